//! The agent loop against the `openai` backend, end to end: a real olliesrv (and the session's
//! real toolsrv) talks to a scripted loopback server speaking OpenAI Chat Completions SSE
//! (`data: {chat.completion.chunk}` events with text, reasoning and tool-call fragments, a
//! usage chunk, `data: [DONE]`). Each test checks what lands in the chat (`log`), `stats`,
//! the states `eventwait`/`statewait` report, the workspace, and the request bodies the
//! server got: streaming, the sandboxed tool round trip, parallel calls, rate limits and
//! transient errors, a dropped stream, context overflow and compaction, text tool calls,
//! unknown tools and failing rounds, prices and the cost cap, `ctl compact`, model lists,
//! `generate` and sub-agents, the API key's secrecy and the plan's re-injection.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod fake_llm;

use std::path::{Path, PathBuf};

use common::{Srv, attach, me, within};
use fake_llm::*;
use ollie_p9::Fid;
use ollie_p9::wire::om;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------
// Fixtures: OpenAI Chat Completions streams

/// One `chat.completion.chunk` event with `delta` for choice 0.
fn chunk(delta: Value, finish: Option<&str>) -> String {
    let c = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
        "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}")
}

/// The last chunk: no choices, the usage.
fn usage_chunk(prompt: u64, completion: u64) -> String {
    let c = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
        "model": "m", "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion}});
    format!("data: {c}")
}

const DONE: &str = "data: [DONE]";

/// `s` in at most `n` non-empty pieces, cut on character boundaries.
fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    let size = chars.len().div_ceil(n);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// A tool call for a fixture: (id, name, arguments).
type Call<'a> = (&'a str, &'a str, Value);

/// The events of one whole reply: the role chunk, reasoning and text in pieces, each tool
/// call's first fragment (index, id, name) and then the arguments in pieces interleaved
/// across the calls, the finish reason, usage and `[DONE]`.
fn reply_events(reasoning: &str, text: &str, calls: &[Call], usage: (u64, u64)) -> Vec<String> {
    let mut ev = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    for p in pieces(reasoning, 3) {
        ev.push(chunk(json!({"reasoning_content": p}), None));
    }
    for p in pieces(text, 3) {
        ev.push(chunk(json!({"content": p}), None));
    }
    for (i, (id, name, _)) in calls.iter().enumerate() {
        ev.push(chunk(
            json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
            None,
        ));
    }
    let args: Vec<Vec<String>> = calls
        .iter()
        .map(|(_, _, a)| pieces(&a.to_string(), 4))
        .collect();
    let most = args.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..most {
        for (i, a) in args.iter().enumerate() {
            if let Some(p) = a.get(k) {
                ev.push(chunk(
                    json!({"tool_calls": [{"index": i, "function": {"arguments": p}}]}),
                    None,
                ));
            }
        }
    }
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    ev.push(chunk(json!({}), Some(finish)));
    ev.push(usage_chunk(usage.0, usage.1));
    ev.push(DONE.to_owned());
    ev
}

/// A text answer (usage 10 in, 5 out).
fn answer(text: &str) -> Reply {
    Reply::sse(&reply_events("", text, &[], (10, 5)))
}

/// Reasoning, then text, with `usage`.
fn thought(reasoning: &str, text: &str, usage: (u64, u64)) -> Reply {
    Reply::sse(&reply_events(reasoning, text, &[], usage))
}

/// A reply that only makes tool calls (usage 10 in, 5 out).
fn tool_calls(calls: &[Call]) -> Reply {
    Reply::sse(&reply_events("", "", calls, (10, 5)))
}

/// One `execute_code` bash call.
fn exec(id: &str, code: &str) -> Reply {
    tool_calls(&[(
        id,
        "execute_code",
        json!({"language": "bash", "code": code}),
    )])
}

/// An error reply in OpenAI's shape.
fn api_error(status: u16, message: &str, code: &str) -> Reply {
    Reply::json(
        status,
        &json!({"error": {"message": message, "type": "invalid_request_error",
            "param": null, "code": code}}),
    )
}

// ---------------------------------------------------------------------------------------
// Harness

/// A fake server, olliesrv using it as backend `fake` (model `m`), and our attachment.
struct H {
    fake: FakeLlm,
    srv: Srv,
    work: PathBuf,
    root: Fid,
    _c: ollie_p9::Client,
}

async fn start(script: Vec<Reply>, extra: &str) -> H {
    start_with(script, extra, "").await
}

/// `start` with more keys for `[backends.fake]`.
async fn start_with(script: Vec<Reply>, extra: &str, backend_extra: &str) -> H {
    let fake = FakeLlm::start(script).await;
    let (srv, work) = olliesrv_with(
        "openai",
        &format!("{}/v1", fake.url()),
        extra,
        backend_extra,
    );
    let (c, root) = attach(&srv, &me()).await;
    H {
        fake,
        srv,
        work,
        root,
        _c: c,
    }
}

/// `start` plus session `s` with agent `a`.
async fn start_agent(script: Vec<Reply>, extra: &str) -> H {
    let h = start(script, extra).await;
    session_with_agent(&h.root, &h.work).await;
    h
}

const A: &str = "session/s/agent/a";

/// Sends `prompt` to agent `a`; returns the states `eventwait` reported until the turn ended
/// (`idle` or `error`), after checking that `statewait` (opened before the prompt) ends in
/// the same state.
async fn turn(root: &Fid, prompt: &str) -> Vec<String> {
    let ev = events(root).await;
    let mut sw = root.walk_path(&format!("{A}/statewait")).await.unwrap();
    sw.open(om::OREAD).await.unwrap();
    write(root, &format!("{A}/prompt"), prompt).await.unwrap();
    let states = states_until(&ev, &["idle", "error"]).await;
    let end = within("statewait", sw.read(0, 256)).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&end),
        format!("{}\n", states.last().unwrap()),
        "statewait disagrees with eventwait {states:?}"
    );
    states
}

/// The chat's blocks (from `log`, the snapshot of `chat.raw`).
async fn chat_blocks(root: &Fid) -> Vec<Block> {
    blocks(&read(root, &format!("{A}/log")).await)
}

fn kinds(bs: &[Block]) -> Vec<&str> {
    bs.iter().map(|b| b.kind.as_str()).collect()
}

async fn stats(root: &Fid) -> String {
    read(root, &format!("{A}/stats")).await
}

/// The `messages` of a request body.
fn messages(g: &Got) -> Vec<Value> {
    g.json()["messages"].as_array().cloned().unwrap_or_default()
}

fn last_message(g: &Got) -> Value {
    messages(g).last().cloned().unwrap_or(Value::Null)
}

