//! The `anthropic` backend: the Anthropic Messages API, streamed.
//!
//! Speaks `POST {base_url}/messages` with `stream: true` and `GET {base_url}/models`
//! ([`Anthropic::list_models`], following `has_more`/`last_id` pages with `after_id`, at most
//! [`MAX_MODEL_PAGES`] of them). The base URL defaults to [`DEFAULT_BASE_URL`]. Every request
//! carries `anthropic-version:` [`API_VERSION`] and the key in `x-api-key`.
//!
//! The request: `model`, `max_tokens` (the API requires it: the request's, else
//! [`DEFAULT_MAX_TOKENS`]), the system prompt as the top-level `system` string, `messages`,
//! `tools` as `{name, description, input_schema}`, `temperature`/`top_p` when given. Our
//! messages are mapped so that roles alternate as the API demands: an assistant message is its
//! text block (when non-empty) followed by a `tool_use {id, name, input}` block per call; a
//! tool result becomes a `tool_result {tool_use_id, content}` block of a user message, and
//! consecutive results, together with a user message that follows them, are merged into one
//! user message (the API wants all results of an assistant turn in the next user message, and
//! tool results before any text in it). Consecutive messages of the same role are merged the
//! same way and messages left without content (an empty reply) are dropped, since the API
//! rejects empty text blocks and messages. A message with a single text block is sent as a
//! plain string.
//!
//! Reasoning is not sent back: [`super::Message`] does not keep it, and the API accepts a
//! replayed `thinking` block only with the `signature` it issued for it. Extended thinking is
//! not requested (no configuration asks for it), and without it the API wants no thinking
//! blocks back; were it enabled, the thinking of an assistant turn with tool calls would have
//! to be returned, signature and all, until its tool results are answered. Thinking a server
//! sends anyway is parsed and streamed as reasoning.
//!
//! The reply arrives as named server-sent events; the `type` inside each `data:` JSON is what
//! counts (it always equals the event name). `message_start` gives the input tokens
//! (`input_tokens` plus `cache_creation_input_tokens` and `cache_read_input_tokens`, all of
//! which count against the context); `content_block_start` opens a `text`, `thinking`,
//! `redacted_thinking` or `tool_use` (`id`, `name`) block at an `index`;
//! `content_block_delta` carries `text_delta` (handed to the sink as [`Event::Text`] as it
//! arrives), `thinking_delta` ([`Event::Reasoning`], as it arrives), `signature_delta`
//! (ignored) or `input_json_delta` (`partial_json`, accumulated per block); at
//! `content_block_stop` a tool call is complete and goes to the sink as [`Event::ToolCall`];
//! `message_delta` has the `stop_reason` and the cumulative `usage.output_tokens`;
//! `message_stop` ends the reply; `ping` and unknown events are ignored. Usage goes to the
//! sink once, at the end. Tool arguments are parsed as in the `openai` backend: an empty input
//! is `{}`, anything that is not a JSON object becomes `{"_raw": "<text>"}` (see
//! `http::parse_arguments`); a call without an id gets a generated one.
//!
//! Errors: HTTP replies are classified as for every HTTP backend (`http::classify_http`): 429
//! is [`BackendError::RateLimited`] with `Retry-After`; 529 (overloaded), other 5xx, 408, 409,
//! connection and read errors are [`BackendError::Transient`]; a 400 saying "prompt is too
//! long" is [`BackendError::ContextOverflow`]; 401, 403 and other 4xx are
//! [`BackendError::Fatal`]. An `error` event inside the stream is classified by its
//! `error.type`: `overloaded_error`, `api_error` and `timeout_error` are transient,
//! `rate_limit_error` is rate limited, an error talking about the prompt being too long is a
//! context overflow, anything else is fatal. A stream that ends without `message_stop`, or with
//! an undecodable event, is transient. Messages are one line, prefixed with the backend name.
//!
//! The API key is read at each call from the variable named by `api_key_env` or the file
//! named by `api_key_file` (neither configured: no `x-api-key` header, for local
//! Anthropic-compatible servers). It is never stored, logged or put in an error: server
//! messages are scrubbed of it, the header is marked sensitive and `Debug` shows only where
//! it comes from.
//!
//! Tested below against a hand-written HTTP/1.1 server on 127.0.0.1 serving SSE fixtures
//! written after the event shapes of Anthropic's streaming documentation.

use std::collections::BTreeMap;
use std::fmt;

use ollie_link::text::{clip, one_line};
use reqwest::{RequestBuilder, Url};
use serde::Serialize;
use serde_json::{Value, json};

use super::http::{
    self, ApiKey, Conn, Endpoint, Frame, HttpApi, MAX_MESSAGE_CHARS, SSE, SseReply, generated_id,
    mentions_context, parse_arguments,
};
use super::{
    BackendError, Event, Message, ModelReply, ModelRequest, Role, Sink, ToolCall, ToolChoice, Usage,
};

/// The base URL when the configuration names none.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com/v1";
/// The `anthropic-version` header sent with every request.
pub const API_VERSION: &str = "2023-06-01";
/// `max_tokens` when the request sets none (the API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 8192;
/// The most pages of `GET /models` followed.
pub const MAX_MODEL_PAGES: usize = 10;
/// Models asked for per page (the API's maximum).
const MODELS_PER_PAGE: &str = "1000";

/// An Anthropic Messages API backend.
pub struct Anthropic {
    http: Conn,
}

impl fmt::Debug for Anthropic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.http.debug(f, "Anthropic")
    }
}

impl Anthropic {
    /// A backend for config entry `name`. Fails (one line, naming the key) when `base_url` is
    /// not an `http`/`https` URL with a host, or carries credentials, a query or a fragment.
    pub fn new(name: &str, cfg: &crate::config::Backend) -> Result<Anthropic, String> {
        let ep = Endpoint::new(
            name,
            cfg.base_url.as_deref(),
            DEFAULT_BASE_URL,
            cfg.timeouts,
        )?;
        Ok(Anthropic {
            http: Conn::new(name, cfg, ep),
        })
    }

