//! `o mount DIR`: olliesrv's namespace as a real filesystem, through FUSE, with nothing else
//! installed (no plan9port, no kernel 9P client).
//!
//! The bridge is one 9P connection (our `p9` client, attached as the current user exactly as
//! `o` and `ollie-9p` are) and one FUSE session of our own ([`crate::fuse`]; as root the kernel
//! mount is made directly, otherwise through the setuid `fusermount3`). How FUSE maps onto 9P:
//!
//! - **Nodes are paths.** A FUSE inode stands for a path from the root; every operation walks
//!   that path afresh (one Twalk of up to 16 names), so sessions and agents that come and go on
//!   the server are seen at once. Entry names are cached by the kernel for [`ENTRY_TTL`];
//!   attributes are never cached (sizes of chat, log and the like change all the time).
//! - **Open files are fids.** Each FUSE open is its own walked and opened fid, kept until the
//!   kernel releases the file: 9P's per-fid state (request/response replies of `ctl` and `new`
//!   files, `statewait`'s baseline, `feed`'s last value) is per open file descriptor.
//! - **Direct I/O.** Every file is opened with `FOPEN_DIRECT_IO`, so each read(2) and write(2)
//!   is one Tread or Twrite at the caller's offset: synthetic files whose stat length is 0 are
//!   read in full, blocking files block, and `echo cmd > ctl` is one write.
//! - **Read ahead.** A read that gets all it asked for sends the Tread for the same amount
//!   right after it at once, so the server sends the next piece while the caller is busy with
//!   this one. It answers only the next read at that offset on that descriptor, and only if
//!   nothing was changed through the mount since it was sent; otherwise (and on close) it is
//!   dropped, and flushed if still unanswered. What it returns is as fresh as if the read
//!   before had asked for both pieces. Short reads (a line of `statewait`, the end of a file)
//!   and request/response descriptors start none. The read ahead's payload is spliced from
//!   the 9P socket into a pipe and from there into `/dev/fuse`: the bridge never copies it.
//! - **Locks** (`flock`, `fcntl`) are the kernel's, local to this machine: 9P has none.
//! - **Request/response on one descriptor.** After a write to a length-0 file opened
//!   read-write, a read that continues at the offset the write left (`exec 3<>ctl; printf … >&3;
//!   cat <&3`) reads the reply from its start; a read at 0 (write, seek, read) is passed as is.
//! - **Appends** (`O_APPEND`, `>>`) write at the length a fresh Tstat reports.
//! - **Interrupts become Tflush.** A signal to a process blocked in a read or write makes the
//!   kernel send `FUSE_INTERRUPT`; the bridge drops the 9P request, which flushes it (the
//!   `p9` client sends Tflush and waits for Rflush), and answers the read with EINTR. So
//!   Ctrl-C on `cat statewait` or `tail -f chat` returns at once (plan9port's 9pfuse never
//!   flushes, and such a read waits for the server).
//! - **Errors** map the server's message to an errno by the words DESIGN.md §3.1 lists
//!   ([`errno_for`]); the message of a failed change (write, create, remove, rename) is
//!   logged on standard error (in the background only with `-v`), every other with `-v`, and
//!   `cat lasterror` in the mount shows the last one of one's own writes.
//! - **Create, mkdir, rm, rmdir, mv** are Tcreate, Tremove and a Twstat of the name; a rename
//!   to another directory is EXDEV (9P2000 renames in place), so `mv` copies instead.
//! - **The end:** when olliesrv closes the connection the bridge unmounts (lazily, so a shell
//!   whose working directory is inside does not keep a dead mount) and exits; `o mount -u DIR`
//!   or `fusermount3 -u DIR` unmounts and the bridge exits.

use std::collections::{HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::io::{BufRead, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use ollie_p9::client::{Call, ClientError, Fid, Spliced, SplicedCall};
use ollie_p9::wire::{Stat, dm, om};
use tokio::sync::oneshot;

use crate::conn::Conn;
use crate::fuse::{self, Attr, Device, Pipes, Request, fattr, op};

pub const AFTER_HELP: &str = "\
DIR must be an empty directory. o mount returns once the mount serves and leaves the bridge \
running in the background (-f keeps it in the foreground, logging to standard error). The \
mount belongs to you: other users, root included, cannot enter it unless --allow-other is \
given (which needs user_allow_other in /etc/fuse.conf when not root). As a user other than \
root it needs the setuid fusermount3 (Debian package fuse3).\n\
Blocking files (statewait, eventwait, feed, bypass/pending, chat at its end) block, and \
Ctrl-C interrupts them at once: the read is flushed on the server. When olliesrv stops, the \
mount goes away by itself.\n\n\
EXAMPLES:\n  \
mkdir -p ~/n/ollie && o mount ~/n/ollie\n  \
cat ~/n/ollie/bypass/pending                         escalation requests, one per read\n  \
echo 'fix the build' > ~/n/ollie/session/proj/agent/main/prompt\n  \
cat ~/n/ollie/session/proj/agent/main/chat           streams (tail -f too, once it is not empty)\n  \
cat ~/n/ollie/session/*/agent/*/stats\n  \
o mount -u ~/n/ollie                                 or: fusermount3 -u ~/n/ollie\n  \
o -a unix!/run/ollie/ollie mount /mnt/ollie          the system service";

/// `o mount` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The directory to mount on (it must exist and be empty).
    dir: PathBuf,
    /// Unmount DIR instead (as `fusermount3 -u DIR` does).
    #[arg(short = 'u', long = "unmount")]
    unmount: bool,
    /// With -u: detach the mount even while files in it are open (umount -l).
    #[arg(short = 'z', long = "lazy", requires = "unmount")]
    lazy: bool,
    /// Stay in the foreground, logging to standard error; Ctrl-C unmounts.
    #[arg(short = 'f', long = "foreground", conflicts_with = "unmount")]
    foreground: bool,
    /// Log every error the server returns (with its message) to standard error.
    #[arg(short = 'v', long = "verbose", conflicts_with = "unmount")]
    verbose: bool,
    /// Let other users (and root) use the mount.
    #[arg(long = "allow-other", conflicts_with = "unmount")]
    allow_other: bool,
    /// Internal: the background bridge started by `o mount` (reports readiness on stdout).
    #[arg(long = "daemon-child", hide = true)]
    daemon_child: bool,
}

/// How long the kernel may keep a name → node mapping without asking again.
const ENTRY_TTL: Duration = Duration::from_secs(1);
/// Attributes are never cached: synthetic files change size all the time.
const ATTR_TTL: Duration = Duration::ZERO;
/// The root's inode (FUSE_ROOT_ID).
const ROOT_INO: u64 = 1;
/// `fuse_open_out.open_flags`: bypass the page cache (every read and write reaches us).
const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// `renameat2` flags.
const RENAME_NOREPLACE: u32 = 1 << 0;
/// Pipe pairs kept for spliced reads (one per file read in parallel).
const SPARE_PIPES: usize = 4;
/// Interrupts kept for requests that had not registered yet when the interrupt came.
const EARLY_INTERRUPTS: usize = 256;
/// The readiness line the background bridge prints for its parent.
const READY: &str = "ready";
/// Exit statuses.
const EXIT_FAIL: u8 = 1;
const EXIT_USAGE: u8 = 2;
/// The mount type, as /proc/self/mountinfo shows it.
const FSTYPE: &str = "fuse.ollie";

pub fn main(addr: Option<String>, key: Option<PathBuf>, args: Args) -> ExitCode {
    let dir = match mount_point(&args.dir) {
        Ok(d) => d,
        Err(m) => return fail(EXIT_USAGE, &m),
    };
    if args.unmount {
        return match unmount(&dir, args.lazy) {
            Ok(()) => ExitCode::SUCCESS,
            Err(m) => fail(EXIT_FAIL, &m),
        };
    }
    if !args.foreground && !args.daemon_child {
        return start_background(addr.as_deref(), key.as_deref(), &args, &dir);
    }
    serve(addr, key, &args, &dir)
}

fn fail(code: u8, msg: &str) -> ExitCode {
    eprintln!("o mount: {}", crate::render::line_safe(msg));
    ExitCode::from(code)
}

/// DIR, absolute and checked to be a directory.
fn mount_point(dir: &Path) -> Result<PathBuf, String> {
    let abs = std::path::absolute(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    match std::fs::metadata(&abs) {
        Ok(m) if m.is_dir() => Ok(abs),
        Ok(_) => Err(format!("{}: not a directory", dir.display())),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

/// Starts the bridge as a child in its own process group (so the terminal's Ctrl-C does not
/// reach it), waits for its readiness line, and returns; a child that fails before that has
/// already said why on the shared standard error, and its status is ours.
fn start_background(addr: Option<&str>, key: Option<&Path>, args: &Args, dir: &Path) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return fail(EXIT_FAIL, &format!("cannot find the o executable: {e}")),
    };
    let mut c = Command::new(exe);
    if let Some(a) = addr {
        c.arg("-a").arg(a);
    }
    if let Some(k) = key {
        c.arg("-k").arg(k);
    }
    c.arg("mount").arg("--daemon-child");
    if args.verbose {
        c.arg("--verbose");
    }
    if args.allow_other {
        c.arg("--allow-other");
    }
    c.arg("--").arg(dir);
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0);
    let mut child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => return fail(EXIT_FAIL, &format!("cannot start the bridge: {e}")),
    };
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    if line.trim_end() == READY {
        return ExitCode::SUCCESS;
    }
    match child.wait() {
        Ok(st) => match st.code() {
            Some(0) | None => fail(EXIT_FAIL, "the bridge ended before the mount was ready"),
            Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(EXIT_FAIL)),
        },
        Err(e) => fail(EXIT_FAIL, &format!("waiting for the bridge: {e}")),
    }
}

