//! The search of the writable trees for every `.git` (any depth, no tree skipped) and for
//! what host-side programs trip on (FIFOs, sockets, device nodes, names with control
//! characters).
//!
//! The post-run snapshot ([`crate::postrun`]) looks into repositories, but only within its
//! bounds (depth, directory count, skipped dependency and build trees). This search only
//! reads directory entries (`getdents64`, no `stat` but one per `.git`), so it can afford to
//! be complete up to [`MAX_TREE_ENTRIES`] entries:
//! - before a run, every `.git` it finds is protected like `{workdir}/.git` (a read-only
//!   bind of the whole `.git`; a gitdir file protects what it points at, a symlinked `.git`
//!   its target), at most [`MAX_PROTECTED_REPOS`] of them;
//! - after the run, a `.git` that is new or was replaced (another inode or type) is flagged,
//!   and so is every new FIFO, socket, device node or name with a control character;
//! - when the bound is hit, a directory could not be searched, or there were more
//!   repositories than can be protected, a [`FlagKind::SearchCut`] flag says so after every
//!   run (so [`crate::workspace::Workspace`] refuses host-side git until a human looked).

use crate::postrun::{FlagKind, PostRunFlag, open_dir, reach};
use crate::sys;
use std::collections::{BTreeMap, VecDeque};
use std::ops::ControlFlow;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// At most this many directory entries are read, in all the writable trees, by one search.
pub const MAX_TREE_ENTRIES: usize = 200_000;
/// At most this many `.git` found in the writable trees are protected for one run or call.
pub const MAX_PROTECTED_REPOS: usize = 64;

/// What one search found, absolute paths.
#[derive(Debug, Default, Clone)]
pub(crate) struct TreeScan {
    /// Every `.git` entry → what stands there (type and inode), and what its `config` and
    /// `hooks` are (inode, size, change time: a write, a rename over it, an entry added to
    /// or removed from `hooks` all show).
    pub(crate) gits: BTreeMap<PathBuf, (String, String)>,
    /// FIFOs, sockets, device nodes and names with control characters → what they are.
    pub(crate) odd: BTreeMap<PathBuf, (FlagKind, String)>,
    /// Why the search is incomplete (bound hit, a directory that could not be searched).
    pub(crate) cut: Option<String>,
    /// Repositories found but not protected (beyond [`MAX_PROTECTED_REPOS`]).
    pub(crate) unprotected: usize,
}

/// Whether a name holds a control character (C0, DEL or C1): a newline breaks
/// `find | xargs`, ESC reaches terminals.
fn has_control(name: &std::ffi::OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let b = name.as_bytes();
    b.iter().any(|&c| c < 0x20 || c == 0x7f)
        || String::from_utf8_lossy(b)
            .chars()
            .any(|c| ('\u{80}'..='\u{9f}').contains(&c))
}

/// What a special file is, for its flag; `None` for regular files, directories, symlinks.
fn special(d_type: u8) -> Option<&'static str> {
    match d_type {
        libc::DT_FIFO => Some("FIFO (a reader such as cat or an editor blocks on it)"),
        libc::DT_SOCK => Some("socket"),
        libc::DT_CHR => Some("character device node"),
        libc::DT_BLK => Some("block device node"),
        _ => None,
    }
}