/// `session/s/agent/a/proc/top` lists no process.
async fn nothing_ran(root: &Fid) {
    let top = read(root, &format!("{A}/proc/top")).await;
    assert_eq!(top.lines().count(), 1, "a process ran:\n{top}");
}

fn states(s: &[&str]) -> Vec<String> {
    s.iter().map(|&x| x.to_owned()).collect()
}

// ---------------------------------------------------------------------------------------
// Tests

/// Reasoning and text stream into their blocks; usage reaches `stats`; the request is a
/// streamed Chat Completions request with the system prompt, the user's message and the
/// tool schemas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_and_reasoning_stream_into_the_chat_and_usage_into_stats() {
    let h = start_agent(
        vec![thought("I should greet back.", "Hello, wörld!", (11, 7))],
        "",
    )
    .await;
    let st = turn(&h.root, "hi there").await;
    assert_eq!(st, states(&["thinking", "idle"]));

    let bs = chat_blocks(&h.root).await;
    assert_eq!(kinds(&bs), ["user", "reasoning", "assistant"], "{bs:?}");
    assert_eq!(bs[0].body, "hi there\n");
    assert_eq!(bs[1].body, "I should greet back.\n");
    assert_eq!(bs[2].body, "Hello, wörld!\n");
    // `chat` is the same without markers (one read of what is there: it streams).
    let mut cf = h.root.walk_path(&format!("{A}/chat")).await.unwrap();
    cf.open(om::OREAD).await.unwrap();
    let chat = String::from_utf8(cf.read(0, 65536).await.unwrap().to_vec()).unwrap();
    assert!(!chat.contains("[[["), "{chat}");
    assert!(chat.contains("Hello, wörld!\n"), "{chat}");

    let s = stats(&h.root).await;
    assert_kv(
        &s,
        &[
            ("tokens_in", "11"),
            ("tokens_out", "7"),
            ("requests", "1"),
            ("context_tokens", "18"),
            ("tool_calls", "0"),
            ("turns", "1"),
            ("errors", "0"),
        ],
    );

    let posts = h.fake.posts();
    assert_eq!(posts.len(), 1);
    let g = &posts[0];
    assert_eq!(g.path, "/v1/chat/completions");
    assert_eq!(g.headers["content-type"], "application/json");
    assert_eq!(g.headers["accept"], "text/event-stream");
    assert_eq!(g.headers["authorization"], format!("Bearer {KEY}"));
    let body = g.json();
    assert_eq!(body["model"], "m", "{body}");
    assert_eq!(body["stream"], true, "{body}");
    assert_eq!(body["stream_options"]["include_usage"], true, "{body}");
    let msgs = messages(g);
    assert_eq!(msgs.len(), 2, "{body}");
    assert_eq!(msgs[0]["role"], "system");
    assert!(
        msgs[0]["content"]
            .as_str()
            .unwrap()
            .contains(&format!("Working directory: {}", h.work.display())),
        "{body}"
    );
    assert_eq!(msgs[1], json!({"role": "user", "content": "hi there"}));
    let tools: Vec<&str> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert_eq!(t["type"], "function", "{t}");
            t["function"]["name"].as_str().unwrap()
        })
        .collect();
    for t in ["execute_code", "file_read", "file_write"] {
        assert!(tools.contains(&t), "{tools:?}");
    }
}

/// The whole loop: the model asks for `execute_code` (its arguments arrive in fragments),
/// the code runs sandboxed in toolsrv (it writes a file in the work directory; reading
/// /etc/shadow is denied), the result block carries the run record, the next request
/// carries the result as a `tool` message answering the call's id, and the model answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_runs_sandboxed_and_its_result_goes_back_to_the_model() {
    const CODE: &str = "echo made > made.txt; if cat /etc/shadow >/dev/null 2>&1; then echo READ; else echo DENIED; fi";
    let args = json!({"language": "bash", "code": CODE});
    let h = start_agent(
        vec![
            Reply::sse(&reply_events(
                "",
                "",
                &[("call_e2e", "execute_code", args.clone())],
                (20, 9),
            )),
            thought("", "Made made.txt; /etc/shadow stayed closed.", (30, 4)),
        ],
        "",
    )
    .await;
    let st = turn(&h.root, "make a file").await;
    assert_eq!(
        st,
        states(&["thinking", "calling: execute_code", "thinking", "idle"])
    );

    let bs = chat_blocks(&h.root).await;
    assert_eq!(
        kinds(&bs),
        ["user", "tool_call", "tool_result", "assistant"],
        "{bs:?}"
    );
    assert_eq!(bs[1].attrs, "name=execute_code id=call_e2e");
    let shown: Value = serde_json::from_str(bs[1].body.trim()).unwrap();
    assert_eq!(shown, args);
    let result = &bs[2];
    assert!(
        result
            .attrs
            .starts_with("name=execute_code id=call_e2e pid="),
        "{}",
        result.attrs
    );
    assert!(
        result.attrs.contains(" exit=0 record={"),
        "{}",
        result.attrs
    );
    // toolsrv's result: a status line, then the output.
    assert!(result.body.starts_with("pid="), "{result:?}");
    assert!(result.body.contains(" exit=0 "), "{result:?}");
    assert!(result.body.ends_with("\nDENIED\n"), "{result:?}");
    assert!(!result.body.contains("\nREAD\n"), "{result:?}");
    let (_, rec) = result.attrs.split_once(" record=").unwrap();
    let rec: Value = serde_json::from_str(rec).unwrap();
    let argv = rec["argv"].as_array().unwrap();
    assert_eq!(argv.last().unwrap(), CODE, "{rec}");
    assert!(argv[0].as_str().unwrap().contains("bash"), "{rec}");
    assert_eq!(rec["exit"]["code"], 0, "{rec}");
    assert_eq!(
        rec["layers"]["landlock"]["status"], "fully_enforced",
        "{rec}"
    );
    assert!(
        rec["layers"]["landlock"]["abi"].as_u64().unwrap() >= 1,
        "{rec}"
    );
    assert_eq!(bs[3].body, "Made made.txt; /etc/shadow stayed closed.\n");

    // The tool ran in the work directory.
    assert_eq!(
        std::fs::read_to_string(h.work.join("made.txt")).unwrap(),
        "made\n"
    );

    let posts = h.fake.posts();
    assert_eq!(posts.len(), 2);
    assert_eq!(
        last_message(&posts[0]),
        json!({"role": "user", "content": "make a file"})
    );
    let msgs = messages(&posts[1]);
    assert_eq!(msgs.len(), 4, "{msgs:?}");
    let asked = &msgs[2];
    assert_eq!(asked["role"], "assistant", "{asked}");
    assert_eq!(asked["content"], Value::Null, "{asked}");
    let calls = asked["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{asked}");
    assert_eq!(calls[0]["id"], "call_e2e");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "execute_code");
    let sent: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(sent, args);
    assert_eq!(
        msgs[3],
        json!({"role": "tool", "tool_call_id": "call_e2e", "content": result.body})
    );

    let s = stats(&h.root).await;
    assert_kv(
        &s,
        &[
            ("requests", "2"),
            ("tool_calls", "1"),
            ("tokens_in", "50"),
            ("tokens_out", "13"),
            ("context_tokens", "34"),
        ],
    );
    let top = read(&h.root, &format!("{A}/proc/top")).await;
    assert!(
        top.contains("exited") && top.contains("execute_code"),
        "{top}"
    );
}

