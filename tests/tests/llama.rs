//! The agent loop against a real model server: llama.cpp's `llama-server` serving
//! SmolLM2-135M (built and downloaded by `scripts/local-model.sh --prepare`, found in its
//! cache; missing, each test prints a SKIP line, or fails under `OLLIE_TEST_REQUIRE=all`).
//! Each test starts its own server on a free loopback port (`-c`, `-np` as it needs,
//! `--metrics`) and a real olliesrv with the `openai` backend aimed at it. Covered: a reply
//! streamed into `chat` in many pieces with the server's token counts in `stats` and the
//! served model in `models`; a tool call forced with `tool_choice = "required_first"` and the
//! `<tool_call>` prefill that runs in toolsrv and ends the turn; a call cut at `max_tokens`
//! answered with a tool error; `ctl stop` mid-generation freeing the server's slot; the
//! server killed mid-stream (retries, a clear error, then a restart and a working prompt); a
//! context overflow on a small window compacted to the window the server names; `generate`
//! on two fids at once. The model's temperature is 0, so its choices repeat from run to run on
//! one machine; its words may differ on another CPU, so the tests check shapes, not words.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod fake_llm;

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use common::{Srv, attach, me};
use fake_llm::{
    Block, assert_kv, blocks, events, rdwr, read, session_with_agent, states_until, wait_for, write,
};
use ollie_p9::Fid;
use ollie_p9::wire::om;
use ollie_testkit::llama::{self, Llama, MODEL};

const A: &str = "session/s/agent/a";

/// olliesrv with backend `local` (the default) aimed at `l`, with `extra` keys in its table;
/// and our attachment.
struct H {
    srv: Srv,
    work: PathBuf,
    root: Fid,
    _c: ollie_p9::Client,
}

async fn olliesrv(l: &Llama, backend_extra: &str) -> H {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let config = format!(
        "default_backend = \"local\"\n\n{}",
        l.backend_table("local", backend_extra)
    );
    let srv = Srv::start_with(dir, &config, |_| {});
    let (c, root) = attach(&srv, &me()).await;
    H {
        srv,
        work,
        root,
        _c: c,
    }
}

/// A server with context `ctx` and `slots` slots, and olliesrv aimed at it with
/// `backend_extra`; `None` after a SKIP line for `test` when llama-server is not built.
async fn up(test: &str, ctx: u32, slots: u32, backend_extra: &str) -> Option<(Llama, H)> {
    let files = llama::available(test)?;
    let l = Llama::start(&files, ctx, slots).await;
    let h = olliesrv(&l, backend_extra).await;
    Some((l, h))
}

/// Session `s` with agent `a`, temperature 0 and the given `cfg` lines.
async fn agent(h: &H, cfg: &str) {
    session_with_agent(&h.root, &h.work).await;
    write(
        &h.root,
        &format!("{A}/cfg"),
        &format!("temperature=0\n{cfg}"),
    )
    .await
    .unwrap();
}

/// Sends `prompt`; returns the states until the turn ended (`idle` or `error`).
async fn turn(root: &Fid, prompt: &str) -> Vec<String> {
    let ev = events(root).await;
    write(root, &format!("{A}/prompt"), prompt).await.unwrap();
    states_until(&ev, &["idle", "error"]).await
}

async fn chat_blocks(root: &Fid) -> Vec<Block> {
    blocks(&read(root, &format!("{A}/log")).await)
}

fn kinds(bs: &[Block]) -> Vec<&str> {
    bs.iter().map(|b| b.kind.as_str()).collect()
}

