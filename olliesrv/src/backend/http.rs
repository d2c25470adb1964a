//! What the HTTP backends share: the endpoint (base URL checks, the client, proxy bypass for
//! loopback), the API key (from an environment variable or a 0600 file, never shown), error
//! classification of HTTP replies, server-sent event framing and tool-argument parsing.
//!
//! Every request to a backend goes through [`Conn::send`] (a model list or lookup through
//! [`Conn::get_json`]), so that each is bounded by the backend's configured timeouts
//! ([`Timeouts`]): the connection, the reply's first byte, each silence after it.

use std::fmt;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ollie_link::text::{clip, one_line};
use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Response, Url};
use serde::Serialize;
use serde_json::{Map, Value, json};

use std::future::Future;
use std::pin::Pin;

pub(super) use super::framing::{Frame, Framer, MAX_EVENT, SseParser};
use super::{
    Backend, BackendError, Event, ModelReply, ModelRequest, Sink, ToolCall, ToolSpec, Usage,
};
use crate::config::Timeouts;

/// The media type of server-sent events (the `Accept` of a streamed request).
pub(super) const SSE: &str = "text/event-stream";
/// The most a model list or context-window lookup may take as a whole, on top of the
/// backend's own timeouts (which still bound each of its waits).
const LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// The most of an error body read.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// How long reading an error body may take (then the status alone classifies it).
const ERROR_BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest model-list reply.
pub(super) const MAX_LIST_BODY: usize = 8 << 20;
/// Server messages in errors are cut to this many characters.
pub(super) const MAX_MESSAGE_CHARS: usize = 200;
/// The largest API key file.
const MAX_KEY_FILE: u64 = 64 * 1024;

/// Phrases (lowercase) with which servers say the request does not fit the context.
const CONTEXT_PHRASES: &[&str] = &[
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "context_length",
    "exceed_context_size",
    "context size",
    "context window",
    "prompt is too long",
];

/// A checked base URL and an HTTP client for it.
pub(super) struct Endpoint {
    /// Without a trailing `/`.
    pub base_url: String,
    pub client: reqwest::Client,
    pub timeouts: Timeouts,
}

impl Endpoint {
    /// The endpoint of config entry `name`: `base_url` (or `default`) must be an `http`/`https`
    /// URL with a host and without credentials, query or fragment. Loopback hosts bypass any
    /// configured proxy. Connecting may take `timeouts.connect`; the other two apply to every
    /// reply once the request is sent through [`Conn::send`] ([`Stream::chunk`]).
    pub fn new(
        name: &str,
        base_url: Option<&str>,
        default: &str,
        timeouts: Timeouts,
    ) -> Result<Endpoint, String> {
        let raw = base_url.unwrap_or(default);
        let url = Url::parse(raw)
            .map_err(|e| format!("backends.{name}.base_url: {raw:?} is not a url ({e})"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "backends.{name}.base_url: scheme {:?} is not supported (valid: http, https)",
                url.scheme()
            ));
        }
        let Some(host) = url.host_str() else {
            return Err(format!("backends.{name}.base_url: {raw:?} has no host"));
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!(
                "backends.{name}.base_url: must not contain credentials (name the key's variable in api_key_env)"
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "backends.{name}.base_url: must not have a query or fragment"
            ));
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            .user_agent(concat!("ollie/", env!("CARGO_PKG_VERSION")));
        if is_loopback_host(host) {
            builder = builder.no_proxy();
        }
        let client = builder
            .build()
            .map_err(|e| format!("backend {name}: cannot make an http client: {e}"))?;
        Ok(Endpoint {
            base_url: url.as_str().trim_end_matches('/').to_owned(),
            client,
            timeouts,
        })
    }
}