/// Whether `dir` is one of our mounts, from /proc/self/mountinfo.
fn is_our_mount(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mountinfo_has(&info, dir)
}

fn mountinfo_has(info: &str, dir: &Path) -> bool {
    info.lines().any(|l| {
        let point = l.split(' ').nth(4).map(unescape_mountinfo);
        let fstype = l.split(" - ").nth(1).and_then(|r| r.split(' ').next());
        point.is_some_and(|p| Path::new(&p) == dir) && fstype == Some(FSTYPE)
    })
}

/// Mount points in mountinfo escape space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = (b[i] == b'\\' && i + 3 < b.len())
            .then(|| &b[i + 1..i + 4])
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                u8::try_from(v).ok()
            });
        if let Some(v) = octal {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `o mount -u DIR`: only our own FUSE mounts are unmounted.
fn unmount(dir: &Path, lazy: bool) -> Result<(), String> {
    if !is_our_mount(dir) {
        return Err(format!("{} is not an o mount", dir.display()));
    }
    detach(dir, lazy)
}

/// Unmounts: as root with umount2(2), otherwise with `fusermount3 -u` (which checks that the
/// mount is the caller's).
fn detach(dir: &Path, lazy: bool) -> Result<(), String> {
    if nix::unistd::geteuid().is_root() {
        let flags = if lazy {
            nix::mount::MntFlags::MNT_DETACH
        } else {
            nix::mount::MntFlags::empty()
        };
        return nix::mount::umount2(dir, flags).map_err(|e| match e {
            nix::errno::Errno::EBUSY => format!(
                "{} is busy (a process has a file open or its working directory there; -z detaches it anyway)",
                dir.display()
            ),
            e => format!("cannot unmount {}: {}", dir.display(), e.desc()),
        });
    }
    let mut c = Command::new("fusermount3");
    c.arg("-u");
    if lazy {
        c.arg("-z");
    }
    c.arg("--").arg(dir);
    let out = c.output().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            "fusermount3 not found (install the fuse3 package)".to_owned()
        }
        _ => format!("cannot run fusermount3: {e}"),
    })?;
    if out.status.success() {
        Ok(())
    } else {
        let msg = String::from_utf8_lossy(&out.stderr);
        let msg = msg.trim().trim_start_matches("fusermount3: ");
        Err(format!("cannot unmount {}: {msg}", dir.display()))
    }
}

/// The bridge itself: connect, mount, serve until unmounted or the server goes away.
fn serve(addr: Option<String>, key: Option<PathBuf>, args: &Args, dir: &Path) -> ExitCode {
    // One thread: a bulk read's receive and its FUSE reply then run back to back on warm
    // caches instead of handing each reply between workers (cat of 64 MiB ≈8 % faster, ≈7 %
    // less CPU). Every handler awaits the server; the only blocking calls are the lookups of
    // owner names, made once per name.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_FAIL, &format!("cannot start the runtime: {e}")),
    };
    let code = rt.block_on(run(addr, key, args, dir));
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

async fn run(addr: Option<String>, key: Option<PathBuf>, args: &Args, dir: &Path) -> ExitCode {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int, mut hup) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        // A closed terminal must not end a bridge started from it.
        signal(SignalKind::hangup()),
    ) {
        (Ok(t), Ok(i), Ok(h)) => (t, i, h),
        _ => return fail(EXIT_FAIL, "cannot install signal handlers"),
    };
    let conn = match Conn::connect(addr.as_deref(), key.as_deref()).await {
        Ok(c) => c,
        Err(f) => return f.exit(),
    };
    let client = conn.root.client().clone();
    let bridge = Arc::new(Bridge::new(conn.root, args.verbose));
    let dev = match fuse::mount(dir, args.allow_other) {
        Ok(fd) => fd,
        Err(m) => {
            return fail(
                EXIT_FAIL,
                &format!("cannot mount on {}: {m}", dir.display()),
            );
        }
    };
    let dev = match Device::new(dev) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            let _ = detach(dir, true);
            return fail(EXIT_FAIL, &format!("cannot serve /dev/fuse: {e}"));
        }
    };
    let served = session(bridge, dev);
    tokio::pin!(served);
    if args.daemon_child {
        // The parent is waiting for this line; then let go of its stdout and stderr, so that
        // whoever waits for their end (a pipe, a test harness) is not held by the bridge.
        let mut out = std::io::stdout();
        let _ = writeln!(out, "{READY}").and_then(|()| out.flush());
        detach_stdio(args.verbose);
    } else {
        eprintln!(
            "o mount: serving {} on {} (Ctrl-C or o mount -u unmounts)",
            addr.as_deref().unwrap_or("the default server"),
            dir.display()
        );
    }
    let ended = tokio::select! {
        r = &mut served => {
            // Unmounted (o mount -u, fusermount3 -u, umount): nothing more to do.
            return match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(m) => {
                    let _ = detach(dir, true);
                    fail(EXIT_FAIL, &format!("the FUSE session failed: {m}"))
                }
            };
        }
        () = client.closed() => "olliesrv closed the connection",
        _ = term.recv() => "stopped",
        _ = int.recv() => "interrupted",
        // Hangups are swallowed; only the end of the signal stream gets here.
        () = async { while hup.recv().await.is_some() {} } => "signal handling ended",
    };
    eprintln!("o mount: {ended}; unmounting {}", dir.display());
    // Lazily when the server is gone: a shell sitting inside must not keep a dead mount.
    let lazy = ended.starts_with("olliesrv");
    if let Err(m) = detach(dir, lazy) {
        return fail(EXIT_FAIL, &m);
    }
    // The kernel ends the session once the last file open in the mount is closed.
    let _ = tokio::time::timeout(Duration::from_secs(5), served).await;
    ExitCode::SUCCESS
}

