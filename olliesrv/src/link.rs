//! Each session's toolsrv: started over a socketpair with the spawn API of `ollie-link`
//! ([`ollie_link::spawn`]), authenticated as the operator and as each agent, watched, and
//! restarted when it dies.
//!
//! The supervisor (one task per session) loops: spawn toolsrv, connect, attach as the
//! operator, configure every agent (policy, tool set), publish the connection, wait for the
//! child to exit or the session to be killed. When toolsrv dies unexpectedly the session
//! says so (`toolsrv-died` event; `state` reads `restarting`), every tool call in flight
//! fails (its 9P calls error), and a new toolsrv is started with backoff (0.1 s doubling to
//! 5 s, reset after a minute up), announced by `toolsrv-started`.
//!
//! A remote session (`remote=NAME`) differs only in how toolsrv is reached: the supervisor
//! runs `[remotes.NAME]`'s command (no shell; `ssh HOST toolsrv --stdio` by default) with a
//! socketpair as its stdin and stdout and its stderr in our log (bounded, [`StderrTail`]),
//! writes the boot message (master key and configuration) as the first bytes on that stream,
//! then speaks 9P on it exactly as on a local link. The pid in the events is the command's
//! (ssh's); `toolsrv-started` adds the remote toolsrv's `host` and `toolsrv_pid`. A lost
//! connection — ssh exits (the network dropped, the remote toolsrv died, someone killed it) or
//! the stream breaks — is handled as a local toolsrv's death: `toolsrv-died`, `restarting`
//! (with the reason and ssh's last stderr line in the session's `cfg`), calls in flight fail,
//! reconnect with the same backoff. The session's `cwd` is a directory on the remote host;
//! toolsrv there uses its own user's home.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ChildStderr;
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
    /// The operator's root fid.
    pub operator: Fid,
    /// Agents' root fids, attached on first use.
    agents: tokio::sync::Mutex<HashMap<String, Arc<Fid>>>,
    /// The policy each hook identity was last configured with.
    hook_policies: tokio::sync::Mutex<HashMap<String, String>>,
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

    /// The root fid of `agent`'s hook identity ([`crate::hooks::identity`]), configured
    /// with `policy`, no escalations and `execute_code` alone before its first run and again
    /// whenever the policy asked for changes (a profile changed by `invalidate`).
    pub async fn hook_root(&self, agent: &str, policy: &str) -> Result<Arc<Fid>, String> {
        let id = crate::hooks::identity(agent);
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

    /// `toolsrv=STATE` and, while it is not up, `toolsrv_reason=WHY` (one line), as the
    /// session's `cfg` and `ctl status` show them.
    pub fn status_lines(&self) -> String {
        let st = self.state();
        let mut out = format!("toolsrv={}\n", st.name());
        if let LinkState::Restarting(r) | LinkState::Failed(r) = &st {
            out.push_str(&format!("toolsrv_reason={}\n", r.replace('\n', " ")));
        }
        out
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
                let _ = kill_agent_procs(&c, &crate::hooks::identity(&id)).await;
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
    let policies = config.policies.clone();
    let default_policy = s
        .profile
        .as_deref()
        .and_then(|p| config.profiles.get(p))
        .or_else(|| config.profiles.get("default"))
        .map_or_else(|| "workspace".to_owned(), |p| p.policy.clone());
    let mut b = Bootstrap::new(
        s.id.clone(),
        s.cwd.clone(),
        // A remote toolsrv uses its own user's home on its host (empty: see `Bootstrap`).
        if s.remote.is_some() {
            PathBuf::new()
        } else {
            PathBuf::from(&home)
        },
        policies,
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
    // Every policy reads the skill paths: read grants toolsrv adds with `with_grants`.
    b.read_grants = crate::skills::grantable(&config, std::path::Path::new(&home));
    // olliesrv's own state and configuration: hidden from every tool (they are on this host
    // only, so a remote toolsrv gets none).
    if s.remote.is_none() {
        b.hidden.push(reg.store.dir().to_path_buf());
        if let Some(p) = &config.path {
            b.hidden.push(crate::config::dir_of(p));
        }
    }
    b
}

/// How long a local toolsrv may take to answer the version handshake and the operator's
/// attach.
const LOCAL_CONNECT: Duration = Duration::from_secs(10);
/// The same for a remote one: the ssh connection and login come first.
const REMOTE_CONNECT: Duration = Duration::from_secs(30);
/// How long a toolsrv (or a remote command) whose link closed may take to exit by itself
/// before it gets SIGKILL.
const LINK_GONE_WAIT: Duration = Duration::from_secs(5);

/// How a session's toolsrv is reached.
#[derive(Debug, Clone)]
enum Start {
    /// The local binary, over a socketpair.
    Local(PathBuf),
    /// `[remotes.NAME]`'s command (no shell), which runs `toolsrv --stdio` on another host.
    Remote { name: String, command: Vec<String> },
}

impl Start {
    /// The session's: its remote's command as the configuration has it now, else the local
    /// binary.
    fn of(s: &Session, reg: &Registry) -> Result<Start, String> {
        let Some(name) = &s.remote else {
            return Ok(Start::Local(reg.toolsrv.clone()));
        };
        let config = reg.config();
        match config.remotes.get(name) {
            Some(r) => Ok(Start::Remote {
                name: name.clone(),
                command: r.command.clone(),
            }),
            None => Err(format!(
                "remote {name:?} is not configured (configured: {}); add [remotes.{name}] to config.toml and write invalidate to ctl",
                if config.remotes.is_empty() {
                    "none".to_owned()
                } else {
                    config
                        .remotes
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )),
        }
    }

    fn remote(&self) -> Option<&str> {
        match self {
            Start::Local(_) => None,
            Start::Remote { name, .. } => Some(name),
        }
    }

    /// The program started.
    fn program(&self) -> String {
        match self {
            Start::Local(p) => p.display().to_string(),
            Start::Remote { command, .. } => command.first().cloned().unwrap_or_default(),
        }
    }

    /// Starts it (blocking: the local binary's boot memfd is written here).
    fn spawn(&self, boot: &Bootstrap) -> std::io::Result<Toolsrv> {
        match self {
            Start::Local(p) => Toolsrv::spawn(p, boot),
            Start::Remote { command, .. } => Toolsrv::spawn_stdio(command, boot),
        }
    }
}

/// A remote command's stderr, read on its own thread into olliesrv's log: bounded (each line
/// cut at [`STDERR_LINE`] bytes, control characters dropped, at most [`STDERR_LINES`] lines
/// per connection, the rest only counted), keeping the last line for the reason the session
/// shows when the connection fails (`ssh: connect to host … refused`).
struct StderrTail {
    last: Arc<Mutex<String>>,
    done: watch::Receiver<bool>,
}

const STDERR_LINE: usize = 512;
const STDERR_LINES: usize = 64;

impl StderrTail {
    fn start(pipe: ChildStderr, session: String, remote: String) -> StderrTail {
        let last = Arc::new(Mutex::new(String::new()));
        let (tx, done) = watch::channel(false);
        let keep = Arc::clone(&last);
        let spawned = std::thread::Builder::new()
            .name("remote-stderr".into())
            .spawn(move || {
                read_stderr(pipe, &session, &remote, &keep);
                tx.send_replace(true);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the reader of a remote's stderr");
        }
        StderrTail { last, done }
    }

    /// ` (stderr: LAST LINE)` once the pipe has ended (waiting at most a second: a
    /// connection-sharing ssh may keep it open), or nothing.
    async fn note(tail: &mut Option<StderrTail>) -> String {
        let Some(t) = tail else {
            return String::new();
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), t.done.wait_for(|d| *d)).await;
        let last = lock(&t.last).clone();
        if last.is_empty() {
            String::new()
        } else {
            format!(" (stderr: {last})")
        }
    }
}

fn read_stderr(mut pipe: ChildStderr, session: &str, remote: &str, last: &Mutex<String>) {
    use std::io::Read;
    let mut logged = 0usize;
    let mut unlogged = 0u64;
    let mut emit = |raw: &[u8]| {
        let text: String = String::from_utf8_lossy(raw)
            .chars()
            .filter(|c| !c.is_control())
            .collect::<String>()
            .trim()
            .chars()
            .take(STDERR_LINE)
            .collect();
        if text.is_empty() {
            return;
        }
        if logged < STDERR_LINES {
            tracing::warn!(session, remote, "remote stderr: {text}");
            logged += 1;
        } else {
            unlogged += 1;
        }
        *lock(last) = text;
    };
    let mut line: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        for &b in &buf[..n] {
            if b == b'\n' {
                emit(&line);
                line.clear();
            } else if line.len() < STDERR_LINE * 4 {
                line.push(b);
            }
        }
    }
    emit(&line);
    if unlogged > 0 {
        tracing::warn!(
            session,
            remote,
            unlogged,
            "remote stderr: further lines not logged"
        );
    }
}

/// SIGKILL for a toolsrv (local), or for a remote command's whole process group (ssh and
/// whatever it started, such as a ProxyCommand).
fn kill_child(pid: u32, remote: bool) {
    let p = nix::unistd::Pid::from_raw(pid as i32);
    let sig = nix::sys::signal::Signal::SIGKILL;
    let _ = if remote {
        nix::sys::signal::killpg(p, sig)
    } else {
        nix::sys::signal::kill(p, sig)
    };
}

/// Why the supervisor stopped waiting on a running toolsrv.
enum End<T> {
    /// The child exited.
    Exited(T),
    /// The 9P connection ended while the child still ran (a remote's ssh still up but the
    /// stream broken, or garbage on it).
    LinkClosed,
    /// The session was killed or the server stops.
    Stop,
}

/// The event fields naming a session (and its remote).
fn who(s: &Session, remote: Option<&str>) -> Vec<(&'static str, Value)> {
    let mut v = vec![("session", Value::from(s.id.clone()))];
    if let Some(r) = remote {
        v.push(("remote", Value::from(r)));
    }
    v
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
        let start = match Start::of(&s, &reg) {
            Ok(x) => x,
            Err(e) => {
                fail(&s, &reg, &mut backoff, &mut stop, s.remote.as_deref(), e).await;
                continue;
            }
        };
        let remote = start.remote().map(str::to_owned);
        let boot = bootstrap(&s, &reg);
        let how = start.clone();
        let spawned = tokio::task::spawn_blocking(move || how.spawn(&boot)).await;
        let mut t = match spawned {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                let what = match &remote {
                    None => "toolsrv".to_owned(),
                    Some(r) => format!("remote {r}"),
                };
                fail(
                    &s,
                    &reg,
                    &mut backoff,
                    &mut stop,
                    remote.as_deref(),
                    format!("cannot start {what} ({}): {e}", start.program()),
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
                    remote.as_deref(),
                    format!("cannot start toolsrv: {e}"),
                )
                .await;
                continue;
            }
        };
        let pid = t.pid();
        let mut stderr = t
            .take_stderr()
            .map(|p| StderrTail::start(p, s.id.clone(), remote.clone().unwrap_or_default()));
        let key = t.key().clone();
        let wait = if remote.is_some() {
            REMOTE_CONNECT
        } else {
            LOCAL_CONNECT
        };
        let conn = match connect(&mut t, key, wait).await {
            Ok(c) => Arc::new(c),
            Err(e) => {
                kill_child(pid, remote.is_some());
                let _ = tokio::task::spawn_blocking(move || t.child().wait()).await;
                let said = StderrTail::note(&mut stderr).await;
                let reason = match &remote {
                    None => format!("toolsrv did not answer: {e}"),
                    Some(r) => format!(
                        "remote {r}: toolsrv did not answer over `{}` (pid {pid}): {e}{said}",
                        start.program()
                    ),
                };
                fail(&s, &reg, &mut backoff, &mut stop, remote.as_deref(), reason).await;
                continue;
            }
        };
        // How long escalation requests wait for the operator.
        let timeout = reg.config().bypass_timeout_s;
        if let Err(e) = conn.ctl(&format!("bypass_timeout {timeout}")).await {
            tracing::warn!(session = %s.id, error = %e, "cannot set toolsrv's bypass_timeout");
        }
        // Where a remote toolsrv runs (its host and pid), for the event and the log.
        let mut fields = who(&s, remote.as_deref());
        fields.push(("pid", Value::from(pid)));
        if let Some(r) = &remote {
            let info = conn.info().await.unwrap_or_default();
            let get = |k: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                    .unwrap_or("")
                    .to_owned()
            };
            let (host, tpid) = (get("host"), get("pid"));
            tracing::info!(session = %s.id, remote = %r, %host, toolsrv_pid = %tpid, "remote toolsrv up");
            fields.push(("host", Value::from(host)));
            fields.push(("toolsrv_pid", Value::from(tpid.parse::<u64>().unwrap_or(0))));
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
        reg.events.emit("toolsrv-started", ev(&fields));
        let closer = t.take_closer();
        let mut waiter = tokio::task::spawn_blocking(move || {
            let st = t.child().wait();
            (t, st)
        });
        let end = tokio::select! {
            r = &mut waiter => End::Exited(r),
            () = conn.client.closed() => End::LinkClosed,
            _ = stop.wait_for(|s| *s) => End::Stop,
        };
        let (r, lost) = match end {
            End::Stop => {
                // The session was killed: closing the link ends toolsrv (and every tool,
                // after their SIGTERM grace: toolsrv's SHUTDOWN_WAIT; a remote one sees end
                // of file through ssh); SIGKILL if it has not gone within six seconds.
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
                    kill_child(pid, remote.is_some());
                    let _ = waiter.await;
                }
                return;
            }
            End::Exited(r) => (r, false),
            End::LinkClosed => {
                // The stream broke but the child runs on: end our side (toolsrv or ssh
                // reads end of file) and give it a moment to exit.
                if let Some(c) = &closer {
                    c.close();
                }
                let r = match tokio::time::timeout(LINK_GONE_WAIT, &mut waiter).await {
                    Ok(r) => r,
                    Err(_) => {
                        kill_child(pid, remote.is_some());
                        (&mut waiter).await
                    }
                };
                (r, true)
            }
        };
        let how = match r {
            Ok((_, Ok(st))) => st.to_string(),
            Ok((_, Err(e))) => e.to_string(),
            Err(e) => e.to_string(),
        };
        // Whoever still holds the connection fails now, not at their next request.
        if let Some(c) = &closer {
            c.close();
        }
        drop(conn);
        let said = StderrTail::note(&mut stderr).await;
        let reason = match &remote {
            None => format!("toolsrv (pid {pid}) died: {how}"),
            Some(r) => format!(
                "remote {r}: the link was lost{} (`{}`, pid {pid}, ended: {how}){said}",
                if lost {
                    " (the stream broke first)"
                } else {
                    ""
                },
                start.program()
            ),
        };
        tracing::warn!(session = %s.id, %reason, "restarting toolsrv");
        link.state
            .send_replace(LinkState::Restarting(reason.clone()));
        let mut fields = who(&s, remote.as_deref());
        fields.push(("pid", Value::from(pid)));
        fields.push(("reason", Value::from(reason)));
        reg.events.emit("toolsrv-died", ev(&fields));
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_millis(100);
        }
        sleep_or_stop(&mut stop, backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
    link.state.send_replace(LinkState::Stopped);
}

