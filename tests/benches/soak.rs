//! Soak (not a timed assertion; it prints figures): the real olliesrv with SOAK_SESSIONS
//! sessions (default 50, each with its real toolsrv) and SOAK_AGENTS agents (100) running
//! turns without a pause, each turn one sandboxed tool call (the model is
//! `ollie_testkit::model`), while SOAK_READERS blocked readers (200) sit on statewait, feed and
//! chat, other readers come and go (open, block, flushed, clunked), and a sampler reads an
//! agent's `stats` every 100 ms. It runs SOAK_SECONDS (default 600): a warm-up (a tenth of the
//! run, at most 60 s, and then on until there have been as many compactions as agents, so
//! that the histories have reached their working size, but at most a quarter of the run),
//! then the rest in SOAK_SAMPLES equal parts (default 1); after each,
//! every task finishes its turn and a second passes before RSS and open descriptors are
//! sampled, so nothing is in flight. It prints olliesrv's and every toolsrv's RSS and
//! descriptor counts, their growth over the run (a leak: goal ≤ 5 % RSS, no descriptor),
//! the RSS after each part (a plateau or a climb), the bytes of the agents' chats on disk,
//! and the p50/p99 of the `stats` reads. The backend's `context_limit` is SOAK_CONTEXT
//! tokens (default 4000; the model reports about four bytes a token), so histories are
//! compacted as with a real model; SOAK_CONTEXT=0 leaves the limit unset (128k tokens
//! assumed) and every request then grows with its history for the whole run.
//!
//! ```text
//! cargo build --release --bins && cargo bench -p ollie-tests --bench soak
//! SOAK_SECONDS=60 cargo bench -p ollie-tests --bench soak --profile dev   # CI's smoke, debug binaries
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ollie_p9::Fid;
use ollie_p9::dial::Addr;
use ollie_p9::wire::om;
use ollie_testkit::client::{dial_attach, rdwr_text, read_text, write_text};
use ollie_testkit::model::Model;
use ollie_testkit::server::{
    bin_dir, children_named, fd_count, olliesrv_command, percentile as pct, status_kib, vm_rss_kib,
};

fn env_count(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// RSS (KiB) and open descriptors of olliesrv and of each toolsrv child.
#[derive(Debug, Clone, Default)]
struct Sample {
    srv_rss: u64,
    /// olliesrv's anonymous memory (heap, arenas, stacks), KiB, and its threads.
    srv_anon: u64,
    srv_threads: u64,
    srv_fds: u64,
    tool_rss: Vec<u64>,
    tool_fds: Vec<u64>,
    /// The agents' chats, bytes (filled in by [`quiet_sample`]).
    chat_bytes: u64,
}

fn sample(pid: u32) -> Sample {
    let tools = children_named(pid, "toolsrv");
    Sample {
        srv_rss: vm_rss_kib(pid).unwrap_or(0),
        srv_anon: status_kib(pid, "RssAnon").unwrap_or(0),
        srv_threads: status_kib(pid, "Threads").unwrap_or(0),
        srv_fds: fd_count(pid).unwrap_or(0),
        tool_rss: tools.iter().filter_map(|p| vm_rss_kib(*p)).collect(),
        tool_fds: tools.iter().filter_map(|p| fd_count(*p)).collect(),
        chat_bytes: 0,
    }
}

fn growth(a: u64, b: u64) -> String {
    format!(
        "{a} → {b} ({:+.1} %)",
        (b as f64 - a as f64) * 100.0 / (a as f64).max(1.0)
    )
}

/// One agent's turns, back to back, until `stop`: a prompt, then its `statewait` until the
/// agent is idle again. Counts the turns that ended.
async fn turns(root: Fid, path: String, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut sw = root.walk_path(&format!("{path}/statewait")).await.unwrap();
        sw.open(om::OREAD).await.unwrap();
        write_text(&root, &format!("{path}/prompt"), &format!("turn {n}"))
            .await
            .unwrap();
        n += 1;
        // States until idle (or error); the first read reports the change to running.
        loop {
            let s = String::from_utf8_lossy(&sw.read(0, 256).await.unwrap()).into_owned();
            if s.starts_with("idle") || s.starts_with("error") {
                break;
            }
        }
        done.fetch_add(1, Ordering::Relaxed);
        let _ = sw.clunk().await;
    }
}