/// Whether a URL host (name, IPv4 or bracketed IPv6) is this machine.
pub(super) fn is_loopback_host(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// An API key; `Debug` never shows it.
pub(super) struct ApiKey(pub String);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl ApiKey {
    /// `text` with every occurrence of the key replaced (and its start, where `text` was cut
    /// short inside it: [`crate::redact::redact_key`]).
    pub fn scrub(&self, text: &str) -> String {
        crate::redact::redact_key(text.into(), &self.0).into_owned()
    }

    /// A header value (`prefix` + key), marked sensitive so that it is never logged.
    pub fn header(&self, name: &str, prefix: &str) -> Result<HeaderValue, BackendError> {
        let mut v = HeaderValue::from_str(&format!("{prefix}{}", self.0)).map_err(|_| {
            BackendError::Fatal(format!(
                "{name}: the api key has characters not allowed in an http header"
            ))
        })?;
        v.set_sensitive(true);
        Ok(v)
    }
}

/// Where a backend's API key comes from: the variable named by `api_key_env`, else the file
/// named by `api_key_file` (a regular file owned by this user, not readable by group or
/// others). Read at each call, so a rotated key is picked up without a restart.
pub(super) struct KeySource {
    pub env: Option<String>,
    pub file: Option<PathBuf>,
    /// Reads an environment variable (`std::env::var`; tests substitute their own, since the
    /// crate forbids the `unsafe` that `set_var` needs).
    pub lookup: fn(&str) -> Option<String>,
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeySource")
            .field("env", &self.env)
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

fn env_lookup(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl KeySource {
    pub fn new(cfg: &crate::config::Backend) -> KeySource {
        KeySource {
            env: cfg.api_key_env.clone(),
            file: cfg.api_key_file.clone(),
            lookup: env_lookup,
        }
    }

    /// The key, if one is configured; a configured source that is unset, empty, unreadable,
    /// too open or holds a key shorter than [`crate::redact::MIN_KEY_CHARS`] is an error
    /// naming the source (never the key). The key is remembered for redaction
    /// ([`crate::redact`]).
    pub fn key(&self, name: &str) -> Result<Option<ApiKey>, BackendError> {
        let (key, source) = if let Some(var) = &self.env {
            match (self.lookup)(var) {
                Some(k) if !k.trim().is_empty() => (k.trim().to_owned(), var.clone()),
                _ => {
                    return Err(BackendError::Fatal(format!(
                        "{name}: environment variable {var} (api_key_env) is not set or empty"
                    )));
                }
            }
        } else if let Some(path) = &self.file {
            let k = read_key_file(path).map_err(|e| {
                BackendError::Fatal(format!("{name}: api_key_file {}: {e}", path.display()))
            })?;
            (k, path.display().to_string())
        } else {
            return Ok(None);
        };
        if key.chars().count() < crate::redact::MIN_KEY_CHARS {
            return Err(BackendError::Fatal(format!(
                "{name}: the API key in {source} is too short: at least {} characters",
                crate::redact::MIN_KEY_CHARS
            )));
        }
        crate::redact::remember(&key);
        Ok(Some(ApiKey(key)))
    }
}

/// The key in `path`: trimmed, non-empty, from a regular file this user owns with no group or
/// other permissions.
fn read_key_file(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string().to_lowercase())?;
    let meta = f.metadata().map_err(|e| e.to_string().to_lowercase())?;
    if !meta.is_file() {
        return Err("not a regular file".to_owned());
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(format!("owned by uid {}, not by this user", meta.uid()));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!("mode {mode:04o} lets others read it (chmod 600)"));
    }
    let mut text = String::new();
    f.by_ref()
        .take(MAX_KEY_FILE)
        .read_to_string(&mut text)
        .map_err(|_| "not valid utf-8 text".to_owned())?;
    let key = text.trim();
    if key.is_empty() {
        return Err("is empty".to_owned());
    }
    Ok(key.to_owned())
}

/// `e` with the key replaced in its message (a server could echo it in a stream error).
pub(super) fn scrubbed(e: BackendError, key: Option<&ApiKey>) -> BackendError {
    let Some(k) = key else {
        return e;
    };
    match e {
        BackendError::Transient(m) => BackendError::Transient(k.scrub(&m)),
        BackendError::ContextOverflow(m) => BackendError::ContextOverflow(k.scrub(&m)),
        BackendError::Fatal(m) => BackendError::Fatal(k.scrub(&m)),
        e @ BackendError::RateLimited { .. } => e,
    }
}

/// The model of a request: its own, else the backend's default; none is an error.
pub(super) fn model_of<'a>(
    name: &str,
    req: &'a super::ModelRequest,
    default: Option<&'a str>,
) -> Result<&'a str, BackendError> {
    req.model.as_deref().or(default).ok_or_else(|| {
        BackendError::Fatal(format!(
            "{name}: no model (set model in the backend or the agent profile)"
        ))
    })
}

/// What every HTTP backend holds: its configured name, endpoint, key source and default
/// model. The backends keep only their paths, headers and JSON shapes.
pub(super) struct Conn {
    /// The backend's name in the configuration (prefixes every error).
    pub name: String,
    /// Without a trailing `/`.
    pub base_url: String,
    /// Where the API key comes from (none configured: send no key).
    pub keys: KeySource,
    /// The model when the request names none.
    pub model: Option<String>,
    pub client: reqwest::Client,
    pub timeouts: Timeouts,
    /// How long a model list or lookup may take as a whole ([`LIST_TIMEOUT`]).
    pub list_limit: Duration,
}

impl Conn {
    /// The connection of config entry `name` to the checked endpoint `ep`.
    pub fn new(name: &str, cfg: &crate::config::Backend, ep: Endpoint) -> Conn {
        Conn {
            name: name.to_owned(),
            base_url: ep.base_url,
            keys: KeySource::new(cfg),
            model: cfg.model.clone(),
            client: ep.client,
            timeouts: ep.timeouts,
            list_limit: LIST_TIMEOUT,
        }
    }

    /// `Debug` for the backend type `ty` holding this connection (never the key).
    pub fn debug(&self, f: &mut fmt::Formatter<'_>, ty: &str) -> fmt::Result {
        f.debug_struct(ty)
            .field("name", &self.name)
            .field("base_url", &self.base_url)
            .field("keys", &self.keys)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }

    /// The key for this call (none configured: `None`).
    pub fn api_key(&self) -> Result<Option<ApiKey>, BackendError> {
        self.keys.key(&self.name)
    }

    /// `rb` with `Authorization: Bearer <key>` when there is a key.
    pub fn bearer(
        &self,
        rb: reqwest::RequestBuilder,
        key: Option<&ApiKey>,
    ) -> Result<reqwest::RequestBuilder, BackendError> {
        Ok(match key {
            Some(k) => rb.header(
                reqwest::header::AUTHORIZATION,
                k.header(&self.name, "Bearer ")?,
            ),
            None => rb,
        })
    }

    /// The model of `req` (see [`model_of`]), logging the request as `what`.
    pub fn start<'a>(&'a self, req: &'a ModelRequest, what: &str) -> Result<&'a str, BackendError> {
        let model = model_of(&self.name, req, self.model.as_deref())?;
        tracing::debug!(
            backend = %self.name,
            model,
            messages = req.messages.len(),
            tools = req.tools.len(),
            "{what}"
        );
        Ok(model)
    }