/// Agent `a`'s history file, one JSON message per line.
async fn history(h: &H) -> Vec<serde_json::Value> {
    let sid = read(&h.root, "session/s/id").await;
    let aid = read(&h.root, &format!("{A}/id")).await;
    let p = h
        .srv
        .state_dir()
        .join("sessions")
        .join(sid.trim())
        .join("agents")
        .join(aid.trim())
        .join("history.jsonl");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A turn with `prompt` ends idle with an assistant reply after the prompt.
async fn answers(h: &H, prompt: &str) {
    let st = turn(&h.root, prompt).await;
    assert_eq!(st.last().map(String::as_str), Some("idle"), "{st:?}");
    let bs = chat_blocks(&h.root).await;
    let at = bs.iter().rposition(|b| b.kind == "user").unwrap();
    assert_eq!(bs[at].body, format!("{prompt}\n"), "{bs:?}");
    assert!(
        bs[at..]
            .iter()
            .any(|b| b.kind == "assistant" && !b.body.trim().is_empty()),
        "no reply to {prompt:?}: {bs:?}"
    );
}

/// A reply streams into `chat` in more than one piece while the model writes it; `stats`
/// shows the token counts the server counted (its `/metrics`); `models` and `ctl models`
/// list the model the server serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_streams_into_chat_and_stats_show_the_servers_counts() {
    let Some((l, h)) = up("llama_stream", 4096, 1, "").await else {
        return;
    };
    agent(&h, "max_tokens=48").await;

    // A reader at the end of `chat` before the prompt: each read returns what arrived since
    // the last one (a read at the end blocks until more comes).
    let mut chat = h.root.walk_path(&format!("{A}/chat")).await.unwrap();
    chat.open(om::OREAD).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let mut off = 0u64;
        loop {
            let Ok(d) = chat.read(off, 8192).await else {
                return;
            };
            if d.is_empty() {
                return;
            }
            off += d.len() as u64;
            let _ = tx.send(String::from_utf8_lossy(&d).into_owned());
        }
    });
    let st = turn(&h.root, "Tell me about the sea in three sentences.").await;
    assert_eq!(st.last().map(String::as_str), Some("idle"), "{st:?}");
    let bs = chat_blocks(&h.root).await;
    // The words differ between CPUs even at temperature 0, so the reply may or may not end
    // before `max_tokens`; cut there, it carries the truncation note.
    let k = kinds(&bs);
    assert_eq!(&k[..2], ["user", "assistant"], "{bs:?}");
    match &bs[2..] {
        [] => {}
        [note] => assert!(note.kind == "info" && note.attrs == "truncated", "{bs:?}"),
        _ => panic!("more than one block after the reply: {bs:?}"),
    }
    let reply = bs[1].body.trim_end().to_owned();
    assert!(!reply.is_empty(), "{bs:?}");
    // Collect the reader's pieces until the whole reply has come through it.
    let mut pieces: Vec<String> = Vec::new();
    while !pieces.concat().contains(&reply) {
        let p = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("chat never showed the reply; read {pieces:?}"))
            .unwrap();
        pieces.push(p);
    }
    reader.abort();
    let prompt_end = pieces
        .iter()
        .position(|p| p.contains("three sentences."))
        .unwrap();
    let reply_pieces = pieces.len() - prompt_end - 1;
    assert!(
        reply_pieces > 1,
        "the reply came in {reply_pieces} piece(s): {pieces:?}"
    );

    let s = read(&h.root, &format!("{A}/stats")).await;
    let prompt = l.metric("prompt_tokens_total").await as u64;
    let predicted = l.metric("tokens_predicted_total").await as u64;
    assert!(predicted > 1, "{predicted}");
    assert_kv(
        &s,
        &[
            ("tokens_in", &prompt.to_string()),
            ("tokens_out", &predicted.to_string()),
            ("requests", "1"),
            ("turns", "1"),
            ("errors", "0"),
        ],
    );
    assert_eq!(read(&h.root, "models").await, format!("local\t{MODEL}\n"));
    assert_eq!(
        rdwr(&h.root, &format!("{A}/ctl"), "models").await.unwrap(),
        format!("{MODEL}\n")
    );
}

/// The settings that make SmolLM2 call a tool (docs/local-model.md): the first model call of
/// a turn requires one, and its reply starts inside a `<tool_call>` block.
const FORCED: &str = "tool_choice = \"required_first\"\ntool_prefill = \"<tool_call>\\n\"";

/// A forced call: the model's call runs in toolsrv (the file it reads is in the session's
/// work directory), its result goes back, and the turn ends after the next, free step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_call_runs_in_toolsrv_and_the_turn_ends() {
    let Some((_l, h)) = up("llama_tool_call", 4096, 1, FORCED).await else {
        return;
    };
    std::fs::write(h.work.join("README.md"), "The secret word is PLUM.\n").unwrap();
    agent(&h, "max_tokens=64\nmax_steps=3").await;
    let st = turn(&h.root, "Read the file README.md.").await;
    let bs = chat_blocks(&h.root).await;
    assert_eq!(st.last().map(String::as_str), Some("idle"), "{st:?} {bs:?}");
    let k = kinds(&bs);
    assert_eq!(&k[..3], ["user", "tool_call", "tool_result"], "{bs:?}");
    assert!(bs[1].attrs.starts_with("name=file_read id="), "{bs:?}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&bs[1].body).unwrap()["path"],
        "README.md",
        "{bs:?}"
    );
    assert!(bs[2].body.contains("The secret word is PLUM."), "{bs:?}");
    let s = read(&h.root, &format!("{A}/stats")).await;
    assert_kv(&s, &[("tool_calls", "1"), ("turns", "1"), ("errors", "0")]);
    // The history the next request carries: the call, answered by its result.
    let hist = history(&h).await;
    assert_eq!(hist[0]["role"], "user");
    assert_eq!(hist[1]["role"], "assistant");
    assert_eq!(hist[2]["role"], "tool");
    assert_eq!(hist[2]["tool_call_id"], hist[1]["tool_calls"][0]["id"]);
}

