//! Spawn benchmark: plain `posix_spawn` of /bin/true, our sandboxed spawn under the default
//! profile (one-shot `run`, and `Prepared::run` after a once-per-session `Prepared::new`), and `bwrap --unshare-all --ro-bind / / --dev /dev true`, as runs/s and ratios.
//!
//! `cargo bench -p ollie-sandbox --bench spawn` (env `OLLIE_BENCH_RUNS`, default 300).
//! A benchmark, not a test: it prints figures and never asserts on time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ollie_policy::Policy;
use ollie_sandbox::{Prepared, RunRequest, SandboxError};

fn measure(name: &str, runs: u32, mut f: impl FnMut() -> bool) -> Option<f64> {
    // Warm-up (page cache, lazy statics such as the compiled seccomp filters).
    for _ in 0..5 {
        if !f() {
            println!("{name:<44} unavailable");
            return None;
        }
    }
    let start = Instant::now();
    for _ in 0..runs {
        assert!(f(), "{name} failed during the run");
    }
    let el = start.elapsed();
    let rate = f64::from(runs) / el.as_secs_f64();
    let per = el / runs;
    println!("{name:<44} {rate:>9.1} runs/s  {:>9.1} µs/run", dur_us(per));
    Some(rate)
}

fn dur_us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `bwrap --unshare-all --ro-bind / / --dev /dev true`, quiet.
fn bwrap_true() -> Command {
    let mut c = Command::new("bwrap");
    c.args([
        "--unshare-all",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "true",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    c
}

/// A plain spawn of `/bin/true`; whether it exited 0.
fn plain_true() -> bool {
    Command::new("/bin/true")
        .stdin(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The prepared path: namespaces, mounts, ruleset and filter set up once per session, then
/// `runs` calls. The first `Prepared::new` in a process also checks the compiled filter
/// against the reference, so it is timed apart from the second, which is kept.
fn measure_prepared(
    policy: &Policy,
    ws: &Path,
    req: &RunRequest,
    runs: u32,
) -> (Result<Prepared, SandboxError>, Option<f64>) {
    let first = Instant::now();
    let first_ok = Prepared::new(policy, ws, &req.home).is_ok();
    let first = first.elapsed();
    let setup = Instant::now();
    let prepared = Prepared::new(policy, ws, &req.home);
    let setup = setup.elapsed();
    let prep = match &prepared {
        Ok(sb) => {
            if first_ok {
                println!(
                    "{:<44} {:>9.1} µs once per process",
                    "  prepared: first Prepared::new + filter check",
                    dur_us(first)
                );
            }
            println!(
                "{:<44} {:>9.1} µs once per session ({} seccomp layout)",
                "  prepared: Prepared::new",
                dur_us(setup),
                sb.session().seccomp_layout
            );
            measure("ollie Prepared::run (workspace) /bin/true", runs, || {
                sb.run(req).is_ok_and(|o| o.record.exit.status == 0)
            })
        }
        Err(e) => {
            println!("{:<44} unavailable: {e}", "ollie Prepared::run");
            None
        }
    };
    (prepared, prep)
}

/// The landlock ruleset build alone, one component of our spawn path, for orientation.
fn measure_landlock(policy: &Policy, ws: &Path, runs: u32) {
    let resolved = policy
        .resolve(&ollie_policy::ResolveContext {
            workdir: ws.canonicalize().unwrap(),
            home: std::env::var_os("HOME").map_or_else(|| "/".into(), Into::into),
            extra_secrets: Vec::new(),
        })
        .unwrap();
    measure("  component: landlock ruleset build", runs, || {
        ollie_sandbox::landlock::build(&resolved, None).is_ok()
    });
}

/// Plain spawn against `Prepared::run` (and bwrap every fourth run, `with_bwrap`),
/// interleaved run by run and summarised by medians, so that bursts of load on a shared
/// machine hit both sides alike.
fn interleaved(sb: &Prepared, req: &RunRequest, runs: u32, with_bwrap: bool) {
    let mut plain_us = Vec::new();
    let mut prep_us = Vec::new();
    let mut bwrap_us = Vec::new();
    for i in 0..runs {
        let t = Instant::now();
        let ok = plain_true();
        plain_us.push(dur_us(t.elapsed()));
        let t = Instant::now();
        let ok = ok && sb.run(req).is_ok_and(|o| o.record.exit.status == 0);
        prep_us.push(dur_us(t.elapsed()));
        assert!(ok, "interleaved run failed");
        if with_bwrap && i % 4 == 0 {
            let t = Instant::now();
            let _ = bwrap_true().status();
            bwrap_us.push(dur_us(t.elapsed()));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (p, r) = (median(&mut plain_us), median(&mut prep_us));
    println!(
        "interleaved medians: plain {p:.1} µs, Prepared::run {r:.1} µs: {:.2}x (target <= 1.3x)",
        r / p
    );
    if !bwrap_us.is_empty() {
        let b = median(&mut bwrap_us);
        println!(
            "interleaved medians: bwrap {b:.1} µs: Prepared::run {:.2}x faster (target >= 5x)",
            b / r
        );
    }
}

fn main() {
    let runs: u32 = std::env::var("OLLIE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let ws = std::env::temp_dir().join(format!("ollie-bench-{}", std::process::id()));
    std::fs::create_dir_all(&ws).unwrap();
    let policy = ollie_policy::shipped_profile("workspace").unwrap();
    let req = RunRequest::new(vec!["/bin/true".into()], ws.clone());

    println!("spawn benchmark, {runs} runs each");
    let plain = measure("plain posix_spawn /bin/true", runs, plain_true);
    let ours = measure("ollie sandbox (workspace profile) /bin/true", runs, || {
        ollie_sandbox::run(&policy, &req).is_ok_and(|o| o.record.exit.status == 0)
    });
    let (prepared, prep) = measure_prepared(&policy, &ws, &req, runs);
    let bwrap = measure("bwrap --unshare-all --ro-bind / / --dev /dev", runs, || {
        bwrap_true().status().is_ok_and(|s| s.success())
    });
    measure_landlock(&policy, &ws, runs);
    if let (Some(p), Some(o)) = (plain, ours) {
        println!("ours / plain time ratio: {:.2}x (target <= 1.3x)", p / o);
    }
    if let (Some(o), Some(b)) = (ours, bwrap) {
        println!("ours vs bwrap speed-up: {:.2}x (target >= 5x)", o / b);
    }
    if let (Some(p), Some(r)) = (plain, prep) {
        println!(
            "prepared / plain time ratio: {:.2}x (target <= 1.3x)",
            p / r
        );
    }
    if let Ok(sb) = &prepared {
        interleaved(sb, &req, runs, bwrap.is_some());
    }
    if let (Some(r), Some(b)) = (prep, bwrap) {
        println!("prepared vs bwrap speed-up: {:.2}x (target >= 5x)", r / b);
    }
    if let (Some(o), Some(r)) = (ours, prep) {
        println!("prepared vs one-shot speed-up: {:.2}x", r / o);
    }
    drop(prepared);
    let _ = std::fs::remove_dir_all(&ws);
}
