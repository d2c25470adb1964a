//! The `replay` backend: plays a JSON-lines script of model turns, one per model request, in
//! order — for reproducible runs, demos and tests. Each line is an object with optional keys
//! `text`, `reasoning` and `tool_calls` (`[{"name": …, "arguments": {…}}]`); unknown keys are
//! errors naming the line. Running past the end is an error (shown in the chat).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Mutex;

use serde::Deserialize;
use serde_json::Value;

use super::{Backend, BackendError, Event, ModelReply, ModelRequest, Sink, ToolCall, Usage};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Turn {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Vec<Call>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    name: String,
    #[serde(default)]
    arguments: Value,
}

/// A replay script with its own position.
#[derive(Debug)]
pub struct Replay {
    turns: Vec<Turn>,
    next: Mutex<usize>,
    name: String,
}

impl Replay {
    /// Reads and validates the script.
    pub fn load(name: &str, path: &Path) -> Result<Replay, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("replay backend {name}: cannot read {}: {e}", path.display()))?;
        Self::parse(name, &text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses script text.
    pub fn parse(name: &str, text: &str) -> Result<Replay, String> {
        let mut turns = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let t: Turn = serde_json::from_str(line)
                .map_err(|e| format!("replay backend {name}: line {}: {e}", i + 1))?;
            turns.push(t);
        }
        Ok(Replay {
            turns,
            next: Mutex::new(0),
            name: name.to_owned(),
        })
    }
}

impl Backend for Replay {
    fn call<'a>(
        &'a self,
        _req: &'a ModelRequest,
        sink: Sink<'a>,
    ) -> Pin<Box<dyn Future<Output = Result<ModelReply, BackendError>> + Send + 'a>> {
        Box::pin(async move {
            let (i, turn) = {
                let mut n = self
                    .next
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let i = *n;
                let Some(t) = self.turns.get(i).cloned() else {
                    return Err(BackendError::Fatal(format!(
                        "replay backend {}: the script has no turn {} (it has {})",
                        self.name,
                        i + 1,
                        self.turns.len()
                    )));
                };
                *n += 1;
                (i, t)
            };
            let mut reply = ModelReply::default();
            if let Some(r) = turn.reasoning {
                sink(Event::Reasoning(r.clone()));
                reply.reasoning = r;
            }
            if let Some(t) = turn.text {
                // Streamed in a few pieces, like a real model.
                let chars: Vec<char> = t.chars().collect();
                for piece in chars.chunks(16) {
                    sink(Event::Text(piece.iter().collect()));
                    tokio::task::yield_now().await;
                }
                reply.text = t;
            }
            for (k, c) in turn.tool_calls.into_iter().enumerate() {
                let call = ToolCall {
                    id: format!("replay-{}-{}", i + 1, k + 1),
                    name: c.name,
                    arguments: if c.arguments.is_null() {
                        Value::Object(Default::default())
                    } else {
                        c.arguments
                    },
                };
                sink(Event::ToolCall(call.clone()));
                reply.tool_calls.push(call);
            }
            let usage = Usage {
                input_tokens: 0,
                output_tokens: (reply.text.len() / 4) as u64,
                cost_usd: None,
            };
            sink(Event::Usage(usage));
            reply.usage = usage;
            Ok(reply)
        })
    }

    /// A script has no models to choose from; it lists the one pseudo-model `replay`.
    fn list_models<'a>(
        &'a self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<String>, BackendError>> + Send + 'a>> {
        Box::pin(async { Ok(vec!["replay".to_owned()]) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn plays_turns_in_order_then_errors() {
        let r = Replay::parse(
            "demo",
            "{\"reasoning\":\"think\",\"text\":\"hello there, this is long enough\"}\n\n{\"tool_calls\":[{\"name\":\"execute_code\",\"arguments\":{\"language\":\"bash\",\"code\":\"ls\"}}]}\n",
        )
        .unwrap();
        let req = ModelRequest::default();
        let mut events = Vec::new();
        let reply = r.call(&req, &mut |e| events.push(e)).await.unwrap();
        assert_eq!(reply.text, "hello there, this is long enough");
        assert_eq!(reply.reasoning, "think");
        assert!(events.len() >= 3);
        let reply = r.call(&req, &mut |_| {}).await.unwrap();
        assert_eq!(reply.tool_calls[0].name, "execute_code");
        assert_eq!(reply.tool_calls[0].arguments["code"], "ls");
        let e = r.call(&req, &mut |_| {}).await.unwrap_err();
        assert!(e.to_string().contains("no turn 3 (it has 2)"), "{e}");
    }

    #[test]
    fn bad_lines_are_named() {
        let e = Replay::parse("d", "{\"text\":\"a\"}\n{\"txt\":1}\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }
}
