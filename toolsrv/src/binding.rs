//! What an approval is bound to: the exact execution toolsrv would perform, and running
//! exactly that.
//!
//! Before a request goes to the human, [`compute`] records the argv (raw bytes), the working
//! directory, the environment the run will get, the resolved executable (canonical path,
//! device, inode, size, SHA-256) and every file the command line names (scripts for
//! interpreters: `python3 x.py`, `bash run.sh`, `rg --pre=./x`), and where the command line
//! runs one of them as a script ([`Binding::runs`]). After the approval, [`Binding::pin`]
//! opens the program and each such script once, checks them on those descriptors, and hands
//! back what the run executes; [`Binding::recheck`] then recomputes the rest by path (a file
//! named since, a data file changed). Any difference voids the approval, naming what changed
//! (DESIGN.md §5; ESCAPES.md item 55). [`Binding::digest`] is a SHA-256 over a canonical
//! encoding of the whole binding, for matching byte-identical requests.
//!
//! Guarantees:
//! - The program is found by an absolute path or in the fixed system directories
//!   ([`SYSTEM_DIRS`]), never through the agent's `PATH`; a relative program path is refused.
//! - Each file is hashed from the same open descriptor that supplied its device, inode and
//!   size, and a file whose length changes while it is read is refused.
//! - What runs is what was checked: the program is executed from the descriptor [`Binding::pin`]
//!   checked (`execveat`), as a sealed memfd copy when it lies in a tree sandboxed tools can
//!   write, else the file itself (read-only; `/proc/self/exe` stays its path). Every script
//!   the command runs — an interpreter's first non-option argument (`bash run.sh`), and inside
//!   inline code (`-c`, `-e`) the words in command position with a `/` (`./run.sh`) and after
//!   a runner (`sh x.sh`, `python3 x.py`, `. ./env.sh`) — is a sealed copy (mode `& 0o555`)
//!   the tool inherits at `/proc/self/fd/7`, 8, …, and exactly that argument or word is
//!   replaced by that name. A rename over a file or a write to it after the check changes
//!   nothing that runs. At most [`ollie_sandbox::MAX_PASS_FDS`] scripts per command.
//! - Files are streamed and capped ([`MAX_FILE`] each, [`MAX_TOTAL`] together).
//!
//! Not guaranteed:
//! - Data files (`cp a.txt b.txt`, arguments of other programs, `--opt=FILE` values) are
//!   bound by hash up to the re-check, not pinned: they are not rewritten (that would break
//!   writes), so a change after the re-check reaches the run.
//! - Inside inline code, data files the code mentions, names built at run time
//!   (`sh "$(echo ./x)"`), files the program opens on its own (its libraries, a script's own
//!   `source` of another file) and files named on the command line that did not exist when
//!   the request was made are not bound. The inline code itself is part of argv and so is
//!   bound. Splitting is quote-agnostic, so a script's name inside a quoted string in
//!   command position (`echo "x; ./run.sh"`) is rewritten too.
//! - The permission delta (grants) is not part of the binding; the caller's request digest
//!   must cover it too.
//!
//! Everything here is blocking file I/O: call it from `spawn_blocking`.
//!
//! Tested by the unit tests below (temporary directories; the system `sh`) and, end to end
//! with an agent's process swapping a script at every check, by `tests/tests/broker.rs`.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};

use ollie_link::auth::hex;

/// The only directories a bare program name is looked up in, in this order.
pub const SYSTEM_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// Largest single file hashed (the executable or one script).
pub const MAX_FILE: u64 = 256 << 20;
/// Largest total of all files hashed for one binding.
pub const MAX_TOTAL: u64 = 1 << 30;

/// One file the binding depends on, as it was when the binding was computed.
#[derive(Serialize, Clone, PartialEq, Eq, Debug)]
pub struct FileId {
    /// Absolute and canonical (every symlink followed).
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Lowercase hex SHA-256 of the contents.
    pub sha256: String,
}

/// Everything an approval is bound to.
#[derive(Serialize, Clone, PartialEq, Debug)]
pub struct Binding {
    /// The command line for display (lossy UTF-8); comparison uses `argv_raw`.
    pub argv: Vec<String>,
    /// The command line as exact bytes.
    #[serde(skip)]
    pub argv_raw: Vec<Vec<u8>>,
    /// The working directory of the run (absolute).
    pub cwd: PathBuf,
    /// The environment the run will get.
    pub env: BTreeMap<String, String>,
    /// The program `argv[0]` resolves to.
    pub executable: FileId,
    /// Every later argument that names an existing regular file, in argv order.
    pub scripts: Vec<FileId>,
    /// Where the command line names a file of `scripts` it runs: what [`Binding::pin`]
    /// replaces by a sealed copy.
    #[serde(skip)]
    pub runs: Vec<ScriptRun>,
}