/// Points standard output (and, unless logging, standard error) at /dev/null.
fn detach_stdio(keep_stderr: bool) {
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return;
    };
    let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
    if !keep_stderr {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 2);
    }
}

// ---------------------------------------------------------------------------------------------
// Errors.

/// The errno for a 9P failure. Server messages are matched by the words our servers (and
/// 9pfuse) use, DESIGN.md §3.1; `unmatched` is the errno for anything else (EINVAL for a
/// refused write, whose message is a complaint about its content; EIO otherwise).
pub(crate) fn errno_for(e: &ClientError, unmatched: i32) -> i32 {
    let msg = match e {
        ClientError::Server(m) => m.to_ascii_lowercase(),
        ClientError::Usage(_) => return libc::EINVAL,
        _ => return libc::EIO,
    };
    const WORDS: &[(&str, i32)] = &[
        ("file does not exist", libc::ENOENT),
        ("does not exist", libc::ENOENT),
        ("no such", libc::ENOENT),
        ("not found", libc::ENOENT),
        ("permission denied", libc::EACCES),
        ("not permitted", libc::EPERM),
        ("already exists", libc::EEXIST),
        ("is a directory", libc::EISDIR),
        ("not a directory", libc::ENOTDIR),
        ("not empty", libc::ENOTEMPTY),
        ("read-only", libc::EROFS),
        ("in use", libc::EBUSY),
        ("interrupted", libc::EINTR),
        ("not implemented", libc::ENOSYS),
        ("not supported", libc::EOPNOTSUPP),
        ("name too long", libc::ENAMETOOLONG),
        ("no space", libc::ENOSPC),
        ("too large", libc::EFBIG),
        ("too big", libc::EFBIG),
        ("timed out", libc::ETIMEDOUT),
        ("invalid argument", libc::EINVAL),
    ];
    WORDS
        .iter()
        .find(|(w, _)| msg.contains(w))
        .map_or(unmatched, |(_, n)| *n)
}

/// An error number for the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Errno(i32);

fn err(n: i32) -> Errno {
    Errno(n)
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// Nodes: inode ↔ path.

#[derive(Debug)]
struct Node {
    path: Vec<String>,
    /// The kernel's references (lookups minus forgets); the root is never forgotten.
    lookups: u64,
}

#[derive(Debug)]
struct Nodes {
    by_ino: HashMap<u64, Node>,
    by_path: HashMap<Vec<String>, u64>,
    next: u64,
}

impl Nodes {
    fn new() -> Nodes {
        let mut n = Nodes {
            by_ino: HashMap::new(),
            by_path: HashMap::new(),
            next: ROOT_INO + 1,
        };
        n.by_ino.insert(
            ROOT_INO,
            Node {
                path: Vec::new(),
                lookups: 1,
            },
        );
        n.by_path.insert(Vec::new(), ROOT_INO);
        n
    }

    fn path(&self, ino: u64) -> Result<Vec<String>, Errno> {
        self.by_ino
            .get(&ino)
            .map(|n| n.path.clone())
            .ok_or_else(|| err(libc::ESTALE))
    }

    /// The node for `path`, counted as one more kernel reference.
    fn remember(&mut self, path: Vec<String>) -> u64 {
        if let Some(&ino) = self.by_path.get(&path) {
            if let Some(n) = self.by_ino.get_mut(&ino) {
                n.lookups += 1;
            }
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_path.insert(path.clone(), ino);
        self.by_ino.insert(ino, Node { path, lookups: 1 });
        ino
    }

    fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let gone = match self.by_ino.get_mut(&ino) {
            Some(node) => {
                node.lookups = node.lookups.saturating_sub(n);
                node.lookups == 0
            }
            None => false,
        };
        if gone
            && let Some(node) = self.by_ino.remove(&ino)
            && self.by_path.get(&node.path) == Some(&ino)
        {
            self.by_path.remove(&node.path);
        }
    }

    /// After a rename of `from` to `to`: the node and everything under it follow.
    fn renamed(&mut self, from: &[String], to: &[String]) {
        // Whatever was at `to` is replaced; its node (if the kernel still holds it) no longer
        // has a path of its own.
        if let Some(old) = self.by_path.remove(to)
            && let Some(n) = self.by_ino.get_mut(&old)
        {
            n.path = vec![String::from("\0replaced")];
        }
        let moved: Vec<(Vec<String>, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (p, ino) in moved {
            self.by_path.remove(&p);
            let mut np = to.to_vec();
            np.extend_from_slice(&p[from.len()..]);
            if let Some(n) = self.by_ino.get_mut(&ino) {
                n.path = np.clone();
            }
            self.by_path.insert(np, ino);
        }
    }
}

/// A directory entry name as a 9P name: UTF-8, not empty, no slash.
fn nine_name(name: &OsStr) -> Result<String, Errno> {
    match name.to_str() {
        Some(s) if !s.is_empty() && !s.contains('/') && s != "." && s != ".." => Ok(s.to_owned()),
        _ => Err(err(libc::ENOENT)),
    }
}

// ---------------------------------------------------------------------------------------------
// Open files.

#[derive(Debug)]
struct Handle {
    /// The read ahead of the caller (before `fid`, so that it is flushed before the clunk).
    ahead: Mutex<Option<Ahead>>,
    /// Whether reads of this descriptor may be read ahead (not a request/response descriptor).
    read_ahead: bool,
    fid: Fid,
    /// `>>`: every write goes to the file's current length.
    append: bool,
    /// A read-write open of a length-0 file: replies of request/response files.
    reply_file: bool,
    cursor: Mutex<Cursor>,
    /// A directory's entries, read when listing starts (offset 0).
    entries: tokio::sync::Mutex<Option<Arc<Vec<Stat>>>>,
}

/// A Tread sent before the caller asked (see "Read ahead" above).
#[derive(Debug)]
struct Ahead {
    offset: u64,
    /// [`Bridge::changes`] when it was sent: a change made through the mount since voids it.
    changes: u64,
    data: AheadData,
}

#[derive(Debug)]
enum AheadData {
    /// On its way; dropping it unanswered flushes the Tread.
    Sent(Call),
    /// On its way, its payload to be spliced into these pipes (the pipes are dropped with
    /// it: the 9P reader may still be filling them).
    Spliced(SplicedCall, Pipes),
    /// What is left of a reply after a shorter read took its front.
    Got(Bytes),
}

/// Counts a change through the mount ([`Bridge::changed`]) when dropped.
struct Changing<'a>(&'a Bridge);

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        self.0.changed();
    }
}

