//! The connection to a session's toolsrv ([`Conn`]: the operator's fid, one attach per
//! agent identity, `ctl`/`info` and proc calls) and the link's published state
//! ([`ToolLink`]), which the supervisor ([`crate::supervise`]) updates and everyone else waits
//! on. Agents are named by their ids: nothing here knows an agent or a session object.
//!
//! [`Conn`]: crate::link::Conn
//! [`ToolLink`]: crate::link::ToolLink

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ollie_link::auth::{Identity, MasterKey};
use ollie_link::spawn::attach;
use ollie_p9::{Client, Fid};
use tokio::sync::watch;

use crate::config::Config;

/// A live connection to a session's toolsrv.
#[derive(Debug)]
pub struct Conn {
    pub client: Client,
    pub key: MasterKey,
    /// The operator's root fid.
    pub operator: Fid,
    /// Agents' root fids, attached on first use.
    agents: tokio::sync::Mutex<HashMap<String, Arc<Fid>>>,
    /// The policy each hook identity was last configured with.
    hook_policies: tokio::sync::Mutex<HashMap<String, String>>,
}

/// What toolsrv is told about an agent: its id, the profile that gives its policy,
/// escalations and tools, and its own tool list if it has one.
#[derive(Debug, Clone)]
pub struct AgentTools {
    pub id: String,
    pub profile: Option<String>,
    pub tools: Option<Vec<String>>,
}

/// The toolsrv identity an agent's hooks run as (agent ids are UUIDs, so it is nobody
/// else's).
pub fn identity(agent_id: &str) -> String {
    format!("{agent_id}.hook")
}

