//! How writes become prompts and how an agent's feed becomes its turns, against a real
//! olliesrv and a scripted OpenAI-style model on loopback that records what it was asked:
//! a prompt written in many Twrites (a small msize, a pipe's chunks) is one turn; one over
//! the limit is refused whole at the write that crosses it and queues nothing; a blank one is
//! refused at the clunk; `agent/new`'s `prompt=` in pieces is one prompt; each new feed value
//! is a turn, only the newest waits while a turn runs, `feed=off` stops it and `feed_prompt`
//! frames it. The rules are olliesrv's `tree/prompt.rs` and `agent/feed.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod fake_llm;

use std::time::Duration;

use bytes::Bytes;
use common::{attach, me, within};
use fake_llm::*;
use ollie_p9::Fid;
use ollie_p9::wire::om;
use serde_json::{Value, json};

const A: &str = "session/s/agent/a";

/// A whole text reply as OpenAI SSE, its chunks `gap` apart.
fn text_reply(text: &str, gap: Duration) -> Reply {
    let chunk = |delta: Value, finish: Option<&str>| {
        let c = json!({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {c}")
    };
    Reply::sse(&[
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"content": text}), None),
        chunk(json!({}), Some("stop")),
        "data: [DONE]".to_owned(),
    ])
    .gap(gap)
}