    /// A streamed JSON `POST {base_url}{path}` of `body`, accepting `accept`.
    pub fn post(&self, path: &str, accept: &str, body: Vec<u8>) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}{path}", self.base_url))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, accept)
            .body(body)
    }

    /// Sends the request `rb`, the way every request to the backend goes: the connection
    /// must be made within `connect_timeout_s` and the reply's head must come within
    /// `first_byte_timeout_s`, which also bounds the wait for its first body byte
    /// ([`Stream::chunk`]). Transport errors are classified as by [`Conn::transport`].
    pub async fn send(&self, rb: reqwest::RequestBuilder) -> Result<Stream, BackendError> {
        let (client, req) = rb.build_split();
        let req = req.map_err(|e| transport(&self.name, "request", e))?;
        self.execute(&client, req).await
    }

    /// [`Conn::send`] of a built request.
    async fn execute(
        &self,
        client: &reqwest::Client,
        req: reqwest::Request,
    ) -> Result<Stream, BackendError> {
        let t = self.timeouts;
        let path = req.url().path().to_owned();
        let first_by = tokio::time::Instant::now() + t.first_byte;
        match tokio::time::timeout_at(first_by, client.execute(req)).await {
            Err(_) => Err(timed_out(
                &self.name,
                &path,
                "first_byte_timeout_s",
                t.first_byte,
            )),
            Ok(Err(e)) => Err(self.transport(&path, "request", e)),
            Ok(Ok(resp)) => Ok(Stream {
                resp,
                path,
                first_by: Some(first_by),
                timeouts: t,
            }),
        }
    }

    /// A connection or read failure (see [`transport`]); a connection to `path` that could
    /// not be made within `connect_timeout_s` says so.
    pub fn transport(&self, path: &str, what: &str, e: reqwest::Error) -> BackendError {
        if e.is_connect() && e.is_timeout() {
            return timed_out(&self.name, path, "connect_timeout_s", self.timeouts.connect);
        }
        transport(&self.name, what, e)
    }

    /// Sends a model-list or lookup request (`what` names it in errors, e.g. `/models`) and
    /// reads its JSON reply: under the backend's timeouts as every request ([`Conn::send`],
    /// [`Stream::chunk`]), and whole within `list_limit`. Transport failures and
    /// timeouts are transient, HTTP errors classified, the body capped at [`MAX_LIST_BODY`].
    pub async fn get_json(
        &self,
        rb: reqwest::RequestBuilder,
        key: Option<&ApiKey>,
        what: &str,
    ) -> Result<Value, BackendError> {
        let name = &self.name;
        let (client, req) = rb.build_split();
        let req = req.map_err(|e| transport(name, "request", e))?;
        let path = req.url().path().to_owned();
        let whole = async {
            let mut s = self.execute(&client, req).await?;
            if !s.resp.status().is_success() {
                return Err(status_error(name, s, key).await);
            }
            s.read_capped(name, MAX_LIST_BODY).await
        };
        let limit = self.list_limit;
        let body = tokio::time::timeout(limit, whole).await.map_err(|_| {
            BackendError::Transient(format!(
                "{name}: {path}: timed out: no whole reply within {} s (the limit of a model list)",
                limit.as_secs()
            ))
        })??;
        if body.len() >= MAX_LIST_BODY {
            return Err(BackendError::Fatal(format!(
                "{name}: {what} reply is larger than {} MiB",
                MAX_LIST_BODY >> 20
            )));
        }
        serde_json::from_slice(&body)
            .map_err(|e| BackendError::Fatal(format!("{name}: {what} reply is not json: {e}")))
    }

    /// [`Conn::send`], then an unsuccessful status is classified.
    pub async fn send_stream(
        &self,
        rb: reqwest::RequestBuilder,
        key: Option<&ApiKey>,
    ) -> Result<Stream, BackendError> {
        let s = self.send(rb).await?;
        if !s.resp.status().is_success() {
            return Err(status_error(&self.name, s, key).await);
        }
        Ok(s)
    }

    /// Sends the streamed request `rb` and reads its server-sent events (see [`read_sse`]);
    /// `on_frame`'s errors are scrubbed of `key`.
    pub async fn stream_sse(
        &self,
        rb: reqwest::RequestBuilder,
        key: Option<&ApiKey>,
        mut on_frame: impl FnMut(Frame) -> Result<bool, BackendError>,
    ) -> Result<(), BackendError> {
        let resp = self.send_stream(rb, key).await?;
        read_sse(&self.name, resp, |f| {
            on_frame(f).map_err(|e| scrubbed(e, key))
        })
        .await
    }

    /// A chat request for `req`: the body `body` encodes for its model, posted to `path`
    /// accepting `accept` and logged as `what`, with the key for this call. The key is not
    /// yet in the request: each API sends it in a header of its own.
    ///
    /// Bodies are encoded straight from the request's messages (borrowed, see
    /// [`FunctionTool`]), not through a `serde_json::Value` copy of the whole history: a
    /// request's memory is its messages and its bytes, nothing more.
    pub fn chat_request(
        &self,
        req: &ModelRequest,
        what: &str,
        path: &str,
        accept: &str,
        body: fn(&str, &ModelRequest) -> serde_json::Result<Vec<u8>>,
    ) -> Result<(reqwest::RequestBuilder, Option<ApiKey>), BackendError> {
        let model = self.start(req, what)?;
        let key = self.api_key()?;
        let body = body(model, req).map_err(|e| {
            BackendError::Fatal(format!("{}: the request cannot be encoded: {e}", self.name))
        })?;
        Ok((self.post(path, accept, body), key))
    }

    /// Sends the streamed chat request `rb` and reads its server-sent events into an `R`
    /// until it is done or the stream ends, then makes the reply from it.
    pub async fn chat_sse<R: SseReply>(
        &self,
        rb: reqwest::RequestBuilder,
        key: Option<&ApiKey>,
        sink: Sink<'_>,
    ) -> Result<ModelReply, BackendError> {
        let mut reply = R::default();
        self.stream_sse(rb, key, |frame| {
            reply.frame(&self.name, frame, sink)?;
            Ok(reply.done())
        })
        .await?;
        reply.finish(&self.name, sink)
    }

    /// The array `field` of a model-list reply to `what` (e.g. `/models`), else a fatal error.
    pub fn listed<'v>(
        &self,
        v: &'v Value,
        what: &str,
        field: &str,
    ) -> Result<&'v Vec<Value>, BackendError> {
        v.get(field).and_then(Value::as_array).ok_or_else(|| {
            BackendError::Fatal(format!("{}: {what} reply has no {field} array", self.name))
        })
    }
}

