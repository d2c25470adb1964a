//! The agent loop against the `anthropic` backend, end to end: a real olliesrv (with the
//! session's real toolsrv) talks to a scripted loopback server speaking the Anthropic Messages
//! streaming format (named SSE events: `message_start`, `content_block_start` /
//! `content_block_delta` / `content_block_stop` for text, thinking and tool_use blocks,
//! `message_delta`, `message_stop`, `ping`, `error`). Each test checks what lands in the chat
//! (`log`), `stats`, the states `eventwait` reports, the workspace and toolsrv where tools
//! run, and the requests the server got (`x-api-key`, `anthropic-version`, the top-level
//! `system`, tools with `input_schema`, `tool_result` blocks in user messages): text and
//! thinking, the sandboxed tool round trip, parallel reads, rate limits, overloads and
//! in-stream errors, a dropped stream, context overflow and compaction, text tool calls,
//! paged model lists and the API key's secrecy.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod fake_llm;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::{Srv, attach, me};
use fake_llm::*;
use ollie_p9::Fid;
use ollie_p9::wire::om;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ---------------------------------------------------------------------------------------
// Fixtures: Anthropic Messages streams, after the event shapes of Anthropic's streaming
// documentation.

/// One named server-sent event.
fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}")
}

/// One streamed Messages reply, built block by block.
struct Sse {
    events: Vec<String>,
    /// The index of the next content block.
    next: u64,
}

impl Sse {
    /// `message_start` (with `input_tokens`) and a `ping`.
    fn start(input_tokens: u64) -> Sse {
        Sse::start_usage(json!({"input_tokens": input_tokens, "output_tokens": 1}))
    }

    fn start_usage(usage: Value) -> Sse {
        let msg = json!({"id": "msg_01fake", "type": "message", "role": "assistant",
            "model": "m", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": usage});
        Sse {
            events: vec![
                event(
                    "message_start",
                    json!({"type": "message_start", "message": msg}),
                ),
                event("ping", json!({"type": "ping"})),
            ],
            next: 0,
        }
    }

    /// Opens a block and sends its deltas (without closing it); returns its index.
    fn open(&mut self, start: Value, deltas: Vec<Value>) -> u64 {
        let index = self.next;
        self.next += 1;
        self.events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        for d in deltas {
            self.events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": d}),
            ));
        }
        index
    }

    fn close(&mut self, index: u64) {
        self.events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }

