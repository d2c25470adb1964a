//! `o approve`: the operator's side of the approval broker.
//!
//! Reads one request at a time from `bypass/pending` (olliesrv's root one: every session's;
//! or `session/NAME/toolsrv/bypass/pending`), on one fid at offset 0, as the server expects:
//! each read returns the next request not yet shown to that fid, blocking until there is one.
//! It prints the request in full, asks on standard input, and writes the verdict (built with
//! serde_json) to the matching `bypass/resolve` on a fresh fid.
//!
//! The server shows long requests cut (a string over 1024 characters as its head and tail
//! around `\[… N characters hidden …]`, more than 64 elements likewise); the display then says
//! so, and always shows the exact request's size and SHA-256 (`request_bytes`,
//! `request_sha256`), whose whole text is in `bypass/full` (write the id, read it back).
//!
//! Guarantees: nothing is approved without an explicit `y`/`yes`/`s`/`session` line; every
//! string from the request is escaped again here (C0, DEL, C1, bidi and invisible format
//! characters as `\u{XX}`) even though the server already escapes them, so a request cannot
//! drive the terminal. On a terminal, lines typed while no request is shown are discarded
//! (with a notice), so a `y` typed ahead can never approve a request not yet seen; from a pipe
//! they are kept, one answer per request, in order. Formatting and answer parsing are pure
//! functions, unit-tested below; the loop is tested against a real olliesrv in
//! `cli/tests/o_approve.rs`.

use std::io::IsTerminal;
use std::process::ExitCode;

use ollie_p9::client::Fid;
use ollie_p9::wire::om;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};

use crate::conn::{Conn, Fail, open, read_all, remote, stdout_write, walk, write_one};
use crate::render;

/// The reason sent with a denial when the operator gives none.
const DEFAULT_REASON: &str = "denied by the operator";
/// Hex digits of a SHA-256 shown (the full one is in `bypass/audit`).
const SHORT_HASH: usize = 16;

/// The program or a script a request is bound to.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Binary {
    /// Its path as resolved by toolsrv.
    pub path: String,
    /// Device and inode it had when the request was made.
    pub dev: u64,
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Hex SHA-256 of its content.
    pub sha256: String,
}

/// One request as `bypass/pending` shows it. Unknown fields are ignored: the display is
/// for a human, and the server stays the one that decides what is bound.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Request {
    /// 32 hex digits.
    pub id: String,
    pub session: String,
    pub agent: String,
    pub tool: String,
    /// The exact command that would run.
    pub argv: Vec<String>,
    pub cwd: String,
    /// The environment it would run with.
    pub env: std::collections::BTreeMap<String, serde_json::Value>,
    pub executable: Option<Binary>,
    pub scripts: Vec<Binary>,
    /// Files named on the command line that the run does not execute from a pinned copy
    /// (checked by path before the run, held by the session's freeze).
    pub unpinned: Vec<String>,
    /// Running calls of the session frozen while this request waits (`None`: a server that
    /// does not hold the session still).
    pub held: Option<u64>,
    /// What the run would get beyond its policy (`net:8080`, `write:/path`).
    pub grants: Vec<String>,
    /// A request of the session's egress proxy (`tool` = `net`): the domain and port a
    /// running call connects to, and that call's command line.
    pub domain: Option<String>,
    pub port: Option<u16>,
    pub command: Option<String>,
    pub reason: String,
    pub created: String,
    pub expires: String,
    /// Size in bytes and hex SHA-256 of the exact request (what `bypass/full` shows,
    /// display-escaped); 0 and empty from a server that does not send them.
    pub request_bytes: u64,
    pub request_sha256: String,
}

/// Whether the server cut some part of `r` (its bounded display left a
/// `\[… N … hidden …]` marker, which escaped agent text cannot forge).
pub fn is_cut(r: &Request) -> bool {
    let marked = ollie_link::bypass::has_hidden_marker;
    let bin = |b: &Binary| marked(&b.path);
    [&r.tool, &r.cwd, &r.reason].iter().any(|s| marked(s))
        || r.argv.iter().chain(&r.grants).any(|s| marked(s))
        || r.env
            .iter()
            .any(|(k, v)| marked(k) || v.as_str().is_some_and(marked))
        || r.executable.as_ref().is_some_and(bin)
        || r.scripts.iter().any(bin)
}

/// `s` with every unsafe character written as `\u{XX}` (upper-case hex, as the server does):
/// the client's one-line rule, [`crate::render::line_safe`].
pub fn escape(s: &str) -> String {
    crate::render::line_safe(s).into_owned()
}