/// Two `file_read` calls in one reply (their fragments interleaved) run together
/// (`calling: file_read, file_read`) and both results go back in order; a `file_read`
/// followed by an `execute_code` run one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_reads_share_a_step_and_other_calls_run_in_order() {
    let h = start_agent(
        vec![
            tool_calls(&[
                ("r1", "file_read", json!({"path": "alpha.txt"})),
                ("r2", "file_read", json!({"path": "beta.txt"})),
            ]),
            tool_calls(&[
                ("r3", "file_read", json!({"path": "alpha.txt"})),
                (
                    "x1",
                    "execute_code",
                    json!({"language": "bash", "code": "echo ran > ran.txt; echo ran"}),
                ),
            ]),
            answer("read both"),
        ],
        "",
    )
    .await;
    std::fs::write(h.work.join("alpha.txt"), "alpha line\n").unwrap();
    std::fs::write(h.work.join("beta.txt"), "beta line\n").unwrap();
    let st = turn(&h.root, "read the files").await;
    assert_eq!(
        st,
        states(&[
            "thinking",
            "calling: file_read, file_read",
            "thinking",
            "calling: file_read",
            "calling: execute_code",
            "thinking",
            "idle"
        ])
    );

    let bs = chat_blocks(&h.root).await;
    assert_eq!(
        kinds(&bs),
        [
            "user",
            "tool_call",
            "tool_call",
            "tool_result",
            "tool_result",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "assistant"
        ],
        "{bs:?}"
    );
    assert_eq!(bs[1].attrs, "name=file_read id=r1");
    assert_eq!(bs[2].attrs, "name=file_read id=r2");
    assert!(bs[3].attrs.starts_with("name=file_read id=r1"), "{bs:?}");
    assert!(bs[3].body.contains("alpha line"), "{bs:?}");
    assert!(bs[4].attrs.starts_with("name=file_read id=r2"), "{bs:?}");
    assert!(bs[4].body.contains("beta line"), "{bs:?}");
    assert!(bs[6].attrs.starts_with("name=file_read id=r3"), "{bs:?}");
    assert!(
        bs[8].attrs.starts_with("name=execute_code id=x1 pid="),
        "{bs:?}"
    );
    assert!(bs[8].attrs.contains(" exit=0 "), "{bs:?}");
    assert!(bs[8].body.ends_with("\nran\n"), "{bs:?}");
    assert_eq!(
        std::fs::read_to_string(h.work.join("ran.txt")).unwrap(),
        "ran\n"
    );

    let posts = h.fake.posts();
    assert_eq!(posts.len(), 3);
    let m = messages(&posts[1]);
    let n = m.len();
    let ids: Vec<&str> = m[n - 3]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["r1", "r2"]);
    let args: Value = serde_json::from_str(
        m[n - 3]["tool_calls"][1]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(args, json!({"path": "beta.txt"}));
    assert_eq!(m[n - 2]["role"], "tool");
    assert_eq!(m[n - 2]["tool_call_id"], "r1");
    assert!(m[n - 2]["content"].as_str().unwrap().contains("alpha line"));
    assert_eq!(m[n - 1]["tool_call_id"], "r2");
    assert!(m[n - 1]["content"].as_str().unwrap().contains("beta line"));
    let m = messages(&posts[2]);
    let n = m.len();
    assert_eq!(m[n - 2]["tool_call_id"], "r3");
    assert_eq!(
        m[n - 1],
        json!({"role": "tool", "tool_call_id": "x1", "content": bs[8].body})
    );
    let s = stats(&h.root).await;
    assert_kv(&s, &[("tool_calls", "4"), ("requests", "3")]);
}

/// HTTP 429 with `Retry-After: 1`: an `info retry` block, the `limitretry` state, the same
/// request again, then the answer; both requests are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_waits_for_retry_after_and_retries() {
    let h = start_agent(
        vec![
            api_error(429, "Rate limit reached for m", "rate_limit_exceeded")
                .header("Retry-After", "1"),
            answer("after the wait"),
        ],
        "",
    )
    .await;
    let st = turn(&h.root, "go").await;
    assert_eq!(st, states(&["thinking", "limitretry", "thinking", "idle"]));
    let bs = chat_blocks(&h.root).await;
    assert_eq!(kinds(&bs), ["user", "info", "assistant"], "{bs:?}");
    assert_eq!(bs[1].attrs, "retry");
    assert_eq!(
        bs[1].body,
        "rate limited (retry after 1 s); retrying in 1.0 s (1 of 3)\n"
    );
    assert_eq!(bs[2].body, "after the wait\n");
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 2);
    assert_eq!(
        posts[0].body, posts[1].body,
        "the retry changed the request"
    );
    let s = stats(&h.root).await;
    assert_kv(
        &s,
        &[("requests", "2"), ("tokens_in", "10"), ("errors", "0")],
    );
}

/// Two HTTP 500s are retried (after 1 s, then 2 s), then the answer arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_with_backoff() {
    let h = start_agent(
        vec![
            api_error(500, "The server had an error", "server_error"),
            api_error(500, "The server had an error", "server_error"),
            answer("third time lucky"),
        ],
        "",
    )
    .await;
    let st = turn(&h.root, "go").await;
    assert_eq!(
        st,
        states(&[
            "thinking",
            "limitretry",
            "thinking",
            "limitretry",
            "thinking",
            "idle"
        ])
    );
    let bs = chat_blocks(&h.root).await;
    assert_eq!(kinds(&bs), ["user", "info", "info", "assistant"], "{bs:?}");
    assert_eq!(
        bs[1].body,
        "fake: http 500: The server had an error; retrying in 1.0 s (1 of 3)\n"
    );
    assert_eq!(
        bs[2].body,
        "fake: http 500: The server had an error; retrying in 2.0 s (2 of 3)\n"
    );
    assert!(bs[1].attrs == "retry" && bs[2].attrs == "retry", "{bs:?}");
    assert_eq!(bs[3].body, "third time lucky\n");
    assert_eq!(h.fake.posts().len(), 3);
    let s = stats(&h.root).await;
    assert_kv(&s, &[("requests", "3"), ("errors", "0")]);
}

