//! The agent loop with the `replay` backend, end to end through the real olliesrv and the
//! session's real toolsrv: prompt → model turn asking for a tool → the tool runs sandboxed in
//! toolsrv → its result goes back → the final answer; sub-agents (`agent/new … prompt=`);
//! `generate` on two fids at once; a script that runs out; `stop` during a long tool.
// Scenario tests read top to bottom; splitting them would hide the story.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::kv_value as kv;
use common::*;
use ollie_p9::Fid;
use ollie_p9::wire::om;
use ollie_testkit::client::{rdwr_text as rdwr, read_ok as read, write_ok as write};

/// A server whose default backend `demo` replays `turns` (and `other` replays `other`).
fn server(turns: &str, other: &str) -> (Srv, std::path::PathBuf) {
    server_with(turns, other, "", "")
}

/// [`server`] with `top` added to config.toml's top-level keys and `profile` written as
/// `agents/asker.toml`.
fn server_with(turns: &str, other: &str, top: &str, profile: &str) -> (Srv, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(dir.path().join("turns.jsonl"), turns).unwrap();
    std::fs::write(dir.path().join("other.jsonl"), other).unwrap();
    if !profile.is_empty() {
        std::fs::create_dir(dir.path().join("agents")).unwrap();
        std::fs::write(dir.path().join("agents").join("asker.toml"), profile).unwrap();
    }
    let config = format!(
        "default_backend = \"demo\"\n{top}\n\n[backends.demo]\nkind = \"replay\"\nfile = \"{}\"\n\n[backends.other]\nkind = \"replay\"\nfile = \"{}\"\n",
        dir.path().join("turns.jsonl").display(),
        dir.path().join("other.jsonl").display()
    );
    let srv = Srv::start_with(dir, &config, |_| {});
    (srv, work)
}

/// Session `s` in `work` with agent `a`.
async fn session_with_agent(root: &Fid, work: &std::path::Path) {
    session_with_profiled_agent(root, work, None).await;
}

/// Session `s` in `work` with agent `a` under `profile` (the default one when `None`).
async fn session_with_profiled_agent(root: &Fid, work: &std::path::Path, profile: Option<&str>) {
    let spec = match profile {
        Some(p) => format!("name=a profile={p}"),
        None => "name=a".to_owned(),
    };
    new_session(root, work, &spec).await;
}