/// A place on the command line naming a script the command runs.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ScriptRun {
    site: Site,
    /// Index into [`Binding::scripts`].
    script: usize,
}

/// Computes the binding of running `argv` in `cwd` with environment `env`.
///
/// Errors are one-line lowercase messages for the agent and the human.
pub fn compute(
    argv: &[OsString],
    cwd: &Path,
    env: &BTreeMap<String, String>,
) -> Result<Binding, String> {
    let Some(program) = argv.first() else {
        return Err("the command is empty".into());
    };
    if !cwd.is_absolute() {
        return Err(format!(
            "the working directory {} is not an absolute path",
            show(cwd)
        ));
    }
    if !cwd.is_dir() {
        return Err(format!(
            "the working directory {} is not a directory",
            show(cwd)
        ));
    }
    let mut budget = MAX_TOTAL;
    let exe_path = resolve_program(program)?;
    let executable = file_id(&exe_path, &mut budget)?;
    let mut scripts = Vec::new();
    for arg in argv.iter().skip(1) {
        for candidate in candidates(arg) {
            if let Some(path) = named_file(cwd, candidate) {
                scripts.push(file_id(&path, &mut budget)?);
            }
        }
    }
    let mut runs = Vec::new();
    for (site, path) in script_sites(argv, cwd, env.get("PATH").map(String::as_str)) {
        let Some(script) = scripts.iter().position(|f| f.path == path) else {
            return Err(format!(
                "{} appeared while the command was being bound",
                show(&path)
            ));
        };
        runs.push(ScriptRun { site, script });
    }
    let mut distinct: Vec<usize> = runs.iter().map(|r| r.script).collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() > ollie_sandbox::MAX_PASS_FDS {
        return Err(format!(
            "the command runs {} scripts; at most {} can be pinned for one run",
            distinct.len(),
            ollie_sandbox::MAX_PASS_FDS
        ));
    }
    Ok(Binding {
        argv: argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        argv_raw: argv.iter().map(|a| a.as_bytes().to_vec()).collect(),
        cwd: cwd.to_path_buf(),
        env: env.clone(),
        executable,
        scripts,
        runs,
    })
}

impl Binding {
    /// The files named on the command line that the run will not execute from a pinned copy
    /// (data files, or files run in a way the binding does not see): checked by path just
    /// before the run, and held unchanged by the session's freeze until it ends.
    pub fn unpinned(&self) -> Vec<&Path> {
        self.scripts
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.runs.iter().any(|r| r.script == *i))
            .map(|(_, f)| f.path.as_path())
            .collect()
    }
}

impl Binding {
    /// Recomputes the binding from the stored argv, cwd and environment and compares.
    ///
    /// `Err` names the first difference found; any difference voids the approval.
    pub fn recheck(&self) -> Result<(), String> {
        let argv: Vec<OsString> = self
            .argv_raw
            .iter()
            .map(|b| OsString::from_vec(b.clone()))
            .collect();
        let Some(program) = argv.first() else {
            return Err("the command is empty".into());
        };
        let old = &self.executable;
        let mut budget = MAX_TOTAL;
        let exe_path = match resolve_program(program) {
            Ok(p) => p,
            Err(_) if !old.path.exists() => {
                return Err(format!("the executable {} is gone", show(&old.path)));
            }
            Err(e) => return Err(format!("the program no longer resolves: {e}")),
        };
        if exe_path != old.path {
            return Err(format!(
                "the executable now resolves to {} (was {})",
                show(&exe_path),
                show(&old.path)
            ));
        }
        let now = file_id(&exe_path, &mut budget)
            .map_err(|e| format!("the executable can no longer be read: {e}"))?;
        if let Some(what) = difference(old, &now) {
            return Err(format!("the executable {} {what}", show(&old.path)));
        }
        for s in &self.scripts {
            if std::fs::metadata(&s.path).is_err() {
                return Err(format!("script {} is gone", show(&s.path)));
            }
            let now = file_id(&s.path, &mut budget)
                .map_err(|e| format!("script {} can no longer be read: {e}", show(&s.path)))?;
            if let Some(what) = difference(s, &now) {
                return Err(format!("script {} {what}", show(&s.path)));
            }
        }
        let new = compute(&argv, &self.cwd, &self.env)
            .map_err(|e| format!("the command no longer binds: {e}"))?;
        if new.scripts.len() != self.scripts.len() {
            return Err(format!(
                "the command now names {} file(s) (was {}): {}",
                new.scripts.len(),
                self.scripts.len(),
                list(&new.scripts)
            ));
        }
        for (o, n) in self.scripts.iter().zip(&new.scripts) {
            if o.path != n.path {
                return Err(format!(
                    "a script argument now resolves to {} (was {})",
                    show(&n.path),
                    show(&o.path)
                ));
            }
        }
        if new != *self {
            return Err(format!(
                "the binding changed (digest {} → {})",
                short(&self.digest()),
                short(&new.digest())
            ));
        }
        Ok(())
    }