/// Four HTTP 500s: three retries, then the turn fails (`error` block, state `error`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_that_persists_fails_the_turn() {
    let e = || api_error(500, "The server had an error", "server_error");
    let h = start_agent(vec![e(), e(), e(), e()], "").await;
    let st = turn(&h.root, "go").await;
    assert_eq!(
        st,
        states(&[
            "thinking",
            "limitretry",
            "thinking",
            "limitretry",
            "thinking",
            "limitretry",
            "thinking",
            "error"
        ])
    );
    let bs = chat_blocks(&h.root).await;
    assert_eq!(
        kinds(&bs),
        ["user", "info", "info", "info", "error"],
        "{bs:?}"
    );
    assert!(bs[3].body.contains("retrying in 4.0 s (3 of 3)"), "{bs:?}");
    assert_eq!(
        bs[4].body,
        "model call failed: fake: http 500: The server had an error\n"
    );
    assert_eq!(h.fake.posts().len(), 4);
    assert_eq!(h.fake.left(), 0);
    let s = stats(&h.root).await;
    assert_kv(&s, &[("requests", "4"), ("errors", "1"), ("turns", "1")]);
}

/// A stream dropped mid-message (no finish reason, no `[DONE]`) is retried; only the
/// complete reply enters the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_mid_message_is_retried() {
    // Role chunk and "Hel", then the connection drops.
    let cut = Reply::sse(&reply_events("", "Hello, world", &[], (10, 5))).cut(2);
    let h = start_agent(vec![cut, answer("Hello again, whole"), answer("ok")], "").await;
    let st = turn(&h.root, "greet").await;
    assert_eq!(st, states(&["thinking", "limitretry", "thinking", "idle"]));
    let bs = chat_blocks(&h.root).await;
    let info: Vec<&Block> = bs.iter().filter(|b| b.kind == "info").collect();
    assert_eq!(info.len(), 1, "{bs:?}");
    assert_eq!(info[0].attrs, "retry");
    assert_eq!(
        info[0].body,
        "fake: the stream ended before the reply was complete; retrying in 1.0 s (1 of 3)\n"
    );
    assert_eq!(bs.last().unwrap().kind, "assistant");
    assert_eq!(bs.last().unwrap().body, "Hello again, whole\n");
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].body, posts[1].body);
    // The next turn's request holds the complete reply only.
    turn(&h.root, "again").await;
    let m = messages(&h.fake.posts()[2]);
    assert_eq!(m.len(), 4, "{m:?}");
    assert_eq!(
        m[2],
        json!({"role": "assistant", "content": "Hello again, whole"})
    );
    let s = stats(&h.root).await;
    assert_kv(&s, &[("requests", "3"), ("errors", "0")]);
}

/// HTTP 400 `context_length_exceeded`: an info block, a compaction request (the summary
/// system prompt and the transcript), the history replaced by the summary + the kept tail,
/// the request retried with it, the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_overflow_compacts_the_history_and_retries() {
    let h = start_agent(
        vec![
            answer("first answer"),
            api_error(
                400,
                "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
                "context_length_exceeded",
            ),
            answer("- the user asked a first question\n- it was answered"),
            answer("second answer"),
        ],
        "",
    )
    .await;
    turn(&h.root, "first question").await;
    let st = turn(&h.root, "second question").await;
    assert_eq!(st, states(&["thinking", "compacting", "thinking", "idle"]));

    let bs = chat_blocks(&h.root).await;
    assert_eq!(
        kinds(&bs),
        ["user", "assistant", "user", "info", "info", "assistant"],
        "{bs:?}"
    );
    assert_eq!(bs[3].attrs, "");
    assert!(
        bs[3].body.starts_with(
            "context overflow: fake: http 400: This model's maximum context length is 8192 tokens."
        ),
        "{bs:?}"
    );
    assert_eq!(bs[4].attrs, "compacted");
    assert!(
        bs[4].body.starts_with(
            "compacted the conversation (the model's context overflowed): 2 messages summarized, 1 kept"
        ),
        "{bs:?}"
    );
    assert!(bs[4].body.contains("- the user asked a first question"));
    assert_eq!(bs[5].body, "second answer\n");

    let posts = h.fake.posts();
    assert_eq!(posts.len(), 4);
    assert_eq!(messages(&posts[1]).len(), 4);
    // The compaction request.
    let body = posts[2].json();
    let m = messages(&posts[2]);
    assert_eq!(m.len(), 2, "{body}");
    assert_eq!(m[0]["role"], "system");
    assert!(
        m[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("You compress"),
        "{body}"
    );
    assert_eq!(m[1]["role"], "user");
    let t = m[1]["content"].as_str().unwrap();
    assert!(t.contains("USER:\nfirst question"), "{t}");
    assert!(t.contains("ASSISTANT:\nfirst answer"), "{t}");
    assert!(t.contains("Summarize the conversation above"), "{t}");
    assert!(!t.contains("second question"), "{t}");
    assert!(body.get("tools").is_none(), "{body}");
    // The retried request: summary, then the kept prompt.
    let m = messages(&posts[3]);
    assert_eq!(m.len(), 3, "{m:?}");
    assert_eq!(m[1]["role"], "user");
    assert!(
        m[1]["content"].as_str().unwrap().starts_with(
            "<conversation-summary>\n- the user asked a first question\n- it was answered\n</conversation-summary>"
        ),
        "{m:?}"
    );
    assert_eq!(m[2], json!({"role": "user", "content": "second question"}));
    let s = stats(&h.root).await;
    assert_kv(&s, &[("requests", "4"), ("errors", "0")]);
}

/// An answer that writes a tool call as text: an `info text-tool-call` block, the model is
/// called again with a note as the last message, then it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_written_as_text_brings_a_note_and_another_call() {
    let as_text = "```json\n{\"name\": \"execute_code\", \"arguments\": {\"language\": \"bash\", \"code\": \"ls\"}}\n```";
    let h = start_agent(
        vec![answer(as_text), answer("Nothing needs running: it is 4.")],
        "",
    )
    .await;
    let st = turn(&h.root, "what is 2+2").await;
    assert_eq!(st, states(&["thinking", "idle"]));
    let bs = chat_blocks(&h.root).await;
    assert_eq!(
        kinds(&bs),
        ["user", "assistant", "info", "assistant"],
        "{bs:?}"
    );
    assert_eq!(bs[2].attrs, "text-tool-call");
    assert!(
        bs[2]
            .body
            .starts_with("Your reply wrote a call to execute_code as text"),
        "{bs:?}"
    );
    assert_eq!(bs[3].body, "Nothing needs running: it is 4.\n");
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 2);
    let m = messages(&posts[1]);
    let n = m.len();
    assert_eq!(m[n - 2], json!({"role": "assistant", "content": as_text}));
    assert_eq!(m[n - 1]["role"], "user");
    assert!(
        m[n - 1]["content"]
            .as_str()
            .unwrap()
            .starts_with("Your reply wrote a call to execute_code as text"),
        "{m:?}"
    );
    nothing_ran(&h.root).await;
    let s = stats(&h.root).await;
    assert_eq!(kv(&s, "tool_calls"), "0", "{s}");
}

