//! Pure text handling for `o`: the `[[[kind …` / `]]]` blocks of `chat.raw`, their rendering
//! on a terminal, and the `idx`/`stats` formats olliesrv serves. No I/O here, so every rule is
//! unit-tested below.

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
/// (with `colour` off, text is plain and only the markers are rewritten).
#[derive(Debug, Default)]
pub struct Renderer {
    colour: bool,
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
        if self.colour {
            out.extend_from_slice(format!("{DIM}[{head}]{RESET}\n").as_bytes());
        } else {
            out.extend_from_slice(format!("[{head}]\n").as_bytes());
        }
        self.kind = Some(kind);
    }

    fn text(&self, piece: &[u8], out: &mut Vec<u8>) {
        let st = if self.colour {
            style(self.kind.as_deref().unwrap_or(""))
        } else {
            ""
        };
        if st.is_empty() {
            out.extend_from_slice(piece);
            return;
        }
        let (body, nl) = match piece.strip_suffix(b"\n") {
            Some(b) => (b, true),
            None => (piece, false),
        };
        out.extend_from_slice(st.as_bytes());
        out.extend_from_slice(body);
        out.extend_from_slice(RESET.as_bytes());
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
