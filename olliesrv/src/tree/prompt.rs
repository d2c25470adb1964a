//! Writing `prompt`, `fifo` and `agent/new`'s `prompt=`: how one open's Twrites become one
//! prompt.
//!
//! Clients split what they write: at their msize (`ollie-9p`, plan9port's `9p`), at each chunk
//! a pipe delivers, at each write(2) of a FUSE mount. So a Twrite is not a prompt. The rule:
//!
//! - a prompt is what one fid writes from a write at offset 0 through the writes that follow
//!   it (each at an offset inside or at the end of what was written: a client writing at
//!   increasing offsets, or rewriting a part);
//! - it is queued when the fid is clunked (or removed, or its connection ends), or when the
//!   fid's next write starts again at offset 0 (that write begins the next prompt);
//! - a prompt over [`MAX_PROMPT`] is refused whole: the write that crosses the limit fails
//!   with the size and the limit, and nothing of it is queued; the fid's later writes fail
//!   too, until one starts a new prompt at offset 0;
//! - an empty (or blank) prompt is not queued; the clunk says so.
//!
//! A clunk's error reaches the client in its Rclunk (the 9P core runs a clunk as a request
//! when nothing else is queued on the fid), and the writer's `lasterror`.

use std::sync::Arc;

use crate::state::Agent;
use crate::state::session::MAX_PROMPT;

/// One fid's prompt being written.
#[derive(Debug)]
pub struct PromptDraft {
    /// The bytes written so far, at their offsets (`offset` is where the prompt starts in the
    /// fid's writes: non-zero for `agent/new`'s `prompt=`).
    buf: Vec<u8>,
    offset: u64,
    /// The prompt went over [`MAX_PROMPT`]: its later writes are refused too.
    refused: bool,
}

impl PromptDraft {
    /// A prompt whose first byte is at `offset` of the fid's writes, starting with `first`.
    pub fn new(offset: u64, first: &[u8]) -> Result<PromptDraft, String> {
        let mut d = PromptDraft {
            buf: Vec::new(),
            offset,
            refused: false,
        };
        d.write(offset, first)?;
        Ok(d)
    }

    /// Where the prompt's writes end (a write here continues it).
    pub fn end(&self) -> u64 {
        self.offset + self.buf.len() as u64
    }

    /// Whether a write at `offset` belongs to this prompt (anything but offset 0, inside or
    /// at the end of what it has).
    pub fn continues(&self, offset: u64) -> bool {
        offset != 0 && offset >= self.offset && offset <= self.end()
    }

    /// A Twrite of `data` at `offset` (one [`PromptDraft::continues`] accepted).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        if self.refused {
            return Err(format!(
                "this prompt was refused (over {MAX_PROMPT} bytes) and nothing of it is queued; write again from offset 0 (a fresh open) for a new one"
            ));
        }
        let at = usize::try_from(offset.saturating_sub(self.offset)).unwrap_or(usize::MAX);
        if at > self.buf.len() {
            return Err(format!(
                "prompt write at offset {offset} leaves a gap: the prompt ends at {}",
                self.end()
            ));
        }
        let new_len = self.buf.len().max(at.saturating_add(data.len()));
        if new_len > MAX_PROMPT {
            self.refused = true;
            self.buf = Vec::new();
            return Err(too_big(new_len));
        }
        self.buf.resize(new_len, 0);
        if let Some(dst) = self.buf.get_mut(at..at + data.len()) {
            dst.copy_from_slice(data);
        }
        Ok(())
    }

    /// The prompt, once complete.
    pub fn finish(self) -> Result<Finished, String> {
        if self.refused {
            return Ok(Finished::Refused);
        }
        let t = String::from_utf8(self.buf).map_err(|e| {
            format!(
                "prompt is not UTF-8 (at byte {}): nothing was queued",
                e.utf8_error().valid_up_to()
            )
        })?;
        if t.trim().is_empty() {
            return Ok(Finished::Blank);
        }
        Ok(Finished::Prompt(t))
    }
}

/// What a complete prompt draft holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Finished {
    Prompt(String),
    /// Nothing but whitespace: not queued.
    Blank,
    /// Over the limit: not queued (the write that crossed it said so).
    Refused,
}

/// The error of a write that would make a prompt `n` bytes.
fn too_big(n: usize) -> String {
    format!(
        "prompt refused: this write makes it {n} bytes, over the limit of {MAX_PROMPT}; nothing of it is queued"
    )
}

