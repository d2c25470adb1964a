//! Union-mount spawn cost: the median wall time of a one-shot `run` of `/bin/true` under the
//! workspace profile, without and with one union at `/ctx` (two lower layers), interleaved.
//!
//! `cargo bench -p ollie-sandbox --bench unions` (env `OLLIE_BENCH_RUNS`, default 50).
//! A benchmark, not a test: it prints figures and never asserts on time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let runs: usize = std::env::var("OLLIE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let base = std::env::temp_dir().join(format!("ollie-bench-unions-{}", std::process::id()));
    for d in ["ws", "A", "B", "U", "W"] {
        std::fs::create_dir_all(base.join(d)).unwrap();
    }
    std::fs::write(base.join("A/x"), "a").unwrap();
    let policy = ollie_policy::shipped_profile("workspace").unwrap();
    let plain = ollie_sandbox::RunRequest::new(vec!["/bin/true".into()], base.join("ws"));
    let mut union = plain.clone();
    union.unions = vec![ollie_sandbox::UnionMount {
        point: "/ctx".into(),
        lowers: vec![base.join("A"), base.join("B")],
        upper: base.join("U"),
        work: base.join("W"),
    }];
    let time = |req: &ollie_sandbox::RunRequest| {
        let t = Instant::now();
        let o = ollie_sandbox::run(&policy, req).unwrap();
        assert_eq!(o.record.exit.status, 0);
        t.elapsed()
    };
    for _ in 0..5 {
        time(&plain);
        time(&union);
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        a.push(time(&plain));
        b.push(time(&union));
    }
    let (a, b) = (median(a), median(b));
    println!("union spawn benchmark, {runs} runs each (median)");
    println!("{:<40} {:>9.1} µs", "run /bin/true", a.as_secs_f64() * 1e6);
    println!(
        "{:<40} {:>9.1} µs",
        "run /bin/true with a union at /ctx",
        b.as_secs_f64() * 1e6
    );
    println!("{:<40} {:>9.2}", "ratio", b.as_secs_f64() / a.as_secs_f64());
    let _ = std::fs::remove_dir_all(&base);
}
