//! The seed's tables against the running server (tier 2): every command of the root `ctl`
//! (`invalidate`, `kill`), of a session's `ctl` (`kill save invalidate pause resume`) and of
//! the seed's "Agent ctl commands" table, each written and its reply read back on the same
//! fid (the /net/dns pattern, also through `ollie-9p rdwr` as the seed shows it), every bad
//! command a one-line error that changes nothing; `aliases` as `id<TAB>path` lines; `generate`
//! in its plain and its JSON form, with a replay script and with a stand-in model that
//! answers with the prompt it got; and what the seed's "wait for all agents" loop does with
//! an agent that is already idle. The real `olliesrv` (with its real `toolsrv` per session)
//! is started for each test with `replay` backends. The test that runs a tool needs the
//! sandbox's kernel features and prints `SKIP` without them.
// Scenario tests read top to bottom; splitting them would hide the story.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use ollie_p9::Fid;
use ollie_p9::wire::{Rmsg, om};
use ollie_testkit::client::{read_ok as read, write_ok as write};
use ollie_testkit::features_ok;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a read that must stay blocked is given to (wrongly) return. Only ever used where
/// the read returning would be the bug; passing never depends on the machine being fast.
const QUIET: Duration = Duration::from_millis(300);

/// How long a turn of a replay script may take (a failure guard, never a measurement).
const GUARD: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Helpers

/// A server whose default backend `demo` replays `turns` and whose backend `other` replays
/// `other`, with `extra` added to config.toml; the work directory for sessions.
fn server(turns: &[Value], other: &[Value], extra: &str) -> (Srv, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let lines = |t: &[Value]| t.iter().map(|v| format!("{v}\n")).collect::<String>();
    std::fs::write(dir.path().join("turns.jsonl"), lines(turns)).unwrap();
    std::fs::write(dir.path().join("other.jsonl"), lines(other)).unwrap();
    let config = replay_config(dir.path(), extra);
    let srv = Srv::start_with(dir, &config, |_| {});
    (srv, work)
}

/// The configuration of [`server`] for the scripts in `dir`.
fn replay_config(dir: &Path, extra: &str) -> String {
    format!(
        "default_backend = \"demo\"\n\n[backends.demo]\nkind = \"replay\"\nfile = \"{}\"\n\n[backends.other]\nkind = \"replay\"\nfile = \"{}\"\n{extra}",
        dir.join("turns.jsonl").display(),
        dir.join("other.jsonl").display()
    )
}

fn text_turn(t: &str) -> Value {
    json!({"text": t})
}

fn tool_turn(code: &str) -> Value {
    json!({"tool_calls": [{"name": "execute_code",
                           "arguments": {"language": "bash", "code": code}}]})
}

/// Opens `path` for reading and writing.
async fn open(root: &Fid, path: &str) -> Fid {
    let mut f = within("walk", root.walk_path(path))
        .await
        .unwrap_or_else(|e| panic!("walk {path}: {e}"));
    within("open", f.open(om::ORDWR))
        .await
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    f
}

/// Opens `path` for reading.
async fn open_read(root: &Fid, path: &str) -> Fid {
    let mut f = within("walk", root.walk_path(path))
        .await
        .unwrap_or_else(|e| panic!("walk {path}: {e}"));
    within("open", f.open(om::OREAD))
        .await
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    f
}

/// On the open fid `f`: writes `cmd` in one Twrite and reads the reply back on `f`; the
/// server's error as text, which must be one line.
async fn ask(f: &Fid, cmd: &str) -> Result<String, String> {
    within("write", f.write(0, Bytes::from(cmd.to_owned())))
        .await
        .map_err(|e| {
            let e = e.to_string();
            assert!(!e.contains('\n'), "{cmd:?}: error is not one line: {e:?}");
            e
        })?;
    let d = within("read reply", f.read_to_end()).await.unwrap();
    Ok(String::from_utf8(d).unwrap())
}

