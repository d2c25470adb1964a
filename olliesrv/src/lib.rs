//! `olliesrv`: the 9P2000 server people and scripts talk to.
//!
//! It serves the tree in [`fs`] (root files, sessions and agents as files, each session's
//! toolsrv tree) on a private unix socket (directory 0700, socket 0600, plan9port's
//! namespace convention) and optionally on TCP, where every connection must authenticate
//! with Tauth and the key in `<state>/tcp.key`. It replaces a stale socket but never a live
//! one; a unix client may attach only as its own user (checked with SO_PEERCRED; root too)
//! or as `agent`, and everyone but the owner (the server's user, root and config.toml's
//! `operators`) gets the group bits. Under systemd ([`systemd`]) it serves the sockets passed
//! by socket activation instead of the default address, reports readiness and stopping, and
//! waits for every toolsrv to exit before it does. Sessions and agents
//! ([`model`]) persist in the state directory ([`store`]) and are restored on start; each
//! session has its own toolsrv ([`link`]), restarted when it dies. Every session and agent has
//! a bead namespace ([`ns`]), kept beside its record and served under its `ns/` directory; an
//! agent's copy is forked from its session's when the agent is created. Skills ([`skills`])
//! from the configured skill paths are served read-only under `skills/`, listed in agents'
//! system prompts and granted read-only to their tools. SIGTERM, SIGINT or `kill`
//! on `ctl` stop it cleanly, after a `server-stopping` event. It never runs a tool or a
//! command itself.
//!
//! A session may run its toolsrv on another host (`remote=`, [`config`]'s `[remotes.NAME]`):
//! olliesrv starts it over ssh (`toolsrv --stdio`) and speaks the same 9P to it.
//!
//! Tested by unit tests here, and by cross-process tests in `tests/` that start the real
//! binary and drive it with our client, the `ninep` crate's client and py9p.
#![forbid(unsafe_code)]

mod backend;
mod bypass;
mod compact;
mod config;
mod events;
mod fs;
mod hooks;
mod link;
mod listen;
mod model;
mod ns;
mod nstools;
mod redact;
mod skills;
mod store;
pub mod systemd;
mod turn;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ollie_p9::Server;
use ollie_p9::dial::{self, Addr};
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::config::{Config, ConfigError};
use crate::events::Events;
use crate::fs::{OllieFs, Shared};
use crate::listen::ListenError;

