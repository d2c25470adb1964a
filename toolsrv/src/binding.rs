//! What an approval is bound to: the exact execution toolsrv would perform.
//!
//! Before a request goes to the human, [`compute`] records the argv (raw bytes), the working
//! directory, the environment the run will get, the resolved executable (canonical path,
//! device, inode, size, SHA-256) and every file the command line names (scripts for
//! interpreters: `python3 x.py`, `bash run.sh`, `rg --pre=./x`). Right before running,
//! [`Binding::recheck`] recomputes all of it and refuses on any difference, naming what
//! changed (DESIGN.md §5; ESCAPES.md item 55). [`Binding::digest`] is a SHA-256 over a
//! canonical encoding of the whole binding, for matching byte-identical requests.
//!
//! Guarantees:
//! - The program is found by an absolute path or in the fixed system directories
//!   ([`SYSTEM_DIRS`]), never through the agent's `PATH`; a relative program path is refused.
//! - Each file is hashed from the same open descriptor that supplied its device, inode and
//!   size, and a file whose length changes while it is read is refused.
//! - Files are streamed and capped ([`MAX_FILE`] each, [`MAX_TOTAL`] together).
//!
//! Not guaranteed:
//! - The window between [`Binding::recheck`] and `execve` remains; the runner should keep it
//!   short (or execute from the hashed descriptor).
//! - Inside inline code (`bash -c '…'`), files in command position (`./run.sh`) or run by an
//!   interpreter (`sh ./x`, `python3 x.py`) are bound; data files the code mentions, names
//!   built at run time (`sh "$(echo ./x)"`) and files the program opens on its own are not.
//!   The inline code itself is part of argv and so is bound.
//! - The permission delta (grants) is not part of the binding; the caller's request digest
//!   must cover it too.
//!
//! Everything here is blocking file I/O: call it from `spawn_blocking`.
//!
//! Tested by the unit tests below (temporary directories; the system `sh`).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

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
    /// The program argv[0] resolves to.
    pub executable: FileId,
    /// Every later argument that names an existing regular file, in argv order.
    pub scripts: Vec<FileId>,
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
    })
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
    /// (raw argv bytes, cwd bytes, environment in key order, every file identity).
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"ollie-binding-v1\0");
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
        hex(&h.finalize())
    }
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

/// argv[0] → the canonical path of the program: absolute, or a bare name found in
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

