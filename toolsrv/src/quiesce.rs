//! Holding the session still while an escalation is decided and its approved run runs.
//!
//! The operator approves a request after looking at the workspace: the script it runs, the
//! files that script reads. So from the moment the request is bound until its approved run
//! ends, nothing else of the session may change the trees it reads:
//!
//! - every tool process of the session that is running when the request is made is frozen
//!   ([`ollie_sandbox::Cancel::freeze`]: every process of the run stopped, confirmed through
//!   `/proc`) before the request is bound and shown; an approved run that is running then is
//!   frozen too (its operator approved what it does, not what it would do to another request's
//!   files);
//! - a tool call that starts meanwhile waits before it runs ([`Quiesce::enter`]);
//! - each request holds a [`Ticket`]; the frozen runs go on, and waiting calls start, once no
//!   ticket is left. A request is never waited for by another: escalated calls do not wait.
//!
//! This covers the session's own calls, including lifecycle hooks (they are calls too). Other
//! sessions are separate toolsrv processes; see docs/broker.md for what that leaves.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ollie_sandbox::Cancel;
use tokio::sync::watch;

/// How long a request waits for the session's running calls to be seen stopped. A process in
/// an uninterruptible wait (a slow disk, a hung network filesystem) can take long; past this
/// the request is refused rather than shown with a moving tree.
pub const FREEZE_WAIT: Duration = Duration::from_secs(20);

/// Whether a call is held: [`HELD_NO`], [`HELD_WAITING`] (not started: a request is being
/// decided) or [`HELD_FROZEN`] (running, stopped for a request). `proc/N/stat` shows it.
pub type Held = AtomicU8;
/// Not held.
pub const HELD_NO: u8 = 0;
/// Waiting to start.
pub const HELD_WAITING: u8 = 1;
/// Frozen.
pub const HELD_FROZEN: u8 = 2;

/// What `proc/N/stat`'s `held=` says.
pub fn held_name(h: &Held) -> &'static str {
    match h.load(Ordering::Relaxed) {
        HELD_WAITING => "waiting",
        HELD_FROZEN => "frozen",
        _ => "no",
    }
}

/// A running call the session may have to freeze.
#[derive(Clone)]
struct Active {
    cancel: Cancel,
    held: Arc<Held>,
}

#[derive(Default)]
struct State {
    next_ticket: u64,
    /// Live requests and the calls each one froze (by pid).
    tickets: BTreeMap<u64, BTreeSet<u32>>,
    /// Calls that are running now, by pid.
    active: BTreeMap<u32, Active>,
}

/// The session's freeze state. See the module documentation.
pub struct Quiesce {
    state: Mutex<State>,
    /// The number of live tickets (calls wait while it is above 0).
    live: watch::Sender<usize>,
}

