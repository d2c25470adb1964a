//! The egress proxy of runs under `network.mode = "proxy"`.
//!
//! Each such run has a network namespace of its own whose only peer is a listener the
//! sandbox hands back (`127.0.0.1:`[`ollie_policy::PROXY_PORT`] inside it). toolsrv serves
//! that listener with an [`ollie_proxy::Proxy`] made for the run, from:
//! - the run's policy (its allow and deny patterns, presets expanded, and its ports);
//! - the operator's `[proxy]` settings from the boot message ([`ProxyBoot`]: addresses the
//!   proxy may reach although they are private or loopback, and pinned names);
//! - the session's broker as the asker, when the agent may ask for `net`: a domain no
//!   pattern lists becomes a request for the grant `net:DOMAIN` (shown with the domain, the
//!   port and the command), and the connection waits for the verdict (bounded by the
//!   broker's deadline). An approval holds for the rest of the run (its proxy remembers it);
//!   with `"scope":"session"` the broker remembers it for the agent for the rest of the
//!   session (the request's digest names the agent and the domain, not the command). A deny
//!   pattern is never asked about;
//! - `bypass/log` as the event sink: one `net` event per request (time, agent, call, command,
//!   method, domain, port, address, verdict, reason, bytes each way, duration), which
//!   olliesrv writes to the audit log and streams as `session/NAME/net`.
//!
//! Dropping the [`Served`] guard (the run ended) closes every connection of that listener
//! and withdraws a question still waiting for the operator.

use std::net::IpAddr;
use std::sync::{Arc, Weak};

use ollie_link::boot::ProxyBoot;
use ollie_policy::ProxyNetwork;
use ollie_proxy::{
    AddressPolicy, AskFuture, AskRequest, AskVerdict, Asker, Caller, Event, EventSink, Proxy,
    ProxyConfig, Resolver,
};
use serde_json::Value;

use crate::broker::{Ask, Asked, Broker, Outcome};

/// The operator's proxy settings, validated.
#[derive(Debug, Clone, Default)]
pub struct Egress {
    allow: Vec<ipnet::IpNet>,
    pins: Vec<(String, Vec<IpAddr>)>,
}

impl Egress {
    /// Checks the boot message's `[proxy]`: every range a CIDR or an address, every pinned
    /// name a host name, every pin an address.
    pub fn new(boot: &ProxyBoot) -> Result<Egress, String> {
        let mut allow = Vec::new();
        for (i, a) in boot.allow_addresses.iter().enumerate() {
            let net = a
                .parse::<ipnet::IpNet>()
                .or_else(|_| a.parse::<IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    format!("proxy.allow_addresses[{i}]: {a:?} is not an address or a CIDR range")
                })?;
            allow.push(net);
        }
        let mut pins = Vec::new();
        for (name, addrs) in &boot.resolve {
            let mut v = Vec::new();
            for a in addrs {
                v.push(
                    a.parse::<IpAddr>()
                        .map_err(|_| format!("proxy.resolve.{name}: {a:?} is not an IP address"))?,
                );
            }
            if v.is_empty() {
                return Err(format!("proxy.resolve.{name}: no address"));
            }
            Resolver::pinned_only()
                .pin(name, v.clone())
                .map_err(|e| format!("proxy.resolve.{name}: {e}"))?;
            pins.push((name.clone(), v));
        }
        Ok(Egress { allow, pins })
    }

    /// The proxy of one run under `network`: its rules and ports, these settings, the
    /// session's broker as asker when `may_ask`, and `bypass/log` as sink.
    pub fn proxy_for(
        &self,
        session: &str,
        broker: &Arc<Broker>,
        network: &ProxyNetwork,
        may_ask: bool,
    ) -> Result<Arc<Proxy>, String> {
        let rules = network.domain_rules()?;
        let mut resolver = Resolver::system();
        for (name, addrs) in &self.pins {
            resolver = resolver
                .pin(name, addrs.clone())
                .map_err(|e| format!("proxy.resolve.{name}: {e}"))?;
        }
        let sink: Arc<dyn EventSink> = Arc::new(LogSink {
            broker: Arc::downgrade(broker),
        });
        let mut config = ProxyConfig::new(rules, sink);
        config.ports = network.ports.clone();
        config.addresses = AddressPolicy::new(self.allow.clone());
        config.resolver = resolver;
        if may_ask {
            config.asker = Some(Arc::new(BrokerAsker {
                session: session.to_owned(),
                broker: Arc::downgrade(broker),
            }));
        }
        Ok(Arc::new(Proxy::new(config)))
    }
}

/// Serves a run's listener on the runtime `rt` until dropped.
#[derive(Debug)]
pub struct Served(tokio::task::AbortHandle);