impl Conn {
    /// A connection over `client`, authenticated as the operator with `operator`.
    pub fn new(client: Client, key: MasterKey, operator: Fid) -> Conn {
        Conn {
            client,
            key,
            operator,
            agents: tokio::sync::Mutex::new(HashMap::new()),
            hook_policies: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The root fid of `a`'s identity. On first use the agent is configured in toolsrv
    /// (its profile's policy and tools) before it is attached, so nothing can ever run for
    /// it under toolsrv's default policy.
    pub async fn agent_root(&self, a: &AgentTools, config: &Config) -> Result<Arc<Fid>, String> {
        let mut m = self.agents.lock().await;
        if let Some(f) = m.get(&a.id) {
            return Ok(Arc::clone(f));
        }
        configure_agent(self, a, config).await?;
        let f = attach(&self.client, &self.key, &Identity::Agent(a.id.clone()))
            .await
            .map_err(|e| format!("toolsrv: {e}"))?;
        let f = Arc::new(f);
        m.insert(a.id.clone(), Arc::clone(&f));
        Ok(f)
    }

    /// The root fid of `agent`'s hook identity ([`identity`]), configured
    /// with `policy`, no escalations and `execute_code` alone before its first run and again
    /// whenever the policy asked for changes (a profile changed by `invalidate`).
    pub async fn hook_root(&self, agent: &str, policy: &str) -> Result<Arc<Fid>, String> {
        let id = identity(agent);
        {
            let mut done = self.hook_policies.lock().await;
            if done.get(&id).map(String::as_str) != Some(policy) {
                self.ctl(&format!("policy {id} {policy}")).await?;
                self.ctl(&format!("escalations {id} none")).await?;
                for t in ollie_link::tools::names() {
                    let verb = if t == "execute_code" {
                        "load"
                    } else {
                        "unload"
                    };
                    self.ctl(&format!("{verb} {id} {t}")).await?;
                }
                done.insert(id.clone(), policy.to_owned());
            }
        }
        let mut m = self.agents.lock().await;
        if let Some(f) = m.get(&id) {
            return Ok(Arc::clone(f));
        }
        let f = attach(&self.client, &self.key, &Identity::Agent(id.clone()))
            .await
            .map_err(|e| format!("toolsrv: {e}"))?;
        let f = Arc::new(f);
        m.insert(id, Arc::clone(&f));
        Ok(f)
    }

    /// The root fid of an agent that was attached before, if any.
    async fn attached(&self, agent: &str) -> Option<Arc<Fid>> {
        self.agents.lock().await.get(agent).cloned()
    }

    /// toolsrv's `info` (host, pid, platform, sandbox layers), read as the operator.
    pub async fn info(&self) -> Result<String, String> {
        let mut f = self
            .operator
            .walk(&["info"])
            .await
            .map_err(|e| format!("toolsrv: {e}"))?;
        f.open(ollie_p9::wire::om::OREAD)
            .await
            .map_err(|e| format!("toolsrv: {e}"))?;
        let b = f.read_to_end().await.map_err(|e| format!("toolsrv: {e}"))?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    /// Reads one JSON object per read from the blocking file at `path` (as the operator; a
    /// long one comes in pieces, the last ending in a newline) and hands each, with its text,
    /// to `each`, until the end of the file or an error. A piece that is not JSON is logged
    /// and skipped.
    pub async fn read_json_lines(
        &self,
        path: &[&str],
        mut each: impl FnMut(String, serde_json::Value),
    ) -> Result<(), String> {
        let mut f = self.operator.walk(path).await.map_err(|e| e.to_string())?;
        f.open(ollie_p9::wire::om::OREAD)
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        loop {
            let b = f.read(0, 64 * 1024).await.map_err(|e| e.to_string())?;
            if b.is_empty() {
                return Ok(());
            }
            buf.extend_from_slice(&b);
            if buf.last() != Some(&b'\n') {
                continue;
            }
            let text = String::from_utf8_lossy(&std::mem::take(&mut buf)).into_owned();
            match serde_json::from_str(&text) {
                Ok(v) => each(text, v),
                Err(_) => {
                    tracing::warn!(file = %path.join("/"), "toolsrv gave something that is not JSON")
                }
            }
        }
    }

    /// One round trip that toolsrv answers without doing anything (a Tstat of the
    /// operator's root): whether it is alive.
    pub async fn ping(&self) -> Result<(), String> {
        self.operator
            .stat()
            .await
            .map(|_| ())
            .map_err(|e| format!("toolsrv: {e}"))
    }

    /// Writes one command to toolsrv's `ctl` as the operator.
    pub async fn ctl(&self, cmd: &str) -> Result<(), String> {
        let mut f = self
            .operator
            .walk(&["ctl"])
            .await
            .map_err(|e| format!("toolsrv: {e}"))?;
        f.open(ollie_p9::wire::om::OWRITE)
            .await
            .map_err(|e| format!("toolsrv: {e}"))?;
        f.write(0, Bytes::from(cmd.to_owned()))
            .await
            .map_err(|e| format!("toolsrv: {e}"))?;
        Ok(())
    }
}

/// One blocking call of a `proc/` file (`new`, `new.bg`) as `root`'s identity: writes the
/// payload as one Twrite and reads the whole reply.
pub async fn proc_call(root: &Fid, file: &str, payload: String) -> Result<Vec<u8>, String> {
    let mut f = root
        .walk(&["proc", file])
        .await
        .map_err(|e| format!("toolsrv: {e}"))?;
    f.open(ollie_p9::wire::om::ORDWR)
        .await
        .map_err(|e| format!("toolsrv: {e}"))?;
    if payload.len() > f.iounit() as usize {
        return Err(format!(
            "the call is {} bytes; at most {} fit in one request to toolsrv (write a large file in pieces)",
            payload.len(),
            f.iounit()
        ));
    }
    f.write(0, Bytes::from(payload))
        .await
        .map_err(|e| call_error(&e))?;
    f.read_to_end().await.map_err(|e| call_error(&e))
}

/// A tool call's 9P failure as the chat and the model see it: a lost link says so (instead of
/// a bare "connection closed").
pub fn call_error(e: &ollie_p9::ClientError) -> String {
    match e {
        ollie_p9::ClientError::Closed | ollie_p9::ClientError::Io(_) => format!(
            "the link to the session's toolsrv was lost during the call ({e}); the call did not finish, and toolsrv is being restarted"
        ),
        _ => e.to_string(),
    }
}

/// Where a session's toolsrv is.
#[derive(Debug, Clone)]
pub enum LinkState {
    /// Not started yet, or being started.
    Starting,
    /// Serving.
    Up(Arc<Conn>),
    /// Died; a new one is being started. The reason.
    Restarting(String),
    /// Could not be started; retried with backoff. The reason.
    Failed(String),
    /// The session was killed.
    Stopped,
}

impl LinkState {
    pub fn name(&self) -> &'static str {
        match self {
            LinkState::Starting => "starting",
            LinkState::Up(_) => "up",
            LinkState::Restarting(_) => "restarting",
            LinkState::Failed(_) => "failed",
            LinkState::Stopped => "stopped",
        }
    }
}

/// A session's toolsrv link.
#[derive(Debug)]
pub struct ToolLink {
    pub(crate) state: watch::Sender<LinkState>,
    pub(crate) stop: watch::Sender<bool>,
    /// Whether the supervisor task runs (it ends once toolsrv has exited for good).
    running: watch::Sender<bool>,
    /// How many times toolsrv was started.
    pub starts: Mutex<u64>,
    /// While the link is up but toolsrv leaves a liveness check unanswered: why.
    unresponsive: watch::Sender<Option<String>>,
}

impl Default for ToolLink {
    fn default() -> Self {
        ToolLink::new()
    }
}

impl ToolLink {
    pub fn new() -> ToolLink {
        ToolLink {
            state: watch::Sender::new(LinkState::Starting),
            stop: watch::Sender::new(false),
            running: watch::Sender::new(false),
            starts: Mutex::new(0),
            unresponsive: watch::Sender::new(None),
        }
    }

    pub fn state(&self) -> LinkState {
        self.state.borrow().clone()
    }

    /// The state's name, or `unresponsive` while it is up but does not answer.
    pub fn state_name(&self) -> &'static str {
        let st = self.state();
        if matches!(st, LinkState::Up(_)) && self.unresponsive.borrow().is_some() {
            return "unresponsive";
        }
        st.name()
    }

    /// `toolsrv=STATE` ([`ToolLink::state_name`]) and, while it is not up, or up but not
    /// answering, `toolsrv_reason=WHY` (one line), as the session's `cfg` and `ctl status`
    /// show them.
    pub fn status_lines(&self) -> String {
        let st = self.state();
        let mut out = format!("toolsrv={}\n", self.state_name());
        let why = match &st {
            LinkState::Restarting(r) | LinkState::Failed(r) => Some(r.clone()),
            LinkState::Up(_) => self.unresponsive.borrow().clone(),
            _ => None,
        };
        if let Some(r) = why {
            out.push_str(&format!("toolsrv_reason={}\n", r.replace('\n', " ")));
        }
        out
    }

    /// Marks the link as not answering (`Some(why)`) or answering again (`None`); whether
    /// that changed anything.
    pub(crate) fn set_unresponsive(&self, why: Option<String>) -> bool {
        self.unresponsive.send_if_modified(|w| {
            let changed = w.is_some() != why.is_some();
            *w = why;
            changed
        })
    }

    /// A session without a working directory: no toolsrv until one comes, and the state's
    /// reason says so.
    pub(crate) fn no_workspace(&self) {
        self.state.send_replace(LinkState::Failed(
            "the session has no working directory yet, so no toolsrv: an agent created with cwd=DIR gives it one".into(),
        ));
    }

    /// The connection, waiting up to `wait` for one.
    pub async fn conn(&self, wait: Duration) -> Result<Arc<Conn>, String> {
        let mut rx = self.state.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let st = rx.borrow_and_update().clone();
            match st {
                LinkState::Up(c) => return Ok(c),
                LinkState::Stopped => {
                    return Err("file does not exist: the session was killed".into());
                }
                // Nothing is starting one (a session without a working directory).
                LinkState::Failed(r) if !*self.running.borrow() => {
                    return Err(format!("toolsrv is not available ({r})"));
                }
                _ => {}
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err("toolsrv link gone".into()),
                Err(_) => {
                    return Err(format!(
                        "toolsrv is not available ({})",
                        match &*rx.borrow() {
                            LinkState::Restarting(r) | LinkState::Failed(r) => r.clone(),
                            s => s.name().to_owned(),
                        }
                    ));
                }
            }
        }
    }