/// A forced call cut off by `max_tokens`: its arguments are not JSON, so nothing runs and the
/// model gets a tool error saying so (the reply is marked as truncated); the turn goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_at_max_tokens_gets_a_tool_error_not_a_crash() {
    let Some((_l, h)) = up("llama_cut_call", 4096, 1, FORCED).await else {
        return;
    };
    agent(&h, "max_tokens=8\nmax_steps=2").await;
    let st = turn(&h.root, "Read the file README.md.").await;
    let bs = chat_blocks(&h.root).await;
    assert!(
        matches!(st.last().map(String::as_str), Some("idle" | "error")),
        "{st:?}"
    );
    let truncated = bs
        .iter()
        .position(|b| b.kind == "info" && b.attrs == "truncated")
        .unwrap_or_else(|| panic!("no truncation note: {bs:?}"));
    let result = bs
        .iter()
        .find(|b| b.kind == "tool_result")
        .unwrap_or_else(|| panic!("no tool result: {bs:?}"));
    assert!(
        result.body.starts_with("error: the arguments of ")
            && result.body.contains("are not a JSON object"),
        "{bs:?}"
    );
    assert!(truncated < bs.len());
    let top = read(&h.root, &format!("{A}/proc/top")).await;
    assert_eq!(top.lines().count(), 1, "a process ran:\n{top}");
    // olliesrv is still there and answering.
    assert!(read(&h.root, "models").await.contains(MODEL));
}

/// `ctl stop` while the model writes a long reply: the turn stops, the HTTP stream is
/// dropped and the server stops generating (its slot frees; it produced only a few tokens
/// more than the chat shows), and the next prompt is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_during_a_generation_frees_the_servers_slot() {
    let Some((l, h)) = up("llama_stop", 4096, 1, "").await else {
        return;
    };
    agent(&h, "max_tokens=3000").await;
    let ev = events(&h.root).await;
    write(
        &h.root,
        &format!("{A}/prompt"),
        "Write a very long story about a dragon, in many chapters.",
    )
    .await
    .unwrap();
    // Some of the reply has arrived: the model is generating.
    let raw = wait_for(&h.root, &format!("{A}/log"), "[[[assistant\n").await;
    assert!(!raw.contains("[[[error"), "{raw}");
    assert_eq!(
        rdwr(&h.root, &format!("{A}/ctl"), "stop").await.unwrap(),
        "stopping\n"
    );
    let st = states_until(&ev, &["idle", "error"]).await;
    let raw = wait_for(&h.root, &format!("{A}/log"), "[[[error\nstopped\n]]]").await;
    assert!(raw.contains("stopped by ctl stop"), "{st:?} {raw}");
    l.wait_idle().await;
    let shown: usize = blocks(&raw)
        .iter()
        .filter(|b| b.kind == "assistant")
        .map(|b| b.body.chars().count())
        .sum();
    let predicted = l.metric("tokens_predicted_total").await as usize;
    // A token is at least one character: had the server gone on, it would have predicted
    // far more than the chat shows (up to 3000).
    assert!(
        predicted <= shown + 64,
        "the server predicted {predicted} tokens, the chat shows {shown} characters"
    );
    write(&h.root, &format!("{A}/cfg"), "max_tokens=16")
        .await
        .unwrap();
    answers(&h, "Say hello.").await;
}

/// llama-server killed mid-stream: the call is retried with backoff (1, 2, 4 s) and the turn
/// ends with an error saying the server is unreachable; restarted on the same port, the next
/// prompt works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_retried_then_reported_and_a_restart_recovers() {
    let Some((mut l, h)) = up("llama_kill", 4096, 1, "").await else {
        return;
    };
    agent(&h, "max_tokens=3000").await;
    let ev = events(&h.root).await;
    write(
        &h.root,
        &format!("{A}/prompt"),
        "Write a very long story about a dragon.",
    )
    .await
    .unwrap();
    wait_for(&h.root, &format!("{A}/log"), "[[[assistant\n").await;
    l.kill();
    let st = states_until(&ev, &["idle", "error"]).await;
    assert_eq!(st.last().map(String::as_str), Some("error"), "{st:?}");
    let bs = chat_blocks(&h.root).await;
    let retries: Vec<&Block> = bs
        .iter()
        .filter(|b| b.kind == "info" && b.attrs == "retry")
        .collect();
    assert_eq!(retries.len(), 3, "{bs:?}");
    for (i, r) in retries.iter().enumerate() {
        assert!(r.body.contains(&format!("({} of 3)", i + 1)), "{bs:?}");
    }
    // The first failure is the cut stream, the later ones the refused connection.
    assert!(retries[0].body.starts_with("local: "), "{bs:?}");
    let err = bs.iter().rev().find(|b| b.kind == "error").unwrap();
    assert!(err.body.starts_with("model call failed: local: "), "{bs:?}");
    assert!(
        err.body.contains("connect") || err.body.contains("refused"),
        "{bs:?}"
    );
    // Nothing of the turn is lost: the prompt is in the history.
    let hist = history(&h).await;
    assert_eq!(
        hist[0]["content"],
        "Write a very long story about a dragon."
    );

    l.restart().await;
    write(&h.root, &format!("{A}/cfg"), "max_tokens=16")
        .await
        .unwrap();
    answers(&h, "Say hello.").await;
}

