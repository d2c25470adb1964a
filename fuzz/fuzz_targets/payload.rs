//! Feeds arbitrary UTF-8 to toolsrv's `proc/new` payload parser (`toolsrv/src/payload.rs`,
//! compiled here as it is) and checks: it never panics; an error is one non-empty line; a
//! parsed payload names a tool, keeps `stdin=` within its limit, and parses again to the same
//! payload when written back in the payload's own escaping (`ollie_link::escape_value`).
//!
//! Run with `scripts/fuzz.sh`, or `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run payload`.

#![no_main]

#[path = "../../toolsrv/src/payload.rs"]
#[allow(dead_code)]
mod payload;

use libfuzzer_sys::fuzz_target;

/// `p` as payload lines, in the payload's escaping.
fn write_back(p: &payload::Payload) -> String {
    let mut back = format!("tool={}\n", payload::escape(&p.tool));
    for (k, v) in [("agent", &p.agent), ("cmd", &p.cmd), ("cwd", &p.cwd), ("stdin", &p.stdin)] {
        if let Some(v) = v {
            back.push_str(&format!("{k}={}\n", payload::escape(v)));
        }
    }
    if let Some(a) = &p.args {
        back.push_str(&format!("args={}\n", serde_json::Value::Object(a.clone())));
    }
    if let Some(r) = p.record {
        back.push_str(if r { "record=1\n" } else { "record=0\n" });
    }
    if p.split {
        back.push_str("output=split\n");
    }
    back
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match payload::parse(text) {
        Err(e) => {
            assert!(!e.is_empty() && !e.contains('\n'), "bad error: {e:?}");
        }
        Ok(p) => {
            assert!(!p.tool.is_empty(), "a payload without a tool");
            if let Some(s) = &p.stdin {
                assert!(s.len() <= payload::MAX_STDIN, "stdin over its limit");
            }
            // Written back, it parses to the same payload (this crate reads JSON floats
            // exactly, serde_json's float_roundtrip, so a number survives its shortest form),
            // unless a value ends in a carriage return: a line's last `\r` is taken as its
            // CRLF ending (payloads typed by hand), and the escaping has no form for it.
            let values = [&Some(p.tool.clone()), &p.agent, &p.cmd, &p.cwd, &p.stdin];
            if values.iter().any(|v| v.as_deref().is_some_and(|v| v.ends_with('\r'))) {
                return;
            }
            let back = write_back(&p);
            match payload::parse(&back) {
                Ok(again) => assert_eq!(again, p, "written back as {back:?}"),
                Err(e) => panic!("written back as {back:?}, refused: {e}"),
            }
        }
    }
});
