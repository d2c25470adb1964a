//! The pure decision for escalation requests.

use crate::model::{Access, EscalationKind, Network, ResolvedPolicy};
use crate::secrets;
use std::path::{Component, PathBuf};

/// One extra permission an agent asks for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Grant {
    /// Any TCP network access.
    Net,
    /// TCP connect to one port.
    NetPort(u16),
    /// Read access to a path.
    Read(PathBuf),
    /// Write access to a path.
    Write(PathBuf),
    /// Run without the sandbox.
    Unsandboxed,
}

impl Grant {
    /// The escalation kind this grant belongs to.
    pub fn kind(&self) -> EscalationKind {
        match self {
            Grant::Net | Grant::NetPort(_) => EscalationKind::Net,
            Grant::Read(_) => EscalationKind::Read,
            Grant::Write(_) => EscalationKind::Write,
            Grant::Unsandboxed => EscalationKind::Unsandboxed,
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

fn normal_abs(p: &std::path::Path) -> bool {
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// Decides an escalation request against a resolved policy.
///
/// Order: empty → deny; malformed or secret paths → deny (no human can grant a secret);
/// kinds the policy does not allow → deny; already covered → allow; else ask.
pub fn decide(policy: &ResolvedPolicy, req: &EscalationRequest) -> Decision {
    if req.grants.is_empty() {
        return Decision::Deny(DenyReason::Empty);
    }
    for g in &req.grants {
        if let Grant::Read(p) | Grant::Write(p) = g {
            if !normal_abs(p) {
                return Decision::Deny(DenyReason::InvalidPath(p.clone()));
            }
            if let Some(s) = secrets::secret_containing(p, &policy.ctx.home) {
                return Decision::Deny(DenyReason::SecretLocation(s));
            }
        }
    }
    for g in &req.grants {
        if !policy.policy.escalations.contains(&g.kind()) {
            return Decision::Deny(DenyReason::KindNotAllowed(g.kind()));
        }
    }
    let covered = req.grants.iter().all(|g| match g {
        Grant::Net => false,
        Grant::NetPort(port) => match &policy.network {
            Network::Off => false,
            Network::Tcp { connect, .. } => connect.contains(port),
        },
        Grant::Read(p) => policy.access_of(p).is_some(),
        Grant::Write(p) => policy.access_of(p) == Some(Access::ReadWrite),
        Grant::Unsandboxed => false,
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
        assert!(matches!(
            decide(&p, &req(vec![Grant::Read("/w/../etc".into())])),
            Decision::Deny(DenyReason::InvalidPath(_))
        ));
        let closed = pol("[fs]\nwrite=[\"{workdir}\"]");
        assert!(matches!(
            decide(&closed, &req(vec![Grant::Net])),
            Decision::Deny(DenyReason::KindNotAllowed(EscalationKind::Net))
        ));
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

    proptest! {
        #[test]
        fn secrets_are_never_allowed_or_asked(grants in proptest::collection::vec(arb_grant(), 0..4)) {
            let p = pol(BASE);
            let d = decide(&p, &req(grants.clone()));
            let touches_secret = grants.iter().any(|g| matches!(g, Grant::Read(x) | Grant::Write(x)
                if secrets::secret_containing(x, std::path::Path::new("/home/u")).is_some()));
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
        fn unsandboxed_is_never_allowed_without_a_human(grants in proptest::collection::vec(arb_grant(), 0..4)) {
            let p = pol("[fs]\nwrite=[\"{workdir}\"]\n[escalations]\nallow=[\"net\",\"read\",\"write\",\"unsandboxed\"]");
            if grants.contains(&Grant::Unsandboxed) {
                prop_assert!(decide(&p, &req(grants)) != Decision::Allow);
            }
        }
    }
}
