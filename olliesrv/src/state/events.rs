//! The server's event log behind `eventwait`: a bounded ring of JSON lines, each with a sequence
//! number, and a way to wait for the next one after a cursor.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use tokio::sync::watch;

/// Events kept for readers that fall behind.
pub const RING: usize = 1024;

#[derive(Debug, Default)]
struct Ring {
    events: VecDeque<(u64, String)>,
    last: u64,
    closed: bool,
}

/// The event log.
#[derive(Debug)]
pub struct Events {
    ring: Mutex<Ring>,
    /// Bumped on every event and on close, to wake waiters.
    bell: watch::Sender<u64>,
}

impl Default for Events {
    fn default() -> Self {
        Events::new()
    }
}

impl Events {
    pub fn new() -> Events {
        Events {
            ring: Mutex::new(Ring::default()),
            bell: watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends an event `{"seq":…,"time":…,"event":kind, …fields}` and wakes every waiter.
    /// Returns its sequence number. Events after [`Events::close`] are dropped.
    pub fn emit(&self, kind: &str, fields: Map<String, Value>) -> u64 {
        let mut r = self.lock();
        if r.closed {
            return r.last;
        }
        r.last += 1;
        let seq = r.last;
        let mut obj = Map::new();
        obj.insert("seq".into(), Value::from(seq));
        obj.insert("time".into(), Value::from(rfc3339(SystemTime::now())));
        obj.insert("event".into(), Value::from(kind));
        for (k, v) in fields {
            obj.insert(k, v);
        }
        let mut line = Value::Object(obj).to_string();
        line.push('\n');
        r.events.push_back((seq, line));
        while r.events.len() > RING {
            r.events.pop_front();
        }
        drop(r);
        self.bell.send_modify(|v| *v = seq);
        seq
    }

    /// The sequence number of the newest event: a reader starting now sees only later ones.
    pub fn cursor(&self) -> u64 {
        self.lock().last
    }

    /// No more events: waiters get what is left, then `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.bell.send_modify(|v| *v = v.wrapping_add(0));
    }

    /// The first event after `cursor`, waiting for one if needed. `None` once the log is closed
    /// and nothing newer is left. A reader that fell more than [`RING`] events behind gets an
    /// `overflow` event saying how many it missed, then continues with the oldest kept.
    pub async fn next_after(&self, cursor: u64) -> Option<(u64, String)> {
        let mut rx = self.bell.subscribe();
        loop {
            {
                let r = self.lock();
                if let Some(&(oldest, _)) = r.events.front()
                    && cursor + 1 < oldest
                {
                    let missed = oldest - cursor - 1;
                    let line = format!(
                        "{{\"seq\":{},\"event\":\"overflow\",\"missed\":{missed}}}\n",
                        oldest - 1
                    );
                    return Some((oldest - 1, line));
                }
                if let Some((seq, line)) = r.events.iter().find(|(s, _)| *s > cursor) {
                    return Some((*seq, line.clone()));
                }
                if r.closed {
                    return None;
                }
            }
            if rx.changed().await.is_err() {
                return None;
            }
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a time after the epoch.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (y, m, d, hh, mm, ss) = ollie_p9::util::civil(secs);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_796_034_119)),
            "2026-11-30T10:21:59Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
    }

    #[tokio::test]
    async fn readers_see_only_newer_events_then_end_on_close() {
        let ev = Events::new();
        ev.emit("before", Map::new());
        let cur = ev.cursor();
        let waiter = {
            let ev = &ev;
            async move { ev.next_after(cur).await }
        };
        let (got, ()) = tokio::join!(waiter, async {
            tokio::task::yield_now().await;
            ev.emit("after", Map::new());
        });
        let (seq, line) = got.unwrap();
        assert_eq!(seq, 2);
        assert!(line.contains("\"event\":\"after\""));
        assert!(line.ends_with('\n'));
        ev.close();
        assert!(ev.next_after(seq).await.is_none());
        // Events emitted after close are dropped.
        ev.emit("late", Map::new());
        assert!(ev.next_after(seq).await.is_none());
    }

    #[tokio::test]
    async fn slow_readers_are_told_what_they_missed() {
        let ev = Events::new();
        for _ in 0..RING + 10 {
            ev.emit("x", Map::new());
        }
        let (seq, line) = ev.next_after(0).await.unwrap();
        assert_eq!(seq, 10);
        assert!(line.contains("\"missed\":10"), "{line}");
        let (seq, _) = ev.next_after(seq).await.unwrap();
        assert_eq!(seq, 11);
    }
}
