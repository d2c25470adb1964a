//! `olliesrv`: the 9P2000 server people and scripts talk to.
//!
//! Guarantees (so far): it serves the root files `help`, `backends`, `ctl` and `eventwait`
//! on a private unix socket (directory 0700, socket 0600, plan9port's namespace convention);
//! it replaces a stale socket but never a live one; a client may attach only as its own user
//! (checked with SO_PEERCRED; root too) or as `agent`, and everyone but the owner gets the group bits;
//! SIGTERM, SIGINT or `kill` on `ctl` stop it cleanly, after a `server-stopping` event.
//! It never runs a tool or a command.
//!
//! Not yet: sessions, agents, toolsrv, backends, persistence, TCP (which will require Tauth).
//!
//! Tested by unit tests here, and by cross-process tests in `tests/` that start the real
//! binary and drive it with our client, the `ninep` crate's client and py9p.
#![forbid(unsafe_code)]

pub mod config;
pub mod events;
pub mod fs;
pub mod listen;

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
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--config FILE`; otherwise the default location, if it exists.
    pub config: Option<PathBuf>,
    /// Listen addresses; empty means `unix!$NAMESPACE/ollie`.
    pub addrs: Vec<Addr>,
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error(
        "{addr}: tcp listeners must authenticate clients, and authentication is not available yet; use a unix socket"
    )]
    TcpUnsupported { addr: String },
    #[error("serving {addr} failed")]
    Serve {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// An error and its causes on one line (`outer: cause: cause`), for logs and 9P errors.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s.replace('\n', " ")
}

/// The default listen address: `unix!$NAMESPACE/ollie`.
pub fn default_addr() -> Addr {
    Addr::Unix(dial::namespace_dir().join("ollie"))
}

/// Runs the server until `stop` is set (by the caller, a signal handler, or `ctl kill`).
pub async fn run(opts: Options, stop: watch::Sender<bool>) -> Result<(), RunError> {
    let config = Config::load(opts.config.as_deref())?;
    let addrs = if opts.addrs.is_empty() {
        vec![default_addr()]
    } else {
        opts.addrs.clone()
    };
    // Bind everything before announcing anything, so a bad address fails fast.
    let mut sockets = Vec::new();
    for a in &addrs {
        match a {
            Addr::Unix(p) => sockets.push(listen::bind_unix(p)?),
            Addr::Tcp { .. } => {
                return Err(RunError::TcpUnsupported {
                    addr: a.to_string(),
                });
            }
        }
    }
    let events = Arc::new(Events::new());
    let shared = Arc::new(Shared::new(
        config,
        opts.config.clone(),
        Arc::clone(&events),
        stop.clone(),
    ));
    let server = Server::new(Arc::new(OllieFs::new(Arc::clone(&shared))));

    let mut f = Map::new();
    f.insert("pid".into(), Value::from(std::process::id()));
    f.insert(
        "addresses".into(),
        Value::from(addrs.iter().map(ToString::to_string).collect::<Vec<_>>()),
    );
    events.emit("server-started", f);
    for a in &addrs {
        tracing::info!(addr = %a, "serving");
    }

    // When told to stop: tell eventwait readers, end the log (their next read is EOF), then
    // stop the listeners.
    let (down_tx, down_rx) = watch::channel(false);
    let mut stop_rx = stop.subscribe();
    let ev = Arc::clone(&events);
    let announcer = tokio::spawn(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
        let mut f = Map::new();
        f.insert("pid".into(), Value::from(std::process::id()));
        ev.emit("server-stopping", f);
        ev.close();
        let _ = down_tx.send(true);
    });

    let mut tasks = tokio::task::JoinSet::new();
    for mut s in sockets {
        let Some(listener) = s.listener.take() else {
            continue;
        };
        let server = Arc::clone(&server);
        let mut down = down_rx.clone();
        tasks.spawn(async move {
            let shutdown = async move {
                let _ = down.wait_for(|d| *d).await;
            };
            let r = server.serve_unix(listener, shutdown, SHUTDOWN_GRACE).await;
            let addr = format!("unix!{}", s.path.display());
            drop(s);
            r.map_err(|source| RunError::Serve { addr, source })
        });
    }
    let mut result = Ok(());
    while let Some(r) = tasks.join_next().await {
        if let Ok(Err(e)) = r {
            result = Err(e);
        }
    }
    announcer.abort();
    tracing::info!("stopped");
    result
}
