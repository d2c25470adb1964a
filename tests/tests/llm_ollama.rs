//! The agent loop against the `ollama` backend (Ollama's native `/api/chat`, streamed as
//! newline-delimited JSON), end to end: the real olliesrv and toolsrv talk to a scripted
//! loopback server ([`fake_llm::FakeLlm`]) that speaks Ollama's stream format. Each test checks
//! what lands in the chat (`log`), `stats` and the agent states, and what olliesrv sent
//! (system prompt first, tools as functions, `stream: true`, tool results as `role: tool`
//! with `tool_name`). Also: retries, a cut stream, an error line in the stream, a context
//! overflow with compaction, a tool call written as text, a missing model, model lists, and
//! the default discovery of an Ollama at `$OLLAMA_HOST` when nothing is configured.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod fake_llm;

use bytes::Bytes;
use common::{Srv, attach, me};
use fake_llm::{
    Block, FakeLlm, Got, KEY, Reply, assert_kv, blocks, events, kv, olliesrv, rdwr, read,
    session_with_agent, states_until, wait_for, write,
};
use ollie_p9::Fid;
use ollie_p9::wire::om;
use serde_json::{Value, json};

const PRICES: &str = "[prices.\"m\"]\ninput_per_mtok = 1000000.0\noutput_per_mtok = 2000000.0\n";

/// One streamed line with a text and/or reasoning delta.
fn delta(content: &str, thinking: &str) -> Value {
    let mut message = json!({"role": "assistant", "content": content});
    if !thinking.is_empty() {
        message["thinking"] = json!(thinking);
    }
    json!({"model": "m", "created_at": "2025-01-01T00:00:00Z", "message": message, "done": false})
}

/// One streamed line carrying whole tool calls (`(name, arguments)`).
fn calls(list: &[(&str, Value)]) -> Value {
    let tool_calls: Vec<Value> = list
        .iter()
        .map(|(n, a)| json!({"function": {"name": n, "arguments": a}}))
        .collect();
    json!({"model": "m", "created_at": "2025-01-01T00:00:00Z",
        "message": {"role": "assistant", "content": "", "tool_calls": tool_calls},
        "done": false})
}

/// The last line: `done: true` with the token counts.
fn done(prompt_eval_count: u64, eval_count: u64) -> Value {
    json!({"model": "m", "created_at": "2025-01-01T00:00:01Z",
        "message": {"role": "assistant", "content": ""},
        "done": true, "done_reason": "stop",
        "total_duration": 123_456_789u64, "load_duration": 1_000_000u64,
        "prompt_eval_count": prompt_eval_count, "prompt_eval_duration": 1_000u64,
        "eval_count": eval_count, "eval_duration": 2_000u64})
}

/// A whole answer: `text` in one delta, then `done`.
fn answer(text: &str) -> Reply {
    Reply::ndjson(&[delta(text, ""), done(10, 3)])
}

