//! The `openai` backend: OpenAI-compatible Chat Completions, streamed.
//!
//! Speaks `POST {base_url}/chat/completions` with `stream: true` and
//! `stream_options.include_usage`, as OpenAI, OpenRouter, llama.cpp's server, vLLM, LM Studio
//! and Ollama's `/v1` do, and `GET {base_url}/models` ([`OpenAi::list_models`]). The base URL
//! defaults to [`DEFAULT_BASE_URL`].
//!
//! The reply arrives as server-sent events, each `data:` a `chat.completion.chunk`:
//! `choices[0].delta.content` (text; `delta.refusal` counts as text too),
//! `delta.reasoning_content` or `delta.reasoning` (reasoning; servers use either name, and when
//! a delta carries both only the first is used), `delta.tool_calls[]` (fragments accumulated per `index`: `id` and `function.name`
//! once, `function.arguments` in pieces), `finish_reason`, a last chunk with `usage` (and
//! OpenRouter's `usage.cost`), then `data: [DONE]`. Text and reasoning are handed to the sink
//! as they arrive; tool calls and usage once the stream has ended.
//!
//! Tool call arguments are parsed as JSON when complete: an empty string or `null` is `{}`, an
//! object is used as is (also when double-encoded as a JSON string), and anything else (not
//! JSON, or not an object) becomes `{"_raw": "<the text as received>"}` so that the agent
//! loop can tell the model its arguments were malformed instead of failing the turn. A call
//! without an id gets a generated `call_<hex>` one.
//!
//! Errors: HTTP 429 is [`BackendError::RateLimited`] (with `Retry-After` or `retry-after-ms`
//! in whole seconds, rounded up) unless the body says `insufficient_quota` (fatal); 408, 409,
//! 5xx, connection and read errors, undecodable chunks and a stream that ends without
//! `[DONE]` or a `finish_reason` are [`BackendError::Transient`]; an error whose body talks
//! about the context length (`context_length_exceeded`, "maximum context length", llama.cpp's
//! `exceed_context_size_error`, …) is [`BackendError::ContextOverflow`]; other 4xx are
//! [`BackendError::Fatal`]. Messages are one line: the backend name, the status and the
//! server's `error.message` cut to about 200 characters. Errors a server sends inside the
//! stream (`data: {"error": …}` or llama.cpp's `error:` lines) are classified the same way by
//! their `code`.
//!
//! The API key is read from the variable named by `api_key_env` at each call (no variable
//! configured: no `Authorization` header, as local servers want). It is never stored, logged
//! or put in an error: server messages are scrubbed of it, the header is marked sensitive and
//! `Debug` shows only the variable's name. Base URLs with credentials in them are refused.
//!
//! Requests send `max_tokens` (not `max_completion_tokens`: the local servers know the
//! former). Loopback base URLs bypass any configured HTTP proxy.
//!
//! Tested below against a hand-written HTTP/1.1 server on 127.0.0.1 serving recorded-style
//! SSE fixtures.

use std::collections::BTreeMap;
use std::fmt;

use ollie_link::text::{clip, one_line};
use serde::Serialize;
use serde_json::Value;

use super::http::{
    self, Conn, Endpoint, Frame, HttpApi, MAX_MESSAGE_CHARS, SSE, SseReply, classify_stream_error,
    generated_id, parse_arguments,
};
use super::{
    BackendError, Event, Message, ModelReply, ModelRequest, Role, Sink, ToolCall, ToolChoice, Usage,
};

/// The base URL when the configuration names none.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// An OpenAI-compatible chat backend.
pub struct OpenAi {
    http: Conn,
    /// The context windows the server told, by model (asked once; empty when it tells none).
    windows: tokio::sync::OnceCell<BTreeMap<String, u64>>,
}

impl fmt::Debug for OpenAi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.http.debug(f, "OpenAi")
    }
}

impl OpenAi {
    /// A backend for config entry `name`. Fails (one line, naming the key) when `base_url` is
    /// not an `http`/`https` URL with a host, or carries credentials, a query or a fragment.
    pub fn new(name: &str, cfg: &crate::config::Backend) -> Result<OpenAi, String> {
        let ep = Endpoint::new(
            name,
            cfg.base_url.as_deref(),
            DEFAULT_BASE_URL,
            cfg.timeouts,
        )?;
        Ok(OpenAi {
            http: Conn::new(name, cfg, ep),
            windows: tokio::sync::OnceCell::new(),
        })
    }

