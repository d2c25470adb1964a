//! The state floor: sessions and agents as live objects (their state and the rules for
//! changing them: names, cfg, prompts, feed, chat), the registry that holds them, the store
//! that makes them durable, the event stream and the escalation mirror. Every change that must
//! survive a restart goes to the [`store::Store`] before it is acknowledged.
//!
//! Fids hold `Arc`s of these objects, so a rename never invalidates an open fid; a killed
//! object answers "file does not exist" and ends its blocking reads. Nothing here starts a
//! task that runs a turn or a toolsrv: that is [`crate::sessions`]'s job.
//!
//! [`store::Store`]: crate::state::store::Store

pub(crate) mod bypass;
pub(crate) mod chat;
pub(crate) mod check;
pub(crate) mod events;
pub(crate) mod holds;
pub(crate) mod ns;
pub(crate) mod registry;
pub(crate) mod session;
pub(crate) mod settings;
pub(crate) mod store;

use std::time::{SystemTime, UNIX_EPOCH};

use crate::util::clip;

pub use chat::ChatKind;
pub use registry::Registry;
pub use session::{Agent, AgentState, Session};

/// A new random (v4) UUID.
pub fn new_uuid() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        // No randomness is not worth dying for here: ids only need to be unique.
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b = t.to_le_bytes();
        b[15] ^= std::process::id() as u8;
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Names that cannot be a session or agent name (they are files beside them).
const RESERVED: &[&str] = &["new", "idx", ".", ".."];

/// Session and agent names: 1–64 bytes of `A-Z a-z 0-9 . _ -`, not starting with `.` or
/// `-`, not a reserved file name.
pub fn validate_name(n: &str) -> Result<(), String> {
    if n.is_empty() || n.len() > 64 {
        return Err(format!(
            "invalid name {:?}: 1 to 64 characters of A-Z a-z 0-9 . _ -",
            clip(n)
        ));
    }
    if RESERVED.contains(&n)
        || n.starts_with('.')
        || n.starts_with('-')
        || !n
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "invalid name {:?}: use A-Z a-z 0-9 . _ -, not starting with . or -, not new or idx",
            clip(n)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_v4_and_distinct() {
        let a = new_uuid();
        let b = new_uuid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
    }

    #[test]
    fn names() {
        assert!(validate_name("proj-1.x_y").is_ok());
        for bad in [
            "",
            "new",
            "idx",
            ".x",
            "-x",
            "a/b",
            "a b",
            "é",
            &"x".repeat(65),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
