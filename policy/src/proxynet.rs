//! `network.mode = "proxy"`: egress by domain through the session's proxy.
//!
//! A run under this mode is in a network namespace of its own whose only peer is a listener
//! the session's proxy owns, at `127.0.0.1:`[`PROXY_PORT`] inside it; the proxy (outside the
//! sandbox) decides each request by its domain and port. The policy keys:
//!
//! ```toml
//! [network]
//! mode = "proxy"
//! allow_domains = ["pypi.org", "*.pythonhosted.org"]
//! deny_domains = ["evil.pythonhosted.org"]   # deny wins
//! presets = ["pypi", "npm"]                  # named lists of domains (crate::domains)
//! ports = [443, 80]                          # what CONNECT and plain HTTP may reach
//! ```
//!
//! Domain spellings are validated and normalised here ([`crate::domains`]); the decision for
//! one request is [`crate::domains::DomainRules::decide`], made by the proxy.

use crate::raw::RawNetwork;
use std::collections::BTreeSet;

/// The port of the proxy's listener inside a proxied run's network namespace (the run's
/// `HTTPS_PROXY` is `http://127.0.0.1:3128`). Every run has a namespace of its own, so the
/// number is the same for all of them and names nothing outside.
pub const PROXY_PORT: u16 = 3128;

/// At most this many entries in each domain list.
pub const MAX_DOMAINS: usize = 1024;

/// The ports a proxy mode policy lets requests reach when it names none.
pub const DEFAULT_PROXY_PORTS: [u16; 2] = [80, 443];

/// The rules of `network.mode = "proxy"`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyNetwork {
    /// Domain patterns requests may reach (`allow_domains`, normalised), presets not
    /// expanded.
    pub allow: BTreeSet<String>,
    /// Domain patterns that are refused even when allowed (`deny_domains`, normalised).
    pub deny: BTreeSet<String>,
    /// Named preset lists whose domains are allowed too (`presets`).
    pub presets: BTreeSet<String>,
    /// Ports requests may reach (`ports`; default 80 and 443).
    pub ports: BTreeSet<u16>,
}

impl ProxyNetwork {
    /// A proxy mode that reaches nothing: every request is refused (or asked, when the
    /// profile allows net escalations).
    pub fn closed() -> ProxyNetwork {
        ProxyNetwork {
            allow: BTreeSet::new(),
            deny: BTreeSet::new(),
            presets: BTreeSet::new(),
            ports: DEFAULT_PROXY_PORTS.into_iter().collect(),
        }
    }

    /// Every allowed pattern: `allow` and the domains of each preset.
    pub fn allowed_patterns(&self) -> BTreeSet<String> {
        let mut out = self.allow.clone();
        for name in &self.presets {
            for d in crate::domains::preset(name).unwrap_or(&[]) {
                out.insert((*d).to_owned());
            }
        }
        out
    }

    /// The proxy's rules: [`ProxyNetwork::allowed_patterns`] and `deny` as patterns. Every
    /// entry parses when the network came from a policy file or a grant; an error names the
    /// one that does not.
    pub fn domain_rules(&self) -> Result<crate::domains::DomainRules, String> {
        let patterns = |set: &BTreeSet<String>| -> Result<Vec<_>, String> {
            set.iter()
                .map(|p| {
                    crate::domains::DomainPattern::parse(p)
                        .map_err(|e| format!("domain {p:?}: {e}"))
                })
                .collect()
        };
        Ok(crate::domains::DomainRules::new(
            patterns(&self.allowed_patterns())?,
            patterns(&self.deny)?,
        ))
    }

    /// Whether `self` (a narrowing layer) allows nothing `base` does not: its ports are a
    /// subset, it denies at least what the base denies, and each pattern it allows is allowed
    /// by the base (the same pattern, or a name under one of the base's wildcards).
    pub fn within(&self, base: &ProxyNetwork) -> bool {
        let base_allowed = base.allowed_patterns();
        self.ports.is_subset(&base.ports)
            && base.deny.is_subset(&self.deny)
            && self
                .allowed_patterns()
                .iter()
                .all(|p| covered_by(p, &base_allowed))
    }
}

