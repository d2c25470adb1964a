//! Feeds arbitrary bytes to the egress proxy's decoders and checks:
//!
//! - `ollie_proxy::sni::parse_first_flight` never panics; a ClientHello's server name is
//!   non-empty ASCII; bytes not starting `0x16 0x03` are never TLS; every strict prefix of a
//!   whole ClientHello is incomplete; `check_sni` never panics on what it returns;
//! - `ollie_policy::domains::normalize_host` (the bytes as lossy UTF-8) never panics, a name
//!   it returns is lower-case ASCII of letters, digits, `-`, `_` and `.` within 253 bytes, and
//!   normalising its display again gives the same host;
//! - `DomainPattern::parse` never panics and its display parses back to the same pattern.
//!
//! Seeds: `fuzz/corpus/egress/` holds curl's ClientHellos (`proxy/testdata/`).
//!
//! Run with `scripts/fuzz.sh`, or `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run egress`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ollie_policy::domains::{DomainPattern, Host, normalize_host};
use ollie_proxy::sni::{FirstFlight, check_sni, parse_first_flight};

fuzz_target!(|data: &[u8]| {
    let flight = parse_first_flight(data);
    if !data.starts_with(&[0x16, 0x03]) && data.len() >= 2 {
        assert_eq!(flight, FirstFlight::NotTls);
    }
    if let FirstFlight::Hello { server_name } = &flight {
        if let Some(n) = server_name {
            assert!(!n.is_empty() && n.is_ascii());
        }
        for cut in [data.len() / 2, 5, 9] {
            if cut < data.len() && cut > 0 {
                assert!(!matches!(parse_first_flight(&data[..cut]), FirstFlight::Hello { .. }));
            }
        }
    }
    if flight != FirstFlight::Incomplete {
        let host = Host::Name("fuzz.example".into());
        let _ = check_sni(&host, &flight);
    }

    let text = String::from_utf8_lossy(data);
    if let Ok(h) = normalize_host(&text) {
        if let Host::Name(n) = &h {
            assert!(n.len() <= 253);
            assert!(n.bytes().all(|b| b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || matches!(b, b'-' | b'_' | b'.')));
        }
        assert_eq!(normalize_host(&h.to_string()), Ok(h));
    }
    if let Ok(p) = DomainPattern::parse(&text) {
        assert_eq!(DomainPattern::parse(&p.to_string()), Ok(p));
    }
});
