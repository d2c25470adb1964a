//! The proxy network mode (`network.mode = "proxy"`): egress by domain through a per-session
//! proxy. The tool runs in a network namespace of its own that holds nothing but a listener
//! at `127.0.0.1:`[`PROXY_PORT`] (served by the runner's proxy) and loopback; the proxy
//! decides which domains and ports a `CONNECT` may reach.

use std::collections::BTreeSet;

/// The port of the session's proxy inside the tool's network namespace (`127.0.0.1`).
pub const PROXY_PORT: u16 = 3128;

/// What the session's proxy lets a tool reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyNetwork {
    /// Domains the proxy connects to.
    pub allow: BTreeSet<String>,
    /// Domains it refuses even where `allow` or a preset names them.
    pub deny: BTreeSet<String>,
    /// Named domain lists added to `allow`.
    pub presets: BTreeSet<String>,
    /// Destination ports the proxy connects to.
    pub ports: BTreeSet<u16>,
}

impl ProxyNetwork {
    /// No domain at all, ports 80 and 443.
    pub fn closed() -> ProxyNetwork {
        ProxyNetwork {
            allow: BTreeSet::new(),
            deny: BTreeSet::new(),
            presets: BTreeSet::new(),
            ports: BTreeSet::from([80, 443]),
        }
    }
}
