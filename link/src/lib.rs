//! The link between olliesrv and a session's toolsrv, as both ends need it: the boot message
//! (master key and configuration) toolsrv reads on start, the identities and secrets of Tauth,
//! the tool names, the spawning side — start a toolsrv over a socketpair and
//! authenticate to it — and the approval broker's pure parts (verdict parsing, display
//! escaping, request ids).
//!
//! olliesrv and toolsrv never depend on each other (STYLE.md); both depend on this crate, and
//! olliesrv starts the `toolsrv` binary by path.

pub mod auth;
pub mod boot;
pub mod bypass;
pub mod instances;
pub mod logging;
pub mod spawn;
pub mod text;
pub mod tools;

/// Escapes a value of a `proc/new` payload line: a backslash becomes `\\`, a newline `\n`
/// (toolsrv's `payload::unescape` undoes it).
pub fn escape_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// An error and its causes on one line (`a: b: c`).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s.replace('\n', " ")
}
