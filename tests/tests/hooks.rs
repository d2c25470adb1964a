//! Lifecycle hooks end to end: a real olliesrv runs an agent profile's `[hooks]` commands in
//! the session's real toolsrv (as the identity `<agent-id>.hook`, under `hook_policy`), with
//! the event as JSON on stdin and `OLLIE_*` in the environment.
//!
//! Covers: every event fires with its fields and environment (a `workspace` hook writes
//! them into the agent's cwd); exit 0 output reaches the model where each event puts it (the
//! requests a fake OpenAI server got); exit 2 blocks `pre_tool` (the tool does not run, the
//! later hooks of the event neither), `pre_turn` (no model call), `post_turn` (the reason goes
//! back to the model, within `max_steps`), `agent_spawn` (every turn fails, also after a
//! restart) and `pre_compact` (no compaction), fails a `post_tool` call, and puts the reason of
//! `turn_error` and `post_compact` into the history; `agent_spawn` fires once and not on
//! restore; failing, killed and hanging hooks (`hook_timeout_s`) leave the turn going;
//! flooding hooks are bounded; the sandbox holds (`readonly`, the default, writes nothing and
//! reaches no network; `workspace` and a user policy are the positive controls; a policy
//! tightened by `invalidate` applies at once); large events still reach their hooks, and an
//! oversized call does not slip past a `pre_tool` hook; a hook's processes are not the
//! agent's; bad hook settings stop olliesrv with one line naming the key.
//!
//! Without Landlock ABI 7 or user namespaces a case prints `SKIP <case>: <reason>` (and fails
//! with `OLLIE_TEST_REQUIRE=all`). No assertion is about time: every wait is bounded and fails
//! with what it saw.
// Scenario tests read top to bottom; splitting them would hide the story.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod fake_llm;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::toolsrv::{NETWORK_TOML, features_ok, poll, sleep_marker, unique, wait_marker_gone};
use common::{Srv, attach, bin, me, text};
use fake_llm::*;
use ollie_p9::Fid;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------
// Fixtures

/// How long a test waits for a turn, a file or a process before it fails.
const GUARD: Duration = Duration::from_secs(60);

/// The model a test's olliesrv talks to.
enum Model<'a> {
    /// The `replay` backend playing these turns.
    Replay(&'a [Value]),
    /// The fake OpenAI server.
    Fake(&'a FakeLlm),
}

/// A running olliesrv with profiles under `agents/`, and our attachment.
struct H {
    srv: Srv,
    /// The sessions' cwd.
    work: PathBuf,
    /// Its parent (the server's temporary directory): outside the workspace.
    top: PathBuf,
    root: Fid,
    _c: ollie_p9::Client,
}

/// `event = ["cmd", …]` lines for a `[hooks]` table (JSON strings are TOML basic strings).
fn hooks_table(hooks: &[(&str, &[&str])]) -> String {
    let mut s = String::from("[hooks]\n");
    for (event, cmds) in hooks {
        s.push_str(&format!(
            "{event} = {}\n",
            serde_json::to_string(cmds).unwrap()
        ));
    }
    s
}

/// In a profile's text: the server's temporary directory (the parent of `work`).
const TOP: &str = "@TOP@";

/// Starts olliesrv with `profiles` (name, TOML; [`TOP`] replaced) as `agents/NAME.toml` and
/// `policies` as `policy/NAME.toml`, using `model`.
async fn start(profiles: &[(&str, String)], policies: &[(&str, String)], model: Model<'_>) -> H {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::create_dir(dir.path().join("agents")).unwrap();
    let top = dir.path().display().to_string();
    for (name, toml) in profiles {
        std::fs::write(
            dir.path().join("agents").join(format!("{name}.toml")),
            toml.replace(TOP, &top),
        )
        .unwrap();
    }
    if !policies.is_empty() {
        std::fs::create_dir(dir.path().join("policy")).unwrap();
        for (name, toml) in policies {
            std::fs::write(dir.path().join("policy").join(format!("{name}.toml")), toml).unwrap();
        }
    }
    let config = match model {
        Model::Replay(turns) => {
            let script: String = turns.iter().map(|t| format!("{t}\n")).collect();
            let file = dir.path().join("turns.jsonl");
            std::fs::write(&file, script).unwrap();
            format!(
                "default_backend = \"demo\"\n\n[backends.demo]\nkind = \"replay\"\nfile = {:?}\n",
                file.display().to_string()
            )
        }
        Model::Fake(fake) => format!(
            "default_backend = \"fake\"\n\n[backends.fake]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"m\"\napi_key_env = \"OLLIE_FAKE_KEY\"\n",
            fake.url()
        ),
    };
    let top = dir.path().to_path_buf();
    let srv = Srv::start_with(dir, &config, |c| {
        c.env("OLLIE_FAKE_KEY", KEY);
    });
    let (c, root) = attach(&srv, &me()).await;
    H {
        srv,
        work,
        top,
        root,
        _c: c,
    }
}

/// Session `s` in `work` (created once) with agent `name` under `profile`.
async fn agent(h: &H, name: &str, profile: &str) {
    if read_opt(&h.root, "session/s/id").await.is_none() {
        rdwr(
            &h.root,
            "session/new",
            &format!("name=s cwd={}", h.work.display()),
        )
        .await
        .unwrap();
    }
    rdwr(
        &h.root,
        "session/s/agent/new",
        &format!("name={name} profile={profile}"),
    )
    .await
    .unwrap_or_else(|e| panic!("agent/new {name} profile={profile}: {e}"));
}

async fn read_opt(root: &Fid, path: &str) -> Option<String> {
    let mut f = root.walk_path(path).await.ok()?;
    f.open(ollie_p9::wire::om::OREAD).await.ok()?;
    Some(String::from_utf8(f.read_to_end().await.ok()?).unwrap())
}

/// Sends `prompt` to agent `name` and waits (bounded) until it has finished `n` turns in all;
/// returns its `stats`.
async fn turn(h: &H, name: &str, prompt: &str, n: u64) -> String {
    write(&h.root, &format!("session/s/agent/{name}/prompt"), prompt)
        .await
        .unwrap();
    wait_turns(h, name, n).await
}

/// Waits (bounded) until agent `name` has finished `n` turns; returns its `stats`. Between
/// looks it blocks in a `statewait` read, which returns at the agent's next state change
/// (a turn's end is one: its count goes up before the state rests).
async fn wait_turns(h: &H, name: &str, n: u64) -> String {
    let mut sw = h
        .root
        .walk_path(&format!("session/s/agent/{name}/statewait"))
        .await
        .unwrap();
    sw.open(ollie_p9::wire::om::OREAD).await.unwrap();
    loop {
        let st = read(&h.root, &format!("session/s/agent/{name}/stats")).await;
        if kv(&st, "turns").parse::<u64>().unwrap_or(0) >= n {
            return st;
        }
        if tokio::time::timeout(GUARD, sw.read(0, 256)).await.is_err() {
            panic!(
                "agent {name} never finished {n} turns; stats:\n{st}\nchat:\n{}",
                read(&h.root, &format!("session/s/agent/{name}/log")).await
            );
        }
    }
}

/// The agent's whole `chat.raw` (from the state directory: `log` is only its last 64 KiB).
async fn chat_raw(h: &H, name: &str) -> String {
    let (sid, aid) = ids(h, name).await;
    let p = h
        .srv
        .state_dir()
        .join("sessions")
        .join(sid)
        .join("agents")
        .join(aid)
        .join("chat.raw");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The chat's blocks of agent `name`.
async fn chat(h: &H, name: &str) -> Vec<Block> {
    blocks(&chat_raw(h, name).await)
}

/// Whether a block's attributes carry `hook=EVENT`.
fn is_hook(b: &Block, event: &str) -> bool {
    b.kind == "info"
        && b.attrs
            .split_whitespace()
            .any(|w| w == format!("hook={event}"))
}

/// The `info` blocks of `event`.
fn hook_infos<'b>(bs: &'b [Block], event: &str) -> Vec<&'b Block> {
    bs.iter().filter(|b| is_hook(b, event)).collect()
}

/// Whether an info block reports a failed hook.
fn failed(b: &Block) -> bool {
    b.attrs.contains("failed") || b.body.contains("failed")
}

/// The context a hook's stdout becomes.
fn ctx(event: &str, said: &str) -> String {
    format!("<hook event=\"{event}\">\n{said}\n</hook>")
}

/// The ids of session `s` and agent `name`.
async fn ids(h: &H, name: &str) -> (String, String) {
    (
        read(&h.root, "session/s/id").await.trim().to_owned(),
        read(&h.root, &format!("session/s/agent/{name}/id"))
            .await
            .trim()
            .to_owned(),
    )
}