/// How long open connections get to finish after the server is told to stop.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// What to serve and where.
#[derive(Debug, Default)]
pub struct Options {
    /// `--config FILE`; otherwise the default location, if it exists.
    pub config: Option<PathBuf>,
    /// Listen addresses; empty means `unix!$NAMESPACE/ollie`. TCP addresses require Tauth
    /// with the key in `<state>/tcp.key`.
    pub addrs: Vec<Addr>,
    /// `--state-dir`; otherwise [`store::default_dir`].
    pub state_dir: Option<PathBuf>,
    /// The toolsrv binary; otherwise `$OLLIE_TOOLSRV`, next to this executable, or `PATH`.
    pub toolsrv: Option<PathBuf>,
    /// Sockets passed by socket activation ([`systemd::Environment::take`]), served besides
    /// `addrs`; when there are some and `addrs` is empty, the default address is not used.
    pub activated: Vec<systemd::Activated>,
    /// The service manager's notification socket: `READY=1` once every listener serves,
    /// `STOPPING=1` when the server starts to stop.
    pub notify: Option<systemd::Notifier>,
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error("no state directory: set XDG_STATE_HOME or HOME, or give --state-dir")]
    NoStateDir,
    #[error("state directory")]
    State {
        #[source]
        source: Box<store::StoreError>,
    },
    #[error("state directory {path} is in use by another olliesrv ({reason})")]
    StateInUse { path: PathBuf, reason: String },
    #[error("{path}")]
    Key {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serving {addr} failed")]
    Serve {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// An error and its causes on one line, for logs and 9P errors.
pub use ollie_link::error_chain;

/// The default listen address: `unix!$NAMESPACE/ollie`.
pub fn default_addr() -> Addr {
    Addr::Unix(dial::namespace_dir().join("ollie"))
}

/// Where the state lives: `--state-dir`, else `$STATE_DIRECTORY` (systemd), else
/// `$XDG_STATE_HOME/ollie`, else `~/.local/state/ollie`.
fn state_dir(opts: &Options) -> Result<PathBuf, RunError> {
    opts.state_dir
        .clone()
        .or_else(store::default_dir)
        .ok_or(RunError::NoStateDir)
}

/// Takes `<dir>/lock` (flock, held while the server runs): two servers on one state
/// directory would both run its sessions.
fn lock_state(dir: &std::path::Path) -> Result<nix::fcntl::Flock<std::fs::File>, RunError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let path = dir.join("lock");
    let io = |source| RunError::Key {
        path: path.clone(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(io)?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        RunError::StateInUse {
            path: dir.to_path_buf(),
            reason: e.desc().to_owned(),
        }
    })
}

/// The key TCP clients authenticate with (created 0600 with 32 random bytes on first use).
pub fn tcp_key(dir: &std::path::Path) -> Result<Vec<u8>, RunError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let path = dir.join("tcp.key");
    let io = |source| RunError::Key {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let meta = std::fs::metadata(&path).map_err(io)?;
            if meta.permissions().mode() & 0o077 != 0 {
                return Err(io(std::io::Error::other(
                    "readable by others; chmod 600 it",
                )));
            }
            let key = text.trim();
            if key.len() != 64 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(io(std::io::Error::other("not 64 hex digits")));
            }
            Ok(key.as_bytes().to_vec())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut b = [0u8; 32];
            getrandom::fill(&mut b).map_err(|e| io(std::io::Error::other(e.to_string())))?;
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(io)?;
            f.write_all(format!("{hex}\n").as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)?;
            Ok(hex.into_bytes())
        }
        Err(e) => Err(io(e)),
    }
}