/// One argv element, escaped and shown so that element boundaries are unambiguous: as it is
/// when it is made only of plain characters, otherwise in single quotes (`'` as `'\''`).
pub fn word(s: &str) -> String {
    let s = escape(s);
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c));
    if plain {
        s
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The command line, each element as [`word`] shows it.
pub fn command_line(argv: &[String]) -> String {
    argv.iter().map(|a| word(a)).collect::<Vec<_>>().join(" ")
}

fn short_hash(h: &str) -> String {
    let h = escape(h);
    match h.char_indices().nth(SHORT_HASH) {
        Some((i, _)) => format!("{}…", &h[..i]),
        None => h,
    }
}

fn binary_line(b: &Binary) -> String {
    format!(
        "{}  sha256 {}  ({} bytes, dev {} ino {})",
        escape(&b.path),
        short_hash(&b.sha256),
        b.size,
        b.dev,
        b.ino
    )
}

/// The current names of a request's session and agent (the request holds their ids).
#[derive(Debug, Default)]
pub struct Names {
    pub session: Option<String>,
    pub agent: Option<String>,
}

/// `name (id)`, or the id alone when the name is unknown or the same.
fn labelled(name: Option<&str>, id: &str) -> String {
    match name {
        Some(n) if n != id => format!("{} ({})", escape(n), escape(id)),
        _ => escape(id),
    }
}

/// The names of the session and agent with these ids, as olliesrv lists them now; unknown
/// ones (gone, or not visible) are left out.
async fn names(conn: &Conn, session_id: &str, agent_id: &str) -> Names {
    let mut n = Names::default();
    let Ok(idx) = read_all(&conn.root, &["session", "idx"]).await else {
        return n;
    };
    let Some(s) = render::parse_session_idx(&idx)
        .into_iter()
        .find(|s| s.id == session_id)
    else {
        return n;
    };
    if let Ok(agents) = read_all(&conn.root, &["session", &s.id, "agent", "idx"]).await {
        n.agent = render::parse_agent_idx(&agents)
            .into_iter()
            .find(|a| a.id == agent_id)
            .map(|a| a.name);
    }
    n.session = Some(s.name);
    n
}

/// The run a request would start, as [`render()`] shows it.
fn render_run(r: &Request, line: &mut impl FnMut(&str, &str)) {
    line("command", &command_line(&r.argv));
    line("cwd", &escape(&r.cwd));
    match &r.executable {
        Some(b) => line("program", &binary_line(b)),
        None => line("program", "-"),
    }
    if r.scripts.is_empty() {
        line("scripts", "-");
    }
    for s in &r.scripts {
        line("script", &binary_line(s));
    }
    for u in &r.unpinned {
        line(
            "unpinned",
            &format!(
                "{} (checked by path only: not run from a sealed copy)",
                escape(u)
            ),
        );
    }
    match r.held {
        Some(n) => line(
            "held",
            &format!("the session until this run ends: {n} running call(s) frozen, new ones wait"),
        ),
        None => line("held", "no (the server does not hold the session)"),
    }
    if r.env.is_empty() {
        line("env", "-");
    }
    for (k, v) in &r.env {
        let v = match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        line("env", &format!("{}={}", escape(k), word(&v)));
    }
}

/// The request as shown to the operator, every line escaped.
pub fn render(r: &Request, names: &Names) -> String {
    let mut out = format!("\nescalation request {}\n", escape(&r.id));
    let mut line = |k: &str, v: &str| out.push_str(&format!("  {k:<10} {v}\n"));
    line("session", &labelled(names.session.as_deref(), &r.session));
    line("agent", &labelled(names.agent.as_deref(), &r.agent));
    line("tool", &escape(&r.tool));
    if let Some(d) = &r.domain {
        // The proxy's question: a running call waits on its connection.
        line(
            "connects",
            &format!("{}:{}", escape(d), r.port.unwrap_or_default()),
        );
        line("command", &escape(r.command.as_deref().unwrap_or("-")));
        line("held", "no: only this connection waits for the answer");
    } else {
        render_run(r, &mut line);
    }
    if r.grants.is_empty() {
        line("grants", "-");
    }
    for g in &r.grants {
        line("grant", &escape(g));
    }
    line("reason", &escape(&r.reason));
    line("created", &escape(&r.created));
    line("expires", &escape(&r.expires));
    if !r.request_sha256.is_empty() {
        line(
            "request",
            &format!(
                "{} bytes, sha256 {}",
                r.request_bytes,
                escape(&r.request_sha256)
            ),
        );
    }
    if is_cut(r) {
        line(
            "CUT",
            "parts of this request are hidden (\\[… N … hidden …]); to read it whole, write its id to bypass/full and read that fid",
        );
    }
    out
}

/// What the operator answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Run it once.
    Approve,
    /// Run it, and identical requests for the rest of the session.
    ApproveSession,
    /// Refuse, with this message for the agent.
    Deny(String),
}

