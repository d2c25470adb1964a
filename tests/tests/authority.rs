//! Who may do what in olliesrv's tree: a client attached as `agent` (over the unix socket, and
//! over TCP with the key) manages no session and no agent. Each row of SECURITY.md's table is
//! tried here: the write is refused with one line naming what it manages, and the state it
//! would have changed is checked unchanged afterwards. The owner, on the same server, is the
//! positive control for each row; the rights an agent keeps (reading, prompting, the plan)
//! are checked to still work.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use bytes::Bytes;
use common::*;
use ollie_p9::wire::om;
use ollie_p9::{Client, Fid};
use ollie_testkit::client::{open_text as open, rdwr_text as rdwr, read_ok as read};

/// A server whose default backend replays `turns`; a work directory for sessions.
fn server(turns: &str) -> (Srv, std::path::PathBuf) {
    server_with(turns, |_| {})
}

/// [`server`] with its command line tweaked.
fn server_with(
    turns: &str,
    tweak: impl FnOnce(&mut std::process::Command),
) -> (Srv, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(dir.path().join("turns.jsonl"), turns).unwrap();
    let config = format!(
        "default_backend = \"demo\"\n\n[backends.demo]\nkind = \"replay\"\nfile = \"{}\"\n",
        dir.path().join("turns.jsonl").display()
    );
    (Srv::start_with(dir, &config, tweak), work)
}

/// The snapshot of everything the refused writes could have changed.
async fn world(root: &Fid) -> String {
    let mut out = String::new();
    for p in [
        "session/idx",
        "session/s/name",
        "session/s/paused",
        "session/s/cfg",
        "session/s/ns/table",
        "session/s/agent/idx",
        "session/s/agent/a/name",
        "session/s/agent/a/cfg",
        "session/s/agent/a/ns/table",
    ] {
        out.push_str(&format!("== {p}\n{}", read(root, p).await));
    }
    out
}

/// Every management write an `agent` fid tries, each refused, with nothing changed.
async fn agent_manages_nothing(owner: &Fid, agent: &Fid, work: &std::path::Path) {
    let before = world(owner).await;
    let bead = work.join("bead");
    std::fs::create_dir_all(&bead).unwrap();
    let rows: &[(&str, String, &str)] = &[
        (
            "session/new",
            format!("name=evil cwd={}", work.display()),
            "session/new",
        ),
        ("session/s/ctl", "pause".into(), "a session's ctl"),
        ("session/s/ctl", "kill".into(), "a session's ctl"),
        ("session/s/name", "renamed".into(), "a session's name"),
        ("session/s/cfg", "cost_cap=1".into(), "a session's cfg"),
        ("session/s/agent/new", "name=b".into(), "agent/new"),
        (
            "session/s/ns/ctl",
            format!("bind {} /ctx", bead.display()),
            "ns/ctl",
        ),
        ("session/s/agent/a/ctl", "kill".into(), "an agent's ctl"),
        ("session/s/agent/a/ctl", "stop".into(), "an agent's ctl"),
        (
            "session/s/agent/a/name",
            "renamed".into(),
            "an agent's name",
        ),
        (
            "session/s/agent/a/cfg",
            "model=other".into(),
            "an agent's cfg",
        ),
        (
            "session/s/agent/a/ns/ctl",
            format!("bind {} /ctx", bead.display()),
            "ns/ctl",
        ),
    ];
    for (path, data, what) in rows {
        // Files the group may not write anyway say so plainly; the others name the rule.
        let st = within("stat", agent.walk_path(path).await.unwrap().stat())
            .await
            .unwrap();
        let group_writes = st.mode & 0o020 != 0;
        for mode in [om::OWRITE, om::ORDWR, om::OWRITE | om::OTRUNC] {
            let e = match open(agent, path, mode).await {
                Ok(f) => {
                    let w = within("write", f.write(0, Bytes::from(data.clone()))).await;
                    panic!("agent opened {path} (mode {mode:#x}) for writing; write: {w:?}")
                }
                Err(e) => e,
            };
            assert!(e.contains("permission denied"), "{path}: {e}");
            if group_writes {
                assert!(e.contains(what) && e.contains("\"agent\""), "{path}: {e}");
            }
        }
        // Truncation through Twstat (9pfuse's `echo x > file`) is refused too.
        let f = within("walk", agent.walk_path(path)).await.unwrap();
        let mut st = ollie_p9::wire::Stat::dont_touch();
        st.length = 0;
        assert!(
            within("wstat", f.wstat(&st)).await.is_err(),
            "{path}: agent truncated it"
        );
        let _ = f.clunk().await;
    }
    // The root ctl and the broker stay owner-only, as before.
    for p in ["ctl", "bypass/resolve", "bypass/pending", "bypass/audit"] {
        assert!(open(agent, p, om::ORDWR).await.is_err(), "{p}");
    }
    assert_eq!(
        world(owner).await,
        before,
        "a refused write changed something"
    );
    assert!(!read(owner, "session/idx").await.contains("evil"));
}

