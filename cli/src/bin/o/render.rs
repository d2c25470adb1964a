//! Pure text handling for `o`: the `[[[kind …` / `]]]` blocks of `chat.raw`, their rendering
//! on a terminal, the `idx`/`stats` formats olliesrv serves, and the escaping of every text
//! `o` prints that someone else chose. No I/O here, so every rule is unit-tested below.
//!
//! # Untrusted text on the terminal
//!
//! Model replies, reasoning, tool calls and their output, agent states, names, ctl replies and
//! server error messages are chosen by a model, a tool, an agent or a remote peer. `o` never
//! writes them to standard output or standard error as they are: every print path goes
//! through [`terminal_safe`] (whole texts), [`SafeStream`] (chat streamed in pieces, the
//! [`Renderer`] included), [`line_safe`] (one-line fields: names, states) or [`json_safe`]
//! (`--json` output). Always, whether or not the output is a terminal: a pipe into
//! `less -R`, `tee` or a log that is `cat` later ends on a terminal too. The exact bytes stay
//! available with `ollie-9p read`.
//!
//! The rule is the approval broker's (`ollie_link::bypass::needs_display_escape`, one set for
//! both): every character of that set (C0 controls, carriage return included, DEL, C1
//! controls, bidi embeddings, overrides, isolates and marks, zero-width and other invisible
//! characters) is shown as `\u{X}`, its code point in uppercase hex: ESC is `\u{1B}`, the
//! 8-bit CSI `\u{9B}`, RLO `\u{202E}`. Newline and tab are kept in multi-line text (chat
//! must stay readable); [`line_safe`] escapes them too. Bytes that are not UTF-8 are shown as
//! U+FFFD (`�`), never passed on (a raw 0x9B byte is a CSI on some terminals). Unlike the
//! broker, a backslash is kept as it is (code and paths in chat stay readable), so the text
//! `\u{1B}` typed by a model looks like an escaped ESC; it is still only text. `o`'s own
//! styling (the block colours) is written around escaped text, never inside it.

use std::borrow::Cow;

use ollie_link::bypass::needs_display_escape;

/// Whether `c` is shown as `\u{X}` in multi-line untrusted text: the broker's set, except
/// newline and tab.
pub fn is_escaped(c: char) -> bool {
    c != '\n' && c != '\t' && needs_display_escape(c)
}

fn push_escape(out: &mut String, c: char) {
    out.push_str(&format!("\\u{{{:X}}}", u32::from(c)));
}

