//! The progress line of `o prompt` and `o attach`: while a turn runs, one self-overwriting
//! line on standard error with a spinner, what the agent is doing (its `statewait` state:
//! `thinking`, `calling: execute_code`, …) and the time since the turn began, e.g.
//! `⠋ thinking · 12s`.
//!
//! Guarantees: the line is drawn only when standard error is a terminal (and `TERM` is not
//! `dumb`), and never when `--quiet` is given or `OLLIE_NO_PROGRESS` is set to anything
//! non-empty; it never goes to standard output. It is erased (`\r` and clear-line) before any
//! other output is written and when the turn ends, and it is not drawn while the chat stands
//! in the middle of a line on the terminal (it would overwrite that line). The state comes
//! from the server: every character that could drive the terminal is escaped
//! (`render::line_safe`), and a long one is cut so the line does not wrap on a common
//! terminal. Message lines written through [`Status::eprintln`] are escaped as well.
//!
//! [`Progress`] holds these rules and writes to any `Write`; they are unit-tested below with
//! a `Vec<u8>`. [`Status`] shares one on standard error between a command's tasks (the
//! `statewait` follower sets the state, the chat writer erases before writing) and
//! [`Status::animate`] redraws it a few times a second.

use std::ffi::OsStr;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::render::line_safe;

