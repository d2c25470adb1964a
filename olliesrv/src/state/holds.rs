//! The holds one session's escalations keep on the other sessions (see [`crate::holds`]): by
//! hold id, the session that asked, the trees its approved run may read or write, and the
//! sessions held for it so far.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use crate::util::lock;

/// One live hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The session whose escalation asked for it.
    pub from: String,
    /// The trees (canonical, absolute) as toolsrv sent them.
    pub trees: Vec<String>,
    /// Sessions told to hold (`ctl hold`), released at the end.
    pub held: BTreeSet<String>,
}

/// Every live hold of the server.
#[derive(Debug, Default)]
pub struct PeerHolds {
    live: Mutex<BTreeMap<String, Hold>>,
    /// Held while a toolsrv's link is published (after the live holds are applied to it)
    /// and while a new hold records itself and picks the sessions to hold: so each session
    /// either is picked or, starting later, finds the hold.
    pub publishing: tokio::sync::Mutex<()>,
}

impl PeerHolds {
    /// Records a new hold; false if the id is live already.
    pub fn start(&self, id: &str, from: &str, trees: Vec<String>) -> bool {
        let mut l = lock(&self.live);
        if l.contains_key(id) {
            return false;
        }
        l.insert(
            id.to_owned(),
            Hold {
                from: from.to_owned(),
                trees,
                held: BTreeSet::new(),
            },
        );
        true
    }

    /// Notes that `session` was told to hold for `id`; false if the hold has ended meanwhile
    /// (the caller then releases it at once).
    pub fn note_held(&self, id: &str, session: &str) -> bool {
        match lock(&self.live).get_mut(id) {
            Some(h) => {
                h.held.insert(session.to_owned());
                true
            }
            None => false,
        }
    }

    /// Ends hold `id`: what it held.
    pub fn end(&self, id: &str) -> Option<Hold> {
        lock(&self.live).remove(id)
    }

    /// Ends every hold session `from` asked for (its toolsrv is gone).
    pub fn end_from(&self, from: &str) -> Vec<(String, Hold)> {
        let mut l = lock(&self.live);
        let ids: Vec<String> = l
            .iter()
            .filter(|(_, h)| h.from == from)
            .map(|(id, _)| id.clone())
            .collect();
        ids.into_iter()
            .filter_map(|id| l.remove(&id).map(|h| (id, h)))
            .collect()
    }

    /// The live holds other sessions than `session` asked for.
    pub fn others(&self, session: &str) -> Vec<(String, Hold)> {
        lock(&self.live)
            .iter()
            .filter(|(_, h)| h.from != session)
            .map(|(id, h)| (id.clone(), h.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_start_once_note_their_sessions_and_end_with_their_asker() {
        let h = PeerHolds::default();
        assert!(h.start("a1", "s1", vec!["/w".into()]));
        assert!(!h.start("a1", "s1", vec![]));
        assert!(h.start("b1", "s2", vec!["/v".into()]));
        assert!(h.note_held("a1", "s2"));
        assert_eq!(h.others("s2").len(), 1);
        assert_eq!(h.others("s3").len(), 2);
        let gone = h.end_from("s1");
        assert_eq!(gone.len(), 1);
        assert!(gone[0].1.held.contains("s2"));
        assert!(!h.note_held("a1", "s3"));
        assert!(h.end("b1").is_some());
        assert!(h.end("b1").is_none());
    }
}
