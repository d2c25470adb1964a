//! What a newcomer meets first, against the real olliesrv: it refuses to start without a
//! runnable toolsrv (exit 2, one line naming what it tried, nothing served); a session's or
//! agent's working directory may not be `/`, the home directory or a system tree unless
//! forced; `proc` on a process that does not exist says so; backend failures are logged at
//! WARN, in plain text off a terminal.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Stdio;

use common::*;
use ollie_testkit::client::{rdwr_text as rdwr, read_ok as read, wait_for_text};

const REPLAY: &str = "default_backend = \"demo\"\n[backends.demo]\nkind = \"replay\"\nfile = \"/nonexistent-turns.jsonl\"\n";

#[test]
fn olliesrv_refuses_to_start_without_a_runnable_toolsrv() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("not-toolsrv");
    std::fs::write(&fake, "#!/bin/sh\necho something else\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let missing = dir.path().join("missing").join("toolsrv");
    for (toolsrv, why) in [
        (&missing, "No such file or directory"),
        (&fake, "did not answer as toolsrv does"),
    ] {
        let sock = dir.path().join("ns").join("ollie");
        let out = ollie_testkit::server::olliesrv_command(&sock, &dir.path().join("state"))
            .arg("--toolsrv")
            .arg(toolsrv)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("olliesrv: no runnable toolsrv: "),
            "{stderr}"
        );
        assert!(stderr.contains(toolsrv.to_str().unwrap()), "{stderr}");
        assert!(stderr.contains(why), "{stderr}");
        assert!(
            stderr.contains("--toolsrv FILE or OLLIE_TOOLSRV"),
            "{stderr}"
        );
        // Refused before anything was made: no socket, no state directory.
        assert!(!sock.exists(), "{stderr}");
        assert!(!dir.path().join("state").exists(), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broad_working_directories_are_refused_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let home_s = home.canonicalize().unwrap().to_str().unwrap().to_owned();
    let srv = Srv::start_with(dir, REPLAY, |c| {
        c.env("HOME", &home);
    });
    let (_c, root) = attach(&srv, &me()).await;
    for (spec, why) in [
        ("name=a cwd=/etc", "cwd /etc is in a system tree"),
        (
            "name=a cwd=/usr/share",
            "cwd /usr/share is in a system tree",
        ),
        ("name=a cwd=/", "cwd / is the root directory"),
        (&format!("name=a cwd={home_s}"), "is your home directory"),
        ("name=a cwd=/etc force=maybe", "force: give yes or no"),
    ] {
        let e = rdwr(&root, "session/new", spec)
            .await
            .expect_err("a broad cwd was accepted");
        assert!(e.contains(why), "{spec}: {e}");
        if !spec.contains("force") {
            assert!(e.contains("force=yes"), "{spec}: {e}");
        }
    }
    assert!(
        ollie_testkit::client::walk(&root, "session/a")
            .await
            .is_err(),
        "a refused session exists"
    );
    // No cwd= (the seed's `name=myproj`): a session without a working directory, never the
    // home directory by default. Its agents must name one, and the same rules apply to it.
    rdwr(&root, "session/new", "name=bare").await.unwrap();
    let cfg = read(&root, "session/bare/cfg").await;
    assert!(cfg.contains("cwd=\n"), "{cfg}");
    assert!(!cfg.contains(&home_s), "{cfg}");
    let e = rdwr(&root, "session/bare/agent/new", "name=x")
        .await
        .expect_err("an agent without a cwd in a session without one");
    assert!(e.contains("has no working directory of its own"), "{e}");
    assert!(e.contains("cwd=DIR"), "{e}");
    let e = rdwr(
        &root,
        "session/bare/agent/new",
        &format!("name=x cwd={home_s}"),
    )
    .await
    .expect_err("an agent in the home directory");
    assert!(e.contains("is your home directory"), "{e}");
    assert!(
        ollie_testkit::client::walk(&root, "session/bare/agent/x")
            .await
            .is_err(),
        "a refused agent exists"
    );
    // Forced: the home directory is accepted.
    rdwr(
        &root,
        "session/new",
        &format!("name=h cwd={home_s} force=yes"),
    )
    .await
    .unwrap();
    let cfg = read(&root, "session/h/cfg").await;
    assert!(cfg.contains(&format!("cwd={home_s}\n")), "{cfg}");
    // Agents: at creation, through cfg and through ctl.
    let work = srv.dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    rdwr(
        &root,
        "session/new",
        &format!("name=s cwd={}", work.display()),
    )
    .await
    .unwrap();
    let e = rdwr(&root, "session/s/agent/new", "name=x cwd=/var")
        .await
        .expect_err("agent cwd=/var accepted");
    assert!(e.contains("cwd /var is in a system tree"), "{e}");
    rdwr(&root, "session/s/agent/new", "name=x").await.unwrap();
    let e = rdwr(&root, "session/s/agent/x/ctl", "cwd /etc")
        .await
        .expect_err("ctl cwd /etc accepted");
    assert!(e.contains("is in a system tree"), "{e}");
    let e = ollie_testkit::client::write_text(&root, "session/s/agent/x/cfg", "cwd=/boot")
        .await
        .expect_err("cfg cwd=/boot accepted");
    assert!(e.contains("is in a system tree"), "{e}");
    let cfg = read(&root, "session/s/agent/x/cfg").await;
    let work_s = work.canonicalize().unwrap();
    assert!(
        cfg.contains(&format!("cwd={}\n", work_s.display())),
        "the refused changes changed the cwd: {cfg}"
    );
    let r = rdwr(
        &root,
        "session/s/agent/x/ctl",
        &format!("cwd {home_s} force"),
    )
    .await
    .unwrap();
    assert_eq!(r, format!("cwd {home_s}\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proc_on_a_process_that_does_not_exist_says_so() {
    let srv = Srv::start(REPLAY);
    let work = srv.dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let (_c, root) = attach(&srv, &me()).await;
    new_session(&root, &work, "name=a").await;
    for (cmd, want) in [
        ("proc kill 999", "no process 999 (proc lists them)"),
        ("proc term 999", "no process 999"),
        ("proc out 999", "no process 999"),
        ("proc dismiss 999", "no process 999"),
        ("proc kill abc", "\"abc\" is not a process number"),
    ] {
        let e = rdwr(&root, "session/s/agent/a/ctl", cmd)
            .await
            .expect_err("accepted");
        assert!(e.contains(want), "{cmd}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_failures_are_logged_at_warn_in_plain_text() {
    // A backend on a loopback port nothing listens on.
    let port = ollie_testkit::server::free_port();
    let config = format!(
        "default_backend = \"dead\"\n[backends.dead]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\nmodel = \"m\"\n"
    );
    let srv = Srv::start(&config);
    let work = srv.dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let (_c, root) = attach(&srv, &me()).await;
    new_session(&root, &work, "name=a").await;
    ollie_testkit::client::write_ok(&root, "session/s/agent/a/prompt", "hello").await;
    wait_for_text(
        &root,
        "session/s/agent/a/log",
        "[[[error",
        std::time::Duration::from_secs(60),
    )
    .await;
    let log = srv.stderr();
    let warn = log
        .lines()
        .find(|l| l.contains("model call failed"))
        .unwrap_or_else(|| panic!("no WARN line for the failed call: {log}"));
    assert!(warn.contains("WARN"), "{warn}");
    assert!(
        warn.contains("backend=dead") || warn.contains("backend=\"dead\""),
        "{warn}"
    );
    assert!(warn.to_lowercase().contains("connect"), "{warn}");
    // stderr is a file here: no colour codes anywhere.
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escapes in a log file: {log:?}"
    );
}

/// `lasterror`: the last error a write of one's own user got, with the file's path, over any
/// connection; another user (here `agent`) sees only its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lasterror_shows_the_last_error_of_ones_own_writes() {
    let srv = Srv::start(REPLAY);
    let work = srv.dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let (_c, root) = attach(&srv, &me()).await;
    assert_eq!(read(&root, "lasterror").await, "", "no error yet");
    new_session(&root, &work, "name=a").await;
    rdwr(&root, "ctl", "bogus")
        .await
        .expect_err("bogus accepted");
    let first = read(&root, "lasterror").await;
    assert!(first.contains(" ctl: unknown command \"bogus\""), "{first}");
    assert!(
        first.ends_with('\n') && first.lines().count() == 1,
        "{first:?}"
    );
    rdwr(&root, "session/s/agent/a/ctl", "proc kill 999")
        .await
        .expect_err("accepted");
    // From another connection of the same user: the newest error, with its full path.
    let (_c2, root2) = attach(&srv, &me()).await;
    let second = read(&root2, "lasterror").await;
    assert!(
        second.contains(" session/s/agent/a/ctl: no process 999"),
        "{second}"
    );
    // A successful write does not clear it; another user has its own.
    rdwr(&root, "session/s/agent/a/ctl", "name").await.unwrap();
    assert_eq!(read(&root, "lasterror").await, second);
    let (_c3, agent) = attach(&srv, "agent").await;
    assert_eq!(read(&agent, "lasterror").await, "");
    // Every sandboxed agent attaches as `agent`: their errors are not kept (one agent would
    // read another session's).
    ollie_testkit::client::write_text(&agent, "session/s/agent/a/ctl", "bogus")
        .await
        .expect_err("an agent wrote a ctl");
    assert_eq!(read(&agent, "lasterror").await, "");
}
