//! The proxy's decisions, pure: what a request targets ([`parse_target`]), whether it may go
//! on ([`decide`]), and every refusal with its status and one-line body ([`Refusal`]).

use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;

use hyper::header::{HOST, HeaderMap};
use hyper::http::uri::Authority;
use hyper::{Method, StatusCode, Uri};
use ollie_policy::domains::{DomainRules, DomainVerdict, Host, HostError, normalize_host};

use crate::event::{Caller, Verdict};

/// What a human is asked about: a request for a host no pattern lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskRequest {
    /// The normalised host (`[…]` around an IPv6 literal).
    pub domain: String,
    /// The target port.
    pub port: u16,
    /// Who asked.
    pub caller: Caller,
}

/// A human's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskVerdict {
    /// Let it through; with `for_session`, every later request for the domain too (on any
    /// allowed port), without asking, until the proxy is dropped.
    Allow {
        /// Remember the approval for the session.
        for_session: bool,
    },
    /// Refuse it.
    Deny {
        /// Why, as the human put it (shown to the tool, one line).
        reason: String,
    },
}

/// The future an [`Asker`] returns.
pub type AskFuture = Pin<Box<dyn Future<Output = AskVerdict> + Send + 'static>>;

/// Asks a human about a host no pattern lists (the broker's net escalation). The request
/// waits for the answer; dropping the future (the client went away) withdraws the question.
pub trait Asker: Send + Sync {
    /// Asks about one request.
    fn ask(&self, request: AskRequest) -> AskFuture;
}

/// The hint a refusal of a host no pattern lists ends with.
pub const NOT_LISTED_HINT: &str =
    "add it to [network] allow_domains in the agent's policy, or allow net escalations";

/// Whether a request tunnels or is forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `CONNECT host:port`.
    Connect,
    /// `METHOD http://host:port/path`.
    Http,
}

/// A request's target, normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) kind: Kind,
    pub(crate) host: Host,
    pub(crate) port: u16,
}

/// Why a request was not served. Each has its status and one-line body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// An origin-form (or `*`) request sent to the proxy itself.
    NotProxyRequest,
    /// An absolute URI of another scheme than `http`.
    Scheme(String),
    /// `CONNECT` without a port, or without an authority.
    NoPort,
    /// User info in the authority.
    UserInfo,
    /// The host does not normalise.
    BadHost(HostError),
    /// The port is not one the proxy forwards to.
    Port { allowed: Vec<u16> },
    /// A deny pattern matched.
    Denied { pattern: String },
    /// No pattern matched and there is no asker.
    NotListed,
    /// The asker denied it.
    HumanDenied { reason: String },
    /// The Host header names another host than the URI (or there are several).
    Fronting { header: String },
    /// Every address the host resolved to is refused.
    Address {
        class: &'static str,
        address: String,
    },
    /// The proxy is at its connection limit.
    Overloaded { max: usize },
    /// Resolution failed.
    Resolve(String),
    /// Connecting (or talking HTTP to the origin) failed.
    Upstream(String),
}

