//! Feeds arbitrary bytes to olliesrv's framers of streamed model replies (server-sent events
//! and NDJSON lines, `olliesrv/src/backend/framing.rs`, compiled here as it is) and checks:
//!
//! - neither panics;
//! - the items do not depend on how the bytes are cut into chunks: the whole input at once,
//!   cut at one point (chosen by the first byte), and one byte at a time give the same items
//!   and the same error;
//! - an SSE event's data never holds a line ending it was split at, and an NDJSON line never
//!   holds its `\n`.
//!
//! Run with `scripts/fuzz.sh`, or `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run stream`.

#![no_main]

#[path = "../../olliesrv/src/backend/framing.rs"]
#[allow(dead_code)]
mod framing;

use framing::{Frame, Framer, LineSplitter, SseParser};
use libfuzzer_sys::fuzz_target;

/// The items and the first error of framing `data` cut into `chunks`.
fn frame<F: Framer + Default>(chunks: &[&[u8]]) -> (Vec<F::Item>, Option<String>) {
    let mut f = F::default();
    let mut out = Vec::new();
    for c in chunks {
        if let Err(e) = f.feed(c, &mut out) {
            return (out, Some(e));
        }
    }
    let r = f.finish(&mut out);
    (out, r.err())
}

fn cuts(data: &[u8], at: usize) -> [Vec<&[u8]>; 3] {
    let at = at.min(data.len());
    [
        vec![data],
        vec![&data[..at], &data[at..]],
        data.chunks(1).collect(),
    ]
}

fuzz_target!(|input: &[u8]| {
    let Some((&k, data)) = input.split_first() else {
        return;
    };
    let at = usize::from(k) * data.len() / 255;
    let [whole, two, bytes] = cuts(data, at);

    let sse = frame::<SseParser>(&whole);
    assert_eq!(sse, frame::<SseParser>(&two), "sse: cut at {at} differs");
    assert_eq!(sse, frame::<SseParser>(&bytes), "sse: byte by byte differs");
    for f in &sse.0 {
        if let Frame::Error(e) = f {
            assert!(!e.contains('\n'), "an error line holds a newline: {e:?}");
        }
    }
    if let Some(e) = &sse.1 {
        assert!(!e.contains('\n'), "multi-line error: {e:?}");
    }

    let lines = frame::<LineSplitter>(&whole);
    assert_eq!(lines, frame::<LineSplitter>(&two), "ndjson: cut at {at} differs");
    assert_eq!(lines, frame::<LineSplitter>(&bytes), "ndjson: byte by byte differs");
    for l in &lines.0 {
        assert!(!l.contains(&b'\n'), "a line holds its newline");
    }
    // Nothing is lost: the lines and their newlines are the input.
    if lines.1.is_none() {
        let n = data.iter().filter(|b| **b == b'\n').count();
        let joined: usize = lines.0.iter().map(Vec::len).sum::<usize>() + n;
        assert_eq!(joined, data.len(), "ndjson lost bytes");
    }
});
