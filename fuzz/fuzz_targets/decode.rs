//! Feeds arbitrary bytes to every decoder of `ollie_p9::wire` and checks, for whatever decodes,
//! the round-trip invariant: re-encoding succeeds, and decoding the encoding yields an equal
//! message. It also checks that the encoding is byte-identical to the input: 9P2000 has one
//! encoding per message and our decoder rejects trailing bytes, inconsistent stat sizes, NUL
//! and invalid UTF-8 in strings, so anything it accepts must re-encode to exactly what it read.
//!
//! Any panic (in a decoder, or a violated invariant below) is reported by libFuzzer as a crash.
//!
//! Run with `scripts/fuzz.sh`, or `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run decode`.

#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use ollie_p9::wire::{self, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    check(data);
    // The same bytes with an honest size field, so that mutations of the body are not all
    // rejected up front as a size mismatch.
    if data.len() >= 4 {
        let mut fixed = data.to_vec();
        let n = u32::try_from(fixed.len()).unwrap_or(u32::MAX);
        fixed[..4].copy_from_slice(&n.to_le_bytes());
        check(&fixed);
    }
});

fn check(data: &[u8]) {
    let frame = Bytes::copy_from_slice(data);

    match wire::decode_header(data) {
        Ok(h) => {
            assert!(
                data.len() >= HEADER_LEN,
                "header decoded from {} bytes",
                data.len()
            );
            assert_eq!(
                h.size,
                u32::from_le_bytes([data[0], data[1], data[2], data[3]])
            );
            assert_eq!(h.ty, data[4]);
            assert_eq!(h.tag, u16::from_le_bytes([data[5], data[6]]));
        }
        Err(_) => assert!(
            data.len() < HEADER_LEN,
            "header rejected with {} bytes",
            data.len()
        ),
    }

    if let Ok((tag, m)) = wire::decode_t(frame.clone()) {
        let mut out = BytesMut::new();
        if let Err(e) = wire::encode_t(&mut out, tag, &m) {
            panic!("decoded {m:?} but cannot re-encode it: {e}");
        }
        match wire::decode_t(out.clone().freeze()) {
            Ok(again) => assert_eq!(again, (tag, m.clone()), "T round trip changed the message"),
            Err(e) => panic!("our own encoding of {m:?} does not decode: {e}"),
        }
        assert_eq!(
            &out[..],
            data,
            "T re-encoding of {m:?} differs from the input"
        );
    }

    if let Ok((tag, m)) = wire::decode_r(frame.clone()) {
        let mut out = BytesMut::new();
        if let Err(e) = wire::encode_r(&mut out, tag, &m) {
            panic!("decoded {m:?} but cannot re-encode it: {e}");
        }
        match wire::decode_r(out.clone().freeze()) {
            Ok(again) => assert_eq!(again, (tag, m.clone()), "R round trip changed the message"),
            Err(e) => panic!("our own encoding of {m:?} does not decode: {e}"),
        }
        assert_eq!(
            &out[..],
            data,
            "R re-encoding of {m:?} differs from the input"
        );

        // The zero-copy variant must produce the same bytes.
        let mut head = BytesMut::new();
        match wire::encode_r_parts(&mut head, tag, &m) {
            Ok(payload) => {
                if let Some(p) = payload {
                    head.extend_from_slice(&p);
                }
                assert_eq!(&head[..], &out[..], "encode_r_parts differs from encode_r");
            }
            Err(e) => panic!("encode_r_parts failed where encode_r succeeded: {e}"),
        }
    }

    // Stat entries: the whole input, and what would follow an Rstat's n[2].
    let after_n = frame.slice(data.len().min(HEADER_LEN + 2)..);
    for buf in [&frame, &after_n] {
        if let Ok(st) = wire::decode_stat(buf) {
            let mut out = BytesMut::new();
            if let Err(e) = wire::encode_stat(&mut out, &st) {
                panic!("decoded stat {st:?} but cannot re-encode it: {e}");
            }
            match wire::decode_stat(&out.clone().freeze()) {
                Ok(again) => assert_eq!(again, st, "stat round trip changed the entry"),
                Err(e) => panic!("our own encoding of stat {st:?} does not decode: {e}"),
            }
            assert_eq!(
                &out[..],
                &buf[..],
                "stat re-encoding differs from the input"
            );
        }
        if let Ok(dir) = wire::decode_dir(buf) {
            let mut out = BytesMut::new();
            for st in &dir {
                if let Err(e) = wire::encode_stat(&mut out, st) {
                    panic!("decoded dir entry {st:?} but cannot re-encode it: {e}");
                }
            }
            match wire::decode_dir(&out.clone().freeze()) {
                Ok(again) => assert_eq!(again, dir, "dir round trip changed the entries"),
                Err(e) => panic!("our own encoding of a directory does not decode: {e}"),
            }
            assert_eq!(&out[..], &buf[..], "dir re-encoding differs from the input");
        }
    }
}
