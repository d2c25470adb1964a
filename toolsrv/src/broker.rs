//! The bypass broker: escalation requests waiting for a human.
//!
//! A tool call that asks for more than its policy allows (and may ask for it) becomes a
//! request: a random 128-bit single-use id, the exact execution it is bound to, the grants,
//! the reason, a deadline. The call waits (nothing has run) until the operator answers on
//! `bypass/resolve`, the deadline passes (denied), or toolsrv goes away (denied: the call's
//! read fails).
//!
//! - `bypass/pending` readers see each request once per fid, as one JSON object whose strings
//!   are display-escaped ([`ollie_link::bypass::display_escape_json`]).
//! - `resolve` takes the strict verdict of [`ollie_link::bypass::parse_resolve`]; unknown,
//!   expired and used ids are errors; answers after the deadline are refused.
//! - `"scope":"session"` remembers the approval for requests with the same binding digest
//!   (byte-identical: same agent, tool, argv, cwd, environment, executable and script hashes,
//!   grants) for the rest of this toolsrv's life.
//! - Flood control: at most [`MAX_PENDING_PER_AGENT`] pending per agent and
//!   [`MAX_PENDING`] per session; more are refused at once (the caller gets an error and
//!   nothing reaches the human). A request identical to one already pending joins it (one
//!   answer decides both).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ollie_link::bypass::{Resolve, Verdict};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

/// Pending requests one agent may have.
pub const MAX_PENDING_PER_AGENT: usize = 4;
/// Pending requests one session may have.
pub const MAX_PENDING: usize = 32;
/// How long a request waits for an answer unless configured otherwise.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);
/// Answered or expired requests remembered (so late or repeated answers get a clear error).
const MAX_DONE: usize = 1024;

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Approved,
    /// Denied by the operator, with their message.
    Denied(String),
    /// No answer before the deadline.
    Expired,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Done {
    Approved,
    Denied,
    Expired,
}

struct Entry {
    seq: u64,
    agent: String,
    digest: String,
    /// What `pending` shows.
    shown: Arc<String>,
    deadline: Instant,
    waiters: Vec<oneshot::Sender<Outcome>>,
}

#[derive(Default)]
struct Table {
    seq: u64,
    pending: BTreeMap<String, Entry>,
    done: BTreeMap<String, Done>,
    done_order: Vec<String>,
    /// Digests approved with `"scope":"session"`.
    approved_digests: HashSet<String>,
}

/// One request being made.
#[derive(Debug)]
pub struct Ask {
    pub agent: String,
    /// Binding digest (see the module doc).
    pub digest: String,
    /// The request's fields (session, agent, tool, argv, cwd, env, executable, scripts,
    /// grants, reason); `id`, `created` and `expires` are added here.
    pub fields: serde_json::Map<String, Value>,
}

/// What asking gave.
#[derive(Debug)]
pub enum Asked {
    /// Approved earlier for the rest of the session (`scope: session`).
    PreApproved,
    /// Waiting: the id and the answer to come.
    Waiting(String, oneshot::Receiver<Outcome>),
}

/// The broker of one toolsrv.
pub struct Broker {
    table: Mutex<Table>,
    tick: watch::Sender<u64>,
    deadline: Mutex<Duration>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("pending", &self.pending_count())
            .field("deadline", &self.deadline())
            .finish()
    }
}

