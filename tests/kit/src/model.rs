//! A model stand-in speaking Ollama's API on 127.0.0.1, for suites and benches that need turns
//! with real tool calls: a request whose last message is the user's prompt gets one
//! `execute_code` call, with the shell code (or the whole arguments, `escalate` included:
//! [`Model::start_with_args`]) the caller makes from a fresh token (1, 2, …); a request
//! whose last message is a tool result gets the answer `done`; a request offering no tools
//! (a compaction's request to summarize) gets a short summary. Each reply reports its usage
//! as about four bytes a token (`prompt_eval_count` from the request body, `eval_count` from
//! the reply), so a configured `context_limit` makes olliesrv compact as with a real model.
//! `GET /api/tags` lists the one model `m`. Every reply is one NDJSON line and the
//! connection closes.
//! Only loopback, only this process's server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The shell code of the tool call carrying token `n`.
pub type Code = dyn Fn(u64) -> String + Send + Sync;

/// The `execute_code` arguments of the tool call carrying token `n`.
pub type Args = dyn Fn(u64) -> Value + Send + Sync;

/// A running stand-in: its base URL (an Ollama `base_url`), the tokens handed out and the
/// summaries written.
#[derive(Debug, Clone)]
pub struct Model {
    pub url: String,
    issued: Arc<AtomicU64>,
    summaries: Arc<AtomicU64>,
}

impl Model {
    /// Starts the stand-in on a free loopback port (in the current tokio runtime): each call
    /// runs `code(token)` in bash.
    pub async fn start(code: Box<Code>) -> Model {
        Model::start_with_args(Box::new(
            move |token| json!({"language": "bash", "code": code(token)}),
        ))
        .await
    }

    /// [`Model::start`] with the whole `execute_code` arguments made from the token (to ask
    /// for an escalation, say).
    pub async fn start_with_args(args: Box<Args>) -> Model {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", l.local_addr().expect("local_addr"));
        let issued = Arc::new(AtomicU64::new(0));
        let summaries = Arc::new(AtomicU64::new(0));
        let code: Arc<Args> = Arc::from(args);
        let (i, n, c) = (
            Arc::clone(&issued),
            Arc::clone(&summaries),
            Arc::clone(&code),
        );
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let (i, n, c) = (Arc::clone(&i), Arc::clone(&n), Arc::clone(&c));
                tokio::spawn(async move {
                    let Some((head, body)) = read_request(&mut s).await else {
                        return;
                    };
                    let reply = answer((&i, &n), &*c, &head, &body);
                    let _ = s.write_all(reply.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        Model {
            url,
            issued,
            summaries,
        }
    }

    /// How many tool calls (tokens) were handed out so far.
    pub fn issued(&self) -> u64 {
        self.issued.load(Ordering::SeqCst)
    }

    /// How many summaries (compactions) were written so far.
    pub fn summaries(&self) -> u64 {
        self.summaries.load(Ordering::SeqCst)
    }

    /// The `config.toml` that makes this the default backend `fake`.
    pub fn config(&self) -> String {
        format!(
            "default_backend = \"fake\"\n\n[backends.fake]\nkind = \"ollama\"\nbase_url = \"{}\"\nmodel = \"m\"\n",
            self.url
        )
    }
}

/// One HTTP/1.1 request: its head and body (by Content-Length).
async fn read_request(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = head_end(&buf) {
            break i;
        }
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let len = content_length(&head);
    let mut body = buf[end..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some((head, body))
}

/// One HTTP/1.1 request (head, and body by Content-Length) from a blocking stream: for a
/// stand-in served by threads.
pub fn read_request_blocking(s: &mut impl std::io::Read) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    let end = loop {
        if let Some(i) = head_end(&buf) {
            break i;
        }
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let len = content_length(&head);
    let mut body = buf[end..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some((head, body))
}

/// Where a request's head ends (after its blank line), once `buf` holds it.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The head's Content-Length (0 without one).
fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0)
}

fn answer(
    (issued, summaries): (&AtomicU64, &AtomicU64),
    args: &Args,
    head: &str,
    body: &[u8],
) -> String {
    let ok = |ct: &str, b: String| {
        format!("HTTP/1.1 200 OK\r\nContent-Type: {ct}\r\nConnection: close\r\n\r\n{b}")
    };
    if head.starts_with("GET /api/tags ") {
        return ok(
            "application/json",
            json!({"models": [{"name": "m"}]}).to_string(),
        );
    }
    if !head.starts_with("POST /api/chat ") {
        return "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into();
    }
    let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let last_role = req["messages"]
        .as_array()
        .and_then(|ms| ms.last())
        .and_then(|m| m["role"].as_str())
        .unwrap_or("")
        .to_owned();
    let offers_tools = req["tools"].as_array().is_some_and(|t| !t.is_empty());
    let message = if !offers_tools {
        summaries.fetch_add(1, Ordering::SeqCst);
        json!({"role": "assistant", "content": "- the agent ran one tool call per prompt"})
    } else if last_role == "user" {
        let token = issued.fetch_add(1, Ordering::SeqCst) + 1;
        json!({"role": "assistant", "content": "",
               "tool_calls": [{"function": {"name": "execute_code",
                                            "arguments": args(token)}}]})
    } else {
        json!({"role": "assistant", "content": "done"})
    };
    let tokens = |bytes: usize| bytes.div_ceil(4).max(1);
    let line = json!({"model": "m", "done": true, "done_reason": "stop",
                      "prompt_eval_count": tokens(body.len()),
                      "eval_count": tokens(message.to_string().len()),
                      "message": message});
    ok("application/x-ndjson", format!("{line}\n"))
}