    /// Lowercase hex SHA-256 over a canonical, length-prefixed encoding of the whole binding
    /// (raw argv bytes, cwd bytes, environment in key order, every file identity, where the
    /// command line runs which script).
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"ollie-binding-v2\0");
        field(&mut h, b"argv", self.argv_raw.len() as u64);
        for a in &self.argv_raw {
            bytes(&mut h, a);
        }
        field(&mut h, b"cwd", 1);
        bytes(&mut h, self.cwd.as_os_str().as_bytes());
        field(&mut h, b"env", self.env.len() as u64);
        for (k, v) in &self.env {
            bytes(&mut h, k.as_bytes());
            bytes(&mut h, v.as_bytes());
        }
        field(&mut h, b"exe", 1);
        file_fields(&mut h, &self.executable);
        field(&mut h, b"scripts", self.scripts.len() as u64);
        for s in &self.scripts {
            file_fields(&mut h, s);
        }
        field(&mut h, b"runs", self.runs.len() as u64);
        for r in &self.runs {
            h.update((r.site.arg as u64).to_be_bytes());
            let (start, end) = r
                .site
                .range
                .as_ref()
                .map_or((u64::MAX, u64::MAX), |w| (w.start as u64, w.end as u64));
            h.update(start.to_be_bytes());
            h.update(end.to_be_bytes());
            h.update((r.script as u64).to_be_bytes());
        }
        hex(&h.finalize())
    }
}

/// One script pinned for a run ([`Pinned::scripts`]).
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct PinnedScript {
    /// The file the binding names (canonical).
    pub path: PathBuf,
    /// What the command line names it by now (`/proc/self/fd/N`).
    #[serde(rename = "as")]
    pub as_path: String,
}

/// What runs, opened once and checked against the binding ([`Binding::pin`]).
#[derive(Debug)]
pub struct Pinned {
    /// The program, executed from this descriptor.
    pub exec: ollie_sandbox::ExecFd,
    /// Whether `exec` is a sealed copy (the program lies in a tree tools can write) rather
    /// than the file itself.
    pub exec_copied: bool,
    /// Sealed copies of the scripts the command runs, for `RunRequest::pass_fds`.
    pub pass_fds: Vec<Arc<OwnedFd>>,
    /// Which file each of `pass_fds` holds, and the name it is run by.
    pub scripts: Vec<PinnedScript>,
    /// The command line to run: every argument or inline-code word naming a pinned script
    /// replaced by its `/proc/self/fd/N`, nothing else changed.
    pub argv: Vec<OsString>,
}