/// The agent's history as the model will see it (`history.jsonl`).
async fn history(h: &H, name: &str) -> Vec<Value> {
    let (sid, aid) = ids(h, name).await;
    let p = h
        .srv
        .state_dir()
        .join("sessions")
        .join(sid)
        .join("agents")
        .join(aid)
        .join("history.jsonl");
    std::fs::read_to_string(&p)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits (bounded) until `path` exists and has at least `n` lines; returns them.
async fn wait_lines(path: &Path, n: usize) -> Vec<String> {
    let ok = poll(GUARD, || {
        std::fs::read_to_string(path).is_ok_and(|t| t.lines().count() >= n)
    })
    .await;
    let t = std::fs::read_to_string(path).unwrap_or_default();
    assert!(ok, "{} never had {n} lines: {t:?}", path.display());
    t.lines().map(str::to_owned).collect()
}

/// One OpenAI `chat.completion.chunk` event.
fn chunk(delta: Value, finish: Option<&str>) -> String {
    let c = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}")
}

/// A text answer.
fn answer(t: &str) -> Reply {
    Reply::sse(&[
        chunk(json!({"role": "assistant", "content": t}), None),
        chunk(json!({}), Some("stop")),
        "data: [DONE]".to_owned(),
    ])
}

/// A reply making these calls: (id, name, arguments).
fn calls(cs: &[(&str, &str, Value)]) -> Reply {
    let mut ev = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    for (i, (id, name, args)) in cs.iter().enumerate() {
        ev.push(chunk(
            json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                "function": {"name": name, "arguments": args.to_string()}}]}),
            None,
        ));
    }
    ev.push(chunk(json!({}), Some("tool_calls")));
    ev.push("data: [DONE]".to_owned());
    Reply::sse(&ev)
}

/// A 400 error the backend does not retry.
fn bad_request(message: &str) -> Reply {
    Reply::json(
        400,
        &json!({"error": {"message": message, "type": "invalid_request_error",
            "param": null, "code": null}}),
    )
}

fn bash(code: &str) -> Value {
    json!({"language": "bash", "code": code})
}

/// A replay turn calling `execute_code` with bash `code`.
fn replay_exec(code: &str) -> Value {
    json!({"tool_calls": [{"name": "execute_code", "arguments": bash(code)}]})
}

fn replay_text(t: &str) -> Value {
    json!({ "text": t })
}

/// The `messages` of a request.
fn messages(g: &Got) -> Vec<Value> {
    g.json()["messages"].as_array().cloned().unwrap_or_default()
}