impl std::fmt::Debug for Quiesce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = lock(&self.state);
        f.debug_struct("Quiesce")
            .field("tickets", &st.tickets)
            .field("active", &st.active.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Default for Quiesce {
    fn default() -> Quiesce {
        Quiesce {
            state: Mutex::new(State::default()),
            live: watch::Sender::new(0),
        }
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // Every update leaves the maps consistent: a poisoned lock is still usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A running call's registration; dropping it ends it (the call's run is over).
#[derive(Debug)]
pub struct Entered {
    q: Arc<Quiesce>,
    pid: u32,
}

impl Drop for Entered {
    fn drop(&mut self) {
        lock(&self.q.state).active.remove(&self.pid);
    }
}

/// One request's hold on the session; dropping it lets the calls it froze go on (unless
/// another ticket froze them too) and, at the last ticket, the waiting calls start.
#[derive(Debug)]
pub struct Ticket {
    q: Arc<Quiesce>,
    id: u64,
    /// What it froze: to wait for.
    frozen: Vec<(u32, Cancel)>,
}

impl Quiesce {
    /// Waits until no request is live, then registers call `pid` as running (so a later
    /// request freezes it). Returns `None` if `stop` becomes true first.
    pub async fn enter(
        self: &Arc<Self>,
        pid: u32,
        cancel: &Cancel,
        held: &Arc<Held>,
        stop: &watch::Sender<bool>,
    ) -> Option<Entered> {
        let mut live = self.live.subscribe();
        let mut stopped = stop.subscribe();
        loop {
            {
                let mut st = lock(&self.state);
                if st.tickets.is_empty() {
                    held.store(HELD_NO, Ordering::Relaxed);
                    st.active.insert(
                        pid,
                        Active {
                            cancel: cancel.clone(),
                            held: Arc::clone(held),
                        },
                    );
                    return Some(Entered {
                        q: Arc::clone(self),
                        pid,
                    });
                }
                held.store(HELD_WAITING, Ordering::Relaxed);
            }
            tokio::select! {
                r = live.wait_for(|n| *n == 0) => {
                    if r.is_err() {
                        return None;
                    }
                }
                _ = stopped.wait_for(|s| *s) => {
                    held.store(HELD_NO, Ordering::Relaxed);
                    return None;
                }
            }
        }
    }

    /// Registers an approved run as running without waiting (a request never waits for
    /// another).
    pub fn enter_now(self: &Arc<Self>, pid: u32, cancel: &Cancel, held: &Arc<Held>) -> Entered {
        lock(&self.state).active.insert(
            pid,
            Active {
                cancel: cancel.clone(),
                held: Arc::clone(held),
            },
        );
        Entered {
            q: Arc::clone(self),
            pid,
        }
    }

    /// Starts holding the session for a request: freezes every running call and makes new
    /// calls wait. [`Ticket::wait_frozen`] then waits until the frozen calls have stopped.
    pub fn hold(self: &Arc<Self>) -> Ticket {
        let mut st = lock(&self.state);
        let id = st.next_ticket;
        st.next_ticket += 1;
        let pids: BTreeSet<u32> = st.active.keys().copied().collect();
        let mut frozen = Vec::new();
        for pid in &pids {
            if let Some(a) = st.active.get(pid) {
                a.cancel.freeze();
                a.held.store(HELD_FROZEN, Ordering::Relaxed);
                frozen.push((*pid, a.cancel.clone()));
            }
        }
        st.tickets.insert(id, pids);
        let n = st.tickets.len();
        drop(st);
        self.live.send_replace(n);
        Ticket {
            q: Arc::clone(self),
            id,
            frozen,
        }
    }

    fn is_active(&self, pid: u32) -> bool {
        lock(&self.state).active.contains_key(&pid)
    }
}

impl Ticket {
    /// Blocks (call it off the async runtime) until every call this ticket froze has been seen
    /// stopped or has ended; `Err` names a call that did not stop within `limit`.
    pub fn wait_frozen(&self, limit: Duration) -> Result<(), u32> {
        let end = std::time::Instant::now() + limit;
        for (pid, cancel) in &self.frozen {
            let left = end.saturating_duration_since(std::time::Instant::now());
            let q = &self.q;
            if !cancel.wait_frozen(left, &|| !q.is_active(*pid)) {
                return Err(*pid);
            }
        }
        Ok(())
    }

    /// How many running calls it froze.
    pub fn frozen_count(&self) -> usize {
        self.frozen.len()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = lock(&self.q.state);
        let Some(mine) = st.tickets.remove(&self.id) else {
            return;
        };
        let still: BTreeSet<u32> = st.tickets.values().flatten().copied().collect();
        for (pid, cancel) in &self.frozen {
            cancel.thaw();
            if mine.contains(pid)
                && !still.contains(pid)
                && let Some(a) = st.active.get(pid)
            {
                a.held.store(HELD_NO, Ordering::Relaxed);
            }
        }
        let n = st.tickets.len();
        drop(st);
        self.q.live.send_replace(n);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn calls_wait_while_a_ticket_lives_and_running_ones_are_frozen() {
        let q = Arc::new(Quiesce::default());
        let stop = watch::Sender::new(false);
        let (c1, h1) = (Cancel::new().unwrap(), Arc::new(Held::new(0)));
        let e1 = q.enter(1, &c1, &h1, &stop).await.unwrap();
        let t = q.hold();
        assert_eq!(t.frozen_count(), 1);
        assert_eq!(held_name(&h1), "frozen");
        // A second request freezes the same call again; it stays frozen until both end.
        let t2 = q.hold();
        // A new call waits.
        let (c2, h2) = (Cancel::new().unwrap(), Arc::new(Held::new(0)));
        let q2 = Arc::clone(&q);
        let stop2 = watch::Sender::new(false);
        let h2b = Arc::clone(&h2);
        let waiting = tokio::spawn(async move {
            let e = q2.enter(2, &c2, &h2b, &stop2).await;
            e.is_some()
        });
        while held_name(&h2) != "waiting" {
            tokio::task::yield_now().await;
        }
        drop(t);
        assert_eq!(held_name(&h1), "frozen");
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(t2);
        assert_eq!(held_name(&h1), "no");
        assert!(waiting.await.unwrap());
        drop(e1);
        // A waiting call that is stopped gives up.
        let t3 = q.hold();
        let stop3 = watch::Sender::new(false);
        let (c3, h3) = (Cancel::new().unwrap(), Arc::new(Held::new(0)));
        let q3 = Arc::clone(&q);
        let s3 = stop3.clone();
        let h3b = Arc::clone(&h3);
        let gave_up = tokio::spawn(async move { q3.enter(3, &c3, &h3b, &s3).await.is_none() });
        while held_name(&h3) != "waiting" {
            tokio::task::yield_now().await;
        }
        stop3.send_replace(true);
        assert!(gave_up.await.unwrap());
        drop(t3);
        // A frozen call that has ended counts as frozen for the wait.
        let (c4, h4) = (Cancel::new().unwrap(), Arc::new(Held::new(0)));
        let e4 = q.enter_now(4, &c4, &h4);
        let t4 = q.hold();
        drop(e4);
        assert_eq!(t4.wait_frozen(Duration::from_secs(5)), Ok(()));
    }
}
