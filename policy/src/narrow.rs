//! Layering (global → profile → per call): a layer can only narrow.

use crate::model::{EscalationKind, Limits, Network, PathTemplate, Policy};
use std::collections::BTreeSet;

/// A narrowing layer; `None` keeps the base value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layer {
    /// Replacement read list; every entry must be covered by a base read/exec/write rule.
    pub read: Option<Vec<PathTemplate>>,
    /// Replacement exec list; every entry must be covered by a base exec rule.
    pub exec: Option<Vec<PathTemplate>>,
    /// Replacement write list; every entry must be covered by a base write rule.
    pub write: Option<Vec<PathTemplate>>,
    /// Extra protected paths (adding protection narrows).
    pub protect: Vec<PathTemplate>,
    /// Replacement network; must be a subset of the base (`Off` < `Proxy(..)`, `Tcp { .. }` <
    /// `All`; a TCP layer on a TCP base only keeps ports the base lists, a proxy layer on a
    /// TCP base only ports it lists, a proxy layer on a proxy base only what
    /// [`crate::ProxyNetwork::within`] allows).
    pub network: Option<Network>,
    /// Replacement limits; each must be ≤ the base.
    pub limits: Option<Limits>,
    /// Replacement environment allowlist; must be a subset.
    pub env_allow: Option<BTreeSet<String>>,
    /// Raise the Landlock floor.
    pub landlock_min_abi: Option<u32>,
    /// Forbid best effort (a layer can never turn it on).
    pub forbid_best_effort: bool,
    /// Replacement escalation kinds; must be a subset.
    pub escalations: Option<BTreeSet<EscalationKind>>,
    /// More calls to take out of the seccomp profile (taking out narrows).
    pub deny_syscalls: BTreeSet<String>,
}

/// A layer tried to widen the policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NarrowError {
    /// A key would grant more than the base.
    #[error("{key}: a layer may only narrow the policy ({reason})")]
    Widens {
        /// Key path of the widening value.
        key: String,
        /// What exceeded the base.
        reason: String,
    },
    /// The base was widened by an approved `unsandboxed` grant: none of its filesystem or
    /// network rules is enforced, so a layer could only pretend to narrow it.
    #[error(
        "a layer cannot narrow an unsandboxed policy (its filesystem and network rules are not enforced); apply layers before the grant"
    )]
    Unsandboxed,
}

fn widens(key: impl Into<String>, reason: impl Into<String>) -> NarrowError {
    NarrowError::Widens {
        key: key.into(),
        reason: reason.into(),
    }
}

fn covered(p: &PathTemplate, by: &[&PathTemplate]) -> bool {
    by.iter()
        .any(|b| b.anchor == p.anchor && p.rest.starts_with(&b.rest))
}

/// Components of the innermost rule of `by` that covers `p` (0: none).
fn depth(p: &PathTemplate, by: &[&PathTemplate]) -> usize {
    by.iter()
        .filter(|b| b.anchor == p.anchor && p.rest.starts_with(&b.rest))
        .map(|b| b.rest.components().count() + 1)
        .max()
        .unwrap_or(0)
}

impl Policy {
    /// Applies a layer. The result grants nothing the base does not. An
    /// [`unsandboxed`](Policy::unsandboxed) base is refused ([`NarrowError::Unsandboxed`]).
    pub fn narrow(&self, layer: &Layer) -> Result<Policy, NarrowError> {
        if self.unsandboxed() {
            return Err(NarrowError::Unsandboxed);
        }
        let mut out = self.clone();
        self.narrow_fs(layer, &mut out)?;
        for (i, name) in layer.deny_syscalls.iter().enumerate() {
            if let Some(why) = crate::model::deny_name_error(name) {
                return Err(widens(format!("syscalls.deny[{i}]"), why));
            }
            out.syscalls.deny.insert(name.clone());
        }
        if let Some(net) = &layer.network {
            let ok = network_within(&self.network, net);
            if !ok {
                return Err(widens("network", "ports or mode exceed the base"));
            }
            out.network = net.clone();
        }
        if let Some(l) = &layer.limits {
            limits_within(l, &self.limits)?;
            out.limits = *l;
        }
        if let Some(env) = &layer.env_allow {
            if !env.is_subset(&self.env.allow) {
                return Err(widens(
                    "env.allow",
                    "names a variable the base does not pass",
                ));
            }
            out.env.allow = env.clone();
        }
        if let Some(abi) = layer.landlock_min_abi {
            if abi < self.landlock_min_abi {
                return Err(widens(
                    "landlock_min_abi",
                    format!("{abi} < base {}", self.landlock_min_abi),
                ));
            }
            out.landlock_min_abi = abi;
        }
        if layer.forbid_best_effort {
            out.best_effort = false;
        }
        if let Some(esc) = &layer.escalations {
            if !esc.is_subset(&self.escalations) {
                return Err(widens(
                    "escalations.allow",
                    "names a kind the base does not allow",
                ));
            }
            out.escalations = esc.clone();
        }
        Ok(out)
    }

