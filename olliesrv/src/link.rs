//! Each session's toolsrv: started over a socketpair with the spawn API of `ollie-toolsrv`,
//! authenticated as the operator and as each agent, watched, and restarted when it dies.
//!
//! The supervisor (one task per session) loops: spawn toolsrv, connect, attach as the
//! operator, configure every agent (policy, tool set), publish the connection, wait for the
//! child to exit or the session to be killed. When toolsrv dies unexpectedly the session
//! says so (`toolsrv-died` event; `state` reads `restarting`), every tool call in flight
//! fails (its 9P calls error), and a new toolsrv is started with backoff (0.1 s doubling to
//! 5 s, reset after a minute up), announced by `toolsrv-started`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ollie_link::auth::{Identity, MasterKey};
use ollie_link::boot::Bootstrap;
use ollie_link::spawn::{Toolsrv, attach};
use ollie_p9::{Client, Fid};
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::config::Config;
use crate::model::{Agent, Registry, Session, lock};

/// A live connection to a session's toolsrv.
#[derive(Debug)]
pub struct Conn {
    pub client: Client,
    pub key: MasterKey,
    pub pid: u32,
    /// The operator's root fid.
    pub operator: Fid,
    /// Agents' root fids, attached on first use.
    agents: tokio::sync::Mutex<HashMap<String, Arc<Fid>>>,
}