    /// The context window of each model, as the server lists it: `GET {base_url}/models`
    /// entries' `context_length` (OpenRouter), `context_window`, `max_model_len` (vLLM) or
    /// `meta.n_ctx_train` (llama.cpp); for llama.cpp's server, whose slots may be smaller than
    /// the model was trained for, `GET /props`'s `default_generation_settings.n_ctx` instead.
    /// Both requests are bounded like every other ([`Conn::get_json`]). Nothing on any error
    /// (logged): the window is then unknown, as when the server tells none, and the turn goes
    /// on (a missing key is the chat request's to report).
    async fn fetch_windows(&self) -> BTreeMap<String, u64> {
        let c = &self.http;
        let Ok(key) = c.api_key() else {
            return BTreeMap::new();
        };
        let key = &key;
        let get = |url: String, what: &'static str| async move {
            let rb = c.bearer(c.client.get(url), key.as_ref()).ok()?;
            c.get_json(rb, key.as_ref(), what)
                .await
                .inspect_err(|e| {
                    tracing::warn!(
                        backend = %c.name,
                        "context window lookup failed, the window is unknown: {e}"
                    );
                })
                .ok()
        };
        let Some(v) = get(format!("{}/models", c.base_url), "/models").await else {
            return BTreeMap::new();
        };
        let entries = v
            .get("data")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut out: BTreeMap<String, u64> = entries
            .iter()
            .filter_map(|m| Some((m.get("id")?.as_str()?.to_owned(), listed_window(m)?)))
            .collect();
        let llama = entries
            .iter()
            .any(|m| m.get("owned_by").and_then(Value::as_str) == Some("llamacpp"));
        if llama {
            let root = c.base_url.strip_suffix("/v1").unwrap_or(&c.base_url);
            let slot = get(format!("{root}/props"), "/props")
                .await
                .and_then(|p| p.pointer("/default_generation_settings/n_ctx")?.as_u64());
            if let Some(n) = slot.filter(|n| *n > 0) {
                for m in &entries {
                    if let Some(id) = m.get("id").and_then(Value::as_str) {
                        out.insert(id.to_owned(), n);
                    }
                }
            }
        }
        out
    }

    /// The models the server offers (`GET {base_url}/models`, each `data[].id`), in its order.
    pub async fn list_models(&self) -> Result<Vec<String>, BackendError> {
        let c = &self.http;
        let key = c.api_key()?;
        let rb = c.bearer(c.client.get(format!("{}/models", c.base_url)), key.as_ref())?;
        let v = c.get_json(rb, key.as_ref(), "/models").await?;
        Ok(c.listed(&v, "/models", "data")?
            .iter()
            .filter_map(|m| m.get("id").and_then(Value::as_str))
            .map(str::to_owned)
            .collect())
    }
}

impl HttpApi for OpenAi {
    async fn chat(&self, req: &ModelRequest, sink: Sink<'_>) -> Result<ModelReply, BackendError> {
        let c = &self.http;
        let (rb, key) =
            c.chat_request(req, "chat request", "/chat/completions", SSE, request_body)?;
        let rb = c.bearer(rb, key.as_ref())?;
        c.chat_sse::<StreamState>(rb, key.as_ref(), sink).await
    }

    async fn models(&self) -> Result<Vec<String>, BackendError> {
        self.list_models().await
    }

    async fn context_window(&self, model: &str) -> Option<u64> {
        self.windows
            .get_or_init(|| self.fetch_windows())
            .await
            .get(model)
            .copied()
    }
}

/// The context window a `/models` entry states, in tokens.
fn listed_window(m: &Value) -> Option<u64> {
    [
        "/context_length",
        "/context_window",
        "/max_model_len",
        "/meta/n_ctx_train",
    ]
    .iter()
    .find_map(|p| m.pointer(p)?.as_u64())
    .filter(|n| *n > 0)
}

/// The JSON body of a streamed chat request.
fn request_body(model: &str, req: &ModelRequest) -> serde_json::Result<Vec<u8>> {
    let system = req.system.as_deref().filter(|s| !s.is_empty());
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    messages.extend(system.map(|s| Msg {
        role: "system",
        content: Some(s),
        tool_call_id: None,
        tool_calls: Vec::new(),
    }));
    messages.extend(req.messages.iter().map(Msg::of));
    messages.extend(req.prefill.as_deref().map(|p| Msg {
        role: "assistant",
        content: Some(p),
        tool_call_id: None,
        tool_calls: Vec::new(),
    }));
    let forced = req.tool_choice == ToolChoice::Required && !req.tools.is_empty();
    serde_json::to_vec(&Body {
        model,
        messages,
        tools: http::function_tools(&req.tools),
        tool_choice: forced.then_some("required"),
        temperature: req.temperature,
        top_p: req.top_p,
        max_tokens: req.max_tokens,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
    })
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: Vec<Msg<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<http::FunctionTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    stream: bool,
    stream_options: StreamOptions,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// One message as the API takes it.
#[derive(Serialize)]
struct Msg<'a> {
    role: &'static str,
    /// `None` (JSON `null`) is how the API spells "only tool calls".
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<Call<'a>>,
}

#[derive(Serialize)]
struct Call<'a> {
    id: &'a str,
    r#type: &'static str,
    function: CallFunction<'a>,
}

#[derive(Serialize)]
struct CallFunction<'a> {
    name: &'a str,
    /// The arguments object as JSON text, as the API wants them.
    #[serde(serialize_with = "as_json_text")]
    arguments: &'a Value,
}

fn as_json_text<S: serde::Serializer>(v: &&Value, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(*v)
}

