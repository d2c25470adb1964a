//! Creating, restoring and killing sessions and agents: the only place that starts an
//! agent's worker ([`crate::agent::turn::start_worker`]) and a session's toolsrv supervisor
//! ([`crate::supervise`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;

use crate::state::session::{Agent, NewSpec, Session};
use crate::state::settings::{
    AgentSettings, apply_setting, list_or_none, refuse_broad, remote_dir, workspace_dir,
};
use crate::state::store::AgentRecord;
use crate::state::{Registry, new_uuid, validate_name};
use crate::supervise;
use crate::util::{clip, ev, lock, now};

impl Registry {
    /// Restores what the store has. Problems are logged and announced, never fatal.
    pub fn restore(self: &Arc<Self>) {
        // Before any toolsrv runs: what it asks for from now on is audited after the repair.
        self.bypass.recover();
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
                // Empty: made without a cwd, and no agent has given it one yet.
                (!r.cwd.as_os_str().is_empty()).then(|| r.cwd.clone()),
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
                if let Err(e) = agent.restore_chat(la.chat_raw_len) {
                    tracing::warn!(agent = %agent.id, error = %e, "cannot read the chat back");
                }
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
            self.start_toolsrv(&s);
            for a in s.agents() {
                crate::agent::turn::start_worker(Arc::clone(&a), Arc::clone(self), false);
                crate::agent::feed::start(a);
            }
        }
        self.order.fetch_max(max_order + 1, Ordering::Relaxed);
        self.bump();
    }
    /// Starts the session's toolsrv supervisor, or, for a session without a working
    /// directory yet, says why there is none (its first agent starts it).
    fn start_toolsrv(self: &Arc<Self>, s: &Arc<Session>) {
        if s.cwd().is_some() {
            supervise::start(Arc::clone(s), Arc::clone(self));
        } else {
            s.link.no_workspace();
        }
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
            (Some(_), Some(c)) => {
                let d = remote_dir(c)?;
                refuse_broad(&d, None, spec.force)?;
                Some(d)
            }
            (Some(r), None) => {
                return Err(format!(
                    "remote {:?}: give cwd= (an absolute directory on the remote host)",
                    clip(r)
                ));
            }
            (None, Some(c)) => Some(workspace_dir(c, spec.force)?),
            // As in the seed (`name=myproj`): the working directory comes with the first
            // agent (`agent/new … cwd=DIR`).
            (None, None) => None,
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
                cwd.as_deref()
                    .and_then(|c| c.file_name())
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
        self.start_toolsrv(&s);
        self.events.emit(
            "session-created",
            ev(&[
                ("session", Value::from(s.id.clone())),
                ("name", Value::from(s.name())),
            ]),
        );
        Ok(s)
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
            cwd: s.cwd().cloned().unwrap_or_default(),
            backend: s.backend.clone(),
            model: s.model.clone(),
            profile: s.profile.clone(),
            ..AgentSettings::default()
        };
        match &spec.cwd {
            Some(c) => settings.cwd = workspace_dir(c, spec.force)?,
            None if s.cwd().is_none() => {
                return Err(format!(
                    "session {} has no working directory of its own: give the agent one (cwd=DIR)",
                    s.name()
                ));
            }
            None => {}
        }
        for (k, v) in [
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
        // A session made without a cwd takes its first agent's as its workspace, and its
        // toolsrv starts now.
        let adopted = s.cwd().is_none() && s.cwd.set(settings.cwd.clone()).is_ok();
        if adopted && let Err(e) = s.save() {
            tracing::warn!(session = %s.id, error = %e, "cannot record the session's working directory; it is kept until olliesrv stops");
        }
        self.bump();
        drop(_g);
        if adopted {
            supervise::start(Arc::clone(s), Arc::clone(self));
        }
        crate::agent::turn::start_worker(Arc::clone(&a), Arc::clone(self), true);
        crate::agent::feed::start(Arc::clone(&a));
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
            s.link.agent_removed(&a.id);
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
}
