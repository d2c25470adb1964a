#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `cat` of a 64 MiB synthetic file through `o mount`, against `ollie-9p read` of the same file
//! and against the same bytes streamed over a bare unix socketpair (issue 10's benchmark).
//!
//! ```text
//! cargo build --release -p ollie-cli --bins && cargo bench -p ollie-cli --bench mount
//! ```
//!
//! What runs:
//! - This process serves a tree with `ollie_p9::Server` on a unix socket in a temporary
//!   directory (one `current_thread` runtime on its own thread): `/big`, 64 MiB of generated
//!   bytes with that stat length, and `/stream`, the same bytes with stat length 0 like our
//!   synthetic files of unknown length, so the bridge's read-until-EOF path is measured too.
//! - The release `o -a unix!SOCK mount DIR` mounts it (it returns once the mount serves and
//!   leaves the bridge running); a guard runs `o mount -u DIR` at the end, also when the bench
//!   fails, so no stale mount is left behind.
//! - The cases, one run each per round, their order rotating every round so that load from
//!   other processes hits them alike:
//!   1. raw: the 64 MiB written over a unix socketpair in iounit-sized writes (msize 1 MiB −
//!      24, what our client negotiates) by one thread and read by another into one reused
//!      buffer, discarding it like `cat > /dev/null` (the bulk baseline of `p9/benches/p9.rs`,
//!      here unpinned like the processes below, and without its 64 MiB destination, whose
//!      page faults would dominate); row 1' is the same with the writer's send buffer set as
//!      `ollie_p9::Server` sets it on a unix connection (its max msize, 1 MiB; the kernel
//!      makes it 2 MiB): the baseline's own cost of holding a whole Rread in the socket
//!      (docs/benchmarks.md);
//!   2. `ollie-9p -a unix!SOCK read big > /dev/null` (the release binary, spawned);
//!   3. `cat DIR/big > /dev/null` (the system's `cat`, spawned);
//!   4. `cat DIR/stream > /dev/null`.
//!
//!   Times run from spawn to exit, so 2–4 include a process start (about a millisecond).
//! - Round 0 is untimed: each spawned reader's output goes through a pipe into this process and
//!   must equal the 64 MiB exactly (a short or wrong read panics). In the timed rounds the
//!   output goes to /dev/null; the server counts the file bytes it sent in each run, and a run
//!   in which it sent fewer is flagged under the table (the kernel's page cache answered, or the
//!   reader stopped early).
//!
//! Every figure is the best of the timed rounds (load only ever makes a run slower). `cpu` is
//! the CPU time of every process involved: this one (the 9P server; both ends of the raw
//! stream; `getrusage(RUSAGE_SELF)`), the reader (`RUSAGE_CHILDREN`) and the `o mount` bridge
//! (found in /proc by its command line; its live threads' schedstat, so a thread of it that
//! ends during a run is not counted). Ratios are against the raw row. Timing never fails the run.
//!
//! Knobs: `OLLIE_BENCH_ROUNDS` (timed rounds, default 5), `OLLIE_BENCH_MIB` (file size, default
//! 64), `OLLIE_BIN_DIR` (where `o` and `ollie-9p` are; default: the `release` directory this
//! bench was built into). Without the binaries, or when FUSE is unusable (no /dev/fuse; not
//! root and no fusermount3), it prints `SKIP mount-bench: <reason>` and exits 0 (with
//! `OLLIE_TEST_REQUIRE=all`, 1).

use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use ollie_p9::util::{DirSnapshot, read_at};
use ollie_p9::wire::{dm, qt};
use ollie_p9::{ConnInfo, Filesystem, Qid, Server, Stat, Walked};

const MIB: usize = 1 << 20;
/// The payload of one Rread at the msize our client offers (1 MiB) minus the Rread header.
const IOUNIT: usize = MIB - 24;
/// A reader that takes longer than this is killed and the bench fails (never a timing limit:
/// 64 MiB at 1 MiB/s would still fit).
const CHILD_TIMEOUT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// The served tree: / with `big` (stat length = its size) and `stream` (same bytes, length 0).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Root,
    Big,
    Stream,
}

impl Node {
    fn qid(self) -> Qid {
        let (ty, path) = match self {
            Node::Root => (qt::DIR, 1),
            Node::Big => (qt::FILE, 2),
            Node::Stream => (qt::FILE, 3),
        };
        Qid {
            ty,
            version: 0,
            path,
        }
    }
}

#[derive(Debug)]
struct Tree {
    data: Bytes,
    /// The root's listing, encoded once (the tree never changes).
    dir: DirSnapshot,
    /// File bytes sent by Rread since the last reset.
    sent: AtomicU64,
}

