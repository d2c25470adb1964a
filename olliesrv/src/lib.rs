//! `olliesrv`: the 9P2000 server people and scripts talk to.
//!
//! It serves the tree in `tree` (root files, sessions and agents as files, each session's
//! toolsrv tree) on a private unix socket (directory 0700, socket 0600, plan9port's
//! namespace convention) and optionally on TCP, where every connection must authenticate
//! with Tauth and the key in `<state>/tcp.key`. It replaces a stale socket but never a live
//! one; a unix client may attach only as its own user (checked with SO_PEERCRED; root too)
//! or as `agent`, and everyone but the owner (the server's user, root and config.toml's
//! `operators`) gets the group bits. Under systemd ([`systemd`]) it serves the sockets passed
//! by socket activation instead of the default address, reports readiness and stopping, and
//! waits for every toolsrv to exit before it does. Sessions and agents
//! (`state`) persist in the state directory (`state::store`) and are restored on start
//! (`sessions`); each session has its own toolsrv (`supervise`, `link`), restarted when it
//! dies. Every session and agent has a bead namespace (`state::ns`), kept beside its record and served under its `ns/` directory; an
//! agent's copy is forked from its session's when the agent is created. Skills (`skills`)
//! from the configured skill paths are served read-only under `skills/`, listed in agents'
//! system prompts and granted read-only to their tools. SIGTERM, SIGINT or `kill`
//! on `ctl` stop it cleanly, after a `server-stopping` event. It never runs a tool or a
//! command itself.
//!
//! A session may run its toolsrv on another host (`remote=`, `config`'s `[remotes.NAME]`):
//! olliesrv starts it over ssh (`toolsrv --stdio`) and speaks the same 9P to it.
//!
//! The modules are floors: each imports only the ones below it (their order below,
//! checked by `tests/tests/floors.rs`); ARCHITECTURE.md maps every file.
//!
//! Tested by unit tests here, and by cross-process tests in `tests/` that start the real
//! binary and drive it with our client, the `ninep` crate's client and py9p; the parsers of
//! the configuration are fuzzed (`fuzz/fuzz_targets/config.rs`, through [`fuzzing`]).
#![forbid(unsafe_code)]

// Floors, top to bottom: each module imports only the ones declared after it
// (tests/tests/floors.rs checks it). Blank lines between them keep rustfmt from sorting them.
// A module documented both here and in its file has all its doc links resolved here, at the
// crate root (rust-lang/rust#134904): its file links by `crate::` paths, and only to items
// the root can see.
/// The 9P face: the file tables, nodes, ctl verbs, toolsrv views, unions and skills.
mod tree;

/// Creating, restoring and killing sessions and agents; starting workers and links.
mod sessions;

/// An agent's turns: the loop, compaction, hooks, namespace tools, history.
mod agent;

/// Each session's toolsrv process: start, connect, watch, restart.
mod supervise;

/// Holding the other sessions still while one session's escalation is decided.
mod holds;

/// Sessions, agents, the registry, the store, events and the escalation mirror.
mod state;

/// The 9P connection to a toolsrv and the calls made on it, by agent id.
mod link;

/// The skill catalogue of the configured skill paths.
mod skills;

/// `--check-config`: the configuration and its backends checked without serving.
mod check;

/// The LLM backends.
mod backend;

/// Keeping API keys out of everything shown or stored.
mod redact;

/// config.toml.
mod config;
/// This server's own secret locations (state, configuration, sockets, key files).
mod secrets;

/// Listening sockets.
mod listen;

/// Socket activation and readiness notification.
pub mod systemd;

/// Locks, the clock, event fields, clipping.
mod util;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ollie_p9::Server;
use ollie_p9::dial::{self, Addr};
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::config::{Config, ConfigError};
use crate::listen::ListenError;
use crate::state::events::Events;
use crate::tree::{OllieFs, Shared};