fn escape_with(s: &str, escaped: impl Fn(char) -> bool) -> Cow<'_, str> {
    let Some(first) = s.find(&escaped) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len() + 16);
    out.push_str(&s[..first]);
    for c in s[first..].chars() {
        if escaped(c) {
            push_escape(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `s` made safe to print: every [`is_escaped`] character becomes `\u{X}`; newline, tab and
/// everything else (letters of every script, emoji, backslashes) are kept. Borrowed when
/// nothing needs escaping. Idempotent: its output has nothing left to escape.
pub fn terminal_safe(s: &str) -> Cow<'_, str> {
    escape_with(s, is_escaped)
}

/// [`terminal_safe`] for one-line fields (names, ids, states): newline and tab are escaped
/// as well, so a field can neither break a line nor shift a column.
pub fn line_safe(s: &str) -> Cow<'_, str> {
    escape_with(s, needs_display_escape)
}

/// Bytes from the server made safe to print: [`terminal_safe`] of their UTF-8 decoding, each
/// invalid sequence shown as U+FFFD.
pub fn terminal_safe_bytes(b: &[u8]) -> String {
    let mut out = Vec::with_capacity(b.len());
    let mut s = SafeStream::default();
    s.feed(b, &mut out);
    s.finish(&mut out);
    // SafeStream only writes whole UTF-8 characters.
    String::from_utf8_lossy(&out).into_owned()
}

/// JSON text (as serde_json writes it) made safe to print without changing what it means:
/// every [`needs_display_escape`] character left raw inside a string (serde_json escapes only
/// C0 controls; DEL, C1, bidi and invisible characters stay raw) becomes its JSON escape
/// `\uXXXX` (a surrogate pair above U+FFFF). The newlines of pretty-printed JSON are outside
/// strings and kept; a parser reads the same values as before.
pub fn json_safe(json: &str) -> Cow<'_, str> {
    let escaped = |c: char| c != '\n' && needs_display_escape(c);
    let Some(first) = json.find(escaped) else {
        return Cow::Borrowed(json);
    };
    let mut out = String::with_capacity(json.len() + 16);
    out.push_str(&json[..first]);
    for c in json[first..].chars() {
        if escaped(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{:04x}", u));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`terminal_safe`] for a byte stream that arrives in pieces of any size: a UTF-8 sequence
/// split between two pieces is held until its end arrives (and decoded whole), an invalid
/// one becomes U+FFFD. Each character is escaped on its own, so a control sequence split
/// across pieces (ESC at the end of one, `]52;…` at the start of the next) is made visible
/// like a whole one.
#[derive(Debug, Default)]
pub struct SafeStream {
    /// The start of a UTF-8 sequence whose end has not arrived yet (at most 3 bytes).
    pending: Vec<u8>,
}

impl SafeStream {
    /// Escapes the next bytes of the stream into `out` (only whole UTF-8 characters).
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        let joined;
        let mut rest: &[u8] = if self.pending.is_empty() {
            data
        } else {
            let mut j = std::mem::take(&mut self.pending);
            j.extend_from_slice(data);
            joined = j;
            &joined
        };
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.extend_from_slice(terminal_safe(s).as_bytes());
                    return;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is UTF-8 by the decoder's word.
                    let valid = std::str::from_utf8(valid).unwrap_or_default();
                    out.extend_from_slice(terminal_safe(valid).as_bytes());
                    match e.error_len() {
                        Some(n) => {
                            out.extend_from_slice(REPLACEMENT.as_bytes());
                            rest = after.get(n..).unwrap_or_default();
                        }
                        None => {
                            // An incomplete sequence at the end: wait for the rest.
                            self.pending = after.to_vec();
                            return;
                        }
                    }
                }
            }
        }
    }

    /// The stream ends here (or a line does): a held incomplete sequence is shown as U+FFFD.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.pending.is_empty() {
            self.pending.clear();
            out.extend_from_slice(REPLACEMENT.as_bytes());
        }
    }
}

/// What a byte sequence that is not UTF-8 is shown as.
const REPLACEMENT: &str = "\u{FFFD}";

/// Whether a whole line (without its newline) is a block marker, exactly as olliesrv decides
/// (`model::is_marker`): body lines that would look like one are indented by the server.
pub fn is_marker(line: &[u8]) -> bool {
    line.starts_with(b"[[[") || line == b"]]]"
}

/// Whether an incomplete line could still turn out to be a marker once the rest arrives.
fn could_be_marker(partial: &[u8]) -> bool {
    partial.starts_with(b"[[[") || b"[[[".starts_with(partial) || b"]]]".starts_with(partial)
}

/// One block of `chat.raw`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// `user`, `assistant`, `reasoning`, `tool_call`, `tool_result`, `error`, `info`.
    pub kind: String,
    /// What follows the kind on the opening marker (`injected` for `ctl inject`).
    pub attrs: String,
    /// The body, newline-terminated lines.
    pub body: String,
}

/// Splits `chat.raw` bytes into blocks. Text outside any block (which olliesrv never writes)
/// becomes a block of kind `""`; an unterminated last block is returned as it stands.
pub fn parse_blocks(raw: &[u8]) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    let mut open = false;
    for line in raw.split_inclusive(|b| *b == b'\n') {
        let bare = line.strip_suffix(b"\n").unwrap_or(line);
        if let Some(head) = bare.strip_prefix(b"[[[") {
            let head = String::from_utf8_lossy(head);
            let (kind, attrs) = head.split_once(' ').unwrap_or((&head, ""));
            out.push(Block {
                kind: kind.to_owned(),
                attrs: attrs.trim().to_owned(),
                body: String::new(),
            });
            open = true;
        } else if bare == b"]]]" {
            open = false;
        } else {
            if !open {
                out.push(Block {
                    kind: String::new(),
                    attrs: String::new(),
                    body: String::new(),
                });
                open = true;
            }
            if let Some(b) = out.last_mut() {
                b.body.push_str(&String::from_utf8_lossy(line));
            }
        }
    }
    out
}