/// Where replies start on a read-write descriptor ([`Handle::reply_file`]).
#[derive(Debug, Default)]
struct Cursor {
    /// The offset the last write ended at, until the next read.
    wrote_to: Option<u64>,
    /// Descriptor offset of the reply's first byte.
    base: u64,
}

impl Cursor {
    /// The 9P offset for a read at descriptor offset `off`.
    fn read_at(&mut self, off: u64) -> u64 {
        if let Some(w) = self.wrote_to.take() {
            // A read continuing where the write left off wants the reply from its start; one
            // anywhere else (a seek back to 0) means what it says.
            self.base = if off == w { w } else { 0 };
        }
        if off >= self.base {
            off - self.base
        } else {
            self.base = 0;
            off
        }
    }
}

/// See [`Bridge::target`].
enum Target {
    Open(Arc<Handle>),
    Walked(Fid),
}

impl Target {
    fn fid(&self) -> &Fid {
        match self {
            Target::Open(h) => &h.fid,
            Target::Walked(f) => f,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Interrupts.

#[derive(Debug, Default)]
struct Interrupts {
    waiting: HashMap<u64, oneshot::Sender<()>>,
    /// Interrupts that came before their request registered (the kernel sends them once the
    /// request was read, which may be before its task ran).
    early: VecDeque<u64>,
}

/// Removes a request's registration when it ends.
struct Registered<'a> {
    ints: &'a Mutex<Interrupts>,
    unique: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        locked(self.ints).waiting.remove(&self.unique);
    }
}

// ---------------------------------------------------------------------------------------------
// The filesystem.

#[derive(Debug)]
struct Bridge {
    root: Fid,
    nodes: Mutex<Nodes>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    ints: Mutex<Interrupts>,
    /// Owner and group names → local ids.
    ids: Mutex<HashMap<(bool, String), u32>>,
    /// The preferred I/O size stat reports (cat and cp read this much at a time): the largest
    /// power of two one Tread carries.
    blksize: u32,
    verbose: bool,
    /// Counts changes of file contents made through the mount (writes, truncation, create),
    /// so that a read ahead sent before one is not used after it.
    changes: AtomicU64,
    /// Empty pipes for spliced read replies, kept for the next.
    pipes: Mutex<Vec<Pipes>>,
}

impl Bridge {
    fn new(root: Fid, verbose: bool) -> Bridge {
        let blksize = 1 << root.client().max_io().max(4096).ilog2();
        Bridge {
            root,
            nodes: Mutex::new(Nodes::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            ints: Mutex::new(Interrupts::default()),
            ids: Mutex::new(HashMap::new()),
            blksize,
            verbose,
            changes: AtomicU64::new(0),
            pipes: Mutex::new(Vec::new()),
        }
    }

    /// A pair of empty pipes for a spliced read (none if pipes cannot be made: the read is
    /// then copied).
    fn take_pipes(&self) -> Option<Pipes> {
        locked(&self.pipes).pop().or_else(|| Pipes::new().ok())
    }

    /// Keeps pipes that are empty again for the next read.
    fn put_pipes(&self, p: Pipes) {
        let mut pool = locked(&self.pipes);
        if pool.len() < SPARE_PIPES {
            pool.push(p);
        }
    }

    /// Called once a change of file contents made through the mount has been answered.
    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// A 9P failure as an errno, logged with the server's message: always for a change
    /// (a write, create, remove, rename, setattr: an errno alone loses the server's reason),
    /// every failure when verbose. In the background, standard error is kept only with -v;
    /// the server's `lasterror` file has the message in any case.
    fn fail(&self, op: &str, path: &[String], e: &ClientError, unmatched: i32) -> Errno {
        let n = errno_for(e, unmatched);
        let change = !matches!(
            op,
            "lookup" | "getattr" | "read" | "readdir" | "open" | "opendir"
        );
        if self.verbose || change {
            let what = format!("{op} /{}: {e}", path.join("/"));
            eprintln!("o mount: {}", crate::render::line_safe(&what));
        }
        err(n)
    }

    fn path(&self, ino: u64) -> Result<Vec<String>, Errno> {
        locked(&self.nodes).path(ino)
    }

    fn child_path(&self, parent: u64, name: &OsStr) -> Result<Vec<String>, Errno> {
        let mut p = self.path(parent)?;
        p.push(nine_name(name)?);
        Ok(p)
    }

    fn handle(&self, fh: u64) -> Result<Arc<Handle>, Errno> {
        locked(&self.handles)
            .get(&fh)
            .cloned()
            .ok_or_else(|| err(libc::EBADF))
    }

    fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        locked(&self.handles).insert(fh, Arc::new(h));
        fh
    }

    async fn walk(&self, op: &str, path: &[String]) -> Result<Fid, Errno> {
        self.root
            .walk(path)
            .await
            .map_err(|e| self.fail(op, path, &e, libc::EIO))
    }

    /// The fid an attribute operation works on: the open file's when the kernel names one
    /// (so a renamed or removed open file still answers), else `path` walked afresh.
    async fn target(&self, op: &str, path: &[String], fh: Option<u64>) -> Result<Target, Errno> {
        match fh.and_then(|fh| self.handle(fh).ok()) {
            Some(h) => Ok(Target::Open(h)),
            None => Ok(Target::Walked(self.walk(op, path).await?)),
        }
    }

    async fn stat_path(&self, op: &str, path: &[String]) -> Result<Stat, Errno> {
        let fid = self.walk(op, path).await?;
        fid.stat()
            .await
            .map_err(|e| self.fail(op, path, &e, libc::EIO))
    }

    /// Runs `fut` until it ends or the kernel interrupts request `unique`; an interrupted
    /// future is dropped, which flushes its 9P request.
    async fn interruptible<T>(
        &self,
        unique: u64,
        fut: impl Future<Output = Result<T, Errno>>,
    ) -> Result<T, Errno> {
        let (tx, rx) = oneshot::channel();
        {
            let mut ints = locked(&self.ints);
            if let Some(i) = ints.early.iter().position(|u| *u == unique) {
                ints.early.remove(i);
                return Err(err(libc::EINTR));
            }
            ints.waiting.insert(unique, tx);
        }
        let _reg = Registered {
            ints: &self.ints,
            unique,
        };
        tokio::select! {
            r = fut => r,
            _ = rx => Err(err(libc::EINTR)),
        }
    }

    /// A local uid (`group` false) or gid for a 9P owner or group name: the account of that
    /// name here, else the overflow id 65534 ("nobody").
    fn local_id(&self, group: bool, name: &str) -> u32 {
        let key = (group, name.to_owned());
        if let Some(&id) = locked(&self.ids).get(&key) {
            return id;
        }
        let id = if group {
            nix::unistd::Group::from_name(name)
                .ok()
                .flatten()
                .map(|g| g.gid.as_raw())
        } else {
            nix::unistd::User::from_name(name)
                .ok()
                .flatten()
                .map(|u| u.uid.as_raw())
        }
        .unwrap_or(65534);
        locked(&self.ids).insert(key, id);
        id
    }