    /// The models the server offers (`GET {base_url}/models`, each `data[].id`), in its order,
    /// following up to [`MAX_MODEL_PAGES`] pages.
    pub async fn list_models(&self) -> Result<Vec<String>, BackendError> {
        let key = self.http.api_key()?;
        let mut ids = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_MODEL_PAGES {
            let page = self.models_page(key.as_ref(), after.as_deref()).await?;
            let data = self.http.listed(&page, "/models", "data")?;
            ids.extend(
                data.iter()
                    .filter_map(|m| m.get("id").and_then(Value::as_str))
                    .map(str::to_owned),
            );
            let more = page.get("has_more").and_then(Value::as_bool) == Some(true);
            match page.get("last_id").and_then(Value::as_str) {
                // A server repeating its cursor would loop: stop there.
                Some(last) if more && !data.is_empty() && after.as_deref() != Some(last) => {
                    after = Some(last.to_owned());
                }
                _ => return Ok(ids),
            }
        }
        tracing::warn!(
            backend = %self.http.name,
            pages = MAX_MODEL_PAGES,
            models = ids.len(),
            "model list cut after the page limit"
        );
        Ok(ids)
    }

    /// One page of `GET /models`, as JSON.
    async fn models_page(
        &self,
        key: Option<&ApiKey>,
        after: Option<&str>,
    ) -> Result<Value, BackendError> {
        let mut url = Url::parse(&format!("{}/models", self.http.base_url)).map_err(|e| {
            BackendError::Fatal(format!(
                "{}: cannot make the /models url: {e}",
                self.http.name
            ))
        })?;
        url.query_pairs_mut().append_pair("limit", MODELS_PER_PAGE);
        if let Some(a) = after {
            url.query_pairs_mut().append_pair("after_id", a);
        }
        let rb = self.authorized(self.http.client.get(url), key)?;
        self.http.get_json(rb, key, "/models").await
    }

    /// `rb` with the version header and, when there is a key, `x-api-key` (marked sensitive).
    fn authorized(
        &self,
        rb: RequestBuilder,
        key: Option<&ApiKey>,
    ) -> Result<RequestBuilder, BackendError> {
        let rb = rb.header("anthropic-version", API_VERSION);
        Ok(match key {
            Some(k) => rb.header("x-api-key", k.header(&self.http.name, "")?),
            None => rb,
        })
    }
}

impl HttpApi for Anthropic {
    async fn chat(&self, req: &ModelRequest, sink: Sink<'_>) -> Result<ModelReply, BackendError> {
        let c = &self.http;
        let (rb, key) = c.chat_request(req, "messages request", "/messages", SSE, request_body)?;
        let rb = self.authorized(rb, key.as_ref())?;
        c.chat_sse::<StreamState>(rb, key.as_ref(), sink).await
    }

    async fn models(&self) -> Result<Vec<String>, BackendError> {
        self.list_models().await
    }
}

/// The JSON body of a streamed Messages request.
fn request_body(model: &str, req: &ModelRequest) -> serde_json::Result<Vec<u8>> {
    let object = json!({"type": "object"});
    let tools = req
        .tools
        .iter()
        .map(|t| Tool {
            name: &t.name,
            description: &t.description,
            // The API insists on an object schema.
            input_schema: if t.parameters.is_object() {
                &t.parameters
            } else {
                &object
            },
        })
        .collect();
    serde_json::to_vec(&Body {
        model,
        max_tokens: req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        system: req.system.as_deref().filter(|s| !s.is_empty()),
        messages: turns(&req.messages),
        tool_choice: (req.tool_choice == ToolChoice::Required && !req.tools.is_empty())
            .then(|| json!({"type": "any"})),
        tools,
        temperature: req.temperature,
        top_p: req.top_p,
        stream: true,
    })
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<&'a str>,
    messages: Vec<Turn<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    stream: bool,
}

#[derive(Serialize)]
struct Tool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

/// One message of the API: a role and its blocks, a single text block sent as a plain
/// string.
struct Turn<'a> {
    role: &'static str,
    blocks: Vec<Part<'a>>,
}

impl Serialize for Turn<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut t = s.serialize_struct("Turn", 2)?;
        t.serialize_field("role", self.role)?;
        match self.blocks.as_slice() {
            [Part::Text { text }] => t.serialize_field("content", text)?,
            blocks => t.serialize_field("content", blocks)?,
        }
        t.end()
    }
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        /// Optional; an empty string is better left out.
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<&'a str>,
    },
}

/// Our messages as the API's alternating `user`/`assistant` messages of content blocks (see
/// the module comment).
fn turns(messages: &[Message]) -> Vec<Turn<'_>> {
    let mut out: Vec<Turn<'_>> = Vec::new();
    for m in messages {
        let (role, blocks) = match m.role {
            Role::User => ("user", text_block(&m.content).into_iter().collect()),
            Role::Tool => (
                "user",
                vec![Part::ToolResult {
                    tool_use_id: m.tool_call_id.as_deref().unwrap_or_default(),
                    content: Some(m.content.as_str()).filter(|c| !c.is_empty()),
                }],
            ),
            Role::Assistant => {
                let mut blocks: Vec<Part<'_>> = text_block(&m.content).into_iter().collect();
                blocks.extend(m.tool_calls.iter().map(|c| Part::ToolUse {
                    id: &c.id,
                    name: &c.name,
                    input: &c.arguments,
                }));
                ("assistant", blocks)
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.role == role => {
                for b in blocks {
                    if matches!(b, Part::ToolResult { .. }) {
                        // Tool results go before any text of the merged message.
                        let at = last
                            .blocks
                            .iter()
                            .take_while(|x| matches!(x, Part::ToolResult { .. }))
                            .count();
                        last.blocks.insert(at, b);
                    } else {
                        last.blocks.push(b);
                    }
                }
            }
            _ => out.push(Turn { role, blocks }),
        }
    }
    out
}