/// Runs the server until `stop` is set (by the caller, a signal handler, or `ctl kill`).
pub async fn run(mut opts: Options, stop: watch::Sender<bool>) -> Result<(), RunError> {
    let config = Config::load(opts.config.as_deref())?;
    let limits = config.limits;
    let activated = std::mem::take(&mut opts.activated);
    let addrs = if opts.addrs.is_empty() && !activated.is_empty() {
        Vec::new()
    } else if opts.addrs.is_empty() {
        vec![default_addr()]
    } else {
        opts.addrs.clone()
    };
    let dir = state_dir(&opts)?;
    let _lock = lock_state(&dir)?;
    let store = Arc::new(store::Store::open(&dir).map_err(|source| RunError::State {
        source: Box::new(source),
    })?);
    // Bind everything before announcing anything, so a bad address fails fast.
    let mut sockets = Vec::new();
    let mut tcps = Vec::new();
    for a in &addrs {
        match a {
            Addr::Unix(p) => sockets.push(listen::bind_unix(p)?),
            Addr::Tcp { host, port } => {
                let l = tokio::net::TcpListener::bind((host.as_str(), *port))
                    .await
                    .map_err(|source| RunError::Serve {
                        addr: a.to_string(),
                        source,
                    })?;
                tcps.push((a.to_string(), l));
            }
        }
    }
    // Activated sockets belong to the service manager: served, never removed.
    let mut passed_unix = Vec::new();
    let mut names: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    for a in activated {
        let addr = a.describe();
        let serve_err = |source| RunError::Serve {
            addr: addr.clone(),
            source,
        };
        match a {
            systemd::Activated::Unix(l) => {
                l.set_nonblocking(true).map_err(serve_err)?;
                passed_unix.push((
                    addr.clone(),
                    tokio::net::UnixListener::from_std(l).map_err(serve_err)?,
                ));
            }
            systemd::Activated::Tcp(l) => {
                l.set_nonblocking(true).map_err(serve_err)?;
                tcps.push((
                    addr.clone(),
                    tokio::net::TcpListener::from_std(l).map_err(serve_err)?,
                ));
            }
        }
        names.push(addr);
    }
    let key = if tcps.is_empty() {
        None
    } else {
        Some(tcp_key(&dir)?)
    };
    let events = Arc::new(Events::new());
    let config = Arc::new(std::sync::RwLock::new(Arc::new(config)));
    let reg = Arc::new(model::Registry::new(
        Arc::clone(&events),
        Arc::clone(&store),
        Arc::clone(&config),
        opts.toolsrv
            .clone()
            .unwrap_or_else(ollie_link::spawn::default_program),
    ));
    reg.restore();
    let shared = Arc::new(Shared::new(
        config,
        opts.config.clone(),
        Arc::clone(&events),
        Arc::clone(&reg),
        stop.clone(),
        key,
    ));
    let server = Server::with_limits(
        Arc::new(OllieFs::new(Arc::clone(&shared))),
        ollie_p9::server::DEFAULT_MAX_MSIZE,
        limits,
    );

    let mut f = Map::new();
    f.insert("pid".into(), Value::from(std::process::id()));
    f.insert("addresses".into(), Value::from(names.clone()));
    f.insert("state".into(), Value::from(dir.display().to_string()));
    events.emit("server-started", f);
    for a in &names {
        tracing::info!(addr = %a, state = %dir.display(), "serving");
    }

    // When told to stop: tell eventwait readers, end the log (their next read is EOF), then
    // stop the listeners.
    let (down_tx, down_rx) = watch::channel(false);
    let mut stop_rx = stop.subscribe();
    let ev = Arc::clone(&events);
    let notify = opts.notify.take().map(Arc::new);
    let stop_notify = notify.clone();
    let announcer = tokio::spawn(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
        if let Some(n) = &stop_notify {
            n.send("STOPPING=1\nSTATUS=stopping: ending sessions' toolsrv");
        }
        let mut f = Map::new();
        f.insert("pid".into(), Value::from(std::process::id()));
        ev.emit("server-stopping", f);
        ev.close();
        let _ = down_tx.send(true);
    });

    let mut tasks = tokio::task::JoinSet::new();
    // Unix listeners: the ones bound here (their socket file is removed when the guard drops,
    // after serving) and the passed ones (no guard: the file is the service manager's).
    let mut unix: Vec<(String, tokio::net::UnixListener, Option<listen::UnixSocket>)> =
        passed_unix.into_iter().map(|(a, l)| (a, l, None)).collect();
    for mut s in sockets {
        if let Some(listener) = s.listener.take() {
            unix.push((format!("unix!{}", s.path.display()), listener, Some(s)));
        }
    }
    for (addr, listener, guard) in unix {
        let server = Arc::clone(&server);
        let mut down = down_rx.clone();
        tasks.spawn(async move {
            let shutdown = async move {
                let _ = down.wait_for(|d| *d).await;
            };
            let r = server.serve_unix(listener, shutdown, SHUTDOWN_GRACE).await;
            drop(guard);
            r.map_err(|source| RunError::Serve { addr, source })
        });
    }
    for (addr, listener) in tcps {
        let server = Arc::clone(&server);
        let mut down = down_rx.clone();
        tasks.spawn(async move {
            let shutdown = async move {
                let _ = down.wait_for(|d| *d).await;
            };
            let r = server.serve_tcp(listener, shutdown, SHUTDOWN_GRACE).await;
            r.map_err(|source| RunError::Serve { addr, source })
        });
    }
    if let Some(n) = &notify {
        n.send(&format!(
            "READY=1\nSTATUS=serving {} ({} sessions restored)",
            names.join(" "),
            reg.sessions().len()
        ));
    }
    let mut result = Ok(());
    while let Some(r) = tasks.join_next().await {
        if let Ok(Err(e)) = r {
            result = Err(e);
        }
    }
    announcer.abort();
    // Every session's toolsrv ends with the server (their state stays on disk), and the
    // server waits for each to be gone (toolsrv ends its tools first; SIGKILL after 6 s).
    let sessions = reg.sessions();
    for s in &sessions {
        s.link.stop();
    }
    for s in &sessions {
        s.link.finished().await;
    }
    tracing::info!(
        sessions = sessions.len(),
        "stopped; every toolsrv has exited"
    );
    result
}
