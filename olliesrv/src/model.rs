//! Sessions and agents: the live objects behind `session/…`, their state, and the rules for
//! changing them (names, cfg, prompts, feed, chat). Every change that must survive a restart
//! goes to the [`Store`] before it is acknowledged.
//!
//! Fids hold `Arc`s of these objects, so a rename never invalidates an open fid; a killed
//! object answers "file does not exist" and ends its blocking reads.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Map, Value};
use tokio::sync::{Notify, watch};

use crate::config::Config;
use crate::events::Events;
use crate::link::ToolLink;
use crate::ns::NsHome;
use crate::store::{AgentRecord, SessionRecord, Store, Sync};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn read<T: Clone>(m: &RwLock<T>) -> T {
    m.read()
        .map_or_else(|p| p.into_inner().clone(), |g| g.clone())
}

fn write<T>(m: &RwLock<T>, v: T) {
    match m.write() {
        Ok(mut g) => *g = v,
        Err(p) => *p.into_inner() = v,
    }
}

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A new random (v4) UUID.
pub fn new_uuid() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        // No randomness is not worth dying for here: ids only need to be unique.
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b = t.to_le_bytes();
        b[15] ^= std::process::id() as u8;
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Names that cannot be a session or agent name (they are files beside them).
const RESERVED: &[&str] = &["new", "idx", ".", ".."];

/// Session and agent names: 1–64 bytes of `A-Z a-z 0-9 . _ -`, not starting with `.` or
/// `-`, not a reserved file name.
pub fn validate_name(n: &str) -> Result<(), String> {
    if n.is_empty() || n.len() > 64 {
        return Err(format!(
            "invalid name {:?}: 1 to 64 characters of A-Z a-z 0-9 . _ -",
            clip(n)
        ));
    }
    if RESERVED.contains(&n)
        || n.starts_with('.')
        || n.starts_with('-')
        || !n
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "invalid name {:?}: use A-Z a-z 0-9 . _ -, not starting with . or -, not new or idx",
            clip(n)
        ));
    }
    Ok(())
}

/// At most 60 characters of `s`, escaped, for error messages.
pub fn clip(s: &str) -> String {
    ollie_link::text::clip(s, 60).escape_debug().to_string()
}

// ---------------------------------------------------------------------------------------
// Chat

#[derive(Debug, Default)]
struct ChatInner {
    raw: Vec<u8>,
    text: Vec<u8>,
    closed: bool,
}

/// An agent's conversation as two append-only streams: `chat.raw` (with block markers) and
/// `chat` (the same without marker lines). Reads at the end wait for more; EOF once closed.
#[derive(Debug)]
pub struct Chat {
    inner: Mutex<ChatInner>,
    tick: watch::Sender<u64>,
}

/// Which chat stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatKind {
    Raw,
    Text,
}

impl Chat {
    fn new() -> Chat {
        Chat {
            inner: Mutex::new(ChatInner::default()),
            tick: watch::Sender::new(0),
        }
    }

    /// Restores from `chat.raw` bytes.
    fn restore(&self, raw: Vec<u8>) {
        let text = strip_markers(&raw);
        let mut c = lock(&self.inner);
        c.raw = raw;
        c.text = text;
    }

    /// One whole block: `[[[kind attrs` / body / `]]]`. Returns the raw bytes appended.
    pub fn block_bytes(kind: &str, attrs: &str, body: &str) -> (Vec<u8>, Vec<u8>) {
        let mut body = body.to_owned();
        if !body.ends_with('\n') {
            body.push('\n');
        }
        // A body line that looks like a marker would be misread: indent it by one space.
        let body: String = body
            .split_inclusive('\n')
            .map(|l| {
                if is_marker(l.trim_end_matches('\n').as_bytes()) {
                    format!(" {l}")
                } else {
                    l.to_owned()
                }
            })
            .collect();
        let head = if attrs.is_empty() {
            format!("[[[{kind}\n")
        } else {
            format!("[[[{kind} {attrs}\n")
        };
        let raw = format!("{head}{body}]]]\n").into_bytes();
        (raw, body.into_bytes())
    }

    fn append(&self, raw: &[u8], text: &[u8]) {
        let mut c = lock(&self.inner);
        if c.closed {
            return;
        }
        c.raw.extend_from_slice(raw);
        c.text.extend_from_slice(text);
        let n = c.raw.len() as u64;
        drop(c);
        self.tick.send_replace(n);
    }

    fn close(&self) {
        lock(&self.inner).closed = true;
        self.tick.send_modify(|v| *v += 1);
    }

    /// Current length of a stream.
    pub fn len(&self, kind: ChatKind) -> u64 {
        let c = lock(&self.inner);
        match kind {
            ChatKind::Raw => c.raw.len() as u64,
            ChatKind::Text => c.text.len() as u64,
        }
    }

    /// Up to `count` bytes at `offset`; at the end, waits for more (empty = EOF, closed).
    pub async fn read(&self, kind: ChatKind, offset: u64, count: u32) -> Bytes {
        let mut rx = self.tick.subscribe();
        loop {
            rx.borrow_and_update();
            {
                let c = lock(&self.inner);
                let buf = match kind {
                    ChatKind::Raw => &c.raw,
                    ChatKind::Text => &c.text,
                };
                let off = usize::try_from(offset).unwrap_or(usize::MAX);
                if off < buf.len() {
                    let end = off.saturating_add(count as usize).min(buf.len());
                    return Bytes::copy_from_slice(&buf[off..end]);
                }
                if c.closed {
                    return Bytes::new();
                }
            }
            if rx.changed().await.is_err() {
                return Bytes::new();
            }
        }
    }

    /// The last `n` bytes of the raw stream, starting at a line boundary where possible.
    pub fn tail(&self, n: usize) -> Bytes {
        let c = lock(&self.inner);
        let start = c.raw.len().saturating_sub(n);
        let mut s = start;
        if start > 0
            && let Some(p) = c.raw[start..].iter().position(|b| *b == b'\n')
        {
            s = start + p + 1;
        }
        Bytes::copy_from_slice(&c.raw[s..])
    }
}

fn is_marker(line: &[u8]) -> bool {
    line.starts_with(b"[[[") || line == b"]]]"
}

/// `chat.raw` without its marker lines.
pub fn strip_markers(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    for line in raw.split_inclusive(|b| *b == b'\n') {
        let bare = line.strip_suffix(b"\n").unwrap_or(line);
        if !is_marker(bare) {
            out.extend_from_slice(line);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Agents

/// What an agent is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentState {
    /// Waiting for a prompt.
    Idle,
    /// A turn is running.
    Running,
    /// The session is paused; queued prompts wait.
    Paused,
    /// The last turn failed (its error is in the chat); the next prompt runs normally.
    Error,
    /// The agent was killed.
    Killed,
}

impl AgentState {
    pub fn name(self) -> &'static str {
        match self {
            AgentState::Idle => "idle",
            AgentState::Running => "running",
            AgentState::Paused => "paused",
            AgentState::Error => "error",
            AgentState::Killed => "killed",
        }
    }
}

/// The keys of an agent's `cfg` (besides `name`, which has its own file).
pub const CFG_KEYS: &[&str] = &[
    "backend",
    "model",
    "profile",
    "cwd",
    "temperature",
    "max_tokens",
    "top_p",
    "max_steps",
    "context_limit",
];

/// Mutable settings of an agent.
#[derive(Debug, Clone, Default)]
pub struct AgentSettings {
    pub cwd: PathBuf,
    pub backend: Option<String>,
    pub model: Option<String>,
    pub profile: Option<String>,
    /// Other cfg keys (`temperature`, `max_tokens`, …), validated.
    pub cfg: BTreeMap<String, String>,
    /// The agent's tool set, if changed from its profile's.
    pub tools: Option<Vec<String>>,
}

/// Token and cost counters (`stats`).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub requests: u64,
    pub cost_usd: f64,
    pub context_tokens: u64,
    pub context_limit: u64,
    pub tool_calls: u64,
    pub turns: u64,
    pub errors: u64,
}

