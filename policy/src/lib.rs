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
//! - [`decide`] is a pure function from a policy and an escalation request to a
//!   [`Decision`] (`Allow | Deny(reason) | NeedsApproval(request)`).
//!
//! Not guaranteed here: enforcement. This crate does no I/O and knows nothing about the kernel;
//! `ollie-sandbox` turns a [`ResolvedPolicy`] into Landlock rules, seccomp filters, mounts and
//! rlimits.
//!
//! Tested by unit tests next to the code (every shipped profile is parsed) and property tests
//! for `decide`, `narrow`, `with_grants` and the grant spelling.
#![forbid(unsafe_code)]

mod decide;
mod model;
mod narrow;
mod raw;
pub mod secrets;
pub mod syscalls;
mod widen;

pub use decide::{Decision, DenyReason, EscalationRequest, Grant, decide};
pub use model::{
    Access, DEFAULT_LANDLOCK_MIN_ABI, EnvPolicy, EscalationKind, FsRules, Limits,
    MAX_DENIED_SYSCALLS, Network, PathAnchor, PathTemplate, Policy, PolicyError, ResolveContext,
    ResolvedFs, ResolvedPolicy, SyscallProfile, Syscalls, env_name_is_forbidden,
};
pub use narrow::{Layer, NarrowError};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_profile_parses_and_resolves() {
        let ctx = ResolveContext {
            workdir: "/w".into(),
            home: "/home/u".into(),
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
    fn unknown_profile_lists_valid_names() {
        let e = shipped_profile("nope").unwrap_err().to_string();
        assert!(e.contains("readonly, workspace, network"), "{e}");
    }
}