    fn attr(&self, ino: u64, st: &Stat) -> Attr {
        let dir = st.qid.is_dir() || st.mode & dm::DIR != 0;
        Attr {
            ino,
            size: st.length,
            atime: u64::from(st.atime),
            mtime: u64::from(st.mtime),
            mode: if dir { libc::S_IFDIR } else { libc::S_IFREG } | (st.mode & 0o777),
            nlink: if dir { 2 } else { 1 },
            uid: self.local_id(false, &st.uid),
            gid: self.local_id(true, &st.gid),
            blksize: self.blksize,
        }
    }

    /// A `fuse_entry_out` for node `ino`.
    fn entry(&self, ino: u64, st: &Stat) -> Vec<u8> {
        let mut out = Vec::with_capacity(128 + 16);
        fuse::entry_out(&mut out, &self.attr(ino, st), ENTRY_TTL, ATTR_TTL);
        out
    }

    /// An inode number for a listed entry without taking a reference: the node's if the kernel
    /// knows it, else one derived from the qid (high bit set, apart from node numbers).
    fn listed_ino(&self, path: &[String], st: &Stat) -> u64 {
        locked(&self.nodes)
            .by_path
            .get(path)
            .copied()
            .unwrap_or(st.qid.path | 1 << 63)
    }

    /// Reads a directory's entries (again when listing restarts at offset 0).
    async fn dir_entries(
        &self,
        h: &Handle,
        offset: u64,
        path: &[String],
    ) -> Result<Arc<Vec<Stat>>, Errno> {
        let mut cached = h.entries.lock().await;
        if offset == 0 || cached.is_none() {
            let list = h
                .fid
                .read_dir()
                .await
                .map_err(|e| self.fail("readdir", path, &e, libc::EIO))?;
            *cached = Some(Arc::new(list));
        }
        Ok(cached.clone().unwrap_or_default())
    }

    /// Walks to `path` and opens it with the FUSE open flags.
    async fn open_fid(&self, op: &str, path: &[String], flags: u32) -> Result<Handle, Errno> {
        let mut fid = self.walk(op, path).await?;
        let flags = flags as i32;
        let mut mode = match flags & libc::O_ACCMODE {
            libc::O_WRONLY => om::OWRITE,
            libc::O_RDWR => om::ORDWR,
            _ => om::OREAD,
        };
        if flags & libc::O_TRUNC != 0 && mode != om::OREAD {
            mode |= om::OTRUNC;
        }
        let reply_file = mode & 3 == om::ORDWR
            && !fid.qid().is_dir()
            && fid.stat().await.is_ok_and(|s| s.length == 0);
        let opened = fid.open(mode).await;
        if mode & om::OTRUNC != 0 {
            self.changed();
        }
        opened.map_err(|e| self.fail(op, path, &e, libc::EIO))?;
        Ok(Handle {
            ahead: Mutex::new(None),
            read_ahead: mode & 3 != om::OWRITE && !reply_file,
            fid,
            append: flags & libc::O_APPEND != 0,
            reply_file,
            cursor: Mutex::new(Cursor::default()),
            entries: tokio::sync::Mutex::new(None),
        })
    }

    async fn rename_to(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        replace: bool,
    ) -> Result<(), Errno> {
        let from = self.child_path(parent, name)?;
        let to = self.child_path(new_parent, new_name)?;
        if from[..from.len() - 1] != to[..to.len() - 1] {
            // 9P2000 renames within a directory only; mv then copies and removes.
            return Err(err(libc::EXDEV));
        }
        let fid = self.walk("rename", &from).await?;
        let mut st = Stat::dont_touch();
        st.name = to[to.len() - 1].clone();
        match fid.wstat(&st).await {
            Ok(()) => {}
            Err(e) if replace && errno_for(&e, libc::EIO) == libc::EEXIST => {
                // rename(2) replaces a file; 9P refuses, so remove the target and retry.
                let src_dir = fid.qid().is_dir();
                let target = self.walk("rename", &to).await?;
                if src_dir || target.qid().is_dir() {
                    return Err(self.fail("rename", &to, &e, libc::EIO));
                }
                target
                    .remove()
                    .await
                    .map_err(|e| self.fail("rename", &to, &e, libc::EIO))?;
                fid.wstat(&st)
                    .await
                    .map_err(|e| self.fail("rename", &from, &e, libc::EIO))?;
            }
            Err(e) => return Err(self.fail("rename", &from, &e, libc::EIO)),
        }
        locked(&self.nodes).renamed(&from, &to);
        Ok(())
    }

    /// Tcreate of `name` in `parent` (a file or, with DMDIR in `perm`, a directory): the new
    /// fid (open with `omode`), its node (one kernel reference) and its stat.
    async fn create_in(
        &self,
        op: &str,
        parent: u64,
        name: &OsStr,
        perm: u32,
        omode: u8,
    ) -> Result<(Fid, u64, Stat), Errno> {
        let path = self.child_path(parent, name)?;
        let mut fid = self.walk(op, &path[..path.len() - 1]).await?;
        let leaf = &path[path.len() - 1];
        fid.create(leaf, perm, omode)
            .await
            .map_err(|e| self.fail(op, &path, &e, libc::EIO))?;
        let st = fid
            .stat()
            .await
            .map_err(|e| self.fail(op, &path, &e, libc::EIO))?;
        let ino = locked(&self.nodes).remember(path);
        Ok((fid, ino, st))
    }

    async fn remove(&self, parent: u64, name: &OsStr, want_dir: bool) -> Result<(), Errno> {
        let path = self.child_path(parent, name)?;
        let fid = self.walk("remove", &path).await?;
        match (fid.qid().is_dir(), want_dir) {
            (true, false) => return Err(err(libc::EISDIR)),
            (false, true) => return Err(err(libc::ENOTDIR)),
            _ => {}
        }
        fid.remove()
            .await
            .map_err(|e| self.fail("remove", &path, &e, libc::EIO))
    }
}

// ---------------------------------------------------------------------------------------------
// The session: requests in, replies out.

/// What an operation answers.
enum Reply {
    /// Success with no data.
    Empty,
    Bytes(Vec<u8>),
    Data(Bytes),
    /// A read's payload, all of it in the pipes' data pipe.
    Piped(Pipes, usize),
}

/// Serves FUSE on `dev` until the file system is unmounted (`Ok`) or the device fails.
async fn session(bridge: Arc<Bridge>, dev: Arc<Device>) -> Result<(), String> {
    let max_io = bridge.max_io();
    // The largest request is a write of max_io bytes after its two headers.
    let mut buf = vec![0u8; max_io as usize + 64 * 1024];
    let mut started = false;
    loop {
        let n = match dev.next(&mut buf).await {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("reading /dev/fuse: {e}")),
        };
        let req = match Request::parse(&buf[..n]) {
            Ok(r) => r,
            Err(m) => {
                eprintln!("o mount: the kernel sent {m}; ignored");
                continue;
            }
        };
        match req.opcode {
            op::INIT => match fuse::init_out(&req.body, max_io) {
                Ok(out) => {
                    dev.reply(req.unique, &[&out]);
                    started = true;
                }
                Err(n) => dev.reply_err(req.unique, n),
            },
            _ if !started => dev.reply_err(req.unique, libc::EIO),
            // Bookkeeping with nothing to wait for is done here, in order.
            op::FORGET | op::BATCH_FORGET | op::INTERRUPT => bridge.note(&req),
            _ => {
                let (b, d) = (Arc::clone(&bridge), Arc::clone(&dev));
                tokio::spawn(async move { b.answer(&d, req).await });
            }
        }
    }
}

