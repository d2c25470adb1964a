//! The process table: every tool call is a process with a session-local pid, an owner
//! (the agent it runs for, or the operator), a bounded output buffer and a state.
//!
//! Bounds (toolsrv never grows without limit): running processes per agent and per session
//! (`Bootstrap::max_procs_per_agent`, `max_procs`), output per process (the policy's
//! `limits.output_bytes`, the rest counted and dropped), exited processes kept for
//! `out`/`wait`/`stat`/`record` (`Bootstrap::max_exited`: beyond it the oldest exited ones
//! are reaped), and the completion log (the same bound). Each finished process keeps its
//! sandbox run record (`ollie_sandbox::RunRecord`) as compact JSON, a few KiB.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use ollie_sandbox::{Cancel, KilledBy, RunOutput, RunRecord, SandboxError};
use tokio::sync::watch;

use crate::tools::Render;

/// Output kept per process.
#[derive(Debug, Default)]
pub struct OutBuf {
    pub data: Vec<u8>,
    /// Bytes produced in all (kept + dropped).
    pub total: u64,
    pub cap: usize,
}

impl OutBuf {
    pub fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        let room = self.cap.saturating_sub(self.data.len());
        self.data.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    fn truncated(&self) -> bool {
        self.total > self.data.len() as u64
    }
}

/// How a process ended.
#[derive(Debug, Clone)]
pub struct Finish {
    /// Exit code, if it exited.
    pub code: Option<i32>,
    /// Signal, if one killed it.
    pub signal: Option<i32>,
    /// Why it was stopped, if the runner or the memory cgroup did (`timeout`, `cancel`,
    /// `disk-limit`, `memory-limit`).
    pub stopped_by: Option<String>,
    /// Set when the tool never ran (the sandbox refused or failed to start it).
    pub error: Option<String>,
    /// The sandbox's run record (`ollie_sandbox::RunRecord`) as one compact JSON object;
    /// `None` when the tool never ran (then `error` says why).
    pub record: Option<Arc<String>>,
    pub duration: Duration,
    /// The tool's result text (rendered for its tool, with truncation notice).
    pub result: Arc<String>,
}

impl Finish {
    /// The status `wait` reports: the exit code, or 128 + signal.
    pub fn status(&self) -> Option<i32> {
        match (self.code, self.signal) {
            (Some(c), _) => Some(c),
            (None, Some(s)) => Some(128 + s),
            (None, None) => None,
        }
    }

    /// `proc/N/record`: the run record and a newline, or `{"error":"…"}` and a newline when
    /// the tool never ran.
    pub fn record_text(&self) -> String {
        let mut s = match (&self.record, &self.error) {
            (Some(r), _) => r.as_str().to_owned(),
            (None, e) => format!(
                "{{\"error\":{}}}",
                json_string(e.as_deref().unwrap_or("no run record was kept"))
            ),
        };
        s.push('\n');
        s
    }

    /// `exited`, `killed` or `failed`.
    pub fn state(&self) -> &'static str {
        if self.error.is_some() {
            "failed"
        } else if self.signal.is_some() {
            "killed"
        } else {
            "exited"
        }
    }
}

/// A process's state.
#[derive(Debug, Clone)]
pub enum State {
    Running,
    Done(Finish),
}

