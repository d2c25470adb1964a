//! Sessions and their agents: the live objects behind `session/NAME/…` and
//! `…/agent/NAME/…` (a session holds its agents, each agent points back at its session), and
//! the `key=value` specs that create them. An agent has its settings, queue, feed, plan,
//! stats, chat and turn signals.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, Weak};

use bytes::Bytes;
use tokio::sync::{Notify, watch};

use crate::config::{Config, Profile};
use crate::link::{AgentTools, ToolLink};
use crate::state::chat::Chat;
use crate::state::ns::{NsHome, split_path};
use crate::state::settings::{AgentSettings, CFG_KEYS, Stats, apply_setting};
use crate::state::store::{AgentRecord, SessionRecord, Store, Sync};
use crate::util::{clip, lock, read, write};

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

/// The chat's block markers at the start of a line; a streamed body line that begins with
/// one is indented by a space (as [`Chat::block_bytes`] does for whole blocks).
const OPEN_MARK: &str = "[[[";
const CLOSE_MARK: &str = "]]]";

/// A chat block being streamed.
#[derive(Debug)]
pub struct Block {
    pub(crate) kind: String,
    pub(crate) raw: Vec<u8>,
    /// Redaction of the streamed text: the end that could begin an API key waits here.
    pub(crate) redact: crate::redact::Stream,
    /// The start of the current line while it could still be a marker.
    pub(crate) line: String,
    pub(crate) decided: bool,
    pub(crate) ends_line: bool,
}

/// A prompt written to an idle agent is recorded as the turn in flight at once (`in_turn`,
/// in the same durable save that acknowledges the write) instead of being queued and then
/// taken in a second save: one fsync'd write less before the model is asked. A crash after
/// the acknowledgement reports that turn as interrupted, as for any turn in flight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Handoff {
    /// No prompt is being handed over.
    #[default]
    None,
    /// `in_turn` holds a prompt whose save has not finished: the worker waits.
    Saving,
    /// `in_turn` holds a durable prompt the worker has not started yet.
    Ready,
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
    pub(crate) order: u64,
    pub(crate) name: RwLock<String>,
    pub(crate) settings: Mutex<AgentSettings>,
    pub stats: Mutex<Stats>,
    pub(crate) queue: Mutex<VecDeque<String>>,
    /// The prompt of the turn in flight (or handed to it, see [`Handoff`]).
    pub(crate) in_turn: Mutex<Option<String>>,
    /// A prompt written to an idle agent goes straight to its turn (locked after `queue`).
    pub(crate) handoff: Mutex<Handoff>,
    /// The newest `feed` value waiting to be this agent's turn ([`crate::agent::feed`]);
    /// locked after `in_turn`. It runs when the queue is empty.
    pub(crate) feed_turn: Mutex<Option<String>>,
    /// Why the `agent_spawn` hook blocked the agent: every turn fails with it.
    pub(crate) blocked: Mutex<Option<String>>,
    /// While running: what the turn is doing (`thinking`, `calling: TOOL`, `limitretry`, …).
    pub(crate) detail: Mutex<String>,
    /// The chat block being streamed, if any.
    pub(crate) streaming: Mutex<Option<Block>>,
    /// The backend this agent talks to, by name (created on first use).
    pub backend: tokio::sync::Mutex<Option<(String, Arc<dyn crate::backend::Backend>)>>,
    /// Held while the history is in use by a turn or a compaction.
    pub history_lock: tokio::sync::Mutex<()>,
    /// `ctl compact` arrived while a turn was running: compact before its next model call.
    pub compact_requested: std::sync::atomic::AtomicBool,
    /// The reader of toolsrv's `proc/complete` for this agent has been started.
    pub completions_watched: std::sync::atomic::AtomicBool,
    pub(crate) queue_bell: Notify,
    pub(crate) feed: watch::Sender<Option<Bytes>>,
    pub(crate) state: watch::Sender<(u64, AgentState)>,
    pub chat: Chat,
    /// The plan as last written; held only to copy or swap it, never across the disk.
    pub(crate) plan: Mutex<Vec<u8>>,
    /// Held by a plan write from reading the plan until the new one is on disk and swapped in.
    pub(crate) plan_writing: Mutex<()>,
    pub(crate) killed: watch::Sender<bool>,
    /// Bumped by `stop`: the running turn ends.
    pub(crate) stop: watch::Sender<u64>,
    /// The last finished turn.
    pub(crate) turns: watch::Sender<Option<TurnEnd>>,
    /// The agent's own bead namespace (forked from the session's at creation, [`crate::state::ns`]).
    pub ns: NsHome,
    pub(crate) store: Arc<Store>,
    /// Held from taking the record to its rename into place ([`Agent::save`]), so that of
    /// two saves racing, the one that took the later record is also the one on disk.
    pub(crate) saving: Mutex<()>,
}