/// A tool as the OpenAI and Ollama chat APIs take it:
/// `{"type": "function", "function": {name, description, parameters}}`.
#[derive(Serialize)]
pub(super) struct FunctionTool<'a> {
    r#type: &'static str,
    function: FunctionSpec<'a>,
}

#[derive(Serialize)]
struct FunctionSpec<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// The request's tools as [`FunctionTool`]s.
pub(super) fn function_tools(tools: &[ToolSpec]) -> Vec<FunctionTool<'_>> {
    tools
        .iter()
        .map(|t| FunctionTool {
            r#type: "function",
            function: FunctionSpec {
                name: &t.name,
                description: &t.description,
                parameters: &t.parameters,
            },
        })
        .collect()
}

/// The reply of a finished stream; the usage the server reported, if it did, goes to `sink`
/// too (none reported: zeros in the reply and no event).
pub(super) fn finished_reply(
    text: String,
    reasoning: String,
    tool_calls: Vec<ToolCall>,
    reported: Option<Usage>,
    truncated: bool,
    sink: Sink<'_>,
) -> ModelReply {
    let usage = reported.unwrap_or_default();
    if reported.is_some() {
        sink(Event::Usage(usage));
    }
    ModelReply {
        text,
        reasoning,
        tool_calls,
        usage,
        truncated,
    }
}

/// How an API's streamed reply is read from its server-sent events (see [`Conn::chat_sse`]):
/// what the stream has said so far.
pub(super) trait SseReply: Default + Send {
    /// Takes one event of backend `name`'s stream, handing text as it comes to `sink`.
    fn frame(&mut self, name: &str, frame: Frame, sink: Sink<'_>) -> Result<(), BackendError>;

    /// Whether the stream has said that the reply is complete.
    fn done(&self) -> bool;

    /// The reply once the stream has ended; what was held back goes to `sink` now.
    fn finish(self, name: &str, sink: Sink<'_>) -> Result<ModelReply, BackendError>;
}

/// What differs between the HTTP backends' [`Backend`] impls (which follow from this).
pub(super) trait HttpApi: Send + Sync + fmt::Debug {
    /// Streams one reply.
    fn chat(
        &self,
        req: &ModelRequest,
        sink: Sink<'_>,
    ) -> impl Future<Output = Result<ModelReply, BackendError>> + Send;

    /// The models the server lists.
    fn models(&self) -> impl Future<Output = Result<Vec<String>, BackendError>> + Send;

    /// The context window the server tells for `model` ([`Backend::context_limit`]).
    fn context_window(&self, model: &str) -> impl Future<Output = Option<u64>> + Send {
        let _ = model;
        async { None }
    }
}

impl<T: HttpApi> Backend for T {
    fn call<'a>(
        &'a self,
        req: &'a ModelRequest,
        sink: Sink<'a>,
    ) -> Pin<Box<dyn Future<Output = Result<ModelReply, BackendError>> + Send + 'a>> {
        Box::pin(self.chat(req, sink))
    }

    fn list_models<'a>(
        &'a self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<String>, BackendError>> + Send + 'a>> {
        Box::pin(self.models())
    }

    fn context_limit<'a>(
        &'a self,
        model: &'a str,
    ) -> Pin<Box<dyn Future<Output = Option<u64>> + Send + 'a>> {
        Box::pin(self.context_window(model))
    }
}

/// Reads `resp` to its end through `framer`, handing each item to `on_item` until it says
/// the reply is done (`Ok(true)`). Read errors are classified as by [`transport`], framing
/// errors (over-long lines or events) are transient; `on_item`'s errors are returned as is.
/// What follows a done reply is read in the background ([`Stream::release`]), so that the
/// connection can serve the next request.
pub(super) async fn read_stream<F: Framer>(
    name: &str,
    mut resp: Stream,
    mut framer: F,
    mut on_item: impl FnMut(F::Item) -> Result<bool, BackendError>,
) -> Result<(), BackendError> {
    let mut items = Vec::new();
    loop {
        let chunk = resp.chunk(name).await?;
        let end = chunk.is_none();
        match chunk {
            Some(bytes) => framer.feed(&bytes, &mut items),
            None => framer.finish(&mut items),
        }
        .map_err(|e| BackendError::Transient(format!("{name}: {e}")))?;
        for item in items.drain(..) {
            if on_item(item)? {
                if !end {
                    resp.release();
                }
                return Ok(());
            }
        }
        if end {
            return Ok(());
        }
    }
}

/// Reads a server-sent event reply (see [`read_stream`]).
pub(super) async fn read_sse(
    name: &str,
    resp: Stream,
    on_frame: impl FnMut(Frame) -> Result<bool, BackendError>,
) -> Result<(), BackendError> {
    read_stream(name, resp, SseParser::default(), on_frame).await
}

/// How much of a done reply's remainder [`Stream::release`] reads, and for how long, before
/// it gives the connection up.
const RELEASE_LIMIT: usize = 64 << 10;
const RELEASE_TIME: Duration = Duration::from_secs(5);

/// A reply, read under the backend's timeouts.
#[derive(Debug)]
pub(super) struct Stream {
    pub resp: Response,
    /// The request's URL path, for errors.
    path: String,
    /// Until the first body byte: when `first_byte_timeout_s` runs out.
    first_by: Option<tokio::time::Instant>,
    timeouts: Timeouts,
}

