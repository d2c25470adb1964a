//! The post-run diff: what a tool left behind that would run *unsandboxed* later.
//!
//! Read-only binds stop writes to the protected paths a policy names, but only under the mount
//! namespace and only for the names listed. Anything else that host-side programs execute on
//! the user's behalf — git hooks and config of nested repositories, direnv's `.envrc`, editor
//! and agent settings — is snapshotted before each run and compared afterwards; every new or
//! changed item becomes a [`PostRunFlag`] in the run record. [`crate::workspace::Workspace`]
//! refuses host-side git until a human acknowledges the flags.
//!
//! What is watched, for the workspace and every repository found in it:
//! - `<gitdir>/hooks/*` (not `*.sample`): new, changed content, mode or symlink target;
//! - `<gitdir>/config` and `config.worktree`: keys that make git run a command or reroute
//!   credentials/URLs (`core.hooksPath`, `core.fsmonitor`, `core.sshCommand`, `core.pager`,
//!   `core.editor`, `core.askpass`, `credential.*helper`, `url.*.insteadOf`, `include.path`,
//!   `includeIf.*.path`, `filter.*.{clean,smudge,process}`, `diff.*.{textconv,command}`,
//!   `diff.external`, `merge.*.driver`, `gpg.program`, `sequence.editor`, `alias.* = !…`),
//!   when new or changed;
//! - `<gitdir>/config` and `config.worktree` changed in any other way;
//! - everything else git reads as configuration or follows: `commondir`, `info/*`,
//!   `objects/info/alternates` and `http-alternates`, `worktrees/*/{commondir,gitdir,
//!   config.worktree}`, and each submodule gitdir `modules/*` (scanned like a repository:
//!   hooks, config, …), new, changed or removed; `.gitmodules` beside each repository;
//! - a `.git` directory or file that did not exist before (a new nested repository); beyond
//!   this snapshot's bounds, `crate::treescan` finds every `.git` (any depth, skipped trees
//!   included), protects the existing ones for the run and flags new or replaced ones, FIFOs,
//!   sockets, device nodes and names with control characters;
//! - `.envrc`, `.claude/settings.json`, `.claude/settings.local.json`, `.vscode/tasks.json`,
//!   `.vscode/settings.json`, `.vscode/launch.json`, `.gitmodules` at the workspace root: new
//!   or changed;
//! - any set-id file (S_ISUID or S_ISGID on a regular file, S_ISUID on anything) left in a
//!   writable tree after the run (`setid_flags`; the seccomp filter already refuses to
//!   make one, so this is a second line), at most [`MAX_SETID_ENTRIES`] entries per run,
//!   not inside the dependency and build trees of [`SKIPPED_DIRS`] (it runs after every
//!   call, so its cost must stay small in large workspaces).
//!
//! What the runner cannot look into is not taken as empty. A runner without `CAP_DAC_*` (an
//! unprivileged user, or root in a hardened unit) is refused what the tool (the same user,
//! no more privileged) can make unreadable: a hooks directory of mode 111 can still be
//! entered and its hooks still run. So a file that cannot be read is fingerprinted by its
//! `stat` (mode, inode, change time, which no tool can set), and a place that cannot be
//! listed or reached — or a symlinked hooks directory pointing outside the workspace — is a
//! *blind spot*: flagged after every run if something beneath it could change unseen (it can
//! be entered, or is a symlink), else whenever it appears or changes. A symlinked hooks
//! directory pointing inside the workspace is scanned where it points.
//!
//! Cost is bounded: the search for nested repositories visits at most [`MAX_DIRS`]
//! directories, [`MAX_DEPTH`] levels deep, skips dependency and build trees
//! ([`SKIPPED_DIRS`]) and the inside of `.git` directories, and scans at most [`MAX_REPOS`]
//! repositories; files are hashed up to [`MAX_FILE_BYTES`]. When a bound is hit the record
//! says so (`truncated`). Every open is `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` with
//! `O_NONBLOCK` (a planted FIFO or symlink cannot block or redirect the runner).

use crate::sys;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::ops::ControlFlow;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// At most this many directories are visited looking for nested repositories.
pub const MAX_DIRS: usize = 2000;
/// Nested repositories are looked for at most this deep below the workspace.
pub const MAX_DEPTH: usize = 6;
/// At most this many repositories (the workspace's own included) are scanned.
pub const MAX_REPOS: usize = 64;
/// Files are hashed up to this size (larger ones by size and mode only).
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Directory names never descended into when looking for nested repositories.
pub const SKIPPED_DIRS: &[&str] = &[
    "node_modules",
    "target",
    ".tmp",
    ".cache",
    "__pycache__",
    ".venv",
    "venv",
    ".tox",
    "dist",
    "build",
];
/// Files at the workspace root that host-side tools execute or obey.
pub const WATCHED_FILES: &[&str] = &[
    ".envrc",
    ".claude",
    ".vscode",
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".vscode/tasks.json",
    ".vscode/settings.json",
    ".vscode/launch.json",
    ".gitmodules",
];

/// Files of a gitdir that git reads as configuration or follows (besides `config`, hooks and
/// the directories below), fingerprinted whole.
pub const GIT_METADATA: &[&str] = &[
    "commondir",
    "objects/info/alternates",
    "objects/info/http-alternates",
];

/// Directories of a gitdir whose every file is fingerprinted: git reads `info/` (attributes,
/// excludes, sparse checkout, grafts), and each linked worktree's gitdir names where it
/// lives and which repository it shares (`commondir`, `gitdir`, `config.worktree`).
pub const GIT_METADATA_DIRS: &[&str] = &["info"];

/// Submodule gitdirs (`modules/NAME`) are scanned like repositories at most this deep.
pub const MAX_MODULE_DEPTH: usize = 3;

/// At most this many directory entries are looked at for set-id files after a run (about
/// 10–20 ms on the reference machine at the bound).
pub const MAX_SETID_ENTRIES: usize = 10_000;

