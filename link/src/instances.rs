//! Where ollie's own secret directories are, wherever they are: the state and configuration
//! directories the environment names, and every olliesrv state directory of this user.
//!
//! An olliesrv writes a [`MARKER`] file into its state directory when it starts and appends
//! the directory's canonical path to the per-user list [`registry`]
//! (`~/.local/state/ollie/state-dirs`, itself inside a default secret location). Both olliesrv
//! (for the sessions it starts) and `o sandbox` (which runs without a server) make every
//! directory listed there, that still holds the marker, secret ([`env_secrets`]). A path check
//! can also look for the marker in a path's ancestors ([`marked_ancestor`]), which finds a
//! state directory that was never listed (another user's HOME, a copied directory).

use std::io::Write;
use std::path::{Path, PathBuf};

/// The file olliesrv writes into its state directory: a directory holding it is an ollie
/// state directory, secret wherever it is.
pub const MARKER: &str = "ollie-state-dir";

/// The marker's text (for a human who finds it).
const MARKER_TEXT: &str = "This is an olliesrv state directory: no sandboxed tool may see it, and no session may use it (or a directory inside or around it) as its workspace.\n";

/// The most entries [`env_secrets`] reads from the registry.
const MAX_ENTRIES: usize = 4096;

fn absolute(v: Option<std::ffi::OsString>) -> Option<PathBuf> {
    v.map(PathBuf::from).filter(|p| p.is_absolute())
}

/// The per-user list of state directories: `$HOME/.local/state/ollie/state-dirs` (`None`
/// without an absolute `HOME`).
pub fn registry() -> Option<PathBuf> {
    absolute(std::env::var_os("HOME")).map(|h| h.join(".local/state/ollie/state-dirs"))
}

/// Writes the [`MARKER`] into `state_dir` and lists the directory's canonical path in the
/// [`registry`] (if not listed yet). The registry's directory is created 0700.
pub fn register(state_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let marker = state_dir.join(MARKER);
    if std::fs::symlink_metadata(&marker).is_err() {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&marker)?
            .write_all(MARKER_TEXT.as_bytes())?;
    }
    let Some(reg) = registry() else {
        return Ok(());
    };
    let real = std::fs::canonicalize(state_dir)?;
    if let Some(d) = reg.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)?;
    }
    // Rewritten whole (dropping directories that lost their marker, so the list does not
    // grow with every temporary server) under a lock beside it: concurrent servers each keep
    // the others' entries.
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(reg.with_extension("lock"))?;
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| std::io::Error::from(e))?;
    let mut keep: Vec<PathBuf> = listed(&reg)
        .into_iter()
        .filter(|d| *d != real && is_state_dir(d))
        .collect();
    keep.push(real);
    let mut text: Vec<u8> = Vec::new();
    for d in keep {
        let line = d.into_os_string().into_encoded_bytes();
        if !line.contains(&b'\n') {
            text.extend_from_slice(&line);
            text.push(b'\n');
        }
    }
    let tmp = reg.with_extension("new");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&text)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &reg)
}

/// The absolute paths listed in `reg` (at most [`MAX_ENTRIES`]; none if it is unreadable).
fn listed(reg: &Path) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(bytes) = std::fs::read(reg) else {
        return Vec::new();
    };
    bytes
        .split(|b| *b == b'\n')
        .map(|l| PathBuf::from(std::ffi::OsStr::from_bytes(l)))
        .filter(|p| p.is_absolute())
        .take(MAX_ENTRIES)
        .collect()
}

/// Whether `dir` is an ollie state directory (holds the [`MARKER`]).
pub fn is_state_dir(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(MARKER)).is_ok_and(|m| m.is_file())
}

/// The nearest of `path` and its ancestors that is an ollie state directory.
pub fn marked_ancestor(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .find(|a| is_state_dir(a))
        .map(Path::to_path_buf)
}

/// ollie's secret directories that the environment names, wherever they are: the state
/// directory olliesrv would use by default (`$STATE_DIRECTORY`'s entries, `$XDG_STATE_HOME/ollie`,
/// `~/.local/state/ollie`), the configuration directory (`$XDG_CONFIG_HOME/ollie`,
/// `~/.config/ollie`), and every directory in the [`registry`] that still holds the marker.
/// Absolute, as given (callers add the real paths).
pub fn env_secrets() -> Vec<PathBuf> {
    let var = |k: &str| std::env::var_os(k);
    let home = absolute(var("HOME"));
    let mut out: Vec<PathBuf> = Vec::new();
    if let Some(v) = var("STATE_DIRECTORY") {
        use std::os::unix::ffi::OsStrExt;
        out.extend(
            v.as_bytes()
                .split(|b| *b == b':')
                .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
                .filter(|p| p.is_absolute()),
        );
    }
    if let Some(x) = absolute(var("XDG_STATE_HOME")) {
        out.push(x.join("ollie"));
    }
    if let Some(x) = absolute(var("XDG_CONFIG_HOME")) {
        out.push(x.join("ollie"));
    }
    if let Some(h) = &home {
        out.push(h.join(".local/state/ollie"));
        out.push(h.join(".config/ollie"));
    }
    if let Some(reg) = registry() {
        out.extend(listed(&reg).into_iter().filter(|d| is_state_dir(d)));
    }
    let mut uniq: Vec<PathBuf> = Vec::new();
    for p in out {
        let p: PathBuf = p.components().collect();
        if p != Path::new("/") && !uniq.contains(&p) {
            uniq.push(p);
        }
    }
    uniq
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_marker_is_found_in_ancestors() {
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join("st");
        std::fs::create_dir_all(state.join("sessions/a")).unwrap();
        assert_eq!(marked_ancestor(&state.join("sessions/a")), None);
        std::fs::write(state.join(MARKER), MARKER_TEXT).unwrap();
        assert_eq!(
            marked_ancestor(&state.join("sessions/a")),
            Some(state.clone())
        );
        assert_eq!(marked_ancestor(t.path()), None);
        assert!(is_state_dir(&state));
    }
}
