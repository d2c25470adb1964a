//! Protected paths that do not exist yet.
//!
//! A protected path (e.g. `{workdir}/.envrc`) is a read-only bind in the run's mount namespace.
//! A bind needs an existing mount point, so for a missing path the runner blocks its *first
//! missing component* instead (the Codex trick): it creates that component on the host as an
//! empty directory, binds it read-only for the run, and removes it afterwards. Inside, the
//! tool can neither create the path (it exists, and is read-only) nor remove or rename the
//! placeholder (it is a mount point: `EBUSY`), nor create anything beneath it (`EROFS`).
//!
//! Concurrent runs on the same workspace: every run holds a shared `flock` on each protected
//! directory it binds, and a placeholder is only removed under an exclusive lock taken without
//! waiting, so one run's clean-up can never pull the mount point out from under another run
//! (removing a mount point in another mount namespace would detach that run's bind). The last
//! run to let go removes it, whichever run created it: placeholders carry a mark (mode
//! [`PLACEHOLDER_MODE`], which a tool cannot set on them: they are read-only for it) and are
//! only removed while empty.
//!
//! Every walk is `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from the writable tree's
//! root; a protected path that passes through a symlink refuses the run (fail closed).

use crate::sys;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// Why protected paths could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum ProtectError {
    /// A component of a protected path is a symlink: binding its target could protect the
    /// wrong object, and creating a placeholder would follow it.
    #[error("protected path {path} passes through the symlink {link}; remove the link or the rule")]
    Symlink {
        /// The protected path.
        path: PathBuf,
        /// The symlink found.
        link: PathBuf,
    },
    /// A file system operation failed.
    #[error("cannot prepare protected path {path}")]
    Io {
        /// The protected path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// One placeholder this run holds (created by it, or found from a concurrent run).
#[derive(Debug)]
struct Created {
    parent: OwnedFd,
    name: PathBuf,
    dir: OwnedFd,
    dev: u64,
    ino: u64,
}

/// The protected islands of one run and the locks that keep them in place. Dropping it
/// (after the run's namespaces are gone) removes the placeholders no other run uses.
#[derive(Debug, Default)]
pub(crate) struct Protected {
    /// Paths to bind read-only (existing protected paths and placeholders).
    pub paths: Vec<PathBuf>,
    /// The placeholders among them.
    pub placeholders: Vec<PathBuf>,
    /// Shared locks on protected directories (released on drop).
    locks: Vec<OwnedFd>,
    created: Vec<Created>,
}

const DIR: i32 = libc::O_RDONLY | libc::O_DIRECTORY;

/// How often the walk to one protected path starts over before the run is refused (`EAGAIN`).
const MAX_ROUNDS: u32 = 64;

/// The mode of a placeholder directory (sticky, read + search): the mark clean-up looks for.
pub(crate) const PLACEHOLDER_MODE: u32 = 0o1555;

fn is_placeholder(fd: &OwnedFd) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fd.try_clone()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata())
        .is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o7777 == PLACEHOLDER_MODE)
}

