//! The agent's history as the model sees it: messages to and from their stored JSON form,
//! appended durably to the store, and the clipping of long texts shown back to a model.

use serde_json::{Value, json};

use crate::backend::{Message, Role, ToolCall};
use crate::state::store::Sync;
use crate::state::{Agent, Registry};

/// At most `max` bytes of `s` (on a character boundary), with a note of what was cut.
pub(crate) fn clip(s: &str, max: usize) -> String {
    let kept = ollie_link::text::prefix_bytes(s, max);
    if kept.len() == s.len() {
        return s.to_owned();
    }
    format!("{kept}… [{} more bytes]", s.len() - kept.len())
}

pub(crate) fn message_json(m: &Message) -> Value {
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut v = json!({"role": role, "content": m.content});
    if !m.tool_calls.is_empty() {
        v["tool_calls"] = Value::Array(
            m.tool_calls
                .iter()
                .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
                .collect(),
        );
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = Value::from(id.clone());
    }
    v
}

pub(crate) fn message_of(v: &Value) -> Option<Message> {
    let role = match v.get("role")?.as_str()? {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        _ => return None,
    };
    let tool_calls = v
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter_map(|c| {
                    Some(ToolCall {
                        id: c.get("id")?.as_str()?.to_owned(),
                        name: c.get("name")?.as_str()?.to_owned(),
                        arguments: c.get("arguments").cloned().unwrap_or(Value::Null),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Message {
        role,
        content: v
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        tool_calls,
        tool_call_id: v
            .get("tool_call_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

pub(crate) fn remember(reg: &Registry, a: &Agent, m: &Message) -> Result<(), String> {
    remember_sync(reg, a, m, Sync::Now)
}

/// Makes what was appended to the agent's chat and history with [`Sync::WithNext`] durable,
/// the two files' syncs side by side: one wait for the disk instead of two in a row.
pub(crate) fn sync_chat_and_history(reg: &Registry, a: &Agent) -> Result<(), String> {
    reg.store
        .sync_chat_and_history(&a.session_id, &a.id)
        .map_err(|e| crate::error_chain(&e))
}

pub(crate) fn remember_sync(
    reg: &Registry,
    a: &Agent,
    m: &Message,
    sync: Sync,
) -> Result<(), String> {
    reg.store
        .append_history(&a.session_id, &a.id, &message_json(m), sync)
        .map_err(|e| crate::error_chain(&e))
}