/// What kind of persistence a flag is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlagKind {
    /// A git hook was created or changed (content, mode or link target).
    GitHook,
    /// A git config key that runs a command or reroutes URLs/credentials was set or changed.
    GitConfig,
    /// A `.git` directory or file appeared (a new, possibly nested, repository).
    NewRepository,
    /// A watched editor/agent/direnv file was created or changed.
    WatchedFile,
    /// Something else git reads as configuration or follows was created, changed or removed
    /// (`commondir`, `info/`, alternates, linked worktrees, submodule gitdirs).
    GitMetadata,
    /// A set-id file was found in a writable tree after the run.
    SetId,
    /// A place the runner cannot look into (list, reach or follow) appeared or changed, or
    /// can hide changes beneath it: what lies there was not checked.
    Unreadable,
    /// A FIFO, socket or device node appeared in a writable tree (a FIFO blocks whatever
    /// host-side program reads it).
    SpecialFile,
    /// A name with a control character (newline, ESC, any C0, DEL or C1) appeared in a
    /// writable tree (a newline splits `find | xargs` input, ESC reaches terminals).
    ControlName,
    /// The search for repositories in the writable trees (every `.git`, at any depth) is
    /// incomplete, or found more than it can protect: a `.git` there was not checked.
    SearchCut,
}

/// One thing a human should look at before running host-side tools in the workspace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PostRunFlag {
    /// What kind of change.
    pub kind: FlagKind,
    /// The path, relative to the workspace.
    pub path: PathBuf,
    /// What changed (for config keys: `key = value`, truncated).
    pub detail: String,
}

impl std::fmt::Display for PostRunFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            FlagKind::GitHook => "git hook",
            FlagKind::GitConfig => "risky git config",
            FlagKind::NewRepository => "new git repository",
            FlagKind::WatchedFile => "host-executed file",
            FlagKind::GitMetadata => "git metadata",
            FlagKind::SetId => "set-id file",
            FlagKind::Unreadable => "unchecked place",
            FlagKind::SpecialFile => "special file",
            FlagKind::ControlName => "name with control characters",
            FlagKind::SearchCut => "incomplete repository search",
        };
        // One line, whatever the tool wrote: control characters of the detail become `?`,
        // those of the path (which the flag is about) `\u{..}`, so the name can be told.
        let detail: String = self
            .detail
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        let mut path = String::new();
        for c in self.path.to_string_lossy().chars() {
            if c.is_control() {
                path.push_str(&format!("\\u{{{:X}}}", u32::from(c)));
            } else {
                path.push(c);
            }
        }
        let path = if path.is_empty() { "." } else { &path };
        write!(f, "{what} {path}: {detail}")
    }
}

/// The post-run section of the run record.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PostRunRecord {
    /// Every new or changed item (empty: nothing to review).
    pub flags: Vec<PostRunFlag>,
    /// Repositories scanned (the workspace's own included).
    pub repositories: usize,
    /// A bound was hit: deeper or later repositories were not scanned.
    pub truncated: bool,
}

impl PostRunRecord {
    /// Adds flags found apart from the snapshot diff (e.g. [`setid_flags`]) and whether that
    /// search was cut short.
    pub(crate) fn add(&mut self, (flags, truncated): (Vec<PostRunFlag>, bool)) {
        self.flags.extend(flags);
        self.flags.sort();
        self.flags.dedup();
        self.truncated |= truncated;
    }
}

/// Fingerprint of one file: mode, size and content hash (or symlink target).
type Print = String;

/// What was there before (or after) a run.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// Repository marker (`.git` dir or file) → kind.
    repos: BTreeSet<PathBuf>,
    /// Hook path → fingerprint.
    hooks: BTreeMap<PathBuf, Print>,
    /// Config path → risky `key = value` entries.
    config: BTreeMap<PathBuf, BTreeSet<String>>,
    /// Watched file → fingerprint.
    files: BTreeMap<PathBuf, Print>,
    /// Git metadata file (and whole config files) → fingerprint.
    meta: BTreeMap<PathBuf, Print>,
    /// Places the runner could not look into → what they are.
    blind: BTreeMap<PathBuf, Blind>,
    truncated: bool,
}

/// A place the runner could not look into (a directory it may not list, or reach; a
/// symlink where the scan does not follow; the workspace itself, when it cannot be opened).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Blind {
    /// Why, and what stands there ([`stat_print`]).
    print: Print,
    /// Whether something beneath it could change while it stays the same: a directory the
    /// runner may enter but not list, or a symlink. Such a place is flagged after every run,
    /// not only when it changed.
    open: bool,
}

const DIR: i32 = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK;

/// Whether an error means "nothing there" (gone, or not a directory where one was looked
/// for) rather than "there, but out of sight".
fn is_absent(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
}

/// Opens the directory `rel` beneath the root for listing (read permission needed): a new
/// open file description, also for the root itself, so no two listings share an offset.
pub(crate) fn open_dir(root: &OwnedFd, rel: &Path) -> std::io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    sys::openat2_beneath(root.as_raw_fd(), rel, DIR, 0)
}

/// An `O_PATH` descriptor for `rel` beneath the root, the last component not followed: for
/// lookups and `stat`s, which need only search permission on the way.
pub(crate) fn reach(root: &OwnedFd, rel: &Path) -> std::io::Result<OwnedFd> {
    if rel.as_os_str().is_empty() {
        return root.try_clone();
    }
    sys::openat2_beneath(root.as_raw_fd(), rel, libc::O_PATH | libc::O_NOFOLLOW, 0)
}

/// The entries of the directory `rel` that `keep` accepts, sorted: `(name, is_dir,
/// is_symlink)`. Only those are copied: the workspace walk keeps directories and `.git`, so
/// a directory of many files costs no memory per file.
fn list(
    root: &OwnedFd,
    rel: &Path,
    keep: &mut dyn FnMut(&std::ffi::OsStr, bool, bool) -> bool,
) -> std::io::Result<Vec<(std::ffi::OsString, bool, bool)>> {
    let mut out = sys::dir_entries_where(&open_dir(root, rel)?, keep)?;
    out.sort();
    Ok(out)
}

/// Every entry of the directory `rel` (see [`list`]).
fn list_all(root: &OwnedFd, rel: &Path) -> std::io::Result<Vec<(std::ffi::OsString, bool, bool)>> {
    list(root, rel, &mut |_, _, _| true)
}

/// What the workspace walk of [`Snapshot::take`] looks at: repository markers (`.git`, of any
/// type) and directories it may descend into (not symlinks).
fn walked(name: &std::ffi::OsStr, is_dir: bool, is_link: bool) -> bool {
    name == ".git" || (is_dir && !is_link)
}