impl Stats {
    pub fn text(&self) -> String {
        format!(
            "tokens_in={}\ntokens_out={}\nrequests={}\ncost_usd={:.6}\ncontext_tokens={}\ncontext_limit={}\ntool_calls={}\nturns={}\nerrors={}\n",
            self.tokens_in,
            self.tokens_out,
            self.requests,
            self.cost_usd,
            self.context_tokens,
            self.context_limit,
            self.tool_calls,
            self.turns,
            self.errors
        )
    }

    fn to_map(&self) -> BTreeMap<String, String> {
        self.text()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    fn from_map(m: &BTreeMap<String, String>) -> Stats {
        let u = |k: &str| m.get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
        Stats {
            tokens_in: u("tokens_in"),
            tokens_out: u("tokens_out"),
            requests: u("requests"),
            cost_usd: m
                .get("cost_usd")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0),
            context_tokens: u("context_tokens"),
            context_limit: u("context_limit"),
            tool_calls: u("tool_calls"),
            turns: u("turns"),
            errors: u("errors"),
        }
    }
}

/// A chat block being streamed.
#[derive(Debug)]
pub struct Block {
    kind: String,
    raw: Vec<u8>,
    /// Redaction of the streamed text: the end that could begin an API key waits here.
    redact: crate::redact::Stream,
    /// The start of the current line while it could still be a marker.
    line: String,
    decided: bool,
    ends_line: bool,
}

/// How a turn ended (for `agent/new … prompt=`).
#[derive(Debug, Clone)]
pub struct TurnEnd {
    pub seq: u64,
    pub result: Result<String, String>,
}

/// One agent.
#[derive(Debug)]
pub struct Agent {
    /// Small number unique in this process (qid paths).
    pub handle: u32,
    pub id: String,
    pub session: Weak<Session>,
    pub session_id: String,
    pub created: u64,
    order: u64,
    name: RwLock<String>,
    settings: Mutex<AgentSettings>,
    pub stats: Mutex<Stats>,
    queue: Mutex<VecDeque<String>>,
    /// The prompt of the turn in flight.
    in_turn: Mutex<Option<String>>,
    /// Why the `agent_spawn` hook blocked the agent: every turn fails with it.
    blocked: Mutex<Option<String>>,
    /// While running: what the turn is doing (`thinking`, `calling: TOOL`, `limitretry`, …).
    detail: Mutex<String>,
    /// The chat block being streamed, if any.
    streaming: Mutex<Option<Block>>,
    /// The backend this agent talks to, by name (created on first use).
    pub backend: tokio::sync::Mutex<Option<(String, Arc<dyn crate::backend::Backend>)>>,
    /// Held while the history is in use by a turn or a compaction.
    pub history_lock: tokio::sync::Mutex<()>,
    /// `ctl compact` arrived while a turn was running: compact before its next model call.
    pub compact_requested: std::sync::atomic::AtomicBool,
    /// The reader of toolsrv's `proc/complete` for this agent has been started.
    pub completions_watched: std::sync::atomic::AtomicBool,
    queue_bell: Notify,
    feed: watch::Sender<Option<Bytes>>,
    state: watch::Sender<(u64, AgentState)>,
    pub chat: Chat,
    plan: Mutex<Vec<u8>>,
    killed: watch::Sender<bool>,
    /// Bumped by `stop`: the running turn ends.
    stop: watch::Sender<u64>,
    /// The last finished turn.
    turns: watch::Sender<Option<TurnEnd>>,
    /// The agent's own bead namespace (forked from the session's at creation, [`crate::ns`]).
    pub ns: NsHome,
    store: Arc<Store>,
}

/// Largest `plan`.
pub const MAX_PLAN: usize = 1 << 20;
/// Largest prompt.
pub const MAX_PROMPT: usize = 1 << 20;
/// Largest `feed` value.
pub const MAX_FEED: usize = 1 << 20;
/// Prompts an agent may have queued.
pub const MAX_QUEUE: usize = 256;

impl Agent {
    pub fn name(&self) -> String {
        read(&self.name)
    }

    pub fn settings(&self) -> AgentSettings {
        lock(&self.settings).clone()
    }

    pub fn state(&self) -> (u64, AgentState) {
        *self.state.borrow()
    }

    pub fn is_killed(&self) -> bool {
        *self.killed.borrow()
    }

    /// A subscription to the agent's death.
    pub fn killed_signal(&self) -> watch::Receiver<bool> {
        self.killed.subscribe()
    }

    /// The state as `statewait` shows it: while a turn runs, what it is doing.
    pub fn state_text(&self) -> String {
        match self.state().1 {
            AgentState::Running => {
                let d = lock(&self.detail).clone();
                if d.is_empty() { "thinking".into() } else { d }
            }
            s => s.name().to_owned(),
        }
    }

    /// Streams text into a `kind` block of the chat (one block is open at a time: a
    /// different kind closes the open one first). [`Agent::stream_end`] closes it.
    pub fn stream(&self, kind: &str, text: &str) -> Result<(), String> {
        let mut open = lock(&self.streaming);
        if open.as_ref().is_some_and(|b| b.kind != kind)
            && let Some(b) = open.take()
        {
            self.close_block(b)?;
        }
        let b = open.get_or_insert_with(|| {
            let head = format!("[[[{kind}\n");
            self.chat.append(head.as_bytes(), b"");
            Block {
                kind: kind.to_owned(),
                raw: head.into_bytes(),
                redact: crate::redact::Stream::default(),
                line: String::new(),
                decided: false,
                ends_line: true,
            }
        });
        let text = b.redact.push(text);
        Self::stream_into(&self.chat, b, &text);
        Ok(())
    }

    /// Adds `text` to the streamed block `b` (and the live chat). A body line that would read
    /// as a marker is indented by one space, as in whole blocks.
    fn stream_into(chat: &Chat, b: &mut Block, text: &str) {
        let mut out = String::new();
        for c in text.chars() {
            if b.decided {
                out.push(c);
                if c == '\n' {
                    b.decided = false;
                }
                continue;
            }
            b.line.push(c);
            if c == '\n' {
                let l = std::mem::take(&mut b.line);
                if l == "]]]\n" {
                    out.push(' ');
                }
                out.push_str(&l);
            } else if b.line.chars().count() == 3 {
                if b.line == "[[[" || b.line == "]]]" {
                    out.push(' ');
                }
                out.push_str(&std::mem::take(&mut b.line));
                b.decided = true;
            }
        }
        if !out.is_empty() {
            b.ends_line = out.ends_with('\n');
            b.raw.extend_from_slice(out.as_bytes());
            chat.append(out.as_bytes(), out.as_bytes());
        }
    }

