//! An approval covers everything that runs (issue 48, item 2): from the moment an escalation is
//! requested until its approved run has ended, nothing else the session runs can change what
//! that run reads or executes.
//!
//! The attack, for every way of running a file that the binding does not pin (command position
//! behind a keyword, a wrapper, a redirection, an interpreter's module or environment file, a
//! makefile): an agent's background call waits for a signal from the test and then replaces
//! the files the approved command will run with code that writes `evil`; the test makes the
//! request, gives the signal after the request is shown, approves, and checks that only the
//! reviewed code ran with the grant. Then it checks that the background call was alive all
//! along: once the approved run has ended it does swap the files. The same for a call started
//! while the request waits (it starts only after the approved run), and for an approved run that
//! is itself running when another request comes (it is frozen too).
//!
//! Without Landlock ABI 7 or user namespaces a case prints `SKIP <case>: <reason>`; with
//! `OLLIE_TEST_REQUIRE=all` it fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::IO_TIMEOUT;
use common::broker::*;
// The broker case, not the toolsrv payload case of the same name.
use common::broker::Case;
use common::toolsrv::*;
use serde_json::json;

/// The forms the outside attack found unbound, each a command that runs `run.sh` (or
/// `run.py`, `lib.sh`, `Makefile`) of the workspace.
const FORMS: &[&str] = &[
    "timeout 60 ./run.sh",
    "if true; then ./run.sh; fi",
    "{ ./run.sh; }",
    "! ./run.sh",
    "while ./run.sh; do break; done",
    "nice -n 5 ./run.sh",
    "env LC_ALL=C ./run.sh",
    "echo x | xargs ./run.sh",
    "find . -maxdepth 0 -exec ./run.sh \\;",
    "command ./run.sh",
    "eval ./run.sh",
    "2>/dev/null ./run.sh",
    "bash < ./run.sh",
    "exec 3<./run.sh; sh <&3",
    "bash -o pipefail run.sh",
    "python3 -m run",
    "python3 -uc \"exec(open('run.py').read())\"",
    "BASH_ENV=./lib.sh bash -c true",
    "make -s -f Makefile",
    "make -s --file=Makefile",
];

/// Writes the honest files (each appends `honest` to `out`) and the evil ones beside them
/// (each appends `evil`), and removes the markers of an earlier round.
fn lay_out(ws: &Path, out: &Path) {
    let o = out.display();
    for (name, honest, evil) in [
        (
            "run.sh",
            format!("#!/bin/sh\necho honest >> {o}\n"),
            format!("#!/bin/sh\necho evil >> {o}\n"),
        ),
        (
            "lib.sh",
            format!("echo honest >> {o}\n"),
            format!("echo evil >> {o}\n"),
        ),
        (
            "run.py",
            format!("open('{o}', 'a').write('honest\\n')\n"),
            format!("open('{o}', 'a').write('evil\\n')\n"),
        ),
        (
            "Makefile",
            format!("all:\n\techo honest >> {o}\n"),
            format!("all:\n\techo evil >> {o}\n"),
        ),
    ] {
        script(&ws.join(name), &honest);
        script(&ws.join(format!("evil-{name}")), &evil);
    }
    for f in ["go", "swapped", "up"] {
        let _ = std::fs::remove_file(ws.join(f));
    }
    let _ = std::fs::remove_file(out);
}

/// The agent's swapper: waits for `go`, then renames every evil file over its honest one.
const SWAPPER: &str = "echo up > up; while [ ! -e go ]; do sleep 0.01; done; \
    for f in run.sh lib.sh run.py Makefile; do mv evil-$f $f; done; echo swapped > swapped";

/// `held=` of the agent's call `pid`, if its `stat` says.
async fn held(c: &Case, pid: u32) -> Option<String> {
    let s = read(&c.a, &format!("proc/{pid}/stat")).await.ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("held="))
        .map(str::to_owned)
}

