//! Interop with py9p (the Python 3 version from `pip install p9fs==0.0.4`): each test starts the
//! real `olliesrv` and runs one script from `tests/py9p/` against its socket.
//!
//! Without `python3` or the `py9p` module the tests print `SKIP <test>: <reason>` and pass,
//! unless `OLLIE_TEST_REQUIRE=all` is set, in which case a missing dependency fails them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::*;

fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("py9p")
}

/// Whether python3 with py9p is here; otherwise SKIP (or fail under OLLIE_TEST_REQUIRE=all).
fn have_py9p(test: &str) -> bool {
    let why = match Command::new("python3")
        .args(["-c", "from py9p import py9p; py9p.Client"])
        .output()
    {
        Err(e) => format!("python3 not runnable: {e}"),
        Ok(o) if o.status.success() => return true,
        Ok(o) => format!(
            "py9p not importable (pip install p9fs==0.0.4): {}",
            text(&o.stderr).trim().lines().last().unwrap_or("")
        ),
    };
    if ollie_testkit::require_all() {
        panic!("{test}: {why} (OLLIE_TEST_REQUIRE=all)");
    }
    println!("SKIP {test}: {why}");
    false
}

/// Runs `tests/py9p/<script>.py <socket>`, expecting success; returns its stdout.
fn py(srv: &Srv, script: &str) -> String {
    let o: Output = run(
        Command::new("python3")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .arg(scripts().join(format!("{script}.py")))
            .arg(&srv.sock),
        b"",
    );
    let out = text(&o.stdout);
    assert!(
        o.status.success(),
        "py9p {script} failed ({}):\nstdout:\n{out}\nstderr:\n{}\nserver stderr:\n{}",
        o.status,
        text(&o.stderr),
        srv.stderr()
    );
    assert!(out.lines().any(|l| l == "ok"), "{script}: {out}");
    out
}

#[test]
fn py9p_ls_short_and_long() {
    if !have_py9p("py9p_ls_short_and_long") {
        return;
    }
    let srv = Srv::start(CONFIG);
    let out = py(&srv, "ls");
    for n in ["backends", "ctl", "eventwait", "help"] {
        assert!(out.contains(&format!("short {n}\n")), "{out}");
    }
    let ctl = out
        .lines()
        .find(|l| l.starts_with("long ") && l.ends_with("ctl"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(ctl.starts_with("long -rw------- "), "{ctl}");
    assert!(ctl.contains(&format!(" {} agent ", me())), "{ctl}");
}

#[test]
fn py9p_read_help_and_backends() {
    if !have_py9p("py9p_read_help_and_backends") {
        return;
    }
    let srv = Srv::start(CONFIG);
    let out = py(&srv, "read");
    assert!(out.contains("backends alpha beta\n"), "{out}");
}

#[test]
fn py9p_rdwr_on_ctl() {
    if !have_py9p("py9p_rdwr_on_ctl") {
        return;
    }
    let srv = Srv::start(CONFIG);
    let out = py(&srv, "rdwr");
    assert!(out.contains("reply help\t"), "{out}");
}

#[test]
fn py9p_unknown_ctl_command_is_an_error() {
    if !have_py9p("py9p_unknown_ctl_command_is_an_error") {
        return;
    }
    let srv = Srv::start(CONFIG);
    let out = py(&srv, "unknown_ctl");
    assert!(
        out.contains("error unknown command \"frobnicate\" (valid: help, invalidate, kill)"),
        "{out}"
    );
}

#[test]
fn py9p_flush_of_a_blocked_eventwait_read() {
    if !have_py9p("py9p_flush_of_a_blocked_eventwait_read") {
        return;
    }
    let srv = Srv::start(CONFIG);
    let out = py(&srv, "flush");
    assert!(out.contains("rflush\n"), "{out}");
    assert!(out.contains("event config-reloaded\n"), "{out}");
}

#[test]
fn py9p_two_clients_at_once() {
    if !have_py9p("py9p_two_clients_at_once") {
        return;
    }
    let srv = Srv::start(CONFIG);
    let out = py(&srv, "two_clients");
    assert!(out.contains("a help\t"), "{out}");
    assert!(out.contains("b config reloaded: 2 backends\n"), "{out}");
}

/// Two py9p processes at once, each its own connection, alongside our CLI.
#[test]
fn py9p_two_processes_at_once() {
    if !have_py9p("py9p_two_processes_at_once") {
        return;
    }
    let srv = Srv::start(CONFIG);
    std::thread::scope(|s| {
        let a = s.spawn(|| py(&srv, "rdwr"));
        let b = s.spawn(|| py(&srv, "read"));
        let o = ollie9p(&srv.addr(), &["read", "backends"], b"");
        assert_eq!(text(&o.stdout), "alpha\nbeta\n");
        assert!(a.join().unwrap().contains("reply help\t"));
        assert!(b.join().unwrap().contains("backends alpha beta"));
    });
}

/// Sessions and agents driven by py9p: create, prompt, chat markers, cfg, plan, statewait
/// woken by a second py9p client, rename, kill.
#[test]
fn py9p_sessions_and_agents() {
    if !have_py9p("py9p_sessions_and_agents") {
        return;
    }
    let srv = Srv::start(CONFIG);
    let out = py(&srv, "sessions");
    assert!(out.contains("session py\n"), "{out}");
    assert!(out.contains("chat.raw ok\n"), "{out}");
    assert!(out.contains("cfg error unknown key \"colour\""), "{out}");
    assert!(out.contains("statewait paused\n"), "{out}");
}