    /// Closes the streamed block, if one is open, and makes it durable.
    pub fn stream_end(&self) -> Result<(), String> {
        match lock(&self.streaming).take() {
            Some(b) => self.close_block(b),
            None => Ok(()),
        }
    }

    fn close_block(&self, mut b: Block) -> Result<(), String> {
        let rest = b.redact.finish();
        Self::stream_into(&self.chat, &mut b, &rest);
        let mut out = std::mem::take(&mut b.line);
        if out == "]]]" || out == "[[[" {
            out.insert(0, ' ');
        }
        if !out.is_empty() {
            b.ends_line = out.ends_with('\n');
        }
        if !b.ends_line {
            out.push('\n');
        }
        b.raw.extend_from_slice(out.as_bytes());
        b.raw.extend_from_slice(b"]]]\n");
        self.chat
            .append(format!("{out}]]]\n").as_bytes(), out.as_bytes());
        self.store
            .append_chat(&self.session_id, &self.id, &b.raw, Sync::Now)
            .map_err(|e| crate::error_chain(&e))
    }

    fn record(&self) -> AgentRecord {
        let s = self.settings();
        AgentRecord {
            id: self.id.clone(),
            session: self.session_id.clone(),
            name: self.name(),
            cwd: s.cwd,
            backend: s.backend,
            model: s.model,
            profile: s.profile,
            cfg: s.cfg,
            created: self.created,
            order: self.order,
            stats: lock(&self.stats).to_map(),
            tools: s.tools,
            queue: lock(&self.queue).iter().cloned().collect(),
            in_turn: lock(&self.in_turn).clone(),
            blocked: lock(&self.blocked).clone(),
        }
    }

    /// Why the `agent_spawn` hook blocked the agent, if it did.
    pub fn blocked(&self) -> Option<String> {
        lock(&self.blocked).clone()
    }

    /// Records that the `agent_spawn` hook blocked the agent (kept across restarts).
    pub fn block(&self, reason: &str) -> Result<(), String> {
        *lock(&self.blocked) = Some(reason.to_owned());
        self.save()
    }

    /// Writes the agent's record to disk.
    pub fn save(&self) -> Result<(), String> {
        self.store
            .save_agent(&self.record())
            .map_err(|e| crate::error_chain(&e))
    }

    /// Sets the state; whether it changed.
    fn set_state(&self, st: AgentState) -> bool {
        self.state.send_if_modified(|(seq, s)| {
            if *s == st {
                return false;
            }
            *seq += 1;
            *s = st;
            true
        })
    }

    /// Appends a whole block to the chat, durably first.
    pub fn say(&self, kind: &str, attrs: &str, body: &str) -> Result<(), String> {
        self.say_sync(kind, attrs, body, Sync::Now)
    }

    /// [`Agent::say`], durable as `sync` says.
    /// Both are redacted ([`crate::redact`]): a tool call's arguments run as the model wrote
    /// them, but the chat shows them without API keys.
    pub fn say_sync(&self, kind: &str, attrs: &str, body: &str, sync: Sync) -> Result<(), String> {
        let attrs = crate::redact::redact(attrs);
        let body = crate::redact::redact(body);
        let (raw, text) = Chat::block_bytes(kind, &attrs, &body);
        self.store
            .append_chat(&self.session_id, &self.id, &raw, sync)
            .map_err(|e| crate::error_chain(&e))?;
        self.chat.append(&raw, &text);
        Ok(())
    }

    /// Queues a prompt (durably: the queue is part of the agent's record).
    pub fn enqueue(&self, prompt: String) -> Result<(), String> {
        if prompt.trim().is_empty() {
            return Err("empty prompt".into());
        }
        if prompt.len() > MAX_PROMPT {
            return Err(format!(
                "prompt is {} bytes; at most {MAX_PROMPT}",
                prompt.len()
            ));
        }
        if self.is_killed() {
            return Err("file does not exist: the agent was killed".into());
        }
        {
            let mut q = lock(&self.queue);
            if q.len() >= MAX_QUEUE {
                return Err(format!("too many queued prompts (limit {MAX_QUEUE})"));
            }
            q.push_back(prompt);
        }
        if let Err(e) = self.save() {
            lock(&self.queue).pop_back();
            return Err(e);
        }
        self.queue_bell.notify_one();
        Ok(())
    }

    /// `fifo` read: takes the next queued prompt out of the queue (empty when none).
    pub fn dequeue(&self) -> Result<Option<String>, String> {
        let p = lock(&self.queue).pop_front();
        if let Some(p) = &p
            && let Err(e) = self.save()
        {
            lock(&self.queue).push_front(p.clone());
            return Err(e);
        }
        Ok(p)
    }

    /// `feed` write: replaces the value; readers wake only if it differs.
    pub fn set_feed(&self, v: Bytes) -> Result<(), String> {
        if v.len() > MAX_FEED {
            return Err(format!(
                "feed value is {} bytes; at most {MAX_FEED}",
                v.len()
            ));
        }
        self.feed.send_if_modified(|cur| {
            if cur.as_ref() == Some(&v) {
                false
            } else {
                *cur = Some(v);
                true
            }
        });
        Ok(())
    }