/// What stands behind a descriptor, from its `stat` alone: type, mode, inode and change time
/// (which no tool can set: a write, a chmod, an entry added or removed all move it), or a
/// symlink's target.
fn stat_print(fd: &OwnedFd) -> std::io::Result<Print> {
    let st = sys::fstat(fd)?;
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFLNK => return Ok(format!("symlink to {}", sys::readlink_fd(fd)?.display())),
        libc::S_IFDIR => "directory",
        libc::S_IFREG => "file",
        _ => "special file",
    };
    Ok(format!(
        "{kind}, mode {:o} [inode {}, changed {}.{:09}]",
        st.st_mode & 0o7777,
        st.st_ino,
        st.st_ctime,
        st.st_ctime_nsec
    ))
}

/// A fingerprint as people read it: without the bracketed part of a [`stat_print`], which
/// only tells two states apart.
fn shown(print: &str) -> &str {
    match print.rfind(" [") {
        Some(i) if print.ends_with(']') => &print[..i],
        _ => print,
    }
}

/// Fingerprint of the entry `name` of the directory `pdir` (an `O_PATH` descriptor will do):
/// mode, size and content hash; a symlink's target (not followed); FIFOs and devices by type
/// only. One the runner cannot read is fingerprinted by [`stat_print`], so a change to it
/// still shows. `None`: nothing there.
fn print_in(pdir: &OwnedFd, name: &std::ffi::OsStr) -> std::io::Result<Option<Print>> {
    let (_, _, is_dir, is_link) = match sys::lstat_at(pdir.as_raw_fd(), Path::new(name)) {
        Ok(st) => st,
        Err(e) if is_absent(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    if is_dir {
        return Ok(Some("dir".into()));
    }
    let read = || -> std::io::Result<Print> {
        if is_link {
            let fd = sys::openat2_beneath(
                pdir.as_raw_fd(),
                Path::new(name),
                libc::O_PATH | libc::O_NOFOLLOW,
                0,
            )?;
            return Ok(format!("symlink:{}", sys::readlink_fd(&fd)?.display()));
        }
        let fd = sys::openat2_beneath(
            pdir.as_raw_fd(),
            Path::new(name),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
        )?;
        let f = std::fs::File::from(fd);
        let md = f.metadata()?;
        use std::os::unix::fs::MetadataExt;
        if !md.is_file() {
            return Ok(format!("special:{:o}", md.mode()));
        }
        let mut h = Sha256::new();
        if md.len() <= MAX_FILE_BYTES {
            let mut buf = Vec::new();
            f.take(MAX_FILE_BYTES).read_to_end(&mut buf)?;
            h.update(&buf);
        }
        let digest: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Ok(format!("{:o}:{}:{digest}", md.mode(), md.len()))
    };
    match read() {
        Ok(p) => Ok(Some(p)),
        Err(e) if is_absent(&e) => Ok(None),
        Err(e) => {
            let fd = sys::openat2_beneath(
                pdir.as_raw_fd(),
                Path::new(name),
                libc::O_PATH | libc::O_NOFOLLOW,
                0,
            )?;
            Ok(Some(format!("unreadable ({e}): {}", stat_print(&fd)?)))
        }
    }
}

/// Reads a small regular file beneath the root (no symlinks, no FIFOs).
fn read_small(root: &OwnedFd, rel: &Path) -> Option<String> {
    let fd = sys::openat2_beneath(
        root.as_raw_fd(),
        rel,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
        0,
    )
    .ok()?;
    let f = std::fs::File::from(fd);
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut buf = Vec::new();
    f.take(MAX_FILE_BYTES).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Whether `section[.subsection].key` (lowercased section and key) makes git run a command
/// or reroute URLs or credentials.
fn risky(section: &str, sub: Option<&str>, key: &str, value: &str) -> bool {
    match (section, sub.is_some(), key) {
        (
            "core",
            false,
            "hookspath" | "fsmonitor" | "sshcommand" | "pager" | "editor" | "askpass" | "gitproxy",
        ) => true,
        ("credential", _, "helper") => true,
        ("url", true, "insteadof" | "pushinsteadof") => true,
        ("include", false, "path") | ("includeif", true, "path") => true,
        ("filter", true, "clean" | "smudge" | "process") => true,
        ("diff", true, "textconv" | "command") | ("diff", false, "external") => true,
        ("merge", true, "driver") => true,
        ("gpg", _, "program") | ("sequence", false, "editor") => true,
        ("uploadpack", false, "packobjectshook") => true,
        ("alias", false, _) => value.trim_start().starts_with('!'),
        _ => false,
    }
}

/// The risky entries of a git config file, as `section[.sub].key = value` lines.
pub(crate) fn risky_config_entries(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut section = String::new();
    let mut sub: Option<String> = None;
    for raw in text.lines() {
        let mut line = raw.trim();
        if line.starts_with('[') {
            let Some(end) = line.find(']') else { continue };
            let head = &line[1..end];
            line = line[end + 1..].trim();
            if let Some(q) = head.find('"') {
                section = head[..q].trim().to_ascii_lowercase();
                sub = Some(head[q + 1..].trim_end_matches('"').to_string());
            } else if let Some((s, rest)) = head.split_once('.') {
                // Deprecated `[section.sub]` form.
                section = s.trim().to_ascii_lowercase();
                sub = Some(rest.trim().to_string());
            } else {
                section = head.trim().to_ascii_lowercase();
                sub = None;
            }
        }
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim().to_ascii_lowercase(), v.trim()),
            None => (line.to_ascii_lowercase(), "true"),
        };
        if risky(&section, sub.as_deref(), &key, value) {
            let name = match &sub {
                Some(s) => format!("{section}.{s}.{key}"),
                None => format!("{section}.{key}"),
            };
            let value: String = value.chars().take(200).collect();
            out.insert(format!("{name} = {value}"));
        }
    }
    out
}

impl Snapshot {
    /// Takes a snapshot of `workdir` (absolute). Never fails: what cannot be looked into is
    /// recorded as such ([`Blind`]), so the diff flags it instead of missing what it hides.
    pub(crate) fn take(workdir: &Path) -> Snapshot {
        let mut s = Snapshot::default();
        let root = match std::fs::File::open(workdir).map(OwnedFd::from) {
            Ok(root) => root,
            Err(e) => {
                let print = format!("the workspace cannot be opened: {e}");
                s.blind.insert(PathBuf::new(), Blind { print, open: true });
                return s;
            }
        };
        // Each parent directory of the watched files is reached once.
        let mut parent: Option<(&Path, std::io::Result<OwnedFd>)> = None;
        for f in WATCHED_FILES {
            let rel = Path::new(f);
            let (Some(dir), Some(name)) = (rel.parent(), rel.file_name()) else {
                continue;
            };
            let printed = if dir.as_os_str().is_empty() {
                print_in(&root, name)
            } else {
                if parent.as_ref().is_none_or(|(d, _)| *d != dir) {
                    parent = Some((dir, reach(&root, dir)));
                }
                match &parent {
                    Some((_, Ok(pdir))) => print_in(pdir, name),
                    // Missing or a file: nothing beneath it (a symlinked `.vscode` is
                    // fingerprinted as the watched entry it also is); else a blind spot.
                    Some((_, Err(e))) => {
                        s.blind_spot(&root, dir, e);
                        Ok(None)
                    }
                    None => Ok(None),
                }
            };
            if let Some(p) = s.seen(&root, rel, printed) {
                s.files.insert(PathBuf::from(f), p);
            }
        }
        // Breadth first, so the bounds cut the deepest levels first.
        let mut queue = std::collections::VecDeque::from([(PathBuf::new(), 0usize)]);
        let mut visited = 0usize;
        while let Some((rel, depth)) = queue.pop_front() {
            visited += 1;
            if visited > MAX_DIRS {
                s.truncated = true;
                break;
            }
            let listed = match list(&root, &rel, &mut walked) {
                Ok(listed) => listed,
                Err(e) => {
                    s.blind_spot(&root, &rel, &e);
                    continue;
                }
            };
            for (name, is_dir, is_link) in listed {
                let child = rel.join(&name);
                if name == ".git" {
                    if s.repos.len() >= MAX_REPOS {
                        s.truncated = true;
                        continue;
                    }
                    // A symlinked `.git` counts as a repository marker; it is not followed.
                    s.repos.insert(child.clone());
                    if is_link {
                        continue;
                    }
                    if is_dir {
                        s.scan_gitdir(&root, workdir, &child, 0);
                    } else if let Some(gitdir) = gitfile_target(&root, &child, workdir) {
                        s.scan_gitdir(&root, workdir, &gitdir, 0);
                    }
                    // The work tree's `.gitmodules` (the workspace root's is a watched file).
                    if !rel.as_os_str().is_empty() {
                        let modules = rel.join(".gitmodules");
                        if let Some(p) = s.print(&root, &modules) {
                            s.meta.insert(modules, p);
                        }
                    }
                    continue;
                }
                if !is_dir || is_link {
                    continue;
                }
                if SKIPPED_DIRS.iter().any(|d| name == *d) {
                    continue;
                }
                if depth + 1 > MAX_DEPTH {
                    s.truncated = true;
                    continue;
                }
                queue.push_back((child, depth + 1));
            }
        }
        s
    }

    /// Records `rel`, which is there but could not be looked into (`err`), as a blind spot;
    /// when `rel` itself cannot be reached, the nearest directory above it that can (whose
    /// change time then tells whether the tool could have gone past it).
    fn blind_spot(&mut self, root: &OwnedFd, rel: &Path, err: &std::io::Error) {
        if is_absent(err) {
            return;
        }
        let mut at = rel;
        let fd = loop {
            match reach(root, at) {
                Ok(fd) => break fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return,
                Err(_) => match at.parent() {
                    Some(up) => at = up,
                    None => return,
                },
            }
        };
        let (what, open) = match stat_print(&fd) {
            Ok(p) if p.starts_with("symlink") => (p, true),
            // Reached, not looked into: it can hide what lies beneath if it can be entered.
            // If not, the tool (no more privileged than the runner) could only have gone
            // past it by changing its mode, which changes this fingerprint.
            Ok(p) => {
                let open = sys::can_search(&fd);
                (p, open)
            }
            Err(e) => (format!("cannot be examined: {e}"), true),
        };
        let print = if at == rel {
            format!("{err}; {what}")
        } else {
            format!("{} cannot be reached ({err}); {what}", rel.display())
        };
        self.blind.insert(at.to_path_buf(), Blind { print, open });
    }

    /// A fingerprint ([`print_in`]'s answer for `rel`): kept, or, when `rel` could not be
    /// examined, recorded as a blind spot.
    fn seen(
        &mut self,
        root: &OwnedFd,
        rel: &Path,
        printed: std::io::Result<Option<Print>>,
    ) -> Option<Print> {
        match printed {
            Ok(p) => p,
            Err(e) => {
                self.blind_spot(root, rel, &e);
                None
            }
        }
    }

    /// Fingerprint of `rel` (see [`print_in`]); `None` when nothing is there, or when it
    /// could not be examined (then recorded as a blind spot).
    fn print(&mut self, root: &OwnedFd, rel: &Path) -> Option<Print> {
        let (parent, name) = (rel.parent()?, rel.file_name()?);
        let printed = match reach(root, parent) {
            Ok(pdir) => print_in(&pdir, name),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e),
        };
        self.seen(root, rel, printed)
    }

    fn scan_gitdir(&mut self, root: &OwnedFd, workdir: &Path, gitdir: &Path, depth: usize) {
        let hooks = gitdir.join("hooks");
        match list_all(root, &hooks) {
            Ok(listed) => self.scan_hooks(root, &hooks, &hooks, listed),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                self.scan_linked_hooks(root, workdir, &hooks, &e);
            }
            Err(e) => self.blind_spot(root, &hooks, &e),
        }
        for cfg in ["config", "config.worktree"] {
            let rel = gitdir.join(cfg);
            if let Some(text) = read_small(root, &rel) {
                self.config.insert(rel.clone(), risky_config_entries(&text));
            }
            if let Some(p) = self.print(root, &rel) {
                self.meta.insert(rel, p);
            }
        }
        for f in GIT_METADATA {
            let rel = gitdir.join(f);
            if let Some(p) = self.print(root, &rel) {
                self.meta.insert(rel, p);
            }
        }
        for d in GIT_METADATA_DIRS {
            self.print_dir(root, &gitdir.join(d));
        }
        // Linked worktrees: what each one's gitdir says about where it lives and what it
        // shares.
        let worktrees = gitdir.join("worktrees");
        match list_all(root, &worktrees) {
            Ok(listed) => {
                for (name, is_dir, _) in listed.into_iter().take(MAX_REPOS) {
                    let rel = worktrees.join(&name);
                    if !is_dir {
                        if let Some(p) = self.print(root, &rel) {
                            self.meta.insert(rel, p);
                        }
                        continue;
                    }
                    self.meta.insert(rel.clone(), "dir".into());
                    for f in ["commondir", "gitdir", "config.worktree"] {
                        if let Some(p) = self.print(root, &rel.join(f)) {
                            self.meta.insert(rel.join(f), p);
                        }
                    }
                }
            }
            Err(e) => self.blind_spot(root, &worktrees, &e),
        }
        // Submodule gitdirs are repositories of their own (hooks, config, …).
        let modules = gitdir.join("modules");
        match list_all(root, &modules) {
            Ok(listed) => {
                for (name, is_dir, _) in listed.into_iter().take(MAX_REPOS) {
                    let rel = modules.join(&name);
                    if !is_dir {
                        continue;
                    }
                    if depth + 1 > MAX_MODULE_DEPTH {
                        self.truncated = true;
                        continue;
                    }
                    self.meta.insert(rel.clone(), "dir".into());
                    self.scan_gitdir(root, workdir, &rel, depth + 1);
                }
            }
            Err(e) => self.blind_spot(root, &modules, &e),
        }
    }

    /// Fingerprints the hooks `listed` in the directory `dir` (which `hooks` names for git:
    /// the same path, or a symlink to it), `*.sample` left out.
    fn scan_hooks(
        &mut self,
        root: &OwnedFd,
        hooks: &Path,
        dir: &Path,
        listed: Vec<(std::ffi::OsString, bool, bool)>,
    ) {
        let pdir = match reach(root, dir) {
            Ok(pdir) => pdir,
            Err(e) => return self.blind_spot(root, dir, &e),
        };
        for (name, _, _) in listed {
            if name.to_string_lossy().ends_with(".sample") {
                continue;
            }
            let printed = print_in(&pdir, &name);
            if let Some(p) = self.seen(root, &dir.join(&name), printed) {
                self.hooks.insert(hooks.join(&name), p);
            }
        }
    }

    /// A hooks directory that is a symlink (`ln -s ../../githooks .git/hooks`): git runs
    /// what lies where it points, so that is scanned when it lies in the workspace (the link
    /// itself is fingerprinted as metadata: a new target is a change); anywhere else, or
    /// through more symlinks, it is a blind spot.
    fn scan_linked_hooks(
        &mut self,
        root: &OwnedFd,
        workdir: &Path,
        hooks: &Path,
        err: &std::io::Error,
    ) {
        let Some(link) = self.print(root, hooks) else {
            return;
        };
        let target = reach(root, hooks)
            .and_then(|fd| sys::readlink_fd(&fd))
            .ok()
            .and_then(|t| inside(workdir, hooks.parent()?, &t));
        self.meta.insert(hooks.to_path_buf(), link);
        let Some(target) = target else {
            return self.blind_spot(root, hooks, err);
        };
        match list_all(root, &target) {
            Ok(listed) => self.scan_hooks(root, hooks, &target, listed),
            Err(e) if is_absent(&e) => {}
            Err(_) => self.blind_spot(root, hooks, err),
        }
    }

    /// Fingerprints every entry of the directory `rel` (not recursing).
    fn print_dir(&mut self, root: &OwnedFd, rel: &Path) {
        let listed = match list_all(root, rel) {
            Ok(listed) => listed,
            Err(e) => return self.blind_spot(root, rel, &e),
        };
        let pdir = match reach(root, rel) {
            Ok(pdir) => pdir,
            Err(e) => return self.blind_spot(root, rel, &e),
        };
        for (name, _, _) in listed.into_iter().take(MAX_DIRS) {
            let printed = print_in(&pdir, &name);
            if let Some(p) = self.seen(root, &rel.join(&name), printed) {
                self.meta.insert(rel.join(&name), p);
            }
        }
    }

    /// What changed from `self` (before) to `after`.
    pub(crate) fn diff(&self, after: &Snapshot) -> PostRunRecord {
        let mut flags = Vec::new();
        for r in after.repos.difference(&self.repos) {
            flags.push(PostRunFlag {
                kind: FlagKind::NewRepository,
                path: r.clone(),
                detail: "created during the run".into(),
            });
        }
        for (p, v) in &after.hooks {
            let detail = match self.hooks.get(p) {
                None => "created during the run",
                Some(old) if old != v => "changed during the run",
                Some(_) => continue,
            };
            flags.push(PostRunFlag {
                kind: FlagKind::GitHook,
                path: p.clone(),
                detail: described(detail, v),
            });
        }
        let empty = BTreeSet::new();
        for (p, entries) in &after.config {
            let old = self.config.get(p).unwrap_or(&empty);
            for e in entries.difference(old) {
                flags.push(PostRunFlag {
                    kind: FlagKind::GitConfig,
                    path: p.clone(),
                    detail: e.clone(),
                });
            }
        }
        for (p, v) in &after.files {
            let detail = match self.files.get(p) {
                None => "created during the run",
                Some(old) if old != v => "changed during the run",
                Some(_) => continue,
            };
            flags.push(PostRunFlag {
                kind: FlagKind::WatchedFile,
                path: p.clone(),
                detail: described(detail, v),
            });
        }
        // Any other change to git metadata (config files whose risky entries did not change
        // included), and anything removed.
        for (p, v) in &after.meta {
            let detail = match self.meta.get(p) {
                None => "created during the run",
                Some(old) if old != v => "changed during the run",
                Some(_) => continue,
            };
            let is_config = after.config.contains_key(p);
            if is_config && flags.iter().any(|f| &f.path == p) {
                continue;
            }
            flags.push(PostRunFlag {
                kind: if is_config {
                    FlagKind::GitConfig
                } else {
                    FlagKind::GitMetadata
                },
                path: p.clone(),
                detail: described(detail, v),
            });
        }
        for p in self.meta.keys().filter(|p| !after.meta.contains_key(*p)) {
            flags.push(PostRunFlag {
                kind: FlagKind::GitMetadata,
                path: p.clone(),
                detail: "removed during the run".into(),
            });
        }
        for (p, b) in &after.blind {
            let detail = if b.open {
                "the runner cannot look into it, so nothing beneath it was checked"
            } else {
                match self.blind.get(p) {
                    None => "the runner cannot look into it since the run",
                    Some(old) if old != b => {
                        "changed during the run; the runner cannot look into it"
                    }
                    Some(_) => continue,
                }
            };
            flags.push(PostRunFlag {
                kind: FlagKind::Unreadable,
                path: p.clone(),
                detail: format!("{detail}: {}", shown(&b.print)),
            });
        }
        flags.sort();
        PostRunRecord {
            flags,
            repositories: after.repos.len(),
            truncated: self.truncated || after.truncated,
        }
    }
}