/// Readers that come and go: a blocking read of an agent's statewait, dropped (flushed)
/// after a moment, the fid clunked.
async fn comers(root: Fid, agents: Vec<String>, stop: Arc<AtomicBool>, count: Arc<AtomicU64>) {
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let path = &agents[i % agents.len()];
        i += 1;
        let mut f = root.walk_path(&format!("{path}/statewait")).await.unwrap();
        f.open(om::OREAD).await.unwrap();
        let call = f.read_call(0, 256).unwrap();
        tokio::time::sleep(Duration::from_millis(20 + (i % 7) as u64 * 10)).await;
        drop(call);
        let _ = f.clunk().await;
        count.fetch_add(1, Ordering::Relaxed);
    }
}

fn main() {
    let secs = env_count("SOAK_SECONDS", 600);
    let sessions = env_count("SOAK_SESSIONS", 50).max(1);
    let agents = env_count("SOAK_AGENTS", 100).max(sessions);
    let readers = env_count("SOAK_READERS", 200);
    let dir = bin_dir();
    for b in ["olliesrv", "toolsrv"] {
        if !dir.join(b).is_file() {
            eprintln!(
                "soak: {} not found; run `cargo build --release --bins` first (or set OLLIE_BIN_DIR)",
                dir.join(b).display()
            );
            std::process::exit(2);
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(soak(tmp.path(), &work, secs, sessions, agents, readers));
}

/// The stand-in as the default backend, its `context_limit` SOAK_CONTEXT tokens (none: 0).
fn config_for(model: &Model) -> String {
    let mut config = model.config();
    match env_count("SOAK_CONTEXT", 4000) {
        0 => {}
        n => config.push_str(&format!("context_limit = {n}\n")),
    }
    config
}

async fn soak(tmp: &Path, work: &Path, secs: u64, sessions: u64, agents: u64, readers: u64) {
    let out = work.to_path_buf();
    let model = Model::start(Box::new(move |token| {
        format!("echo {token} > {}/last-$RANDOM", out.display())
    }))
    .await;
    let cfg = tmp.join("config.toml");
    std::fs::write(&cfg, config_for(&model)).unwrap();
    let sock = tmp.join("ns").join("ollie");
    let mut srv = olliesrv_command(&sock, &tmp.join("state"))
        .arg("--config")
        .arg(&cfg)
        .env("XDG_CONFIG_HOME", tmp.join("xdg"))
        .env("OLLIE_LOG", "warn")
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "olliesrv did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = srv.id();
    let addr = Addr::Unix(sock.clone());
    let user = ollie_p9::dial::current_user();
    let (_c, root) = dial_attach(&addr, &user).await;
    let first = sample(pid);

    let paths = populate(&root, work, sessions, agents).await;

    // The blocked readers, on four connections of their own.
    let mut parked = Vec::new();
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(dial_attach(&addr, &user).await);
    }
    for i in 0..readers as usize {
        let r = &conns[i % conns.len()].1;
        let (file, off) = [("statewait", 0), ("feed", 0), ("chat", 1u64 << 40)][i % 3];
        let mut f = r
            .walk_path(&format!("{}/{file}", paths[i % paths.len()]))
            .await
            .unwrap();
        f.open(om::OREAD).await.unwrap();
        let call = f.read_call(off, 4096).unwrap();
        parked.push((f, call));
    }

    // The workload in two phases, warm-up and the run, each ended by letting every task
    // finish its turn, so that both samples are taken with nothing in flight.
    let mut workers = Vec::new();
    for _ in 0..4 {
        workers.push(dial_attach(&addr, &user).await);
    }
    let roots: Vec<Fid> = {
        let mut v = Vec::new();
        for i in 0..paths.len() + 2 {
            v.push(workers[i % workers.len()].1.clone_fid().await.unwrap());
        }
        v
    };
    let total = Duration::from_secs(secs);
    let (least, most) = ((total / 10).min(Duration::from_secs(60)), total / 4);
    // With a context limit, the warm-up waits for about one compaction per agent.
    let wanted = if env_count("SOAK_CONTEXT", 4000) > 0 {
        agents
    } else {
        0
    };
    let warm_until = |t: Duration| t < least || (t < most && model.summaries() < wanted);
    let state = tmp.join("state");
    let mut lat = Vec::new();
    let started = Instant::now();
    let w = phase(&root, &roots, &paths, &warm_until, &mut lat).await;
    let warm = started.elapsed();
    let warm_compactions = model.summaries();
    let warm_s = quiet_sample(pid, &state).await;
    let parts = env_count("SOAK_SAMPLES", 1).clamp(1, 100) as u32;
    let len = total.saturating_sub(warm) / parts;
    let (r, along) = parts_of(&root, &roots, &paths, (len, parts), (pid, &state), &mut lat).await;
    let end = along.last().cloned().unwrap_or_default();
    drop(parked);
    report(&Report {
        secs,
        sessions,
        agents,
        readers,
        first,
        warm: warm_s,
        end,
        along,
        turns: r.turns,
        all_turns: w.turns + r.turns,
        came: w.came + r.came,
        tool_calls: model.issued(),
        compactions: model.summaries(),
        warm_compactions,
        lat,
        warm_len: warm,
        measured: len * parts,
    });
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = tokio::task::spawn_blocking(move || srv.wait()).await;
}

/// Makes `sessions` sessions and `agents` agents spread evenly over them, and waits until
/// every session's toolsrv is up; returns the agents' paths.
async fn populate(root: &Fid, work: &Path, sessions: u64, agents: u64) -> Vec<String> {
    let mut paths = Vec::new();
    for s in 0..sessions {
        rdwr_text(
            root,
            "session/new",
            &format!("name=s{s} cwd={}", work.display()),
        )
        .await
        .unwrap();
    }
    for a in 0..agents {
        let s = a % sessions;
        rdwr_text(
            root,
            &format!("session/s{s}/agent/new"),
            &format!("name=a{a}"),
        )
        .await
        .unwrap();
        paths.push(format!("session/s{s}/agent/a{a}"));
    }
    let up_by = Instant::now() + Duration::from_secs(300);
    loop {
        let idx = read_text(root, "session/idx").await.unwrap();
        if idx.lines().filter(|l| l.contains("\tup\t")).count() as u64 >= sessions {
            break;
        }
        assert!(Instant::now() < up_by, "not every toolsrv came up:\n{idx}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    paths
}

/// The measured run: `n` phases of `len`, each followed by a quiet sample of `pid`.
async fn parts_of(
    root: &Fid,
    roots: &[Fid],
    paths: &[String],
    (len, n): (Duration, u32),
    (pid, state): (u32, &Path),
    lat: &mut Vec<Duration>,
) -> (Phase, Vec<Sample>) {
    let mut r = Phase { turns: 0, came: 0 };
    let mut along = Vec::new();
    for _ in 0..n {
        let p = phase(root, roots, paths, &|t| t < len, lat).await;
        r.turns += p.turns;
        r.came += p.came;
        along.push(quiet_sample(pid, state).await);
    }
    (r, along)
}

/// What a phase did.
struct Phase {
    turns: u64,
    came: u64,
}

/// Runs every agent's turns and two comers while `go(time since the start)` holds (then
/// lets each finish its turn), reading a `stats` every 100 ms into `lat`.
async fn phase(
    root: &Fid,
    roots: &[Fid],
    paths: &[String],
    go: &dyn Fn(Duration) -> bool,
    lat: &mut Vec<Duration>,
) -> Phase {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let came = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let r = roots[i].clone_fid().await.unwrap();
        tasks.push(tokio::spawn(turns(
            r,
            p.clone(),
            Arc::clone(&stop),
            Arc::clone(&done),
        )));
    }
    for k in 0..2 {
        let r = roots[paths.len() + k].clone_fid().await.unwrap();
        tasks.push(tokio::spawn(comers(
            r,
            paths.to_vec(),
            Arc::clone(&stop),
            Arc::clone(&came),
        )));
    }
    let started = Instant::now();
    let mut i = 0usize;
    while go(started.elapsed()) {
        let t = Instant::now();
        let st = read_text(root, &format!("{}/stats", paths[i % paths.len()]))
            .await
            .unwrap();
        assert!(st.contains("turns="), "{st}");
        lat.push(t.elapsed());
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(120), t).await;
    }
    Phase {
        turns: done.load(Ordering::Relaxed),
        came: came.load(Ordering::Relaxed),
    }
}

/// A sample once things have settled (a second after the workload stopped), with the bytes
/// the agents' chats hold (`chat.raw` on disk; olliesrv keeps only the end of each in memory).
async fn quiet_sample(pid: u32, state: &Path) -> Sample {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut s = sample(pid);
    s.chat_bytes = chat_bytes(&state.join("sessions"));
    s
}

fn chat_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                chat_bytes(&p)
            } else if p.file_name().is_some_and(|n| n == "chat.raw") {
                e.metadata().map_or(0, |m| m.len())
            } else {
                0
            }
        })
        .sum()
}

