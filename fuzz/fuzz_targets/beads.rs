//! Feeds arbitrary bytes to the two decoders of bead namespaces: the `ns/ctl` command parser
//! (`ollie_beads::Command::parse`) and the session namespace file
//! (`ollie_beads::Namespace::from_json`), and checks:
//!
//! - neither panics, and every error is one line;
//! - a command that parses prints (`Display`) as a line that parses to the same command;
//! - a namespace file that parses writes back (`to_json`) as one that parses to the same
//!   namespace (replaying it rebuilds the same table).
//!
//! Run with `scripts/fuzz.sh`, or `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run beads`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ollie_beads::{Command, Namespace};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Command::parse(text) {
        Err(e) => assert!(!e.contains('\n'), "multi-line error: {e:?}"),
        Ok(c) => {
            let again = Command::parse(&c.to_string())
                .unwrap_or_else(|e| panic!("{c} does not parse back: {e}"));
            assert_eq!(again, c);
        }
    }
    match Namespace::from_json(text) {
        Err(e) => assert!(!e.to_string().contains('\n'), "multi-line error: {e}"),
        Ok(ns) => {
            let back = Namespace::from_json(&ns.to_json())
                .unwrap_or_else(|e| panic!("to_json does not parse back: {e}"));
            assert_eq!(back, ns);
        }
    }
});
