//! Policy for the ollie tool sandbox: pure data, validation and decisions.
//!
//! Guarantees:
//! - A [`Policy`] only exists after validation: every path is absolute (or anchored at
//!   `{workdir}` / `{home}`), lexically normal (no `.`/`..`), limits are in range, the
//!   environment allowlist names no secret-bearing variable, and unknown keys are rejected.
//!   Errors name the key path (`fs.write[2]: must be an absolute path …`).
//! - Secret locations ([`secrets`]) can never be granted: a rule naming one (or a path inside
//!   one) is rejected when the policy is resolved, and [`ResolvedPolicy::secrets_within`] tells
//!   the enforcer which secret paths it must carve out of a broader grant.
//! - Layering ([`Policy::narrow`]) can only narrow; any attempt to widen is an error.
//! - The only widening is [`ResolvedPolicy::with_grants`] (and [`Policy::with_grants`], which
//!   applies the same rules): a copy for one run, grown by exactly the grants a human approved
//!   ([`Grant::parse`] reads the agent's spelling), never by a secret location. `net` gives
//!   [`Network::All`] (the host network, TCP and UDP, every port); `unsandboxed` gives a copy
//!   whose filesystem rules the enforcer does not apply ([`Policy::unsandboxed`]), which no
//!   policy file or layer can produce.
//! - [`decide()`] is a pure function from a policy and an escalation request to a
//!   [`Decision`] (`Allow | Deny(reason) | NeedsApproval(request)`).
//! - [`domains`] holds the egress proxy's pure half: a host is compared only in its one
//!   normalised form ([`domains::normalize_host`]: lower case, punycode, canonical IP literals,
//!   NUL, `%`, `@`, ports and look-alike scripts refused), and [`domains::DomainRules::decide`]
//!   lets a deny pattern win over an allow pattern.
//!
//! Not guaranteed here: enforcement. This crate does no I/O and knows nothing about the kernel;
//! `ollie-sandbox` turns a [`ResolvedPolicy`] into Landlock rules, seccomp filters, mounts and
//! rlimits.
//!
//! Tested by unit tests next to the code (every shipped profile is parsed) and property tests
//! for `decide`, `narrow`, `with_grants` and the grant spelling.
#![forbid(unsafe_code)]

mod decide;
pub mod domains;
mod model;
mod narrow;
pub mod proxynet;
mod raw;
pub mod secrets;
pub mod syscalls;
mod widen;

pub use decide::{Decision, DenyReason, EscalationRequest, Grant, decide};
pub use model::{
    Access, DEFAULT_LANDLOCK_MIN_ABI, EnvPolicy, EscalationKind, FsRules, Limits,
    MAX_DENIED_SYSCALLS, Network, PathAnchor, PathTemplate, Policy, PolicyError, RESOLVER_FILES,
    ResolveContext, ResolvedFs, ResolvedPolicy, SyscallProfile, Syscalls, env_name_is_forbidden,
};
pub use narrow::{Layer, NarrowError};
pub use proxynet::{PROXY_PORT, ProxyNetwork};

/// The profiles shipped in `packaging/policy/`, by name. `workspace` is the default.
pub const SHIPPED_PROFILES: &[(&str, &str)] = &[
    (
        "readonly",
        include_str!("../../packaging/policy/readonly.toml"),
    ),
    (
        "workspace",
        include_str!("../../packaging/policy/workspace.toml"),
    ),
    (
        "network",
        include_str!("../../packaging/policy/network.toml"),
    ),
    (
        "packages",
        include_str!("../../packaging/policy/packages.toml"),
    ),
];

/// The name of the default profile.
pub const DEFAULT_PROFILE: &str = "workspace";

