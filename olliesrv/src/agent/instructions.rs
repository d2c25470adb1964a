//! Project instructions for agents: `AGENTS.md` files, read as Codex reads them. From the
//! repository's root (the nearest directory at or above the working directory holding
//! `.git`; the working directory itself when there is none) down to the working directory,
//! each directory contributes its `AGENTS.override.md` if it has one, else its `AGENTS.md`,
//! root first, so the nearest file has the last word. The whole is bounded by
//! [`MAX_BYTES`]; it goes into the system prompt.
//!
//! These files are the repository's, which an agent's earlier commands may have written, so
//! they are opened without following a symbolic link at any step (an `AGENTS.md` pointing at
//! `~/.ssh/id_ed25519` would hand the key to the model), must be regular files with one
//! link, are read with `O_NONBLOCK` (a FIFO cannot hang the turn) and only up to the bound.
//! What they say is only instructions: they cannot change a policy, a tool or a backend.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

/// The most bytes of instructions the system prompt takes (Codex's default too).
pub const MAX_BYTES: usize = 32 * 1024;

/// The file names, in the order they are preferred within one directory.
const NAMES: [&str; 2] = ["AGENTS.override.md", "AGENTS.md"];

/// The system prompt's section of project instructions for an agent working in `cwd` (an
/// absolute, canonical directory), or an empty string when there are none.
pub fn section(cwd: &Path) -> String {
    let mut out = String::new();
    let mut left = MAX_BYTES;
    let mut cut = false;
    for dir in chain(cwd) {
        let Some((name, text)) = read_one(&dir, left + 1) else {
            continue;
        };
        let (text, clipped) = clip(&text, left);
        cut |= clipped;
        left -= text.len();
        out.push_str(&format!(
            "\n\n--- {} ---\n{}",
            dir.join(name).display(),
            text.trim_end()
        ));
        if left == 0 {
            break;
        }
    }
    if out.is_empty() {
        return out;
    }
    let mut s = String::from(
        "\n\nProject instructions (AGENTS.md files of this repository, the nearest last; follow \
         them where they do not conflict with the user's request):",
    );
    s.push_str(&out);
    if cut {
        s.push_str(&format!("\n(cut at {MAX_BYTES} bytes)"));
    }
    s
}

/// The directories whose files count, from the repository's root down to `cwd`.
fn chain(cwd: &Path) -> Vec<PathBuf> {
    let mut up: Vec<PathBuf> = Vec::new();
    for d in cwd.ancestors() {
        up.push(d.to_path_buf());
        if d.join(".git").symlink_metadata().is_ok() {
            up.reverse();
            return up;
        }
    }
    // No repository: the working directory alone.
    vec![cwd.to_path_buf()]
}

/// The preferred instruction file of `dir` and up to `limit` bytes of it (lossy UTF-8), if
/// it has one that may be read.
fn read_one(dir: &Path, limit: usize) -> Option<(&'static str, String)> {
    let d = open_dir(dir)?;
    for name in NAMES {
        let Ok(mut f) = open_in(&d, OsStr::new(name), OFlag::O_NONBLOCK) else {
            continue;
        };
        let md = f.metadata().ok()?;
        if !md.is_file() || md.nlink() != 1 {
            tracing::warn!(path = %dir.join(name).display(), "not a plain file with one link; skipped");
            return None;
        }
        let mut buf = Vec::new();
        (&mut f).take(limit as u64).read_to_end(&mut buf).ok()?;
        return Some((name, String::from_utf8_lossy(&buf).into_owned()));
    }
    None
}

/// `dir` (absolute) opened as a directory one component at a time from `/`, following no
/// symbolic link at any step: a directory of the chain that became a link since the session
/// was made leads nowhere.
fn open_dir(dir: &Path) -> Option<File> {
    let mut d = File::open("/").ok()?;
    for c in dir.components() {
        match c {
            std::path::Component::RootDir => {}
            std::path::Component::Normal(n) => d = open_in(&d, n, OFlag::O_DIRECTORY).ok()?,
            _ => return None,
        }
    }
    Some(d)
}