/// A text block, unless `text` is empty (the API refuses empty text blocks).
fn text_block(text: &str) -> Option<Part<'_>> {
    (!text.is_empty()).then_some(Part::Text { text })
}

/// An `error` event's `error` object as a [`BackendError`].
fn classify_stream_error(name: &str, error: &Value) -> BackendError {
    let kind = error.get("type").and_then(Value::as_str).unwrap_or("");
    let message = match error.get("message") {
        Some(Value::String(s)) => s.clone(),
        _ => error.to_string(),
    };
    let text = format!(
        "{name}: error in stream: {}",
        clip(&one_line(&format!("{kind}: {message}")), MAX_MESSAGE_CHARS)
    );
    match kind {
        "rate_limit_error" => BackendError::RateLimited { retry_after: None },
        "overloaded_error" | "api_error" | "timeout_error" => BackendError::Transient(text),
        _ if mentions_context(&message) => BackendError::ContextOverflow(text),
        _ => BackendError::Fatal(text),
    }
}

/// A content block being received.
#[derive(Debug)]
enum Block {
    Text,
    Thinking,
    /// `redacted_thinking`: encrypted, nothing to show.
    Redacted,
    ToolUse {
        id: String,
        name: String,
        /// `input` as given in `content_block_start` (normally `{}`).
        start_input: Value,
        /// The `partial_json` pieces so far.
        json: String,
    },
    /// A block type this backend does not know (server tools, citations, …).
    Other,
}

/// What a stream has said so far.
#[derive(Debug, Default)]
struct StreamState {
    text: String,
    reasoning: String,
    /// Open blocks by `index`.
    blocks: BTreeMap<u64, Block>,
    /// Finished tool calls, in the order they finished.
    tool_calls: Vec<ToolCall>,
    input_tokens: Option<u64>,
    cache_creation_tokens: Option<u64>,
    cache_read_tokens: Option<u64>,
    output_tokens: Option<u64>,
    stop_reason: Option<String>,
    /// `message_stop` was seen.
    done: bool,
}

impl SseReply for StreamState {
    fn frame(&mut self, name: &str, frame: Frame, sink: Sink<'_>) -> Result<(), BackendError> {
        // An `error:` line is not Anthropic's way, but some proxies fail a stream like this.
        let data = frame.data(|err| classify_stream_error(name, err))?;
        let data = data.trim();
        if data.is_empty() {
            return Ok(());
        }
        let ev: Value = serde_json::from_str(data).map_err(|e| {
            BackendError::Transient(format!(
                "{name}: undecodable stream event ({e}): {}",
                clip(&one_line(data), MAX_MESSAGE_CHARS)
            ))
        })?;
        let index = ev.get("index").and_then(Value::as_u64).unwrap_or(0);
        match ev.get("type").and_then(Value::as_str).unwrap_or("") {
            "message_start" => {
                if let Some(u) = ev.get("message").and_then(|m| m.get("usage")) {
                    self.usage(u);
                }
            }
            "content_block_start" => {
                let block = ev.get("content_block").unwrap_or(&Value::Null);
                let str_of = |k: &str| {
                    block
                        .get(k)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                };
                let b = match block.get("type").and_then(Value::as_str).unwrap_or("") {
                    "text" => {
                        // Normally empty; a server may start with some text.
                        self.push_text(&str_of("text"), sink);
                        Block::Text
                    }
                    "thinking" => {
                        self.push_reasoning(&str_of("thinking"), sink);
                        Block::Thinking
                    }
                    "redacted_thinking" => Block::Redacted,
                    "tool_use" => Block::ToolUse {
                        id: str_of("id"),
                        name: str_of("name"),
                        start_input: block.get("input").cloned().unwrap_or(Value::Null),
                        json: String::new(),
                    },
                    _ => Block::Other,
                };
                self.blocks.insert(index, b);
            }
            "content_block_delta" => {
                let delta = ev.get("delta").unwrap_or(&Value::Null);
                let field = |k: &str| delta.get(k).and_then(Value::as_str).unwrap_or_default();
                match delta.get("type").and_then(Value::as_str).unwrap_or("") {
                    "text_delta" => self.push_text(field("text"), sink),
                    "thinking_delta" => self.push_reasoning(field("thinking"), sink),
                    "input_json_delta" => {
                        if let Some(Block::ToolUse { json, .. }) = self.blocks.get_mut(&index) {
                            json.push_str(field("partial_json"));
                            if json.len() > http::MAX_EVENT {
                                return Err(BackendError::Transient(format!(
                                    "{name}: tool call input is longer than {} MiB",
                                    http::MAX_EVENT >> 20
                                )));
                            }
                        }
                    }
                    // signature_delta (needed only to send thinking back), citations, …
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some(b) = self.blocks.remove(&index) {
                    self.block_done(name, index, b, sink)?;
                }
            }
            "message_delta" => {
                if let Some(r) = ev
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop_reason = Some(r.to_owned());
                }
                if let Some(u) = ev.get("usage") {
                    self.usage(u);
                }
            }
            "message_stop" => self.done = true,
            "error" => {
                let err = ev.get("error").unwrap_or(&Value::Null);
                return Err(classify_stream_error(name, err));
            }
            // ping, and event types added after this was written.
            _ => {}
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }

    /// The end of the stream: usage goes to the sink.
    fn finish(mut self, name: &str, sink: Sink<'_>) -> Result<ModelReply, BackendError> {
        if !self.done {
            return Err(BackendError::Transient(format!(
                "{name}: the stream ended before the reply was complete"
            )));
        }
        // Blocks the server never closed are complete all the same after message_stop.
        for (index, b) in std::mem::take(&mut self.blocks) {
            self.block_done(name, index, b, sink)?;
        }
        tracing::debug!(backend = %name, stop_reason = ?self.stop_reason, "reply complete");
        let reported = [
            self.input_tokens,
            self.cache_creation_tokens,
            self.cache_read_tokens,
            self.output_tokens,
        ];
        let usage = Usage {
            input_tokens: reported[..3].iter().flatten().sum(),
            output_tokens: self.output_tokens.unwrap_or(0),
            cost_usd: None,
        };
        let reported = reported.iter().any(Option::is_some).then_some(usage);
        Ok(http::finished_reply(
            self.text,
            self.reasoning,
            self.tool_calls,
            reported,
            self.stop_reason.as_deref() == Some("max_tokens"),
            sink,
        ))
    }
}

impl StreamState {
    fn push_text(&mut self, t: &str, sink: Sink<'_>) {
        if !t.is_empty() {
            self.text.push_str(t);
            sink(Event::Text(t.to_owned()));
        }
    }

