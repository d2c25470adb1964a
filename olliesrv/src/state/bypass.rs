//! The operator's view of every session's approval broker, and the audit log.
//!
//! Each session's toolsrv holds its own requests (`session/S/toolsrv/bypass/`). olliesrv
//! reads each toolsrv's `bypass/pending` as the operator (one reader per running toolsrv) and
//! keeps a mirror, so that:
//! - the root `bypass/pending` shows the requests of all sessions, each once per fid
//!   (blocking like the per-session file);
//! - the root `bypass/resolve` takes the same strict verdict, finds the session that holds
//!   the id and forwards it there;
//! - every request seen and every verdict written through olliesrv (root or per-session) is
//!   appended to `audit.jsonl` in the state directory (one JSON object per line, fdatasync'd
//!   before the write that caused it is acknowledged), served as `bypass/audit`;
//! - so is every event of each toolsrv's `bypass/log` (requests refused at once or by the
//!   flood bounds, joined, withdrawn, expired, voided at the re-check, run — with the
//!   binding digests), read as the operator like `pending`; and when a toolsrv's link goes
//!   down, its requests still pending are recorded as denied (`broker-gone`).
//! - at start, before any toolsrv runs, [`Bypass::recover`] repairs what a crash of olliesrv
//!   leaves in the log: a torn last line is cut (its cause was never acknowledged), and each
//!   request with no end (pending when olliesrv stopped; its toolsrv went with it) is
//!   recorded as denied (`broker-gone`), as the link going down would have.
//!
//! The requests themselves, their deadlines and the decisions stay in toolsrv: the mirror only
//! shows and forwards. A request whose `expires` has passed is no longer shown. toolsrv shows
//! each request bounded (long strings cut around `\[… N characters hidden …]`, with the exact
//! request's `request_bytes` and `request_sha256`); the mirror and the audit log keep that
//! bounded form, and a denial's message is audited display-escaped.
//!
//! The server's `eventwait` gets one event per request seen and one when it ends, each with
//! only the session id, the request id, the agent id and the tool name (never the argv, the
//! reason, the grants, the paths or the denial message: `eventwait` is readable by every client
//! of the server and its ring is not the audit log):
//! - `bypass-requested`;
//! - `bypass-resolved` with `verdict` (`approved` or `denied`), `scope` (`session`, when so),
//!   and `by` (who wrote the verdict through olliesrv);
//! - `bypass-expired` (no answer before the deadline), `bypass-withdrawn` (the call was
//!   stopped), `bypass-gone` (toolsrv stopped or its link went down first).
//!
//! Each request gets exactly one of the ending events, the first that happens.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use ollie_p9::wire::om;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::link::Conn;
use crate::state::events::Events;
use crate::state::session::Session;

/// Why a verdict written through to toolsrv was not acknowledged.
#[derive(Debug, Clone, PartialEq)]
pub struct Undelivered {
    pub error: String,
    /// The write reached toolsrv and the link went down before it answered: the verdict may
    /// have been taken (and an approved call run).
    pub maybe_taken: bool,
}

impl Undelivered {
    pub fn refused(error: impl Into<String>) -> Undelivered {
        Undelivered {
            error: error.into(),
            maybe_taken: false,
        }
    }

    /// The failure of the write of a verdict to toolsrv's `bypass/resolve`: an error reply
    /// is a refusal; a connection lost under the write leaves the verdict's fate unknown.
    pub fn of_write(e: &ollie_p9::client::ClientError) -> Undelivered {
        use ollie_p9::client::ClientError as E;
        Undelivered {
            error: e.to_string(),
            maybe_taken: matches!(e, E::Io(_) | E::Closed | E::Protocol(_)),
        }
    }
}

impl std::fmt::Display for Undelivered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.maybe_taken {
            write!(
                f,
                "resolve: the link to toolsrv went down before it answered ({}): the verdict may have been taken, see bypass/audit",
                self.error
            )
        } else {
            f.write_str(&self.error)
        }
    }
}

/// Requests remembered by the mirror.
const MAX_KEPT: usize = 1024;
/// The most of the audit log `bypass/audit` shows (its end).
const MAX_AUDIT_SHOWN: u64 = 1 << 20;
/// The audit log's file name in the state directory.
pub const AUDIT_FILE: &str = "audit.jsonl";
/// The audit events that end a request: a verdict toolsrv took (`decision`), and how toolsrv
/// (`expired`, `withdrawn`, `denied` on its way out) or olliesrv (`broker-gone`) ended one
/// without a verdict.
const ENDINGS: [&str; 5] = ["decision", "expired", "withdrawn", "denied", "broker-gone"];

/// What a read of the audit log found ([`scan_audit`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AuditScan {
    /// Lines that are audit events.
    pub events: usize,
    /// Whole lines that are not an event (not a JSON object with a string `event`): their
    /// line numbers (from 1).
    pub bad: Vec<usize>,
    /// The length of the whole lines: less than the file's when its last line is torn.
    pub whole: u64,
    /// Requests with no end, in the order they were asked: (session id, request id).
    pub open: Vec<(String, String)>,
}