/// The spinner's frames, one per redraw.
pub const FRAMES: &[char] = &['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
/// Back to the start of the line, and clear it.
pub const ERASE: &str = "\r\x1b[2K";
/// How often the line is redrawn.
pub const TICK: Duration = Duration::from_millis(125);
/// The longest state shown, in characters (the rest becomes `…`).
const MAX_STATE: usize = 60;
/// The environment variable that turns the line off (any non-empty value).
pub const NO_PROGRESS_ENV: &str = "OLLIE_NO_PROGRESS";

/// Whether `state` (as `statewait` reports it) means a turn is running: while one runs the
/// server reports what it is doing (`thinking`, `calling: …`, `limitretry`, …); these four
/// are the states between turns.
pub fn is_running(state: &str) -> bool {
    !matches!(state, "idle" | "error" | "paused" | "killed" | "")
}

/// Whether the line is wanted: not `--quiet`, standard error a terminal that understands
/// the erase sequence, and `OLLIE_NO_PROGRESS` unset or empty.
pub fn wanted(
    quiet: bool,
    stderr_is_terminal: bool,
    term: Option<&OsStr>,
    no_progress: Option<&OsStr>,
) -> bool {
    !quiet
        && stderr_is_terminal
        && term.is_none_or(|t| t != "dumb")
        && no_progress.is_none_or(|v| v.is_empty())
}

/// `12s`, or `2m05s` from a minute on.
pub fn elapsed_text(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else {
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

/// The line for spinner frame `frame`, state `state` and `elapsed` since the turn began
/// (without the erase sequence): `⠋ thinking · 12s`.
pub fn line(frame: usize, state: &str, elapsed: Duration) -> String {
    let spin = FRAMES[frame % FRAMES.len()];
    let state = line_safe(state.trim()).into_owned();
    let state = match state.char_indices().nth(MAX_STATE) {
        Some((i, _)) => format!("{}…", &state[..i]),
        None => state,
    };
    format!("{spin} {state} · {}", elapsed_text(elapsed))
}

/// The progress line's state and the rules for drawing it, writing to `out` (standard error,
/// or a `Vec<u8>` in tests). Every method takes the current time, so nothing here reads the
/// clock.
#[derive(Debug)]
pub struct Progress<W: Write> {
    out: W,
    /// What the running turn is doing, and when the turn began; `None` between turns.
    turn: Option<(String, Instant)>,
    /// Whether the server has reported a state yet (an initial state only applies before).
    reported: bool,
    /// The spinner frame drawn next.
    frame: usize,
    /// Whether a line is on the terminal now (and must be erased before other output).
    shown: bool,
    /// Whether chat output shares the terminal (standard output is one): then the line waits
    /// while that output stands in the middle of a line.
    track_output: bool,
    /// Whether the last chat output ended a line (true before any).
    at_line_start: bool,
    /// Closed for good: nothing is drawn any more (a late state cannot leave a line behind).
    closed: bool,
}

impl<W: Write> Progress<W> {
    /// A progress line written to `out`; `track_output`: chat output goes to the same
    /// terminal.
    pub fn new(out: W, track_output: bool) -> Progress<W> {
        Progress {
            out,
            turn: None,
            reported: false,
            frame: 0,
            shown: false,
            track_output,
            at_line_start: true,
            closed: false,
        }
    }

    /// The writer (for tests).
    #[cfg(test)]
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// Whether a line is on the terminal now.
    #[cfg(test)]
    pub fn shown(&self) -> bool {
        self.shown
    }

    /// A turn begins now, before the server said what it does: shown as `label`.
    pub fn begin(&mut self, label: &str, now: Instant) {
        self.turn = Some((label.to_owned(), now));
        self.draw(now);
    }

    /// A state the server reported: a running one shows (the turn's start kept when it was
    /// already running), any other ends the turn and erases the line.
    pub fn state(&mut self, state: &str, now: Instant) {
        self.reported = true;
        self.apply(state, now);
    }

    /// The state read when the command started; ignored once the server reported one.
    pub fn initial(&mut self, state: &str, now: Instant) {
        if !self.reported {
            self.apply(state, now);
        }
    }

    fn apply(&mut self, state: &str, now: Instant) {
        if is_running(state) {
            let since = self.turn.as_ref().map_or(now, |(_, t)| *t);
            self.turn = Some((state.to_owned(), since));
            self.draw(now);
        } else {
            self.end();
        }
    }

    /// The next spinner frame.
    pub fn tick(&mut self, now: Instant) {
        if self.turn.is_some() {
            self.frame = self.frame.wrapping_add(1);
        }
        self.draw(now);
    }

    /// The turn is over: the line goes away and stays away until the next.
    pub fn end(&mut self) {
        self.turn = None;
        self.erase();
    }

    /// The line goes away for good: later calls draw nothing.
    pub fn close(&mut self) {
        self.end();
        self.closed = true;
    }

    /// Before other output to the terminal: the line goes away (the next tick redraws it).
    pub fn before_output(&mut self) {
        self.erase();
    }

    /// After chat output `data` was written: whether it left the terminal at a line start.
    pub fn after_output(&mut self, data: &[u8]) {
        if self.track_output
            && let Some(last) = data.last()
        {
            self.at_line_start = *last == b'\n';
        }
    }

    fn erase(&mut self) {
        if self.shown {
            self.shown = false;
            let _ = self
                .out
                .write_all(ERASE.as_bytes())
                .and_then(|()| self.out.flush());
        }
    }

    fn draw(&mut self, now: Instant) {
        let Some((state, since)) = &self.turn else {
            return;
        };
        if self.closed {
            return;
        }
        if !self.at_line_start {
            // Drawing would overwrite the chat's unfinished line: erase what stands.
            self.erase();
            return;
        }
        // One write per redraw, so the terminal never shows half of one.
        let text = format!(
            "{ERASE}{}",
            line(self.frame, state, now.saturating_duration_since(*since))
        );
        self.shown = true;
        let _ = self
            .out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush());
    }
}

/// A command's progress line on standard error, shared between its tasks; off (every call
/// does nothing) unless [`wanted`].
#[derive(Debug, Clone)]
pub struct Status {
    inner: Option<Arc<Mutex<Progress<std::io::Stderr>>>>,
}

impl Status {
    /// No progress line.
    pub fn off() -> Status {
        Status { inner: None }
    }

    /// The line on standard error when it is wanted there (see [`wanted`]).
    pub fn on_stderr(quiet: bool) -> Status {
        let want = wanted(
            quiet,
            std::io::stderr().is_terminal(),
            std::env::var_os("TERM").as_deref(),
            std::env::var_os(NO_PROGRESS_ENV).as_deref(),
        );
        if !want {
            return Status::off();
        }
        let track = std::io::stdout().is_terminal();
        Status {
            inner: Some(Arc::new(Mutex::new(Progress::new(
                std::io::stderr(),
                track,
            )))),
        }
    }

    /// Whether the line is in use.
    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Progress<std::io::Stderr>, Instant) -> T) -> Option<T> {
        let inner = self.inner.as_ref()?;
        let mut p = inner.lock().unwrap_or_else(PoisonError::into_inner);
        Some(f(&mut p, Instant::now()))
    }

    /// See [`Progress::begin`].
    pub fn begin(&self, label: &str) {
        self.with(|p, now| p.begin(label, now));
    }

    /// See [`Progress::state`].
    pub fn state(&self, state: &str) {
        self.with(|p, now| p.state(state, now));
    }

    /// See [`Progress::initial`].
    pub fn initial(&self, state: &str) {
        self.with(|p, now| p.initial(state, now));
    }

    /// Writes chat output with `write` (to standard output): the line is erased first and
    /// cannot be redrawn until `write` returns.
    pub fn output<T>(&self, data: &[u8], write: impl FnOnce() -> T) -> T {
        let Some(inner) = &self.inner else {
            return write();
        };
        let mut p = inner.lock().unwrap_or_else(PoisonError::into_inner);
        p.before_output();
        let r = write();
        p.after_output(data);
        r
    }

    /// A message line on standard error, with the progress line out of its way; the message
    /// may quote the server, so it is escaped ([`crate::render::terminal_safe`]).
    pub fn eprintln(&self, msg: &str) {
        let msg = crate::render::terminal_safe(msg);
        self.output(b"", || eprintln!("{msg}"));
    }

    /// Redraws the line every [`TICK`] until the returned guard is dropped; dropping it also
    /// erases the line for good ([`Progress::close`]). Off: nothing runs.
    pub fn animate(&self) -> Animation {
        let task = self.inner.as_ref().map(|_| {
            let me = self.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(TICK);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    every.tick().await;
                    me.with(|p, now| p.tick(now));
                }
            })
        });
        Animation {
            task,
            status: self.clone(),
        }
    }
}

