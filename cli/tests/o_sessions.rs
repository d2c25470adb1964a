//! `o`'s session commands against a real `olliesrv` (tier 2): `new`, `ls` (text and JSON),
//! `ctl`, `prompt`, `logs`, `kill`, `attach` (piped and on a terminal) and their errors.
//!
//! Needs the workspace binaries: run `cargo build --workspace --bins` first (olliesrv and the
//! toolsrv it starts are looked for next to this crate's `o`, or in `$OLLIE_BIN_DIR`).
//! Every wait is bounded by a failure guard; nothing here measures time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{Srv, drain_pty, fails, ok, run, wait_child};

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Command, Stdio};

fn ls_json(srv: &Srv) -> serde_json::Value {
    let out = srv.run(&["ls", "--json"], b"");
    serde_json::from_str(ok(&out)).unwrap_or_else(|e| panic!("ls --json: {e}: {out:?}"))
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|c| *c == '-').count() == 4
}

#[test]
fn sessions_agents_prompts_and_kill() {
    let srv = Srv::start();
    let work = srv.workdir();
    let work = work.to_str().unwrap();

    assert_eq!(ok(&srv.run(&["new", "proj", "--cwd", work], b"")), "proj\n");
    let id = ok(&srv.run(&["new", "proj/main"], b"")).trim().to_owned();
    assert!(is_uuid(&id), "{id}");

    // Text listing: the session, and its agent indented under it.
    let out = srv.run(&["ls"], b"");
    let text = ok(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("proj "), "{text}");
    assert!(lines[0].contains("agents 1"), "{text}");
    assert!(lines[0].contains("toolsrv "), "{text}");
    assert!(lines[0].contains("paused no"), "{text}");
    assert!(lines[1].starts_with("  main "), "{text}");
    assert!(lines[1].contains(&id), "{text}");
    assert!(lines[1].contains(" idle "), "{text}");
    assert!(lines[1].contains("tokens 0"), "{text}");
    assert!(lines[1].ends_with("context -"), "{text}");

    // JSON: the same, parsed.
    let j = ls_json(&srv);
    let sessions = j.as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{j}");
    assert_eq!(sessions[0]["name"], "proj");
    assert!(is_uuid(sessions[0]["id"].as_str().unwrap()));
    assert_eq!(sessions[0]["paused"], false);
    let agents = sessions[0]["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 1);
    assert_eq!(agents[0]["name"], "main");
    assert_eq!(agents[0]["id"], id.as_str());
    assert_eq!(agents[0]["state"], "idle");
    assert_eq!(agents[0]["tokens"], 0);
    assert!(agents[0]["context_percent"].is_null(), "{j}");

    // ctl: session and agent command lists.
    let help = srv.run(&["ctl", "proj", "help"], b"");
    assert!(ok(&help).contains("pause\t"), "{help:?}");
    let help = srv.run(&["ctl", "proj/main", "help"], b"");
    assert!(ok(&help).contains("stop\t"), "{help:?}");
    let bad = srv.run(&["ctl", "proj/main", "frobnicate"], b"");
    fails(&bad, 1, "unknown command");

    // prompt: the turn ends in the no-backend error block: exit 1, its text on stderr.
    let out = srv.run(&["prompt", "proj/main", "hello", "there"], b"");
    fails(&out, 1, "no backend: start Ollama");
    assert!(out.stdout.contains("hello there\n"), "{out:?}");
    assert!(!out.stdout.contains("[[["), "{out:?}");

    // logs: the chat holds the prompt and the error, without markers (raw: with them).
    let log = srv.run(&["logs", "proj/main"], b"");
    let log = ok(&log);
    assert!(log.contains("hello there\n"), "{log}");
    assert!(log.contains("no backend: start Ollama"), "{log}");
    assert!(!log.contains("[[["), "{log}");
    let raw = srv.run(&["logs", "--raw", "proj/main"], b"");
    let raw = ok(&raw);
    assert!(
        raw.starts_with("[[[user\nhello there\n]]]\n[[[error\n"),
        "{raw}"
    );
    assert_eq!(ls_json(&srv)[0]["agents"][0]["state"], "error");

    // kill: an agent, then the session; nothing printed; gone from ls.
    let k = srv.run(&["kill", "proj/main"], b"");
    assert_eq!(ok(&k), "");
    assert_eq!(ls_json(&srv)[0]["agents"].as_array().unwrap().len(), 0);
    let k = srv.run(&["kill", "proj"], b"");
    assert_eq!(ok(&k), "");
    assert_eq!(ls_json(&srv), serde_json::json!([]));
    assert_eq!(ok(&srv.run(&["ls"], b"")), "");
    fails(
        &srv.run(&["kill", "proj"], b""),
        1,
        "no session named \"proj\"",
    );
}

#[test]
fn attach_sends_input_lines_and_ends_at_end_of_input() {
    let srv = Srv::start();
    let work = srv.workdir();
    ok(&srv.run(&["new", "s", "--cwd", work.to_str().unwrap()], b""));

    // No agent yet: attach creates "main". One line, then end of input: the process ends
    // by itself once the turn is over (bounded by the guard in `run`).
    let out = srv.run(&["attach", "s"], b"fix the build\n");
    let shown = ok(&out);
    // Piped: the chat as it is, from where it stood at attach.
    assert!(shown.contains("fix the build\n"), "{out:?}");
    assert!(shown.contains("no backend: start Ollama"), "{out:?}");
    assert!(!shown.contains("[[["), "{out:?}");
    let j = ls_json(&srv);
    assert_eq!(j[0]["agents"][0]["name"], "main", "{j}");
    assert_eq!(j[0]["agents"][0]["state"], "error", "{j}");
    let log = srv.run(&["logs", "s/main"], b"");
    assert!(ok(&log).starts_with("fix the build\n"), "{log:?}");

    // Re-attaching replays nothing without --history, everything with it.
    let again = srv.run(&["attach", "s/main"], b"");
    assert_eq!(ok(&again), "", "{again:?}");
    let hist = srv.run(&["attach", "--history", "s/main"], b"");
    assert!(ok(&hist).starts_with("fix the build\n"), "{hist:?}");

    // Blank lines are not prompts; two prompts, two turns.
    let two = srv.run(&["attach", "s"], b"\none\n\ntwo\n");
    let shown = ok(&two);
    assert!(shown.contains("one\n"), "{two:?}");
    assert!(shown.contains("two\n"), "{two:?}");
    let raw = srv.run(&["logs", "--raw", "s"], b"");
    assert_eq!(ok(&raw).matches("[[[user\n").count(), 3, "{raw:?}");
}

#[test]
fn attach_on_a_terminal_renders_blocks() {
    let srv = Srv::start();
    let work = srv.workdir();
    ok(&srv.run(&["new", "t", "--cwd", work.to_str().unwrap()], b""));
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave: OwnedFd = pty.slave;
    let mut child = srv
        .o(&["attach", "t"])
        .env_remove("NO_COLOR")
        .stdin(Stdio::piped())
        .stdout(Stdio::from(slave.as_fd().try_clone_to_owned().unwrap()))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(slave);
    let reader = drain_pty(pty.master);
    {
        let mut input = child.stdin.take().unwrap();
        input.write_all(b"hello tty\n").unwrap();
    }
    let st = wait_child(&mut child, "o attach on a pty");
    assert!(st.success(), "{st}");
    let shown = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    // Markers become compact [kind] lines; user text bold, the error red.
    assert!(shown.contains("[user]"), "{shown:?}");
    assert!(shown.contains("\x1b[1mhello tty\x1b[0m"), "{shown:?}");
    assert!(shown.contains("[error]"), "{shown:?}");
    assert!(
        shown.contains("\x1b[31mno backend: start Ollama"),
        "{shown:?}"
    );
    assert!(!shown.contains("[[["), "{shown:?}");
    assert!(!shown.contains("]]]"), "{shown:?}");
}

#[test]
fn errors_are_one_line_with_distinct_statuses() {
    let srv = Srv::start();
    let work = srv.workdir();
    let work = work.to_str().unwrap();
    for args in [
        &["attach", "nope"][..],
        &["prompt", "nope", "hi"],
        &["ctl", "nope", "help"],
        &["kill", "nope"],
        &["logs", "nope/a"],
        &["new", "nope/a"],
    ] {
        fails(&srv.run(args, b""), 1, "no session named \"nope\"");
    }
    ok(&srv.run(&["new", "p", "--cwd", work], b""));
    fails(
        &srv.run(&["new", "p", "--cwd", work], b""),
        1,
        "already exists",
    );
    fails(
        &srv.run(&["logs", "p/ghost"], b""),
        1,
        "no agent named \"ghost\"",
    );
    fails(&srv.run(&["logs", "p"], b""), 1, "has no agents");
    fails(
        &srv.run(&["new", "q", "--profile", "nope"], b""),
        1,
        "unknown profile",
    );
    fails(
        &srv.run(&["new", "q", "--cwd", "/nonexistent/x"], b""),
        1,
        "cwd",
    );
    fails(&srv.run(&["new", "bad name"], b""), 2, "invalid name");
    fails(&srv.run(&["attach", "a/b/c"], b""), 2, "NAME/AGENT");
    // Files beside the sessions are not sessions.
    fails(
        &srv.run(&["ctl", "idx", "help"], b""),
        1,
        "no session named \"idx\"",
    );
    // Nothing was created by the failures.
    let j = ls_json(&srv);
    assert_eq!(j.as_array().unwrap().len(), 1, "{j}");
    assert_eq!(j[0]["name"], "p");

    // The default address is $NAMESPACE/ollie.
    let mut c = Command::new(env!("CARGO_BIN_EXE_o"));
    c.arg("ls").env("NAMESPACE", srv.sock.parent().unwrap());
    let out = run(&mut c, b"");
    assert!(ok(&out).starts_with("p "), "{out:?}");
}

#[test]
fn unreachable_server_exits_3() {
    let out = run(
        Command::new(env!("CARGO_BIN_EXE_o")).args(["-a", "unix!/nonexistent/dir/ollie", "ls"]),
        b"",
    );
    fails(&out, 3, "cannot connect to unix!/nonexistent/dir/ollie");
    let out = run(
        Command::new(env!("CARGO_BIN_EXE_o")).args(["-a", "bogus!x", "ls"]),
        b"",
    );
    fails(&out, 2, "unknown network");
}

#[test]
fn help_has_examples() {
    for cmd in [
        "ls", "new", "attach", "prompt", "ctl", "kill", "logs", "approve",
    ] {
        let out = run(
            Command::new(env!("CARGO_BIN_EXE_o")).args([cmd, "--help"]),
            b"",
        );
        assert!(ok(&out).contains("EXAMPLES:"), "{cmd}: {out:?}");
    }
}