impl<'a> Msg<'a> {
    fn of(m: &'a Message) -> Msg<'a> {
        let mut msg = Msg {
            role: "user",
            content: Some(&m.content),
            tool_call_id: None,
            tool_calls: Vec::new(),
        };
        match m.role {
            Role::User => {}
            Role::Tool => {
                msg.role = "tool";
                msg.tool_call_id = Some(m.tool_call_id.as_deref().unwrap_or_default());
            }
            Role::Assistant => {
                msg.role = "assistant";
                if m.content.is_empty() && !m.tool_calls.is_empty() {
                    msg.content = None;
                }
                msg.tool_calls = m
                    .tool_calls
                    .iter()
                    .map(|c| Call {
                        id: &c.id,
                        r#type: "function",
                        function: CallFunction {
                            name: &c.name,
                            arguments: &c.arguments,
                        },
                    })
                    .collect();
            }
        }
        msg
    }
}

/// A tool call being assembled from fragments.
#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// What a stream has said so far.
#[derive(Debug, Default)]
struct StreamState {
    text: String,
    reasoning: String,
    /// By the server's `index`.
    calls: BTreeMap<u64, PartialCall>,
    /// The index of the last fragment (for servers that omit `index`).
    last_index: Option<u64>,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    /// `[DONE]` was seen.
    done: bool,
}

impl SseReply for StreamState {
    fn frame(&mut self, name: &str, frame: Frame, sink: Sink<'_>) -> Result<(), BackendError> {
        let data = frame.data(|err| classify_stream_error(name, err))?;
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            BackendError::Transient(format!(
                "{name}: undecodable stream chunk ({e}): {}",
                clip(&one_line(data), MAX_MESSAGE_CHARS)
            ))
        })?;
        if let Some(err) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err(classify_stream_error(name, err));
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
            self.usage = Some(Usage {
                input_tokens: n("prompt_tokens"),
                output_tokens: n("completion_tokens"),
                cost_usd: u.get("cost").and_then(Value::as_f64),
            });
        }
        let choices = chunk.get("choices").and_then(Value::as_array);
        for choice in choices.into_iter().flatten() {
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.get("delta") {
                self.delta(delta, sink);
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                if reason == "error" {
                    return Err(BackendError::Transient(format!(
                        "{name}: the server ended the reply with finish_reason \"error\""
                    )));
                }
                self.finish_reason = Some(reason.to_owned());
            }
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }

    /// The end of the stream: complete tool calls and usage go to the sink.
    fn finish(self, name: &str, sink: Sink<'_>) -> Result<ModelReply, BackendError> {
        if !self.done && self.finish_reason.is_none() {
            return Err(BackendError::Transient(format!(
                "{name}: the stream ended before the reply was complete"
            )));
        }
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, pc) in self.calls {
            if pc.name.is_empty() {
                return Err(BackendError::Transient(format!(
                    "{name}: tool call {index} came without a function name"
                )));
            }
            let call = ToolCall {
                id: if pc.id.is_empty() {
                    generated_id()
                } else {
                    pc.id
                },
                name: pc.name,
                arguments: parse_arguments(&pc.arguments),
            };
            sink(Event::ToolCall(call.clone()));
            tool_calls.push(call);
        }
        Ok(http::finished_reply(
            self.text,
            self.reasoning,
            tool_calls,
            self.usage,
            self.finish_reason.as_deref() == Some("length"),
            sink,
        ))
    }
}