/// What an `agent` fid may still do: read every session's files, prompt an agent, keep a plan.
async fn agent_keeps_its_rights(owner: &Fid, agent: &Fid) {
    assert_eq!(read(agent, "session/s/paused").await, "false\n");
    assert!(read(agent, "session/s/agent/idx").await.starts_with("a\t"));
    let f = open(agent, "session/s/agent/a/plan", om::OWRITE | om::OTRUNC)
        .await
        .unwrap();
    within("write", f.write(0, Bytes::from_static(b"step 1\n")))
        .await
        .unwrap();
    assert_eq!(read(owner, "session/s/agent/a/plan").await, "step 1\n");
    let f = open(agent, "session/s/agent/a/prompt", om::OWRITE)
        .await
        .unwrap();
    within("write", f.write(0, Bytes::from_static(b"hello")))
        .await
        .unwrap();
    // The prompt is queued at the clunk.
    within("clunk", f.clunk()).await.unwrap();
    wait_for_text(owner, "session/s/agent/a/log", "replayed", GUARD).await;
}

/// The owner can do each of the rows (the positive control), ending with the kill.
async fn owner_manages(owner: &Fid, work: &std::path::Path) {
    assert_eq!(
        rdwr(owner, "session/s/ctl", "pause").await.unwrap(),
        "paused\n"
    );
    assert_eq!(read(owner, "session/s/paused").await, "true\n");
    rdwr(owner, "session/s/ctl", "resume").await.unwrap();
    let id = rdwr(owner, "session/s/agent/new", "name=b").await.unwrap();
    assert!(!id.trim().is_empty());
    let f = open(owner, "session/s/agent/b/name", om::OWRITE)
        .await
        .unwrap();
    within("write", f.write(0, Bytes::from_static(b"b2")))
        .await
        .unwrap();
    assert!(read(owner, "session/s/agent/idx").await.contains("b2\t"));
    rdwr(owner, "session/s/agent/b2/ctl", "kill").await.unwrap();
    rdwr(
        owner,
        "session/new",
        &format!("name=second cwd={}", work.display()),
    )
    .await
    .unwrap();
    assert!(read(owner, "session/idx").await.contains("second"));
}

/// A hang guard only.
const GUARD: std::time::Duration = std::time::Duration::from_secs(60);

const TURNS: &str = "{\"text\": \"replayed\"}\n";

