//! llama.cpp's `llama-server` with SmolLM2-135M, for the suite and the benchmark that talk to
//! a real model server.
//!
//! [`find`] locates what `scripts/local-model.sh --prepare` builds and downloads: the binary,
//! the GGUF model and the tool-aware chat template, under `$OLLIE_LLAMA_DIR` or
//! `${XDG_CACHE_HOME:-~/.cache}/ollie/llama` (the script's `$OLLIE_CACHE_DIR/llama`). A test
//! calls [`available`] first: when they are missing it prints a SKIP line (or fails under
//! `OLLIE_TEST_REQUIRE=all`). [`Llama::start`] runs a server on a free loopback port with the
//! context size and slot count the test asks for (one server at a time per process), `--metrics` on, and waits (bounded) until
//! `/health` says the model is loaded; it can be killed and started again on the same port, and is killed
//! when dropped. [`get`] and [`stream`] are minimal HTTP/1.1 clients for what a test checks
//! directly (slots, metrics, a direct streamed request as the benchmark's baseline).
//! Only loopback, only this process's servers.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The model's name as the server lists it (`--alias`), and as the backend asks for it.
pub const MODEL: &str = "smollm2-135m";
/// The pinned versions: the names `scripts/local-model.sh` gives the cached files.
const SERVER: &str = "bin/llama-server-11434.0.0";
const GGUF: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
const TEMPLATE: &str = "templates/Qwen-Qwen2.5-7B-Instruct.jinja";
/// How long a server may take to load the model and answer.
const UP: Duration = Duration::from_secs(120);

/// One server at a time per process: each uses every core, and two at once make each
/// other's requests crawl (the suite's tests run in parallel threads).
static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The cached files a server needs.
#[derive(Debug, Clone)]
pub struct Files {
    pub server: PathBuf,
    pub model: PathBuf,
    pub template: PathBuf,
}

/// The cache directory: `$OLLIE_LLAMA_DIR`, else the script's default.
pub fn cache_dir() -> PathBuf {
    let var = |n: &str| std::env::var_os(n).filter(|v| !v.is_empty());
    if let Some(d) = var("OLLIE_LLAMA_DIR") {
        return PathBuf::from(d);
    }
    let base = var("OLLIE_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(var("HOME").unwrap_or_default()).join(".cache"))
                .join("ollie")
        });
    base.join("llama")
}

/// The server, model and template in [`cache_dir`], or what is missing.
pub fn find() -> Result<Files, String> {
    let dir = cache_dir();
    let f = Files {
        server: dir.join(SERVER),
        model: dir.join(GGUF),
        template: dir.join(TEMPLATE),
    };
    let missing: Vec<String> = [&f.server, &f.model, &f.template]
        .iter()
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        Ok(f)
    } else {
        Err(format!(
            "llama-server or its model is not built: run scripts/local-model.sh --prepare (missing {})",
            missing.join(", ")
        ))
    }
}

/// The files, or `None` after a SKIP line for `test` (a failure under the rule).
pub fn available(test: &str) -> Option<Files> {
    match find() {
        Ok(f) => Some(f),
        Err(why) => {
            crate::skip(&format!("SKIP {test}: {why}"));
            None
        }
    }
}