/// One tool process.
#[derive(Debug)]
pub struct Proc {
    pub id: u32,
    /// The agent it runs for (`operator` for the operator's own).
    pub owner: String,
    pub tool: String,
    pub summary: String,
    pub policy: String,
    /// Started with `proc/new.bg` (its completion goes to the completion log).
    pub bg: bool,
    pub started: SystemTime,
    pub t0: Instant,
    pub out: Mutex<OutBuf>,
    pub state: watch::Sender<State>,
    pub cancel: Cancel,
    /// Held for an escalation being decided: waiting to start, or frozen
    /// ([`crate::quiesce`]); `stat` shows it as `held=`.
    pub held: Arc<crate::quiesce::Held>,
    /// Set when the process is asked to stop (flush, term, kill, shutdown): a call still
    /// waiting for the operator gives up instead of running later.
    pub stop: watch::Sender<bool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Proc {
    /// The current state.
    pub fn current(&self) -> State {
        self.state.borrow().clone()
    }

    pub fn running(&self) -> bool {
        matches!(*self.state.borrow(), State::Running)
    }

    /// Waits for the end.
    pub async fn finished(&self) -> Finish {
        let mut rx = self.state.subscribe();
        loop {
            if let State::Done(f) = &*rx.borrow_and_update() {
                return f.clone();
            }
            if rx.changed().await.is_err() {
                // The sender lives in `self`: cannot happen while we hold it.
                std::future::pending::<()>().await;
            }
        }
    }

    /// `count` bytes of the output from `offset` (what has been captured so far).
    pub fn out_at(&self, offset: u64, count: u32) -> Vec<u8> {
        let o = lock(&self.out);
        let Ok(off) = usize::try_from(offset) else {
            return Vec::new();
        };
        if off >= o.data.len() {
            return Vec::new();
        }
        let end = off.saturating_add(count as usize).min(o.data.len());
        o.data[off..end].to_vec()
    }

    /// `stat`: key=value lines.
    pub fn stat_text(&self) -> String {
        let st = self.current();
        let (state, runtime) = match &st {
            State::Running => ("running", self.t0.elapsed()),
            State::Done(f) => (f.state(), f.duration),
        };
        let o = lock(&self.out);
        let mut s = format!(
            "pid={}\nstate={state}\ntool={}\nagent={}\npolicy={}\nruntime={:.3}s\nstarted={}\noutput={}\ntruncated={}\ncmd={}\n",
            self.id,
            self.tool,
            self.owner,
            self.policy,
            runtime.as_secs_f64(),
            self.started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            o.total,
            o.truncated(),
            crate::payload::escape(&self.summary),
        );
        if matches!(st, State::Running) {
            s.push_str(&format!("held={}\n", crate::quiesce::held_name(&self.held)));
        }
        if let State::Done(f) = &st {
            if let Some(c) = f.code {
                s.push_str(&format!("exit={c}\n"));
            }
            if let Some(sig) = f.signal {
                s.push_str(&format!("signal={sig}\n"));
            }
            if let Some(b) = &f.stopped_by {
                s.push_str(&format!("stopped_by={b}\n"));
            }
            if let Some(e) = &f.error {
                s.push_str(&format!("error={}\n", crate::payload::escape(e)));
            }
        }
        s
    }

    /// `proc/N/record`: the run record once the process has ended; an error while it runs.
    pub fn record_file(&self) -> Result<String, String> {
        match self.current() {
            State::Running => Err(format!(
                "process {} is still running (read wait first)",
                self.id
            )),
            State::Done(f) => Ok(f.record_text()),
        }
    }

    /// The first line of a blocking `proc/new` reply with `record=1` (newline included):
    /// `{"pid":N,"record":{…}}`, or `{"pid":N,"record":null,"error":"…"}` when the tool
    /// never ran.
    pub fn record_line(&self, f: &Finish) -> String {
        match (&f.record, &f.error) {
            (Some(r), _) => format!("{{\"pid\":{},\"record\":{r}}}\n", self.id),
            (None, e) => format!(
                "{{\"pid\":{},\"record\":null,\"error\":{}}}\n",
                self.id,
                json_string(e.as_deref().unwrap_or("no run record was kept"))
            ),
        }
    }

    /// The header line of a blocking `proc/new` result.
    pub fn header(&self, f: &Finish) -> String {
        let mut h = format!("pid={}", self.id);
        if let Some(c) = f.code {
            h.push_str(&format!(" exit={c}"));
        }
        if let Some(s) = f.signal {
            h.push_str(&format!(" signal={s}"));
        }
        if let Some(b) = &f.stopped_by {
            h.push_str(&format!(" stopped_by={b}"));
        }
        let o = lock(&self.out);
        if o.truncated() {
            h.push_str(&format!(" truncated={}/{}", o.data.len(), o.total));
        }
        h.push_str(&format!(" time={:.3}s", f.duration.as_secs_f64()));
        h
    }
}

/// One entry of the completion log.
#[derive(Debug, Clone)]
pub struct Completion {
    pub seq: u64,
    pub pid: u32,
    pub owner: String,
    /// The seed's `<system-proc-complete …>` message.
    pub message: Arc<String>,
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// The run record as compact JSON. Serializing fails only on a path that is not UTF-8;
/// then an object naming the failure stands in (`record_error`), so the file stays JSON.
fn record_json(r: &RunRecord) -> String {
    serde_json::to_string(r).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "run record not serializable");
        format!(
            "{{\"record_error\":{}}}",
            json_string(&format!("the run record could not be serialized: {e}"))
        )
    })
}

