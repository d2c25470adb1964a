//! Model backends: one streaming call per model request.
//!
//! A backend turns a [`ModelRequest`] (system prompt, messages, tool schemas, generation
//! parameters) into a stream of [`Event`]s handed to a sink as they arrive (text and
//! reasoning deltas, complete tool calls, usage), and returns the whole [`ModelReply`] at the
//! end. The agent loop (`turn.rs`) owns everything else: chat, tools, retries, accounting.
//!
//! Kinds: `replay` (a JSON-lines script of turns, for offline runs and tests); `openai`,
//! `anthropic` and `ollama` speak their HTTP streaming APIs.
//!
//! [`ModelRequest`]: crate::backend::ModelRequest
//! [`Event`]: crate::backend::Event
//! [`ModelReply`]: crate::backend::ModelReply

pub mod anthropic;
mod framing;
pub(crate) mod http;
pub mod ollama;
pub mod openai;
pub mod replay;
pub mod select;
#[cfg(test)]
mod testserver;

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
    /// The result of a tool call (`tool_call_id` says which).
    Tool,
}

/// One tool call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The backend's id for it (generated when the backend has none).
    pub id: String,
    pub name: String,
    /// The arguments (a JSON object).
    pub arguments: Value,
}

/// One message of the conversation as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// Assistant messages: the tool calls it made.
    pub tool_calls: Vec<ToolCall>,
    /// Tool messages: the call answered.
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn user(content: impl Into<String>) -> Message {
        Message {
            role: Role::User,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments.
    pub parameters: Value,
}

/// One request to a model.
#[derive(Debug, Clone, Default)]
pub struct ModelRequest {
    pub model: Option<String>,
    pub system: Option<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_tokens: Option<u32>,
    /// Whether the model must call a tool in this reply (see [`ToolChoice`]).
    pub tool_choice: ToolChoice,
    /// Text the reply is to start with, sent as a last, unfinished assistant message that
    /// the server continues (llama-server does; the `openai` kind only).
    pub prefill: Option<String>,
}

/// Whether the model may answer in text or must call one of the tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (every API's default).
    #[default]
    Auto,
    /// The reply must be a tool call: OpenAI's `tool_choice: "required"`, Anthropic's
    /// `{"type": "any"}`. Ignored when the request offers no tools.
    Required,
}

/// The context window, in tokens, that a server's overflow message states, if it states
/// one: llama.cpp's "exceeds the available context size (2048 tokens)", OpenAI's "maximum
/// context length is 8192 tokens", Anthropic's "210000 tokens > 200000 maximum". The agent
/// loop compacts to fit it when it is smaller than the limit it assumed.
pub fn overflow_window(message: &str) -> Option<u64> {
    const AROUND: [(&str, &str); 3] = [
        ("context size (", " tokens"),
        ("maximum context length is ", " tokens"),
        (" tokens > ", " maximum"),
    ];
    let lower = message.to_lowercase();
    AROUND.iter().find_map(|(before, after)| {
        let at = lower.find(before)? + before.len();
        let rest = &lower[at..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if !rest[digits..].starts_with(after) {
            return None;
        }
        rest[..digits].parse().ok().filter(|n| *n > 0)
    })
}

/// Token counts a backend reports.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Cost the backend itself reported, if any.
    pub cost_usd: Option<f64>,
}

/// What streams out of a call.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Text(String),
    Reasoning(String),
    ToolCall(ToolCall),
    Usage(Usage),
}

/// The whole reply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelReply {
    pub text: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    /// The server stopped the reply at its token limit (`max_tokens`, or the context's end),
    /// so the text may end mid-sentence and a tool call may lack its arguments.
    pub truncated: bool,
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// Rate limited; retry after this many seconds (if the server said).
    #[error("rate limited{}", .retry_after.map(|s| format!(" (retry after {s} s)")).unwrap_or_default())]
    RateLimited { retry_after: Option<u64> },
    /// A server error or a dropped stream: worth a bounded retry.
    #[error("{0}")]
    Transient(String),
    /// The request is too long for the model's context.
    #[error("context overflow: {0}")]
    ContextOverflow(String),
    /// Anything else (bad request, auth, the end of a replay script): not retried.
    #[error("{0}")]
    Fatal(String),
}

/// A sink for streamed events.
pub type Sink<'a> = &'a mut (dyn FnMut(Event) + Send);

/// A model backend.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Streams one reply.
    fn call<'a>(
        &'a self,
        req: &'a ModelRequest,
        sink: Sink<'a>,
    ) -> Pin<Box<dyn Future<Output = Result<ModelReply, BackendError>> + Send + 'a>>;

    /// The models the backend offers, as its server lists them (one request; `models` and
    /// `ctl models` show the result).
    fn list_models<'a>(
        &'a self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<String>, BackendError>> + Send + 'a>>;

    /// The context window of `model` in tokens, when the server tells it (asked once per
    /// backend and remembered); `None` when it does not.
    fn context_limit<'a>(
        &'a self,
        model: &'a str,
    ) -> Pin<Box<dyn Future<Output = Option<u64>> + Send + 'a>> {
        let _ = model;
        Box::pin(async { None })
    }
}

#[cfg(test)]
mod tests {
    use super::overflow_window;

    #[test]
    fn the_window_an_overflow_message_states() {
        for (message, want) in [
            (
                "local: http 400: request (2138 tokens) exceeds the available context size (2048 tokens), try increasing it",
                Some(2048),
            ),
            (
                "openai: http 400: This model's maximum context length is 8192 tokens. However, your messages resulted in 9001 tokens.",
                Some(8192),
            ),
            (
                "claude: http 400: prompt is too long: 210000 tokens > 200000 maximum",
                Some(200_000),
            ),
            // Named without a number, or a number that is not the window.
            ("ollama: the input length exceeds the context length", None),
            (
                "request (2138 tokens) exceeds the available context size",
                None,
            ),
            ("context size (lots of tokens)", None),
            ("context size (0 tokens)", None),
            ("context size (99999999999999999999999 tokens)", None),
            ("", None),
        ] {
            assert_eq!(overflow_window(message), want, "{message}");
        }
    }
}