impl Binding {
    /// Opens the program and every script the command runs once, checks device, inode, size
    /// and SHA-256 on those descriptors against the binding, and returns them to run: the
    /// program as is, or, if it lies in one of `writable` (canonical trees sandboxed tools
    /// can write), as a sealed copy; each script as a sealed copy (mode `& 0o555`), which
    /// argv then names instead of the file. A rename or write after this changes nothing
    /// that runs. `Err` names the first difference (a one-line reason); nothing may run then.
    pub fn pin(&self, writable: &[PathBuf]) -> Result<Pinned, String> {
        let argv: Vec<OsString> = self
            .argv_raw
            .iter()
            .map(|b| OsString::from_vec(b.clone()))
            .collect();
        let mut budget = MAX_TOTAL;
        let exe = &self.executable;
        let copy = writable.iter().any(|w| exe.path.starts_with(w));
        let (fd, exec_copied) = if copy {
            let c = sealed_copy_of(exe, "the executable", &mut budget)?;
            (c, true)
        } else {
            (opened_as_bound(exe, "the executable", &mut budget)?, false)
        };
        let exec = ollie_sandbox::ExecFd {
            fd: Arc::new(fd),
            path: exe.path.clone(),
        };
        let mut scripts: Vec<PinnedScript> = Vec::new();
        let mut pass_fds = Vec::new();
        let mut edits: Vec<(Site, String)> = Vec::new();
        for run in &self.runs {
            let Some(bound) = self.scripts.get(run.script) else {
                return Err("the binding is inconsistent".into());
            };
            let n = match scripts.iter().position(|p| p.path == bound.path) {
                Some(n) => n,
                None => {
                    if scripts.len() == ollie_sandbox::MAX_PASS_FDS {
                        return Err(format!(
                            "the command runs more than {} scripts",
                            ollie_sandbox::MAX_PASS_FDS
                        ));
                    }
                    pass_fds.push(Arc::new(sealed_copy_of(bound, "script", &mut budget)?));
                    scripts.push(PinnedScript {
                        path: bound.path.clone(),
                        as_path: ollie_sandbox::pass_fd_path(scripts.len()),
                    });
                    scripts.len() - 1
                }
            };
            edits.push((run.site.clone(), scripts[n].as_path.clone()));
        }
        Ok(Pinned {
            exec,
            exec_copied,
            pass_fds,
            scripts,
            argv: rewrite(&argv, &edits),
        })
    }
}

/// `argv` with each edit's site replaced: a whole argument, or exactly a word's bytes.
fn rewrite(argv: &[OsString], edits: &[(Site, String)]) -> Vec<OsString> {
    argv.iter()
        .enumerate()
        .map(|(i, a)| {
            let mine: Vec<&(Site, String)> = edits.iter().filter(|(s, _)| s.arg == i).collect();
            if let Some((_, to)) = mine.iter().find(|(s, _)| s.range.is_none()) {
                return OsString::from(to);
            }
            let b = a.as_bytes();
            let mut ranges: Vec<(std::ops::Range<usize>, &str)> = mine
                .iter()
                .filter_map(|(s, to)| s.range.clone().map(|r| (r, to.as_str())))
                .collect();
            ranges.sort_by_key(|(r, _)| r.start);
            let mut out = Vec::with_capacity(b.len());
            let mut at = 0;
            for (r, to) in ranges {
                if r.start < at {
                    continue;
                }
                out.extend_from_slice(&b[at..r.start]);
                out.extend_from_slice(to.as_bytes());
                at = r.end;
            }
            out.extend_from_slice(&b[at..]);
            OsString::from_vec(out)
        })
        .collect()
}

/// Opens `f.path` once (no symlink at the end, no blocking) and checks that the descriptor
/// is the bound file: a regular file with the same device, inode and size.
fn open_bound(f: &FileId, what: &str) -> Result<(File, u32), String> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_NOFOLLOW).bits())
        .open(&f.path)
        .map_err(|e| {
            format!(
                "{what} {} cannot be opened to run: {}",
                show(&f.path),
                io_reason(&e)
            )
        })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{what} {}: {}", show(&f.path), io_reason(&e)))?;
    if !meta.is_file() {
        return Err(format!(
            "{what} {} is no longer a regular file",
            show(&f.path)
        ));
    }
    if (meta.dev(), meta.ino()) != (f.dev, f.ino) {
        return Err(format!(
            "{what} {} opened to run was replaced (device:inode {}:{} → {}:{})",
            show(&f.path),
            f.dev,
            f.ino,
            meta.dev(),
            meta.ino()
        ));
    }
    if meta.len() != f.size {
        return Err(format!(
            "{what} {} opened to run changed (size {} → {})",
            show(&f.path),
            f.size,
            meta.len()
        ));
    }
    Ok((file, meta.mode()))
}

/// The error for contents whose hash is not the bound one.
fn changed(what: &str, f: &FileId, now: &str) -> String {
    format!(
        "{what} {} opened to run changed (sha256 {} → {})",
        show(&f.path),
        short(&f.sha256),
        short(now)
    )
}

