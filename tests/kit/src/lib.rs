//! The test kit: the one place that reads `OLLIE_TEST_REQUIRE`, prints SKIP lines and probes the sandbox's kernel features.
//!
//! A test that needs something this machine lacks prints `SKIP <name>: <reason>` to stderr
//! (past libtest's capture, so skips are always visible; `.ci` and `scripts/` grep for them)
//! and returns. With `OLLIE_TEST_REQUIRE=all` nothing may be skipped: the test fails instead.
//! Used only by tests and benches; its modules:
//! - [`cases`]: table-driven tests that run every case and name each failure;
//! - [`probe`]: what the sandbox needs and this kernel lacks, whether FUSE mounts work;
//! - [`server`]: the built binaries, bounded client runs, servers that listen, free ports;
//! - [`client`]: a small 9P client helper (attach, walk, read a file, write a string);
//! - [`model`]: a model stand-in (Ollama's API) whose every turn makes one tool call;
//! - [`llama`]: a real model server (llama.cpp's llama-server, SmolLM2-135M) from the cache;
//! - [`toolsrv`]: the real toolsrv over a socketpair, clients attached with Tauth.
//!
//! It guarantees nothing to production code and is tested by the suites that use it: a helper
//! that stops failing when it should shows up as a suite that passes a broken binary.
#![allow(clippy::panic, clippy::expect_used)]

pub mod cases;
pub mod client;
pub mod fstree;
pub mod gitrepo;
pub mod llama;
pub mod model;
pub mod probe;
pub mod server;
pub mod toolsrv;

use std::io::Write;

pub use probe::{features_ok, missing_sandbox_features};

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