impl Tree {
    fn new(data: Bytes) -> Tree {
        let mut t = Tree {
            data,
            dir: DirSnapshot::default(),
            sent: AtomicU64::new(0),
        };
        t.dir = DirSnapshot::new(&[t.stat_of(Node::Big), t.stat_of(Node::Stream)]);
        t
    }

    fn stat_of(&self, n: Node) -> Stat {
        let (name, mode, length) = match n {
            Node::Root => ("/", dm::DIR | 0o555, 0),
            Node::Big => ("big", 0o444, self.data.len() as u64),
            Node::Stream => ("stream", 0o444, 0),
        };
        Stat {
            qid: n.qid(),
            mode,
            length,
            name: name.into(),
            uid: "bench".into(),
            gid: "bench".into(),
            muid: "bench".into(),
            ..Stat::default()
        }
    }
}

impl Filesystem for Tree {
    type Fid = Node;

    async fn attach(
        &self,
        _conn: &ConnInfo,
        _auth: Option<&mut Node>,
        _uname: &str,
        _aname: &str,
    ) -> ollie_p9::Result<(Node, Qid)> {
        Ok((Node::Root, Node::Root.qid()))
    }

    async fn walk(&self, fid: &Node, names: &[String]) -> ollie_p9::Result<Walked<Node>> {
        let mut at = *fid;
        let mut qids = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            at = match (at, name.as_str()) {
                (Node::Root, "big") => Node::Big,
                (Node::Root, "stream") => Node::Stream,
                (Node::Root, "..") => Node::Root,
                _ if i == 0 => return Err(ollie_p9::Error::not_found()),
                _ => return Ok(Walked { qids, fid: None }),
            };
            qids.push(at.qid());
        }
        Ok(Walked {
            qids,
            fid: Some(at),
        })
    }

    async fn open(&self, fid: &mut Node, _mode: u8) -> ollie_p9::Result<(Qid, u32)> {
        Ok((fid.qid(), 0))
    }

    async fn read(&self, fid: &mut Node, offset: u64, count: u32) -> ollie_p9::Result<Bytes> {
        match fid {
            Node::Root => self.dir.read(offset, count),
            Node::Big | Node::Stream => {
                let b = read_at(&self.data, offset, count);
                self.sent.fetch_add(b.len() as u64, Ordering::Relaxed);
                Ok(b)
            }
        }
    }

    async fn write(&self, _fid: &mut Node, _offset: u64, _data: Bytes) -> ollie_p9::Result<u32> {
        Err(ollie_p9::Error::read_only())
    }

    async fn stat(&self, fid: &mut Node) -> ollie_p9::Result<Stat> {
        Ok(self.stat_of(*fid))
    }
}