/// A call to a tool the agent does not have is answered with an error and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_tool_is_refused_without_running_anything() {
    let h = start_agent(
        vec![
            tool_calls(&[("u1", "rm_rf_everything", json!({"path": "/"}))]),
            answer("I cannot do that."),
        ],
        "",
    )
    .await;
    let st = turn(&h.root, "clean up").await;
    assert_eq!(
        st,
        states(&["thinking", "calling: rm_rf_everything", "thinking", "idle"])
    );
    let bs = chat_blocks(&h.root).await;
    assert_eq!(
        kinds(&bs),
        ["user", "tool_call", "tool_result", "assistant"],
        "{bs:?}"
    );
    assert_eq!(bs[2].attrs, "name=rm_rf_everything id=u1");
    assert!(
        bs[2]
            .body
            .starts_with("error: unknown tool \"rm_rf_everything\" (available: "),
        "{bs:?}"
    );
    assert!(bs[2].body.contains("execute_code"), "{bs:?}");
    nothing_ran(&h.root).await;
    let m = messages(&h.fake.posts()[1]);
    let last = m.last().unwrap();
    assert_eq!(last["role"], "tool");
    assert_eq!(last["tool_call_id"], "u1");
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .starts_with("error: unknown tool \"rm_rf_everything\""),
        "{last}"
    );
}

/// Three rounds in a row in which every call fails bring a nudge (the next request's last
/// message); five end the turn with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_rounds_bring_a_nudge_and_then_abort_the_turn() {
    let script = (1..=5).map(|i| exec(&format!("f{i}"), "exit 3")).collect();
    let h = start_agent(script, "").await;
    let st = turn(&h.root, "try it").await;
    let mut want = vec!["thinking"];
    for i in 0..5 {
        want.push("calling: execute_code");
        want.push(if i < 4 { "thinking" } else { "error" });
    }
    assert_eq!(st, states(&want));
    let bs = chat_blocks(&h.root).await;
    assert_eq!(
        kinds(&bs),
        [
            "user",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "info",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "error"
        ],
        "{bs:?}"
    );
    assert!(bs[2].attrs.contains(" exit=3 "), "{bs:?}");
    assert_eq!(bs[7].attrs, "nudge");
    assert!(
        bs[7]
            .body
            .starts_with("In your last 3 rounds every tool call failed."),
        "{bs:?}"
    );
    assert_eq!(
        bs[12].body,
        "aborted: in 5 rounds in a row every tool call failed\n"
    );
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 5);
    assert_eq!(last_message(&posts[2])["role"], "tool");
    let nudge = last_message(&posts[3]);
    assert_eq!(nudge["role"], "user");
    assert!(
        nudge["content"]
            .as_str()
            .unwrap()
            .starts_with("In your last 3 rounds every tool call failed."),
        "{nudge}"
    );
    assert_eq!(last_message(&posts[4])["role"], "tool");
    let s = stats(&h.root).await;
    assert_kv(
        &s,
        &[("tool_calls", "5"), ("requests", "5"), ("errors", "1")],
    );
}

/// The price table turns reported usage into `cost_usd`; with the session's cost cap below
/// what was spent, the next turn fails before any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prices_give_the_cost_and_the_cost_cap_stops_the_next_turn() {
    let h = start_agent(
        vec![thought("", "priced", (3, 2)), answer("never sent")],
        "[prices.\"m\"]\ninput_per_mtok = 1000000.0\noutput_per_mtok = 2000000.0\n",
    )
    .await;
    turn(&h.root, "one").await;
    let s = stats(&h.root).await;
    // 3 tokens at $1 + 2 tokens at $2.
    let cost: f64 = kv(&s, "cost_usd").parse().unwrap();
    assert!((cost - 7.0).abs() < 1e-9, "{s}");
    let c = rdwr(&h.root, "session/s/ctl", "cost").await.unwrap();
    assert_eq!(c, "cost_usd=7.000000\ncost_cap_usd=none\n");
    rdwr(&h.root, "session/s/ctl", "cost_cap 0.5")
        .await
        .unwrap();
    let c = rdwr(&h.root, "session/s/ctl", "cost").await.unwrap();
    assert_eq!(c, "cost_usd=7.000000\ncost_cap_usd=0.5\n");

    let st = turn(&h.root, "two").await;
    assert_eq!(st, states(&["thinking", "error"]));
    let bs = chat_blocks(&h.root).await;
    let last = bs.last().unwrap();
    assert_eq!(last.kind, "error");
    assert!(
        last.body
            .starts_with("session cost cap reached: $7.0000 spent of $0.50"),
        "{last:?}"
    );
    assert_eq!(h.fake.posts().len(), 1, "a request was sent over the cap");
    let s = stats(&h.root).await;
    assert_kv(&s, &[("requests", "1"), ("errors", "1")]);
}

/// `ctl compact` on an idle agent summarizes its history now; the next request starts with
/// the summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_compact_summarizes_an_idle_agents_history() {
    let h = start_agent(
        vec![
            answer("first answer"),
            answer("SUMMARY: asked a first question"),
            answer("second answer"),
        ],
        "",
    )
    .await;
    turn(&h.root, "first question").await;
    let ev = events(&h.root).await;
    let r = rdwr(&h.root, &format!("{A}/ctl"), "compact").await.unwrap();
    assert_eq!(r, "compacted: 1 messages summarized, 1 kept\n");
    let st = states_until(&ev, &["idle"]).await;
    assert_eq!(st[st.len() - 2..], ["compacting", "idle"], "{st:?}");

    let posts = h.fake.posts();
    assert_eq!(posts.len(), 2);
    let m = messages(&posts[1]);
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(
        m[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("You compress")
    );
    let t = m[1]["content"].as_str().unwrap();
    assert!(t.contains("USER:\nfirst question"), "{t}");
    assert!(!t.contains("first answer"), "{t}");
    let bs = chat_blocks(&h.root).await;
    let last = bs.last().unwrap();
    assert_eq!(last.attrs, "compacted");
    assert!(
        last.body.starts_with(
            "compacted the conversation (requested with ctl compact): 1 messages summarized, 1 kept"
        ),
        "{last:?}"
    );

    turn(&h.root, "second question").await;
    let m = messages(&h.fake.posts()[2]);
    assert_eq!(m.len(), 4, "{m:?}");
    assert!(
        m[1]["content"]
            .as_str()
            .unwrap()
            .starts_with("<conversation-summary>\nSUMMARY: asked a first question\n"),
        "{m:?}"
    );
    assert_eq!(
        m[2],
        json!({"role": "assistant", "content": "first answer"})
    );
    assert_eq!(m[3], json!({"role": "user", "content": "second question"}));
}

