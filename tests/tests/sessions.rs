//! Cross-process suite for sessions and agents: the real `olliesrv` (which starts a real
//! `toolsrv` per session) driven through our 9P client. Covers `session/new`, the session
//! and agent files, blocking reads and their flushes, `eventwait`, `generate`, the session's
//! toolsrv view, toolsrv and olliesrv crashes, persistence across restarts, corrupt state and
//! the authenticated TCP listener.
// Scenario tests read top to bottom; splitting them would hide the story.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use nix::sys::signal::Signal;
use ollie_p9::dial::Addr;
use ollie_p9::wire::{Rmsg, Stat, dm, om};
use ollie_p9::{Client, ClientError, Fid};
use serde_json::Value;

/// How long a read that must stay blocked is given to (wrongly) return. Only ever used where
/// the read returning would be the bug; its passing never depends on the machine being fast.
const QUIET: Duration = Duration::from_millis(300);

/// The one-line error every turn ends with while olliesrv cannot call a model.
const NO_BACKEND: &str = "no backend: start Ollama";

// ---------------------------------------------------------------------------------------------
// Helpers

fn msg(e: &ClientError) -> String {
    e.to_string()
}

async fn try_open(root: &Fid, path: &str, mode: u8) -> Result<Fid, String> {
    let mut f = within("walk", root.walk_path(path))
        .await
        .map_err(|e| msg(&e))?;
    within("open", f.open(mode)).await.map_err(|e| msg(&e))?;
    Ok(f)
}

async fn open(root: &Fid, path: &str, mode: u8) -> Fid {
    try_open(root, path, mode)
        .await
        .unwrap_or_else(|e| panic!("open {path}: {e}"))
}

/// All of a file that never blocks.
async fn read_all(root: &Fid, path: &str) -> String {
    let f = open(root, path, om::OREAD).await;
    let d = within("read", f.read_to_end())
        .await
        .unwrap_or_else(|e| panic!("read {path}: {e}"));
    String::from_utf8(d).expect("utf-8")
}

/// One Twrite on `f`; the server's error as a string.
async fn put(f: &Fid, data: &str) -> Result<u32, String> {
    within("write", f.write(0, Bytes::from(data.to_owned())))
        .await
        .map_err(|e| msg(&e))
}

/// Everything a request/response fid has for its reader now.
async fn reply(f: &Fid) -> Result<String, String> {
    let d = within("read reply", f.read_to_end())
        .await
        .map_err(|e| msg(&e))?;
    Ok(String::from_utf8(d).expect("utf-8"))
}

/// Opens `path` ORDWR, writes `data`, reads the reply on the same fid.
async fn rdwr(root: &Fid, path: &str, data: &str) -> Result<String, String> {
    let f = open(root, path, om::ORDWR).await;
    put(&f, data).await?;
    reply(&f).await
}

/// Opens `path` OWRITE (with OTRUNC, as `echo data > path` does), writes `data` and clunks
/// (a prompt is queued at the clunk, whose error is returned).
async fn write(root: &Fid, path: &str, data: &str) -> Result<(), String> {
    let f = try_open(root, path, om::OWRITE | om::OTRUNC).await?;
    put(&f, data).await?;
    within("clunk", f.clunk()).await.map_err(|e| msg(&e))
}

fn expect_err(r: Result<impl std::fmt::Debug, String>, what: &str) -> String {
    match r {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => {
            assert!(!e.contains('\n'), "{what}: error is not one line: {e:?}");
            e
        }
    }
}

/// Creates a session; returns its name (what `session/new` replies).
async fn new_session(root: &Fid, spec: &str) -> String {
    let r = rdwr(root, "session/new", spec)
        .await
        .unwrap_or_else(|e| panic!("session/new {spec}: {e}"));
    assert!(r.ends_with('\n'), "{r:?}");
    r.trim_end().to_owned()
}

/// Creates an agent in session `s`; returns its id.
async fn new_agent(root: &Fid, s: &str, spec: &str) -> String {
    let r = rdwr(root, &format!("session/{s}/agent/new"), spec)
        .await
        .unwrap_or_else(|e| panic!("agent/new {spec}: {e}"));
    let id = r.trim_end().to_owned();
    assert!(is_uuid(&id), "agent/new replied {r:?}");
    id
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            14 => b == b'4',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

async fn id_of(root: &Fid, path: &str) -> String {
    let id = read_all(root, &format!("{path}/id")).await;
    assert!(id.ends_with('\n'), "{id:?}");
    let id = id.trim_end().to_owned();
    assert!(is_uuid(&id), "{path}/id is {id:?}");
    id
}

/// Polls `check` every [`STEP`]·2 until it holds; fails after [`IO_TIMEOUT`].
async fn poll_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + IO_TIMEOUT;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {IO_TIMEOUT:?}"
        );
        tokio::time::sleep(STEP * 2).await;
    }
}

/// `session/idx` as fields.
async fn idx(root: &Fid) -> Vec<Vec<String>> {
    read_all(root, "session/idx")
        .await
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

async fn session_names(root: &Fid) -> Vec<String> {
    idx(root).await.into_iter().map(|l| l[0].clone()).collect()
}

/// Waits until session `name`'s toolsrv is up (`session/idx`).
async fn wait_toolsrv_up(root: &Fid, name: &str) {
    poll_until(&format!("toolsrv of {name} up"), || async move {
        idx(root)
            .await
            .iter()
            .any(|l| l[0] == name && l.get(3).is_some_and(|s| s == "up"))
    })
    .await;
}

/// `key=value` lines as pairs.
fn kv(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not key=value: {l:?} in {text:?}"));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

fn get<'a>(pairs: &'a [(String, String)], key: &str) -> &'a str {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key} in {pairs:?}"))
}

/// Waits until the agent at `path` has finished `n` turns (`stats`).
async fn wait_turns(root: &Fid, path: &str, n: u64) {
    let stats = format!("{path}/stats");
    let stats = stats.as_str();
    poll_until(&format!("{n} turns of {path}"), || async move {
        get(&kv(&read_all(root, stats).await), "turns")
            .parse::<u64>()
            .unwrap()
            >= n
    })
    .await;
}

/// All of a streaming file as it is now: reads up to its stat length (never at the end, so
/// never blocks).
async fn snapshot(root: &Fid, path: &str) -> String {
    let f = open(root, path, om::OREAD).await;
    let len = within("stat", f.stat()).await.expect("stat").length;
    let mut got = Vec::new();
    while (got.len() as u64) < len {
        let d = within("read", f.read(got.len() as u64, 65536))
            .await
            .expect("read");
        assert!(!d.is_empty(), "{path}: EOF before its stat length {len}");
        got.extend_from_slice(&d);
    }
    String::from_utf8(got).expect("utf-8")
}

/// Reads the stream `f` from `from` until what was read contains `needle` (each read bounded).
async fn stream_until(f: &Fid, from: u64, needle: &str) -> String {
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains(needle) {
        let d = within(needle, f.read(from + got.len() as u64, 65536))
            .await
            .expect("read");
        assert!(
            !d.is_empty(),
            "EOF before {needle:?}; got {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&d);
    }
    String::from_utf8(got).expect("utf-8")
}

/// The data of a read reply.
fn data(r: Result<Rmsg, ClientError>) -> Bytes {
    match r {
        Ok(Rmsg::Read { data }) => data,
        other => panic!("expected Rread, got {other:?}"),
    }
}

fn json(line: &[u8]) -> Value {
    let s = std::str::from_utf8(line).expect("utf-8 event");
    assert!(
        s.ends_with('\n') && s.matches('\n').count() == 1,
        "event is not one line: {s:?}"
    );
    serde_json::from_str(s.trim_end()).unwrap_or_else(|e| panic!("bad JSON {s:?}: {e}"))
}

/// An `eventwait` fid and every event it has returned.
struct Events {
    fid: Fid,
    log: Vec<Value>,
}

impl Events {
    async fn open(root: &Fid) -> Events {
        Events {
            fid: open(root, "eventwait", om::OREAD).await,
            log: Vec::new(),
        }
    }

    /// The next event (bounded).
    async fn next(&mut self) -> Value {
        let d = within("eventwait", self.fid.read(0, 65536))
            .await
            .expect("eventwait read");
        assert!(!d.is_empty(), "eventwait ended; so far {:?}", self.log);
        let v = json(&d);
        self.log.push(v.clone());
        v
    }

    /// Reads events until one satisfies `pred` (the others stay in the log).
    async fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        loop {
            let v = self.next().await;
            if pred(&v) {
                return v;
            }
        }
    }

    /// Until an event of `kind` with `field` = `value`.
    async fn until_kind(&mut self, kind: &str, field: &str, value: &str) -> Value {
        self.until(|v| v["event"] == kind && v[field] == value)
            .await
    }

    fn count(&self, pred: impl Fn(&Value) -> bool) -> usize {
        self.log.iter().filter(|v| pred(v)).count()
    }
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped).
fn pid_gone(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => {
            let state = s.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
            matches!(state, Some('Z' | 'X'))
        }
    }
}

async fn wait_pid_gone(pid: u64) {
    poll_until(&format!("pid {pid} ends"), || async move { pid_gone(pid) }).await;
}