/// [`ask`] that must succeed.
async fn ok(f: &Fid, cmd: &str) -> String {
    ask(f, cmd).await.unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// [`ask`] that must fail; afterwards the fid has no reply to read (a failed command leaves
/// none, not the one before). Returns the error.
async fn refused(f: &Fid, cmd: &str) -> String {
    match ask(f, cmd).await {
        Ok(r) => panic!("{cmd:?}: expected an error, got {r:?}"),
        Err(e) => {
            let left = within("read after error", f.read_to_end()).await.unwrap();
            assert!(
                left.is_empty(),
                "{cmd:?}: a reply after the error: {left:?}"
            );
            e
        }
    }
}

/// `echo CMD | ollie-9p rdwr PATH`: its standard output, or its standard error (one line) and
/// exit status 1.
fn p9_rdwr(srv: &Srv, path: &str, cmd: &str) -> Result<String, String> {
    let o = ollie9p(&srv.addr(), &["rdwr", path], format!("{cmd}\n").as_bytes());
    if o.status.success() {
        return Ok(text(&o.stdout));
    }
    assert_eq!(o.status.code(), Some(1), "{path} {cmd:?}: {o:?}");
    let e = text(&o.stderr);
    assert_eq!(e.lines().count(), 1, "{path} {cmd:?}: not one line: {e:?}");
    assert!(o.stdout.is_empty(), "{path} {cmd:?}: output with the error");
    Err(e)
}

/// The first word of each line of a `help` reply.
fn verbs(help: &str) -> BTreeSet<String> {
    help.lines()
        .map(|l| l.split([' ', '\t']).next().unwrap().to_owned())
        .collect()
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// `agent/idx`'s state of agent `name` in session `s`.
async fn state_in_idx(root: &Fid, s: &str, name: &str) -> String {
    read(root, &format!("session/{s}/agent/idx"))
        .await
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f[0] == name).then(|| f[2].to_owned())
        })
        .unwrap_or_default()
}

