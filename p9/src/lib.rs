//! `ollie-p9`: our own 9P2000 — codec, async server core and async client.
//!
//! Guarantees:
//! - The decoder never panics and never allocates more than the frame it was handed (which the
//!   server and client bound by msize before reading it); `Twrite`/`Rread` payloads are
//!   zero-copy slices of the frame.
//! - The server keeps per-fid state for the file implementation, runs requests on different
//!   fids concurrently and requests on one fid in arrival order, answers `Tflush` at once by
//!   cancelling the flushed request, and confines protocol errors to their connection.
//! - The client multiplexes requests by tag, sends `Tflush` when a request's future is dropped,
//!   and uses explicit fids (no path cache).
//!
//! Not provided: 9P2000.u/.L extensions, authentication protocols (the server exposes a hook;
//! ollie's Tauth lives in toolsrv/olliesrv), or any knowledge of ollie.
//!
//! Tested by byte-exact codec fixtures and a differential round trip against the `ninep`
//! crate's codec (unit and property tests), in-process server/client tests (ordering, flush,
//! isolation, malformed input), interop tests with independent clients in `tests/`, and a
//! cargo-fuzz target for the decoder (`fuzz/`).

pub mod client;
pub mod dial;
pub mod error;
pub mod server;
pub mod util;
pub mod wire;

pub use client::{Client, ClientError, Fid};
pub use error::{Error, Result};
pub use server::{ConnInfo, Filesystem, PeerCred, Server, Walked};
pub use wire::{Qid, Rmsg, Stat, Tmsg};