/// A fid of `prompt`, `fifo` or `agent/new`: the agent and the prompt being written.
#[derive(Debug)]
pub struct PromptWriter {
    pub agent: Arc<Agent>,
    pub draft: PromptDraft,
}

/// Splits an `agent/new` request at its `prompt=` key: the keys before it, and the prompt's
/// start (the byte offset of its value in `text`), if there is one. `prompt=` is a key where
/// it starts the text or follows whitespace.
pub fn split_prompt_key(text: &str) -> (&str, Option<usize>) {
    const KEY: &str = "prompt=";
    let mut from = 0;
    while let Some(i) = text.get(from..).and_then(|t| t.find(KEY)) {
        let at = from + i;
        let starts_key = at == 0
            || text
                .get(..at)
                .and_then(|b| b.chars().next_back())
                .is_some_and(char::is_whitespace);
        if starts_key {
            return (text.get(..at).unwrap_or(""), Some(at + KEY.len()));
        }
        from = at + KEY.len();
    }
    (text, None)
}

/// An `agent/new` prompt's final text: `\n` in it is a newline, and the one line end that
/// closes the request (`echo`, `printf '…\n'`) is not part of it.
pub fn spawn_prompt_text(raw: &str) -> String {
    let raw = raw
        .strip_suffix("\r\n")
        .or_else(|| raw.strip_suffix('\n'))
        .unwrap_or(raw);
    raw.replace("\\n", "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_at_increasing_offsets_are_one_prompt() {
        let mut d = PromptDraft::new(0, b"fix ").unwrap();
        assert!(d.continues(4));
        d.write(4, b"the bug").unwrap();
        // A rewrite inside continues too; a gap is refused; offset 0 never continues.
        assert!(d.continues(2));
        d.write(4, b"THE").unwrap();
        assert!(!d.continues(0));
        assert!(!d.continues(100));
        let e = d.write(100, b"x").unwrap_err();
        assert!(e.contains("gap"), "{e}");
        assert_eq!(d.finish().unwrap(), Finished::Prompt("fix THE bug".into()));
    }

    #[test]
    fn a_prompt_over_the_limit_is_refused_whole() {
        let chunk = vec![b'x'; 8192];
        let mut d = PromptDraft::new(0, &chunk).unwrap();
        let mut off = chunk.len() as u64;
        let e = loop {
            match d.write(off, &chunk) {
                Ok(()) => off += chunk.len() as u64,
                Err(e) => break e,
            }
        };
        assert!(
            e.contains(&format!("over the limit of {MAX_PROMPT}")),
            "{e}"
        );
        assert!(
            e.contains(&format!("{}", off as usize + chunk.len())),
            "{e}"
        );
        assert!(!e.contains('\n'));
        // Later writes are refused; nothing is left to queue.
        assert!(d.write(off, b"more").unwrap_err().contains("refused"));
        assert_eq!(d.finish().unwrap(), Finished::Refused);
    }

    #[test]
    fn blank_and_non_utf8_prompts_are_not_queued() {
        assert_eq!(
            PromptDraft::new(0, b" \n").unwrap().finish().unwrap(),
            Finished::Blank
        );
        // A character split between two writes is whole at the end.
        let e = "é".as_bytes();
        let mut d = PromptDraft::new(0, &e[..1]).unwrap();
        d.write(1, &e[1..]).unwrap();
        assert_eq!(d.finish().unwrap(), Finished::Prompt("é".into()));
        let e = PromptDraft::new(0, b"ok\xff")
            .unwrap()
            .finish()
            .unwrap_err();
        assert!(e.contains("not UTF-8 (at byte 2)"), "{e}");
    }

    #[test]
    fn the_prompt_key_is_found_only_as_a_key() {
        assert_eq!(split_prompt_key("name=a"), ("name=a", None));
        assert_eq!(
            split_prompt_key("name=a cwd=/x\nprompt=fix it"),
            ("name=a cwd=/x\n", Some(21))
        );
        assert_eq!(split_prompt_key("prompt=x"), ("", Some(7)));
        // Inside a value it is not the key.
        assert_eq!(
            split_prompt_key("cwd=/a/prompt=b"),
            ("cwd=/a/prompt=b", None)
        );
        let (keys, at) = split_prompt_key("cwd=/a/prompt=b prompt=go");
        assert_eq!((keys, at), ("cwd=/a/prompt=b ", Some(23)));
        assert_eq!(spawn_prompt_text("fix\\nit\n"), "fix\nit");
        assert_eq!(spawn_prompt_text("two\nlines"), "two\nlines");
    }
}