/// Charges `f`'s size to `budget`.
fn charge(f: &FileId, budget: &mut u64) -> Result<(), String> {
    if f.size > MAX_FILE || f.size > *budget {
        return Err(format!(
            "the files named by the command total more than {} MiB and cannot be pinned",
            MAX_TOTAL >> 20
        ));
    }
    *budget -= f.size;
    Ok(())
}

/// The bound file itself, open read-only, after checking it ([`open_bound`]) and hashing
/// everything read through the descriptor; the offset is back at 0.
fn opened_as_bound(f: &FileId, what: &str, budget: &mut u64) -> Result<OwnedFd, String> {
    use std::io::Seek;
    charge(f, budget)?;
    let (mut file, _) = open_bound(f, what)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut read: u64 = 0;
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                h.update(&buf[..n]);
                read += n as u64;
                if read > f.size {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("{what} {}: {}", show(&f.path), io_reason(&e))),
        }
    }
    let now = hex(&h.finalize());
    if read != f.size || now != f.sha256 {
        return Err(changed(what, f, &now));
    }
    file.rewind()
        .map_err(|e| format!("{what} {}: {}", show(&f.path), io_reason(&e)))?;
    Ok(file.into())
}

/// A sealed copy of the bound file, after checking it ([`open_bound`]); the hash is of
/// exactly the bytes copied.
fn sealed_copy_of(f: &FileId, what: &str, budget: &mut u64) -> Result<OwnedFd, String> {
    charge(f, budget)?;
    let (file, mode) = open_bound(f, what)?;
    let name = format!(
        "ollie-pin:{}",
        f.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    );
    let c = ollie_sandbox::sealed_copy(&mut (&file).take(f.size + 1), &name, mode, f.size)
        .map_err(|e| match e {
            ollie_sandbox::SealError::TooLarge { .. } => format!(
                "{what} {} opened to run changed (it grew past {} bytes)",
                show(&f.path),
                f.size
            ),
            e => format!(
                "{what} {} cannot be pinned: {}",
                show(&f.path),
                crate::error_chain(&e)
            ),
        })?;
    let now = hex(&c.sha256);
    if c.len != f.size || now != f.sha256 {
        return Err(changed(what, f, &now));
    }
    Ok(c.fd)
}

fn field(h: &mut Sha256, tag: &[u8], count: u64) {
    bytes(h, tag);
    h.update(count.to_be_bytes());
}

fn bytes(h: &mut Sha256, b: &[u8]) {
    h.update((b.len() as u64).to_be_bytes());
    h.update(b);
}

fn file_fields(h: &mut Sha256, f: &FileId) {
    bytes(h, f.path.as_os_str().as_bytes());
    h.update(f.dev.to_be_bytes());
    h.update(f.ino.to_be_bytes());
    h.update(f.size.to_be_bytes());
    bytes(h, f.sha256.as_bytes());
}

/// `argv[0]` → the canonical path of the program: absolute, or a bare name found in
/// [`SYSTEM_DIRS`] (first regular executable file wins).
fn resolve_program(program: &OsStr) -> Result<PathBuf, String> {
    let raw = program.as_bytes();
    if raw.is_empty() {
        return Err("the program name is empty".into());
    }
    let path = if raw.contains(&b'/') {
        let p = Path::new(program);
        if !p.is_absolute() {
            return Err(format!(
                "{}: the program must be named by an absolute path or found in the system directories",
                show(p)
            ));
        }
        match std::fs::metadata(p) {
            Ok(m) if m.is_file() && m.mode() & 0o111 != 0 => p.to_path_buf(),
            Ok(m) if m.is_file() => return Err(format!("{} is not executable", show(p))),
            Ok(_) => return Err(format!("{} is not a regular file", show(p))),
            Err(e) => return Err(format!("{}: {}", show(p), io_reason(&e))),
        }
    } else {
        let found = SYSTEM_DIRS
            .iter()
            .map(|d| Path::new(d).join(program))
            .find(|c| std::fs::metadata(c).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0));
        match found {
            Some(p) => p,
            None => {
                return Err(format!(
                    "{}: not found in the system directories ({}); name the program by an absolute path",
                    show(Path::new(program)),
                    SYSTEM_DIRS.join(" ")
                ));
            }
        }
    };
    std::fs::canonicalize(&path).map_err(|e| format!("{}: {}", show(&path), io_reason(&e)))
}