impl Protected {
    /// Resolves `protected` against the writable trees (canonical, as bound), creating
    /// placeholders for missing paths.
    pub(crate) fn prepare(
        protected: &[PathBuf],
        writable: &[PathBuf],
    ) -> Result<Protected, ProtectError> {
        let mut out = Protected::default();
        for p in protected {
            // The innermost writable tree that strictly contains the path (lexically: the
            // walk below refuses symlinks, so lexical is exact).
            let Some(tree) = writable
                .iter()
                .filter(|w| p.starts_with(w) && p != *w)
                .max_by_key(|w| w.components().count())
            else {
                continue;
            };
            let rel = match p.strip_prefix(tree) {
                Ok(r) => r.to_path_buf(),
                Err(_) => continue,
            };
            if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
                continue;
            }
            // Already inside an island (e.g. `.git/config` once `.git` is a placeholder).
            if out.paths.iter().any(|i| p.starts_with(i)) {
                continue;
            }
            let io = |source| ProtectError::Io {
                path: p.clone(),
                source,
            };
            // Rounds: concurrent runs on the same workspace may be creating and removing the
            // placeholder we are after (each round is a few syscalls).
            for round in 0.. {
                match out.walk(tree, &rel).map_err(io)? {
                    Step::Done => break,
                    Step::Symlink(link) => {
                        // An existing target is judged where it really is (bound if it lies
                        // in a writable tree); a dangling link cannot be bound: refuse.
                        match std::fs::canonicalize(p) {
                            Ok(real) => {
                                if writable.iter().any(|w| real.starts_with(w) && &real != w) {
                                    out.push(real);
                                }
                                break;
                            }
                            Err(_) => {
                                return Err(ProtectError::Symlink {
                                    path: p.clone(),
                                    link,
                                });
                            }
                        }
                    }
                    Step::Retry if round < MAX_ROUNDS => continue,
                    Step::Retry => return Err(io(io::Error::from_raw_os_error(libc::EAGAIN))),
                }
            }
        }
        Ok(out)
    }

    /// Walks `rel` beneath `tree`; binds the first non-directory or missing component.
    fn walk(&mut self, tree: &Path, rel: &Path) -> io::Result<Step> {
        let mut dir = std::fs::File::open(tree).map(OwnedFd::from)?;
        let mut at = tree.to_path_buf();
        let comps: Vec<&Path> = rel.components().map(|c| Path::new(c.as_os_str())).collect();
        for (i, name) in comps.iter().enumerate() {
            let here = at.join(name);
            let last = i + 1 == comps.len();
            match sys::lstat_at(dir.as_raw_fd(), name) {
                Ok((_, _, _, true)) => return Ok(Step::Symlink(here)),
                Ok((_, _, true, false)) if !last => {
                    let Some(next) =
                        gone_is_retry(sys::openat2_beneath(dir.as_raw_fd(), name, DIR, 0))?
                    else {
                        return Ok(Step::Retry);
                    };
                    if is_placeholder(&next) {
                        // A concurrent run's placeholder already blocks this path.
                        return self.hold(dir, name, here);
                    }
                    dir = next;
                    at = here;
                }
                Ok((_, _, true, false)) => return self.hold(dir, name, here),
                Ok((_, _, false, false)) => {
                    // The path itself, or a file where a directory would have to be (e.g. a
                    // `.git` gitdir pointer file): bind that.
                    self.push(here);
                    return Ok(Step::Done);
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    match sys::mkdirat(dir.as_raw_fd(), name, PLACEHOLDER_MODE) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                            return Ok(Step::Retry);
                        }
                        Err(e) => return Err(e),
                    }
                    let Some(fd) =
                        gone_is_retry(sys::openat2_beneath(dir.as_raw_fd(), name, DIR, 0))?
                    else {
                        return Ok(Step::Retry);
                    };
                    // The unit tests widen the window the check below is for.
                    #[cfg(test)]
                    std::thread::sleep(std::time::Duration::from_micros(200));
                    sys::flock(&fd, libc::LOCK_SH)?;
                    // Between our mkdir and our lock, a concurrent run that found the new
                    // placeholder may have used it, let go last and removed it.
                    let (dev, ino, nlink, _) = sys::fstat_ids(&fd)?;
                    if nlink == 0 {
                        return Ok(Step::Retry);
                    }
                    {
                        // The exact mark, whatever the umask.
                        use std::os::unix::fs::PermissionsExt;
                        std::fs::File::from(fd.try_clone()?)
                            .set_permissions(std::fs::Permissions::from_mode(PLACEHOLDER_MODE))?;
                    }
                    self.placeholders.push(here.clone());
                    self.push(here);
                    self.created.push(Created {
                        parent: dir,
                        name: name.to_path_buf(),
                        dir: fd,
                        dev,
                        ino,
                    });
                    return Ok(Step::Done);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Step::Done)
    }

    /// Binds the existing directory `name` in `dir`, holding a shared lock on it for the run.
    fn hold(&mut self, dir: OwnedFd, name: &Path, here: PathBuf) -> io::Result<Step> {
        // Found a moment ago, gone now: a concurrent run removed its placeholder.
        let Some(fd) = gone_is_retry(sys::openat2_beneath(dir.as_raw_fd(), name, DIR, 0))? else {
            return Ok(Step::Retry);
        };
        sys::flock(&fd, libc::LOCK_SH)?;
        let (dev, ino, nlink, _) = sys::fstat_ids(&fd)?;
        if nlink == 0 {
            return Ok(Step::Retry); // removed while we waited for the lock
        }
        if is_placeholder(&fd) {
            // Another run's placeholder: ours to remove if we let go last.
            self.placeholders.push(here.clone());
            self.created.push(Created {
                parent: dir,
                name: name.to_path_buf(),
                dir: fd,
                dev,
                ino,
            });
        } else {
            self.locks.push(fd);
        }
        self.push(here);
        Ok(Step::Done)
    }

    fn push(&mut self, path: PathBuf) {
        if !self.paths.contains(&path) {
            self.paths.push(path);
        }
    }
}

enum Step {
    Done,
    Retry,
    Symlink(PathBuf),
}

/// `r`, with "it is gone" (`ENOENT`: a concurrent run removed what was just found) as `None`,
/// for the walk to start over.
fn gone_is_retry<T>(r: io::Result<T>) -> io::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

