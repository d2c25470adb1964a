//! Framing of streamed model replies: server-sent events ([`SseParser`], the OpenAI and
//! Anthropic APIs, llama.cpp) and newline-delimited JSON ([`LineSplitter`], Ollama), behind
//! one [`Framer`] trait. Neither ever panics on input, and both give the same items however
//! the bytes are cut into chunks.
//!
//! Self-contained (std and serde_json only): the fuzz target `stream` compiles this file as
//! it is (`fuzz/fuzz_targets/stream.rs`).

/// The largest single server-sent event or stream line.
pub(crate) const MAX_EVENT: usize = 8 << 20;

/// A splitter of a streamed reply into items (server-sent events, NDJSON lines).
pub(crate) trait Framer {
    type Item;
    /// Splits `bytes` off, pushing what is complete to `out`.
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<Self::Item>) -> Result<(), String>;
    /// The end of the stream: pushes what is left and still counts.
    fn finish(&mut self, out: &mut Vec<Self::Item>) -> Result<(), String>;
}

impl Framer for SseParser {
    type Item = Frame;
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<Frame>) -> Result<(), String> {
        SseParser::feed(self, bytes, out)
    }
    fn finish(&mut self, out: &mut Vec<Frame>) -> Result<(), String> {
        SseParser::finish(self, out)
    }
}

/// One dispatched server-sent event.
#[derive(Debug, PartialEq)]
pub(crate) enum Frame {
    /// The (joined) `data:` lines of an event.
    Data(String),
    /// An `error:` line (llama.cpp's way of failing a started stream).
    Error(String),
}

/// Splits a byte stream into server-sent events. Never panics on input.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// The unfinished line.
    line: Vec<u8>,
    /// The data lines of the current event.
    data: Option<String>,
}

impl SseParser {
    pub(crate) fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<Frame>) -> Result<(), String> {
        while let Some(pos) = bytes.iter().position(|b| *b == b'\n') {
            self.line.extend_from_slice(&bytes[..pos]);
            bytes = &bytes[pos + 1..];
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, out)?;
        }
        self.line.extend_from_slice(bytes);
        if self.line.len() > MAX_EVENT {
            return Err(format!(
                "a stream line is longer than {} MiB",
                MAX_EVENT >> 20
            ));
        }
        Ok(())
    }

    /// The end of the stream. The standard drops an event cut off by the end; we keep one
    /// that is nevertheless whole (`[DONE]` or a complete JSON value), since some servers
    /// close without the final blank line.
    pub(crate) fn finish(&mut self, out: &mut Vec<Frame>) -> Result<(), String> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, out)?;
        }
        if let Some(d) = self.data.take() {
            let t = d.trim();
            if t == "[DONE]" || serde_json::from_str::<serde::de::IgnoredAny>(t).is_ok() {
                out.push(Frame::Data(d));
            }
        }
        Ok(())
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<Frame>) -> Result<(), String> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if let Some(d) = self.data.take() {
                out.push(Frame::Data(d));
            }
            return Ok(());
        }
        if line.starts_with(b":") {
            return Ok(());
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => {
                let data = match &mut self.data {
                    Some(d) => {
                        // A further data line of the same event.
                        d.push('\n');
                        d
                    }
                    None => self.data.insert(String::new()),
                };
                data.push_str(value);
                if data.len() > MAX_EVENT {
                    return Err(format!(
                        "a stream event is longer than {} MiB",
                        MAX_EVENT >> 20
                    ));
                }
            }
            "error" => out.push(Frame::Error(value.to_owned())),
            _ => {}
        }
        Ok(())
    }
}

/// Splits a byte stream into lines (without the `\n`). Never panics on input.
#[derive(Debug, Default)]
pub(crate) struct LineSplitter {
    /// The unfinished line.
    line: Vec<u8>,
}

impl Framer for LineSplitter {
    type Item = Vec<u8>;

    fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<Vec<u8>>) -> Result<(), String> {
        while let Some(pos) = bytes.iter().position(|b| *b == b'\n') {
            self.line.extend_from_slice(&bytes[..pos]);
            bytes = &bytes[pos + 1..];
            self.check_len()?;
            out.push(std::mem::take(&mut self.line));
        }
        self.line.extend_from_slice(bytes);
        self.check_len()
    }

    /// The end of the stream: a last line without its `\n` still counts.
    fn finish(&mut self, out: &mut Vec<Vec<u8>>) -> Result<(), String> {
        if !self.line.is_empty() {
            out.push(std::mem::take(&mut self.line));
        }
        Ok(())
    }
}

impl LineSplitter {
    fn check_len(&self) -> Result<(), String> {
        if self.line.len() > MAX_EVENT {
            return Err(format!(
                "a stream line is longer than {} MiB",
                MAX_EVENT >> 20
            ));
        }
        Ok(())
    }
}