/// The user messages' contents of a request.
fn user_texts(g: &Got) -> Vec<String> {
    messages(g)
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

fn content(m: &Value) -> &str {
    m["content"].as_str().unwrap_or("")
}

/// The position of the message with exactly this role and content.
fn position(ms: &[Value], role: &str, text: &str) -> Option<usize> {
    ms.iter()
        .position(|m| m["role"] == role && content(m) == text)
}

// ---------------------------------------------------------------------------------------
// Every event, its JSON and its environment

/// Appends the event (stdin) to `hooks/EVENT.jsonl`, the variables to `hooks/EVENT.env` and
/// the working directory to `hooks/EVENT.pwd` (relative paths: the cwd is the agent's).
const RECORD: &str = r#"e=$(cat); printf '%s\n' "$e" >> "hooks/$OLLIE_EVENT.jsonl"; for v in OLLIE_EVENT OLLIE_SESSION_ID OLLIE_SESSION_NAME OLLIE_AGENT_ID OLLIE_AGENT_NAME OLLIE_CWD OLLIE_PROFILE OLLIE_TOOL; do printf '%s=%s\n' "$v" "${!v-(unset)}"; done > "hooks/$OLLIE_EVENT.env"; pwd -P > "hooks/$OLLIE_EVENT.pwd""#;

const EVENTS: [&str; 8] = [
    "agent_spawn",
    "pre_turn",
    "post_turn",
    "pre_tool",
    "post_tool",
    "pre_compact",
    "post_compact",
    "turn_error",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_fires_with_its_json_fields_and_environment() {
    if !features_ok("every_event_fires_with_its_json_fields_and_environment") {
        return;
    }
    let all: Vec<(&str, &[&str])> = EVENTS.iter().map(|e| (*e, &[RECORD][..])).collect();
    let profile = format!("hook_policy = \"workspace\"\n{}", hooks_table(&all));
    let turns = [
        replay_exec("echo tool-ran"),
        replay_text("first answer"),
        replay_text("SUMMARY of the first prompt"),
    ];
    let h = start(&[("h", profile)], &[], Model::Replay(&turns)).await;
    std::fs::create_dir(h.work.join("hooks")).unwrap();
    let dir = h.work.join("hooks");
    agent(&h, "a", "h").await;
    let (sid, aid) = ids(&h, "a").await;
    let file = |e: &str, ext: &str| dir.join(format!("{e}.{ext}"));
    wait_lines(&file("agent_spawn", "jsonl"), 1).await;

    // A turn with one tool call.
    turn(&h, "a", "first prompt", 1).await;
    wait_lines(&file("post_turn", "jsonl"), 1).await;
    // A compaction by ctl compact.
    let before = history(&h, "a").await.len();
    let r = rdwr(&h.root, "session/s/agent/a/ctl", "compact")
        .await
        .unwrap();
    let (summarized, kept) = {
        let rest = r
            .strip_prefix("compacted: ")
            .unwrap_or_else(|| panic!("{r}"));
        let (s, rest) = rest.split_once(" messages summarized, ").unwrap();
        (
            s.parse::<u64>().unwrap(),
            rest.trim_end()
                .strip_suffix(" kept")
                .unwrap()
                .parse::<u64>()
                .unwrap(),
        )
    };
    wait_lines(&file("post_compact", "jsonl"), 1).await;
    // A turn that fails: the script has no fourth turn.
    let st = turn(&h, "a", "second prompt", 2).await;
    assert_eq!(kv(&st, "errors"), "1", "{st}");
    wait_lines(&file("turn_error", "jsonl"), 1).await;

    let bs = chat(&h, "a").await;
    let call_id = bs
        .iter()
        .find(|b| b.kind == "tool_call")
        .and_then(|b| {
            b.attrs
                .split_whitespace()
                .find_map(|w| w.strip_prefix("id="))
        })
        .unwrap_or_else(|| panic!("no tool_call block: {bs:?}"))
        .to_owned();
    let turn_error = bs
        .iter()
        .rfind(|b| b.kind == "error")
        .unwrap_or_else(|| panic!("no error block: {bs:?}"))
        .body
        .trim()
        .to_owned();
    let cwd = std::fs::canonicalize(&h.work).unwrap();
    let want_counts = [
        ("agent_spawn", 1),
        ("pre_turn", 2),
        ("post_turn", 1),
        ("pre_tool", 1),
        ("post_tool", 1),
        ("pre_compact", 1),
        ("post_compact", 1),
        ("turn_error", 1),
    ];
    for (event, count) in want_counts {
        let lines = wait_lines(&file(event, "jsonl"), count).await;
        assert_eq!(lines.len(), count, "{event}: {lines:?}");
        for l in &lines {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{event}: stdin is not one line of JSON ({e}): {l}"));
            assert_eq!(v["event"], event, "{l}");
            assert_eq!(v["session_id"], sid.as_str(), "{l}");
            assert_eq!(v["session_name"], "s", "{l}");
            assert_eq!(v["agent_id"], aid.as_str(), "{l}");
            assert_eq!(v["agent_name"], "a", "{l}");
            assert_eq!(v["profile"], "h", "{l}");
            let c = v["cwd"].as_str().unwrap_or_else(|| panic!("no cwd: {l}"));
            assert_eq!(std::fs::canonicalize(c).unwrap(), cwd, "{l}");
        }
        // The environment says the same; OLLIE_TOOL only for the tool events.
        let env = std::fs::read_to_string(file(event, "env")).unwrap();
        let v: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
        let tool = if event.ends_with("_tool") {
            "execute_code"
        } else {
            "(unset)"
        };
        let want = format!(
            "OLLIE_EVENT={event}\nOLLIE_SESSION_ID={sid}\nOLLIE_SESSION_NAME=s\nOLLIE_AGENT_ID={aid}\nOLLIE_AGENT_NAME=a\nOLLIE_CWD={}\nOLLIE_PROFILE=h\nOLLIE_TOOL={tool}\n",
            v["cwd"].as_str().unwrap()
        );
        if event.ends_with("_tool") {
            assert_eq!(env, want, "{event}");
        } else {
            // Not documented for other events: only check the documented ones.
            let (head, _) = want.rsplit_once("OLLIE_TOOL=").unwrap();
            assert!(env.starts_with(head), "{event}: {env}");
        }
        // It ran in the agent's cwd.
        let pwd = std::fs::read_to_string(file(event, "pwd")).unwrap();
        assert_eq!(Path::new(pwd.trim()), cwd, "{event}");
    }
    let one = |event: &str, i: usize| -> Value {
        let t = std::fs::read_to_string(file(event, "jsonl")).unwrap();
        serde_json::from_str(t.lines().nth(i).unwrap()).unwrap()
    };
    let keys = |v: &Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    let common_keys = [
        "agent_id",
        "agent_name",
        "cwd",
        "event",
        "profile",
        "session_id",
        "session_name",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        let mut k: Vec<String> = common_keys
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect();
        k.sort();
        k
    };
    assert_eq!(keys(&one("agent_spawn", 0)), with(&[]));

    let v = one("pre_turn", 0);
    assert_eq!(keys(&v), with(&["prompt"]), "{v}");
    assert_eq!(v["prompt"], "first prompt");
    assert_eq!(one("pre_turn", 1)["prompt"], "second prompt");

    let v = one("post_turn", 0);
    assert_eq!(keys(&v), with(&["prompt", "reply"]), "{v}");
    assert_eq!(v["prompt"], "first prompt");
    assert_eq!(v["reply"], "first answer");

    let v = one("pre_tool", 0);
    assert_eq!(keys(&v), with(&["arguments", "call_id", "tool"]), "{v}");
    assert_eq!(v["tool"], "execute_code");
    assert_eq!(v["call_id"], call_id.as_str(), "{v}");
    assert_eq!(v["arguments"], bash("echo tool-ran"), "{v}");

    let v = one("post_tool", 0);
    assert_eq!(
        keys(&v),
        with(&["arguments", "call_id", "ok", "result", "tool"]),
        "{v}"
    );
    assert_eq!(v["tool"], "execute_code");
    assert_eq!(v["call_id"], call_id.as_str(), "{v}");
    assert_eq!(v["arguments"], bash("echo tool-ran"), "{v}");
    assert!(v["result"].as_str().unwrap().contains("tool-ran\n"), "{v}");
    assert_eq!(v["ok"], true, "{v}");

    let v = one("pre_compact", 0);
    assert_eq!(keys(&v), with(&["messages", "reason"]), "{v}");
    let reason = v["reason"].as_str().unwrap().to_owned();
    assert!(reason.contains("ctl compact"), "{v}");
    assert_eq!(v["messages"], before, "history had {before} messages: {v}");

    let v = one("post_compact", 0);
    assert_eq!(
        keys(&v),
        with(&["kept", "reason", "summarized", "summary"]),
        "{v}"
    );
    assert_eq!(v["reason"], reason.as_str(), "{v}");
    assert_eq!(v["summarized"], summarized, "{v} after {r}");
    assert_eq!(v["kept"], kept, "{v} after {r}");
    assert_eq!(v["summary"], "SUMMARY of the first prompt", "{v}");

    let v = one("turn_error", 0);
    assert_eq!(keys(&v), with(&["error", "prompt"]), "{v}");
    assert_eq!(v["prompt"], "second prompt");
    let e = v["error"].as_str().unwrap();
    assert!(e.contains("the script has no turn 4"), "{v}");
    assert_eq!(e, turn_error, "the chat's error block says {turn_error:?}");

    // Hooks that print nothing add nothing: no hook context in the history.
    let hist = history(&h, "a").await;
    assert!(
        hist.iter().all(|m| !content(m).contains("<hook ")),
        "{hist:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Exit 0: context

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_0_output_is_context_where_each_event_puts_it() {
    if !features_ok("exit_0_output_is_context_where_each_event_puts_it") {
        return;
    }
    let fake = FakeLlm::start(vec![
        calls(&[("call_1", "execute_code", bash("echo tool-out"))]),
        answer("first answer"),
        bad_request("the fake says no"),
        answer("third answer"),
        answer("THE SUMMARY"),
        answer("fourth answer"),
    ])
    .await;
    let profile = hooks_table(&[
        ("agent_spawn", &["echo 'spawn says hi'"]),
        (
            "pre_turn",
            &[
                // Surrounding blank lines and spaces are trimmed; whitespace alone is nothing.
                r#"printf '\n  pre-turn for %s  \n\n' "$OLLIE_AGENT_NAME""#,
                "echo; echo '   '",
            ],
        ),
        ("pre_tool", &["echo pre-tool-note"]),
        ("post_tool", &["echo post-tool-note"]),
        ("post_turn", &["echo post-turn-note"]),
        ("turn_error", &["echo turn-error-note"]),
        ("pre_compact", &["echo keep-the-file-names"]),
        ("post_compact", &["echo post-compact-note"]),
    ]);
    let h = start(&[("h", profile)], &[], Model::Fake(&fake)).await;
    agent(&h, "a", "h").await;
    turn(&h, "a", "first prompt", 1).await;
    let st = turn(&h, "a", "second prompt", 2).await;
    assert_eq!(kv(&st, "errors"), "1", "{st}");
    turn(&h, "a", "third prompt", 3).await;
    let r = rdwr(&h.root, "session/s/agent/a/ctl", "compact")
        .await
        .unwrap();
    assert!(r.starts_with("compacted: "), "{r}");
    turn(&h, "a", "fourth prompt", 4).await;
    let posts = fake.posts();
    assert_eq!(posts.len(), 6, "{posts:?}");

    // 1: agent_spawn before the first prompt, pre_turn right after it.
    let m = messages(&posts[0]);
    assert_eq!(m[0]["role"], "system", "{m:?}");
    let spawn = position(&m, "user", &ctx("agent_spawn", "spawn says hi"))
        .unwrap_or_else(|| panic!("no agent_spawn context: {m:?}"));
    let prompt = position(&m, "user", "first prompt").unwrap();
    assert!(spawn < prompt, "{m:?}");
    assert_eq!(
        m[prompt + 1],
        json!({"role": "user", "content": ctx("pre_turn", "pre-turn for a")}),
        "{m:?}"
    );
    assert_eq!(
        m.len(),
        prompt + 2,
        "the empty pre_turn output added something: {m:?}"
    );

    // 2: pre_tool and post_tool context appended to the call's result.
    let m = messages(&posts[1]);
    let tool = m
        .iter()
        .find(|x| x["role"] == "tool")
        .unwrap_or_else(|| panic!("no tool result: {m:?}"));
    assert_eq!(tool["tool_call_id"], "call_1", "{tool}");
    let t = content(tool);
    let (out, pre, post) = (
        t.find("tool-out\n").unwrap_or_else(|| panic!("{t}")),
        t.find(&ctx("pre_tool", "pre-tool-note"))
            .unwrap_or_else(|| panic!("{t}")),
        t.find(&ctx("post_tool", "post-tool-note"))
            .unwrap_or_else(|| panic!("{t}")),
    );
    assert!(out < pre && out < post, "not appended: {t}");

    // 3: post_turn's context is in the history the next turn's request carries.
    let m = messages(&posts[2]);
    let ans = position(&m, "assistant", "first answer").unwrap_or_else(|| panic!("{m:?}"));
    let note = position(&m, "user", &ctx("post_turn", "post-turn-note"))
        .unwrap_or_else(|| panic!("no post_turn context: {m:?}"));
    let next = position(&m, "user", "second prompt").unwrap();
    assert!(ans < note && note < next, "{m:?}");

    // 4: turn_error's context, in the request after the failed turn.
    let m = messages(&posts[3]);
    let note = position(&m, "user", &ctx("turn_error", "turn-error-note"))
        .unwrap_or_else(|| panic!("no turn_error context: {m:?}"));
    let failed_prompt = position(&m, "user", "second prompt").unwrap();
    let next = position(&m, "user", "third prompt").unwrap();
    assert!(failed_prompt < note && note < next, "{m:?}");

    // 5: the compaction request: pre_compact's output is part of the instruction.
    let m = messages(&posts[4]);
    assert!(
        content(&m[0]).starts_with("You compress"),
        "not the compaction request: {m:?}"
    );
    let instruction = content(m.last().unwrap());
    assert!(instruction.contains("keep-the-file-names"), "{instruction}");

    // 6: post_compact's context after the summary.
    let m = messages(&posts[5]);
    let summary = m
        .iter()
        .position(|x| content(x).contains("THE SUMMARY"))
        .unwrap_or_else(|| panic!("no summary: {m:?}"));
    let note = position(&m, "user", &ctx("post_compact", "post-compact-note"))
        .unwrap_or_else(|| panic!("no post_compact context: {m:?}"));
    let next = position(&m, "user", "fourth prompt").unwrap();
    assert!(summary < note && note < next, "{m:?}");

    // The chat shows each, in an info block marked with its event.
    let bs = chat(&h, "a").await;
    for (event, said) in [
        ("agent_spawn", "spawn says hi"),
        ("pre_turn", "pre-turn for a"),
        ("pre_tool", "pre-tool-note"),
        ("post_tool", "post-tool-note"),
        ("post_turn", "post-turn-note"),
        ("turn_error", "turn-error-note"),
        ("pre_compact", "keep-the-file-names"),
        ("post_compact", "post-compact-note"),
    ] {
        let infos = hook_infos(&bs, event);
        assert!(
            infos.iter().any(|b| b.body.contains(said) && !failed(b)),
            "{event}: no info block with {said:?}: {infos:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Exit 2: blocking

/// pre_tool exit 2: that call does not run and its result is the reason; the event's later
/// hooks do not run for it; another call in the same reply, which the hook lets through,
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_tool_exit_2_blocks_the_call_and_the_later_hooks() {
    if !features_ok("pre_tool_exit_2_blocks_the_call_and_the_later_hooks") {
        return;
    }
    let fake = FakeLlm::start(vec![
        calls(&[
            (
                "call_1",
                "execute_code",
                bash("touch made-by-tool; echo made"),
            ),
            (
                "call_2",
                "execute_code",
                bash("echo allowed > allowed.txt; echo allowed"),
            ),
        ]),
        answer("ok"),
    ])
    .await;
    let profile = format!(
        "hook_policy = \"workspace\"\n{}",
        hooks_table(&[(
            "pre_tool",
            &[
                r#"e=$(cat); printf '%s\n' "$e" >> first.jsonl"#,
                "if grep -q made-by-tool; then echo 'no touching' >&2; echo ignored-stdout; exit 2; fi",
                r#"e=$(cat); printf '%s\n' "$e" >> third.jsonl"#,
            ],
        )])
    );
    let h = start(&[("h", profile)], &[], Model::Fake(&fake)).await;
    agent(&h, "a", "h").await;
    let st = turn(&h, "a", "go", 1).await;
    assert_eq!(kv(&st, "errors"), "0", "{st}");

    // The blocked call did not run; the other one did.
    assert!(
        !h.work.join("made-by-tool").exists(),
        "the blocked tool ran"
    );
    assert_eq!(
        std::fs::read_to_string(h.work.join("allowed.txt")).unwrap(),
        "allowed\n"
    );
    // The first hook ran for both calls, the third only for the call not blocked.
    let first = std::fs::read_to_string(h.work.join("first.jsonl")).unwrap();
    assert_eq!(first.lines().count(), 2, "{first}");
    let third = std::fs::read_to_string(h.work.join("third.jsonl")).unwrap_or_default();
    assert_eq!(third.lines().count(), 1, "{third}");
    assert!(
        third.contains("call_2") && !third.contains("call_1"),
        "{third}"
    );

    // What the model got back for each call.
    let posts = fake.posts();
    assert_eq!(posts.len(), 2);
    let m = messages(&posts[1]);
    let result = |id: &str| -> String {
        m.iter()
            .find(|x| x["role"] == "tool" && x["tool_call_id"] == id)
            .map(|x| content(x).to_owned())
            .unwrap_or_else(|| panic!("no result for {id}: {m:?}"))
    };
    assert_eq!(result("call_1"), "blocked by pre_tool hook: no touching");
    assert!(result("call_2").contains("allowed\n"), "{m:?}");
    // The chat says the same; only the allowed call became a process of the agent.
    let bs = chat(&h, "a").await;
    let r1 = bs
        .iter()
        .find(|b| b.kind == "tool_result" && b.attrs.contains("id=call_1"))
        .unwrap_or_else(|| panic!("{bs:?}"));
    assert!(
        r1.body.contains("blocked by pre_tool hook: no touching"),
        "{r1:?}"
    );
    assert!(!r1.body.contains("ignored-stdout"), "{r1:?}");
    let top = read(&h.root, "session/s/agent/a/proc/top").await;
    assert_eq!(top.lines().count(), 2, "one process expected:\n{top}");
}

/// pre_turn exit 2: the model is not called, the turn fails with the reason, the history
/// keeps a note of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_turn_exit_2_blocks_the_model_call() {
    if !features_ok("pre_turn_exit_2_blocks_the_model_call") {
        return;
    }
    let fake = FakeLlm::start(Vec::new()).await;
    let profile = hooks_table(&[("pre_turn", &["echo 'closed for lunch' >&2; exit 2"])]);
    let h = start(&[("h", profile)], &[], Model::Fake(&fake)).await;
    agent(&h, "a", "h").await;
    let st = turn(&h, "a", "hello", 1).await;
    assert_eq!(kv(&st, "errors"), "1", "{st}");
    assert_eq!(kv(&st, "requests"), "0", "{st}");
    assert!(fake.posts().is_empty(), "the model was called");
    let bs = chat(&h, "a").await;
    let err = bs
        .iter()
        .rfind(|b| b.kind == "error")
        .unwrap_or_else(|| panic!("no error block: {bs:?}"));
    assert_eq!(
        err.body.trim(),
        "blocked by pre_turn hook: closed for lunch",
        "{bs:?}"
    );
    assert!(!bs.iter().any(|b| b.kind == "assistant"), "{bs:?}");
    let hist = history(&h, "a").await;
    assert!(
        hist.iter().any(|m| content(m).contains("closed for lunch")),
        "no note in the history: {hist:?}"
    );
    let idx = read(&h.root, "session/s/agent/idx").await;
    assert!(idx.contains("\terror"), "{idx}");
}

/// post_turn exit 2: the turn goes on with the reason as a user message, and ends when the
/// hook is satisfied; a hook that is never satisfied ends the turn at max_steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_turn_exit_2_sends_the_reason_back_within_max_steps() {
    if !features_ok("post_turn_exit_2_sends_the_reason_back_within_max_steps") {
        return;
    }
    let fake = FakeLlm::start(vec![answer("done"), answer("tests were run")]).await;
    let once = format!(
        "hook_policy = \"workspace\"\n{}",
        hooks_table(&[(
            "post_turn",
            &[
                "if [ -e once ]; then exit 0; fi; touch once; echo 'run the tests first' >&2; exit 2"
            ],
        )])
    );
    let stubborn = format!(
        "max_steps = 2\n{}",
        hooks_table(&[("post_turn", &["echo 'never good enough' >&2; exit 2"])])
    );
    let h = start(
        &[("once", once), ("stubborn", stubborn)],
        &[],
        Model::Fake(&fake),
    )
    .await;
    agent(&h, "a", "once").await;
    let st = turn(&h, "a", "fix it", 1).await;
    assert_eq!(kv(&st, "errors"), "0", "{st}");
    let posts = fake.posts();
    assert_eq!(posts.len(), 2, "{posts:?}");
    let m = messages(&posts[1]);
    let n = m.len();
    assert_eq!(
        m[n - 2],
        json!({"role": "assistant", "content": "done"}),
        "{m:?}"
    );
    assert_eq!(
        m[n - 1],
        json!({"role": "user", "content": ctx("post_turn", "run the tests first")}),
        "{m:?}"
    );
    let bs = chat(&h, "a").await;
    let answers: Vec<&str> = bs
        .iter()
        .filter(|b| b.kind == "assistant")
        .map(|b| b.body.trim())
        .collect();
    assert_eq!(answers, ["done", "tests were run"], "{bs:?}");
    assert!(!bs.iter().any(|b| b.kind == "error"), "{bs:?}");

    // Never satisfied: two model calls (max_steps), then the turn ends in an error.
    fake.push(vec![answer("try 1"), answer("try 2")]);
    agent(&h, "b", "stubborn").await;
    let st = turn(&h, "b", "fix it", 1).await;
    assert_eq!(kv(&st, "errors"), "1", "{st}");
    assert_eq!(kv(&st, "requests"), "2", "{st}");
    assert_eq!(fake.posts().len(), 4);
    let m = messages(&fake.posts()[3]);
    assert_eq!(
        m.last().unwrap(),
        &json!({"role": "user", "content": ctx("post_turn", "never good enough")}),
        "{m:?}"
    );
    assert_eq!(fake.left(), 0);
}

/// agent_spawn exit 2: the agent is blocked: every turn fails with the reason and the model
/// is never called, also after olliesrv restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_spawn_exit_2_blocks_every_turn_also_after_a_restart() {
    if !features_ok("agent_spawn_exit_2_blocks_every_turn_also_after_a_restart") {
        return;
    }
    let fake = FakeLlm::start(Vec::new()).await;
    let profile = hooks_table(&[("agent_spawn", &["echo 'not in this repo' >&2; exit 2"])]);
    let mut h = start(&[("h", profile)], &[], Model::Fake(&fake)).await;
    agent(&h, "a", "h").await;
    let want = "blocked by agent_spawn hook: not in this repo";
    for (i, p) in ["one", "two"].into_iter().enumerate() {
        let st = turn(&h, "a", p, i as u64 + 1).await;
        assert_eq!(kv(&st, "errors"), (i + 1).to_string(), "{st}");
    }
    let bs = chat(&h, "a").await;
    let errors: Vec<&str> = bs
        .iter()
        .filter(|b| b.kind == "error")
        .map(|b| b.body.trim())
        .collect();
    assert_eq!(errors, [want, want], "{bs:?}");
    assert!(fake.posts().is_empty(), "the model was called");

    // After a restart (agent_spawn does not run again) it is still blocked.
    h.srv.kill9();
    h.srv.relaunch(|c| {
        c.env("OLLIE_FAKE_KEY", KEY);
    });
    let (c, root) = attach(&h.srv, &me()).await;
    h.root = root;
    h._c = c;
    let before = read(&h.root, "session/s/agent/a/stats").await;
    let n = |st: &str, k: &str| kv(st, k).parse::<u64>().unwrap_or(0);
    let st = turn(&h, "a", "three", n(&before, "turns") + 1).await;
    assert_eq!(n(&st, "errors"), n(&before, "errors") + 1, "{st}");
    let bs = chat(&h, "a").await;
    assert_eq!(
        bs.iter().rfind(|b| b.kind == "error").unwrap().body.trim(),
        want,
        "{bs:?}"
    );
    assert!(fake.posts().is_empty(), "the model was called");
}

/// agent_spawn fires once per agent, at its creation: not when olliesrv restores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_spawn_fires_at_creation_not_on_restore() {
    if !features_ok("agent_spawn_fires_at_creation_not_on_restore") {
        return;
    }
    let turns = [replay_text("ok")];
    let profile = format!(
        "hook_policy = \"workspace\"\n{}",
        hooks_table(&[
            (
                "agent_spawn",
                &[r#"e=$(cat); printf '%s\n' "$e" >> spawned.jsonl"#],
            ),
            (
                "pre_turn",
                &[r#"e=$(cat); printf '%s\n' "$e" >> turns.jsonl"#]
            ),
        ])
    );
    let mut h = start(&[("h", profile)], &[], Model::Replay(&turns)).await;
    agent(&h, "a", "h").await;
    let spawned = h.work.join("spawned.jsonl");
    wait_lines(&spawned, 1).await;
    turn(&h, "a", "before", 1).await;

    h.srv.kill9();
    h.srv.relaunch(|_| {});
    let (c, root) = attach(&h.srv, &me()).await;
    h.root = root;
    h._c = c;
    let before = read(&h.root, "session/s/agent/a/stats").await;
    let n = |st: &str, k: &str| kv(st, k).parse::<u64>().unwrap_or(0);
    let st = turn(&h, "a", "after", n(&before, "turns") + 1).await;
    assert_eq!(n(&st, "errors"), n(&before, "errors"), "{st}");
    // Both turns' pre_turn ran; agent_spawn did not run again.
    let t = wait_lines(&h.work.join("turns.jsonl"), 2).await;
    assert_eq!(t.len(), 2, "{t:?}");
    let s = std::fs::read_to_string(&spawned).unwrap();
    assert_eq!(s.lines().count(), 1, "agent_spawn ran on restore: {s}");
    // A new agent gets its own.
    agent(&h, "b", "h").await;
    let s = wait_lines(&spawned, 2).await;
    let v: Value = serde_json::from_str(&s[1]).unwrap();
    assert_eq!(v["agent_name"], "b", "{v}");
    assert_eq!(v["event"], "agent_spawn", "{v}");
}

/// post_tool exit 2: the tool ran, its result gets the reason appended and counts as failed
/// (three such rounds bring the nudge every-call-failed rounds bring).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_tool_exit_2_appends_the_reason_and_fails_the_call() {
    if !features_ok("post_tool_exit_2_appends_the_reason_and_fails_the_call") {
        return;
    }
    let turns = [
        replay_exec("echo one > one.txt; echo ran-1"),
        replay_exec("echo two > two.txt; echo ran-2"),
        replay_exec("echo three > three.txt; echo ran-3"),
        replay_text("done"),
    ];
    let profile = hooks_table(&[("post_tool", &["echo 'lint failed' >&2; exit 2"])]);
    let h = start(&[("h", profile)], &[], Model::Replay(&turns)).await;
    agent(&h, "a", "h").await;
    let st = turn(&h, "a", "go", 1).await;
    assert_eq!(kv(&st, "errors"), "0", "{st}");
    // The tools ran.
    for f in ["one.txt", "two.txt", "three.txt"] {
        assert!(h.work.join(f).exists(), "{f} missing: the tool did not run");
    }
    let bs = chat(&h, "a").await;
    let results: Vec<&Block> = bs.iter().filter(|b| b.kind == "tool_result").collect();
    assert_eq!(results.len(), 3, "{bs:?}");
    for (i, r) in results.iter().enumerate() {
        let out = format!("ran-{}\n", i + 1);
        let at = r.body.find(&out).unwrap_or_else(|| panic!("{r:?}"));
        let reason = r
            .body
            .find("blocked by post_tool hook: lint failed")
            .unwrap_or_else(|| panic!("no reason in {r:?}"));
        assert!(at < reason, "not appended: {r:?}");
    }
    // The history the model sees carries the same.
    let hist = history(&h, "a").await;
    let tools: Vec<&Value> = hist.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tools.len(), 3, "{hist:?}");
    assert!(
        tools
            .iter()
            .all(|m| content(m).contains("blocked by post_tool hook: lint failed")),
        "{hist:?}"
    );
    // Three rounds in which every call failed: the nudge.
    assert!(
        bs.iter()
            .any(|b| b.kind == "info" && b.attrs.contains("nudge")),
        "the blocked calls did not count as failed: {bs:?}"
    );
}

/// pre_compact exit 2: the compaction is skipped (no summary request, the history as it
/// was) and the chat says why; post_compact does not fire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_compact_exit_2_skips_the_compaction() {
    if !features_ok("pre_compact_exit_2_skips_the_compaction") {
        return;
    }
    let fake = FakeLlm::start(vec![answer("first answer"), answer("SHOULD NOT BE ASKED")]).await;
    let profile = hooks_table(&[
        ("pre_compact", &["echo 'not now' >&2; exit 2"]),
        ("post_compact", &["echo post-compact-ran"]),
    ]);
    let h = start(&[("h", profile)], &[], Model::Fake(&fake)).await;
    agent(&h, "a", "h").await;
    turn(&h, "a", "hello", 1).await;
    let before = history(&h, "a").await;
    // The agent is idle, so the compaction (and its hooks) runs before ctl answers.
    let r = rdwr(&h.root, "session/s/agent/a/ctl", "compact").await;
    assert!(
        r.as_ref()
            .is_err_and(|e| e.contains("blocked by pre_compact hook: not now")),
        "{r:?}"
    );
    let bs = chat(&h, "a").await;
    let infos = hook_infos(&bs, "pre_compact");
    assert!(
        infos
            .iter()
            .any(|b| b.body.contains("blocked by pre_compact hook: not now")),
        "{infos:?}"
    );
    assert_eq!(fake.posts().len(), 1, "a summary was asked for");
    assert_eq!(history(&h, "a").await, before, "the history changed");
    assert!(
        !bs.iter()
            .any(|b| b.kind == "info" && b.attrs.contains("compacted")),
        "{bs:?}"
    );
    assert!(hook_infos(&bs, "post_compact").is_empty(), "{bs:?}");
}

/// turn_error and post_compact exit 2: their reasons join the history like context, and the
/// next request carries them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turn_error_and_post_compact_reasons_join_the_history() {
    if !features_ok("turn_error_and_post_compact_reasons_join_the_history") {
        return;
    }
    let fake = FakeLlm::start(vec![
        answer("first answer"),
        answer("THE SUMMARY"),
        bad_request("the fake says no"),
        answer("third answer"),
    ])
    .await;
    let profile = hooks_table(&[
        ("post_compact", &["echo 'compact-reason' >&2; exit 2"]),
        ("turn_error", &["echo 'error-reason' >&2; exit 2"]),
    ]);
    let h = start(&[("h", profile)], &[], Model::Fake(&fake)).await;
    agent(&h, "a", "h").await;
    turn(&h, "a", "first prompt", 1).await;
    let r = rdwr(&h.root, "session/s/agent/a/ctl", "compact")
        .await
        .unwrap();
    assert!(r.starts_with("compacted: "), "{r}");
    let st = turn(&h, "a", "second prompt", 2).await;
    assert_eq!(kv(&st, "errors"), "1", "{st}");
    let st = turn(&h, "a", "third prompt", 3).await;
    assert_eq!(kv(&st, "errors"), "1", "{st}");
    let posts = fake.posts();
    assert_eq!(posts.len(), 4);
    let m = messages(&posts[3]);
    let compact = position(&m, "user", &ctx("post_compact", "compact-reason"))
        .unwrap_or_else(|| panic!("no post_compact reason: {m:?}"));
    let error = position(&m, "user", &ctx("turn_error", "error-reason"))
        .unwrap_or_else(|| panic!("no turn_error reason: {m:?}"));
    let second = position(&m, "user", "second prompt").unwrap();
    let third = position(&m, "user", "third prompt").unwrap();
    assert!(compact < second && second < error && error < third, "{m:?}");
}

/// A profile's hook_policy changed by `invalidate` applies to the next hook: tightened from
/// workspace to readonly, the hook can no longer write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tightened_hook_policy_applies_after_invalidate() {
    if !features_ok("a_tightened_hook_policy_applies_after_invalidate") {
        return;
    }
    let hooks = hooks_table(&[(
        "pre_turn",
        &[r#"n=$(cat | grep -o 'prompt[0-9]'); echo x > "$n.txt"; echo "wrote=$?""#],
    )]);
    let turns = [replay_text("ok"), replay_text("ok")];
    let h = start(
        &[("h", format!("hook_policy = \"workspace\"\n{hooks}"))],
        &[],
        Model::Replay(&turns),
    )
    .await;
    agent(&h, "a", "h").await;
    turn(&h, "a", "prompt1", 1).await;
    assert!(
        h.work.join("prompt1.txt").exists(),
        "the workspace hook did not write"
    );
    std::fs::write(
        h.top.join("agents/h.toml"),
        format!("hook_policy = \"readonly\"\n{hooks}"),
    )
    .unwrap();
    let r = rdwr(&h.root, "ctl", "invalidate").await.unwrap();
    assert!(r.starts_with("config reloaded"), "{r}");
    turn(&h, "a", "prompt2", 2).await;
    let bs = chat(&h, "a").await;
    let said: Vec<&str> = hook_infos(&bs, "pre_turn")
        .iter()
        .map(|b| b.body.trim())
        .collect();
    assert_eq!(said.len(), 2, "{bs:?}");
    assert_eq!(said[0], "wrote=0", "{said:?}");
    assert_ne!(said[1], "wrote=0", "{said:?}");
    assert!(
        !h.work.join("prompt2.txt").exists(),
        "the hook kept its old policy"
    );
}

/// A call too large to carry inside a hook's event does not slip past a pre_tool hook that
/// would block it: an execute_pipe call whose arguments fit in one request to toolsrv but
/// grow past it once escaped into the hook's stdin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_call_cannot_slip_past_a_pre_tool_hook() {
    if !features_ok("an_oversized_call_cannot_slip_past_a_pre_tool_hook") {
        return;
    }
    // 16 steps of 42 000 characters (each under the 64 KiB field clip), mostly newlines:
    // about 1 MB of JSON arguments, about 1.3 MB once escaped as a payload value.
    let filler = ":\n".repeat(21_000);
    let mut steps = vec![json!({"language": "bash", "code": format!("touch pwned\n{filler}")})];
    steps.extend((1..16).map(|_| json!({"language": "bash", "code": filler})));
    let args = json!({ "steps": steps });
    assert!(
        args.to_string().len() < 1_040_000,
        "{}",
        args.to_string().len()
    );
    let turns = [
        json!({"tool_calls": [{"name": "execute_pipe", "arguments": args}]}),
        replay_text("done"),
    ];
    let profile = hooks_table(&[(
        "pre_tool",
        &[r#"if [ "$OLLIE_TOOL" = execute_pipe ]; then echo 'no pipes' >&2; exit 2; fi"#],
    )]);
    let h = start(&[("h", profile)], &[], Model::Replay(&turns)).await;
    agent(&h, "a", "h").await;
    turn(&h, "a", "go", 1).await;
    let bs = chat(&h, "a").await;
    assert!(
        !h.work.join("pwned").exists(),
        "the call ran although the pre_tool hook blocks every execute_pipe; hook blocks: {:?}",
        hook_infos(&bs, "pre_tool")
    );
}

/// A call whose arguments cannot be cut down to an event the hooks can take (a great many
/// small values, no long string to shorten) is blocked when the event has pre_tool hooks,
/// whatever they would have said: the tool does not run, and the model is told why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_too_large_for_its_pre_tool_hooks_is_blocked() {
    if !features_ok("a_call_too_large_for_its_pre_tool_hooks_is_blocked") {
        return;
    }
    // About 600 KB of arguments in 150 000 one-digit numbers beside the code.
    let args = json!({"language": "bash", "code": "touch pwned", "pad": vec![7u8; 150_000]});
    let turns = [
        json!({"tool_calls": [{"name": "execute_code", "arguments": args}]}),
        replay_text("done"),
    ];
    // The hook would let everything through.
    let profile = hooks_table(&[("pre_tool", &["exit 0"])]);
    let h = start(&[("h", profile)], &[], Model::Replay(&turns)).await;
    agent(&h, "a", "h").await;
    turn(&h, "a", "go", 1).await;
    // (toolsrv would refuse the unknown key too: the result below shows the hook path
    // answered first.)
    assert!(!h.work.join("pwned").exists(), "the oversized call ran");
    let bs = chat(&h, "a").await;
    let result = bs
        .iter()
        .find(|b| b.kind == "tool_result")
        .expect("a tool_result block");
    assert!(
        result
            .body
            .starts_with("blocked by pre_tool hook: the pre_tool event is too large"),
        "{result:?}"
    );
    assert!(
        hook_infos(&bs, "pre_tool")
            .iter()
            .any(|b| b.body.contains("too large")),
        "{bs:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Failures, hangs and floods

/// A hook stopped at its timeout has failed even when it catches the signal and exits 0: what
/// it printed is not context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_that_exits_0_when_stopped_has_still_failed() {
    if !features_ok("a_hook_that_exits_0_when_stopped_has_still_failed") {
        return;
    }
    let profile = format!(
        "hook_timeout_s = 1\n{}",
        hooks_table(&[(
            "pre_turn",
            &["trap 'echo caught-late; exit 0' TERM; while :; do sleep 0.05; done"],
        )])
    );
    let turns = [replay_text("fine")];
    let h = start(&[("h", profile)], &[], Model::Replay(&turns)).await;
    agent(&h, "a", "h").await;
    let st = turn(&h, "a", "go", 1).await;
    assert_eq!(kv(&st, "errors"), "0", "{st}");
    let bs = chat(&h, "a").await;
    let infos = hook_infos(&bs, "pre_turn");
    assert!(
        infos.len() == 1 && failed(infos[0]) && infos[0].body.contains("timeout"),
        "{infos:?}"
    );
    let hist = history(&h, "a").await;
    assert!(
        !hist.iter().any(|m| content(m).contains("caught-late")),
        "{hist:?}"
    );
}

/// Killing an agent stops its running hook (the hook identity's processes go with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_agent_stops_its_running_hook() {
    if !features_ok("killing_the_agent_stops_its_running_hook") {
        return;
    }
    let marker = sleep_marker();
    let sleep = format!("sleep {marker}");
    let profile = format!(
        "hook_timeout_s = 300\n{}",
        hooks_table(&[("pre_turn", &[sleep.as_str()])])
    );
    let turns = [replay_text("never")];
    let h = start(&[("h", profile)], &[], Model::Replay(&turns)).await;
    agent(&h, "a", "h").await;
    write(&h.root, "session/s/agent/a/prompt", "go")
        .await
        .unwrap();
    assert!(
        poll(GUARD, || !common::toolsrv::procs_with(&marker).is_empty()).await,
        "the hook never started"
    );
    rdwr(&h.root, "session/s/agent/a/ctl", "kill")
        .await
        .unwrap();
    wait_marker_gone(&marker).await;
}