    /// The layer's `fs` lists, each inside the base's, into `out`; `protect` adds to it.
    fn narrow_fs(&self, layer: &Layer, out: &mut Policy) -> Result<(), NarrowError> {
        let all: Vec<&PathTemplate> = self
            .fs
            .read
            .iter()
            .chain(&self.fs.exec)
            .chain(&self.fs.write)
            .collect();
        if let Some(read) = &layer.read {
            for (i, p) in read.iter().enumerate() {
                if !self.fs.read_all && !covered(p, &all) {
                    return Err(widens(
                        format!("fs.read[{i}]"),
                        format!("{p} is not readable in the base"),
                    ));
                }
            }
            out.fs.read = read.clone();
            out.fs.read_all = false;
        }
        if let Some(exec) = &layer.exec {
            let base: Vec<&PathTemplate> = self.fs.exec.iter().collect();
            for (i, p) in exec.iter().enumerate() {
                if !covered(p, &base) {
                    return Err(widens(
                        format!("fs.exec[{i}]"),
                        format!("{p} is not executable in the base"),
                    ));
                }
            }
            out.fs.exec = exec.clone();
        }
        if let Some(write) = &layer.write {
            let base: Vec<&PathTemplate> = self.fs.write.iter().collect();
            let prot: Vec<&PathTemplate> = self.fs.protected.iter().collect();
            for (i, p) in write.iter().enumerate() {
                if !covered(p, &base) || depth(p, &prot) > depth(p, &base) {
                    return Err(widens(
                        format!("fs.write[{i}]"),
                        format!("{p} is not writable in the base"),
                    ));
                }
            }
            out.fs.write = write.clone();
        }
        for p in &layer.protect {
            if !out.fs.protected.contains(p) {
                out.fs.protected.push(p.clone());
            }
        }
        Ok(())
    }
}

/// Whether a layer's `net` allows nothing `base` does not.
fn network_within(base: &Network, net: &Network) -> bool {
    match (base, net) {
        (_, Network::Off) | (Network::All, _) => true,
        (Network::Off, Network::Tcp { .. } | Network::All | Network::Proxy(_))
        | (Network::Tcp { .. } | Network::Proxy(_), Network::All)
        | (Network::Proxy(_), Network::Tcp { .. }) => false,
        // Any domain on a port the base may reach directly.
        (Network::Tcp { connect, .. }, Network::Proxy(p)) => p.ports.is_subset(connect),
        (Network::Proxy(b), Network::Proxy(l)) => l.within(b),
        (
            Network::Tcp {
                connect: bc,
                bind: bb,
            },
            Network::Tcp {
                connect: lc,
                bind: lb,
            },
        ) => lc.is_subset(bc) && lb.is_subset(bb),
    }
}

/// Each of the layer's limits `l` at most the base's `b`.
fn limits_within(l: &Limits, b: &Limits) -> Result<(), NarrowError> {
    for (name, get) in LIMIT_FIELDS {
        let (new, base) = (get(l), get(b));
        if new > base {
            return Err(widens(
                format!("limits.{name}"),
                format!("{new} > base {base}"),
            ));
        }
    }
    Ok(())
}