impl Bridge {
    /// The largest read or write one request carries: what one Tread or Twrite can, up to
    /// the 1 MiB FUSE moves at once (256 pages).
    fn max_io(&self) -> u32 {
        self.root.client().max_io().clamp(4096, 1 << 20)
    }

    /// FORGET, BATCH_FORGET and INTERRUPT.
    fn note(&self, req: &Request) {
        let mut a = req.args();
        match req.opcode {
            op::FORGET => {
                if let Some(n) = a.u64() {
                    locked(&self.nodes).forget(req.nodeid, n);
                }
            }
            op::BATCH_FORGET => {
                let Some(count) = a.u32() else { return };
                let _ = a.u32();
                let mut nodes = locked(&self.nodes);
                for _ in 0..count {
                    let (Some(ino), Some(n)) = (a.u64(), a.u64()) else {
                        break;
                    };
                    nodes.forget(ino, n);
                }
            }
            op::INTERRUPT => {
                if let Some(unique) = a.u64() {
                    self.interrupt(unique);
                }
            }
            _ => {}
        }
    }

    /// Runs one request and sends its reply.
    async fn answer(&self, dev: &Device, req: Request) {
        match self.dispatch(&req).await {
            Ok(Reply::Empty) => dev.reply(req.unique, &[]),
            Ok(Reply::Bytes(b)) => dev.reply(req.unique, &[&b]),
            Ok(Reply::Data(d)) => dev.reply(req.unique, &[&d]),
            Ok(Reply::Piped(pipes, len)) => {
                if dev.reply_spliced(req.unique, &pipes, len) {
                    self.put_pipes(pipes);
                }
            }
            Err(Errno(n)) => dev.reply_err(req.unique, n),
        }
    }

    async fn dispatch(&self, req: &Request) -> Result<Reply, Errno> {
        let mut a = req.args();
        let ino = req.nodeid;
        let bad = || err(libc::EINVAL);
        match req.opcode {
            op::LOOKUP => {
                let name = a.name().ok_or_else(bad)?;
                let path = self.child_path(ino, name)?;
                let st = self.stat_path("lookup", &path).await?;
                let node = locked(&self.nodes).remember(path);
                Ok(Reply::Bytes(self.entry(node, &st)))
            }
            op::GETATTR => {
                let (flags, _, fh) = (a.u32(), a.u32(), a.u64());
                let fh = fh.filter(|_| flags.is_some_and(|f| f & fuse::GETATTR_FH != 0));
                self.getattr(ino, fh).await
            }
            op::SETATTR => self.setattr(ino, &mut a).await.map(Reply::Bytes),
            op::MKDIR => {
                let (mode, _umask) = (a.u32().ok_or_else(bad)?, a.u32());
                let name = a.name().ok_or_else(bad)?;
                let (_, node, st) = self
                    .create_in("mkdir", ino, name, dm::DIR | (mode & 0o777), om::OREAD)
                    .await?;
                Ok(Reply::Bytes(self.entry(node, &st)))
            }
            op::UNLINK | op::RMDIR => {
                let name = a.name().ok_or_else(bad)?;
                self.remove(ino, name, req.opcode == op::RMDIR).await?;
                Ok(Reply::Empty)
            }
            op::RENAME | op::RENAME2 => {
                let new_parent = a.u64().ok_or_else(bad)?;
                let flags = if req.opcode == op::RENAME2 {
                    let f = a.u32().ok_or_else(bad)?;
                    a.skip(4).ok_or_else(bad)?;
                    f
                } else {
                    0
                };
                let (name, new_name) = (a.name().ok_or_else(bad)?, a.name().ok_or_else(bad)?);
                let replace = match flags {
                    0 => true,
                    RENAME_NOREPLACE => false,
                    // RENAME_EXCHANGE, RENAME_WHITEOUT: not something 9P can do.
                    _ => return Err(err(libc::EINVAL)),
                };
                self.rename_to(ino, name, new_parent, new_name, replace)
                    .await?;
                Ok(Reply::Empty)
            }
            op::OPEN | op::OPENDIR => {
                let flags = a.u32().ok_or_else(bad)?;
                let dir = req.opcode == op::OPENDIR;
                let path = self.path(ino)?;
                let (what, flags) = if dir {
                    ("opendir", libc::O_RDONLY as u32)
                } else {
                    ("open", flags)
                };
                let h = self.open_fid(what, &path, flags).await?;
                match (h.fid.qid().is_dir(), dir) {
                    (true, false) => return Err(err(libc::EISDIR)),
                    (false, true) => return Err(err(libc::ENOTDIR)),
                    _ => {}
                }
                let mut out = Vec::with_capacity(16);
                let open_flags = if dir { 0 } else { FOPEN_DIRECT_IO };
                fuse::open_out(&mut out, self.add_handle(h), open_flags);
                Ok(Reply::Bytes(out))
            }
            op::READ => {
                let (fh, offset, size) = (a.u64(), a.u64(), a.u32());
                let (Some(fh), Some(offset), Some(size)) = (fh, offset, size) else {
                    return Err(bad());
                };
                self.read(req.unique, ino, fh, offset, size).await
            }
            op::WRITE => {
                let (fh, offset, size) = (a.u64(), a.u64(), a.u32());
                let (Some(fh), Some(offset), Some(size)) = (fh, offset, size) else {
                    return Err(bad());
                };
                // write_flags, lock_owner, flags, padding.
                a.skip(4 + 8 + 4 + 4).ok_or_else(bad)?;
                let data = a.rest().get(..size as usize).ok_or_else(bad)?;
                let written = self.write(req.unique, ino, fh, offset, data).await?;
                Ok(Reply::Bytes(fuse::write_out(written)))
            }
            op::STATFS => Ok(Reply::Bytes(fuse::statfs_out())),
            op::RELEASE | op::RELEASEDIR => {
                // Dropping the last reference clunks the fid.
                let fh = a.u64().ok_or_else(bad)?;
                locked(&self.handles).remove(&fh);
                Ok(Reply::Empty)
            }
            // The server decides at open; nothing is cached here, so nothing to sync.
            op::FSYNC | op::FSYNCDIR | op::FLUSH | op::ACCESS | op::DESTROY => Ok(Reply::Empty),
            op::READDIR | op::READDIRPLUS => {
                let (fh, offset, size) = (a.u64(), a.u64(), a.u32());
                let (Some(fh), Some(offset), Some(size)) = (fh, offset, size) else {
                    return Err(bad());
                };
                let plus = req.opcode == op::READDIRPLUS;
                self.readdir(ino, fh, offset, size as usize, plus)
                    .await
                    .map(Reply::Bytes)
            }
            op::CREATE => {
                let (flags, mode) = (a.u32().ok_or_else(bad)?, a.u32().ok_or_else(bad)?);
                a.skip(8).ok_or_else(bad)?; // umask, open_flags
                let name = a.name().ok_or_else(bad)?;
                self.create(ino, name, flags, mode).await.map(Reply::Bytes)
            }
            _ => Err(err(libc::ENOSYS)),
        }
    }