/// Searches `trees` (absolute directories; symlinks never followed). A tree inside another
/// one, or inside a `.git`, is left out (searched with the outer one, or git's own).
pub(crate) fn scan(trees: &[PathBuf]) -> TreeScan {
    let mut out = TreeScan::default();
    let mut seen = 0usize;
    let covered = |t: &PathBuf| {
        trees.iter().any(|o| o != t && t.starts_with(o))
            || t.components().any(|c| c.as_os_str() == ".git")
    };
    let mut done: Vec<&PathBuf> = Vec::new();
    for tree in trees {
        if covered(tree) || done.contains(&tree) {
            continue;
        }
        done.push(tree);
        let Ok(root) = std::fs::File::open(tree).map(OwnedFd::from) else {
            continue;
        };
        if !std::fs::metadata(tree).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let mut queue = VecDeque::from([PathBuf::new()]);
        while let Some(rel) = queue.pop_front() {
            let dir = match open_dir(&root, &rel) {
                Ok(dir) => dir,
                Err(e) => {
                    let absent = matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR));
                    if !absent && reach(&root, &rel).is_ok_and(|fd| sys::can_search(&fd)) {
                        out.cut.get_or_insert_with(|| {
                            format!("{} could not be searched", tree.join(&rel).display())
                        });
                    }
                    continue;
                }
            };
            let mut cut = false;
            let listed = sys::visit_dir_typed(&dir, &mut |name, d_type| {
                seen += 1;
                if seen > MAX_TREE_ENTRIES {
                    cut = true;
                    return ControlFlow::Break(());
                }
                let abs = tree.join(&rel).join(name);
                if name == ".git" {
                    let what = match sys::lstat_at(dir.as_raw_fd(), Path::new(name)) {
                        Ok((_, ino, is_dir, is_link)) => {
                            let kind = match (is_dir, is_link) {
                                (true, _) => "directory",
                                (_, true) => "symlink",
                                _ => "file",
                            };
                            format!("{kind}, inode {ino}")
                        }
                        Err(_) => "unexaminable".into(),
                    };
                    let inner = ["config", "hooks"]
                        .map(|f| {
                            let p = Path::new(".git").join(f);
                            match sys::stat_at(dir.as_raw_fd(), &p, libc::AT_SYMLINK_NOFOLLOW) {
                                Ok(st) => format!(
                                    "{f} {}:{}:{}.{}",
                                    st.st_ino, st.st_size, st.st_ctime, st.st_ctime_nsec
                                ),
                                Err(e) => format!("{f} {:?}", e.raw_os_error()),
                            }
                        })
                        .join(", ");
                    out.gits.insert(abs, (what, inner));
                    return ControlFlow::Continue(());
                }
                if has_control(name) {
                    out.odd.insert(
                        abs.clone(),
                        (FlagKind::ControlName, "name with control characters".into()),
                    );
                }
                if let Some(what) = special(d_type) {
                    out.odd.insert(abs, (FlagKind::SpecialFile, what.into()));
                } else if d_type == libc::DT_DIR {
                    queue.push_back(rel.join(name));
                }
                ControlFlow::Continue(())
            });
            if listed.is_err() {
                out.cut.get_or_insert_with(|| {
                    format!("{} could not be listed", tree.join(&rel).display())
                });
            }
            if cut {
                out.cut = Some(format!(
                    "the search stopped after {MAX_TREE_ENTRIES} entries"
                ));
                return out;
            }
        }
    }
    out
}

