//! The pure decision for escalation requests.

use crate::model::{Access, EscalationKind, Network, ResolvedPolicy};
use std::fmt;
use std::path::{Component, PathBuf};

/// One extra permission an agent asks for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Grant {
    /// The host network: TCP and UDP to any host and port, bind and listen
    /// ([`Network::All`]).
    Net,
    /// TCP connect to one port.
    NetPort(u16),
    /// Requests through the session's proxy to one domain pattern (normalised, as
    /// [`crate::domains::DomainPattern`] spells it): what the proxy asks for a domain its
    /// policy does not list ([`Network::Proxy`]).
    NetDomain(String),
    /// Read access to a path.
    Read(PathBuf),
    /// Write access to a path.
    Write(PathBuf),
    /// Run without filesystem and network confinement (no Landlock, no read-only mounts, the
    /// host network), keeping capabilities dropped, `no_new_privs`, seccomp, limits and the
    /// environment allowlist ([`ResolvedPolicy::unsandboxed`]).
    Unsandboxed,
}

impl Grant {
    /// The escalation kind this grant belongs to.
    pub fn kind(&self) -> EscalationKind {
        match self {
            Grant::Net | Grant::NetPort(_) | Grant::NetDomain(_) => EscalationKind::Net,
            Grant::Read(_) => EscalationKind::Read,
            Grant::Write(_) => EscalationKind::Write,
            Grant::Unsandboxed => EscalationKind::Unsandboxed,
        }
    }

    /// Parses the agent-facing spelling: `net`, `net:PORT` (decimal `1..=65535`, no sign, no
    /// leading zero), `read:PATH`, `write:PATH` (absolute and normal: no `.`, `..` or empty
    /// components, no trailing `/` except for `/` itself, no NUL) or `unsandboxed`.
    ///
    /// Matching is exact and case-sensitive, so every accepted string is the canonical one:
    /// `Grant::parse(s)?.to_string() == s`. Errors are one lowercase line that names what was
    /// wrong and lists the valid forms.
    pub fn parse(s: &str) -> Result<Grant, String> {
        let bad = |why: &str| {
            Err(format!(
                "invalid grant {}: {why} (valid: {VALID_GRANTS})",
                shown(s)
            ))
        };
        match s {
            "net" => return Ok(Grant::Net),
            "unsandboxed" => return Ok(Grant::Unsandboxed),
            _ => {}
        }
        if let Some(rest) = s.strip_prefix("net:") {
            // A domain has a dot (a single label is no public name); anything else is a port.
            if !rest.contains('.') {
                return match parse_port(rest) {
                    Ok(p) => Ok(Grant::NetPort(p)),
                    Err(why) => bad(why),
                };
            }
            return match crate::domains::DomainPattern::parse(rest) {
                Ok(d) if d.to_string() == rest => Ok(Grant::NetDomain(d.to_string())),
                Ok(d) => bad(&format!("the domain is spelled net:{d}")),
                Err(e) => bad(&e.to_string()),
            };
        }
        let (path, make): (&str, fn(PathBuf) -> Grant) = if let Some(p) = s.strip_prefix("read:") {
            (p, Grant::Read)
        } else if let Some(p) = s.strip_prefix("write:") {
            (p, Grant::Write)
        } else {
            return bad("unknown form");
        };
        match check_grant_path(path) {
            Ok(()) => Ok(make(PathBuf::from(path))),
            Err(why) => bad(why),
        }
    }
}

/// The valid grant spellings, for error messages.
const VALID_GRANTS: &str = "net, net:<port 1..=65535>, net:<domain or *.domain>, read:<absolute path>, write:<absolute path>, unsandboxed";

/// The offending input as shown in an error: quoted, escaped, and cut at 80 characters.
fn shown(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{head:?}…")
    }
}

fn parse_port(s: &str) -> Result<u16, &'static str> {
    if s.is_empty() {
        return Err("the port is missing");
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("the port must be decimal digits only");
    }
    if s.starts_with('0') {
        return Err(if s.bytes().all(|b| b == b'0') {
            "port 0 is not a port"
        } else {
            "the port must not have leading zeros"
        });
    }
    // At most five digits, so the u32 cannot overflow; anything longer is out of range anyway.
    match s.parse::<u32>() {
        Ok(n) if s.len() <= 5 => u16::try_from(n).map_err(|_| "the port is out of range"),
        _ => Err("the port is out of range"),
    }
}