/// The root `models` file and the agent's `ctl models` list what `GET /v1/models` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_come_from_the_servers_model_list() {
    let h = start_agent(Vec::new(), "").await;
    h.fake.route(
        "/v1/models",
        Reply::json(
            200,
            &json!({"object": "list", "data": [
                {"id": "m", "object": "model", "created": 1, "owned_by": "fake"},
                {"id": "m-large", "object": "model", "created": 1, "owned_by": "fake"}
            ]}),
        ),
    );
    assert_eq!(read(&h.root, "models").await, "fake\tm\nfake\tm-large\n");
    assert_eq!(
        rdwr(&h.root, &format!("{A}/ctl"), "models").await.unwrap(),
        "m\nm-large\n"
    );
    let gets: Vec<Got> = h
        .fake
        .got()
        .into_iter()
        .filter(|g| g.method == "GET")
        .collect();
    assert_eq!(gets.len(), 2);
    for g in &gets {
        assert_eq!(g.path, "/v1/models");
        assert_eq!(g.headers["authorization"], format!("Bearer {KEY}"));
    }
    assert!(h.fake.posts().is_empty());
}

/// `generate` on two fids at once: each fid gets the reply to its own prompt; a sub-agent
/// (`agent/new … prompt=`) returns its final reply on the same fid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_answers_each_fid_and_a_sub_agent_returns_its_reply() {
    let replies = ["reply number one", "reply number two"];
    let h = start(
        vec![
            answer(replies[0]),
            answer(replies[1]),
            answer("the sub-agent is done"),
        ],
        "",
    )
    .await;
    let prompts = ["prompt A: say one", "prompt B: say two"];
    let mut a = h.root.walk_path("generate").await.unwrap();
    a.open(om::ORDWR).await.unwrap();
    let mut b = h.root.walk_path("generate").await.unwrap();
    b.open(om::ORDWR).await.unwrap();
    let (wa, wb) = tokio::join!(
        a.write(0, bytes::Bytes::from_static(prompts[0].as_bytes())),
        b.write(0, bytes::Bytes::from_static(prompts[1].as_bytes()))
    );
    wa.unwrap();
    wb.unwrap();
    let got = [
        String::from_utf8(a.read_to_end().await.unwrap()).unwrap(),
        String::from_utf8(b.read_to_end().await.unwrap()).unwrap(),
    ];
    assert_ne!(got[0], got[1]);
    // The server answers in arrival order: the fid whose prompt arrived i-th gets reply i.
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 2);
    for (i, p) in posts.iter().enumerate() {
        let m = messages(p);
        assert_eq!(m.len(), 1, "generate sends no system prompt: {m:?}");
        assert!(p.json().get("tools").is_none());
        let asked = m[0]["content"].as_str().unwrap();
        let fid = prompts.iter().position(|q| *q == asked).unwrap();
        assert_eq!(got[fid], format!("{}\n", replies[i]), "{got:?}");
    }

    rdwr(
        &h.root,
        "session/new",
        &format!("name=s cwd={}", h.work.display()),
    )
    .await
    .unwrap();
    let r = rdwr(
        &h.root,
        "session/s/agent/new",
        "name=sub prompt=finish the job",
    )
    .await
    .unwrap();
    assert_eq!(r, "the sub-agent is done");
    let p = &h.fake.posts()[2];
    assert_eq!(
        last_message(p),
        json!({"role": "user", "content": "finish the job"})
    );
}

/// Every file in `dir`, recursively.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.is_file() {
            out.push(p);
        }
    }
}

/// The API key goes in the Authorization header and nowhere else: not in the chat, stats,
/// cfg, errors (also when the server echoes the key in an error body or an in-stream
/// error), olliesrv's stderr or the state directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_sent_as_a_bearer_token_and_never_shown() {
    let echo = format!(
        "Incorrect API key provided: {KEY}. You can find your API key at https://platform.example/account/api-keys."
    );
    let in_stream = format!(
        "data: {}",
        json!({"error": {"message": format!("invalid key {KEY}"), "type": "invalid_request_error", "code": 401}})
    );
    let h = start_agent(
        vec![
            answer("fine"),
            api_error(401, &echo, "invalid_api_key"),
            Reply::sse(&[
                chunk(json!({"role": "assistant", "content": ""}), None),
                in_stream,
            ]),
        ],
        "",
    )
    .await;
    h.fake
        .route("/v1/models", api_error(401, &echo, "invalid_api_key"));
    assert_eq!(turn(&h.root, "one").await.last().unwrap(), "idle");
    assert_eq!(turn(&h.root, "two").await.last().unwrap(), "error");
    assert_eq!(turn(&h.root, "three").await.last().unwrap(), "error");

    let log = read(&h.root, &format!("{A}/log")).await;
    let bs = blocks(&log);
    let errors: Vec<&Block> = bs.iter().filter(|b| b.kind == "error").collect();
    assert_eq!(errors.len(), 2, "{bs:?}");
    assert!(
        errors[0].body.starts_with(
            "model call failed: fake: http 401: Incorrect API key provided: <redacted>."
        ),
        "{bs:?}"
    );
    assert!(errors[1].body.contains("invalid key <redacted>"), "{bs:?}");
    let models = read(&h.root, "models").await;
    assert!(models.starts_with("# fake: "), "{models}");
    let ctl_models = rdwr(&h.root, &format!("{A}/ctl"), "models")
        .await
        .unwrap_err();
    let shown = [
        ("log", log),
        ("stats", read(&h.root, &format!("{A}/stats")).await),
        ("cfg", read(&h.root, &format!("{A}/cfg")).await),
        ("session env", read(&h.root, "session/s/env").await),
        ("models", models),
        ("ctl models", ctl_models),
        ("backends", read(&h.root, "backends").await),
        ("stderr", h.srv.stderr()),
    ];
    for (what, text) in &shown {
        assert!(!text.contains(KEY), "the key shows in {what}:\n{text}");
    }
    let mut all = Vec::new();
    files(&h.srv.state_dir(), &mut all);
    assert!(!all.is_empty());
    for f in all {
        let b = std::fs::read(&f).unwrap();
        assert!(
            !String::from_utf8_lossy(&b).contains(KEY),
            "the key is in {}",
            f.display()
        );
    }
    let got = h.fake.got();
    // Three chat requests, two model listings, and the one /models request at the first
    // turn that learns the model's context window (no context_limit is configured).
    assert_eq!(got.len(), 3 + 2 + 1);
    for g in &got {
        assert_eq!(
            g.headers.get("authorization").map(String::as_str),
            Some(format!("Bearer {KEY}").as_str()),
            "{} {}",
            g.method,
            g.path
        );
        assert!(!g.body.contains(KEY), "the key is in a request body");
    }
}

