//! Widening a resolved policy by grants a human approved through the broker.
//!
//! This is the one place a policy grows. It is only for the exact run an approval covers:
//! the result is a new [`ResolvedPolicy`] (or [`Policy`]) and the stored policy is never
//! changed. It is also the only way to an unsandboxed policy: no policy file or layer can
//! make one.

use crate::decide::{Grant, normal_abs};
use crate::model::{Access, Network, PathTemplate, Policy, ResolveContext, ResolvedPolicy};
use std::collections::BTreeSet;

/// `net:PORT` on a network: `Off` becomes TCP with just that connect port (and no bind
/// ports), TCP gains the connect port, the proxy may reach that port too, `All` already
/// allows it.
fn add_connect_port(network: &mut Network, port: u16) {
    match network {
        Network::Off => {
            *network = Network::Tcp {
                connect: BTreeSet::from([port]),
                bind: BTreeSet::new(),
            };
        }
        Network::Tcp { connect, .. } => {
            connect.insert(port);
        }
        // Through the proxy: requests may reach that port too.
        Network::Proxy(p) => {
            p.ports.insert(port);
        }
        Network::All => {}
    }
}

/// `net:DOMAIN` on a network: `Off` becomes the proxy mode reaching just that domain (on the
/// default ports), the proxy mode allows it too, `All` already reaches it. Refused under
/// `Tcp` (a proxied network would take its direct ports away) and for a domain the proxy
/// mode denies (deny wins).
fn add_domain(network: &mut Network, d: &str) -> Result<(), String> {
    match network {
        Network::Off => {
            let mut p = crate::ProxyNetwork::closed();
            p.allow.insert(d.to_owned());
            *network = Network::Proxy(p);
        }
        Network::Proxy(p) => {
            if let Some(deny) = crate::proxynet::denied_by(d, p) {
                return Err(format!(
                    "net:{d}: refused by the policy's deny_domains entry {deny}"
                ));
            }
            p.allow.insert(d.to_owned());
        }
        Network::Tcp { .. } => {
            return Err(format!(
                "net:{d}: domains need network.mode = \"proxy\" (or \"off\"); this policy's mode is \"tcp\""
            ));
        }
        Network::All => {}
    }
    Ok(())
}

