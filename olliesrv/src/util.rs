//! Small helpers every floor of olliesrv uses: poison-proof locks, disk waits off the worker
//! threads, the clock, and the clipped quoting of user input in error messages.

use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `f`, which blocks on the disk (an fsync) or on a lock held across one, without
/// holding up the other tasks of the worker thread it runs on: on the multi-threaded runtime
/// they move to another thread meanwhile ([`tokio::task::block_in_place`]). Elsewhere (a
/// current-thread runtime, no runtime) `f` simply runs.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

pub(crate) fn read<T: Clone>(m: &RwLock<T>) -> T {
    m.read()
        .map_or_else(|p| p.into_inner().clone(), |g| g.clone())
}

pub(crate) fn write<T>(m: &RwLock<T>, v: T) {
    match m.write() {
        Ok(mut g) => *g = v,
        Err(p) => *p.into_inner() = v,
    }
}

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// At most 60 characters of `s`, escaped, for error messages.
pub fn clip(s: &str) -> String {
    ollie_link::text::clip(s, 60).escape_debug().to_string()
}

/// The fields of an event from `(name, value)` pairs.
pub(crate) fn ev(pairs: &[(&str, Value)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}
