//! A real model through olliesrv vs a direct client: time to first token and tokens per
//! second, against llama.cpp's `llama-server` with SmolLM2-135M (from the cache that
//! `scripts/local-model.sh --prepare` fills). It prints figures, it asserts no timing.
//!
//! Method:
//!
//! - One llama-server (`-c 4096 -np 1`), one real olliesrv with two `openai` backends for it:
//!   `local` aimed at the server, and `capture` aimed at a pass-through proxy in this process
//!   that records the request bytes. Agent `a` (temperature 0, `max_tokens` N) makes one
//!   warm-up turn through `capture`: its request body is what olliesrv sends for that prompt
//!   after `ctl clear`, and the direct client sends exactly those bytes (so both hit the same
//!   prompt cache and, at temperature 0, generate the same tokens).
//! - A round, in alternating order: (1) through olliesrv: `ctl clear` (untimed), a reader
//!   blocked at the end of `chat.raw`, then the prompt is written; time to first token is
//!   from that write to the first read carrying the assistant's text, and the stream lasts
//!   until the read that closes the assistant block; the tokens are `stats`' `tokens_out`
//!   difference; (2) direct: a raw HTTP/1.1 client posts the recorded body to the server and
//!   reads the SSE stream (first content delta, `[DONE]`, `usage.completion_tokens`).
//! - Tokens per second is (tokens − 1) / (last piece − first piece), the rate after the first
//!   token, for both. The table gives medians over the rounds and the ratios: TTFT olliesrv /
//!   direct (goal ≤ 1.1 × direct + 2 ms) and tokens/s olliesrv / direct (goal ≥ 0.95), and
//!   the median of the per-round TTFT differences (the server's drift between rounds, several
//!   milliseconds here, cancels out of it).
//!
//! ```text
//! scripts/local-model.sh --prepare
//! cargo build --release --bins && cargo bench -p ollie-tests --bench llama
//! ```
//!
//! `OLLIE_BENCH_RUNS` sets the rounds (default 30), `OLLIE_BENCH_MAX_TOKENS` the reply length
//! (default 96), `OLLIE_BENCH_LLAMA_THREADS` the server's `-t` (default: one per core). On a
//! 2-core machine the server's threads keep both cores busy while it computes, so every
//! process a token passes through may wait a scheduler slice (a few ms) to run: with `-t 1`
//! the figure shows olliesrv's own cost rather than that contention. Without the server in the cache it prints `SKIP llama: <reason>` (with
//! `OLLIE_TEST_REQUIRE=all` it fails).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ollie_p9::Fid;
use ollie_p9::wire::om;
use ollie_testkit::client::{dial_attach, rdwr, read, write};
use ollie_testkit::llama::{self, Llama};
use ollie_testkit::server::{olliesrv_command, percentile, wait_listening};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const A: &str = "session/s/agent/a";
const PROMPT: &str = "Tell me a short story about a lighthouse keeper.";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pass-through TCP proxy to `port` on loopback that keeps every byte clients send.
async fn capture_proxy(port: u16) -> (u16, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = l.accept().await {
            let keep = keep.clone();
            tokio::spawn(async move {
                let upstream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                let (mut cr, mut cw) = client.into_split();
                let (mut ur, mut uw) = upstream.into_split();
                let up = async {
                    let mut b = vec![0u8; 65536];
                    loop {
                        let n = cr.read(&mut b).await.unwrap_or(0);
                        if n == 0 {
                            let _ = uw.shutdown().await;
                            return;
                        }
                        keep.lock().unwrap().extend_from_slice(&b[..n]);
                        if uw.write_all(&b[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                let down = async {
                    let _ = tokio::io::copy(&mut ur, &mut cw).await;
                    let _ = cw.shutdown().await;
                };
                tokio::join!(up, down);
            });
        }
    });
    (at, seen)
}

/// The JSON body of the chat request among `bytes` (a client's requests, in order).
fn chat_body(bytes: &[u8]) -> Value {
    let text = String::from_utf8_lossy(bytes);
    let at = text
        .find("POST /v1/chat/completions ")
        .expect("no chat request was captured");
    let rest = &text[at..];
    let (head, body) = rest.split_once("\r\n\r\n").unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .expect("the chat request has no Content-Length");
    serde_json::from_str(&body[..len]).unwrap()
}

async fn stat(root: &Fid, key: &str) -> u64 {
    let s = read(root, &format!("{A}/stats")).await.unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in stats:\n{s}"))
}

/// One turn timed through olliesrv: (time to first token, first to last piece, tokens).
async fn through_olliesrv(root: &Fid) -> (Duration, Duration, u64) {
    rdwr(root, &format!("{A}/ctl"), "clear").await.unwrap();
    let before = stat(root, "tokens_out").await;
    let mut raw = root.walk_path(&format!("{A}/chat.raw")).await.unwrap();
    raw.open(om::OREAD).await.unwrap();
    // Its end (a read there would block until the reply comes).
    let mut off = raw.stat().await.unwrap().length;
    let mut sw = root.walk_path(&format!("{A}/statewait")).await.unwrap();
    sw.open(om::OREAD).await.unwrap();
    let start = Instant::now();
    write(root, &format!("{A}/prompt"), PROMPT).await.unwrap();
    let mut seen = String::new();
    let mut first = None;
    loop {
        let d = raw.read(off, 65536).await.unwrap();
        assert!(!d.is_empty(), "chat.raw ended");
        off += d.len() as u64;
        seen.push_str(&String::from_utf8_lossy(&d));
        let Some(at) = seen.find("[[[assistant") else {
            continue;
        };
        let body = &seen[at..];
        let text_started = body.split_once('\n').is_some_and(|(_, t)| !t.is_empty());
        if text_started && first.is_none() {
            first = Some(start.elapsed());
        }
        if body.contains("\n]]]\n") {
            break;
        }
    }
    let last = start.elapsed();
    // The turn's end, then its counts.
    let mut end = String::new();
    while !end.contains("idle") {
        let d = sw.read(0, 256).await.unwrap();
        end = String::from_utf8_lossy(&d).into_owned();
        assert!(!end.contains("error"), "the turn failed: {seen}");
    }
    let tokens = stat(root, "tokens_out").await - before;
    let first = first.unwrap();
    (first, last - first, tokens)
}

fn rate(tokens: u64, span: Duration) -> f64 {
    tokens.saturating_sub(1) as f64 / span.as_secs_f64().max(1e-9)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let files = match llama::find() {
        Ok(f) => f,
        Err(why) => ollie_testkit::skip_bench("llama", &why),
    };
    let runs = env_usize("OLLIE_BENCH_RUNS", 30);
    let max_tokens = env_usize("OLLIE_BENCH_MAX_TOKENS", 96);
    let threads = std::env::var("OLLIE_BENCH_LLAMA_THREADS")
        .ok()
        .and_then(|v| v.parse().ok());
    let l = Llama::start_with_threads(&files, 4096, 1, threads).await;
    let (proxy, captured) = capture_proxy(l.port).await;

    let dir = tempfile::tempdir().unwrap();
    // olliesrv refuses a socket directory others may enter.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "default_backend = \"local\"\n\n{}\n[backends.capture]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{proxy}/v1\"\nmodel = \"{}\"\ncontext_limit = {}\n",
            l.backend_table("local", ""),
            llama::MODEL,
            l.ctx
        ),
    )
    .unwrap();
    let sock = dir.path().join("ollie.sock");
    let stderr = dir.path().join("olliesrv.stderr");
    let mut child = olliesrv_command(&sock, &dir.path().join("state"))
        .arg("--config")
        .arg(&config)
        .env("OLLIE_LOG", "warn")
        .stderr(std::fs::File::create(&stderr).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(
        &mut child,
        &sock,
        Duration::from_secs(20),
        "olliesrv",
        || std::fs::read_to_string(&stderr).unwrap_or_default(),
    );
    let _srv = Server(child);
    let (_c, root) = dial_attach(
        &ollie_p9::dial::Addr::Unix(sock.clone()),
        &ollie_p9::dial::current_user(),
    )
    .await;
    rdwr(
        &root,
        "session/new",
        &format!("name=s cwd={}", work.display()),
    )
    .await
    .unwrap();
    rdwr(&root, "session/s/agent/new", "name=a").await.unwrap();
    write(
        &root,
        &format!("{A}/cfg"),
        &format!("temperature=0\nmax_tokens={max_tokens}\nbackend=capture"),
    )
    .await
    .unwrap();
    // Warm-up through the proxy: the request to replay directly, and the prompt cache.
    through_olliesrv(&root).await;
    let body = chat_body(&captured.lock().unwrap());
    write(&root, &format!("{A}/cfg"), "backend=local")
        .await
        .unwrap();
    through_olliesrv(&root).await;
    llama::stream(l.port, body.clone()).await.unwrap();

    let (mut ours, mut direct) = (Samples::default(), Samples::default());
    for round in 0..runs {
        // Alternate which goes first, so that neither always runs on a just-used server.
        for first in [round % 2 == 0, round % 2 != 0] {
            if first {
                let (ttft, span, n) = through_olliesrv(&root).await;
                ours.add(ttft, span, n);
            } else {
                let d = llama::stream(l.port, body.clone()).await.unwrap();
                direct.add(d.first_token, d.total - d.first_token, d.completion_tokens);
            }
        }
        println!(
            "round {round}: first token {} through olliesrv, {} direct",
            ms(ours.ttft[round]),
            ms(direct.ttft[round])
        );
    }
    println!(
        "llama: {runs} rounds, max_tokens {max_tokens}, {} vs {} tokens per reply (olliesrv, direct)",
        ours.tokens, direct.tokens
    );
    report(ours, direct);
}

/// One side's figures: time to first token, the rate after it, the tokens of the last reply.
#[derive(Default)]
struct Samples {
    ttft: Vec<Duration>,
    rate: Vec<f64>,
    tokens: u64,
}

impl Samples {
    fn add(&mut self, ttft: Duration, span: Duration, tokens: u64) {
        self.ttft.push(ttft);
        self.rate.push(rate(tokens, span));
        self.tokens = tokens;
    }
}

/// The table: medians, ratios and the goals.
fn report(mut ours: Samples, mut direct: Samples) {
    // The server's own time drifts by several milliseconds from round to round on a small
    // machine; the difference within a round (both sides ran back to back) does not carry
    // that drift.
    let paired: Vec<f64> = ours
        .ttft
        .iter()
        .zip(&direct.ttft)
        .map(|(o, d)| (o.as_secs_f64() - d.as_secs_f64()) * 1e3)
        .collect();
    let (ot, dt) = (
        percentile(&mut ours.ttft, 0.5),
        percentile(&mut direct.ttft, 0.5),
    );
    let (or, dr) = (median(&ours.rate), median(&direct.rate));
    println!(
        "{:<34} {:>12} {:>12} {:>8}",
        "measure", "olliesrv", "direct", "ratio"
    );
    let goal_ttft = dt.mul_f64(1.1) + Duration::from_millis(2);
    println!(
        "{:<34} {:>12} {:>12} {:>7.2}x   goal <= {} ({})",
        "time to first token (median)",
        ms(ot),
        ms(dt),
        ot.as_secs_f64() / dt.as_secs_f64().max(1e-9),
        ms(goal_ttft),
        if ot <= goal_ttft { "met" } else { "not met" }
    );
    println!(
        "{:<34} {:>9.1} ms   (median of olliesrv minus direct within each round)",
        "time to first token, added",
        median(&paired)
    );
    println!(
        "{:<34} {:>12.1} {:>12.1} {:>7.2}x   goal >= 0.95x ({})",
        "tokens/s after the first (median)",
        or,
        dr,
        or / dr.max(1e-9),
        if or >= 0.95 * dr { "met" } else { "not met" }
    );
}