/// A running llama-server.
#[derive(Debug)]
pub struct Llama {
    files: Files,
    child: Option<Child>,
    pub port: u16,
    /// `-c`: the context size in tokens (shared by the slots).
    pub ctx: u32,
    /// `-np`: how many requests it serves at once.
    pub slots: u32,
    /// `-t`: its compute threads (unset: llama-server's default, one per core).
    threads: Option<u32>,
    log: PathBuf,
    _dir: tempfile::TempDir,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Llama {
    /// Starts a server with context `ctx` and `slots` slots on a free port (after the one
    /// this process runs, if any, is dropped); waits until it answers.
    pub async fn start(files: &Files, ctx: u32, slots: u32) -> Llama {
        Llama::start_with_threads(files, ctx, slots, None).await
    }

    /// [`Llama::start`] with `threads` compute threads (`-t`).
    pub async fn start_with_threads(
        files: &Files,
        ctx: u32,
        slots: u32,
        threads: Option<u32>,
    ) -> Llama {
        let turn = ONE.lock().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut l = Llama {
            files: files.clone(),
            child: None,
            port: crate::server::free_port(),
            ctx,
            slots,
            threads,
            log: dir.path().join("llama-server.log"),
            _dir: dir,
            _turn: turn,
        };
        l.restart().await;
        l
    }

    /// `http://127.0.0.1:PORT/v1`, an `openai` backend's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// The `[backends.NAME]` table for it, with `extra` keys.
    pub fn backend_table(&self, name: &str, extra: &str) -> String {
        format!(
            "[backends.{name}]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"{MODEL}\"\ncontext_limit = {}\n{extra}\n",
            self.base_url(),
            self.ctx / self.slots.max(1)
        )
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server (again, on the same port) and waits until it answers.
    pub async fn restart(&mut self) {
        self.kill();
        let log = std::fs::File::create(&self.log).expect("server log");
        let err = log.try_clone().expect("server log");
        let child = Command::new(&self.files.server)
            .arg("-m")
            .arg(&self.files.model)
            .args(["--alias", MODEL, "--host", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .args(["-c", &self.ctx.to_string(), "-np", &self.slots.to_string()])
            .args(["--metrics", "--jinja", "--chat-template-file"])
            .arg(&self.files.template)
            .args(
                self.threads
                    .iter()
                    .flat_map(|t| ["-t".to_owned(), t.to_string()]),
            )
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.files.server.display()));
        self.child = Some(child);
        let deadline = Instant::now() + UP;
        loop {
            // `/health` says 200 once the model is loaded (`/v1/models` answers before).
            if let Ok((200, _)) = get(self.port, "/health").await {
                return;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("llama-server exited ({st}): {}", self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "llama-server did not answer within {UP:?}: {}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The end of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let t = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// One Prometheus counter of `/metrics` (`llamacpp:NAME`).
    pub async fn metric(&self, name: &str) -> f64 {
        let (_, body) = get(self.port, "/metrics").await.expect("GET /metrics");
        let key = format!("llamacpp:{name}");
        body.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("no {key} in /metrics:\n{body}"))
    }

    /// Waits (bounded, 60 s) until no slot is processing a request.
    pub async fn wait_idle(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, body) = get(self.port, "/slots").await.expect("GET /slots");
            let slots: Value = serde_json::from_str(&body).expect("slots JSON");
            let busy = slots
                .as_array()
                .is_none_or(|a| a.iter().any(|s| s["is_processing"] != false));
            if !busy {
                return;
            }
            assert!(Instant::now() < deadline, "a slot stays busy: {body}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Llama {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `GET path` on 127.0.0.1:`port`: the status and the body.
pub async fn get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf))
        .await
        .map_err(|_| std::io::Error::other("no reply within 20 s"))??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP head"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    Ok((
        status,
        if chunked {
            dechunk(body)
        } else {
            body.to_owned()
        },
    ))
}

/// The body of a chunked reply.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// What a streamed chat request delivered, seen by a direct client.
#[derive(Debug, Clone)]
pub struct Streamed {
    /// From sending the request to the first content delta.
    pub first_token: Duration,
    /// From sending the request to `[DONE]`.
    pub total: Duration,
    /// Content deltas seen, and the characters they carried.
    pub deltas: usize,
    pub text: String,
    /// The server's `usage.completion_tokens`.
    pub completion_tokens: u64,
}

/// Posts `body` (a Chat Completions request; `stream` is set) to the server on `port` and
/// reads the SSE stream to its end.
pub async fn stream(port: u16, mut body: Value) -> std::io::Result<Streamed> {
    body["stream"] = Value::Bool(true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let body = body.to_string();
    // From before the connection, as for any client (olliesrv connects for each request:
    // llama-server closes a streamed reply's connection).
    let start = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.set_nodelay(true)?;
    s.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    let mut chunked = false;
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            return Err(std::io::Error::other("no HTTP head"));
        }
        if line == "\r\n" {
            break;
        }
        chunked |= line
            .to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked");
    }
    let mut out = Streamed {
        first_token: Duration::ZERO,
        total: Duration::ZERO,
        deltas: 0,
        text: String::new(),
        completion_tokens: 0,
    };
    // Body bytes not yet cut into lines.
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let piece = if chunked {
            line.clear();
            r.read_line(&mut line).await?;
            let n = usize::from_str_radix(line.trim(), 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
            let mut piece = vec![0u8; n + 2];
            r.read_exact(&mut piece).await?;
            piece.truncate(n);
            piece
        } else {
            let mut piece = vec![0u8; 8192];
            let n = r.read(&mut piece).await?;
            piece.truncate(n);
            piece
        };
        if piece.is_empty() {
            return Err(std::io::Error::other("the stream ended before [DONE]"));
        }
        pending.extend_from_slice(&piece);
        while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
            let l: Vec<u8> = pending.drain(..=nl).collect();
            let l = String::from_utf8_lossy(&l);
            let Some(data) = l.trim_end().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                out.total = start.elapsed();
                return Ok(out);
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if let Some(n) = v
                .pointer("/usage/completion_tokens")
                .and_then(Value::as_u64)
            {
                out.completion_tokens = n;
            }
            if let Some(t) = v
                .pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
            {
                if out.deltas == 0 {
                    out.first_token = start.elapsed();
                }
                out.deltas += 1;
                out.text.push_str(t);
            }
        }
    }
}