    async fn getattr(&self, ino: u64, fh: Option<u64>) -> Result<Reply, Errno> {
        let path = self.path(ino)?;
        let target = self.target("getattr", &path, fh).await?;
        let st = target
            .fid()
            .stat()
            .await
            .map_err(|e| self.fail("getattr", &path, &e, libc::EIO))?;
        Ok(Reply::Bytes(fuse::attr_out(&self.attr(ino, &st), ATTR_TTL)))
    }

    async fn setattr(&self, ino: u64, a: &mut fuse::Args<'_>) -> Result<Vec<u8>, Errno> {
        let bad = || err(libc::EINVAL);
        let valid = a.u32().ok_or_else(bad)?;
        a.skip(4).ok_or_else(bad)?;
        let fh = a.u64().ok_or_else(bad)?;
        let size = a.u64().ok_or_else(bad)?;
        a.skip(8 + 8).ok_or_else(bad)?; // lock_owner, atime
        let mtime = a.u64().ok_or_else(bad)?;
        a.skip(8 + 3 * 4).ok_or_else(bad)?; // ctime, the three nanoseconds
        let mode = a.u32().ok_or_else(bad)?;
        a.skip(4).ok_or_else(bad)?;
        let (uid, gid) = (a.u32().ok_or_else(bad)?, a.u32().ok_or_else(bad)?);
        let fh = (valid & fattr::FH != 0).then_some(fh);

        let path = self.path(ino)?;
        let target = self.target("setattr", &path, fh).await?;
        let fid = target.fid();
        let cur = fid
            .stat()
            .await
            .map_err(|e| self.fail("setattr", &path, &e, libc::EIO))?;
        let now = self.attr(ino, &cur);
        if (valid & fattr::UID != 0 && uid != now.uid)
            || (valid & fattr::GID != 0 && gid != now.gid)
        {
            return Err(err(libc::EPERM));
        }
        let mut st = Stat::dont_touch();
        let mut change = false;
        if valid & fattr::SIZE != 0 {
            st.length = size;
            change = true;
        }
        if valid & fattr::MODE != 0 && mode & 0o777 != cur.mode & 0o777 {
            st.mode = (cur.mode & !0o777) | (mode & 0o777);
            change = true;
        }
        // With MTIME_NOW the kernel has put the current time in `mtime`.
        if valid & fattr::MTIME != 0 && mtime != u64::from(cur.mtime) {
            st.mtime = u32::try_from(mtime).unwrap_or(u32::MAX);
            change = true;
        }
        let st = if change {
            let changed = fid.wstat(&st).await;
            self.changed();
            changed.map_err(|e| self.fail("setattr", &path, &e, libc::EPERM))?;
            fid.stat()
                .await
                .map_err(|e| self.fail("setattr", &path, &e, libc::EIO))?
        } else {
            cur
        };
        Ok(fuse::attr_out(&self.attr(ino, &st), ATTR_TTL))
    }

