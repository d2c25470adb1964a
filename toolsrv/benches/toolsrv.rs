//! toolsrv benchmark: what a tool call costs through a real toolsrv, against the sandbox alone.
//!
//! - A `proc/new` round trip (one Twrite of `tool=execute_code\ncmd=true`, one Tread of the
//!   result) through the real `toolsrv` binary over its socketpair, authenticated as an agent,
//!   under the shipped workspace policy — toolsrv runs `bash -c true` in its prepared sandbox.
//! - `ollie_sandbox::Prepared::run` of the same argv (`bash -c true`) in this process, same
//!   policy, same workspace: the sandbox alone, without toolsrv and 9P. Also `/usr/bin/true`
//!   (the cheapest possible `true`) for orientation.
//!
//! The three are interleaved run by run, so bursts of load hit them alike; medians and means
//! are printed with the ratio (target: toolsrv ≤ 1.5× the sandbox alone). Then toolsrv's RSS
//! (VmRSS) right after start (target ≤ 4 MiB), and after the calls.
//!
//! `cargo bench -p ollie-toolsrv --bench toolsrv` (env `OLLIE_BENCH_RUNS`, default 300;
//! `OLLIE_TOOLSRV`, the toolsrv binary to measure, default the one cargo built for this bench:
//! `scripts/bench.sh` measures the static one `scripts/build.sh` makes).
//! A benchmark, not a test: it prints figures and never asserts on time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ollie_link::auth::Identity;
use ollie_link::boot::Bootstrap;
use ollie_link::spawn::{Toolsrv, attach};
use ollie_p9::Fid;
use ollie_p9::wire::om;

const WORKSPACE_TOML: &str = include_str!("../../packaging/policy/workspace.toml");
const PAYLOAD: &str = "tool=execute_code\ncmd=true\n";
const RSS_TARGET_KIB: u64 = 4 * 1024;
const RATIO_TARGET: f64 = 1.5;

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `RssAnon`, `RssFile`).
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS")
}

/// `VmRSS (anon A + file F)`.
fn rss_text(pid: u32) -> String {
    let f = |k| status_kib(pid, k).map_or_else(|| "?".to_owned(), |v| v.to_string());
    format!(
        "{} KiB (anon {} + file {})",
        f("VmRSS"),
        f("RssAnon"),
        f("RssFile")
    )
}

/// The children of `pid` (toolsrv's zygotes), from every process's `PPid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|c| status_kib(*c, "PPid") == Some(u64::from(pid)))
        .collect()
}

fn verdict(met: bool) -> &'static str {
    if met { "target met" } else { "target missed" }
}

/// One `proc/new` round trip on an open `proc/new` fid: the write, then the blocking read.
async fn round_trip(f: &Fid) {
    f.write(0, Bytes::from_static(PAYLOAD.as_bytes()))
        .await
        .expect("proc/new write");
    let r = f.read(0, 8192).await.expect("proc/new read");
    let head = std::str::from_utf8(&r).expect("utf-8 result");
    assert!(
        head.starts_with("pid=") && head.contains(" exit=0 "),
        "unexpected result {head:?}"
    );
}

/// The sandbox alone: `bash -c true` and `/usr/bin/true` under the same policy, workspace and
/// home as toolsrv's call.
fn sandbox_requests(
    ws: &Path,
    home: &Path,
) -> (ollie_sandbox::RunRequest, ollie_sandbox::RunRequest) {
    let mut req = ollie_sandbox::RunRequest::new(
        vec!["bash".into(), "-c".into(), "true".into()],
        ws.to_path_buf(),
    );
    req.home = home.to_path_buf();
    req.base_env = Vec::new();
    let mut req_true = req.clone();
    req_true.argv = vec!["/usr/bin/true".into()];
    (req, req_true)
}

/// One run of `r` in this process's prepared sandbox; it must exit 0.
fn direct(prepared: &ollie_sandbox::Prepared, r: &ollie_sandbox::RunRequest) {
    let o = prepared.run(r).expect("Prepared::run");
    assert_eq!(o.record.exit.status, 0, "Prepared::run failed");
}

/// The microseconds of each run of the three cases.
struct Samples {
    tsrv: Vec<f64>,
    bash: Vec<f64>,
    truev: Vec<f64>,
}

/// The first round trip (timed alone), a warm-up, then `runs` interleaved runs of the three
/// cases.
fn measure(
    runs: usize,
    rt: &tokio::runtime::Runtime,
    f: &Fid,
    prepared: &ollie_sandbox::Prepared,
    (req, req_true): (&ollie_sandbox::RunRequest, &ollie_sandbox::RunRequest),
) -> Samples {
    // Warm-up: toolsrv's prepared sandbox is set up by its first call.
    let t = Instant::now();
    rt.block_on(round_trip(f));
    println!(
        "{:<52} {:>9.1} µs (sets up toolsrv's prepared sandbox)",
        "first proc/new round trip",
        us(t.elapsed())
    );
    for _ in 0..5 {
        rt.block_on(round_trip(f));
        direct(prepared, req);
        direct(prepared, req_true);
    }

    let (mut tsrv, mut bash, mut truev) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        rt.block_on(round_trip(f));
        tsrv.push(us(t.elapsed()));
        let t = Instant::now();
        direct(prepared, req);
        bash.push(us(t.elapsed()));
        let t = Instant::now();
        direct(prepared, req_true);
        truev.push(us(t.elapsed()));
    }
    Samples { tsrv, bash, truev }
}

