//! A scripted HTTP/1.1 server on 127.0.0.1 standing in for an LLM API in cross-process tests.
//!
//! POST requests get the next [`Reply`] of the script in order (a script that has run out
//! answers 599); GET requests are answered from fixed routes (model lists). Every request is
//! recorded ([`Got`]) so tests can check what olliesrv sent. Responses carry no length and end
//! when the connection closes, so a [`Reply::cut`] reply is a stream dropped mid-message;
//! [`Reply::silent`] and [`Reply::hang`] are servers that stall.
//! Only loopback, only this test's server.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One scripted response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Written one after another, with `gap` between them (so streaming is real).
    pub chunks: Vec<Vec<u8>>,
    pub gap: Duration,
    /// Stop after this many chunks and drop the connection.
    pub cut_after: Option<usize>,
    /// Write nothing at all, not even the head ([`Reply::silent`]).
    pub silent: bool,
    /// After the chunks, hold the connection open without a further byte ([`Reply::hang`]).
    pub hang: bool,
}

impl Reply {
    fn new(status: u16, content_type: &str, chunks: Vec<Vec<u8>>) -> Reply {
        Reply {
            status,
            headers: vec![("Content-Type".into(), content_type.into())],
            chunks,
            gap: Duration::from_millis(2),
            cut_after: None,
            silent: false,
            hang: false,
        }
    }

    /// A server that accepts the connection, reads the request and never answers.
    pub fn silent() -> Reply {
        Reply {
            silent: true,
            hang: true,
            ..Reply::new(200, "application/json", Vec::new())
        }
    }

    /// Server-sent events: each item is one event's full text (`data: …` lines, optionally
    /// `event: …`); a blank line is added after each.
    pub fn sse<S: AsRef<str>>(events: &[S]) -> Reply {
        Reply::new(
            200,
            "text/event-stream",
            events
                .iter()
                .map(|e| format!("{}\n\n", e.as_ref()).into_bytes())
                .collect(),
        )
    }

    /// Newline-delimited JSON, one value per line.
    pub fn ndjson(lines: &[serde_json::Value]) -> Reply {
        Reply::new(
            200,
            "application/x-ndjson",
            lines
                .iter()
                .map(|l| format!("{l}\n").into_bytes())
                .collect(),
        )
    }

    /// A JSON body with `status`.
    pub fn json(status: u16, body: &serde_json::Value) -> Reply {
        Reply::new(
            status,
            "application/json",
            vec![body.to_string().into_bytes()],
        )
    }

    pub fn header(mut self, k: &str, v: &str) -> Reply {
        self.headers.push((k.into(), v.into()));
        self
    }

    /// Drops the connection after `n` chunks.
    pub fn cut(mut self, n: usize) -> Reply {
        self.cut_after = Some(n);
        self
    }

    /// Holds the connection open after the chunks (none: after the head) without a further
    /// byte, until the client closes it: a server that stalls.
    pub fn hang(mut self) -> Reply {
        self.hang = true;
        self
    }

    /// Waits `gap` between chunks.
    pub fn gap(mut self, gap: Duration) -> Reply {
        self.gap = gap;
        self
    }
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct Got {
    pub method: String,
    pub path: String,
    /// Names in lowercase.
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl Got {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

#[derive(Default)]
struct State {
    script: VecDeque<Reply>,
    routes: HashMap<String, Reply>,
    got: Vec<Got>,
}

/// The running server (it stops with the test's runtime).
#[derive(Clone)]
pub struct FakeLlm {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl FakeLlm {
    /// Starts a server answering POSTs with `script`, in order.
    pub async fn start(script: Vec<Reply>) -> FakeLlm {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            script: script.into(),
            ..State::default()
        }));
        let st = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let st = Arc::clone(&st);
                tokio::spawn(async move {
                    let _ = serve(sock, st).await;
                });
            }
        });
        FakeLlm { addr, state }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers GET `path` (without the query) with `reply`, every time.
    pub fn route(&self, path: &str, reply: Reply) {
        self.state
            .lock()
            .unwrap()
            .routes
            .insert(path.to_owned(), reply);
    }

    /// Appends replies to the script.
    pub fn push(&self, replies: Vec<Reply>) {
        self.state.lock().unwrap().script.extend(replies);
    }

    /// Every request so far.
    pub fn got(&self) -> Vec<Got> {
        self.state.lock().unwrap().got.clone()
    }

    /// The POST requests so far.
    pub fn posts(&self) -> Vec<Got> {
        self.got()
            .into_iter()
            .filter(|g| g.method == "POST")
            .collect()
    }

    /// Script replies not used yet.
    pub fn left(&self) -> usize {
        self.state.lock().unwrap().script.len()
    }
}

