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
//! socketpair as its stdin and stdout and its stderr in our log (bounded, `StderrTail`),
//! writes the boot message (master key and configuration) as the first bytes on that stream,
//! then speaks 9P on it exactly as on a local link. The pid in the events is the command's
//! (ssh's); `toolsrv-started` adds the remote toolsrv's `host` and `toolsrv_pid`. A lost
//! connection — ssh exits (the network dropped, the remote toolsrv died, someone killed it) or
//! the stream breaks — is handled as a local toolsrv's death: `toolsrv-died`, `restarting`
//! (with the reason and ssh's last stderr line in the session's `cfg`), calls in flight fail,
//! reconnect with the same backoff. The session's `cwd` is a directory on the remote host;
//! toolsrv there uses its own user's home.

use std::path::PathBuf;
use std::process::ChildStderr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ollie_link::auth::{Identity, MasterKey};
use ollie_link::boot::Bootstrap;
use ollie_link::spawn::{Toolsrv, attach};
use serde_json::Value;
use tokio::sync::watch;

use crate::link::{Conn, LinkState};
use crate::state::{Registry, Session};
use crate::util::{ev, lock};

/// Starts the supervisor task of `s`'s toolsrv link.
pub fn start(s: Arc<Session>, reg: Arc<Registry>) {
    s.link.set_running(true);
    tokio::spawn(async move {
        supervise(Arc::clone(&s), reg).await;
        s.link.set_running(false);
    });
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
        // Started only once the session has one (`sessions.rs`).
        s.cwd().cloned().unwrap_or_default(),
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
    // The egress proxy's operator settings, for local and remote sessions alike.
    b.proxy = config.proxy.clone();
    // olliesrv's own secret locations (state directory, configuration files, sockets, key
    // files, other instances' state directories): hidden from every tool and secret in every
    // other way there too. They are on this host only, so a remote toolsrv gets none.
    if s.remote.is_none() {
        b.hidden = crate::secrets::current(reg.store.dir());
        // Its escalations hold the other local sessions working in the same trees
        // ([`crate::holds`]).
        b.hold_peers = true;
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

/// Starts toolsrv (or the remote's command) off the async threads.
async fn spawn(start: &Start, boot: Bootstrap, remote: Option<&str>) -> Result<Toolsrv, String> {
    let how = start.clone();
    match tokio::task::spawn_blocking(move || how.spawn(&boot)).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => {
            let what = match remote {
                None => "toolsrv".to_owned(),
                Some(r) => format!("remote {r}"),
            };
            Err(format!("cannot start {what} ({}): {e}", start.program()))
        }
        Err(e) => Err(format!("cannot start toolsrv: {e}")),
    }
}

/// A new toolsrv answers: it is told the escalation timeout, the link is published (agents
/// are configured on first use, [`Conn::agent_root`]), its escalation requests are mirrored,
/// and `toolsrv-started` says where it runs.
async fn publish(
    s: &Arc<Session>,
    reg: &Arc<Registry>,
    conn: &Arc<Conn>,
    pid: u32,
    remote: Option<&str>,
) {
    // How long escalation requests wait for the operator.
    let timeout = reg.config().bypass_timeout_s;
    if let Err(e) = conn.ctl(&format!("bypass_timeout {timeout}")).await {
        tracing::warn!(session = %s.id, error = %e, "cannot set toolsrv's bypass_timeout");
    }
    // Where a remote toolsrv runs (its host and pid), for the event and the log.
    let mut fields = who(s, remote);
    fields.push(("pid", Value::from(pid)));
    if let Some(r) = remote {
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
    // Holds other sessions' escalations keep are applied before anything of this session
    // can run ([`crate::holds`]).
    let publishing = reg.holds.publishing.lock().await;
    crate::holds::apply_live(reg, s, conn).await;
    s.link.set_state(LinkState::Up(Arc::clone(conn)));
    drop(publishing);
    // The readers let go of the connection as soon as the link is not up any more (closing
    // the link is what ends toolsrv).
    let mut st = s.link.state.subscribe();
    reg.bypass.watch(s, Arc::clone(conn), async move {
        let _ = st.wait_for(|x| !matches!(x, LinkState::Up(_))).await;
    });
    let mut st = s.link.state.subscribe();
    crate::holds::watch(reg, s, Arc::clone(conn), async move {
        let _ = st.wait_for(|x| !matches!(x, LinkState::Up(_))).await;
    });
    reg.events.emit("toolsrv-started", ev(&fields));
}

/// Why a session's toolsrv is being restarted: how it ended (`how`), and for a remote one
/// the command that ran and its last stderr line (`said`).
fn died(
    remote: Option<&str>,
    pid: u32,
    how: &str,
    lost: bool,
    program: &str,
    said: &str,
) -> String {
    match remote {
        None => format!("toolsrv (pid {pid}) died: {how}"),
        Some(r) => format!(
            "remote {r}: the link was lost{} (`{program}`, pid {pid}, ended: {how}){said}",
            if lost {
                " (the stream broke first)"
            } else {
                ""
            },
        ),
    }
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
        let mut t = match spawn(&start, boot, remote.as_deref()).await {
            Ok(t) => t,
            Err(e) => {
                fail(&s, &reg, &mut backoff, &mut stop, remote.as_deref(), e).await;
                continue;
            }
        };
        let pid = t.pid();
        let mut stderr = t
            .take_stderr()
            .map(|p| StderrTail::start(p, s.id.clone(), remote.clone().unwrap_or_default()));
        let key = t.key().clone();
        let conn = match connect(&mut t, key, remote.is_some()).await {
            Ok(c) => Arc::new(c),
            Err(e) => {
                kill_child(pid, remote.is_some());
                let _ = t.wait().await;
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
        publish(&s, &reg, &conn, pid, remote.as_deref()).await;
        let closer = t.take_closer();
        // The exit, heard without a thread of its own (SIGCHLD, see [`Toolsrv::wait`]).
        let waiter = t.wait();
        tokio::pin!(waiter);
        let end = tokio::select! {
            r = &mut waiter => End::Exited(r),
            () = conn.client.closed() => End::LinkClosed,
            _ = stop.wait_for(|s| *s) => End::Stop,
            never = watch_liveness(&s, &reg, &conn, pid) => match never {},
        };
        // Whatever ended the link, its liveness is no longer in question.
        link.set_unresponsive(None);
        let (r, lost) = match end {
            End::Stop => {
                // The session was killed: closing the link ends toolsrv (and every tool,
                // after their SIGTERM grace: toolsrv's SHUTDOWN_WAIT; a remote one sees end
                // of file through ssh); SIGKILL if it has not gone within six seconds.
                link.set_state(LinkState::Stopped);
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
            Ok(st) => st.to_string(),
            Err(e) => e.to_string(),
        };
        // Whoever still holds the connection fails now, not at their next request.
        if let Some(c) = &closer {
            c.close();
        }
        drop(conn);
        let said = StderrTail::note(&mut stderr).await;
        let reason = died(remote.as_deref(), pid, &how, lost, &start.program(), &said);
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
    link.set_state(LinkState::Stopped);
}

/// Checks forever that the toolsrv behind `conn` answers: a [`Conn::ping`] every half of
/// `toolsrv_liveness_s` (at most every second). One left unanswered that long marks the
/// session's toolsrv `unresponsive` (`toolsrv-unresponsive` event; a stopped or wedged
/// process, which olliesrv leaves alone: SIGCONT it, or kill it to have it restarted); its
/// answer, when it comes, marks it up again (`toolsrv-responsive`).
async fn watch_liveness(
    s: &Session,
    reg: &Registry,
    conn: &Conn,
    pid: u32,
) -> std::convert::Infallible {
    loop {
        let Some(bound) = reg.config().toolsrv_liveness else {
            // Not checked; the configuration may change at the next invalidate.
            tokio::time::sleep(Duration::from_secs(5)).await;
            continue;
        };
        tokio::time::sleep((bound / 2).max(Duration::from_secs(1))).await;
        let ping = conn.ping();
        tokio::pin!(ping);
        if tokio::time::timeout(bound, &mut ping).await.is_ok() {
            continue;
        }
        let why = format!(
            "toolsrv (pid {pid}) has not answered for {} s (stopped or wedged: SIGCONT it, or kill it to have it restarted)",
            bound.as_secs()
        );
        tracing::warn!(session = %s.id, pid, "toolsrv does not answer");
        s.link.set_unresponsive(Some(why.clone()));
        let mut fields = who(s, s.remote.as_deref());
        fields.push(("pid", Value::from(pid)));
        fields.push(("reason", Value::from(why)));
        reg.events.emit("toolsrv-unresponsive", ev(&fields));
        if ping.await.is_ok() && s.link.set_unresponsive(None) {
            tracing::info!(session = %s.id, pid, "toolsrv answers again");
            let mut fields = who(s, s.remote.as_deref());
            fields.push(("pid", Value::from(pid)));
            reg.events.emit("toolsrv-responsive", ev(&fields));
        }
    }
}

/// Connects to a started toolsrv and attaches as the operator, within [`REMOTE_CONNECT`] or
/// [`LOCAL_CONNECT`].
async fn connect(t: &mut Toolsrv, key: MasterKey, remote: bool) -> Result<Conn, String> {
    let wait = if remote {
        REMOTE_CONNECT
    } else {
        LOCAL_CONNECT
    };
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
    Ok(Conn::new(client, key, operator))
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
    s.link.set_state(LinkState::Failed(reason.clone()));
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
