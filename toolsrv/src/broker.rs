//! The bypass broker: escalation requests waiting for a human.
//!
//! A tool call that asks for more than its policy allows (and may ask for it) becomes a
//! request: a random 128-bit single-use id, the exact execution it is bound to, the grants,
//! the reason, a deadline. The call waits (nothing has run) until the operator answers on
//! `bypass/resolve`, the deadline passes (denied), or toolsrv goes away (denied: the call's
//! read fails).
//!
//! - `bypass/pending` readers see each request once per fid, as one JSON object whose strings
//!   are display-escaped and bounded ([`ollie_link::bypass::display_bounded_json`]: a string
//!   over 1024 characters shows its head and tail around `\[… N characters hidden …]`), with
//!   `request_bytes` and `request_sha256`: the length and SHA-256 of the exact request (its
//!   compact JSON, unescaped). `bypass/full` shows that request whole, display-escaped, to
//!   whoever writes its id: `display_unescape` of it gives back the bytes the hash covers.
//! - `resolve` takes the strict verdict of [`ollie_link::bypass::parse_resolve_at`] (whole, in
//!   one write at offset 0); unknown, expired and used ids are errors; answers after the
//!   deadline are refused. The operator's denial message reaches the agent display-escaped.
//! - `"scope":"session"` remembers the approval for requests with the same binding digest
//!   (byte-identical: same agent, tool, argv, cwd, environment, executable and script hashes,
//!   grants) for the rest of this toolsrv's life.
//! - Flood control: at most [`MAX_PENDING_PER_AGENT`] pending per agent and
//!   [`MAX_PENDING`] per session; more are refused at once (the caller gets an error and
//!   nothing reaches the human). A request identical to one already pending joins it (one
//!   answer decides both). A request identical to one the operator denied less than
//!   [`DENIAL_MEMO`] ago is refused at once with the operator's message (no retry loop).
//! - `bypass/log` readers see every event the operator does not see on `pending` — requests
//!   refused at once, joined, withdrawn, expired, voided, run under a session-scope approval,
//!   and every escalated run's end — as JSON lines (see [`Broker::log`]). olliesrv reads it
//!   into the audit log. Refusals and joins are rate-limited per agent
//!   ([`NOISE_PER_WINDOW`] per [`NOISE_WINDOW`]); the rest are counted and the count is
//!   logged, so a flood cannot flood the audit log either.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
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
/// A request identical (same binding digest) to one the operator denied this recently is
/// refused without asking again.
pub const DENIAL_MEMO: Duration = Duration::from_secs(60);
/// Events `bypass/log` keeps for readers that have not caught up.
const MAX_EVENTS: usize = 4096;
/// Refusals and joins logged per agent in one [`NOISE_WINDOW`]; more are only counted.
pub const NOISE_PER_WINDOW: u32 = 16;
/// See [`NOISE_PER_WINDOW`].
pub const NOISE_WINDOW: Duration = Duration::from_secs(10);

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
    /// What `pending` shows: bounded, with `request_bytes` and `request_sha256`.
    shown: Arc<String>,
    /// What `full` shows: the whole request, display-escaped.
    full: Arc<String>,
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
    /// Digests the operator denied: when, and their message.
    denied: HashMap<String, (Instant, String)>,
}

/// The event log behind `bypass/log`.
struct Log {
    /// Sequence number of `events[0]` (the first event ever is 1).
    first: u64,
    events: VecDeque<Arc<String>>,
    /// Per agent: the rate limit of refusals and joins.
    noise: HashMap<String, Noise>,
}

impl Default for Log {
    fn default() -> Log {
        Log {
            first: 1,
            events: VecDeque::new(),
            noise: HashMap::new(),
        }
    }
}