async fn connect(t: &mut Toolsrv, key: MasterKey, wait: Duration) -> Result<Conn, String> {
    let secs = wait.as_secs();
    // The largest msize toolsrv accepts: a tool call's payload (a file_write's content, a
    // hook's event) is one Twrite.
    let client = tokio::time::timeout(wait, t.connect(ollie_p9::server::DEFAULT_MAX_MSIZE))
        .await
        .map_err(|_| format!("no answer within {secs} s"))?
        .map_err(|e| e.to_string())?;
    let operator = tokio::time::timeout(wait, attach(&client, &key, &Identity::Operator))
        .await
        .map_err(|_| format!("no answer to the operator's attach within {secs} s"))?
        .map_err(|e| e.to_string())?;
    Ok(Conn {
        client,
        key,
        operator,
        agents: tokio::sync::Mutex::new(HashMap::new()),
        hook_policies: tokio::sync::Mutex::new(HashMap::new()),
    })
}

async fn fail(
    s: &Session,
    reg: &Registry,
    backoff: &mut Duration,
    stop: &mut watch::Receiver<bool>,
    remote: Option<&str>,
    reason: String,
) {
    tracing::warn!(session = %s.id, %reason, "toolsrv");
    s.link.state.send_replace(LinkState::Failed(reason.clone()));
    let mut fields = who(s, remote);
    fields.push(("reason", Value::from(reason)));
    reg.events.emit("toolsrv-failed", ev(&fields));
    sleep_or_stop(stop, *backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_secs(5));
}

async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}
