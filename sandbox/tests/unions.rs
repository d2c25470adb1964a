//! Union mounts (`RunRequest::unions`): a bead namespace's union at `/ctx`, a point that does
//! not exist on the host. Reads find the first member that has a name; writes land in the
//! shadow layer (the overlay's upper directory) and never in a member; nothing else becomes
//! writable; the host's `/` is unchanged afterwards.
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead. Run as root and as an
//! unprivileged user (`scripts/test-unprivileged.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_policy::Policy;
use ollie_sandbox::{RunOutput, RunRequest, SandboxError, UnionMount};
use std::path::{Path, PathBuf};

mod common;
use common::features_ok;

const POINT: &str = "/ctx";

/// A workspace and two members A and B, a shadow layer U and overlay work dir W, all under
/// one temporary directory.
struct Scratch {
    base: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let base = std::env::temp_dir().join(format!("ollie-unions-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        for d in ["ws/.git/hooks", "A", "B", "U", "W"] {
            std::fs::create_dir_all(base.join(d)).unwrap();
        }
        std::fs::write(base.join("A/x"), "a\n").unwrap();
        std::fs::write(base.join("B/x"), "b\n").unwrap();
        std::fs::write(base.join("B/y"), "b\n").unwrap();
        Scratch {
            base: std::fs::canonicalize(&base).unwrap(),
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }

    fn union(&self) -> UnionMount {
        UnionMount {
            point: PathBuf::from(POINT),
            lowers: vec![self.p("A"), self.p("B")],
            upper: self.p("U"),
            work: self.p("W"),
        }
    }

    fn req(&self, script: &str, unions: bool) -> RunRequest {
        let mut r = RunRequest::new(
            ["sh", "-c", script].iter().map(Into::into).collect(),
            self.p("ws"),
        );
        r.base_env = vec![("LANG".into(), "C.UTF-8".into())];
        if unions {
            r.unions = vec![self.union()];
        }
        r
    }

    fn run(&self, script: &str) -> RunOutput {
        let o = ollie_sandbox::run(&policy(), &self.req(script, true)).unwrap();
        assert_eq!(
            o.record.exit.code,
            Some(0),
            "{script}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }

    /// Every file under `rel` with its contents, sorted.
    fn tree(&self, rel: &str) -> Vec<(String, String)> {
        fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                let name = p.strip_prefix(root).unwrap().display().to_string();
                let ft = e.file_type().unwrap();
                if ft.is_dir() {
                    out.push((format!("{name}/"), String::new()));
                    walk(root, &p, out);
                } else if ft.is_file() {
                    out.push((name, std::fs::read_to_string(&p).unwrap()));
                } else {
                    out.push((format!("{name} (special)"), String::new()));
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.p(rel), &self.p(rel), &mut out);
        out.sort();
        out
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn policy() -> Policy {
    common::profile_with_limits("workspace", "")
}

fn s(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn union_reads_members_in_order_and_writes_only_the_shadow_layer() {
    if !features_ok("union_reads_members_in_order_and_writes_only_the_shadow_layer") {
        return;
    }
    let sc = Scratch::new("rw");
    let members = (sc.tree("A"), sc.tree("B"));
    let o = sc.run("cat /ctx/x /ctx/y");
    assert_eq!(o.stdout, b"a\nb\n");
    let m = &o.record.layers.mounts;
    assert_eq!(m.unions, vec![sc.union()]);
    let json = serde_json::to_value(&o.record).unwrap();
    assert_eq!(json["layers"]["mounts"]["unions"][0]["point"], POINT);

    let o = sc.run(
        "mkdir -p /ctx/notes && echo new > /ctx/notes/n.md && echo z > /ctx/x && \
         cat /ctx/x /ctx/notes/n.md && ls /ctx",
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "z\nnew\nnotes\nx\ny\n");
    assert_eq!(
        sc.tree("U"),
        s(&[("notes/", ""), ("notes/n.md", "new\n"), ("x", "z\n")])
    );
    // A later run sees the shadow layer first; removing a member's name leaves a whiteout in
    // the shadow layer, not a change in the member.
    let o = sc.run("cat /ctx/x; rm /ctx/y; ls /ctx");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "z\nnotes\nx\n");
    assert_eq!((sc.tree("A"), sc.tree("B")), members);
    assert!(
        sc.tree("U")
            .contains(&("y (special)".to_string(), String::new()))
    );
    // The point exists only inside the sandbox.
    assert!(std::fs::symlink_metadata(POINT).is_err());
}

#[test]
fn union_leaves_everything_else_as_it_was() {
    if !features_ok("union_leaves_everything_else_as_it_was") {
        return;
    }
    let sc = Scratch::new("deny");
    let members = (sc.tree("A"), sc.tree("B"));
    let outside = std::env::temp_dir().join(format!("ollie-unions-{}-outside", std::process::id()));
    let _ = std::fs::remove_file(&outside);
    // Each probe prints `ok` or `denied`.
    let script = format!(
        r#"
try() {{ if ( eval "$1" ) 2>/dev/null; then echo "ok $1"; else echo "denied $1"; fi; }}
try 'echo w > {ws}/f'
try 'echo z > /ctx/new'
try 'echo no > {a}/x'
try 'echo no > {a}/new'
try 'echo no > {u}/direct'
try 'echo no > {w}/direct'
try 'echo no > {outside}'
try 'echo no > /ctx2'
try 'mkdir /ctx2'
try 'rmdir /ctx'
try 'mv /ctx /ctx2'
try 'umount -l /ctx'
try 'echo no > {ws}/.git/hooks/pre-commit'
try 'cat /ctx/x >/dev/null'
"#,
        ws = sc.p("ws").display(),
        a = sc.p("A").display(),
        u = sc.p("U").display(),
        w = sc.p("W").display(),
        outside = outside.display(),
    );
    let o = sc.run(&script);
    let out = String::from_utf8_lossy(&o.stdout);
    let verdicts: Vec<&str> = out.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(
        verdicts,
        [
            "ok", "ok", "denied", "denied", "denied", "denied", "denied", "denied", "denied",
            "denied", "denied", "denied", "denied", "ok"
        ],
        "{out}"
    );
    assert!(!outside.exists());
    assert_eq!((sc.tree("A"), sc.tree("B")), members);
    assert_eq!(std::fs::read_to_string(sc.p("ws/f")).unwrap(), "w\n");
    assert_eq!(sc.tree("U"), s(&[("new", "z\n")]));
    assert!(std::fs::symlink_metadata(POINT).is_err());
    assert!(std::fs::symlink_metadata("/ctx2").is_err());
}

#[test]
fn new_root_keeps_the_hosts_top_level_and_mounts() {
    if !features_ok("new_root_keeps_the_hosts_top_level_and_mounts") {
        return;
    }
    let sc = Scratch::new("root");
    let mut names: Vec<String> = std::fs::read_dir("/")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // stat is not a Landlock right: every top-level entry is there, with the host's kind
    // (and symlinks keep their targets).
    let script = format!(
        "for n in {}; do if [ -L \"/$n\" ]; then echo \"$n -> $(readlink \"/$n\")\"; \
         elif [ -d \"/$n\" ]; then echo \"$n/\"; elif [ -e \"/$n\" ]; then echo \"$n\"; \
         else echo \"$n missing\"; fi; done; [ -d /ctx ] && echo ctx/",
        names.join(" ")
    );
    let o = sc.run(&script);
    let mut want: Vec<String> = names
        .iter()
        .map(|n| {
            let p = Path::new("/").join(n);
            let md = std::fs::symlink_metadata(&p).unwrap();
            if md.file_type().is_symlink() {
                format!("{n} -> {}", std::fs::read_link(&p).unwrap().display())
            } else if md.is_dir() {
                format!("{n}/")
            } else {
                n.clone()
            }
        })
        .collect();
    want.push("ctx/".into());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .collect::<Vec<_>>(),
        want
    );
    // Submounts came along: /proc is a procfs, /dev/null works, /dev/shm is the run's own.
    // The only mount at / is the new root (read-only); the host's root is detached.
    let o = sc.run(
        "stat -f -c %T /proc /ctx; echo x > /dev/null && echo null-ok; \
         echo s > /dev/shm/s && cat /dev/shm/s; \
         awk '$5 == \"/\" {print $9, substr($6, 1, 3)}' /proc/self/mountinfo",
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "proc\noverlayfs\nnull-ok\ns\ntmpfs ro,\n"
    );
    // `ls /` answers as it does without a union (Landlock decides, the root is not listable
    // under the workspace profile), apart from the point.
    let ls = |unions: bool| {
        let o = ollie_sandbox::run(&policy(), &sc.req("ls / 2>&1; echo $?", unions)).unwrap();
        String::from_utf8_lossy(&o.stdout).replace(" ", "")
    };
    assert_eq!(ls(true), ls(false));
}

#[test]
fn unions_are_checked_before_anything_runs() {
    if !features_ok("unions_are_checked_before_anything_runs") {
        return;
    }
    let sc = Scratch::new("refuse");
    let marker = sc.p("ws/ran");
    let script = format!("touch {}", marker.display());
    let refused = |u: UnionMount| {
        let mut r = sc.req(&script, false);
        r.unions = vec![u];
        match ollie_sandbox::run(&policy(), &r) {
            Err(SandboxError::Union { reason, .. }) => reason,
            other => panic!("{:?}", other.map(|o| o.record.exit)),
        }
    };
    let mut u = sc.union();
    u.point = PathBuf::from("/tmp");
    assert!(refused(u).contains("exists in the host's /"));
    let mut u = sc.union();
    u.upper = sc.p("ws");
    assert!(refused(u).contains("writable tree"));
    let mut u = sc.union();
    u.lowers = vec![sc.p("nothing")];
    assert!(refused(u).contains("no lower layer"));
    assert!(!marker.exists());
}

/// A bead's dated folders lie inside the bead; overlayfs refuses nested lower layers (ELOOP),
/// so such runs are merged first. The search order is kept: the newest dated folder, the
/// older one, the member itself, then the next member.
#[test]
fn nested_lower_layers_are_merged_in_search_order() {
    if !features_ok("nested_lower_layers_are_merged_in_search_order") {
        return;
    }
    let sc = Scratch::new("nested");
    for (d, x, only) in [
        ("A/2026-11-30", "new\n", "n"),
        ("A/2026-11-29", "old\n", "o"),
    ] {
        std::fs::create_dir_all(sc.p(d).join("notes")).unwrap();
        std::fs::write(sc.p(d).join("notes/x"), x).unwrap();
        std::fs::write(sc.p(d).join("notes").join(only), only).unwrap();
    }
    std::fs::create_dir_all(sc.p("B/2026-01-01/notes")).unwrap();
    std::fs::write(sc.p("B/2026-01-01/notes/x"), "b-dated\n").unwrap();
    std::fs::write(sc.p("B/2026-01-01/notes/b"), "b").unwrap();
    let before = (sc.tree("A"), sc.tree("B"));
    let mut r = sc.req(
        "cat /ctx/notes/x /ctx/notes/n /ctx/notes/o /ctx/notes/b /ctx/x /ctx/y; \
         echo made > /ctx/notes/made; echo changed > /ctx/notes/x; cat /ctx/notes/x",
        false,
    );
    r.unions = vec![UnionMount {
        point: PathBuf::from(POINT),
        lowers: vec![
            sc.p("A/2026-11-30"),
            sc.p("A/2026-11-29"),
            sc.p("A"),
            sc.p("B/2026-01-01"),
            sc.p("B"),
        ],
        upper: sc.p("U"),
        work: sc.p("W"),
    }];
    let o = ollie_sandbox::run(&policy(), &r).unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.record.exit.code,
        Some(0),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // x from the newest dated folder, n and o from both, b from B's, then A/x and B/y.
    assert_eq!(out, "new\nnoba\nb\nchanged\n");
    // Writes are in the shadow layer only; the members are as they were.
    assert_eq!(
        std::fs::read_to_string(sc.p("U/notes/made")).unwrap(),
        "made\n"
    );
    assert_eq!(
        std::fs::read_to_string(sc.p("U/notes/x")).unwrap(),
        "changed\n"
    );
    assert_eq!((sc.tree("A"), sc.tree("B")), before);
}
