//! `o sandbox` under `network.mode = "proxy"`: the proxy a server would run, in process.
//!
//! The run's listener (in its own network namespace) is served by an [`ollie_proxy::Proxy`]
//! with the policy's domains and ports, public addresses only (no operator settings here),
//! the system resolver and no one to ask: a domain no pattern lists is refused. Each request
//! is one line on standard error, after the run's own output of the moment.

use std::io::Write as _;
use std::sync::Arc;

use ollie_policy::{Network, Policy};

/// Serves the run's listener until dropped (every connection closes with the runtime).
pub struct Served {
    _rt: tokio::runtime::Runtime,
}

/// One line per request on standard error.
struct StderrSink;

impl ollie_proxy::EventSink for StderrSink {
    fn event(&self, e: &ollie_proxy::Event) {
        let verdict = match e.verdict {
            ollie_proxy::Verdict::Allowed => "allowed",
            ollie_proxy::Verdict::Refused => "refused",
            ollie_proxy::Verdict::Approved => "approved",
            ollie_proxy::Verdict::Denied => "denied",
        };
        let why = e.reason.as_deref().unwrap_or("");
        let line = format!(
            "o sandbox: net: {verdict} {} {}:{} ({why}; {} bytes up, {} down)",
            e.method, e.domain, e.port, e.bytes_up, e.bytes_down
        );
        let _ = writeln!(std::io::stderr(), "{}", crate::render::line_safe(&line));
    }
}

/// The handoff for `policy`'s run, when it is proxied, and what serves it.
pub fn for_run(policy: &Policy) -> anyhow::Result<Option<(ollie_sandbox::ProxyHandoff, Served)>> {
    let Network::Proxy(network) = &policy.network else {
        return Ok(None);
    };
    let rules = network.domain_rules().map_err(anyhow::Error::msg)?;
    let mut config = ollie_proxy::ProxyConfig::new(rules, Arc::new(StderrSink));
    config.ports = network.ports.clone();
    let proxy = Arc::new(ollie_proxy::Proxy::new(config));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let handle = rt.handle().clone();
    let handoff = ollie_sandbox::ProxyHandoff::new(move |listener| {
        let proxy = Arc::clone(&proxy);
        let served = listener.set_nonblocking(true).and_then(|()| {
            let _entered = handle.enter();
            tokio::net::TcpListener::from_std(listener)
        });
        match served {
            Ok(l) => {
                handle.spawn(async move {
                    let Err(e) = proxy.serve(l, ollie_proxy::Caller::default()).await;
                    let _ = writeln!(std::io::stderr(), "o sandbox: the proxy stopped: {e}");
                });
            }
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "o sandbox: the proxy cannot listen: {e}");
            }
        }
    });
    Ok(Some((handoff, Served { _rt: rt })))
}