/// The ANSI style a block kind is shown in on a terminal.
fn style(kind: &str) -> &'static str {
    match kind {
        "user" => "\x1b[1m",
        "error" => "\x1b[31m",
        "reasoning" | "info" => "\x1b[2m",
        "tool_call" | "tool_result" => "\x1b[36m",
        _ => "",
    }
}

const RESET: &str = "\x1b[0m";
const DIM: &str = "\x1b[2m";

/// Renders a `chat.raw` stream for a terminal as it arrives, in pieces of any size: marker
/// lines become one compact `[kind attrs]` line, body text is styled by its block's kind
/// (with `colour` off, text is plain and only the markers are rewritten). Everything from
/// the stream is escaped ([`SafeStream`], markers with [`terminal_safe`]); the styles are
/// written around the escaped text.
#[derive(Debug, Default)]
pub struct Renderer {
    colour: bool,
    /// The escaping of body text, which holds a UTF-8 sequence split between pieces.
    safe: SafeStream,
    /// The start of a line that might still be a marker.
    held: Vec<u8>,
    /// Inside a line that is known not to be a marker.
    mid_line: bool,
    /// The kind of the open block.
    kind: Option<String>,
}

impl Renderer {
    pub fn new(colour: bool) -> Renderer {
        Renderer {
            colour,
            ..Renderer::default()
        }
    }

    /// Renders `data` (the next bytes of the stream) into `out`.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        for seg in data.split_inclusive(|b| *b == b'\n') {
            let complete = seg.ends_with(b"\n");
            if self.mid_line {
                self.text(seg, out);
                self.mid_line = !complete;
                continue;
            }
            self.held.extend_from_slice(seg);
            if complete {
                let line = std::mem::take(&mut self.held);
                let bare = line.strip_suffix(b"\n").unwrap_or(&line);
                if is_marker(bare) {
                    self.marker(bare, out);
                } else {
                    self.text(&line, out);
                }
            } else if !could_be_marker(&self.held) {
                let part = std::mem::take(&mut self.held);
                self.text(&part, out);
                self.mid_line = true;
            }
        }
    }

    fn marker(&mut self, bare: &[u8], out: &mut Vec<u8>) {
        let Some(head) = bare.strip_prefix(b"[[[") else {
            self.kind = None;
            return;
        };
        let head = String::from_utf8_lossy(head).trim().to_owned();
        let kind = head.split(' ').next().unwrap_or("").to_owned();
        let shown = line_safe(&head);
        if self.colour {
            out.extend_from_slice(format!("{DIM}[{shown}]{RESET}\n").as_bytes());
        } else {
            out.extend_from_slice(format!("[{shown}]\n").as_bytes());
        }
        self.kind = Some(kind);
    }

    /// The stream has ended: what is held (the start of a line that could have been a
    /// marker, a UTF-8 sequence left open) is shown as text.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let held = std::mem::take(&mut self.held);
        self.text(&held, out);
        let mut tail = Vec::new();
        self.safe.finish(&mut tail);
        out.extend_from_slice(&tail);
    }

    /// Body text: escaped, then styled; a line's end also ends a UTF-8 sequence left open.
    fn text(&mut self, piece: &[u8], out: &mut Vec<u8>) {
        let st = if self.colour {
            style(self.kind.as_deref().unwrap_or(""))
        } else {
            ""
        };
        let (body, nl) = match piece.strip_suffix(b"\n") {
            Some(b) => (b, true),
            None => (piece, false),
        };
        let mut shown = Vec::with_capacity(body.len());
        self.safe.feed(body, &mut shown);
        if nl {
            self.safe.finish(&mut shown);
        }
        if !st.is_empty() && !shown.is_empty() {
            out.extend_from_slice(st.as_bytes());
            out.extend_from_slice(&shown);
            out.extend_from_slice(RESET.as_bytes());
        } else {
            out.extend_from_slice(&shown);
        }
        if nl {
            out.push(b'\n');
        }
    }
}

/// One line of `session/idx`: `name<TAB>id<TAB>agents<TAB>toolsrv state<TAB>paused`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLine {
    pub name: String,
    pub id: String,
    pub agents: u64,
    pub toolsrv: String,
    pub paused: bool,
}

