//! Context compaction: the older part of an agent's history is replaced by a summary the
//! model writes, so a long conversation keeps going within the model's context window.
//!
//! It runs automatically before a model call once the last request used
//! `compact_at` × `context_limit` tokens, when the backend says the context overflowed
//! (then the call is retried once), and on `ctl compact`. The last few messages are kept
//! verbatim (cut where no tool result would lose its call; fewer when they would fill more
//! than a quarter of the context window); everything before them goes to
//! the model as a transcript with the instruction to summarize, and the history becomes one
//! user message holding the summary followed by the kept messages. The plan is not part of
//! the history: it stays in the `plan` file and is shown to the model again after a
//! compaction. The chat keeps everything; an `info` block records the compaction and the
//! summary.
//!
//! The profile's `pre_compact` hooks run first: one exiting 2 skips the compaction (an error
//! naming the hook's reason), and what they print is added to the instruction to
//! summarize. The `post_compact` hooks run after it: what they print follows the summary in
//! the history.

use std::sync::Arc;

use serde_json::Value;

use crate::agent::history::{clip, message_json, message_of, remember};
use crate::backend::{Backend, BackendError, Message, ModelRequest, Role};
use crate::state::{Agent, Registry};
use crate::util::lock;

/// Messages kept verbatim after the summary (a few more when the tail would otherwise begin
/// with tool results: their call is kept with them).
pub const KEEP_TAIL: usize = 6;
/// The longest transcript sent for summarizing, in characters, when the context limit is
/// unknown (about 100k tokens).
const MAX_TRANSCRIPT: usize = 400_000;
/// The most tokens a summary may take (within every API's output limit).
const MAX_SUMMARY_TOKENS: u32 = 4096;
/// Each message in the transcript is cut to this many characters.
const MAX_MESSAGE: usize = 8_000;

const SUMMARY_SYSTEM: &str = "You compress the history of a coding agent's session into a summary that lets the agent continue the work without the original messages.";

const SUMMARY_INSTRUCTION: &str = "Summarize the conversation above for the agent that will continue it. Keep: the user's requests and constraints, decisions made and why, files read or changed (with paths), commands run and their important results or errors, what is done, and what remains to do next. Be concise and factual; use short bullet points. Do not invent anything.";

/// What a compaction did.
#[derive(Debug)]
pub struct Compacted {
    /// Messages replaced by the summary.
    pub summarized: usize,
    /// Messages kept after it.
    pub kept: usize,
}

/// Where the kept tail starts: the last `keep` messages, and never at a tool result: the
/// tail then starts at the assistant message that made the call, so that a result the
/// model has not answered yet (a compaction in the middle of a turn) stays whole, with its
/// call, instead of being summarized away (the model would make the call again).
fn tail_start(msgs: &[Message], keep: usize) -> usize {
    let mut i = msgs.len().saturating_sub(keep);
    while i > 0 && i < msgs.len() && msgs[i].role == Role::Tool {
        i -= 1;
    }
    i
}

/// The longest summary asked for, in tokens: an eighth of the window (so that the summary,
/// the kept tail and the system prompt fit a small one), at most [`MAX_SUMMARY_TOKENS`].
fn summary_tokens(context_limit: Option<u64>) -> u32 {
    context_limit
        .map_or(MAX_SUMMARY_TOKENS, |l| {
            u32::try_from(l / 8).unwrap_or(u32::MAX)
        })
        .clamp(64, MAX_SUMMARY_TOKENS)
}

/// Where the summarized part of `msgs` ends and the kept tail starts: the last
/// [`KEEP_TAIL`] messages (all but the last when that would keep everything), fewer when they
/// hold more than a quarter of a `context_limit`-token window (at about four characters a
/// token: as many characters as the window has tokens), down to the last one; never at a
/// tool result ([`tail_start`]).
fn cut_point(msgs: &[Message], context_limit: Option<u64>) -> usize {
    let mut cut = tail_start(msgs, KEEP_TAIL);
    if cut == 0 && !msgs.is_empty() {
        cut = tail_start(msgs, 1);
    }
    if let Some(limit) = context_limit {
        let mut keep = msgs.len() - cut;
        while keep > 1 && chars(&msgs[cut..]) as u64 > limit {
            keep -= 1;
            cut = cut.max(tail_start(msgs, keep));
        }
    }
    cut
}

/// The characters of `msgs`' texts and call arguments.
fn chars(msgs: &[Message]) -> usize {
    msgs.iter()
        .map(|m| {
            m.content.len()
                + m.tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.arguments.to_string().len())
                    .sum::<usize>()
        })
        .sum()
}

