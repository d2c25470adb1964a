//! Model backends: one streaming call per model request.
//!
//! A backend turns a [`ModelRequest`] (system prompt, messages, tool schemas, generation
//! parameters) into a stream of [`Event`]s handed to a sink as they arrive (text and
//! reasoning deltas, complete tool calls, usage), and returns the whole [`ModelReply`] at the
//! end. The agent loop (`turn.rs`) owns everything else: chat, tools, retries, accounting.
//!
//! Kinds: `replay` (a JSON-lines script of turns, for offline runs and tests); `openai`,
//! `anthropic` and `ollama` speak their HTTP streaming APIs.

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