/// Each case's median and mean, and toolsrv's ratio to the sandbox alone.
fn report_times(s: &Samples) {
    let Samples { tsrv, bash, truev } = s;
    for (name, v) in [
        ("toolsrv proc/new round trip (bash -c true)", tsrv),
        ("Prepared::run in process (bash -c true)", bash),
        ("Prepared::run in process (/usr/bin/true)", truev),
    ] {
        println!(
            "{name:<52} median {:>9.1} µs   mean {:>9.1} µs",
            median(v),
            mean(v)
        );
    }
    let by_median = median(tsrv) / median(bash);
    let by_mean = mean(tsrv) / mean(bash);
    println!(
        "toolsrv / sandbox alone (same argv): {by_median:.2}x by median, {by_mean:.2}x by mean \
         (target <= {RATIO_TARGET}x): {}",
        verdict(by_median <= RATIO_TARGET)
    );
    println!(
        "toolsrv / sandbox alone (/usr/bin/true): {:.2}x by median, {:.2}x by mean (for orientation)",
        median(tsrv) / median(truev),
        mean(tsrv) / mean(truev)
    );
}

/// toolsrv's RSS after start (`rss_start`, `rss_start_text`) and now, after `runs` measured
/// calls, and its zygotes'.
fn report_rss(pid: u32, runs: usize, rss_start: Option<u64>, rss_start_text: &str) {
    std::thread::sleep(Duration::from_millis(200));
    let rss_after = rss_kib(pid);
    let zygotes: Vec<String> = children(pid)
        .into_iter()
        .map(|c| format!("pid {c}: {}", rss_text(c)))
        .collect();
    match (rss_start, rss_after) {
        (Some(a), Some(b)) => {
            // The goal is the idle process olliesrv keeps per session. After calls the heap
            // holds the calls' buffers (flat from 300 to 1500 calls: a working set, no leak).
            println!(
                "toolsrv VmRSS: {a} KiB idle after start (target <= {RSS_TARGET_KIB} KiB): {}; \
                 {b} KiB idle after {} calls",
                verdict(a <= RSS_TARGET_KIB),
                runs + 6,
            );
            println!("  after start: {rss_start_text}");
            println!("  after calls: {}", rss_text(pid));
        }
        _ => println!("toolsrv VmRSS: unavailable (cannot read /proc/{pid}/status)"),
    }
    println!(
        "  its zygote(s), separate processes, not counted: {}",
        if zygotes.is_empty() {
            "none".to_owned()
        } else {
            zygotes.join(", ")
        }
    );
}

fn main() {
    let runs: usize = std::env::var("OLLIE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("w");
    let home = dir.path().join("home");
    std::fs::create_dir(&ws).unwrap();
    std::fs::create_dir(&home).unwrap();
    let ws = ws.canonicalize().unwrap();

    let program = std::env::var_os("OLLIE_TOOLSRV")
        .filter(|p| !p.is_empty())
        .map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_toolsrv")),
            PathBuf::from,
        );
    println!("toolsrv: {}", program.display());
    let program = program.as_path();
    let mut policies = BTreeMap::new();
    policies.insert("workspace".to_owned(), WORKSPACE_TOML.to_owned());
    let boot = Bootstrap::new("bench", ws.clone(), home.clone(), policies, "workspace");
    let mut ts = Toolsrv::spawn(program, &boot).expect("spawn toolsrv");
    let pid = ts.pid();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (client, f) = rt.block_on(async {
        let c = ts.connect(1 << 16).await.expect("connect");
        let root = attach(&c, ts.key(), &Identity::Agent("bench".into()))
            .await
            .expect("attach");
        let mut f = root.walk_path("proc/new").await.expect("walk proc/new");
        f.open(om::ORDWR).await.expect("open proc/new");
        (c, f)
    });
    std::thread::sleep(Duration::from_millis(200));
    let rss_start = rss_kib(pid);
    let rss_start_text = rss_text(pid);

    let policy = ollie_policy::Policy::from_toml(WORKSPACE_TOML).unwrap();
    let prepared = ollie_sandbox::Prepared::new(&policy, &ws, &home).expect("Prepared::new");
    let (req, req_true) = sandbox_requests(&ws, &home);

    println!("toolsrv benchmark, {runs} interleaved runs each (workspace policy)");
    let samples = measure(runs, &rt, &f, &prepared, (&req, &req_true));
    report_times(&samples);
    report_rss(pid, runs, rss_start, &rss_start_text);

    // Closing the link (the runtime owns the connection's tasks) ends toolsrv.
    drop(f);
    drop(client);
    drop(rt);
    drop(prepared);
    let st = ts.child().wait();
    match st {
        Ok(s) if s.success() => {}
        other => println!("toolsrv exited with {other:?}"),
    }
}