struct Report {
    secs: u64,
    sessions: u64,
    agents: u64,
    readers: u64,
    first: Sample,
    warm: Sample,
    end: Sample,
    /// After each part of the run (the last is `end`).
    along: Vec<Sample>,
    turns: u64,
    all_turns: u64,
    came: u64,
    tool_calls: u64,
    compactions: u64,
    warm_compactions: u64,
    lat: Vec<Duration>,
    warm_len: Duration,
    measured: Duration,
}

fn report(r: &Report) {
    let sum = |v: &[u64]| v.iter().sum::<u64>();
    let max = |v: &[u64]| v.iter().copied().max().unwrap_or(0);
    println!(
        "soak: {} s, {} sessions, {} agents, {} blocked readers; {} turns ({} after warm-up, {:.1}/s), {} tool calls, {} compactions, {} readers came and went",
        r.secs,
        r.sessions,
        r.agents,
        r.readers,
        r.all_turns,
        r.turns,
        r.turns as f64 / r.measured.as_secs_f64().max(1e-9),
        r.tool_calls,
        r.compactions,
        r.came
    );
    println!(
        "warm-up: {:.0} s, {} compactions",
        r.warm_len.as_secs_f64(),
        r.warm_compactions
    );
    println!(
        "olliesrv RSS KiB: start {}, after warm-up → end {}; anonymous {}; threads {} → {}",
        r.first.srv_rss,
        growth(r.warm.srv_rss, r.end.srv_rss),
        growth(r.warm.srv_anon, r.end.srv_anon),
        r.warm.srv_threads,
        r.end.srv_threads
    );
    println!(
        "agents' chats on disk (olliesrv keeps only their ends in memory), KiB: {}",
        growth(r.warm.chat_bytes >> 10, r.end.chat_bytes >> 10)
    );
    println!(
        "olliesrv fds: start {}, after warm-up → end {}",
        r.first.srv_fds,
        growth(r.warm.srv_fds, r.end.srv_fds)
    );
    println!(
        "toolsrv ({} → {} processes) RSS KiB, sum: {}; max {} → {}",
        r.warm.tool_rss.len(),
        r.end.tool_rss.len(),
        growth(sum(&r.warm.tool_rss), sum(&r.end.tool_rss)),
        max(&r.warm.tool_rss),
        max(&r.end.tool_rss)
    );
    if r.along.len() > 1 {
        let line = |f: &dyn Fn(&Sample) -> u64| {
            std::iter::once(&r.warm)
                .chain(&r.along)
                .map(|s| f(s).to_string())
                .collect::<Vec<_>>()
                .join(" → ")
        };
        println!(
            "RSS KiB after the warm-up and each of {} parts: olliesrv {}; toolsrv sum {}",
            r.along.len(),
            line(&|s| s.srv_rss),
            line(&|s| sum(&s.tool_rss))
        );
    }
    println!(
        "toolsrv fds, sum: {}",
        growth(sum(&r.warm.tool_fds), sum(&r.end.tool_fds))
    );
    let mut lat = r.lat.clone();
    let n = lat.len();
    let (p50, p99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
    println!(
        "stats read under the soak ({n} reads): p50 {:.0} µs, p99 {:.0} µs",
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
}