/// Parses `session/idx`; lines that do not have the five fields are skipped.
pub fn parse_session_idx(text: &str) -> Vec<SessionLine> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            match f.as_slice() {
                [name, id, agents, toolsrv, paused] => Some(SessionLine {
                    name: (*name).to_owned(),
                    id: (*id).to_owned(),
                    agents: agents.parse().unwrap_or(0),
                    toolsrv: (*toolsrv).to_owned(),
                    paused: *paused == "true",
                }),
                _ => None,
            }
        })
        .collect()
}

/// One line of `agent/idx`: `name<TAB>id<TAB>state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLine {
    pub name: String,
    pub id: String,
    pub state: String,
}

/// Parses `agent/idx`; malformed lines are skipped.
pub fn parse_agent_idx(text: &str) -> Vec<AgentLine> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            match f.as_slice() {
                [name, id, state] => Some(AgentLine {
                    name: (*name).to_owned(),
                    id: (*id).to_owned(),
                    state: (*state).to_owned(),
                }),
                _ => None,
            }
        })
        .collect()
}

/// The counters of an agent's `stats` that `o ls` shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
    pub context_tokens: u64,
    pub context_limit: u64,
}

impl Stats {
    /// Parses `key=value` lines; missing or malformed values count as 0.
    pub fn parse(text: &str) -> Stats {
        let mut s = Stats::default();
        for (k, v) in text.lines().filter_map(|l| l.split_once('=')) {
            let n = || v.trim().parse::<u64>().unwrap_or(0);
            match k.trim() {
                "tokens_in" => s.tokens_in = n(),
                "tokens_out" => s.tokens_out = n(),
                "cost_usd" => s.cost_usd = v.trim().parse().unwrap_or(0.0),
                "context_tokens" => s.context_tokens = n(),
                "context_limit" => s.context_limit = n(),
                _ => {}
            }
        }
        s
    }

    pub fn tokens(&self) -> u64 {
        self.tokens_in.saturating_add(self.tokens_out)
    }

    /// How full the context window is, in percent; `None` when the limit is unknown (0).
    pub fn context_percent(&self) -> Option<f64> {
        (self.context_limit > 0)
            .then(|| self.context_tokens as f64 * 100.0 / self.context_limit as f64)
    }
}

/// `NAME` or `NAME/AGENT`, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub session: String,
    pub agent: Option<String>,
}