/// A hook that exits 1, one killed by a signal and one that hangs past hook_timeout_s each
/// leave a `failed` info block, and the event's next hook and the turn go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_killed_and_hanging_hooks_do_not_stop_the_turn() {
    if !features_ok("failing_killed_and_hanging_hooks_do_not_stop_the_turn") {
        return;
    }
    let marker = sleep_marker();
    let sleep = format!("sleep {marker}");
    let profile = format!(
        "hook_timeout_s = 1\n{}",
        hooks_table(&[(
            "pre_turn",
            &[
                "echo out-of-a-failure; exit 1",
                "kill -KILL $$",
                &sleep,
                "echo still-ran",
            ],
        )])
    );
    let turns = [replay_text("fine")];
    let h = start(&[("h", profile)], &[], Model::Replay(&turns)).await;
    agent(&h, "a", "h").await;
    let st = turn(&h, "a", "go", 1).await;
    assert_eq!(kv(&st, "errors"), "0", "{st}");
    let bs = chat(&h, "a").await;
    let infos = hook_infos(&bs, "pre_turn");
    let failures = infos.iter().filter(|b| failed(b)).count();
    assert_eq!(failures, 3, "{infos:?}");
    assert!(
        infos
            .iter()
            .any(|b| !failed(b) && b.body.contains("still-ran")),
        "{infos:?}"
    );
    assert!(
        bs.iter()
            .any(|b| b.kind == "assistant" && b.body.trim() == "fine"),
        "{bs:?}"
    );
    // A failed hook's stdout is not context.
    let hist = history(&h, "a").await;
    assert!(
        !hist.iter().any(|m| content(m).contains("out-of-a-failure")),
        "{hist:?}"
    );
    assert!(
        hist.iter()
            .any(|m| content(m) == ctx("pre_turn", "still-ran")),
        "{hist:?}"
    );
    // The hanging hook was stopped, not left behind.
    wait_marker_gone(&marker).await;
}

