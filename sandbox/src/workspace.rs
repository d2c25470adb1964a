//! Host-side file operations inside a workspace that never follow symlinks out of it:
//! every open goes through `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` relative to a directory fd of the workspace root.
//!
//! Host-side git is gated: after a run, the caller hands the run's post-run flags to
//! [`Workspace::record_flags`]; while any is unacknowledged, [`Workspace::git_allowed`] says
//! `Deny` and [`Workspace::git_command`] refuses. A human reviews the flags and calls
//! [`Workspace::acknowledge_flags`] with exactly the flags shown to them.

use crate::postrun::PostRunFlag;
use crate::sys;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path};

/// A workspace root, held open.
#[derive(Debug)]
pub struct Workspace {
    root: OwnedFd,
    /// The root as opened (for host-side commands).
    path: std::path::PathBuf,
    /// Post-run flags no human has acknowledged yet.
    unacknowledged: Vec<PostRunFlag>,
}

/// Whether host-side git may run in the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GitDecision {
    /// No unacknowledged post-run flag.
    Allow,
    /// A run left these behind; a human must review and acknowledge them first.
    Deny(Vec<PostRunFlag>),
}

/// Host-side git was refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "host-side git refused in {path}: {count} unacknowledged post-run flag(s) (new hooks, risky git config, …); review them and acknowledge"
)]
pub struct GitRefused {
    /// The workspace.
    pub path: std::path::PathBuf,
    /// How many flags are pending.
    pub count: usize,
}

fn check_rel(rel: &Path) -> io::Result<()> {
    if rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path must be relative and contain only normal components",
        ));
    }
    Ok(())
}

impl Workspace {
    /// Opens the workspace root (an absolute directory).
    pub fn open(root: &Path) -> io::Result<Workspace> {
        let f = File::open(root)?;
        if !f.metadata()?.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(Workspace {
            root: f.into(),
            path: root.to_path_buf(),
            unacknowledged: Vec::new(),
        })
    }

    /// Adds a run's post-run flags (`RunRecord::post_run.flags`); host-side git is refused
    /// until a human acknowledges them.
    pub fn record_flags(&mut self, flags: &[PostRunFlag]) {
        for f in flags {
            if !self.unacknowledged.contains(f) {
                self.unacknowledged.push(f.clone());
            }
        }
    }

    /// Flags still waiting for a human.
    pub fn pending_flags(&self) -> &[PostRunFlag] {
        &self.unacknowledged
    }

    /// A human has reviewed exactly `seen` (as shown to them): those are cleared; flags
    /// recorded since stay pending. Returns how many remain.
    pub fn acknowledge_flags(&mut self, seen: &[PostRunFlag]) -> usize {
        self.unacknowledged.retain(|f| !seen.contains(f));
        self.unacknowledged.len()
    }

    /// Whether host-side git may run here now.
    pub fn git_allowed(&self) -> GitDecision {
        if self.unacknowledged.is_empty() {
            GitDecision::Allow
        } else {
            GitDecision::Deny(self.unacknowledged.clone())
        }
    }