/// Escapes text for an XML-ish attribute: quotes, angle brackets, ampersands and control
/// characters.
fn attr(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => o.push_str("&quot;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            c if c.is_control() => o.push_str(&format!("&#{};", c as u32)),
            c => o.push(c),
        }
    }
    o
}

/// The message an agent gets when its background process ends.
pub fn completion_message(p: &Proc, f: &Finish) -> String {
    let exit = f
        .status()
        .map_or_else(|| "-1".to_owned(), |s| s.to_string());
    let mut m = format!(
        "<system-proc-complete id=\"{}\" cmd=\"{}\" exit=\"{exit}\"",
        p.id,
        attr(&p.summary)
    );
    if let Some(s) = f.signal {
        m.push_str(&format!(" signal=\"{s}\""));
    }
    m.push_str(">\n");
    match &f.error {
        Some(e) => m.push_str(&format!("tool did not run: {e}\n")),
        None => {
            m.push_str(&f.result);
            if !f.result.is_empty() && !f.result.ends_with('\n') {
                m.push('\n');
            }
        }
    }
    m.push_str("</system-proc-complete>\n");
    m
}

#[derive(Debug, Default)]
struct Table {
    next: u32,
    procs: BTreeMap<u32, Arc<Proc>>,
    log: VecDeque<Completion>,
    seq: u64,
}

/// The session's processes.
#[derive(Debug)]
pub struct Procs {
    table: Mutex<Table>,
    /// Bumped on every completion-log entry.
    log_tick: watch::Sender<u64>,
    pub max_per_agent: usize,
    pub max_total: usize,
    pub max_exited: usize,
}

/// What a new process needs.
#[derive(Debug)]
pub struct NewProc {
    pub owner: String,
    pub tool: String,
    pub summary: String,
    pub policy: String,
    pub bg: bool,
    pub out_cap: usize,
}

impl Procs {
    pub fn new(max_per_agent: usize, max_total: usize, max_exited: usize) -> Procs {
        Procs {
            table: Mutex::new(Table {
                next: 1,
                ..Table::default()
            }),
            log_tick: watch::Sender::new(0),
            max_per_agent: max_per_agent.max(1),
            max_total: max_total.max(1),
            max_exited: max_exited.max(1),
        }
    }

    /// Registers a process (still to be started), enforcing the running limits.
    pub fn create(&self, n: NewProc) -> Result<Arc<Proc>, String> {
        let mut t = lock(&self.table);
        let running: Vec<&Arc<Proc>> = t.procs.values().filter(|p| p.running()).collect();
        if running.len() >= self.max_total {
            return Err(format!(
                "too many processes: the session has {} running (limit {})",
                running.len(),
                self.max_total
            ));
        }
        let mine = running.iter().filter(|p| p.owner == n.owner).count();
        if mine >= self.max_per_agent {
            return Err(format!(
                "too many processes: {} has {mine} running (limit {} per agent)",
                n.owner, self.max_per_agent
            ));
        }
        let cancel = Cancel::new().map_err(|e| format!("cannot create a cancel handle: {e}"))?;
        let id = t.next;
        t.next = t.next.checked_add(1).unwrap_or(1);
        let p = Arc::new(Proc {
            id,
            owner: n.owner,
            tool: n.tool,
            summary: n.summary,
            policy: n.policy,
            bg: n.bg,
            started: SystemTime::now(),
            t0: Instant::now(),
            out: Mutex::new(OutBuf {
                cap: n.out_cap,
                ..OutBuf::default()
            }),
            state: watch::Sender::new(State::Running),
            cancel,
            held: Arc::new(crate::quiesce::Held::new(crate::quiesce::HELD_NO)),
            stop: watch::Sender::new(false),
        });
        t.procs.insert(id, Arc::clone(&p));
        Self::reap(&mut t, self.max_exited);
        Ok(p)
    }