    fn push_reasoning(&mut self, t: &str, sink: Sink<'_>) {
        if !t.is_empty() {
            self.reasoning.push_str(t);
            sink(Event::Reasoning(t.to_owned()));
        }
    }

    /// Usage counts: each one the event has replaces the earlier value (they are cumulative).
    fn usage(&mut self, u: &Value) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64);
        for (slot, key) in [
            (&mut self.input_tokens, "input_tokens"),
            (
                &mut self.cache_creation_tokens,
                "cache_creation_input_tokens",
            ),
            (&mut self.cache_read_tokens, "cache_read_input_tokens"),
            (&mut self.output_tokens, "output_tokens"),
        ] {
            if let Some(v) = n(key) {
                *slot = Some(v);
            }
        }
    }

    /// A finished block: a tool call goes to the sink.
    fn block_done(
        &mut self,
        name: &str,
        index: u64,
        b: Block,
        sink: Sink<'_>,
    ) -> Result<(), BackendError> {
        let Block::ToolUse {
            id,
            name: tool,
            start_input,
            json,
        } = b
        else {
            return Ok(());
        };
        if tool.is_empty() {
            return Err(BackendError::Transient(format!(
                "{name}: tool call in block {index} came without a name"
            )));
        }
        let arguments = match start_input {
            // Some compatible servers give the whole input at the start.
            Value::Object(o) if json.trim().is_empty() && !o.is_empty() => Value::Object(o),
            _ => parse_arguments(&json),
        };
        let call = ToolCall {
            id: if id.is_empty() { generated_id() } else { id },
            name: tool,
            arguments,
        };
        sink(Event::ToolCall(call.clone()));
        self.tool_calls.push(call);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::backend::ToolSpec;
    use crate::config::{Backend as BackendCfg, BackendKind};
    use tokio::sync::mpsc;

    use crate::backend::testserver::{self, Got, KEY, Reply, fake_env};

    /// The shared test server, with the API's `/v1` base path.
    async fn serve(replies: Vec<Reply>) -> (String, mpsc::UnboundedReceiver<Got>) {
        let (url, rx) = crate::backend::testserver::serve(replies).await;
        (format!("{url}/v1"), rx)
    }

    fn cfg(base_url: Option<&str>, key_var: Option<&str>) -> BackendCfg {
        BackendCfg {
            kind: BackendKind::Anthropic,
            base_url: base_url.map(str::to_owned),
            api_key_env: key_var.map(str::to_owned),
            model: Some("claude-test".into()),
            file: None,
            api_key_file: None,
            context_limit: None,
            timeouts: Default::default(),
            force_first_tool: false,
            tool_prefill: None,
        }
    }

    fn backend(base_url: &str, key_var: Option<&str>) -> Anthropic {
        let mut b = Anthropic::new("claude", &cfg(Some(base_url), key_var)).unwrap();
        b.http.keys.lookup = fake_env;
        b
    }

    fn request() -> ModelRequest {
        ModelRequest {
            messages: vec![Message::user("hi")],
            ..ModelRequest::default()
        }
    }

    async fn run(
        b: &Anthropic,
        req: &ModelRequest,
    ) -> (Result<ModelReply, BackendError>, Vec<Event>) {
        let mut events = Vec::new();
        let mut sink = |e: Event| events.push(e);
        let r = b.call(req, &mut sink).await;
        (r, events)
    }

    /// One named event, as the API frames it (`event:` equal to the data's `type`).
    fn ev(data: Value) -> String {
        let name = data["type"].as_str().unwrap().to_owned();
        format!("event: {name}\ndata: {data}\n\n")
    }

    fn message_start(input: u64) -> String {
        ev(json!({"type": "message_start", "message": {
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
            "content": [], "model": "claude-test", "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0, "output_tokens": 1}}}))
    }

    fn block_start(index: u64, block: Value) -> String {
        ev(json!({"type": "content_block_start", "index": index, "content_block": block}))
    }

    fn delta(index: u64, d: Value) -> String {
        ev(json!({"type": "content_block_delta", "index": index, "delta": d}))
    }

    fn text(index: u64, t: &str) -> String {
        delta(index, json!({"type": "text_delta", "text": t}))
    }

    fn input_json(index: u64, partial: &str) -> String {
        delta(
            index,
            json!({"type": "input_json_delta", "partial_json": partial}),
        )
    }

    fn block_stop(index: u64) -> String {
        ev(json!({"type": "content_block_stop", "index": index}))
    }

    fn message_delta(stop_reason: &str, output: u64) -> String {
        ev(json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": null},
            "usage": {"output_tokens": output}}))
    }

    fn tool_use(id: &str, name: &str) -> Value {
        json!({"type": "tool_use", "id": id, "name": name, "input": {}})
    }

    const PING: &str = "event: ping\ndata: {\"type\": \"ping\"}\n\n";
    const STOP: &str = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

    #[tokio::test]
    async fn plain_text_streamed_with_usage() {
        let whole = [
            message_start(25),
            block_start(0, json!({"type": "text", "text": ""})),
            PING.to_owned(),
            text(0, "Hel"),
            text(0, "lo, wörld").replace("\n\n", "\r\n\r\n"),
            text(0, "!"),
            block_stop(0),
            message_delta("end_turn", 15),
            STOP.to_owned(),
        ]
        .concat();
        // Cut everywhere awkward: mid-line, mid-"event:", inside the two bytes of 'ö'.
        let bytes = whole.as_bytes();
        let o = whole.find('ö').unwrap() + 1;
        let cuts = [0, 9, 60, o, o + 30, bytes.len() - 3, bytes.len()];
        let chunks = cuts
            .windows(2)
            .map(|w| bytes[w[0]..w[1]].to_vec())
            .collect();
        let reply = Reply {
            chunks,
            ..Reply::sse(&[])
        };
        let (url, mut rx) = serve(vec![reply]).await;
        let b = backend(&url, Some("OLLIE_TEST_KEY_TEXT"));
        let (r, events) = run(&b, &request()).await;
        let r = r.unwrap();
        let usage = Usage {
            input_tokens: 25,
            output_tokens: 15,
            cost_usd: None,
        };
        assert_eq!(
            r,
            ModelReply {
                text: "Hello, wörld!".into(),
                reasoning: String::new(),
                tool_calls: Vec::new(),
                usage,
                truncated: false,
            }
        );
        assert_eq!(
            events,
            vec![
                Event::Text("Hel".into()),
                Event::Text("lo, wörld".into()),
                Event::Text("!".into()),
                Event::Usage(usage),
            ]
        );
        let got = rx.recv().await.unwrap();
        assert!(got.head.starts_with("POST /v1/messages HTTP/1.1\r\n"));
        assert_eq!(got.header("x-api-key"), Some(KEY));
        assert_eq!(got.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(got.header("content-type"), Some("application/json"));
        assert_eq!(got.header("accept"), Some("text/event-stream"));
        assert_eq!(got.header("authorization"), None);
        assert_eq!(
            got.json(),
            json!({
                "model": "claude-test",
                "max_tokens": DEFAULT_MAX_TOKENS,
                "messages": [{"role": "user", "content": "hi"}],
                "stream": true,
            })
        );
    }

    #[tokio::test]
    async fn stop_reason_max_tokens_marks_the_reply_truncated() {
        let whole = [
            message_start(25),
            block_start(0, json!({"type": "text", "text": ""})),
            text(0, "The answer is"),
            block_stop(0),
            message_delta("max_tokens", 3),
            STOP.to_owned(),
        ]
        .concat();
        let (url, _rx) = serve(vec![Reply::sse(&[&whole])]).await;
        let b = backend(&url, Some("OLLIE_TEST_KEY_CUT"));
        let r = run(&b, &request()).await.0.unwrap();
        assert_eq!((r.text.as_str(), r.truncated), ("The answer is", true));
    }

    #[test]
    fn a_forced_call_sends_tool_choice_any() {
        let req = ModelRequest {
            tools: vec![ToolSpec {
                name: "t".into(),
                description: String::new(),
                parameters: json!({"type": "object"}),
            }],
            tool_choice: ToolChoice::Required,
            ..request()
        };
        let body: Value = serde_json::from_slice(&request_body("m", &req).unwrap()).unwrap();
        assert_eq!(body["tool_choice"], json!({"type": "any"}), "{body}");
        let free = ModelRequest {
            tool_choice: ToolChoice::Auto,
            ..req
        };
        let body: Value = serde_json::from_slice(&request_body("m", &free).unwrap()).unwrap();
        assert!(body.get("tool_choice").is_none(), "{body}");
    }

    #[tokio::test]
    async fn thinking_then_text_with_cached_input() {
        let start = ev(json!({"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "content": [],
            "model": "claude-test", "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 10, "cache_creation_input_tokens": 100,
                "cache_read_input_tokens": 1000, "output_tokens": 1}}}));
        let (url, _rx) = serve(vec![Reply::sse(&[
            &start,
            &block_start(0, json!({"type": "thinking", "thinking": ""})),
            &delta(0, json!({"type": "thinking_delta", "thinking": "Let me "})),
            &delta(0, json!({"type": "thinking_delta", "thinking": "add: 4."})),
            &delta(
                0,
                json!({"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"}),
            ),
            &block_stop(0),
            &block_start(1, json!({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3p"})),
            &block_stop(1),
            &block_start(2, json!({"type": "text", "text": ""})),
            &text(2, "2 + 2 = 4."),
            &block_stop(2),
            &message_delta("end_turn", 42),
            STOP,
        ])])
        .await;
        let (r, events) = run(&backend(&url, None), &request()).await;
        let r = r.unwrap();
        assert_eq!(r.reasoning, "Let me add: 4.");
        assert_eq!(r.text, "2 + 2 = 4.");
        let usage = Usage {
            input_tokens: 1110,
            output_tokens: 42,
            cost_usd: None,
        };
        assert_eq!(r.usage, usage);
        assert_eq!(
            events,
            vec![
                Event::Reasoning("Let me ".into()),
                Event::Reasoning("add: 4.".into()),
                Event::Text("2 + 2 = 4.".into()),
                Event::Usage(usage),
            ]
        );
    }

    #[tokio::test]
    async fn one_tool_use_in_several_input_json_deltas() {
        let (url, mut rx) = serve(vec![Reply::sse(&[
            &message_start(472),
            &block_start(0, json!({"type": "text", "text": ""})),
            &text(0, "Reading it."),
            &block_stop(0),
            &block_start(1, tool_use("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "file_read")),
            &input_json(1, ""),
            &input_json(1, "{\"pa"),
            PING,
            &input_json(1, "th\": \"src/ma"),
            &input_json(1, "in.rs\"}"),
            &block_stop(1),
            &message_delta("tool_use", 89),
            STOP,
        ])])
        .await;
        let (r, events) = run(&backend(&url, None), &request()).await;
        let r = r.unwrap();
        let call = ToolCall {
            id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
            name: "file_read".into(),
            arguments: json!({"path": "src/main.rs"}),
        };
        assert_eq!(r.tool_calls, vec![call.clone()]);
        assert_eq!(r.text, "Reading it.");
        assert_eq!(
            events,
            vec![
                Event::Text("Reading it.".into()),
                Event::ToolCall(call),
                Event::Usage(Usage {
                    input_tokens: 472,
                    output_tokens: 89,
                    cost_usd: None
                }),
            ]
        );
        // No key configured: no x-api-key header, the version all the same.
        let got = rx.recv().await.unwrap();
        assert_eq!(got.header("x-api-key"), None);
        assert_eq!(got.header("anthropic-version"), Some(API_VERSION));
    }

    #[tokio::test]
    async fn two_parallel_tool_uses() {
        let (url, _rx) = serve(vec![Reply::sse(&[
            &message_start(5),
            &block_start(0, tool_use("toolu_a", "file_read")),
            &input_json(0, "{\"path\":"),
            &input_json(0, "\"a.txt\"}"),
            &block_stop(0),
            &block_start(1, tool_use("toolu_b", "execute_code")),
            &input_json(1, "{\"language\":\"sh\","),
            &input_json(1, "\"code\":\"ls\"}"),
            &block_stop(1),
            // An empty input is an empty object; broken JSON is kept raw.
            &block_start(2, tool_use("toolu_c", "status")),
            &block_stop(2),
            &block_start(3, tool_use("", "file_read")),
            &input_json(3, "{\"path\": \"b"),
            &block_stop(3),
            &message_delta("tool_use", 50),
            STOP,
        ])])
        .await;
        let (r, events) = run(&backend(&url, None), &request()).await;
        let r = r.unwrap();
        assert_eq!(r.tool_calls.len(), 4);
        assert_eq!(
            r.tool_calls[..3],
            [
                ToolCall {
                    id: "toolu_a".into(),
                    name: "file_read".into(),
                    arguments: json!({"path": "a.txt"}),
                },
                ToolCall {
                    id: "toolu_b".into(),
                    name: "execute_code".into(),
                    arguments: json!({"language": "sh", "code": "ls"}),
                },
                ToolCall {
                    id: "toolu_c".into(),
                    name: "status".into(),
                    arguments: json!({}),
                },
            ]
        );
        let last = &r.tool_calls[3];
        assert!(last.id.starts_with("call_"), "{last:?}");
        assert_eq!(last.arguments, json!({"_raw": "{\"path\": \"b"}));
        let calls: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::ToolCall(c) => Some(c.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(calls, r.tool_calls);
        assert!(matches!(events.last(), Some(Event::Usage(_))));
    }

    #[tokio::test]
    async fn rate_limited_with_retry_after() {
        let mut r = Reply::json(
            429,
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#,
        );
        r.headers.push(("retry-after", "13".into()));
        let (url, _rx) = serve(vec![r, Reply::json(429, "")]).await;
        let b = backend(&url, None);
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::RateLimited {
                retry_after: Some(13)
            }
        );
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(e, BackendError::RateLimited { retry_after: None });
    }

    #[tokio::test]
    async fn server_errors_and_overloaded_are_transient() {
        let (url, _rx) = serve(vec![
            Reply::json(
                500,
                r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
            ),
            Reply::json(
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ),
        ])
        .await;
        let b = backend(&url, None);
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::Transient("claude: http 500: Internal server error".into())
        );
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::Transient("claude: http 529: Overloaded".into())
        );
    }

    #[tokio::test]
    async fn stream_cut_mid_message_is_transient() {
        // Closed without message_stop: between events, mid-event, and after message_delta.
        let start = message_start(5);
        let open = block_start(0, json!({"type": "text", "text": ""}));
        let a = text(0, "Hel");
        let b2 = text(0, "lo");
        let stop = block_stop(0);
        let md = message_delta("end_turn", 2);
        let (url, _rx) = serve(vec![
            Reply::sse(&[&start, &open, &a, &b2]),
            Reply::sse(&[&start, &open, &a, &b2[..b2.len() - 5]]),
            Reply::sse(&[&start, &open, &a, &stop, &md]),
        ])
        .await;
        let b = backend(&url, None);
        for _ in 0..3 {
            let (r, events) = run(&b, &request()).await;
            assert_eq!(
                r.unwrap_err(),
                BackendError::Transient(
                    "claude: the stream ended before the reply was complete".into()
                )
            );
            assert_eq!(events[0], Event::Text("Hel".into()));
        }
    }

    #[tokio::test]
    async fn error_events_mid_stream() {
        let err = |kind: &str, msg: &str| {
            ev(json!({"type": "error", "error": {"type": kind, "message": msg}}))
        };
        let start = message_start(5);
        let open = block_start(0, json!({"type": "text", "text": ""}));
        let a = text(0, "partial");
        let (url, _rx) = serve(vec![
            Reply::sse(&[&start, &open, &a, &err("overloaded_error", "Overloaded")]),
            Reply::sse(&[&start, &err("rate_limit_error", "slow down")]),
            Reply::sse(&[&err("api_error", "Internal server error")]),
            Reply::sse(&[&err(
                "invalid_request_error",
                "prompt is too long: 210000 tokens > 200000 maximum",
            )]),
            Reply::sse(&[&err("invalid_request_error", "messages: field required")]),
            Reply::sse(&[&start, "event: content_block_delta\ndata: {not json\n\n"]),
        ])
        .await;
        let b = backend(&url, None);
        let (r, events) = run(&b, &request()).await;
        assert_eq!(
            r.unwrap_err(),
            BackendError::Transient("claude: error in stream: overloaded_error: Overloaded".into())
        );
        assert_eq!(events, vec![Event::Text("partial".into())]);
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(e, BackendError::RateLimited { retry_after: None });
        let e = run(&b, &request()).await.0.unwrap_err();
        assert!(matches!(e, BackendError::Transient(_)), "{e:?}");
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::ContextOverflow(
                "claude: error in stream: invalid_request_error: prompt is too long: 210000 tokens > 200000 maximum".into()
            )
        );
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::Fatal(
                "claude: error in stream: invalid_request_error: messages: field required".into()
            )
        );
        let e = run(&b, &request()).await.0.unwrap_err();
        assert!(
            matches!(&e, BackendError::Transient(m) if m.contains("undecodable stream event")),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn prompt_too_long_is_context_overflow() {
        let (url, _rx) = serve(vec![Reply::json(
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#,
        )])
        .await;
        let e = run(&backend(&url, None), &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::ContextOverflow(
                "claude: http 400: prompt is too long: 208310 tokens > 200000 maximum".into()
            )
        );
    }

    #[tokio::test]
    async fn auth_errors_are_fatal_and_never_show_the_key() {
        let (url, _rx) = serve(vec![
            Reply::json(
                401,
                &format!(
                    r#"{{"type":"error","error":{{"type":"authentication_error","message":"invalid x-api-key {KEY}"}}}}"#
                ),
            ),
            Reply::json(
                403,
                r#"{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."}}"#,
            ),
            Reply::sse(&[&ev(
                json!({"type": "error", "error": {"type": "authentication_error", "message": format!("bad key {KEY}")}}),
            )]),
            // The 200-character cut of the message falls inside the key.
            Reply::sse(&[&ev(
                json!({"type": "error", "error": {"type": "authentication_error", "message": format!("{} {KEY}", "x".repeat(160))}}),
            )]),
        ])
        .await;
        let b = backend(&url, Some("OLLIE_TEST_KEY_FATAL"));
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::Fatal("claude: http 401: invalid x-api-key <redacted>".into())
        );
        let e = run(&b, &request()).await.0.unwrap_err();
        assert!(
            matches!(&e, BackendError::Fatal(m) if m.starts_with("claude: http 403: Your API key")),
            "{e:?}"
        );
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::Fatal(
                "claude: error in stream: authentication_error: bad key <redacted>".into()
            )
        );
        let e = run(&b, &request()).await.0.unwrap_err();
        assert!(
            matches!(&e, BackendError::Fatal(m) if m.ends_with(" <redacted>…") && !m.contains(&KEY[..8])),
            "{e:?}"
        );
        assert!(!format!("{b:?}").contains(KEY));
    }

    #[tokio::test]
    async fn request_body_maps_the_conversation() {
        let (url, mut rx) = serve(vec![Reply::sse(&[
            &message_start(1),
            &message_delta("end_turn", 1),
            STOP,
        ])])
        .await;
        let b = backend(&url, Some("OLLIE_TEST_KEY_BODY"));
        let tool = |id: &str, content: &str| Message {
            role: Role::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(id.into()),
        };
        let req = ModelRequest {
            model: Some("claude-other".into()),
            system: Some("You are terse.".into()),
            messages: vec![
                Message::user("list and read"),
                Message {
                    role: Role::Assistant,
                    content: "Both at once.".into(),
                    tool_calls: vec![
                        ToolCall {
                            id: "toolu_1".into(),
                            name: "execute_code".into(),
                            arguments: json!({"language": "sh", "code": "ls"}),
                        },
                        ToolCall {
                            id: "toolu_2".into(),
                            name: "file_read".into(),
                            arguments: json!({"path": "a.txt"}),
                        },
                    ],
                    tool_call_id: None,
                },
                tool("toolu_1", "a.txt\n"),
                tool("toolu_2", ""),
                Message::user("and then?"),
                Message {
                    role: Role::Assistant,
                    content: "Done.".into(),
                    tool_calls: Vec::new(),
                    tool_call_id: None,
                },
            ],
            tools: vec![ToolSpec {
                name: "execute_code".into(),
                description: "Run code.".into(),
                parameters: json!({"type": "object", "properties": {"code": {"type": "string"}}}),
            }],
            temperature: Some(0.5),
            top_p: Some(0.9),
            max_tokens: Some(100),
            tool_choice: ToolChoice::Auto,
            prefill: None,
        };
        let (r, events) = run(&b, &req).await;
        assert_eq!(r.unwrap().text, "");
        assert_eq!(events.len(), 1, "only usage: {events:?}");
        let got = rx.recv().await.unwrap();
        assert_eq!(got.header("x-api-key"), Some(KEY));
        assert_eq!(got.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(
            got.json(),
            json!({
                "model": "claude-other",
                "max_tokens": 100,
                "system": "You are terse.",
                "messages": [
                    {"role": "user", "content": "list and read"},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Both at once."},
                        {"type": "tool_use", "id": "toolu_1", "name": "execute_code",
                            "input": {"language": "sh", "code": "ls"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "file_read",
                            "input": {"path": "a.txt"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt\n"},
                        {"type": "tool_result", "tool_use_id": "toolu_2"},
                        {"type": "text", "text": "and then?"},
                    ]},
                    {"role": "assistant", "content": "Done."},
                ],
                "tools": [{"name": "execute_code", "description": "Run code.", "input_schema":
                    {"type": "object", "properties": {"code": {"type": "string"}}}}],
                "temperature": 0.5,
                "top_p": 0.9,
                "stream": true,
            })
        );
    }

    #[test]
    fn roles_alternate_and_empty_messages_are_dropped() {
        let assistant = |content: &str, calls: Vec<ToolCall>| Message {
            role: Role::Assistant,
            content: content.into(),
            tool_calls: calls,
            tool_call_id: None,
        };
        let call = ToolCall {
            id: "toolu_9".into(),
            name: "status".into(),
            arguments: json!({}),
        };
        let messages = vec![
            Message::user("one"),
            // An empty reply: dropped, so the two user messages merge.
            assistant("", Vec::new()),
            Message::user("two"),
            assistant("", vec![call]),
            // The user spoke before the result arrived: the result still goes first.
            Message::user("hurry"),
            Message {
                role: Role::Tool,
                content: "ok".into(),
                tool_calls: Vec::new(),
                tool_call_id: Some("toolu_9".into()),
            },
        ];
        assert_eq!(
            serde_json::to_value(turns(&messages)).unwrap(),
            json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "one"},
                    {"type": "text", "text": "two"},
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_9", "name": "status", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_9", "content": "ok"},
                    {"type": "text", "text": "hurry"},
                ]},
            ])
        );
        // A schema that is not an object is replaced by the least one the API takes.
        let req = ModelRequest {
            tools: vec![ToolSpec {
                name: "t".into(),
                description: String::new(),
                parameters: Value::Null,
            }],
            ..request()
        };
        assert_eq!(
            serde_json::from_slice::<Value>(&request_body("m", &req).unwrap()).unwrap()["tools"][0]
                ["input_schema"],
            json!({"type": "object"})
        );
    }

    #[tokio::test]
    async fn list_models_follows_pages() {
        let page = |ids: &[&str], more: bool| {
            let data: Vec<Value> = ids
                .iter()
                .map(|id| {
                    json!({"type": "model", "id": id, "display_name": id,
                    "created_at": "2025-02-19T00:00:00Z"})
                })
                .collect();
            json!({"data": data, "has_more": more, "first_id": ids[0],
                "last_id": ids[ids.len() - 1]})
            .to_string()
        };
        let (url, mut rx) = serve(vec![
            Reply::json(200, &page(&["claude-a", "claude-b"], true)),
            Reply::json(200, &page(&["claude-c"], false)),
            Reply::json(
                401,
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
            ),
        ])
        .await;
        let b = backend(&url, Some("OLLIE_TEST_KEY_MODELS"));
        assert_eq!(
            b.list_models().await.unwrap(),
            ["claude-a", "claude-b", "claude-c"]
        );
        let first = rx.recv().await.unwrap();
        assert!(
            first
                .head
                .starts_with("GET /v1/models?limit=1000 HTTP/1.1\r\n"),
            "{}",
            first.head
        );
        assert_eq!(first.header("x-api-key"), Some(KEY));
        assert_eq!(first.header("anthropic-version"), Some(API_VERSION));
        let second = rx.recv().await.unwrap();
        assert!(
            second
                .head
                .starts_with("GET /v1/models?limit=1000&after_id=claude-b HTTP/1.1\r\n"),
            "{}",
            second.head
        );
        assert_eq!(
            b.list_models().await.unwrap_err(),
            BackendError::Fatal("claude: http 401: invalid x-api-key".into())
        );
    }

    #[tokio::test]
    async fn list_models_stops_at_the_page_limit() {
        // A server that always has more (and a fresh cursor) gets MAX_MODEL_PAGES requests.
        let replies = (0..MAX_MODEL_PAGES)
            .map(|i| {
                Reply::json(
                    200,
                    &json!({"data": [{"id": format!("m{i}")}], "has_more": true,
                        "last_id": format!("m{i}")})
                    .to_string(),
                )
            })
            .collect();
        let (url, _rx) = serve(replies).await;
        let ids = backend(&url, None).list_models().await.unwrap();
        assert_eq!(ids.len(), MAX_MODEL_PAGES);
        assert_eq!(
            ids[MAX_MODEL_PAGES - 1],
            format!("m{}", MAX_MODEL_PAGES - 1)
        );
    }

    /// Every request is bounded by the backend's timeouts: a model page and a messages
    /// request to a server that never answers (or sends a head and stalls) end at
    /// `first_byte_timeout_s`, naming it and the path.
    #[tokio::test]
    async fn every_request_runs_out_of_the_backends_timeouts() {
        for reply in [b"" as &[u8], testserver::JSON_HEAD] {
            let url = testserver::stalling(vec![reply]).await;
            let c = BackendCfg {
                timeouts: testserver::only("first_byte"),
                ..cfg(Some(&format!("{url}/v1")), None)
            };
            let b = Anthropic::new("claude", &c).unwrap();
            assert_eq!(
                b.list_models().await.unwrap_err(),
                BackendError::Transient(
                    "claude: /v1/models: timed out: no reply within 1 s (first_byte_timeout_s)"
                        .into()
                )
            );
            assert_eq!(
                run(&b, &request()).await.0.unwrap_err(),
                BackendError::Transient(
                    "claude: /v1/messages: timed out: no reply within 1 s (first_byte_timeout_s)"
                        .into()
                )
            );
        }
    }

    #[tokio::test]
    async fn missing_key_or_model_fails_before_connecting() {
        // The real environment: this variable is not set; nothing listens on port 9.
        let mut c = cfg(
            Some("http://127.0.0.1:9/v1"),
            Some("OLLIE_TEST_UNSET_VARIABLE_a41c"),
        );
        c.model = None;
        let b = Anthropic::new("claude", &c).unwrap();
        let req = ModelRequest {
            model: Some("m".into()),
            ..request()
        };
        let want = BackendError::Fatal(
            "claude: environment variable OLLIE_TEST_UNSET_VARIABLE_a41c (api_key_env) is not set or empty"
                .into(),
        );
        assert_eq!(run(&b, &req).await.0.unwrap_err(), want);
        assert_eq!(b.list_models().await.unwrap_err(), want);
        assert_eq!(
            run(&b, &request()).await.0.unwrap_err(),
            BackendError::Fatal(
                "claude: no model (set model in the backend or the agent profile)".into()
            )
        );
    }

    #[test]
    fn base_url_default_and_checks() {
        assert_eq!(
            Anthropic::new("x", &cfg(None, None)).unwrap().http.base_url,
            DEFAULT_BASE_URL
        );
        let e = Anthropic::new("x", &cfg(Some("https://u:pw@host/v1"), None)).unwrap_err();
        assert!(
            e.contains("must not contain credentials") && !e.contains("pw"),
            "{e}"
        );
    }
}