    /// `feed` read: the value once it differs from `last` (what this fid read before);
    /// `None` when the agent is killed.
    pub async fn next_feed(&self, last: Option<&Bytes>) -> Option<Bytes> {
        let mut rx = self.feed.subscribe();
        let mut killed = self.killed.subscribe();
        loop {
            {
                let cur = rx.borrow_and_update();
                if let Some(v) = cur.as_ref()
                    && Some(v) != last
                {
                    return Some(v.clone());
                }
            }
            if *killed.borrow_and_update() {
                return None;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return None; },
                r = killed.changed() => if r.is_err() { return None; },
            }
        }
    }

    /// `statewait` read: the state once its sequence passes `seen`; `None` after the
    /// killed state has been reported.
    pub async fn next_state(&self, seen: u64) -> (u64, AgentState) {
        let mut rx = self.state.subscribe();
        loop {
            let cur = *rx.borrow_and_update();
            if cur.0 > seen {
                return cur;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// The plan.
    pub fn plan(&self) -> Bytes {
        Bytes::copy_from_slice(&lock(&self.plan))
    }

    /// Writes into the plan at `offset` (`truncate` first empties it), durably.
    pub fn write_plan(&self, offset: u64, data: &[u8], truncate: bool) -> Result<(), String> {
        let mut p = lock(&self.plan);
        let mut next = if truncate { Vec::new() } else { p.clone() };
        let off = usize::try_from(offset).map_err(|_| "offset too large".to_owned())?;
        let end = off
            .checked_add(data.len())
            .filter(|e| *e <= MAX_PLAN)
            .ok_or_else(|| format!("plan may hold at most {MAX_PLAN} bytes"))?;
        if next.len() < off {
            next.resize(off, b' ');
        }
        if next.len() < end {
            next.resize(end, 0);
        }
        next[off..end].copy_from_slice(data);
        self.store
            .save_plan(&self.session_id, &self.id, &next)
            .map_err(|e| crate::error_chain(&e))?;
        *p = next;
        Ok(())
    }

    /// Empties the plan (truncation on open).
    pub fn clear_plan(&self) -> Result<(), String> {
        self.write_plan(0, &[], true)
    }

    /// `cfg` read.
    pub fn cfg_text(&self) -> String {
        let s = self.settings();
        let mut out = format!("name={}\nid={}\n", self.name(), self.id);
        out.push_str(&format!("cwd={}\n", s.cwd.display()));
        for (k, v) in [
            ("backend", &s.backend),
            ("model", &s.model),
            ("profile", &s.profile),
        ] {
            out.push_str(&format!("{k}={}\n", v.as_deref().unwrap_or("")));
        }
        for k in &CFG_KEYS[4..] {
            out.push_str(&format!(
                "{k}={}\n",
                s.cfg.get(*k).map(String::as_str).unwrap_or("")
            ));
        }
        out
    }

    /// `cfg` write: `key=value` lines, all validated before any is applied.
    pub fn set_cfg(&self, text: &str, config: &Config) -> Result<Vec<(String, String)>, String> {
        let mut next = self.settings();
        let mut changed = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let (k, v) = line.split_once('=').ok_or_else(|| {
                format!(
                    "cfg line {:?} is not key=value (keys: {})",
                    clip(line),
                    CFG_KEYS.join(", ")
                )
            })?;
            let (k, v) = (k.trim(), v.trim());
            apply_setting(&mut next, k, v, config)?;
            changed.push((k.to_owned(), v.to_owned()));
        }
        if changed.is_empty() {
            return Err(format!(
                "nothing to set: write key=value lines (keys: {})",
                CFG_KEYS.join(", ")
            ));
        }
        let old = std::mem::replace(&mut *lock(&self.settings), next);
        if let Err(e) = self.save() {
            *lock(&self.settings) = old;
            return Err(e);
        }
        Ok(changed)
    }

    /// Changes settings through a closure (used by `ctl`), durably.
    pub fn update_settings(&self, f: impl FnOnce(&mut AgentSettings)) -> Result<(), String> {
        let old = self.settings();
        f(&mut lock(&self.settings));
        if let Err(e) = self.save() {
            *lock(&self.settings) = old;
            return Err(e);
        }
        Ok(())
    }

    /// Bumps `stop`: a running turn ends.
    pub fn stop_turn(&self) -> bool {
        let running = self.state().1 == AgentState::Running;
        self.stop.send_modify(|v| *v += 1);
        running
    }

    /// Waits for a turn ending after `after`.
    pub async fn next_turn_end(&self, after: u64) -> Option<TurnEnd> {
        let mut rx = self.turns.subscribe();
        let mut killed = self.killed.subscribe();
        loop {
            if let Some(t) = rx.borrow_and_update().as_ref()
                && t.seq > after
            {
                return Some(t.clone());
            }
            if *killed.borrow_and_update() {
                return None;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return None; },
                r = killed.changed() => if r.is_err() { return None; },
            }
        }
    }

    /// Sequence of the last finished turn.
    pub fn turn_seq(&self) -> u64 {
        self.turns.borrow().as_ref().map_or(0, |t| t.seq)
    }

    /// Marks the agent killed: blocking reads end, chat readers get EOF.
    fn mark_killed(&self) {
        self.killed.send_replace(true);
        self.set_state(AgentState::Killed);
        self.chat.close();
        self.queue_bell.notify_waiters();
    }

    /// Renames (the caller checks uniqueness), durably.
    fn rename(&self, to: &str) -> Result<(), String> {
        let old = self.name();
        write(&self.name, to.to_owned());
        if let Err(e) = self.save() {
            write(&self.name, old);
            return Err(e);
        }
        Ok(())
    }
}

/// Validates and applies one cfg key.
pub fn apply_setting(
    s: &mut AgentSettings,
    k: &str,
    v: &str,
    config: &Config,
) -> Result<(), String> {
    let opt = |v: &str| (!v.is_empty()).then(|| v.to_owned());
    match k {
        "backend" => {
            if !v.is_empty() && !config.backends.contains_key(v) {
                return Err(format!(
                    "unknown backend {:?} (configured: {})",
                    clip(v),
                    list_or_none(config.backends.keys())
                ));
            }
            s.backend = opt(v);
        }
        "model" => {
            if v.len() > 200 || v.contains(char::is_control) {
                return Err("model: at most 200 printable characters".into());
            }
            s.model = opt(v);
        }
        "profile" => {
            if !v.is_empty() && !config.profiles.contains_key(v) {
                return Err(format!(
                    "unknown profile {:?} (available: {})",
                    clip(v),
                    list_or_none(config.profiles.keys())
                ));
            }
            s.profile = opt(v);
        }
        "cwd" => s.cwd = existing_dir(v)?,
        "temperature" | "top_p" => {
            let max = if k == "temperature" { 2.0 } else { 1.0 };
            if !v.is_empty() {
                let x: f64 = v
                    .parse()
                    .ok()
                    .filter(|x: &f64| (0.0..=max).contains(x))
                    .ok_or_else(|| format!("{k}: {:?} is not a number from 0 to {max}", clip(v)))?;
                s.cfg.insert(k.to_owned(), x.to_string());
            } else {
                s.cfg.remove(k);
            }
        }
        "max_tokens" | "max_steps" | "context_limit" => {
            let max: u64 = match k {
                "max_tokens" => 1_000_000,
                "max_steps" => 1000,
                _ => 10_000_000,
            };
            if !v.is_empty() {
                let x: u64 = v
                    .parse()
                    .ok()
                    .filter(|x| (1..=max).contains(x))
                    .ok_or_else(|| format!("{k}: {:?} is not a number from 1 to {max}", clip(v)))?;
                s.cfg.insert(k.to_owned(), x.to_string());
            } else {
                s.cfg.remove(k);
            }
        }
        other => {
            return Err(format!(
                "unknown key {:?} (valid: {})",
                clip(other),
                CFG_KEYS.join(", ")
            ));
        }
    }
    Ok(())
}