/// Checks the textual form of a grant path: absolute, no NUL, and every component after the
/// root normal and non-empty (so the string is exactly how the path displays).
fn check_grant_path(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        return Err("the path is missing");
    }
    let Some(rest) = s.strip_prefix('/') else {
        return Err("the path must be absolute");
    };
    if s.contains('\0') {
        return Err("the path contains a nul byte");
    }
    if rest.is_empty() {
        return Ok(());
    }
    for seg in rest.split('/') {
        match seg {
            "" => return Err("the path has an empty component (`//` or a trailing `/`)"),
            "." | ".." => return Err("the path must not contain `.` or `..` components"),
            _ => {}
        }
    }
    Ok(())
}

/// The agent-facing spelling accepted by [`Grant::parse`]. Paths are shown with
/// [`Path::display`](std::path::Path::display), so a path that is not UTF-8 (which `parse`
/// never produces) is shown lossily.
impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Grant::Net => f.write_str("net"),
            Grant::NetPort(p) => write!(f, "net:{p}"),
            Grant::NetDomain(d) => write!(f, "net:{d}"),
            Grant::Read(p) => write!(f, "read:{}", p.display()),
            Grant::Write(p) => write!(f, "write:{}", p.display()),
            Grant::Unsandboxed => f.write_str("unsandboxed"),
        }
    }
}

/// An escalation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EscalationRequest {
    /// The grants requested.
    pub grants: Vec<Grant>,
    /// The agent's stated reason (display only; never used in the decision).
    pub reason: String,
}

/// Why a request is refused without asking a human.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyReason {
    /// The request asks for nothing.
    Empty,
    /// A path is not absolute and normal.
    InvalidPath(PathBuf),
    /// A path is (inside) a secret location.
    SecretLocation(PathBuf),
    /// The policy does not let agents ask for this kind of escalation.
    KindNotAllowed(EscalationKind),
    /// The domain is in the policy's `deny_domains` (deny wins: no human is asked), or the
    /// network mode cannot reach domains (`tcp`: a proxied grant would take its ports away).
    DomainRefused(String),
}

/// The outcome of [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Everything asked for is already granted by the policy.
    Allow,
    /// Refused without asking.
    Deny(DenyReason),
    /// A human must approve.
    NeedsApproval(EscalationRequest),
}

/// Whether `p` is absolute, has only normal components, contains no NUL, and is spelled
/// canonically: no `//`, no `/./` (which [`Path::components`](std::path::Path::components)
/// silently drops) and no trailing `/` except for `/` itself.
pub(crate) fn normal_abs(p: &std::path::Path) -> bool {
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && p.components().collect::<PathBuf>().as_os_str() == p.as_os_str()
        && !p.as_os_str().as_encoded_bytes().contains(&0)
}

/// Why a `net:DOMAIN` grant can never be given under `network`, if so: a denied domain, or a
/// TCP network (which a proxy would narrow).
fn domain_refusal(network: &Network, d: &str) -> Option<String> {
    match network {
        Network::Proxy(p) => crate::proxynet::denied_by(d, p)
            .map(|deny| format!("net:{d} is refused by the policy's deny_domains entry {deny}")),
        Network::Tcp { .. } => Some(format!(
            "net:{d} needs network.mode = \"proxy\" (or \"off\"); this policy's mode is \"tcp\""
        )),
        Network::Off | Network::All => None,
    }
}