/// The messages as a plain-text transcript (no tool-call structure, so any backend can
/// summarize it), at most `max` characters, dropping the oldest first.
fn transcript(msgs: &[Message], max: usize) -> String {
    let mut parts: Vec<String> = msgs
        .iter()
        .map(|m| {
            let mut t = match m.role {
                Role::User => format!("USER:\n{}", clip(&m.content, MAX_MESSAGE)),
                Role::Assistant => format!("ASSISTANT:\n{}", clip(&m.content, MAX_MESSAGE)),
                Role::Tool => format!("TOOL RESULT:\n{}", clip(&m.content, MAX_MESSAGE)),
            };
            for c in &m.tool_calls {
                t.push_str(&format!(
                    "\n[calls {} {}]",
                    c.name,
                    clip(&c.arguments.to_string(), MAX_MESSAGE)
                ));
            }
            t
        })
        .collect();
    let mut total: usize = parts.iter().map(|p| p.len() + 2).sum();
    let mut dropped = 0;
    while total > max && parts.len() > 1 {
        total -= parts[0].len() + 2;
        parts.remove(0);
        dropped += 1;
    }
    let mut out = String::new();
    if dropped > 0 {
        out.push_str(&format!(
            "[{dropped} older messages did not fit and are left out]\n\n"
        ));
    }
    out.push_str(&parts.join("\n\n"));
    out
}