impl Refusal {
    /// The response status.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Refusal::NotProxyRequest
            | Refusal::Scheme(_)
            | Refusal::NoPort
            | Refusal::UserInfo
            | Refusal::BadHost(_) => StatusCode::BAD_REQUEST,
            Refusal::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::Resolve(_) | Refusal::Upstream(_) => StatusCode::BAD_GATEWAY,
            _ => StatusCode::FORBIDDEN,
        }
    }

    /// The verdict an event reports; `None` for a failure after the request was allowed,
    /// which keeps the verdict it had.
    pub(crate) fn verdict(&self) -> Option<Verdict> {
        match self {
            Refusal::HumanDenied { .. } => Some(Verdict::Denied),
            Refusal::Resolve(_) | Refusal::Upstream(_) => None,
            _ => Some(Verdict::Refused),
        }
    }

    /// Why, for the event (no hint).
    pub(crate) fn reason(&self) -> String {
        match self {
            Refusal::NotProxyRequest => "not a proxy request".into(),
            Refusal::Scheme(s) => format!("unsupported scheme {}", printable(s)),
            Refusal::NoPort => "connect needs host:port".into(),
            Refusal::UserInfo => "user info in the request's authority".into(),
            Refusal::BadHost(e) => e.to_string(),
            Refusal::Port { allowed } => format!("port not allowed (allowed: {})", ports(allowed)),
            Refusal::Denied { pattern } => format!("denied by {pattern}"),
            Refusal::NotListed => "not in the session's allowed domains".into(),
            Refusal::HumanDenied { reason } => {
                format!("denied on escalation: {}", printable(reason))
            }
            Refusal::Fronting { header } => {
                format!(
                    "the host header names {}, not the request's host",
                    printable(header)
                )
            }
            Refusal::Address { class, address } => {
                format!("it resolves only to refused addresses ({address}: {class})")
            }
            Refusal::Overloaded { max } => format!("too many connections (at most {max})"),
            Refusal::Resolve(e) => format!("cannot resolve: {e}"),
            Refusal::Upstream(e) => format!("cannot reach the origin: {e}"),
        }
    }

    /// The response body: one line naming `domain:port`, why, and what would allow it.
    pub(crate) fn body(&self, domain: &str, port: u16) -> String {
        let target = if port == 0 {
            domain.to_string()
        } else {
            format!("{domain}:{port}")
        };
        let mut line = match self {
            Refusal::NotProxyRequest => {
                "ollie proxy: not a proxy request; send CONNECT host:port, or an absolute http:// uri"
                    .to_string()
            }
            Refusal::Scheme(_) | Refusal::NoPort | Refusal::UserInfo => {
                format!("ollie proxy: {}; use CONNECT host:port, or an absolute http:// uri", self.reason())
            }
            Refusal::Resolve(_) | Refusal::Upstream(_) | Refusal::Overloaded { .. } => {
                format!("ollie proxy: {target}: {}", self.reason())
            }
            _ => format!("ollie proxy: refused {target}: {}", self.reason()),
        };
        let hint = match self {
            Refusal::NotListed => NOT_LISTED_HINT,
            Refusal::Port { .. } => "add it to [network] ports in the agent's policy",
            Refusal::Denied { .. } => "the pattern is in [network] deny_domains",
            Refusal::Address { .. } => {
                "the proxy connects to such addresses only if the operator lists them in [proxy] allow_addresses"
            }
            Refusal::Fronting { .. } => "send the Host header of the request's uri",
            _ => "",
        };
        if !hint.is_empty() {
            let _ = write!(line, "; {hint}");
        }
        line.push('\n');
        line
    }
}

fn ports(allowed: &[u16]) -> String {
    let list: Vec<String> = allowed.iter().map(u16::to_string).collect();
    list.join(", ")
}

/// Text from a request made safe for a log line or a body: unprintable characters escaped,
/// at most 256 characters.
pub(crate) fn printable(raw: &str) -> String {
    raw.escape_debug().take(256).collect()
}

/// A request's target, or (the domain and port to report, why not).
pub(crate) fn parse_target(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Target, (String, u16, Refusal)> {
    let connect = method == Method::CONNECT;
    if !connect {
        match uri.scheme_str() {
            None => return Err((String::new(), 0, Refusal::NotProxyRequest)),
            Some("http") => {}
            Some(s) => return Err((String::new(), 0, Refusal::Scheme(s.to_string()))),
        }
    }
    let Some(authority) = uri.authority() else {
        let r = if connect {
            Refusal::NoPort
        } else {
            Refusal::NotProxyRequest
        };
        return Err((String::new(), 0, r));
    };
    let raw = authority.host();
    let port = match (authority.port_u16(), connect) {
        (Some(p), _) => p,
        (None, false) => 80,
        (None, true) => return Err((printable(raw), 0, Refusal::NoPort)),
    };
    if authority.as_str().contains('@') {
        return Err((printable(raw), port, Refusal::UserInfo));
    }
    let host = normalize_host(raw).map_err(|e| (printable(raw), port, Refusal::BadHost(e)))?;
    if !connect {
        check_host_header(headers, &host, port).map_err(|r| (host.to_string(), port, r))?;
    }
    let kind = if connect { Kind::Connect } else { Kind::Http };
    Ok(Target { kind, host, port })
}

/// The Host header of a plain request must name the URI's host and port (or be absent):
/// otherwise an origin serving several names would answer for the header's (domain
/// fronting).
fn check_host_header(headers: &HeaderMap, host: &Host, port: u16) -> Result<(), Refusal> {
    let mut values = headers.get_all(HOST).iter();
    let Some(value) = values.next() else {
        return Ok(());
    };
    let text = String::from_utf8_lossy(value.as_bytes()).into_owned();
    let fronting = || Refusal::Fronting {
        header: text.clone(),
    };
    if values.next().is_some() {
        return Err(Refusal::Fronting {
            header: "several hosts".into(),
        });
    }
    let authority: Authority = text.parse().map_err(|_| fronting())?;
    if authority.as_str().contains('@') {
        return Err(fronting());
    }
    let same_host = normalize_host(authority.host()).is_ok_and(|h| h == *host);
    let same_port = authority.port_u16().unwrap_or(80) == port;
    if same_host && same_port {
        Ok(())
    } else {
        Err(fronting())
    }
}

/// What to do with a request after [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Refuse it.
    Refuse(Refusal),
    /// Let it go on (resolve and connect), reported with this verdict and reason.
    Go(Verdict, String),
    /// Ask the asker (or refuse, when there is none).
    Ask,
}