impl StreamState {
    fn delta(&mut self, delta: &Value, sink: Sink<'_>) {
        let text = |k: &str| {
            delta
                .get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        if let Some(r) = text("reasoning_content").or_else(|| text("reasoning")) {
            self.reasoning.push_str(r);
            sink(Event::Reasoning(r.to_owned()));
        }
        for key in ["content", "refusal"] {
            if let Some(t) = text(key) {
                self.text.push_str(t);
                sink(Event::Text(t.to_owned()));
            }
        }
        let calls = delta.get("tool_calls").and_then(Value::as_array);
        for call in calls.into_iter().flatten() {
            let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
            let index = match call.get("index").and_then(Value::as_u64) {
                Some(i) => i,
                // No index: a new id starts a new call, anything else continues the last.
                None => match self.last_index {
                    Some(last)
                        if id.is_empty() || self.calls.get(&last).is_some_and(|c| c.id == id) =>
                    {
                        last
                    }
                    _ => self.calls.len() as u64,
                },
            };
            self.last_index = Some(index);
            let pc = self.calls.entry(index).or_default();
            if pc.id.is_empty() {
                pc.id = id.to_owned();
            }
            let function = call.get("function");
            let field = |k: &str| function.and_then(|f| f.get(k)).and_then(Value::as_str);
            if let Some(n) = field("name").filter(|n| !n.is_empty()) {
                // Some servers repeat the whole name in every fragment.
                if pc.name != n {
                    pc.name.push_str(n);
                }
            }
            if let Some(a) = field("arguments") {
                pc.arguments.push_str(a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::backend::ToolSpec;
    use crate::backend::http::{ApiKey, retry_after};
    use crate::config::{Backend as BackendCfg, BackendKind};
    use reqwest::header::{HeaderMap, HeaderValue};
    use serde_json::json;
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    use crate::backend::testserver::{self, Got, KEY, Reply, fake_env};

    /// The shared test server, with the API's `/v1` base path.
    async fn serve(replies: Vec<Reply>) -> (String, mpsc::UnboundedReceiver<Got>) {
        let (url, rx) = crate::backend::testserver::serve(replies).await;
        (format!("{url}/v1"), rx)
    }

    fn backend(base_url: &str, key_var: Option<&str>) -> OpenAi {
        timed(base_url, key_var, Default::default())
    }

    /// [`backend`] with the timeouts `t`.
    fn timed(base_url: &str, key_var: Option<&str>, t: crate::config::Timeouts) -> OpenAi {
        let cfg = BackendCfg {
            kind: BackendKind::OpenAi,
            base_url: Some(base_url.to_owned()),
            api_key_env: key_var.map(str::to_owned),
            model: Some("test-model".into()),
            file: None,
            api_key_file: None,
            context_limit: None,
            timeouts: t,
            force_first_tool: false,
            tool_prefill: None,
        };
        let mut b = OpenAi::new("local", &cfg).unwrap();
        b.http.keys.lookup = fake_env;
        b
    }

    fn request() -> ModelRequest {
        ModelRequest {
            messages: vec![Message::user("hi")],
            ..ModelRequest::default()
        }
    }

    async fn run(b: &OpenAi, req: &ModelRequest) -> (Result<ModelReply, BackendError>, Vec<Event>) {
        let mut events = Vec::new();
        let mut sink = |e: Event| events.push(e);
        let r = b.call(req, &mut sink).await;
        (r, events)
    }

    /// One chunk with a delta for choice 0.
    fn delta(d: Value) -> String {
        let c = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": "test-model", "choices": [{"index": 0, "delta": d, "finish_reason": null}]});
        format!("data: {c}\n\n")
    }

    fn finish(reason: &str) -> String {
        let c = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": "test-model", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]});
        format!("data: {c}\n\n")
    }

    const USAGE: &str = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5,\"total_tokens\":17,\"cost\":0.0015}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    #[tokio::test]
    async fn text_split_over_chunks_with_usage() {
        let text = format!(
            "{}: OPENROUTER PROCESSING\n\n{}{}{}{}{USAGE}{DONE}",
            delta(json!({"role": "assistant", "content": ""})),
            delta(json!({"content": "Hel"})),
            delta(json!({"content": "lo, wörld"})).replace("\n\n", "\r\n\r\n"),
            delta(json!({"content": "!"})),
            finish("stop"),
        );
        // Cut everywhere awkward: mid-line, mid-"data:", inside the two bytes of 'ö'.
        let bytes = text.as_bytes();
        let o = text.find('ö').unwrap() + 1;
        let cuts = [0, 7, 40, o, o + 30, bytes.len() - 3, bytes.len()];
        let mut chunks = Vec::new();
        for w in cuts.windows(2) {
            chunks.push(bytes[w[0]..w[1]].to_vec());
        }
        let reply = Reply {
            status: 200,
            headers: vec![("Content-Type", "text/event-stream".into())],
            chunks,
        };
        let (url, mut rx) = serve(vec![reply]).await;
        let b = backend(&url, Some("OLLIE_TEST_KEY_TEXT"));
        let req = ModelRequest {
            temperature: Some(0.5),
            max_tokens: Some(100),
            ..request()
        };
        let (r, events) = run(&b, &req).await;
        let r = r.unwrap();
        assert_eq!(r.text, "Hello, wörld!");
        let usage = Usage {
            input_tokens: 12,
            output_tokens: 5,
            cost_usd: Some(0.0015),
        };
        assert_eq!(r.usage, usage);
        assert!(r.tool_calls.is_empty() && r.reasoning.is_empty());
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
        assert!(
            got.head
                .starts_with("POST /v1/chat/completions HTTP/1.1\r\n")
        );
        assert_eq!(got.header("authorization"), Some(&*format!("Bearer {KEY}")));
        assert_eq!(got.header("content-type"), Some("application/json"));
        let body = got.json();
        assert_eq!(
            body,
            json!({
                "model": "test-model",
                "messages": [{"role": "user", "content": "hi"}],
                "temperature": 0.5,
                "max_tokens": 100,
                "stream": true,
                "stream_options": {"include_usage": true},
            })
        );
    }

    #[tokio::test]
    async fn reasoning_under_either_name() {
        let (url, _rx) = serve(vec![Reply::sse(&[
            &delta(json!({"role": "assistant", "reasoning_content": "Let me "})),
            &delta(json!({"reasoning_content": "think.", "content": null})),
            // vLLM sends both names with the same text: counted once.
            &delta(json!({"reasoning_content": " Both", "reasoning": " Both"})),
            &delta(json!({"reasoning": " And more."})),
            &delta(json!({"content": "Answer."})),
            &finish("stop"),
            DONE,
        ])])
        .await;
        let b = backend(&url, None);
        let (r, events) = run(&b, &request()).await;
        let r = r.unwrap();
        assert_eq!(r.reasoning, "Let me think. Both And more.");
        assert_eq!(r.text, "Answer.");
        assert_eq!(r.usage, Usage::default());
        assert_eq!(
            events,
            vec![
                Event::Reasoning("Let me ".into()),
                Event::Reasoning("think.".into()),
                Event::Reasoning(" Both".into()),
                Event::Reasoning(" And more.".into()),
                Event::Text("Answer.".into()),
            ]
        );
    }

    #[tokio::test]
    async fn one_tool_call_in_three_fragments() {
        let first = json!({"tool_calls": [{"index": 0, "id": "call_abc", "type": "function",
            "function": {"name": "file_read", "arguments": ""}}]});
        let frag = |a: &str| json!({"tool_calls": [{"index": 0, "function": {"arguments": a}}]});
        let (url, mut rx) = serve(vec![Reply::sse(&[
            &delta(json!({"role": "assistant", "content": null})),
            &delta(first),
            &delta(frag("{\"pa")),
            &delta(frag("th\": \"src/ma")),
            &delta(frag("in.rs\"}")),
            &finish("tool_calls"),
            USAGE,
            DONE,
        ])])
        .await;
        let b = backend(&url, None);
        let (r, events) = run(&b, &request()).await;
        let r = r.unwrap();
        let call = ToolCall {
            id: "call_abc".into(),
            name: "file_read".into(),
            arguments: json!({"path": "src/main.rs"}),
        };
        assert_eq!(r.tool_calls, vec![call.clone()]);
        assert_eq!(r.text, "");
        assert_eq!(events[0], Event::ToolCall(call));
        assert!(matches!(events[1], Event::Usage(_)));
        assert_eq!(events.len(), 2);
        // No key variable configured: no Authorization header.
        assert_eq!(rx.recv().await.unwrap().header("authorization"), None);
    }

    #[tokio::test]
    async fn two_parallel_tool_calls_interleaved() {
        let start = |i: u64, id: &str, name: &str| {
            json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""}}]})
        };
        let frag =
            |i: u64, a: &str| json!({"tool_calls": [{"index": i, "function": {"arguments": a}}]});
        let (url, _rx) = serve(vec![Reply::sse(&[
            &delta(json!({"content": "Reading both."})),
            &delta(start(0, "call_0", "file_read")),
            &delta(start(1, "call_1", "execute_code")),
            &delta(frag(1, "{\"language\":\"sh\",")),
            &delta(frag(0, "{\"path\":")),
            &delta(frag(1, "\"code\":\"ls\"}")),
            &delta(frag(0, "\"a.txt\"}")),
            &finish("tool_calls"),
            DONE,
        ])])
        .await;
        let b = backend(&url, None);
        let (r, events) = run(&b, &request()).await;
        let r = r.unwrap();
        let want = vec![
            ToolCall {
                id: "call_0".into(),
                name: "file_read".into(),
                arguments: json!({"path": "a.txt"}),
            },
            ToolCall {
                id: "call_1".into(),
                name: "execute_code".into(),
                arguments: json!({"language": "sh", "code": "ls"}),
            },
        ];
        assert_eq!(r.tool_calls, want);
        assert_eq!(r.text, "Reading both.");
        assert_eq!(
            events,
            vec![
                Event::Text("Reading both.".into()),
                Event::ToolCall(want[0].clone()),
                Event::ToolCall(want[1].clone()),
            ]
        );
    }