/// A flag's detail: `what` happened, and, for an item the runner could not read, what it
/// saw instead.
fn described(what: &str, print: &str) -> String {
    if print.starts_with("unreadable") {
        format!("{what}; {}", shown(print))
    } else {
        what.into()
    }
}

/// Whether a mode makes a file run with its owner's or group's rights: S_ISUID on anything,
/// S_ISGID on a regular file (on a directory S_ISGID only makes new entries inherit the
/// group, which the host set up).
fn is_setid(mode: u32) -> bool {
    let fmt = mode & libc::S_IFMT;
    mode & libc::S_ISUID != 0 || (fmt == libc::S_IFREG && mode & libc::S_ISGID != 0)
}

/// Every set-id file in the writable directories `trees` (absolute; symlinks never
/// followed, other filesystems' mounts included), as flags whose path is relative to
/// `workdir` where it lies inside it. Skips [`SKIPPED_DIRS`]; looks at most at
/// [`MAX_SETID_ENTRIES`] entries in all; `true` when that bound cut the search short, or
/// when part of it could not be searched (a directory the runner may enter but not list, an
/// entry it could not examine).
pub(crate) fn setid_flags(trees: &[PathBuf], workdir: &Path) -> (Vec<PostRunFlag>, bool) {
    let mut flags = Vec::new();
    let mut unsearched = false;
    let mut seen = 0usize;
    for tree in trees {
        let Ok(root) = std::fs::File::open(tree).map(OwnedFd::from) else {
            continue;
        };
        if !std::fs::metadata(tree).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let mut queue = std::collections::VecDeque::from([PathBuf::new()]);
        while let Some(rel) = queue.pop_front() {
            let dir = match open_dir(&root, &rel) {
                Ok(dir) => dir,
                Err(e) => {
                    // One the runner may not list but anyone could enter: not searched.
                    unsearched |=
                        !is_absent(&e) && reach(&root, &rel).is_ok_and(|fd| sys::can_search(&fd));
                    continue;
                }
            };
            // Streamed, not listed: a directory of many files costs no memory per file.
            let mut cut = false;
            let listed = sys::visit_dir_entries(&dir, &mut |name, is_dir, is_link| {
                seen += 1;
                if seen > MAX_SETID_ENTRIES {
                    cut = true;
                    return ControlFlow::Break(());
                }
                if is_link {
                    return ControlFlow::Continue(());
                }
                let mode = match sys::mode_at(dir.as_raw_fd(), Path::new(name)) {
                    Ok(mode) => mode,
                    Err(e) => {
                        unsearched |= !is_absent(&e);
                        return ControlFlow::Continue(());
                    }
                };
                if is_setid(mode) {
                    let abs = tree.join(&rel).join(name);
                    flags.push(PostRunFlag {
                        kind: FlagKind::SetId,
                        path: abs
                            .strip_prefix(workdir)
                            .map_or(abs.clone(), Path::to_path_buf),
                        detail: format!("mode {:o}", mode & 0o7777),
                    });
                }
                if is_dir && !SKIPPED_DIRS.iter().any(|d| name == *d) {
                    queue.push_back(rel.join(name));
                }
                ControlFlow::Continue(())
            });
            unsearched |= listed.is_err();
            if cut {
                return (flags, true);
            }
        }
    }
    (flags, unsearched)
}