struct Noise {
    since: Instant,
    logged: u32,
    suppressed: u64,
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
    log: Mutex<Log>,
    log_tick: watch::Sender<u64>,
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
            log: Mutex::new(Log::default()),
            log_tick: watch::Sender::new(0),
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
            drop(t);
            let mut f = Self::summary(&ask.fields);
            f.insert("digest".into(), Value::from(ask.digest.clone()));
            self.log("pre-approved", f);
            return Ok(Asked::PreApproved);
        }
        let (tx, rx) = oneshot::channel();
        if let Some((id, e)) = t
            .pending
            .iter_mut()
            .find(|(_, e)| e.digest == ask.digest && e.agent == ask.agent)
        {
            e.waiters.push(tx);
            let id = id.clone();
            drop(t);
            let mut f = serde_json::Map::new();
            f.insert("id".into(), Value::from(id.clone()));
            f.insert("agent".into(), Value::from(ask.agent.clone()));
            self.log_noisy(&ask.agent, "joined", f);
            return Ok(Asked::Waiting(id, rx));
        }
        let refused = |t: &Table| -> Option<String> {
            if let Some((when, msg)) = t.denied.get(&ask.digest)
                && when.elapsed() < DENIAL_MEMO
            {
                return Some(format!(
                    "escalation refused: the operator denied this exact request {} s ago ({}); it is not asked again within {} s; nothing was run",
                    when.elapsed().as_secs(),
                    ollie_link::bypass::display_escape(msg),
                    DENIAL_MEMO.as_secs()
                ));
            }
            None
        };
        if let Some(why) = refused(&t).or_else(|| {
            let mine = t.pending.values().filter(|e| e.agent == ask.agent).count();
            (mine >= MAX_PENDING_PER_AGENT || t.pending.len() >= MAX_PENDING)
                .then(|| self.full_text(mine, t.pending.len()))
        }) {
            drop(t);
            self.refused(&ask, &why);
            return Err(why);
        }
        let id = match ollie_link::bypass::new_request_id() {
            Ok(id) => id,
            Err(e) => {
                drop(t);
                let why = format!("escalation refused: no randomness for a request id: {e}");
                self.refused(&ask, &why);
                return Err(why);
            }
        };
        let deadline = self.deadline();
        let now = SystemTime::now();
        let mut fields = ask.fields;
        fields.insert("digest".into(), Value::from(ask.digest.clone()));
        fields.insert("id".into(), Value::from(id.clone()));
        fields.insert("created".into(), Value::from(rfc3339(now)));
        fields.insert("expires".into(), Value::from(rfc3339(now + deadline)));
        let (shown, full) = Self::shown(fields);
        t.seq += 1;
        let seq = t.seq;
        t.pending.insert(
            id.clone(),
            Entry {
                seq,
                agent: ask.agent,
                digest: ask.digest,
                shown: Arc::new(shown),
                full: Arc::new(full),
                deadline: Instant::now() + deadline,
                waiters: vec![tx],
            },
        );
        drop(t);
        self.tick.send_modify(|s| *s += 1);
        Ok(Asked::Waiting(id, rx))
    }

    /// What `pending` and `full` show of a request with these fields. The request itself is
    /// `raw`, their compact JSON (serde_json's escapes only, so it may hold any character):
    /// `full` is `display_escape(raw)` and a newline; `pending` is the fields escaped and
    /// bounded ([`ollie_link::bypass::display_bounded_json`]) with `request_bytes` (the length
    /// of `raw`) and `request_sha256` (its SHA-256) added, and a newline.
    fn shown(fields: serde_json::Map<String, Value>) -> (String, String) {
        let v = Value::Object(fields);
        let raw = v.to_string();
        let mut shown = match ollie_link::bypass::display_bounded_json(&v) {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        shown.insert("request_bytes".into(), Value::from(raw.len()));
        shown.insert(
            "request_sha256".into(),
            Value::from(ollie_link::bypass::sha256_hex(raw.as_bytes())),
        );
        (
            format!("{}\n", Value::Object(shown)),
            format!("{}\n", ollie_link::bypass::display_escape(&raw)),
        )
    }

    /// The whole request `id` as `bypass/full` shows it (see `Broker::shown`), while it is
    /// pending.
    pub fn full_request(&self, id: &str) -> Result<Arc<String>, String> {
        let mut t = lock(&self.table);
        self.expire(&mut t);
        if let Some(e) = t.pending.get(id) {
            return Ok(Arc::clone(&e.full));
        }
        Err(match t.done.get(id) {
            Some(_) => format!("request {id} is no longer pending"),
            None => format!("no request {id}"),
        })
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
        for (id, agent) in Self::take_expired(t) {
            let mut f = serde_json::Map::new();
            f.insert("id".into(), Value::from(id));
            f.insert("agent".into(), Value::from(agent));
            f.insert("verdict".into(), Value::from("denied"));
            f.insert(
                "why".into(),
                Value::from("no answer from the operator before the deadline"),
            );
            self.log("expired", f);
        }
    }

    fn take_expired(t: &mut Table) -> Vec<(String, String)> {
        let mut out = Vec::new();
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
                Self::remember(t, id.clone(), Done::Expired);
                out.push((id, e.agent));
            }
        }
        out
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
            Verdict::Deny { message } => {
                if t.denied.len() >= MAX_DONE {
                    t.denied.retain(|_, (when, _)| when.elapsed() < DENIAL_MEMO);
                }
                if t.denied.len() < MAX_DONE {
                    t.denied
                        .insert(e.digest.clone(), (Instant::now(), message.clone()));
                }
                (Outcome::Denied(message), Done::Denied, "denied\n")
            }
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
        let gone = t.pending.remove(id);
        if gone.is_some() {
            Self::remember(&mut t, id.to_owned(), Done::Denied);
        }
        drop(t);
        if let Some(e) = gone {
            for w in e.waiters {
                let _ = w.send(Outcome::Denied(why.to_owned()));
            }
            let mut f = serde_json::Map::new();
            f.insert("id".into(), Value::from(id));
            f.insert("agent".into(), Value::from(e.agent));
            f.insert("why".into(), Value::from(why));
            self.log("withdrawn", f);
        }
        self.tick.send_modify(|s| *s += 1);
    }

    /// Denies everything pending (toolsrv is stopping).
    pub fn deny_all(&self, why: &str) {
        let mut t = lock(&self.table);
        let ids: Vec<String> = t.pending.keys().cloned().collect();
        let mut gone = Vec::new();
        for id in ids {
            if let Some(e) = t.pending.remove(&id) {
                for w in e.waiters {
                    let _ = w.send(Outcome::Denied(why.to_owned()));
                }
                Self::remember(&mut t, id.clone(), Done::Denied);
                gone.push((id, e.agent));
            }
        }
        drop(t);
        for (id, agent) in gone {
            let mut f = serde_json::Map::new();
            f.insert("id".into(), Value::from(id));
            f.insert("agent".into(), Value::from(agent));
            f.insert("verdict".into(), Value::from("denied"));
            f.insert("why".into(), Value::from(why));
            self.log("denied", f);
        }
    }

    /// Why a new request of `agent` would be refused by the flood bounds right now, if it
    /// would. Checked before the costly binding, so a flood costs no hashing; a request
    /// identical to a pending one then is refused rather than joined.
    pub fn full(&self, agent: &str) -> Option<String> {
        let t = lock(&self.table);
        let mine = t.pending.values().filter(|e| e.agent == agent).count();
        (mine >= MAX_PENDING_PER_AGENT || t.pending.len() >= MAX_PENDING)
            .then(|| self.full_text(mine, t.pending.len()))
    }

    fn full_text(&self, mine: usize, all: usize) -> String {
        if mine >= MAX_PENDING_PER_AGENT {
            format!(
                "escalation refused: {mine} requests of this agent are already waiting for the operator (limit {MAX_PENDING_PER_AGENT}); nothing was run"
            )
        } else {
            format!(
                "escalation refused: {all} requests are already waiting for the operator in this session (limit {MAX_PENDING}); nothing was run"
            )
        }
    }

    /// Requests pending now.
    pub fn pending_count(&self) -> usize {
        lock(&self.table).pending.len()
    }

    /// What a log line says about a request: its fields without the environment (the
    /// digest covers it) and without the display-only times.
    pub fn summary(fields: &serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
        fields
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "env" | "created" | "expires"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Logs a request refused without reaching the operator (rate-limited per agent).
    fn refused(&self, ask: &Ask, why: &str) {
        let mut f = Self::summary(&ask.fields);
        f.insert("digest".into(), Value::from(ask.digest.clone()));
        f.insert("verdict".into(), Value::from("denied"));
        f.insert("why".into(), Value::from(why));
        self.log_noisy(&ask.agent, "refused", f);
    }

    /// Appends one event to `bypass/log`: `{"event": EVENT, "time": …, FIELDS…}`. Strings are
    /// display-escaped and bounded like `pending`, so the log can be shown as is.
    pub fn log(&self, event: &str, mut fields: serde_json::Map<String, Value>) {
        fields.insert("event".into(), Value::from(event));
        fields.insert("time".into(), Value::from(rfc3339(SystemTime::now())));
        let line = format!(
            "{}\n",
            ollie_link::bypass::display_bounded_json(&Value::Object(fields))
        );
        let mut l = lock(&self.log);
        l.events.push_back(Arc::new(line));
        while l.events.len() > MAX_EVENTS {
            l.events.pop_front();
            l.first += 1;
        }
        drop(l);
        self.log_tick.send_modify(|s| *s += 1);
    }

    /// [`Broker::log`] for events an agent can cause at will (refusals, joins): at most
    /// [`NOISE_PER_WINDOW`] per agent per [`NOISE_WINDOW`]. The first one over the limit
    /// logs a `suppressed` event; the next one logged carries `"suppressed": N`, the count
    /// of those not logged.
    pub fn log_noisy(&self, agent: &str, event: &str, mut fields: serde_json::Map<String, Value>) {
        let now = Instant::now();
        let (log_it, first_suppressed, suppressed) = {
            let mut l = lock(&self.log);
            if l.noise.len() > MAX_DONE && !l.noise.contains_key(agent) {
                l.noise.retain(|_, n| n.since.elapsed() < NOISE_WINDOW);
            }
            let n = l.noise.entry(agent.to_owned()).or_insert(Noise {
                since: now,
                logged: 0,
                suppressed: 0,
            });
            if now.duration_since(n.since) >= NOISE_WINDOW {
                n.since = now;
                n.logged = 0;
            }
            if n.logged < NOISE_PER_WINDOW {
                n.logged += 1;
                let s = std::mem::take(&mut n.suppressed);
                (true, false, s)
            } else {
                n.suppressed += 1;
                (false, n.suppressed == 1, 0)
            }
        };
        if log_it {
            if suppressed > 0 {
                fields.insert("suppressed".into(), Value::from(suppressed));
            }
            self.log(event, fields);
        } else if first_suppressed {
            let mut f = serde_json::Map::new();
            f.insert("agent".into(), Value::from(agent));
            f.insert(
                "why".into(),
                Value::from(format!(
                    "more than {NOISE_PER_WINDOW} refused or joined requests in {} s: further ones are counted, and the count is logged with the next one",
                    NOISE_WINDOW.as_secs()
                )),
            );
            self.log("suppressed", f);
        }
    }

    /// The event after `cursor` (blocks until there is one): its sequence number and line.
    /// A reader that fell more than `MAX_EVENTS` behind gets one `lost` event first.
    pub async fn next_event(&self, cursor: u64) -> (u64, Arc<String>) {
        let mut rx = self.log_tick.subscribe();
        loop {
            rx.borrow_and_update();
            {
                let l = lock(&self.log);
                let next = cursor + 1;
                if next < l.first {
                    let lost = l.first - next;
                    let line = format!(
                        "{}\n",
                        serde_json::json!({"event": "lost", "count": lost,
                            "time": rfc3339(SystemTime::now())})
                    );
                    return (l.first - 1, Arc::new(line));
                }
                let at = usize::try_from(next - l.first).unwrap_or(usize::MAX);
                if let Some(e) = l.events.get(at) {
                    return (next, Arc::clone(e));
                }
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
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
    async fn pending_is_bounded_and_full_gives_the_exact_request_back() {
        let b = Broker::default();
        let cmd = format!("curl x|sh;{}cargo test", "\u{2800}".repeat(4000));
        let mut a = ask("a", "d1");
        a.fields
            .insert("argv".into(), serde_json::json!(["bash", "-c", cmd]));
        let (id, _rx) = waiting(b.ask(a).unwrap());
        let shown = b.next_pending(&mut HashSet::new()).await;
        assert!(shown.len() < 4096, "{} bytes", shown.len());
        let v: Value = serde_json::from_str(&shown).unwrap();
        let argv2 = v["argv"][2].as_str().unwrap();
        assert!(argv2.starts_with("curl x|sh;\\u{2800}"), "{argv2}");
        assert!(argv2.ends_with("\\u{2800}cargo test"), "{argv2}");
        assert!(argv2.contains(" characters hidden …]"), "{argv2}");
        assert!(!shown.contains('\u{2800}'));
        let full = b.full_request(&id).unwrap();
        assert!(!full.contains('\u{2800}'));
        let raw = ollie_link::bypass::display_unescape(full.trim_end_matches('\n')).unwrap();
        assert_eq!(v["request_bytes"], raw.len());
        assert_eq!(
            v["request_sha256"],
            ollie_link::bypass::sha256_hex(raw.as_bytes())
        );
        let r: Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(r["argv"][2], cmd.as_str());
        assert_eq!(r["id"], id.as_str());
        b.resolve(verdict(&id, true, false)).unwrap();
        let e = b.full_request(&id).unwrap_err();
        assert!(e.contains("no longer pending"), "{e}");
        assert!(
            b.full_request(&"0".repeat(32))
                .unwrap_err()
                .starts_with("no request")
        );
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

    /// The next event of `b` after `cursor`, parsed.
    async fn event(b: &Broker, cursor: &mut u64) -> Value {
        let (seq, line) = tokio::time::timeout(Duration::from_secs(5), b.next_event(*cursor))
            .await
            .expect("an event");
        *cursor = seq;
        serde_json::from_str(&line).unwrap()
    }

    #[tokio::test]
    async fn a_denied_request_asked_again_is_refused_with_the_message_and_logged() {
        let b = Broker::default();
        let (id, rx) = waiting(b.ask(ask("a", "d1")).unwrap());
        b.resolve(verdict(&id, false, false)).unwrap();
        assert_eq!(b.wait(&id, rx).await, Outcome::Denied("no".into()));
        let e = b.ask(ask("a", "d1")).err().unwrap();
        assert!(
            e.contains("denied this exact request") && e.contains("(no)"),
            "{e}"
        );
        assert_eq!(b.pending_count(), 0);
        // Another command is asked normally.
        assert!(matches!(b.ask(ask("a", "d2")).unwrap(), Asked::Waiting(..)));
        let mut cursor = 0;
        let ev = event(&b, &mut cursor).await;
        assert_eq!(ev["event"], "refused", "{ev}");
        assert_eq!(ev["digest"], "d1");
        assert_eq!(ev["agent"], "a");
        assert!(ev["why"].as_str().unwrap().contains("denied this exact"));
        assert!(ev["time"].is_string());
    }

    #[tokio::test]
    async fn the_log_holds_joins_expiries_withdrawals_and_pre_approvals() {
        let b = Broker::default();
        let (id, _rx) = waiting(b.ask(ask("a", "d1")).unwrap());
        let (same, _rx2) = waiting(b.ask(ask("a", "d1")).unwrap());
        assert_eq!(same, id);
        b.withdraw(&id, "the call was stopped");
        let (id2, rx2) = waiting(b.ask(ask("a", "d2")).unwrap());
        b.resolve(verdict(&id2, true, true)).unwrap();
        assert_eq!(b.wait(&id2, rx2).await, Outcome::Approved);
        assert!(matches!(b.ask(ask("a", "d2")).unwrap(), Asked::PreApproved));
        b.set_deadline(Duration::from_millis(30));
        let (id3, rx3) = waiting(b.ask(ask("a", "d3")).unwrap());
        assert_eq!(b.wait(&id3, rx3).await, Outcome::Expired);
        let mut cursor = 0;
        let kinds: Vec<(String, String)> = {
            let mut v = Vec::new();
            for _ in 0..4 {
                let ev = event(&b, &mut cursor).await;
                v.push((
                    ev["event"].as_str().unwrap().to_owned(),
                    ev["id"].as_str().unwrap_or("").to_owned(),
                ));
            }
            v
        };
        assert_eq!(
            kinds,
            vec![
                ("joined".into(), id.clone()),
                ("withdrawn".into(), id.clone()),
                ("pre-approved".into(), String::new()),
                ("expired".into(), id3.clone()),
            ]
        );
        // Nothing more: the next read waits.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), b.next_event(cursor))
                .await
                .is_err()
        );
        // A new reader starts at the oldest event kept.
        let mut fresh = 0;
        assert_eq!(event(&b, &mut fresh).await["event"], "joined");
    }

    #[tokio::test]
    async fn a_flood_of_refusals_is_counted_not_logged_one_by_one() {
        let b = Broker::default();
        for i in 0..MAX_PENDING_PER_AGENT {
            let _ = waiting(b.ask(ask("a", &format!("d{i}"))).unwrap());
        }
        let flood = 1000;
        for i in 0..flood {
            assert!(b.ask(ask("a", &format!("x{i}"))).is_err());
        }
        assert_eq!(b.pending_count(), MAX_PENDING_PER_AGENT);
        let mut cursor = 0;
        let mut refused = 0;
        let mut suppressed_events = 0;
        loop {
            match tokio::time::timeout(Duration::from_millis(100), b.next_event(cursor)).await {
                Err(_) => break,
                Ok((seq, line)) => {
                    cursor = seq;
                    let ev: Value = serde_json::from_str(&line).unwrap();
                    match ev["event"].as_str().unwrap() {
                        "refused" => refused += 1,
                        "suppressed" => suppressed_events += 1,
                        other => panic!("unexpected {other}"),
                    }
                }
            }
        }
        assert_eq!(refused, NOISE_PER_WINDOW);
        assert_eq!(suppressed_events, 1);
        // Another agent is not silenced by the first one's flood.
        assert!(b.ask(ask("b", "y")).is_ok());
    }

    #[tokio::test]
    async fn a_reader_that_fell_behind_is_told_how_much_it_lost() {
        let b = Broker::default();
        for i in 0..(MAX_EVENTS + 10) {
            let mut f = serde_json::Map::new();
            f.insert("n".into(), Value::from(i));
            b.log("test", f);
        }
        let mut cursor = 0;
        let ev = event(&b, &mut cursor).await;
        assert_eq!(ev["event"], "lost");
        assert_eq!(ev["count"], 10);
        let ev = event(&b, &mut cursor).await;
        assert_eq!(ev["n"], 10);
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
