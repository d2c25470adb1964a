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
    /// The holds sessions' escalations keep on the other sessions ([`crate::holds`]).
    pub holds: crate::state::holds::PeerHolds,
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
            holds: crate::state::holds::PeerHolds::default(),
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
        cwd: Option<PathBuf>,
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
            cwd: cwd.map_or_else(std::sync::OnceLock::new, std::sync::OnceLock::from),
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
            net: crate::state::events::Events::new(),
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
            handoff: Mutex::new(Default::default()),
            feed_turn: Mutex::new(None),
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
            plan_writing: Mutex::new(()),
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
        // statewait shows the detail only while a turn runs: otherwise it has nothing new.
        a.state.send_if_modified(|(seq, st)| {
            if *st != AgentState::Running {
                return false;
            }
            *seq += 1;
            true
        });
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

    /// Waits until `a` has a prompt to start (true) or dies (false); honours `paused`.
    pub async fn next_prompt(&self, a: &Agent) -> bool {
        let mut killed = a.killed.subscribe();
        loop {
            let notified = a.queue_bell.notified();
            if a.is_killed() {
                return false;
            }
            let paused = a.session.upgrade().is_none_or(|s| s.paused());
            if a.has_prompt(paused) {
                return true;
            }
            tokio::select! {
                _ = notified => {}
                r = killed.changed() => if r.is_err() { return false; },
            }
        }
    }

    /// Takes the prompt `next_prompt` found and marks its turn as in flight, durably (a
    /// crash from here on reports the turn as interrupted on restart instead of running it
    /// twice); a prompt handed over by its write is so already. If that cannot be recorded
    /// (a full or read-only state directory) the prompt goes back to the head of the queue
    /// and the error is returned: a turn the disk still shows as queued must not run, or a
    /// crash would run it again.
    pub fn take_prompt(&self, a: &Agent) -> Result<Option<String>, String> {
        let Some((p, unsaved)) = a.start_prompt() else {
            return Ok(None);
        };
        if unsaved && let Err(e) = a.save() {
            a.unstart_prompt(p);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::store::{AgentRecord, SessionRecord};

    const S: &str = "11111111-1111-4111-8111-111111111111";
    const A: &str = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";

    /// A registry over a fresh state directory with one session and one agent, built as a
    /// restart builds them: no toolsrv, no worker (the test plays the worker).
    fn one_agent() -> (tempfile::TempDir, Registry, Arc<Session>, Arc<Agent>) {
        let t = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&t.path().join("state")).unwrap());
        let reg = Registry::new(
            Arc::new(Events::new()),
            Arc::clone(&store),
            Arc::new(RwLock::new(Arc::new(Config::default()))),
            PathBuf::from("/nonexistent/toolsrv"),
        );
        let sr = SessionRecord {
            id: S.into(),
            name: "s".into(),
            cwd: t.path().into(),
            backend: None,
            model: None,
            profile: None,
            remote: None,
            paused: false,
            created: 1,
            order: 1,
            cost_cap_usd: None,
        };
        store.save_session(&sr).unwrap();
        let s = reg.build_session(
            sr.id.clone(),
            sr.name.clone(),
            Some(sr.cwd.clone()),
            (None, None, None),
            None,
            1,
            1,
            false,
        );
        let ar = AgentRecord {
            id: A.into(),
            session: S.into(),
            name: "a".into(),
            cwd: t.path().into(),
            backend: None,
            model: None,
            profile: None,
            cfg: Default::default(),
            created: 1,
            order: 2,
            stats: Default::default(),
            tools: None,
            queue: Vec::new(),
            in_turn: None,
            blocked: None,
        };
        let a = reg.build_agent(&s, &ar);
        a.save().unwrap();
        (t, reg, s, a)
    }

    /// The agent's queue and turn in flight as the state directory has them.
    fn on_disk(reg: &Registry) -> (Vec<String>, Option<String>) {
        let l = reg.store.load();
        let r = &l.sessions[0].agents[0].record;
        (r.queue.clone(), r.in_turn.clone())
    }

    /// A prompt written to an idle agent is its turn in flight as soon as the write is
    /// acknowledged (one save); one written while a turn runs is queued, and taken (saved)
    /// when that turn has finished.
    #[test]
    fn a_prompt_to_an_idle_agent_is_handed_to_its_turn_and_later_ones_queue() {
        let (_t, reg, _s, a) = one_agent();
        a.enqueue("first".into()).unwrap();
        assert_eq!(on_disk(&reg), (vec![], Some("first".into())));
        assert!(a.has_prompt(false));
        assert_eq!(reg.take_prompt(&a).unwrap().as_deref(), Some("first"));
        // Taken once: nothing more to start.
        assert!(!a.has_prompt(false));
        assert_eq!(reg.take_prompt(&a).unwrap(), None);

        a.enqueue("second".into()).unwrap();
        assert_eq!(
            on_disk(&reg),
            (vec!["second".to_owned()], Some("first".into()))
        );
        reg.finish_turn(&a);
        assert_eq!(on_disk(&reg), (vec!["second".to_owned()], None));
        assert_eq!(reg.take_prompt(&a).unwrap().as_deref(), Some("second"));
        assert_eq!(on_disk(&reg), (vec![], Some("second".into())));
    }

    /// In a paused session a prompt is queued, not handed over: `fifo` can still take it,
    /// and no turn starts until the session resumes. A handed-over prompt waits for a pause
    /// to end too.
    #[test]
    fn a_paused_session_queues_and_holds_back_a_handed_prompt() {
        let (_t, reg, s, a) = one_agent();
        s.set_paused(true).unwrap();
        a.enqueue("while paused".into()).unwrap();
        assert_eq!(on_disk(&reg), (vec!["while paused".to_owned()], None));
        assert!(!a.has_prompt(true));
        assert_eq!(a.dequeue().unwrap().as_deref(), Some("while paused"));
        s.set_paused(false).unwrap();

        a.enqueue("handed".into()).unwrap();
        assert!(a.has_prompt(false));
        assert!(!a.has_prompt(true));
    }

    /// A hand-over whose save fails is refused and leaves nothing behind: no turn to start,
    /// nothing queued, and the next prompt is handed over normally.
    #[test]
    fn a_hand_over_that_cannot_be_saved_is_refused_and_undone() {
        let (_t, reg, _s, a) = one_agent();
        let dir = reg.store.dir().join("sessions").join(S);
        let aside = dir.with_extension("aside");
        std::fs::rename(&dir, &aside).unwrap();
        let e = a.enqueue("lost".into()).unwrap_err();
        assert!(!e.is_empty());
        assert!(!a.has_prompt(false));
        assert_eq!(reg.take_prompt(&a).unwrap(), None);
        assert!(lock(&a.queue).is_empty());
        assert_eq!(*lock(&a.in_turn), None);
        std::fs::rename(&aside, &dir).unwrap();
        a.enqueue("kept".into()).unwrap();
        assert_eq!(on_disk(&reg), (vec![], Some("kept".into())));
        assert_eq!(reg.take_prompt(&a).unwrap().as_deref(), Some("kept"));
    }

    /// A detail (a hook, a compaction) of an agent that is not running changes nothing a
    /// statewait reader sees, so it wakes none; while a turn runs, each new detail does.
    #[test]
    fn a_detail_wakes_statewait_only_while_running() {
        let (_t, reg, _s, a) = one_agent();
        let (idle, _) = a.state();
        reg.detail(&a, "hook: agent_spawn");
        assert_eq!(a.state().0, idle);
        assert_eq!(a.state_text(), "idle");
        reg.state_changed(&a, AgentState::Running);
        reg.detail(&a, "thinking");
        assert_eq!(
            a.state().0,
            idle + 1,
            "thinking is what a running turn shows already"
        );
        reg.detail(&a, "calling: bash");
        assert_eq!(a.state().0, idle + 2);
        assert_eq!(a.state_text(), "calling: bash");
    }

    /// A plan write waiting for the disk holds only the writers' turn: the plan can be read
    /// meanwhile, and a second write waits for its turn and then lands whole.
    #[test]
    fn a_plan_write_keeps_readers_off_the_disk_and_writers_in_turn() {
        let (_t, _reg, _s, a) = one_agent();
        a.write_plan(0, b"first plan\n", true).unwrap();
        // As a write in the middle of its fsync.
        let turn = a.plan_writing.lock().unwrap();
        assert_eq!(&a.plan()[..], b"first plan\n");
        let (tx, rx) = std::sync::mpsc::channel();
        let a2 = Arc::clone(&a);
        let second = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw()).unwrap();
            a2.write_plan(0, b"second\n", true)
        });
        // The second write either goes to sleep waiting for its turn (its thread's state
        // becomes S: nothing before the lock sleeps), or, not waiting, ends and its thread
        // leaves /proc.
        let stat = format!("/proc/self/task/{}/stat", rx.recv().unwrap());
        loop {
            let Ok(line) = std::fs::read_to_string(&stat) else {
                panic!("a second plan write did not wait for the first");
            };
            let state = line.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
            if state == Some("S") {
                break;
            }
            std::thread::yield_now();
        }
        assert_eq!(&a.plan()[..], b"first plan\n");
        drop(turn);
        second.join().unwrap().unwrap();
        assert_eq!(&a.plan()[..], b"second\n");
    }
}