/// Every limit a layer may only lower: its key under `limits.` and how to read it.
type LimitField = (&'static str, fn(&Limits) -> u64);
const LIMIT_FIELDS: [LimitField; 12] = [
    ("cpu_seconds", |x| x.cpu_seconds),
    ("address_space_bytes", |x| x.address_space_bytes),
    ("memory_bytes", |x| x.memory_bytes),
    ("processes", |x| x.processes),
    ("file_size_bytes", |x| x.file_size_bytes),
    ("open_files", |x| x.open_files),
    ("output_bytes", |x| x.output_bytes),
    ("timeout_seconds", |x| x.timeout_seconds),
    ("kill_grace_ms", |x| x.kill_grace_ms),
    ("shm_bytes", |x| x.shm_bytes),
    ("disk_bytes", |x| x.disk_bytes),
    ("disk_inodes", |x| x.disk_inodes),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ResolveContext, ResolvedPolicy};
    use proptest::prelude::*;
    use std::path::PathBuf;

    const BASE: &str = "[fs]\nread=[\"/etc/hostname\"]\nexec=[\"/usr\"]\nwrite=[\"{workdir}\"]\n[network]\nmode=\"tcp\"\nconnect=[80,443]\n[env]\nallow=[\"PATH\",\"LANG\"]\n[escalations]\nallow=[\"net\",\"read\"]";

    fn t(s: &str) -> PathTemplate {
        PathTemplate::parse("x", s).unwrap()
    }

    fn resolve(p: &Policy) -> ResolvedPolicy {
        p.resolve(&ResolveContext {
            workdir: "/w".into(),
            home: "/home/u".into(),
            extra_secrets: Vec::new(),
        })
        .unwrap()
    }

    #[test]
    fn a_raised_limit_is_refused_naming_its_key() {
        let base = Policy::from_toml(BASE).unwrap();
        let mut big = base.limits;
        big.open_files += 1;
        let e = base
            .narrow(&Layer {
                limits: Some(big),
                ..Layer::default()
            })
            .unwrap_err();
        assert!(e.to_string().starts_with("limits.open_files:"), "{e}");
        let mut lower = base.limits;
        lower.open_files -= 1;
        let n = base
            .narrow(&Layer {
                limits: Some(lower),
                ..Layer::default()
            })
            .unwrap();
        assert_eq!(n.limits.open_files, base.limits.open_files - 1);
    }

    #[test]
    fn widening_is_refused_with_key() {
        let base = Policy::from_toml(BASE).unwrap();
        let e = base
            .narrow(&Layer {
                write: Some(vec![t("/etc")]),
                ..Layer::default()
            })
            .unwrap_err();
        assert!(e.to_string().starts_with("fs.write[0]:"), "{e}");
        let mut big = base.limits;
        big.timeout_seconds += 1;
        assert!(
            base.narrow(&Layer {
                limits: Some(big),
                ..Layer::default()
            })
            .is_err()
        );
        assert!(
            base.narrow(&Layer {
                landlock_min_abi: Some(3),
                ..Layer::default()
            })
            .is_err()
        );
    }

    fn tcp(connect: &[u16], bind: &[u16]) -> Network {
        Network::Tcp {
            connect: connect.iter().copied().collect(),
            bind: bind.iter().copied().collect(),
        }
    }

    fn with_network(n: Network) -> Policy {
        let mut p = Policy::from_toml(BASE).unwrap();
        p.network = n;
        p
    }

    fn layer(n: Network) -> Layer {
        Layer {
            network: Some(n),
            ..Layer::default()
        }
    }

    #[test]
    fn network_narrows_from_all_to_tcp_to_off_and_never_back() {
        let all = with_network(Network::All);
        for n in [
            Network::All,
            tcp(&[443], &[]),
            tcp(&[], &[8080]),
            Network::Off,
        ] {
            assert_eq!(all.narrow(&layer(n.clone())).unwrap().network, n);
        }
        let t = with_network(tcp(&[80, 443], &[8080]));
        assert_eq!(
            t.narrow(&layer(Network::Off)).unwrap().network,
            Network::Off
        );
        assert_eq!(
            t.narrow(&layer(tcp(&[443], &[]))).unwrap().network,
            tcp(&[443], &[])
        );
        for wider in [Network::All, tcp(&[22], &[]), tcp(&[80], &[9090])] {
            let e = t.narrow(&layer(wider.clone())).unwrap_err();
            assert_eq!(
                e.to_string(),
                "network: a layer may only narrow the policy (ports or mode exceed the base)",
                "{wider:?}"
            );
        }
        let off = with_network(Network::Off);
        for wider in [Network::All, tcp(&[], &[])] {
            assert!(off.narrow(&layer(wider)).is_err());
        }
        assert_eq!(
            off.narrow(&layer(Network::Off)).unwrap().network,
            Network::Off
        );
    }

    #[test]
    fn an_unsandboxed_policy_cannot_be_narrowed() {
        let ctx = ResolveContext {
            workdir: "/w".into(),
            home: "/home/u".into(),
            extra_secrets: Vec::new(),
        };
        let base = Policy::from_toml(BASE).unwrap();
        let wide = base
            .with_grants(&[crate::Grant::Unsandboxed], &ctx)
            .unwrap();
        assert!(wide.unsandboxed());
        for l in [
            Layer::default(),
            layer(Network::Off),
            layer(tcp(&[80], &[])),
        ] {
            let e = wide.narrow(&l).unwrap_err();
            assert_eq!(e, NarrowError::Unsandboxed);
            assert!(
                e.to_string()
                    .starts_with("a layer cannot narrow an unsandboxed policy")
            );
        }
        // A layer never makes a policy unsandboxed.
        let n = base.narrow(&layer(Network::Off)).unwrap();
        assert!(!n.unsandboxed() && !resolve(&n).unsandboxed());
    }

    /// `a` grants no network access `b` does not.
    fn within(a: &Network, b: &Network) -> bool {
        match (a, b) {
            (Network::Off, _) | (_, Network::All) => true,
            (
                Network::Tcp { connect, bind },
                Network::Tcp {
                    connect: c,
                    bind: bb,
                },
            ) => connect.is_subset(c) && bind.is_subset(bb),
            _ => false,
        }
    }

    fn arb_network() -> impl Strategy<Value = Network> {
        let ports =
            || proptest::collection::btree_set(prop_oneof![Just(80u16), Just(443), Just(22)], 0..3);
        prop_oneof![
            Just(Network::Off),
            Just(Network::All),
            (ports(), ports()).prop_map(|(connect, bind)| Network::Tcp { connect, bind }),
        ]
    }

    fn arb_tpl() -> impl Strategy<Value = PathTemplate> {
        prop_oneof![
            Just("/usr"),
            Just("/usr/bin"),
            Just("/etc"),
            Just("/etc/hostname"),
            Just("{workdir}"),
            Just("{workdir}/a"),
            Just("/w"),
            Just("/"),
            Just("{home}/x"),
        ]
        .prop_map(t)
    }

    fn arb_layer() -> impl Strategy<Value = Layer> {
        (
            proptest::option::of(proptest::collection::vec(arb_tpl(), 0..3)),
            proptest::option::of(proptest::collection::vec(arb_tpl(), 0..3)),
            proptest::option::of(proptest::collection::vec(arb_tpl(), 0..3)),
            proptest::option::of(proptest::collection::btree_set(
                prop_oneof![Just(80u16), Just(443), Just(22)],
                0..3,
            )),
            proptest::option::of(0u64..200),
        )
            .prop_map(|(read, exec, write, ports, timeout)| Layer {
                read,
                exec,
                write,
                network: ports.map(|connect| Network::Tcp {
                    connect,
                    bind: BTreeSet::new(),
                }),
                limits: timeout.map(|s| Limits {
                    timeout_seconds: s,
                    ..Limits::default()
                }),
                ..Layer::default()
            })
    }

    proptest! {
        #[test]
        fn network_narrowing_is_exactly_the_order(base in arb_network(), new in arb_network()) {
            let p = with_network(base.clone());
            match p.narrow(&layer(new.clone())) {
                Ok(n) => {
                    prop_assert!(within(&n.network, &base));
                    prop_assert_eq!(n.network, new);
                }
                Err(_) => prop_assert!(!within(&new, &base)),
            }
        }

        #[test]
        fn narrowing_never_grants_more(layer in arb_layer(), probe in arb_tpl()) {
            let base = Policy::from_toml(BASE).unwrap();
            if let Ok(n) = base.narrow(&layer) {
                let (rb, rn) = (resolve(&base), resolve(&n));
                let path: PathBuf = probe.resolve(&rb.ctx);
                prop_assert!(rn.access_of(&path) <= rb.access_of(&path));
                prop_assert!(n.limits.timeout_seconds <= base.limits.timeout_seconds);
                if let (Network::Tcp { connect: nc, .. }, Network::Tcp { connect: bc, .. }) = (&n.network, &base.network) {
                    prop_assert!(nc.is_subset(bc));
                }
                // Layers compose: narrowing again with the same layer is still a narrowing.
                if let Ok(n2) = n.narrow(&layer) {
                    prop_assert!(resolve(&n2).access_of(&path) <= rn.access_of(&path));
                }
            }
        }
    }
}
