//! `o approve` against a real `olliesrv` (tier 2): a replay backend makes the agent call
//! `execute_code` with an `escalate` request; `o approve` shows it and answers it from its
//! standard input, and the agent's chat shows the outcome.
//!
//! Needs the workspace binaries: run `cargo build --workspace --bins` first. Every wait is
//! bounded by a failure guard (see `common`); nothing here measures time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{Out, Srv, ok, run};

use std::path::Path;

/// A server whose default backend replays `turns`, with a profile `asker` that may ask for
/// `write` grants; session `s` (in its workdir) with agent `a` of that profile.
fn server(turns: &str) -> Srv {
    let srv = Srv::start_with(|cfg| {
        let file = cfg.join("turns.jsonl");
        std::fs::write(&file, turns).unwrap();
        std::fs::write(
            cfg.join("config.toml"),
            format!(
                "default_backend = \"demo\"\n\n[backends.demo]\nkind = \"replay\"\nfile = \"{}\"\n",
                file.display()
            ),
        )
        .unwrap();
        std::fs::create_dir_all(cfg.join("agents")).unwrap();
        std::fs::write(
            cfg.join("agents").join("asker.toml"),
            "escalations = [\"write\"]\n",
        )
        .unwrap();
    });
    let work = srv.workdir();
    ok(&srv.run(&["new", "s", "--cwd", work.to_str().unwrap()], b""));
    ok(&srv.run(&["new", "s/a", "--profile", "asker"], b""));
    srv
}

/// One replayed turn calling `execute_code` with `code`, asking to write to `dir`, then a
/// closing answer `text`.
fn turns(code: &str, dir: &Path, text: &str) -> String {
    let call = serde_json::json!({"tool_calls": [{"name": "execute_code", "arguments": {
        "language": "bash",
        "code": code,
        "escalate": {"grants": [format!("write:{}", dir.display())],
                     "reason": "store the result outside the workspace"}}}]});
    format!("{call}\n{}\n", serde_json::json!({ "text": text }))
}

/// Starts `o prompt s/a go` in the background (bounded); join it for its output.
fn prompt(srv: &Srv) -> std::thread::JoinHandle<Out> {
    let mut cmd = srv.o(&["prompt", "s/a", "go"]);
    std::thread::spawn(move || run(&mut cmd, b""))
}

#[test]
fn approving_runs_the_command_with_the_grant() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("result.txt");
    let code = format!("echo granted > {} && echo wrote-it", target.display());
    let srv = server(&turns(&code, outside.path(), "Stored it."));
    let turn = prompt(&srv);

    // The root pending: every session's requests.
    let out = srv.run(&["approve", "--once"], b"y\n");
    let shown = ok(&out);
    for want in [
        "escalation request ",
        "session    s (",
        "agent      a (",
        "tool       execute_code\n",
        "command    ",
        "program    ",
        " sha256 ",
        &format!("grant      write:{}\n", outside.path().display()),
        "reason     store the result outside the workspace\n",
        "expires    ",
        "approve? [y/N/s] (s = for the rest of the session) ",
        "\napproved\n",
    ] {
        assert!(shown.contains(want), "{want:?} in {out:?}");
    }
    assert!(shown.contains("wrote-it"), "the command is shown: {out:?}");

    let chat = turn.join().unwrap();
    assert!(ok(&chat).contains("wrote-it"), "{chat:?}");
    assert!(chat.stdout.contains("Stored it."), "{chat:?}");
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "granted\n",
        "{chat:?}"
    );
}

#[test]
fn denying_sends_the_reason_and_controls_never_reach_the_terminal() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("never.txt");
    // The command carries an ANSI escape (clear screen, red) and a right-to-left override.
    let code = format!(
        "printf '\x1b[2J\x1b[31m\u{202E}txt.exe'; echo no > {}",
        target.display()
    );
    let srv = server(&turns(&code, outside.path(), "The operator said no."));
    let turn = prompt(&srv);

    // End of input before an answer: exits 0, answers nothing (the request stays pending).
    let quit = srv.run(&["approve", "--session", "s"], b"");
    let shown = ok(&quit);
    assert!(shown.contains("escalation request "), "{quit:?}");
    assert!(!shown.contains("denied"), "{quit:?}");
    assert!(!shown.contains("approved"), "{quit:?}");

    // One session's pending; no, with a reason.
    let out = srv.run(&["approve", "--session", "s", "--once"], b"n\nnot now\n");
    let shown = ok(&out);
    assert!(shown.contains("\ndenied\n"), "{out:?}");
    assert!(shown.contains("reason for the agent"), "{out:?}");
    // Shown escaped, never raw.
    assert!(
        shown.contains(r"\u{1B}[2J\u{1B}[31m\u{202E}txt.exe"),
        "{out:?}"
    );
    for raw in [quit.stdout.as_str(), &out.stdout, &out.stderr] {
        assert!(!raw.contains('\x1b'), "{raw:?}");
        assert!(!raw.contains('\u{202E}'), "{raw:?}");
    }

    let chat = turn.join().unwrap();
    let all = format!("{}{}", chat.stdout, chat.stderr);
    assert!(all.contains("not now"), "{chat:?}");
    assert!(all.contains("The operator said no."), "{chat:?}");
    assert!(!target.exists(), "{chat:?}");
    let log = srv.run(&["logs", "s/a"], b"");
    assert!(ok(&log).contains("not now"), "{log:?}");

    // Nothing is left to answer: a second verdict for the same request cannot happen, and
    // an unknown session is refused before anything is shown.
    let none = srv.run(&["approve", "--session", "nope"], b"");
    assert_eq!(none.code, Some(1), "{none:?}");
    assert!(
        none.stderr.contains("no session named \"nope\""),
        "{none:?}"
    );
    let bad = srv.run(&["approve", "--session", "a/b"], b"");
    assert_eq!(bad.code, Some(2), "{bad:?}");
}