/// How long open connections get to finish after the server is told to stop.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// What to serve and where.
#[derive(Debug, Default)]
pub struct Options {
    /// `--config FILE`; otherwise the default location, if it exists.
    pub config: Option<PathBuf>,
    /// Listen addresses besides `unix!$NAMESPACE/ollie`, which a unix address among them
    /// replaces. TCP addresses require Tauth with the key in `<state>/tcp.key`.
    pub addrs: Vec<Addr>,
    /// `--state-dir`; otherwise `crate::state::store::default_dir`.
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
        source: Box<crate::state::store::StoreError>,
    },
    #[error("state directory {path} is in use by another olliesrv ({reason})")]
    StateInUse { path: PathBuf, reason: String },
    #[error("{path}")]
    Key {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no runnable toolsrv: {tried}: {reason}; build it (cargo build --release --workspace), \
         or give --toolsrv FILE or OLLIE_TOOLSRV"
    )]
    NoToolsrv { tried: String, reason: String },
    #[error("serving {addr} failed")]
    Serve {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// An error and its causes on one line, for logs and 9P errors.
pub use ollie_link::error_chain;

/// For the `config` fuzz target only (fuzz/ is its own workspace and needs the parsers of a
/// private module); not an API.
#[doc(hidden)]
pub use config::fuzzing;

/// `olliesrv --check-config`.
pub use check::{Report as ConfigReport, check as check_config};
/// `olliesrv --check-state DIR`.
pub use state::check::{Report as StateReport, check as check_state};

/// The default listen address: `unix!$NAMESPACE/ollie`.
pub fn default_addr() -> Addr {
    Addr::Unix(dial::namespace_dir().join("ollie"))
}

/// What to listen on: the `-a` addresses, plus the default unix socket unless one of them
/// is a unix socket (TCP is served besides the socket `o` looks for, not instead of it) or
/// the service manager passed sockets.
fn listen_addrs(given: &[Addr], activated: bool) -> Vec<Addr> {
    let mut addrs = given.to_vec();
    if !activated && !addrs.iter().any(|a| matches!(a, Addr::Unix(_))) {
        addrs.insert(0, default_addr());
    }
    addrs
}

/// Where the state lives: `--state-dir`, else `$STATE_DIRECTORY` (systemd), else
/// `$XDG_STATE_HOME/ollie`, else `~/.local/state/ollie`.
fn state_dir(opts: &Options) -> Result<PathBuf, RunError> {
    opts.state_dir
        .clone()
        .or_else(crate::state::store::default_dir)
        .ok_or(RunError::NoStateDir)
}

/// The toolsrv binary to start sessions with, checked to run (`toolsrv --version`): a
/// server that cannot start any session's tools refuses to start rather than fail each one.
fn runnable_toolsrv(opts: &Options) -> Result<PathBuf, RunError> {
    let program = opts
        .toolsrv
        .clone()
        .unwrap_or_else(ollie_link::spawn::default_program);
    let tried = if program.components().count() > 1 {
        program.display().to_string()
    } else {
        let here = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("toolsrv").display().to_string()))
            .unwrap_or_else(|| "next to olliesrv".into());
        format!("tried {here} and {} on PATH", program.display())
    };
    let fail = |reason: String| RunError::NoToolsrv {
        tried: tried.clone(),
        reason,
    };
    let out = std::process::Command::new(&program)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() || !out.stdout.starts_with(b"toolsrv ") {
        return Err(fail(format!(
            "`{} --version` did not answer as toolsrv does ({})",
            program.display(),
            out.status
        )));
    }
    Ok(program)
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

/// Every socket the server serves, bound (or taken from the service manager) before anything
/// is announced.
struct Listeners {
    /// Bound here: their socket files are removed after serving.
    sockets: Vec<listen::UnixSocket>,
    /// Passed by socket activation: the service manager's, never removed.
    passed_unix: Vec<(String, tokio::net::UnixListener)>,
    tcps: Vec<(String, tokio::net::TcpListener)>,
    /// Every address, as announced.
    names: Vec<String>,
}