    #[tokio::test]
    async fn whole_calls_without_index_or_id() {
        // Ollama-style: each call complete in one delta, no index, no id.
        let (url, _rx) = serve(vec![Reply::sse(&[
            &delta(json!({"tool_calls": [
                {"function": {"name": "file_read", "arguments": "{\"path\":\"x\"}"}}]})),
            &delta(json!({"tool_calls": [
                {"id": "b", "function": {"name": "file_read", "arguments": "{\"path\":\"y\"}"}}]})),
            &finish("tool_calls"),
            DONE,
        ])])
        .await;
        let (r, _) = run(&backend(&url, None), &request()).await;
        let calls = r.unwrap().tool_calls;
        assert_eq!(calls.len(), 2);
        assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 21);
        assert_eq!(calls[0].arguments, json!({"path": "x"}));
        assert_eq!(
            (calls[1].id.as_str(), &calls[1].arguments),
            ("b", &json!({"path": "y"}))
        );
    }

    #[tokio::test]
    async fn invalid_arguments_are_wrapped() {
        let (url, _rx) = serve(vec![Reply::sse(&[
            &delta(json!({"tool_calls": [{"index": 0, "id": "c", "function":
                {"name": "file_read", "arguments": "{\"path\": \"a"}}]})),
            &finish("tool_calls"),
            DONE,
        ])])
        .await;
        let (r, _) = run(&backend(&url, None), &request()).await;
        assert_eq!(
            r.unwrap().tool_calls[0].arguments,
            json!({"_raw": "{\"path\": \"a"})
        );
    }

    #[test]
    fn arguments_parsing() {
        assert_eq!(parse_arguments(""), json!({}));
        assert_eq!(parse_arguments("  null "), json!({}));
        assert_eq!(parse_arguments("{\"a\":1}"), json!({"a": 1}));
        assert_eq!(parse_arguments("\"{\\\"a\\\":1}\""), json!({"a": 1}));
        assert_eq!(parse_arguments("[1]"), json!({"_raw": "[1]"}));
        assert_eq!(parse_arguments("\"x\""), json!({"_raw": "\"x\""}));
        assert_eq!(parse_arguments("{oops"), json!({"_raw": "{oops"}));
    }

    #[tokio::test]
    async fn rate_limited_with_retry_after() {
        let mut r = Reply::json(
            429,
            r#"{"error":{"message":"slow down","type":"requests"}}"#,
        );
        r.headers.push(("Retry-After", "7".into()));
        let mut ms = Reply::json(429, "{}");
        ms.headers.push(("retry-after-ms", "1500".into()));
        let quota = Reply::json(
            429,
            r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
        );
        let (url, _rx) = serve(vec![r, ms, Reply::json(429, ""), quota]).await;
        let b = backend(&url, None);
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::RateLimited {
                retry_after: Some(7)
            }
        );
        assert_eq!(e.to_string(), "rate limited (retry after 7 s)");
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::RateLimited {
                retry_after: Some(2)
            }
        );
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(e, BackendError::RateLimited { retry_after: None });
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::Fatal("local: http 429: You exceeded your current quota".into())
        );
    }

    #[tokio::test]
    async fn server_errors_are_transient() {
        let (url, _rx) = serve(vec![
            Reply::json(500, r#"{"error":{"message":"The server had an error"}}"#),
            Reply::json(503, ""),
        ])
        .await;
        let b = backend(&url, None);
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::Transient("local: http 500: The server had an error".into())
        );
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::Transient("local: http 503: service unavailable".into())
        );
    }

    #[tokio::test]
    async fn stream_cut_mid_message_is_transient() {
        // Closed without [DONE] or finish_reason, once between events and once mid-event.
        let a = delta(json!({"content": "Hel"}));
        let b2 = delta(json!({"content": "lo"}));
        let (url, _rx) = serve(vec![Reply::sse(&[&a, &b2]), Reply::sse(&[&a, &b2[..20]])]).await;
        let b = backend(&url, None);
        for _ in 0..2 {
            let (r, events) = run(&b, &request()).await;
            assert_eq!(
                r.unwrap_err(),
                BackendError::Transient(
                    "local: the stream ended before the reply was complete".into()
                )
            );
            assert_eq!(events[0], Event::Text("Hel".into()));
        }
    }

    #[tokio::test]
    async fn chunked_body_cut_is_transient() {
        let mut r = Reply::sse(&["40\r\n", &delta(json!({"content": "x"}))[..30]]);
        r.headers.push(("Transfer-Encoding", "chunked".into()));
        let (url, _rx) = serve(vec![r]).await;
        let e = run(&backend(&url, None), &request()).await.0.unwrap_err();
        assert!(
            matches!(&e, BackendError::Transient(m) if m.starts_with("local: reading the stream failed")),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn finish_reason_without_done_is_complete() {
        let (url, _rx) = serve(vec![Reply::sse(&[
            &delta(json!({"content": "ok"})),
            &finish("stop"),
        ])])
        .await;
        let (r, _) = run(&backend(&url, None), &request()).await;
        assert_eq!(r.unwrap().text, "ok");
    }

    /// A server that keeps connections open gets the next request on the first one's
    /// connection (the pool reuses it), and every stream, sent chunked, reads whole: also
    /// when the body's end comes after `[DONE]` in a write of its own, which the reply does
    /// not wait for (it is read in the background, and the connection then goes back to the
    /// pool).
    #[tokio::test]
    async fn a_kept_alive_connection_is_reused() {
        for late_end in [false, true] {
            let (url, mut rx) = crate::backend::testserver::serve_kept(
                vec![
                    Reply::sse(&[
                        &delta(json!({"content": "one"})),
                        &finish("stop"),
                        USAGE,
                        DONE,
                    ]),
                    Reply::sse(&[&delta(json!({"content": "two"})), &finish("stop"), DONE]),
                ],
                late_end,
            )
            .await;
            let b = backend(&url, None);
            let r = run(&b, &request()).await.0.unwrap();
            assert_eq!((r.text.as_str(), r.usage.output_tokens), ("one", 5));
            if late_end {
                // The server's end of the body, then ample time for the background read.
                tokio::time::sleep(crate::backend::testserver::LATE_END * 5).await;
            }
            let r = run(&b, &request()).await.0.unwrap();
            assert_eq!(r.text, "two");
            let (first, second) = (rx.recv().await.unwrap(), rx.recv().await.unwrap());
            assert_eq!(
                (first.conn, second.conn),
                (0, 0),
                "late_end {late_end}: a new connection was opened"
            );
        }
    }

    #[tokio::test]
    async fn finish_reason_length_marks_the_reply_truncated() {
        let (url, _rx) = serve(vec![
            Reply::sse(&[
                &delta(json!({"content": "The answer is"})),
                &finish("length"),
                DONE,
            ]),
            Reply::sse(&[&delta(json!({"content": "42."})), &finish("stop"), DONE]),
        ])
        .await;
        let b = backend(&url, None);
        let r = run(&b, &request()).await.0.unwrap();
        assert_eq!((r.text.as_str(), r.truncated), ("The answer is", true));
        let r = run(&b, &request()).await.0.unwrap();
        assert_eq!((r.text.as_str(), r.truncated), ("42.", false));
    }

    #[test]
    fn a_forced_call_sends_tool_choice_required_and_the_prefill_last() {
        let tool = ToolSpec {
            name: "file_read".into(),
            description: "Read a file.".into(),
            parameters: json!({"type": "object"}),
        };
        let body = |req: &ModelRequest| -> Value {
            serde_json::from_slice(&request_body("m", req).unwrap()).unwrap()
        };
        let forced = ModelRequest {
            tools: vec![tool.clone()],
            tool_choice: ToolChoice::Required,
            prefill: Some("<tool_call>\n".into()),
            ..request()
        };
        let b = body(&forced);
        assert_eq!(b["tool_choice"], "required", "{b}");
        assert_eq!(
            b["messages"],
            json!([{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "<tool_call>\n"}])
        );
        // Auto: no tool_choice at all (the API's default), whatever the tools.
        let free = ModelRequest {
            tools: vec![tool],
            ..request()
        };
        assert!(body(&free).get("tool_choice").is_none());
        // Nothing to call: nothing is forced.
        let toolless = ModelRequest {
            tool_choice: ToolChoice::Required,
            ..request()
        };
        assert!(body(&toolless).get("tool_choice").is_none());
    }

    #[tokio::test]
    async fn context_overflow() {
        let (url, _rx) = serve(vec![
            Reply::json(
                400,
                r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            ),
            // llama.cpp (older versions answered 500).
            Reply::json(
                500,
                r#"{"error":{"code":500,"message":"the request exceeds the available context size. try increasing the context size or enable context shift","type":"exceed_context_size_error","n_prompt_tokens":1407,"n_ctx":256}}"#,
            ),
        ])
        .await;
        let b = backend(&url, None);
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::ContextOverflow(
                "local: http 400: This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.".into()
            )
        );
        let e = run(&b, &request()).await.0.unwrap_err();
        assert!(matches!(e, BackendError::ContextOverflow(_)), "{e:?}");
    }

    #[tokio::test]
    async fn client_errors_are_fatal_one_line_and_never_show_the_key() {
        let long = format!(
            r#"{{"error":{{"message":"Incorrect API key provided: {KEY}.\nYou can find your API key at https://example.invalid/{}","type":"invalid_request_error","code":"invalid_api_key"}}}}"#,
            "x".repeat(400)
        );
        let (url, _rx) = serve(vec![
            Reply::json(401, &long),
            Reply::json(404, "404 page not found"),
        ])
        .await;
        let b = backend(&url, Some("OLLIE_TEST_KEY_FATAL"));
        let e = run(&b, &request()).await.0.unwrap_err();
        let BackendError::Fatal(m) = &e else {
            panic!("{e:?}")
        };
        assert!(
            m.starts_with("local: http 401: Incorrect API key provided: <redacted>. You can"),
            "{m}"
        );
        assert!(!m.contains(KEY) && !m.contains('\n'), "{m}");
        assert!(m.chars().count() < 240 && m.ends_with('…'), "{m}");
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::Fatal("local: http 404: 404 page not found".into())
        );
        assert!(!format!("{b:?}").contains(KEY));
        assert_eq!(format!("{:?}", ApiKey(KEY.into())), "ApiKey(<redacted>)");
    }

    #[tokio::test]
    async fn errors_inside_the_stream() {
        let (url, _rx) = serve(vec![
            Reply::sse(&[
                &delta(json!({"content": "a"})),
                "data: {\"error\":{\"code\":502,\"message\":\"Provider returned error\"}}\n\n",
            ]),
            Reply::sse(&["error: {\"code\":500,\"message\":\"the request exceeds the available context size\",\"type\":\"exceed_context_size_error\"}\n\n"]),
            Reply::sse(&["data: {\"error\":{\"code\":429,\"message\":\"busy\"}}\n\n"]),
            Reply::sse(&["data: not json\n\n"]),
        ])
        .await;
        let b = backend(&url, None);
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::Transient("local: error in stream: Provider returned error".into())
        );
        let e = run(&b, &request()).await.0.unwrap_err();
        assert!(matches!(e, BackendError::ContextOverflow(_)), "{e:?}");
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(e, BackendError::RateLimited { retry_after: None });
        let e = run(&b, &request()).await.0.unwrap_err();
        assert!(
            matches!(&e, BackendError::Transient(m) if m.contains("undecodable stream chunk")),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn errors_inside_the_stream_never_show_the_key() {
        let echo =
            format!("data: {{\"error\":{{\"code\":401,\"message\":\"invalid key {KEY}\"}}}}\n\n");
        let junk = format!("data: {{not json {KEY}\n\n");
        let (url, _rx) = serve(vec![Reply::sse(&[&echo]), Reply::sse(&[&junk])]).await;
        let b = backend(&url, Some("OLLIE_TEST_KEY_STREAM"));
        let e = run(&b, &request()).await.0.unwrap_err();
        assert_eq!(
            e,
            BackendError::Fatal("local: error in stream: invalid key <redacted>".into())
        );
        let e = run(&b, &request()).await.0.unwrap_err();
        assert!(
            matches!(&e, BackendError::Transient(m) if m.contains("{not json <redacted>")),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn full_conversation_request_body() {
        let (url, mut rx) = serve(vec![Reply::sse(&[&finish("stop"), DONE])]).await;
        let b = backend(&url, Some("OLLIE_TEST_KEY_BODY"));
        let req = ModelRequest {
            model: Some("other-model".into()),
            system: Some("You are terse.".into()),
            messages: vec![
                Message::user("list files"),
                Message {
                    role: Role::Assistant,
                    content: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "call_1".into(),
                        name: "execute_code".into(),
                        arguments: json!({"language": "sh", "code": "ls"}),
                    }],
                    tool_call_id: None,
                },
                Message {
                    role: Role::Tool,
                    content: "a.txt\n".into(),
                    tool_calls: Vec::new(),
                    tool_call_id: Some("call_1".into()),
                },
                Message {
                    role: Role::Assistant,
                    content: "One file.".into(),
                    tool_calls: Vec::new(),
                    tool_call_id: None,
                },
            ],
            tools: vec![ToolSpec {
                name: "execute_code".into(),
                description: "Run code.".into(),
                parameters: json!({"type": "object", "properties": {"code": {"type": "string"}}}),
            }],
            temperature: None,
            top_p: Some(0.9),
            max_tokens: None,
            tool_choice: ToolChoice::Auto,
            prefill: None,
        };
        let (r, events) = run(&b, &req).await;
        assert_eq!(r.unwrap(), ModelReply::default());
        assert!(events.is_empty());
        let got = rx.recv().await.unwrap();
        assert_eq!(got.header("authorization"), Some(&*format!("Bearer {KEY}")));
        let body = got.json();
        assert_eq!(
            body,
            json!({
                "model": "other-model",
                "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "list files"},
                    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                        "type": "function", "function": {"name": "execute_code",
                        "arguments": "{\"code\":\"ls\",\"language\":\"sh\"}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\n"},
                    {"role": "assistant", "content": "One file."},
                ],
                "tools": [{"type": "function", "function": {"name": "execute_code",
                    "description": "Run code.", "parameters":
                    {"type": "object", "properties": {"code": {"type": "string"}}}}}],
                "top_p": 0.9,
                "stream": true,
                "stream_options": {"include_usage": true},
            })
        );
    }

    #[tokio::test]
    async fn list_models() {
        let (url, mut rx) = serve(vec![
            Reply::json(
                200,
                r#"{"object":"list","data":[{"id":"gpt-a","object":"model"},{"id":"gpt-b","object":"model"}]}"#,
            ),
            Reply::json(500, "oops"),
        ])
        .await;
        let b = backend(&url, Some("OLLIE_TEST_KEY_MODELS"));
        assert_eq!(b.list_models().await.unwrap(), ["gpt-a", "gpt-b"]);
        let got = rx.recv().await.unwrap();
        assert!(got.head.starts_with("GET /v1/models HTTP/1.1\r\n"));
        assert_eq!(got.header("authorization"), Some(&*format!("Bearer {KEY}")));
        assert_eq!(
            b.list_models().await.unwrap_err(),
            BackendError::Transient("local: http 500: oops".into())
        );
    }

    #[tokio::test]
    async fn context_windows_come_from_models_and_llama_cpp_props() {
        // llama.cpp: /models tells the trained window, /props the slot's (smaller) one.
        let (url, mut rx) = serve(vec![
            Reply::json(
                200,
                r#"{"object":"list","data":[{"id":"smol","object":"model","owned_by":"llamacpp","meta":{"n_ctx_train":8192}}]}"#,
            ),
            Reply::json(200, r#"{"default_generation_settings":{"n_ctx":4096}}"#),
        ])
        .await;
        let b = backend(&url, None);
        assert_eq!(b.context_window("smol").await, Some(4096));
        assert!(rx.recv().await.unwrap().head.starts_with("GET /v1/models "));
        assert!(rx.recv().await.unwrap().head.starts_with("GET /props "));
        // Asked once: the second answer comes from memory (the server has no more replies).
        assert_eq!(b.context_window("smol").await, Some(4096));
        assert_eq!(b.context_window("other").await, None);
        // OpenRouter's context_length; a server that lists none: unknown.
        let (url, _rx) = serve(vec![Reply::json(
            200,
            r#"{"data":[{"id":"a","context_length":200000},{"id":"b"}]}"#,
        )])
        .await;
        let b = backend(&url, None);
        assert_eq!(b.context_window("a").await, Some(200_000));
        assert_eq!(b.context_window("b").await, None);
        // An error: unknown, not a failure.
        let (url, _rx) = serve(vec![Reply::json(500, "oops")]).await;
        assert_eq!(backend(&url, None).context_window("a").await, None);
    }

    /// The context-window lookup and the model list are bounded by the backend's timeouts
    /// (here `first_byte_timeout_s = 1`): against a server that never answers, or sends a head
    /// and stalls, the list fails naming the path and the timeout, and the lookup ends with the
    /// window unknown (the turn goes on with the default), not after a limit of its own.
    #[tokio::test]
    async fn lookups_and_lists_run_out_of_the_backends_timeouts() {
        let first_byte = testserver::only("first_byte");
        for reply in [b"" as &[u8], testserver::JSON_HEAD] {
            let url = testserver::stalling(vec![reply]).await;
            let b = timed(&format!("{url}/v1"), None, first_byte);
            assert_eq!(
                b.list_models().await.unwrap_err(),
                BackendError::Transient(
                    "local: /v1/models: timed out: no reply within 1 s (first_byte_timeout_s)"
                        .into()
                )
            );
            assert_eq!(b.context_window("m").await, None);
        }
        // llama.cpp's /props stalls after /models answered: the window /models told stands.
        let url = testserver::stalling(vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 74\r\n\r\n{\"data\":[{\"id\":\"smol\",\"owned_by\":\"llamacpp\",\"meta\":{\"n_ctx_train\":8192}}]}",
            b"",
        ])
        .await;
        let b = timed(&format!("{url}/v1"), None, first_byte);
        assert_eq!(b.context_window("smol").await, Some(8192));
    }

    #[tokio::test]
    async fn missing_key_or_model_fails_before_connecting() {
        // The real environment: this variable is not set.
        let cfg = BackendCfg {
            kind: BackendKind::OpenAi,
            base_url: Some("http://127.0.0.1:9/v1".into()),
            api_key_env: Some("OLLIE_TEST_UNSET_VARIABLE_7f3a".into()),
            model: None,
            file: None,
            api_key_file: None,
            context_limit: None,
            timeouts: Default::default(),
            force_first_tool: false,
            tool_prefill: None,
        };
        let b = OpenAi::new("remote", &cfg).unwrap();
        let req = ModelRequest {
            model: Some("m".into()),
            ..request()
        };
        assert_eq!(
            run(&b, &req).await.0.unwrap_err(),
            BackendError::Fatal(
                "remote: environment variable OLLIE_TEST_UNSET_VARIABLE_7f3a (api_key_env) is not set or empty".into()
            )
        );
        assert!(matches!(b.list_models().await, Err(BackendError::Fatal(_))));
        assert_eq!(
            run(&b, &request()).await.0.unwrap_err(),
            BackendError::Fatal(
                "remote: no model (set model in the backend or the agent profile)".into()
            )
        );
    }

    #[tokio::test]
    async fn connection_refused_is_transient() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let b = backend(&format!("http://{addr}/v1"), None);
        let e = run(&b, &request()).await.0.unwrap_err();
        let BackendError::Transient(m) = &e else {
            panic!("{e:?}")
        };
        assert!(m.starts_with("local: request cannot connect: "), "{m}");
        assert!(!m.contains('\n'), "{m}");
    }

    #[test]
    fn base_url_validation() {
        let cfg = |u: Option<&str>| BackendCfg {
            kind: BackendKind::OpenAi,
            base_url: u.map(str::to_owned),
            api_key_env: None,
            model: None,
            file: None,
            api_key_file: None,
            context_limit: None,
            timeouts: Default::default(),
            force_first_tool: false,
            tool_prefill: None,
        };
        assert_eq!(
            OpenAi::new("x", &cfg(None)).unwrap().http.base_url,
            DEFAULT_BASE_URL
        );
        assert_eq!(
            OpenAi::new("x", &cfg(Some("http://[::1]:8080/v1/")))
                .unwrap()
                .http
                .base_url,
            "http://[::1]:8080/v1"
        );
        let cases = [
            (
                "ftp://host/v1",
                "backends.x.base_url: scheme \"ftp\" is not supported",
            ),
            (
                "not a url",
                "backends.x.base_url: \"not a url\" is not a url",
            ),
            ("https://user:pw@host/v1", "must not contain credentials"),
            ("https://host/v1?x=1", "must not have a query"),
            ("unix:/run/sock", "scheme \"unix\""),
        ];
        for (u, want) in cases {
            let e = OpenAi::new("x", &cfg(Some(u))).unwrap_err();
            assert!(e.contains(want), "{u}: {e}");
            assert!(!e.contains("pw"), "{e}");
        }
    }

    #[test]
    fn retry_after_forms() {
        let h = |k: &'static str, v: &str| {
            let mut m = HeaderMap::new();
            m.insert(k, HeaderValue::from_str(v).unwrap());
            retry_after(&m)
        };
        assert_eq!(h("retry-after", "7"), Some(7));
        assert_eq!(h("retry-after", "0.2"), Some(1));
        assert_eq!(h("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(h("retry-after", "-3"), None);
        assert_eq!(h("retry-after-ms", "20"), Some(1));
    }
}