/// Compacts `a`'s history with `backend`. The caller holds `a.history_lock`.
pub async fn compact(
    reg: &Arc<Registry>,
    a: &Arc<Agent>,
    backend: &Arc<dyn Backend>,
    model: Option<String>,
    context_limit: Option<u64>,
    why: &str,
) -> Result<Compacted, String> {
    let (msgs, _) = reg
        .store
        .read_history(&a.session_id, &a.id, |v| message_of(&v));
    let cut = cut_point(&msgs, context_limit);
    if msgs.is_empty() {
        return Err("nothing to compact: the history is empty".to_owned());
    }
    if cut == 0 {
        return Err("nothing to compact: the history holds only the latest message".to_owned());
    }
    let config = reg.config();
    let pre = crate::agent::hooks::fire(
        reg,
        a,
        &config,
        crate::agent::hooks::Event::PreCompact {
            reason: why,
            messages: msgs.len(),
        },
    )
    .await;
    if let Some(r) = pre.blocked {
        return Err(format!("blocked by pre_compact hook: {r}"));
    }
    let (old, tail) = msgs.split_at(cut);
    // About four characters per token; use half the window for the transcript.
    let max = context_limit.map_or(MAX_TRANSCRIPT, |l| {
        (l as usize).saturating_mul(2).max(4_000)
    });
    let req = ModelRequest {
        model,
        system: Some(SUMMARY_SYSTEM.to_owned()),
        messages: vec![Message::user(format!(
            "{}\n\n---\n{SUMMARY_INSTRUCTION}{}",
            transcript(old, max),
            pre.context
                .map(|c| format!("\n\nAlso follow these instructions for the summary:\n{c}"))
                .unwrap_or_default()
        ))],
        max_tokens: Some(summary_tokens(context_limit)),
        ..ModelRequest::default()
    };
    let mut attempt = 0;
    let reply = loop {
        let r = backend.call(&req, &mut |_| {}).await;
        {
            let mut st = lock(&a.stats);
            st.requests += 1;
            if let Ok(r) = &r {
                st.tokens_in += r.usage.input_tokens;
                st.tokens_out += r.usage.output_tokens;
                st.cost_usd += r.usage.cost_usd.unwrap_or(0.0);
            }
        }
        match r {
            Ok(r) => break r,
            Err(BackendError::RateLimited { .. } | BackendError::Transient(_))
                if attempt < super::RETRIES =>
            {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(500 << attempt)).await;
            }
            Err(e) => return Err(format!("compaction failed: {e}")),
        }
    };
    let summary = reply.text.trim();
    if summary.is_empty() {
        return Err("compaction failed: the model returned an empty summary".to_owned());
    }
    let mut lines: Vec<Value> = vec![message_json(&Message::user(format!(
        "<conversation-summary>\n{summary}\n</conversation-summary>\nThe earlier conversation was compacted into the summary above; continue from it."
    )))];
    lines.extend(tail.iter().map(message_json));
    reg.store
        .replace_history(&a.session_id, &a.id, &lines)
        .map_err(|e| crate::error_chain(&e))?;
    {
        let chars: usize = lines.iter().map(|l| l.to_string().len()).sum();
        lock(&a.stats).context_tokens = (chars / 4) as u64;
    }
    a.say(
        "info",
        "compacted",
        &format!(
            "compacted the conversation ({why}): {} messages summarized, {} kept\n\n{summary}",
            old.len(),
            tail.len()
        ),
    )?;
    let post = crate::agent::hooks::fire(
        reg,
        a,
        &config,
        crate::agent::hooks::Event::PostCompact {
            reason: why,
            summarized: old.len(),
            kept: tail.len(),
            summary,
        },
    )
    .await;
    for n in post.notes("post_compact") {
        remember(reg, a, &Message::user(n))?;
    }
    Ok(Compacted {
        summarized: old.len(),
        kept: tail.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ToolCall;

    fn m(role: Role, c: &str) -> Message {
        Message {
            role,
            content: c.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    #[test]
    fn the_tail_never_starts_with_a_tool_result() {
        let msgs = vec![
            m(Role::User, "a"),
            m(Role::Assistant, "b"),
            m(Role::Tool, "c"),
            m(Role::Tool, "d"),
            m(Role::Assistant, "e"),
        ];
        // The results' call is kept with them.
        assert_eq!(tail_start(&msgs, 3), 1);
        assert_eq!(tail_start(&msgs, 4), 1);
        assert_eq!(tail_start(&msgs, 1), 4);
        assert_eq!(tail_start(&msgs, 10), 0);
        assert_eq!(tail_start(&msgs, 0), 5);
        // A turn's call and its result not yet answered: both kept, whatever `keep` says.
        let turn = [
            m(Role::User, "p"),
            m(Role::Assistant, "call"),
            m(Role::Tool, "r"),
        ];
        assert_eq!(tail_start(&turn, 1), 1);
        assert_eq!(tail_start(&turn, 2), 1);
    }

    #[test]
    fn the_tail_shrinks_to_a_quarter_of_the_window() {
        let big = "x".repeat(400);
        let msgs: Vec<Message> = (0..10)
            .map(|i| {
                m(
                    if i % 2 == 0 {
                        Role::User
                    } else {
                        Role::Assistant
                    },
                    &big,
                )
            })
            .collect();
        // No window, or a large one: the last six.
        assert_eq!(cut_point(&msgs, None), 4);
        assert_eq!(cut_point(&msgs, Some(128_000)), 4);
        // 2048 tokens: a quarter is about 2048 characters, five messages of 400.
        assert_eq!(cut_point(&msgs, Some(2048)), 5);
        assert_eq!(cut_point(&msgs, Some(1000)), 8);
        // Never fewer than the last message, however small the window.
        assert_eq!(cut_point(&msgs, Some(10)), 9);
        // A tool result keeps its call, also when that is over the budget.
        let mut call = m(Role::Assistant, "");
        call.tool_calls.push(ToolCall {
            id: "c".into(),
            name: "file_read".into(),
            arguments: serde_json::json!({"path": big}),
        });
        let turn = [m(Role::User, &big), call, m(Role::Tool, &big)];
        assert_eq!(cut_point(&turn, Some(10)), 1);
        // Everything would be kept: all but the last is summarized.
        assert_eq!(cut_point(&msgs[..3], None), 2);
        assert_eq!(cut_point(&[], Some(10)), 0);
    }

    #[test]
    fn summaries_take_an_eighth_of_the_window_within_bounds() {
        assert_eq!(summary_tokens(Some(2048)), 256);
        assert_eq!(summary_tokens(Some(128_000)), MAX_SUMMARY_TOKENS);
        assert_eq!(summary_tokens(None), MAX_SUMMARY_TOKENS);
        assert_eq!(summary_tokens(Some(100)), 64);
        assert_eq!(summary_tokens(Some(u64::MAX)), MAX_SUMMARY_TOKENS);
    }

    #[test]
    fn transcripts_drop_the_oldest_and_say_so() {
        let mut a = m(Role::Assistant, "calling");
        a.tool_calls.push(ToolCall {
            id: "1".into(),
            name: "file_read".into(),
            arguments: serde_json::json!({"path": "x"}),
        });
        let msgs = vec![m(Role::User, &"x".repeat(100)), a, m(Role::Tool, "ok")];
        let full = transcript(&msgs, 10_000);
        assert!(full.starts_with("USER:\n"), "{full}");
        assert!(
            full.contains("[calls file_read {\"path\":\"x\"}]"),
            "{full}"
        );
        let cut = transcript(&msgs, 80);
        assert!(cut.starts_with("[1 older messages"), "{cut}");
        assert!(!cut.contains("USER:"), "{cut}");
        assert!(cut.ends_with("TOOL RESULT:\nok"), "{cut}");
    }

    #[test]
    fn clipping_respects_characters() {
        let s = "é".repeat(10);
        let c = clip(&s, 5);
        assert!(c.starts_with("éé…"), "{c}");
        assert!(c.contains("more bytes"));
    }
}