impl Listeners {
    async fn bind(
        addrs: &[Addr],
        activated: Vec<systemd::Activated>,
    ) -> Result<Listeners, RunError> {
        let mut sockets = Vec::new();
        let mut tcps = Vec::new();
        for a in addrs {
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
        Ok(Listeners {
            sockets,
            passed_unix,
            tcps,
            names,
        })
    }
}

/// One task per listener, serving until `down` turns true.
fn serve_all(
    server: &Arc<Server<OllieFs>>,
    sockets: Vec<listen::UnixSocket>,
    passed_unix: Vec<(String, tokio::net::UnixListener)>,
    tcps: Vec<(String, tokio::net::TcpListener)>,
    down_rx: &watch::Receiver<bool>,
) -> tokio::task::JoinSet<Result<(), RunError>> {
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
        let server = Arc::clone(server);
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
        let server = Arc::clone(server);
        let mut down = down_rx.clone();
        tasks.spawn(async move {
            let shutdown = async move {
                let _ = down.wait_for(|d| *d).await;
            };
            let r = server.serve_tcp(listener, shutdown, SHUTDOWN_GRACE).await;
            r.map_err(|source| RunError::Serve { addr, source })
        });
    }
    tasks
}

/// Runs the server until `stop` is set (by the caller, a signal handler, or `ctl kill`).
pub async fn run(mut opts: Options, stop: watch::Sender<bool>) -> Result<(), RunError> {
    let config = Config::load(opts.config.as_deref())?;
    let limits = config.limits;
    let activated = std::mem::take(&mut opts.activated);
    let addrs = listen_addrs(&opts.addrs, !activated.is_empty());
    let toolsrv = runnable_toolsrv(&opts)?;
    let dir = state_dir(&opts)?;
    let _lock = lock_state(&dir)?;
    let store =
        Arc::new(
            crate::state::store::Store::open(&dir).map_err(|source| RunError::State {
                source: Box::new(source),
            })?,
        );
    // Mark the state directory as ollie's and list it for other instances and `o sandbox`
    // (before the socket accepts anyone).
    if let Err(e) = ollie_link::instances::register(&dir) {
        tracing::warn!(state = %dir.display(), error = %e, "state directory not listed as secret for other instances");
    }
    // Bind everything before announcing anything, so a bad address fails fast.
    let Listeners {
        sockets,
        passed_unix,
        tcps,
        names,
    } = Listeners::bind(&addrs, activated).await?;
    let key = if tcps.is_empty() {
        None
    } else {
        Some(tcp_key(&dir)?)
    };
    // This server's secret set, fixed before anything is served.
    let socket_paths: Vec<PathBuf> = sockets.iter().map(|s| s.path.clone()).collect();
    let config_paths = crate::secrets::config_paths(
        config.path.as_deref(),
        config.path.as_deref().map(crate::config::dir_of),
        config
            .backends
            .values()
            .filter_map(|b| b.api_key_file.clone())
            .collect(),
    );
    crate::secrets::set(crate::secrets::compute(&dir, &config_paths, &socket_paths));
    let events = Arc::new(Events::new());
    let config = Arc::new(std::sync::RwLock::new(Arc::new(config)));
    let reg = Arc::new(crate::state::Registry::new(
        Arc::clone(&events),
        Arc::clone(&store),
        Arc::clone(&config),
        toolsrv,
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

    let mut tasks = serve_all(&server, sockets, passed_unix, tcps, &down_rx);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_addresses_add_to_the_default_socket_and_a_unix_one_replaces_it() {
        let tcp = Addr::parse("tcp!127.0.0.1!5640").unwrap();
        let unix = Addr::parse("unix!/tmp/x/ollie").unwrap();
        let show = |v: Vec<Addr>| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(show(listen_addrs(&[], false)), show(vec![default_addr()]));
        assert_eq!(
            show(listen_addrs(std::slice::from_ref(&tcp), false)),
            show(vec![default_addr(), tcp.clone()])
        );
        assert_eq!(
            show(listen_addrs(&[unix.clone(), tcp.clone()], false)),
            show(vec![unix, tcp.clone()])
        );
        // Socket activation passes the unix socket itself.
        assert!(listen_addrs(&[], true).is_empty());
        assert_eq!(
            show(listen_addrs(std::slice::from_ref(&tcp), true)),
            show(vec![tcp])
        );
    }
}
