//! Holding the other sessions still while one session's escalation is decided.
//!
//! A toolsrv holds its own session still from an escalation's request to the end of its
//! approved run (`toolsrv/src/quiesce.rs`), but other sessions can work in the same trees, and
//! each has its own toolsrv. So a local session's toolsrv (booted with `hold_peers`) logs
//! `{"event":"hold","hold":ID,"trees":[…]}` on its `bypass/log` once its own calls are
//! stopped, and waits; olliesrv, which reads that log, then:
//!
//! 1. writes `hold ID TREES` to the `ctl` of every other local session whose toolsrv is up:
//!    each freezes its running calls and holds new ones if it can write any of the trees
//!    (its workspace, its policies' writable paths, its agents' union upper layers), and the
//!    write returns once they are seen stopped (a session that cannot write them answers at
//!    once and holds nothing);
//! 2. writes `held ID` to the asking toolsrv (or `unheld ID` if a session could not be held:
//!    the request is refused, nothing runs), which then binds and shows the request;
//! 3. on `{"event":"release","hold":ID}` (the approved run has ended, or the request was
//!    refused, denied, expired or withdrawn) writes `release ID` to every session it held.
//!
//! A toolsrv that starts while a hold is live is told `hold` before its link is published, so
//! it runs nothing meanwhile; when the asking toolsrv's link goes down, its holds are released.
//! Remote sessions are neither held nor hold others: their trees are on another host.

use std::sync::Arc;

use serde_json::Value;

use crate::link::{Conn, LinkState};
use crate::state::{Registry, Session};

/// Starts reading `bypass/log` of session `s`'s toolsrv for its `hold` and `release`
/// events, until `done` completes or the link fails; then releases what its holds held.
pub fn watch(
    reg: &Arc<Registry>,
    s: &Arc<Session>,
    conn: Arc<Conn>,
    done: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let reg = Arc::clone(reg);
    let session = s.id.clone();
    tokio::spawn(async move {
        tokio::select! {
            r = read_events(&reg, &session, &conn) => {
                if let Err(e) = r {
                    tracing::debug!(session = %session, error = %e, "hold reader ended");
                }
            }
            () = done => {}
        }
        drop(conn);
        for (id, h) in reg.holds.end_from(&session) {
            release(&reg, &id, h.held).await;
        }
    });
}

/// Reads the log's events (one JSON line per read, a long one in pieces) and acts on
/// `hold` and `release`.
async fn read_events(reg: &Arc<Registry>, session: &str, conn: &Arc<Conn>) -> Result<(), String> {
    conn.read_json_lines(&["bypass", "log"], |_, v| {
        let Some(id) = v["hold"].as_str().map(str::to_owned) else {
            return;
        };
        match v["event"].as_str() {
            Some("hold") => {
                let trees: Vec<String> = v["trees"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|t| t.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let (reg, conn, session) = (Arc::clone(reg), Arc::clone(conn), session.to_owned());
                tokio::spawn(async move { hold(&reg, &session, &conn, id, trees).await });
            }
            Some("release") => {
                if let Some(h) = reg.holds.end(&id) {
                    let reg = Arc::clone(reg);
                    tokio::spawn(async move { release(&reg, &id, h.held).await });
                }
            }
            _ => {}
        }
    })
    .await
}

/// The `hold` command for `id` and `trees`.
fn hold_command(id: &str, trees: &[String]) -> String {
    format!("hold {id} {}", Value::from(trees.to_vec()))
}

/// Holds every other local session for session `from`'s escalation `id`, then tells
/// `from`'s toolsrv whether they all are.
async fn hold(reg: &Arc<Registry>, from: &str, asker: &Conn, id: String, trees: Vec<String>) {
    let targets: Vec<(String, Arc<Conn>)> = {
        let _publishing = reg.holds.publishing.lock().await;
        if trees.is_empty() || !reg.holds.start(&id, from, trees.clone()) {
            drop(_publishing);
            let _ = asker.ctl(&format!("unheld {id}")).await;
            return;
        }
        reg.sessions()
            .into_iter()
            .filter(|t| t.id != from && t.remote.is_none())
            .filter_map(|t| match t.link.state() {
                LinkState::Up(conn) => Some((t.id.clone(), conn)),
                _ => None,
            })
            .collect()
    };
    let cmd = hold_command(&id, &trees);
    let mut ok = true;
    for (tid, conn) in targets {
        match conn.ctl(&cmd).await {
            Ok(()) => {
                if !reg.holds.note_held(&id, &tid) {
                    let _ = conn.ctl(&format!("release {id}")).await;
                }
            }
            Err(e) => {
                tracing::warn!(session = %tid, hold = %id, error = %e, "cannot hold a session for another's escalation");
                ok = false;
            }
        }
    }
    let answer = if ok { "held" } else { "unheld" };
    if let Err(e) = asker.ctl(&format!("{answer} {id}")).await {
        tracing::debug!(session = %from, hold = %id, error = %e, "cannot answer a hold");
    }
}

/// Releases hold `id` in every session it held.
async fn release(reg: &Registry, id: &str, held: std::collections::BTreeSet<String>) {
    for t in reg.sessions() {
        if !held.contains(&t.id) {
            continue;
        }
        if let LinkState::Up(conn) = t.link.state()
            && let Err(e) = conn.ctl(&format!("release {id}")).await
        {
            tracing::debug!(session = %t.id, hold = %id, error = %e, "cannot release a hold");
        }
    }
}

/// Tells a toolsrv that is starting every hold live now (before its link is published, so
/// nothing of its session runs meanwhile). The caller holds `reg.holds.publishing` until the
/// link is published.
pub async fn apply_live(reg: &Registry, s: &Session, conn: &Conn) {
    if s.remote.is_some() {
        return;
    }
    for (id, h) in reg.holds.others(&s.id) {
        match conn.ctl(&hold_command(&id, &h.trees)).await {
            Ok(()) => {
                if !reg.holds.note_held(&id, &s.id) {
                    let _ = conn.ctl(&format!("release {id}")).await;
                }
            }
            Err(e) => {
                tracing::warn!(session = %s.id, hold = %id, error = %e, "cannot hold a new session for another's escalation");
            }
        }
    }
}