/// Programs whose next argument is a file they run or read as code.
const RUNNERS: &[&[u8]] = &[
    b"sh", b"bash", b"dash", b"zsh", b"ksh", b"python", b"python3", b"perl", b"node", b"ruby",
    b"php", b"lua", b"tclsh", b"source", b".", b"exec", b"env", b"nohup", b"time", b"nice",
];

/// The runners that read their first non-option argument as a script (a name without `/` is
/// taken relative to the working directory).
const INTERPRETERS: &[&[u8]] = &[
    b"sh", b"bash", b"dash", b"zsh", b"ksh", b"python", b"python3", b"perl", b"node", b"ruby",
    b"php", b"lua", b"tclsh",
];

/// The interpreters that are shells: `-c` anywhere in their options makes the first
/// non-option argument inline code.
const SHELLS: &[&[u8]] = &[b"sh", b"bash", b"dash", b"zsh", b"ksh"];

/// The runners that read a file as code in the running shell: a name without `/` is looked
/// up in `PATH` first.
const SOURCERS: &[&[u8]] = &[b"source", b"."];

/// Options of the interpreters that take the next argument as their value.
const VALUE_OPTIONS: &[&[u8]] = &[
    b"-o",
    b"+o",
    b"-O",
    b"+O",
    b"--rcfile",
    b"--init-file",
    b"-W",
    b"-X",
    b"-r",
    b"--require",
    b"--import",
    b"--loader",
    b"-I",
];

/// The last component of a program name.
fn base_name(p: &[u8]) -> &[u8] {
    p.rsplit(|c| *c == b'/').next().unwrap_or(p)
}

/// Where a word of inline code stands ([`inline_words`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// First word of a simple command (assignments skipped): run through `PATH` unless it
    /// has a `/`.
    Command,
    /// First non-option word after an interpreter (`bash x.sh`, `python3 x.py`).
    Script,
    /// First non-option word after `source` or `.`.
    Sourced,
    /// First non-option word after `exec`, `env`, `nohup`, `time` or `nice`: a command.
    RunCommand,
}

/// A word of inline code that may name a file: `b[start..end]`, quotes dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Word {
    start: usize,
    end: usize,
    place: Place,
}

/// The words of inline code (one argument) in command position of each simple command
/// (`./run.sh`) and after a runner (`bash x.sh`, `python3 x.py`, `. ./env.sh`). Commands
/// split at `;&|()`, newlines and backquotes, words at whitespace; one leading and one
/// trailing quote are dropped; assignments before a command (`X=1 ./run.sh`) are not the
/// command. Quote-agnostic on purpose: code nested in quotes (`bash -c "sh x.sh"`,
/// `os.system('./x')`) is split too. Other words (an output file, a pattern) are data.
fn inline_words(b: &[u8]) -> Vec<Word> {
    let mut out = Vec::new();
    for (cs, ce) in spans(b, 0, b.len(), |c| b";&|()\n`".contains(&c)).take(1024) {
        let words: Vec<(usize, usize)> = spans(b, cs, ce, |c| c.is_ascii_whitespace())
            .map(|(mut s, mut e)| {
                if b[s] == b'"' || b[s] == b'\'' {
                    s += 1;
                }
                if e > s && (b[e - 1] == b'"' || b[e - 1] == b'\'') {
                    e -= 1;
                }
                (s, e)
            })
            .filter(|(s, e)| e > s && e - s <= 4096)
            // Assignments before a command (`X=1 ./run.sh`) are not the command.
            .skip_while(|&(s, e)| b[s..e].contains(&b'=') && b[s] != b'-')
            .collect();
        let mut prev: Option<&[u8]> = None;
        for (i, &(s, e)) in words.iter().enumerate() {
            let w = &b[s..e];
            let option = w.starts_with(b"-");
            let place = match prev.map(base_name) {
                _ if option => None,
                _ if i == 0 => Some(Place::Command),
                Some(p) if INTERPRETERS.contains(&p) => Some(Place::Script),
                Some(p) if SOURCERS.contains(&p) => Some(Place::Sourced),
                Some(p) if RUNNERS.contains(&p) => Some(Place::RunCommand),
                _ => None,
            };
            if let Some(place) = place {
                out.push(Word {
                    start: s,
                    end: e,
                    place,
                });
            }
            if !option {
                prev = Some(w);
            }
        }
    }
    out
}