/// The strings in one argument that may name a file: the argument itself; for
/// `--opt=VALUE` / `-o=VALUE`, the value; and, when the argument is inline code (it holds
/// several words), the words in command position of each simple command (`./run.sh`) and
/// the word after a program that runs a file (`bash x.sh`, `python3 x.py`, `. ./env.sh`).
/// Other words (an output file, a pattern) are data and stay unbound, so an approval for
/// the session still matches after they change. Words split at whitespace and shell
/// punctuation, quotes dropped.
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
    for command in b.split(|c| b";&|()\n`".contains(c)).take(1024) {
        let words: Vec<&[u8]> = command
            .split(|c| c.is_ascii_whitespace())
            .map(|w| w.trim_ascii_start())
            .map(|w| {
                let w = w
                    .strip_prefix(b"\"")
                    .or_else(|| w.strip_prefix(b"'"))
                    .unwrap_or(w);
                w.strip_suffix(b"\"")
                    .or_else(|| w.strip_suffix(b"'"))
                    .unwrap_or(w)
            })
            .filter(|w| !w.is_empty() && w.len() <= 4096)
            // Assignments before a command (`X=1 ./run.sh`) are not the command.
            .skip_while(|w| w.contains(&b'=') && !w.starts_with(b"-"))
            .collect();
        let mut prev: Option<&[u8]> = None;
        for (i, w) in words.iter().enumerate() {
            let runner = prev.is_some_and(|p| {
                let base = p.rsplit(|c| *c == b'/').next().unwrap_or(p);
                RUNNERS.contains(&base)
            });
            if (i == 0 || runner) && !w.starts_with(b"-") {
                out.push(OsStr::from_bytes(w));
            }
            if !w.starts_with(b"-") {
                prev = Some(w);
            }
        }
    }
    out.dedup();
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
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn env() -> BTreeMap<String, String> {
        BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())])
    }

    fn sha256_of(b: &[u8]) -> String {
        hex(&Sha256::digest(b))
    }

    /// A copy of the system `sh` in `dir`, executable, by absolute path.
    fn copied_sh(dir: &Path) -> PathBuf {
        let sh = resolve_program(OsStr::new("sh")).unwrap();
        let dst = dir.join("mysh");
        std::fs::copy(&sh, &dst).unwrap();
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).unwrap();
        dst
    }

    #[test]
    fn binding_resolves_sh_in_system_dirs_and_hashes_it() {
        let d = tempfile::tempdir().unwrap();
        for name in ["sh", "bash"] {
            let b = match compute(&os(&[name, "-c", "true"]), d.path(), &env()) {
                Ok(b) => b,
                Err(e) if name == "bash" => {
                    println!("SKIP bash: {e}");
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            let p = &b.executable.path;
            assert!(p.is_absolute());
            assert_eq!(*p, std::fs::canonicalize(p).unwrap());
            assert!(
                ["/usr/", "/bin/", "/sbin/"]
                    .iter()
                    .any(|d| p.to_string_lossy().starts_with(d)),
                "{p:?}"
            );
            let content = std::fs::read(p).unwrap();
            assert_eq!(b.executable.size, content.len() as u64);
            assert_eq!(b.executable.sha256, sha256_of(&content));
            assert!(b.scripts.is_empty(), "{:?}", b.scripts);
            assert_eq!(b.argv, vec![name, "-c", "true"]);
            b.recheck().unwrap();
        }
    }

    #[test]
    fn binding_refuses_relative_and_missing_programs() {
        let d = tempfile::tempdir().unwrap();
        let exe = copied_sh(d.path());
        std::fs::create_dir(d.path().join("bin")).unwrap();
        std::fs::copy(&exe, d.path().join("bin/x")).unwrap();
        for rel in ["./mysh", "bin/x", "../mysh"] {
            let e = compute(&os(&[rel]), d.path(), &env()).unwrap_err();
            assert!(
                e.contains(
                    "the program must be named by an absolute path or found in the system directories"
                ),
                "{e}"
            );
        }
        // A bare name is never looked up in cwd or the agent's PATH.
        let mut agent_env = env();
        agent_env.insert("PATH".into(), d.path().to_string_lossy().into_owned());
        let e = compute(&os(&["mysh"]), d.path(), &agent_env).unwrap_err();
        assert!(e.contains("not found in the system directories"), "{e}");
        let e = compute(&os(&["ollie-no-such-program-xyz"]), d.path(), &env()).unwrap_err();
        assert!(e.contains("not found in the system directories"), "{e}");
        let missing = d.path().join("nope");
        let e = compute(&[missing.into_os_string()], d.path(), &env()).unwrap_err();
        assert!(e.contains("no such file"), "{e}");
        assert_eq!(
            compute(&[], d.path(), &env()).unwrap_err(),
            "the command is empty"
        );
        // A regular file without an execute bit.
        let plain = d.path().join("plain");
        std::fs::write(&plain, "x").unwrap();
        let e = compute(&[plain.into_os_string()], d.path(), &env()).unwrap_err();
        assert!(e.contains("is not executable"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn binding_hashes_scripts_absolute_and_relative_to_cwd() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run.sh");
        std::fs::write(&run, "echo hi\n").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/x.py"), "print(1)\n").unwrap();
        let abs = run.to_string_lossy().into_owned();
        let b = compute(
            &os(&["sh", &abs, "sub/x.py", "not-a-file", "sub"]),
            d.path(),
            &env(),
        )
        .unwrap();
        let canon = std::fs::canonicalize(d.path()).unwrap();
        assert_eq!(b.scripts.len(), 2, "{:?}", b.scripts);
        assert_eq!(b.scripts[0].path, canon.join("run.sh"));
        assert_eq!(b.scripts[0].sha256, sha256_of(b"echo hi\n"));
        assert_eq!(b.scripts[0].size, 8);
        assert_eq!(b.scripts[1].path, canon.join("sub/x.py"));
        assert_eq!(b.scripts[1].sha256, sha256_of(b"print(1)\n"));
        // `--opt=FILE` values are bound too.
        let b = compute(&os(&["sh", "--pre=run.sh"]), d.path(), &env()).unwrap();
        assert_eq!(b.scripts.len(), 1);
        assert_eq!(b.scripts[0].path, canon.join("run.sh"));
        // Inline code naming a file is bound as well (`sh -c ./run.sh` runs it).
        let b = compute(&os(&["sh", "-c", "./run.sh"]), d.path(), &env()).unwrap();
        assert_eq!(b.scripts.len(), 1);
        let b = compute(&os(&["sh", "-c", "echo hi; exit 0"]), d.path(), &env()).unwrap();
        assert!(b.scripts.is_empty());
    }

    #[test]
    fn binding_recheck_catches_an_edited_or_deleted_script() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run.sh");
        std::fs::write(&run, "echo hi\n").unwrap();
        let b = compute(&os(&["sh", "run.sh"]), d.path(), &env()).unwrap();
        b.recheck().unwrap();
        let canon = std::fs::canonicalize(&run).unwrap();
        let name = canon.to_string_lossy().into_owned();

        std::fs::write(&run, "echo evil\n").unwrap();
        let e = b.recheck().unwrap_err();
        assert!(e.starts_with(&format!("script {name} changed")), "{e}");
        assert!(e.contains("sha256"), "{e}");

        // Same content, new inode: still a replacement.
        std::fs::write(d.path().join("tmp"), "echo hi\n").unwrap();
        std::fs::rename(d.path().join("tmp"), &run).unwrap();
        let e = b.recheck().unwrap_err();
        assert!(e.starts_with(&format!("script {name} was replaced")), "{e}");

        std::fs::remove_file(&run).unwrap();
        let e = b.recheck().unwrap_err();
        assert_eq!(e, format!("script {name} is gone"));
    }

    #[test]
    fn binding_recheck_catches_a_new_or_retargeted_file() {
        let d = tempfile::tempdir().unwrap();
        let b = compute(&os(&["sh", "later.sh"]), d.path(), &env()).unwrap();
        assert!(b.scripts.is_empty());
        std::fs::write(d.path().join("later.sh"), "echo late\n").unwrap();
        let e = b.recheck().unwrap_err();
        assert!(e.contains("now names 1 file(s) (was 0)"), "{e}");

        std::fs::write(d.path().join("a.sh"), "a\n").unwrap();
        std::fs::write(d.path().join("b.sh"), "b\n").unwrap();
        std::os::unix::fs::symlink("a.sh", d.path().join("link.sh")).unwrap();
        let b = compute(&os(&["sh", "link.sh"]), d.path(), &env()).unwrap();
        b.recheck().unwrap();
        std::fs::remove_file(d.path().join("link.sh")).unwrap();
        std::os::unix::fs::symlink("b.sh", d.path().join("link.sh")).unwrap();
        let e = b.recheck().unwrap_err();
        assert!(e.contains("now resolves to"), "{e}");
        assert!(e.contains("b.sh"), "{e}");
    }

    #[test]
    fn binding_recheck_catches_a_replaced_executable() {
        let d = tempfile::tempdir().unwrap();
        let exe = copied_sh(d.path());
        let b = compute(
            &[exe.clone().into_os_string(), "-c".into(), "true".into()],
            d.path(),
            &env(),
        )
        .unwrap();
        b.recheck().unwrap();
        let name = std::fs::canonicalize(&exe).unwrap();
        let name = name.to_string_lossy();

        // Different contents.
        let mut content = std::fs::read(&exe).unwrap();
        content.push(0);
        std::fs::write(&exe, &content).unwrap();
        let e = b.recheck().unwrap_err();
        assert!(
            e.starts_with(&format!("the executable {name} changed (sha256 ")),
            "{e}"
        );

        // Gone.
        std::fs::remove_file(&exe).unwrap();
        let e = b.recheck().unwrap_err();
        assert_eq!(e, format!("the executable {name} is gone"));

        // Named through a symlink that is then retargeted.
        let real = copied_sh(d.path());
        let other = d.path().join("other");
        std::fs::copy(&real, &other).unwrap();
        let link = d.path().join("prog");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let b = compute(&[link.clone().into_os_string()], d.path(), &env()).unwrap();
        assert_eq!(b.executable.path, std::fs::canonicalize(&real).unwrap());
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&other, &link).unwrap();
        let e = b.recheck().unwrap_err();
        assert!(e.starts_with("the executable now resolves to "), "{e}");
    }

    #[test]
    fn binding_digest_is_stable_and_covers_argv_and_env() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("empty"), "").unwrap();
        let a = compute(&os(&["sh", "empty"]), d.path(), &env()).unwrap();
        assert_eq!(a.scripts.len(), 1);
        assert_eq!(a.scripts[0].size, 0);
        assert_eq!(a.scripts[0].sha256, sha256_of(b""));
        a.recheck().unwrap();

        let again = compute(&os(&["sh", "empty"]), d.path(), &env()).unwrap();
        assert_eq!(a, again);
        assert_eq!(a.digest(), again.digest());
        assert_eq!(a.digest().len(), 64);

        let other_argv = compute(&os(&["sh", "empty", "x"]), d.path(), &env()).unwrap();
        assert_ne!(a.digest(), other_argv.digest());
        // Length prefixes: moving a byte between arguments changes the digest.
        let x = compute(&os(&["sh", "ab", "c"]), d.path(), &env()).unwrap();
        let y = compute(&os(&["sh", "a", "bc"]), d.path(), &env()).unwrap();
        assert_ne!(x.digest(), y.digest());

        let mut e2 = env();
        e2.insert("LANG".into(), "C".into());
        let other_env = compute(&os(&["sh", "empty"]), d.path(), &e2).unwrap();
        assert_ne!(a.digest(), other_env.digest());

        let sub = d.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let other_cwd = compute(&os(&["sh", "../empty"]), &sub, &env()).unwrap();
        assert_ne!(a.digest(), other_cwd.digest());
    }

    #[test]
    fn binding_keeps_non_utf8_argv_exact() {
        let d = tempfile::tempdir().unwrap();
        let a = OsString::from_vec(vec![0xff, b'a']);
        let b = OsString::from_vec(vec![0xfe, b'a']);
        let x = compute(&["sh".into(), a], d.path(), &env()).unwrap();
        let y = compute(&["sh".into(), b], d.path(), &env()).unwrap();
        // Lossy display is identical; the binding is not.
        assert_eq!(x.argv, y.argv);
        assert_ne!(x, y);
        assert_ne!(x.digest(), y.digest());
        x.recheck().unwrap();
        let json = serde_json::to_value(&x).unwrap();
        assert!(json.get("argv_raw").is_none());
        assert_eq!(json["argv"][0], "sh");
    }

    #[test]
    fn binding_refuses_a_relative_or_missing_cwd() {
        let e = compute(&os(&["sh"]), Path::new("rel"), &env()).unwrap_err();
        assert!(e.contains("not an absolute path"), "{e}");
        let d = tempfile::tempdir().unwrap();
        let e = compute(&os(&["sh"]), &d.path().join("nope"), &env()).unwrap_err();
        assert!(e.contains("is not a directory"), "{e}");
    }

    #[test]
    fn binding_inline_code_binds_commands_and_interpreted_files_not_data() {
        let words = |code: &str| -> Vec<String> {
            candidates(OsStr::new(code))
                .iter()
                .skip(1)
                .map(|w| w.to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(words("bash /w/run.sh"), ["bash", "/w/run.sh"]);
        assert_eq!(
            words("cd /w && X=1 ./build.sh --fast; python3 -u tool.py in.txt"),
            ["cd", "./build.sh", "python3", "tool.py"]
        );
        assert_eq!(words("echo ran >> /w/out"), ["echo"]);
        assert_eq!(words("cat a | sh 'b.sh'"), ["cat", "sh", "b.sh"]);
        assert_eq!(words(". ./env.sh"), [".", "./env.sh"]);
        assert!(words("single").is_empty());
    }

    #[test]
    fn kernel_files_named_in_code_are_not_bound() {
        let dir = tempfile::tempdir().unwrap();
        let argv = [
            OsString::from("bash"),
            OsString::from("-c"),
            OsString::from("grep CapEff /proc/self/status; cat /sys/kernel/osrelease /dev/null"),
        ];
        let b = compute(&argv, dir.path(), &BTreeMap::new()).unwrap();
        assert!(b.scripts.is_empty(), "{:?}", b.scripts);
        assert!(b.recheck().is_ok());
    }
}
