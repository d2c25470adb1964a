//! What a newcomer meets first, through `o` against a real server: `o new` works in the
//! current directory and refuses one too broad to be a workspace, fails loudly when the
//! session's toolsrv cannot start, and `o prompt` on a paused session says the prompt is
//! queued instead of waiting silently.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Srv, fails, ok, run};

/// The value of `key=` in a `cfg` text.
fn cfg_value(srv: &Srv, session: &str, key: &str) -> String {
    let out = run(
        std::process::Command::new(common::bin("ollie-9p"))
            .arg("-a")
            .arg(srv.addr())
            .args(["read", &format!("session/{session}/cfg")]),
        b"",
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or("")
        .to_owned()
}

#[test]
fn o_new_works_in_the_current_directory_and_refuses_broad_ones() {
    let srv = Srv::start();
    let work = srv.workdir();
    // No --cwd: the directory o was started in (not $HOME).
    let out = run(srv.o(&["new", "here"]).current_dir(&work), b"");
    assert_eq!(ok(&out), "here\n");
    assert_eq!(
        cfg_value(&srv, "here", "cwd"),
        work.canonicalize().unwrap().to_str().unwrap()
    );
    // An agent inherits its session's directory, wherever o runs.
    ok(&run(srv.o(&["new", "here/a"]).current_dir("/"), b""));
    // A system tree or / as the workspace: refused, with the reason and the way out, and no
    // session made.
    for (dir, why) in [
        ("/etc", "is in a system tree"),
        ("/", "is the root directory"),
    ] {
        let out = run(srv.o(&["new", "broad"]).current_dir(dir), b"");
        fails(&out, 1, why);
        assert!(out.stderr.contains("force=yes"), "{out:?}");
        let out = srv.run(&["new", "broad", "--cwd", "/usr/lib"], b"");
        fails(&out, 1, "is in a system tree");
    }
    let listed = ok(&srv.run(&["ls"], b"")).to_owned();
    assert!(!listed.contains("broad"), "{listed}");
}

#[test]
fn o_new_fails_with_the_reason_when_the_sessions_toolsrv_cannot_start() {
    // A toolsrv that answers --version (so the server starts) but fails as a session's.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("toolsrv");
    std::fs::write(
        &fake,
        "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'toolsrv 0.0.0'; exit 0; }\necho 'toolsrv: broken on purpose' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let srv = Srv::start_full(&fake, |_| {});
    let work = srv.workdir();
    let out = srv.run(&["new", "p", "--cwd", work.to_str().unwrap()], b"");
    fails(&out, 1, "its toolsrv failed");
    assert!(out.stderr.contains("o kill p"), "{out:?}");
}

#[test]
fn o_prompt_on_a_paused_session_says_the_prompt_is_queued() {
    let srv = Srv::start();
    let work = srv.workdir();
    ok(&srv.run(&["new", "p", "--cwd", work.to_str().unwrap()], b""));
    ok(&srv.run(&["new", "p/main"], b""));
    ok(&srv.run(&["ctl", "p", "pause"], b""));
    let out = srv.run(&["prompt", "p/main", "queued words"], b"");
    assert_eq!(out.code, Some(4), "{out:?}");
    assert!(out.stderr.contains("session p is paused"), "{out:?}");
    assert!(out.stderr.contains("queued"), "{out:?}");
    // Nothing ran; after resume the queued prompt is the next turn (it fails here: the test
    // server has no backend, and the error is the turn's).
    ok(&srv.run(&["ctl", "p", "resume"], b""));
    let deadline = std::time::Instant::now() + common::GUARD;
    loop {
        let log = run(
            std::process::Command::new(common::bin("ollie-9p"))
                .arg("-a")
                .arg(srv.addr())
                .args(["read", "session/p/agent/main/log"]),
            b"",
        );
        if log.stdout.contains("[[[user\nqueued words") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{log:?}");
        std::thread::sleep(common::STEP);
    }
}

/// Shell completion of SESSION and SESSION/AGENT arguments asks the server (bash's protocol:
/// `COMPLETE=bash o -- WORDS…`, the word at `_CLAP_COMPLETE_INDEX` being completed); with no
/// server there, nothing is offered, at once.
#[test]
fn session_and_agent_names_complete_from_the_server() {
    let srv = Srv::start();
    let work = srv.workdir();
    ok(&srv.run(&["new", "proj", "--cwd", work.to_str().unwrap()], b""));
    ok(&srv.run(&["new", "proj/coder"], b""));
    ok(&srv.run(&["new", "other", "--cwd", work.to_str().unwrap()], b""));
    let complete = |ns: &std::path::Path, words: &[&str]| common::complete(words, Some(ns));
    let ns = srv.sock.parent().unwrap();
    assert_eq!(complete(ns, &["o", "attach", "pr"]), ["proj", "proj/coder"]);
    assert_eq!(complete(ns, &["o", "prompt", "proj/"]), ["proj/coder"]);
    // An empty word: every name (and the options).
    let all = complete(ns, &["o", "kill", ""]);
    assert_eq!(all[..3], ["other", "proj", "proj/coder"], "{all:?}");
    assert!(all[3..].iter().all(|w| w.starts_with('-')), "{all:?}");
    let empty = tempfile::tempdir().unwrap();
    assert!(complete(empty.path(), &["o", "attach", "pr"]).is_empty());
}
