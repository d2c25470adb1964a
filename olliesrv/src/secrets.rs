//! This server's own secret locations, by their real paths: what no session's workspace may
//! be, lie inside or contain, and what every local toolsrv gets as its boot message's `hidden`
//! (hidden from every tool and secret there in every other way: see
//! `ollie_sandbox::RunRequest::hidden`).
//!
//! The set is computed at start from the directories the server actually uses ([`compute`](crate::secrets::compute)),
//! not from the default paths (which `ollie_policy::secrets` knows already).

use std::path::{Path, PathBuf};
use std::sync::RwLock;

/// The server's set, once [`set`] at start (empty before, as in unit tests of other
/// modules).
static SERVER: RwLock<Vec<PathBuf>> = RwLock::new(Vec::new());

/// Shared directories a socket may be in without the whole directory becoming secret.
const SHARED_DIRS: &[&str] = &["/tmp", "/var/tmp", "/dev/shm"];

/// The server's secret locations: its state directory; `config` (its configuration file, the
/// `agents/` and `policy/` directories beside it, and the backends' key files: see
/// [`config_paths`]); the unix sockets it
/// serves and their directories (unless a shared one such as `/tmp`, the home or a system
/// tree); and [`ollie_link::instances::env_secrets`] (the default state and configuration
/// directories of the environment, and every other state directory of this user). Each as
/// given and by its real path.
pub fn compute(state_dir: &Path, config: &[PathBuf], sockets: &[PathBuf]) -> Vec<PathBuf> {
    let mut given: Vec<PathBuf> = vec![state_dir.to_path_buf()];
    given.extend(config.iter().cloned());
    let home = std::env::var_os("HOME").map(PathBuf::from);
    for s in sockets {
        given.push(s.clone());
        if let Some(d) = s.parent() {
            let shared = SHARED_DIRS.iter().any(|x| d == Path::new(x))
                || too_broad(d, home.as_deref()).is_some();
            if !shared && !d.as_os_str().is_empty() {
                given.push(d.to_path_buf());
            }
        }
    }
    given.extend(ollie_link::instances::env_secrets());
    let given: Vec<PathBuf> = given
        .into_iter()
        .filter_map(|p| std::path::absolute(p).ok())
        .collect();
    real_forms(&given)
}

/// The configuration's part of the set: the file at `path`, the `agents/` and `policy/`
/// directories in `dir` (the file's directory), and the backends' `key_files`.
pub fn config_paths(
    path: Option<&Path>,
    dir: Option<PathBuf>,
    key_files: Vec<PathBuf>,
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = path {
        out.push(p.to_path_buf());
    }
    if let Some(d) = dir {
        out.extend([d.join("agents"), d.join("policy")]);
    }
    out.extend(key_files);
    out
}

/// Trees a workspace must not be in: the workspace policy makes the cwd writable, and these
/// hold the system's programs, configuration and state.
pub const SYSTEM_TREES: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
    "/sbin", "/sys", "/usr", "/var",
];

/// Why `dir` (canonical, or a remote path) is too broad to be a workspace: `/`, the home
/// directory `home`, or a directory in a [`SYSTEM_TREES`] tree.
pub fn too_broad(dir: &Path, home: Option<&Path>) -> Option<&'static str> {
    if dir == Path::new("/") {
        return Some("is the root directory");
    }
    if home == Some(dir) {
        return Some("is your home directory, and tools could write every file in it");
    }
    SYSTEM_TREES
        .iter()
        .any(|t| dir.starts_with(t))
        .then_some("is in a system tree")
}

/// Makes `list` the server's set.
pub fn set(list: Vec<PathBuf>) {
    *SERVER
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = list;
}

/// The server's set.
pub fn server() -> Vec<PathBuf> {
    SERVER
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// The server's set as it is now: [`server`], plus `state_dir` (for servers not started by
/// `run`) and the state directories other instances listed since the start.
pub fn current(state_dir: &Path) -> Vec<PathBuf> {
    let mut given = server();
    given.push(state_dir.to_path_buf());
    given.extend(ollie_link::instances::env_secrets());
    real_forms(&given)
}

/// Why the canonical directory `dir` may not be a local workspace: it is, lies inside or
/// contains (unless it is a shared directory such as `/tmp`) one of the server's secret
/// locations, lies inside a default secret location of
/// `home`, or lies inside an ollie state directory (found by its marker). `force=yes` does
/// not override this: the workspace policy makes the cwd writable.
pub fn refuse_workspace(dir: &Path, home: Option<&Path>) -> Result<(), String> {
    let reason = |what: String| {
        Err(format!(
            "cwd {} {what}, which no tool may touch: give a project directory",
            dir.display()
        ))
    };
    let defaults = home.map(ollie_policy::secrets::secret_locations);
    let mut list = server();
    list.extend(real_forms(&ollie_link::instances::env_secrets()));
    if let Some(s) = list.iter().find(|s| dir.starts_with(s)) {
        return reason(format!("is inside ollie's own {}", s.display()));
    }
    // A workspace containing one: refused, except where the sandbox's carve-out is the
    // rule anyway: inside a default secret location (so a forced cwd=$HOME keeps working) or
    // in a shared directory such as /tmp, whose entries belong to everyone. There the secret
    // is carved out of the grant, bound read-only and hidden, as every secret location is.
    let shared = SHARED_DIRS.iter().any(|x| dir == Path::new(x));
    for s in list.into_iter().filter(|_| !shared) {
        let carved = defaults
            .as_deref()
            .is_some_and(|d| ollie_policy::secrets::secret_in(&s, d).is_some());
        if s.starts_with(dir) && !carved && std::fs::symlink_metadata(&s).is_ok() {
            return reason(format!("contains ollie's own {}", s.display()));
        }
    }
    if let Some(h) = home
        && let Some(s) = ollie_policy::secrets::secret_containing(dir, h)
    {
        return reason(format!("is inside the secret location {}", s.display()));
    }
    if let Some(s) = ollie_link::instances::marked_ancestor(dir) {
        return reason(format!(
            "is inside the ollie state directory {}",
            s.display()
        ));
    }
    Ok(())
}

/// Each path as given and by its real path, where it has one.
fn real_forms(given: &[PathBuf]) -> Vec<PathBuf> {
    ollie_policy::secrets::with_real_paths(given, |p| std::fs::canonicalize(p).ok())
}
