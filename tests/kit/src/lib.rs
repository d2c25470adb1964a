//! The test kit: the one place that reads `OLLIE_TEST_REQUIRE` and prints SKIP lines.
//!
//! A test that needs something this machine lacks prints `SKIP <name>: <reason>` to stderr
//! (past libtest's capture, so skips are always visible; `.ci` and `scripts/` grep for them)
//! and returns. With `OLLIE_TEST_REQUIRE=all` nothing may be skipped: the test fails instead.
//! Used only by tests and benches; it touches nothing but stderr and the sandbox's probe.
#![allow(clippy::panic)]

use std::io::Write;

/// Whether `OLLIE_TEST_REQUIRE=all` is set: every skip becomes a failure.
pub fn require_all() -> bool {
    std::env::var("OLLIE_TEST_REQUIRE").as_deref() == Ok("all")
}

/// Prints `line` to stderr, past libtest's output capture. Does not check the rule.
pub fn print_skip(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Prints the SKIP `line`, or fails with `<line> (OLLIE_TEST_REQUIRE=all)` under the rule.
pub fn skip(line: &str) {
    if require_all() {
        panic!("{line} (OLLIE_TEST_REQUIRE=all)");
    }
    print_skip(line);
}

/// Prints `SKIP <name>: <reason>` and returns false, or fails under the rule with `fail`
/// (the caller's own failure text).
pub fn skip_or_fail(name: &str, reason: &str, fail: &str) -> bool {
    if require_all() {
        panic!("{fail}");
    }
    print_skip(&format!("SKIP {name}: {reason}"));
    false
}

/// What the sandbox needs and this kernel lacks (Landlock ABI 7, user namespaces), if anything.
pub fn missing_sandbox_features() -> Option<String> {
    let p = ollie_sandbox::probe();
    if p.landlock_abi < 7 {
        Some(format!("landlock ABI {} < 7", p.landlock_abi))
    } else if !p.user_namespaces {
        Some("user namespaces are disabled".to_string())
    } else {
        None
    }
}

/// Whether the kernel offers what the sandbox needs. When it does not, prints
/// `SKIP <name>: <reason>` and returns false, or under the rule fails with
/// `<name>: required kernel feature missing: <reason>`.
pub fn features_ok(name: &str) -> bool {
    match missing_sandbox_features() {
        None => true,
        Some(r) => skip_or_fail(
            name,
            &r,
            &format!("{name}: required kernel feature missing: {r}"),
        ),
    }
}

/// For a bench (its own `main`): prints `SKIP <bench>: <reason>` to stdout and exits 0, or under
/// the rule prints `<bench>: required feature missing: <reason>` to stderr and exits 1.
pub fn skip_bench(bench: &str, reason: &str) -> ! {
    if require_all() {
        let _ = writeln!(
            std::io::stderr(),
            "{bench}: required feature missing: {reason}"
        );
        std::process::exit(1);
    }
    let _ = writeln!(std::io::stdout(), "SKIP {bench}: {reason}");
    std::process::exit(0);
}