impl Drop for Served {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts serving `listener` (the run's, from the sandbox) with `proxy` for `caller`.
pub fn serve(
    rt: &tokio::runtime::Handle,
    proxy: Arc<Proxy>,
    listener: std::net::TcpListener,
    caller: Caller,
) -> Result<Served, String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("the proxy listener: {e}"))?;
    let _entered = rt.enter();
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| format!("the proxy listener: {e}"))?;
    let task = rt.spawn(async move {
        let Err(e) = proxy.serve(listener, caller).await;
        tracing::warn!(error = %e, "a run's proxy listener failed");
    });
    Ok(Served(task.abort_handle()))
}

/// `net` events on the session's `bypass/log`.
struct LogSink {
    broker: Weak<Broker>,
}

impl EventSink for LogSink {
    fn event(&self, e: &Event) {
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        if let Ok(Value::Object(fields)) = serde_json::to_value(e) {
            broker.log("net", fields);
        }
    }
}

/// The session's broker, asked about domains no pattern lists.
struct BrokerAsker {
    /// The session's id, for the request.
    session: String,
    broker: Weak<Broker>,
}

/// Withdraws a request whose asker went away (the client closed, the run ended).
struct Withdraw<'a> {
    broker: &'a Broker,
    id: Option<String>,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.broker.withdraw(
                &id,
                "the run's connection ended before the operator answered",
            );
        }
    }
}

impl Asker for BrokerAsker {
    fn ask(&self, r: AskRequest) -> AskFuture {
        let (session, broker) = (self.session.clone(), self.broker.clone());
        Box::pin(async move {
            let Some(b) = broker.upgrade() else {
                return AskVerdict::Deny {
                    reason: "the session ended".into(),
                };
            };
            let grant = format!("net:{}", r.domain);
            let mut fields = serde_json::Map::new();
            fields.insert("session".into(), session.into());
            fields.insert("agent".into(), r.caller.agent.clone().into());
            fields.insert("tool".into(), "net".into());
            fields.insert("call".into(), r.caller.call.clone().into());
            fields.insert("command".into(), r.caller.command.clone().into());
            fields.insert("domain".into(), r.domain.clone().into());
            fields.insert("port".into(), r.port.into());
            fields.insert("grants".into(), vec![grant.clone()].into());
            fields.insert(
                "reason".into(),
                format!(
                    "the run connects to {}:{} through the session's proxy, and no allow_domains pattern lists it",
                    r.domain, r.port
                )
                .into(),
            );
            // The agent and the domain: a session-scope approval (or a remembered denial)
            // is the asking agent's, as for every other escalation, never another agent's.
            let digest = ollie_link::bypass::sha256_hex(
                format!("net-domain\0{}\0{}", r.caller.agent, r.domain).as_bytes(),
            );
            let asked = b.ask(Ask {
                agent: r.caller.agent.clone(),
                digest,
                fields,
            });
            match asked {
                // The broker's words are for a call that has not run; this one is running.
                Err(why) => AskVerdict::Deny {
                    reason: why
                        .strip_suffix("; nothing was run")
                        .unwrap_or(&why)
                        .to_owned(),
                },
                Ok(Asked::PreApproved) => AskVerdict::Allow { for_session: true },
                Ok(Asked::Waiting(id, rx)) => {
                    let mut guard = Withdraw {
                        broker: &b,
                        id: Some(id.clone()),
                    };
                    let outcome = b.wait(&id, rx).await;
                    guard.id = None;
                    match outcome {
                        // For the rest of this run: its proxy is its own.
                        Outcome::Approved => AskVerdict::Allow { for_session: true },
                        Outcome::Denied(m) => AskVerdict::Deny {
                            reason: format!(
                                "the operator denied {grant}: {}",
                                ollie_link::bypass::display_escape(&m)
                            ),
                        },
                        Outcome::Expired => AskVerdict::Deny {
                            reason: format!(
                                "no answer from the operator about {grant} within {} s",
                                b.deadline().as_secs()
                            ),
                        },
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_settings_are_checked() {
        let mut b = ProxyBoot {
            allow_addresses: vec!["127.0.0.1/32".into(), "::1".into()],
            ..ProxyBoot::default()
        };
        b.resolve
            .insert("pypi.test".into(), vec!["127.0.0.1".into()]);
        let e = Egress::new(&b).unwrap();
        assert_eq!(e.allow.len(), 2);
        assert_eq!(e.pins.len(), 1);
        let bad = ProxyBoot {
            allow_addresses: vec!["10.0.0.0/33".into()],
            ..ProxyBoot::default()
        };
        assert!(
            Egress::new(&bad)
                .unwrap_err()
                .starts_with("proxy.allow_addresses[0]:")
        );
        let mut bad = ProxyBoot::default();
        bad.resolve
            .insert("pypi.test".into(), vec!["localhost".into()]);
        assert!(
            Egress::new(&bad)
                .unwrap_err()
                .starts_with("proxy.resolve.pypi.test:")
        );
        let mut bad = ProxyBoot::default();
        bad.resolve
            .insert("a\u{0}.test".into(), vec!["127.0.0.1".into()]);
        assert!(Egress::new(&bad).is_err());
    }
}
