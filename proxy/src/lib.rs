//! `ollie-proxy`: the per-session egress proxy of the ollie tool sandbox. A sandboxed run's
//! only way out is a TCP listener the proxy serves (toolsrv hands it in); the proxy speaks
//! HTTP CONNECT (tunnels, no TLS interception) and plain HTTP with absolute URIs, and lets a
//! request through by domain.
//!
//! Guarantees:
//! - Every request is decided in this order, and the first refusal ends it: the host must
//!   normalise ([`ollie_policy::domains::normalize_host`]: NUL bytes, `%`, user info,
//!   non-canonical IP forms, look-alike scripts refused); the target port must be listed
//!   ([`ProxyConfig::ports`]); a deny pattern refuses at once; an allow pattern, or
//!   an earlier approval for the session, lets it go on; anything else is a question for the
//!   [`Asker`] (the broker), or refused when there is none.
//! - A name is resolved only after it was allowed (a refused name is never looked up), every
//!   address it resolves to is vetted ([`AddressPolicy`]: public unicast only, unless an
//!   operator range allows more; embedded IPv4 addresses judged by the IPv4 address), and the
//!   proxy connects only to a vetted address, resolved once (DNS rebinding cannot swap it).
//! - No domain fronting: a plain request's `Host` header must name the URI's host; the first
//!   flight of a CONNECT tunnel is held back until checked, and a TLS ClientHello must name
//!   the CONNECT host ([`sni`]); a mismatch closes the tunnel before the origin gets a byte.
//! - Exactly one [`Event`] per request, when it ends (refusals at once), also when the task
//!   serving it is dropped. Refusals answer with one `text/plain` line naming `domain:port`,
//!   why, and how it could be allowed.
//! - Bounded: [`ProxyConfig::max_connections`] client connections at once (more get 503),
//!   hyper's header size limits and a header timeout, a connect timeout; no panic on any
//!   input (the ClientHello parser is bounds-checked and property-tested).
//!
//! Not guaranteed here: that the sandbox's only route is the proxy (the sandbox's network
//! namespace does that), what a tunnel carries once its first flight passed (no TLS
//! interception: an allowed domain can carry anything), or protection against an origin
//! that an allowed name really points to.
//!
//! Tested by unit tests of each pure piece (addresses, decisions, target parsing, the
//! ClientHello parser with curl's real ClientHello and hand-built ones, header scrubbing),
//! and by `tests/proxy.rs` against origins the test starts on loopback, with a raw client
//! and curl. The `egress` cargo-fuzz target (`fuzz/fuzz_targets/egress.rs`) drives the
//! ClientHello parser and host normalisation. `cargo bench -p ollie-proxy` compares throughput and latency with direct
//! connections.
#![forbid(unsafe_code)]

mod address;
mod decide;
mod event;
mod forward;
mod resolve;
mod server;
pub mod sni;
mod splice;
mod tunnel;

pub use address::{AddressPolicy, AddressRefusal, AddressVerdict, address_class};
pub use decide::{AskFuture, AskRequest, AskVerdict, Asker, NOT_LISTED_HINT};
pub use event::{Caller, Event, EventSink, TracingSink, Verdict};
pub use resolve::{ResolveError, Resolver};
pub use server::{DEFAULT_PORTS, Proxy, ProxyConfig, ServeError};