    /// A thinking block in `parts`, with its signature.
    fn thinking(mut self, parts: &[&str]) -> Sse {
        let mut deltas: Vec<Value> = parts
            .iter()
            .map(|p| json!({"type": "thinking_delta", "thinking": p}))
            .collect();
        deltas
            .push(json!({"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}));
        let i = self.open(json!({"type": "thinking", "thinking": ""}), deltas);
        self.close(i);
        self
    }

    /// A text block in `parts`.
    fn text(mut self, parts: &[&str]) -> Sse {
        let i = self.open_text(parts);
        self.close(i);
        self
    }

    fn open_text(&mut self, parts: &[&str]) -> u64 {
        let deltas = parts
            .iter()
            .map(|p| json!({"type": "text_delta", "text": p}))
            .collect();
        self.open(json!({"type": "text", "text": ""}), deltas)
    }

    /// A `tool_use` block whose input arrives as `input_json_delta` pieces of `input`'s JSON.
    fn tool_use(mut self, id: &str, name: &str, input: &Value, n: usize) -> Sse {
        let deltas = pieces(&input.to_string(), n)
            .into_iter()
            .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
            .collect();
        let i = self.open(
            json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
            deltas,
        );
        self.close(i);
        self
    }

    /// `message_delta` (stop reason, cumulative output tokens) and `message_stop`.
    fn done(mut self, stop_reason: &str, output_tokens: u64) -> Vec<String> {
        self.events.push(event(
            "message_delta",
            json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                "usage": {"output_tokens": output_tokens}}),
        ));
        self.events
            .push(event("message_stop", json!({"type": "message_stop"})));
        self.events
    }

    fn reply(self, stop_reason: &str, output_tokens: u64) -> Reply {
        Reply::sse(&self.done(stop_reason, output_tokens))
    }

    /// Ends the stream with an `error` event (no `message_stop`).
    fn error_event(mut self, kind: &str, message: &str) -> Reply {
        self.events.push(event(
            "error",
            json!({"type": "error", "error": {"type": kind, "message": message}}),
        ));
        Reply::sse(&self.events)
    }
}

/// `s` in at most `n` non-empty pieces (cut on character boundaries).
fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let size = chars.len().div_ceil(n.max(1)).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// A plain text answer.
fn answer(text: &str, input_tokens: u64, output_tokens: u64) -> Reply {
    Sse::start(input_tokens)
        .text(&[text])
        .reply("end_turn", output_tokens)
}

/// An API error reply: `{"type": "error", "error": {"type", "message"}}` with `status`.
fn api_error(status: u16, kind: &str, message: &str) -> Reply {
    Reply::json(
        status,
        &json!({"type": "error", "error": {"type": kind, "message": message}}),
    )
}

// ---------------------------------------------------------------------------------------
// Driving olliesrv

/// A running olliesrv with the fake server as backend `fake`, attached, with session `s` and
/// agent `a`.
struct H {
    fake: FakeLlm,
    srv: Srv,
    work: PathBuf,
    _client: ollie_p9::Client,
    root: Fid,
}

async fn start(script: Vec<Reply>, extra: &str) -> H {
    let fake = FakeLlm::start(script).await;
    let (srv, work) = olliesrv("anthropic", &format!("{}/v1", fake.url()), extra);
    let (client, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    H {
        fake,
        srv,
        work,
        _client: client,
        root,
    }
}

const A: &str = "session/s/agent/a";

/// Writes `prompt` to the agent and returns the states up to the end of the turn.
async fn turn(h: &H, ev: &Fid, prompt: &str) -> Vec<String> {
    write(&h.root, &format!("{A}/prompt"), prompt)
        .await
        .unwrap();
    states_until(ev, &["idle", "error"]).await
}

async fn chat(h: &H) -> Vec<Block> {
    blocks(&read(&h.root, &format!("{A}/log")).await)
}

fn kinds(bs: &[Block]) -> Vec<String> {
    bs.iter()
        .map(|b| {
            if b.kind == "info" && !b.attrs.is_empty() {
                format!("info {}", b.attrs)
            } else {
                b.kind.clone()
            }
        })
        .collect()
}

async fn stats(h: &H) -> String {
    read(&h.root, &format!("{A}/stats")).await
}

fn states(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| (*s).to_owned()).collect()
}

/// Checks what every Messages request carries: the path, the key, the version, the JSON
/// body with `stream`, `max_tokens` (the default, or a summary's bound), the model, the system prompt as a top-level string
/// (never a message) and the tools with `input_schema`.
fn check_request(g: &Got) -> Value {
    assert_eq!(g.method, "POST");
    assert_eq!(g.path, "/v1/messages");
    assert_eq!(g.headers.get("x-api-key").map(String::as_str), Some(KEY));
    assert_eq!(
        g.headers.get("anthropic-version").map(String::as_str),
        Some("2023-06-01")
    );
    assert!(!g.headers.contains_key("authorization"), "{:?}", g.headers);
    assert!(
        g.headers
            .get("content-type")
            .is_some_and(|c| c.starts_with("application/json")),
        "{:?}",
        g.headers
    );
    let b = g.json();
    assert_eq!(b["model"], "m", "{b}");
    assert_eq!(b["stream"], true, "{b}");
    // The default, but for a compaction's summary: at most an eighth of the window, here
    // the 4096-token cap.
    let summary = b["system"]
        .as_str()
        .is_some_and(|s| s.starts_with("You compress"));
    assert_eq!(b["max_tokens"], if summary { 4096 } else { 8192 }, "{b}");
    assert!(b["system"].is_string(), "{b}");
    for m in b["messages"].as_array().unwrap() {
        let role = m["role"].as_str().unwrap();
        assert!(role == "user" || role == "assistant", "{b}");
    }
    b
}

/// `check_request` for an agent's call: the agent's system prompt and tools too.
fn check_agent_request(g: &Got, work: &Path) -> Value {
    let b = check_request(g);
    let system = b["system"].as_str().unwrap();
    assert!(system.starts_with("You are a coding agent"), "{system}");
    assert!(
        system.ends_with(&format!("Working directory: {}", work.display())),
        "{system}"
    );
    // The sandbox as the agent's policy has it, generated (agent/sandbox.rs).
    for want in [
        format!(
            "Sandbox (policy \"workspace\"): you can write only in {} and $TMPDIR (private); .git, .envrc",
            work.display()
        ),
        "so git cannot commit".to_owned(),
        "Network: none.".to_owned(),
    ] {
        assert!(system.contains(&want), "{want:?} in {system}");
    }
    let tools = b["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    for t in ["execute_code", "file_read", "file_write"] {
        assert!(names.contains(&t), "{names:?}");
    }
    for t in tools {
        assert_eq!(t["input_schema"]["type"], "object", "{t}");
        assert!(t["description"].is_string(), "{t}");
        assert!(t.get("parameters").is_none(), "{t}");
    }
    let exec = tools.iter().find(|t| t["name"] == "execute_code").unwrap();
    assert!(
        exec["input_schema"]["properties"]["code"].is_object(),
        "{exec}"
    );
    b
}

/// The run record on a `tool_result` marker (`… record={json}`).
fn record_of(b: &Block) -> Value {
    let (_, r) = b.attrs.split_once("record=").expect("no record");
    serde_json::from_str(r).unwrap()
}

// ---------------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_and_thinking_stream_into_the_chat_and_usage_into_stats() {
    let reply = Sse::start_usage(json!({"input_tokens": 20, "cache_creation_input_tokens": 3,
        "cache_read_input_tokens": 2, "output_tokens": 1}))
    .thinking(&["The user greets me. ", "I greet back."])
    .text(&["Hel", "lo ", "there."])
    .reply("end_turn", 12);
    let h = start(
        vec![reply],
        "[prices.\"m\"]\ninput_per_mtok = 1000000.0\noutput_per_mtok = 2000000.0\n",
    )
    .await;
    let ev = events(&h.root).await;
    assert_eq!(turn(&h, &ev, "hello").await, states(&["thinking", "idle"]));
    let bs = chat(&h).await;
    assert_eq!(kinds(&bs), ["user", "reasoning", "assistant"], "{bs:?}");
    assert_eq!(bs[0].body, "hello\n");
    assert_eq!(bs[1].body, "The user greets me. I greet back.\n");
    assert_eq!(bs[2].body, "Hello there.\n");
    // chat (without markers) has the same text.
    let mut cf = h.root.walk_path(&format!("{A}/chat")).await.unwrap();
    cf.open(om::OREAD).await.unwrap();
    let text = String::from_utf8(cf.read(0, 65536).await.unwrap().to_vec()).unwrap();
    assert!(!text.contains("[[["), "{text}");
    assert!(text.contains("Hello there.\n"), "{text}");
    // Usage: input with both cache counts, the final cumulative output count.
    let st = stats(&h).await;
    assert_kv(
        &st,
        &[
            ("tokens_in", "25"),
            ("tokens_out", "12"),
            ("context_tokens", "37"),
            ("requests", "1"),
            ("cost_usd", "49.000000"),
            ("turns", "1"),
            ("errors", "0"),
            ("tool_calls", "0"),
        ],
    );
    // The request.
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 1);
    let b = check_agent_request(&posts[0], &h.work);
    assert_eq!(
        b["messages"],
        json!([{"role": "user", "content": "hello"}]),
        "{b}"
    );
    assert!(b.get("temperature").is_none(), "{b}");
    // The thinking is not sent back on the next turn (no signature kept), the text is.
    h.fake.push(vec![answer("fine", 30, 2)]);
    assert_eq!(
        turn(&h, &ev, "how are you").await,
        states(&["thinking", "idle"])
    );
    let b = check_agent_request(&h.fake.posts()[1], &h.work);
    assert_eq!(
        b["messages"],
        json!([{"role": "user", "content": "hello"},
               {"role": "assistant", "content": "Hello there."},
               {"role": "user", "content": "how are you"}]),
        "{b}"
    );
    let st = stats(&h).await;
    assert_kv(
        &st,
        &[
            ("tokens_in", "55"),
            ("tokens_out", "14"),
            ("context_tokens", "32"),
            ("requests", "2"),
            ("turns", "2"),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_use_runs_sandboxed_and_its_result_goes_back_as_a_tool_result_block() {
    let code = "echo made > made.txt; cat made.txt; if cat /etc/shadow >/dev/null 2>&1; then echo READ; else echo DENIED; fi";
    let input = json!({"language": "bash", "code": code});
    let first = Sse::start(50)
        .text(&["I will write ", "the file."])
        .tool_use("toolu_01A", "execute_code", &input, 4)
        .reply("tool_use", 40);
    let h = start(
        vec![
            first,
            answer("Wrote made.txt; shadow stayed closed.", 90, 9),
        ],
        "",
    )
    .await;
    let ev = events(&h.root).await;
    assert_eq!(
        turn(&h, &ev, "make a file").await,
        states(&["thinking", "calling: execute_code", "thinking", "idle"])
    );
    // The workspace: the tool ran in the session's directory, inside the sandbox.
    assert_eq!(
        std::fs::read_to_string(h.work.join("made.txt")).unwrap(),
        "made\n"
    );
    let bs = chat(&h).await;
    assert_eq!(
        kinds(&bs),
        ["user", "assistant", "tool_call", "tool_result", "assistant"],
        "{bs:?}"
    );
    assert_eq!(bs[1].body, "I will write the file.\n");
    assert_eq!(bs[2].attrs, "name=execute_code id=toolu_01A");
    let args: Value = serde_json::from_str(bs[2].body.trim()).unwrap();
    assert_eq!(args, input);
    assert!(
        bs[3]
            .attrs
            .starts_with("name=execute_code id=toolu_01A pid=1 exit=0 record={"),
        "{}",
        bs[3].attrs
    );
    // The result: toolsrv's summary line, then the output.
    let result = bs[3].body.clone();
    assert!(
        result.starts_with("pid=1 exit=0 time=") && result.ends_with("s\nmade\nDENIED\n"),
        "{result}"
    );
    let rec = record_of(&bs[3]);
    assert_eq!(rec["exit"]["code"], 0, "{rec}");
    assert_eq!(rec["argv"][2], code, "{rec}");
    assert_eq!(bs[4].body, "Wrote made.txt; shadow stayed closed.\n");
    // toolsrv kept the process and its record.
    let top = read(&h.root, &format!("{A}/proc/top")).await;
    assert!(
        top.contains("exited") && top.contains("execute_code"),
        "{top}"
    );
    let via_toolsrv: Value =
        serde_json::from_str(&read(&h.root, "session/s/toolsrv/proc/1/record").await).unwrap();
    assert_eq!(via_toolsrv, rec);
    // The second request: the assistant message with its text and tool_use block, then a
    // user message with the tool_result.
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 2);
    check_agent_request(&posts[0], &h.work);
    let b = check_agent_request(&posts[1], &h.work);
    let msgs = b["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{b}");
    assert_eq!(msgs[0], json!({"role": "user", "content": "make a file"}));
    assert_eq!(
        msgs[1],
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "I will write the file."},
            {"type": "tool_use", "id": "toolu_01A", "name": "execute_code", "input": input}]}),
        "{b}"
    );
    assert_eq!(
        msgs[2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01A", "content": result}]}),
        "{b}"
    );
    let st = stats(&h).await;
    assert_kv(
        &st,
        &[
            ("requests", "2"),
            ("tool_calls", "1"),
            ("tokens_in", "140"),
            ("tokens_out", "49"),
            ("errors", "0"),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_parallel_reads_answer_in_one_user_message() {
    let first = Sse::start(30)
        .tool_use("toolu_a", "file_read", &json!({"path": "a.txt"}), 2)
        .tool_use("toolu_b", "file_read", &json!({"path": "b.txt"}), 3)
        .reply("tool_use", 20);
    let h = start(vec![first, answer("alpha and beta", 60, 4)], "").await;
    std::fs::write(h.work.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(h.work.join("b.txt"), "beta\n").unwrap();
    let ev = events(&h.root).await;
    assert_eq!(
        turn(&h, &ev, "read both").await,
        states(&[
            "thinking",
            "calling: file_read, file_read",
            "thinking",
            "idle"
        ])
    );
    let bs = chat(&h).await;
    assert_eq!(
        kinds(&bs),
        [
            "user",
            "tool_call",
            "tool_call",
            "tool_result",
            "tool_result",
            "assistant"
        ],
        "{bs:?}"
    );
    assert_eq!(bs[1].attrs, "name=file_read id=toolu_a");
    assert_eq!(bs[2].attrs, "name=file_read id=toolu_b");
    assert!(
        bs[3].attrs.starts_with("name=file_read id=toolu_a ") && bs[3].attrs.contains(" exit=0"),
        "{}",
        bs[3].attrs
    );
    assert!(
        bs[4].attrs.starts_with("name=file_read id=toolu_b ") && bs[4].attrs.contains(" exit=0"),
        "{}",
        bs[4].attrs
    );
    assert!(bs[3].body.contains("alpha"), "{}", bs[3].body);
    assert!(bs[4].body.contains("beta"), "{}", bs[4].body);
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 2);
    let b = check_agent_request(&posts[1], &h.work);
    let msgs = b["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{b}");
    assert_eq!(
        msgs[1],
        json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_a", "name": "file_read", "input": {"path": "a.txt"}},
            {"type": "tool_use", "id": "toolu_b", "name": "file_read", "input": {"path": "b.txt"}}]}),
        "{b}"
    );
    // Both results in ONE user message, in the order of the calls.
    assert_eq!(msgs[2]["role"], "user", "{b}");
    let results = msgs[2]["content"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{b}");
    assert_eq!(results[0]["type"], "tool_result");
    assert_eq!(results[0]["tool_use_id"], "toolu_a");
    assert!(
        results[0]["content"].as_str().unwrap().contains("alpha"),
        "{b}"
    );
    assert_eq!(results[1]["type"], "tool_result");
    assert_eq!(results[1]["tool_use_id"], "toolu_b");
    assert!(
        results[1]["content"].as_str().unwrap().contains("beta"),
        "{b}"
    );
    let st = stats(&h).await;
    assert_kv(&st, &[("tool_calls", "2"), ("requests", "2")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_waits_for_retry_after_and_retries() {
    let limited = api_error(
        429,
        "rate_limit_error",
        "Number of request tokens has exceeded your per-minute rate limit",
    )
    .header("retry-after", "1");
    let h = start(vec![limited, answer("after the wait", 10, 3)], "").await;
    let ev = events(&h.root).await;
    assert_eq!(
        turn(&h, &ev, "hi").await,
        states(&["thinking", "limitretry", "thinking", "idle"])
    );
    let bs = chat(&h).await;
    assert_eq!(kinds(&bs), ["user", "info retry", "assistant"], "{bs:?}");
    assert_eq!(
        bs[1].body,
        "rate limited (retry after 1 s); retrying in 1.0 s (1 of 3)\n"
    );
    assert_eq!(bs[2].body, "after the wait\n");
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 2);
    // The same request again.
    assert_eq!(check_request(&posts[0]), check_request(&posts[1]));
    let st = stats(&h).await;
    assert_kv(
        &st,
        &[("requests", "2"), ("errors", "0"), ("tokens_in", "10")],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overload_and_an_error_event_mid_stream_are_retried() {
    let overloaded = api_error(529, "overloaded_error", "Overloaded");
    let broken = Sse::start(8);
    let mut broken = broken;
    broken.open_text(&["Partial "]);
    let broken = broken.error_event("overloaded_error", "Overloaded");
    let h = start(
        vec![
            overloaded,
            answer("first answer", 10, 3),
            broken,
            answer("second answer", 20, 4),
        ],
        "",
    )
    .await;
    let ev = events(&h.root).await;
    // An HTTP 529.
    assert_eq!(
        turn(&h, &ev, "one").await,
        states(&["thinking", "limitretry", "thinking", "idle"])
    );
    let bs = chat(&h).await;
    assert_eq!(kinds(&bs), ["user", "info retry", "assistant"], "{bs:?}");
    assert_eq!(
        bs[1].body,
        "fake: http 529: Overloaded; retrying in 1.0 s (1 of 3)\n"
    );
    assert_eq!(bs[2].body, "first answer\n");
    // An `error` event after some text: the partial text stays in the chat, the call is
    // retried and the history keeps only the complete answer.
    assert_eq!(
        turn(&h, &ev, "two").await,
        states(&["thinking", "limitretry", "thinking", "idle"])
    );
    let bs = chat(&h).await;
    assert_eq!(
        kinds(&bs[3..]),
        ["user", "assistant", "info retry", "assistant"],
        "{bs:?}"
    );
    assert_eq!(bs[4].body, "Partial \n");
    assert_eq!(
        bs[5].body,
        "fake: error in stream: overloaded_error: Overloaded; retrying in 1.0 s (1 of 3)\n"
    );
    assert_eq!(bs[6].body, "second answer\n");
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 4);
    assert_eq!(check_request(&posts[2]), check_request(&posts[3]));
    let b = check_request(&posts[3]);
    assert_eq!(
        b["messages"],
        json!([{"role": "user", "content": "one"},
               {"role": "assistant", "content": "first answer"},
               {"role": "user", "content": "two"}]),
        "{b}"
    );
    let st = stats(&h).await;
    assert_kv(&st, &[("requests", "4"), ("errors", "0"), ("turns", "2")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_that_persists_fails_the_turn_after_three_retries() {
    let e = || api_error(500, "api_error", "Internal server error");
    let h = start(vec![e(), e(), e(), e()], "").await;
    let ev = events(&h.root).await;
    assert_eq!(
        turn(&h, &ev, "hi").await,
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
    let bs = chat(&h).await;
    assert_eq!(
        kinds(&bs),
        ["user", "info retry", "info retry", "info retry", "error"],
        "{bs:?}"
    );
    for (i, wait) in [(1, "1.0"), (2, "2.0"), (3, "4.0")] {
        assert_eq!(
            bs[i].body,
            format!("fake: http 500: Internal server error; retrying in {wait} s ({i} of 3)\n")
        );
    }
    assert_eq!(
        bs[4].body,
        "model call failed: fake: http 500: Internal server error\n"
    );
    assert_eq!(h.fake.posts().len(), 4);
    assert_eq!(h.fake.left(), 0);
    let st = stats(&h).await;
    assert_kv(&st, &[("requests", "4"), ("errors", "1"), ("turns", "1")]);
    wait_for(&h.root, "session/s/agent/idx", "\terror\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_mid_message_is_retried() {
    // Chunks: message_start, ping, content_block_start, "Hello wor", "ld.", …: cut after
    // the first delta.
    let cut = Sse::start(12)
        .text(&["Hello wor", "ld."])
        .reply("end_turn", 5)
        .cut(4);
    let h = start(vec![cut, answer("Hello world.", 12, 5)], "").await;
    let ev = events(&h.root).await;
    assert_eq!(
        turn(&h, &ev, "greet").await,
        states(&["thinking", "limitretry", "thinking", "idle"])
    );
    let bs = chat(&h).await;
    assert_eq!(
        kinds(&bs),
        ["user", "assistant", "info retry", "assistant"],
        "{bs:?}"
    );
    assert_eq!(bs[1].body, "Hello wor\n");
    assert_eq!(
        bs[2].body,
        "fake: the stream ended before the reply was complete; retrying in 1.0 s (1 of 3)\n"
    );
    assert_eq!(bs[3].body, "Hello world.\n");
    assert_eq!(h.fake.posts().len(), 2);
    let st = stats(&h).await;
    assert_kv(&st, &[("requests", "2"), ("errors", "0")]);
    // Only the complete answer counts.
    assert_kv(&st, &[("tokens_in", "12"), ("tokens_out", "5")]);
    // The next turn's history has the complete answer only.
    h.fake.push(vec![answer("ok", 20, 1)]);
    turn(&h, &ev, "again").await;
    let b = check_request(&h.fake.posts()[2]);
    assert_eq!(
        b["messages"],
        json!([{"role": "user", "content": "greet"},
               {"role": "assistant", "content": "Hello world."},
               {"role": "user", "content": "again"}]),
        "{b}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_overflow_compacts_the_history_and_retries() {
    let too_long = api_error(
        400,
        "invalid_request_error",
        "prompt is too long: 210000 tokens > 200000 maximum",
    );
    let h = start(
        vec![
            answer("The answer to the first question.", 100, 10),
            too_long,
            answer(
                "- the user asked a first question\n- it was answered",
                50,
                12,
            ),
            answer("The second answer.", 60, 5),
        ],
        "",
    )
    .await;
    let ev = events(&h.root).await;
    assert_eq!(
        turn(&h, &ev, "first question").await,
        states(&["thinking", "idle"])
    );
    assert_eq!(
        turn(&h, &ev, "second question").await,
        states(&["thinking", "compacting", "thinking", "idle"])
    );
    let bs = chat(&h).await;
    assert_eq!(
        kinds(&bs),
        [
            "user",
            "assistant",
            "user",
            "info",
            "info compacted",
            "assistant"
        ],
        "{bs:?}"
    );
    assert_eq!(
        bs[3].body,
        "context overflow: fake: http 400: prompt is too long: 210000 tokens > 200000 maximum\n"
    );
    assert!(
        bs[4].body.starts_with(
            "compacted the conversation (the model's context overflowed): 2 messages summarized, 1 kept\n"
        ),
        "{}",
        bs[4].body
    );
    assert!(
        bs[4].body.contains("- the user asked a first question"),
        "{}",
        bs[4].body
    );
    assert_eq!(bs[5].body, "The second answer.\n");
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 4);
    // The overflowing request had the whole history.
    let b = check_agent_request(&posts[1], &h.work);
    assert_eq!(b["messages"].as_array().unwrap().len(), 3, "{b}");
    // The compaction request: its own system prompt, one user message with the transcript,
    // no tools.
    let c = check_request(&posts[2]);
    assert!(
        c["system"]
            .as_str()
            .unwrap()
            .starts_with("You compress the history"),
        "{c}"
    );
    assert!(c.get("tools").is_none(), "{c}");
    let cm = c["messages"].as_array().unwrap();
    assert_eq!(cm.len(), 1, "{c}");
    assert_eq!(cm[0]["role"], "user");
    let transcript = cm[0]["content"].as_str().unwrap();
    assert!(
        transcript.contains("USER:\nfirst question")
            && transcript.contains("ASSISTANT:\nThe answer to the first question.")
            && transcript.contains("Summarize the conversation above"),
        "{transcript}"
    );
    assert!(!transcript.contains("second question"), "{transcript}");
    // The retried request begins with the summary; the kept prompt follows in the same user
    // message (roles must alternate).
    let r = check_agent_request(&posts[3], &h.work);
    let rm = r["messages"].as_array().unwrap();
    assert_eq!(rm.len(), 1, "{r}");
    assert_eq!(rm[0]["role"], "user");
    let parts = rm[0]["content"].as_array().unwrap();
    assert_eq!(parts.len(), 2, "{r}");
    let summary = parts[0]["text"].as_str().unwrap();
    assert!(
        summary.starts_with("<conversation-summary>\n- the user asked a first question"),
        "{summary}"
    );
    assert_eq!(
        parts[1],
        json!({"type": "text", "text": "second question"}),
        "{r}"
    );
    let st = stats(&h).await;
    assert_kv(&st, &[("requests", "4"), ("errors", "0"), ("turns", "2")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_written_as_text_brings_a_note_and_another_call() {
    let as_text = "<tool_call>\n{\"name\": \"execute_code\", \"arguments\": {\"language\": \"bash\", \"code\": \"touch ran.txt\"}}\n</tool_call>";
    let h = start(
        vec![
            answer(as_text, 10, 20),
            answer("I cannot run it, sorry.", 30, 6),
        ],
        "",
    )
    .await;
    let ev = events(&h.root).await;
    assert_eq!(
        turn(&h, &ev, "touch a file").await,
        states(&["thinking", "idle"])
    );
    let bs = chat(&h).await;
    assert_eq!(
        kinds(&bs),
        ["user", "assistant", "info text-tool-call", "assistant"],
        "{bs:?}"
    );
    assert_eq!(bs[1].body, format!("{as_text}\n"));
    assert!(
        bs[2]
            .body
            .starts_with("Your reply wrote a call to execute_code as text"),
        "{}",
        bs[2].body
    );
    assert_eq!(bs[3].body, "I cannot run it, sorry.\n");
    // Nothing ran.
    assert!(!h.work.join("ran.txt").exists());
    let st = stats(&h).await;
    assert_kv(&st, &[("tool_calls", "0"), ("requests", "2")]);
    // The model was asked again, with the note as a user message.
    let posts = h.fake.posts();
    assert_eq!(posts.len(), 2);
    let b = check_agent_request(&posts[1], &h.work);
    let msgs = b["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{b}");
    assert_eq!(
        msgs[1],
        json!({"role": "assistant", "content": as_text}),
        "{b}"
    );
    assert_eq!(msgs[2]["role"], "user");
    assert!(
        msgs[2]["content"]
            .as_str()
            .unwrap()
            .contains("make a structured tool call through the tool interface"),
        "{b}"
    );
}

/// A loopback server for `GET /v1/models` that pages by `after_id` (the fake server's
/// routes ignore the query). Returns its URL and the request heads it got.
async fn paged_models() -> (String, Arc<Mutex<Vec<String>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&heads);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = l.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let head = String::from_utf8_lossy(&buf).into_owned();
                seen.lock().unwrap().push(head.clone());
                let target = head.split(' ').nth(1).unwrap_or("").to_owned();
                let model = |id: &str| {
                    json!({"id": id, "type": "model", "display_name": id,
                        "created_at": "2025-01-01T00:00:00Z"})
                };
                let (status, body) = if !target.starts_with("/v1/models?") {
                    (
                        404,
                        json!({"type": "error", "error": {"type": "not_found_error", "message": "no such path"}}),
                    )
                } else if target.contains("after_id=claude-b") {
                    (
                        200,
                        json!({"data": [model("claude-c")], "has_more": false,
                            "first_id": "claude-c", "last_id": "claude-c"}),
                    )
                } else if target.contains("after_id") {
                    (
                        400,
                        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad after_id"}}),
                    )
                } else {
                    (
                        200,
                        json!({"data": [model("claude-a"), model("claude-b")], "has_more": true,
                            "first_id": "claude-a", "last_id": "claude-b"}),
                    )
                };
                let body = body.to_string();
                let out = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(out.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    (url, heads)
}

/// The headers of a request head, names in lowercase.
fn head_headers(head: &str) -> HashMap<String, String> {
    head.split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_come_from_the_paged_model_list() {
    let (url, heads) = paged_models().await;
    let (srv, work) = olliesrv("anthropic", &format!("{url}/v1"), "");
    let (_c, root) = attach(&srv, &me()).await;
    let text = read(&root, "models").await;
    assert_eq!(
        text, "fake\tclaude-a\nfake\tclaude-b\nfake\tclaude-c\n",
        "{text}"
    );
    let got = heads.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got[0].starts_with("GET /v1/models?limit=1000 HTTP/1.1\r\n"),
        "{}",
        got[0]
    );
    assert!(
        got[1].starts_with("GET /v1/models?limit=1000&after_id=claude-b HTTP/1.1\r\n"),
        "{}",
        got[1]
    );
    for g in &got {
        let hd = head_headers(g);
        assert_eq!(hd.get("x-api-key").map(String::as_str), Some(KEY), "{g}");
        assert_eq!(
            hd.get("anthropic-version").map(String::as_str),
            Some("2023-06-01"),
            "{g}"
        );
    }
    // The agent's ctl lists its backend's models, one per line.
    session_with_agent(&root, &work).await;
    assert_eq!(
        rdwr(&root, &format!("{A}/ctl"), "models").await.unwrap(),
        "claude-a\nclaude-b\nclaude-c\n"
    );
    assert_eq!(heads.lock().unwrap().len(), 4);
    assert!(!srv.stderr().contains(KEY));
}

/// Every file under `dir`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            files(&p, out);
        } else if e.file_type().is_ok_and(|t| t.is_file()) {
            out.push(p);
        }
    }
}

/// Fails if `text` holds the key or any 10-character piece of it.
fn assert_no_key(what: &str, text: &str) {
    for w in KEY.as_bytes().windows(10) {
        let w = std::str::from_utf8(w).unwrap();
        assert!(
            !text.contains(w),
            "{what} shows part of the key ({w}):\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_sent_in_x_api_key_and_never_shown() {
    // Servers that echo the key: in an HTTP error body, in a stream error event (long
    // enough that a 200-character cut would fall inside the key), and in the model list's
    // error.
    let echo = format!("invalid x-api-key: {KEY}");
    let long = format!("{} {KEY} was refused", "x".repeat(161));
    let h = start(
        vec![
            api_error(401, "authentication_error", &echo),
            Sse::start(3).error_event("invalid_request_error", &long),
            api_error(400, "invalid_request_error", &long),
            answer("fine", 5, 1),
        ],
        "",
    )
    .await;
    h.fake
        .route("/v1/models", api_error(403, "permission_error", &echo));
    let ev = events(&h.root).await;
    assert_eq!(turn(&h, &ev, "one").await, states(&["thinking", "error"]));
    assert_eq!(turn(&h, &ev, "two").await, states(&["thinking", "error"]));
    assert_eq!(turn(&h, &ev, "three").await, states(&["thinking", "error"]));
    assert_eq!(turn(&h, &ev, "four").await, states(&["thinking", "idle"]));
    let raw = read(&h.root, &format!("{A}/log")).await;
    let bs = blocks(&raw);
    let errors: Vec<&Block> = bs.iter().filter(|b| b.kind == "error").collect();
    assert_eq!(errors.len(), 3, "{raw}");
    assert_eq!(
        errors[0].body,
        "model call failed: fake: http 401: invalid x-api-key: <redacted>\n"
    );
    assert!(
        errors[1]
            .body
            .starts_with("model call failed: fake: error in stream: invalid_request_error: xxx"),
        "{}",
        errors[1].body
    );
    assert!(
        errors[2]
            .body
            .starts_with("model call failed: fake: http 400: xxx"),
        "{}",
        errors[2].body
    );
    // The key went to the server, in x-api-key only.
    for g in h.fake.posts() {
        check_request(&g);
        assert_no_key("the request body", &g.body);
    }
    // Nowhere to be seen: log, chat, stats, cfg, ctl answers, the model list's error, the
    // files olliesrv keeps (state, history, chat), its stderr.
    assert_no_key("log", &raw);
    let mut cf = h.root.walk_path(&format!("{A}/chat")).await.unwrap();
    cf.open(om::OREAD).await.unwrap();
    let chat = String::from_utf8(cf.read(0, 65536).await.unwrap().to_vec()).unwrap();
    assert!(chat.contains("fine"), "{chat}");
    assert_no_key("chat", &chat);
    assert_no_key("stats", &stats(&h).await);
    assert_no_key("cfg", &read(&h.root, &format!("{A}/cfg")).await);
    let models = read(&h.root, "models").await;
    assert!(
        models.starts_with("# fake: http 403: invalid x-api-key: <redacted>"),
        "{models}"
    );
    assert_no_key("models", &models);
    let e = rdwr(&h.root, &format!("{A}/ctl"), "models")
        .await
        .unwrap_err();
    assert!(e.contains("<redacted>"), "{e}");
    assert_no_key("ctl models", &e);
    assert_no_key(
        "ctl backend",
        &rdwr(&h.root, &format!("{A}/ctl"), "backend").await.unwrap(),
    );
    let mut all = Vec::new();
    files(h.srv.dir.path(), &mut all);
    assert!(all.len() > 3, "{all:?}");
    for f in all {
        let text = String::from_utf8_lossy(&std::fs::read(&f).unwrap()).into_owned();
        assert_no_key(&f.display().to_string(), &text);
    }
    assert_no_key("stderr", &h.srv.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unset_key_variable_fails_the_turn_without_a_request() {
    const VAR: &str = "OLLIE_H6_SURELY_UNSET_KEY";
    assert!(std::env::var_os(VAR).is_none());
    let fake = FakeLlm::start(vec![answer("never", 1, 1)]).await;
    let url = format!("{}/v1", fake.url());
    // `nokey` is the same server with a key variable nobody set.
    let extra = format!(
        "[backends.nokey]\nkind = \"anthropic\"\nbase_url = \"{url}\"\nmodel = \"m\"\napi_key_env = \"{VAR}\"\n"
    );
    let (srv, work) = olliesrv("anthropic", &url, &extra);
    let (_c, root) = attach(&srv, &me()).await;
    rdwr(
        &root,
        "session/new",
        &format!("name=s cwd={} backend=nokey", work.display()),
    )
    .await
    .unwrap();
    rdwr(&root, "session/s/agent/new", "name=a").await.unwrap();
    let ev = events(&root).await;
    write(&root, &format!("{A}/prompt"), "hi").await.unwrap();
    assert_eq!(
        states_until(&ev, &["idle", "error"]).await,
        states(&["thinking", "error"])
    );
    let bs = blocks(&read(&root, &format!("{A}/log")).await);
    assert_eq!(kinds(&bs), ["user", "error"], "{bs:?}");
    assert_eq!(
        bs[1].body,
        format!(
            "model call failed: nokey: environment variable {VAR} (api_key_env) is not set or empty\n"
        )
    );
    // Not retried, and nothing reached the server.
    assert!(fake.got().is_empty(), "{:?}", fake.got());
    assert_eq!(fake.left(), 1);
    let st = read(&root, &format!("{A}/stats")).await;
    assert_eq!(kv(&st, "errors"), "1", "{st}");
    // The model list says the same for nokey, and asks the server only for `fake`.
    fake.route(
        "/v1/models",
        Reply::json(
            200,
            &json!({"data": [{"id": "claude-x", "type": "model"}], "has_more": false,
                "first_id": "claude-x", "last_id": "claude-x"}),
        ),
    );
    let models = read(&root, "models").await;
    assert!(models.contains("fake\tclaude-x\n"), "{models}");
    assert!(
        models.contains(&format!(
            "# nokey: environment variable {VAR} (api_key_env) is not set or empty\n"
        )),
        "{models}"
    );
    let got = fake.got();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        got[0].headers.get("x-api-key").map(String::as_str),
        Some(KEY)
    );
    assert_no_key("stderr", &srv.stderr());
}

/// Every request is bounded by the backend's timeouts (`first_byte_timeout_s = 2` here):
/// `models` against a `/v1/models` that sends its head and stalls shows that timeout, with
/// the backend and the path, before its own 10 s; a server that accepts and never answers a
/// messages request fails the turn (after its retries) naming it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stalls_runs_out_of_the_backends_timeouts() {
    let fake = FakeLlm::start((0..4).map(|_| Reply::silent()).collect()).await;
    let head_only = Reply {
        chunks: Vec::new(),
        ..Reply::json(200, &json!({}))
    };
    fake.route("/v1/models", head_only.hang());
    let (srv, work) = olliesrv_with(
        "anthropic",
        &format!("{}/v1", fake.url()),
        "",
        "first_byte_timeout_s = 2\n",
    );
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    let ev = events(&root).await;
    assert_eq!(
        read(&root, "models").await,
        "# fake: /v1/models: timed out: no reply within 2 s (first_byte_timeout_s)\n"
    );
    write(&root, &format!("{A}/prompt"), "hi").await.unwrap();
    assert_eq!(
        states_until(&ev, &["idle", "error"]).await.last().unwrap(),
        "error"
    );
    let bs = blocks(&read(&root, &format!("{A}/log")).await);
    assert_eq!(
        bs.last().unwrap().body,
        "model call failed: fake: /v1/messages: timed out: no reply within 2 s (first_byte_timeout_s)\n"
    );
    assert_eq!(fake.posts().len(), 4);
}