/// Redaction never changes what runs: a tool call whose arguments hold the API key's text runs
/// exactly as the model wrote it (the file it writes holds the key), while the chat, the
/// history the next request carries and the state directory show `<redacted>` instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_runs_as_written_and_only_its_copies_are_redacted() {
    let code = format!("printf %s '{KEY}/bk/work' > got.txt && printf wrote");
    // The answer streams in three pieces that cut the key apart.
    let h = start_agent(vec![exec("c1", &code), answer(&format!("done {KEY}"))], "").await;
    assert_eq!(turn(&h.root, "write it").await.last().unwrap(), "idle");
    let got = std::fs::read_to_string(h.work.join("got.txt")).unwrap();
    assert_eq!(
        got,
        format!("{KEY}/bk/work"),
        "the command did not run as written"
    );

    let log = read(&h.root, &format!("{A}/log")).await;
    assert!(!log.contains(KEY), "the key shows in the chat:\n{log}");
    let call = blocks(&log)
        .into_iter()
        .find(|b| b.kind == "tool_call")
        .expect("a tool_call block");
    assert!(call.body.contains("<redacted>/bk/work"), "{call:?}");
    let said = blocks(&log)
        .into_iter()
        .rfind(|b| b.kind == "assistant")
        .expect("an assistant block");
    assert_eq!(said.body, "done <redacted>\n");
    let mut all = Vec::new();
    files(&h.srv.state_dir(), &mut all);
    let history: Vec<&PathBuf> = all
        .iter()
        .filter(|f| f.ends_with("history.jsonl"))
        .collect();
    assert_eq!(history.len(), 1, "{all:?}");
    for f in &all {
        let text = String::from_utf8_lossy(&std::fs::read(f).unwrap()).into_owned();
        assert!(!text.contains(KEY), "the key is in {}", f.display());
    }
    let history = std::fs::read_to_string(history[0]).unwrap();
    assert!(history.contains("<redacted>/bk/work"), "{history}");
    // The two chat requests (besides the /models request that learns the context window).
    let got: Vec<_> = h
        .fake
        .got()
        .into_iter()
        .filter(|g| g.method == "POST")
        .collect();
    assert_eq!(got.len(), 2);
    assert!(!got[1].body.contains(KEY), "the key went back to the model");
}

/// A key shorter than 16 characters is refused where it is read: the turn fails with one line
/// naming the source, no request is sent, and ordinary text that holds the short key's
/// characters (a path `…/bk/work`) is shown untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_api_key_is_refused_with_a_clear_error() {
    let keydir = tempfile::tempdir().unwrap();
    let keyfile = keydir.path().join("key");
    std::fs::write(&keyfile, "bk\n").unwrap();
    std::fs::set_permissions(
        &keyfile,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let fake = FakeLlm::start(vec![answer("never")]).await;
    let extra = format!(
        "[backends.short]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"m\"\napi_key_file = \"{}\"\n",
        fake.url(),
        keyfile.display()
    );
    let (srv, work) = olliesrv("openai", &format!("{}/v1", fake.url()), &extra);
    let (_c, root) = attach(&srv, &me()).await;
    rdwr(
        &root,
        "session/new",
        &format!("name=s cwd={}", work.display()),
    )
    .await
    .unwrap();
    rdwr(&root, "session/s/agent/new", "name=a backend=short")
        .await
        .unwrap();
    assert_eq!(
        turn(&root, "look in /home/bk/work").await.last().unwrap(),
        "error"
    );
    let bs = chat_blocks(&root).await;
    let err = bs
        .iter()
        .find(|b| b.kind == "error")
        .expect("an error block");
    assert_eq!(
        err.body.trim_end(),
        format!(
            "model call failed: short: the API key in {} is too short: at least 16 characters",
            keyfile.display()
        ),
        "{bs:?}"
    );
    let user = bs.iter().find(|b| b.kind == "user").expect("the prompt");
    assert_eq!(user.body, "look in /home/bk/work\n");
    assert!(
        fake.got().is_empty(),
        "a request was sent with the short key"
    );
}

/// The plan is shown to the model again (as the last message) on the 9th request of a turn,
/// not before, and it does not stay in the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_is_shown_again_every_eighth_step() {
    let mut script: Vec<Reply> = (1..=8).map(|i| exec(&format!("p{i}"), "true")).collect();
    script.push(answer("all steps done"));
    script.push(answer("bye"));
    let h = start_agent(script, "").await;
    write(
        &h.root,
        &format!("{A}/plan"),
        "1. look around\n2. write the report\n",
    )
    .await
    .unwrap();
    let st = turn(&h.root, "work through the plan").await;
    assert_eq!(st.last().unwrap(), "idle", "{st:?}");
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 9);
    for (i, p) in posts[..8].iter().enumerate() {
        assert!(!p.body.contains("<plan>"), "request {} has the plan", i + 1);
    }
    let last = last_message(&posts[8]);
    assert_eq!(last["role"], "user", "{last}");
    let t = last["content"].as_str().unwrap();
    assert!(
        t.starts_with("<plan>\n1. look around\n2. write the report\n</plan>\n"),
        "{t}"
    );
    let s = stats(&h.root).await;
    assert_kv(&s, &[("tool_calls", "8"), ("requests", "9")]);
    // The reminder is not part of the history: the next turn's first request lacks it.
    turn(&h.root, "anything else?").await;
    let p = &h.fake.posts()[9];
    assert!(!p.body.contains("<plan>"), "{}", p.body);
    assert_eq!(
        last_message(p),
        json!({"role": "user", "content": "anything else?"})
    );
}