    async fn read(
        &self,
        unique: u64,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Result<Reply, Errno> {
        let h = self.handle(fh)?;
        let at = if h.reply_file {
            locked(&h.cursor).read_at(offset)
        } else {
            offset
        };
        let ahead = locked(&h.ahead).take();
        let changes = self.changes.load(Ordering::Acquire);
        let (reply, len) = self
            .interruptible(unique, async {
                if let Some(a) = ahead
                    && a.offset == at
                    && a.changes == changes
                {
                    // An error is asked again below, which reports it.
                    let got = match a.data {
                        AheadData::Got(d) => Some(d),
                        AheadData::Sent(call) => call.read_data().await.ok(),
                        AheadData::Spliced(call, pipes) => match call.await {
                            Ok(s)
                                if s.rest.is_empty()
                                    && s.in_pipe > 0
                                    && s.in_pipe <= size as usize =>
                            {
                                // The common case: all of it waits in the pipe.
                                return Ok((Reply::Piped(pipes, s.in_pipe), s.in_pipe));
                            }
                            Ok(s) => self.unpipe(s, pipes),
                            Err(_) => None,
                        },
                    };
                    // An empty reply may be an end of file that has moved since: ask again.
                    if let Some(d) = got.filter(|d| !d.is_empty()) {
                        let n = d.len().min(size as usize);
                        if n < d.len() {
                            *locked(&h.ahead) = Some(Ahead {
                                offset: at + n as u64,
                                data: AheadData::Got(d.slice(n..)),
                                ..a
                            });
                        }
                        return Ok((Reply::Data(d.slice(..n)), n));
                    }
                }
                let d = h.fid.read(at, size).await.map_err(|e| {
                    let path = self.path(ino).unwrap_or_default();
                    self.fail("read", &path, &e, libc::EIO)
                })?;
                let n = d.len();
                Ok((Reply::Data(d), n))
            })
            .await?;
        let want = size.min(h.fid.iounit());
        if h.read_ahead && want > 0 && len == want as usize {
            self.read_ahead(&h, at + u64::from(want), want, changes);
        }
        Ok(reply)
    }

    /// Sends the Tread for the `want` bytes at `next`, for the read that will come (see "Read
    /// ahead" above), its payload spliced into pipes where they can be had.
    fn read_ahead(&self, h: &Handle, next: u64, want: u32, changes: u64) {
        let mut ahead = locked(&h.ahead);
        // Not while a rest is left, nor over a concurrent reader's read ahead.
        if ahead.is_some() {
            return;
        }
        let data = match self.take_pipes() {
            Some(pipes) => match h
                .fid
                .read_call_spliced(next, want, Arc::clone(&pipes.data_w))
            {
                Ok(call) => AheadData::Spliced(call, pipes),
                Err(_) => return,
            },
            None => match h.fid.read_call(next, want) {
                Ok(call) => AheadData::Sent(call),
                Err(_) => return,
            },
        };
        *ahead = Some(Ahead {
            offset: next,
            changes,
            data,
        });
    }

    /// A spliced reply in memory (when it did not all fit in the pipe, or the caller asked
    /// for less than it brought); the emptied pipes are kept.
    fn unpipe(&self, s: Spliced, pipes: Pipes) -> Option<Bytes> {
        let mut v = Vec::with_capacity(s.in_pipe + s.rest.len());
        pipes.drain_data(&mut v).ok()?;
        if v.len() != s.in_pipe {
            return None;
        }
        self.put_pipes(pipes);
        v.extend_from_slice(&s.rest);
        Some(Bytes::from(v))
    }

    async fn write(
        &self,
        unique: u64,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<u32, Errno> {
        let h = self.handle(fh)?;
        // Counted when the write ends, also when it is interrupted (it may have landed).
        let _changing = Changing(self);
        let fail = |op: &str, e: &ClientError, unmatched: i32| {
            let path = self.path(ino).unwrap_or_default();
            self.fail(op, &path, e, unmatched)
        };
        let written = self
            .interruptible(unique, async {
                let at = if h.append {
                    h.fid
                        .stat()
                        .await
                        .map_err(|e| fail("write", &e, libc::EIO))?
                        .length
                } else {
                    offset
                };
                h.fid
                    .write_all(at, data)
                    .await
                    .map_err(|e| fail("write", &e, libc::EINVAL))
            })
            .await?;
        if h.reply_file {
            locked(&h.cursor).wrote_to = Some(offset + written);
        }
        Ok(u32::try_from(written).unwrap_or(u32::MAX))
    }

    /// READDIR and READDIRPLUS: the entries from `offset` that fit in `size` bytes.
    async fn readdir(
        &self,
        parent: u64,
        fh: u64,
        offset: u64,
        size: usize,
        plus: bool,
    ) -> Result<Vec<u8>, Errno> {
        let h = self.handle(fh)?;
        let path = self.path(parent)?;
        let list = self.dir_entries(&h, offset, &path).await?;
        let mut out = Vec::with_capacity(size.min(64 * 1024));
        for (i, name, dir, ino) in self.listing(parent, &path, &list) {
            if i < offset {
                continue;
            }
            if out.len() + fuse::dirent_len(&name, plus) > size {
                break;
            }
            if !plus {
                fuse::put_dirent(&mut out, None, ino, i + 1, dir, &name);
                continue;
            }
            // ".", "..": the kernel takes no reference; an entry: it takes one, as a lookup
            // would (counted only once it is known to fit).
            let entry = match (i, list.get((i as usize).wrapping_sub(2))) {
                (2.., Some(st)) => {
                    let mut p = path.clone();
                    p.push(st.name.clone());
                    let node = locked(&self.nodes).remember(p);
                    Some(self.attr(node, st))
                }
                _ => None,
            };
            let ino = entry.map_or(ino, |a| a.ino);
            let plus_entry = entry.as_ref().map(|a| (a, ENTRY_TTL, ATTR_TTL));
            fuse::put_dirent(&mut out, Some(plus_entry), ino, i + 1, dir, &name);
        }
        Ok(out)
    }

    async fn create(
        &self,
        parent: u64,
        name: &OsStr,
        flags: u32,
        mode: u32,
    ) -> Result<Vec<u8>, Errno> {
        let omode = match flags as i32 & libc::O_ACCMODE {
            libc::O_RDWR => om::ORDWR,
            libc::O_RDONLY => om::OREAD,
            _ => om::OWRITE,
        };
        let created = self
            .create_in("create", parent, name, mode & 0o777, omode)
            .await;
        self.changed();
        let (fid, ino, st) = created?;
        let fh = self.add_handle(Handle {
            ahead: Mutex::new(None),
            read_ahead: omode != om::OWRITE,
            fid,
            append: flags as i32 & libc::O_APPEND != 0,
            reply_file: false,
            cursor: Mutex::new(Cursor::default()),
            entries: tokio::sync::Mutex::new(None),
        });
        let mut out = self.entry(ino, &st);
        fuse::open_out(&mut out, fh, FOPEN_DIRECT_IO);
        Ok(out)
    }

    fn interrupt(&self, unique: u64) {
        let mut ints = locked(&self.ints);
        match ints.waiting.remove(&unique) {
            Some(tx) => {
                let _ = tx.send(());
            }
            None => {
                if ints.early.len() >= EARLY_INTERRUPTS {
                    ints.early.pop_front();
                }
                ints.early.push_back(unique);
            }
        }
    }

    /// A directory listing: (index, name, is a directory, inode) for ".", ".." and each
    /// entry.
    fn listing(
        &self,
        parent: u64,
        path: &[String],
        list: &[Stat],
    ) -> Vec<(u64, OsString, bool, u64)> {
        let mut out = vec![
            (0, OsString::from("."), true, parent),
            (1, OsString::from(".."), true, parent),
        ];
        for (i, st) in list.iter().enumerate() {
            let mut p = path.to_vec();
            p.push(st.name.clone());
            out.push((
                i as u64 + 2,
                OsString::from(&st.name),
                st.qid.is_dir(),
                self.listed_ino(&p, st),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Vec<String> {
        s.split('/')
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect()
    }

    #[test]
    fn errnos_follow_the_servers_words() {
        let cases = [
            ("file does not exist: \"x\"", libc::ENOENT),
            ("permission denied", libc::EACCES),
            ("not permitted: x", libc::EPERM),
            ("file already exists", libc::EEXIST),
            ("is a directory", libc::EISDIR),
            ("not a directory", libc::ENOTDIR),
            ("directory not empty", libc::ENOTEMPTY),
            ("read-only file", libc::EROFS),
            ("interrupted", libc::EINTR),
            ("something odd", libc::EIO),
        ];
        for (msg, want) in cases {
            let e = ClientError::Server(msg.into());
            assert_eq!(errno_for(&e, libc::EIO), want, "{msg}");
        }
        // A refused write's complaint about its content: the caller's default.
        let e = ClientError::Server("unknown key \"colour\" (valid: name)".into());
        assert_eq!(errno_for(&e, libc::EINVAL), libc::EINVAL);
        assert_eq!(errno_for(&ClientError::Closed, libc::EINVAL), libc::EIO);
    }

    #[test]
    fn replies_start_where_the_write_left_off() {
        // exec 3<>ctl; printf 'help\n' >&3; cat <&3
        let mut c = Cursor {
            wrote_to: Some(5),
            ..Cursor::default()
        };
        assert_eq!(c.read_at(5), 0);
        assert_eq!(c.read_at(105), 100);
        // A second request on the same descriptor.
        c.wrote_to = Some(300);
        assert_eq!(c.read_at(300), 0);
        // Write, seek to 0, read: as asked.
        let mut c = Cursor {
            wrote_to: Some(5),
            ..Cursor::default()
        };
        assert_eq!(c.read_at(0), 0);
        assert_eq!(c.read_at(7), 7);
        // No write: offsets pass through.
        let mut c = Cursor::default();
        assert_eq!(c.read_at(42), 42);
    }

    #[test]
    fn nodes_follow_renames_and_forgets() {
        let mut n = Nodes::new();
        let a = n.remember(p("session/a"));
        let f = n.remember(p("session/a/agent/x/chat"));
        assert_eq!(n.remember(p("session/a")), a);
        n.renamed(&p("session/a"), &p("session/b"));
        assert_eq!(n.path(a).unwrap(), p("session/b"));
        assert_eq!(n.path(f).unwrap(), p("session/b/agent/x/chat"));
        assert!(!n.by_path.contains_key(&p("session/a")));
        n.forget(a, 1);
        assert_eq!(n.path(a).unwrap(), p("session/b"));
        n.forget(a, 1);
        assert!(n.path(a).is_err());
        n.forget(ROOT_INO, 10);
        assert_eq!(n.path(ROOT_INO).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn names_are_nine_p_names() {
        assert_eq!(nine_name(OsStr::new("chat")).unwrap(), "chat");
        for bad in ["", ".", "..", "a/b"] {
            assert!(nine_name(OsStr::new(bad)).is_err(), "{bad:?}");
        }
        use std::os::unix::ffi::OsStrExt;
        assert!(nine_name(OsStr::from_bytes(b"\xff")).is_err());
    }

    #[test]
    fn mountinfo_lines() {
        let info = "36 35 0:50 / /tmp/o\\040mount rw,nosuid,nodev - fuse.ollie ollie rw,user_id=0\n\
                    37 35 0:51 / /tmp/other rw - fuse.sshfs x rw\n";
        assert!(mountinfo_has(info, Path::new("/tmp/o mount")));
        assert!(!mountinfo_has(info, Path::new("/tmp/other")));
        assert!(!mountinfo_has(info, Path::new("/tmp/o")));
        // Not an escape (past a byte, or too short): kept as it is, never a panic.
        assert_eq!(unescape_mountinfo("a\\777b\\04"), "a\\777b\\04");
        assert_eq!(unescape_mountinfo("tab\\011end"), "tab\tend");
    }
}
