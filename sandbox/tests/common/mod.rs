//! What every sandbox test file needs: the kernel-feature gate and visible skips.
#![allow(dead_code, clippy::panic, clippy::unwrap_used)]

// The SKIP rule and the kernel feature probe live in the shared test kit.
#[allow(unused_imports)] // each suite uses some of these
pub use ollie_testkit::{features_ok, skip};

/// `e` and its sources, joined with `: `.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut chain = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        chain.push_str(&format!(": {s}"));
        src = s.source();
    }
    chain
}

/// The shipped profile `profile` with its `[limits]` table replaced by `limits` (TOML lines).
#[allow(clippy::unwrap_used)]
pub fn profile_with_limits(profile: &str, limits: &str) -> ollie_policy::Policy {
    let base = ollie_policy::SHIPPED_PROFILES
        .iter()
        .find(|(n, _)| *n == profile)
        .unwrap()
        .1;
    let start = base.find("[limits]").unwrap();
    let end = base[start..].find("\n[env]").unwrap() + start;
    ollie_policy::Policy::from_toml(&format!(
        "{}[limits]\n{limits}\n{}",
        &base[..start],
        &base[end..]
    ))
    .unwrap()
}

/// The shipped `workspace` profile's text with `extra` added to its `fs.write` list.
pub fn workspace_with_write(extra: &str) -> String {
    let base = ollie_policy::SHIPPED_PROFILES
        .iter()
        .find(|(n, _)| *n == "workspace")
        .unwrap()
        .1;
    base.replacen(
        "write = [\"{workdir}\",",
        &format!("write = [\"{extra}\", \"{{workdir}}\","),
        1,
    )
}

/// Pids of live (non-zombie) processes whose command line contains `marker`.
pub fn procs_with(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let state = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = state
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmd).contains(marker) {
            out.push(pid);
        }
    }
    out
}

/// Whether every process whose command line contains `marker` is gone within 5 s (they die
/// with their pid namespace; the kernel takes a moment to tear it down).
pub fn wait_gone(marker: &str) -> bool {
    use std::time::{Duration, Instant};
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if procs_with(marker).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The small libtest-compatible harness of the suites that cannot run under libtest
/// (`harness = false`: a probe that must stay single-threaded re-executes the test binary).
/// `args` are libtest's: names filter tests, `--skip NAME` skips them, other options are
/// ignored. Prints libtest's lines (the CI summary counts `test result:`), exit 101 on a
/// failure.
pub fn run_harness(tests: &[(&str, fn())], args: &[String]) -> std::process::ExitCode {
    let (mut filters, mut skips) = (Vec::new(), Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--skip" => skips.extend(it.next()),
            // libtest options (--test-threads=N, --nocapture, --exact, …) do not apply.
            a if a.starts_with('-') => {}
            a => filters.push(a.to_string()),
        }
    }
    let selected: Vec<_> = tests
        .iter()
        .filter(|(n, _)| filters.is_empty() || filters.iter().any(|f| n.contains(f.as_str())))
        .filter(|(n, _)| !skips.iter().any(|s| n.contains(s.as_str())))
        .collect();
    println!("\nrunning {} tests", selected.len());
    let mut failed = Vec::new();
    for (name, test) in &selected {
        let ok = std::panic::catch_unwind(test).is_ok();
        println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
        if !ok {
            failed.push(*name);
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed; 0 ignored; 0 measured; {} filtered out\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        selected.len() - failed.len(),
        failed.len(),
        tests.len() - selected.len()
    );
    if failed.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(101)
    }
}
