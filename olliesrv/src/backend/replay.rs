//! The `replay` backend: plays a JSON-lines script of model turns, one per model request, in
//! order — for reproducible runs, demos and tests. Each line is an object with optional keys
//! `text`, `reasoning` and `tool_calls` (`[{"name": …, "arguments": {…}}]`); unknown keys are
//! errors naming the line. Running past the end is an error (shown in the chat), unless the
//! script file was changed since it was read: then it is read again and plays from its first
//! turn. `invalidate` on the root `ctl` starts every agent's script over.

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
    /// The turns, the index of the next one, and the file's stamp when they were read.
    script: Mutex<(Vec<Turn>, usize, Stamp)>,
    name: String,
    /// The script's file.
    source: Option<std::path::PathBuf>,
}

/// A file's modification time and length.
type Stamp = (Option<std::time::SystemTime>, u64);

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path).map_or((None, 0), |m| (m.modified().ok(), m.len()))
}

impl Replay {
    /// Reads and validates the script.
    pub fn load(name: &str, path: &Path) -> Result<Replay, String> {
        let at = stamp(path);
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("replay backend {name}: cannot read {}: {e}", path.display()))?;
        let mut r = Self::parse(name, &text).map_err(|e| format!("{}: {e}", path.display()))?;
        r.source = Some(path.to_owned());
        if let Ok(s) = r.script.get_mut() {
            s.2 = at;
        }
        Ok(r)
    }

    /// The script read again when its file changed since `seen`, with its new stamp.
    fn reread(&self, seen: Stamp) -> Option<(Vec<Turn>, Stamp)> {
        let path = self.source.as_ref()?;
        let now = stamp(path);
        if now == seen {
            return None;
        }
        let text = std::fs::read_to_string(path).ok()?;
        let turns = Self::parse(&self.name, &text)
            .ok()?
            .script
            .into_inner()
            .ok()?
            .0;
        Some((turns, now))
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
            script: Mutex::new((turns, 0, (None, 0))),
            name: name.to_owned(),
            source: None,
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
                let mut s = self
                    .script
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if s.1 >= s.0.len()
                    && let Some((turns, at)) = self.reread(s.2)
                {
                    *s = (turns, 0, at);
                }
                let (turns, n, _) = &mut *s;
                let i = *n;
                let Some(t) = turns.get(i).cloned() else {
                    return Err(BackendError::Fatal(format!(
                        "replay backend {}: the script has no turn {} (it has {}); edit it, or write invalidate to ctl to start it over",
                        self.name,
                        i + 1,
                        turns.len()
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

    #[tokio::test]
    async fn an_edited_script_starts_over_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("turns.jsonl");
        std::fs::write(&path, "{\"text\":\"one\"}\n").unwrap();
        let r = Replay::load("demo", &path).unwrap();
        let req = ModelRequest::default();
        assert_eq!(r.call(&req, &mut |_| {}).await.unwrap().text, "one");
        let e = r.call(&req, &mut |_| {}).await.unwrap_err();
        assert!(
            e.to_string().contains("edit it, or write invalidate"),
            "{e}"
        );
        // Edited (another length, so the stamp differs even within the clock's resolution).
        std::fs::write(&path, "{\"text\":\"two\"}\n{\"text\":\"three\"}\n").unwrap();
        assert_eq!(r.call(&req, &mut |_| {}).await.unwrap().text, "two");
        assert_eq!(r.call(&req, &mut |_| {}).await.unwrap().text, "three");
        assert!(r.call(&req, &mut |_| {}).await.is_err());
    }

    #[test]
    fn bad_lines_are_named() {
        let e = Replay::parse("d", "{\"text\":\"a\"}\n{\"txt\":1}\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }
}