impl Default for Broker {
    fn default() -> Broker {
        Broker {
            table: Mutex::new(Table::default()),
            tick: watch::Sender::new(0),
            deadline: Mutex::new(DEFAULT_DEADLINE),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d, hh, mm, ss) = ollie_p9::util::civil(secs);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

impl Broker {
    /// Sets how long new requests wait.
    pub fn set_deadline(&self, d: Duration) {
        *lock(&self.deadline) = d;
    }

    pub fn deadline(&self) -> Duration {
        *lock(&self.deadline)
    }

    /// Files a request (or joins an identical pending one).
    pub fn ask(&self, ask: Ask) -> Result<Asked, String> {
        let mut t = lock(&self.table);
        self.expire(&mut t);
        if t.approved_digests.contains(&ask.digest) {
            return Ok(Asked::PreApproved);
        }
        let (tx, rx) = oneshot::channel();
        if let Some((id, e)) = t
            .pending
            .iter_mut()
            .find(|(_, e)| e.digest == ask.digest && e.agent == ask.agent)
        {
            e.waiters.push(tx);
            return Ok(Asked::Waiting(id.clone(), rx));
        }
        let mine = t.pending.values().filter(|e| e.agent == ask.agent).count();
        if mine >= MAX_PENDING_PER_AGENT {
            return Err(format!(
                "escalation refused: {mine} requests of this agent are already waiting for the operator (limit {MAX_PENDING_PER_AGENT}); nothing was run"
            ));
        }
        if t.pending.len() >= MAX_PENDING {
            return Err(format!(
                "escalation refused: {} requests are already waiting for the operator in this session (limit {MAX_PENDING}); nothing was run",
                t.pending.len()
            ));
        }
        let id = ollie_link::bypass::new_request_id()
            .map_err(|e| format!("escalation refused: no randomness for a request id: {e}"))?;
        let deadline = self.deadline();
        let now = SystemTime::now();
        let mut fields = ask.fields;
        fields.insert("id".into(), Value::from(id.clone()));
        fields.insert("created".into(), Value::from(rfc3339(now)));
        fields.insert("expires".into(), Value::from(rfc3339(now + deadline)));
        let shown = ollie_link::bypass::display_escape_json(&Value::Object(fields));
        t.seq += 1;
        let seq = t.seq;
        t.pending.insert(
            id.clone(),
            Entry {
                seq,
                agent: ask.agent,
                digest: ask.digest,
                shown: Arc::new(format!("{shown}\n")),
                deadline: Instant::now() + deadline,
                waiters: vec![tx],
            },
        );
        drop(t);
        self.tick.send_modify(|s| *s += 1);
        Ok(Asked::Waiting(id, rx))
    }

    /// Waits for the answer to request `id` (its deadline included).
    pub async fn wait(&self, id: &str, rx: oneshot::Receiver<Outcome>) -> Outcome {
        let deadline = lock(&self.table).pending.get(id).map(|e| e.deadline);
        let Some(deadline) = deadline else {
            // Answered between asking and waiting: the answer is in the channel.
            return rx.await.unwrap_or(Outcome::Expired);
        };
        match tokio::time::timeout_at(deadline.into(), rx).await {
            Ok(Ok(o)) => o,
            Ok(Err(_)) => Outcome::Expired,
            Err(_) => {
                let mut t = lock(&self.table);
                self.expire(&mut t);
                Outcome::Expired
            }
        }
    }

    /// Moves requests past their deadline to done (their waiters get `Expired`).
    fn expire(&self, t: &mut Table) {
        let now = Instant::now();
        let late: Vec<String> = t
            .pending
            .iter()
            .filter(|(_, e)| e.deadline <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in late {
            if let Some(e) = t.pending.remove(&id) {
                for w in e.waiters {
                    let _ = w.send(Outcome::Expired);
                }
                Self::remember(t, id, Done::Expired);
            }
        }
    }

    fn remember(t: &mut Table, id: String, d: Done) {
        t.done.insert(id.clone(), d);
        t.done_order.push(id);
        if t.done_order.len() > MAX_DONE {
            let old = t.done_order.remove(0);
            t.done.remove(&old);
        }
    }

    /// The next pending request `seen` does not hold (blocks until there is one).
    pub async fn next_pending(&self, seen: &mut HashSet<String>) -> Arc<String> {
        let mut rx = self.tick.subscribe();
        loop {
            rx.borrow_and_update();
            {
                let mut t = lock(&self.table);
                self.expire(&mut t);
                if let Some((id, e)) = t
                    .pending
                    .iter()
                    .filter(|(id, _)| !seen.contains(*id))
                    .min_by_key(|(_, e)| e.seq)
                {
                    seen.insert(id.clone());
                    return Arc::clone(&e.shown);
                }
            }
            // Wake at the next change, or at the next deadline (expired requests leave).
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Applies a verdict.
    pub fn resolve(&self, r: Resolve) -> Result<&'static str, String> {
        let mut t = lock(&self.table);
        self.expire(&mut t);
        let Some(e) = t.pending.remove(&r.id) else {
            return Err(match t.done.get(&r.id) {
                Some(Done::Expired) => format!("request {} expired: it was denied", r.id),
                Some(_) => format!("request {} was already answered", r.id),
                None => format!("no request {}", r.id),
            });
        };
        let (outcome, done, reply) = match r.verdict {
            Verdict::Approve { session_scope } => {
                if session_scope {
                    t.approved_digests.insert(e.digest.clone());
                }
                (Outcome::Approved, Done::Approved, "approved\n")
            }
            Verdict::Deny { message } => (Outcome::Denied(message), Done::Denied, "denied\n"),
        };
        for w in e.waiters {
            let _ = w.send(outcome.clone());
        }
        Self::remember(&mut t, r.id, done);
        drop(t);
        self.tick.send_modify(|s| *s += 1);
        Ok(reply)
    }

    /// Withdraws request `id` (its call was stopped): it leaves `pending`, and a later
    /// answer is refused as already answered.
    pub fn withdraw(&self, id: &str, why: &str) {
        let mut t = lock(&self.table);
        if let Some(e) = t.pending.remove(id) {
            for w in e.waiters {
                let _ = w.send(Outcome::Denied(why.to_owned()));
            }
            Self::remember(&mut t, id.to_owned(), Done::Denied);
        }
        drop(t);
        self.tick.send_modify(|s| *s += 1);
    }

    /// Denies everything pending (toolsrv is stopping).
    pub fn deny_all(&self, why: &str) {
        let mut t = lock(&self.table);
        let ids: Vec<String> = t.pending.keys().cloned().collect();
        for id in ids {
            if let Some(e) = t.pending.remove(&id) {
                for w in e.waiters {
                    let _ = w.send(Outcome::Denied(why.to_owned()));
                }
                Self::remember(&mut t, id, Done::Denied);
            }
        }
    }

    /// Requests pending now.
    pub fn pending_count(&self) -> usize {
        lock(&self.table).pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(agent: &str, digest: &str) -> Ask {
        let mut fields = serde_json::Map::new();
        fields.insert("agent".into(), Value::from(agent));
        fields.insert("argv".into(), serde_json::json!(["curl", "x\u{202e}y"]));
        Ask {
            agent: agent.into(),
            digest: digest.into(),
            fields,
        }
    }

    fn waiting(a: Asked) -> (String, oneshot::Receiver<Outcome>) {
        match a {
            Asked::Waiting(id, rx) => (id, rx),
            Asked::PreApproved => panic!("pre-approved"),
        }
    }

    fn verdict(id: &str, approve: bool, scope: bool) -> Resolve {
        Resolve {
            id: id.into(),
            verdict: if approve {
                Verdict::Approve {
                    session_scope: scope,
                }
            } else {
                Verdict::Deny {
                    message: "no".into(),
                }
            },
        }
    }

    #[tokio::test]
    async fn approve_once_then_the_id_is_used() {
        let b = Broker::default();
        let (id, rx) = waiting(b.ask(ask("a", "d1")).unwrap());
        assert_eq!(id.len(), 32);
        let mut seen = HashSet::new();
        let shown = b.next_pending(&mut seen).await;
        let v: Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(v["id"], id.as_str());
        assert!(v["expires"].is_string() && v["created"].is_string());
        assert!(
            shown.contains("\\\\u{202E}") || shown.contains("\\u{202E}"),
            "{shown}"
        );
        assert!(!shown.contains('\u{202e}'), "{shown}");
        assert_eq!(b.resolve(verdict(&id, true, false)).unwrap(), "approved\n");
        assert_eq!(b.wait(&id, rx).await, Outcome::Approved);
        let e = b.resolve(verdict(&id, true, false)).unwrap_err();
        assert!(e.contains("already answered"), "{e}");
        let e = b
            .resolve(verdict(&"0".repeat(32), true, false))
            .unwrap_err();
        assert!(e.starts_with("no request"), "{e}");
        // Without scope, the same request asks again.
        assert!(matches!(b.ask(ask("a", "d1")).unwrap(), Asked::Waiting(..)));
    }

    #[tokio::test]
    async fn deny_carries_the_message_and_scope_session_remembers() {
        let b = Broker::default();
        let (id, rx) = waiting(b.ask(ask("a", "d1")).unwrap());
        b.resolve(verdict(&id, false, false)).unwrap();
        assert_eq!(b.wait(&id, rx).await, Outcome::Denied("no".into()));
        let (id, rx) = waiting(b.ask(ask("a", "d2")).unwrap());
        b.resolve(verdict(&id, true, true)).unwrap();
        assert_eq!(b.wait(&id, rx).await, Outcome::Approved);
        assert!(matches!(b.ask(ask("a", "d2")).unwrap(), Asked::PreApproved));
        assert!(matches!(b.ask(ask("a", "d3")).unwrap(), Asked::Waiting(..)));
    }

    #[tokio::test]
    async fn the_deadline_denies_and_late_answers_are_refused() {
        let b = Broker::default();
        b.set_deadline(Duration::from_millis(50));
        let (id, rx) = waiting(b.ask(ask("a", "d1")).unwrap());
        assert_eq!(b.wait(&id, rx).await, Outcome::Expired);
        let e = b.resolve(verdict(&id, true, false)).unwrap_err();
        assert!(e.contains("expired"), "{e}");
        assert_eq!(b.pending_count(), 0);
    }

    #[tokio::test]
    async fn floods_are_bounded_and_duplicates_join() {
        let b = Broker::default();
        let mut ids = Vec::new();
        for i in 0..MAX_PENDING_PER_AGENT {
            ids.push(waiting(b.ask(ask("a", &format!("d{i}"))).unwrap()));
        }
        let e = b.ask(ask("a", "another")).err().unwrap();
        assert!(
            e.contains("limit 4") && e.contains("nothing was run"),
            "{e}"
        );
        // An identical request joins the pending one: one answer decides both.
        let (id2, rx2) = waiting(b.ask(ask("a", "d0")).unwrap());
        assert_eq!(id2, ids[0].0);
        assert_eq!(b.pending_count(), MAX_PENDING_PER_AGENT);
        b.resolve(verdict(&id2, false, false)).unwrap();
        let (id0, rx0) = ids.remove(0);
        assert_eq!(b.wait(&id0, rx0).await, Outcome::Denied("no".into()));
        assert_eq!(b.wait(&id2, rx2).await, Outcome::Denied("no".into()));
        // The session-wide bound, across agents.
        for i in 0..MAX_PENDING {
            let _ = b.ask(ask(&format!("agent{i}"), "x"));
        }
        assert_eq!(b.pending_count(), MAX_PENDING);
        let e = b.ask(ask("late", "y")).err().unwrap();
        assert!(e.contains("in this session"), "{e}");
    }

    #[tokio::test]
    async fn each_reader_sees_each_request_once_and_blocks_for_the_next() {
        let b = Arc::new(Broker::default());
        let (id1, _rx1) = waiting(b.ask(ask("a", "d1")).unwrap());
        let mut seen = HashSet::new();
        let first = b.next_pending(&mut seen).await;
        assert!(first.contains(&id1));
        let b2 = Arc::clone(&b);
        let next = tokio::spawn(async move {
            let mut seen = seen;
            b2.next_pending(&mut seen).await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !next.is_finished(),
            "a second read returned the same request"
        );
        let (id2, _rx2) = waiting(b.ask(ask("a", "d2")).unwrap());
        let second = next.await.unwrap();
        assert!(second.contains(&id2), "{second}");
        // Another reader sees both.
        let mut other = HashSet::new();
        assert!(b.next_pending(&mut other).await.contains(&id1));
        assert!(b.next_pending(&mut other).await.contains(&id2));
    }

    #[tokio::test]
    async fn stopping_denies_everything_pending() {
        let b = Broker::default();
        let (id, rx) = waiting(b.ask(ask("a", "d1")).unwrap());
        b.deny_all("toolsrv is stopping");
        assert_eq!(
            b.wait(&id, rx).await,
            Outcome::Denied("toolsrv is stopping".into())
        );
    }
}