/// The chat-completion requests the model got, as the text of their last user message.
fn asked(llm: &FakeLlm) -> Vec<String> {
    llm.posts()
        .iter()
        .filter(|g| g.path.ends_with("/chat/completions"))
        .map(|g| {
            let v: Value = serde_json::from_str(&g.body).unwrap();
            let msgs = v["messages"].as_array().unwrap();
            let last = msgs.iter().rev().find(|m| m["role"] == "user").unwrap();
            last["content"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

async fn turns(root: &Fid) -> u64 {
    kv(&read(root, &format!("{A}/stats")).await, "turns")
        .parse()
        .unwrap()
}

/// Waits (bounded) until the agent has finished `n` turns and is idle again.
async fn wait_turns(root: &Fid, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let idx = read(root, "session/s/agent/idx").await;
        if turns(root).await >= n && idx.contains("\tidle\n") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never {n} turns: {idx}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes `data` on a fresh open of `path` in Twrites of `piece` bytes at increasing
/// offsets (what a client with a small msize, or a pipe, sends); returns the first write
/// error and the clunk's result.
async fn write_in_pieces(
    root: &Fid,
    path: &str,
    data: &[u8],
    piece: usize,
) -> (Option<String>, Result<(), String>) {
    let f = ollie_testkit::client::open(root, path, om::OWRITE)
        .await
        .unwrap();
    let mut err = None;
    for (i, c) in data.chunks(piece).enumerate() {
        if let Err(e) = within(
            "write",
            f.write((i * piece) as u64, Bytes::copy_from_slice(c)),
        )
        .await
        {
            err.get_or_insert(e.to_string());
        }
    }
    let clunk = within("clunk", f.clunk()).await.map_err(|e| e.to_string());
    (err, clunk)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_is_what_one_open_writes() {
    let llm = FakeLlm::start(vec![
        text_reply("one", Duration::ZERO),
        text_reply("two", Duration::ZERO),
    ])
    .await;
    let (srv, work) = olliesrv("openai", &format!("{}/v1", llm.url()), "");
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;

    // 300 KB in 1000-byte Twrites: one turn, with the whole prompt.
    let big: String = (0..30_000).map(|i| format!("{:09}\n", i)).collect();
    let (err, clunk) = write_in_pieces(&root, &format!("{A}/prompt"), big.as_bytes(), 1000).await;
    assert_eq!((err, clunk), (None, Ok(())));
    wait_turns(&root, 1).await;
    assert_eq!(asked(&llm), [big]);
    eprintln!("a 300000-byte prompt in 300 Twrites: 1 turn");

    // 20 MB: the write that crosses 1 MiB fails with the size and the limit, the rest fail
    // too, the clunk queues nothing.
    let huge = vec![b'x'; 20 << 20];
    let (err, clunk) = write_in_pieces(&root, &format!("{A}/prompt"), &huge, 65_000).await;
    let err = err.expect("the 20 MB prompt was accepted");
    assert!(err.contains("over the limit of 1048576"), "{err}");
    assert!(err.contains("1105000"), "the size: {err}");
    assert!(!err.contains('\n'));
    assert_eq!(clunk, Ok(()));
    eprintln!("a 20 MB prompt: refused once ({err}); turns stay at 1");
    // A blank prompt: the clunk says nothing was queued.
    let (err, clunk) = write_in_pieces(&root, &format!("{A}/prompt"), b"  \n\n", 2).await;
    assert_eq!(err, None);
    assert!(
        clunk.as_ref().unwrap_err().contains("empty prompt"),
        "{clunk:?}"
    );
    // fifo writes follow the same rule; its read dequeues the prompt the fid wrote.
    let f = ollie_testkit::client::open(&root, &format!("{A}/fifo"), om::ORDWR)
        .await
        .unwrap();
    assert_eq!(
        rdwr(&root, "session/s/ctl", "pause").await.unwrap(),
        "paused\n"
    );
    within("w", f.write(0, Bytes::from_static(b"queued ")))
        .await
        .unwrap();
    within("w", f.write(7, Bytes::from_static(b"whole")))
        .await
        .unwrap();
    let got = within("read", f.read(0, 4096)).await.unwrap();
    assert_eq!(&got[..], b"queued whole");
    within("clunk", f.clunk()).await.unwrap();
    assert_eq!(
        rdwr(&root, "session/s/ctl", "resume").await.unwrap(),
        "resumed\n"
    );

    // None of the refused or dequeued prompts reached the model; a small one still does.
    write(&root, &format!("{A}/prompt"), "after\n")
        .await
        .unwrap();
    wait_turns(&root, 2).await;
    assert_eq!(asked(&llm).len(), 2);
    assert_eq!(asked(&llm)[1], "after\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_new_prompt_in_pieces_is_one_prompt() {
    let llm = FakeLlm::start(vec![text_reply("sub done", Duration::ZERO)]).await;
    let (srv, work) = olliesrv("openai", &format!("{}/v1", llm.url()), "");
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    let body: String = "fix the failing tests ".repeat(10_000);
    let req = format!("name=sub\nprompt={body}\\nthen report\n");
    let f = ollie_testkit::client::open(&root, "session/s/agent/new", om::ORDWR)
        .await
        .unwrap();
    within("write", f.write_all(0, req.as_bytes()))
        .await
        .unwrap();
    // The read queues the prompt and returns the sub-agent's reply.
    let reply = within("read", f.read_to_end()).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&reply), "sub done");
    assert_eq!(asked(&llm), [format!("{body}\nthen report")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_values_are_turns_and_only_the_newest_waits() {
    // The first turn is slow (its chunks 1 s apart), so values written meanwhile wait.
    let llm = FakeLlm::start(vec![
        text_reply("first", Duration::from_secs(1)),
        text_reply("second", Duration::ZERO),
        text_reply("framed", Duration::ZERO),
    ])
    .await;
    let (srv, work) = olliesrv("openai", &format!("{}/v1", llm.url()), "");
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    let feed = format!("{A}/feed");
    write(&root, &feed, "v1\n").await.unwrap();
    // Once v1's turn runs, three more values: only the newest becomes a turn.
    wait_for(&root, &format!("{A}/log"), "[[[user\nv1").await;
    for v in ["v2\n", "v3\n", "v4\n"] {
        write(&root, &feed, v).await.unwrap();
    }
    wait_turns(&root, 2).await;
    assert_eq!(asked(&llm), ["v1\n", "v4\n"]);
    // The same value again is no new value: no turn.
    write(&root, &feed, "v4\n").await.unwrap();
    // feed=off: a value is published to readers but is no turn.
    write(&root, &format!("{A}/cfg"), "feed=off").await.unwrap();
    let r = ollie_testkit::client::open(&root, &feed, om::OREAD)
        .await
        .unwrap();
    // (Its baseline is v4, the value at its open: the read returns v5 whenever it comes.)
    write(&root, &feed, "v5\n").await.unwrap();
    assert_eq!(&within("read", r.read(0, 4096)).await.unwrap()[..], b"v5\n");
    // feed_prompt frames the value (\n is a newline).
    write(
        &root,
        &format!("{A}/cfg"),
        "feed=turn\nfeed_prompt=Review this change:\\n{feed}",
    )
    .await
    .unwrap();
    write(&root, &feed, "v6\n").await.unwrap();
    wait_turns(&root, 3).await;
    assert_eq!(
        asked(&llm),
        ["v1\n", "v4\n", "Review this change:\nv6\n"],
        "v4 again and v5 (feed=off) made no turn"
    );
    let cfg = read(&root, &format!("{A}/cfg")).await;
    assert!(cfg.contains("feed=turn\n"), "{cfg}");
    assert!(
        cfg.contains("feed_prompt=Review this change:\\n{feed}\n"),
        "{cfg}"
    );
}