/// Waits (bounded) until `path` contains `needle`; returns the content.
async fn wait_for(root: &Fid, path: &str, needle: &str) -> String {
    wait_for_text(root, path, needle, Duration::from_secs(30)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_round_trip_runs_sandboxed_and_ends_with_the_answer() {
    let turns = concat!(
        r#"{"reasoning": "Look first.", "tool_calls": [{"name": "execute_code", "arguments": {"language": "bash", "code": "echo made > made.txt; if cat /etc/shadow >/dev/null 2>&1; then echo READ; else echo DENIED; fi"}}]}"#,
        "\n",
        r#"{"text": "Made made.txt; the shadow file stayed closed."}"#,
        "\n"
    );
    let (srv, work) = server(turns, "");
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    let mut ev = root.walk_path("eventwait").await.unwrap();
    ev.open(om::OREAD).await.unwrap();
    write(&root, "session/s/agent/a/prompt", "make a file").await;
    // The states the turn went through, from eventwait (the turn is over at idle).
    let mut states = Vec::new();
    while !states.iter().any(|s| s == "idle") {
        let d = ev.read(0, 8192).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&d).unwrap();
        if v["event"] == "agent-state" {
            states.push(v["state"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(
        states,
        ["thinking", "calling: execute_code", "thinking", "idle"],
        "{states:?}"
    );
    let raw = read(&root, "session/s/agent/a/log").await;
    // The blocks, in order.
    let kinds: Vec<&str> = raw
        .lines()
        .filter_map(|l| l.strip_prefix("[[["))
        .map(|l| l.split(' ').next().unwrap_or(""))
        .collect();
    assert_eq!(
        kinds,
        ["user", "reasoning", "tool_call", "tool_result", "assistant"],
        "{raw}"
    );
    assert!(raw.contains("[[[tool_call name=execute_code id="), "{raw}");
    // The tool ran in the sandbox: the file exists, the shadow file was denied.
    assert_eq!(
        std::fs::read_to_string(work.join("made.txt")).unwrap(),
        "made\n"
    );
    assert!(
        raw.contains("\nDENIED\n]]]") && !raw.contains("\nREAD\n"),
        "{raw}"
    );
    assert!(raw.contains("pid=1 exit=0"), "{raw}");
    // chat streams (a read at its end waits): one read of what is there.
    let mut cf = root.walk_path("session/s/agent/a/chat").await.unwrap();
    cf.open(om::OREAD).await.unwrap();
    let chat = String::from_utf8(cf.read(0, 65536).await.unwrap().to_vec()).unwrap();
    assert!(!chat.contains("[[["), "{chat}");
    assert!(chat.contains("Made made.txt; the shadow file stayed closed.\n"));
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_eq!(kv(&stats, "requests"), "2", "{stats}");
    assert_eq!(kv(&stats, "tool_calls"), "1", "{stats}");
    assert_eq!(kv(&stats, "errors"), "0", "{stats}");
    // The agent's process is visible in its proc/ view, exited.
    let top = read(&root, "session/s/agent/a/proc/top").await;
    assert!(
        top.contains("exited") && top.contains("execute_code"),
        "{top}"
    );
}

/// A refused write and a missing program: the result the model gets carries one line each
/// saying what the sandbox did, from the run record and the agent's policy
/// (olliesrv/src/agent/sandbox.rs), and the refused file was not made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_tells_the_model_what_the_sandbox_did() {
    let turns = concat!(
        r#"{"tool_calls": [{"name": "execute_code", "arguments": {"language": "bash", "code": "touch .git/planted; echo 'eval x' > .envrc; nosuchprogram_ollie"}}]}"#,
        "\n",
        r#"{"text": "Both refused."}"#,
        "\n"
    );
    let (srv, work) = server(turns, "");
    std::fs::create_dir(work.join(".git")).unwrap();
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    write(&root, "session/s/agent/a/prompt", "try").await;
    let raw = wait_for(&root, "session/s/agent/a/log", "Both refused.").await;
    let result = raw
        .split("[[[tool_result")
        .nth(1)
        .and_then(|r| r.split("]]]").next())
        .unwrap_or_else(|| panic!("no tool result: {raw}"));
    assert!(result.contains("exit=127"), "{result}");
    assert!(result.contains("Read-only file system"), "{result}");
    for want in [
        format!(
            "ollie: \"Read-only file system\" is the sandbox: only {} can be written",
            work.display()
        ),
        format!(
            "read-only even so: {}/.git, {}/.envrc",
            work.display(),
            work.display()
        ),
        "git cannot change .git here: leave commits to the user.".to_owned(),
        // The default profile asks for no escalations.
        "This agent cannot ask for more writes.".to_owned(),
        // .envrc did not exist: a placeholder stood there.
        format!("ollie: {}/.envrc is protected", work.display()),
        "ollie: a program was not found: PATH in the sandbox is /usr/local/bin:/usr/bin:/bin"
            .to_owned(),
    ] {
        assert!(result.contains(&want), "{want:?} in {result}");
    }
    assert!(!work.join(".envrc").exists(), ".envrc was left behind");
    assert!(!work.join(".git/planted").exists(), ".git/planted was made");
}

/// The repository's AGENTS.md reaches the system prompt (`ctl systemprompt`, what the model
/// is sent), and a symlinked AGENTS.override.md pointing at a file outside does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn project_instructions_reach_the_system_prompt_and_links_do_not() {
    let (srv, work) = server(r#"{"text": "ok"}"#, "");
    std::fs::create_dir(work.join(".git")).unwrap();
    std::fs::write(
        work.join("AGENTS.md"),
        "Run make check before you answer.\n",
    )
    .unwrap();
    let secret = work.parent().unwrap().join("id_ed25519");
    std::fs::write(&secret, "CANARY-PRIVATE-KEY").unwrap();
    std::os::unix::fs::symlink(&secret, work.join("AGENTS.override.md")).unwrap();
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    let sp = rdwr(&root, "session/s/agent/a/ctl", "systemprompt")
        .await
        .unwrap();
    assert!(sp.contains("Project instructions"), "{sp}");
    assert!(
        sp.contains(&format!(
            "--- {}/AGENTS.md ---\nRun make check before you answer.",
            work.display()
        )),
        "{sp}"
    );
    assert!(!sp.contains("CANARY"), "{sp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_returns_its_final_reply_on_the_same_fid() {
    let turns = concat!(r#"{"text": "the tests pass"}"#, "\n");
    let (srv, work) = server(turns, "");
    let (_c, root) = attach(&srv, &me()).await;
    rdwr(
        &root,
        "session/new",
        &format!("name=s cwd={}", work.display()),
    )
    .await
    .unwrap();
    let reply = rdwr(
        &root,
        "session/s/agent/new",
        "name=sub\nprompt=run the tests",
    )
    .await
    .unwrap();
    assert_eq!(reply, "the tests pass");
    // Each agent plays the script from its start: a second sub-agent gets the same reply.
    let again = rdwr(&root, "session/s/agent/new", "name=sub2\nprompt=again")
        .await
        .unwrap();
    assert_eq!(again, "the tests pass");
    // The first agent has used its script up: its next turn fails, in the chat and stats.
    write(&root, "session/s/agent/sub/prompt", "once more").await;
    let raw = wait_for(&root, "session/s/agent/sub/log", "the script has no turn 2").await;
    assert!(
        raw.contains("[[[error\nmodel call failed: replay backend demo"),
        "{raw}"
    );
    let stats = wait_for(&root, "session/s/agent/sub/stats", "errors=1").await;
    assert_eq!(kv(&stats, "turns"), "2", "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_answers_each_fid_with_its_own_reply() {
    let (srv, _work) = server(
        concat!(r#"{"text": "from demo"}"#, "\n"),
        concat!(r#"{"text": "from other"}"#, "\n"),
    );
    let (_c, root) = attach(&srv, &me()).await;
    let mut a = root.walk_path("generate").await.unwrap();
    a.open(om::ORDWR).await.unwrap();
    let mut b = root.walk_path("generate").await.unwrap();
    b.open(om::ORDWR).await.unwrap();
    let (ra, rb) = tokio::join!(
        a.write(0, Bytes::from_static(b"say something")),
        b.write(
            0,
            Bytes::from_static(br#"{"prompt": "say something", "backend": "other"}"#)
        )
    );
    ra.unwrap();
    rb.unwrap();
    assert_eq!(&a.read_to_end().await.unwrap()[..], b"from demo\n");
    assert_eq!(&b.read_to_end().await.unwrap()[..], b"from other\n");
    let e = b
        .write(0, Bytes::from_static(br#"{"prompt": "x", "colour": 1}"#))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("colour"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_during_a_long_tool_kills_it_and_ends_the_turn() {
    let turns = concat!(
        r#"{"tool_calls": [{"name": "execute_code", "arguments": {"language": "bash", "code": "sleep 1000"}}]}"#,
        "\n"
    );
    let (srv, work) = server(turns, "");
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    write(&root, "session/s/agent/a/prompt", "sleep").await;
    wait_for(&root, "session/s/agent/a/proc/top", "running").await;
    assert_eq!(
        rdwr(&root, "session/s/agent/a/ctl", "stop").await.unwrap(),
        "stopping\n"
    );
    // The info block comes first, then the turn's error block (written by the worker after
    // the turn returns): wait for the second, not only the first.
    let raw = wait_for(&root, "session/s/agent/a/log", "[[[error\nstopped\n]]]").await;
    assert!(raw.contains("stopped by ctl stop"), "{raw}");
    // The tool's process in toolsrv was stopped too.
    let top = wait_for(&root, "session/s/agent/a/proc/top", "killed").await;
    assert!(!top.contains("running"), "{top}");
    wait_for(&root, "session/s/agent/idx", "\tidle\n").await;
}

/// A tool process's run record (`proc/N/record` in toolsrv) is reachable through both of
/// olliesrv's views of toolsrv: the agent's `proc/N/` and the session's `toolsrv/proc/N/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_record_is_reachable_through_olliesrv() {
    let turns = concat!(
        r#"{"tool_calls": [{"name": "execute_code", "arguments": {"language": "bash", "code": "echo recorded"}}]}"#,
        "\n",
        r#"{"text": "done"}"#,
        "\n"
    );
    let (srv, work) = server(turns, "");
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    write(&root, "session/s/agent/a/prompt", "run it").await;
    wait_for(&root, "session/s/agent/a/proc/top", "exited").await;
    let mut d = root.walk_path("session/s/agent/a/proc/1").await.unwrap();
    d.open(om::OREAD).await.unwrap();
    let names: Vec<String> = d
        .read_dir()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert!(names.iter().any(|n| n == "record"), "{names:?}");
    let via_agent = read(&root, "session/s/agent/a/proc/1/record").await;
    let via_session = read(&root, "session/s/toolsrv/proc/1/record").await;
    assert_eq!(via_agent, via_session);
    assert!(via_agent.ends_with('\n'), "{via_agent:?}");
    let v: serde_json::Value = serde_json::from_str(&via_agent).unwrap();
    assert_eq!(v["argv"][2], "echo recorded", "{via_agent}");
    assert_eq!(v["exit"]["code"], 0, "{via_agent}");
    // Read-only in both views.
    for p in [
        "session/s/agent/a/proc/1/record",
        "session/s/toolsrv/proc/1/record",
    ] {
        let mut f = root.walk_path(p).await.unwrap();
        assert!(f.open(om::OWRITE).await.is_err(), "{p} opened for writing");
    }
}

/// A call with `"background": true` returns at once; when the process ends, its
/// `<system-proc-complete …>` message reaches the (by then idle) agent as a new prompt, and
/// the model answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_process_reports_back_when_it_ends() {
    let turns = concat!(
        r#"{"tool_calls": [{"name": "execute_code", "arguments": {"language": "bash", "code": "sleep 0.3; echo bg-finished", "background": true}}]}"#,
        "\n",
        r#"{"text": "Started it; I will look when it is done."}"#,
        "\n",
        r#"{"text": "The background job finished."}"#,
        "\n"
    );
    let (srv, work) = server(turns, "");
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    write(
        &root,
        "session/s/agent/a/prompt",
        "run it in the background",
    )
    .await;
    let raw = wait_for(
        &root,
        "session/s/agent/a/log",
        "The background job finished.",
    )
    .await;
    // The tool result says where the output will come from, and carries the pid.
    assert!(
        raw.contains("background=true]]]") || raw.contains("background=true\n"),
        "{raw}"
    );
    assert!(
        raw.contains("started in the background as process "),
        "{raw}"
    );
    // The completion arrived as the next turn's prompt, with the output.
    let second_user = raw
        .split("[[[user\n")
        .nth(2)
        .unwrap_or_else(|| panic!("no second user block:\n{raw}"));
    assert!(
        second_user.starts_with("<system-proc-complete id=\""),
        "{raw}"
    );
    assert!(second_user.contains("exit=\"0\""), "{raw}");
    assert!(second_user.contains("bg-finished"), "{raw}");
    let first_answer = raw.find("Started it;").unwrap();
    assert!(
        raw.find("<system-proc-complete id=").unwrap() > first_answer,
        "{raw}"
    );
    // The second turn's reply is in the log before the turn is counted as ended.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let stats = loop {
        let stats = read(&root, "session/s/agent/a/stats").await;
        if kv(&stats, "turns") == "2" || std::time::Instant::now() > deadline {
            break stats;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(kv(&stats, "turns"), "2", "{stats}");
    assert_eq!(kv(&stats, "errors"), "0", "{stats}");
}

/// `stop` while a tool runs leaves a well-formed history: the call the model made is
/// answered (as interrupted) before the next prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_keeps_the_history_well_formed() {
    let turns = concat!(
        r#"{"tool_calls": [{"name": "execute_code", "arguments": {"language": "bash", "code": "sleep 1000"}}]}"#,
        "\n",
        r#"{"text": "ok"}"#,
        "\n"
    );
    let (srv, work) = server(turns, "");
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    write(&root, "session/s/agent/a/prompt", "sleep").await;
    wait_for(&root, "session/s/agent/a/proc/top", "running").await;
    rdwr(&root, "session/s/agent/a/ctl", "stop").await.unwrap();
    wait_for(&root, "session/s/agent/idx", "\tidle\n").await;
    write(&root, "session/s/agent/a/prompt", "again").await;
    wait_for(&root, "session/s/agent/a/log", "[[[assistant\nok\n").await;
    let sid = read(&root, "session/s/id").await;
    let aid = read(&root, "session/s/agent/a/id").await;
    let hist = std::fs::read_to_string(
        srv.state_dir()
            .join("sessions")
            .join(sid.trim())
            .join("agents")
            .join(aid.trim())
            .join("history.jsonl"),
    )
    .unwrap();
    let msgs: Vec<serde_json::Value> = hist
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "user", "assistant"],
        "{hist}"
    );
    let call_id = msgs[1]["tool_calls"][0]["id"].as_str().unwrap();
    assert_eq!(msgs[2]["tool_call_id"], call_id, "{hist}");
    assert!(
        msgs[2]["content"].as_str().unwrap().contains("interrupted"),
        "{hist}"
    );
}

/// An agent asks for network access to one loopback port: the turn shows `waiting: bypass`,
/// the operator sees the request in `session/s/toolsrv/bypass/pending`, approves it on
/// `bypass/resolve`, and the command runs once with that port reachable; the same command
/// without the grant is refused by the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_escalation_runs_once_with_the_grant() {
    escalation_needs_a_profile_that_allows_it().await;
    let canary = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = canary.local_addr().unwrap().port();
    let code = format!(
        "if exec 3<>/dev/tcp/127.0.0.1/{port}; then echo connected-{port}; else echo refused; fi"
    );
    let call = |escalate: bool| {
        let mut args = serde_json::json!({"language": "bash", "code": code});
        if escalate {
            args["escalate"] = serde_json::json!({
                "grants": [format!("net:{port}")],
                "reason": "talk to the local test server"
            });
        }
        serde_json::json!({"tool_calls": [{"name": "execute_code", "arguments": args}]})
    };
    let turns = format!(
        "{}\n{}\n{}\n{}\n",
        call(true),
        r#"{"text": "Connected with the grant."}"#,
        call(false),
        r#"{"text": "Without the grant it was refused."}"#
    );
    let (srv, work) = server(&turns, "");
    // A profile that may ask for network access (the default may ask for nothing).
    std::fs::create_dir_all(srv.dir.path().join("agents")).unwrap();
    std::fs::write(
        srv.dir.path().join("agents").join("asker.toml"),
        "escalations = [\"net\"]\n",
    )
    .unwrap();
    let (_c, root) = attach(&srv, &me()).await;
    assert_eq!(
        rdwr(&root, "ctl", "invalidate")
            .await
            .unwrap()
            .lines()
            .next(),
        Some("config reloaded: 2 backends")
    );
    session_with_profiled_agent(&root, &work, Some("asker")).await;
    let mut sw = root.walk_path("session/s/agent/a/statewait").await.unwrap();
    sw.open(om::OREAD).await.unwrap();
    write(&root, "session/s/agent/a/prompt", "connect").await;
    // The operator's view: one request, with what will run and what it asks for.
    let mut pending = root
        .walk_path("session/s/toolsrv/bypass/pending")
        .await
        .unwrap();
    pending.open(om::OREAD).await.unwrap();
    let req = tokio::time::timeout(Duration::from_secs(30), pending.read(0, 65536))
        .await
        .expect("no request reached bypass/pending")
        .unwrap();
    let req: serde_json::Value = serde_json::from_slice(&req).unwrap();
    assert_eq!(
        req["grants"],
        serde_json::json!([format!("net:{port}")]),
        "{req}"
    );
    assert_eq!(req["reason"], "talk to the local test server", "{req}");
    assert_eq!(req["tool"], "execute_code", "{req}");
    assert!(
        req["argv"][2]
            .as_str()
            .unwrap()
            .contains(&format!("/dev/tcp/127.0.0.1/{port}"))
    );
    assert_eq!(
        req["executable"]["sha256"].as_str().unwrap().len(),
        64,
        "{req}"
    );
    let id = req["id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 32, "{req}");
    // Waiting for the human.
    let mut states = Vec::new();
    while states.last().map(String::as_str) != Some("waiting: bypass") {
        let s = tokio::time::timeout(Duration::from_secs(30), sw.read(0, 64))
            .await
            .expect("no waiting: bypass state")
            .unwrap();
        states.push(String::from_utf8_lossy(&s).trim().to_owned());
    }
    // The root view shows the same request (every session's, once per fid).
    let mut all = root.walk_path("bypass/pending").await.unwrap();
    all.open(om::OREAD).await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(30), all.read(0, 65536))
        .await
        .expect("the root bypass/pending showed nothing")
        .unwrap();
    let seen: serde_json::Value = serde_json::from_slice(&seen).unwrap();
    assert_eq!(seen["id"], id.as_str(), "{seen}");
    // With the names a person knows, next to toolsrv's ids.
    assert_eq!(seen["session_name"], "s", "{seen}");
    assert_eq!(seen["agent_name"], "a", "{seen}");
    assert_eq!(seen["agent"], req["agent"], "{seen}");
    // Answered through the root resolve, which finds the session.
    let verdict = format!(r#"{{"id":"{id}","approved":true}}"#);
    let mut r = root.walk_path("bypass/resolve").await.unwrap();
    r.open(om::OWRITE).await.unwrap();
    r.write(0, Bytes::from(verdict.clone())).await.unwrap();
    let raw = wait_for(&root, "session/s/agent/a/log", "Connected with the grant.").await;
    assert!(raw.contains(&format!("\nconnected-{port}\n")), "{raw}");
    // The id is single use.
    let e = r.write(0, Bytes::from(verdict)).await.unwrap_err();
    assert!(e.to_string().contains("already answered"), "{e}");
    // The server's log has the request and the decision, at INFO, with who decided.
    let log = srv.stderr();
    let line = |kind: &str| {
        log.lines()
            .find(|l| l.contains(&format!("escalation: {kind}")) && l.contains(&id))
            .unwrap_or_else(|| panic!("no {kind} line for {id}: {log}"))
            .to_owned()
    };
    let asked = line("bypass-requested");
    assert!(asked.contains("INFO"), "{asked}");
    assert!(asked.contains("tool=execute_code"), "{asked}");
    let decided = line("bypass-resolved");
    assert!(decided.contains("INFO"), "{decided}");
    assert!(decided.contains("verdict=\"approved\""), "{decided}");
    assert!(decided.contains(&format!("by=\"{}\"", me())), "{decided}");
    // The audit log has the request, the verdicts (accepted and refused) and the run.
    let audit = wait_for(&root, "bypass/audit", "\"event\":\"ran\"").await;
    let events: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    let mut sorted = kinds.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "decision",
            "decision-refused",
            "hold",
            "ran",
            "release",
            "request"
        ],
        "{audit}"
    );
    // The session's hold (its two log events, read apart from the request) aside, the
    // request comes first.
    let events: Vec<serde_json::Value> = events
        .into_iter()
        .filter(|e| e["event"] != "hold")
        .collect();
    assert_eq!(events[0]["event"], "request", "{audit}");
    assert_eq!(events[0]["id"], id.as_str(), "{audit}");
    assert_eq!(
        events[0]["grants"],
        serde_json::json!([format!("net:{port}")]),
        "{audit}"
    );
    assert_eq!(events[0]["digest"].as_str().unwrap().len(), 64, "{audit}");
    assert_eq!(events[0]["agent_name"], "a", "{audit}");
    let by = |k: &str| events.iter().find(|e| e["event"] == k).unwrap();
    assert_eq!(by("decision")["verdict"], "approved", "{audit}");
    assert_eq!(by("ran")["id"], id.as_str(), "{audit}");
    assert_eq!(by("ran")["status"], 0, "{audit}");
    assert_eq!(by("ran")["session"], events[0]["session"], "{audit}");
    assert_eq!(by("ran")["digest"], events[0]["digest"], "{audit}");
    // Approval never widens a later run: the same command without the grant is refused.
    write(&root, "session/s/agent/a/prompt", "again, without asking").await;
    let raw = wait_for(&root, "session/s/agent/a/log", "Without the grant").await;
    let second = raw.split("again, without asking").nth(1).unwrap();
    assert!(second.contains("\nrefused\n"), "{raw}");
    assert!(!second.contains(&format!("\nconnected-{port}\n")), "{raw}");
    drop(canary);
}

/// The default profile may ask for no escalation at all: the call is refused at once and
/// nothing reaches the operator.
async fn escalation_needs_a_profile_that_allows_it() {
    let call = serde_json::json!({"tool_calls": [{"name": "execute_code", "arguments": {
        "language": "bash", "code": "echo hi",
        "escalate": {"grants": ["net:80"], "reason": "r"}}}]});
    let turns = format!("{call}\n{}\n", r#"{"text": "done"}"#);
    let (srv, work) = server(&turns, "");
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    write(&root, "session/s/agent/a/prompt", "go").await;
    let raw = wait_for(&root, "session/s/agent/a/log", "[[[assistant\ndone").await;
    assert!(
        raw.contains("this agent's profile does not let it ask for net:80 (its escalations: none)"),
        "{raw}"
    );
    // The refusal is audited (from toolsrv's bypass/log); nothing was asked.
    let audit = wait_for(&root, "bypass/audit", "\"event\":\"refused\"").await;
    assert!(!audit.contains("\"event\":\"request\""), "{audit}");
    let refused: serde_json::Value = serde_json::from_str(audit.lines().next().unwrap()).unwrap();
    // Sessions and agents are named by their ids in toolsrv.
    assert_eq!(refused["agent"].as_str().unwrap().len(), 36, "{audit}");
    assert_eq!(refused["grants"], serde_json::json!(["net:80"]), "{audit}");
    assert!(
        refused["why"]
            .as_str()
            .unwrap()
            .contains("profile does not let it ask"),
        "{audit}"
    );
}

/// `bypass_timeout_s` in config.toml: a request nobody answers is denied after it, the
/// agent gets the reason, and the audit log records the expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_escalation_is_denied_at_the_configured_deadline() {
    let call = serde_json::json!({"tool_calls": [{"name": "execute_code", "arguments": {
        "language": "bash", "code": "echo should-not-run",
        "escalate": {"grants": ["net:9"], "reason": "r"}}}]});
    let turns = format!("{call}\n{}\n", r#"{"text": "gave up"}"#);
    let (srv, work) = server_with(
        &turns,
        "",
        "bypass_timeout_s = 1",
        "escalations = [\"net\"]\n",
    );
    let (_c, root) = attach(&srv, &me()).await;
    session_with_profiled_agent(&root, &work, Some("asker")).await;
    write(&root, "session/s/agent/a/prompt", "go").await;
    let raw = wait_for(&root, "session/s/agent/a/log", "[[[assistant\ngave up").await;
    assert!(
        raw.contains("no answer from the operator within 1 s; nothing was run"),
        "{raw}"
    );
    assert!(!raw.contains("\nshould-not-run\n"), "{raw}");
    let audit = wait_for(&root, "bypass/audit", "\"event\":\"expired\"").await;
    assert!(audit.contains("\"event\":\"request\""), "{audit}");
}

/// ESCAPES I51–I53: while a request is pending, a tool of another agent of the same session
/// tries to answer it itself: through olliesrv's socket (connect), by finding a `resolve`
/// file, and by looking for the id in its environment. Nothing works, and the request is
/// still pending afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_tool_cannot_answer_a_pending_request() {
    let asks = serde_json::json!({"tool_calls": [{"name": "execute_code", "arguments": {
        "language": "bash", "code": "echo asked",
        "escalate": {"grants": ["net:9"], "reason": "r"}}}]});
    let (srv, work) = server_with(&format!("{asks}\n"), "", "", "escalations = [\"net\"]\n");
    let sock = srv.sock.display().to_string();
    let ns = srv.sock.parent().unwrap().display().to_string();
    let attack = format!(
        "python3 - <<'PY'\nimport socket, os, glob\ntry:\n    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n    s.connect({sock:?})\n    print('CONNECTED')\nexcept OSError as e:\n    print('connect refused', e.errno)\ntry:\n    print('LISTED', os.listdir({ns:?}))\nexcept OSError as e:\n    print('list refused', e.errno)\nprint('found', [p for p in glob.glob('/**/resolve', recursive=True) if 'bypass' in p])\nprint('env', [k for k in os.environ if 'BYPASS' in k.upper() or 'OLLIE' in k.upper()])\nPY"
    );
    let other = serde_json::json!({"tool_calls": [{"name": "execute_code", "arguments": {
        "language": "bash", "code": attack}}]});
    let other = format!("{other}\n{}\n", r#"{"text": "tried"}"#);
    std::fs::write(srv.dir.path().join("other.jsonl"), other).unwrap();
    let (_c, root) = attach(&srv, &me()).await;
    session_with_profiled_agent(&root, &work, Some("asker")).await;
    write(&root, "session/s/agent/a/prompt", "ask").await;
    let mut pending = root.walk_path("bypass/pending").await.unwrap();
    pending.open(om::OREAD).await.unwrap();
    let req = tokio::time::timeout(Duration::from_secs(30), pending.read(0, 65536))
        .await
        .expect("no request")
        .unwrap();
    let req: serde_json::Value = serde_json::from_slice(&req).unwrap();
    let id = req["id"].as_str().unwrap().to_owned();
    // The attacker: an agent of another session, in another tree, on the other replay
    // script (a call of the same session, or of one in the same tree, waits until the
    // request is answered: nothing else of it runs meanwhile).
    let elsewhere = srv.dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    rdwr(
        &root,
        "session/new",
        &format!("name=t cwd={}", elsewhere.display()),
    )
    .await
    .unwrap();
    rdwr(&root, "session/t/agent/new", "name=b backend=other")
        .await
        .unwrap();
    write(&root, "session/t/agent/b/prompt", "try").await;
    let raw = wait_for(&root, "session/t/agent/b/log", "[[[assistant\ntried").await;
    assert!(raw.contains("connect refused"), "{raw}");
    assert!(!raw.contains("\nCONNECTED\n"), "{raw}");
    assert!(
        raw.contains("list refused") || raw.contains("LISTED []"),
        "{raw}"
    );
    assert!(raw.contains("found []"), "{raw}");
    assert!(raw.contains("env []"), "{raw}");
    assert!(!raw.contains(&id), "the tool saw the request id:\n{raw}");
    // Still pending: a fresh reader of the session's own file sees it.
    let mut fresh = root
        .walk_path("session/s/toolsrv/bypass/pending")
        .await
        .unwrap();
    fresh.open(om::OREAD).await.unwrap();
    let again = tokio::time::timeout(Duration::from_secs(10), fresh.read(0, 65536))
        .await
        .expect("the request is gone")
        .unwrap();
    assert!(String::from_utf8_lossy(&again).contains(&id));
    let audit = read(&root, "bypass/audit").await;
    assert!(!audit.contains("\"event\":\"decision"), "{audit}");
}
