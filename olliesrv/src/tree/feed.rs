//! Writing `feed`: how one writer's Twrites become values.
//!
//! A writer (a fid) writes a value in as many Twrites as it likes: a pipe through
//! `ollie-9p write` or plan9port's `9p write` sends each chunk it reads (4–64 KiB), a client
//! splits at its msize, a FUSE mount sends each write(2). The boundary rule:
//!
//! - a write on the same fid at the offset where its last write ended, less than
//!   [`FEED_QUIET`] after it, and not at offset 0, continues the value being written;
//! - any other write (offset 0, a fresh open, another offset, or after a pause of
//!   [`FEED_QUIET`]) starts a new value, and the value before it is complete;
//! - a value is published (readers woken, unless it equals the current value) when it is
//!   complete: [`FEED_QUIET`] after its last write, when the next value starts, or when the
//!   fid is clunked. Readers never see part of a value.
//!
//! So `while :; do git diff HEAD --; sleep 5; done | ollie-9p write …/feed` gives one value per
//! iteration, and an unchanged iteration wakes nobody. Iterations closer together than
//! [`FEED_QUIET`] join into one value.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;

use crate::state::Agent;
use crate::state::session::MAX_FEED;
use crate::util::lock;

/// How long a feed writer must pause for its value to be complete (and published).
pub const FEED_QUIET: Duration = Duration::from_secs(1);

/// Whether a write at `offset` at time `now` continues the value whose last write ended at
/// `end` at time `last`.
fn continues(end: u64, last: Instant, offset: u64, now: Instant) -> bool {
    offset != 0 && offset == end && now.saturating_duration_since(last) < FEED_QUIET
}

/// One writer fid's value being written.
#[derive(Debug, Clone)]
pub struct FeedWriter {
    agent: Arc<Agent>,
    draft: Arc<Mutex<Draft>>,
}

#[derive(Debug)]
struct Draft {
    /// The value being written; `None` when there is none (published, or refused).
    value: Option<BytesMut>,
    /// Where this fid's last write ended.
    end: u64,
    /// When it arrived.
    last: Instant,
    /// The value being written went over [`MAX_FEED`]: the rest of it is refused too.
    refused: bool,
    /// A task waits to publish the value after [`FEED_QUIET`].
    timer: bool,
}

impl FeedWriter {
    pub fn new(agent: Arc<Agent>) -> FeedWriter {
        FeedWriter {
            agent,
            draft: Arc::new(Mutex::new(Draft {
                value: None,
                end: 0,
                last: Instant::now(),
                refused: false,
                timer: false,
            })),
        }
    }

    /// A Twrite of `data` at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        let now = Instant::now();
        let mut d = lock(&self.draft);
        let more = continues(d.end, d.last, offset, now);
        d.end = offset.saturating_add(data.len() as u64);
        d.last = now;
        if !more {
            if let Some(v) = d.value.take() {
                self.publish(v.freeze());
            }
            d.refused = false;
        }
        if d.refused {
            return Err(too_big(None));
        }
        let had = d.value.as_ref().map_or(0, BytesMut::len);
        if had + data.len() > MAX_FEED {
            d.value = None;
            d.refused = true;
            return Err(too_big(Some(had + data.len())));
        }
        d.value
            .get_or_insert_with(|| BytesMut::with_capacity(data.len()))
            .extend_from_slice(data);
        if !d.timer {
            d.timer = true;
            tokio::spawn(self.clone().publish_when_quiet());
        }
        Ok(())
    }

    /// The fid is clunked: its value is complete.
    pub fn finish(&self) {
        if let Some(v) = lock(&self.draft).value.take() {
            self.publish(v.freeze());
        }
    }

    /// Publishes the value once no write has come for [`FEED_QUIET`].
    async fn publish_when_quiet(self) {
        loop {
            let due = {
                let mut d = lock(&self.draft);
                if d.value.is_none() {
                    d.timer = false;
                    return;
                }
                let due = d.last + FEED_QUIET;
                if Instant::now() >= due {
                    if let Some(v) = d.value.take() {
                        self.publish(v.freeze());
                    }
                    d.timer = false;
                    return;
                }
                due
            };
            tokio::time::sleep_until(due).await;
        }
    }

    /// Called with the draft locked, so one writer's values are published in order.
    fn publish(&self, v: Bytes) {
        // The size was checked as it was written.
        let _ = self.agent.set_feed(v);
    }
}

fn too_big(n: Option<usize>) -> String {
    let what = match n {
        Some(n) => format!("feed value would be {n} bytes"),
        None => "feed value is too large".to_owned(),
    };
    format!(
        "{what}; at most {MAX_FEED} (one value is the writes that follow each other within {}s; pause or write at offset 0 to start the next)",
        FEED_QUIET.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_at_the_end_soon_after_continues() {
        let t = Instant::now();
        assert!(continues(100, t, 100, t + Duration::from_millis(10)));
        assert!(continues(
            100,
            t,
            100,
            t + FEED_QUIET - Duration::from_millis(1)
        ));
    }

    #[test]
    fn offset_zero_another_offset_or_a_pause_start_a_new_value() {
        let t = Instant::now();
        let soon = t + Duration::from_millis(10);
        assert!(!continues(0, t, 0, soon), "offset 0 always starts a value");
        assert!(!continues(100, t, 0, soon));
        assert!(!continues(100, t, 50, soon));
        assert!(!continues(100, t, 200, soon));
        assert!(!continues(100, t, 100, t + FEED_QUIET));
        assert!(!continues(100, t, 100, t + Duration::from_secs(5)));
    }

    #[test]
    fn the_size_error_says_the_limit_and_the_rule() {
        let m = too_big(Some(MAX_FEED + 1));
        assert!(m.contains(&format!("{}", MAX_FEED + 1)), "{m}");
        assert!(m.contains(&format!("at most {MAX_FEED}")), "{m}");
        assert!(!m.contains('\n'), "{m}");
    }
}