/// `y`/`yes` approve, `s`/`session` approve for the session; anything else denies (the
/// reason is asked next).
pub fn parse_answer(line: &str) -> Option<Verdict> {
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Some(Verdict::Approve),
        "s" | "session" => Some(Verdict::ApproveSession),
        _ => None,
    }
}

/// The reason line, or the default when it is empty.
pub fn deny_reason(line: Option<&str>) -> String {
    match line.map(str::trim) {
        Some(r) if !r.is_empty() => r.to_owned(),
        _ => DEFAULT_REASON.to_owned(),
    }
}

/// The JSON `bypass/resolve` takes for `id`.
pub fn verdict_json(id: &str, v: &Verdict) -> String {
    let j = match v {
        Verdict::Approve => serde_json::json!({"id": id, "approved": true}),
        Verdict::ApproveSession => {
            serde_json::json!({"id": id, "approved": true, "scope": "session"})
        }
        Verdict::Deny(reason) => serde_json::json!({"id": id, "error": reason}),
    };
    j.to_string()
}

fn is_request_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Standard input, line by line.
struct Input {
    lines: Lines<BufReader<Stdin>>,
    tty: bool,
}

impl Input {
    /// The next line; `None` at end of input.
    async fn line(&mut self) -> Result<Option<String>, Fail> {
        self.lines
            .next_line()
            .await
            .map_err(|e| Fail::Usage(format!("reading standard input: {e}")))
    }
}

/// Prints `text` without a newline (a question).
fn ask(text: &str) -> Result<(), Fail> {
    stdout_write(text.as_bytes())
}

/// The next request's bytes; `None` when the operator ended the input while waiting (only
/// noticed on a terminal: from a pipe, input is not read until there is a question).
async fn next_request(pending: &Fid, input: &mut Input) -> Result<Option<Vec<u8>>, Fail> {
    let read = pending.read(0, pending.iounit());
    tokio::pin!(read);
    loop {
        let got = if input.tty {
            tokio::select! {
                r = &mut read => r,
                l = input.line() => {
                    match l? {
                        None => return Ok(None),
                        Some(_) => {
                            eprintln!("o: no request is waiting; that input was discarded");
                            continue;
                        }
                    }
                }
            }
        } else {
            (&mut read).await
        };
        let d = got.map_err(remote)?;
        if d.is_empty() {
            return Err(Fail::Server(
                "bypass/pending ended (the session is gone?)".into(),
            ));
        }
        return Ok(Some(d.to_vec()));
    }
}

/// Asks about one request; `None` when input ended before an answer.
async fn decide(input: &mut Input) -> Result<Option<Verdict>, Fail> {
    ask("approve? [y/N/s] (s = for the rest of the session) ")?;
    let Some(answer) = input.line().await? else {
        ask("\n")?;
        return Ok(None);
    };
    if !input.tty {
        ask("\n")?;
    }
    if let Some(v) = parse_answer(&answer) {
        return Ok(Some(v));
    }
    ask(&format!("reason for the agent (empty: {DEFAULT_REASON}): "))?;
    let reason = input.line().await?;
    if !input.tty || reason.is_none() {
        ask("\n")?;
    }
    Ok(Some(Verdict::Deny(deny_reason(reason.as_deref()))))
}