/// Parses a shipped profile by name.
pub fn shipped_profile(name: &str) -> Result<Policy, PolicyError> {
    match SHIPPED_PROFILES.iter().find(|(n, _)| *n == name) {
        Some((_, text)) => Policy::from_toml(text),
        None => Err(PolicyError::UnknownProfile {
            name: name.to_string(),
            valid: SHIPPED_PROFILES
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// Whether `name` is a shipped profile's name.
pub fn is_shipped(name: &str) -> bool {
    SHIPPED_PROFILES.iter().any(|(n, _)| *n == name)
}

/// The one rule for naming a user policy (`policy/NAME.toml` beside olliesrv's config, and the
/// `o sandbox --profile NAME` lookup in `$XDG_CONFIG_HOME/ollie/policy/`): a shipped name
/// always means the shipped profile, so a user file cannot take one. The error is the reason,
/// one line.
pub fn check_user_policy_name(name: &str) -> Result<(), String> {
    if is_shipped(name) {
        return Err(format!(
            "{name:?} is a shipped policy and cannot be redefined; use another name (shipped: {})",
            SHIPPED_PROFILES
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(())
}

/// Resolves a profile name as olliesrv does: a shipped name is the shipped profile, unless
/// `user_dir` (a `policy/` directory) holds a file of that name, which is refused as olliesrv
/// refuses it; any other name is `user_dir/NAME.toml`. The error is one line naming the file.
pub fn resolve_profile(name: &str, user_dir: Option<&std::path::Path>) -> Result<Policy, String> {
    let file = user_dir
        .filter(|_| is_policy_name(name))
        .map(|d| d.join(format!("{name}.toml")))
        .filter(|f| f.exists());
    match (file, is_shipped(name)) {
        (Some(f), true) => Err(format!(
            "policy {}: {}",
            f.display(),
            check_user_policy_name(name).err().unwrap_or_default()
        )),
        (Some(f), false) => {
            let text = std::fs::read_to_string(&f)
                .map_err(|e| format!("cannot read policy {}: {e}", f.display()))?;
            Policy::from_toml(&text).map_err(|e| format!("policy {}: {e}", f.display()))
        }
        (None, _) => shipped_profile(name).map_err(|e| match user_dir {
            Some(d) => format!("{e} (or a file {}/NAME.toml)", d.display()),
            None => e.to_string(),
        }),
    }
}

/// Whether `name` may name a policy or profile file: 1–64 letters, digits, `.`, `_` or `-`,
/// not starting with `.`.
pub fn is_policy_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_profile_parses_and_resolves() {
        let ctx = ResolveContext {
            workdir: "/w".into(),
            home: "/home/u".into(),
            extra_secrets: Vec::new(),
        };
        for (name, _) in SHIPPED_PROFILES {
            let p = shipped_profile(name).unwrap();
            let r = p.resolve(&ctx).unwrap();
            assert!(
                r.fs.write
                    .iter()
                    .all(|p| p.starts_with("/w") || p.starts_with("/dev"))
            );
            assert_eq!(p.landlock_min_abi, 7, "{name}");
            assert!(!p.best_effort, "{name}");
        }
    }

    #[test]
    fn shipped_profiles_have_expected_shape() {
        let ctx = ResolveContext {
            workdir: "/w".into(),
            home: "/home/u".into(),
            extra_secrets: Vec::new(),
        };
        let ro = shipped_profile("readonly").unwrap().resolve(&ctx).unwrap();
        assert!(!ro.fs.write.iter().any(|p| p.starts_with("/w")));
        assert_eq!(ro.network, Network::Off);
        let ws = shipped_profile("workspace").unwrap().resolve(&ctx).unwrap();
        assert!(ws.fs.write.iter().any(|p| p == std::path::Path::new("/w")));
        assert_eq!(ws.network, Network::Off);
        let net = shipped_profile("network").unwrap().resolve(&ctx).unwrap();
        assert!(matches!(net.network, Network::Tcp { .. }));
    }

    #[test]
    fn a_user_file_cannot_take_a_shipped_name_and_other_names_are_user_files() {
        let dir = tempfile::tempdir().unwrap();
        let user = SHIPPED_PROFILES[0].1;
        std::fs::write(dir.path().join("workspace.toml"), user).unwrap();
        std::fs::write(dir.path().join("mine.toml"), user).unwrap();
        let e = resolve_profile("workspace", Some(dir.path())).unwrap_err();
        assert!(
            e.ends_with(
                "workspace.toml: \"workspace\" is a shipped policy and cannot be redefined; use another name (shipped: readonly, workspace, network, packages)"
            ),
            "{e}"
        );
        assert!(resolve_profile("readonly", Some(dir.path())).is_ok());
        assert!(resolve_profile("mine", Some(dir.path())).is_ok());
        let e = resolve_profile("absent", Some(dir.path())).unwrap_err();
        assert!(e.contains("absent") && e.contains("NAME.toml"), "{e}");
        assert!(resolve_profile("../mine", Some(dir.path())).is_err());
        assert!(resolve_profile("workspace", None).is_ok());
    }

    #[test]
    fn unknown_profile_lists_valid_names() {
        let e = shipped_profile("nope").unwrap_err().to_string();
        assert!(e.contains("readonly, workspace, network, packages"), "{e}");
    }
}