/// Reads an audit log line by line (never all of it at once).
pub fn scan_audit(mut r: impl BufRead) -> std::io::Result<AuditScan> {
    let mut scan = AuditScan::default();
    // (session, id) → the line of its request.
    let mut open: HashMap<(String, String), usize> = HashMap::new();
    let mut line = Vec::new();
    for n in 1.. {
        line.clear();
        if r.read_until(b'\n', &mut line)? == 0 || line.last() != Some(&b'\n') {
            break;
        }
        scan.whole += line.len() as u64;
        let v: Option<Value> = serde_json::from_slice(&line).ok();
        let Some(event) = v.as_ref().and_then(|v| v.get("event")?.as_str()) else {
            scan.bad.push(n);
            continue;
        };
        scan.events += 1;
        let field = |k: &str| {
            v.as_ref()
                .and_then(|v| v.get(k)?.as_str())
                .unwrap_or("")
                .to_owned()
        };
        let key = (field("session"), field("id"));
        if event == "request" && !key.1.is_empty() {
            open.insert(key, n);
        } else if ENDINGS.contains(&event) {
            open.remove(&key);
        }
    }
    let mut open: Vec<_> = open.into_iter().collect();
    open.sort_by_key(|(_, n)| *n);
    scan.open = open.into_iter().map(|(k, _)| k).collect();
    Ok(scan)
}

struct Req {
    seq: u64,
    session: String,
    id: String,
    /// The agent's id and the tool, for `eventwait` (as toolsrv showed them: escaped).
    agent: String,
    tool: String,
    /// As toolsrv showed it (escaped JSON and a newline).
    shown: Arc<String>,
    /// Unix seconds.
    expires: u64,
    done: bool,
}

#[derive(Default)]
struct Mirror {
    seq: u64,
    reqs: Vec<Req>,
    /// Verdicts toolsrv took for requests the mirror had not read yet (written through the
    /// session's own `bypass/resolve` while the reader was on its way): (session, id, the
    /// `bypass-resolved` fields), so that when the request arrives it is not shown as pending
    /// and its events come in order.
    answered: std::collections::VecDeque<Early>,
}

