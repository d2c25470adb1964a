//! Feeds arbitrary bytes to `ollie_link::bypass::parse_resolve`, the parser of what the
//! operator writes to `bypass/resolve`, and checks:
//!
//! - it never panics, and every error is one line starting `resolve: `;
//! - whatever it accepts obeys the grammar: at most 4096 bytes of UTF-8 without NUL, a
//!   32-digit lowercase hex id, a denial message of 1..=1000 characters with no control
//!   character; and the verdict written back as canonical JSON parses to the same verdict;
//! - `display_escape` of the input (read as lossy UTF-8) contains none of the escaped
//!   characters, and escaping it again only doubles its backslashes; `display_escape_json` of
//!   any JSON value leaves none of them in its serialisation;
//! - `display_unescape` undoes `display_escape` exactly; `display_bounded` of the input is
//!   escaped, at most `MAX_SHOWN_CHARS` characters plus one marker, and has a hidden-part
//!   marker exactly when it was cut; `display_bounded_json` leaves no escaped character;
//! - `parse_resolve_at` refuses every write at an offset other than 0, and every strict
//!   prefix of an accepted verdict that ends inside its object.
//!
//! Good seeds: `mkdir -p corpus/resolve && echo '{"id":"0123456789abcdef0123456789abcdef",
//! "approved":true,"scope":"session"}' > corpus/resolve/a` (the corpus directory is not
//! committed).
//!
//! Run with `scripts/fuzz.sh`, or `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run resolve`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ollie_link::bypass::{
    MAX_ERROR_CHARS, MAX_RESOLVE, MAX_SHOWN_CHARS, ResolveError, Verdict, display_bounded,
    display_bounded_json, display_escape, display_escape_json, display_unescape,
    has_hidden_marker, is_request_id, needs_display_escape, parse_resolve, parse_resolve_at,
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
            assert!(matches!(
                parse_resolve_at(1 + data.len() as u64, data),
                Err(ResolveError::NotAtStart { .. })
            ));
            let body = std::str::from_utf8(data).unwrap_or_default().trim_end();
            if let Some(cut) = body.rfind('}') {
                for i in (0..cut).filter(|&i| body.is_char_boundary(i)) {
                    assert!(
                        parse_resolve_at(0, &body.as_bytes()[..i]).is_err(),
                        "a prefix of a verdict was accepted: {:?}",
                        &body[..i]
                    );
                }
            }
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
    assert_eq!(display_unescape(&once).as_deref(), Some(&*s));
    let bounded = display_bounded(&s);
    assert!(!bounded.chars().any(needs_display_escape), "{bounded:?}");
    let cut = once.chars().count() > MAX_SHOWN_CHARS;
    assert_eq!(has_hidden_marker(&bounded), cut, "{bounded:?}");
    assert!(!has_hidden_marker(&once));
    if cut {
        assert!(bounded.chars().count() <= MAX_SHOWN_CHARS + 64, "{bounded:?}");
    } else {
        assert_eq!(bounded, once);
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let shown = display_escape_json(&v).to_string();
        assert!(!shown.chars().any(needs_display_escape), "{shown:?}");
        let shown = display_bounded_json(&v).to_string();
        assert!(!shown.chars().any(needs_display_escape), "{shown:?}");
    }
});