/// Waits (bounded) until `cond` holds.
async fn until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + IO_TIMEOUT;
    while !cond().await {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_swapped_by_the_session_after_the_request_never_run_with_the_grant() {
    let case = "files_swapped_by_the_session_after_the_request_never_run_with_the_grant";
    let Some(c) = Case::start(case).await else {
        return;
    };
    let ws = c.t.ws().to_path_buf();
    let out = c.out("out");
    let grant = c.grant();
    let mut failures = Vec::new();
    for form in FORMS {
        lay_out(&ws, &out);
        let swapper = run_bg(&c.a, &code("bash", SWAPPER))
            .await
            .expect("start the swapper");
        // It runs (its loop polls for `go`).
        until("the swapper runs", async || ws.join("up").exists()).await;
        let call = start_call(&c.a, &esc(form, &[&grant])).await;
        let v = Pending::open(&c.op).await.next().await;
        if v["held"] != 1 {
            failures.push(format!(
                "{form}: the request does not say the swapper is held: {v}"
            ));
        }
        // The request is shown: now the swapper is told to swap. Either it does (the attack
        // is on: approving would run its code) or it is frozen and cannot.
        std::fs::write(ws.join("go"), "").unwrap();
        until("the swapper swaps or is frozen", async || {
            ws.join("swapped").exists() || held(&c, swapper).await.as_deref() == Some("frozen")
        })
        .await;
        resolve(&c.op, &approve(v["id"].as_str().unwrap()))
            .await
            .expect("approve");
        let r = call.finish().await;
        let wrote = std::fs::read_to_string(&out).unwrap_or_default();
        if wrote.contains("evil") {
            failures.push(format!(
                "{form}: the swapped code ran with the grant ({r:?})"
            ));
        } else if wrote != "honest\n" {
            failures.push(format!(
                "{form}: the approved run did not run the reviewed code once: wrote {wrote:?}, {r:?}"
            ));
        }
        // The swapper was alive all along: once the approved run is over it goes on and swaps.
        until("the swapper swaps after the run", async || {
            ws.join("swapped").exists()
        })
        .await;
        let status = read(&c.a, &format!("proc/{swapper}/wait")).await;
        assert_eq!(status.as_deref().map(str::trim), Ok("0"), "{form}: swapper");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_started_while_a_request_waits_runs_only_after_the_approved_run() {
    let case = "a_call_started_while_a_request_waits_runs_only_after_the_approved_run";
    let Some(c) = Case::start(case).await else {
        return;
    };
    let ws = c.t.ws().to_path_buf();
    let out = c.out("out");
    lay_out(&ws, &out);
    let call = start_call(&c.a, &esc("./run.sh", &[&c.grant()])).await;
    let v = Pending::open(&c.op).await.next().await;
    // A call started now waits: it would have replaced run.sh.
    let late = run_bg(
        &c.a,
        &code("bash", "mv evil-run.sh run.sh; echo late > late"),
    )
    .await
    .expect("start the late call");
    until("the late call is held", async || {
        held(&c, late).await.as_deref() == Some("waiting")
    })
    .await;
    assert!(
        !ws.join("late").exists(),
        "the late call ran before the approval"
    );
    resolve(&c.op, &approve(v["id"].as_str().unwrap()))
        .await
        .expect("approve");
    let r = call.finish().await.expect("the approved run");
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "honest\n");
    let status = read(&c.a, &format!("proc/{late}/wait")).await;
    assert_eq!(status.as_deref().map(str::trim), Ok("0"));
    assert_eq!(std::fs::read_to_string(ws.join("late")).unwrap(), "late\n");

    // A denial lets it go too.
    lay_out(&ws, &out);
    let call = start_call(&c.a, &esc("./run.sh", &[&c.grant()])).await;
    let v = Pending::open(&c.op).await.next().await;
    let late = run_bg(&c.a, &code("bash", "echo later > later"))
        .await
        .expect("start the late call");
    until("the late call is held", async || {
        held(&c, late).await.as_deref() == Some("waiting")
    })
    .await;
    resolve(&c.op, &deny(v["id"].as_str().unwrap(), "no"))
        .await
        .expect("deny");
    assert!(call.finish().await.is_err());
    let status = read(&c.a, &format!("proc/{late}/wait")).await;
    assert_eq!(status.as_deref().map(str::trim), Ok("0"));
    assert!(ws.join("later").exists());
    assert!(!out.exists(), "the denied run ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_run_is_frozen_by_the_next_request() {
    let case = "an_approved_run_is_frozen_by_the_next_request";
    let Some(c) = Case::start(case).await else {
        return;
    };
    let ws = c.t.ws().to_path_buf();
    let out = c.out("out");
    lay_out(&ws, &out);
    let grant = c.grant();
    // A: approved, runs in the background until `go` appears, then swaps run.sh.
    let first = run_bg(&c.a, &esc(SWAPPER, &[&grant])).await.expect("A");
    let v = Pending::open(&c.op).await.next().await;
    resolve(&c.op, &approve(v["id"].as_str().unwrap()))
        .await
        .expect("approve A");
    until("A runs", async || ws.join("up").exists()).await;
    // B: runs run.sh; A is frozen before B is shown.
    let call = start_call(&c.a, &esc("./run.sh", &[&grant])).await;
    let vb = Pending::open(&c.op).await.next().await;
    assert_ne!(vb["id"], v["id"]);
    std::fs::write(ws.join("go"), "").unwrap();
    until("A swaps or is frozen", async || {
        ws.join("swapped").exists() || held(&c, first).await.as_deref() == Some("frozen")
    })
    .await;
    resolve(&c.op, &approve(vb["id"].as_str().unwrap()))
        .await
        .expect("approve B");
    let r = call.finish().await;
    assert_eq!(
        std::fs::read_to_string(&out).unwrap_or_default(),
        "honest\n",
        "A changed what B's approval ran: {r:?}"
    );
    until("A goes on and swaps", async || ws.join("swapped").exists()).await;
    let status = read(&c.a, &format!("proc/{first}/wait")).await;
    assert_eq!(status.as_deref().map(str::trim), Ok("0"));
}

/// A real olliesrv with sessions `s1` and `s2` in `work` and `s3` in `other`, agents `a`
/// (asks to run `timeout 60 ./run.sh` writing `outside/out`), `b` (starts [`SWAPPER`] in the
/// background) and `c` (a background ticker writing `other/ticks`), each on its own replay
/// script; the files laid out. The server, `work`, `other` and `outside/out`.
async fn three_sessions(
    case: &str,
) -> Option<(
    common::Srv,
    std::path::PathBuf,
    std::path::PathBuf,
    std::path::PathBuf,
)> {
    if !features_ok(case) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (work, other, outside) = (
        dir.path().join("work"),
        dir.path().join("other"),
        dir.path().join("outside"),
    );
    for d in [&work, &other, &outside] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let out = outside.join("out");
    lay_out(&work, &out);
    let call = |code: &str, extra: serde_json::Value| {
        let mut args = json!({"language": "bash", "code": code});
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"tool_calls": [{"name": "execute_code", "arguments": args}]}).to_string()
    };
    let done = r#"{"text": "done"}"#;
    let grant = format!("write:{}", outside.display());
    let scripts = [
        (
            "asker",
            call(
                "timeout 60 ./run.sh",
                json!({"escalate": {"grants": [grant], "reason": "r"}}),
            ),
        ),
        ("swapper", call(SWAPPER, json!({"background": true}))),
        (
            "ticker",
            call(
                "while :; do echo t >> ticks; sleep 0.01; done",
                json!({"background": true}),
            ),
        ),
    ];
    let mut config = "default_backend = \"asker\"\n".to_owned();
    for (name, turn) in &scripts {
        let f = dir.path().join(format!("{name}.jsonl"));
        std::fs::write(&f, format!("{turn}\n{done}\n")).unwrap();
        config.push_str(&format!(
            "\n[backends.{name}]\nkind = \"replay\"\nfile = \"{}\"\n",
            f.display()
        ));
    }
    std::fs::create_dir(dir.path().join("agents")).unwrap();
    std::fs::write(
        dir.path().join("agents").join("asker.toml"),
        "escalations = [\"write\"]\n",
    )
    .unwrap();
    let srv = common::Srv::start_with(dir, &config, |_| {});
    let (_client, root) = common::attach(&srv, &common::me()).await;
    for (s, cwd, agent) in [
        ("s1", &work, "name=a profile=asker backend=asker"),
        ("s2", &work, "name=b backend=swapper"),
        ("s3", &other, "name=c backend=ticker"),
    ] {
        rdwr(
            &root,
            "session/new",
            &format!("name={s} cwd={}", cwd.display()),
        )
        .await
        .expect("session/new");
        rdwr(&root, &format!("session/{s}/agent/new"), agent)
            .await
            .unwrap_or_else(|e| panic!("{s}: agent/new: {e}"));
    }
    Some((srv, work, other, out))
}

/// Through a real olliesrv: sessions `s1` and `s2` work in the same tree, `s3` in another.
/// `s1`'s agent asks to run `./run.sh` with a grant; `s2`'s agent started a background call
/// that swaps `run.sh` once the request is shown. olliesrv holds `s2` before the request is
/// shown, so only the reviewed code runs; `s3`'s background call, which cannot write the
/// tree, keeps running; and `s2`'s call goes on once the approved run has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_sessions_in_the_same_tree_are_held_too() {
    let case = "other_sessions_in_the_same_tree_are_held_too";
    let Some((srv, work, other, out)) = three_sessions(case).await else {
        return;
    };
    let (_client, root) = common::attach(&srv, &common::me()).await;
    // The one process of session `s` (its agent's background call).
    let only_pid = async |s: &str| -> u32 {
        let list = read(&root, &format!("session/{s}/toolsrv/proc/list"))
            .await
            .unwrap();
        let first = list
            .lines()
            .next()
            .unwrap_or_else(|| panic!("{s}: no process"));
        first.split('\t').next().unwrap().parse().unwrap()
    };
    let stat_held = async |s: &str, pid: u32| -> Option<String> {
        let st = read(&root, &format!("session/{s}/toolsrv/proc/{pid}/stat"))
            .await
            .ok()?;
        st.lines()
            .find_map(|l| l.strip_prefix("held="))
            .map(str::to_owned)
    };
    write(&root, "session/s2/agent/b/prompt", "start")
        .await
        .expect("prompt b");
    until("s2's swapper runs", async || work.join("up").exists()).await;
    write(&root, "session/s3/agent/c/prompt", "start")
        .await
        .expect("prompt c");
    until("s3's ticker runs", async || other.join("ticks").exists()).await;
    let (swapper, ticker) = (only_pid("s2").await, only_pid("s3").await);

    write(&root, "session/s1/agent/a/prompt", "go")
        .await
        .expect("prompt a");
    let v = Pending::open(&root).await.next().await;
    assert_eq!(v["session_name"], "s1", "{v}");
    std::fs::write(work.join("go"), "").unwrap();
    until("s2's swapper swaps or is frozen", async || {
        work.join("swapped").exists() || stat_held("s2", swapper).await.as_deref() == Some("frozen")
    })
    .await;
    // s3 cannot write the tree: it is not held, and goes on.
    assert_eq!(stat_held("s3", ticker).await.as_deref(), Some("no"));
    let ticks = std::fs::metadata(other.join("ticks")).unwrap().len();
    until("s3's ticker goes on while the request waits", async || {
        std::fs::metadata(other.join("ticks")).unwrap().len() > ticks
    })
    .await;
    resolve(&root, &approve(v["id"].as_str().unwrap()))
        .await
        .expect("approve");
    common::wait_for_text(
        &root,
        "session/s1/agent/a/log",
        "[[[assistant\ndone",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(&out).unwrap_or_default(),
        "honest\n",
        "another session changed what the approval ran"
    );
    until("s2's swapper goes on after the run", async || {
        work.join("swapped").exists()
    })
    .await;
    // The audit log has the hold and its release.
    let audit = read(&root, "bypass/audit").await.unwrap();
    assert!(audit.contains("\"event\":\"hold\""), "{audit}");
    assert!(audit.contains("\"event\":\"release\""), "{audit}");
}