/// `name` in the directory `dir`, read-only, never through a symbolic link (`O_NOFOLLOW`),
/// with `extra` flags. Through `/proc/self/fd` (the directory's own link, which names it
/// whatever became of its path), as std has no `openat` and this crate forbids `unsafe`.
fn open_in(dir: &File, name: &OsStr, extra: OFlag) -> std::io::Result<File> {
    let at = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | extra).bits())
        .open(at)
}

/// `text` cut to at most `max` bytes at a character boundary; whether it was cut.
fn clip(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap().join("repo");
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::create_dir_all(root.join("svc/api")).unwrap();
        (t, root)
    }

    #[test]
    fn files_from_the_root_down_the_override_winning_in_its_directory() {
        let (_t, root) = repo();
        std::fs::write(root.join("AGENTS.md"), "Run make test.\n").unwrap();
        std::fs::write(root.join("svc/AGENTS.md"), "Ignored: overridden.\n").unwrap();
        std::fs::write(root.join("svc/AGENTS.override.md"), "Use the svc venv.\n").unwrap();
        let s = section(&root.join("svc/api"));
        let a = s.find("Run make test.").unwrap();
        let b = s.find("Use the svc venv.").unwrap();
        assert!(a < b, "{s}");
        assert!(!s.contains("Ignored"), "{s}");
        assert!(
            s.contains(&format!("--- {}/AGENTS.md ---", root.display())),
            "{s}"
        );
        // Above the repository's root nothing is read.
        std::fs::write(root.parent().unwrap().join("AGENTS.md"), "outside\n").unwrap();
        assert!(!section(&root.join("svc/api")).contains("outside"));
    }

    #[test]
    fn no_files_no_section_and_without_a_repository_only_the_working_directory() {
        let t = tempfile::tempdir().unwrap();
        let w = t.path().canonicalize().unwrap().join("w");
        std::fs::create_dir(&w).unwrap();
        assert_eq!(section(&w), "");
        std::fs::write(t.path().join("AGENTS.md"), "parent\n").unwrap();
        assert_eq!(section(&w), "");
        std::fs::write(w.join("AGENTS.md"), "here\n").unwrap();
        assert!(section(&w).ends_with("---\nhere"));
    }

    #[test]
    fn links_fifos_and_hard_links_are_not_read() {
        let (t, root) = repo();
        let secret = t.path().join("id_ed25519");
        std::fs::write(&secret, "PRIVATE KEY").unwrap();
        std::os::unix::fs::symlink(&secret, root.join("AGENTS.md")).unwrap();
        assert_eq!(section(&root), "");
        std::fs::remove_file(root.join("AGENTS.md")).unwrap();
        std::fs::hard_link(&secret, root.join("AGENTS.md")).unwrap();
        assert_eq!(section(&root), "");
        std::fs::remove_file(root.join("AGENTS.md")).unwrap();
        nix::unistd::mkfifo(
            &root.join("AGENTS.md"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        // Returns at once (no writer): O_NONBLOCK, then not a regular file.
        assert_eq!(section(&root), "");
        // A directory on the way that became a link is not followed either, last or not.
        std::fs::remove_file(root.join("AGENTS.md")).unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("api")).unwrap();
        std::fs::write(elsewhere.join("AGENTS.md"), "PRIVATE").unwrap();
        std::fs::write(elsewhere.join("api/AGENTS.md"), "PRIVATE").unwrap();
        std::fs::remove_dir_all(root.join("svc")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("svc")).unwrap();
        assert!(!section(&root.join("svc")).contains("PRIVATE"));
        assert!(!section(&root.join("svc/api")).contains("PRIVATE"));
    }

    #[test]
    fn the_whole_is_bounded_at_a_character_boundary() {
        let (_t, root) = repo();
        let big = "é".repeat(MAX_BYTES); // two bytes each
        std::fs::write(root.join("AGENTS.md"), &big).unwrap();
        std::fs::write(root.join("svc/AGENTS.md"), "never reached\n").unwrap();
        let s = section(&root.join("svc"));
        assert!(
            s.ends_with(&format!("(cut at {MAX_BYTES} bytes)")),
            "{}",
            &s[s.len() - 80..]
        );
        assert!(!s.contains("never reached"));
        let body = s.split("---\n").nth(1).unwrap();
        assert!(body.len() <= MAX_BYTES + 40, "{}", body.len());
    }
}