/// The fake server with `script`, olliesrv pointed at it (`extra` config first), a session
/// `s` with agent `a`, and an open `eventwait` fid.
async fn setup(
    script: Vec<Reply>,
    extra: &str,
) -> (FakeLlm, Srv, std::path::PathBuf, ollie_p9::Client, Fid, Fid) {
    let fake = FakeLlm::start(script).await;
    let (srv, work) = olliesrv("ollama", &fake.url(), extra);
    let (c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    let ev = events(&root).await;
    (fake, srv, work, c, root, ev)
}

/// Checks what every chat request olliesrv sent has: POST /api/chat, the model, the system
/// prompt first, `stream: true`, tools as `{"type": "function", "function": {…}}`, no key.
fn check_chat_request(g: &Got, model: &str) -> Value {
    assert_eq!(g.method, "POST");
    assert_eq!(g.path, "/api/chat");
    assert!(
        !g.headers.contains_key("authorization"),
        "a key was sent: {:?}",
        g.headers
    );
    let b = g.json();
    assert_eq!(b["model"], model, "{b}");
    assert_eq!(b["stream"], true, "{b}");
    assert!(
        b.get("think").is_none() && b.get("num_ctx").is_none(),
        "{b}"
    );
    let msgs = b["messages"].as_array().expect("messages");
    assert_eq!(msgs[0]["role"], "system", "{b}");
    assert!(!msgs[0]["content"].as_str().unwrap().is_empty(), "{b}");
    let tools = b["tools"].as_array().expect("tools");
    let names: Vec<&str> = tools
        .iter()
        .map(|t| {
            assert_eq!(t["type"], "function", "{t}");
            assert!(t["function"]["description"].is_string(), "{t}");
            assert_eq!(t["function"]["parameters"]["type"], "object", "{t}");
            t["function"]["name"].as_str().unwrap()
        })
        .collect();
    for n in ["execute_code", "file_read", "file_write"] {
        assert!(names.contains(&n), "{names:?}");
    }
    b
}

/// Writes `prompt` to agent `a` and returns the states it went through until idle or error.
async fn turn(root: &Fid, ev: &Fid, prompt: &str) -> Vec<String> {
    write(root, "session/s/agent/a/prompt", prompt)
        .await
        .unwrap_or_else(|e| panic!("prompt {prompt:?}: {e}"));
    states_until(ev, &["idle", "error"]).await
}

/// Agent `a`'s log (the snapshot of `chat.raw`) and its blocks.
async fn log(root: &Fid) -> (String, Vec<Block>) {
    let raw = read(root, "session/s/agent/a/log").await;
    let bs = blocks(&raw);
    (raw, bs)
}

/// The kinds of the blocks, in order.
fn kinds(bs: &[Block]) -> Vec<&str> {
    bs.iter().map(|b| b.kind.as_str()).collect()
}

/// The run record on a `tool_result` marker (`… record={json}`).
fn record(b: &Block) -> Value {
    let r = b
        .attrs
        .split_once("record=")
        .unwrap_or_else(|| panic!("no record on {b:?}"))
        .1;
    serde_json::from_str(r).unwrap_or_else(|e| panic!("record {r:?}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_and_thinking_stream_into_reasoning_then_assistant() {
    let reply = Reply::ndjson(&[
        delta("", "The user wants "),
        delta("", "a greeting."),
        delta("Hello,\n", ""),
        delta("second line\n", ""),
        delta("third line.", ""),
        done(42, 7),
    ]);
    let (fake, srv, _work, _c, root, ev) = setup(vec![reply], PRICES).await;
    let states = turn(&root, &ev, "say hello").await;
    assert_eq!(states, ["thinking", "idle"]);
    let (raw, bs) = log(&root).await;
    assert_eq!(kinds(&bs), ["user", "reasoning", "assistant"], "{raw}");
    assert_eq!(bs[0].body, "say hello\n");
    assert_eq!(bs[1].body.trim_end(), "The user wants a greeting.", "{raw}");
    assert_eq!(
        bs[2].body.trim_end(),
        "Hello,\nsecond line\nthird line.",
        "{raw}"
    );
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_kv(
        &stats,
        &[
            ("tokens_in", "42"),
            ("tokens_out", "7"),
            ("context_tokens", "49"),
            ("requests", "1"),
            ("turns", "1"),
            ("errors", "0"),
        ],
    );
    // No cost from Ollama: the price table's, 42 × $1 + 7 × $2.
    assert_eq!(kv(&stats, "cost_usd"), "56.000000", "{stats}");
    let posts = fake.posts();
    assert_eq!(posts.len(), 1);
    let b = check_chat_request(&posts[0], "m");
    assert_eq!(
        posts[0].headers.get("accept").map(String::as_str),
        Some("application/x-ndjson")
    );
    let msgs = b["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2, "{b}");
    assert_eq!(msgs[1], json!({"role": "user", "content": "say hello"}));
    // The chat without markers has the answer.
    let mut cf = root.walk_path("session/s/agent/a/chat").await.unwrap();
    cf.open(om::OREAD).await.unwrap();
    let chat = String::from_utf8(cf.read(0, 65536).await.unwrap().to_vec()).unwrap();
    assert!(!chat.contains("[[["), "{chat}");
    assert!(chat.contains("Hello,\nsecond line\nthird line."), "{chat}");
    assert!(!srv.stderr().contains("panicked"), "{}", srv.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_round_trip_sends_the_result_back_as_a_tool_message() {
    let code = "echo made > made.txt; echo wrote it";
    let script = vec![
        Reply::ndjson(&[
            delta("", "I should write the file."),
            calls(&[("execute_code", json!({"language": "bash", "code": code}))]),
            done(20, 5),
        ]),
        Reply::ndjson(&[delta("Made made.txt.", ""), done(40, 4)]),
    ];
    let (fake, _srv, work, _c, root, ev) = setup(script, "").await;
    let states = turn(&root, &ev, "make a file").await;
    assert_eq!(
        states,
        ["thinking", "calling: execute_code", "thinking", "idle"]
    );
    assert_eq!(
        std::fs::read_to_string(work.join("made.txt")).unwrap(),
        "made\n"
    );
    let (raw, bs) = log(&root).await;
    assert_eq!(
        kinds(&bs),
        ["user", "reasoning", "tool_call", "tool_result", "assistant"],
        "{raw}"
    );
    // Ollama sends no call id: one was generated, the same on the call and its result.
    let id = bs[2]
        .attrs
        .strip_prefix("name=execute_code id=")
        .unwrap_or_else(|| panic!("{raw}"))
        .to_owned();
    assert!(id.starts_with("call_"), "{raw}");
    assert_eq!(
        serde_json::from_str::<Value>(&bs[2].body).unwrap(),
        json!({"language": "bash", "code": code})
    );
    assert!(
        bs[3]
            .attrs
            .starts_with(&format!("name=execute_code id={id} pid=1 exit=0 record={{")),
        "{raw}"
    );
    assert!(bs[3].body.contains("wrote it"), "{raw}");
    let rec = record(&bs[3]);
    assert_eq!(rec["exit"]["code"], 0, "{rec}");
    assert_eq!(rec["argv"][2], code, "{rec}");
    // The same record in toolsrv, through the session's view.
    let via_toolsrv: Value =
        serde_json::from_str(&read(&root, "session/s/toolsrv/proc/1/record").await).unwrap();
    assert_eq!(via_toolsrv, rec);
    assert_eq!(bs[4].body.trim_end(), "Made made.txt.");
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_kv(
        &stats,
        &[
            ("requests", "2"),
            ("tool_calls", "1"),
            ("tokens_in", "60"),
            ("tokens_out", "9"),
            ("errors", "0"),
        ],
    );
    // The second request carries the call and its result.
    let posts = fake.posts();
    assert_eq!(posts.len(), 2);
    check_chat_request(&posts[0], "m");
    let b = check_chat_request(&posts[1], "m");
    let msgs = b["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 4, "{b}");
    assert_eq!(msgs[1], json!({"role": "user", "content": "make a file"}));
    assert_eq!(msgs[2]["role"], "assistant", "{b}");
    assert_eq!(
        msgs[2]["tool_calls"],
        json!([{"function": {"name": "execute_code",
            "arguments": {"language": "bash", "code": code}}}]),
        "{b}"
    );
    assert_eq!(msgs[3]["role"], "tool", "{b}");
    assert_eq!(msgs[3]["tool_name"], "execute_code", "{b}");
    assert!(
        msgs[3]["content"].as_str().unwrap().contains("wrote it"),
        "{b}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_file_reads_in_one_line_run_together() {
    let script = vec![
        Reply::ndjson(&[
            calls(&[
                ("file_read", json!({"path": "a.txt"})),
                ("file_read", json!({"path": "b.txt"})),
            ]),
            done(20, 5),
        ]),
        answer("alpha and beta"),
    ];
    let (fake, _srv, work, _c, root, ev) = setup(script, "").await;
    std::fs::write(work.join("a.txt"), "alpha-content\n").unwrap();
    std::fs::write(work.join("b.txt"), "beta-content\n").unwrap();
    let states = turn(&root, &ev, "read both").await;
    assert_eq!(
        states,
        [
            "thinking",
            "calling: file_read, file_read",
            "thinking",
            "idle"
        ]
    );
    let (raw, bs) = log(&root).await;
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
        "{raw}"
    );
    let id_of = |b: &Block| {
        b.attrs
            .split_whitespace()
            .find_map(|w| w.strip_prefix("id="))
            .unwrap()
            .to_owned()
    };
    let (ia, ib) = (id_of(&bs[1]), id_of(&bs[2]));
    assert_ne!(ia, ib, "{raw}");
    assert!(
        bs[3].attrs.starts_with(&format!("name=file_read id={ia} ")),
        "{raw}"
    );
    assert!(
        bs[4].attrs.starts_with(&format!("name=file_read id={ib} ")),
        "{raw}"
    );
    assert!(bs[3].body.contains("alpha-content"), "{raw}");
    assert!(bs[4].body.contains("beta-content"), "{raw}");
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_kv(&stats, &[("tool_calls", "2"), ("requests", "2")]);
    let posts = fake.posts();
    assert_eq!(posts.len(), 2);
    let b = check_chat_request(&posts[1], "m");
    let msgs = b["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 5, "{b}");
    assert_eq!(
        msgs[2]["tool_calls"],
        json!([
            {"function": {"name": "file_read", "arguments": {"path": "a.txt"}}},
            {"function": {"name": "file_read", "arguments": {"path": "b.txt"}}}
        ]),
        "{b}"
    );
    for (m, want) in msgs[3..].iter().zip(["alpha-content", "beta-content"]) {
        assert_eq!(m["role"], "tool", "{b}");
        assert_eq!(m["tool_name"], "file_read", "{b}");
        assert!(m["content"].as_str().unwrap().contains(want), "{b}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_waits_its_retry_after_then_succeeds() {
    let script = vec![
        Reply::json(429, &json!({"error": "too many requests"})).header("Retry-After", "1"),
        answer("after the wait"),
    ];
    let (fake, _srv, _work, _c, root, ev) = setup(script, "").await;
    let states = turn(&root, &ev, "hi").await;
    assert_eq!(states, ["thinking", "limitretry", "thinking", "idle"]);
    let (raw, bs) = log(&root).await;
    assert_eq!(kinds(&bs), ["user", "info", "assistant"], "{raw}");
    assert_eq!(bs[1].attrs, "retry", "{raw}");
    assert!(bs[1].body.contains("retrying in 1.0 s (1 of 3)"), "{raw}");
    assert_eq!(bs[2].body.trim_end(), "after the wait");
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_kv(&stats, &[("requests", "2"), ("errors", "0")]);
    assert_eq!(fake.posts().len(), 2);
    check_chat_request(&fake.posts()[1], "m");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_is_retried_then_succeeds() {
    let script = vec![
        Reply::json(
            500,
            &json!({"error": "llama runner process has terminated"}),
        ),
        answer("second try"),
    ];
    let (fake, _srv, _work, _c, root, ev) = setup(script, "").await;
    let states = turn(&root, &ev, "hi").await;
    assert_eq!(states, ["thinking", "limitretry", "thinking", "idle"]);
    let (raw, bs) = log(&root).await;
    assert_eq!(kinds(&bs), ["user", "info", "assistant"], "{raw}");
    assert_eq!(bs[1].attrs, "retry", "{raw}");
    assert!(
        bs[1]
            .body
            .contains("fake: http 500: llama runner process has terminated")
            && bs[1].body.contains("retrying in 1.0 s (1 of 3)"),
        "{raw}"
    );
    assert_eq!(bs[2].body.trim_end(), "second try");
    assert_eq!(fake.posts().len(), 2);
    // The retried request is the same request.
    assert_eq!(fake.posts()[0].json(), fake.posts()[1].json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_500s_fail_the_turn() {
    let e500 = || Reply::json(500, &json!({"error": "server busy"}));
    let script = vec![e500(), e500(), e500(), e500(), answer("never used")];
    let (fake, _srv, _work, _c, root, ev) = setup(script, "").await;
    let states = turn(&root, &ev, "hi").await;
    assert_eq!(
        states,
        [
            "thinking",
            "limitretry",
            "thinking",
            "limitretry",
            "thinking",
            "limitretry",
            "thinking",
            "error"
        ]
    );
    let (raw, bs) = log(&root).await;
    assert_eq!(
        kinds(&bs),
        ["user", "info", "info", "info", "error"],
        "{raw}"
    );
    for (i, b) in bs[1..4].iter().enumerate() {
        assert_eq!(b.attrs, "retry", "{raw}");
        assert!(b.body.contains(&format!("({} of 3)", i + 1)), "{raw}");
    }
    assert!(bs[2].body.contains("retrying in 2.0 s"), "{raw}");
    assert!(bs[3].body.contains("retrying in 4.0 s"), "{raw}");
    assert_eq!(
        bs[4].body.trim_end(),
        "model call failed: fake: http 500: server busy",
        "{raw}"
    );
    assert_eq!(fake.posts().len(), 4);
    assert_eq!(fake.left(), 1);
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_kv(
        &stats,
        &[("requests", "4"), ("errors", "1"), ("turns", "1")],
    );
    let idx = read(&root, "session/s/agent/idx").await;
    assert!(idx.contains("\terror"), "{idx}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_before_done_is_retried() {
    let script = vec![
        Reply::ndjson(&[
            delta("partial ", ""),
            delta("answer", ""),
            delta(" never sent", ""),
            done(5, 5),
        ])
        .cut(2),
        Reply::ndjson(&[delta("whole answer", ""), done(8, 2)]),
    ];
    let (fake, _srv, _work, _c, root, ev) = setup(script, "").await;
    let states = turn(&root, &ev, "hi").await;
    assert_eq!(states, ["thinking", "limitretry", "thinking", "idle"]);
    let (raw, bs) = log(&root).await;
    // What streamed before the cut stays in the chat; the retry notice; the whole answer.
    assert_eq!(
        kinds(&bs),
        ["user", "assistant", "info", "assistant"],
        "{raw}"
    );
    assert_eq!(bs[1].body.trim_end(), "partial answer", "{raw}");
    assert_eq!(bs[2].attrs, "retry", "{raw}");
    assert!(
        bs[2].body.starts_with("fake: ") && bs[2].body.contains("(1 of 3)"),
        "{raw}"
    );
    assert!(!raw.contains("never sent"), "{raw}");
    assert_eq!(bs[3].body.trim_end(), "whole answer");
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_kv(
        &stats,
        &[("requests", "2"), ("tokens_in", "8"), ("tokens_out", "2")],
    );
    // The half answer is not in the history: the retry asks the same thing again.
    let posts = fake.posts();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].json(), posts[1].json());
    // The next turn's request has only the whole answer.
    fake.push(vec![answer("ok")]);
    write(&root, "session/s/agent/a/prompt", "again")
        .await
        .unwrap();
    states_until(&ev, &["idle", "error"]).await;
    let b = check_chat_request(&fake.posts()[2], "m");
    let msgs = b["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 4, "{b}");
    assert_eq!(
        msgs[2],
        json!({"role": "assistant", "content": "whole answer"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_line_in_the_stream_is_retried() {
    let script = vec![
        Reply::ndjson(&[
            delta("start", ""),
            json!({"error": "an upstream failure happened"}),
        ]),
        answer("fine now"),
    ];
    let (fake, _srv, _work, _c, root, ev) = setup(script, "").await;
    let states = turn(&root, &ev, "hi").await;
    assert_eq!(states, ["thinking", "limitretry", "thinking", "idle"]);
    let (raw, bs) = log(&root).await;
    assert_eq!(
        kinds(&bs),
        ["user", "assistant", "info", "assistant"],
        "{raw}"
    );
    assert_eq!(bs[2].attrs, "retry", "{raw}");
    assert!(
        bs[2].body.contains(
            "fake: error in stream: an upstream failure happened; retrying in 1.0 s (1 of 3)"
        ),
        "{raw}"
    );
    assert_eq!(bs[3].body.trim_end(), "fine now");
    assert_eq!(fake.posts().len(), 2);
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_eq!(kv(&stats, "errors"), "0", "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_overflow_compacts_and_retries() {
    let script = vec![
        answer("first answer"),
        answer("second answer"),
        Reply::json(
            400,
            &json!({"error": "the input length exceeds the context length"}),
        ),
        Reply::ndjson(&[delta("- the user asked two things", ""), done(100, 10)]),
        answer("third answer"),
    ];
    let (fake, _srv, _work, _c, root, ev) = setup(script, "").await;
    for p in ["first prompt", "second prompt"] {
        write(&root, "session/s/agent/a/prompt", p).await.unwrap();
        assert_eq!(
            states_until(&ev, &["idle", "error"]).await,
            ["thinking", "idle"]
        );
    }
    let states = turn(&root, &ev, "third prompt").await;
    assert_eq!(states, ["thinking", "compacting", "thinking", "idle"]);
    let (raw, bs) = log(&root).await;
    assert_eq!(
        kinds(&bs),
        [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "info",
            "info",
            "assistant"
        ],
        "{raw}"
    );
    assert_eq!(bs[5].attrs, "", "{raw}");
    assert_eq!(
        bs[5].body.trim_end(),
        "context overflow: fake: http 400: the input length exceeds the context length",
        "{raw}"
    );
    assert_eq!(bs[6].attrs, "compacted", "{raw}");
    assert!(
        bs[6].body.starts_with(
            "compacted the conversation (the model's context overflowed): 4 messages summarized, 1 kept"
        ) && bs[6].body.contains("- the user asked two things"),
        "{raw}"
    );
    assert_eq!(bs[7].body.trim_end(), "third answer");
    let posts = fake.posts();
    assert_eq!(posts.len(), 5);
    // The summary request: its own system prompt, one user message with the transcript.
    let s = posts[3].json();
    assert_eq!(s["stream"], true, "{s}");
    let sm = s["messages"].as_array().unwrap();
    assert_eq!(sm.len(), 2, "{s}");
    assert_eq!(sm[0]["role"], "system");
    assert!(
        sm[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("You compress the history"),
        "{s}"
    );
    let t = sm[1]["content"].as_str().unwrap();
    assert_eq!(sm[1]["role"], "user");
    assert!(
        t.contains("first prompt")
            && t.contains("second answer")
            && t.contains("Summarize the conversation above")
            && !t.contains("third prompt"),
        "{t}"
    );
    // The retried request: the summary, then the kept prompt.
    let b = check_chat_request(&posts[4], "m");
    let msgs = b["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{b}");
    assert!(
        msgs[1]["content"].as_str().unwrap().starts_with(
            "<conversation-summary>\n- the user asked two things\n</conversation-summary>"
        ),
        "{b}"
    );
    assert_eq!(msgs[2], json!({"role": "user", "content": "third prompt"}));
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_kv(
        &stats,
        &[("errors", "0"), ("requests", "5"), ("turns", "3")],
    );
}

/// A context that overflows in the middle of a turn, when the tool result is not answered
/// yet: the compaction keeps the call and its result, so the model answers the result and
/// does not make the call again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflow_after_a_tool_result_keeps_the_call_and_its_result() {
    let script = vec![
        Reply::ndjson(&[
            calls(&[(
                "execute_code",
                json!({"language": "bash", "code": "echo ran >> runs"}),
            )]),
            done(20, 5),
        ]),
        Reply::json(
            400,
            &json!({"error": "the input length exceeds the context length"}),
        ),
        Reply::ndjson(&[delta("- the user asked for a run", ""), done(100, 10)]),
        answer("it ran"),
    ];
    let (fake, _srv, work, _c, root, ev) = setup(script, "").await;
    let states = turn(&root, &ev, "run it").await;
    assert_eq!(
        states,
        [
            "thinking",
            "calling: execute_code",
            "thinking",
            "compacting",
            "thinking",
            "idle"
        ]
    );
    // The call ran once: it was not made again after the compaction.
    assert_eq!(std::fs::read_to_string(work.join("runs")).unwrap(), "ran\n");
    let posts = fake.posts();
    assert_eq!(posts.len(), 4);
    let b = check_chat_request(&posts[3], "m");
    let msgs = b["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 4, "{b}");
    assert!(
        msgs[1]["content"]
            .as_str()
            .unwrap()
            .starts_with("<conversation-summary>\n- the user asked for a run"),
        "{b}"
    );
    assert_eq!(msgs[2]["role"], "assistant", "{b}");
    assert_eq!(msgs[2]["tool_calls"][0]["function"]["name"], "execute_code");
    assert_eq!(msgs[3]["role"], "tool", "{b}");
    assert_eq!(msgs[3]["tool_name"], "execute_code", "{b}");
    let (raw, bs) = log(&root).await;
    assert_eq!(bs.last().unwrap().body.trim_end(), "it ran", "{raw}");
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_kv(&stats, &[("tool_calls", "1"), ("requests", "4")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_written_as_text_is_sent_back() {
    let text = r#"I will read it: {"name": "file_read", "arguments": {"path": "x"}}"#;
    let script = vec![
        Reply::ndjson(&[delta(text, ""), done(10, 10)]),
        answer("sorry, the answer is 4"),
    ];
    let (fake, _srv, _work, _c, root, ev) = setup(script, "").await;
    let states = turn(&root, &ev, "what is 2+2").await;
    assert_eq!(states, ["thinking", "idle"]);
    let (raw, bs) = log(&root).await;
    assert_eq!(
        kinds(&bs),
        ["user", "assistant", "info", "assistant"],
        "{raw}"
    );
    assert_eq!(bs[2].attrs, "text-tool-call", "{raw}");
    assert!(bs[2].body.contains("call to file_read as text"), "{raw}");
    assert_eq!(bs[3].body.trim_end(), "sorry, the answer is 4");
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_kv(&stats, &[("tool_calls", "0"), ("requests", "2")]);
    let posts = fake.posts();
    assert_eq!(posts.len(), 2);
    let b = check_chat_request(&posts[1], "m");
    let msgs = b["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 4, "{b}");
    assert_eq!(msgs[2], json!({"role": "assistant", "content": text}));
    assert_eq!(msgs[3]["role"], "user", "{b}");
    assert!(
        msgs[3]["content"]
            .as_str()
            .unwrap()
            .contains("tool interface"),
        "{b}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_model_fails_the_turn_at_once() {
    let script = vec![
        Reply::json(
            404,
            &json!({"error": "model \"m\" not found, try pulling it first"}),
        ),
        answer("never used"),
    ];
    let (fake, _srv, _work, _c, root, ev) = setup(script, "").await;
    let states = turn(&root, &ev, "hi").await;
    assert_eq!(states, ["thinking", "error"]);
    let (raw, bs) = log(&root).await;
    assert_eq!(kinds(&bs), ["user", "error"], "{raw}");
    assert_eq!(
        bs[1].body,
        "model call failed: fake: http 404: model \"m\" not found, try pulling it first\n",
        "{raw}"
    );
    assert_eq!(fake.posts().len(), 1);
    assert_eq!(fake.left(), 1);
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_kv(&stats, &[("errors", "1"), ("requests", "1")]);
}

fn tags() -> Reply {
    Reply::json(
        200,
        &json!({"models": [
            {"name": "llama3.2:latest", "model": "llama3.2:latest",
             "modified_at": "2025-01-01T00:00:00Z", "size": 2019393189u64,
             "digest": "a80c4f17acd5", "details": {"family": "llama", "parameter_size": "3.2B"}},
            {"name": "qwen3:8b", "model": "qwen3:8b", "size": 5225388164u64}
        ]}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_come_from_api_tags() {
    let (fake, _srv, _work, _c, root, _ev) = setup(Vec::new(), "").await;
    fake.route("/api/tags", tags());
    assert_eq!(
        read(&root, "models").await,
        "fake\tllama3.2:latest\nfake\tqwen3:8b\n"
    );
    assert_eq!(
        rdwr(&root, "session/s/agent/a/ctl", "models")
            .await
            .unwrap(),
        "llama3.2:latest\nqwen3:8b\n"
    );
    assert_eq!(
        rdwr(&root, "session/s/agent/a/ctl", "backend")
            .await
            .unwrap(),
        "fake\tollama\n"
    );
    let got = fake.got();
    assert!(
        got.iter()
            .all(|g| g.method == "GET" && g.path == "/api/tags"),
        "{got:?}"
    );
    assert_eq!(got.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_configured_an_ollama_at_ollama_host_is_used() {
    let fake = FakeLlm::start(vec![answer("found you"), answer("generated")]).await;
    fake.route(
        "/api/version",
        Reply::json(200, &json!({"version": "0.12.0"})),
    );
    fake.route("/api/tags", tags());
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let addr = fake.addr.to_string();
    let srv = Srv::start_with(dir, "", |c| {
        c.env("OLLAMA_HOST", &addr);
    });
    let (_c, root) = attach(&srv, &me()).await;
    assert_eq!(read(&root, "backends").await, "ollama\n");
    assert_eq!(
        read(&root, "models").await,
        "ollama\tllama3.2:latest\nollama\tqwen3:8b\n"
    );
    session_with_agent(&root, &work).await;
    assert_eq!(
        rdwr(&root, "session/s/agent/a/ctl", "backend")
            .await
            .unwrap(),
        "ollama\tollama\n"
    );
    let ev = events(&root).await;
    write(&root, "session/s/agent/a/prompt", "hello")
        .await
        .unwrap();
    assert_eq!(
        states_until(&ev, &["idle", "error"]).await,
        ["thinking", "idle"]
    );
    let (raw, bs) = log(&root).await;
    assert_eq!(kinds(&bs), ["user", "assistant"], "{raw}");
    assert_eq!(bs[1].body.trim_end(), "found you");
    let posts = fake.posts();
    assert_eq!(posts.len(), 1);
    // The first model the server lists.
    check_chat_request(&posts[0], "llama3.2:latest");
    // The probe asked /api/version.
    assert!(
        fake.got()
            .iter()
            .any(|g| g.method == "GET" && g.path == "/api/version"),
        "{:?}",
        fake.got()
    );
    // generate uses it too.
    assert_eq!(
        rdwr(&root, "generate", "say it").await.unwrap(),
        "generated\n"
    );
    let g = fake.posts()[1].json();
    assert_eq!(g["model"], "llama3.2:latest", "{g}");
    assert_eq!(
        g["messages"],
        json!([{"role": "user", "content": "say it"}]),
        "{g}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_configured_and_no_ollama_prompts_and_generate_fail() {
    // The harness's OLLAMA_HOST (the discard port) answers nothing.
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let srv = Srv::start_with(dir, "", |_| {});
    let (_c, root) = attach(&srv, &me()).await;
    assert_eq!(read(&root, "backends").await, "");
    session_with_agent(&root, &work).await;
    let ev = events(&root).await;
    write(&root, "session/s/agent/a/prompt", "hello")
        .await
        .unwrap();
    // The turn starts (running shows as thinking) and fails before any model call.
    assert_eq!(
        states_until(&ev, &["idle", "error"]).await,
        ["thinking", "error"]
    );
    let (raw, bs) = log(&root).await;
    assert_eq!(kinds(&bs), ["user", "error"], "{raw}");
    assert!(
        bs[1].body.starts_with("no backend: start Ollama") && bs[1].body.lines().count() == 1,
        "{raw}"
    );
    let e = rdwr(&root, "generate", "say it").await.unwrap_err();
    assert!(e.contains("no backend: start Ollama"), "{e}");
    assert!(!e.contains('\n'), "{e:?}");
    let stats = read(&root, "session/s/agent/a/stats").await;
    assert_kv(&stats, &[("errors", "1"), ("requests", "0")]);
}

/// An Ollama behind an authenticating proxy: the configured key goes out as a bearer token
/// and never shows up anywhere, even when the server echoes it in an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_key_is_sent_and_never_shown() {
    let fake = FakeLlm::start(vec![
        Reply::json(401, &json!({"error": format!("bad token {KEY}")})),
        Reply::json(403, &json!({"error": format!("forbidden for {KEY}")})),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let config = format!(
        "default_backend = \"fake\"\n\n[backends.fake]\nkind = \"ollama\"\nbase_url = \"{}/api\"\nmodel = \"m\"\napi_key_env = \"OLLIE_FAKE_KEY\"\n",
        fake.url()
    );
    let srv = Srv::start_with(dir, &config, |c| {
        c.env("OLLIE_FAKE_KEY", KEY);
    });
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    write(&root, "session/s/agent/a/prompt", "hi")
        .await
        .unwrap();
    let raw = wait_for(&root, "session/s/agent/a/log", "[[[error").await;
    let bs = blocks(&raw);
    assert_eq!(kinds(&bs), ["user", "error"], "{raw}");
    assert!(
        bs[1]
            .body
            .starts_with("model call failed: fake: http 401: bad token "),
        "{raw}"
    );
    let posts = fake.posts();
    assert_eq!(posts.len(), 1);
    // A base URL ending in /api means the server root.
    assert_eq!(posts[0].path, "/api/chat");
    assert_eq!(
        posts[0].headers.get("authorization").map(String::as_str),
        Some(format!("Bearer {KEY}").as_str())
    );
    for p in [
        "session/s/agent/a/log",
        "session/s/agent/a/stats",
        "session/s/agent/a/cfg",
    ] {
        let t = read(&root, p).await;
        assert!(!t.contains(KEY), "{p}: {t}");
    }
    assert!(!srv.stderr().contains(KEY), "{}", srv.stderr());
    let mut f = root.walk_path("generate").await.unwrap();
    f.open(om::ORDWR).await.unwrap();
    let e = f
        .write(0, Bytes::from_static(b"say it"))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("fake: http 403: forbidden for "), "{e}");
    assert!(!e.contains(KEY), "{e}");
    assert!(!srv.stderr().contains(KEY), "{}", srv.stderr());
}

/// Every request is bounded by the backend's timeouts (`first_byte_timeout_s = 2` here):
/// `models` and `ctl models` against an `/api/tags` that never answers show that timeout,
/// with the backend and the path, before their own 10 s; a chat whose replies send a head
/// and stall fails the turn (after its retries) naming it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stalls_runs_out_of_the_backends_timeouts() {
    let stall = || {
        Reply {
            chunks: Vec::new(),
            ..answer("never")
        }
        .hang()
    };
    let fake = FakeLlm::start((0..4).map(|_| stall()).collect()).await;
    fake.route("/api/tags", Reply::silent());
    let (srv, work) =
        fake_llm::olliesrv_with("ollama", &fake.url(), "", "first_byte_timeout_s = 2\n");
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    let ev = events(&root).await;
    let timed_out = "fake: /api/tags: timed out: no reply within 2 s (first_byte_timeout_s)";
    assert_eq!(read(&root, "models").await, format!("# {timed_out}\n"));
    let e = rdwr(&root, "session/s/agent/a/ctl", "models")
        .await
        .unwrap_err();
    assert!(e.contains(timed_out), "{e}");

    assert_eq!(turn(&root, &ev, "hi").await.last().unwrap(), "error");
    let (_, bs) = log(&root).await;
    assert_eq!(
        bs.last().unwrap().body,
        "model call failed: fake: /api/chat: timed out: no reply within 2 s (first_byte_timeout_s)\n"
    );
    assert_eq!(fake.posts().len(), 4);
}
