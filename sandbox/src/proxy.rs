//! The sandbox side of `network.mode = "proxy"` (`ollie_policy::Network::Proxy`): egress by
//! domain through a proxy the runner serves. The proxy itself (HTTP `CONNECT`, the domain
//! lists) is the runner's; this module gives the tool nothing else to reach.
//!
//! - **A network namespace of its own.** pid 1 of a proxied one-shot run (or of a prepared
//!   session: its zygote) is cloned with `CLONE_NEWNET` as well, brings `lo` up, opens a TCP
//!   listener at `127.0.0.1:`[`PROXY_PORT`] and hands it to the runner over a unix socket
//!   made before the clone (`sys/netns.rs` says how), before the tool exists: the tool never
//!   holds it. There is no other interface and no route, so nothing in the namespace reaches
//!   the host's network, its loopback included (a connect elsewhere fails at once with
//!   `ENETUNREACH` or `ECONNREFUSED`: no packet leaves).
//! - **The listener.** A one-shot run hands it to [`crate::RunRequest::proxy`] (a [`ProxyHandoff`],
//!   required under this mode) as soon as the namespaces exist, before the tool starts; the
//!   caller serves it (accepts, speaks the proxy protocol) and may drop it once the run has
//!   returned. Connections the tool makes before the caller accepts wait in the backlog.
//!   A [`crate::Prepared`] sandbox has **one namespace and one listener per session**: the
//!   zygote holds the namespace, every call's per-call init is cloned into it (a new pid
//!   namespace, never a new network namespace), and the listener is the owner's, from
//!   [`crate::Prepared::take_proxy_listener`], available once [`crate::Prepared::new`]
//!   returns. Calls cannot bind or listen, so they cannot reach one another either; they
//!   share the session's proxy, whose policy is the session's. No proxied call ever runs in
//!   the host's network namespace.
//! - **What the tool may do** is what `network.mode = "tcp"` without bind ports allows
//!   (seccomp: `socket()` for IPv4/IPv6 TCP streams only, no UDP, raw, netlink or AF_UNIX
//!   sockets, no `bind`, `listen` or `accept`), with Landlock's TCP connect right for
//!   [`PROXY_PORT`] only and no bind port.
//! - **The environment** gets [`proxy_env`] (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`,
//!   `NO_PROXY` and their lower-case forms), set after the policy's allowlist and fixed
//!   values, so neither can take them away or point them elsewhere.
//! - **No resolver.** `/etc/resolv.conf` (its real path, where it exists) is replaced,
//!   read-only, by [`RESOLV_CONF`]: a comment saying why and no `nameserver` line, so
//!   resolvers fail at once (UDP sockets are refused, nothing listens on port 53) and names
//!   are left to the proxy.
//! - **The record** says so ([`crate::NetworkRecord`]: the mode, the namespace, the
//!   proxy's address), and the run's namespaces list `net`.

use crate::error::SandboxError;
use ollie_policy::{Network, PROXY_PORT};
use std::net::TcpListener;
use std::sync::Arc;

/// Receives the proxy's listener of a one-shot run under `network.mode = "proxy"`
/// ([`crate::RunRequest::proxy`]). Called once per such run, on the runner's thread, after
/// the run's namespaces exist and before the tool starts; it must not block (hand the
/// listener to a thread or task that serves it). Never called for other modes.
#[derive(Clone)]
pub struct ProxyHandoff(Arc<dyn Fn(TcpListener) + Send + Sync>);

impl ProxyHandoff {
    /// A handoff that calls `f` with each listener.
    pub fn new(f: impl Fn(TcpListener) + Send + Sync + 'static) -> ProxyHandoff {
        ProxyHandoff(Arc::new(f))
    }

    /// A handoff that sends each listener to the returned receiver.
    pub fn channel() -> (ProxyHandoff, std::sync::mpsc::Receiver<TcpListener>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let handoff = ProxyHandoff::new(move |l| {
            let tx = tx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // A receiver that is gone drops the listener: the tool's connects are refused.
            let _ = tx.send(l);
        });
        (handoff, rx)
    }

    pub(crate) fn hand(&self, listener: TcpListener) {
        (self.0)(listener)
    }
}

impl std::fmt::Debug for ProxyHandoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProxyHandoff(..)")
    }
}

/// Where the tool reaches the proxy, as its environment names it.
pub const PROXY_URL: &str = "http://127.0.0.1:3128";

/// What the tool's `NO_PROXY` lists: its own loopback (nothing listens there but the
/// proxy, which must not be asked for itself).
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// The variables set for a tool under `network.mode = "proxy"`, both spellings of each.
pub fn proxy_env() -> [(&'static str, &'static str); 8] {
    [
        ("HTTP_PROXY", PROXY_URL),
        ("HTTPS_PROXY", PROXY_URL),
        ("ALL_PROXY", PROXY_URL),
        ("NO_PROXY", NO_PROXY),
        ("http_proxy", PROXY_URL),
        ("https_proxy", PROXY_URL),
        ("all_proxy", PROXY_URL),
        ("no_proxy", NO_PROXY),
    ]
}

/// What a proxied run finds at `/etc/resolv.conf`.
pub const RESOLV_CONF: &str = "\
# No resolver in this sandbox (network.mode = \"proxy\"): the tool has a network namespace
# of its own, and the only thing in it is the session's proxy at 127.0.0.1:3128.
# Names are resolved by that proxy: connect through HTTPS_PROXY / HTTP_PROXY
# (http://127.0.0.1:3128), which the environment sets.
# There is deliberately no nameserver line: DNS lookups fail at once.
";

/// The resolver configuration a proxied run's mounts replace: the real path of
/// `/etc/resolv.conf`, if it is a file.
pub(crate) fn resolv_conf_target() -> Option<std::path::PathBuf> {
    std::fs::canonicalize("/etc/resolv.conf")
        .ok()
        .filter(|p| p.is_file())
}

/// Whether `network` gives the run a network namespace of its own.
pub(crate) fn own_namespace(network: &Network) -> bool {
    matches!(network, Network::Proxy(_))
}

/// The port pid 1 listens on for the runner (0: no network namespace).
pub(crate) fn listen_port(network: &Network) -> u16 {
    if own_namespace(network) {
        PROXY_PORT
    } else {
        0
    }
}

/// The refusal of a proxied one-shot run that has nowhere to hand its listener.
pub(crate) fn no_handoff() -> SandboxError {
    SandboxError::InvalidRequest {
        reason: "network mode proxy needs a receiver for the proxy's listener (RunRequest::proxy)"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_names_the_proxy_in_both_spellings() {
        let env = proxy_env();
        for (k, v) in env {
            let other = if k.chars().all(|c| !c.is_lowercase()) {
                k.to_lowercase()
            } else {
                k.to_uppercase()
            };
            assert!(env.iter().any(|(o, ov)| *o == other && *ov == v), "{k}");
        }
        assert_eq!(PROXY_URL, format!("http://127.0.0.1:{PROXY_PORT}"));
        assert!(!RESOLV_CONF.lines().any(|l| !l.starts_with('#')));
        assert!(RESOLV_CONF.contains("HTTPS_PROXY"));
        let proxy = Network::Proxy(ollie_policy::ProxyNetwork::closed());
        assert_eq!(listen_port(&proxy), PROXY_PORT);
        assert_eq!(listen_port(&Network::All), 0);
    }
}
