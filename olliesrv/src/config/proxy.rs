//! `[proxy]`: the operator's settings for the egress proxy of runs under
//! `network.mode = "proxy"` (docs/egress.md), handed to every local and remote toolsrv in its
//! boot message. Only the operator's file may open the proxy to private or loopback
//! addresses, or pin names; no policy or agent can.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ollie_link::boot::ProxyBoot;
use ollie_policy::domains::{Host, normalize_host};

/// At most this many entries in each of `[proxy]`'s lists.
const MAX_ENTRIES: usize = 256;

/// `[proxy]` as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProxy {
    /// Address ranges the proxy may connect to although they are special (loopback,
    /// private, link-local, …).
    #[serde(default)]
    allow_addresses: Vec<String>,
    /// Names the proxy resolves to these addresses without DNS.
    #[serde(default)]
    resolve: BTreeMap<String, Vec<String>>,
}

/// Validates `[proxy]`; on error the key path and what is wrong with it.
pub(super) fn proxy(raw: RawProxy) -> Result<ProxyBoot, (String, String)> {
    if raw.allow_addresses.len() > MAX_ENTRIES || raw.resolve.len() > MAX_ENTRIES {
        return Err((
            "proxy".into(),
            format!("at most {MAX_ENTRIES} allow_addresses and {MAX_ENTRIES} resolve entries"),
        ));
    }
    for (i, a) in raw.allow_addresses.iter().enumerate() {
        if a.parse::<ipnet::IpNet>().is_err() && a.parse::<IpAddr>().is_err() {
            return Err((
                format!("proxy.allow_addresses[{i}]"),
                format!(
                    "{a:?} is not an address or a CIDR range (e.g. \"127.0.0.1/32\", \"fd00::/8\")"
                ),
            ));
        }
    }
    let mut resolve = BTreeMap::new();
    for (name, addrs) in raw.resolve {
        let key = format!("proxy.resolve.{name:?}");
        let n = match normalize_host(&name) {
            Ok(Host::Name(n)) => n,
            Ok(Host::Ip(_)) => {
                return Err((key, "an IP address is not a name to pin".into()));
            }
            Err(e) => return Err((key, e.to_string())),
        };
        if addrs.is_empty() || addrs.len() > 16 {
            return Err((key, "give 1 to 16 addresses".into()));
        }
        for a in &addrs {
            if a.parse::<IpAddr>().is_err() {
                return Err((key, format!("{a:?} is not an IP address")));
            }
        }
        if resolve.insert(n.clone(), addrs).is_some() {
            return Err((
                key,
                format!("{n} is pinned twice (names are compared normalised)"),
            ));
        }
    }
    Ok(ProxyBoot {
        allow_addresses: raw.allow_addresses,
        resolve,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(toml: &str) -> RawProxy {
        toml::from_str(toml).unwrap()
    }

    #[test]
    fn the_operators_proxy_settings_are_checked_by_key() {
        let ok = proxy(raw(
            "allow_addresses = [\"127.0.0.1/32\", \"::1\"]\nresolve = { \"PyPI.Test.\" = [\"127.0.0.1\"] }",
        ))
        .unwrap();
        assert_eq!(ok.allow_addresses.len(), 2);
        assert_eq!(ok.resolve["pypi.test"], ["127.0.0.1"]);
        let e = |t: &str| proxy(raw(t)).unwrap_err();
        assert_eq!(
            e("allow_addresses = [\"10.0.0.0/33\"]").0,
            "proxy.allow_addresses[0]"
        );
        assert!(
            e("resolve = { \"a.test\" = [\"localhost\"] }")
                .1
                .contains("not an IP address")
        );
        assert!(e("resolve = { \"a.test\" = [] }").1.contains("1 to 16"));
        assert!(
            e("resolve = { \"127.0.0.1\" = [\"127.0.0.1\"] }")
                .1
                .contains("not a name")
        );
        assert!(
            e("resolve = { \"a.test\" = [\"127.0.0.1\"], \"A.TEST\" = [\"127.0.0.2\"] }")
                .1
                .contains("pinned twice")
        );
        assert!(
            toml::from_str::<RawProxy>("allow = []").is_err(),
            "unknown keys are refused"
        );
    }
}