    /// Drops the oldest exited processes beyond the bound.
    fn reap(t: &mut Table, max_exited: usize) {
        let exited: Vec<u32> = t
            .procs
            .values()
            .filter(|p| !p.running())
            .map(|p| p.id)
            .collect();
        if exited.len() > max_exited {
            for id in &exited[..exited.len() - max_exited] {
                t.procs.remove(id);
            }
        }
    }

    /// A process `who` may see.
    pub fn get(&self, id: u32, who: &crate::auth::Identity) -> Option<Arc<Proc>> {
        let t = lock(&self.table);
        t.procs
            .get(&id)
            .filter(|p| who.may_act_for(&p.owner))
            .cloned()
    }

    /// Every process `who` may see, by pid.
    pub fn visible(&self, who: &crate::auth::Identity) -> Vec<Arc<Proc>> {
        let t = lock(&self.table);
        t.procs
            .values()
            .filter(|p| who.may_act_for(&p.owner))
            .cloned()
            .collect()
    }

    /// Removes an exited process.
    pub fn dismiss(&self, id: u32) -> Result<(), String> {
        let mut t = lock(&self.table);
        match t.procs.get(&id) {
            None => Err(format!("no process {id}")),
            Some(p) if p.running() => Err(format!(
                "process {id} is still running; term or kill it first"
            )),
            Some(_) => {
                t.procs.remove(&id);
                t.log.retain(|c| c.pid != id);
                Ok(())
            }
        }
    }

    /// Records the end of `p`.
    pub fn finish(&self, p: &Proc, f: Finish) {
        let message = p.bg.then(|| completion_message(p, &f));
        p.state.send_replace(State::Done(f));
        let mut t = lock(&self.table);
        if let Some(message) = message {
            t.seq += 1;
            let seq = t.seq;
            t.log.push_back(Completion {
                seq,
                pid: p.id,
                owner: p.owner.clone(),
                message: Arc::new(message),
            });
            while t.log.len() > self.max_exited {
                t.log.pop_front();
            }
            self.log_tick.send_replace(seq);
        }
        Self::reap(&mut t, self.max_exited);
    }

