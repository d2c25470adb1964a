//! An agent's chat: the append-only transcript with its block markers, read by offset and
//! waited on by readers.

use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::watch;

use crate::util::lock;

#[derive(Debug, Default)]
struct ChatInner {
    raw: Vec<u8>,
    text: Vec<u8>,
    closed: bool,
}

/// An agent's conversation as two append-only streams: `chat.raw` (with block markers) and
/// `chat` (the same without marker lines). Reads at the end wait for more; EOF once closed.
#[derive(Debug)]
pub struct Chat {
    inner: Mutex<ChatInner>,
    tick: watch::Sender<u64>,
}

/// Which chat stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatKind {
    Raw,
    Text,
}

impl Chat {
    pub(crate) fn new() -> Chat {
        Chat {
            inner: Mutex::new(ChatInner::default()),
            tick: watch::Sender::new(0),
        }
    }

    /// Restores from `chat.raw` bytes.
    pub(crate) fn restore(&self, raw: Vec<u8>) {
        let text = strip_markers(&raw);
        let mut c = lock(&self.inner);
        c.raw = raw;
        c.text = text;
    }

    /// One whole block: `[[[kind attrs` / body / `]]]`. Returns the raw bytes appended.
    pub fn block_bytes(kind: &str, attrs: &str, body: &str) -> (Vec<u8>, Vec<u8>) {
        let mut body = body.to_owned();
        if !body.ends_with('\n') {
            body.push('\n');
        }
        // A body line that looks like a marker would be misread: indent it by one space.
        let body: String = body
            .split_inclusive('\n')
            .map(|l| {
                if is_marker(l.trim_end_matches('\n').as_bytes()) {
                    format!(" {l}")
                } else {
                    l.to_owned()
                }
            })
            .collect();
        let head = if attrs.is_empty() {
            format!("[[[{kind}\n")
        } else {
            format!("[[[{kind} {attrs}\n")
        };
        let raw = format!("{head}{body}]]]\n").into_bytes();
        (raw, body.into_bytes())
    }

    pub(crate) fn append(&self, raw: &[u8], text: &[u8]) {
        let mut c = lock(&self.inner);
        if c.closed {
            return;
        }
        c.raw.extend_from_slice(raw);
        c.text.extend_from_slice(text);
        let n = c.raw.len() as u64;
        drop(c);
        self.tick.send_replace(n);
    }

    pub(crate) fn close(&self) {
        lock(&self.inner).closed = true;
        self.tick.send_modify(|v| *v += 1);
    }

    /// Current length of a stream.
    pub fn len(&self, kind: ChatKind) -> u64 {
        let c = lock(&self.inner);
        match kind {
            ChatKind::Raw => c.raw.len() as u64,
            ChatKind::Text => c.text.len() as u64,
        }
    }

    /// Up to `count` bytes at `offset`; at the end, waits for more (empty = EOF, closed).
    pub async fn read(&self, kind: ChatKind, offset: u64, count: u32) -> Bytes {
        let mut rx = self.tick.subscribe();
        loop {
            rx.borrow_and_update();
            {
                let c = lock(&self.inner);
                let buf = match kind {
                    ChatKind::Raw => &c.raw,
                    ChatKind::Text => &c.text,
                };
                let off = usize::try_from(offset).unwrap_or(usize::MAX);
                if off < buf.len() {
                    let end = off.saturating_add(count as usize).min(buf.len());
                    return Bytes::copy_from_slice(&buf[off..end]);
                }
                if c.closed {
                    return Bytes::new();
                }
            }
            if rx.changed().await.is_err() {
                return Bytes::new();
            }
        }
    }

    /// The last `n` bytes of the raw stream, starting at a line boundary where possible.
    pub fn tail(&self, n: usize) -> Bytes {
        let c = lock(&self.inner);
        let start = c.raw.len().saturating_sub(n);
        let mut s = start;
        if start > 0
            && let Some(p) = c.raw[start..].iter().position(|b| *b == b'\n')
        {
            s = start + p + 1;
        }
        Bytes::copy_from_slice(&c.raw[s..])
    }
}

fn is_marker(line: &[u8]) -> bool {
    line.starts_with(b"[[[") || line == b"]]]"
}

/// `chat.raw` without its marker lines.
pub fn strip_markers(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    for line in raw.split_inclusive(|b| *b == b'\n') {
        let bare = line.strip_suffix(b"\n").unwrap_or(line);
        if !is_marker(bare) {
            out.extend_from_slice(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_and_marker_stripping() {
        let (raw, text) = Chat::block_bytes("user", "", "hi\n]]]\n[[[x");
        let raw = String::from_utf8(raw).unwrap();
        assert_eq!(raw, "[[[user\nhi\n ]]]\n [[[x\n]]]\n");
        assert_eq!(strip_markers(raw.as_bytes()), text);
        assert_eq!(String::from_utf8(text).unwrap(), "hi\n ]]]\n [[[x\n");
    }
}
