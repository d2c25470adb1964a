//! Every session, looked up by name or id, and the announcements about agents.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde_json::Value;
use tokio::sync::{Notify, watch};

use crate::config::Config;
use crate::link::ToolLink;
use crate::state::chat::Chat;
use crate::state::events::Events;
use crate::state::ns::NsHome;
use crate::state::session::Session;
use crate::state::session::{Agent, AgentState, TurnEnd};
use crate::state::settings::{AgentSettings, Stats};
use crate::state::store::{AgentRecord, Store};
use crate::state::validate_name;
use crate::util::{ev, lock, read, write};

/// Every session, and what creating and killing them needs.
#[derive(Debug)]
pub struct Registry {
    pub events: Arc<Events>,
    pub store: Arc<Store>,
    pub config: Arc<RwLock<Arc<Config>>>,
    pub(crate) sessions: RwLock<Vec<Arc<Session>>>,
    pub(crate) handles: AtomicU32,
    pub(crate) order: AtomicU64,
    /// Serialises creations, renames and kills (name uniqueness).
    pub(crate) naming: Mutex<()>,
    /// The toolsrv binary.
    pub toolsrv: PathBuf,
    /// Bumped whenever the set or names of sessions/agents change (`aliases`, `idx`).
    pub version: AtomicU32,
    /// Every session's escalation requests, and the audit log.
    pub bypass: Arc<crate::state::bypass::Bypass>,
}

impl Registry {
    pub fn new(
        events: Arc<Events>,
        store: Arc<Store>,
        config: Arc<RwLock<Arc<Config>>>,
        toolsrv: PathBuf,
    ) -> Registry {
        Registry {
            bypass: Arc::new(crate::state::bypass::Bypass::new(
                store.dir(),
                Arc::clone(&events),
            )),
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

    pub(crate) fn handle(&self) -> u32 {
        self.handles.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn bump(&self) {
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

    /// Replays a saved namespace; problems are logged and announced like those of the store.
    pub(crate) fn restore_ns(&self, ns: &NsHome) {
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
    pub(crate) fn build_session(
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
            saving: Mutex::new(()),
        })
    }

    /// Reads an agent's `chat.raw` back for its [`Chat`].
    fn chat_reader(&self, session: &str, agent: &str) -> crate::state::chat::Reader {
        let store = Arc::clone(&self.store);
        let (session, agent) = (session.to_owned(), agent.to_owned());
        Box::new(move |offset, len| {
            store
                .read_chat(&session, &agent, offset, len)
                .map_err(|e| crate::error_chain(&e))
        })
    }

    pub(crate) fn build_agent(&self, s: &Arc<Session>, r: &AgentRecord) -> Arc<Agent> {
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
            chat: Chat::new(self.chat_reader(&s.id, &r.id)),
            plan: Mutex::new(Vec::new()),
            killed: watch::Sender::new(false),
            stop: watch::Sender::new(0),
            turns: watch::Sender::new(None),
            store: Arc::clone(&self.store),
            saving: Mutex::new(()),
        })
    }

    pub(crate) fn unique_session_name(&self, base: &str) -> String {
        let taken = |n: &str| self.sessions().iter().any(|s| s.name() == n);
        if !taken(base) {
            return base.to_owned();
        }
        (2..)
            .map(|i| format!("{base}{i}"))
            .find(|n| !taken(n))
            .unwrap_or_default()
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
    /// instead of running it twice). If that cannot be recorded (a full or read-only state
    /// directory) the prompt goes back to the head of the queue and the error is returned:
    /// a turn the disk still shows as queued must not run, or a crash would run it again.
    pub fn take_prompt(&self, a: &Agent) -> Result<Option<String>, String> {
        let Some(p) = lock(&a.queue).pop_front() else {
            return Ok(None);
        };
        *lock(&a.in_turn) = Some(p.clone());
        if let Err(e) = a.save() {
            *lock(&a.in_turn) = None;
            lock(&a.queue).push_front(p);
            return Err(e);
        }
        Ok(Some(p))
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