impl ResolvedPolicy {
    /// Returns a copy widened by exactly `grants` and nothing else.
    ///
    /// - `read:P` appends `P` to `fs.read`, unless [`access_of`](Self::access_of) already
    ///   reports `P` as readable (then it is a no-op).
    /// - `write:P` appends `P` to `fs.write`, unless `P` is already read-write; a read-only or
    ///   read+exec `P` is thereby upgraded. A `P` inside a `fs.protected` island is refused:
    ///   islands stay read-only whatever covers them, so the grant could not be honoured, and
    ///   lifting the island would widen more than `P`.
    /// - `net:PORT` adds `PORT` to the TCP connect set; `Network::Off` becomes TCP with just
    ///   that connect port and no bind ports (which also lets the run create TCP sockets).
    ///   Under [`Network::All`] it is a no-op.
    /// - `net` makes the network [`Network::All`]: the host network, TCP and UDP to any host
    ///   and port, bind and listen (raw, packet, netlink and AF_UNIX sockets stay denied).
    ///   Later `net:PORT` grants add nothing.
    /// - `net:DOMAIN` lets the proxy reach that domain pattern: [`Network::Off`] becomes
    ///   [`Network::Proxy`] with just it (default ports), a proxied network allows it too
    ///   (refused when a deny pattern covers it), `All` already reaches it; refused under
    ///   [`Network::Tcp`] (a proxied network would take its direct ports away).
    /// - Where the result uses the host network (`Tcp`, `All`), the resolver's files
    ///   ([`crate::RESOLVER_FILES`]) are added to the reads.
    /// - `unsandboxed` marks the copy [`unsandboxed`](ResolvedPolicy::unsandboxed) and makes
    ///   the network [`Network::All`]: the enforcer applies no filesystem rule (no Landlock,
    ///   so no secret-location carve-outs; no read-only mounts or protected islands) and keeps
    ///   capabilities dropped, `no_new_privs`, seccomp, limits and the environment allowlist.
    ///   This is the only way to an unsandboxed policy. The filesystem rules stay in the copy
    ///   as data, and `read:`/`write:` grants next to it are still checked and added.
    ///
    /// Paths must be absolute and normal (as [`Grant::parse`] requires), and no path may be, or lie inside, a secret location
    /// ([`ResolveContext::secret_containing`]: the defaults and the runner's extra ones); `decide` already denies these, this re-checks.
    /// A path that is an ancestor of secret locations is accepted, exactly as in a policy
    /// file: the enforcer carves out [`secrets_within`](Self::secrets_within).
    ///
    /// Limits, environment, syscall profile, Landlock floor, best effort, escalation kinds,
    /// `env_set`, the context, the source `policy` and every other rule are unchanged. Any
    /// error refuses the whole list (nothing is partially applied). Whether a grant's kind may
    /// be asked for at all is [`decide`](crate::decide())'s question, not this one's.
    pub fn with_grants(&self, grants: &[Grant]) -> Result<ResolvedPolicy, String> {
        let mut out = self.clone();
        for g in grants {
            match g {
                Grant::Read(p) | Grant::Write(p) => {
                    if !normal_abs(p) {
                        return Err(format!(
                            "{g}: the path must be absolute and normal (no `.`, `..` or empty components, no nul)"
                        ));
                    }
                    if let Some(s) = self.ctx.secret_containing(p) {
                        return Err(format!(
                            "{g}: {} is inside the secret location {} and can never be granted",
                            p.display(),
                            s.display()
                        ));
                    }
                    if matches!(g, Grant::Read(_)) {
                        if out.access_of(p).is_none() {
                            out.fs.read.push(p.clone());
                        }
                    } else if out.access_of(p) != Some(Access::ReadWrite) {
                        if let Some(island) = out.fs.protected.iter().find(|i| p.starts_with(i)) {
                            return Err(format!(
                                "{g}: {} is inside the protected path {}, which stays read-only",
                                p.display(),
                                island.display()
                            ));
                        }
                        out.fs.write.push(p.clone());
                    }
                }
                Grant::NetPort(0) => return Err("net:0: port 0 is not a port".to_string()),
                Grant::NetPort(port) => add_connect_port(&mut out.network, *port),
                Grant::NetDomain(d) => add_domain(&mut out.network, d)?,
                Grant::Net => out.network = Network::All,
                Grant::Unsandboxed => out.set_unsandboxed(),
            }
        }
        if out.network.uses_host_resolver() {
            crate::model::add_resolver_reads(&mut out.fs);
        }
        Ok(out)
    }
}