/// A verdict that reached toolsrv before its request reached the mirror: session, request
/// id, and the `bypass-resolved` event's fields.
type Early = (String, String, Vec<(&'static str, Value)>);

/// Early verdicts remembered at most.
const MAX_ANSWERED: usize = 256;

/// The mirror and the audit log.
pub struct Bypass {
    mirror: Mutex<Mirror>,
    tick: watch::Sender<u64>,
    audit_path: PathBuf,
    audit: Mutex<()>,
    /// The server's `eventwait` log.
    events: Arc<Events>,
}

impl std::fmt::Debug for Bypass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bypass")
            .field("audit", &self.audit_path)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// toolsrv's request line (`{…}\n`, display-escaped) with `session_name` and `agent_name`
/// added in front, from the session (when it and the agent still exist).
fn with_names(text: &str, v: &Value, s: &std::sync::Weak<Session>) -> String {
    let Some(s) = s.upgrade() else {
        return text.to_owned();
    };
    let mut extra = serde_json::Map::new();
    extra.insert("session_name".into(), Value::from(s.name()));
    if let Some(id) = v.get("agent").and_then(Value::as_str)
        && let Some(a) = s.agents().into_iter().find(|a| a.id == id)
    {
        extra.insert("agent_name".into(), Value::from(a.name()));
    }
    let extra = ollie_link::bypass::display_escape_json(&Value::Object(extra)).to_string();
    match (extra.strip_suffix('}'), text.strip_prefix('{')) {
        (Some(head), Some(rest)) if !rest.trim_start().starts_with('}') => {
            format!("{head},{rest}")
        }
        _ => text.to_owned(),
    }
}

/// Parses toolsrv's `YYYY-MM-DDTHH:MM:SSZ` into Unix seconds.
fn parse_time(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[19] != b'Z' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss) = (n(11..13)?, n(14..16)?, n(17..19)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from civil (the inverse of `ollie_p9::util::civil`).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

impl Bypass {
    pub fn new(state_dir: &Path, events: Arc<Events>) -> Bypass {
        Bypass {
            mirror: Mutex::new(Mirror::default()),
            tick: watch::Sender::new(0),
            audit_path: state_dir.join(AUDIT_FILE),
            audit: Mutex::new(()),
            events,
        }
    }

    /// One `eventwait` event about request `id` of `session`, with the agent and tool the
    /// mirror holds for it (nothing more: see the module doc) and `extra`.
    fn emit(&self, kind: &str, session: &str, id: &str, extra: &[(&str, Value)]) {
        let (agent, tool) = lock(&self.mirror)
            .reqs
            .iter()
            .rev()
            .find(|r| r.id == id && r.session == session)
            .map(|r| (r.agent.clone(), r.tool.clone()))
            .unwrap_or_default();
        let mut f = serde_json::Map::new();
        f.insert("session".into(), Value::from(session));
        f.insert("id".into(), Value::from(id));
        f.insert("agent".into(), Value::from(agent.as_str()));
        f.insert("tool".into(), Value::from(tool.as_str()));
        for (k, v) in extra {
            f.insert((*k).into(), v.clone());
        }
        // Every request and its outcome in the log too (an operator's journal shows who asked
        // for what and what was decided).
        let field = |k: &str| {
            extra
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
        };
        tracing::info!(
            session,
            id,
            agent = %agent,
            tool = %tool,
            verdict = field("verdict").as_deref().unwrap_or("-"),
            by = field("by").as_deref().unwrap_or("-"),
            "escalation: {kind}"
        );
        self.events.emit(kind, f);
    }

    /// Repairs the audit log after a crash (see the module doc); run at start, before any
    /// toolsrv, so that no request it names can still be pending. What cannot be read or
    /// repaired is logged, never fatal.
    pub fn recover(&self) {
        let scan = match self.cut_torn_line() {
            Ok(Some(scan)) => scan,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(path = %self.audit_path.display(), error = %e, "cannot repair the audit log");
                return;
            }
        };
        if !scan.bad.is_empty() {
            tracing::warn!(path = %self.audit_path.display(), lines = ?scan.bad, "audit log lines that are not events");
        }
        for (session, id) in scan.open {
            self.audit_gone(
                &session,
                id,
                "olliesrv stopped before an answer; the session's toolsrv went with it",
            );
        }
    }

    /// Audits request `id` of `session` as denied because its broker is gone (`why`).
    fn audit_gone(&self, session: &str, id: String, why: &str) {
        let mut fields = serde_json::Map::new();
        fields.insert("session".into(), Value::from(session));
        fields.insert("id".into(), Value::from(id));
        fields.insert("verdict".into(), json!("denied"));
        fields.insert("why".into(), json!(why));
        self.audit("broker-gone", fields);
    }

    /// Reads the audit log ([`scan_audit`]) and cuts a torn last line, durably: it is an
    /// append a crash stopped, and the next append must not continue it. `None`: no log yet.
    fn cut_torn_line(&self) -> std::io::Result<Option<AuditScan>> {
        let _g = lock(&self.audit);
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.audit_path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let scan = scan_audit(std::io::BufReader::new(&f))?;
        let len = f.metadata()?.len();
        if scan.whole < len {
            f.set_len(scan.whole)?;
            f.sync_data()?;
            tracing::warn!(
                path = %self.audit_path.display(),
                bytes = len - scan.whole,
                "cut the audit log's torn last line (an append a crash interrupted)"
            );
        }
        Ok(Some(scan))
    }

    /// Appends one event to the audit log, durably.
    pub fn audit(&self, event: &str, mut fields: serde_json::Map<String, Value>) {
        let secs = now_unix();
        let (y, m, d, hh, mm, ss) = ollie_p9::util::civil(secs);
        fields.insert(
            "time".into(),
            Value::from(format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")),
        );
        fields.insert("event".into(), Value::from(event));
        let mut line = Value::Object(fields).to_string();
        line.push('\n');
        let r = crate::util::blocking(|| {
            let _g = lock(&self.audit);
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&self.audit_path)
                .and_then(|mut f| {
                    f.write_all(line.as_bytes())?;
                    f.sync_data()
                })
        });
        if let Err(e) = r {
            tracing::error!(path = %self.audit_path.display(), error = %e, "cannot append to the audit log");
        }
    }

    /// The end of the audit log (`bypass/audit`).
    pub fn audit_text(&self) -> Bytes {
        use std::io::{Read, Seek, SeekFrom};
        let _g = lock(&self.audit);
        let Ok(mut f) = std::fs::File::open(&self.audit_path) else {
            return Bytes::new();
        };
        let len = f.metadata().map_or(0, |m| m.len());
        let start = len.saturating_sub(MAX_AUDIT_SHOWN);
        let mut out = Vec::new();
        if f.seek(SeekFrom::Start(start)).is_ok() && f.read_to_end(&mut out).is_err() {
            return Bytes::new();
        }
        if start > 0
            && let Some(nl) = out.iter().position(|b| *b == b'\n')
        {
            out.drain(..=nl);
        }
        Bytes::from(out)
    }

    /// Starts reading `bypass/pending` and `bypass/log` of a session's toolsrv as the
    /// operator, until `done` completes or the connection fails (then it drops its hold on
    /// the connection and records the session's unanswered requests as denied).
    pub fn watch(
        self: &Arc<Self>,
        s: &Arc<Session>,
        conn: Arc<Conn>,
        done: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let me = Arc::clone(self);
        let session = s.id.clone();
        let names = Arc::downgrade(s);
        tokio::spawn(async move {
            tokio::select! {
                r = me.read_lines(&session, &conn, "pending", &names) => {
                    if let Err(e) = r {
                        tracing::debug!(session = %session, error = %e, "bypass/pending reader ended");
                    }
                }
                r = me.read_lines(&session, &conn, "log", &names) => {
                    if let Err(e) = r {
                        tracing::debug!(session = %session, error = %e, "bypass/log reader ended");
                    }
                }
                () = done => {}
            }
            drop(conn);
            me.gone(&session);
        });
    }

    /// Reads one JSON object per read from `bypass/FILE` (a long one comes in pieces, the
    /// last ending in a newline) and takes each in. Requests get the session's and the
    /// agent's names (`session_name`, `agent_name`) next to toolsrv's ids.
    async fn read_lines(
        &self,
        session: &str,
        conn: &Conn,
        file: &str,
        names: &std::sync::Weak<Session>,
    ) -> Result<(), String> {
        conn.read_json_lines(&["bypass", file], |text, v| {
            if file == "pending" {
                let text = with_names(&text, &v, names);
                let v = serde_json::from_str(&text).unwrap_or(v);
                self.add(session, v, text);
            } else {
                // The egress proxy's decisions also go to `session/NAME/net`, with the
                // session's and the agent's names.
                if v.get("event").and_then(Value::as_str) == Some("net")
                    && let Some(s) = names.upgrade()
                    && let Ok(Value::Object(mut fields)) =
                        serde_json::from_str::<Value>(&with_names(&text, &v, names))
                {
                    fields.remove("event");
                    s.net.emit("net", fields);
                }
                self.event(session, v);
            }
        })
        .await
    }

    /// One event of a toolsrv's `bypass/log`, into the audit log.
    fn event(&self, session: &str, v: Value) {
        let Value::Object(mut fields) = v else {
            return;
        };
        let event = match fields.remove("event") {
            Some(Value::String(e)) => e,
            _ => "unknown".to_owned(),
        };
        if let Some(t) = fields.remove("time") {
            fields.insert("toolsrv_time".into(), t);
        }
        fields.insert("session".into(), Value::from(session));
        let ended = match event.as_str() {
            "expired" => Some("bypass-expired"),
            "withdrawn" => Some("bypass-withdrawn"),
            "denied" => Some("bypass-gone"),
            _ => None,
        };
        if let Some(kind) = ended
            && let Some(id) = fields.get("id").and_then(Value::as_str)
            && self.mark_done(session, id)
        {
            self.emit(kind, session, id, &[]);
        }
        self.audit(&event, fields);
    }

    /// Marks request `id` of `session` answered; whether it was not already.
    /// Whether the mirror has read request `id` of `session`.
    fn knows(&self, session: &str, id: &str) -> bool {
        lock(&self.mirror)
            .reqs
            .iter()
            .any(|r| r.id == id && r.session == session)
    }

    fn mark_done(&self, session: &str, id: &str) -> bool {
        let mut m = lock(&self.mirror);
        let changed = match m
            .reqs
            .iter_mut()
            .find(|r| r.id == id && r.session == session)
        {
            Some(r) if !r.done => {
                r.done = true;
                true
            }
            _ => false,
        };
        drop(m);
        self.tick.send_modify(|s| *s += 1);
        changed
    }

    /// The link to a session's toolsrv went down: whatever it still had pending is denied
    /// (toolsrv denies it on its way out, or is gone).
    fn gone(&self, session: &str) {
        let ids: Vec<String> = {
            let mut m = lock(&self.mirror);
            m.reqs
                .iter_mut()
                .filter(|r| r.session == session && !r.done)
                .map(|r| {
                    r.done = true;
                    r.id.clone()
                })
                .collect()
        };
        for id in ids {
            self.emit("bypass-gone", session, &id, &[]);
            self.audit_gone(
                session,
                id,
                "the session's toolsrv went away before an answer",
            );
        }
        self.tick.send_modify(|s| *s += 1);
    }

    fn add(&self, session: &str, v: Value, shown: String) {
        let id = v.get("id").and_then(Value::as_str).unwrap_or("").to_owned();
        let expires = v
            .get("expires")
            .and_then(Value::as_str)
            .and_then(parse_time)
            .unwrap_or(u64::MAX);
        let mut fields = serde_json::Map::new();
        fields.insert("session".into(), Value::from(session));
        for k in [
            "id",
            "agent",
            "agent_name",
            "session_name",
            "tool",
            "argv",
            "cwd",
            "grants",
            "reason",
            "expires",
            "digest",
            "request_bytes",
            "request_sha256",
        ] {
            if let Some(x) = v.get(k) {
                fields.insert(k.into(), x.clone());
            }
        }
        if let Some(sha) = v.get("executable").and_then(|e| e.get("sha256")) {
            fields.insert("executable_sha256".into(), sha.clone());
        }
        self.audit("request", fields);
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let early = {
            let mut m = lock(&self.mirror);
            let early = m
                .answered
                .iter()
                .position(|(s, i, _)| s == session && *i == id)
                .and_then(|at| m.answered.remove(at))
                .map(|(_, _, extra)| extra);
            m.seq += 1;
            let seq = m.seq;
            m.reqs.push(Req {
                seq,
                session: session.to_owned(),
                id: id.clone(),
                agent: text("agent"),
                tool: text("tool"),
                shown: Arc::new(shown),
                expires,
                done: early.is_some(),
            });
            if m.reqs.len() > MAX_KEPT {
                m.reqs.remove(0);
            }
            early
        };
        self.emit("bypass-requested", session, &id, &[]);
        if let Some(extra) = early {
            self.emit("bypass-resolved", session, &id, &extra);
        }
        self.tick.send_modify(|s| *s += 1);
    }

    /// The next request, of any session, that `seen` has not been shown (blocks).
    pub async fn next(&self, seen: &mut HashSet<String>) -> Arc<String> {
        let mut rx = self.tick.subscribe();
        loop {
            rx.borrow_and_update();
            {
                let now = now_unix();
                let m = lock(&self.mirror);
                if let Some(r) = m
                    .reqs
                    .iter()
                    .filter(|r| !r.done && r.expires > now && !seen.contains(&r.id))
                    .min_by_key(|r| r.seq)
                {
                    seen.insert(r.id.clone());
                    return Arc::clone(&r.shown);
                }
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// The session holding request `id`, if the mirror saw it.
    fn session_of(&self, id: &str) -> Option<String> {
        lock(&self.mirror)
            .reqs
            .iter()
            .rev()
            .find(|r| r.id == id)
            .map(|r| r.session.clone())
    }

    /// Records a verdict written for `session` (through the root file or the session's own)
    /// and its outcome; marks the request answered when toolsrv took it. A verdict whose
    /// write reached toolsrv but whose answer was lost with the link is audited as
    /// `decision-unknown`: toolsrv may have taken it.
    pub fn decided(&self, session: &str, data: &[u8], by: &str, result: &Result<(), Undelivered>) {
        let r = match ollie_link::bypass::parse_resolve(data) {
            Ok(r) => r,
            Err(e) => {
                self.refused_input(Some(session), data, by, &e.to_string());
                return;
            }
        };
        let mut fields = serde_json::Map::new();
        fields.insert("session".into(), Value::from(session));
        fields.insert("id".into(), Value::from(r.id.clone()));
        fields.insert("by".into(), Value::from(by));
        match &r.verdict {
            ollie_link::bypass::Verdict::Approve { session_scope } => {
                fields.insert("verdict".into(), json!("approved"));
                if *session_scope {
                    fields.insert("scope".into(), json!("session"));
                }
            }
            ollie_link::bypass::Verdict::Deny { message } => {
                fields.insert("verdict".into(), json!("denied"));
                fields.insert(
                    "message".into(),
                    Value::from(ollie_link::bypass::display_escape(message)),
                );
            }
        }
        match result {
            Ok(()) => {
                let mut extra = vec![("by", Value::from(by))];
                match &r.verdict {
                    ollie_link::bypass::Verdict::Approve { session_scope } => {
                        extra.push(("verdict", json!("approved")));
                        if *session_scope {
                            extra.push(("scope", json!("session")));
                        }
                    }
                    ollie_link::bypass::Verdict::Deny { .. } => {
                        extra.push(("verdict", json!("denied")));
                    }
                }
                if self.mark_done(session, &r.id) {
                    self.emit("bypass-resolved", session, &r.id, &extra);
                } else if !self.knows(session, &r.id) {
                    // Answered before the mirror read it: its events wait for it.
                    let mut m = lock(&self.mirror);
                    if m.answered.len() >= MAX_ANSWERED {
                        m.answered.pop_front();
                    }
                    m.answered
                        .push_back((session.to_owned(), r.id.clone(), extra));
                }
                self.audit("decision", fields);
            }
            Err(e) if e.maybe_taken => {
                fields.insert("error".into(), Value::from(e.error.clone()));
                self.audit("decision-unknown", fields);
            }
            Err(e) => {
                fields.insert("refused".into(), Value::from(e.error.clone()));
                self.audit("decision-refused", fields);
            }
        }
    }

    /// Records a verdict that was refused before it reached a request (malformed, or an id
    /// no session holds: truncated, re-cased, padded, confusable): who wrote it, what (its
    /// first 256 bytes, display-escaped) and why. Nothing else changes.
    fn refused_input(&self, session: Option<&str>, data: &[u8], by: &str, why: &str) {
        let shown: String = String::from_utf8_lossy(&data[..data.len().min(256)]).into_owned();
        let mut fields = serde_json::Map::new();
        if let Some(s) = session {
            fields.insert("session".into(), Value::from(s));
        }
        fields.insert("by".into(), Value::from(by));
        fields.insert(
            "input".into(),
            Value::from(ollie_link::bypass::display_escape(&shown)),
        );
        fields.insert("bytes".into(), Value::from(data.len()));
        fields.insert("refused".into(), Value::from(why));
        self.audit("decision-refused", fields);
    }

    /// The root `bypass/full`: the whole request whose id is written, from the session that
    /// holds it (its toolsrv's `bypass/full`).
    pub async fn full(&self, sessions: &[Arc<Session>], data: &[u8]) -> Result<Bytes, String> {
        let id = std::str::from_utf8(data)
            .ok()
            .map(|t| t.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r')))
            .filter(|t| ollie_link::bypass::is_request_id(t))
            .ok_or("full: write the id of a pending request (32 lowercase hex digits)")?;
        let sid = self
            .session_of(id)
            .ok_or_else(|| format!("full: no request {id}"))?;
        let s = sessions
            .iter()
            .find(|s| s.id == sid)
            .ok_or_else(|| format!("full: request {id} belonged to a session that is gone"))?;
        let conn = s.link.conn(Duration::from_secs(5)).await?;
        let mut f = conn
            .operator
            .walk(&["bypass", "full"])
            .await
            .map_err(|e| e.to_string())?;
        f.open(om::ORDWR).await.map_err(|e| e.to_string())?;
        f.write(0, Bytes::copy_from_slice(id.as_bytes()))
            .await
            .map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        loop {
            let b = f
                .read(out.len() as u64, 64 * 1024)
                .await
                .map_err(|e| e.to_string())?;
            if b.is_empty() {
                break;
            }
            out.extend_from_slice(&b);
        }
        Ok(Bytes::from(out))
    }

    /// The root `bypass/resolve`: checks the verdict (whole, in one write at `offset` 0),
    /// finds its session, forwards it.
    pub async fn resolve(
        &self,
        sessions: &[Arc<Session>],
        offset: u64,
        data: &[u8],
        by: &str,
    ) -> Result<(), String> {
        let r = ollie_link::bypass::parse_resolve_at(offset, data).map_err(|e| {
            let e = e.to_string();
            self.refused_input(None, data, by, &e);
            e
        })?;
        let Some(sid) = self.session_of(&r.id) else {
            let e = format!("resolve: no request {}", r.id);
            self.refused_input(None, data, by, &e);
            return Err(e);
        };
        // Every way it can fail from here on is audited: as refused, or as unknown when the
        // verdict reached toolsrv and its answer was lost.
        let result = async {
            let s = sessions.iter().find(|s| s.id == sid).ok_or_else(|| {
                Undelivered::refused(format!(
                    "resolve: request {} belonged to a session that is gone",
                    r.id
                ))
            })?;
            let conn = s
                .link
                .conn(Duration::from_secs(5))
                .await
                .map_err(Undelivered::refused)?;
            let mut f = conn
                .operator
                .walk(&["bypass", "resolve"])
                .await
                .map_err(|e| Undelivered::refused(e.to_string()))?;
            f.open(om::OWRITE)
                .await
                .map_err(|e| Undelivered::refused(e.to_string()))?;
            f.write(0, Bytes::copy_from_slice(data))
                .await
                .map(|_| ())
                .map_err(|e| Undelivered::of_write(&e))
        }
        .await;
        self.decided(&sid, data, by, &result);
        result.map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_with_civil() {
        for secs in [0, 86_399, 951_782_400, 1_700_000_000, 4_102_444_800] {
            let (y, m, d, hh, mm, ss) = ollie_p9::util::civil(secs);
            let s = format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z");
            assert_eq!(parse_time(&s), Some(secs), "{s}");
        }
        for bad in [
            "",
            "2026-13-01T00:00:00Z",
            "2026-01-01 00:00:00Z",
            "x".repeat(20).as_str(),
        ] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn recover_cuts_a_torn_line_and_ends_what_a_crash_left_pending() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(AUDIT_FILE);
        let req = |s: &str, id: &str| json!({"event": "request", "session": s, "id": id});
        let mut text = String::new();
        for v in [
            req("s1", "a"),
            req("s1", "b"),
            json!({"event": "decision", "session": "s1", "id": "a", "verdict": "approved"}),
            req("s2", "c"),
            req("s2", "d"),
            json!({"event": "expired", "session": "s2", "id": "d"}),
        ] {
            text.push_str(&format!("{v}\n"));
        }
        text.push_str("not an event\n{\"event\": \"requ");
        std::fs::write(&path, &text).unwrap();
        let b = Bypass::new(dir.path(), Arc::new(crate::state::events::Events::new()));
        b.recover();
        let after = std::fs::read_to_string(&path).unwrap();
        let whole = text.rsplit_once('\n').unwrap().0;
        // The torn append is cut, nothing whole is touched (not even the line that is no
        // event), and b and c, in the order asked, are denied.
        let added = after.strip_prefix(&format!("{whole}\n")).expect(&after);
        let added: Vec<Value> = added
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(added.len(), 2, "{after}");
        for (v, (s, id)) in added.iter().zip([("s1", "b"), ("s2", "c")]) {
            assert_eq!(
                (&v["event"], &v["session"], &v["id"], &v["verdict"]),
                (
                    &json!("broker-gone"),
                    &json!(s),
                    &json!(id),
                    &json!("denied")
                ),
                "{v}"
            );
        }
        let scan =
            scan_audit(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
        assert_eq!(scan.open, [], "{after}");
        assert_eq!(scan.bad, [7]);
        // A second start finds nothing to do.
        b.recover();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), after);
    }

    #[tokio::test]
    #[allow(clippy::too_many_lines)] // one scenario, step by step
    async fn the_mirror_shows_each_request_once_per_reader_and_audits() {
        let dir = tempfile::tempdir().unwrap();
        let events = Arc::new(crate::state::events::Events::new());
        let b = Bypass::new(dir.path(), Arc::clone(&events));
        let id = "0123456789abcdef0123456789abcdef";
        let v = json!({"id": id, "agent": "a", "tool": "execute_code", "argv": ["x"],
            "grants": ["net:80"], "reason": "r", "expires": "2999-01-01T00:00:00Z",
            "executable": {"sha256": "ab"}});
        b.add("s1", v.clone(), format!("{v}\n"));
        let mut seen = HashSet::new();
        assert!(b.next(&mut seen).await.contains(id));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), b.next(&mut seen))
                .await
                .is_err()
        );
        let expired = json!({"id": "f".repeat(32), "expires": "2000-01-01T00:00:00Z"});
        b.add("s1", expired.clone(), format!("{expired}\n"));
        let mut fresh = HashSet::new();
        assert!(b.next(&mut fresh).await.contains(id));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), b.next(&mut fresh))
                .await
                .is_err(),
            "an expired request was shown"
        );
        b.event(
            "s1",
            json!({"event": "expired", "id": "f".repeat(32), "time": "2000-01-01T00:00:10Z"}),
        );
        let verdict = format!(r#"{{"id":"{id}","error":"no"}}"#);
        b.decided("s1", verdict.as_bytes(), "me", &Ok(()));
        let mut third = HashSet::new();
        assert!(
            tokio::time::timeout(Duration::from_millis(100), b.next(&mut third))
                .await
                .is_err(),
            "an answered request was shown"
        );
        let audit = String::from_utf8(b.audit_text().to_vec()).unwrap();
        let lines: Vec<Value> = audit
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4, "{audit}");
        assert_eq!(lines[0]["event"], "request");
        assert_eq!(lines[0]["executable_sha256"], "ab");
        assert_eq!(lines[1]["event"], "request");
        assert_eq!(lines[2]["event"], "expired", "{audit}");
        assert_eq!(lines[2]["id"], "f".repeat(32), "{audit}");
        assert_eq!(lines[2]["session"], "s1", "{audit}");
        assert_eq!(lines[2]["toolsrv_time"], "2000-01-01T00:00:10Z", "{audit}");
        assert_eq!(lines[3]["event"], "decision");
        assert_eq!(lines[3]["verdict"], "denied");
        assert_eq!(lines[3]["message"], "no");
        // Verdicts refused before reaching a request are audited with what was written.
        let upper = format!(r#"{{"id":"{}","approved":true}}"#, id.to_uppercase());
        b.decided("s1", upper.as_bytes(), "me", &Ok(()));
        // No session holds a request: the verdicts are refused before any is looked for.
        let none: &[Arc<Session>] = &[];
        let e = b
            .resolve(
                none,
                0,
                "{\"id\":\"x\u{202e}\",\"approved\":true}".as_bytes(),
                "me",
            )
            .await
            .unwrap_err();
        assert!(e.starts_with("resolve:"), "{e}");
        let e = b
            .resolve(
                none,
                0,
                format!(r#"{{"id":"{}","approved":true}}"#, "a".repeat(32)).as_bytes(),
                "me",
            )
            .await
            .unwrap_err();
        assert!(e.contains("no request"), "{e}");
        let audit = String::from_utf8(b.audit_text().to_vec()).unwrap();
        let refused: Vec<Value> = audit
            .lines()
            .skip(4)
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(refused.len(), 3, "{audit}");
        assert!(
            refused
                .iter()
                .all(|r| r["event"] == "decision-refused" && r["by"] == "me")
        );
        assert_eq!(refused[0]["session"], "s1");
        assert!(
            refused[0]["input"]
                .as_str()
                .unwrap()
                .contains(&id.to_uppercase())
        );
        assert!(
            !refused[1]["input"].as_str().unwrap().contains('\u{202e}'),
            "{audit}"
        );
        assert!(
            refused[2]["refused"]
                .as_str()
                .unwrap()
                .contains("no request")
        );
        // The link going down denies what is still pending, once.
        let v = json!({"id": "e".repeat(32), "expires": "2999-01-01T00:00:00Z"});
        b.add("s2", v.clone(), format!("{v}\n"));
        b.gone("s2");
        b.gone("s2");
        let audit = String::from_utf8(b.audit_text().to_vec()).unwrap();
        let last: Vec<Value> = audit
            .lines()
            .skip(7)
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(last.len(), 2, "{audit}");
        assert_eq!(last[1]["event"], "broker-gone");
        assert_eq!(last[1]["id"], "e".repeat(32));
        let mut fourth = HashSet::new();
        assert!(
            tokio::time::timeout(Duration::from_millis(100), b.next(&mut fourth))
                .await
                .is_err(),
            "a request of a gone toolsrv was shown"
        );
        // eventwait: each request once, and one ending each, without the argv or reason.
        let mut cursor = 0;
        let mut seen = Vec::new();
        while let Ok(Some((seq, line))) =
            tokio::time::timeout(Duration::from_millis(100), events.next_after(cursor)).await
        {
            cursor = seq;
            let v: Value = serde_json::from_str(&line).unwrap();
            assert!(
                v.get("argv").is_none() && v.get("reason").is_none(),
                "{line}"
            );
            assert!(!line.contains("\"no\""), "{line}");
            seen.push((
                v["event"].as_str().unwrap().to_owned(),
                v["id"].as_str().unwrap().to_owned(),
            ));
        }
        let f = "f".repeat(32);
        let e = "e".repeat(32);
        assert_eq!(
            seen,
            vec![
                ("bypass-requested".to_owned(), id.to_owned()),
                ("bypass-requested".to_owned(), f.clone()),
                ("bypass-expired".to_owned(), f),
                ("bypass-resolved".to_owned(), id.to_owned()),
                ("bypass-requested".to_owned(), e.clone()),
                ("bypass-gone".to_owned(), e),
            ]
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(AUDIT_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// A verdict whose write reached toolsrv and whose answer was lost with the link is
    /// audited as unknown (it may have been taken), not as refused; an error reply is a
    /// refusal. Neither ends the request: the link going down does (broker-gone).
    #[test]
    fn a_verdict_lost_with_the_link_is_audited_as_unknown() {
        use ollie_p9::client::ClientError;
        let dir = tempfile::tempdir().unwrap();
        let b = Bypass::new(dir.path(), Arc::new(crate::state::events::Events::new()));
        let id = "0123456789abcdef0123456789abcdef";
        let v = json!({"id": id, "expires": "2999-01-01T00:00:00Z"});
        b.add("s1", v.clone(), format!("{v}\n"));
        let verdict = format!(r#"{{"id":"{id}","approved":true}}"#);
        let lost = Undelivered::of_write(&ClientError::Closed);
        assert!(lost.maybe_taken);
        assert!(
            lost.to_string().contains("the verdict may have been taken"),
            "{lost}"
        );
        b.decided("s1", verdict.as_bytes(), "op", &Err(lost));
        let answered = Undelivered::of_write(&ClientError::Server("resolve: no request".into()));
        assert!(!answered.maybe_taken);
        assert_eq!(answered.to_string(), "resolve: no request");
        b.decided("s1", verdict.as_bytes(), "op", &Err(answered));
        b.gone("s1");
        let audit = String::from_utf8(b.audit_text().to_vec()).unwrap();
        let events: Vec<(String, String)> = audit
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                let why = v.get("error").or(v.get("refused")).cloned();
                (
                    v["event"].as_str().unwrap().to_owned(),
                    why.and_then(|w| w.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            events,
            [
                ("request".to_owned(), String::new()),
                (
                    "decision-unknown".to_owned(),
                    "connection closed".to_owned()
                ),
                (
                    "decision-refused".to_owned(),
                    "resolve: no request".to_owned()
                ),
                ("broker-gone".to_owned(), String::new()),
            ],
            "{audit}"
        );
    }

    /// A verdict toolsrv took before the mirror read the request (written through the
    /// session's own resolve while the reader was on its way): when the request arrives it is
    /// not shown as pending, and eventwait gets requested, then resolved.
    #[tokio::test]
    async fn a_verdict_that_overtakes_its_request_keeps_the_events_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let events = Arc::new(crate::state::events::Events::new());
        let b = Bypass::new(dir.path(), Arc::clone(&events));
        let id = "0123456789abcdef0123456789abcdef";
        let verdict = format!(r#"{{"id":"{id}","approved":true}}"#);
        b.decided("s1", verdict.as_bytes(), "op", &Ok(()));
        let v = json!({"id": id, "agent": "a", "tool": "execute_code",
            "expires": "2999-01-01T00:00:00Z"});
        b.add("s1", v.clone(), format!("{v}\n"));
        let mut seen = HashSet::new();
        assert!(
            tokio::time::timeout(Duration::from_millis(100), b.next(&mut seen))
                .await
                .is_err(),
            "an answered request was shown as pending"
        );
        let mut cursor = 0;
        let mut got = Vec::new();
        while let Ok(Some((seq, line))) =
            tokio::time::timeout(Duration::from_millis(100), events.next_after(cursor)).await
        {
            cursor = seq;
            let v: Value = serde_json::from_str(&line).unwrap();
            got.push((
                v["event"].as_str().unwrap().to_owned(),
                v["verdict"].as_str().unwrap_or("").to_owned(),
                v["tool"].as_str().unwrap_or("").to_owned(),
            ));
        }
        assert_eq!(
            got,
            vec![
                (
                    "bypass-requested".into(),
                    String::new(),
                    "execute_code".into()
                ),
                (
                    "bypass-resolved".into(),
                    "approved".into(),
                    "execute_code".into()
                ),
            ]
        );
    }
}