/// Keeps the line animated; see [`Status::animate`].
#[derive(Debug)]
pub struct Animation {
    task: Option<tokio::task::JoinHandle<()>>,
    status: Status,
}

impl Drop for Animation {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.status.with(|p, _| p.close());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: &Progress<Vec<u8>>) -> String {
        String::from_utf8(p.get_ref().clone()).unwrap()
    }

    #[test]
    fn lines() {
        assert_eq!(
            line(0, "thinking", Duration::from_millis(12_400)),
            "⠋ thinking · 12s"
        );
        assert_eq!(
            line(1, "calling: execute_code", Duration::ZERO),
            "⠙ calling: execute_code · 0s"
        );
        // The frames go round.
        assert_eq!(
            line(FRAMES.len() + 2, "thinking", Duration::from_secs(125)),
            "⠹ thinking · 2m05s"
        );
        assert_eq!(elapsed_text(Duration::from_secs(59)), "59s");
        assert_eq!(elapsed_text(Duration::from_secs(60)), "1m00s");
        assert_eq!(elapsed_text(Duration::from_secs(3725)), "62m05s");
    }

    #[test]
    fn states_from_the_server_cannot_drive_the_terminal_or_wrap() {
        let l = line(0, "calling: \x1b[2Jx\ny", Duration::ZERO);
        assert_eq!(l, "⠋ calling: \\u{1B}[2Jx\\u{A}y · 0s");
        let long = "calling: ".to_owned() + &"t".repeat(200);
        let l = line(0, &long, Duration::ZERO);
        assert_eq!(
            l.chars().count(),
            2 + MAX_STATE + 1 + " · 0s".chars().count()
        );
        assert!(l.contains("t… · 0s"), "{l}");
    }

    #[test]
    fn running_states() {
        for s in ["thinking", "calling: execute_code", "limitretry", "running"] {
            assert!(is_running(s), "{s}");
        }
        for s in ["idle", "error", "paused", "killed", ""] {
            assert!(!is_running(s), "{s}");
        }
    }

    #[test]
    fn when_it_is_wanted() {
        let one = Some(OsStr::new("1"));
        let empty = Some(OsStr::new(""));
        let xterm = Some(OsStr::new("xterm-256color"));
        assert!(wanted(false, true, xterm, None));
        assert!(wanted(false, true, None, empty));
        assert!(!wanted(true, true, xterm, None), "--quiet");
        assert!(!wanted(false, false, xterm, None), "not a terminal");
        assert!(!wanted(false, true, xterm, one), "OLLIE_NO_PROGRESS=1");
        assert!(!wanted(false, true, Some(OsStr::new("dumb")), None));
    }

    #[test]
    fn a_turn_draws_redraws_and_erases_at_its_end() {
        let t0 = Instant::now();
        let mut p = Progress::new(Vec::new(), true);
        // Between turns nothing is drawn.
        p.tick(t0);
        p.state("idle", t0);
        assert_eq!(text(&p), "");
        p.state("thinking", t0);
        assert_eq!(text(&p), "\r\x1b[2K⠋ thinking · 0s");
        p.tick(t0 + Duration::from_secs(3));
        p.state("calling: execute_code", t0 + Duration::from_secs(4));
        // The turn's start is kept across its states.
        assert_eq!(
            text(&p),
            "\r\x1b[2K⠋ thinking · 0s\r\x1b[2K⠙ thinking · 3s\r\x1b[2K⠙ calling: execute_code · 4s"
        );
        p.state("idle", t0 + Duration::from_secs(5));
        assert!(
            text(&p).ends_with("execute_code · 4s\r\x1b[2K"),
            "{:?}",
            text(&p)
        );
        assert!(!p.shown());
        // Erased once; nothing more until the next turn, which counts from its own start.
        let before = text(&p);
        p.tick(t0 + Duration::from_secs(6));
        p.end();
        assert_eq!(text(&p), before);
        p.state("thinking", t0 + Duration::from_secs(10));
        assert!(
            text(&p).ends_with("\r\x1b[2K⠙ thinking · 0s"),
            "{:?}",
            text(&p)
        );
    }

    #[test]
    fn output_erases_first_and_a_partial_line_is_never_drawn_over() {
        let t0 = Instant::now();
        let mut p = Progress::new(Vec::new(), true);
        p.begin("waiting", t0);
        assert_eq!(text(&p), "\r\x1b[2K⠋ waiting · 0s");
        // Chat output: the line is erased before it.
        p.before_output();
        assert_eq!(text(&p), "\r\x1b[2K⠋ waiting · 0s\r\x1b[2K");
        assert!(!p.shown());
        p.after_output(b"Hello, wor");
        // The chat's line is unfinished: no redraw over it.
        p.tick(t0 + Duration::from_secs(1));
        p.state("thinking", t0 + Duration::from_secs(1));
        assert_eq!(text(&p), "\r\x1b[2K⠋ waiting · 0s\r\x1b[2K");
        // Nothing is drawn, so nothing needs erasing before the rest.
        p.before_output();
        p.after_output(b"ld\n");
        assert_eq!(text(&p), "\r\x1b[2K⠋ waiting · 0s\r\x1b[2K");
        p.tick(t0 + Duration::from_secs(2));
        assert!(
            text(&p).ends_with("\r\x1b[2K⠹ thinking · 2s"),
            "{:?}",
            text(&p)
        );
        assert!(p.shown());
        // Output without bytes (a message line on standard error) erases as well.
        p.before_output();
        p.after_output(b"");
        assert!(
            text(&p).ends_with("thinking · 2s\r\x1b[2K"),
            "{:?}",
            text(&p)
        );
    }

    #[test]
    fn output_elsewhere_does_not_hold_the_line() {
        // Standard output is not the terminal: its partial lines do not matter here.
        let t0 = Instant::now();
        let mut p = Progress::new(Vec::new(), false);
        p.begin("waiting", t0);
        p.before_output();
        p.after_output(b"no newline");
        p.tick(t0 + Duration::from_secs(1));
        assert!(
            text(&p).ends_with("\r\x1b[2K⠙ waiting · 1s"),
            "{:?}",
            text(&p)
        );
    }

    #[test]
    fn an_initial_state_applies_only_before_the_servers_first() {
        let t0 = Instant::now();
        let mut p = Progress::new(Vec::new(), true);
        p.state("thinking", t0);
        p.initial("running", t0);
        assert_eq!(text(&p), "\r\x1b[2K⠋ thinking · 0s");
        let mut q = Progress::new(Vec::new(), true);
        q.initial("running", t0);
        assert_eq!(text(&q), "\r\x1b[2K⠋ running · 0s");
    }

    #[test]
    fn closed_stays_closed() {
        let t0 = Instant::now();
        let mut p = Progress::new(Vec::new(), true);
        p.begin("waiting", t0);
        p.close();
        assert_eq!(text(&p), "\r\x1b[2K⠋ waiting · 0s\r\x1b[2K");
        p.state("thinking", t0);
        p.begin("waiting", t0);
        p.tick(t0);
        assert_eq!(text(&p), "\r\x1b[2K⠋ waiting · 0s\r\x1b[2K");
        assert!(!p.shown());
    }

    #[test]
    fn off_does_nothing() {
        let s = Status::off();
        assert!(!s.is_on());
        s.begin("waiting");
        s.state("thinking");
        assert_eq!(s.output(b"x", || 7), 7);
        drop(s.animate());
    }
}