async fn setup(root: &Fid, work: &std::path::Path) {
    new_session(root, work, "name=a").await;
    // The snapshots compare a settled session: its toolsrv up.
    wait_for_text(root, "session/s/cfg", "toolsrv=up", GUARD).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_attached_over_the_unix_socket_manages_no_session_or_agent() {
    let (srv, work) = server(TURNS);
    let (_c, owner) = attach(&srv, &me()).await;
    setup(&owner, &work).await;
    let (_ac, agent) = attach(&srv, "agent").await;
    agent_manages_nothing(&owner, &agent, &work).await;
    agent_keeps_its_rights(&owner, &agent).await;
    owner_manages(&owner, &work).await;
}

/// A tool process's `ctl` (kill, signal) in the agent's `proc/` view is refused to an `agent`
/// fid; the process keeps running until the owner stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cannot_signal_a_tool_process() {
    let turns = concat!(
        r#"{"tool_calls": [{"name": "execute_code", "arguments": {"language": "bash", "code": "sleep 1000"}}]}"#,
        "\n"
    );
    let (srv, work) = server(turns);
    let (_c, owner) = attach(&srv, &me()).await;
    setup(&owner, &work).await;
    let f = open(&owner, "session/s/agent/a/prompt", om::OWRITE)
        .await
        .unwrap();
    within("write", f.write(0, Bytes::from_static(b"sleep")))
        .await
        .unwrap();
    within("clunk", f.clunk()).await.unwrap();
    wait_for_text(&owner, "session/s/agent/a/proc/top", "running", GUARD).await;
    let (_ac, agent) = attach(&srv, "agent").await;
    for mode in [om::OWRITE, om::ORDWR] {
        let e = open(&agent, "session/s/agent/a/proc/1/ctl", mode)
            .await
            .expect_err("agent opened a process ctl for writing");
        assert!(e.contains("permission denied"), "{e}");
    }
    assert!(
        read(&owner, "session/s/agent/a/proc/top")
            .await
            .contains("running")
    );
    rdwr(&owner, "session/s/agent/a/ctl", "stop").await.unwrap();
    wait_for_text(&owner, "session/s/agent/a/proc/top", "killed", GUARD).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_attached_over_tcp_with_the_key_manages_no_session_or_agent() {
    let port = free_port();
    let (srv, work) = server_with(TURNS, |c| {
        c.arg("-a").arg(format!("tcp!127.0.0.1!{port}"));
    });
    wait_tcp(port).await;
    let (_c, owner) = attach(&srv, &me()).await;
    setup(&owner, &work).await;
    let key = std::fs::read_to_string(srv.state_dir().join("tcp.key"))
        .unwrap_or_else(|e| panic!("tcp.key: {e}; olliesrv said: {}", srv.stderr()));
    let agent = tcp_agent(port, key.trim()).await;
    agent_manages_nothing(&owner, &agent, &work).await;
    agent_keeps_its_rights(&owner, &agent).await;
    // On the same server: only one test of this file listens on TCP, so that no two pick the
    // same free port.
    the_audit_names_who_wrote_a_verdict(port, key.trim()).await;
}

async fn tcp_agent(port: u16, key: &str) -> Fid {
    tcp_attach(port, key, "agent").await
}

/// Attaches over TCP as `uname` with the key.
async fn tcp_attach(port: u16, key: &str, uname: &str) -> Fid {
    let addr = ollie_p9::dial::Addr::Tcp {
        host: "127.0.0.1".into(),
        port,
    };
    let c = within("dial", Client::dial(&addr)).await.unwrap();
    let afid = within("auth", c.auth(uname, "")).await.unwrap();
    within("key", afid.write(0, Bytes::from(key.to_owned())))
        .await
        .unwrap();
    let root = within("attach", c.attach(Some(&afid), uname, ""))
        .await
        .unwrap();
    // The client lives as long as the test's root fid needs it.
    std::mem::forget(c);
    root
}

/// The audit names who wrote a verdict: the uname of the attach (a TCP key holder calling
/// itself "alice"), not the server's user.
async fn the_audit_names_who_wrote_a_verdict(port: u16, key: &str) {
    let alice = tcp_attach(port, key, "alice").await;
    let f = open(&alice, "bypass/resolve", om::OWRITE).await.unwrap();
    let verdict = format!("{{\"id\":\"{}\",\"approved\":true}}", "a".repeat(32));
    let e = within("write", f.write(0, Bytes::from(verdict)))
        .await
        .expect_err("a verdict for no request");
    assert!(e.to_string().contains("no request"), "{e}");
    let audit = read(&alice, "bypass/audit").await;
    let last: serde_json::Value = serde_json::from_str(audit.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "decision-refused", "{audit}");
    assert_eq!(last["by"], "alice", "{audit}");
}