/// `tool_choice = "required_first"` with a `tool_prefill`: the turn's first request requires
/// a tool call and ends with the unfinished assistant message; the request after the tool's
/// result requires nothing and has no prefill, so the model ends the turn in text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_call_is_asked_for_on_the_first_step_only() {
    let h = start_with(
        vec![
            exec("c1", "echo forced"),
            answer("Done."),
            exec("c2", "echo again"),
            answer("Done again."),
        ],
        "",
        "tool_choice = \"required_first\"\ntool_prefill = \"<tool_call>\\n\"",
    )
    .await;
    session_with_agent(&h.root, &h.work).await;
    let st = turn(&h.root, "say something").await;
    assert_eq!(
        st,
        states(&["thinking", "calling: execute_code", "thinking", "idle"])
    );
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 2);
    let first = posts[0].json();
    assert_eq!(first["tool_choice"], "required", "{first}");
    assert_eq!(
        last_message(&posts[0]),
        json!({"role": "assistant", "content": "<tool_call>\n"})
    );
    let second = posts[1].json();
    assert!(second.get("tool_choice").is_none(), "{second}");
    let last = last_message(&posts[1]);
    assert_eq!(last["role"], "tool", "{second}");
    assert_eq!(last["tool_call_id"], "c1");
    assert!(
        messages(&posts[1])
            .iter()
            .all(|m| m["content"] != "<tool_call>\n"),
        "the prefill stayed in the history: {second}"
    );
    let bs = chat_blocks(&h.root).await;
    assert_eq!(
        kinds(&bs),
        ["user", "tool_call", "tool_result", "assistant"],
        "{bs:?}"
    );
    assert!(bs[2].body.contains("forced"), "{bs:?}");
    // The next turn is forced again, from its first step only.
    turn(&h.root, "once more").await;
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 4);
    assert_eq!(posts[2].json()["tool_choice"], "required");
    assert_eq!(last_message(&posts[2])["content"], "<tool_call>\n");
    assert!(posts[3].json().get("tool_choice").is_none());
    assert_eq!(last_message(&posts[3])["role"], "tool");
}

/// A backend without `tool_choice` never sends one, nor a prefill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tool_choice_no_call_is_forced() {
    let h = start_agent(vec![answer("Hi.")], "").await;
    turn(&h.root, "hi").await;
    let body = h.fake.posts()[0].json();
    assert!(body.get("tool_choice").is_none(), "{body}");
    assert_eq!(last_message(&h.fake.posts()[0])["role"], "user", "{body}");
}

/// A reply the server stopped at its token limit (`finish_reason: "length"`) is kept, and an
/// `info` block after it says that it may be incomplete; a tool call cut that way gets a tool error
/// (its arguments are not JSON) and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_at_the_token_limit_is_marked_and_a_cut_call_runs_nothing() {
    let mut cut_text = reply_events("", "The answer is", &[], (10, 3));
    let mut cut_call = vec![
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "t1", "type": "function",
                "function": {"name": "execute_code", "arguments": "{\"language\": \"ba"}}]}),
            None,
        ),
    ];
    for ev in [&mut cut_text, &mut cut_call] {
        ev.retain(|e| !e.contains("\"finish_reason\":\"stop\""));
        ev.retain(|e| e != DONE && !e.contains("\"usage\""));
        ev.push(chunk(json!({}), Some("length")));
        ev.push(usage_chunk(10, 3));
        ev.push(DONE.to_owned());
    }
    let h = start_agent(
        vec![
            Reply::sse(&cut_text),
            Reply::sse(&cut_call),
            answer("Sorry."),
        ],
        "",
    )
    .await;
    write(&h.root, &format!("{A}/cfg"), "max_tokens=3")
        .await
        .unwrap();
    let st = turn(&h.root, "what is it").await;
    assert_eq!(st, states(&["thinking", "idle"]));
    let bs = chat_blocks(&h.root).await;
    assert_eq!(kinds(&bs), ["user", "assistant", "info"], "{bs:?}");
    assert_eq!(bs[1].body, "The answer is\n");
    assert_eq!(bs[2].attrs, "truncated");
    assert_eq!(
        bs[2].body,
        "the reply stopped at the model's token limit (max_tokens 3); it may be incomplete\n"
    );

    let st = turn(&h.root, "run it").await;
    assert_eq!(
        st,
        states(&["thinking", "calling: execute_code", "thinking", "idle"])
    );
    let bs = chat_blocks(&h.root).await;
    let k = kinds(&bs);
    assert_eq!(
        &k[3..],
        ["user", "info", "tool_call", "tool_result", "assistant"],
        "{bs:?}"
    );
    assert_eq!(
        bs[6].body,
        "error: the arguments of execute_code are not a JSON object: {\"language\": \"ba; call it again with an object of its parameters\n"
    );
    nothing_ran(&h.root).await;
}

/// A reply that sends its head and then stalls: no body byte ever comes.
fn head_then_stall() -> Reply {
    Reply {
        chunks: Vec::new(),
        ..Reply::json(200, &json!({}))
    }
    .hang()
}

/// The context-window lookup is bounded by the backend's timeouts, not by a limit of its
/// own: with `first_byte_timeout_s = 2` and a `/v1/models` that never answers (or sends its
/// head and stalls), the lookup ends at that timeout, says so in the log (backend, path,
/// timeout), and the turn goes on as when the server tells no window: the default limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_that_gets_no_answer_ends_at_the_backends_timeout_and_the_turn_goes_on() {
    for stall in [Reply::silent(), head_then_stall()] {
        let h = start_with(vec![answer("still here")], "", "first_byte_timeout_s = 2\n").await;
        h.fake.route("/v1/models", stall);
        session_with_agent(&h.root, &h.work).await;
        assert_eq!(turn(&h.root, "hi").await, states(&["thinking", "idle"]));
        let bs = chat_blocks(&h.root).await;
        assert_eq!(kinds(&bs), ["user", "assistant"], "{bs:?}");
        assert_eq!(bs[1].body, "still here\n");
        assert_kv(&stats(&h.root).await, &[("context_limit", "128000")]);
        let log = h.srv.stderr();
        assert!(
            log.contains("fake: /v1/models: timed out: no reply within 2 s (first_byte_timeout_s)"),
            "{log}"
        );
        let gets: Vec<Got> = h
            .fake
            .got()
            .into_iter()
            .filter(|g| g.method == "GET")
            .collect();
        assert_eq!(gets.len(), 1, "{gets:?}");
    }
}

/// The case found by a user: a server that accepts connections and never answers, with
/// `first_byte_timeout_s = 2`. The lookup and every chat attempt end at that timeout (no
/// 60 s of the lookup's own first), and the turn fails with one line naming the backend,
/// the path and the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_fails_the_turn_at_the_backends_timeout() {
    let h = start_with(
        (0..4).map(|_| Reply::silent()).collect(),
        "",
        "first_byte_timeout_s = 2\n",
    )
    .await;
    h.fake.route("/v1/models", Reply::silent());
    session_with_agent(&h.root, &h.work).await;
    assert_eq!(turn(&h.root, "hi").await.last().unwrap(), "error");
    let bs = chat_blocks(&h.root).await;
    let last = bs.last().unwrap();
    assert_eq!(last.kind, "error", "{bs:?}");
    assert_eq!(
        last.body,
        "model call failed: fake: /v1/chat/completions: timed out: no reply within 2 s (first_byte_timeout_s)\n"
    );
    let log = h.srv.stderr();
    assert!(
        log.contains("fake: /v1/models: timed out: no reply within 2 s (first_byte_timeout_s)"),
        "{log}"
    );
    assert_eq!(h.fake.posts().len(), 4);
}
