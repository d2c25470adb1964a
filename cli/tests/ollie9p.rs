//! The `ollie-9p` binary's failure modes: usage errors and unreachable servers get one line and
//! distinct exit statuses. (Talking to a live server is covered by `tests/tests/olliesrv.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn ollie9p() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ollie-9p"))
}

#[test]
fn bad_address_is_a_usage_error() {
    let out = ollie9p().args(["-a", "bogus!x", "ls"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown network"), "{err}");
    assert!(err.contains("unix!/path"), "{err}");
}

#[test]
fn unreachable_server_exits_3() {
    let out = ollie9p()
        .args(["-a", "unix!/nonexistent/dir/ollie", "read", "help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot connect to unix!/nonexistent/dir/ollie"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn default_address_follows_namespace() {
    let out = ollie9p()
        .env("NAMESPACE", "/nonexistent/ns")
        .args(["read", "help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unix!/nonexistent/ns/ollie"));
}

#[test]
fn missing_subcommand_is_a_usage_error() {
    let out = ollie9p().output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