    /// Stops the supervisor: toolsrv and every tool end.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// An agent was killed: stop its processes.
    pub fn agent_removed(&self, id: &str) {
        if let LinkState::Up(c) = self.state() {
            let id = id.to_owned();
            tokio::spawn(async move {
                let _ = kill_agent_procs(&c, &id).await;
                let _ = kill_agent_procs(&c, &identity(&id)).await;
            });
        }
    }

    /// Marks the supervisor task as running or ended.
    pub(crate) fn set_running(&self, running: bool) {
        self.running.send_replace(running);
    }

    /// Publishes the link's new state.
    pub(crate) fn set_state(&self, st: LinkState) {
        self.state.send_replace(st);
    }

    /// Waits until the supervisor has ended after [`ToolLink::stop`]: toolsrv has exited (or
    /// was killed), so none of the session's processes remain.
    pub async fn finished(&self) {
        let mut rx = self.running.subscribe();
        let _ = rx.wait_for(|r| !*r).await;
    }
}

/// The policy and tool set an agent's profile gives, applied in toolsrv.
pub async fn configure_agent(c: &Conn, a: &AgentTools, config: &Config) -> Result<(), String> {
    let profile_name = a.profile.as_deref().unwrap_or("default");
    let Some(profile) = config.profiles.get(profile_name) else {
        return Err(format!("unknown profile {profile_name:?}"));
    };
    c.ctl(&format!("policy {} {}", a.id, profile.policy))
        .await?;
    // Which escalations the agent may ask for at all: its profile's (the policy still has
    // the last word).
    let kinds = if profile.escalations.is_empty() {
        "none".to_owned()
    } else {
        profile.escalations.join(",")
    };
    c.ctl(&format!("escalations {} {kinds}", a.id)).await?;
    let want: Vec<String> = a.tools.clone().unwrap_or_else(|| profile.tools.clone());
    for t in ollie_link::tools::names() {
        let verb = if want.iter().any(|w| w == t) {
            "load"
        } else {
            "unload"
        };
        c.ctl(&format!("{verb} {} {t}", a.id)).await?;
    }
    Ok(())
}

async fn kill_agent_procs(c: &Conn, agent: &str) -> Result<(), String> {
    // Never attached: it has no processes.
    let Some(root) = c.attached(agent).await else {
        return Ok(());
    };
    let mut l = root
        .walk(&["proc", "list"])
        .await
        .map_err(|e| e.to_string())?;
    l.open(ollie_p9::wire::om::OREAD)
        .await
        .map_err(|e| e.to_string())?;
    let text = l.read_to_end().await.map_err(|e| e.to_string())?;
    for line in String::from_utf8_lossy(&text).lines() {
        let mut it = line.split('\t');
        if let (Some(pid), Some("running")) = (it.next(), it.next())
            && let Ok(mut f) = root.walk(&["proc", pid, "ctl"]).await
            && f.open(ollie_p9::wire::om::OWRITE).await.is_ok()
        {
            let _ = f.write(0, Bytes::from_static(b"kill")).await;
        }
    }
    Ok(())
}
