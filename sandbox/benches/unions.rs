//! Union-mount spawn cost: the median wall time of a run of `/bin/true` under the workspace
//! profile, without and with one union at `/ctx` (two lower layers), one-shot and as a call of
//! a prepared sandbox (`Prepared::new` against `Prepared::new_with_points`, as toolsrv runs an
//! agent's calls without and with a bead namespace), all four interleaved.
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
    let plain_sb = ollie_sandbox::Prepared::new(&policy, &plain.workdir, &plain.home).unwrap();
    let union_sb = ollie_sandbox::Prepared::new_with_points(
        &policy,
        &plain.workdir,
        &plain.home,
        &[],
        &["/ctx".into()],
    )
    .unwrap();
    let check = |o: ollie_sandbox::RunOutput| assert_eq!(o.record.exit.status, 0);
    let one_shot = |req: &ollie_sandbox::RunRequest| {
        let t = Instant::now();
        check(ollie_sandbox::run(&policy, req).unwrap());
        t.elapsed()
    };
    let prepared = |sb: &ollie_sandbox::Prepared, req: &ollie_sandbox::RunRequest| {
        let t = Instant::now();
        check(sb.run(req).unwrap());
        t.elapsed()
    };
    for _ in 0..5 {
        one_shot(&plain);
        one_shot(&union);
        prepared(&plain_sb, &plain);
        prepared(&union_sb, &union);
    }
    let mut v: [Vec<Duration>; 4] = Default::default();
    for _ in 0..runs {
        v[0].push(one_shot(&plain));
        v[1].push(one_shot(&union));
        v[2].push(prepared(&plain_sb, &plain));
        v[3].push(prepared(&union_sb, &union));
    }
    let [a, b, c, d] = v.map(median);
    println!("union spawn benchmark, {runs} runs each (median)");
    let line = |name: &str, t: Duration| println!("{name:<48} {:>9.1} µs", t.as_secs_f64() * 1e6);
    line("run /bin/true", a);
    line("run /bin/true with a union at /ctx", b);
    println!("{:<48} {:>9.2}", "ratio", b.as_secs_f64() / a.as_secs_f64());
    line("Prepared::run /bin/true", c);
    line("Prepared::run /bin/true, union at /ctx", d);
    println!(
        "{:<48} {:>9.1} µs",
        "prepared: added by the union",
        (d.as_secs_f64() - c.as_secs_f64()) * 1e6
    );
    drop((plain_sb, union_sb));
    let _ = std::fs::remove_dir_all(&base);
}