/// Waits (bounded) until agent `name` of session `s` has ended `n` turns and is idle.
async fn wait_idle_after(root: &Fid, s: &str, name: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let stats = read(root, &format!("session/{s}/agent/{name}/stats")).await;
        let turns: u64 = kv_value(&stats, "turns").parse().unwrap();
        if turns >= n && state_in_idx(root, s, name).await == "idle" {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never ended turn {n}:\n{stats}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn new_session(root: &Fid, name: &str, work: &Path) {
    let r = ollie_testkit::client::rdwr_text(
        root,
        "session/new",
        &format!("name={name} cwd={}", work.display()),
    )
    .await
    .unwrap();
    assert_eq!(r, format!("{name}\n"));
}

/// Creates agent `name` in session `s`; returns its id.
async fn new_agent(root: &Fid, s: &str, name: &str) -> String {
    let r = ollie_testkit::client::rdwr_text(
        root,
        &format!("session/{s}/agent/new"),
        &format!("name={name}"),
    )
    .await
    .unwrap();
    r.trim_end().to_owned()
}

// ---------------------------------------------------------------------------------------------
// The root ctl: invalidate, kill

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_ctl_answers_each_seed_command_on_the_same_fid() {
    let (srv, _work) = server(&[text_turn("hi")], &[], "");
    let (_c, root) = attach(&srv, &me()).await;
    let f = open(&root, "ctl").await;
    assert_eq!(
        verbs(&ok(&f, "help").await),
        set(&["help", "invalidate", "kill"])
    );
    assert_eq!(
        ok(&f, "invalidate\n").await,
        "config reloaded: 2 backends\n"
    );
    // The reply stays on the fid until the next write replaces it.
    assert_eq!(
        &within("reread", f.read(0, 8192)).await.unwrap()[..],
        b"config reloaded: 2 backends\n"
    );

    // A third backend appears on invalidate; a broken file changes nothing.
    let good = std::fs::read_to_string(&srv.config).unwrap();
    std::fs::write(
        &srv.config,
        format!("{good}\n[backends.third]\nkind = \"replay\"\nfile = \"/nonexistent\"\n"),
    )
    .unwrap();
    assert_eq!(ok(&f, "invalidate").await, "config reloaded: 3 backends\n");
    std::fs::write(&srv.config, "[backends.x\n").unwrap();
    let e = refused(&f, "invalidate").await;
    assert!(e.contains("invalidate") && e.contains("line 1"), "{e}");
    assert_eq!(read(&root, "backends").await, "demo\nother\nthird\n");

    // Bad commands: one line, what was wrong and what is valid; nothing stops.
    let e = refused(&f, "reboot").await;
    assert!(
        e.contains(r#"unknown command "reboot""#) && e.contains("help, invalidate, kill"),
        "{e}"
    );
    let e = refused(&f, "kill now").await;
    assert!(e.contains("kill: takes no arguments"), "{e}");
    let e = refused(&f, "help\nkill").await;
    assert!(e.contains("one command per write"), "{e}");
    let e = refused(&f, "\n").await;
    assert!(e.contains("empty command"), "{e}");
    assert_eq!(read(&root, "backends").await, "demo\nother\nthird\n");

    // The seed's own form, through ollie-9p: help, then kill, whose reply is read back
    // before the server stops.
    let help = p9_rdwr(&srv, "ctl", "help").unwrap();
    assert_eq!(verbs(&help), set(&["help", "invalidate", "kill"]));
    let e = p9_rdwr(&srv, "ctl", "frobnicate").unwrap_err();
    assert!(e.contains("unknown command"), "{e}");
    let mut srv = srv;
    assert_eq!(p9_rdwr(&srv, "ctl", "kill").unwrap(), "stopping\n");
    assert!(srv.wait_exit().success(), "{}", srv.stderr());
}

// ---------------------------------------------------------------------------------------------
// A session's ctl: kill, save, invalidate, pause, resume

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_ctl_answers_each_seed_command_on_the_same_fid() {
    let (srv, work) = server(&[text_turn("hi")], &[], "");
    let (_c, root) = attach(&srv, &me()).await;
    new_session(&root, "s", &work).await;
    let sid = read(&root, "session/s/id").await.trim_end().to_owned();
    new_agent(&root, "s", "a").await;
    let f = open(&root, "session/s/ctl").await;
    let help = ok(&f, "help").await;
    let listed = verbs(&help);
    for v in ["kill", "save", "invalidate", "pause", "resume", "help"] {
        assert!(listed.contains(v), "{v}: {help}");
    }
    assert_eq!(ok(&f, "save").await, "saved\n");
    assert_eq!(ok(&f, "invalidate").await, "config reloaded\n");

    assert_eq!(ok(&f, "pause").await, "paused\n");
    assert_eq!(read(&root, "session/s/paused").await, "true\n");
    assert_eq!(ok(&f, "pause").await, "already paused\n");
    // Paused: a prompt waits.
    write(&root, "session/s/agent/a/prompt", "later").await;
    assert_eq!(state_in_idx(&root, "s", "a").await, "paused");
    assert_eq!(ok(&f, "resume").await, "resumed\n");
    assert_eq!(read(&root, "session/s/paused").await, "false\n");
    assert_eq!(ok(&f, "resume").await, "not paused\n");
    wait_idle_after(&root, "s", "a", 1).await;

    // Bad commands change nothing.
    let e = refused(&f, "pause now").await;
    assert!(e.contains("pause: takes no arguments"), "{e}");
    assert_eq!(read(&root, "session/s/paused").await, "false\n");
    let e = refused(&f, "suspend").await;
    assert!(
        e.contains(r#"unknown command "suspend""#)
            && e.contains("kill, save, invalidate, pause, resume"),
        "{e}"
    );
    let e = refused(&f, "kill\nkill").await;
    assert!(e.contains("one command per write"), "{e}");
    assert!(read(&root, "session/idx").await.starts_with("s\t"));

    // Through ollie-9p as the seed writes it.
    assert_eq!(p9_rdwr(&srv, "session/s/ctl", "pause").unwrap(), "paused\n");
    assert_eq!(
        p9_rdwr(&srv, "session/s/ctl", "resume").unwrap(),
        "resumed\n"
    );
    let e = p9_rdwr(&srv, "session/s/ctl", "bogus").unwrap_err();
    assert!(e.contains("unknown command"), "{e}");

    // kill: its reply is read on the same fid, after the session is gone.
    assert_eq!(ok(&f, "kill").await, "killed\n");
    assert_eq!(read(&root, "session/idx").await, "");
    assert!(root.walk_path("session/s").await.is_err());
    assert!(!read(&root, "aliases").await.contains(&sid));
}

// ---------------------------------------------------------------------------------------------
// An agent's ctl: the seed's table

/// The seed's "Agent ctl commands" table, by first word (`proc top` and `proc term|kill|out|
/// dismiss PID` are `proc`; `i` is inject's alias, named in its line).
const SEED_AGENT_VERBS: &[&str] = &[
    "stop",
    "compact",
    "clear",
    "kill",
    "inject",
    "agent",
    "model",
    "models",
    "backend",
    "name",
    "cwd",
    "tools",
    "tool_load",
    "tool_unload",
    "proc",
    "systemprompt",
    "help",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_ctl_answers_each_seed_command_on_the_same_fid() {
    let (srv, work) = server(
        &[text_turn("first answer"), text_turn("SUMMARY of it all")],
        &[],
        "",
    );
    let (_c, root) = attach(&srv, &me()).await;
    new_session(&root, "s", &work).await;
    let id = new_agent(&root, "s", "a").await;
    let a = "session/s/agent/a";
    let f = open(&root, &format!("{a}/ctl")).await;

    // help: the seed's commands, each on a line of its own.
    let help = ok(&f, "help").await;
    assert_eq!(verbs(&help), set(SEED_AGENT_VERBS), "{help}");
    assert!(help.contains("alias: i"), "{help}");
    assert!(help.lines().any(|l| l.starts_with("proc top\t")), "{help}");
    assert!(
        help.lines()
            .any(|l| l.starts_with("proc term|kill|out|dismiss PID\t")),
        "{help}"
    );

    // Shows.
    assert_eq!(ok(&f, "stop").await, "not running\n");
    assert_eq!(ok(&f, "agent").await, "default\n");
    assert_eq!(ok(&f, "model").await, "\n", "no model of its own");
    assert_eq!(ok(&f, "models").await, "replay\n");
    assert_eq!(ok(&f, "backend").await, "demo\treplay\n");
    assert_eq!(ok(&f, "name").await, "a\n");
    let cwd = format!("{}\n", work.display());
    assert_eq!(ok(&f, "cwd").await, cwd);
    let tools = ok(&f, "tools").await;
    let names: Vec<&str> = tools
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "execute_code",
            "execute_tool",
            "execute_pipe",
            "file_read",
            "file_write"
        ],
        "{tools}"
    );
    assert_eq!(ok(&f, "proc").await, "", "no processes yet");
    let top = ok(&f, "proc top").await;
    assert_eq!(
        top.split_whitespace().collect::<Vec<_>>(),
        ["PID", "STATE", "TOOL", "CMD"],
        "{top}"
    );
    let sp = ok(&f, "systemprompt").await;
    assert!(
        sp.ends_with(&format!("Working directory: {}\n", work.display())),
        "{sp}"
    );
    assert!(
        sp.contains(&format!(
            "you can write only in {} and $TMPDIR",
            work.display()
        )),
        "the sandbox section: {sp}"
    );

    // inject and its alias add to the context without a turn; inject's text may have lines.
    assert_eq!(ok(&f, "inject remember the fixtures").await, "injected\n");
    assert_eq!(ok(&f, "i and the docs").await, "injected\n");
    assert_eq!(
        ok(&f, "inject first line\nsecond line\n").await,
        "injected\n"
    );
    let log = read(&root, &format!("{a}/log")).await;
    assert!(
        log.contains("[[[user injected\nremember the fixtures\n]]]\n")
            && log.contains("[[[user injected\nand the docs\n]]]\n")
            && log.contains("[[[user injected\nfirst line\nsecond line\n]]]\n"),
        "{log}"
    );
    assert_eq!(
        kv_value(&read(&root, &format!("{a}/stats")).await, "turns"),
        "0"
    );

    // A turn, then compact summarizes the history with the backend (the script's second
    // turn), and clear forgets it.
    write(&root, &format!("{a}/prompt"), "first").await;
    wait_idle_after(&root, "s", "a", 1).await;
    let c = ok(&f, "compact").await;
    assert!(
        c.starts_with("compacted: ") && c.ends_with(" kept\n") && c.lines().count() == 1,
        "{c:?}"
    );
    assert_eq!(ok(&f, "clear").await, "cleared\n");
    let e = refused(&f, "compact").await;
    assert!(e.contains("nothing to compact"), "{e}");

    // Switches, each confirmed, each shown back.
    assert_eq!(ok(&f, "model m2").await, "model m2\n");
    assert_eq!(ok(&f, "model").await, "m2\n");
    assert_eq!(ok(&f, "agent default").await, "profile default\n");
    std::fs::create_dir(work.join("sub")).unwrap();
    let sub = work.join("sub");
    assert_eq!(
        ok(&f, &format!("cwd {}", sub.display())).await,
        format!("cwd {}\n", sub.display())
    );
    assert_eq!(ok(&f, "cwd").await, format!("{}\n", sub.display()));
    assert_eq!(
        ok(&f, "tool_unload file_write").await,
        "unloaded file_write\n"
    );
    assert!(!ok(&f, "tools").await.contains("file_write"));
    assert_eq!(ok(&f, "tool_load file_write").await, "loaded file_write\n");
    assert_eq!(ok(&f, "tools").await, tools);
    assert_eq!(ok(&f, "name b").await, "name b\n");
    assert_eq!(read(&root, "session/s/agent/b/id").await, format!("{id}\n"));
    assert_eq!(ok(&f, "name").await, "b\n", "the fid follows the rename");
    assert_eq!(ok(&f, "name a").await, "name a\n");

    // Bad commands: one line each, what was wrong and what is valid, and nothing changed.
    let e = refused(&f, "frobnicate").await;
    assert!(
        e.contains(r#"unknown command "frobnicate""#)
            && e.contains("stop, compact, clear, kill, inject, i, agent")
            && e.contains("systemprompt, help"),
        "{e}"
    );
    let e = refused(&f, "backend other").await;
    assert!(
        e.contains("backend: read-only") && e.contains("backend=NAME in cfg"),
        "{e}"
    );
    assert_eq!(ok(&f, "backend").await, "demo\treplay\n");
    let e = refused(&f, "agent nope").await;
    assert!(
        e.contains(r#"unknown profile "nope""#) && e.contains("default"),
        "{e}"
    );
    assert_eq!(ok(&f, "agent").await, "default\n");
    let e = refused(&f, "cwd /nonexistent/dir").await;
    assert!(e.contains("/nonexistent/dir"), "{e}");
    let e = refused(&f, "cwd /etc").await;
    assert!(e.contains("system tree"), "{e}");
    assert_eq!(ok(&f, "cwd").await, format!("{}\n", sub.display()));
    let e = refused(&f, "name bad/name").await;
    assert!(e.contains("invalid name"), "{e}");
    assert_eq!(ok(&f, "name").await, "a\n");
    let e = refused(&f, "model bad\u{7}model").await;
    assert!(e.contains("model: at most 200 printable characters"), "{e}");
    assert_eq!(ok(&f, "model").await, "m2\n");
    let e = refused(&f, "tool_load").await;
    assert!(
        e.contains("tool_load: give a tool name") && e.contains("file_read"),
        "{e}"
    );
    let e = refused(&f, "tool_unload hammer").await;
    assert!(e.contains(r#"unknown tool "hammer""#), "{e}");
    assert_eq!(ok(&f, "tools").await, tools);
    let e = refused(&f, "inject").await;
    assert!(e.contains("inject: give the text to add"), "{e}");
    let e = refused(&f, "i   \n").await;
    assert!(e.contains("inject: give the text to add"), "{e}");
    for (cmd, want) in [
        (
            "proc bogus",
            "proc: proc, proc top, proc term|kill|out|dismiss PID",
        ),
        ("proc top 1", "proc: proc, proc top"),
        ("proc term", "proc: proc, proc top"),
        ("proc kill x", r#"proc: "x" is not a process number"#),
        ("proc term 1", "no process 1 (proc lists them)"),
        ("proc kill 1", "no process 1"),
        ("proc out 1", "no process 1"),
        ("proc dismiss 1", "no process 1"),
        ("stop now", "stop: takes no arguments"),
        ("help me", "help: takes no arguments"),
        ("models all", "models: takes no arguments"),
        ("tools all", "tools: takes no arguments"),
        ("kill -9", "kill: takes no arguments"),
        ("stop\nclear", "one command per write"),
        ("", "empty command"),
    ] {
        let e = refused(&f, cmd).await;
        assert!(e.contains(want), "{cmd:?}: {e}");
    }
    assert!(read(&root, "session/s/agent/idx").await.starts_with("a\t"));

    // The seed's own form: `echo CMD | ollie-9p rdwr …/ctl`, the same answers.
    let ctl = format!("{a}/ctl");
    for cmd in [
        "help", "stop", "agent", "model", "models", "backend", "name", "cwd", "tools",
    ] {
        assert_eq!(
            p9_rdwr(&srv, &ctl, cmd).unwrap(),
            ok(&f, cmd).await,
            "{cmd}"
        );
    }
    assert_eq!(p9_rdwr(&srv, &ctl, "proc top").unwrap(), top);
    assert_eq!(p9_rdwr(&srv, &ctl, "i via ollie-9p").unwrap(), "injected\n");
    let e = p9_rdwr(&srv, &ctl, "frobnicate").unwrap_err();
    assert!(e.contains(r#"unknown command "frobnicate""#), "{e}");

    // kill: the reply is read back on the same fid, after the agent is gone.
    assert_eq!(ok(&f, "kill").await, "killed\n");
    assert_eq!(read(&root, "session/s/agent/idx").await, "");
    assert!(!read(&root, "aliases").await.contains(&id));
}

/// The `proc` commands and `stop` on real tool processes (a turn whose tools sleep).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_ctl_proc_commands_and_stop_act_on_running_tools() {
    let name = "agent_ctl_proc_commands_and_stop_act_on_running_tools";
    if !features_ok(name) {
        return;
    }
    let (srv, work) = server(
        &[
            tool_turn("echo started; sleep 1000"),
            tool_turn("sleep 1000"),
            tool_turn("sleep 1000"),
        ],
        &[],
        "",
    );
    let (_c, root) = attach(&srv, &me()).await;
    new_session(&root, "s", &work).await;
    new_agent(&root, "s", "a").await;
    let a = "session/s/agent/a";
    let f = open(&root, &format!("{a}/ctl")).await;
    write(&root, &format!("{a}/prompt"), "run the tools").await;

    // pid 1: shown, its output read, not dismissed while it runs, terminated, dismissed.
    wait_for_text(&root, &format!("{a}/proc/top"), "started", GUARD).await;
    wait_for_text(&root, &format!("{a}/proc/1/out"), "started", GUARD).await;
    assert_eq!(ok(&f, "proc").await, "1\trunning\texecute_code\n");
    let top = ok(&f, "proc top").await;
    assert!(
        top.lines()
            .nth(1)
            .is_some_and(|l| l.split_whitespace().collect::<Vec<_>>()
                == [
                    "1",
                    "running",
                    "execute_code",
                    "echo",
                    "started;",
                    "sleep",
                    "1000"
                ]),
        "{top}"
    );
    assert_eq!(ok(&f, "proc out 1").await, "started\n");
    let e = refused(&f, "proc dismiss 1").await;
    assert!(e.contains("still running"), "{e}");
    assert_eq!(ok(&f, "proc term 1").await, "term 1\n");
    wait_for_text(&root, &format!("{a}/proc/top"), "killed", GUARD).await;
    assert_eq!(ok(&f, "proc dismiss 1").await, "dismissed 1\n");
    let e = refused(&f, "proc out 1").await;
    assert!(e.contains("no process 1"), "{e}");

    // pid 2 (the script's next call): killed.
    wait_for_text(&root, &format!("{a}/proc/top"), "\n2 ", GUARD).await;
    wait_for_text(&root, &format!("{a}/proc/top"), "running", GUARD).await;
    assert_eq!(ok(&f, "proc kill 2").await, "kill 2\n");

    // pid 3: stop ends the turn and its tool.
    wait_for_text(&root, &format!("{a}/proc/top"), "\n3 ", GUARD).await;
    wait_for_text(&root, &format!("{a}/proc/top"), "running", GUARD).await;
    assert_eq!(ok(&f, "stop").await, "stopping\n");
    wait_for_text(&root, &format!("{a}/log"), "[[[error\nstopped\n]]]", GUARD).await;
    wait_for_text(&root, "session/s/agent/idx", "\tidle\n", GUARD).await;
    let deadline = tokio::time::Instant::now() + GUARD;
    while read(&root, &format!("{a}/proc/top"))
        .await
        .contains("running")
    {
        assert!(tokio::time::Instant::now() < deadline, "pid 3 never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ok(&f, "stop").await, "not running\n");
    assert_eq!(
        ok(&f, "proc").await,
        "2\tkilled\texecute_code\n3\tkilled\texecute_code\n"
    );
}

// ---------------------------------------------------------------------------------------------
// aliases

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliases_are_id_tab_path_lines_that_follow_renames_and_kills() {
    let (srv, work) = server(&[], &[], "");
    let (_c, root) = attach(&srv, &me()).await;
    assert_eq!(read(&root, "aliases").await, "", "no sessions, no lines");
    new_session(&root, "one", &work).await;
    new_session(&root, "two", &work).await;
    let a = new_agent(&root, "one", "a").await;
    let b = new_agent(&root, "one", "b").await;
    let c = new_agent(&root, "two", "c").await;
    let one = read(&root, "session/one/id").await.trim_end().to_owned();
    let two = read(&root, "session/two/id").await.trim_end().to_owned();

    let pairs = |t: &str| -> BTreeSet<(String, String)> {
        assert!(t.is_empty() || t.ends_with('\n'), "{t:?}");
        t.lines()
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                assert_eq!(f.len(), 2, "not id<TAB>path: {l:?}");
                (f[0].to_owned(), f[1].to_owned())
            })
            .collect()
    };
    let want = |v: &[(&str, &str)]| -> BTreeSet<(String, String)> {
        v.iter()
            .map(|(i, p)| ((*i).to_owned(), (*p).to_owned()))
            .collect()
    };
    let t = read(&root, "aliases").await;
    assert_eq!(
        pairs(&t),
        want(&[
            (&one, "/session/one"),
            (&a, "/session/one/agent/a"),
            (&b, "/session/one/agent/b"),
            (&two, "/session/two"),
            (&c, "/session/two/agent/c"),
        ]),
        "{t}"
    );
    // Each path leads to the thing with that id, and so does the id itself.
    for (id, path) in pairs(&t) {
        assert_eq!(read(&root, &format!("{path}/id")).await, format!("{id}\n"));
        let by_id = if path.contains("/agent/") {
            let s = path.split('/').nth(2).unwrap();
            format!("session/{s}/agent/{id}/id")
        } else {
            format!("session/{id}/id")
        };
        assert_eq!(read(&root, &by_id).await, format!("{id}\n"), "{by_id}");
    }
    // The same through ollie-9p.
    let o = ollie9p(&srv.addr(), &["read", "aliases"], b"");
    assert!(o.status.success(), "{o:?}");
    assert_eq!(text(&o.stdout), t);

    // A rename changes the paths under it; a kill removes its lines.
    ollie_testkit::client::write_text(&root, "session/one/name", "uno")
        .await
        .unwrap();
    let g = open(&root, "session/uno/agent/b/ctl").await;
    assert_eq!(ok(&g, "name bee").await, "name bee\n");
    let h = open(&root, "session/two/ctl").await;
    assert_eq!(ok(&h, "kill").await, "killed\n");
    let t = read(&root, "aliases").await;
    assert_eq!(
        pairs(&t),
        want(&[
            (&one, "/session/uno"),
            (&a, "/session/uno/agent/a"),
            (&b, "/session/uno/agent/bee"),
        ]),
        "{t}"
    );
    // Read-only.
    let e = ollie_testkit::client::write_text(&root, "aliases", "x\t/y\n")
        .await
        .unwrap_err();
    assert!(e.contains("permission denied"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// generate

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_takes_the_plain_and_the_json_form_from_a_replay_script() {
    let (srv, _work) = server(
        &[text_turn("a summary of the repo")],
        &[text_turn("recursion is a function calling itself")],
        "",
    );
    // The seed's two lines, as written.
    let r = ollie9p(&srv.addr(), &["rdwr", "generate"], b"summarize this repo\n");
    assert!(r.status.success(), "{r:?}");
    assert_eq!(text(&r.stdout), "a summary of the repo\n");
    let r = ollie9p(
        &srv.addr(),
        &["rdwr", "generate"],
        b"{\"prompt\":\"explain recursion\"}\n",
    );
    assert!(r.status.success(), "{r:?}");
    assert_eq!(
        text(&r.stdout),
        "a summary of the repo\n",
        "the default backend"
    );
    // The JSON form may name the backend.
    let r = p9_rdwr(
        &srv,
        "generate",
        r#"{"prompt": "explain recursion", "backend": "other"}"#,
    );
    assert_eq!(r.unwrap(), "recursion is a function calling itself\n");

    // Bad input: one line, said in the error, and no reply on the fid.
    let (_c, root) = attach(&srv, &me()).await;
    let f = open(&root, "generate").await;
    for (input, want) in [
        (
            "{\"prompt\":\"x\",\"colour\":1}",
            "unknown field `colour`, expected `prompt` or `backend`",
        ),
        ("{\"prompt\":1}", "invalid type"),
        ("{\"prompt\":\"x\"", "JSON form"),
        (
            "{summarize this}",
            "a write beginning with { is the JSON form",
        ),
        ("{}", "missing field `prompt`"),
        ("{\"prompt\":\"\"}", "empty prompt"),
        ("{\"prompt\":\"x\"} trailing", "trailing characters"),
        ("{\"a\\nb\":1}", "unknown field `a\\nb`"),
        ("\n", "empty prompt"),
        (
            "{\"prompt\":\"x\",\"backend\":\"nope\"}",
            r#"unknown backend "nope""#,
        ),
    ] {
        let e = refused(&f, input).await;
        assert!(
            e.contains("generate") || e.contains("backend"),
            "{input:?}: {e}"
        );
        assert!(e.contains(want), "{input:?}: {e}");
    }
    let e = p9_rdwr(&srv, "generate", r#"{"prompt":"x","colour":1}"#).unwrap_err();
    assert!(e.contains("colour"), "{e}");
    // And the fid still works afterwards.
    assert_eq!(ok(&f, "again").await, "a summary of the repo\n");
}

/// A stand-in for Ollama's `/api/chat` that answers `you said: PROMPT` (the last message's
/// content, as olliesrv sent it). Every reply is one NDJSON line; the connection closes.
async fn echo_model() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let (head, body) = loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + len {
                        break (head, buf[end + 4..end + 4 + len].to_vec());
                    }
                };
                let reply = if head.starts_with("POST /api/chat ") {
                    let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let said = req["messages"]
                        .as_array()
                        .and_then(|m| m.last())
                        .and_then(|m| m["content"].as_str())
                        .unwrap_or("")
                        .to_owned();
                    let line = json!({"model": "m", "done": true, "done_reason": "stop",
                        "prompt_eval_count": 1, "eval_count": 1,
                        "message": {"role": "assistant", "content": format!("you said: {said:?}")}});
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n{line}\n"
                    )
                } else {
                    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_owned()
                };
                let _ = s.write_all(reply.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_sends_the_model_the_prompt_of_either_form() {
    let url = echo_model().await;
    let (srv, _work) = server(
        &[],
        &[],
        &format!("\n[backends.echo]\nkind = \"ollama\"\nbase_url = \"{url}\"\nmodel = \"m\"\n"),
    );
    // The plain form: the text without the line end echo added.
    assert_eq!(
        p9_rdwr(
            &srv,
            "generate",
            "{\"prompt\":\"explain recursion\",\"backend\":\"echo\"}"
        )
        .unwrap(),
        "you said: \"explain recursion\"\n"
    );
    // The plain form goes to the default backend: make it the echo.
    std::fs::write(
        &srv.config,
        format!(
            "default_backend = \"echo\"\n[backends.echo]\nkind = \"ollama\"\nbase_url = \"{url}\"\nmodel = \"m\"\n"
        ),
    )
    .unwrap();
    assert_eq!(
        p9_rdwr(&srv, "ctl", "invalidate").unwrap(),
        "config reloaded: 1 backends\n"
    );
    assert_eq!(
        p9_rdwr(&srv, "generate", "summarize this repo").unwrap(),
        "you said: \"summarize this repo\"\n"
    );
    assert_eq!(
        p9_rdwr(&srv, "generate", "{\"prompt\":\"line one\\nline two\"}").unwrap(),
        "you said: \"line one\\nline two\"\n"
    );
    // Two lines of plain text are one prompt.
    let (_c, root) = attach(&srv, &me()).await;
    let f = open(&root, "generate").await;
    assert_eq!(
        ok(&f, "first line\nsecond line\n").await,
        "you said: \"first line\\nsecond line\"\n"
    );
}

// ---------------------------------------------------------------------------------------------
// The seed's "Wait for all agents to finish" loop

/// `for s in session/*/agent/*/statewait; do cat "$s" > /dev/null; done`: each `cat` opens
/// statewait (its baseline: the state then) and returns at that agent's next change. So an
/// agent that is already idle holds the loop until its next turn starts; the loop only goes
/// on when one comes. The rule every other reader relies on stays: a fid opened before a
/// prompt returns once that turn has started (the README's fan-out), and a fresh open on an
/// idle agent never returns at once (the seed's observer loop, which opens anew each time,
/// would spin otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_wait_loop_holds_at_an_idle_agent_until_its_next_change() {
    let (srv, work) = server(&[text_turn("done"), text_turn("done again")], &[], "");
    let (_c, root) = attach(&srv, &me()).await;
    new_session(&root, "s", &work).await;
    new_agent(&root, "s", "a").await;
    new_agent(&root, "s", "b").await;
    // a has finished a turn already: it is idle, as is b, which never ran.
    write(&root, "session/s/agent/a/prompt", "work").await;
    wait_idle_after(&root, "s", "a", 1).await;

    // The loop's first cat: a is idle, so it blocks.
    let sa = open_read(&root, "session/s/agent/a/statewait").await;
    let mut cat_a = sa.read_call(0, 64).unwrap();
    assert!(
        tokio::time::timeout(QUIET, &mut cat_a).await.is_err(),
        "cat of an idle agent's statewait returned without a change"
    );
    // Nothing but a's next change lets it go: a prompt to b does not.
    write(&root, "session/s/agent/b/prompt", "work").await;
    wait_idle_after(&root, "s", "b", 1).await;
    assert!(
        tokio::time::timeout(QUIET, &mut cat_a).await.is_err(),
        "cat of a's statewait returned at b's change"
    );
    write(&root, "session/s/agent/a/prompt", "more").await;
    let got = match within("a's next change", cat_a).await {
        Ok(Rmsg::Read { data }) => String::from_utf8(data.to_vec()).unwrap(),
        other => panic!("{other:?}"),
    };
    assert!(["thinking\n", "idle\n"].contains(&got.as_str()), "{got:?}");
    // cat then sees end of file and the loop goes on to b, idle now too: blocked again.
    assert!(
        within("eof", sa.read(got.len() as u64, 64))
            .await
            .unwrap()
            .is_empty()
    );
    let sb = open_read(&root, "session/s/agent/b/statewait").await;
    let mut cat_b = sb.read_call(0, 64).unwrap();
    assert!(
        tokio::time::timeout(QUIET, &mut cat_b).await.is_err(),
        "cat of b's statewait (b finished) returned without a change"
    );
    // Here the loop would wait for ever; a kill is a change too, and ends it.
    let g = open(&root, "session/s/agent/b/ctl").await;
    assert_eq!(ok(&g, "kill").await, "killed\n");
    match within("b killed", cat_b).await {
        Ok(Rmsg::Read { data }) => assert_eq!(&data[..], b"killed\n"),
        other => panic!("{other:?}"),
    }

    // What the help and the README say instead: look at the state first (agent/idx), and
    // block in statewait only while it is not idle — for a, idle by now, that returns at once.
    wait_idle_after(&root, "s", "a", 2).await;
    let help = read(&root, "help").await;
    let line = help
        .lines()
        .find(|l| l.contains("session/NAME/agent/NAME/statewait"))
        .unwrap();
    assert!(
        line.contains("already idle waits for its next turn to start")
            && line.contains("agent/idx"),
        "{line}"
    );
    let readme = include_str!("../../README.md");
    assert!(
        readme.contains("for s in session/*/agent/*/statewait; do cat \"$s\" > /dev/null; done"),
        "README.md no longer explains the seed's loop"
    );
}