impl Policy {
    /// The policy (as the sandbox takes it) widened by exactly `grants` for a run in `ctx`:
    /// the same checks and the same rules as [`ResolvedPolicy::with_grants`], which it runs
    /// first; grants already covered add nothing. `net` makes the network [`Network::All`];
    /// `unsandboxed` makes the copy [`unsandboxed`](Policy::unsandboxed) (the only way to
    /// one) with the network `All`.
    pub fn with_grants(&self, grants: &[Grant], ctx: &ResolveContext) -> Result<Policy, String> {
        let resolved = self.resolve(ctx).map_err(|e| e.to_string())?;
        resolved.with_grants(grants)?;
        let mut out = self.clone();
        let mut now = resolved;
        for g in grants {
            match g {
                Grant::Read(p) | Grant::Write(p) => {
                    let write = matches!(g, Grant::Write(_));
                    let have = now.access_of(p);
                    let covered = if write {
                        have == Some(Access::ReadWrite)
                    } else {
                        have.is_some()
                    };
                    if !covered {
                        let t = PathTemplate::parse("grant", &p.to_string_lossy())
                            .map_err(|e| e.to_string())?;
                        if write {
                            out.fs.write.push(t);
                        } else {
                            out.fs.read.push(t);
                        }
                    }
                }
                Grant::NetPort(port) => add_connect_port(&mut out.network, *port),
                Grant::NetDomain(d) => add_domain(&mut out.network, d)?,
                Grant::Net => out.network = Network::All,
                Grant::Unsandboxed => out.set_unsandboxed(),
            }
            now = now.with_grants(std::slice::from_ref(g))?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::decide::{Decision, EscalationRequest, decide};
    use crate::model::{Access, Network, Policy, ResolveContext, ResolvedPolicy};
    use crate::{Grant, secrets};
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

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

    /// A policy with something in every field, so "unchanged" means something.
    const BASE: &str = "landlock_min_abi = 6\nbest_effort = true\n\
        [fs]\nread=[\"/etc/hostname\"]\nexec=[\"/usr\"]\nwrite=[\"{workdir}\"]\nprotected=[\"{workdir}/.git\"]\n\
        [network]\nmode=\"tcp\"\nconnect=[443]\nbind=[8080]\n\
        [limits]\ncpu_seconds=7\ntimeout_seconds=9\n\
        [env]\nallow=[\"PATH\"]\nset={TMPDIR=\"{workdir}/.tmp\"}\n\
        [escalations]\nallow=[\"net\",\"read\",\"write\",\"unsandboxed\"]";

    fn g(s: &str) -> Grant {
        Grant::parse(s).unwrap()
    }

    #[test]
    fn the_sandbox_policy_widens_like_the_resolved_one() {
        let base = Policy::from_toml(
            "[fs]\nwrite=[\"{workdir}\"]\nread=[\"/usr\"]\n[escalations]\nallow=[\"net\",\"read\",\"write\"]",
        )
        .unwrap();
        let ctx = ResolveContext {
            workdir: "/w".into(),
            home: "/home/u".into(),
            extra_secrets: Vec::new(),
        };
        let grants = [
            g("read:/srv/data"),
            g("write:/tmp/out"),
            g("net:8080"),
            g("read:/usr/lib"),
        ];
        let wide = base.with_grants(&grants, &ctx).unwrap();
        let want = base.resolve(&ctx).unwrap().with_grants(&grants).unwrap();
        let got = wide.resolve(&ctx).unwrap();
        assert_eq!(got.fs, want.fs);
        assert_eq!(got.network, want.network);
        assert_eq!(
            wide.fs.read.len(),
            base.fs.read.len() + 1,
            "/usr/lib was covered"
        );
        assert_eq!(wide.limits, base.limits);
        assert_eq!(wide.env, base.env);
        assert!(!wide.unsandboxed());
        // net and unsandboxed too.
        for grants in [
            vec![g("net")],
            vec![g("net:443"), g("net")],
            vec![g("unsandboxed")],
            vec![g("unsandboxed"), g("read:/srv/data"), g("net:22")],
        ] {
            let wide = base.with_grants(&grants, &ctx).unwrap();
            let want = base.resolve(&ctx).unwrap().with_grants(&grants).unwrap();
            let got = wide.resolve(&ctx).unwrap();
            assert_eq!(got.fs, want.fs, "{grants:?}");
            assert_eq!(got.network, Network::All, "{grants:?}");
            assert_eq!(got.network, want.network, "{grants:?}");
            let unsandboxed = grants.contains(&Grant::Unsandboxed);
            assert_eq!(wide.unsandboxed(), unsandboxed, "{grants:?}");
            assert_eq!(got.unsandboxed(), unsandboxed, "{grants:?}");
            assert_eq!(want.unsandboxed(), unsandboxed, "{grants:?}");
            assert_eq!((wide.limits, &wide.env), (base.limits, &base.env));
            assert_eq!(wide.syscalls, base.syscalls);
        }
        // The stored policy is never changed.
        assert!(!base.unsandboxed());
        assert_eq!(base.network, Network::Off);
        assert!(
            base.with_grants(&[g("read:/home/u/.ssh/id_rsa")], &ctx)
                .is_err()
        );
    }

    #[test]
    fn read_adds_exactly_one_rule() {
        let before = pol(BASE);
        let after = before.with_grants(&[g("read:/opt/data")]).unwrap();
        let mut expected = before.clone();
        expected.fs.read.push("/opt/data".into());
        assert_eq!(after, expected);
        assert_eq!(
            after.access_of(Path::new("/opt/data/x")),
            Some(Access::Read)
        );
        assert_eq!(after.access_of(Path::new("/opt")), None);
    }

    #[test]
    fn write_adds_exactly_one_rule_and_upgrades() {
        let before = pol(BASE);
        for p in ["/etc/hostname", "/usr/lib", "/srv"] {
            let after = before.with_grants(&[Grant::Write(p.into())]).unwrap();
            let mut expected = before.clone();
            expected.fs.write.push(p.into());
            assert_eq!(after, expected, "{p}");
            assert_eq!(after.access_of(Path::new(p)), Some(Access::ReadWrite));
        }
    }

    #[test]
    fn net_port_adds_to_connect_only() {
        let before = pol(BASE);
        let after = before.with_grants(&[g("net:22")]).unwrap();
        let mut expected = before.clone();
        expected.network = Network::Tcp {
            connect: BTreeSet::from([22, 443]),
            bind: BTreeSet::from([8080]),
        };
        crate::model::add_resolver_reads(&mut expected.fs);
        assert_eq!(after, expected);

        let off = pol("[fs]\nwrite=[\"{workdir}\"]");
        assert_eq!(off.network, Network::Off);
        let after = off.with_grants(&[g("net:443")]).unwrap();
        let mut expected = off.clone();
        expected.network = Network::Tcp {
            connect: BTreeSet::from([443]),
            bind: BTreeSet::new(),
        };
        crate::model::add_resolver_reads(&mut expected.fs);
        assert_eq!(after, expected);
    }

    #[test]
    fn net_opens_the_whole_network_and_covers_every_port() {
        for text in [
            BASE,
            "[fs]\nwrite=[\"{workdir}\"]",
            "[network]\nmode=\"all\"",
        ] {
            let before = pol(text);
            for grants in [
                vec![g("net")],
                vec![g("net"), g("net:22")],
                vec![g("net:22"), g("net")],
            ] {
                let after = before.with_grants(&grants).unwrap();
                let mut expected = before.clone();
                expected.network = Network::All;
                crate::model::add_resolver_reads(&mut expected.fs);
                assert_eq!(after, expected, "{text}: {grants:?}");
                assert!(!after.unsandboxed());
            }
        }
        // Under All, net:PORT adds nothing.
        let all = pol("[network]\nmode=\"all\"");
        assert_eq!(all.with_grants(&[g("net:443")]).unwrap(), all);
    }

    #[test]
    fn unsandboxed_marks_the_copy_and_opens_the_network_only() {
        let before = pol(BASE);
        assert!(!before.unsandboxed());
        let after = before.with_grants(&[g("unsandboxed")]).unwrap();
        assert!(after.unsandboxed());
        assert_eq!(after.network, Network::All);
        // Everything else is as it was: the rules stay as data, limits and environment apply.
        assert_eq!(after.fs, before.fs);
        assert_eq!(after.policy, before.policy);
        assert_eq!(after.env_set, before.env_set);
        assert_eq!(after.ctx, before.ctx);
        assert_eq!(
            after.access_of(Path::new("/home/u/.ssh/id_rsa")),
            None,
            "secrets are never granted as rules"
        );
        // Read and write grants next to it are checked as ever.
        let e = before
            .with_grants(&[g("unsandboxed"), g("read:/home/u/.ssh")])
            .unwrap_err();
        assert!(e.contains("secret location"), "{e}");
        let e = before
            .with_grants(&[g("unsandboxed"), g("write:/w/.git/x")])
            .unwrap_err();
        assert!(e.contains("protected path /w/.git"), "{e}");
        let e = before
            .with_grants(&[Grant::Read("/a/../b".into()), g("unsandboxed")])
            .unwrap_err();
        assert!(e.contains("absolute and normal"), "{e}");
        // Idempotent.
        assert_eq!(
            after.with_grants(&[g("unsandboxed"), g("net")]).unwrap(),
            after
        );
    }

    #[test]
    fn covered_grants_are_no_ops() {
        let before = pol(BASE);
        for grants in [
            vec![g("read:/etc/hostname")],
            vec![g("read:/usr/bin/env")],
            vec![g("read:/w/.git/config")],
            vec![g("write:/w/src")],
            vec![g("write:/w")],
            vec![g("net:443")],
            vec![],
        ] {
            assert_eq!(before.with_grants(&grants).unwrap(), before, "{grants:?}");
        }
        let all = pol("[fs]\nread_all=true");
        assert_eq!(all.with_grants(&[g("read:/opt")]).unwrap(), all);
        // The same grant twice adds one rule.
        let twice = before
            .with_grants(&[g("write:/srv"), g("write:/srv"), g("write:/srv/x")])
            .unwrap();
        assert_eq!(twice.fs.write.len(), before.fs.write.len() + 1);
    }

    #[test]
    fn several_grants_combine() {
        let before = pol(BASE);
        let after = before
            .with_grants(&[g("read:/opt"), g("write:/srv"), g("net:80")])
            .unwrap();
        let mut expected = before.clone();
        expected.fs.read.push("/opt".into());
        expected.fs.write.push("/srv".into());
        if let Network::Tcp { connect, .. } = &mut expected.network {
            connect.insert(80);
        }
        assert_eq!(after, expected);
    }

    #[test]
    fn refusals_are_clear() {
        let p = pol(BASE);
        let err = |grants: &[Grant]| p.with_grants(grants).unwrap_err();
        assert_eq!(err(&[Grant::NetPort(0)]), "net:0: port 0 is not a port");
        assert_eq!(
            err(&[Grant::Net, Grant::NetPort(0)]),
            "net:0: port 0 is not a port"
        );
        for s in [
            "/home/u/.ssh",
            "/home/u/.ssh/id_ed25519",
            "/etc/shadow",
            "/root/.aws/credentials",
        ] {
            for grant in [Grant::Read(s.into()), Grant::Write(s.into())] {
                let e = err(std::slice::from_ref(&grant));
                assert!(e.contains("secret location"), "{e}");
                assert!(e.starts_with(&grant.to_string()), "{e}");
            }
        }
        for s in ["rel", "/a/../b", "/a/./b", "/a//b", "/a/", "/a\0b", ""] {
            assert!(err(&[Grant::Read(s.into())]).contains("absolute"), "{s}");
        }
        let e = err(&[g("write:/w/.git/hooks")]);
        assert!(e.contains("protected path /w/.git"), "{e}");
        // An ancestor of secret locations is accepted, as in a policy file; the secrets stay
        // denied.
        let home = p.with_grants(&[g("read:/home/u")]).unwrap();
        assert_eq!(home.access_of(Path::new("/home/u/.ssh/id_rsa")), None);
        assert!(!home.secrets_within(Path::new("/home/u")).is_empty());
    }

    #[test]
    fn approved_requests_become_allowed() {
        let p = pol(
            "[fs]\nwrite=[\"{workdir}\"]\n[escalations]\nallow=[\"net\",\"read\",\"write\",\"unsandboxed\"]",
        );
        for grants in [
            vec![g("read:/opt"), g("write:/srv"), g("net:22")],
            vec![g("net")],
            vec![g("unsandboxed")],
            vec![g("unsandboxed"), g("net:22"), g("read:/opt")],
        ] {
            let req = EscalationRequest {
                grants: grants.clone(),
                reason: "r".into(),
            };
            assert!(matches!(decide(&p, &req), Decision::NeedsApproval(_)));
            assert_eq!(
                decide(&p.with_grants(&grants).unwrap(), &req),
                Decision::Allow,
                "{grants:?}"
            );
            // The stored policy still asks.
            assert!(matches!(decide(&p, &req), Decision::NeedsApproval(_)));
        }
    }

    fn arb_path() -> impl Strategy<Value = PathBuf> {
        let seg = prop_oneof![
            Just("w"),
            Just("usr"),
            Just("etc"),
            Just("home"),
            Just("u"),
            Just(".ssh"),
            Just(".git"),
            Just("shadow"),
            Just("srv"),
            Just("x"),
        ];
        proptest::collection::vec(seg, 0..4).prop_map(|segs| {
            let mut p = PathBuf::from("/");
            for s in segs {
                p.push(s);
            }
            p
        })
    }

    fn arb_grant() -> impl Strategy<Value = Grant> {
        prop_oneof![
            Just(Grant::Net),
            (1u16..=65535).prop_map(Grant::NetPort),
            prop_oneof![Just(22u16), Just(443)].prop_map(Grant::NetPort),
            arb_path().prop_map(Grant::Read),
            arb_path().prop_map(Grant::Write),
            Just(Grant::Unsandboxed),
        ]
    }

    proptest! {
        #[test]
        fn widening_grants_what_was_asked_and_nothing_else(
            grants in proptest::collection::vec(arb_grant(), 0..4),
            probe in arb_path(),
        ) {
            let before = pol(BASE);
            let result = before.with_grants(&grants);
            let refusable = grants.iter().any(|g| match g {
                Grant::Read(p) | Grant::Write(p) => {
                    secrets::secret_containing(p, Path::new("/home/u")).is_some()
                        || (matches!(g, Grant::Write(_)) && p.starts_with("/w/.git"))
                }
                Grant::Net | Grant::NetPort(_) | Grant::NetDomain(_) | Grant::Unsandboxed => false,
            });
            prop_assert_eq!(result.is_err(), refusable, "{:?}", result);
            let Ok(after) = result else { return Ok(()) };
            // Everything but fs.read, fs.write and the connect set is unchanged.
            prop_assert_eq!(&after.policy, &before.policy);
            prop_assert_eq!(&after.ctx, &before.ctx);
            prop_assert_eq!(&after.env_set, &before.env_set);
            prop_assert_eq!(&after.fs.exec, &before.fs.exec);
            prop_assert_eq!(&after.fs.protected, &before.fs.protected);
            prop_assert_eq!(after.fs.read_all, before.fs.read_all);
            prop_assert!(after.fs.read.starts_with(&before.fs.read));
            prop_assert!(after.fs.write.starts_with(&before.fs.write));
            // Each added rule is one of the grants.
            for p in &after.fs.read[before.fs.read.len()..] {
                prop_assert!(
                    grants.contains(&Grant::Read(p.clone()))
                        || crate::RESOLVER_FILES.iter().any(|f| p.as_path() == Path::new(f)),
                    "{} was added", p.display()
                );
            }
            for p in &after.fs.write[before.fs.write.len()..] {
                prop_assert!(grants.contains(&Grant::Write(p.clone())));
            }
            // Access never shrinks, and only grows under a granted path.
            let (a, b) = (after.access_of(&probe), before.access_of(&probe));
            prop_assert!(a >= b);
            if a != b {
                prop_assert!(grants.iter().any(|g| matches!(g, Grant::Read(p) | Grant::Write(p) if probe.starts_with(p))));
            }
            // Secrets stay denied.
            if secrets::secret_containing(&probe, Path::new("/home/u")).is_some() {
                prop_assert_eq!(a, None);
            }
            // Unsandboxed exactly when granted.
            let unsandboxed = grants.contains(&Grant::Unsandboxed);
            prop_assert_eq!(after.unsandboxed(), unsandboxed);
            // Network: the whole network after net or unsandboxed; otherwise bind unchanged
            // and connect = base ∪ granted ports.
            if unsandboxed || grants.contains(&Grant::Net) {
                prop_assert_eq!(&after.network, &Network::All);
            } else {
                let (Network::Tcp { connect: ac, bind: ab }, Network::Tcp { connect: bc, bind: bb }) =
                    (&after.network, &before.network) else { unreachable!() };
                prop_assert_eq!(ab, bb);
                let mut want = bc.clone();
                want.extend(grants.iter().filter_map(|g| match g { Grant::NetPort(p) => Some(*p), _ => None }));
                prop_assert_eq!(ac, &want);
            }
            // Every grant is now covered.
            let req = EscalationRequest { grants: grants.clone(), reason: "r".into() };
            if !grants.is_empty() {
                prop_assert_eq!(decide(&after, &req), Decision::Allow);
            }
        }
    }
}