impl Stream {
    /// `resp` (just received) read under `timeouts`.
    #[cfg(test)]
    pub fn new(resp: Response, timeouts: Timeouts) -> Stream {
        Stream {
            path: resp.url().path().to_owned(),
            resp,
            first_by: Some(tokio::time::Instant::now() + timeouts.first_byte),
            timeouts,
        }
    }

    /// Reads what is left of a reply whose content is complete (an SSE stream's end after
    /// `[DONE]`, the last chunk's terminator) in a task of its own, then drops it: an HTTP/1.1
    /// connection goes back to the pool only once its body has been read to the end. A body
    /// that goes on for more than [`RELEASE_LIMIT`] bytes or [`RELEASE_TIME`] is dropped
    /// with its connection, as before.
    pub fn release(mut self) {
        tokio::spawn(async move {
            let mut left = RELEASE_LIMIT;
            let drain = async {
                while let Ok(Some(b)) = self.resp.chunk().await {
                    left = left.saturating_sub(b.len());
                    if left == 0 {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(RELEASE_TIME, drain).await;
        });
    }

    /// The next piece of the reply (`None` at its end): the first within
    /// `first_byte_timeout_s` of the request, each later one within `idle_timeout_s` of the
    /// one before.
    pub async fn chunk(&mut self, name: &str) -> Result<Option<bytes::Bytes>, BackendError> {
        let t = self.timeouts;
        let (deadline, key, limit) = match self.first_by {
            Some(d) => (d, "first_byte_timeout_s", t.first_byte),
            None => (
                tokio::time::Instant::now() + t.idle,
                "idle_timeout_s",
                t.idle,
            ),
        };
        match tokio::time::timeout_at(deadline, self.resp.chunk()).await {
            Err(_) => Err(timed_out(name, &self.path, key, limit)),
            Ok(r) => {
                self.first_by = None;
                r.map_err(|e| transport(name, "reading the stream", e))
            }
        }
    }

    /// At most `cap` bytes of the body, read as by [`Stream::chunk`] (the rest is dropped
    /// with the connection).
    pub async fn read_capped(&mut self, name: &str, cap: usize) -> Result<Vec<u8>, BackendError> {
        let mut out = Vec::new();
        while let Some(chunk) = self.chunk(name).await? {
            let room = cap.saturating_sub(out.len());
            out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if out.len() >= cap {
                break;
            }
        }
        Ok(out)
    }
}

/// A request to `path` that ran out of the timeout `key` (`limit`): worth a retry.
fn timed_out(name: &str, path: &str, key: &str, limit: Duration) -> BackendError {
    let what = match key {
        "connect_timeout_s" => "no connection",
        "first_byte_timeout_s" => "no reply",
        _ => "the reply stalled: nothing more",
    };
    BackendError::Transient(format!(
        "{name}: {path}: timed out: {what} within {} s ({key})",
        limit.as_secs()
    ))
}

/// A connection or read failure: worth a retry.
pub(super) fn transport(name: &str, what: &str, e: reqwest::Error) -> BackendError {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "failed"
    };
    let chain = clip(
        &one_line(&crate::error_chain(&e.without_url())),
        MAX_MESSAGE_CHARS,
    );
    BackendError::Transient(format!("{name}: {what} {kind}: {chain}"))
}

/// An unsuccessful HTTP status, classified (the key scrubbed from the server's message).
pub(super) async fn status_error(name: &str, resp: Stream, key: Option<&ApiKey>) -> BackendError {
    let status = resp.resp.status().as_u16();
    let retry = retry_after(resp.resp.headers());
    let mut body = error_body(name, resp).await;
    if let Some(k) = key {
        body = k.scrub(&body);
    }
    classify_http(name, status, retry, &body)
}

/// The text of an error reply (at most [`MAX_ERROR_BODY`] bytes, read under the backend's
/// timeouts and within [`ERROR_BODY_TIMEOUT`]); a body that cannot be read is empty, so that
/// the status alone classifies the error.
pub(super) async fn error_body(name: &str, mut resp: Stream) -> String {
    let read = resp.read_capped(name, MAX_ERROR_BODY);
    let body = tokio::time::timeout(ERROR_BODY_TIMEOUT, read)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    String::from_utf8_lossy(&body).into_owned()
}

/// Reads at most `cap` bytes of a body (the rest is dropped with the connection).
pub(super) async fn read_capped(mut resp: Response, cap: usize) -> Result<Vec<u8>, reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = cap.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= cap {
            break;
        }
    }
    Ok(out)
}

/// `Retry-After` in seconds (integer or decimal, rounded up), else `retry-after-ms`. HTTP
/// dates are not understood.
pub(super) fn retry_after(headers: &HeaderMap) -> Option<u64> {
    let secs = |v: &HeaderValue, scale: f64| {
        let f: f64 = v.to_str().ok()?.trim().parse().ok()?;
        (f.is_finite() && f >= 0.0).then(|| (f / scale).ceil() as u64)
    };
    headers
        .get(RETRY_AFTER)
        .and_then(|v| secs(v, 1.0))
        .or_else(|| headers.get("retry-after-ms").and_then(|v| secs(v, 1000.0)))
}

