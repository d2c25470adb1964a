//! Feeds arbitrary UTF-8 to the policy TOML parser and validator, resolution, `decide`, and
//! layering, and checks the invariants the sandbox relies on:
//!
//! - parsing never panics, and every error is one line that names a key path or a line;
//! - a resolved policy never grants a secret location, and every resolved path is absolute;
//! - `narrow` with an empty layer is the identity, and any layer it accepts only narrows
//!   (limits, network, Landlock floor, best effort, environment, escalations, paths);
//! - narrowing is idempotent: a narrowed policy accepts its own layer again unchanged.
//!
//! The input is split at the first NUL byte: the part before is the base policy, the part
//! after (if any) is turned into a layer. The committed corpus (`corpus/policy/`) started from
//! the shipped profiles (`packaging/policy/*.toml`).
//!
//! Run with `scripts/fuzz.sh`, or `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run policy`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ollie_policy::{
    EscalationRequest, Grant, Layer, Network, Policy, ResolveContext, decide, secrets,
};
use std::path::{Path, PathBuf};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (base_text, layer_text) = match text.split_once('\0') {
        Some((a, b)) => (a, Some(b)),
        None => (text, None),
    };
    let base = match Policy::from_toml(base_text) {
        Ok(p) => p,
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "multi-line error: {msg:?}");
            assert!(!msg.is_empty());
            return;
        }
    };
    check_resolved(&base);

    // The empty layer is the identity.
    match base.narrow(&Layer::default()) {
        Ok(same) => assert_eq!(same, base, "empty layer changed the policy"),
        Err(e) => panic!("empty layer refused: {e}"),
    }

    let Some(layer_text) = layer_text else { return };
    let Ok(other) = Policy::from_toml(layer_text) else {
        return;
    };
    let layer = Layer {
        read: Some(other.fs.read.clone()),
        exec: Some(other.fs.exec.clone()),
        write: Some(other.fs.write.clone()),
        protect: other.fs.protected.clone(),
        network: Some(other.network.clone()),
        limits: Some(other.limits),
        env_allow: Some(other.env.allow.clone()),
        landlock_min_abi: Some(other.landlock_min_abi),
        forbid_best_effort: !other.best_effort,
        escalations: Some(other.escalations.clone()),
        deny_syscalls: other.syscalls.deny.clone(),
    };
    let Ok(n) = base.narrow(&layer) else { return };
    check_resolved(&n);
    let (l, b) = (&n.limits, &base.limits);
    for (new, old) in [
        (l.cpu_seconds, b.cpu_seconds),
        (l.address_space_bytes, b.address_space_bytes),
        (l.processes, b.processes),
        (l.file_size_bytes, b.file_size_bytes),
        (l.open_files, b.open_files),
        (l.output_bytes, b.output_bytes),
        (l.timeout_seconds, b.timeout_seconds),
        (l.kill_grace_ms, b.kill_grace_ms),
        (l.shm_bytes, b.shm_bytes),
        (l.memory_bytes, b.memory_bytes),
        (l.disk_bytes, b.disk_bytes),
        (l.disk_inodes, b.disk_inodes),
    ] {
        assert!(new <= old, "a limit widened: {new} > {old}");
    }
    assert!(n.landlock_min_abi >= base.landlock_min_abi);
    assert!(!n.best_effort || base.best_effort);
    assert!(n.env.allow.is_subset(&base.env.allow));
    assert!(n.escalations.is_subset(&base.escalations));
    assert!(
        base.syscalls.deny.is_subset(&n.syscalls.deny),
        "a denied call came back"
    );
    match (&n.network, &base.network) {
        (Network::Off, _) => {}
        (
            Network::Tcp { connect, bind },
            Network::Tcp {
                connect: c0,
                bind: b0,
            },
        ) => {
            assert!(connect.is_subset(c0) && bind.is_subset(b0), "ports widened");
        }
        (_, Network::All) => {}
        (Network::All, Network::Tcp { .. }) => panic!("the whole network opened by a layer"),
        (Network::Tcp { .. } | Network::All | Network::Proxy(_), Network::Off) => {
            panic!("network turned on by a layer")
        }
        (Network::Proxy(p), Network::Tcp { connect, .. }) => {
            assert!(p.ports.is_subset(connect), "proxy ports widened");
        }
        (Network::Proxy(p), Network::Proxy(p0)) => {
            assert!(p.within(p0), "proxy rules widened");
        }
        (Network::Tcp { .. } | Network::All, Network::Proxy(_)) => {
            panic!("a proxied network opened by a layer")
        }
    }
    for p in &base.fs.protected {
        assert!(n.fs.protected.contains(p), "a protected path was dropped");
    }
    // Every path the narrowed policy grants is granted at least as strongly by the base.
    let ctx = ctx();
    if let (Ok(rn), Ok(rb)) = (n.resolve(&ctx), base.resolve(&ctx)) {
        for p in rn.fs.read.iter().chain(&rn.fs.exec).chain(&rn.fs.write) {
            let (an, ab) = (rn.access_of(p), rb.access_of(p));
            assert!(
                an <= ab || ab.is_none() && an.is_none(),
                "{p:?}: {an:?} > {ab:?}"
            );
        }
    }
    // Idempotent.
    match n.narrow(&layer) {
        Ok(again) => assert_eq!(again, n, "narrowing twice changed the result"),
        Err(e) => panic!("a layer accepted once is refused the second time: {e}"),
    }
});

fn ctx() -> ResolveContext {
    ResolveContext {
        workdir: PathBuf::from("/w"),
        home: PathBuf::from("/home/u"),
        extra_secrets: Vec::new(),
    }
}

fn check_resolved(p: &Policy) {
    let ctx = ctx();
    let Ok(r) = p.resolve(&ctx) else { return };
    let secret_list = secrets::secret_locations(&ctx.home);
    for path in r.fs.read.iter().chain(&r.fs.exec).chain(&r.fs.write) {
        assert!(path.is_absolute(), "relative path {path:?}");
        assert!(
            secrets::secret_in(path, &secret_list).is_none(),
            "secret granted: {path:?}"
        );
        assert!(
            r.access_of(path).is_some() || secrets::secret_containing(path, &ctx.home).is_some()
        );
    }
    for s in &secret_list {
        assert_eq!(r.access_of(s), None, "secret {s:?} accessible");
    }
    for path in r.fs.protected.iter() {
        let a = r.access_of(path);
        assert!(
            a != Some(ollie_policy::Access::ReadWrite),
            "protected {path:?} writable"
        );
    }
    // decide never panics and never allows a secret.
    for g in [
        Grant::Read(PathBuf::from("/home/u/.ssh/id_ed25519")),
        Grant::Write(Path::new("/w/x").to_path_buf()),
    ] {
        let d = decide(
            &r,
            &EscalationRequest {
                grants: vec![g.clone()],
                reason: String::new(),
            },
        );
        if matches!(g, Grant::Read(_)) {
            assert!(
                !matches!(d, ollie_policy::Decision::Allow),
                "secret read allowed"
            );
        }
    }
}
