//! Turning an allowed host into addresses, and connecting to a vetted one.
//!
//! The proxy resolves a name only after the name was allowed (a refused name is never looked
//! up, so DNS cannot carry data out through the proxy), vets every address with the
//! [`AddressPolicy`](crate::AddressPolicy), and connects to exactly what it vetted: nobody
//! looks the name up a second time, so a DNS answer that changes in between (rebinding) is
//! never used.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ollie_policy::domains::{Host, HostError, normalize_host};
use tokio::net::TcpStream;

/// Why a host gave no address.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The system resolver failed.
    #[error("cannot resolve {name}")]
    Lookup {
        /// The name.
        name: String,
        /// What the resolver said.
        #[source]
        source: io::Error,
    },
    /// The resolver answered with no address.
    #[error("{name} has no address")]
    NoAddress {
        /// The name.
        name: String,
    },
    /// The name has no pin and the system resolver is off.
    #[error("{name} is not pinned, and the proxy's system resolver is off")]
    NotPinned {
        /// The name.
        name: String,
    },
    /// A pin's name is not a host name (or is an IP literal).
    #[error("cannot pin {name:?}: {source}")]
    BadPin {
        /// The name as given (escaped in the message).
        name: String,
        /// Why.
        #[source]
        source: HostError,
    },
    /// A pin's name is an IP literal, which needs no pin.
    #[error("cannot pin {name}: it is an ip address")]
    IpPin {
        /// The literal.
        name: String,
    },
}

/// Names to addresses: operator pins first (like curl's `--resolve`), then, unless turned
/// off, the system resolver.
#[derive(Debug, Clone)]
pub struct Resolver {
    pins: HashMap<String, Vec<IpAddr>>,
    system: bool,
}

impl Resolver {
    /// The system resolver, with no pins.
    pub fn system() -> Resolver {
        Resolver {
            pins: HashMap::new(),
            system: true,
        }
    }

    /// Pins only: a name without a pin does not resolve (tests, and hosts with no DNS).
    pub fn pinned_only() -> Resolver {
        Resolver {
            pins: HashMap::new(),
            system: false,
        }
    }

    /// Adds a pin: `name` (normalised like every host) resolves to `addrs`, in that order.
    /// A later pin of the same name replaces the earlier one; an empty list makes the name
    /// resolve to nothing.
    pub fn pin(mut self, name: &str, addrs: Vec<IpAddr>) -> Result<Resolver, ResolveError> {
        match normalize_host(name) {
            Ok(Host::Name(n)) => {
                self.pins.insert(n, addrs);
                Ok(self)
            }
            Ok(Host::Ip(a)) => Err(ResolveError::IpPin {
                name: a.to_string(),
            }),
            Err(source) => Err(ResolveError::BadPin {
                name: name.to_string(),
                source,
            }),
        }
    }

    /// The pins, by normalised name.
    pub fn pins(&self) -> &HashMap<String, Vec<IpAddr>> {
        &self.pins
    }

    /// The addresses of `host`: an IP literal is itself (no lookup); a pinned name its pin;
    /// any other name the system resolver's answer (`port` is only passed along to it).
    pub async fn resolve(&self, host: &Host, port: u16) -> Result<Vec<IpAddr>, ResolveError> {
        let name = match host {
            Host::Ip(a) => return Ok(vec![*a]),
            Host::Name(n) => n,
        };
        if let Some(addrs) = self.pins.get(name) {
            return match addrs.is_empty() {
                true => Err(ResolveError::NoAddress { name: name.clone() }),
                false => Ok(addrs.clone()),
            };
        }
        if !self.system {
            return Err(ResolveError::NotPinned { name: name.clone() });
        }
        let found = tokio::net::lookup_host((name.as_str(), port))
            .await
            .map_err(|source| ResolveError::Lookup {
                name: name.clone(),
                source,
            })?;
        let mut addrs: Vec<IpAddr> = Vec::new();
        for a in found {
            if !addrs.contains(&a.ip()) {
                addrs.push(a.ip());
            }
        }
        if addrs.is_empty() {
            return Err(ResolveError::NoAddress { name: name.clone() });
        }
        Ok(addrs)
    }
}

/// Connects to the first of `addrs` (already vetted) that accepts, all within `timeout`.
pub(crate) async fn connect(
    addrs: &[IpAddr],
    port: u16,
    timeout: Duration,
) -> Result<(TcpStream, SocketAddr), String> {
    let attempt = async {
        let mut last = String::from("no address to connect to");
        for &ip in addrs {
            let addr = SocketAddr::new(ip, port);
            match TcpStream::connect(addr).await {
                Ok(s) => {
                    // Latency matters more than packet count for interactive protocols.
                    let _ = s.set_nodelay(true);
                    return Ok((s, addr));
                }
                Err(e) => last = format!("{addr}: {e}"),
            }
        }
        Err(last)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(format!("timed out after {} ms", timeout.as_millis())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn pins_are_normalised_and_ip_literals_are_not_looked_up() {
        let r = Resolver::pinned_only()
            .pin("Allowed.Test.", vec!["127.0.0.1".parse().unwrap()])
            .unwrap()
            .pin("empty.test", vec![])
            .unwrap();
        assert!(r.pins().contains_key("allowed.test"));
        let rt = rt();
        let name = normalize_host("allowed.test").unwrap();
        assert_eq!(
            rt.block_on(r.resolve(&name, 443)).unwrap(),
            vec!["127.0.0.1".parse::<IpAddr>().unwrap()]
        );
        let ip = normalize_host("[::1]").unwrap();
        assert_eq!(
            rt.block_on(r.resolve(&ip, 443)).unwrap(),
            vec!["::1".parse::<IpAddr>().unwrap()]
        );
        let other = normalize_host("other.test").unwrap();
        assert!(matches!(
            rt.block_on(r.resolve(&other, 443)),
            Err(ResolveError::NotPinned { .. })
        ));
        let empty = normalize_host("empty.test").unwrap();
        assert!(matches!(
            rt.block_on(r.resolve(&empty, 443)),
            Err(ResolveError::NoAddress { .. })
        ));
        assert!(Resolver::system().pin("a\u{0}.test", vec![]).is_err());
        assert!(Resolver::system().pin("127.0.0.1", vec![]).is_err());
    }
}