/// A window too small for the conversation (`-c 2048`, while the configuration claims
/// 100000 tokens): the server's "exceeds the available context size (2048 tokens)" makes
/// olliesrv believe that window for the turn, compact to fit it (a shorter tail, a summary of
/// at most an eighth of it) and retry, and the turn ends with the model's reply; the chat
/// keeps every prompt and the history the latest one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_overflow_compacts_to_the_servers_window_and_loses_nothing() {
    let Some((_l, h)) = up("llama_overflow", 2048, 1, "").await else {
        return;
    };
    agent(&h, "max_tokens=12\ncontext_limit=100000").await;
    let filler = "The harbour was quiet and the boats rocked slowly in the grey water. ".repeat(12);
    let mut prompts = Vec::new();
    let mut overflowed = false;
    for i in 0..16 {
        let p = format!("Note {i}: {filler} Answer with one word.");
        let st = turn(&h.root, &p).await;
        prompts.push(p);
        let raw = read(&h.root, &format!("{A}/log")).await;
        let bs = blocks(&raw);
        let Some(at) = bs
            .iter()
            .position(|b| b.kind == "info" && b.body.starts_with("context overflow: "))
        else {
            assert_eq!(st.last().map(String::as_str), Some("idle"), "{st:?}");
            continue;
        };
        overflowed = true;
        let after = &bs[at..];
        assert!(
            after[0]
                .body
                .contains("exceeds the available context size (2048 tokens)"),
            "{after:?}"
        );
        assert_eq!(
            st.last().map(String::as_str),
            Some("idle"),
            "{st:?} {after:?}"
        );
        assert_eq!(after[1].kind, "info", "{after:?}");
        assert_eq!(after[1].attrs, "compacted", "{after:?}");
        assert!(
            after[2..]
                .iter()
                .any(|b| b.kind == "assistant" && !b.body.trim().is_empty()),
            "no reply after the compaction: {after:?}"
        );
        assert!(!after.iter().any(|b| b.kind == "error"), "{after:?}");
        let s = read(&h.root, &format!("{A}/stats")).await;
        assert_kv(&s, &[("context_limit", "2048"), ("errors", "0")]);
        break;
    }
    assert!(
        overflowed,
        "{} turns never overflowed a 2048-token window",
        prompts.len()
    );
    let raw = read(&h.root, &format!("{A}/log")).await;
    for p in &prompts {
        assert!(raw.contains(p.as_str()), "the chat lost {p:?}");
    }
    let hist = history(&h).await;
    let last = prompts.last().unwrap();
    assert!(
        hist.iter().any(|m| m["content"] == last.as_str()),
        "the history lost the last prompt"
    );
}

/// `generate` on two fids at once, against a server with two slots: each fid gets its own
/// answer, both from the real model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_answers_two_fids_at_once() {
    let Some((l, h)) = up("llama_generate", 4096, 2, "").await else {
        return;
    };
    let prompts = ["Name a colour.", "Name an animal."];
    let mut a = h.root.walk_path("generate").await.unwrap();
    a.open(om::ORDWR).await.unwrap();
    let mut b = h.root.walk_path("generate").await.unwrap();
    b.open(om::ORDWR).await.unwrap();
    let (wa, wb) = tokio::join!(
        a.write(0, Bytes::from_static(prompts[0].as_bytes())),
        b.write(0, Bytes::from_static(prompts[1].as_bytes()))
    );
    wa.unwrap();
    wb.unwrap();
    let (ra, rb) = tokio::join!(a.read_to_end(), b.read_to_end());
    let got = [
        String::from_utf8(ra.unwrap()).unwrap(),
        String::from_utf8(rb.unwrap()).unwrap(),
    ];
    for g in &got {
        assert!(!g.trim().is_empty(), "{got:?}");
    }
    assert_eq!(l.metric("requests_processing").await as u64, 0);
    let predicted = l.metric("tokens_predicted_total").await as u64;
    assert!(predicted >= 2, "{predicted}");
}
