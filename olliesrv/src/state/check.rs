//! `olliesrv --check-state DIR`: every file of a state directory checked against the store's
//! layout and formats ([`crate::state::store`]) without changing anything, as an operator
//! would before restoring a backup or after a crash.
//!
//! A finding is either a *problem* (a record that does not decode or does not match its
//! directory, a history line that is not a message, a file the layout has no place for, a
//! file others may read) or a *leftover* that a crash leaves by design and the server repairs
//! by itself (a temp file of an atomic replace, a staged or tombstoned directory, deleted at
//! start; a torn last history line, cut before the next append; in the escalation audit log,
//! a torn last line and requests with no end, cut and denied at start). Problems make the
//! check fail; leftovers are listed and do not.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::bypass::{AUDIT_FILE, scan_audit};
use super::store::{
    AGENT_FILE, AGENTS, AgentRecord, CHAT_FILE, HISTORY_FILE, Hidden, PLAN_FILE, SESSION_FILE,
    SESSIONS, SessionRecord, hidden_kind, is_valid_id, parse_history, read_record,
};

/// The namespace file beside a session's or agent's record ([`crate::state::ns`]).
const NS_FILE: &str = "ns.json";
/// The namespace's shadow layers (users' files: not checked).
const NS_SHADOW: &str = "ns-shadow";

/// One thing the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub path: PathBuf,
    pub reason: String,
    /// A leftover the server repairs at start or at the next write, not a problem.
    pub leftover: bool,
}

/// What [`check`] found.
#[derive(Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub sessions: usize,
    pub agents: usize,
    /// History lines that decoded as messages.
    pub history_lines: usize,
    /// Whether a server holds the directory's lock (its writes in progress may show up as
    /// leftovers).
    pub server_running: bool,
}

impl Report {
    /// How many findings are problems.
    pub fn problems(&self) -> usize {
        self.findings.iter().filter(|f| !f.leftover).count()
    }

    /// The report as lines: one per finding, then a summary.
    pub fn text(&self) -> String {
        let mut out = String::new();
        if self.server_running {
            out.push_str("note: a server holds this directory's lock; files it is writing may show as leftovers\n");
        }
        for f in &self.findings {
            let kind = if f.leftover { "leftover" } else { "problem" };
            out.push_str(&format!("{kind}: {}: {}\n", f.path.display(), f.reason));
        }
        let leftovers = self.findings.len() - self.problems();
        out.push_str(&format!(
            "{} sessions, {} agents, {} history lines; {} problems, {} leftovers{}\n",
            self.sessions,
            self.agents,
            self.history_lines,
            self.problems(),
            leftovers,
            if self.problems() == 0 { ": ok" } else { "" }
        ));
        out
    }

    fn problem(&mut self, path: &Path, reason: impl Into<String>) {
        self.push(path, reason.into(), false);
    }

    fn leftover(&mut self, path: &Path, reason: impl Into<String>) {
        self.push(path, reason.into(), true);
    }

    fn push(&mut self, path: &Path, reason: String, leftover: bool) {
        self.findings.push(Finding {
            path: path.to_path_buf(),
            reason: reason.replace('\n', " "),
            leftover,
        });
    }
}

/// Checks the state directory `dir`; reads only.
pub fn check(dir: &Path) -> Report {
    let mut r = Report::default();
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            r.problem(dir, "not a directory");
            return r;
        }
        Err(e) => {
            r.problem(dir, format!("cannot open: {e}"));
            return r;
        }
    }
    r.server_running = lock_held(&dir.join("lock"));
    check_audit(&dir.join(AUDIT_FILE), &mut r);
    let key = dir.join("tcp.key");
    if let Ok(m) = fs::symlink_metadata(&key)
        && m.mode() & 0o077 != 0
    {
        r.problem(
            &key,
            format!("mode {:04o} lets others read it", m.mode() & 0o777),
        );
    }
    let sessions = dir.join(SESSIONS);
    match fs::symlink_metadata(&sessions) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            r.problem(&sessions, "not a directory");
            return r;
        }
        // A directory no server has used yet.
        Err(e) if e.kind() == ErrorKind::NotFound => return r,
        Err(e) => {
            r.problem(&sessions, format!("cannot open: {e}"));
            return r;
        }
    }
    for (name, path) in entries(&sessions, &mut r) {
        match name.as_deref() {
            Some(id) if is_valid_id(id) => check_session(id, &path, &mut r),
            other => unexpected(other, &path, "a session id", &mut r),
        }
    }
    r
}