impl Conn {
    /// The root fid of `a`'s identity. On first use the agent is configured in toolsrv
    /// (its profile's policy and tools) before it is attached, so nothing can ever run for
    /// it under toolsrv's default policy.
    pub async fn agent_root(&self, a: &Agent, config: &Config) -> Result<Arc<Fid>, String> {
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

    /// The root fid of an agent that was attached before, if any.
    async fn attached(&self, agent: &str) -> Option<Arc<Fid>> {
        self.agents.lock().await.get(agent).cloned()
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
    state: watch::Sender<LinkState>,
    stop: watch::Sender<bool>,
    /// Whether the supervisor task runs (it ends once toolsrv has exited for good).
    running: watch::Sender<bool>,
    /// How many times toolsrv was started.
    pub starts: Mutex<u64>,
}

impl Default for ToolLink {
    fn default() -> Self {
        ToolLink::new()
    }
}

fn ev(pairs: &[(&str, Value)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

impl ToolLink {
    pub fn new() -> ToolLink {
        ToolLink {
            state: watch::Sender::new(LinkState::Starting),
            stop: watch::Sender::new(false),
            running: watch::Sender::new(false),
            starts: Mutex::new(0),
        }
    }

    pub fn state(&self) -> LinkState {
        self.state.borrow().clone()
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
    pub fn agent_removed(&self, a: &Arc<Agent>) {
        if let LinkState::Up(c) = self.state() {
            let id = a.id.clone();
            tokio::spawn(async move {
                let _ = kill_agent_procs(&c, &id).await;
            });
        }
    }

    /// Starts the supervisor task.
    pub fn start(&self, s: Arc<Session>, reg: Arc<Registry>) {
        self.running.send_replace(true);
        tokio::spawn(async move {
            supervise(Arc::clone(&s), reg).await;
            s.link.running.send_replace(false);
        });
    }

    /// Waits until the supervisor has ended after [`ToolLink::stop`]: toolsrv has exited (or
    /// was killed), so none of the session's processes remain.
    pub async fn finished(&self) {
        let mut rx = self.running.subscribe();
        let _ = rx.wait_for(|r| !*r).await;
    }
}

/// The policy and tool set an agent's profile gives, applied in toolsrv.
pub async fn configure_agent(c: &Conn, a: &Agent, config: &Config) -> Result<(), String> {
    let settings = a.settings();
    let profile_name = settings.profile.as_deref().unwrap_or("default");
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
    let want: Vec<String> = settings
        .tools
        .clone()
        .unwrap_or_else(|| profile.tools.clone());
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

fn bootstrap(s: &Session, reg: &Registry) -> Bootstrap {
    let config = reg.config();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/".to_owned());
    let default_policy = s
        .profile
        .as_deref()
        .and_then(|p| config.profiles.get(p))
        .or_else(|| config.profiles.get("default"))
        .map_or_else(|| "workspace".to_owned(), |p| p.policy.clone());
    let mut b = Bootstrap::new(
        s.id.clone(),
        s.cwd.clone(),
        home.into(),
        config.policies.clone(),
        default_policy,
    );
    b.env = std::env::vars()
        .filter(|(k, _)| {
            matches!(
                k.as_str(),
                "LANG"
                    | "LC_ALL"
                    | "LC_CTYPE"
                    | "LC_MESSAGES"
                    | "TERM"
                    | "TZ"
                    | "COLUMNS"
                    | "LINES"
                    | "NO_COLOR"
            )
        })
        .collect();
    b.env.push(("OLLIE_SESSION_ID".into(), s.id.clone()));
    b
}

async fn supervise(s: Arc<Session>, reg: Arc<Registry>) {
    let link = &s.link;
    let mut stop = link.stop.subscribe();
    let mut backoff = Duration::from_millis(100);
    loop {
        if *stop.borrow_and_update() {
            break;
        }
        *lock(&link.starts) += 1;
        let started = Instant::now();
        let boot = bootstrap(&s, &reg);
        let program = reg.toolsrv.clone();
        let spawned = tokio::task::spawn_blocking(move || Toolsrv::spawn(&program, &boot)).await;
        let mut t = match spawned {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                fail(
                    &s,
                    &reg,
                    &mut backoff,
                    &mut stop,
                    format!("cannot start toolsrv ({}): {e}", reg.toolsrv.display()),
                )
                .await;
                continue;
            }
            Err(e) => {
                fail(
                    &s,
                    &reg,
                    &mut backoff,
                    &mut stop,
                    format!("cannot start toolsrv: {e}"),
                )
                .await;
                continue;
            }
        };
        let pid = t.pid();
        let key = t.key().clone();
        let conn = match connect(&mut t, key, pid).await {
            Ok(c) => Arc::new(c),
            Err(e) => {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = tokio::task::spawn_blocking(move || t.child().wait()).await;
                fail(
                    &s,
                    &reg,
                    &mut backoff,
                    &mut stop,
                    format!("toolsrv did not answer: {e}"),
                )
                .await;
                continue;
            }
        };
        // How long escalation requests wait for the operator.
        let timeout = reg.config().bypass_timeout_s;
        if let Err(e) = conn.ctl(&format!("bypass_timeout {timeout}")).await {
            tracing::warn!(session = %s.id, error = %e, "cannot set toolsrv's bypass_timeout");
        }
        // Agents are configured in this toolsrv on first use (`Conn::agent_root`).
        link.state.send_replace(LinkState::Up(Arc::clone(&conn)));
        {
            // The reader lets go of the connection as soon as the link is not up any more
            // (closing the link is what ends toolsrv).
            let mut st = link.state.subscribe();
            reg.bypass.watch(&s, Arc::clone(&conn), async move {
                let _ = st.wait_for(|x| !matches!(x, LinkState::Up(_))).await;
            });
        }
        reg.events.emit(
            "toolsrv-started",
            ev(&[
                ("session", Value::from(s.id.clone())),
                ("pid", Value::from(pid)),
            ]),
        );
        let closer = t.take_closer();
        let mut waiter = tokio::task::spawn_blocking(move || {
            let st = t.child().wait();
            (t, st)
        });
        let status = tokio::select! {
            r = &mut waiter => Some(r),
            _ = stop.wait_for(|s| *s) => None,
        };
        match status {
            None => {
                // The session was killed: closing the link ends toolsrv (and every tool,
                // after their SIGTERM grace: toolsrv's SHUTDOWN_WAIT); SIGKILL if it has not
                // gone within six seconds.
                link.state.send_replace(LinkState::Stopped);
                drop(conn);
                // Other holders of the connection (an agent's turn waiting for a tool) must
                // not keep the link open: end it for both sides now.
                if let Some(c) = &closer {
                    c.close();
                }
                if tokio::time::timeout(Duration::from_secs(6), &mut waiter)
                    .await
                    .is_err()
                {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    let _ = waiter.await;
                }
                return;
            }
            Some(r) => {
                let how = match r {
                    Ok((_, Ok(st))) => st.to_string(),
                    Ok((_, Err(e))) => e.to_string(),
                    Err(e) => e.to_string(),
                };
                drop(conn);
                let reason = format!("toolsrv (pid {pid}) died: {how}");
                tracing::warn!(session = %s.id, %reason, "restarting toolsrv");
                link.state
                    .send_replace(LinkState::Restarting(reason.clone()));
                reg.events.emit(
                    "toolsrv-died",
                    ev(&[
                        ("session", Value::from(s.id.clone())),
                        ("pid", Value::from(pid)),
                        ("reason", Value::from(reason)),
                    ]),
                );
                if started.elapsed() > Duration::from_secs(60) {
                    backoff = Duration::from_millis(100);
                }
                sleep_or_stop(&mut stop, backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    link.state.send_replace(LinkState::Stopped);
}

async fn connect(t: &mut Toolsrv, key: MasterKey, pid: u32) -> Result<Conn, String> {
    let client = tokio::time::timeout(Duration::from_secs(10), t.connect(64 * 1024))
        .await
        .map_err(|_| "no answer within 10 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let operator = attach(&client, &key, &Identity::Operator)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Conn {
        client,
        key,
        pid,
        operator,
        agents: tokio::sync::Mutex::new(HashMap::new()),
    })
}

async fn fail(
    s: &Session,
    reg: &Registry,
    backoff: &mut Duration,
    stop: &mut watch::Receiver<bool>,
    reason: String,
) {
    tracing::warn!(session = %s.id, %reason, "toolsrv");
    s.link.state.send_replace(LinkState::Failed(reason.clone()));
    reg.events.emit(
        "toolsrv-failed",
        ev(&[
            ("session", Value::from(s.id.clone())),
            ("reason", Value::from(reason)),
        ]),
    );
    sleep_or_stop(stop, *backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_secs(5));
}

async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}