    /// A host-side `git` command in the workspace, or a refusal while flags are pending.
    /// Even when allowed, hooks and the fsmonitor are disabled for the command (defence in
    /// depth: the post-run diff is bounded).
    pub fn git_command(&self) -> Result<std::process::Command, GitRefused> {
        if !self.unacknowledged.is_empty() {
            return Err(GitRefused {
                path: self.path.clone(),
                count: self.unacknowledged.len(),
            });
        }
        let mut c = std::process::Command::new("git");
        c.current_dir(&self.path).args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
        ]);
        Ok(c)
    }

    /// Opens a file for reading; fails with ELOOP on any symlink and EXDEV on escapes.
    pub fn open_read(&self, rel: &Path) -> io::Result<File> {
        check_rel(rel)?;
        sys::openat2_beneath(self.root.as_raw_fd(), rel, libc::O_RDONLY, 0).map(File::from)
    }

    /// Creates or truncates a file for writing (mode 0644), never through a symlink.
    pub fn create(&self, rel: &Path) -> io::Result<File> {
        check_rel(rel)?;
        sys::openat2_beneath(
            self.root.as_raw_fd(),
            rel,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW,
            0o644,
        )
        .map(File::from)
    }

    /// Creates a directory and its missing parents (mode 0755), never through a symlink.
    pub fn create_dir_all(&self, rel: &Path) -> io::Result<()> {
        check_rel(rel)?;
        let mut dir: Option<OwnedFd> = None;
        for c in rel.components() {
            let name = Path::new(c.as_os_str());
            let parent = dir
                .as_ref()
                .map_or(self.root.as_raw_fd(), |d| d.as_raw_fd());
            match sys::mkdirat(parent, name, 0o755) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            let next = sys::openat2_beneath(parent, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            dir = Some(next);
        }
        Ok(())
    }

    /// Removes a file (not a directory) without following symlinks in the path.
    pub fn remove_file(&self, rel: &Path) -> io::Result<()> {
        check_rel(rel)?;
        let (parent, name) = match (rel.parent(), rel.file_name()) {
            (Some(p), Some(n)) if !p.as_os_str().is_empty() => (Some(p), n),
            (_, Some(n)) => (None, n),
            _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        };
        let dfd = match parent {
            Some(p) => Some(sys::openat2_beneath(
                self.root.as_raw_fd(),
                p,
                libc::O_RDONLY | libc::O_DIRECTORY,
                0,
            )?),
            None => None,
        };
        let d = dfd
            .as_ref()
            .map_or(self.root.as_raw_fd(), |d| d.as_raw_fd());
        sys::unlinkat(d, Path::new(name), 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ollie-ws-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn symlinks_out_of_the_workspace_are_refused() {
        let root = tmp("sym");
        let outside = tmp("outside");
        std::fs::write(outside.join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("dirlink")).unwrap();
        let ws = Workspace::open(&root).unwrap();
        assert_eq!(
            ws.open_read(Path::new("link")).unwrap_err().raw_os_error(),
            Some(libc::ELOOP)
        );
        assert!(ws.open_read(Path::new("dirlink/secret")).is_err());
        assert!(ws.create(Path::new("link")).is_err());
        assert!(ws.create_dir_all(Path::new("dirlink/x")).is_err());
        assert!(!outside.join("x").exists());
        assert!(ws.open_read(Path::new("../outside/secret")).is_err());
        assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"s");
        // Normal operations work.
        ws.create_dir_all(Path::new("a/b")).unwrap();
        ws.create(Path::new("a/b/f"))
            .unwrap()
            .write_all(b"hi")
            .unwrap();
        let mut s = String::new();
        ws.open_read(Path::new("a/b/f"))
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "hi");
        ws.remove_file(Path::new("a/b/f")).unwrap();
        assert!(!root.join("a/b/f").exists());
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&outside);
    }

    #[test]
    fn host_git_is_refused_until_flags_are_acknowledged() {
        use crate::postrun::{FlagKind, PostRunFlag};
        let root = tmp("git");
        let mut ws = Workspace::open(&root).unwrap();
        assert_eq!(ws.git_allowed(), GitDecision::Allow);
        let hook = PostRunFlag {
            kind: FlagKind::GitHook,
            path: ".git/hooks/pre-commit".into(),
            detail: "created during the run".into(),
        };
        let cfg = PostRunFlag {
            kind: FlagKind::GitConfig,
            path: ".git/config".into(),
            detail: "core.hookspath = .hooks".into(),
        };
        ws.record_flags(std::slice::from_ref(&hook));
        assert_eq!(ws.git_allowed(), GitDecision::Deny(vec![hook.clone()]));
        let e = ws.git_command().unwrap_err();
        assert_eq!(e.count, 1);
        assert!(e.to_string().contains("unacknowledged"), "{e}");
        // A flag recorded after the human looked stays pending.
        ws.record_flags(std::slice::from_ref(&cfg));
        assert_eq!(ws.acknowledge_flags(std::slice::from_ref(&hook)), 1);
        assert!(ws.git_command().is_err());
        assert_eq!(ws.acknowledge_flags(&[cfg]), 0);
        assert_eq!(ws.git_allowed(), GitDecision::Allow);
        let out = ws
            .git_command()
            .unwrap()
            .args(["config", "--get", "core.hooksPath"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "/dev/null");
        let _ = std::fs::remove_dir_all(&root);
    }
}