/// The server's message, `code` and `type` from an error body in any of the shapes seen:
/// `{"error": {"message", "code", "type"}}`, `{"error": "text"}`, `{"message": …}`,
/// `{"detail": …}`, or plain text.
pub(super) fn error_fields(body: &str) -> (String, Option<Value>, Option<String>) {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return (body.to_owned(), None, None);
    };
    let obj = match v.get("error") {
        Some(e @ Value::Object(_)) => e,
        Some(Value::String(s)) => return (s.clone(), None, None),
        _ => &v,
    };
    let message = ["message", "detail", "error"]
        .iter()
        .find_map(|k| match obj.get(*k) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(other @ (Value::Object(_) | Value::Array(_))) => Some(other.to_string()),
            _ => None,
        })
        .unwrap_or_else(|| body.to_owned());
    let code = obj.get("code").filter(|c| !c.is_null()).cloned();
    let kind = obj.get("type").and_then(Value::as_str).map(str::to_owned);
    (message, code, kind)
}

pub(super) fn mentions_context(text: &str) -> bool {
    let lower = text.to_lowercase();
    CONTEXT_PHRASES.iter().any(|p| lower.contains(p))
}

/// An unsuccessful HTTP reply as a [`BackendError`].
pub(super) fn classify_http(
    name: &str,
    status: u16,
    retry_after: Option<u64>,
    body: &str,
) -> BackendError {
    let (message, code, kind) = error_fields(body);
    let mut message = clip(&one_line(&message), MAX_MESSAGE_CHARS);
    if message.is_empty() {
        message = reqwest::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("no message")
            .to_lowercase();
    }
    let text = format!("{name}: http {status}: {message}");
    let quota = |v: &str| v == "insufficient_quota";
    if status == 429 {
        if code.as_ref().and_then(Value::as_str).is_some_and(quota)
            || kind.as_deref().is_some_and(quota)
        {
            return BackendError::Fatal(text);
        }
        return BackendError::RateLimited { retry_after };
    }
    if mentions_context(body) {
        return BackendError::ContextOverflow(text);
    }
    match status {
        408 | 409 | 500..=599 => BackendError::Transient(text),
        _ => BackendError::Fatal(text),
    }
}

/// An error the server sent inside the stream, classified by its `code` (an HTTP status).
pub(super) fn classify_stream_error(name: &str, error: &Value) -> BackendError {
    let body = error.to_string();
    let (message, code, _) = error_fields(&body);
    let text = format!(
        "{name}: error in stream: {}",
        clip(&one_line(&message), MAX_MESSAGE_CHARS)
    );
    if mentions_context(&body) {
        return BackendError::ContextOverflow(text);
    }
    let status = code.and_then(|c| match c {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    });
    match status {
        Some(429) => BackendError::RateLimited { retry_after: None },
        Some(408 | 409) => BackendError::Transient(text),
        Some(s) if (400..500).contains(&s) => BackendError::Fatal(text),
        _ => BackendError::Transient(text),
    }
}

/// Tool call arguments as received, as a JSON object (see the module comment).
pub(super) fn parse_arguments(raw: &str) -> Value {
    let trimmed = raw.trim();
    let wrap = || json!({ "_raw": raw });
    if trimmed.is_empty() {
        return Value::Object(Map::new());
    }
    match serde_json::from_str::<Value>(trimmed) {
        Ok(v @ Value::Object(_)) => v,
        Ok(Value::Null) => Value::Object(Map::new()),
        Ok(Value::String(inner)) => match serde_json::from_str::<Value>(&inner) {
            Ok(v @ Value::Object(_)) => v,
            _ => wrap(),
        },
        _ => wrap(),
    }
}

/// A fresh tool call id for servers that send none.
pub(super) fn generated_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = getrandom::u64().unwrap_or_else(|_| COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("call_{n:016x}")
}