/// A hook printing megabytes gives at most about 16 KiB of context (and of reason), and the
/// turn completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flooding_hooks_are_bounded() {
    if !features_ok("flooding_hooks_are_bounded") {
        return;
    }
    const LIMIT: usize = 16 * 1024 + 512;
    let fake = FakeLlm::start(vec![
        calls(&[("call_1", "execute_code", bash("echo never"))]),
        answer("done"),
    ])
    .await;
    let profile = hooks_table(&[
        ("pre_turn", &["yes | head -c 5000000"]),
        ("pre_tool", &["yes no | head -c 3000000 >&2; exit 2"]),
    ]);
    let h = start(&[("h", profile)], &[], Model::Fake(&fake)).await;
    agent(&h, "a", "h").await;
    let st = turn(&h, "a", "go", 1).await;
    assert_eq!(kv(&st, "errors"), "0", "{st}");
    let posts = fake.posts();
    assert_eq!(posts.len(), 2);
    let users = user_texts(&posts[0]);
    let flood = users
        .iter()
        .find(|u| u.starts_with("<hook event=\"pre_turn\">\ny\ny\n"))
        .unwrap_or_else(|| {
            panic!(
                "no pre_turn context: {}",
                &posts[0].body[..2000.min(posts[0].body.len())]
            )
        });
    assert!(flood.len() <= LIMIT, "context of {} bytes", flood.len());
    assert!(flood.len() >= 1024, "context of {} bytes", flood.len());
    let m = messages(&posts[1]);
    let result = m
        .iter()
        .find(|x| x["role"] == "tool")
        .map(|x| content(x).to_owned())
        .unwrap();
    assert!(
        result.starts_with("blocked by pre_tool hook: no\nno\n"),
        "{}",
        &result[..200.min(result.len())]
    );
    assert!(result.len() <= LIMIT, "reason of {} bytes", result.len());
    for p in &posts {
        assert!(
            p.body.len() < 6 * LIMIT,
            "a request of {} bytes",
            p.body.len()
        );
    }
    let raw = chat_raw(&h, "a").await;
    assert!(raw.len() < 8 * LIMIT, "the chat holds {} bytes", raw.len());
}