fn list_or_none<'a>(it: impl Iterator<Item = &'a String>) -> String {
    let v: Vec<&str> = it.map(String::as_str).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// An existing absolute directory, canonicalised.
pub fn existing_dir(v: &str) -> Result<PathBuf, String> {
    let p = Path::new(v);
    if !p.is_absolute() {
        return Err(format!("cwd {:?} must be an absolute path", clip(v)));
    }
    let c = std::fs::canonicalize(p).map_err(|e| format!("cwd {:?}: {e}", clip(v)))?;
    if !c.is_dir() {
        return Err(format!("cwd {:?} is not a directory", clip(v)));
    }
    Ok(c)
}

/// A remote session's `cwd=`: absolute, without `.` or `..` components (it names a directory
/// on the remote host, so it cannot be checked here; the remote toolsrv refuses a missing one).
pub fn remote_dir(v: &str) -> Result<PathBuf, String> {
    use std::path::Component;
    let p = Path::new(v);
    if !p.is_absolute() {
        return Err(format!(
            "cwd {:?} must be an absolute path (on the remote host)",
            clip(v)
        ));
    }
    if p.components()
        .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
    {
        return Err(format!(
            "cwd {:?}: give the directory without . or .. components",
            clip(v)
        ));
    }
    Ok(p.components().collect())
}

// ---------------------------------------------------------------------------------------
// Sessions

/// One session.
#[derive(Debug)]
pub struct Session {
    pub handle: u32,
    pub id: String,
    pub created: u64,
    order: u64,
    name: RwLock<String>,
    pub cwd: PathBuf,
    pub backend: Option<String>,
    pub model: Option<String>,
    pub profile: Option<String>,
    pub remote: Option<String>,
    paused: watch::Sender<bool>,
    agents: RwLock<Vec<Arc<Agent>>>,
    killed: watch::Sender<bool>,
    pub link: ToolLink,
    /// The session's own cost cap in US dollars (`None`: `cost_cap_usd` of the config).
    cost_cap: Mutex<Option<f64>>,
    /// The session's bead namespace, the template new agents copy ([`crate::ns`]).
    pub ns: NsHome,
    store: Arc<Store>,
}

impl Session {
    pub fn name(&self) -> String {
        read(&self.name)
    }

    pub fn paused(&self) -> bool {
        *self.paused.borrow()
    }

    pub fn is_killed(&self) -> bool {
        *self.killed.borrow()
    }

    pub fn agents(&self) -> Vec<Arc<Agent>> {
        read(&self.agents)
    }

    /// An agent by name or id.
    pub fn agent(&self, key: &str) -> Option<Arc<Agent>> {
        self.agents()
            .into_iter()
            .find(|a| a.id == key || a.name() == key)
    }

    fn record(&self) -> SessionRecord {
        SessionRecord {
            id: self.id.clone(),
            name: self.name(),
            cwd: self.cwd.clone(),
            backend: self.backend.clone(),
            model: self.model.clone(),
            profile: self.profile.clone(),
            remote: self.remote.clone(),
            paused: self.paused(),
            created: self.created,
            order: self.order,
            cost_cap_usd: self.cost_cap(),
        }
    }

    /// The session's own cost cap, if set.
    pub fn cost_cap(&self) -> Option<f64> {
        *lock(&self.cost_cap)
    }

    /// Sets (or with `None` clears) the session's cost cap, durably.
    pub fn set_cost_cap(&self, cap: Option<f64>) -> Result<(), String> {
        let old = std::mem::replace(&mut *lock(&self.cost_cap), cap);
        if let Err(e) = self.save() {
            *lock(&self.cost_cap) = old;
            return Err(e);
        }
        Ok(())
    }

    /// What the session's agents have spent, in US dollars.
    pub fn cost_usd(&self) -> f64 {
        self.agents().iter().map(|a| lock(&a.stats).cost_usd).sum()
    }

    pub fn save(&self) -> Result<(), String> {
        self.store
            .save_session(&self.record())
            .map_err(|e| crate::error_chain(&e))
    }

    /// `env`: `OLLIE_SESSION_ID`, other non-secret session facts, and the server's own
    /// non-secret `OLLIE_*` variables.
    pub fn env_text(&self) -> String {
        let mut out = format!(
            "OLLIE_SESSION_ID={}\nOLLIE_SESSION_NAME={}\nOLLIE_SESSION_CWD={}\n",
            self.id,
            self.name(),
            self.cwd.display()
        );
        let mut extra: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k.starts_with("OLLIE_") && !k.starts_with("OLLIE_SESSION_"))
            .filter(|(k, _)| !looks_secret(k))
            .filter(|(_, v)| !v.contains('\n'))
            .collect();
        extra.sort();
        for (k, v) in extra {
            out.push_str(&format!("{k}={v}\n"));
        }
        out
    }

    /// The session's `cfg`: its settings, where its tools run (`remote=`, empty for this
    /// host) and the state of its toolsrv link.
    pub fn cfg_text(&self) -> String {
        let o = |v: &Option<String>| v.clone().unwrap_or_default();
        format!(
            "name={}\nid={}\ncwd={}\nbackend={}\nmodel={}\nprofile={}\nremote={}\n{}",
            self.name(),
            self.id,
            self.cwd.display(),
            o(&self.backend),
            o(&self.model),
            o(&self.profile),
            o(&self.remote),
            self.link.status_lines()
        )
    }

    /// `paused` changes, durably.
    pub fn set_paused(&self, p: bool) -> Result<bool, String> {
        let was = self.paused();
        if was == p {
            return Ok(false);
        }
        self.paused.send_replace(p);
        if let Err(e) = self.save() {
            self.paused.send_replace(was);
            return Err(e);
        }
        Ok(true)
    }
}

/// Names of variables that must never be shown.
pub fn looks_secret(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    [
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "AUTH",
    ]
    .iter()
    .any(|w| n.contains(w))
}

/// What `session/new` and `agent/new` accept.
#[derive(Debug, Default, Clone)]
pub struct NewSpec {
    pub name: Option<String>,
    pub cwd: Option<String>,
    pub backend: Option<String>,
    pub model: Option<String>,
    pub profile: Option<String>,
    pub remote: Option<String>,
    pub prompt: Option<String>,
}

/// Parses `key=value` pairs (whitespace- or newline-separated; a `prompt=` value runs to the
/// end of its line, and a `\n` in it is a newline). `valid` lists the keys accepted.
pub fn parse_spec(text: &str, valid: &[&str]) -> Result<NewSpec, String> {
    let mut spec = NewSpec::default();
    let mut seen: Vec<String> = Vec::new();
    for line in text.lines() {
        let mut rest = line.trim();
        while !rest.is_empty() {
            let (k, after) = rest.split_once('=').ok_or_else(|| {
                format!(
                    "{:?} is not key=value (valid: {})",
                    clip(rest),
                    valid.join(", ")
                )
            })?;
            let k = k.trim();
            if !valid.contains(&k) {
                return Err(format!(
                    "unknown key {:?} (valid: {})",
                    clip(k),
                    valid.join(", ")
                ));
            }
            if seen.iter().any(|s| s == k) {
                return Err(format!("key {k:?} given twice"));
            }
            seen.push(k.to_owned());
            let (v, next) = if k == "prompt" {
                (after.replace("\\n", "\n"), "")
            } else {
                match after.find(char::is_whitespace) {
                    Some(i) => (after[..i].to_owned(), after[i..].trim_start()),
                    None => (after.to_owned(), ""),
                }
            };
            let v = Some(v);
            match k {
                "name" => spec.name = v,
                "cwd" => spec.cwd = v,
                "backend" => spec.backend = v,
                "model" => spec.model = v,
                "profile" => spec.profile = v,
                "remote" => spec.remote = v,
                "prompt" => spec.prompt = v,
                _ => {}
            }
            rest = next;
        }
    }
    Ok(spec)
}

// ---------------------------------------------------------------------------------------
// The registry

/// Every session, and what creating and killing them needs.
#[derive(Debug)]
pub struct Registry {
    pub events: Arc<Events>,
    pub store: Arc<Store>,
    pub config: Arc<RwLock<Arc<Config>>>,
    sessions: RwLock<Vec<Arc<Session>>>,
    handles: AtomicU32,
    order: AtomicU64,
    /// Serialises creations, renames and kills (name uniqueness).
    naming: Mutex<()>,
    /// The toolsrv binary.
    pub toolsrv: PathBuf,
    /// Bumped whenever the set or names of sessions/agents change (`aliases`, `idx`).
    pub version: AtomicU32,
    /// Every session's escalation requests, and the audit log.
    pub bypass: Arc<crate::bypass::Bypass>,
}