/// A session created with `eventwait` watching: its name, id and toolsrv pid.
async fn session_with_toolsrv(root: &Fid, ev: &mut Events, spec: &str) -> (String, String, u64) {
    let name = new_session(root, spec).await;
    let id = id_of(root, &format!("session/{name}")).await;
    let started = ev.until_kind("toolsrv-started", "session", &id).await;
    let pid = started["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("toolsrv-started without a pid: {started}"));
    (name, id, pid)
}

fn cmdline(pid: u64) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

fn strip_markers(raw: &str) -> String {
    raw.split_inclusive('\n')
        .filter(|l| {
            let bare = l.trim_end_matches('\n');
            !(bare.starts_with("[[[") || bare == "]]]")
        })
        .collect()
}

fn names(entries: &[Stat]) -> BTreeSet<String> {
    entries.iter().map(|s| s.name.clone()).collect()
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

async fn ls(root: &Fid, path: &str) -> Vec<Stat> {
    let d = open(root, path, om::OREAD).await;
    within("read dir", d.read_dir()).await.expect("read dir")
}

// ---------------------------------------------------------------------------------------------
// session/new

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_new_replies_are_per_fid() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let a = open(&root, "session/new", om::ORDWR).await;
    let b = open(&root, "session/new", om::ORDWR).await;
    let idle = open(&root, "session/new", om::ORDWR).await;
    put(&a, "name=first cwd=/tmp").await.expect("write a");
    put(&b, "name=second cwd=/tmp").await.expect("write b");
    assert_eq!(reply(&a).await.unwrap(), "first\n");
    assert_eq!(reply(&b).await.unwrap(), "second\n");
    assert_eq!(reply(&idle).await.unwrap(), "", "a fid that wrote nothing");
    // The reply stays on the fid: read again from 0.
    assert_eq!(
        &within("reread", a.read(0, 100)).await.unwrap()[..],
        b"first\n"
    );
    assert_eq!(session_names(&root).await, ["first", "second"]);
    // Without a name, the cwd's last element names it, made unique.
    assert_eq!(new_session(&root, "cwd=/tmp").await, "tmp");
    assert_eq!(new_session(&root, "cwd=/tmp").await, "tmp2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_new_errors_name_the_problem_and_change_nothing() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let f = open(&root, "session/new", om::ORDWR).await;
    put(&f, "name=dup cwd=/tmp").await.expect("first dup");
    assert_eq!(reply(&f).await.unwrap(), "dup\n");
    let before_idx = session_names(&root).await;
    let before_aliases = read_all(&root, "aliases").await;
    let before_ls = names(&ls(&root, "session").await);
    let cases: &[(&str, &[&str])] = &[
        (
            "colour=red",
            &[r#"unknown key "colour" (valid: name, cwd, backend, model, profile, remote, force)"#],
        ),
        ("name=x prompt=hi", &[r#"unknown key "prompt""#]),
        ("junk", &[r#""junk" is not key=value (valid: name,"#]),
        ("name=new cwd=/tmp", &[r#"invalid name "new""#]),
        ("name=a/b cwd=/tmp", &[r#"invalid name "a/b""#]),
        ("name=.hidden cwd=/tmp", &["invalid name"]),
        ("name=dup cwd=/tmp", &["file already exists", r#""dup""#]),
        (
            "name=x cwd=/nonexistent/dir",
            &[r#"cwd "/nonexistent/dir""#],
        ),
        ("name=x cwd=relative", &["must be an absolute path"]),
        (
            "name=x cwd=/tmp backend=zeta",
            &[r#"unknown backend "zeta" (configured: alpha, beta)"#],
        ),
        (
            "name=x cwd=/tmp profile=nope",
            &[r#"unknown profile "nope" (available: "#, "default"],
        ),
        (
            "name=x cwd=/tmp remote=far",
            &[r#"unknown remote "far" (configured: none)"#],
        ),
        ("name=x name=y", &["twice"]),
    ];
    for (spec, want) in cases {
        let e = expect_err(put(&f, spec).await, spec);
        for w in *want {
            assert!(e.contains(w), "{spec}: {e:?} lacks {w:?}");
        }
        assert_eq!(
            reply(&f).await.unwrap(),
            "",
            "{spec}: a failed write leaves no reply (not even the earlier one)"
        );
    }
    assert_eq!(session_names(&root).await, before_idx, "idx unchanged");
    assert_eq!(read_all(&root, "aliases").await, before_aliases);
    assert_eq!(names(&ls(&root, "session").await), before_ls);
    assert_eq!(before_idx, ["dup"]);
    // The fid still works.
    put(&f, "name=ok cwd=/tmp")
        .await
        .expect("good write after errors");
    assert_eq!(reply(&f).await.unwrap(), "ok\n");
}

// ---------------------------------------------------------------------------------------------
// Session files

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_env_shows_ollie_vars_but_no_secrets() {
    let srv = Srv::start_with(tempfile::tempdir().unwrap(), CONFIG, |c| {
        c.env("OLLIE_API_KEY", "sekrit")
            .env("OLLIE_FOO", "bar")
            .env("OLLIE_AUTH_TOKEN", "sekrit-token")
            .env("OLLIE_CLIENT_SECRET", "sekrit-secret")
            .env("NOT_OLLIE", "elsewhere");
    });
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=envy cwd=/tmp").await;
    let id = id_of(&root, &format!("session/{s}")).await;
    let env = read_all(&root, &format!("session/{s}/env")).await;
    let pairs = kv(&env);
    assert_eq!(get(&pairs, "OLLIE_SESSION_ID"), id, "{env}");
    assert_eq!(get(&pairs, "OLLIE_FOO"), "bar", "{env}");
    assert!(!env.contains("sekrit"), "a secret leaked into env:\n{env}");
    assert!(!env.contains("elsewhere"), "only OLLIE_* variables:\n{env}");
    for (k, _) in &pairs {
        let up = k.to_ascii_uppercase();
        for bad in ["KEY", "TOKEN", "SECRET"] {
            assert!(!up.contains(bad), "{k} shown in env:\n{env}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_ctl_pause_resume_and_per_fid_replies() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=p cwd=/tmp").await;
    let ctl = format!("session/{s}/ctl");
    let paused = format!("session/{s}/paused");
    assert_eq!(read_all(&root, &paused).await, "false\n");

    let a = open(&root, &ctl, om::ORDWR).await;
    let b = open(&root, &ctl, om::ORDWR).await;
    put(&a, "pause\n").await.expect("pause");
    put(&b, "help\n").await.expect("help");
    assert_eq!(reply(&a).await.unwrap(), "paused\n");
    let help = reply(&b).await.unwrap();
    let cmds: BTreeSet<String> = help
        .lines()
        .map(|l| l.split('\t').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        cmds,
        set(&[
            "kill",
            "save",
            "invalidate",
            "pause",
            "resume",
            "status",
            "cost",
            "cost_cap",
            "help"
        ]),
        "{help}"
    );
    // A local session: no remote; the link's state.
    let status = rdwr(&root, &ctl, "status").await.unwrap();
    assert!(status.starts_with("remote=\ntoolsrv="), "{status}");
    assert_eq!(read_all(&root, &paused).await, "true\n");
    assert_eq!(idx(&root).await[0][4], "true", "idx shows paused");
    assert_eq!(
        rdwr(&root, &ctl, "pause").await.unwrap(),
        "already paused\n"
    );
    assert_eq!(rdwr(&root, &ctl, "resume").await.unwrap(), "resumed\n");
    assert_eq!(read_all(&root, &paused).await, "false\n");
    assert_eq!(idx(&root).await[0][4], "false");
    assert_eq!(rdwr(&root, &ctl, "resume").await.unwrap(), "not paused\n");
    assert_eq!(rdwr(&root, &ctl, "save").await.unwrap(), "saved\n");
    assert_eq!(
        rdwr(&root, &ctl, "invalidate").await.unwrap(),
        "config reloaded\n"
    );

    let e = expect_err(put(&a, "frobnicate").await, "unknown command");
    assert!(
        e.contains(
            r#"unknown command "frobnicate" (valid: kill, save, invalidate, pause, resume, status, cost, cost_cap, help)"#
        ),
        "{e}"
    );
    assert_eq!(
        reply(&a).await.unwrap(),
        "",
        "a failed write leaves no reply"
    );
    let e = expect_err(put(&a, "pause now").await, "extra argument");
    assert!(e.contains("takes no arguments"), "{e}");
    let e = expect_err(put(&a, "pause\nresume\n").await, "two commands");
    assert!(e.contains("one command per write"), "{e}");
    assert_eq!(read_all(&root, &paused).await, "false\n", "nothing ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_immutable() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=fixed cwd=/tmp").await;
    let aid = new_agent(&root, &s, "name=x").await;
    let sid = id_of(&root, &format!("session/{s}")).await;
    assert_eq!(id_of(&root, &format!("session/{s}/agent/x")).await, aid);
    for path in [format!("session/{s}/id"), format!("session/{s}/agent/x/id")] {
        for mode in [om::OWRITE, om::ORDWR, om::OWRITE | om::OTRUNC] {
            let e = expect_err(try_open(&root, &path, mode).await, &path);
            assert!(e.contains("permission denied"), "{path}: {e}");
        }
        let f = within("walk", root.walk_path(&path)).await.unwrap();
        let mut trunc = Stat::dont_touch();
        trunc.length = 0;
        let e = within("wstat", f.wstat(&trunc))
            .await
            .expect_err("truncated id");
        assert!(msg(&e).contains("permission denied"), "{e}");
    }
    // Sessions and agents are reachable by id as well as by name.
    assert_eq!(
        read_all(&root, &format!("session/{sid}/name")).await,
        "fixed\n"
    );
    assert_eq!(
        read_all(&root, &format!("session/{sid}/agent/{aid}/name")).await,
        "x\n"
    );
    assert_eq!(id_of(&root, &format!("session/{s}")).await, sid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renames_keep_open_fids_valid() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=A cwd=/tmp").await;
    let sid = id_of(&root, "session/A").await;
    let aid = new_agent(&root, &s, "name=X").await;
    let ctl = open(&root, "session/A/ctl", om::ORDWR).await;
    let actl = open(&root, "session/A/agent/X/ctl", om::ORDWR).await;
    let chat = open(&root, "session/A/agent/X/chat", om::OREAD).await;
    put(&actl, "inject before the rename")
        .await
        .expect("inject");
    let before = stream_until(&chat, 0, "before the rename").await;

    write(&root, "session/A/name", "B\n")
        .await
        .expect("rename A to B");

    // The old fids still work.
    put(&ctl, "help").await.expect("old session ctl fid");
    assert!(reply(&ctl).await.unwrap().contains("pause"));
    put(&actl, "inject after the rename")
        .await
        .expect("old agent ctl fid");
    let after = stream_until(&chat, before.len() as u64, "after the rename").await;
    assert!(after.contains("after the rename"), "{after}");
    // The old name is gone, the new one works.
    let e = within("walk", root.walk_path("session/A"))
        .await
        .expect_err("session/A still walks");
    assert!(msg(&e).contains("does not exist"), "{e}");
    assert_eq!(read_all(&root, "session/B/name").await, "B\n");
    assert_eq!(id_of(&root, "session/B").await, sid);
    assert_eq!(id_of(&root, "session/B/agent/X").await, aid);
    assert_eq!(session_names(&root).await, ["B"]);
    let env = read_all(&root, "session/B/env").await;
    assert!(env.contains("OLLIE_SESSION_NAME=B\n"), "{env}");
    let aliases = read_all(&root, "aliases").await;
    assert!(
        aliases.contains(&format!("{sid}\t/session/B\n")),
        "{aliases}"
    );
    assert!(
        aliases.contains(&format!("{aid}\t/session/B/agent/X\n")),
        "{aliases}"
    );
    assert!(!aliases.contains("/session/A"), "{aliases}");

    // Agents rename the same way.
    write(&root, "session/B/agent/X/name", "Y")
        .await
        .expect("rename X");
    assert!(
        within("walk", root.walk_path("session/B/agent/X"))
            .await
            .is_err()
    );
    assert_eq!(id_of(&root, "session/B/agent/Y").await, aid);
    put(&actl, "name")
        .await
        .expect("old agent fid after its rename");
    assert_eq!(reply(&actl).await.unwrap(), "Y\n");
    assert!(
        read_all(&root, "aliases")
            .await
            .contains(&format!("{aid}\t/session/B/agent/Y\n"))
    );

    // Renames to a taken or invalid name are refused and change nothing.
    new_session(&root, "name=C cwd=/tmp").await;
    let e = expect_err(write(&root, "session/B/name", "C").await, "taken");
    assert!(e.contains("file already exists"), "{e}");
    let e = expect_err(write(&root, "session/B/name", "idx").await, "reserved");
    assert!(e.contains("invalid name"), "{e}");
    new_agent(&root, "B", "name=Z").await;
    let e = expect_err(write(&root, "session/B/agent/Y/name", "Z").await, "taken");
    assert!(e.contains("file already exists"), "{e}");
    assert_eq!(session_names(&root).await, ["B", "C"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idx_lines() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let one = new_session(&root, "name=one cwd=/tmp").await;
    let two = new_session(&root, "name=two cwd=/tmp").await;
    let a = new_agent(&root, &one, "name=a").await;
    let b = new_agent(&root, &one, "name=b").await;
    wait_toolsrv_up(&root, &one).await;
    wait_toolsrv_up(&root, &two).await;
    let id1 = id_of(&root, "session/one").await;
    let id2 = id_of(&root, "session/two").await;
    assert_eq!(
        idx(&root).await,
        [
            ["one", id1.as_str(), "2", "up", "false"],
            ["two", id2.as_str(), "0", "up", "false"]
        ]
    );
    assert_eq!(
        read_all(&root, "session/one/agent/idx").await,
        format!("a\t{a}\tidle\nb\t{b}\tidle\n")
    );
    assert_eq!(read_all(&root, "session/two/agent/idx").await, "");
    rdwr(&root, "session/one/ctl", "pause").await.unwrap();
    assert_eq!(
        read_all(&root, "session/one/agent/idx").await,
        format!("a\t{a}\tpaused\nb\t{b}\tpaused\n")
    );
    let l = &idx(&root).await[0];
    assert_eq!((l[0].as_str(), l[4].as_str()), ("one", "true"));
}

// ---------------------------------------------------------------------------------------------
// Agents

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_new_ids_names_and_errors() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    let other = new_session(&root, "name=t cwd=/tmp").await;
    // Per-fid replies.
    let f = open(&root, "session/s/agent/new", om::ORDWR).await;
    let g = open(&root, "session/s/agent/new", om::ORDWR).await;
    put(&f, "name=p").await.unwrap();
    // Not the server's directory itself: that holds its state and configuration, and a cwd
    // containing them is refused.
    let qdir = srv.dir.path().join("work");
    std::fs::create_dir_all(&qdir).unwrap();
    let qdir = qdir.canonicalize().unwrap();
    put(&g, &format!("name=q cwd={}", qdir.display()))
        .await
        .unwrap();
    let p = reply(&f).await.unwrap();
    let q = reply(&g).await.unwrap();
    assert!(is_uuid(p.trim_end()) && p.ends_with('\n'), "{p:?}");
    assert_ne!(p, q);
    assert_eq!(id_of(&root, "session/s/agent/p").await, p.trim_end());
    assert_eq!(id_of(&root, "session/s/agent/q").await, q.trim_end());
    let cfg = kv(&read_all(&root, "session/s/agent/q/cfg").await);
    assert_eq!(get(&cfg, "cwd"), qdir.to_str().unwrap());
    assert_eq!(
        get(&kv(&read_all(&root, "session/s/agent/p/cfg").await), "cwd"),
        "/tmp",
        "an agent inherits the session's cwd"
    );

    // Names are unique per session, not across sessions.
    let e = expect_err(put(&f, "name=p").await, "duplicate");
    assert!(
        e.contains(r#"file already exists: session s has an agent named "p""#),
        "{e}"
    );
    assert_eq!(
        reply(&f).await.unwrap(),
        "",
        "no reply after a failed write"
    );
    new_agent(&root, &other, "name=p").await;
    // Without a name: a1, a2, …
    new_agent(&root, &s, "").await;
    assert!(
        within("walk", root.walk_path("session/s/agent/a1"))
            .await
            .is_ok()
    );

    let cases: &[(&str, &str)] = &[
        (
            "colour=red",
            r#"unknown key "colour" (valid: name, cwd, backend, model, profile, prompt, force)"#,
        ),
        ("name=r remote=x", r#"unknown key "remote""#),
        ("name=r cwd=/nonexistent", r#"cwd "/nonexistent""#),
        ("name=idx", r#"invalid name "idx""#),
        ("name=r backend=zeta", r#"unknown backend "zeta""#),
        ("name=r profile=nope", r#"unknown profile "nope""#),
    ];
    let before = read_all(&root, "session/s/agent/idx").await;
    for (spec, want) in cases {
        let e = expect_err(put(&f, spec).await, spec);
        assert!(e.contains(want), "{spec}: {e}");
    }
    assert_eq!(read_all(&root, "session/s/agent/idx").await, before);
    assert_eq!(
        names(&ls(&root, "session/s/agent").await),
        set(&["new", "idx", "p", "q", "a1"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_new_with_prompt_returns_the_turns_error() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    let f = open(&root, &format!("session/{s}/agent/new"), om::ORDWR).await;
    put(&f, "name=w prompt=first line\\nsecond line")
        .await
        .expect("agent/new with prompt");
    let e = within("read", f.read(0, 4096))
        .await
        .expect_err("the turn's error is the read's Rerror");
    assert!(msg(&e).contains(NO_BACKEND), "{e}");
    // It names where Ollama was looked for ($OLLAMA_HOST, which the test sets) and the
    // configuration file to add a backend to.
    assert!(
        msg(&e).contains("start Ollama on http://127.0.0.1:9 (OLLAMA_HOST)"),
        "{e}"
    );
    assert!(
        msg(&e).contains("config.toml and set default_backend"),
        "{e}"
    );
    // The read waited for the end of the turn: the chat already has its error (log never
    // blocks).
    let log = read_all(&root, "session/s/agent/w/log").await;
    assert!(
        log.contains("[[[user\nfirst line\nsecond line\n]]]\n"),
        "the prompt (with \\n as a newline) is in the chat: {log}"
    );
    assert!(log.contains(&format!("[[[error\n{NO_BACKEND}")), "{log}");
    let stats = kv(&read_all(&root, "session/s/agent/w/stats").await);
    assert_eq!(get(&stats, "turns"), "1");
    assert_eq!(get(&stats, "errors"), "1");
    // An empty prompt is refused before anything is created.
    let e = expect_err(put(&f, "name=v prompt=").await, "empty prompt");
    assert!(e.contains("empty prompt"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_then_chat_and_chat_raw() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    new_agent(&root, &s, "name=a").await;
    let a = "session/s/agent/a";
    let chat = open(&root, &format!("{a}/chat"), om::OREAD).await;
    write(&root, &format!("{a}/prompt"), "hello world\n")
        .await
        .expect("prompt");
    // A reader at 0 streams the turn as it happens.
    let streamed = stream_until(&chat, 0, NO_BACKEND).await;
    assert!(streamed.starts_with("hello world\n"), "{streamed}");
    wait_turns(&root, a, 1).await;

    let raw = snapshot(&root, &format!("{a}/chat.raw")).await;
    let lines: Vec<&str> = raw.lines().collect();
    assert_eq!(lines[..3], ["[[[user", "hello world", "]]]"], "{raw}");
    assert_eq!(lines[3], "[[[error", "{raw}");
    assert!(lines[4].contains(NO_BACKEND), "{raw}");
    assert_eq!(lines[5], "]]]", "{raw}");
    assert_eq!(lines.len(), 6, "{raw}");
    let text = snapshot(&root, &format!("{a}/chat")).await;
    assert_eq!(
        text,
        strip_markers(&raw),
        "chat is chat.raw without markers"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("[[[") || l == "]]]"),
        "{text}"
    );
    // stat lengths are the true lengths.
    let st = within("stat", root.walk_path(&format!("{a}/chat.raw")))
        .await
        .unwrap()
        .stat()
        .await
        .unwrap();
    assert_eq!(st.length, raw.len() as u64);
    // An empty prompt is an error.
    let e = expect_err(write(&root, &format!("{a}/prompt"), "  \n").await, "empty");
    assert!(e.contains("empty prompt"), "{e}");
    // prompt is write-only.
    let e = expect_err(
        try_open(&root, &format!("{a}/prompt"), om::OREAD).await,
        "read",
    );
    assert!(e.contains("permission denied"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_to_two_readers_at_once() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    new_agent(&root, &s, "name=a").await;
    let a = "session/s/agent/a";
    write(&root, &format!("{a}/prompt"), "one").await.unwrap();
    wait_turns(&root, a, 1).await;
    let end = snapshot(&root, &format!("{a}/chat.raw")).await.len() as u64;
    let r1 = open(&root, &format!("{a}/chat.raw"), om::OREAD).await;
    let (_c2, root2) = attach(&srv, &me()).await;
    let r2 = open(&root2, &format!("{a}/chat.raw"), om::OREAD).await;
    let mut c1 = r1.read_call(end, 65536).unwrap();
    let mut c2 = r2.read_call(end, 65536).unwrap();
    // Both wait at the end of the stream.
    assert!(
        tokio::time::timeout(QUIET, &mut c1).await.is_err(),
        "a read at the end of chat.raw returned without new output"
    );
    write(&root, &format!("{a}/prompt"), "two").await.unwrap();
    let d1 = data(within("reader 1", c1).await);
    let d2 = data(within("reader 2", &mut c2).await);
    assert!(d1.starts_with(b"[[[user\ntwo\n"), "{d1:?}");
    assert!(d2.starts_with(b"[[[user\ntwo\n"), "{d2:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_is_a_snapshot_of_at_most_64k() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    new_agent(&root, &s, "name=a").await;
    let a = "session/s/agent/a";
    assert_eq!(
        read_all(&root, &format!("{a}/log")).await,
        "",
        "an empty log reads as empty at once"
    );
    let ctl = open(&root, &format!("{a}/ctl"), om::ORDWR).await;
    for i in 0..6 {
        let line = format!("inject {i}:{}", "x".repeat(16 * 1024));
        put(&ctl, &line).await.expect("inject");
    }
    let raw = snapshot(&root, &format!("{a}/chat.raw")).await;
    assert!(raw.len() > 64 * 1024, "{}", raw.len());
    let log = read_all(&root, &format!("{a}/log")).await;
    assert!(!log.is_empty());
    assert!(log.len() <= 64 * 1024, "log is {} bytes", log.len());
    assert!(raw.ends_with(&log), "log is the tail of chat.raw");
    assert_eq!(
        raw.as_bytes()[raw.len() - log.len() - 1],
        b'\n',
        "log starts at a line"
    );
    assert!(log.ends_with("]]]\n"));
}

/// olliesrv keeps only the end of a chat in memory and reads older bytes back from
/// `chat.raw`: a chat of several hundred KiB (with body lines that look like markers) reads
/// back whole, in reads of any size, equal to the file on disk, before and after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_chat_reads_back_whole_before_and_after_a_restart() {
    let mut srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    new_agent(&root, &s, "name=a").await;
    let a = "session/s/agent/a";
    let (sid, aid) = (id_of(&root, "session/s").await, id_of(&root, a).await);
    let on_disk = srv
        .state_dir()
        .join("sessions")
        .join(&sid)
        .join("agents")
        .join(&aid)
        .join("chat.raw");
    for i in 0..48 {
        // One line of 12 KiB, then lines that look like markers.
        let prompt = format!("{i}:{}\n]]]\n[[[x {i}\ntail\n", "y".repeat(12 * 1024));
        write(&root, &format!("{a}/prompt"), &prompt)
            .await
            .expect("prompt");
    }
    wait_turns(&root, a, 48).await;
    check_long_chat(&root, a, &on_disk, "running").await;
    srv.kill9();
    srv.relaunch(|_| {});
    let (_c, root) = attach(&srv, &me()).await;
    check_long_chat(&root, a, &on_disk, "restarted").await;
    // And it goes on: a reader waiting at the end gets the next block.
    let end = snapshot(&root, &format!("{a}/chat.raw")).await.len() as u64;
    let r = open(&root, &format!("{a}/chat.raw"), om::OREAD).await;
    let wait = r.read_call(end, 65536).unwrap();
    rdwr(&root, &format!("{a}/ctl"), "inject after")
        .await
        .unwrap();
    let d = data(within("reader", wait).await);
    assert!(d.starts_with(b"[[[user injected\nafter\n"), "{d:?}");
    check_long_chat(&root, a, &on_disk, "appended").await;
}

/// The checks of [`a_long_chat_reads_back_whole_before_and_after_a_restart`].
async fn check_long_chat(root: &Fid, a: &str, on_disk: &std::path::Path, label: &str) {
    let disk = String::from_utf8(std::fs::read(on_disk).unwrap()).unwrap();
    assert!(disk.len() > 512 * 1024, "{label}: {}", disk.len());
    let raw = snapshot(root, &format!("{a}/chat.raw")).await;
    assert!(
        raw == disk,
        "{label}: chat.raw over 9P differs from the file"
    );
    let text = snapshot(root, &format!("{a}/chat")).await;
    assert!(
        text == strip_markers(&raw),
        "{label}: chat is not chat.raw without markers"
    );
    assert!(text.contains("\n ]]]\n [[[x 47\ntail\n"), "{label}");
    // Small reads from the start, through the part no longer in memory.
    let f = open(root, &format!("{a}/chat"), om::OREAD).await;
    let mut got = Vec::new();
    while got.len() < 200 * 1024 {
        let d = within("read", f.read(got.len() as u64, 777)).await.unwrap();
        assert!(!d.is_empty() && d.len() <= 777, "{label}");
        got.extend_from_slice(&d);
    }
    assert!(
        text.as_bytes().starts_with(&got),
        "{label}: small reads differ"
    );
    let log = read_all(root, &format!("{a}/log")).await;
    assert!(
        !log.is_empty() && raw.ends_with(&log),
        "{label}: log is the tail"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_write_read_and_truncate() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    new_agent(&root, &s, "name=a").await;
    let plan = "session/s/agent/a/plan";
    assert_eq!(read_all(&root, plan).await, "");
    let w = open(&root, plan, om::OWRITE).await;
    put(&w, "step 1\n").await.unwrap();
    within("write at 7", w.write(7, Bytes::from_static(b"step 2\n")))
        .await
        .unwrap();
    assert_eq!(read_all(&root, plan).await, "step 1\nstep 2\n");
    let st = within("stat", w.stat()).await.unwrap();
    assert_eq!(st.length, 14, "stat length is the plan's length");
    // Overwrite in place.
    within("write at 5", w.write(5, Bytes::from_static(b"9")))
        .await
        .unwrap();
    assert_eq!(read_all(&root, plan).await, "step 9\nstep 2\n");
    // OTRUNC empties it.
    let t = open(&root, plan, om::OWRITE | om::OTRUNC).await;
    assert_eq!(read_all(&root, plan).await, "", "truncated on open");
    put(&t, "fresh\n").await.unwrap();
    assert_eq!(read_all(&root, plan).await, "fresh\n");
    // So does the truncating Twstat 9pfuse sends.
    let f = within("walk", root.walk_path(plan)).await.unwrap();
    let mut trunc = Stat::dont_touch();
    trunc.length = 0;
    within("wstat", f.wstat(&trunc)).await.expect("truncate");
    assert_eq!(read_all(&root, plan).await, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cfg_reads_writes_and_refuses_bad_values() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    let id = new_agent(&root, &s, "name=a").await;
    let cfg = "session/s/agent/a/cfg";
    let c0 = kv(&read_all(&root, cfg).await);
    let keys: Vec<&str> = c0.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "name",
            "id",
            "cwd",
            "backend",
            "model",
            "profile",
            "temperature",
            "max_tokens",
            "top_p",
            "max_steps",
            "context_limit",
            "feed",
            "feed_prompt"
        ]
    );
    assert_eq!(get(&c0, "feed"), "turn");
    assert_eq!(get(&c0, "name"), "a");
    assert_eq!(get(&c0, "id"), id);
    assert_eq!(get(&c0, "cwd"), "/tmp");

    write(
        &root,
        cfg,
        "temperature=0.5\nmax_steps=10\nmodel=m1\nbackend=alpha\ntop_p=1\nmax_tokens=100\ncontext_limit=8000\n",
    )
    .await
    .expect("valid cfg");
    let good = read_all(&root, cfg).await;
    let c1 = kv(&good);
    for (k, v) in [
        ("temperature", "0.5"),
        ("max_steps", "10"),
        ("model", "m1"),
        ("backend", "alpha"),
        ("top_p", "1"),
        ("max_tokens", "100"),
        ("context_limit", "8000"),
    ] {
        assert_eq!(get(&c1, k), v, "{good}");
    }
    // The same fid reads the new values after its write.
    let f = open(&root, cfg, om::ORDWR).await;
    put(&f, "cwd=/mnt").await.unwrap();
    assert!(reply(&f).await.unwrap().contains("cwd=/mnt\n"));
    write(&root, cfg, "cwd=/tmp").await.unwrap();
    let good = read_all(&root, cfg).await;

    let cases: &[(&str, &str)] = &[
        (
            "colour=red",
            r#"unknown key "colour" (valid: backend, model, profile, cwd, temperature, max_tokens, top_p, max_steps, context_limit, feed, feed_prompt)"#,
        ),
        ("feed=sometimes", r#"feed: "sometimes" is not turn or off"#),
        ("feed_prompt=no placeholder", "has no {feed}"),
        ("temperature=5", "temperature"),
        ("temperature=warm", "temperature"),
        ("max_steps=0", "max_steps"),
        ("max_steps=1001", "max_steps"),
        ("top_p=1.5", "top_p"),
        ("cwd=/nonexistent", r#"cwd "/nonexistent""#),
        (
            "backend=zeta",
            r#"unknown backend "zeta" (configured: alpha, beta)"#,
        ),
        ("profile=nope", r#"unknown profile "nope""#),
        ("temperature=0.9\nmax_steps=0", "max_steps"),
        ("just words", "not key=value"),
        ("\n", "nothing to set"),
        ("id=00000000-0000-4000-8000-000000000000", "id is immutable"),
        ("name=bad/name", "invalid name"),
    ];
    for (text, want) in cases {
        let e = expect_err(write(&root, cfg, text).await, text);
        assert!(e.contains(want), "{text:?}: {e}");
        assert_eq!(read_all(&root, cfg).await, good, "{text:?} changed the cfg");
    }
    // What cfg shows can be written back unchanged, and name= renames.
    write(&root, cfg, &good).await.expect("cfg round trip");
    assert_eq!(read_all(&root, cfg).await, good);
    let renamed = good.replace("name=a\n", "name=b\n");
    write(&root, cfg, &renamed)
        .await
        .expect("rename through cfg");
    assert_eq!(read_all(&root, "session/s/agent/b/name").await, "b\n");
    assert!(root.walk_path("session/s/agent/a").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_has_the_promised_keys() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    new_agent(&root, &s, "name=a").await;
    let stats = read_all(&root, "session/s/agent/a/stats").await;
    let pairs = kv(&stats);
    for k in [
        "tokens_in",
        "tokens_out",
        "requests",
        "cost_usd",
        "context_tokens",
        "context_limit",
        "tool_calls",
    ] {
        let v = get(&pairs, k);
        assert!(v.parse::<f64>().is_ok(), "{k}={v} is not a number");
    }
    assert_eq!(get(&pairs, "turns"), "0");
    write(&root, "session/s/agent/a/prompt", "go")
        .await
        .unwrap();
    wait_turns(&root, "session/s/agent/a", 1).await;
    let pairs = kv(&read_all(&root, "session/s/agent/a/stats").await);
    assert_eq!(get(&pairs, "errors"), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_enqueues_and_dequeues() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    new_agent(&root, &s, "name=a").await;
    let a = "session/s/agent/a";
    // Paused, so the worker does not take the prompts.
    rdwr(&root, "session/s/ctl", "pause").await.unwrap();
    write(&root, &format!("{a}/fifo"), "one\n").await.unwrap();
    write(&root, &format!("{a}/prompt"), "two\n").await.unwrap();
    assert_eq!(read_all(&root, &format!("{a}/fifo")).await, "one\n");
    assert_eq!(read_all(&root, &format!("{a}/fifo")).await, "two\n");
    assert_eq!(read_all(&root, &format!("{a}/fifo")).await, "", "none left");
    // A read past what the fid took does not dequeue another.
    write(&root, &format!("{a}/fifo"), "three\n").await.unwrap();
    let f = open(&root, &format!("{a}/fifo"), om::OREAD).await;
    assert_eq!(&within("read", f.read(0, 2)).await.unwrap()[..], b"th");
    assert_eq!(&within("read", f.read(2, 100)).await.unwrap()[..], b"ree\n");
    assert!(within("read", f.read(6, 100)).await.unwrap().is_empty());
    // Dequeued prompts never run; a new one does, after resume.
    write(&root, &format!("{a}/prompt"), "four\n")
        .await
        .unwrap();
    rdwr(&root, "session/s/ctl", "resume").await.unwrap();
    wait_turns(&root, a, 1).await;
    let raw = snapshot(&root, &format!("{a}/chat.raw")).await;
    assert!(raw.starts_with("[[[user\nfour\n]]]\n"), "{raw}");
    for gone in ["one", "two", "three"] {
        assert!(!raw.contains(gone), "{gone} ran: {raw}");
    }
}

/// Writes one feed value on a fresh fid and clunks it, which publishes the value at once.
async fn put_feed(root: &Fid, feed: &str, v: &str) {
    let w = open(root, feed, om::OWRITE).await;
    put(&w, v).await.unwrap();
    within("clunk", w.clunk()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_wakes_readers_only_on_a_new_value() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    new_agent(&root, &s, "name=a").await;
    let feed = "session/s/agent/a/feed";
    let r = open(&root, feed, om::OREAD).await;
    let mut first = r.read_call(0, 4096).unwrap();
    assert!(
        tokio::time::timeout(QUIET, &mut first).await.is_err(),
        "a feed with no value returned"
    );
    put_feed(&root, feed, "v1").await;
    assert_eq!(&data(within("v1", first).await)[..], b"v1");
    // cat-style: the rest of that value is end of file.
    assert!(within("eof", r.read(2, 4096)).await.unwrap().is_empty());
    // The same bytes again wake nobody.
    let mut second = r.read_call(0, 4096).unwrap();
    put_feed(&root, feed, "v1").await;
    assert!(
        tokio::time::timeout(QUIET, &mut second).await.is_err(),
        "writing the same value woke the reader"
    );
    put_feed(&root, feed, "v2").await;
    assert_eq!(&data(within("v2", second).await)[..], b"v2");
    // A fresh fid starts from the value current at its open (as statewait does): it waits
    // for the next one, so a loop of opens returns once per new value.
    let fresh = open(&root, feed, om::OREAD).await;
    let mut third = fresh.read_call(0, 4096).unwrap();
    assert!(
        tokio::time::timeout(QUIET, &mut third).await.is_err(),
        "a fresh fid returned the value current at its open"
    );
    put_feed(&root, feed, "v3").await;
    assert_eq!(&data(within("v3", third).await)[..], b"v3");
    // How a value written in pieces, or by an endless pipe, becomes values: tests/tests/feed.rs.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statewait_reports_changes_and_is_flushed() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    new_agent(&root, &s, "name=a").await;
    let a = "session/s/agent/a";
    let sw = open(&root, &format!("{a}/statewait"), om::OREAD).await;

    // Blocks (nothing changed since open); dropping the call flushes it, promptly.
    let mut parked = sw.read_call(0, 64).unwrap();
    assert!(
        tokio::time::timeout(QUIET, &mut parked).await.is_err(),
        "statewait returned without a change"
    );
    drop(parked);
    assert!(read_all(&root, "help").await.contains("statewait"));

    let next = sw.read_call(0, 64).unwrap();
    rdwr(&root, "session/s/ctl", "pause").await.unwrap();
    assert_eq!(&data(within("paused", next).await)[..], b"paused\n");
    // cat-style: then end of file.
    assert!(within("eof", sw.read(7, 64)).await.unwrap().is_empty());

    // A fid opened now takes the current state as its baseline.
    let late = open(&root, &format!("{a}/statewait"), om::OREAD).await;
    let mut late_call = late.read_call(0, 64).unwrap();
    assert!(
        tokio::time::timeout(QUIET, &mut late_call).await.is_err(),
        "statewait returned the state it was opened in"
    );
    let next = sw.read_call(0, 64).unwrap();
    rdwr(&root, "session/s/ctl", "resume").await.unwrap();
    assert_eq!(&data(within("idle", next).await)[..], b"idle\n");
    assert_eq!(&data(within("late idle", late_call).await)[..], b"idle\n");

    // A turn (it fails: no backend): thinking, then error (the read returns the state
    // current when it wakes).
    let next = sw.read_call(0, 64).unwrap();
    write(&root, &format!("{a}/prompt"), "go").await.unwrap();
    let got = data(within("thinking", next).await);
    match &got[..] {
        b"thinking\n" => {
            assert_eq!(
                &within("error", sw.read(0, 64)).await.unwrap()[..],
                b"error\n"
            );
        }
        b"error\n" => {}
        other => panic!("statewait after a prompt: {other:?}"),
    }
    wait_turns(&root, a, 1).await;

    // Killed, then end of file.
    let next = sw.read_call(0, 64).unwrap();
    rdwr(&root, &format!("{a}/ctl"), "kill").await.unwrap();
    assert_eq!(&data(within("killed", next).await)[..], b"killed\n");
    assert!(within("eof", sw.read(0, 64)).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_ctl_commands() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    new_agent(&root, &s, "name=x").await;
    wait_toolsrv_up(&root, &s).await;
    let ctl = "session/s/agent/x/ctl";
    let run = |cmd: &'static str| {
        let root = &root;
        async move { rdwr(root, ctl, cmd).await }
    };
    let help = run("help").await.unwrap();
    let verbs: BTreeSet<String> = help
        .lines()
        .map(|l| l.split([' ', '\t']).next().unwrap().to_owned())
        .collect();
    assert_eq!(
        verbs,
        set(&[
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
            "help"
        ]),
        "{help}"
    );
    // Per-fid replies.
    let f = open(&root, ctl, om::ORDWR).await;
    let g = open(&root, ctl, om::ORDWR).await;
    put(&f, "stop").await.unwrap();
    put(&g, "agent").await.unwrap();
    assert_eq!(reply(&f).await.unwrap(), "not running\n");
    assert_eq!(reply(&g).await.unwrap(), "default\n");

    assert_eq!(run("name").await.unwrap(), "x\n");
    assert_eq!(run("cwd").await.unwrap(), "/tmp\n");
    assert_eq!(run("cwd /mnt").await.unwrap(), "cwd /mnt\n");
    assert_eq!(run("cwd").await.unwrap(), "/mnt\n");
    let e = expect_err(run("cwd /nonexistent").await, "cwd");
    assert!(e.contains("/nonexistent"), "{e}");
    assert_eq!(run("model").await.unwrap(), "\n");
    assert_eq!(run("model m2").await.unwrap(), "model m2\n");
    assert_eq!(run("model").await.unwrap(), "m2\n");
    let e = expect_err(run("backend").await, "none configured or found");
    assert!(e.contains(NO_BACKEND), "{e}");
    write(&root, "session/s/agent/x/cfg", "backend=beta")
        .await
        .unwrap();
    assert!(run("backend").await.unwrap().starts_with("beta\t"));
    assert_eq!(run("agent default").await.unwrap(), "profile default\n");
    let e = expect_err(run("agent nope").await, "profile");
    assert!(e.contains(r#"unknown profile "nope""#), "{e}");

    let tools = run("tools").await.unwrap();
    for t in [
        "execute_code",
        "execute_tool",
        "execute_pipe",
        "file_read",
        "file_write",
    ] {
        assert!(tools.lines().any(|l| l.starts_with(t)), "{t}: {tools}");
    }
    assert_eq!(
        run("tool_unload file_write").await.unwrap(),
        "unloaded file_write\n"
    );
    let fewer = run("tools").await.unwrap();
    assert!(!fewer.contains("file_write"), "{fewer}");
    assert!(fewer.contains("file_read"), "{fewer}");
    assert_eq!(
        run("tool_load file_write").await.unwrap(),
        "loaded file_write\n"
    );
    assert_eq!(run("tools").await.unwrap(), tools);
    let e = expect_err(run("tool_load hammer").await, "unknown tool");
    assert!(
        e.contains(r#"unknown tool "hammer""#) && e.contains("file_read"),
        "{e}"
    );

    assert_eq!(run("proc").await.unwrap(), "", "no processes");
    let top = run("proc top").await.unwrap();
    let header: Vec<&str> = top.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["PID", "STATE", "TOOL", "CMD"], "{top}");
    assert_eq!(top.lines().count(), 1, "{top}");
    assert_eq!(
        read_all(&root, "session/s/agent/x/proc/top").await,
        top,
        "proc/top is proc top"
    );
    expect_err(run("proc bogus").await, "proc bogus");
    expect_err(run("proc out 424242").await, "proc out of no process");

    let sp = run("systemprompt").await.unwrap();
    assert!(!sp.is_empty() && sp.ends_with('\n'), "{sp:?}");

    assert_eq!(run("inject remember this").await.unwrap(), "injected\n");
    assert_eq!(run("i and this").await.unwrap(), "injected\n");
    let e = expect_err(run("inject").await, "empty inject");
    assert!(e.contains("inject"), "{e}");
    assert_eq!(run("clear").await.unwrap(), "cleared\n");
    let raw = snapshot(&root, "session/s/agent/x/chat.raw").await;
    assert!(
        raw.contains("[[[user injected\nremember this\n]]]\n[[[user injected\nand this\n]]]\n"),
        "{raw}"
    );
    assert!(
        raw.contains("[[[info\nconversation history cleared\n]]]\n"),
        "{raw}"
    );

    // The agent's backend (beta) has nothing to compact and does not answer.
    let e = expect_err(run("compact").await, "compact");
    assert!(e.contains("nothing to compact"), "{e}");
    let e = expect_err(run("models").await, "models");
    assert!(e.contains("beta: request cannot connect"), "{e}");
    let e = expect_err(run("frobnicate").await, "unknown");
    assert!(e.contains(r#"unknown command "frobnicate""#), "{e}");
    let e = expect_err(run("stop now").await, "stop with an argument");
    assert!(e.contains("takes no arguments"), "{e}");
    let e = expect_err(run("stop\nclear").await, "two commands");
    assert!(e.contains("one command per write"), "{e}");

    // name renames; kill removes.
    assert_eq!(run("name y").await.unwrap(), "name y\n");
    assert_eq!(read_all(&root, "session/s/agent/y/name").await, "y\n");
    let e = expect_err(
        rdwr(&root, "session/s/agent/y/ctl", "name new").await,
        "bad name",
    );
    assert!(e.contains("invalid name"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_kill_ends_its_readers() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    let sid = id_of(&root, "session/s").await;
    let id = new_agent(&root, &s, "name=k").await;
    let k = "session/s/agent/k";
    let mut ev = Events::open(&root).await;
    rdwr(&root, &format!("{k}/ctl"), "inject something")
        .await
        .unwrap();
    let chat = open(&root, &format!("{k}/chat"), om::OREAD).await;
    let end = stream_until(&chat, 0, "something").await.len() as u64;
    let chat_call = chat.read_call(end, 4096).unwrap();
    let sw = open(&root, &format!("{k}/statewait"), om::OREAD).await;
    let sw_call = sw.read_call(0, 64).unwrap();
    let feed = open(&root, &format!("{k}/feed"), om::OREAD).await;
    let feed_call = feed.read_call(0, 64).unwrap();
    let ctl = open(&root, &format!("{k}/ctl"), om::ORDWR).await;

    put(&ctl, "kill").await.expect("kill");
    assert_eq!(reply(&ctl).await.unwrap(), "killed\n");
    assert!(
        data(within("chat EOF", chat_call).await).is_empty(),
        "chat EOF"
    );
    assert_eq!(&data(within("statewait", sw_call).await)[..], b"killed\n");
    assert!(
        within("statewait EOF", sw.read(0, 64))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        data(within("feed EOF", feed_call).await).is_empty(),
        "feed EOF"
    );
    let v = ev.until_kind("agent-killed", "agent", &id).await;
    assert_eq!(v["session"], sid.as_str());

    // Gone everywhere.
    assert!(within("walk", root.walk_path(k)).await.is_err());
    assert_eq!(read_all(&root, "session/s/agent/idx").await, "");
    assert!(!read_all(&root, "aliases").await.contains(&id));
    assert_eq!(idx(&root).await[0][2], "0");
    let e = expect_err(put(&ctl, "help").await, "ctl of a killed agent");
    assert!(e.contains("does not exist"), "{e}");
    let agent_dir = srv
        .state_dir()
        .join("sessions")
        .join(&sid)
        .join("agents")
        .join(&id);
    assert!(!agent_dir.exists(), "{} still exists", agent_dir.display());
}

// ---------------------------------------------------------------------------------------------
// eventwait

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventwait_reports_session_and_agent_changes() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let mut ev = Events::open(&root).await;

    // A flushed read is answered promptly and swallows nothing.
    let parked = ev.fid.read_call(0, 65536).unwrap();
    drop(parked);
    assert!(!read_all(&root, "help").await.is_empty());

    let (s, sid, pid) = session_with_toolsrv(&root, &mut ev, "name=ev cwd=/tmp").await;
    assert!(
        cmdline(pid).contains("toolsrv"),
        "pid {pid}: {}",
        cmdline(pid)
    );
    let logged = ev
        .log
        .iter()
        .find(|v| v["event"] == "session-created")
        .cloned();
    let created = match logged {
        Some(v) => v,
        None => ev.until(|v| v["event"] == "session-created").await,
    };
    assert_eq!(created["session"], sid.as_str());
    assert_eq!(created["name"], "ev");

    let aid = new_agent(&root, &s, "name=ag").await;
    let v = ev.until_kind("agent-created", "agent", &aid).await;
    assert_eq!(
        (v["session"].as_str(), v["name"].as_str()),
        (Some(sid.as_str()), Some("ag"))
    );

    write(&root, "session/ev/name", "ev2").await.unwrap();
    let v = ev.until_kind("session-renamed", "session", &sid).await;
    assert_eq!(
        (v["from"].as_str(), v["name"].as_str()),
        (Some("ev"), Some("ev2"))
    );

    write(&root, "session/ev2/agent/ag/name", "ag2")
        .await
        .unwrap();
    let v = ev.until_kind("agent-renamed", "agent", &aid).await;
    assert_eq!(
        (v["from"].as_str(), v["name"].as_str()),
        (Some("ag"), Some("ag2"))
    );

    write(&root, "session/ev2/agent/ag2/prompt", "hi")
        .await
        .unwrap();
    let v = ev.until_kind("agent-state", "agent", &aid).await;
    assert_eq!(v["state"], "thinking", "{v}");
    let v = ev.until_kind("agent-state", "agent", &aid).await;
    assert_eq!(v["state"], "error", "{v}: the turn fails without a backend");

    rdwr(&root, "session/ev2/agent/ag2/ctl", "kill")
        .await
        .unwrap();
    ev.until_kind("agent-killed", "agent", &aid).await;
    rdwr(&root, "session/ev2/ctl", "kill").await.unwrap();
    ev.until_kind("session-killed", "session", &sid).await;

    // A marker, so everything before it has been read; then each change made exactly one line.
    rdwr(&root, "ctl", "invalidate").await.unwrap();
    ev.until(|v| v["event"] == "config-reloaded").await;
    for (kind, n) in [
        ("session-created", 1),
        ("agent-created", 1),
        ("session-renamed", 1),
        ("agent-renamed", 1),
        ("agent-killed", 1),
        ("session-killed", 1),
        ("toolsrv-started", 1),
        ("agent-state", 2),
    ] {
        assert_eq!(
            ev.count(|v| v["event"] == kind),
            n,
            "{kind} events: {:?}",
            ev.log
        );
    }
    // Every line has a sequence number and a time, in order.
    let seqs: Vec<u64> = ev.log.iter().map(|v| v["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert!(ev.log.iter().all(|v| v["time"].is_string()));
}

/// Pausing and resuming a session changes its agents' state (statewait sees it), so
/// eventwait must report it as agent-state like any other state change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventwait_reports_state_changes_from_pause_and_resume() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    let aid = new_agent(&root, &s, "name=a").await;
    let mut ev = Events::open(&root).await;
    rdwr(&root, "session/s/ctl", "pause").await.unwrap();
    assert_eq!(
        read_all(&root, "session/s/agent/idx").await,
        format!("a\t{aid}\tpaused\n")
    );
    rdwr(&root, "session/s/ctl", "resume").await.unwrap();
    rdwr(&root, "ctl", "invalidate").await.unwrap();
    ev.until(|v| v["event"] == "config-reloaded").await;
    let states: Vec<&str> = ev
        .log
        .iter()
        .filter(|v| v["event"] == "agent-state" && v["agent"] == aid.as_str())
        .filter_map(|v| v["state"].as_str())
        .collect();
    assert_eq!(states, ["paused", "idle"], "events: {:?}", ev.log);
}

// ---------------------------------------------------------------------------------------------
// generate

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_without_a_backend() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let f = open(&root, "generate", om::ORDWR).await;
    let e = expect_err(put(&f, "summarize this repo\n").await, "plain prompt");
    assert!(e.contains(NO_BACKEND), "{e}");
    let e = expect_err(put(&f, r#"{"prompt":"explain recursion"}"#).await, "json");
    assert!(e.contains(NO_BACKEND), "{e}");
    let bad = expect_err(put(&f, r#"{"prompt":1}"#).await, "prompt not a string");
    assert!(!bad.contains(NO_BACKEND), "{bad}");
    assert!(
        bad.contains("generate") && bad.contains("invalid type"),
        "{bad}"
    );
    let e = expect_err(
        put(&f, r#"{"prompt":"x","colour":1}"#).await,
        "unknown field",
    );
    assert!(e.contains("colour"), "{e}");
    let e = expect_err(put(&f, "   ").await, "empty");
    assert!(e.contains("empty prompt"), "{e}");
    assert_eq!(reply(&f).await.unwrap(), "", "no reply after errors");
}

// ---------------------------------------------------------------------------------------------
// The session's toolsrv view

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_toolsrv_view_is_read_only_and_owner_only() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let s = new_session(&root, "name=s cwd=/tmp").await;
    let sid = id_of(&root, "session/s").await;
    wait_toolsrv_up(&root, &s).await;
    let entries = ls(&root, "session/s/toolsrv").await;
    let modes: BTreeSet<(String, u32)> = entries
        .iter()
        .map(|e| (e.name.clone(), e.mode & (dm::DIR | 0o777)))
        .collect();
    assert_eq!(
        modes,
        BTreeSet::from([
            ("bypass".to_owned(), dm::DIR | 0o500),
            ("ctl".to_owned(), 0o400),
            ("info".to_owned(), 0o400),
            ("proc".to_owned(), dm::DIR | 0o500),
            ("tools".to_owned(), 0o400),
        ])
    );
    let bypass: BTreeSet<(String, u32)> = ls(&root, "session/s/toolsrv/bypass")
        .await
        .iter()
        .map(|e| (e.name.clone(), e.mode & 0o777))
        .collect();
    assert_eq!(
        bypass,
        BTreeSet::from([
            ("full".to_owned(), 0o600),
            ("log".to_owned(), 0o400),
            ("pending".to_owned(), 0o400),
            ("resolve".to_owned(), 0o200)
        ])
    );
    let info = kv(&read_all(&root, "session/s/toolsrv/info").await);
    assert_eq!(get(&info, "platform"), "linux");
    assert_eq!(get(&info, "session"), sid);

    for (path, mode) in [
        ("session/s/toolsrv/ctl", om::OWRITE),
        ("session/s/toolsrv/ctl", om::ORDWR),
        ("session/s/toolsrv/tools", om::ORDWR),
        ("session/s/toolsrv/info", om::OWRITE),
    ] {
        let e = expect_err(try_open(&root, path, mode).await, path);
        assert!(e.contains("permission denied"), "{path}: {e}");
    }

    let r = open(&root, "session/s/toolsrv/bypass/resolve", om::OWRITE).await;
    let e = expect_err(
        put(
            &r,
            r#"{"id":"0123456789abcdef0123456789abcdef","approved":true}"#,
        )
        .await,
        "unknown id",
    );
    assert!(
        e.contains("no request 0123456789abcdef0123456789abcdef"),
        "{e}"
    );
    let e = expect_err(
        put(&r, r#"{"id":"x","approved":true,"extra":1}"#).await,
        "unknown field",
    );
    assert!(e.contains("resolve: unknown key \"extra\""), "{e}");

    // As "agent": the group has no rights on toolsrv/, not even to walk into it.
    let (_ac, aroot) = attach(&srv, "agent").await;
    let sdir = within("walk", aroot.walk_path("session/s")).await.unwrap();
    let e = within("walk", sdir.walk(&["toolsrv"]))
        .await
        .expect_err("agent walked into toolsrv/");
    assert!(msg(&e).contains("permission denied"), "{e}");
    assert!(
        within("walk", aroot.walk_path("session/s/toolsrv/bypass/resolve"))
            .await
            .is_err()
    );
    // But the session itself is readable.
    assert_eq!(read_all(&aroot, "session/s/paused").await, "false\n");
}

// ---------------------------------------------------------------------------------------------
// Crashes, kills and restarts

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_toolsrv_is_restarted() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let mut ev = Events::open(&root).await;
    let (s, sid, pid) = session_with_toolsrv(&root, &mut ev, "name=s cwd=/tmp").await;
    new_agent(&root, &s, "name=a").await;
    let ctl = "session/s/agent/a/ctl";
    // Wait until the agent is configured (its tools answer), then change its tool set.
    let tools = rdwr(&root, ctl, "tools").await.unwrap();
    assert!(tools.contains("file_write"), "{tools}");
    rdwr(&root, ctl, "tool_unload file_write").await.unwrap();
    assert!(cmdline(pid).contains("toolsrv"), "{pid}: {}", cmdline(pid));

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        Signal::SIGKILL,
    )
    .expect("kill toolsrv");
    let died = ev.until_kind("toolsrv-died", "session", &sid).await;
    assert_eq!(died["pid"].as_u64(), Some(pid), "{died}");
    let started = ev.until_kind("toolsrv-started", "session", &sid).await;
    let new_pid = started["pid"].as_u64().expect("pid");
    assert_ne!(new_pid, pid);
    assert!(cmdline(new_pid).contains("toolsrv"), "{}", cmdline(new_pid));
    wait_toolsrv_up(&root, &s).await;
    wait_pid_gone(pid).await;

    // The agent works again, with its changed tool set applied to the new toolsrv.
    let after = rdwr(&root, ctl, "tools")
        .await
        .expect("tools after restart");
    assert!(after.contains("file_read"), "{after}");
    assert!(
        !after.contains("file_write"),
        "tool set not re-applied: {after}"
    );
    let info = read_all(&root, "session/s/toolsrv/info").await;
    assert!(info.contains("platform=linux"), "{info}");
}

/// A stopped toolsrv (SIGSTOP) is noticed within `toolsrv_liveness_s`, shown as
/// `unresponsive` with the reason, and up again after SIGCONT; killed while stopped, it is
/// restarted and the new one is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_toolsrv_is_shown_unresponsive_and_recovers() {
    let srv = Srv::start(&format!("toolsrv_liveness_s = 1\n{CONFIG}"));
    let (_c, root) = attach(&srv, &me()).await;
    let mut ev = Events::open(&root).await;
    let (s, sid, pid) = session_with_toolsrv(&root, &mut ev, "name=s cwd=/tmp").await;
    wait_toolsrv_up(&root, &s).await;
    let target = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    let cfg = format!("session/{s}/cfg");

    nix::sys::signal::kill(target, Signal::SIGSTOP).expect("stop toolsrv");
    let v = ev.until_kind("toolsrv-unresponsive", "session", &sid).await;
    assert_eq!(v["pid"].as_u64(), Some(pid), "{v}");
    let why = v["reason"].as_str().unwrap_or("");
    assert!(why.contains("has not answered for 1 s"), "{v}");
    let shown = read_all(&root, &cfg).await;
    assert!(shown.contains("toolsrv=unresponsive\n"), "{shown}");
    assert!(
        shown.contains(&format!("toolsrv_reason={why}\n")),
        "{shown}"
    );
    assert!(
        idx(&root)
            .await
            .iter()
            .any(|l| l[0] == s && l[3] == "unresponsive"),
        "{:?}",
        idx(&root).await
    );

    nix::sys::signal::kill(target, Signal::SIGCONT).expect("continue toolsrv");
    let v = ev.until_kind("toolsrv-responsive", "session", &sid).await;
    assert_eq!(v["pid"].as_u64(), Some(pid), "{v}");
    let shown = read_all(&root, &cfg).await;
    assert!(
        shown.contains("toolsrv=up\n") && !shown.contains("toolsrv_reason="),
        "{shown}"
    );
    // The same process, never restarted.
    assert_eq!(ev.count(|e| e["event"] == "toolsrv-died"), 0);

    // Stopped again, then killed: a new one is started and it is up.
    nix::sys::signal::kill(target, Signal::SIGSTOP).expect("stop toolsrv");
    ev.until_kind("toolsrv-unresponsive", "session", &sid).await;
    nix::sys::signal::kill(target, Signal::SIGKILL).expect("kill toolsrv");
    ev.until_kind("toolsrv-died", "session", &sid).await;
    let started = ev.until_kind("toolsrv-started", "session", &sid).await;
    assert_ne!(started["pid"].as_u64(), Some(pid), "{started}");
    wait_toolsrv_up(&root, &s).await;
    let shown = read_all(&root, &cfg).await;
    assert!(shown.contains("toolsrv=up\n"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_kill_ends_toolsrv_state_and_fids() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let mut ev = Events::open(&root).await;
    let (s, sid, pid) = session_with_toolsrv(&root, &mut ev, "name=doomed cwd=/tmp").await;
    let (keep, _, _) = session_with_toolsrv(&root, &mut ev, "name=kept cwd=/tmp").await;
    let aid = new_agent(&root, &s, "name=a").await;
    let dir = srv.state_dir().join("sessions").join(&sid);
    assert!(
        dir.join("session.json").is_file(),
        "layout: {}",
        dir.display()
    );

    let ctl = open(&root, "session/doomed/ctl", om::ORDWR).await;
    let paused = open(&root, "session/doomed/paused", om::OREAD).await;
    let chat = open(&root, "session/doomed/agent/a/chat", om::OREAD).await;
    let chat_call = chat.read_call(0, 4096).unwrap();
    let sw = open(&root, "session/doomed/agent/a/statewait", om::OREAD).await;
    let sw_call = sw.read_call(0, 64).unwrap();
    let actl = open(&root, "session/doomed/agent/a/ctl", om::ORDWR).await;

    put(&ctl, "kill").await.expect("kill");
    assert_eq!(reply(&ctl).await.unwrap(), "killed\n");
    ev.until_kind("session-killed", "session", &sid).await;
    wait_pid_gone(pid).await;
    assert_eq!(session_names(&root).await, [keep.as_str()]);
    let aliases = read_all(&root, "aliases").await;
    assert!(
        !aliases.contains(&sid) && !aliases.contains(&aid),
        "{aliases}"
    );
    assert!(!dir.exists(), "{} still exists", dir.display());
    let left: Vec<String> = std::fs::read_dir(srv.state_dir().join("sessions"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&sid))
        .collect();
    assert!(left.is_empty(), "leftovers of the killed session: {left:?}");

    // Open fids: blocked reads end, writes and new reads fail.
    assert!(data(within("chat", chat_call).await).is_empty(), "chat EOF");
    assert_eq!(&data(within("statewait", sw_call).await)[..], b"killed\n");
    let e = expect_err(put(&ctl, "help").await, "session ctl after kill");
    assert!(e.contains("does not exist"), "{e}");
    let e = expect_err(put(&actl, "help").await, "agent ctl after kill");
    assert!(e.contains("does not exist"), "{e}");
    let e = within("stat", paused.stat())
        .await
        .expect_err("stat after kill");
    assert!(msg(&e).contains("does not exist"), "{e}");
    assert!(
        within("walk", root.walk_path("session/doomed"))
            .await
            .is_err()
    );
    assert!(
        within("walk", root.walk_path(&format!("session/{sid}")))
            .await
            .is_err()
    );
    // The other session is untouched.
    wait_toolsrv_up(&root, "kept").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_kill9_restores_everything() {
    let mut srv = Srv::start(CONFIG);
    let work = srv.dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let work = std::fs::canonicalize(&work).unwrap();
    let (before, toolsrv_pids) = {
        let (_c, root) = attach(&srv, &me()).await;
        let mut ev = Events::open(&root).await;
        let (s, _, p1) =
            session_with_toolsrv(&root, &mut ev, &format!("name=keep cwd={}", work.display()))
                .await;
        let (_, _, p2) = session_with_toolsrv(&root, &mut ev, "name=second cwd=/tmp").await;
        new_agent(&root, &s, "name=talker").await;
        new_agent(&root, &s, "name=waiter cwd=/mnt").await;
        new_agent(&root, "second", "name=other").await;
        write(
            &root,
            "session/keep/agent/talker/plan",
            "1. restore\n2. verify\n",
        )
        .await
        .unwrap();
        write(
            &root,
            "session/keep/agent/talker/cfg",
            "temperature=0.25\nmodel=m9",
        )
        .await
        .unwrap();
        write(&root, "session/keep/agent/talker/prompt", "remember me")
            .await
            .unwrap();
        wait_turns(&root, "session/keep/agent/talker", 1).await;
        write(&root, "session/keep/name", "kept").await.unwrap();
        // Paused, two prompts queued: acknowledged, so they must survive.
        rdwr(&root, "session/kept/ctl", "pause").await.unwrap();
        write(&root, "session/kept/agent/waiter/prompt", "queued one")
            .await
            .unwrap();
        write(&root, "session/kept/agent/waiter/fifo", "queued two")
            .await
            .unwrap();
        let mut snap = Vec::new();
        snap.push(read_all(&root, "session/idx").await);
        snap.push(read_all(&root, "aliases").await);
        for s in ["kept", "second"] {
            snap.push(read_all(&root, &format!("session/{s}/agent/idx")).await);
        }
        for a in [
            "kept/agent/talker",
            "kept/agent/waiter",
            "second/agent/other",
        ] {
            snap.push(read_all(&root, &format!("session/{a}/cfg")).await);
        }
        let talker_raw = snapshot(&root, "session/kept/agent/talker/chat.raw").await;
        assert!(talker_raw.contains("remember me") && talker_raw.contains(NO_BACKEND));
        snap.push(talker_raw);
        snap.push(read_all(&root, "session/kept/agent/talker/plan").await);
        snap.push(read_all(&root, "session/kept/agent/talker/stats").await);
        (snap, [p1, p2])
    };

    srv.kill9();
    // Its toolsrvs end with it (their link closed).
    for p in toolsrv_pids {
        wait_pid_gone(p).await;
    }
    srv.relaunch(|_| {});
    let (_c, root) = attach(&srv, &me()).await;
    for s in ["kept", "second"] {
        wait_toolsrv_up(&root, s).await;
    }
    let mut after = Vec::new();
    after.push(read_all(&root, "session/idx").await);
    after.push(read_all(&root, "aliases").await);
    for s in ["kept", "second"] {
        after.push(read_all(&root, &format!("session/{s}/agent/idx")).await);
    }
    for a in [
        "kept/agent/talker",
        "kept/agent/waiter",
        "second/agent/other",
    ] {
        after.push(read_all(&root, &format!("session/{a}/cfg")).await);
    }
    after.push(snapshot(&root, "session/kept/agent/talker/chat.raw").await);
    after.push(read_all(&root, "session/kept/agent/talker/plan").await);
    after.push(read_all(&root, "session/kept/agent/talker/stats").await);
    let labels = [
        "session/idx",
        "aliases",
        "kept's agents",
        "second's agents",
        "talker's cfg",
        "waiter's cfg",
        "other's cfg",
        "talker's chat.raw",
        "talker's plan",
        "talker's stats",
    ];
    for ((l, b), a) in labels.iter().zip(&before).zip(&after) {
        assert_eq!(a, b, "{l} after the restart");
    }
    assert!(
        before[0].contains("\ttrue\n"),
        "kept is paused: {}",
        before[0]
    );
    let cfg = kv(&after[4]);
    assert_eq!(get(&cfg, "cwd"), work.to_str().unwrap());
    assert_eq!(get(&cfg, "temperature"), "0.25");
    assert_eq!(get(&kv(&after[5]), "cwd"), "/mnt");
    assert_eq!(read_all(&root, "session/kept/paused").await, "true\n");
    assert_eq!(
        read_all(&root, "session/kept/agent/talker/plan").await,
        "1. restore\n2. verify\n"
    );

    // The queue survived, in order: take the first, let the second run.
    let w = "session/kept/agent/waiter";
    assert_eq!(read_all(&root, &format!("{w}/fifo")).await, "queued one");
    rdwr(&root, "session/kept/ctl", "resume").await.unwrap();
    wait_turns(&root, w, 1).await;
    let raw = snapshot(&root, &format!("{w}/chat.raw")).await;
    assert!(raw.starts_with("[[[user\nqueued two\n]]]\n"), "{raw}");
    assert!(!raw.contains("queued one"), "{raw}");
    assert_eq!(
        read_all(&root, &format!("{w}/fifo")).await,
        "",
        "queue empty"
    );
    // The restored agents work: their toolsrv knows them.
    let tools = rdwr(&root, "session/kept/agent/talker/ctl", "tools")
        .await
        .unwrap();
    assert!(tools.contains("execute_code"), "{tools}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_session_is_skipped_and_reported() {
    let mut srv = Srv::start(CONFIG);
    let (good_id, bad_id) = {
        let (_c, root) = attach(&srv, &me()).await;
        new_session(&root, "name=good cwd=/tmp").await;
        new_session(&root, "name=bad cwd=/tmp").await;
        new_agent(&root, "good", "name=g").await;
        new_agent(&root, "bad", "name=b").await;
        (
            id_of(&root, "session/good").await,
            id_of(&root, "session/bad").await,
        )
    };
    srv.kill9();
    let bad_file = srv
        .state_dir()
        .join("sessions")
        .join(&bad_id)
        .join("session.json");
    assert!(bad_file.is_file(), "layout: {}", bad_file.display());
    std::fs::write(&bad_file, b"{\"id\": garbage\x00\xff").unwrap();
    srv.relaunch(|_| {});
    let (_c, root) = attach(&srv, &me()).await;
    let names = session_names(&root).await;
    assert_eq!(names, ["good"]);
    assert_eq!(id_of(&root, "session/good").await, good_id);
    assert!(
        within("walk", root.walk_path("session/good/agent/g"))
            .await
            .is_ok()
    );
    assert!(!read_all(&root, "aliases").await.contains(&bad_id));
    let err = srv.stderr();
    assert!(
        err.contains(&bad_file.display().to_string()),
        "stderr does not name {}:\n{err}",
        bad_file.display()
    );
    // The server carries on: new sessions, the old one's name is free.
    new_session(&root, "name=bad cwd=/tmp").await;
    wait_toolsrv_up(&root, "good").await;
    assert_eq!(session_names(&root).await, ["good", "bad"]);
}

// ---------------------------------------------------------------------------------------------
// TCP

async fn dial_tcp(port: u16) -> Client {
    let addr = Addr::Tcp {
        host: "127.0.0.1".into(),
        port,
    };
    within("dial tcp", Client::dial(&addr))
        .await
        .expect("dial tcp")
}

/// Tauth, write `key`, attach: the root, or the first error.
async fn tcp_attach(port: u16, key: &[u8], uname: &str) -> Result<Fid, String> {
    let c = dial_tcp(port).await;
    let afid = within("auth", c.auth(uname, ""))
        .await
        .map_err(|e| msg(&e))?;
    within("key", afid.write(0, Bytes::copy_from_slice(key)))
        .await
        .map_err(|e| msg(&e))?;
    within("attach", c.attach(Some(&afid), uname, ""))
        .await
        .map_err(|e| msg(&e))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_requires_tauth_with_the_state_key() {
    let port = free_port();
    let mut srv = Srv::start_with(tempfile::tempdir().unwrap(), CONFIG, |c| {
        c.arg("-a").arg(format!("tcp!127.0.0.1!{port}"));
    });
    wait_tcp(port).await;
    let key_path = srv.state_dir().join("tcp.key");
    let meta = std::fs::metadata(&key_path).expect("tcp.key created");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "tcp.key mode");
    let key = std::fs::read_to_string(&key_path).unwrap();
    let hex = key.trim_end();
    assert!(
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key:?}"
    );

    // No auth: refused.
    let c = dial_tcp(port).await;
    let e = within("attach", c.attach(None, &me(), ""))
        .await
        .expect_err("tcp attach without auth");
    assert!(msg(&e).contains("permission denied"), "{e}");
    let e = within("attach", c.attach(None, "agent", ""))
        .await
        .expect_err("tcp attach as agent without auth");
    assert!(msg(&e).contains("permission denied"), "{e}");

    // A wrong key: the write fails and the afid cannot attach.
    let afid = within("auth", c.auth(&me(), ""))
        .await
        .expect("Tauth on tcp");
    let e = within("key", afid.write(0, Bytes::from("0".repeat(64))))
        .await
        .expect_err("wrong key accepted");
    assert!(msg(&e).contains("wrong key"), "{e}");
    let e = within("attach", c.attach(Some(&afid), &me(), ""))
        .await
        .expect_err("attach with a failed afid");
    assert!(msg(&e).contains("permission denied"), "{e}");
    // An afid nobody wrote to cannot attach either.
    let fresh = within("auth", c.auth(&me(), "")).await.unwrap();
    let e = within("attach", c.attach(Some(&fresh), &me(), ""))
        .await
        .expect_err("attach with an unused afid");
    assert!(msg(&e).contains("permission denied"), "{e}");

    // The right key: the operator's tree.
    let c = dial_tcp(port).await;
    let afid = within("auth", c.auth(&me(), "")).await.unwrap();
    within("key", afid.write(0, Bytes::from(key.clone())))
        .await
        .expect("right key");
    let root = within("attach", c.attach(Some(&afid), &me(), ""))
        .await
        .expect("attach with the key");
    let e = within("attach", c.attach(Some(&afid), &me(), ""))
        .await
        .expect_err("afid reused");
    assert!(msg(&e).contains("permission denied"), "{e}");
    let listed = names(&ls(&root, "").await);
    assert!(listed.contains("session"), "{listed:?}");
    assert!(
        rdwr(&root, "ctl", "help")
            .await
            .unwrap()
            .contains("invalidate")
    );
    new_session(&root, "name=overtcp cwd=/tmp").await;
    // Attached as agent with the key: only the group's rights.
    let aroot = tcp_attach(port, hex.as_bytes(), "agent").await.unwrap();
    let e = expect_err(try_open(&aroot, "ctl", om::ORDWR).await, "agent ctl");
    assert!(e.contains("permission denied"), "{e}");

    // Restarted: the same key file, still good.
    drop(root);
    drop(aroot);
    srv.signal(Signal::SIGTERM);
    assert_eq!(srv.wait_exit().code(), Some(0), "{}", srv.stderr());
    let port2 = free_port();
    srv.relaunch(|c| {
        c.arg("-a").arg(format!("tcp!127.0.0.1!{port2}"));
    });
    wait_tcp(port2).await;
    assert_eq!(
        std::fs::read_to_string(&key_path).unwrap(),
        key,
        "key reused"
    );
    let root = tcp_attach(port2, hex.as_bytes(), &me())
        .await
        .expect("old key");
    assert_eq!(session_names(&root).await, ["overtcp"]);
    let e = tcp_attach(port2, "f".repeat(64).as_bytes(), &me())
        .await
        .expect_err("another key");
    assert!(e.contains("wrong key"), "{e}");
}

/// Agents created while a session's toolsrv is being (re)started must still get their
/// profile (its policy and tool set) in the new toolsrv. A profile with one tool makes a
/// configured agent distinguishable from an unconfigured one (toolsrv gives an agent it was
/// never told about every tool and the session's default policy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_created_while_toolsrv_restarts_get_their_profile() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("agents")).unwrap();
    std::fs::write(
        dir.path().join("agents").join("narrow.toml"),
        "tools = [\"file_read\"]\n",
    )
    .unwrap();
    let srv = Srv::start_with(dir, CONFIG, |_| {});
    let (_c, root) = attach(&srv, &me()).await;
    let mut ev = Events::open(&root).await;
    let (s, sid, pid) = session_with_toolsrv(&root, &mut ev, "name=s cwd=/tmp").await;
    // Agents that exist when toolsrv restarts (configuring them takes a while).
    for i in 0..30 {
        new_agent(&root, &s, &format!("name=base{i} profile=narrow")).await;
    }
    let narrow = "file_read";
    assert!(
        rdwr(&root, "session/s/agent/base0/ctl", "tools")
            .await
            .unwrap()
            .starts_with(narrow)
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        Signal::SIGKILL,
    )
    .expect("kill toolsrv");
    ev.until_kind("toolsrv-died", "session", &sid).await;
    // Create agents until the new toolsrv is announced (at most 300).
    let mut made = Vec::new();
    {
        let started = ev.until_kind("toolsrv-started", "session", &sid);
        tokio::pin!(started);
        while made.len() < 300 {
            let name = format!("during{}", made.len());
            let spec = format!("name={name} profile=narrow");
            tokio::select! {
                _ = &mut started => break,
                r = rdwr(&root, "session/s/agent/new", &spec) => {
                    r.expect("agent/new during the restart");
                    made.push(name);
                }
            }
        }
    }
    for i in 0..3 {
        let name = format!("after{i}");
        new_agent(&root, &s, &format!("name={name} profile=narrow")).await;
        made.push(name);
    }
    // Every one of them ends up with the profile's single tool (bounded wait).
    let mut wrong = Vec::new();
    let deadline = tokio::time::Instant::now() + IO_TIMEOUT;
    for name in &made {
        let ctl = format!("session/s/agent/{name}/ctl");
        loop {
            let tools = rdwr(&root, &ctl, "tools").await.unwrap();
            if tools.lines().count() == 1 && tools.starts_with(narrow) {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                wrong.push(format!("{name}: {} tools", tools.lines().count()));
                break;
            }
            tokio::time::sleep(STEP * 5).await;
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} agents created around the restart never got their profile in toolsrv: {:?}",
        wrong.len(),
        made.len(),
        &wrong[..wrong.len().min(5)]
    );
}