// ---------------------------------------------------------------------------------------
// The sandbox

/// Tries to write into the cwd, beside it and into /tmp, and reports what happened.
fn writer(outside: &Path, tmp: &Path) -> String {
    format!(
        "for f in \"inside-$OLLIE_PROFILE\" {:?} {:?}; do if echo x > \"$f\" 2>/dev/null; then echo \"wrote $f\"; else echo \"denied $f\"; fi; done",
        format!("{}-$OLLIE_PROFILE", outside.display()),
        format!("{}-$OLLIE_PROFILE", tmp.display())
    )
}

/// Under `readonly` (the default hook_policy) a hook writes nothing, in the cwd or outside
/// it; under `workspace` it writes into the cwd only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_hooks_write_nothing_and_workspace_hooks_write_the_cwd() {
    if !features_ok("readonly_hooks_write_nothing_and_workspace_hooks_write_the_cwd") {
        return;
    }
    let tmp = PathBuf::from(format!(
        "/tmp/ollie-hook-test-{}-{}",
        std::process::id(),
        unique()
    ));
    let outside = Path::new(TOP).join("outside");
    let cmd = writer(&outside, &tmp);
    let ro = hooks_table(&[("pre_turn", &[&cmd])]);
    let ws = format!("hook_policy = \"workspace\"\n{ro}");
    let turns = [replay_text("ok")];
    let h = start(&[("ro", ro), ("ws", ws)], &[], Model::Replay(&turns)).await;
    // Beside the workspace, in a directory we may write: only the sandbox stands in the way.
    let outside = h.top.join("outside");
    agent(&h, "a", "ro").await;
    turn(&h, "a", "go", 1).await;
    agent(&h, "b", "ws").await;
    turn(&h, "b", "go", 1).await;
    let said = |bs: &[Block]| -> String {
        hook_infos(bs, "pre_turn")
            .iter()
            .map(|b| b.body.clone())
            .collect::<String>()
    };
    let (a, b) = (said(&chat(&h, "a").await), said(&chat(&h, "b").await));
    let paths = |p: &str| {
        (
            "inside-".to_owned() + p,
            format!("{}-{p}", outside.display()),
            format!("{}-{p}", tmp.display()),
        )
    };
    let (ri, ro_out, ro_tmp) = paths("ro");
    let (wi, ws_out, ws_tmp) = paths("ws");
    for f in [&ri, &ro_out, &ro_tmp] {
        assert!(a.contains(&format!("denied {f}\n")), "readonly: {a}");
    }
    assert!(b.contains(&format!("wrote {wi}\n")), "workspace: {b}");
    for f in [&ws_out, &ws_tmp] {
        assert!(b.contains(&format!("denied {f}\n")), "workspace: {b}");
    }
    // On disk: only the workspace hook's file in the cwd.
    assert!(!h.work.join(&ri).exists(), "a readonly hook wrote the cwd");
    assert_eq!(std::fs::read_to_string(h.work.join(&wi)).unwrap(), "x\n");
    for f in [&ro_out, &ro_tmp, &ws_out, &ws_tmp] {
        assert!(!Path::new(f).exists(), "a hook wrote {f}");
    }
}

