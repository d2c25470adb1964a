//! Feeds arbitrary bytes to `ollie_link::bypass::parse_resolve`, the parser of what the
//! operator writes to `bypass/resolve`, and checks:
//!
//! - it never panics, and every error is one line starting `resolve: `;
//! - whatever it accepts obeys the grammar: at most 4096 bytes of UTF-8 without NUL, a
//!   32-digit lowercase hex id, a denial message of 1..=1000 characters with no control
//!   character; and the verdict written back as canonical JSON parses to the same verdict;
//! - `display_escape` of the input (read as lossy UTF-8) contains none of the escaped
//!   characters, and escaping it again only doubles its backslashes; `display_escape_json` of
//!   any JSON value leaves none of them in its serialisation.
//!
//! Good seeds: `mkdir -p corpus/resolve && echo '{"id":"0123456789abcdef0123456789abcdef",
//! "approved":true,"scope":"session"}' > corpus/resolve/a` (the corpus directory is not
//! committed).
//!
//! Run with `scripts/fuzz.sh`, or `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run resolve`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ollie_link::bypass::{
    MAX_ERROR_CHARS, MAX_RESOLVE, Verdict, display_escape, display_escape_json, is_request_id,
    needs_display_escape, parse_resolve,
};
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    match parse_resolve(data) {
        Err(e) => {
            let m = e.to_string();
            assert!(m.starts_with("resolve: "), "{m:?}");
            assert!(
                !m.contains('\n') && !m.contains('\r'),
                "multi-line error: {m:?}"
            );
        }
        Ok(r) => {
            assert!(data.len() <= MAX_RESOLVE);
            assert!(!data.contains(&0));
            assert!(std::str::from_utf8(data).is_ok());
            assert!(is_request_id(&r.id), "bad id accepted: {:?}", r.id);
            let canonical = match &r.verdict {
                Verdict::Approve {
                    session_scope: false,
                } => {
                    json!({"id": r.id, "approved": true})
                }
                Verdict::Approve {
                    session_scope: true,
                } => {
                    json!({"id": r.id, "approved": true, "scope": "session"})
                }
                Verdict::Deny { message } => {
                    let n = message.chars().count();
                    assert!((1..=MAX_ERROR_CHARS).contains(&n), "{n} characters");
                    assert!(!message.chars().any(|c| c.is_control()), "{message:?}");
                    json!({"id": r.id, "error": message})
                }
            };
            let text = canonical.to_string();
            match parse_resolve(text.as_bytes()) {
                Ok(again) => assert_eq!(again, r, "canonical form parses differently"),
                Err(e) => panic!("canonical form {text:?} refused: {e}"),
            }
        }
    }

    let s = String::from_utf8_lossy(data);
    let once = display_escape(&s);
    assert!(!once.chars().any(needs_display_escape), "{once:?}");
    assert_eq!(display_escape(&once), once.replace('\\', "\\\\"));
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let shown = display_escape_json(&v).to_string();
        assert!(!shown.chars().any(needs_display_escape), "{shown:?}");
    }
});