/// The workspace-relative gitdir a `.git` file points at, if it lies inside the workspace.
fn gitfile_target(root: &OwnedFd, dotgit: &Path, workdir: &Path) -> Option<PathBuf> {
    let text = read_small(root, dotgit)?;
    let target = text.lines().next()?.strip_prefix("gitdir:")?.trim();
    inside(workdir, dotgit.parent()?, Path::new(target))
}

/// Where `target` (as a `.git` file or a symlink in the directory `base` names it: absolute,
/// or relative to `base`) lies, relative to the workspace; `None` outside it. Lexical: the
/// opens that follow refuse symlinks and escapes anyway.
fn inside(workdir: &Path, base: &Path, target: &Path) -> Option<PathBuf> {
    let abs = if target.is_absolute() {
        target.to_path_buf()
    } else {
        workdir.join(base).join(target)
    };
    let mut norm = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                norm.pop();
            }
            std::path::Component::CurDir => {}
            other => norm.push(other),
        }
    }
    norm.strip_prefix(workdir).ok().map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn risky_keys_are_found_in_any_spelling() {
        let text = "[core]\n\trepositoryformatversion = 0\n\tHooksPath = .hooks\n\tfsmonitor = touch /tmp/x\n\
                    [Core]\n sshCommand=ssh -o ProxyCommand=x\n[credential]\n\thelper = store\n\
                    [credential \"https://h\"]\n helper = !evil\n[url \"git@evil:\"]\n\tinsteadOf = https://github.com/\n\
                    [remote \"origin\"]\n\turl = x\n[alias]\n\tco = checkout\n\tx = !sh -c id\n\
                    [filter \"lfs\"]\n\tsmudge = run\n[include]\n\tpath = ../x\n# core.pager = nope\n";
        let got = risky_config_entries(text);
        let want = [
            "core.hookspath = .hooks",
            "core.fsmonitor = touch /tmp/x",
            "core.sshcommand = ssh -o ProxyCommand=x",
            "credential.helper = store",
            "credential.https://h.helper = !evil",
            "url.git@evil:.insteadof = https://github.com/",
            "alias.x = !sh -c id",
            "filter.lfs.smudge = run",
            "include.path = ../x",
        ];
        for w in want {
            assert!(got.contains(w), "{w} missing from {got:?}");
        }
        assert_eq!(got.len(), want.len(), "{got:?}");
    }

    #[test]
    fn diff_flags_new_and_changed_items_only() {
        let d = std::env::temp_dir().join(format!("ollie-postrun-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join(".git/hooks")).unwrap();
        std::fs::write(d.join(".git/config"), "[core]\n\tbare = false\n").unwrap();
        std::fs::write(d.join(".git/hooks/pre-push"), "#!/bin/sh\n").unwrap();
        std::fs::write(d.join(".git/hooks/x.sample"), "#!/bin/sh\n").unwrap();
        std::fs::create_dir_all(d.join("node_modules/m/.git/hooks")).unwrap();
        let before = Snapshot::take(&d);
        assert!(before.diff(&before).flags.is_empty());
        std::fs::write(d.join(".git/hooks/pre-commit"), "#!/bin/sh\n").unwrap();
        std::fs::write(d.join(".git/hooks/x.sample"), "changed").unwrap();
        std::fs::write(
            d.join(".git/config"),
            "[core]\n\tbare = false\n\thooksPath = h\n",
        )
        .unwrap();
        std::fs::create_dir_all(d.join("vendor/x/.git/hooks")).unwrap();
        std::fs::write(d.join("vendor/x/.git/hooks/post-checkout"), "x").unwrap();
        std::fs::write(d.join("node_modules/m/.git/hooks/post-checkout"), "x").unwrap();
        std::fs::write(d.join(".envrc"), "x").unwrap();
        let after = Snapshot::take(&d);
        let r = before.diff(&after);
        let got: Vec<(FlagKind, String)> = r
            .flags
            .iter()
            .map(|f| (f.kind, f.path.display().to_string()))
            .collect();
        assert_eq!(
            got,
            vec![
                (FlagKind::GitHook, ".git/hooks/pre-commit".into()),
                (
                    FlagKind::GitHook,
                    "vendor/x/.git/hooks/post-checkout".into()
                ),
                (FlagKind::GitConfig, ".git/config".into()),
                (FlagKind::NewRepository, "vendor/x/.git".into()),
                (FlagKind::WatchedFile, ".envrc".into()),
            ]
        );
        assert_eq!(r.repositories, 2);
        // A FIFO planted as a watched file neither blocks nor follows.
        std::fs::remove_file(d.join(".envrc")).unwrap();
        let st = std::process::Command::new("mkfifo")
            .arg(d.join(".envrc"))
            .status()
            .unwrap();
        assert!(st.success());
        let r = before.diff(&Snapshot::take(&d));
        assert!(r.flags.iter().any(|f| f.path == Path::new(".envrc")));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A tool that hides what it left (a hooks directory or a parent it may list no more, a
    /// hook it may not read, a directory of its own it closed, a symlinked hooks directory)
    /// is flagged, not missed: as a runner without `CAP_DAC_*` sees it (root drops them for
    /// the thread that looks).
    #[test]
    fn what_the_runner_cannot_see_is_flagged_not_missed() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("ollie-postrun-b-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for dir in [
            ".git/hooks",
            "vendor/x/.git/hooks",
            "vendor/y/.git",
            "githooks",
            "githooks2",
            "closed",
            "ajar",
        ] {
            std::fs::create_dir_all(d.join(dir)).unwrap();
        }
        std::os::unix::fs::symlink("../../../githooks", d.join("vendor/y/.git/hooks")).unwrap();
        let chmod = |p: &str, mode: u32| {
            std::fs::set_permissions(d.join(p), std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let flags = |before: &Snapshot, after: &Snapshot| -> Vec<(FlagKind, String, String)> {
            before
                .diff(after)
                .flags
                .iter()
                .map(|f| (f.kind, f.path.display().to_string(), f.detail.clone()))
                .collect()
        };
        let has = |got: &[(FlagKind, String, String)], kind: FlagKind, path: &str| {
            got.iter().any(|(k, p, _)| *k == kind && p == path)
        };
        let looker = std::thread::scope(|sc| {
            sc.spawn(|| {
                crate::sys::drop_dac_caps_of_this_thread().unwrap();
                chmod("closed", 0);
                std::fs::write(d.join("setup"), "").unwrap();
                let before = Snapshot::take(&d);
                assert!(
                    flags(&before, &before).is_empty(),
                    "{:?}",
                    flags(&before, &before)
                );

                // A nested repository's hooks directory, listable no more.
                std::fs::write(d.join("vendor/x/.git/hooks/post-checkout"), "#!/bin/sh\n").unwrap();
                chmod("vendor/x/.git/hooks", 0o111);
                let got = flags(&before, &Snapshot::take(&d));
                assert!(
                    has(&got, FlagKind::Unreadable, "vendor/x/.git/hooks"),
                    "{got:?}"
                );
                chmod("vendor/x/.git/hooks", 0o755);
                let got = flags(&before, &Snapshot::take(&d));
                assert!(
                    has(&got, FlagKind::GitHook, "vendor/x/.git/hooks/post-checkout"),
                    "{got:?}"
                );
                assert!(!got.iter().any(|f| f.0 == FlagKind::Unreadable), "{got:?}");

                // A new repository behind a parent that can be entered but not listed.
                std::fs::create_dir_all(d.join("deep/r/.git/hooks")).unwrap();
                chmod("deep", 0o111);
                let got = flags(&before, &Snapshot::take(&d));
                assert!(has(&got, FlagKind::Unreadable, "deep"), "{got:?}");
                chmod("deep", 0o755);
                std::fs::remove_dir_all(d.join("deep")).unwrap();

                // A hook the runner may run but not read.
                std::fs::write(d.join("vendor/x/.git/hooks/pre-push"), "\x7fELF").unwrap();
                chmod("vendor/x/.git/hooks/pre-push", 0o111);
                let got = flags(&before, &Snapshot::take(&d));
                let hook = got
                    .iter()
                    .find(|(k, p, _)| *k == FlagKind::GitHook && p.ends_with("pre-push"));
                assert!(
                    hook.is_some_and(|(_, _, detail)| detail.contains("unreadable")),
                    "{got:?}"
                );
                std::fs::remove_file(d.join("vendor/x/.git/hooks/pre-push")).unwrap();
                std::fs::remove_file(d.join("vendor/x/.git/hooks/post-checkout")).unwrap();

                // A closed directory is fine while it stays closed; opened, filled and closed
                // again, its change time tells, once the file system's clock has moved on from
                // the time it was closed at (timestamps may be as coarse as a clock tick).
                let got = flags(&before, &Snapshot::take(&d));
                assert!(got.is_empty(), "{got:?}");
                let ctime = |p: &Path| {
                    use std::os::unix::fs::MetadataExt;
                    let m = std::fs::symlink_metadata(p).unwrap();
                    (m.ctime(), m.ctime_nsec())
                };
                let closed_at = ctime(&d.join("closed"));
                while ctime(&d.join("setup")) <= closed_at {
                    std::fs::write(d.join("setup"), "").unwrap();
                    std::thread::yield_now();
                }
                chmod("closed", 0o700);
                std::fs::create_dir_all(d.join("closed/r/.git")).unwrap();
                chmod("closed", 0);
                let got = flags(&before, &Snapshot::take(&d));
                assert!(has(&got, FlagKind::Unreadable, "closed"), "{got:?}");
                chmod("closed", 0o700);
                std::fs::remove_dir_all(d.join("closed/r")).unwrap();
                chmod("closed", 0);
                let before = Snapshot::take(&d);

                // A symlinked hooks directory: what it points to is scanned; a new target is a
                // change; a target outside the workspace is a blind spot.
                std::fs::write(d.join("githooks/pre-commit"), "#!/bin/sh\n").unwrap();
                let got = flags(&before, &Snapshot::take(&d));
                assert!(
                    has(&got, FlagKind::GitHook, "vendor/y/.git/hooks/pre-commit"),
                    "{got:?}"
                );
                std::fs::remove_file(d.join("vendor/y/.git/hooks")).unwrap();
                std::os::unix::fs::symlink("../../../githooks2", d.join("vendor/y/.git/hooks"))
                    .unwrap();
                let got = flags(&before, &Snapshot::take(&d));
                assert!(
                    has(&got, FlagKind::GitMetadata, "vendor/y/.git/hooks"),
                    "{got:?}"
                );
                std::fs::remove_file(d.join("vendor/y/.git/hooks")).unwrap();
                std::os::unix::fs::symlink("/usr/share", d.join("vendor/y/.git/hooks")).unwrap();
                let got = flags(&before, &Snapshot::take(&d));
                assert!(
                    has(&got, FlagKind::Unreadable, "vendor/y/.git/hooks"),
                    "{got:?}"
                );

                // The set-id search says when a directory could not be searched.
                assert!(!setid_flags(std::slice::from_ref(&d), &d).1);
                chmod("ajar", 0o311);
                assert!(setid_flags(std::slice::from_ref(&d), &d).1);
                chmod("ajar", 0o755);
            })
            .join()
        });
        chmod("closed", 0o755);
        let _ = std::fs::remove_dir_all(&d);
        looker.unwrap();
    }

    #[test]
    fn entries_and_nested_watched_files() {
        let d = std::env::temp_dir().join(format!("ollie-postrun-e-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::create_dir_all(d.join(".vscode")).unwrap();
        std::fs::write(d.join("f"), "x").unwrap();
        std::os::unix::fs::symlink("sub", d.join("l")).unwrap();
        // More entries than one 4 KiB getdents64 buffer holds.
        for i in 0..300 {
            std::fs::write(d.join(format!("many-{i:03}-{}", "n".repeat(40))), "").unwrap();
        }
        let root = OwnedFd::from(std::fs::File::open(&d).unwrap());
        let got = list_all(&root, Path::new("")).unwrap();
        assert_eq!(got.len(), 304);
        let find = |n: &str| got.iter().find(|e| e.0 == n).map(|e| (e.1, e.2));
        assert_eq!(find("sub"), Some((true, false)));
        assert_eq!(find("l"), Some((false, true)));
        assert_eq!(find("f"), Some((false, false)));
        assert_eq!(find("."), None);
        assert_eq!(find(".."), None);
        // Watched files below one parent: each is seen (new, changed, symlinked).
        let before = Snapshot::take(&d);
        std::fs::write(d.join(".vscode/tasks.json"), "{}").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.join(".vscode/launch.json")).unwrap();
        let after = Snapshot::take(&d);
        let paths: Vec<String> = before
            .diff(&after)
            .flags
            .iter()
            .map(|f| f.path.display().to_string())
            .collect();
        assert_eq!(paths, vec![".vscode/launch.json", ".vscode/tasks.json"]);
        std::fs::write(d.join(".vscode/tasks.json"), "{\"x\": 1}").unwrap();
        let r = after.diff(&Snapshot::take(&d));
        assert_eq!(r.flags.len(), 1);
        assert_eq!(r.flags[0].path, Path::new(".vscode/tasks.json"));
        assert_eq!(r.flags[0].detail, "changed during the run");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn scans_of_a_directory_of_many_files() {
        // The post-run scans run around every call: in a directory of many files they find
        // what they look for (a nested repository, a set-id file) as in a small one.
        let d = std::env::temp_dir().join(format!("ollie-postrun-m-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        for i in 0..9_000 {
            std::fs::write(d.join(format!("last-{i:05}")), "").unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(d.join("sub/x"), "x").unwrap();
        std::fs::set_permissions(d.join("sub/x"), std::fs::Permissions::from_mode(0o4755)).unwrap();
        let before = Snapshot::take(&d);
        std::fs::create_dir_all(d.join("sub/.git/hooks")).unwrap();
        let r = before.diff(&Snapshot::take(&d));
        let (flags, cut) = setid_flags(std::slice::from_ref(&d), &d);
        let _ = std::fs::remove_dir_all(&d);
        assert!(
            r.flags
                .iter()
                .any(|f| f.kind == FlagKind::NewRepository && f.path == Path::new("sub/.git")),
            "{:?}",
            r.flags
        );
        assert!(!cut);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert_eq!(flags[0].path, Path::new("sub/x"));
    }

    #[test]
    fn set_id_means_what_runs_with_other_rights() {
        let reg = libc::S_IFREG;
        let dir = libc::S_IFDIR;
        assert!(is_setid(reg | 0o4755));
        assert!(is_setid(reg | 0o2755));
        assert!(is_setid(dir | 0o4755));
        // A setgid directory only passes its group on (the host's choice).
        assert!(!is_setid(dir | 0o2775));
        assert!(!is_setid(reg | 0o1755));
        assert!(!is_setid(reg | 0o755));
        let d = std::env::temp_dir().join(format!("ollie-postrun-s-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("a/b/x"), "x").unwrap();
        std::fs::set_permissions(d.join("a/b/x"), std::fs::Permissions::from_mode(0o4755)).unwrap();
        std::os::unix::fs::symlink("/usr/bin/passwd", d.join("link")).unwrap();
        let (flags, cut) = setid_flags(std::slice::from_ref(&d), &d);
        let _ = std::fs::remove_dir_all(&d);
        assert!(!cut);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert_eq!(flags[0].path, Path::new("a/b/x"));
        assert_eq!(flags[0].detail, "mode 4755");
        assert_eq!(flags[0].kind, FlagKind::SetId);
    }
}