impl Target {
    pub fn parse(s: &str) -> Result<Target, String> {
        let bad = || format!("{s:?} is not NAME or NAME/AGENT");
        let (session, agent) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        if session.is_empty() || agent.is_some_and(|a| a.is_empty() || a.contains('/')) {
            return Err(bad());
        }
        Ok(Target {
            session: session.to_owned(),
            agent: agent.map(str::to_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RAW: &str =
        "[[[user\nhello\n ]]]\n]]]\n[[[error\nno backend\n]]]\n[[[user injected\nx\n]]]\n";

    #[test]
    fn blocks_parse() {
        let b = parse_blocks(RAW.as_bytes());
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].kind, "user");
        assert_eq!(b[0].body, "hello\n ]]]\n");
        assert_eq!(b[1].kind, "error");
        assert_eq!(b[1].body, "no backend\n");
        assert_eq!(b[2].attrs, "injected");
        assert_eq!(b[2].body, "x\n");
        assert!(parse_blocks(b"").is_empty());
        let stray = parse_blocks(b"loose\n");
        assert_eq!(stray[0].kind, "");
        assert_eq!(stray[0].body, "loose\n");
    }

    fn render(colour: bool, pieces: &[&str]) -> String {
        let mut r = Renderer::new(colour);
        let mut out = Vec::new();
        for p in pieces {
            r.feed(p.as_bytes(), &mut out);
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn renders_markers_compactly_without_colour() {
        assert_eq!(
            render(false, &[RAW]),
            "[user]\nhello\n ]]]\n[error]\nno backend\n[user injected]\nx\n"
        );
    }

    #[test]
    fn rendering_does_not_depend_on_how_the_stream_is_split() {
        let whole = render(true, &[RAW]);
        // Every split point, including inside markers and ANSI-relevant newlines.
        for i in 0..RAW.len() {
            let (a, b) = RAW.split_at(i);
            let got = render(true, &[a, b]);
            // Text split mid-line is styled piecewise; strip styles to compare the text.
            assert_eq!(strip_ansi(&got), strip_ansi(&whole), "split at {i}");
        }
        let bytes: Vec<String> = RAW.chars().map(|c| c.to_string()).collect();
        let refs: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert_eq!(strip_ansi(&render(true, &refs)), strip_ansi(&whole));
    }

    fn strip_ansi(s: &str) -> String {
        let mut out = String::new();
        let mut it = s.chars();
        while let Some(c) = it.next() {
            if c == '\x1b' {
                for d in it.by_ref() {
                    if d == 'm' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    #[test]
    fn colours_by_kind() {
        let out = render(
            true,
            &[
                "[[[user\nhi\n]]]\n[[[error\nbad\n]]]\n[[[reasoning\nhm\n]]]\n[[[tool_call\nls\n]]]\n[[[assistant\nok\n]]]\n",
            ],
        );
        assert!(out.contains("\x1b[1mhi\x1b[0m\n"), "{out:?}");
        assert!(out.contains("\x1b[31mbad\x1b[0m\n"), "{out:?}");
        assert!(out.contains("\x1b[2mhm\x1b[0m\n"), "{out:?}");
        assert!(out.contains("\x1b[36mls\x1b[0m\n"), "{out:?}");
        assert!(out.contains("\nok\n"), "{out:?}");
        assert!(!out.contains("[[["), "{out:?}");
        assert!(!out.contains("]]]"), "{out:?}");
    }

    #[test]
    fn a_partial_line_that_cannot_be_a_marker_is_shown_at_once() {
        let mut r = Renderer::new(false);
        let mut out = Vec::new();
        r.feed(b"[[[assistant\nstreaming tok", &mut out);
        assert_eq!(String::from_utf8_lossy(&out), "[assistant]\nstreaming tok");
        out.clear();
        r.feed(b"[[[", &mut out);
        // Mid-line: not a marker, shown as text.
        assert_eq!(String::from_utf8_lossy(&out), "[[[");
        out.clear();
        r.feed(b"\n]]", &mut out);
        assert_eq!(String::from_utf8_lossy(&out), "\n");
        out.clear();
        r.feed(b"]\n", &mut out);
        assert!(out.is_empty());
    }

    /// The escapes the client tests use: terminal sequences of every kind a model or tool
    /// could send.
    const NASTY: &str = "a\x1b]52;c;SGVsbG8=\x07b\x1b]52;c;SGVsbG8=\x1b\\c\x1b[2J\x1b]0;title\x07\
        \u{9b}31m\u{9d}0;t\u{9c}\r\x08\x7f\u{202e}rlo\u{2066}lri\u{200b}zw\u{feff}\u{2800}z";

    fn escaped(c: char) -> String {
        format!("\\u{{{:X}}}", u32::from(c))
    }

    /// Whether `b` holds a byte that drives a terminal: ESC, another C0 control but newline
    /// and tab, DEL, or a C1 control (UTF-8 0xC2 0x80..=0x9F).
    fn has_control_bytes(b: &[u8]) -> bool {
        b.iter()
            .any(|&x| (x < 0x20 && x != b'\n' && x != b'\t') || x == 0x7f)
            || b.windows(2)
                .any(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1]))
    }

    #[test]
    fn terminal_safe_escapes_exactly_the_brokers_set_but_newline_and_tab() {
        for c in (0..=u32::from(char::MAX)).filter_map(char::from_u32) {
            let s = c.to_string();
            let got = terminal_safe(&s);
            let want = if needs_display_escape(c) && c != '\n' && c != '\t' {
                escaped(c)
            } else {
                s.clone()
            };
            assert_eq!(got, want, "U+{:04X}", u32::from(c));
            let want_line = if needs_display_escape(c) {
                escaped(c)
            } else {
                s
            };
            assert_eq!(
                line_safe(&c.to_string()),
                want_line,
                "U+{:04X}",
                u32::from(c)
            );
        }
    }

    #[test]
    fn terminal_sequences_of_every_kind_are_made_visible() {
        let got = terminal_safe(NASTY);
        for (raw, shown) in [
            ("\x1b]52;c;SGVsbG8=\x07", "\\u{1B}]52;c;SGVsbG8=\\u{7}"),
            ("\x1b]52;c;SGVsbG8=\x1b\\", "\\u{1B}]52;c;SGVsbG8=\\u{1B}\\"),
            ("\x1b[2J", "\\u{1B}[2J"),
            ("\x1b]0;title\x07", "\\u{1B}]0;title\\u{7}"),
            ("\u{9b}31m", "\\u{9B}31m"),
            ("\u{9d}0;t\u{9c}", "\\u{9D}0;t\\u{9C}"),
            ("\r\x08\x7f", "\\u{D}\\u{8}\\u{7F}"),
            ("\u{202e}rlo\u{2066}lri", "\\u{202E}rlo\\u{2066}lri"),
            ("\u{200b}zw\u{feff}", "\\u{200B}zw\\u{FEFF}"),
        ] {
            assert!(NASTY.contains(raw));
            assert!(got.contains(shown), "{raw:?}: {got}");
        }
        // Braille blank and whatever else the broker's set holds: as it decides.
        assert_eq!(
            got.contains("\\u{2800}"),
            needs_display_escape('\u{2800}'),
            "{got}"
        );
        assert!(!has_control_bytes(got.as_bytes()), "{got:?}");
        assert!(!got.chars().any(is_escaped), "{got:?}");
        // Nothing left to escape: escaping again changes nothing.
        assert_eq!(terminal_safe(&got), got);
    }

    #[test]
    fn newline_tab_backslashes_and_every_script_stay() {
        for text in [
            "line one\n\tindented\nC:\\path\\n \\u{1B} literal\n",
            "Grüße, naïve café; Ελληνικά; Кириллица; עברית; مرحبا; हिन्दी; 中文; 日本語; 한국어",
            "emoji 🎉👍🏽 🇫🇷 ✓ — “quotes” …",
            "",
        ] {
            assert!(
                matches!(terminal_safe(text), Cow::Borrowed(t) if t == text),
                "{text}"
            );
        }
        assert_eq!(line_safe("a\tb\nc"), "a\\u{9}b\\u{A}c");
        // An emoji's variation selector is in the set: the emoji shows, the selector escaped.
        assert_eq!(terminal_safe("\u{2764}\u{fe0f}"), "\u{2764}\\u{FE0F}");
    }

    #[test]
    fn bytes_that_are_not_utf8_become_a_visible_replacement() {
        assert_eq!(terminal_safe_bytes(b"\x9b31m"), "\u{FFFD}31m");
        assert_eq!(terminal_safe_bytes(b"a\xc2"), "a\u{FFFD}");
        assert_eq!(
            terminal_safe_bytes(b"\xff\xfe\x1b[2J"),
            "\u{FFFD}\u{FFFD}\\u{1B}[2J"
        );
        assert_eq!(terminal_safe_bytes("é\u{9b}".as_bytes()), "é\\u{9B}");
        for b in 0x80..=0xffu8 {
            assert!(
                !has_control_bytes(terminal_safe_bytes(&[b]).as_bytes()),
                "{b:#x}"
            );
        }
    }

    /// `data` through a [`SafeStream`] in pieces cut at `cuts`.
    fn streamed(data: &[u8], cuts: &[usize]) -> String {
        let mut s = SafeStream::default();
        let mut out = Vec::new();
        let mut at = 0;
        for &c in cuts.iter().chain(std::iter::once(&data.len())) {
            s.feed(&data[at..c], &mut out);
            at = c;
        }
        s.finish(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn streaming_does_not_depend_on_where_reads_end() {
        let text = format!("ü{NASTY}→é🎉\n中");
        let data = text.as_bytes();
        let whole = terminal_safe(&text).into_owned();
        assert_eq!(streamed(data, &[]), whole);
        for i in 0..=data.len() {
            assert_eq!(streamed(data, &[i]), whole, "cut at {i}");
        }
        let every: Vec<usize> = (1..data.len()).collect();
        assert_eq!(streamed(data, &every), whole);
        // ESC at the end of one read, the rest of OSC 52 at the start of the next.
        assert_eq!(
            streamed(b"x\x1b]52;c;SGVsbG8=\x07", &[2]),
            "x\\u{1B}]52;c;SGVsbG8=\\u{7}"
        );
        // The two bytes of an 8-bit CSI, apart: still the escaped control.
        assert_eq!(streamed("\u{9b}2J".as_bytes(), &[1]), "\\u{9B}2J");
        // A sequence that never completes: one replacement, at the end.
        assert_eq!(streamed(b"ok\xe2\x82", &[3]), "ok\u{FFFD}");
        // Invalid bytes are not held: what follows shows at once.
        let mut s = SafeStream::default();
        let mut out = Vec::new();
        s.feed(b"\x9bA", &mut out);
        assert_eq!(out, "\u{FFFD}A".as_bytes());
    }

    #[test]
    fn rendered_chat_is_escaped_inside_our_own_styles() {
        let raw = format!(
            "[[[assistant\n{NASTY}\n]]]\n[[[tool_result \x1b]0;t\x07\nout\x1b[2J\r\n]]]\n[[[error\n\u{9b}boom\n]]]\n"
        );
        for colour in [false, true] {
            let out = render(colour, &[&raw]);
            let ours = out
                .replace(RESET, "")
                .replace(DIM, "")
                .replace("\x1b[1m", "")
                .replace("\x1b[31m", "")
                .replace("\x1b[36m", "");
            assert!(!has_control_bytes(ours.as_bytes()), "{colour}: {ours:?}");
            assert!(ours.contains(&*terminal_safe(NASTY)), "{ours}");
            assert!(ours.contains("[tool_result \\u{1B}]0;t\\u{7}]\n"), "{ours}");
            assert!(ours.contains("out\\u{1B}[2J\\u{D}\n"), "{ours}");
            assert!(ours.contains("\\u{9B}boom\n"), "{ours}");
            if colour {
                assert!(
                    out.contains("\x1b[36mout\\u{1B}[2J\\u{D}\x1b[0m\n"),
                    "{out:?}"
                );
            }
        }
        // Cut anywhere, even inside a UTF-8 sequence or an escape: the same text.
        let whole = strip_ansi(&render(true, &[&raw]));
        for i in 0..=raw.len() {
            let (a, b) = raw.as_bytes().split_at(i);
            let mut r = Renderer::new(true);
            let mut out = Vec::new();
            r.feed(a, &mut out);
            r.feed(b, &mut out);
            r.finish(&mut out);
            assert_eq!(
                strip_ansi(&String::from_utf8(out).unwrap()),
                whole,
                "cut at {i}"
            );
        }
    }

    #[test]
    fn json_stays_the_same_json_without_raw_controls() {
        let v = serde_json::json!({
            "reply": NASTY,
            "k\u{202e}": ["\u{e0041}tag", 1, null],
            "plain": "ü\n\t",
        });
        for text in [
            serde_json::to_string(&v).unwrap(),
            serde_json::to_string_pretty(&v).unwrap(),
        ] {
            let safe = json_safe(&text);
            assert!(
                !has_control_bytes(safe.replace('\n', "").as_bytes()),
                "{safe}"
            );
            assert!(
                !safe.chars().any(|c| c != '\n' && needs_display_escape(c)),
                "{safe}"
            );
            assert!(safe.contains("\\u009b31m"), "{safe}");
            assert!(safe.contains("\\udb40\\udc41tag"), "{safe}");
            let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
            assert_eq!(back, v);
            assert_eq!(safe.lines().count(), text.lines().count());
        }
        assert!(matches!(json_safe("{\"a\":\"ü\"}"), Cow::Borrowed(_)));
    }

    #[test]
    fn idx_and_stats() {
        let s = parse_session_idx("p1\tid1\t2\tup\tfalse\nbad line\np2\tid2\t0\tfailed\ttrue\n");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].agents, 2);
        assert!(!s[0].paused);
        assert!(s[1].paused);
        assert_eq!(s[1].toolsrv, "failed");
        let a = parse_agent_idx("main\tid\tidle\n");
        assert_eq!(a[0].state, "idle");
        let st = Stats::parse(
            "tokens_in=10\ntokens_out=5\ncost_usd=0.250000\ncontext_tokens=50\ncontext_limit=200\n",
        );
        assert_eq!(st.tokens(), 15);
        assert_eq!(st.cost_usd, 0.25);
        assert_eq!(st.context_percent(), Some(25.0));
        assert_eq!(Stats::parse("context_tokens=5\n").context_percent(), None);
    }

    #[test]
    fn targets() {
        assert_eq!(
            Target::parse("s/a").unwrap(),
            Target {
                session: "s".into(),
                agent: Some("a".into())
            }
        );
        assert_eq!(Target::parse("s").unwrap().agent, None);
        for bad in ["", "/a", "s/", "s/a/b"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}
