//! Small helpers every floor of olliesrv uses: poison-proof locks, the clock, and the
//! clipped quoting of user input in error messages.

use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