    /// The next completion after `cursor` that `who` may see; waits for one.
    pub async fn next_completion(&self, cursor: u64, who: &crate::auth::Identity) -> Completion {
        let mut rx = self.log_tick.subscribe();
        loop {
            rx.borrow_and_update();
            {
                let t = lock(&self.table);
                if let Some(c) = t
                    .log
                    .iter()
                    .find(|c| c.seq > cursor && who.may_act_for(&c.owner))
                {
                    return c.clone();
                }
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// The processes still running.
    pub fn still_running(&self) -> Vec<Arc<Proc>> {
        lock(&self.table)
            .procs
            .values()
            .filter(|p| p.running())
            .cloned()
            .collect()
    }

    /// Asks every running process to stop (SIGTERM, SIGKILL after the grace period).
    pub fn cancel_all(&self) {
        let t = lock(&self.table);
        for p in t.procs.values().filter(|p| p.running()) {
            p.stop.send_replace(true);
            p.cancel.cancel();
        }
    }
}

/// The [`Finish`] of a call that never ran, with why (a refused or denied escalation, a
/// sandbox that would not start).
pub fn not_run(p: &Proc, msg: String) -> Finish {
    Finish {
        code: None,
        signal: None,
        stopped_by: None,
        error: Some(msg.clone()),
        record: None,
        duration: p.t0.elapsed(),
        result: Arc::new(format!("tool did not run: {msg}\n")),
    }
}

/// Turns a sandbox result into a [`Finish`].
/// What the run left behind for host-side programs (the record's post-run flags), one
/// escaped line each after the tool's output, so the model, `o attach` and `o logs` see it.
fn post_run_note(result: &mut String, post_run: &ollie_sandbox::PostRunRecord) {
    if post_run.flags.is_empty() {
        return;
    }
    if !result.is_empty() && !result.ends_with('\n') {
        result.push('\n');
    }
    for f in &post_run.flags {
        // The flag's own text has its control characters escaped already; what else a
        // terminal would act on (bidi overrides, …) is escaped here.
        let mut line = String::new();
        for c in f.to_string().chars() {
            if ollie_link::bypass::needs_display_escape(c) {
                line.push_str(&format!("\\u{{{:X}}}", u32::from(c)));
            } else {
                line.push(c);
            }
        }
        result.push_str(&format!(
            "[post-run: {line} (review before running git or tools here)]\n"
        ));
    }
}

pub fn finish_of(p: &Proc, render: &Render, r: Result<RunOutput, SandboxError>) -> Finish {
    let duration = p.t0.elapsed();
    match r {
        Err(e) => {
            // The operator's journal says so too, not only the agent's chat: a sandbox that
            // cannot start is the host's or the deployment's problem, not the agent's.
            let msg = crate::error_chain(&e);
            tracing::warn!(pid = p.id, owner = %p.owner, tool = %p.tool, policy = %p.policy, error = %msg, "sandbox refused to start the tool");
            not_run(p, msg)
        }
        Ok(out) => {
            let exit = &out.record.exit;
            let ok = exit.code == Some(0);
            let (combined, total, kept) = {
                let o = lock(&p.out);
                (o.data.clone(), o.total, o.data.len() as u64)
            };
            let mut result = crate::tools::render(render, &combined, &out.stdout, &out.stderr, ok);
            let truncated =
                total > kept || out.record.stdout.truncated || out.record.stderr.truncated;
            if truncated {
                if !result.is_empty() && !result.ends_with('\n') {
                    result.push('\n');
                }
                result.push_str(&format!(
                    "[output truncated: first {kept} of {total} bytes shown]\n"
                ));
            }
            post_run_note(&mut result, &out.record.post_run);
            Finish {
                code: exit.code,
                signal: exit.signal,
                stopped_by: exit.killed_by.map(|k| match k {
                    KilledBy::Timeout => "timeout".to_owned(),
                    KilledBy::Cancel => "cancel".to_owned(),
                    KilledBy::DiskLimit => "disk-limit".to_owned(),
                    KilledBy::MemoryLimit => "memory-limit".to_owned(),
                }),
                error: None,
                record: Some(Arc::new(record_json(&out.record))),
                duration,
                result: Arc::new(result),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Identity;

    fn np(owner: &str, bg: bool) -> NewProc {
        NewProc {
            owner: owner.into(),
            tool: "execute_code".into(),
            summary: "echo \"x\" <y>".into(),
            policy: "workspace".into(),
            bg,
            out_cap: 4,
        }
    }

    fn done(code: i32) -> Finish {
        Finish {
            code: Some(code),
            signal: None,
            stopped_by: None,
            error: None,
            record: Some(Arc::new(r#"{"argv":["true"],"exit":{"code":0}}"#.into())),
            duration: Duration::from_millis(5),
            result: Arc::new("out\n".into()),
        }
    }

    #[test]
    fn limits_visibility_and_reaping() {
        let ps = Procs::new(2, 3, 2);
        let a1 = ps.create(np("a", false)).unwrap();
        let _a2 = ps.create(np("a", false)).unwrap();
        assert!(ps.create(np("a", false)).unwrap_err().contains("per agent"));
        let _b1 = ps.create(np("b", false)).unwrap();
        assert!(ps.create(np("c", false)).unwrap_err().contains("session"));
        let a = Identity::Agent("a".into());
        let b = Identity::Agent("b".into());
        assert!(ps.get(a1.id, &a).is_some());
        assert!(ps.get(a1.id, &b).is_none());
        assert_eq!(ps.visible(&b).len(), 1);
        assert_eq!(ps.visible(&Identity::Operator).len(), 3);
        assert!(ps.dismiss(a1.id).unwrap_err().contains("still running"));
        ps.finish(&a1, done(0));
        ps.dismiss(a1.id).unwrap();
        assert!(ps.get(a1.id, &Identity::Operator).is_none());
        // Exited beyond max_exited are reaped, oldest first.
        for _ in 0..3 {
            let p = ps.create(np("c", false)).unwrap();
            ps.finish(&p, done(1));
        }
        let exited = ps
            .visible(&Identity::Operator)
            .iter()
            .filter(|p| !p.running())
            .count();
        assert_eq!(exited, 2);
    }

    #[test]
    fn output_is_capped_and_counted() {
        let ps = Procs::new(4, 4, 4);
        let p = ps.create(np("a", false)).unwrap();
        lock(&p.out).push(b"hello world");
        assert_eq!(p.out_at(0, 100), b"hell");
        assert_eq!(p.out_at(2, 1), b"l");
        assert!(p.out_at(9, 1).is_empty());
        assert!(lock(&p.out).truncated());
        assert!(p.stat_text().contains("truncated=true"));
    }

    #[test]
    fn record_file_and_record_line() {
        let ps = Procs::new(4, 4, 4);
        let p = ps.create(np("a", false)).unwrap();
        let e = p.record_file().unwrap_err();
        assert_eq!(
            e,
            format!("process {} is still running (read wait first)", p.id)
        );
        ps.finish(&p, done(0));
        let rec = r#"{"argv":["true"],"exit":{"code":0}}"#;
        assert_eq!(p.record_file().unwrap(), format!("{rec}\n"));
        let State::Done(f) = p.current() else {
            panic!("not done")
        };
        let line = p.record_line(&f);
        assert_eq!(line, format!("{{\"pid\":{},\"record\":{rec}}}\n", p.id));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["record"]["argv"][0], "true");

        // A tool that never ran: the sandbox's error, escaped, in both forms.
        let q = ps.create(np("a", false)).unwrap();
        let failed = Finish {
            code: None,
            signal: None,
            stopped_by: None,
            error: Some("cannot start in \"/w/x\"\nbad".into()),
            record: None,
            duration: Duration::from_millis(1),
            result: Arc::new(String::new()),
        };
        ps.finish(&q, failed.clone());
        let file = q.record_file().unwrap();
        assert!(
            file.ends_with('\n') && file.matches('\n').count() == 1,
            "{file:?}"
        );
        let v: serde_json::Value = serde_json::from_str(&file).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": "cannot start in \"/w/x\"\nbad"})
        );
        let line = q.record_line(&failed);
        assert!(
            line.starts_with(&format!("{{\"pid\":{},\"record\":null,\"error\":", q.id)),
            "{line}"
        );
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["pid"], q.id);
        assert!(v["record"].is_null());
        assert_eq!(v["error"], "cannot start in \"/w/x\"\nbad");
    }

    #[tokio::test]
    async fn completions_are_scoped_and_escaped() {
        let ps = Procs::new(4, 4, 4);
        let p = ps.create(np("a", true)).unwrap();
        ps.finish(&p, done(3));
        let c = ps.next_completion(0, &Identity::Agent("a".into())).await;
        assert!(
            c.message.starts_with(
                "<system-proc-complete id=\"1\" cmd=\"echo &quot;x&quot; &lt;y&gt;\" exit=\"3\">\nout\n"
            ),
            "{}",
            c.message
        );
        let other = tokio::time::timeout(
            Duration::from_millis(50),
            ps.next_completion(0, &Identity::Agent("b".into())),
        )
        .await;
        assert!(other.is_err(), "agent b must not see a's completion");
        assert_eq!(p.finished().await.status(), Some(3));
    }
}