/// The 9P server on a unix socket, on its own thread; stopped when dropped.
struct Served {
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Served {
    fn start(tree: &Arc<Tree>) -> Served {
        let dir = tempfile::Builder::new()
            .prefix("mount-bench")
            .tempdir()
            .unwrap();
        let sock = dir.path().join("bench.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        listener.set_nonblocking(true).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let tree = Arc::clone(tree);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::from_std(listener).unwrap();
                let shutdown = async {
                    let _ = stopped.await;
                };
                Server::new(tree)
                    .serve_unix(listener, shutdown, Duration::from_millis(200))
                    .await
                    .unwrap();
            });
        });
        Served {
            addr: format!("unix!{}", sock.display()),
            stop: Some(stop),
            thread: Some(thread),
            _dir: dir,
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The mount and its guard.

/// `o -a ADDR mount DIR` on a temporary directory; unmounted when dropped (also while a failed
/// bench unwinds).
struct Mount {
    o: PathBuf,
    addr: String,
    dir: tempfile::TempDir,
    /// The bridge's processes, for their CPU time (empty if not found).
    bridge: Vec<Pid>,
}

impl Mount {
    fn new(o: &Path, addr: &str) -> Mount {
        let dir = tempfile::Builder::new()
            .prefix("mount-bench-mnt")
            .tempdir()
            .unwrap();
        let out = run_bounded(
            Command::new(o)
                .arg("-a")
                .arg(addr)
                .arg("mount")
                .arg(dir.path()),
            "o mount",
        );
        // From here on the guard exists, so a failure below still unmounts.
        let mut m = Mount {
            o: o.to_path_buf(),
            addr: addr.to_owned(),
            dir,
            bridge: Vec::new(),
        };
        assert!(
            out.status.success(),
            "`o -a {addr} mount {}` failed ({}): {}",
            m.dir.path().display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        assert!(
            is_fuse_mount(m.dir.path()),
            "`o mount` exited 0 but {} is not a FUSE mount point",
            m.dir.path().display()
        );
        m.bridge = bridge_pids(m.dir.path());
        m
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let dir = self.dir.path().to_path_buf();
        if !is_fuse_mount(&dir) {
            return;
        }
        let out = run_bounded(
            Command::new(&self.o)
                .arg("-a")
                .arg(&self.addr)
                .arg("mount")
                .arg("-u")
                .arg(&dir),
            "o mount -u",
        );
        if !is_fuse_mount(&dir) {
            return;
        }
        eprintln!(
            "mount-bench: `o mount -u {}` left it mounted ({}: {}); detaching it",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        // A lazy unmount cannot hang on a stuck bridge.
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(&dir)
            .status();
        if is_fuse_mount(&dir) {
            let _ = Command::new("umount").arg("-l").arg(&dir).status();
        }
        if is_fuse_mount(&dir) {
            eprintln!("mount-bench: could not unmount {}", dir.display());
        }
    }
}

/// Whether `dir` is a FUSE mount point in this process's mount namespace.
fn is_fuse_mount(dir: &Path) -> bool {
    let Ok(canon) = dir.canonicalize() else {
        return false;
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines().any(|l| {
        let mount_point = l.split(' ').nth(4);
        let fstype = l.split(" - ").nth(1).and_then(|r| r.split(' ').next());
        mount_point.is_some_and(|m| Path::new(m) == canon)
            && fstype.is_some_and(|t| t.starts_with("fuse"))
    })
}

/// The processes whose command line has `mount` and `dir` in it: the bridge `o mount` left
/// running.
fn bridge_pids(dir: &Path) -> Vec<Pid> {
    let canon = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let me = std::process::id();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
            args.contains(&&b"mount"[..])
                && args
                    .iter()
                    .any(|a| *a == dir.as_os_str().as_bytes() || *a == canon.as_os_str().as_bytes())
        })
        .map(|pid| Pid::from_raw(pid as i32))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// CPU accounting.

/// CPU time of the live threads of another process, ns (`/proc/PID/task/*/schedstat`).
fn cpu_ns(pid: Pid) -> u64 {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// CPU time of this process (threads that have ended included) or of its reaped children, ns.
fn rusage_ns(who: UsageWho) -> u64 {
    let Ok(u) = getrusage(who) else {
        return 0;
    };
    let ns =
        |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000_000 + t.tv_usec() as u64 * 1000;
    ns(u.user_time()) + ns(u.system_time())
}

/// CPU time so far of this process, its reaped children and `others`, ns.
fn total_cpu_ns(others: &[Pid]) -> u64 {
    rusage_ns(UsageWho::RUSAGE_SELF)
        + rusage_ns(UsageWho::RUSAGE_CHILDREN)
        + others.iter().map(|&p| cpu_ns(p)).sum::<u64>()
}

// ---------------------------------------------------------------------------------------------
// The cases.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Raw,
    RawWide,
    NineP,
    MountBig,
    MountStream,
}

const CASES: [Case; 5] = [
    Case::Raw,
    Case::RawWide,
    Case::NineP,
    Case::MountBig,
    Case::MountStream,
];

impl Case {
    fn label(self) -> String {
        match self {
            Case::Raw => format!("1. raw unix socketpair, {IOUNIT} B writes"),
            Case::RawWide => "1'. as 1, the 9P server's send buffer".into(),
            Case::NineP => "2. ollie-9p read big > /dev/null".into(),
            Case::MountBig => "3. o mount: cat big > /dev/null".into(),
            Case::MountStream => "4. o mount: cat stream > /dev/null (length 0)".into(),
        }
    }
}

/// One run: wall time, CPU time of everything involved, file bytes the server sent.
#[derive(Debug, Clone, Copy)]
struct Run {
    wall: Duration,
    cpu: Duration,
    sent: u64,
}

/// What a case needs to run.
struct Env<'a> {
    tree: &'a Tree,
    ollie_9p: &'a Path,
    addr: &'a str,
    mount: &'a Mount,
}

/// Runs `case` once. With `verify`, the reader's output is piped here and must be the file's
/// bytes exactly (untimed figures); otherwise it goes to /dev/null.
fn run_case(env: &Env, case: Case, verify: bool) -> Run {
    let mut cmd = match case {
        Case::Raw => return raw_stream(&env.tree.data, env.mount, None),
        Case::RawWide => return raw_stream(&env.tree.data, env.mount, Some(MIB)),
        Case::NineP => {
            let mut c = Command::new(env.ollie_9p);
            c.arg("-a").arg(env.addr).arg("read").arg("big");
            c
        }
        Case::MountBig | Case::MountStream => {
            let name = if case == Case::MountBig {
                "big"
            } else {
                "stream"
            };
            let mut c = Command::new("cat");
            c.arg(env.mount.path().join(name));
            c
        }
    };
    cmd.stdin(Stdio::null()).stderr(Stdio::inherit());
    cmd.stdout(if verify {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    env.tree.sent.store(0, Ordering::Relaxed);
    let c0 = total_cpu_ns(&env.mount.bridge);
    let t = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let dog = Watchdog::arm(child.id(), format!("{cmd:?}"));
    let mut got = Vec::new();
    if let Some(mut out) = child.stdout.take() {
        got.reserve(env.tree.data.len());
        out.read_to_end(&mut got).unwrap();
    }
    let status = child.wait().unwrap();
    let wall = t.elapsed();
    dog.disarm();
    let cpu = Duration::from_nanos(total_cpu_ns(&env.mount.bridge).saturating_sub(c0));
    let sent = env.tree.sent.load(Ordering::Relaxed);
    assert!(status.success(), "{cmd:?} failed: {status}");
    if verify {
        let want = &env.tree.data[..];
        assert!(
            got.len() == want.len(),
            "SHORT READ: {cmd:?} delivered {} bytes, the file has {}",
            got.len(),
            want.len()
        );
        if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
            panic!("{cmd:?} delivered wrong bytes from offset {at}");
        }
    }
    Run { wall, cpu, sent }
}

/// The baseline: the file's bytes written in iounit-sized writes over a socketpair by one
/// thread, read by this one into one reused iounit-sized buffer (a reader that discards, as
/// `cat > /dev/null` does; a fresh 64 MiB destination would mostly measure its page faults).
/// `send_buffer`: the writer's `SO_SNDBUF` request, if not the default.
fn raw_stream(data: &Bytes, mount: &Mount, send_buffer: Option<usize>) -> Run {
    let (mut rd, mut wr) = UnixStream::pair().unwrap();
    if let Some(n) = send_buffer {
        nix::sys::socket::setsockopt(&wr, nix::sys::socket::sockopt::SndBuf, &n).unwrap();
    }
    let src = data.clone();
    let c0 = total_cpu_ns(&mount.bridge);
    let t = Instant::now();
    let writer = std::thread::spawn(move || {
        for piece in src.chunks(IOUNIT) {
            wr.write_all(piece).unwrap();
        }
    });
    let mut buf = vec![0u8; IOUNIT];
    let mut got = 0;
    loop {
        let k = rd.read(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        got += k;
        std::hint::black_box(&buf);
    }
    writer.join().unwrap();
    let wall = t.elapsed();
    let cpu = Duration::from_nanos(total_cpu_ns(&mount.bridge).saturating_sub(c0));
    assert!(
        got == data.len(),
        "SHORT READ: the raw stream delivered {got} of {} bytes",
        data.len()
    );
    Run {
        wall,
        cpu,
        sent: got as u64,
    }
}

/// Kills a child that outlives [`CHILD_TIMEOUT`], so a hung bridge fails the bench instead of
/// hanging it (the mount guard then unmounts).
struct Watchdog {
    done: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Watchdog {
    fn arm(pid: u32, what: String) -> Watchdog {
        let (done, rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            if rx.recv_timeout(CHILD_TIMEOUT) == Err(mpsc::RecvTimeoutError::Timeout) {
                eprintln!("mount-bench: {what} still running after {CHILD_TIMEOUT:?}; killing it");
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        });
        Watchdog { done, thread }
    }

    fn disarm(self) {
        let _ = self.done.send(());
        let _ = self.thread.join();
    }
}

/// Runs a short command with [`CHILD_TIMEOUT`], capturing its output.
fn run_bounded(cmd: &mut Command, what: &str) -> std::process::Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let dog = Watchdog::arm(child.id(), what.to_owned());
    let out = child.wait_with_output().unwrap();
    dog.disarm();
    out
}

// ---------------------------------------------------------------------------------------------
// Set-up checks and the table.

fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("OLLIE_BIN_DIR")
        && !d.is_empty()
    {
        return PathBuf::from(d);
    }
    // target/release/deps/mount-HASH → target/release
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Prints `SKIP mount-bench: <reason>` and exits 0, or fails under `OLLIE_TEST_REQUIRE=all`.
fn skip(reason: &str) -> ! {
    ollie_testkit::skip_bench("mount-bench", reason)
}

/// Why FUSE cannot be mounted here, if it cannot.
fn fuse_unusable() -> Option<&'static str> {
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse");
    }
    let root = nix::unistd::geteuid().is_root();
    let fusermount = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").exists()))
        .unwrap_or(false);
    if !root && !fusermount {
        return Some("not root and no fusermount3 (apt install fuse3)");
    }
    None
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; arguments are ignored.
    let t0 = Instant::now();
    let bins = bin_dir();
    let (o, ollie_9p) = (bins.join("o"), bins.join("ollie-9p"));
    if let Some(missing) = [&o, &ollie_9p].into_iter().find(|p| !p.is_file()) {
        println!(
            "mount-bench: {} not found; build the binaries first: cargo build --release -p \
             ollie-cli --bins (or set OLLIE_BIN_DIR)",
            missing.display()
        );
        skip(&format!("{} not built", missing.display()));
    }
    if let Some(reason) = fuse_unusable() {
        skip(reason);
    }
    let rounds = env_usize("OLLIE_BENCH_ROUNDS", 5);
    let size = env_usize("OLLIE_BENCH_MIB", 64) * MIB;

    // A pattern that repeats at no power of two (a page of it differs from the next).
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4093) as u8).collect();
    let tree = Arc::new(Tree::new(Bytes::from(data)));
    // Declared in this order so that the mount is dropped (unmounted) before the server stops.
    let served = Served::start(&tree);
    let mount = Mount::new(&o, &served.addr);
    let env = Env {
        tree: &tree,
        ollie_9p: &ollie_9p,
        addr: &served.addr,
        mount: &mount,
    };

    // Round 0 verifies the bytes (untimed); rounds 1..=rounds are timed. The order rotates.
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); CASES.len()];
    for round in 0..=rounds {
        for k in 0..CASES.len() {
            let i = (k + round) % CASES.len();
            let r = run_case(&env, CASES[i], round == 0);
            if round > 0 {
                runs[i].push(r);
            }
        }
    }

    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "mount-bench: cat of a {} MiB file; {cpus} CPUs; best of {rounds} rounds, cases \
         alternating; bytes checked through a pipe in an untimed round first\n\
         cpu = CPU time of every process involved (9P server, reader, o mount bridge{}); \
         ratios vs row 1",
        size / MIB,
        if mount.bridge.is_empty() {
            ": NOT FOUND, not counted"
        } else {
            ""
        }
    );
    let mib = size as f64 / MIB as f64;
    let best = |i: usize| {
        let wall = runs[i].iter().map(|r| r.wall).min().unwrap();
        let cpu = runs[i].iter().map(|r| r.cpu).min().unwrap();
        (mib / wall.as_secs_f64(), wall, cpu)
    };
    let (raw_tput, _, raw_cpu) = best(0);
    let mut table = vec![[
        "case".to_owned(),
        "MiB/s".into(),
        "wall".into(),
        "cpu".into(),
        "cpu/MiB".into(),
        "cpu vs raw".into(),
        "MiB/s vs raw".into(),
    ]];
    for (i, case) in CASES.iter().enumerate() {
        let (tput, wall, cpu) = best(i);
        table.push([
            case.label(),
            format!("{tput:.0} MiB/s"),
            format!("{:.1} ms", wall.as_secs_f64() * 1e3),
            format!("{:.1} ms", cpu.as_secs_f64() * 1e3),
            format!("{:.0} us", cpu.as_secs_f64() * 1e6 / mib),
            format!("{:.2}x", cpu.as_secs_f64() / raw_cpu.as_secs_f64()),
            format!("{:.2}x raw", tput / raw_tput),
        ]);
    }
    let width = |c: usize| table.iter().map(|r| r[c].len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..table[0].len()).map(width).collect();
    for row in &table {
        let mut line = format!("{:<w$}", row[0], w = widths[0]);
        for (cell, w) in row.iter().zip(&widths).skip(1) {
            line.push_str(&format!("  {cell:>w$}"));
        }
        println!("{line}");
    }
    for (i, case) in CASES.iter().enumerate() {
        let short: Vec<u64> = runs[i]
            .iter()
            .map(|r| r.sent)
            .filter(|&s| s < size as u64)
            .collect();
        if !short.is_empty() {
            println!(
                "note: {}: the server sent fewer than {size} bytes in {} of {rounds} timed runs \
                 (least {}): the page cache answered, or the reader stopped early",
                case.label(),
                short.len(),
                short.iter().min().unwrap()
            );
        }
    }
    println!("(total bench time {:.1} s)", t0.elapsed().as_secs_f64());
    drop(mount);
    drop(served);
}