impl Drop for Protected {
    fn drop(&mut self) {
        // Shared locks on existing directories first, so a concurrent run's clean-up of a
        // placeholder we merely used is not held up by us.
        self.locks.clear();
        for c in self.created.drain(..) {
            // Another run still binds it (holds a shared lock): leave it to that run.
            if sys::flock(&c.dir, libc::LOCK_EX | libc::LOCK_NB).is_err() {
                continue;
            }
            // Only the directory we created, and only while empty (rmdir refuses otherwise).
            if let Ok((dev, ino, true, false)) = sys::lstat_at(c.parent.as_raw_fd(), &c.name)
                && (dev, ino) == (c.dev, c.ino)
                && sys::unlinkat(c.parent.as_raw_fd(), &c.name, libc::AT_REMOVEDIR).is_ok()
            {
                // Gone from the tree; a run waiting for the lock on it retries on a new one.
                let _ = sys::flock(&c.dir, libc::LOCK_UN);
                close_later(c.dir);
            }
        }
    }
}

/// Closes the descriptor of a removed placeholder on a background thread, or keeps it for
/// [`close_in_a_child`] in a process that said it would end soon ([`close_at_exit`]). Its
/// last close frees the directory's block, and on a filesystem mounted with `discard` (and
/// without a journal to defer it) that waits for the device's discard: 0.2–0.6 ms per
/// placeholder on the reference machine, which every run would otherwise wait for after its
/// tool ended.
///
/// At most [`CLOSER_BACKLOG`] descriptors wait for that thread: when discards are slower than
/// runs end, the run that finds the backlog full closes its own (and waits), so a busy
/// process cannot pile up open descriptors until it runs out of them.
fn close_later(fd: OwnedFd) {
    if let Some(kept) = lock(&KEPT).as_mut() {
        kept.push(fd);
        return;
    }
    static CLOSER: std::sync::OnceLock<Option<std::sync::mpsc::SyncSender<OwnedFd>>> =
        std::sync::OnceLock::new();
    let closer = CLOSER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<OwnedFd>(CLOSER_BACKLOG);
        std::thread::Builder::new()
            .name("ollie-closer".into())
            .spawn(move || rx.into_iter().for_each(drop))
            .ok()
            .map(|_| tx)
    });
    if let Some(tx) = closer {
        // A full or closed channel hands the descriptor back: it is then closed here.
        let _ = tx.try_send(fd);
    }
}

/// How many removed placeholders' descriptors may wait for the closing thread.
const CLOSER_BACKLOG: usize = 64;

/// Descriptors of removed placeholders kept until the process ends ([`close_at_exit`]).
static KEPT: std::sync::Mutex<Option<Vec<OwnedFd>>> = std::sync::Mutex::new(None);

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// For a process that makes one run and ends (`o sandbox`): the descriptors of removed
/// placeholders are kept (not closed on a background thread, whose close the process's exit
/// would wait for), for [`close_in_a_child`].
pub fn close_at_exit() {
    let mut kept = lock(&KEPT);
    if kept.is_none() {
        *kept = Some(Vec::new());
    }
}

/// Right before the process ends: the kept descriptors ([`close_at_exit`]) are closed by a
/// short-lived child instead (forked, it closes every other descriptor first, then exits),
/// so this process's exit does not wait for the discards their last close may cause.
/// Without kept descriptors, or if the fork fails, nothing happens: they are closed at exit.
pub fn close_in_a_child() {
    let kept = lock(&KEPT).take().unwrap_or_default();
    if !kept.is_empty() {
        let mut fds: Vec<u32> = kept
            .iter()
            .filter_map(|f| u32::try_from(f.as_raw_fd()).ok())
            .collect();
        fds.sort_unstable();
        sys::fork_to_close(&fds);
    }
    // This process's copies: not the last ones once the child holds its own.
    drop(kept);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Runs preparing and dropping the same protected paths at once on one tree: whatever
    /// interleaving, every path a run is given to bind exists until that run lets go, and the
    /// last run to let go leaves no placeholder behind.
    #[test]
    fn a_placeholder_outlives_every_run_that_binds_it() {
        let tmp = std::env::temp_dir().join(format!("ollie-placeholders-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp).unwrap();
        let tree = std::fs::canonicalize(&tmp).unwrap();
        let protected = vec![tree.join(".envrc"), tree.join(".git").join("hooks")];
        let writable = vec![tree.clone()];
        let threads: Vec<_> = (0..6)
            .map(|t| {
                let (protected, writable) = (protected.clone(), writable.clone());
                std::thread::spawn(move || {
                    for i in 0..400 {
                        let held = Protected::prepare(&protected, &writable).unwrap();
                        assert_eq!(held.paths.len(), 2);
                        for p in &held.paths {
                            let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| {
                                panic!("thread {t}, run {i}: {} is gone: {e}", p.display())
                            });
                            assert!(m.is_dir(), "{} is not the placeholder", p.display());
                        }
                        drop(held);
                        // Gaps of different lengths, so that every run sometimes finds the
                        // placeholders held by others and sometimes has to make them.
                        std::thread::sleep(Duration::from_micros((i + t) % 5 * 40));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let left: Vec<_> = std::fs::read_dir(&tree).unwrap().flatten().collect();
        assert!(left.is_empty(), "placeholders left behind: {left:?}");
        std::fs::remove_dir(&tree).unwrap();
    }
}