/// Whether pattern `d` (a grant's, normalised) is already allowed by `p` and not denied.
pub(crate) fn pattern_allowed(d: &str, p: &ProxyNetwork) -> bool {
    denied_by(d, p).is_none() && covered_by(d, &p.allowed_patterns())
}

/// The `deny` entry of `p` that refuses pattern `d`, if one does: `d` itself, or a deny
/// wildcard `d` lies under, or (for a wildcard `d`) a deny entry under it — a wildcard grant
/// cannot reach around a denied name.
pub(crate) fn denied_by<'a>(d: &str, p: &'a ProxyNetwork) -> Option<&'a str> {
    p.deny
        .iter()
        .find(|deny| {
            covered_by(d, &BTreeSet::from([(*deny).clone()]))
                || d.strip_prefix("*.")
                    .is_some_and(|_| covered_by(deny, &BTreeSet::from([d.to_owned()])))
        })
        .map(String::as_str)
}

/// Whether pattern `p` is `base` itself or lies under one of its `*.` wildcards.
fn covered_by(p: &str, base: &BTreeSet<String>) -> bool {
    base.contains(p)
        || base.iter().any(|b| {
            b.strip_prefix("*.").is_some_and(|suffix| {
                let name = p.strip_prefix("*.").unwrap_or(p);
                name.len() > suffix.len()
                    && name.ends_with(suffix)
                    && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
            })
        })
}

/// A key path and what is wrong with it (the model makes it a `PolicyError::Invalid`).
pub(crate) type KeyError = (String, String);

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> KeyError {
    (key.into(), reason.into())
}

/// One domain list: each entry a valid pattern, normalised.
fn domain_list(key: &str, raw: &[String]) -> Result<BTreeSet<String>, KeyError> {
    if raw.len() > MAX_DOMAINS {
        return Err(invalid(
            key,
            format!("{} entries, over the limit of {MAX_DOMAINS}", raw.len()),
        ));
    }
    let mut out = BTreeSet::new();
    for (i, s) in raw.iter().enumerate() {
        let p = crate::domains::DomainPattern::parse(s)
            .map_err(|e| invalid(format!("{key}[{i}]"), format!("{s:?}: {e}")))?;
        out.insert(p.to_string());
    }
    Ok(out)
}

/// `network` with `mode = "proxy"`.
pub(crate) fn parse(raw: &RawNetwork) -> Result<ProxyNetwork, KeyError> {
    if let Some(key) = raw.port_list_set() {
        return Err(invalid(
            key,
            "mode \"proxy\" reaches the network only through the session's proxy; its ports are network.ports",
        ));
    }
    let mut presets = BTreeSet::new();
    for (i, name) in raw.presets.iter().enumerate() {
        if crate::domains::preset(name).is_none() {
            return Err(invalid(
                format!("network.presets[{i}]"),
                format!(
                    "unknown preset {name:?} (valid: {})",
                    crate::domains::PRESET_NAMES.join(", ")
                ),
            ));
        }
        presets.insert(name.clone());
    }
    let ports = match &raw.ports {
        None => DEFAULT_PROXY_PORTS.into_iter().collect(),
        Some(list) => {
            let mut ports = BTreeSet::new();
            for (i, p) in list.iter().enumerate() {
                let key = format!("network.ports[{i}]");
                ports.insert(crate::raw::port_value(*p).map_err(|why| (key, why))?);
            }
            ports
        }
    };
    Ok(ProxyNetwork {
        allow: domain_list("network.allow_domains", &raw.allow_domains)?,
        deny: domain_list("network.deny_domains", &raw.deny_domains)?,
        presets,
        ports,
    })
}

