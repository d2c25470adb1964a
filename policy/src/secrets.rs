//! Secret locations: paths that no filesystem rule can ever grant.
//!
//! A rule that *is* a secret location, or lies inside one, is rejected. A rule that is an
//! *ancestor* of a secret location (e.g. read-only `/` or `$HOME`) is accepted, and the enforcer
//! must carve the secret out by construction (Landlock cannot deny a subpath of a granted tree,
//! so the sandbox grants the siblings instead). [`secrets_within`] lists what to carve out.

use std::path::{Path, PathBuf};

/// Secret locations relative to a home directory. Applied to the user's home and to `/root`.
pub const HOME_SECRETS: &[&str] = &[
    ".ssh",
    ".aws",
    ".azure",
    ".gnupg",
    ".netrc",
    ".git-credentials",
    ".config/ollie",
    ".local/state/ollie",
    ".local/share/ollie",
    ".config/gh",
    ".config/gcloud",
    ".config/hub",
    ".docker",
    ".kube",
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".lesshst",
    ".viminfo",
    ".password-store",
    ".local/share/keyrings",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".terraform.d",
    ".vault-token",
];

/// Absolute secret locations.
pub const ABSOLUTE_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/ollie",
    "/var/lib/ollie",
    "/run/ollie",
];

/// All secret locations for a given home directory.
pub fn secret_locations(home: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ABSOLUTE_SECRETS.iter().map(PathBuf::from).collect();
    let homes: &[&Path] = if home == Path::new("/root") {
        &[home]
    } else {
        &[home, Path::new("/root")]
    };
    for h in homes {
        out.extend(HOME_SECRETS.iter().map(|s| h.join(s)));
    }
    out
}

/// A runner's own secret locations as [`ResolveContext::extra_secrets`](crate::ResolveContext::extra_secrets):
/// each absolute one in normal form as given and, where `real` resolves it, by its real path
/// (rules are judged lexically, the objects an enforcer opens by their real paths). `real` is
/// the caller's I/O (`std::fs::canonicalize`); relative paths are dropped.
pub fn with_real_paths(given: &[PathBuf], real: impl Fn(&Path) -> Option<PathBuf>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in given.iter().filter(|p| p.is_absolute()) {
        let lexical: PathBuf = p.components().collect();
        for f in [real(p), Some(lexical)].into_iter().flatten() {
            if !out.contains(&f) {
                out.push(f);
            }
        }
    }
    out
}

/// Returns the secret location that `path` is equal to or lies inside, if any.
pub fn secret_containing(path: &Path, home: &Path) -> Option<PathBuf> {
    secret_in(path, &secret_locations(home))
}

/// Like [`secret_containing`], against a precomputed [`secret_locations`] list.
pub fn secret_in(path: &Path, secrets: &[PathBuf]) -> Option<PathBuf> {
    secrets.iter().find(|s| path.starts_with(s)).cloned()
}

/// Secret locations strictly inside `path` (which a broad grant on `path` must exclude).
pub fn secrets_within(path: &Path, home: &Path) -> Vec<PathBuf> {
    secret_locations(home)
        .into_iter()
        .filter(|s| s.starts_with(path) && s != path)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_is_secret_and_inside_is_secret() {
        let home = Path::new("/home/u");
        assert!(secret_containing(Path::new("/home/u/.ssh"), home).is_some());
        assert!(secret_containing(Path::new("/home/u/.ssh/id_ed25519"), home).is_some());
        assert!(secret_containing(Path::new("/home/u/.sshx"), home).is_none());
        assert!(secret_containing(Path::new("/etc/shadow"), home).is_some());
        assert!(secret_containing(Path::new("/root/.aws/credentials"), home).is_some());
    }

    #[test]
    fn broad_rules_report_what_to_carve_out() {
        let home = Path::new("/home/u");
        let w = secrets_within(Path::new("/"), home);
        assert!(w.contains(&PathBuf::from("/home/u/.ssh")));
        assert!(w.contains(&PathBuf::from("/etc/shadow")));
        let w = secrets_within(Path::new("/usr"), home);
        assert!(w.is_empty());
    }
}