/// Largest `plan`.
pub const MAX_PLAN: usize = 1 << 20;
/// Largest prompt.
pub const MAX_PROMPT: usize = 1 << 20;
/// Largest `feed` value.
pub const MAX_FEED: usize = 1 << 20;
/// Prompts an agent may have queued.
pub const MAX_QUEUE: usize = 256;

fn queue_full() -> String {
    format!("too many queued prompts (limit {MAX_QUEUE})")
}

impl Agent {
    /// The agent's profile (its own, else `default`).
    pub fn profile<'c>(&self, config: &'c Config) -> Option<&'c Profile> {
        self.settings()
            .profile
            .as_deref()
            .and_then(|p| config.profiles.get(p))
            .or_else(|| config.profiles.get(crate::config::DEFAULT_PROFILE))
    }

    /// What toolsrv is told about this agent ([`crate::link::configure_agent`]).
    pub fn tools_spec(&self) -> AgentTools {
        let st = self.settings();
        AgentTools {
            id: self.id.clone(),
            profile: st.profile,
            tools: st.tools,
        }
    }

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
    pub(crate) fn stream_into(chat: &Chat, b: &mut Block, text: &str) {
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
                out.push_str(&std::mem::take(&mut b.line));
            } else if !OPEN_MARK.starts_with(b.line.as_str())
                && !CLOSE_MARK.starts_with(b.line.as_str())
            {
                // Not a marker: shown at once (a reply's first word is not kept back
                // until the next piece).
                out.push_str(&std::mem::take(&mut b.line));
                b.decided = true;
            } else if b.line.len() == OPEN_MARK.len() {
                out.push(' ');
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

    pub(crate) fn close_block(&self, mut b: Block) -> Result<(), String> {
        let rest = b.redact.finish();
        Self::stream_into(&self.chat, &mut b, &rest);
        // What is held is shorter than a marker (see `stream_into`): it goes out as it is.
        let mut out = std::mem::take(&mut b.line);
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
            .map_err(|e| crate::error_chain(&e))?;
        self.chat.made_durable(b.raw.len());
        Ok(())
    }

    pub(crate) fn record(&self) -> AgentRecord {
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
        // The wait for another save of this record blocks too.
        crate::util::blocking(|| {
            let _order = lock(&self.saving);
            self.store
                .save_agent(&self.record())
                .map_err(|e| crate::error_chain(&e))
        })
    }

    /// Sets the state; whether it changed.
    pub(crate) fn set_state(&self, st: AgentState) -> bool {
        self.state.send_if_modified(|(seq, s)| {
            if *s == st {
                return false;
            }
            *seq += 1;
            *s = st;
            true
        })
    }

    /// Reads the chat back from the first `len` bytes of `chat.raw` at start-up, and closes
    /// its last block if a crash tore it (so the next block starts on a line of its own).
    pub(crate) fn restore_chat(&self, len: u64) -> Result<(), String> {
        self.chat.restore(len)?;
        if let Some(end) = self.chat.unclosed() {
            self.store
                .append_chat(&self.session_id, &self.id, end, Sync::Now)
                .map_err(|e| crate::error_chain(&e))?;
            self.chat
                .append_durable(end, &crate::state::chat::strip_markers(end));
        }
        Ok(())
    }

    /// Appends a whole block to the chat, durably first.
    pub fn say(&self, kind: &str, attrs: &str, body: &str) -> Result<(), String> {
        self.say_sync(kind, attrs, body, Sync::Now)
    }

    /// [`Agent::say`], durable as `sync` says.
    /// Both are redacted ([`crate::redact`]): a tool call's arguments run as the model wrote
    /// them, but the chat shows them without API keys. A block being streamed is closed
    /// first, so the chat and `chat.raw` hold the blocks in the same order.
    pub fn say_sync(&self, kind: &str, attrs: &str, body: &str, sync: Sync) -> Result<(), String> {
        let attrs = crate::redact::redact(attrs);
        let body = crate::redact::redact(body);
        let (raw, text) = Chat::block_bytes(kind, &attrs, &body);
        let mut open = lock(&self.streaming);
        let closed = open.take().map_or(Ok(()), |b| self.close_block(b));
        self.store
            .append_chat(&self.session_id, &self.id, &raw, sync)
            .map_err(|e| crate::error_chain(&e))?;
        self.chat.append_durable(&raw, &text);
        drop(open);
        closed
    }

    /// Offers a feed value's prompt as the next turn after the queue: it replaces one that
    /// still waits, so a fast producer never builds a queue.
    pub(crate) fn offer_feed_turn(&self, prompt: String) {
        *lock(&self.feed_turn) = Some(prompt);
        self.queue_bell.notify_one();
    }

    /// Whether the agent can take one more prompt now: it is alive and its queue has room
    /// (checked again when the prompt is queued).
    pub fn has_room(&self) -> Result<(), String> {
        if self.is_killed() {
            return Err("file does not exist: the agent was killed".into());
        }
        if lock(&self.queue).len() >= MAX_QUEUE {
            return Err(queue_full());
        }
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
        self.has_room()?;
        let handed = {
            let mut q = lock(&self.queue);
            if q.len() >= MAX_QUEUE {
                return Err(queue_full());
            }
            let mut h = lock(&self.handoff);
            let mut t = lock(&self.in_turn);
            let paused = self.session.upgrade().is_none_or(|s| s.paused());
            if q.is_empty() && t.is_none() && *h == Handoff::None && !paused {
                *t = Some(prompt.clone());
                *h = Handoff::Saving;
                true
            } else {
                q.push_back(prompt.clone());
                false
            }
        };
        let saved = self.save();
        {
            let mut q = lock(&self.queue);
            let mut h = lock(&self.handoff);
            match (&saved, handed) {
                (Ok(()), true) => *h = Handoff::Ready,
                (Ok(()), false) => {}
                (Err(_), true) => {
                    *h = Handoff::None;
                    *lock(&self.in_turn) = None;
                }
                (Err(_), false) => {
                    // This prompt, not whatever a concurrent write queued after it.
                    if let Some(i) = q.iter().rposition(|x| *x == prompt) {
                        q.remove(i);
                    }
                }
            }
        }
        // Also after a failed hand-over: a worker that waited for it looks at the queue.
        self.queue_bell.notify_one();
        saved
    }

    /// Whether the worker has a prompt to start: one handed over, or (unless `paused`) the
    /// head of the queue. While a hand-over is being saved, none.
    pub(crate) fn has_prompt(&self, paused: bool) -> bool {
        let q = lock(&self.queue);
        match *lock(&self.handoff) {
            Handoff::Ready => !paused,
            Handoff::Saving => false,
            Handoff::None => !paused && (!q.is_empty() || lock(&self.feed_turn).is_some()),
        }
    }

    /// The prompt of the next turn, marked as in flight, and whether that still needs to be
    /// saved (a handed-over prompt is durable already; one from the queue is not).
    pub(crate) fn start_prompt(&self) -> Option<(String, bool)> {
        let mut q = lock(&self.queue);
        let mut h = lock(&self.handoff);
        let mut t = lock(&self.in_turn);
        match *h {
            Handoff::Ready => {
                *h = Handoff::None;
                t.clone().map(|p| (p, false))
            }
            Handoff::Saving => None,
            Handoff::None => {
                let p = match q.pop_front() {
                    Some(p) => p,
                    None => lock(&self.feed_turn).take()?,
                };
                *t = Some(p.clone());
                Some((p, true))
            }
        }
    }

    /// Undoes [`Agent::start_prompt`] of a queued prompt whose start could not be saved: it
    /// is the head of the queue again.
    pub(crate) fn unstart_prompt(&self, p: String) {
        let mut q = lock(&self.queue);
        *lock(&self.in_turn) = None;
        q.push_front(p);
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
        let v = collapse(v);
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

    /// The current `feed` value (none before the first).
    pub fn feed_value(&self) -> Option<Bytes> {
        self.feed.borrow().clone()
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
    ///
    /// Writes of one plan take turns; readers never wait for the disk. The whole write runs as
    /// blocking work ([`crate::util::blocking`]), so a writer waiting for another one's
    /// fsync does not hold up the tasks of its worker thread.
    pub fn write_plan(&self, offset: u64, data: &[u8], truncate: bool) -> Result<(), String> {
        crate::util::blocking(|| {
            let _writing = lock(&self.plan_writing);
            let mut next = if truncate {
                Vec::new()
            } else {
                lock(&self.plan).clone()
            };
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
            *lock(&self.plan) = next;
            Ok(())
        })
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
            // `feed` shows its default: the agent takes its feed as turns.
            let unset = if *k == "feed" { "turn" } else { "" };
            out.push_str(&format!(
                "{k}={}\n",
                s.cfg.get(*k).map(String::as_str).unwrap_or(unset)
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
    pub(crate) fn mark_killed(&self) {
        self.killed.send_replace(true);
        self.set_state(AgentState::Killed);
        self.chat.close();
        self.queue_bell.notify_waiters();
    }

    /// Renames (the caller checks uniqueness), durably.
    pub(crate) fn rename(&self, to: &str) -> Result<(), String> {
        let old = self.name();
        write(&self.name, to.to_owned());
        if let Err(e) = self.save() {
            write(&self.name, old);
            return Err(e);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The agent's file tools

impl Agent {
    /// The agent's mount points (`/ctx`), in the order they were first mounted.
    pub fn ns_points(&self) -> Vec<String> {
        self.ns.points()
    }

    /// Reads the whole file at the absolute `path` through the agent's union view: `None` when
    /// `path` is not under one of [`Agent::ns_points`] (`/ctx/notes/a.md` is under `/ctx`),
    /// else its bytes (at most [`MAX_FILE`](crate::state::ns::MAX_FILE)) or a one-line error (missing, a directory, too
    /// large, `..` in the path).
    pub fn ns_read(&self, path: &str) -> Option<Result<Vec<u8>, String>> {
        let split = split_path(&self.ns.points(), path)?;
        Some(split.and_then(|(point, rel)| self.ns.read_file(&point, &rel)))
    }

    /// Creates, or truncates and rewrites, the file at the absolute `path` through the agent's
    /// union view with `content` (at most [`MAX_FILE`](crate::state::ns::MAX_FILE)): `None` when `path` is not under one of
    /// [`Agent::ns_points`], else the bytes written or a one-line error. A new file lands where
    /// a create does (the create target's `<today>/<kind>/…` under a kind folder when one is
    /// pinned, else the shadow layer); missing parent directories are made below a kind folder
    /// (`/ctx/notes/a/b.md` makes `notes/a/`), elsewhere the parent must exist. An existing
    /// file of a read-only member is copied up first; the member is never written.
    pub fn ns_write(&self, path: &str, content: &[u8]) -> Option<Result<usize, String>> {
        let split = split_path(&self.ns.points(), path)?;
        Some(split.and_then(|(point, rel)| self.ns.write_file(&point, &rel, content)))
    }

    /// The agent's points as overlay layers, for the commands its tools run (toolsrv mounts
    /// them at the points in the tool's mount namespace); empty without points.
    pub fn ns_overlays(&self) -> Result<Vec<ollie_beads::OverlayLayers>, String> {
        let ns = self.ns.snapshot();
        if ns.points().is_empty() {
            return Ok(Vec::new());
        }
        let env = self.ns.env(false)?;
        ns.points()
            .iter()
            .map(|p| ns.overlay_layers(&env, p.path()).map_err(|e| e.to_string()))
            .collect()
    }

    /// Moves what the agent's commands created under the kind folders of a point with a
    /// create target from its shadow layer into that target (as a create through the view
    /// would have); returns how many files moved.
    pub fn ns_settle(&self) -> Result<usize, String> {
        let ns = self.ns.snapshot();
        if ns.points().iter().all(|p| p.create_target().is_none()) {
            return Ok(0);
        }
        let env = self.ns.env(false)?;
        let mut moved = 0;
        for p in ns.points() {
            if p.create_target().is_some() {
                moved += ns
                    .settle(&env, p.path())
                    .map_err(|e| e.to_string())?
                    .moved
                    .len();
            }
        }
        Ok(moved)
    }
}

#[derive(Debug)]
pub struct Session {
    pub handle: u32,
    pub id: String,
    pub created: u64,
    pub(crate) order: u64,
    pub(crate) name: RwLock<String>,
    /// The session's working directory: toolsrv's workspace. A session made without `cwd=`
    /// has none until its first agent brings one ([`Registry::create_agent`]).
    ///
    /// [`Registry::create_agent`]: crate::state::Registry::create_agent
    pub(crate) cwd: std::sync::OnceLock<PathBuf>,
    pub backend: Option<String>,
    pub model: Option<String>,
    pub profile: Option<String>,
    pub remote: Option<String>,
    pub(crate) paused: watch::Sender<bool>,
    pub(crate) agents: RwLock<Vec<Arc<Agent>>>,
    pub(crate) killed: watch::Sender<bool>,
    pub link: ToolLink,
    /// The session's own cost cap in US dollars (`None`: `cost_cap_usd` of the config).
    pub(crate) cost_cap: Mutex<Option<f64>>,
    /// The session's bead namespace, the template new agents copy ([`crate::state::ns`]).
    pub ns: NsHome,
    pub(crate) store: Arc<Store>,
    /// As [`Agent::saving`], for [`Session::save`].
    pub(crate) saving: Mutex<()>,
    /// The egress proxy's decisions for this session's runs (`net` events of its toolsrv's
    /// `bypass/log`), as `session/NAME/net` streams them: the last
    /// [`crate::state::events::RING`] kept.
    pub net: crate::state::events::Events,
}

impl Session {
    pub fn name(&self) -> String {
        read(&self.name)
    }

    /// The working directory, if the session has one yet.
    pub fn cwd(&self) -> Option<&PathBuf> {
        self.cwd.get()
    }

    /// The working directory as `cfg` and `env` show it (empty while there is none).
    fn cwd_text(&self) -> String {
        self.cwd()
            .map(|c| c.display().to_string())
            .unwrap_or_default()
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

    pub(crate) fn record(&self) -> SessionRecord {
        SessionRecord {
            id: self.id.clone(),
            name: self.name(),
            // Stored empty while there is none.
            cwd: self.cwd().cloned().unwrap_or_default(),
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
        // The wait for another save of this record blocks too.
        crate::util::blocking(|| {
            let _order = lock(&self.saving);
            self.store
                .save_session(&self.record())
                .map_err(|e| crate::error_chain(&e))
        })
    }

    /// `env`: `OLLIE_SESSION_ID`, other non-secret session facts, and the server's own
    /// non-secret `OLLIE_*` variables.
    pub fn env_text(&self) -> String {
        let mut out = format!(
            "OLLIE_SESSION_ID={}\nOLLIE_SESSION_NAME={}\nOLLIE_SESSION_CWD={}\n",
            self.id,
            self.name(),
            self.cwd_text()
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
            self.cwd_text(),
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

/// A feed value that is one block of whole lines written more than once is that block: "same
/// data written repeatedly never wakes the reader" (the seed). A producer that prints the
/// same diff twice in quick succession (`while :; do ollie-9p read …/statewait; git diff;
/// done`, two state changes within the feed's quiet interval) sends both in one value.
fn collapse(v: Bytes) -> Bytes {
    let n = v.len();
    for p in 1..=n / 2 {
        if n.is_multiple_of(p) && v.get(p - 1) == Some(&b'\n') && repeats(&v, &v[..p]) {
            return v.slice(..p);
        }
    }
    v
}

/// Whether `v` is `unit` written one or more times.
fn repeats(v: &[u8], unit: &[u8]) -> bool {
    if unit.is_empty() {
        return v.is_empty();
    }
    !v.is_empty() && v.len().is_multiple_of(unit.len()) && v.chunks(unit.len()).all(|c| c == unit)
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
    /// `force=yes`: accept a cwd that is too broad for a workspace (`settings::too_broad`).
    pub force: bool,
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
                "force" => {
                    spec.force = match v.as_deref() {
                        Some("yes" | "true" | "1") => true,
                        Some("no" | "false" | "0") => false,
                        _ => return Err("force: give yes or no".into()),
                    }
                }
                _ => {}
            }
            rest = next;
        }
    }
    Ok(spec)
}

// ---------------------------------------------------------------------------------------
// The registry

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_value_written_repeatedly_is_no_new_value() {
        assert!(repeats(b"d\n", b"d\n"));
        assert!(repeats(b"d\nd\nd\n", b"d\n"));
        assert!(repeats(b"", b""));
        assert!(!repeats(b"d\nd", b"d\n"));
        assert!(!repeats(b"d\ne\n", b"d\n"));
        assert!(!repeats(b"", b"d\n"));
        assert!(!repeats(b"d\n", b""));
        // A block of whole lines written again is that block; anything else is as written.
        let c = |v: &'static [u8]| collapse(Bytes::from_static(v));
        assert_eq!(
            &c(b"diff a\n+x\ndiff a\n+x\ndiff a\n+x\n")[..],
            b"diff a\n+x\n"
        );
        assert_eq!(&c(b"diff a\n+x\n")[..], b"diff a\n+x\n");
        assert_eq!(&c(b"abab")[..], b"abab");
        assert_eq!(&c(b"a\nb\na\n")[..], b"a\nb\na\n");
        assert_eq!(&c(b"")[..], b"");
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

    /// The live chat's text after streaming `pieces` into a fresh block, piece by piece.
    fn streamed(pieces: &[&str]) -> Vec<String> {
        let chat = Chat::new(Box::new(|_, _| Ok(Vec::new())));
        let mut b = Block {
            kind: "assistant".to_owned(),
            raw: Vec::new(),
            redact: crate::redact::Stream::default(),
            line: String::new(),
            decided: false,
            ends_line: true,
        };
        pieces
            .iter()
            .map(|p| {
                Agent::stream_into(&chat, &mut b, p);
                let n = chat.len(crate::state::chat::ChatKind::Raw);
                let now = chat.tail(usize::try_from(n).unwrap());
                String::from_utf8(now.to_vec()).unwrap()
            })
            .collect()
    }

    #[test]
    fn a_streamed_word_shows_at_once_unless_it_could_begin_a_marker() {
        // A first word shorter than a marker is not kept back for the next piece.
        assert_eq!(streamed(&["In", " a", "\nI"]), ["In", "In a", "In a\nI"]);
        // What could still begin a marker waits; a marker line is indented.
        assert_eq!(
            streamed(&["[", "[", "[x\n", "]]", "]\n", "]", "!"]),
            [
                "",
                "",
                " [[[x\n",
                " [[[x\n",
                " [[[x\n ]]]\n",
                " [[[x\n ]]]\n",
                " [[[x\n ]]]\n]!"
            ]
        );
        // A held start that turns out not to be a marker goes out with what follows.
        assert_eq!(streamed(&["[[", "a"]), ["", "[[a"]);
        assert_eq!(streamed(&["]]\n"]), ["]]\n"]);
    }

    #[test]
    fn secret_looking_names() {
        assert!(looks_secret("OLLIE_API_KEY"));
        assert!(looks_secret("OLLIE_TOKEN"));
        assert!(!looks_secret("OLLIE_LOG"));
    }
}