/// A hook under a writable policy is sandboxed like any tool: it cannot leave a set-id file
/// in the workspace, and olliesrv's state directory is hidden from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_leave_no_set_id_file_and_cannot_see_the_state_directory() {
    if !features_ok("hooks_leave_no_set_id_file_and_cannot_see_the_state_directory") {
        return;
    }
    let cmd = format!(
        "cp /bin/true hookbin; chmod 4755 hookbin; echo \"suid $?\"; chmod 2755 hookbin; echo \"sgid $?\"; \
         stat {TOP}/state/lock >/dev/null 2>&1; echo \"state $?\"; ls {TOP}/state >/dev/null 2>&1; echo \"lsstate $?\""
    );
    let profile = format!(
        "hook_policy = \"workspace\"\n{}",
        hooks_table(&[("pre_turn", &[&cmd])])
    );
    let turns = [replay_text("ok")];
    let h = start(&[("p", profile)], &[], Model::Replay(&turns)).await;
    agent(&h, "a", "p").await;
    turn(&h, "a", "go", 1).await;
    let said: String = hook_infos(&chat(&h, "a").await, "pre_turn")
        .iter()
        .map(|b| b.body.clone())
        .collect();
    for l in ["suid", "sgid", "state", "lsstate"] {
        assert!(
            said.lines().any(|x| x.starts_with(l) && !x.ends_with(" 0")),
            "{l} succeeded: {said}"
        );
    }
    assert!(said.contains("suid "), "{said}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(h.work.join("hookbin"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o6000, 0, "the hook left a set-id file: {mode:o}");
    assert!(
        h.srv.state_dir().join("lock").exists(),
        "the state directory is in use"
    );
}