fn ev(pairs: &[(&str, Value)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

impl Registry {
    pub fn new(
        events: Arc<Events>,
        store: Arc<Store>,
        config: Arc<RwLock<Arc<Config>>>,
        toolsrv: PathBuf,
    ) -> Registry {
        Registry {
            bypass: Arc::new(crate::bypass::Bypass::new(store.dir(), Arc::clone(&events))),
            events,
            store,
            config,
            sessions: RwLock::new(Vec::new()),
            handles: AtomicU32::new(1),
            order: AtomicU64::new(1),
            naming: Mutex::new(()),
            toolsrv,
            version: AtomicU32::new(0),
        }
    }

    pub fn config(&self) -> Arc<Config> {
        read(&self.config)
    }

    fn handle(&self) -> u32 {
        self.handles.fetch_add(1, Ordering::Relaxed)
    }

    fn bump(&self) {
        self.version.fetch_add(1, Ordering::Relaxed);
    }

    pub fn sessions(&self) -> Vec<Arc<Session>> {
        read(&self.sessions)
    }

    /// A session by name or id.
    pub fn session(&self, key: &str) -> Option<Arc<Session>> {
        self.sessions()
            .into_iter()
            .find(|s| s.id == key || s.name() == key)
    }

    /// Restores what the store has. Problems are logged and announced, never fatal.
    pub fn restore(self: &Arc<Self>) {
        let loaded = self.store.load();
        for p in &loaded.problems {
            tracing::warn!(path = %p.path.display(), reason = %p.reason, "state skipped");
            self.events.emit(
                "state-skipped",
                ev(&[
                    ("path", Value::from(p.path.display().to_string())),
                    ("reason", Value::from(p.reason.clone())),
                ]),
            );
        }
        let mut max_order = 0;
        for ls in loaded.sessions {
            let r = ls.record;
            max_order = max_order.max(r.order);
            let s = self.build_session(
                r.id.clone(),
                r.name.clone(),
                r.cwd.clone(),
                (r.backend.clone(), r.model.clone(), r.profile.clone()),
                r.remote.clone(),
                r.created,
                r.order,
                r.paused,
            );
            *lock(&s.cost_cap) = r.cost_cap_usd;
            self.restore_ns(&s.ns);
            for la in ls.agents {
                let a = la.record;
                max_order = max_order.max(a.order);
                let agent = self.build_agent(&s, &a);
                self.restore_ns(&agent.ns);
                agent.chat.restore(
                    self.store
                        .read_chat(&s.id, &agent.id, 0, la.chat_raw_len as usize)
                        .unwrap_or_default(),
                );
                *lock(&agent.plan) = la.plan;
                let interrupted = lock(&agent.in_turn).take();
                if let Some(p) = interrupted {
                    let msg = format!(
                        "interrupted: olliesrv stopped during the turn for {:?}; tools that were running were stopped",
                        clip(&p)
                    );
                    if let Err(e) = agent.say("error", "", &msg).and_then(|()| agent.save()) {
                        tracing::warn!(agent = %agent.id, error = %e, "cannot record the interrupted turn");
                    }
                }
                if let Ok(mut v) = s.agents.write() {
                    v.push(Arc::clone(&agent));
                }
            }
            if let Ok(mut v) = self.sessions.write() {
                v.push(Arc::clone(&s));
            }
            s.link.start(Arc::clone(&s), Arc::clone(self));
            for a in s.agents() {
                crate::turn::start_worker(Arc::clone(&a), Arc::clone(self), false);
            }
        }
        self.order.fetch_max(max_order + 1, Ordering::Relaxed);
        self.bump();
    }

    /// Replays a saved namespace; problems are logged and announced like those of the store.
    fn restore_ns(&self, ns: &NsHome) {
        for (path, reason) in ns.restore() {
            tracing::error!(path = %path.display(), %reason, "namespace skipped");
            self.events.emit(
                "state-skipped",
                ev(&[
                    ("path", Value::from(path.display().to_string())),
                    ("reason", Value::from(reason)),
                ]),
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn build_session(
        &self,
        id: String,
        name: String,
        cwd: PathBuf,
        (backend, model, profile): (Option<String>, Option<String>, Option<String>),
        remote: Option<String>,
        created: u64,
        order: u64,
        paused: bool,
    ) -> Arc<Session> {
        let ns = NsHome::new(
            &id,
            self.store
                .session_path(&id)
                .map_err(|e| crate::error_chain(&e)),
            Arc::clone(&self.config),
        );
        Arc::new(Session {
            ns,
            handle: self.handle(),
            id,
            created,
            order,
            name: RwLock::new(name),
            cwd,
            backend,
            model,
            profile,
            remote,
            paused: watch::Sender::new(paused),
            agents: RwLock::new(Vec::new()),
            killed: watch::Sender::new(false),
            link: ToolLink::new(),
            cost_cap: Mutex::new(None),
            store: Arc::clone(&self.store),
        })
    }

    fn build_agent(&self, s: &Arc<Session>, r: &AgentRecord) -> Arc<Agent> {
        let initial = if s.paused() {
            AgentState::Paused
        } else {
            AgentState::Idle
        };
        let ns = NsHome::new(
            &r.id,
            self.store
                .agent_path(&s.id, &r.id)
                .map_err(|e| crate::error_chain(&e)),
            Arc::clone(&self.config),
        );
        Arc::new(Agent {
            ns,
            handle: self.handle(),
            id: r.id.clone(),
            session: Arc::downgrade(s),
            session_id: s.id.clone(),
            created: r.created,
            order: r.order,
            name: RwLock::new(r.name.clone()),
            settings: Mutex::new(AgentSettings {
                cwd: r.cwd.clone(),
                backend: r.backend.clone(),
                model: r.model.clone(),
                profile: r.profile.clone(),
                cfg: r.cfg.clone(),
                tools: r.tools.clone(),
            }),
            stats: Mutex::new(Stats::from_map(&r.stats)),
            queue: Mutex::new(r.queue.iter().cloned().collect()),
            in_turn: Mutex::new(r.in_turn.clone()),
            blocked: Mutex::new(r.blocked.clone()),
            detail: Mutex::new(String::new()),
            streaming: Mutex::new(None),
            backend: tokio::sync::Mutex::new(None),
            history_lock: tokio::sync::Mutex::new(()),
            compact_requested: std::sync::atomic::AtomicBool::new(false),
            completions_watched: std::sync::atomic::AtomicBool::new(false),
            queue_bell: Notify::new(),
            feed: watch::Sender::new(None),
            state: watch::Sender::new((0, initial)),
            chat: Chat::new(),
            plan: Mutex::new(Vec::new()),
            killed: watch::Sender::new(false),
            stop: watch::Sender::new(0),
            turns: watch::Sender::new(None),
            store: Arc::clone(&self.store),
        })
    }

    fn unique_session_name(&self, base: &str) -> String {
        let taken = |n: &str| self.sessions().iter().any(|s| s.name() == n);
        if !taken(base) {
            return base.to_owned();
        }
        (2..)
            .map(|i| format!("{base}{i}"))
            .find(|n| !taken(n))
            .unwrap_or_default()
    }

    /// `session/new`.
    pub fn create_session(self: &Arc<Self>, spec: NewSpec) -> Result<Arc<Session>, String> {
        let config = self.config();
        if let Some(p) = &spec.prompt {
            return Err(format!(
                "unknown key \"prompt\" for a session ({})",
                clip(p)
            ));
        }
        if let Some(b) = &spec.backend
            && !config.backends.contains_key(b)
        {
            return Err(format!(
                "unknown backend {:?} (configured: {})",
                clip(b),
                list_or_none(config.backends.keys())
            ));
        }
        if let Some(p) = &spec.profile
            && !config.profiles.contains_key(p)
        {
            return Err(format!(
                "unknown profile {:?} (available: {})",
                clip(p),
                list_or_none(config.profiles.keys())
            ));
        }
        if let Some(r) = &spec.remote
            && !config.remotes.contains_key(r)
        {
            return Err(format!(
                "unknown remote {:?} (configured: {})",
                clip(r),
                list_or_none(config.remotes.keys())
            ));
        }
        // A remote session's cwd is a directory on the remote host: toolsrv there checks it.
        let cwd = match (&spec.remote, &spec.cwd) {
            (Some(_), Some(c)) => remote_dir(c)?,
            (Some(r), None) => {
                return Err(format!(
                    "remote {:?}: give cwd= (an absolute directory on the remote host)",
                    clip(r)
                ));
            }
            (None, Some(c)) => existing_dir(c)?,
            (None, None) => {
                existing_dir(&std::env::var("HOME").unwrap_or_else(|_| "/".to_owned()))?
            }
        };
        let _g = lock(&self.naming);
        let name = match &spec.name {
            Some(n) => {
                validate_name(n)?;
                if self.session(n).is_some() {
                    return Err(format!("file already exists: a session is named {n:?}"));
                }
                n.clone()
            }
            None => self.unique_session_name(
                cwd.file_name()
                    .and_then(|n| n.to_str())
                    .filter(|n| validate_name(n).is_ok())
                    .unwrap_or("session"),
            ),
        };
        let s = self.build_session(
            new_uuid(),
            name,
            cwd,
            (spec.backend, spec.model, spec.profile),
            spec.remote,
            now(),
            self.order.fetch_add(1, Ordering::Relaxed),
            false,
        );
        s.save()?;
        if let Ok(mut v) = self.sessions.write() {
            v.push(Arc::clone(&s));
        }
        self.bump();
        s.link.start(Arc::clone(&s), Arc::clone(self));
        self.events.emit(
            "session-created",
            ev(&[
                ("session", Value::from(s.id.clone())),
                ("name", Value::from(s.name())),
            ]),
        );
        Ok(s)
    }

    /// Renames a session.
    pub fn rename_session(&self, s: &Session, to: &str) -> Result<(), String> {
        validate_name(to)?;
        let _g = lock(&self.naming);
        let old = s.name();
        if old == to {
            return Ok(());
        }
        if self.session(to).is_some() {
            return Err(format!("file already exists: a session is named {to:?}"));
        }
        write(&s.name, to.to_owned());
        if let Err(e) = s.save() {
            write(&s.name, old);
            return Err(e);
        }
        self.bump();
        self.events.emit(
            "session-renamed",
            ev(&[
                ("session", Value::from(s.id.clone())),
                ("from", Value::from(old)),
                ("name", Value::from(to)),
            ]),
        );
        Ok(())
    }

    /// Kills a session: its agents, its toolsrv (and every tool), its state on disk.
    pub fn kill_session(&self, s: &Arc<Session>) -> Result<(), String> {
        {
            let _g = lock(&self.naming);
            if s.is_killed() {
                return Ok(());
            }
            s.killed.send_replace(true);
            if let Ok(mut v) = self.sessions.write() {
                v.retain(|x| !Arc::ptr_eq(x, s));
            }
        }
        for a in s.agents() {
            a.mark_killed();
        }
        s.link.stop();
        self.bump();
        let r = self
            .store
            .remove_session(&s.id)
            .map_err(|e| crate::error_chain(&e));
        self.events.emit(
            "session-killed",
            ev(&[
                ("session", Value::from(s.id.clone())),
                ("name", Value::from(s.name())),
            ]),
        );
        r
    }

    /// `agent/new`.
    pub fn create_agent(
        self: &Arc<Self>,
        s: &Arc<Session>,
        spec: &NewSpec,
    ) -> Result<Arc<Agent>, String> {
        if s.is_killed() {
            return Err("file does not exist: the session was killed".into());
        }
        if spec.remote.is_some() {
            return Err("unknown key \"remote\" for an agent (remote is a session key)".into());
        }
        let config = self.config();
        let mut settings = AgentSettings {
            cwd: s.cwd.clone(),
            backend: s.backend.clone(),
            model: s.model.clone(),
            profile: s.profile.clone(),
            ..AgentSettings::default()
        };
        for (k, v) in [
            ("cwd", &spec.cwd),
            ("backend", &spec.backend),
            ("model", &spec.model),
            ("profile", &spec.profile),
        ] {
            if let Some(v) = v {
                apply_setting(&mut settings, k, v, &config)?;
            }
        }
        let _g = lock(&self.naming);
        let name = match &spec.name {
            Some(n) => {
                validate_name(n)?;
                if s.agent(n).is_some() {
                    return Err(format!(
                        "file already exists: session {} has an agent named {n:?}",
                        s.name()
                    ));
                }
                n.clone()
            }
            None => {
                let taken = |n: &str| s.agents().iter().any(|a| a.name() == n);
                (1..)
                    .map(|i| format!("a{i}"))
                    .find(|n| !taken(n))
                    .unwrap_or_default()
            }
        };
        let rec = AgentRecord {
            id: new_uuid(),
            session: s.id.clone(),
            name,
            cwd: settings.cwd.clone(),
            backend: settings.backend.clone(),
            model: settings.model.clone(),
            profile: settings.profile.clone(),
            cfg: BTreeMap::new(),
            created: now(),
            order: self.order.fetch_add(1, Ordering::Relaxed),
            stats: BTreeMap::new(),
            tools: None,
            queue: Vec::new(),
            in_turn: None,
            blocked: None,
        };
        let a = self.build_agent(s, &rec);
        // Isolation by default: the agent starts with a private copy of the session's
        // namespace as it is now (its shadow layer starts empty).
        a.ns.set(s.ns.fork(&a.id));
        a.save()?;
        if let Err(e) = a.ns.save() {
            if let Err(r) = self.store.remove_agent(&s.id, &a.id) {
                tracing::warn!(agent = %a.id, error = %crate::error_chain(&r), "cannot remove a half-created agent");
            }
            return Err(e);
        }
        if let Ok(mut v) = s.agents.write() {
            v.push(Arc::clone(&a));
        }
        self.bump();
        drop(_g);
        crate::turn::start_worker(Arc::clone(&a), Arc::clone(self), true);
        self.events.emit(
            "agent-created",
            ev(&[
                ("session", Value::from(s.id.clone())),
                ("agent", Value::from(a.id.clone())),
                ("name", Value::from(a.name())),
            ]),
        );
        Ok(a)
    }

    /// Renames an agent.
    pub fn rename_agent(&self, a: &Agent, to: &str) -> Result<(), String> {
        validate_name(to)?;
        let s = a
            .session
            .upgrade()
            .ok_or("file does not exist: the session was killed")?;
        let _g = lock(&self.naming);
        let old = a.name();
        if old == to {
            return Ok(());
        }
        if s.agent(to).is_some() {
            return Err(format!(
                "file already exists: session {} has an agent named {to:?}",
                s.name()
            ));
        }
        a.rename(to)?;
        self.bump();
        self.events.emit(
            "agent-renamed",
            ev(&[
                ("session", Value::from(s.id.clone())),
                ("agent", Value::from(a.id.clone())),
                ("from", Value::from(old)),
                ("name", Value::from(to)),
            ]),
        );
        Ok(())
    }

    /// Kills an agent: its turn, its blocking readers, its state on disk.
    pub fn kill_agent(&self, a: &Arc<Agent>) -> Result<(), String> {
        let s = a.session.upgrade();
        {
            let _g = lock(&self.naming);
            if a.is_killed() {
                return Ok(());
            }
            if let Some(s) = &s
                && let Ok(mut v) = s.agents.write()
            {
                v.retain(|x| !Arc::ptr_eq(x, a));
            }
        }
        a.stop_turn();
        a.mark_killed();
        if let Some(s) = &s {
            s.link.agent_removed(a);
        }
        self.bump();
        let r = self
            .store
            .remove_agent(&a.session_id, &a.id)
            .map_err(|e| crate::error_chain(&e));
        self.events.emit(
            "agent-killed",
            ev(&[
                ("session", Value::from(a.session_id.clone())),
                ("agent", Value::from(a.id.clone())),
                ("name", Value::from(a.name())),
            ]),
        );
        r
    }

    /// Pauses or resumes a session, durably: idle agents become paused (queued prompts
    /// wait) or idle again, each announced; a running turn finishes first.
    pub fn set_paused(&self, s: &Session, p: bool) -> Result<bool, String> {
        if !s.set_paused(p)? {
            return Ok(false);
        }
        self.events.emit(
            if p {
                "session-paused"
            } else {
                "session-resumed"
            },
            ev(&[
                ("session", Value::from(s.id.clone())),
                ("name", Value::from(s.name())),
            ]),
        );
        for a in s.agents() {
            if a.state().1 != AgentState::Running && !a.is_killed() {
                self.state_changed(
                    &a,
                    if p {
                        AgentState::Paused
                    } else {
                        AgentState::Idle
                    },
                );
            }
            a.queue_bell.notify_one();
        }
        Ok(true)
    }

    /// While a turn runs: what it is doing now (a change `statewait` reports).
    pub fn detail(&self, a: &Agent, d: &str) {
        let shown = a.state_text();
        *lock(&a.detail) = d.to_owned();
        if shown == d {
            return;
        }
        a.state.send_modify(|(seq, _)| *seq += 1);
        self.events.emit(
            "agent-state",
            ev(&[
                ("session", Value::from(a.session_id.clone())),
                ("agent", Value::from(a.id.clone())),
                ("state", Value::from(d)),
            ]),
        );
    }

    /// Announces an agent state change.
    pub fn state_changed(&self, a: &Agent, st: AgentState) {
        lock(&a.detail).clear();
        if !a.set_state(st) {
            return;
        }
        self.events.emit(
            "agent-state",
            ev(&[
                ("session", Value::from(a.session_id.clone())),
                ("agent", Value::from(a.id.clone())),
                ("state", Value::from(a.state_text())),
            ]),
        );
    }

    /// Records the end of a turn (its reply or error as shown: without API keys).
    pub fn turn_ended(&self, a: &Agent, result: Result<String, String>) {
        let shown = |s: String| crate::redact::redact(&s).into_owned();
        let result = result.map(shown).map_err(shown);
        a.turns.send_modify(|t| {
            let seq = t.as_ref().map_or(1, |t| t.seq + 1);
            *t = Some(TurnEnd { seq, result });
        });
    }

    /// `aliases`: `id<TAB>path` for every session and agent.
    pub fn aliases_text(&self) -> String {
        let mut out = String::new();
        for s in self.sessions() {
            out.push_str(&format!("{}\t/session/{}\n", s.id, s.name()));
            for a in s.agents() {
                out.push_str(&format!(
                    "{}\t/session/{}/agent/{}\n",
                    a.id,
                    s.name(),
                    a.name()
                ));
            }
        }
        out
    }

    /// Waits for the next queued prompt of `a` (or its death); honours `paused`.
    pub async fn next_prompt(&self, a: &Agent) -> Option<String> {
        let mut killed = a.killed.subscribe();
        loop {
            let notified = a.queue_bell.notified();
            if a.is_killed() {
                return None;
            }
            let paused = a.session.upgrade().is_none_or(|s| s.paused());
            if !paused && let Some(p) = lock(&a.queue).front().cloned() {
                return Some(p);
            }
            tokio::select! {
                _ = notified => {}
                r = killed.changed() => if r.is_err() { return None; },
            }
        }
    }

    /// Takes the prompt `next_prompt` returned out of the queue and marks its turn as in
    /// flight, durably (a crash from here on reports the turn as interrupted on restart
    /// instead of running it twice).
    pub fn take_prompt(&self, a: &Agent) -> Option<String> {
        let p = lock(&a.queue).pop_front()?;
        *lock(&a.in_turn) = Some(p.clone());
        if let Err(e) = a.save() {
            tracing::warn!(agent = %a.id, error = %e, "cannot save the agent's queue");
        }
        Some(p)
    }

    /// The turn in flight is over (its outcome is in the chat).
    pub fn finish_turn(&self, a: &Agent) {
        *lock(&a.in_turn) = None;
        if a.is_killed() {
            return;
        }
        if let Err(e) = a.save() {
            tracing::warn!(agent = %a.id, error = %e, "cannot save the agent");
        }
    }

    /// A subscription that fires when `stop` is written.
    pub fn stop_signal(&self, a: &Agent) -> watch::Receiver<u64> {
        a.stop.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_v4_and_distinct() {
        let a = new_uuid();
        let b = new_uuid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
    }

    #[test]
    fn names() {
        assert!(validate_name("proj-1.x_y").is_ok());
        for bad in [
            "",
            "new",
            "idx",
            ".x",
            "-x",
            "a/b",
            "a b",
            "é",
            &"x".repeat(65),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn blocks_and_marker_stripping() {
        let (raw, text) = Chat::block_bytes("user", "", "hi\n]]]\n[[[x");
        let raw = String::from_utf8(raw).unwrap();
        assert_eq!(raw, "[[[user\nhi\n ]]]\n [[[x\n]]]\n");
        assert_eq!(strip_markers(raw.as_bytes()), text);
        assert_eq!(String::from_utf8(text).unwrap(), "hi\n ]]]\n [[[x\n");
    }

    #[test]
    fn specs() {
        let valid = &["name", "cwd", "prompt"];
        let s = parse_spec("name=x cwd=/tmp\nprompt=fix it now\\nplease", valid).unwrap();
        assert_eq!(s.name.as_deref(), Some("x"));
        assert_eq!(s.cwd.as_deref(), Some("/tmp"));
        assert_eq!(s.prompt.as_deref(), Some("fix it now\nplease"));
        let e = parse_spec("colour=red", valid).unwrap_err();
        assert!(
            e.contains("unknown key \"colour\" (valid: name, cwd, prompt)"),
            "{e}"
        );
        assert!(
            parse_spec("name=a name=b", valid)
                .unwrap_err()
                .contains("twice")
        );
        assert!(parse_spec("junk", valid).is_err());
    }

    #[test]
    fn secret_looking_names() {
        assert!(looks_secret("OLLIE_API_KEY"));
        assert!(looks_secret("OLLIE_TOKEN"));
        assert!(!looks_secret("OLLIE_LOG"));
    }
}