/// Decides on a request for `host:port`, in order: the port; the rules (a deny pattern
/// refuses at once, an allow pattern lets it go on); a domain approved for the session goes
/// on; anything else is a question for the asker.
pub(crate) fn decide(
    ports: &BTreeSet<u16>,
    rules: &DomainRules,
    approved: &HashSet<String>,
    host: &Host,
    port: u16,
) -> Step {
    if !ports.contains(&port) {
        return Step::Refuse(Refusal::Port {
            allowed: ports.iter().copied().collect(),
        });
    }
    match rules.decide(host) {
        DomainVerdict::Denied(pattern) => Step::Refuse(Refusal::Denied { pattern }),
        DomainVerdict::Allowed(pattern) => {
            Step::Go(Verdict::Allowed, format!("allowed by {pattern}"))
        }
        DomainVerdict::NotListed if approved.contains(&host.to_string()) => Step::Go(
            Verdict::Approved,
            "approved earlier, remembered by this proxy".into(),
        ),
        DomainVerdict::NotListed => Step::Ask,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ollie_policy::domains::DomainPattern;

    fn rules(allow: &[&str], deny: &[&str]) -> DomainRules {
        let p = |v: &[&str]| v.iter().map(|s| DomainPattern::parse(s).unwrap()).collect();
        DomainRules::new(p(allow), p(deny))
    }

    fn host(s: &str) -> Host {
        normalize_host(s).unwrap()
    }

    fn target(
        method: &str,
        uri: &str,
        host_header: Option<&str>,
    ) -> Result<Target, (String, u16, Refusal)> {
        let mut headers = HeaderMap::new();
        if let Some(h) = host_header {
            headers.insert(HOST, h.parse().unwrap());
        }
        parse_target(&method.parse().unwrap(), &uri.parse().unwrap(), &headers)
    }

    #[test]
    fn decisions_go_port_then_rules_then_session_then_ask() {
        let ports = BTreeSet::from([80, 443]);
        let r = rules(&["*.ok.test", "ok.test"], &["*.bad.ok.test"]);
        let mut approved = HashSet::new();
        let d = |h: &str, p: u16, a: &HashSet<String>| decide(&ports, &r, a, &host(h), p);
        assert_eq!(
            d("ok.test", 8443, &approved),
            Step::Refuse(Refusal::Port {
                allowed: vec![80, 443]
            })
        );
        assert_eq!(
            d("x.bad.ok.test", 443, &approved),
            Step::Refuse(Refusal::Denied {
                pattern: "*.bad.ok.test".into()
            })
        );
        assert_eq!(
            d("a.ok.test", 443, &approved),
            Step::Go(Verdict::Allowed, "allowed by *.ok.test".into())
        );
        assert_eq!(d("other.test", 80, &approved), Step::Ask);
        approved.insert("other.test".into());
        approved.insert("x.bad.ok.test".into());
        assert_eq!(
            d("other.test", 80, &approved),
            Step::Go(
                Verdict::Approved,
                "approved earlier, remembered by this proxy".into()
            )
        );
        // A deny pattern wins over an approval, and the port check over both.
        assert!(matches!(
            d("x.bad.ok.test", 443, &approved),
            Step::Refuse(Refusal::Denied { .. })
        ));
        assert!(matches!(
            d("other.test", 22, &approved),
            Step::Refuse(Refusal::Port { .. })
        ));
    }

    #[test]
    fn connect_targets() {
        let t = target("CONNECT", "Allowed.Test:443", None).unwrap();
        assert_eq!(
            (t.kind, t.host, t.port),
            (Kind::Connect, host("allowed.test"), 443)
        );
        let t = target("CONNECT", "[::1]:443", None).unwrap();
        assert_eq!(t.host, host("::1"));
        assert_eq!(
            target("CONNECT", "allowed.test", None).unwrap_err().2,
            Refusal::NoPort
        );
        // hyper's URI parser already refuses '%' in an authority (hyper answers 400).
        assert!("attacker%00.allowed.test:443".parse::<Uri>().is_err());
        let e = target("CONNECT", "a*b.allowed.test:443", None).unwrap_err();
        assert_eq!(
            e,
            (
                "a*b.allowed.test".into(),
                443,
                Refusal::BadHost(HostError::Star)
            )
        );
        let e = target("CONNECT", "127.1:443", None).unwrap_err();
        assert_eq!(e.2, Refusal::BadHost(HostError::NonCanonicalIp));
    }

    #[test]
    fn plain_targets_and_their_host_header() {
        let t = target(
            "GET",
            "http://allowed.test:8080/x?y",
            Some("allowed.test:8080"),
        )
        .unwrap();
        assert_eq!((t.kind, t.port), (Kind::Http, 8080));
        assert_eq!(
            target("GET", "http://allowed.test/x", None).unwrap().port,
            80
        );
        assert!(target("GET", "http://allowed.test/x", Some("ALLOWED.test.")).is_ok());
        assert!(target("GET", "http://allowed.test/x", Some("allowed.test:80")).is_ok());
        for h in [
            "evil.test",
            "allowed.test:81",
            "u@allowed.test",
            "allowed.test\u{7f}",
        ] {
            let Ok(value) = h.parse() else { continue };
            let mut headers = HeaderMap::new();
            headers.insert(HOST, value);
            let e = parse_target(
                &Method::GET,
                &"http://allowed.test/x".parse().unwrap(),
                &headers,
            );
            assert!(matches!(e, Err((_, 80, Refusal::Fronting { .. }))), "{h}");
        }
        let mut two = HeaderMap::new();
        two.append(HOST, "allowed.test".parse().unwrap());
        two.append(HOST, "allowed.test".parse().unwrap());
        let e = parse_target(&Method::GET, &"http://allowed.test/".parse().unwrap(), &two);
        assert!(matches!(e, Err((_, _, Refusal::Fronting { .. }))));
        assert_eq!(
            target("GET", "/x", None).unwrap_err().2,
            Refusal::NotProxyRequest
        );
        assert_eq!(
            target("OPTIONS", "*", None).unwrap_err().2,
            Refusal::NotProxyRequest
        );
        assert_eq!(
            target("GET", "https://allowed.test/", None).unwrap_err().2,
            Refusal::Scheme("https".into())
        );
        assert_eq!(
            target("GET", "http://u@allowed.test/", None).unwrap_err().2,
            Refusal::UserInfo
        );
    }

    #[test]
    fn bodies_are_one_line_and_say_how_to_allow() {
        assert_eq!(
            Refusal::NotListed.body("registry.example.com", 443),
            "ollie proxy: refused registry.example.com:443: not in the session's allowed domains; add it to [network] allow_domains in the agent's policy, or allow net escalations\n"
        );
        let all = [
            Refusal::NotProxyRequest,
            Refusal::Scheme("ftp".into()),
            Refusal::NoPort,
            Refusal::UserInfo,
            Refusal::BadHost(HostError::Nul),
            Refusal::Port {
                allowed: vec![80, 443],
            },
            Refusal::Denied {
                pattern: "*.bad.test".into(),
            },
            Refusal::HumanDenied {
                reason: "no\nway".into(),
            },
            Refusal::Fronting {
                header: "evil.test".into(),
            },
            Refusal::Address {
                class: "loopback",
                address: "127.0.0.1".into(),
            },
            Refusal::Overloaded { max: 4 },
            Refusal::Resolve("no such name".into()),
            Refusal::Upstream("connection refused".into()),
        ];
        for r in all {
            let b = r.body("a\u{0}.test", 443);
            assert_eq!(b.matches('\n').count(), 1, "{b}");
            assert!(b.starts_with("ollie proxy: "), "{b}");
        }
        assert_eq!(
            Refusal::Port { allowed: vec![] }.status(),
            StatusCode::FORBIDDEN
        );
        assert_eq!(Refusal::NoPort.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            Refusal::Upstream(String::new()).status(),
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(Refusal::Upstream(String::new()).verdict(), None);
        let denied = Refusal::HumanDenied {
            reason: String::new(),
        };
        assert_eq!(denied.verdict(), Some(Verdict::Denied));
        assert_eq!(printable("a\u{0}b"), "a\\0b");
    }
}