/// Under `readonly` a hook reaches no network: a connection to a loopback listener of this
/// test fails and the listener sees nothing. Under a user policy allowing that port (the
/// positive control) it connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readonly_hook_reaches_no_network() {
    if !features_ok("a_readonly_hook_reaches_no_network") {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let loopnet = NETWORK_TOML.replace("connect = [53, 80, 443]", &format!("connect = [{port}]"));
    assert_ne!(
        loopnet, NETWORK_TOML,
        "network.toml no longer has that line"
    );
    let cmd = format!(
        "if exec 3<>/dev/tcp/127.0.0.1/{port}; then echo connected-{port}; else echo refused-{port}; fi"
    );
    let ro = hooks_table(&[("pre_turn", &[&cmd])]);
    let net = format!("hook_policy = \"loopnet\"\n{ro}");
    let turns = [replay_text("ok")];
    let h = start(
        &[("ro", ro), ("net", net)],
        &[("loopnet", loopnet)],
        Model::Replay(&turns),
    )
    .await;
    agent(&h, "a", "ro").await;
    turn(&h, "a", "go", 1).await;
    let said: String = hook_infos(&chat(&h, "a").await, "pre_turn")
        .iter()
        .map(|b| b.body.clone())
        .collect();
    assert!(said.contains(&format!("refused-{port}")), "{said}");
    assert!(!said.contains(&format!("connected-{port}")), "{said}");
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok((_, from)) => panic!("the listener got a connection from {from}"),
        Err(e) => panic!("accept: {e}"),
    }

    // The positive control.
    agent(&h, "b", "net").await;
    turn(&h, "b", "go", 1).await;
    let said: String = hook_infos(&chat(&h, "b").await, "pre_turn")
        .iter()
        .map(|b| b.body.clone())
        .collect();
    assert!(said.contains(&format!("connected-{port}")), "{said}");
    // The hook's connect completed, so the connection waits in the backlog already.
    listener
        .accept()
        .expect("no connection reached the listener");
}

/// A hook runs as its own toolsrv identity (`<agent-id>.hook`) under hook_policy: the
/// agent's `proc/` view does not show it and cannot reach it; the operator's view does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hooks_process_is_not_the_agents() {
    if !features_ok("a_hooks_process_is_not_the_agents") {
        return;
    }
    let profile = hooks_table(&[("pre_turn", &["echo hook-ran"])]);
    let turns = [replay_exec("echo tool-ran"), replay_text("done")];
    let h = start(&[("h", profile)], &[], Model::Replay(&turns)).await;
    agent(&h, "a", "h").await;
    turn(&h, "a", "go", 1).await;
    let (_, aid) = ids(&h, "a").await;
    let list = read(&h.root, "session/s/toolsrv/proc/list").await;
    let mut hook_pids = Vec::new();
    let mut agent_pids = Vec::new();
    for l in list.lines() {
        let pid = l.split('\t').next().unwrap().to_owned();
        let stat = read(&h.root, &format!("session/s/toolsrv/proc/{pid}/stat")).await;
        let owner = kv(&stat, "agent");
        if owner == format!("{aid}.hook") {
            assert_eq!(kv(&stat, "policy"), "readonly", "{stat}");
            hook_pids.push(pid);
        } else {
            assert_eq!(owner, aid, "{stat}");
            agent_pids.push(pid);
        }
    }
    assert_eq!(hook_pids.len(), 1, "{list}");
    assert_eq!(agent_pids.len(), 1, "{list}");
    let top = read(&h.root, "session/s/agent/a/proc/top").await;
    assert_eq!(top.lines().count(), 2, "{top}");
    for p in &hook_pids {
        for f in ["stat", "out", "ctl"] {
            let path = format!("session/s/agent/a/proc/{p}/{f}");
            assert!(
                h.root.walk_path(&path).await.is_err(),
                "the agent's view reaches the hook's {path}"
            );
        }
    }
}

/// Events larger than one 9P message still reach their hooks: a pre_tool hook guarding
/// file_write blocks a write with a large content, and a post_tool hook sees a large result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_events_still_reach_their_hooks() {
    if !features_ok("large_events_still_reach_their_hooks") {
        return;
    }
    let content = "a line of the file\n".repeat(10_000);
    let turns = [
        json!({"tool_calls": [{"name": "file_write",
            "arguments": {"path": "big.txt", "content": content}}]}),
        replay_exec("seq 1 30000"),
        replay_text("done"),
    ];
    let profile = hooks_table(&[
        (
            "pre_tool",
            &[r#"if [ "$OLLIE_TOOL" = file_write ]; then echo 'no writes' >&2; exit 2; fi"#],
        ),
        (
            "post_tool",
            &[
                r#"python3 -c 'import json, sys; e = json.load(sys.stdin); print("post_tool saw", len(e["result"]) > 60000, e["ok"])'"#,
            ],
        ),
    ]);
    let h = start(&[("h", profile)], &[], Model::Replay(&turns)).await;
    agent(&h, "a", "h").await;
    turn(&h, "a", "go", 1).await;
    let bs = chat(&h, "a").await;
    let results: Vec<&Block> = bs.iter().filter(|b| b.kind == "tool_result").collect();
    assert_eq!(results.len(), 2, "{bs:?}");
    assert!(
        !h.work.join("big.txt").exists(),
        "the guarded write ran (hook infos: {:?})",
        hook_infos(&bs, "pre_tool")
    );
    assert!(
        results[0]
            .body
            .starts_with("blocked by pre_tool hook: no writes"),
        "{:?}",
        hook_infos(&bs, "pre_tool")
    );
    assert!(
        results[1]
            .body
            .contains(&ctx("post_tool", "post_tool saw True True")),
        "{:?}",
        hook_infos(&bs, "post_tool")
    );
}

// ---------------------------------------------------------------------------------------
// Configuration

/// Runs olliesrv on a directory whose `agents/h.toml` is `profile`; returns its output.
fn olliesrv_with_profile(profile: &str) -> (tempfile::TempDir, std::process::Output) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("agents")).unwrap();
    std::fs::write(dir.path().join("agents/h.toml"), profile).unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, "").unwrap();
    let mut cmd = Command::new(bin("olliesrv"));
    cmd.arg("--config")
        .arg(&cfg)
        .arg("-a")
        .arg(format!(
            "unix!{}",
            dir.path().join("ns").join("ollie").display()
        ))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("XDG_CONFIG_HOME", dir.path())
        .env("OLLAMA_HOST", "127.0.0.1:9");
    let o = common::run(&mut cmd, b"");
    (dir, o)
}

#[test]
fn bad_hook_settings_stop_olliesrv_with_one_line_naming_the_key() {
    let many = hooks_table(&[("post_tool", &["true"; 17])]);
    let long_cmd = "x".repeat(16 * 1024 + 1);
    let long = hooks_table(&[("pre_turn", &[&long_cmd])]);
    let cases: Vec<(String, &[&str])> = vec![
        (
            hooks_table(&[("on_save", &["true"])]),
            &["hooks", "on_save"],
        ),
        (hooks_table(&[("pre_tool", &[""])]), &["hooks.pre_tool"]),
        (hooks_table(&[("pre_tool", &["  "])]), &["hooks.pre_tool"]),
        (many, &["hooks.post_tool"]),
        (long, &["hooks.pre_turn"]),
        ("hook_timeout_s = 0\n".to_owned(), &["hook_timeout_s"]),
        ("hook_timeout_s = 301\n".to_owned(), &["hook_timeout_s"]),
        ("hook_timeout_s = -5\n".to_owned(), &["hook_timeout_s"]),
        (
            "hook_policy = \"lax\"\n".to_owned(),
            &["hook_policy", "lax"],
        ),
        ("hook_policy = \"\"\n".to_owned(), &["hook_policy"]),
    ];
    for (profile, wants) in &cases {
        let (dir, o) = olliesrv_with_profile(profile);
        let err = text(&o.stderr);
        let shown = &profile[..profile.len().min(80)];
        assert_eq!(o.status.code(), Some(2), "{shown:?}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{shown:?}: not one line: {err:?}"
        );
        assert!(err.contains("agents/h.toml"), "{shown:?}: {err}");
        for w in *wants {
            assert!(err.contains(w), "{shown:?}: {w:?} not in {err}");
        }
        assert!(
            !dir.path().join("ns").join("ollie").exists(),
            "{shown:?}: a socket was made"
        );
    }
}

/// The limits themselves are allowed: 16 commands, a 16 KiB command, timeouts 1 and 300, a
/// user policy.
#[test]
fn hook_settings_at_their_limits_are_accepted() {
    let sixteen = ["true"; 16];
    let long_cmd = format!("true {}", "x".repeat(16 * 1024 - 5));
    assert_eq!(long_cmd.len(), 16 * 1024);
    for profile in [
        format!(
            "hook_timeout_s = 1\n{}",
            hooks_table(&[("post_tool", &sixteen)])
        ),
        format!(
            "hook_timeout_s = 300\nhook_policy = \"network\"\n{}",
            hooks_table(&[("pre_turn", &[&long_cmd])])
        ),
        hooks_table(
            &EVENTS
                .iter()
                .map(|e| (*e, &["true"][..]))
                .collect::<Vec<_>>(),
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("agents")).unwrap();
        std::fs::write(dir.path().join("agents/h.toml"), &profile).unwrap();
        // Starting is the check: Srv::start_with fails with the server's stderr otherwise.
        let mut srv = Srv::start_with(dir, "", |_| {});
        srv.kill9();
    }
}
