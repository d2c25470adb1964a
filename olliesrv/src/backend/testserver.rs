//! A hand-written HTTP/1.1 server on 127.0.0.1 for the backends' unit tests: canned replies
//! in order, each body written in separate pieces; what each request carried comes back on
//! a channel. [`serve`] answers one request per connection and closes it; [`serve_kept`]
//! keeps connections open (chunked bodies) and answers any number on each.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// The key every `OLLIE_TEST_KEY_*` variable holds (see [`fake_env`]).
pub const KEY: &str = "sk-test-0123456789abcdef";

/// Stands in for the environment: the crate forbids the `unsafe` that `set_var` needs.
pub fn fake_env(name: &str) -> Option<String> {
    name.starts_with("OLLIE_TEST_KEY_").then(|| KEY.to_owned())
}

/// A canned HTTP reply: the head, then the body in separately written pieces.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub chunks: Vec<Vec<u8>>,
}

impl Reply {
    pub fn sse(chunks: &[&str]) -> Reply {
        Reply {
            status: 200,
            headers: vec![("Content-Type", "text/event-stream".into())],
            chunks: chunks.iter().map(|c| c.as_bytes().to_vec()).collect(),
        }
    }

    pub fn ndjson(chunks: &[&str]) -> Reply {
        Reply {
            status: 200,
            headers: vec![("Content-Type", "application/x-ndjson".into())],
            chunks: chunks.iter().map(|c| c.as_bytes().to_vec()).collect(),
        }
    }

    pub fn json(status: u16, body: &str) -> Reply {
        Reply {
            status,
            headers: vec![("Content-Type", "application/json".into())],
            chunks: vec![body.as_bytes().to_vec()],
        }
    }
}

/// What the server received.
#[derive(Debug)]
pub struct Got {
    pub head: String,
    pub body: Vec<u8>,
    /// Which connection it came on, counted from 0 in the order they were accepted.
    pub conn: usize,
}

impl Got {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// Serves `replies` in order, one per connection, on 127.0.0.1; bodies end by closing the
/// connection. Returns the server root URL.
pub async fn serve(replies: Vec<Reply>) -> (String, mpsc::UnboundedReceiver<Got>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        for (conn, reply) in replies.into_iter().enumerate() {
            let (mut sock, _) = listener.accept().await.unwrap();
            let (head, body) = read_request(&mut sock).await.unwrap();
            tx.send(Got { head, body, conn }).unwrap();
            let mut out = format!("HTTP/1.1 {} X\r\n", reply.status);
            for (k, v) in &reply.headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("Connection: close\r\n\r\n");
            sock.write_all(out.as_bytes()).await.unwrap();
            for c in &reply.chunks {
                sock.write_all(c).await.unwrap();
                sock.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let _ = sock.shutdown().await;
        }
    });
    (format!("http://{addr}"), rx)
}

/// How long after a reply's last piece [`serve_kept`] with `late_end` ends its body.
pub const LATE_END: Duration = Duration::from_millis(100);

/// Reads one request: its head and its body (by `Content-Length`); `None` when the client
/// closes the connection before another request.
async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let head_end = loop {
        let mut b = [0u8; 4096];
        // A reset (the client dropped the connection) ends it like a close.
        let n = sock.read(&mut b).await.unwrap_or(0);
        if n == 0 {
            assert!(
                buf.is_empty(),
                "the client closed in the middle of a request"
            );
            return None;
        }
        buf.extend_from_slice(&b[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let mut b = [0u8; 4096];
        let n = sock.read(&mut b).await.unwrap();
        assert!(n > 0);
        body.extend_from_slice(&b[..n]);
    }
    Some((head, body))
}

/// Serves `replies` in order on 127.0.0.1 like [`serve`], but keeps each connection open
/// after a reply (its body sent chunked, one HTTP chunk per piece), so that a client may
/// send its next request on it. With `late_end`, the body's terminating chunk follows its
/// last piece after [`LATE_END`], as from a server that flushes it separately. Returns the
/// server root URL.
pub async fn serve_kept(
    replies: Vec<Reply>,
    late_end: bool,
) -> (String, mpsc::UnboundedReceiver<Got>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let replies = std::sync::Arc::new(std::sync::Mutex::new(
        replies
            .into_iter()
            .collect::<std::collections::VecDeque<_>>(),
    ));
    tokio::spawn(async move {
        for conn in 0.. {
            let (mut sock, _) = listener.accept().await.unwrap();
            let (tx, replies) = (tx.clone(), replies.clone());
            tokio::spawn(async move {
                while let Some((head, body)) = read_request(&mut sock).await {
                    tx.send(Got { head, body, conn }).unwrap();
                    let reply = replies.lock().unwrap().pop_front().expect("no reply left");
                    let mut out = format!("HTTP/1.1 {} X\r\n", reply.status);
                    for (k, v) in &reply.headers {
                        out.push_str(&format!("{k}: {v}\r\n"));
                    }
                    out.push_str("Transfer-Encoding: chunked\r\n\r\n");
                    sock.write_all(out.as_bytes()).await.unwrap();
                    for c in reply.chunks.iter().filter(|c| !c.is_empty()) {
                        sock.write_all(format!("{:x}\r\n", c.len()).as_bytes())
                            .await
                            .unwrap();
                        sock.write_all(c).await.unwrap();
                        sock.write_all(b"\r\n").await.unwrap();
                        sock.flush().await.unwrap();
                    }
                    if late_end {
                        tokio::time::sleep(LATE_END).await;
                    }
                    sock.write_all(b"0\r\n\r\n").await.unwrap();
                }
            });
        }
    });
    (format!("http://{addr}"), rx)
}

/// A loopback peer that reads each request and writes the next of `replies` (raw bytes,
/// head and all; the last one again for every later connection), then holds the connection
/// open without a further byte until the test ends: an empty reply is a server that accepts
/// and never answers, a head alone one that stalls before the body. Returns the server root
/// URL.
pub async fn stalling(replies: Vec<&'static [u8]>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        for conn in 0.. {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let reply = replies[conn.min(replies.len() - 1)];
            let _ = s.write_all(reply).await;
            held.push(s);
        }
    });
    url
}

/// The head of a chunked `200` JSON reply, for [`stalling`]: a body may follow.
pub const JSON_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";

/// Timeouts of 60 s but for the one named (`connect`, `first_byte`, `idle`): 1 s, so that
/// only it can end a request.
pub fn only(which: &str) -> crate::config::Timeouts {
    let (one, long) = (Duration::from_secs(1), Duration::from_secs(60));
    let pick = |w: &str| if w == which { one } else { long };
    crate::config::Timeouts {
        connect: pick("connect"),
        first_byte: pick("first_byte"),
        idle: pick("idle"),
    }
}