/// Runs the approval loop; see the module doc.
pub async fn approve(conn: &Conn, session: Option<&str>, once: bool) -> Result<ExitCode, Fail> {
    let dir = match session {
        Some(s) => {
            let sdir = conn.session(s).await?;
            walk(&sdir, &["toolsrv", "bypass"]).await?
        }
        None => walk(&conn.root, &["bypass"]).await?,
    };
    let pending = open(&dir, &["pending"], om::OREAD).await?;
    let mut input = Input {
        lines: BufReader::new(tokio::io::stdin()).lines(),
        tty: std::io::stdin().is_terminal(),
    };
    if input.tty {
        let whose = session.map_or_else(|| "every session".to_owned(), |s| format!("session {s}"));
        eprintln!("· waiting for escalation requests of {whose} (Ctrl-D or Ctrl-C quits)");
    }
    loop {
        let Some(raw) = next_request(&pending, &mut input).await? else {
            return Ok(ExitCode::SUCCESS);
        };
        let req: Request = match serde_json::from_slice(&raw) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("o: cannot read a request from bypass/pending ({e}); skipped");
                continue;
            }
        };
        if !is_request_id(&req.id) {
            eprintln!(
                "o: a request with an invalid id {:?} was skipped",
                escape(&req.id)
            );
            continue;
        }
        let names = names(conn, &req.session, &req.agent).await;
        stdout_write(render(&req, &names).as_bytes())?;
        let Some(verdict) = decide(&mut input).await? else {
            return Ok(ExitCode::SUCCESS);
        };
        let resolve = open(&dir, &["resolve"], om::OWRITE).await?;
        match write_one(&resolve, &verdict_json(&req.id, &verdict)).await {
            Ok(()) => stdout_write(match verdict {
                Verdict::Approve => b"approved\n",
                Verdict::ApproveSession => b"approved (for the rest of the session)\n",
                Verdict::Deny(_) => b"denied\n",
            })?,
            Err(Fail::Server(m)) => eprintln!("o: {}", escape(&m)),
            Err(e) => return Err(e),
        }
        drop(resolve);
        if once {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_controls_bidi_and_invisibles() {
        assert_eq!(escape("plain ü ☃"), "plain ü ☃");
        assert_eq!(escape("\x1b[31mred"), "\\u{1B}[31mred");
        assert_eq!(escape("a\u{202E}b"), "a\\u{202E}b");
        assert_eq!(
            escape("\u{9B}\u{7F}\t\n\r"),
            "\\u{9B}\\u{7F}\\u{9}\\u{A}\\u{D}"
        );
        assert_eq!(
            escape("\u{200B}\u{2066}\u{FEFF}\u{61C}"),
            "\\u{200B}\\u{2066}\\u{FEFF}\\u{61C}"
        );
        for c in (0u32..0x20).chain(0x7f..0xa0) {
            let c = char::from_u32(c).unwrap();
            assert!(!escape(&c.to_string()).contains(c), "{c:?}");
        }
    }

    #[test]
    fn words_are_unambiguous() {
        assert_eq!(word("ls"), "ls");
        assert_eq!(word("/usr/bin/env"), "/usr/bin/env");
        assert_eq!(word("a b"), "'a b'");
        assert_eq!(word(""), "''");
        assert_eq!(word("it's"), r"'it'\''s'");
        assert_eq!(word("x\u{1b}y"), r"'x\u{1B}y'");
        let argv = ["bash", "-c", "echo hi > /tmp/x"].map(String::from);
        assert_eq!(command_line(&argv), "bash -c 'echo hi > /tmp/x'");
    }

    #[test]
    fn answers() {
        assert_eq!(parse_answer("y\n"), Some(Verdict::Approve));
        assert_eq!(parse_answer(" YES "), Some(Verdict::Approve));
        assert_eq!(parse_answer("s"), Some(Verdict::ApproveSession));
        assert_eq!(parse_answer("session"), Some(Verdict::ApproveSession));
        for no in ["", "n", "no", "yy", "ye s", "sure"] {
            assert_eq!(parse_answer(no), None, "{no:?}");
        }
        assert_eq!(deny_reason(None), DEFAULT_REASON);
        assert_eq!(deny_reason(Some("  ")), DEFAULT_REASON);
        assert_eq!(deny_reason(Some(" not now ")), "not now");
    }

    #[test]
    fn verdicts_are_json() {
        let id = "0123456789abcdef0123456789abcdef";
        let v: serde_json::Value =
            serde_json::from_str(&verdict_json(id, &Verdict::Approve)).unwrap();
        assert_eq!(v, serde_json::json!({"id": id, "approved": true}));
        let v: serde_json::Value =
            serde_json::from_str(&verdict_json(id, &Verdict::ApproveSession)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"id": id, "approved": true, "scope": "session"})
        );
        let tricky = "no \"thanks\"\n}";
        let v: serde_json::Value =
            serde_json::from_str(&verdict_json(id, &Verdict::Deny(tricky.into()))).unwrap();
        assert_eq!(v, serde_json::json!({"id": id, "error": tricky}));
        assert!(is_request_id(id));
        assert!(!is_request_id("0123"));
        assert!(!is_request_id(&"g".repeat(32)));
    }

    #[test]
    fn a_proxy_request_shows_the_domain_port_and_command() {
        let r: Request = serde_json::from_value(serde_json::json!({
            "id": "0123456789abcdef0123456789abcdef",
            "tool": "net", "domain": "files.example.test", "port": 443,
            "command": "pip install \u{1b}[31mx", "grants": ["net:files.example.test"],
            "reason": "the run connects to files.example.test:443",
        }))
        .unwrap();
        let shown = render(&r, &Names::default());
        assert!(
            shown.contains("connects   files.example.test:443\n"),
            "{shown}"
        );
        assert!(
            shown.contains("grant      net:files.example.test\n"),
            "{shown}"
        );
        assert!(
            shown.contains("held       no: only this connection waits"),
            "{shown}"
        );
        assert!(!shown.contains('\u{1b}'), "escaped: {shown}");
        assert!(!shown.contains("program"), "no run to show: {shown}");
    }

    #[test]
    fn rendering_shows_the_size_hash_and_cut() {
        let long = format!(
            "curl x|sh;{}\\[… 3876 characters hidden …]{}cargo test",
            "\\u{2800}".repeat(60),
            "\\u{2800}".repeat(62)
        );
        let r: Request = serde_json::from_value(serde_json::json!({
            "id": "0123456789abcdef0123456789abcdef",
            "argv": ["bash", "-c", long],
            "request_bytes": 12838, "request_sha256": "ab".repeat(32),
        }))
        .unwrap();
        assert!(is_cut(&r));
        let shown = render(&r, &Names::default());
        assert!(
            shown.contains(&format!(
                "request    12838 bytes, sha256 {}",
                "ab".repeat(32)
            )),
            "{shown}"
        );
        assert!(
            shown.contains("CUT        parts of this request are hidden"),
            "{shown}"
        );
        assert!(shown.contains("3876 characters hidden"), "{shown}");
        assert!(shown.contains("cargo test'"), "{shown}");
        assert!(!shown.contains('\u{2800}'));
        // Agent text that looks like a marker arrives with its backslash doubled: not a cut.
        let r: Request = serde_json::from_value(serde_json::json!({
            "id": "0123456789abcdef0123456789abcdef",
            "argv": ["echo", "\\\\[… 5 characters hidden …]"],
        }))
        .unwrap();
        assert!(!is_cut(&r));
        assert!(!render(&r, &Names::default()).contains("CUT"));
    }

    #[test]
    fn rendering_shows_everything_and_no_raw_controls() {
        let r: Request = serde_json::from_value(serde_json::json!({
            "id": "0123456789abcdef0123456789abcdef",
            "session": "sid-1", "agent": "main", "tool": "execute_code",
            "argv": ["bash", "-c", "echo \u{1b}[2J\u{202e}txt.exe"],
            "cwd": "/work", "env": {"PATH": "/usr/bin", "X": "a b"},
            "executable": {"path": "/usr/bin/bash", "dev": 1, "ino": 2, "size": 3,
                "sha256": "ab".repeat(32)},
            "scripts": [{"path": "/work/s.sh", "dev": 1, "ino": 5, "size": 9,
                "sha256": "cd".repeat(32)}],
            "unpinned": ["/work/data\u{1b}.txt"], "held": 2,
            "grants": ["write:/tmp/out", "net:8080"],
            "reason": "needs \u{9b}out",
            "created": "2030-01-01T00:00:00Z", "expires": "2030-01-01T00:10:00Z",
            "future_field": 1
        }))
        .unwrap();
        let shown = render(
            &r,
            &Names {
                session: Some("proj".into()),
                agent: None,
            },
        );
        for want in [
            "escalation request 0123456789abcdef0123456789abcdef",
            "session    proj (sid-1)",
            "agent      main",
            "tool       execute_code",
            r"command    bash -c 'echo \u{1B}[2J\u{202E}txt.exe'",
            "cwd        /work",
            "program    /usr/bin/bash  sha256 abababababababab…",
            "script     /work/s.sh  sha256 cdcdcdcdcdcdcdcd…",
            "env        PATH=/usr/bin",
            "env        X='a b'",
            "grant      write:/tmp/out",
            "grant      net:8080",
            r"reason     needs \u{9B}out",
            "expires    2030-01-01T00:10:00Z",
            r"unpinned   /work/data\u{1B}.txt (checked by path only",
            "held       the session until this run ends: 2 running call(s) frozen, new ones wait",
        ] {
            assert!(shown.contains(want), "{want:?} in\n{shown}");
        }
        assert!(
            !shown
                .chars()
                .any(|c| c != '\n'
                    && (c.is_control() || ollie_link::bypass::needs_display_escape(c))),
            "{shown:?}"
        );
    }
}