async fn serve(mut sock: TcpStream, st: Arc<Mutex<State>>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let method = first.next().unwrap_or("").to_owned();
    let target = first.next().unwrap_or("").to_owned();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let path = target.split('?').next().unwrap_or("").to_owned();
    let reply = {
        let mut s = st.lock().unwrap();
        s.got.push(Got {
            method: method.clone(),
            path: target.clone(),
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        if method == "POST" {
            s.script.pop_front()
        } else {
            s.routes.get(&path).cloned()
        }
    }
    .unwrap_or_else(|| {
        Reply::json(
            599,
            &serde_json::json!({"error": {"message": format!("the fake server has no reply for {method} {path}")}}),
        )
    });
    if !reply.silent {
        let mut out = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", reply.status);
        for (k, v) in &reply.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        sock.write_all(out.as_bytes()).await?;
        for (i, c) in reply.chunks.iter().enumerate() {
            if reply.cut_after == Some(i) {
                break;
            }
            sock.write_all(c).await?;
            sock.flush().await?;
            tokio::time::sleep(reply.gap).await;
        }
    }
    if reply.hang {
        // Until the client gives up and closes (or the test ends).
        while sock.read(&mut chunk).await? > 0 {}
        return Ok(());
    }
    let _ = sock.shutdown().await;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Driving olliesrv against a fake server

use ollie_p9::Fid;
use ollie_p9::wire::om;

use crate::common::Srv;
/// `key=value` from a stats/cfg text.
pub use crate::common::kv_value as kv;
// Writing then reading on one fid, reading a whole file (never `chat`/`chat.raw`, which
// stream: use `log`, the snapshot of `chat.raw`), one write: the test kit's 9P helper.
pub use ollie_testkit::client::{rdwr_text as rdwr, read_ok as read, write_text as write};

/// The API key the tests configure (`api_key_env = "OLLIE_FAKE_KEY"`); it must never show
/// up in any served file, log line or error.
pub const KEY: &str = "sk-fake-0123456789abcdef-secret";

/// Starts olliesrv with backend `fake` of `kind` at `base_url` (model `m`, key from
/// `OLLIE_FAKE_KEY`) as the default, plus `extra` TOML appended to config.toml. Returns the
/// server and a work directory for sessions.
pub fn olliesrv(kind: &str, base_url: &str, extra: &str) -> (Srv, std::path::PathBuf) {
    olliesrv_with(kind, base_url, extra, "")
}

/// [`olliesrv`] with `backend_extra`: more keys of the `[backends.fake]` table.
pub fn olliesrv_with(
    kind: &str,
    base_url: &str,
    extra: &str,
    backend_extra: &str,
) -> (Srv, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let key = if kind == "ollama" {
        String::new()
    } else {
        "api_key_env = \"OLLIE_FAKE_KEY\"\n".to_owned()
    };
    let config = format!(
        "default_backend = \"fake\"\n{extra}\n\n[backends.fake]\nkind = \"{kind}\"\nbase_url = \"{base_url}\"\nmodel = \"m\"\n{key}{backend_extra}\n"
    );
    let srv = crate::common::Srv::start_with(dir, &config, |c| {
        c.env("OLLIE_FAKE_KEY", KEY);
    });
    (srv, work)
}

/// Session `s` in `work` with agent `a`.
pub async fn session_with_agent(root: &Fid, work: &std::path::Path) {
    crate::common::new_session(root, work, "name=a").await;
}

/// Waits (bounded, 60 s) until `path` contains `needle`; returns the content.
pub async fn wait_for(root: &Fid, path: &str, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let t = read(root, path).await;
        if t.contains(needle) {
            return t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{path} never contained {needle:?}:\n{t}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks each `(key, value)` of `want` against the `key=value` lines of `text` (a stats or
/// cfg text): every key is checked, and the failure names each one that differs.
pub fn assert_kv(text: &str, want: &[(&str, &str)]) {
    let wrong: Vec<String> = want
        .iter()
        .filter_map(|(k, v)| {
            let got = kv(text, k);
            (got != *v).then(|| format!("{k}={got:?}, want {v:?}"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} keys differ: {}
{text}",
        wrong.len(),
        want.len(),
        wrong.join("; ")
    );
}

/// One block of `chat.raw`.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub kind: String,
    pub attrs: String,
    pub body: String,
}

/// The blocks of a `chat.raw` text (`[[[kind attrs` … `]]]`).
pub fn blocks(raw: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut cur: Option<Block> = None;
    for line in raw.split_inclusive('\n') {
        let l = line.trim_end_matches('\n');
        if let Some(h) = l.strip_prefix("[[[")
            && cur.is_none()
        {
            let (kind, attrs) = h.split_once(' ').unwrap_or((h, ""));
            cur = Some(Block {
                kind: kind.into(),
                attrs: attrs.into(),
                body: String::new(),
            });
        } else if l == "]]]" {
            if let Some(b) = cur.take() {
                out.push(b);
            }
        } else if let Some(b) = cur.as_mut() {
            b.body.push_str(line);
        }
    }
    out
}

/// An open `eventwait` fid, for [`states_until`].
pub async fn events(root: &Fid) -> Fid {
    let mut ev = root.walk_path("eventwait").await.unwrap();
    ev.open(om::OREAD).await.unwrap();
    ev
}

/// The agent states `eventwait` reports until one of `end` (included), bounded.
pub async fn states_until(ev: &Fid, end: &[&str]) -> Vec<String> {
    let mut states: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !states.last().is_some_and(|s| end.contains(&s.as_str())) {
        let d = tokio::time::timeout_at(deadline, ev.read(0, 8192))
            .await
            .unwrap_or_else(|_| panic!("no end state {end:?} after {states:?}"))
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&d).unwrap();
        if v["event"] == "agent-state" {
            states.push(v["state"].as_str().unwrap().to_owned());
        }
    }
    states
}