/// The non-empty spans of `b[from..to]` between bytes for which `sep` holds.
fn spans(
    b: &[u8],
    from: usize,
    to: usize,
    sep: impl Fn(u8) -> bool,
) -> impl Iterator<Item = (usize, usize)> {
    let mut i = from;
    std::iter::from_fn(move || {
        while i < to && sep(b[i]) {
            i += 1;
        }
        if i >= to {
            return None;
        }
        let s = i;
        while i < to && !sep(b[i]) {
            i += 1;
        }
        Some((s, i))
    })
}

/// The strings in one argument that may name a file: the argument itself; for
/// `--opt=VALUE` / `-o=VALUE`, the value; and, when the argument is inline code (it holds
/// several words), the [`inline_words`] in command position and after a runner. Other words
/// stay unbound, so an approval for the session still matches after they change.
fn candidates(arg: &OsStr) -> Vec<&OsStr> {
    let b = arg.as_bytes();
    let mut out = vec![arg];
    if b.first() == Some(&b'-')
        && let Some(i) = b.iter().position(|&c| c == b'=')
        && i + 1 < b.len()
    {
        out.push(OsStr::from_bytes(&b[i + 1..]));
    }
    if !b.iter().any(u8::is_ascii_whitespace) {
        return out;
    }
    out.extend(
        inline_words(b)
            .into_iter()
            .map(|w| OsStr::from_bytes(&b[w.start..w.end])),
    );
    out.dedup();
    out
}

/// Where the command line names a script to run: a whole argument (`bash run.sh`) or a word
/// inside inline code (`bash -c 'sh run.sh'`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Site {
    /// The argument's index in argv.
    arg: usize,
    /// The word's bytes in that argument; `None`: the whole argument.
    range: Option<std::ops::Range<usize>>,
}

/// What of argv an interpreter `argv[0]` runs or reads as code: `(script, code)`, the index
/// of the argument naming its script file (its first non-option argument) and the indices of
/// its inline code arguments (after `-c`, `-e`; for a shell, the first non-option argument
/// once any option holds `c`). Only interpreters have either. A shell's positional
/// parameters right after a `-c` or `-e` are inline code too (code the shell hands on to
/// another interpreter, as `execute_pipe` does).
fn script_args(argv: &[OsString]) -> (Option<usize>, Vec<usize>) {
    let Some(program) = argv.first() else {
        return (None, Vec::new());
    };
    let base = base_name(program.as_bytes());
    if !INTERPRETERS.contains(&base) {
        return (None, Vec::new());
    }
    let shell = SHELLS.contains(&base);
    let (mut script, mut code) = (None, Vec::new());
    let mut shell_code = false;
    let mut i = 1;
    while i < argv.len() {
        let a = argv[i].as_bytes();
        if a == b"--" {
            if shell_code {
                code.push(i + 1);
            } else {
                script = Some(i + 1);
            }
            break;
        }
        let option = a.len() > 1 && (a[0] == b'-' || (shell && a[0] == b'+'));
        if !option {
            if shell_code {
                code.push(i);
            } else {
                script = Some(i);
            }
            break;
        }
        if shell && a[0] == b'-' && a[1] != b'-' && a.contains(&b'c') {
            shell_code = true;
        } else if !shell && (a == b"-c" || a == b"-e" || a == b"-E") {
            code.push(i + 1);
            break;
        } else if !shell && a == b"-m" {
            break;
        } else if VALUE_OPTIONS.contains(&a) {
            i += 1;
        }
        i += 1;
    }
    // A shell's inline code gets the later arguments as positional parameters.
    if shell_code && let Some(&at) = code.first() {
        for j in at + 2..argv.len() {
            if matches!(argv[j - 1].as_bytes(), b"-c" | b"-e") {
                code.push(j);
            }
        }
    }
    code.retain(|&j| j < argv.len());
    (script.filter(|&j| j < argv.len()), code)
}