impl Frame {
    /// The data of an event; an `error:` line fails the stream with what `classify` makes
    /// of it: its `error` object, else the whole line (JSON, or else a string).
    pub(super) fn data(
        self,
        classify: impl FnOnce(&Value) -> BackendError,
    ) -> Result<String, BackendError> {
        match self {
            Frame::Data(d) => Ok(d),
            Frame::Error(e) => {
                let v = serde_json::from_str::<Value>(&e).unwrap_or(Value::String(e));
                let err = v.get("error").cloned().unwrap_or(v);
                Err(classify(&err))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testserver::{self, JSON_HEAD, Reply, only, stalling};
    use std::os::unix::fs::PermissionsExt;

    fn keys(file: &std::path::Path) -> KeySource {
        KeySource {
            env: None,
            file: Some(file.to_owned()),
            lookup: |_| None,
        }
    }

    #[test]
    fn sse_parser_is_indifferent_to_chunking() {
        let text = b": comment\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: line1\ndata: line2\n\nid: 3\ndata:[DONE]\n\nerror: {\"code\":1}\ndata: {\"t\":1}";
        let mut whole = Vec::new();
        let mut p = SseParser::default();
        p.feed(text, &mut whole).unwrap();
        p.finish(&mut whole).unwrap();
        assert_eq!(
            whole,
            vec![
                Frame::Data("{\"a\":1}".into()),
                Frame::Data("line1\nline2".into()),
                Frame::Data("[DONE]".into()),
                Frame::Error("{\"code\":1}".into()),
                Frame::Data("{\"t\":1}".into()),
            ]
        );
        let mut bytewise = Vec::new();
        let mut p = SseParser::default();
        for b in text {
            p.feed(std::slice::from_ref(b), &mut bytewise).unwrap();
        }
        p.finish(&mut bytewise).unwrap();
        assert_eq!(bytewise, whole);
        // Garbage never panics.
        let mut out = Vec::new();
        let mut p = SseParser::default();
        p.feed(&[0xff, 0xfe, b'\n', b':', 0xc3, b'\n', b'\n'], &mut out)
            .unwrap();
        p.finish(&mut out).unwrap();
        assert!(out.is_empty());
        // An event cut off by the end of the stream is dropped.
        let mut p = SseParser::default();
        p.feed(b"data: {\"choices\":[{", &mut out).unwrap();
        p.finish(&mut out).unwrap();
        assert!(out.is_empty());
    }

    /// The frames `read_sse` hands on for a reply written in `chunks`, until `[DONE]`.
    async fn read_frames(chunks: Vec<Vec<u8>>) -> (Result<(), BackendError>, Vec<Frame>) {
        let reply = Reply {
            status: 200,
            headers: vec![("Content-Type", "text/event-stream".into())],
            chunks,
        };
        let (url, _rx) = testserver::serve(vec![reply]).await;
        let ep = Endpoint::new("t", Some(&url), &url, Timeouts::default()).unwrap();
        let resp = Stream::new(ep.client.get(&url).send().await.unwrap(), ep.timeouts);
        let mut got = Vec::new();
        let r = read_sse("t", resp, |f| {
            let done = f == Frame::Data("[DONE]".into());
            got.push(f);
            Ok(done)
        })
        .await;
        (r, got)
    }

    #[tokio::test]
    async fn read_sse_joins_chunks_and_stops_at_done() {
        // "ö" split across two chunks, a line split mid-field, a comment, then [DONE] and
        // an event after it that is never handed on.
        let chunks = vec![
            b": hi\ndata: {\"t\":\"\xc3".to_vec(),
            b"\xb6\"}\n\nda".to_vec(),
            b"ta: [DONE]\n\ndata: {\"late\":1}\n\n".to_vec(),
        ];
        let (r, got) = read_frames(chunks).await;
        r.unwrap();
        assert_eq!(
            got,
            [
                Frame::Data("{\"t\":\"\u{f6}\"}".into()),
                Frame::Data("[DONE]".into())
            ]
        );
        // Without [DONE] the stream's end ends the reading, keeping a whole last event.
        let (r, got) = read_frames(vec![b"data: {\"a\":1}".to_vec()]).await;
        r.unwrap();
        assert_eq!(got, [Frame::Data("{\"a\":1}".into())]);
    }

    #[tokio::test]
    async fn read_sse_refuses_an_overlong_line_and_passes_errors_on() {
        let (r, _) = read_frames(vec![vec![b'x'; MAX_EVENT + 1]]).await;
        let Err(BackendError::Transient(m)) = r else {
            panic!("{r:?}")
        };
        assert_eq!(m, "t: a stream line is longer than 8 MiB");
        let reply = Reply::sse(&["data: 1\n\n"]);
        let (url, _rx) = testserver::serve(vec![reply]).await;
        let ep = Endpoint::new("t", Some(&url), &url, Timeouts::default()).unwrap();
        let resp = Stream::new(ep.client.get(&url).send().await.unwrap(), ep.timeouts);
        let r = read_sse("t", resp, |_| Err(BackendError::Fatal("no".into()))).await;
        assert!(matches!(r, Err(BackendError::Fatal(m)) if m == "no"));
    }

    /// A connection to `url` under `t`.
    fn conn_with(url: &str, t: Timeouts) -> Conn {
        let cfg = crate::config::Backend {
            kind: crate::config::BackendKind::OpenAi,
            base_url: Some(url.into()),
            api_key_env: None,
            api_key_file: None,
            model: None,
            file: None,
            context_limit: None,
            timeouts: t,
            force_first_tool: false,
            tool_prefill: None,
        };
        Conn::new("t", &cfg, Endpoint::new("t", Some(url), url, t).unwrap())
    }

    fn transient(r: Result<impl fmt::Debug, BackendError>) -> String {
        match r {
            Err(BackendError::Transient(m)) => m,
            other => panic!("expected a transient error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_peer_that_never_answers_runs_out_of_first_byte_timeout() {
        let url = stalling(vec![b""]).await;
        let c = conn_with(&url, only("first_byte"));
        let m = transient(c.send(c.post("/x", SSE, "{}".into())).await);
        assert_eq!(
            m,
            "t: /x: timed out: no reply within 1 s (first_byte_timeout_s)"
        );
        // A head without a body byte after it is no answer either.
        let url = stalling(vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        ])
        .await;
        let c = conn_with(&url, only("first_byte"));
        let r = c.stream_sse(c.post("/x", SSE, "{}".into()), None, |_| Ok(false));
        let m = transient(r.await);
        assert_eq!(
            m,
            "t: /x: timed out: no reply within 1 s (first_byte_timeout_s)"
        );
    }

    #[tokio::test]
    async fn a_stream_that_stalls_runs_out_of_idle_timeout() {
        let url = stalling(vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n",
        ])
        .await;
        let c = conn_with(&url, only("idle"));
        let mut frames = Vec::new();
        let r = c.stream_sse(c.post("/x", SSE, "{}".into()), None, |f| {
            frames.push(f);
            Ok(false)
        });
        let m = transient(r.await);
        assert_eq!(
            m,
            "t: /x: timed out: the reply stalled: nothing more within 1 s (idle_timeout_s)"
        );
        assert_eq!(
            frames,
            [Frame::Data("1".into())],
            "what came before the stall"
        );
    }

    /// A loopback address whose listener never accepts: its accept queue (the shortest) is
    /// filled by connections nobody accepts, so the kernel drops new handshakes and
    /// connecting hangs. (`listen` again on a listening socket sets its backlog.) The
    /// listener and the queued connections are returned to be kept open.
    fn unaccepted() -> (std::net::TcpListener, Vec<std::net::TcpStream>, String) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        nix::sys::socket::listen(&l, nix::sys::socket::Backlog::new(0).unwrap()).unwrap();
        let target = l.local_addr().unwrap();
        let mut queued = Vec::new();
        while let Ok(s) = std::net::TcpStream::connect_timeout(&target, Duration::from_millis(300))
        {
            queued.push(s);
            assert!(queued.len() < 64, "the accept queue never filled");
        }
        (l, queued, format!("http://{target}"))
    }

    #[tokio::test]
    async fn a_listener_that_never_accepts_runs_out_of_connect_timeout() {
        let (l, queued, url) = unaccepted();
        // The first-byte bound runs from the request's start: well behind, so that only the
        // connect timeout can end it.
        let c = conn_with(&url, only("connect"));
        let m = transient(c.send(c.post("/x", SSE, "{}".into())).await);
        assert_eq!(
            m,
            "t: /x: timed out: no connection within 1 s (connect_timeout_s)"
        );
        // A model list or lookup too.
        let r = c.get_json(c.client.get(format!("{url}/models")), None, "/models");
        assert_eq!(
            transient(r.await),
            "t: /models: timed out: no connection within 1 s (connect_timeout_s)"
        );
        drop((l, queued));
    }

    /// A model list or lookup runs out of the same timeouts as a chat request, not of a
    /// limit of its own: no answer, a head alone, a body that stalls.
    #[tokio::test]
    async fn a_model_list_runs_out_of_the_backends_timeouts() {
        async fn list(c: &Conn, url: &str) -> Result<Value, BackendError> {
            let rb = c.client.get(format!("{url}/v1/models"));
            c.get_json(rb, None, "/models").await
        }
        for reply in [b"" as &[u8], JSON_HEAD] {
            let url = stalling(vec![reply]).await;
            let c = conn_with(&url, only("first_byte"));
            assert_eq!(
                transient(list(&c, &url).await),
                "t: /v1/models: timed out: no reply within 1 s (first_byte_timeout_s)"
            );
        }
        let url = stalling(vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n1\r\n{\r\n",
        ])
        .await;
        let c = conn_with(&url, only("idle"));
        assert_eq!(
            transient(list(&c, &url).await),
            "t: /v1/models: timed out: the reply stalled: nothing more within 1 s (idle_timeout_s)"
        );
        // An error reply whose body stalls is classified by its status alone, once the idle
        // timeout ends the body's reading.
        let url = stalling(vec![
            b"HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked\r\n\r\n1\r\n{\r\n",
        ])
        .await;
        let c = conn_with(&url, only("idle"));
        assert_eq!(
            transient(list(&c, &url).await),
            "t: http 500: internal server error"
        );
    }

    /// A list that keeps coming, never stalling for the idle timeout, ends at the list's own
    /// limit, which says so.
    #[tokio::test]
    async fn a_model_list_that_never_ends_runs_out_of_the_list_limit() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let _ = s.read(&mut [0u8; 4096]).await;
            let _ = s.write_all(JSON_HEAD).await;
            // A space of JSON at a time, well within the idle timeout.
            while s.write_all(b"1\r\n \r\n").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let mut c = conn_with(&url, Timeouts::default());
        c.list_limit = Duration::from_secs(1);
        let r = c.get_json(c.client.get(format!("{url}/props")), None, "/props");
        assert_eq!(
            transient(r.await),
            "t: /props: timed out: no whole reply within 1 s (the limit of a model list)"
        );
    }

    #[test]
    fn key_files_must_be_private_non_empty_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        std::fs::write(&f, "  sk-secret-1-0123456789\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            keys(&f).key("b").unwrap().unwrap().0,
            "sk-secret-1-0123456789"
        );

        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = keys(&f).key("b").unwrap_err().to_string();
        assert!(e.contains("mode 0640") && e.contains("chmod 600"), "{e}");
        assert!(!e.contains("sk-secret-1"), "{e}");

        // A short key is refused where it is read, naming the source and never the key.
        std::fs::write(&f, "sk-short-15char").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = keys(&f).key("b").unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "b: the API key in {} is too short: at least 16 characters",
                f.display()
            )
        );

        std::fs::write(&f, "\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = keys(&f).key("b").unwrap_err().to_string();
        assert!(e.ends_with("is empty"), "{e}");

        let e = keys(dir.path()).key("b").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = keys(&dir.path().join("missing"))
            .key("b")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("b: api_key_file ") && e.contains("no such file"),
            "{e}"
        );
    }

    #[test]
    fn the_variable_wins_over_the_file_and_must_be_set() {
        let k = KeySource {
            env: Some("V".into()),
            file: Some("/nonexistent".into()),
            lookup: |v| (v == "V").then(|| "from-env-0123456789".to_owned()),
        };
        assert_eq!(k.key("b").unwrap().unwrap().0, "from-env-0123456789");
        let short = KeySource {
            env: Some("OPENAI_API_KEY".into()),
            file: None,
            lookup: |_| Some("bk".to_owned()),
        };
        assert_eq!(
            short.key("b").unwrap_err().to_string(),
            "b: the API key in OPENAI_API_KEY is too short: at least 16 characters"
        );
        let k = KeySource {
            env: Some("W".into()),
            file: None,
            lookup: |_| None,
        };
        let e = k.key("b").unwrap_err().to_string();
        assert_eq!(
            e,
            "b: environment variable W (api_key_env) is not set or empty"
        );
        let none = KeySource {
            env: None,
            file: None,
            lookup: |_| None,
        };
        assert!(none.key("b").unwrap().is_none());
    }

    #[test]
    fn keys_never_show_in_debug_or_scrubbed_text() {
        let k = ApiKey("sk-abc-0123456789".into());
        assert_eq!(format!("{k:?}"), "ApiKey(<redacted>)");
        assert_eq!(k.scrub("bad key sk-abc-0123456789!"), "bad key <redacted>!");
        // A message cut inside the key loses the key's start too.
        assert_eq!(k.scrub("bad key sk-abc-0123…"), "bad key <redacted>…");
        assert!(k.header("b", "Bearer ").unwrap().is_sensitive());
    }
}