/// Decides an escalation request against a resolved policy.
///
/// Order: empty → deny; malformed or secret paths → deny (no human can grant a secret);
/// kinds the policy does not allow → deny; already covered → allow; else ask.
///
/// Covered means: `net` by [`Network::All`] only; `net:PORT` by `All` or a TCP connect set
/// holding `PORT`; `read:P` / `write:P` by the policy's rules ([`ResolvedPolicy::access_of`]);
/// `unsandboxed` only by a policy an approved `unsandboxed` grant already widened
/// ([`ResolvedPolicy::unsandboxed`]), which no policy file or layer can be, so for every
/// stored policy it needs a human.
pub fn decide(policy: &ResolvedPolicy, req: &EscalationRequest) -> Decision {
    if req.grants.is_empty() {
        return Decision::Deny(DenyReason::Empty);
    }
    for g in &req.grants {
        if let Grant::Read(p) | Grant::Write(p) = g {
            if !normal_abs(p) {
                return Decision::Deny(DenyReason::InvalidPath(p.clone()));
            }
            if let Some(s) = policy.ctx.secret_containing(p) {
                return Decision::Deny(DenyReason::SecretLocation(s));
            }
        }
    }
    for g in &req.grants {
        if let Grant::NetDomain(d) = g
            && let Some(why) = domain_refusal(&policy.network, d)
        {
            return Decision::Deny(DenyReason::DomainRefused(why));
        }
    }
    for g in &req.grants {
        if !policy.policy.escalations.contains(&g.kind()) {
            return Decision::Deny(DenyReason::KindNotAllowed(g.kind()));
        }
    }
    let covered = req.grants.iter().all(|g| match g {
        Grant::Net => policy.network == Network::All,
        Grant::NetPort(port) => match &policy.network {
            Network::Off => false,
            Network::Tcp { connect, .. } => connect.contains(port),
            Network::Proxy(p) => p.ports.contains(port),
            Network::All => true,
        },
        Grant::NetDomain(d) => match &policy.network {
            Network::All => true,
            Network::Proxy(p) => crate::proxynet::pattern_allowed(d, p),
            Network::Off | Network::Tcp { .. } => false,
        },
        Grant::Read(p) => policy.access_of(p).is_some(),
        Grant::Write(p) => policy.access_of(p) == Some(Access::ReadWrite),
        Grant::Unsandboxed => policy.unsandboxed(),
    });
    if covered {
        Decision::Allow
    } else {
        Decision::NeedsApproval(req.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Policy, ResolveContext};
    use proptest::prelude::*;

    fn pol(text: &str) -> ResolvedPolicy {
        Policy::from_toml(text)
            .unwrap()
            .resolve(&ResolveContext {
                workdir: "/w".into(),
                home: "/home/u".into(),
                extra_secrets: Vec::new(),
            })
            .unwrap()
    }

    const BASE: &str = "[fs]\nwrite=[\"{workdir}\"]\nread=[\"/usr\"]\n[escalations]\nallow=[\"net\",\"read\",\"write\"]";

    fn req(grants: Vec<Grant>) -> EscalationRequest {
        EscalationRequest {
            grants,
            reason: "r".into(),
        }
    }

    #[test]
    fn examples() {
        let p = pol(BASE);
        assert_eq!(decide(&p, &req(vec![])), Decision::Deny(DenyReason::Empty));
        assert_eq!(
            decide(&p, &req(vec![Grant::Write("/w/x".into())])),
            Decision::Allow
        );
        assert!(matches!(
            decide(&p, &req(vec![Grant::Write("/usr/x".into())])),
            Decision::NeedsApproval(_)
        ));
        assert!(matches!(
            decide(&p, &req(vec![Grant::Net])),
            Decision::NeedsApproval(_)
        ));
        assert_eq!(
            decide(&p, &req(vec![Grant::Unsandboxed])),
            Decision::Deny(DenyReason::KindNotAllowed(EscalationKind::Unsandboxed))
        );
        assert_eq!(
            decide(&p, &req(vec![Grant::Read("/home/u/.ssh/id_rsa".into())])),
            Decision::Deny(DenyReason::SecretLocation("/home/u/.ssh".into()))
        );
        for bad in ["/w/../etc", "/w/./x", "/w//x", "/w/x/", "w/x", "/w/x\0"] {
            assert_eq!(
                decide(&p, &req(vec![Grant::Read(bad.into())])),
                Decision::Deny(DenyReason::InvalidPath(bad.into())),
                "{bad:?}"
            );
        }
        let closed = pol("[fs]\nwrite=[\"{workdir}\"]");
        assert!(matches!(
            decide(&closed, &req(vec![Grant::Net])),
            Decision::Deny(DenyReason::KindNotAllowed(EscalationKind::Net))
        ));
    }

    #[test]
    fn network_grants_are_covered_by_the_widest_mode_only() {
        const ESC: &str = "[escalations]\nallow=[\"net\",\"unsandboxed\"]";
        let off = pol(ESC);
        let tcp = pol(&format!(
            "[network]\nmode=\"tcp\"\nconnect=[443]\nbind=[8080]\n{ESC}"
        ));
        let all = pol(&format!("[network]\nmode=\"all\"\n{ESC}"));
        let d = |p: &ResolvedPolicy, g: Grant| decide(p, &req(vec![g]));
        let asks = |dec: Decision| matches!(dec, Decision::NeedsApproval(_));
        // net: only all covers it.
        assert!(asks(d(&off, Grant::Net)));
        assert!(asks(d(&tcp, Grant::Net)));
        assert_eq!(d(&all, Grant::Net), Decision::Allow);
        // net:PORT: all, or a connect set holding the port (a bind port is not a connect
        // port).
        assert!(asks(d(&off, Grant::NetPort(443))));
        assert_eq!(d(&tcp, Grant::NetPort(443)), Decision::Allow);
        assert!(asks(d(&tcp, Grant::NetPort(8080))));
        assert!(asks(d(&tcp, Grant::NetPort(22))));
        for port in [1, 22, 443, 8080, 65535] {
            assert_eq!(d(&all, Grant::NetPort(port)), Decision::Allow, "{port}");
        }
        // unsandboxed: never covered by a stored policy, however wide its network.
        for p in [&off, &tcp, &all] {
            assert!(asks(d(p, Grant::Unsandboxed)), "{:?}", p.network);
            assert!(asks(decide(p, &req(vec![Grant::Net, Grant::Unsandboxed]))));
        }
        // Only a policy an approved grant made unsandboxed covers it (and net with it).
        let granted = off.with_grants(&[Grant::Unsandboxed]).unwrap();
        assert_eq!(d(&granted, Grant::Unsandboxed), Decision::Allow);
        assert_eq!(d(&granted, Grant::Net), Decision::Allow);
        // The kind check still comes first.
        let closed = pol("[network]\nmode=\"all\"");
        assert_eq!(
            d(&closed, Grant::Net),
            Decision::Deny(DenyReason::KindNotAllowed(EscalationKind::Net))
        );
    }

    fn arb_path() -> impl Strategy<Value = PathBuf> {
        let seg = prop_oneof![
            Just("w".to_string()),
            Just("usr".to_string()),
            Just("home".to_string()),
            Just("u".to_string()),
            Just(".ssh".to_string()),
            Just(".aws".to_string()),
            Just("etc".to_string()),
            Just("shadow".to_string()),
            Just("..".to_string()),
            "[a-z]{1,3}",
        ];
        (any::<bool>(), proptest::collection::vec(seg, 0..5)).prop_map(|(abs, segs)| {
            let mut p = PathBuf::from(if abs { "/" } else { "" });
            for s in segs {
                p.push(s);
            }
            p
        })
    }

    fn arb_grant() -> impl Strategy<Value = Grant> {
        prop_oneof![
            Just(Grant::Net),
            any::<u16>().prop_map(Grant::NetPort),
            arb_path().prop_map(Grant::Read),
            arb_path().prop_map(Grant::Write),
            Just(Grant::Unsandboxed),
        ]
    }

    #[test]
    fn grant_spellings_round_trip() {
        for (s, g) in [
            ("net", Grant::Net),
            ("net:1", Grant::NetPort(1)),
            ("net:443", Grant::NetPort(443)),
            ("net:65535", Grant::NetPort(65535)),
            ("read:/", Grant::Read("/".into())),
            ("read:/usr/share/doc", Grant::Read("/usr/share/doc".into())),
            ("write:/w/out", Grant::Write("/w/out".into())),
            ("write:/tmp/a b/ü", Grant::Write("/tmp/a b/ü".into())),
            ("unsandboxed", Grant::Unsandboxed),
            ("net:pypi.org", Grant::NetDomain("pypi.org".into())),
            (
                "net:*.pythonhosted.org",
                Grant::NetDomain("*.pythonhosted.org".into()),
            ),
        ] {
            assert_eq!(Grant::parse(s), Ok(g.clone()), "{s}");
            assert_eq!(g.to_string(), s);
        }
    }

    #[test]
    fn invalid_grant_spellings_are_refused_clearly() {
        for (s, why) in [
            ("net:0", "port 0 is not a port"),
            ("net:65536", "the port is out of range"),
            ("net:99999999999", "the port is out of range"),
            ("net:-1", "decimal digits only"),
            ("net:+1", "decimal digits only"),
            ("net: 80", "decimal digits only"),
            ("net:0x50", "decimal digits only"),
            ("net:080", "leading zeros"),
            ("net:", "the port is missing"),
            ("net:PyPI.org", "the domain is spelled net:pypi.org"),
            ("net:*.org", "broad"),
            ("read:relative", "must be absolute"),
            ("read:/a/../b", "`.` or `..`"),
            ("read:/a/./b", "`.` or `..`"),
            ("read:/a//b", "empty component"),
            ("read:/a/", "empty component"),
            ("read:/a\0b", "nul byte"),
            ("write:", "the path is missing"),
            ("read:", "the path is missing"),
            ("frob", "unknown form"),
            ("NET", "unknown form"),
            ("Net:80", "unknown form"),
            ("read /etc", "unknown form"),
            (" net", "unknown form"),
            ("net ", "unknown form"),
            ("unsandboxed:yes", "unknown form"),
            ("", "unknown form"),
        ] {
            let e = Grant::parse(s).unwrap_err();
            assert!(e.contains(why), "{s:?}: {e}");
            assert!(e.starts_with(&format!("invalid grant {s:?}: ")), "{e}");
            assert!(e.ends_with(&format!("(valid: {VALID_GRANTS})")), "{e}");
            let own = e.replacen(&format!("{s:?}"), "", 1);
            assert!(!e.contains('\n') && own == own.to_lowercase(), "{e}");
        }
        let long = format!("read:{}", "x".repeat(500));
        let e = Grant::parse(&long).unwrap_err();
        assert!(e.len() < 300, "{e}");
    }

    fn arb_valid_path() -> impl Strategy<Value = PathBuf> {
        proptest::collection::vec("[^/\\x00]{1,8}", 0..5).prop_filter_map("normal", |segs| {
            if segs.iter().any(|s| s == "." || s == "..") {
                return None;
            }
            Some(PathBuf::from(format!("/{}", segs.join("/"))))
        })
    }

    proptest! {
        #[test]
        fn parse_display_round_trip(g in prop_oneof![
            Just(Grant::Net),
            (1u16..=65535).prop_map(Grant::NetPort),
            arb_valid_path().prop_map(Grant::Read),
            arb_valid_path().prop_map(Grant::Write),
            Just(Grant::Unsandboxed),
        ]) {
            let s = g.to_string();
            prop_assert_eq!(Grant::parse(&s), Ok(g));
        }

        #[test]
        fn parse_never_panics_and_accepts_only_canonical(s in "(net|read|write|unsandboxed)?:?\\PC{0,20}") {
            if let Ok(g) = Grant::parse(&s) {
                prop_assert_eq!(g.to_string(), s);
                if let Grant::Read(p) | Grant::Write(p) = &g {
                    prop_assert!(normal_abs(p));
                }
            }
        }

        #[test]
        fn secrets_are_never_allowed_or_asked(grants in proptest::collection::vec(arb_grant(), 0..4)) {
            let p = pol(BASE);
            let d = decide(&p, &req(grants.clone()));
            let touches_secret = grants.iter().any(|g| matches!(g, Grant::Read(x) | Grant::Write(x)
                if crate::secrets::secret_containing(x, std::path::Path::new("/home/u")).is_some()));
            if touches_secret {
                prop_assert!(matches!(d, Decision::Deny(_)), "{d:?}");
            }
        }

        #[test]
        fn allow_only_when_policy_already_covers(grants in proptest::collection::vec(arb_grant(), 0..4)) {
            let p = pol(BASE);
            if decide(&p, &req(grants.clone())) == Decision::Allow {
                for g in &grants {
                    match g {
                        Grant::Write(x) => prop_assert_eq!(p.access_of(x), Some(Access::ReadWrite)),
                        Grant::Read(x) => prop_assert!(p.access_of(x).is_some()),
                        other => prop_assert!(false, "allowed {other:?}"),
                    }
                }
            }
        }

        #[test]
        fn unsandboxed_is_never_allowed_without_a_human(
            grants in proptest::collection::vec(arb_grant(), 0..4),
            network in prop_oneof![
                Just(""),
                Just("[network]\nmode=\"tcp\"\nconnect=[80,443]\n"),
                Just("[network]\nmode=\"all\"\n"),
            ],
            read_all in any::<bool>(),
        ) {
            let p = pol(&format!(
                "[fs]\nwrite=[\"{{workdir}}\"]\nread_all={read_all}\n{network}[escalations]\nallow=[\"net\",\"read\",\"write\",\"unsandboxed\"]"
            ));
            if grants.contains(&Grant::Unsandboxed) {
                prop_assert!(decide(&p, &req(grants)) != Decision::Allow);
            }
        }

        #[test]
        fn network_grants_are_allowed_exactly_when_covered(
            grants in proptest::collection::vec(
                prop_oneof![Just(Grant::Net), any::<u16>().prop_map(Grant::NetPort)],
                1..4,
            ),
            mode in 0..3u8,
            connect in proptest::collection::btree_set(any::<u16>().prop_filter("port", |p| *p != 0), 0..4),
        ) {
            let network = match mode {
                0 => String::new(),
                1 => format!("[network]\nmode=\"tcp\"\nconnect={:?}\n", connect.iter().collect::<Vec<_>>()),
                _ => "[network]\nmode=\"all\"\n".to_string(),
            };
            let p = pol(&format!("{network}[escalations]\nallow=[\"net\"]"));
            let covered = grants.iter().all(|g| match (g, &p.network) {
                (_, Network::All) => true,
                (Grant::NetPort(port), Network::Tcp { connect, .. }) => connect.contains(port),
                _ => false,
            });
            let d = decide(&p, &req(grants));
            if covered {
                prop_assert_eq!(d, Decision::Allow);
            } else {
                prop_assert!(matches!(d, Decision::NeedsApproval(_)), "{:?}", d);
            }
        }
    }
}