/// Every [`Site`] of argv naming a script, with the canonical path of the regular file it
/// names (relative to `cwd`). A word in command position or after `exec`/`env`/… counts
/// only with a `/` (otherwise the shell looks it up in `PATH`); one after `source` or `.`
/// only with a `/` or when no directory of `path_var` holds that name.
fn script_sites(argv: &[OsString], cwd: &Path, path_var: Option<&str>) -> Vec<(Site, PathBuf)> {
    let (script, code) = script_args(argv);
    let mut out = Vec::new();
    if let Some(i) = script
        && let Some(p) = named_file(cwd, &argv[i])
    {
        out.push((
            Site {
                arg: i,
                range: None,
            },
            p,
        ));
    }
    for i in code {
        let b = argv[i].as_bytes();
        for w in inline_words(b) {
            let word = &b[w.start..w.end];
            let slash = word.contains(&b'/');
            let counts = match w.place {
                Place::Script => true,
                Place::Command | Place::RunCommand => slash,
                Place::Sourced => {
                    slash
                        || !path_var.unwrap_or("").split(':').any(|d| {
                            !d.is_empty() && Path::new(d).join(OsStr::from_bytes(word)).is_file()
                        })
                }
            };
            if counts && let Some(p) = named_file(cwd, OsStr::from_bytes(word)) {
                out.push((
                    Site {
                        arg: i,
                        range: Some(w.start..w.end),
                    },
                    p,
                ));
            }
        }
    }
    out
}

/// The canonical path of the regular file `arg` names (absolute, or relative to `cwd`), if any.
fn named_file(cwd: &Path, arg: &OsStr) -> Option<PathBuf> {
    if arg.is_empty() {
        return None;
    }
    let path = cwd.join(arg);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => std::fs::canonicalize(&path)
            .ok()
            .filter(|p| !is_kernel_file(p)),
        _ => None,
    }
}

/// Files of the kernel's pseudo filesystems (`/proc/self/status`, `/sys/…`, `/dev/…`):
/// not programs or scripts, their content changes by itself, and `/proc/self` means
/// another process in the tool. They are not bound.
fn is_kernel_file(p: &Path) -> bool {
    ["/proc", "/sys", "/dev"]
        .iter()
        .any(|root| p.starts_with(root))
}

/// Opens `path` (canonical), and takes device, inode and size from the open descriptor and
/// the hash from its contents. `budget` is the total still allowed.
fn file_id(path: &Path, budget: &mut u64) -> Result<FileId, String> {
    let file: File = OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(|e| format!("{}: {}", show(path), io_reason(&e)))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {}", show(path), io_reason(&e)))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", show(path)));
    }
    let size = meta.len();
    if size > MAX_FILE {
        return Err(format!(
            "{} is larger than {} MiB and cannot be bound",
            show(path),
            MAX_FILE >> 20
        ));
    }
    if size > *budget {
        return Err(format!(
            "the files named by the command total more than {} MiB and cannot be bound",
            MAX_TOTAL >> 20
        ));
    }
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut read: u64 = 0;
    let mut r = file.take(size.saturating_add(1));
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                h.update(&buf[..n]);
                read += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("{}: {}", show(path), io_reason(&e))),
        }
    }
    if read != size {
        return Err(format!("{} changed while it was being read", show(path)));
    }
    *budget -= size;
    Ok(FileId {
        path: path.to_path_buf(),
        dev: meta.dev(),
        ino: meta.ino(),
        size,
        sha256: hex(&h.finalize()),
    })
}

/// How `new` differs from `old` (same path), or `None`.
fn difference(old: &FileId, new: &FileId) -> Option<String> {
    if old.sha256 != new.sha256 {
        Some(format!(
            "changed (sha256 {} → {})",
            short(&old.sha256),
            short(&new.sha256)
        ))
    } else if (old.dev, old.ino) != (new.dev, new.ino) {
        Some(format!(
            "was replaced (device:inode {}:{} → {}:{})",
            old.dev, old.ino, new.dev, new.ino
        ))
    } else if old.size != new.size {
        Some(format!("changed (size {} → {})", old.size, new.size))
    } else {
        None
    }
}

fn short(hex: &str) -> &str {
    hex.get(..16).unwrap_or(hex)
}

fn list(files: &[FileId]) -> String {
    if files.is_empty() {
        return "none".into();
    }
    files
        .iter()
        .map(|f| show(&f.path))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A path for a one-line message: control characters escaped.
fn show(p: &Path) -> String {
    p.to_string_lossy()
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().collect()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// An I/O error as a short lowercase reason.
fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        ErrorKind::NotFound => "no such file".into(),
        ErrorKind::PermissionDenied => "permission denied".into(),
        _ => {
            let s = e.to_string();
            let mut c = s.chars();
            match c.next() {
                Some(f) => f.to_lowercase().chain(c).collect(),
                None => s,
            }
        }
    }
}

#[cfg(test)]
mod tests;
