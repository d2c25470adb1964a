//! What a tool call's reply from toolsrv comes to for the model and the chat: the result
//! text (with a line on the sandbox when it refused something: [`super::sandbox::hint`]),
//! whether it succeeded, and the attributes of the chat's `tool_result` marker.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::config::Profile;

/// What one tool call came to.
#[derive(Debug, Clone)]
pub(super) struct Outcome {
    /// The result text for the model.
    pub(super) text: String,
    /// Whether it succeeded (ran and exited 0, or started in the background).
    pub(super) ok: bool,
    /// Attributes for the chat's `tool_result` marker (pid, exit, record).
    pub(super) attrs: String,
}

impl Outcome {
    pub(super) fn error(e: impl std::fmt::Display) -> Outcome {
        Outcome {
            text: format!("error: {e}"),
            ok: false,
            attrs: String::new(),
        }
    }
}

/// [`outcome_of_reply`] with, for a call that failed, the sandbox's hint for what its output
/// shows (`profile` and `policies` say what the agent may ask for).
pub(super) fn of_reply(
    reply: &str,
    profile: Option<&Profile>,
    policies: &BTreeMap<String, String>,
) -> Outcome {
    let mut o = outcome_of_reply(reply);
    if !o.ok
        && let Some(h) = super::sandbox::hint(reply, profile, policies)
    {
        if !o.text.is_empty() && !o.text.ends_with('\n') {
            o.text.push('\n');
        }
        o.text.push_str(&h);
    }
    o
}

/// Splits a `record=1` reply: the first line is `{"pid","record"|"error"}`, the rest the
/// result text.
fn outcome_of_reply(reply: &str) -> Outcome {
    let (head, text) = reply.split_once('\n').unwrap_or((reply, ""));
    let Ok(meta) = serde_json::from_str::<Value>(head) else {
        // Not the framed form: the whole reply is the result.
        return Outcome {
            text: reply.to_owned(),
            ok: true,
            attrs: String::new(),
        };
    };
    let pid = meta.get("pid").and_then(Value::as_u64);
    let record = meta.get("record").filter(|r| !r.is_null());
    let exit = record.and_then(|r| r.get("exit"));
    let code = exit.and_then(|e| e.get("code")).and_then(Value::as_i64);
    let signal = exit.and_then(|e| e.get("signal")).and_then(Value::as_i64);
    let mut attrs = Vec::new();
    if let Some(p) = pid {
        attrs.push(format!("pid={p}"));
    }
    match (code, signal) {
        (Some(c), _) => attrs.push(format!("exit={c}")),
        (None, Some(s)) => attrs.push(format!("signal={s}")),
        _ => attrs.push("exit=none".to_owned()),
    }
    if let Some(r) = record {
        attrs.push(format!("record={r}"));
    } else if let Some(e) = meta.get("error").and_then(Value::as_str) {
        attrs.push(format!("error={}", ollie_link::escape_value(e)));
    }
    let text = match meta.get("error").and_then(Value::as_str) {
        Some(e) if text.is_empty() => format!("error: the tool did not run: {e}"),
        _ => text.to_owned(),
    };
    Outcome {
        text,
        ok: code == Some(0),
        attrs: attrs.join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framed_replies_give_exit_and_record() {
        let o = outcome_of_reply(
            "{\"pid\":3,\"record\":{\"exit\":{\"code\":0},\"argv\":[\"sh\"]}}\nhello\n",
        );
        assert!(o.ok);
        assert_eq!(o.text, "hello\n");
        assert!(o.attrs.starts_with("pid=3 exit=0 record={"), "{}", o.attrs);
        let o = outcome_of_reply("{\"pid\":4,\"record\":{\"exit\":{\"code\":2}}}\nno\n");
        assert!(!o.ok);
        let o =
            outcome_of_reply("{\"pid\":5,\"record\":null,\"error\":\"landlock: not supported\"}\n");
        assert!(!o.ok);
        assert_eq!(
            o.text,
            "error: the tool did not run: landlock: not supported"
        );
        assert!(o.attrs.contains("exit=none"), "{}", o.attrs);
        assert!(
            o.attrs.contains("error=landlock: not supported"),
            "{}",
            o.attrs
        );
        let o = outcome_of_reply("plain text\nmore\n");
        assert_eq!(o.text, "plain text\nmore\n");
        let o = outcome_of_reply("{\"pid\":6,\"record\":{\"exit\":{\"signal\":9}}}\n");
        assert!(!o.ok);
        assert!(o.attrs.contains("signal=9"), "{}", o.attrs);
    }
}