/// The escalation audit log ([`crate::state::bypass`]): every whole line an event; a torn
/// last line and requests with no end are what a crash leaves, repaired at start.
fn check_audit(path: &Path, r: &mut Report) {
    let f = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return,
        Err(e) => {
            r.problem(path, format!("cannot open: {e}"));
            return;
        }
    };
    private_file(path, r);
    let scan = match scan_audit(std::io::BufReader::new(&f)) {
        Ok(s) => s,
        Err(e) => {
            r.problem(path, format!("cannot read: {e}"));
            return;
        }
    };
    for n in &scan.bad {
        r.problem(path, format!("line {n} is not an audit event"));
    }
    let len = f.metadata().map_or(scan.whole, |m| m.len());
    if scan.whole < len {
        r.leftover(
            path,
            format!(
                "torn last line ({} bytes after line {}), cut at start",
                len - scan.whole,
                scan.events + scan.bad.len()
            ),
        );
    }
    // While a server runs, a request with no end is simply pending.
    if !r.server_running && !scan.open.is_empty() {
        r.leftover(
            path,
            format!(
                "{} requests with no end (pending when the server stopped), recorded as denied (broker-gone) at start",
                scan.open.len()
            ),
        );
    }
}

/// Whether another process holds `path`'s flock (the running server's lock).
fn lock_held(path: &Path) -> bool {
    let Ok(f) = fs::File::open(path) else {
        return false;
    };
    match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockSharedNonblock) {
        Ok(_) => false,
        Err((_, e)) => e == nix::errno::Errno::EWOULDBLOCK,
    }
}

fn check_session(id: &str, dir: &Path, r: &mut Report) {
    if !private_dir(dir, r) {
        return;
    }
    let rec_path = dir.join(SESSION_FILE);
    match read_record::<SessionRecord>(&rec_path, "session") {
        Ok(rec) if rec.id == id => r.sessions += 1,
        Ok(rec) => r.problem(
            &rec_path,
            format!("id {:?} does not match its directory", rec.id),
        ),
        Err(p) => r.problem(&rec_path, p.reason),
    }
    private_file(&rec_path, r);
    for (name, path) in entries(dir, r) {
        match name.as_deref() {
            Some(SESSION_FILE | NS_SHADOW) => {}
            Some(NS_FILE) => check_ns(&path, r),
            Some(AGENTS) => {
                if !private_dir(&path, r) {
                    continue;
                }
                for (name, path) in entries(&path, r) {
                    match name.as_deref() {
                        Some(aid) if is_valid_id(aid) => check_agent(id, aid, &path, r),
                        other => unexpected(other, &path, "an agent id", r),
                    }
                }
            }
            other => unexpected(other, &path, "part of a session", r),
        }
    }
}

fn check_agent(session: &str, id: &str, dir: &Path, r: &mut Report) {
    if !private_dir(dir, r) {
        return;
    }
    let rec_path = dir.join(AGENT_FILE);
    match read_record::<AgentRecord>(&rec_path, "agent") {
        Ok(rec) if rec.id == id && rec.session == session => r.agents += 1,
        Ok(rec) => r.problem(
            &rec_path,
            format!(
                "id {:?} in session {:?} does not match its directory",
                rec.id, rec.session
            ),
        ),
        Err(p) => r.problem(&rec_path, p.reason),
    }
    private_file(&rec_path, r);
    for (name, path) in entries(dir, r) {
        match name.as_deref() {
            Some(AGENT_FILE | NS_SHADOW) => {}
            Some(NS_FILE) => check_ns(&path, r),
            Some(PLAN_FILE | CHAT_FILE) => {
                if let Err(e) = fs::File::open(&path) {
                    r.problem(&path, format!("cannot read: {e}"));
                }
                private_file(&path, r);
            }
            Some(HISTORY_FILE) => {
                check_history(&path, r);
                private_file(&path, r);
            }
            other => unexpected(other, &path, "part of an agent", r),
        }
    }
}

/// Every line of `history.jsonl` is one message (`role` user, assistant or tool, a string
/// `content` if any, `tool_calls` an array of calls with an id and a name).
fn check_history(path: &Path, r: &mut Report) {
    let data = match fs::read(path) {
        Ok(d) => d,
        Err(e) => {
            r.problem(path, format!("cannot read: {e}"));
            return;
        }
    };
    let whole = data.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    if whole < data.len() {
        r.leftover(
            path,
            format!(
                "torn last line ({} bytes without a newline, an interrupted append; cut before the next one)",
                data.len() - whole
            ),
        );
    }
    let (values, problems) = parse_history(path, &data[..whole]);
    for p in problems {
        r.problem(path, p.reason);
    }
    for (i, v) in values.iter().enumerate() {
        match message_problem(v) {
            None => r.history_lines += 1,
            Some(why) => r.problem(path, format!("value {}: {why}", i + 1)),
        }
    }
}