impl TreeScan {
    /// The `.git` of this (before-run) search to bind read-only, besides `already` (the
    /// policy's protected paths): each `.git` itself, or a symlinked one's target, where it
    /// lies strictly inside a writable tree; at most [`MAX_PROTECTED_REPOS`] (the rest are
    /// counted in `unprotected`).
    pub(crate) fn protect_list(
        &mut self,
        already: &[PathBuf],
        writable: &[PathBuf],
    ) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        let mut left = 0usize;
        for g in self.gits.keys() {
            let target = if std::fs::symlink_metadata(g).is_ok_and(|m| m.file_type().is_symlink()) {
                match std::fs::canonicalize(g) {
                    Ok(t) if t.is_dir() => t,
                    _ => continue,
                }
            } else {
                g.clone()
            };
            let in_tree = writable
                .iter()
                .any(|w| target.starts_with(w) && &target != w);
            if !in_tree || already.iter().any(|p| target.starts_with(p)) || out.contains(&target) {
                continue;
            }
            if out.len() >= MAX_PROTECTED_REPOS {
                left += 1;
                continue;
            }
            out.push(target);
        }
        self.unprotected = left;
        out
    }

    /// The flags for what changed from `self` (before the run) to `after`, paths relative to
    /// `workdir` where they lie in it.
    pub(crate) fn diff(&self, after: &TreeScan, workdir: &Path) -> (Vec<PostRunFlag>, bool) {
        let rel = |p: &Path| {
            p.strip_prefix(workdir)
                .map_or(p.to_path_buf(), Path::to_path_buf)
        };
        let mut flags = Vec::new();
        for (g, (what, inner)) in &after.gits {
            let detail = match self.gits.get(g) {
                None => "created during the run".to_string(),
                Some((old, _)) if old != what => {
                    format!(
                        "replaced during the run (now a {})",
                        what.split(',').next().unwrap_or("")
                    )
                }
                Some((_, old)) if old != inner => {
                    "its config or hooks changed during the run".into()
                }
                Some(_) => continue,
            };
            flags.push(PostRunFlag {
                kind: FlagKind::NewRepository,
                path: rel(g),
                detail,
            });
        }
        for (p, (kind, what)) in &after.odd {
            if self.odd.get(p).is_some_and(|(k, w)| k == kind && w == what) {
                continue;
            }
            flags.push(PostRunFlag {
                kind: *kind,
                path: rel(p),
                detail: format!("{what}, created during the run"),
            });
        }
        let mut cut = false;
        for why in [&self.cut, &after.cut].into_iter().flatten() {
            cut = true;
            flags.push(PostRunFlag {
                kind: FlagKind::SearchCut,
                path: PathBuf::new(),
                detail: format!(
                    "the search for repositories is incomplete ({why}): a .git beyond was neither protected nor checked"
                ),
            });
        }
        if self.unprotected > 0 {
            cut = true;
            flags.push(PostRunFlag {
                kind: FlagKind::SearchCut,
                path: PathBuf::new(),
                detail: format!(
                    "{} repositories in the writable trees beyond the {MAX_PROTECTED_REPOS} protected were writable during the run",
                    self.unprotected
                ),
            });
        }
        (flags, cut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_git_and_odd_names_at_any_depth() {
        let d = std::env::temp_dir().join(format!("ollie-treescan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let root = d.canonicalize().unwrap();
        let deep = root.join("a/b/c/d/e/f/g/h");
        std::fs::create_dir_all(deep.join(".git")).unwrap();
        std::fs::create_dir_all(root.join("node_modules/pkg/.git")).unwrap();
        let before = scan(std::slice::from_ref(&root));
        assert_eq!(before.gits.len(), 2, "{before:?}");
        std::fs::create_dir_all(root.join("dist/x/.git")).unwrap();
        std::fs::write(root.join("a/evil\nname"), "").unwrap();
        std::fs::write(root.join("a/esc\x1b[2J"), "").unwrap();
        let after = scan(std::slice::from_ref(&root));
        let (flags, cut) = before.diff(&after, &root);
        assert!(!cut);
        let kinds: Vec<_> = flags.iter().map(|f| (f.kind, f.path.clone())).collect();
        assert!(
            kinds.contains(&(FlagKind::NewRepository, "dist/x/.git".into())),
            "{kinds:?}"
        );
        assert_eq!(
            kinds
                .iter()
                .filter(|(k, _)| *k == FlagKind::ControlName)
                .count(),
            2,
            "{kinds:?}"
        );
        assert_eq!(flags.len(), 3, "{flags:?}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}

#[cfg(test)]
mod cost {
    use super::*;

    /// Every `.git` of a `node_modules`-like tree is found; the time of one search is printed
    /// (`cargo test -p ollie-sandbox --lib treescan::tests::every_git -- --nocapture`).
    #[test]
    fn every_git_of_a_large_tree_is_found() {
        let d = std::env::temp_dir().join(format!("ollie-treescan-cost-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        // 500 packages of 4 directories and 20 files each (~12,500 entries), 5 with a .git.
        for p in 0..500 {
            let pkg = d.join("node_modules").join(format!("pkg{p}"));
            for sub in ["lib", "lib/util", "dist", "test"] {
                std::fs::create_dir_all(pkg.join(sub)).unwrap();
                for f in 0..5 {
                    std::fs::write(pkg.join(sub).join(format!("f{f}.js")), "").unwrap();
                }
            }
            if p % 100 == 0 {
                std::fs::create_dir_all(pkg.join(".git/hooks")).unwrap();
                std::fs::write(pkg.join(".git/config"), "").unwrap();
            }
        }
        let root = d.canonicalize().unwrap();
        let trees = [root.clone()];
        let _ = scan(&trees);
        let n = 3;
        let t = std::time::Instant::now();
        let mut found = 0;
        for _ in 0..n {
            found = scan(&trees).gits.len();
        }
        let per = t.elapsed() / n;
        println!("treescan: {found} .git in ~12,500 entries: {per:?} per search");
        assert_eq!(found, 5);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
