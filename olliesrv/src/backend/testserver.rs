//! A hand-written HTTP/1.1 server on 127.0.0.1 for the backends' unit tests: canned replies
//! in order, one per connection, each body written in separate pieces; what each request
//! carried comes back on a channel.
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
        for reply in replies {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let head_end = loop {
                let mut b = [0u8; 4096];
                let n = sock.read(&mut b).await.unwrap();
                assert!(n > 0, "client closed before sending a request");
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
            tx.send(Got { head, body }).unwrap();
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