/// Why `v` is not a stored message, if it is not.
fn message_problem(v: &Value) -> Option<String> {
    let Some(o) = v.as_object() else {
        return Some("not an object".to_owned());
    };
    match o.get("role").and_then(Value::as_str) {
        Some("user" | "assistant" | "tool") => {}
        Some(other) => return Some(format!("unknown role {other:?}")),
        None => return Some("no role".to_owned()),
    }
    if o.get("content").is_some_and(|c| !c.is_string()) {
        return Some("content is not a string".to_owned());
    }
    if let Some(calls) = o.get("tool_calls") {
        let Some(calls) = calls.as_array() else {
            return Some("tool_calls is not an array".to_owned());
        };
        for c in calls {
            if c.get("id").and_then(Value::as_str).is_none()
                || c.get("name").and_then(Value::as_str).is_none()
            {
                return Some("a tool call without an id or a name".to_owned());
            }
        }
    }
    if o.get("tool_call_id").is_some_and(|c| !c.is_string()) {
        return Some("tool_call_id is not a string".to_owned());
    }
    None
}

fn check_ns(path: &Path, r: &mut Report) {
    if let Err(e) = ollie_beads::Namespace::load(path) {
        r.problem(path, format!("the bead namespace does not load: {e}"));
    }
    private_file(path, r);
}

/// A directory entry with no place in the layout: a crash's leftover or a problem.
fn unexpected(name: Option<&str>, path: &Path, what: &str, r: &mut Report) {
    // The bead namespace's own atomic save ([`ollie_beads::Namespace::save`]), cleaned by
    // its restore ([`crate::state::ns`]).
    if name.is_some_and(|n| n.starts_with(&format!(".{NS_FILE}.tmp-"))) {
        r.leftover(
            path,
            "a temp file an interrupted namespace save left (deleted at start)",
        );
        return;
    }
    match name.and_then(hidden_kind) {
        Some(Hidden::Dir(_)) => r.leftover(
            path,
            "a directory an interrupted create or remove left (deleted at start)",
        ),
        Some(Hidden::TempFile(_)) => r.leftover(
            path,
            "a temp file an interrupted replace left (deleted at start)",
        ),
        None => r.problem(path, format!("not {what}")),
    }
}

/// Whether `dir` is a directory; a problem if it is not or others may enter it.
fn private_dir(dir: &Path, r: &mut Report) -> bool {
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {
            if m.mode() & 0o077 != 0 {
                r.problem(dir, format!("mode {:04o} lets others in", m.mode() & 0o777));
            }
            true
        }
        Ok(_) => {
            r.problem(dir, "not a directory");
            false
        }
        Err(e) => {
            r.problem(dir, format!("cannot open: {e}"));
            false
        }
    }
}

/// A problem if the regular file `path` may be read by others, or is not a regular file.
fn private_file(path: &Path, r: &mut Report) {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => {
            if m.mode() & 0o077 != 0 {
                r.problem(
                    path,
                    format!("mode {:04o} lets others read it", m.mode() & 0o777),
                );
            }
        }
        Ok(_) => r.problem(path, "not a regular file"),
        // Missing: the record check has said so already.
        Err(_) => {}
    }
}

