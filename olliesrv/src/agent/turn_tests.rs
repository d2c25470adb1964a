//! The agent loop's unit tests (a file of their own to keep turn.rs readable).

use super::*;
use serde_json::json;

fn spec(n: &str) -> ToolSpec {
    ToolSpec {
        name: n.into(),
        description: String::new(),
        parameters: Value::Null,
    }
}

fn call(n: &str, args: Value) -> ToolCall {
    ToolCall {
        id: n.into(),
        name: n.into(),
        arguments: args,
    }
}

/// The prefetch's retry: `ask_again` with an answer that fails `fails` times, on paused
/// time; what it returned, how often it asked, and how long it paused in all.
async fn asked(fails: u32, stop: bool) -> (Result<u32, String>, u32, Duration) {
    let n = std::cell::Cell::new(0u32);
    let t0 = tokio::time::Instant::now();
    let r = ask_again(
        PREFETCH_TRIES,
        PREFETCH_PAUSE,
        || stop,
        || {
            n.set(n.get() + 1);
            let k = n.get();
            async move {
                if k <= fails {
                    Err(format!("failure {k}"))
                } else {
                    Ok(k)
                }
            }
        },
    )
    .await;
    (r, n.get(), t0.elapsed())
}

#[tokio::test(start_paused = true)]
async fn the_tool_list_is_asked_again_after_a_failure() {
    assert_eq!(asked(0, false).await, (Ok(1), 1, Duration::ZERO));
    // A toolsrv that died while asked: the second question has the list.
    assert_eq!(asked(1, false).await, (Ok(2), 2, PREFETCH_PAUSE));
    assert_eq!(
        asked(PREFETCH_TRIES - 1, false).await,
        (Ok(PREFETCH_TRIES), PREFETCH_TRIES, PREFETCH_PAUSE * 6)
    );
    // One that stays down fails the turn after the last question, with its failure.
    assert_eq!(
        asked(u32::MAX, false).await,
        (
            Err(format!("failure {PREFETCH_TRIES}")),
            PREFETCH_TRIES,
            PREFETCH_PAUSE * 6
        )
    );
    // A killed agent is not asked for again.
    assert_eq!(
        asked(u32::MAX, true).await,
        (Err("failure 1".into()), 1, Duration::ZERO)
    );
}

#[test]
fn tool_calls_written_as_text_are_recognised() {
    let tools = [spec("execute_code"), spec("file_read")];
    let yes = [
        "```json\n{\"name\": \"execute_code\", \"arguments\": {\"code\": \"ls\"}}\n```",
        "<tool_call>\n{\"name\":\"file_read\",\"arguments\":{\"path\":\"a\"}}\n</tool_call>",
        "I'll run execute_code({\"language\": \"sh\", \"code\": \"ls\"})",
        "[TOOL_CALLS] something",
        "<function=file_read>{\"path\":\"x\"}</function>",
    ];
    for t in yes {
        assert!(text_tool_call(t, &tools).is_some(), "{t}");
    }
    assert_eq!(
        text_tool_call("{\"name\": \"file_read\", \"input\": {}}", &tools).as_deref(),
        Some("file_read")
    );
    let no = [
        "I ran execute_code and the tests pass.",
        "The file_read tool showed the config; done.",
        "{\"name\": \"alice\", \"arguments\": 3}",
        "",
    ];
    for t in no {
        assert_eq!(text_tool_call(t, &tools), None, "{t}");
    }
}

#[test]
fn only_consecutive_read_only_calls_share_a_run() {
    let r = call("file_read", json!({}));
    let w = call("file_write", json!({}));
    let bg = call("file_read", json!({"background": true}));
    let calls = [r.clone(), r.clone(), w.clone(), r.clone(), bg, r.clone()];
    let sizes: Vec<usize> = runs(&calls).iter().map(|r| r.len()).collect();
    assert_eq!(sizes, [2, 1, 1, 1, 1]);
    assert!(runs(&[]).is_empty());
}
