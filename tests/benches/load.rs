//! Load test for olliesrv (not a timed assertion; it prints figures):
//!
//! - starts the real `olliesrv` (which starts one real `toolsrv` per session),
//! - creates SESSIONS sessions with one agent each,
//! - parks READERS blocked reads (statewait, feed and chat at its end, spread over the
//!   agents, on a few connections),
//! - then prints olliesrv's RSS, the RSS of each toolsrv (min / median / max), and the
//!   latency of a `stats` read (open + read + clunk on a fresh fid) under that load, against
//!   the same read before the load.
//!
//! Build the binaries first (the bench looks for them next to itself, in `target/release`):
//!
//! ```text
//! cargo build --release --bins && cargo bench -p ollie-tests --bench load
//! ```
//!
//! `LOAD_SESSIONS` and `LOAD_READERS` override the defaults (200 and 1000).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ollie_p9::client::Call;
use ollie_p9::dial::Addr;
use ollie_p9::wire::om;
use ollie_p9::{Client, Fid};
use ollie_testkit::server::{children_named, percentile as pct, status_kib};

fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("OLLIE_BIN_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

async fn rdwr(root: &Fid, path: &str, data: &str) -> String {
    let mut f = root.walk_path(path).await.unwrap();
    f.open(om::ORDWR).await.unwrap();
    f.write(0, Bytes::from(data.to_owned())).await.unwrap();
    String::from_utf8(f.read_to_end().await.unwrap()).unwrap()
}

async fn read_all(root: &Fid, path: &str) -> String {
    let mut f = root.walk_path(path).await.unwrap();
    f.open(om::OREAD).await.unwrap();
    String::from_utf8(f.read_to_end().await.unwrap()).unwrap()
}

async fn stats_read(root: &Fid, path: &str) -> Duration {
    let t = Instant::now();
    let mut f = root.walk_path(path).await.unwrap();
    f.open(om::OREAD).await.unwrap();
    let b = f.read_to_end().await.unwrap();
    assert!(String::from_utf8_lossy(&b).contains("tokens_in="));
    f.clunk().await.unwrap();
    t.elapsed()
}

/// The number in variable `name`, else `default`.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Starts `olliesrv` from `dir` with its socket, state and configuration under `tmp`, and
/// waits until it accepts connections on the socket (returned).
fn start_olliesrv(dir: &Path, tmp: &Path) -> (Child, PathBuf) {
    let sock = tmp.join("ns").join("ollie");
    let srv = Command::new(dir.join("olliesrv"))
        .arg("-a")
        .arg(format!("unix!{}", sock.display()))
        .arg("--state-dir")
        .arg(tmp.join("state"))
        .env("XDG_CONFIG_HOME", tmp.join("cfg"))
        .env("OLLIE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "olliesrv did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    (srv, sock)
}

/// Creates sessions `s0`… with one agent `a` each, in `work`; how long that took.
async fn create_sessions(root: &Fid, sessions: usize, work: &Path) -> Duration {
    let t = Instant::now();
    for i in 0..sessions {
        rdwr(
            root,
            "session/new",
            &format!("name=s{i} cwd={}", work.display()),
        )
        .await;
        rdwr(root, &format!("session/s{i}/agent/new"), "name=a").await;
    }
    t.elapsed()
}

/// Waits until every session's toolsrv is up.
async fn wait_toolsrv_up(root: &Fid, sessions: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let idx = read_all(root, "session/idx").await;
        let up = idx.lines().filter(|l| l.contains("\tup\t")).count();
        if up >= sessions {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {up} of {sessions} toolsrv up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `n` timed reads of the agents' `stats`, going round the sessions.
async fn stats_reads(root: &Fid, n: usize, sessions: usize) -> Vec<Duration> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(stats_read(root, &format!("session/s{}/agent/a/stats", i % sessions)).await);
    }
    v
}

/// The connections of the blocked readers, and the readers: their fids and pending reads.
type Parked = (Vec<(Client, Fid)>, Vec<(Fid, Call)>);

/// `readers` blocked reads (statewait, feed, chat at its end) spread over the sessions'
/// agents, on 4 connections.
async fn park_readers(addr: &Addr, user: &str, readers: usize, sessions: usize) -> Parked {
    let mut conns = Vec::new();
    for _ in 0..4 {
        let c = Client::dial(addr).await.unwrap();
        let r = c.attach(None, user, "").await.unwrap();
        conns.push((c, r));
    }
    let mut parked = Vec::new();
    for i in 0..readers {
        let (_, r) = &conns[i % conns.len()];
        let s = i % sessions;
        let (file, off) = match i % 3 {
            0 => ("statewait", 0),
            1 => ("feed", 0),
            _ => ("chat", 1 << 40),
        };
        let mut f = r
            .walk_path(&format!("session/s{s}/agent/a/{file}"))
            .await
            .unwrap();
        f.open(om::OREAD).await.unwrap();
        let call = f.read_call(off, 4096).unwrap();
        parked.push((f, call));
    }
    (conns, parked)
}

/// What was measured, for the report.
struct Figures {
    sessions: usize,
    readers: usize,
    created: Duration,
    rss_empty: u64,
    rss_loaded: u64,
    /// Each toolsrv's VmRSS, sorted.
    tool_rss: Vec<u64>,
    /// `stats` reads before the load and under it.
    base: Vec<Duration>,
    loaded: Vec<Duration>,
}

fn report(mut m: Figures) {
    let (sessions, readers, rss_empty, rss_loaded) =
        (m.sessions, m.readers, m.rss_empty, m.rss_loaded);
    let (created, tool_rss) = (m.created, &m.tool_rss);
    println!("olliesrv load test: {sessions} sessions (one agent each), {readers} blocked readers");
    println!(
        "created {sessions} sessions + agents in {:.2} s ({:.1} ms each)",
        created.as_secs_f64(),
        created.as_secs_f64() * 1000.0 / sessions as f64
    );
    println!(
        "olliesrv RSS: {rss_empty} KiB empty, {rss_loaded} KiB with {sessions} sessions and {readers} blocked readers"
    );
    if tool_rss.is_empty() {
        println!("toolsrv RSS: no toolsrv children found");
    } else {
        println!(
            "toolsrv RSS ({} processes): min {} KiB, median {} KiB, max {} KiB",
            tool_rss.len(),
            tool_rss[0],
            tool_rss[tool_rss.len() / 2],
            tool_rss[tool_rss.len() - 1]
        );
    }
    let (b50, b99) = (pct(&mut m.base, 0.5), pct(&mut m.base, 0.99));
    let (l50, l99) = (pct(&mut m.loaded, 0.5), pct(&mut m.loaded, 0.99));
    println!(
        "stats read (walk+open+read+clunk): idle p50 {:.0} µs p99 {:.0} µs; under load p50 {:.0} µs p99 {:.0} µs ({:.2}x p50)",
        b50.as_secs_f64() * 1e6,
        b99.as_secs_f64() * 1e6,
        l50.as_secs_f64() * 1e6,
        l99.as_secs_f64() * 1e6,
        l50.as_secs_f64() / b50.as_secs_f64().max(1e-9)
    );
}

fn main() {
    let sessions = env_count("LOAD_SESSIONS", 200);
    let readers = env_count("LOAD_READERS", 1000);
    let dir = bin_dir();
    for b in ["olliesrv", "toolsrv"] {
        if !dir.join(b).is_file() {
            eprintln!(
                "load: {} not found; run `cargo build --release --bins` first (or set OLLIE_BIN_DIR)",
                dir.join(b).display()
            );
            std::process::exit(2);
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let (mut srv, sock) = start_olliesrv(&dir, tmp.path());
    let pid = srv.id();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let addr = Addr::Unix(sock.clone());
        let user = ollie_p9::dial::current_user();
        let c = Client::dial(&addr).await.unwrap();
        let root = c.attach(None, &user, "").await.unwrap();
        let rss_empty = status_kib(pid, "VmRSS").unwrap_or(0);
        let created = create_sessions(&root, sessions, &work).await;
        wait_toolsrv_up(&root, sessions).await;
        let base = stats_reads(&root, 100, sessions).await;
        let (conns, parked) = park_readers(&addr, &user, readers, sessions).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let loaded = stats_reads(&root, 200, sessions).await;
        let rss_loaded = status_kib(pid, "VmRSS").unwrap_or(0);
        let mut tool_rss: Vec<u64> = children_named(pid, "toolsrv")
            .into_iter()
            .filter_map(|p| status_kib(p, "VmRSS"))
            .collect();
        tool_rss.sort();
        report(Figures {
            sessions,
            readers,
            created,
            rss_empty,
            rss_loaded,
            tool_rss,
            base,
            loaded,
        });
        drop(parked);
        drop(conns);
    });
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = srv.wait();
}