/// The entries of `dir` sorted by path: the name if it is UTF-8, and the path.
fn entries(dir: &Path, r: &mut Report) -> Vec<(Option<String>, PathBuf)> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            r.problem(dir, format!("cannot list: {e}"));
            return Vec::new();
        }
    };
    let mut out: Vec<_> = rd
        .filter_map(|e| match e {
            Ok(e) => Some((e.file_name().into_string().ok(), e.path())),
            Err(e) => {
                r.problem(dir, format!("cannot list: {e}"));
                None
            }
        })
        .collect();
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use serde_json::json;

    use super::*;
    use crate::state::store::{Store, Sync};

    const S1: &str = "11111111-1111-4111-8111-111111111111";
    const A1: &str = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";

    fn store_with_one_agent() -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("state");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let s = Store::open(&dir).unwrap();
        s.save_session(&SessionRecord {
            id: S1.into(),
            name: "s".into(),
            cwd: "/work".into(),
            backend: None,
            model: None,
            profile: None,
            remote: None,
            paused: false,
            created: 1,
            order: 1,
            cost_cap_usd: None,
        })
        .unwrap();
        s.save_agent(&AgentRecord {
            id: A1.into(),
            session: S1.into(),
            name: "a".into(),
            cwd: "/work".into(),
            backend: None,
            model: None,
            profile: None,
            cfg: Default::default(),
            created: 1,
            order: 1,
            stats: Default::default(),
            tools: None,
            queue: vec!["q".into()],
            in_turn: None,
            blocked: None,
        })
        .unwrap();
        s.save_plan(S1, A1, b"1. a\n").unwrap();
        s.append_history(S1, A1, &json!({"role": "user", "content": "hi"}), Sync::Now)
            .unwrap();
        (d, s)
    }

    fn agent_dir(s: &Store) -> PathBuf {
        s.dir().join("sessions").join(S1).join("agents").join(A1)
    }

    #[test]
    fn a_store_the_server_wrote_is_clean() {
        let (_d, s) = store_with_one_agent();
        let r = check(s.dir());
        assert_eq!(r.findings, []);
        assert_eq!((r.sessions, r.agents, r.history_lines), (1, 1, 1));
        assert!(
            r.text().ends_with("; 0 problems, 0 leftovers: ok\n"),
            "{}",
            r.text()
        );
    }

    #[test]
    fn crash_leftovers_are_listed_but_are_not_problems() {
        let (_d, s) = store_with_one_agent();
        let a = agent_dir(&s);
        let mut h = fs::OpenOptions::new()
            .append(true)
            .open(a.join("history.jsonl"))
            .unwrap();
        std::io::Write::write_all(&mut h, b"{\"role\": \"us").unwrap();
        fs::write(a.join(".agent.json.tmp-1x0-3"), b"{").unwrap();
        fs::write(a.join(".ns.json.tmp-f634460fbd6cfd09"), b"{").unwrap();
        let staged = s.dir().join("sessions").join(format!(".new-{S1}-1x0-4"));
        fs::create_dir(&staged).unwrap();
        let r = check(s.dir());
        assert_eq!(r.problems(), 0, "{}", r.text());
        assert_eq!(r.findings.len(), 4, "{}", r.text());
        assert!(r.findings.iter().all(|f| f.leftover));
        assert!(
            r.text().contains("torn last line (12 bytes"),
            "{}",
            r.text()
        );
        // The check changed nothing.
        assert!(staged.is_dir() && a.join(".agent.json.tmp-1x0-3").is_file());
    }

    #[test]
    fn the_audit_log_is_checked_line_by_line() {
        let (_d, s) = store_with_one_agent();
        let path = s.dir().join("audit.jsonl");
        let good = "{\"event\":\"request\",\"session\":\"s\",\"id\":\"a\"}\n";
        fs::write(&path, good).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        // Pending when the server stopped: repaired at start.
        let r = check(s.dir());
        assert_eq!(r.problems(), 0, "{}", r.text());
        assert!(r.text().contains("1 requests with no end"), "{}", r.text());
        // A torn append is a leftover too; a whole line that is no event is a problem.
        fs::write(&path, format!("{good}[1]\n{good}{{\"ev")).unwrap();
        let r = check(s.dir());
        assert_eq!(r.problems(), 1, "{}", r.text());
        let text = r.text();
        assert!(
            text.contains("audit.jsonl: line 2 is not an audit event"),
            "{text}"
        );
        assert!(
            text.contains("torn last line (4 bytes after line 3)"),
            "{text}"
        );
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            format!("{good}[1]\n{good}{{\"ev"),
            "the check changed the log"
        );
        // Others may read it: a problem.
        fs::write(&path, good).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            check(s.dir())
                .text()
                .contains("mode 0644 lets others read it"),
            "{}",
            check(s.dir()).text()
        );
    }

    #[test]
    fn damage_is_a_problem_naming_the_file() {
        let (_d, s) = store_with_one_agent();
        let a = agent_dir(&s);
        fs::write(
            a.join("history.jsonl"),
            "{\"role\": \"user\", \"content\": \"x\"}\nnot json\n{\"role\": \"robot\"}\n[1]\n",
        )
        .unwrap();
        let rec = s.dir().join("sessions").join(S1).join("session.json");
        fs::write(&rec, "{\"id\": 3}").unwrap();
        fs::write(s.dir().join("sessions").join("stray"), "").unwrap();
        fs::set_permissions(a.join("plan"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(a.join("ns.json"), "{\"profile\": 1}").unwrap();
        fs::set_permissions(a.join("ns.json"), fs::Permissions::from_mode(0o600)).unwrap();
        let r = check(s.dir());
        let text = r.text();
        for want in [
            "history.jsonl: line 2: ",
            "history.jsonl: value 2: unknown role \"robot\"",
            "history.jsonl: value 3: not an object",
            "session.json: invalid record",
            "sessions/stray: not a session id",
            "plan: mode 0644 lets others read it",
            "ns.json: the bead namespace does not load",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        assert_eq!(r.problems(), 7, "{text}");
        assert!(text.ends_with("7 problems, 0 leftovers\n"), "{text}");
    }

    #[test]
    fn a_missing_directory_is_a_problem_and_an_unused_one_is_clean() {
        let d = tempfile::tempdir().unwrap();
        let r = check(&d.path().join("nope"));
        assert_eq!(r.problems(), 1);
        assert!(r.text().contains("nope: cannot open"), "{}", r.text());
        let r = check(d.path());
        assert_eq!(r.findings, []);
    }
}