/// The proxy keys set outside `mode = "proxy"`, as an error.
pub(crate) fn refuse_proxy_keys(raw: &RawNetwork, mode: &str) -> Result<(), KeyError> {
    for (key, set) in [
        ("network.allow_domains", !raw.allow_domains.is_empty()),
        ("network.deny_domains", !raw.deny_domains.is_empty()),
        ("network.presets", !raw.presets.is_empty()),
        ("network.ports", raw.ports.is_some()),
    ] {
        if set {
            return Err(invalid(
                key,
                format!("domains and proxy ports need network.mode = \"proxy\" (this is {mode:?})"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;

    fn err(toml: &str) -> String {
        Policy::from_toml(toml).unwrap_err().to_string()
    }

    fn proxy(toml: &str) -> ProxyNetwork {
        match Policy::from_toml(toml).unwrap().network {
            crate::Network::Proxy(p) => p,
            other => panic!("not a proxy network: {other:?}"),
        }
    }

    #[test]
    fn proxy_mode_parses_its_keys_normalised() {
        let p = proxy(
            "[network]\nmode = \"proxy\"\nallow_domains = [\"PyPI.org.\", \"*.pythonhosted.org\"]\ndeny_domains = [\"bad.pythonhosted.org\"]\npresets = [\"npm\"]\nports = [443]",
        );
        assert_eq!(
            p.allow,
            BTreeSet::from(["pypi.org".to_owned(), "*.pythonhosted.org".to_owned()])
        );
        assert!(p.deny.contains("bad.pythonhosted.org"));
        assert_eq!(p.ports, BTreeSet::from([443]));
        assert!(
            p.allowed_patterns().len() > 2,
            "the npm preset adds domains"
        );
        assert_eq!(
            proxy("[network]\nmode = \"proxy\"").ports,
            BTreeSet::from([80, 443])
        );
    }

    #[test]
    fn bad_proxy_keys_are_refused_with_their_key() {
        assert!(
            err("[network]\nmode = \"proxy\"\nallow_domains = [\"a\\u0000.b.com\"]")
                .starts_with("network.allow_domains[0]:")
        );
        assert!(
            err("[network]\nmode = \"proxy\"\npresets = [\"cpan\"]")
                .starts_with("network.presets[0]: unknown preset")
        );
        assert!(err("[network]\nmode = \"proxy\"\nports = [0]").starts_with("network.ports[0]:"));
        assert!(
            err("[network]\nmode = \"proxy\"\nconnect = [443]").starts_with("network.connect:")
        );
        assert!(
            err("[network]\nmode = \"tcp\"\nallow_domains = [\"pypi.org\"]")
                .starts_with("network.allow_domains: domains and proxy ports need")
        );
        assert!(err("[network]\nports = [443]").starts_with("network.ports:"));
        assert!(err("[network]\nmode = \"proxy\"\ndomains = []").contains("unknown field"));
    }

    fn resolved(toml: &str) -> crate::ResolvedPolicy {
        Policy::from_toml(toml)
            .unwrap()
            .resolve(&crate::ResolveContext {
                workdir: "/w".into(),
                home: "/home/u".into(),
                extra_secrets: Vec::new(),
            })
            .unwrap()
    }

    fn ask(p: &crate::ResolvedPolicy, grant: &str) -> crate::Decision {
        crate::decide(
            p,
            &crate::EscalationRequest {
                grants: vec![crate::Grant::parse(grant).unwrap()],
                reason: "r".into(),
            },
        )
    }

    const ESC: &str = "[escalations]\nallow = [\"net\"]";

    #[test]
    fn domain_grants_are_covered_asked_or_refused() {
        use crate::{Decision, DenyReason};
        let p = resolved(&format!(
            "[network]\nmode = \"proxy\"\nallow_domains = [\"*.example.com\"]\ndeny_domains = [\"bad.example.com\"]\npresets = [\"pypi\"]\n{ESC}"
        ));
        assert_eq!(ask(&p, "net:pypi.org"), Decision::Allow);
        assert_eq!(ask(&p, "net:a.example.com"), Decision::Allow);
        assert!(matches!(
            ask(&p, "net:example.com"),
            Decision::NeedsApproval(_)
        ));
        assert!(matches!(
            ask(&p, "net:other.test"),
            Decision::NeedsApproval(_)
        ));
        for refused in ["net:bad.example.com", "net:*.example.com"] {
            assert!(
                matches!(
                    ask(&p, refused),
                    Decision::Deny(DenyReason::DomainRefused(_))
                ),
                "{refused}"
            );
        }
        let tcp = resolved(&format!(
            "[network]\nmode = \"tcp\"\nconnect = [443]\n{ESC}"
        ));
        assert!(matches!(
            ask(&tcp, "net:pypi.org"),
            Decision::Deny(DenyReason::DomainRefused(_))
        ));
        let all = resolved(&format!("[network]\nmode = \"all\"\n{ESC}"));
        assert_eq!(ask(&all, "net:pypi.org"), Decision::Allow);
        let closed = resolved("[network]\nmode = \"proxy\"");
        assert!(matches!(
            ask(&closed, "net:pypi.org"),
            Decision::Deny(DenyReason::KindNotAllowed(_))
        ));
    }

    #[test]
    fn a_domain_grant_widens_by_that_domain_only() {
        let g = |s: &str| crate::Grant::parse(s).unwrap();
        let off = resolved(ESC);
        let w = off.with_grants(&[g("net:pypi.org")]).unwrap();
        let crate::Network::Proxy(p) = &w.network else {
            panic!("{:?}", w.network)
        };
        assert_eq!(p.allow, BTreeSet::from(["pypi.org".to_owned()]));
        assert_eq!(p.ports, BTreeSet::from([80, 443]));
        assert!(
            !w.fs.read.iter().any(|r| r.ends_with("resolv.conf")),
            "the proxy resolves: no resolver files"
        );
        let proxied = resolved(&format!(
            "[network]\nmode = \"proxy\"\ndeny_domains = [\"*.bad.test\"]\n{ESC}"
        ));
        let w = proxied.with_grants(&[g("net:ok.test")]).unwrap();
        let crate::Network::Proxy(p) = &w.network else {
            panic!()
        };
        assert!(p.allow.contains("ok.test"));
        assert!(proxied.with_grants(&[g("net:x.bad.test")]).is_err());
        let tcp = resolved("[network]\nmode = \"tcp\"\nconnect = [443]");
        assert!(tcp.with_grants(&[g("net:ok.test")]).is_err());
    }

    #[test]
    fn the_host_resolver_is_readable_where_the_host_network_is() {
        let reads = |toml: &str| resolved(toml).fs.read;
        let has = |r: &[std::path::PathBuf]| r.iter().any(|p| p.as_os_str() == "/etc/resolv.conf");
        assert!(!has(&reads("")));
        assert!(!has(&reads("[network]\nmode = \"proxy\"")));
        assert!(has(&reads("[network]\nmode = \"all\"")));
        assert!(has(&reads("[network]\nmode = \"tcp\"\nconnect = [53]")));
        // An approved `net` on a closed policy: the resolver files come with it.
        let net = resolved(ESC).with_grants(&[crate::Grant::Net]).unwrap();
        for f in crate::RESOLVER_FILES {
            assert!(net.fs.read.iter().any(|p| p.as_os_str() == *f), "{f}");
        }
    }

    #[test]
    fn a_layer_is_within_its_base_only_when_it_allows_less() {
        let base = proxy(
            "[network]\nmode = \"proxy\"\nallow_domains = [\"*.example.com\", \"pypi.org\"]\ndeny_domains = [\"x.example.com\"]",
        );
        let mut l = base.clone();
        l.allow = BTreeSet::from(["a.example.com".to_owned(), "*.b.example.com".to_owned()]);
        assert!(l.within(&base));
        l.allow.insert("example.com".to_owned());
        assert!(!l.within(&base), "the apex is not under *.example.com");
        let mut l = base.clone();
        l.deny.clear();
        assert!(!l.within(&base), "dropping a deny widens");
        let mut l = base.clone();
        l.ports.insert(22);
        assert!(!l.within(&base));
        let mut l = base.clone();
        l.presets.insert("npm".to_owned());
        assert!(!l.within(&base));
        let mut l = base.clone();
        l.allow = BTreeSet::from(["evilexample.com".to_owned()]);
        assert!(!l.within(&base));
    }
}
