//! Union mounts (`RunRequest::unions`): a bead namespace's union at `/ctx`, a point that does
//! not exist on the host. Reads find the first member that has a name; writes land in the
//! shadow layer (the overlay's upper directory) and never in a member; nothing else becomes
//! writable; the host's `/` is unchanged afterwards.
//!
//! Every test runs twice: as one-shot runs (`ollie_sandbox::run`) and as calls of a prepared
//! sandbox made for the point (`Prepared::new_with_points`), whose calls mount their own
//! overlays.
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead. Run as root and as an
//! unprivileged user (`scripts/test-unprivileged.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_policy::Policy;
use ollie_sandbox::{Prepared, RunOutput, RunRequest, SandboxError, UnionMount};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

mod common;
use common::features_ok;

const POINT: &str = "/ctx";

/// A workspace and two members A and B, a shadow layer U and overlay work dir W, all under
/// one temporary directory.
struct Scratch {
    base: PathBuf,
    mode: Mode,
    /// Prepared sandboxes by their points (prepared mode).
    prepared: Mutex<HashMap<Vec<PathBuf>, Prepared>>,
}

/// How a test's runs are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    OneShot,
    Prepared,
}

/// Runs `$name(mode)` as two tests, `$name::one_shot` and `$name::prepared`.
macro_rules! both_modes {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn one_shot() {
                super::$name(super::Mode::OneShot)
            }
            #[test]
            fn prepared() {
                super::$name(super::Mode::Prepared)
            }
        }
    )*};
}

both_modes!(
    union_reads_members_in_order_and_writes_only_the_shadow_layer,
    union_leaves_everything_else_as_it_was,
    new_root_keeps_the_hosts_top_level_and_mounts,
    unions_are_checked_before_anything_runs,
    nested_lower_layers_are_merged_in_search_order,
    layers_in_a_hidden_directory_stay_hidden,
);

impl Scratch {
    fn new(name: &str, mode: Mode) -> Scratch {
        let base = std::env::temp_dir().join(format!(
            "ollie-unions-{}-{name}-{mode:?}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&base);
        for d in ["ws/.git/hooks", "A", "B", "U", "W"] {
            std::fs::create_dir_all(base.join(d)).unwrap();
        }
        std::fs::write(base.join("A/x"), "a\n").unwrap();
        std::fs::write(base.join("B/x"), "b\n").unwrap();
        std::fs::write(base.join("B/y"), "b\n").unwrap();
        Scratch {
            base: std::fs::canonicalize(&base).unwrap(),
            mode,
            prepared: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `req` in this scratch's mode: one-shot, or in the prepared sandbox for its points
    /// (made on first use, then reused).
    fn exec(&self, req: &RunRequest) -> Result<RunOutput, SandboxError> {
        if self.mode == Mode::OneShot {
            return ollie_sandbox::run(&policy(), req);
        }
        let points: Vec<PathBuf> = req.unions.iter().map(|u| u.point.clone()).collect();
        let mut cache = self.prepared.lock().unwrap();
        if !cache.contains_key(&points) {
            let p = Prepared::new_with_points(
                &policy(),
                &req.workdir,
                &req.home,
                &req.hidden,
                &points,
            )?;
            cache.insert(points.clone(), p);
        }
        cache[&points].run(req)
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }

    /// Makes the directories `rel` (each with its parents) and writes `x` (`contents`) into
    /// those that have contents.
    fn layout(&self, dirs: &[(&str, Option<&str>)]) {
        for (d, x) in dirs {
            std::fs::create_dir_all(self.p(d)).unwrap();
            if let Some(x) = x {
                std::fs::write(self.p(d).join("x"), x).unwrap();
            }
        }
    }

    /// A union at `point` of the one member `lower` over `upper` (work dir `work`).
    fn union_of(&self, point: &str, lower: &str, upper: &str, work: &str) -> UnionMount {
        UnionMount {
            point: PathBuf::from(point),
            lowers: vec![self.p(lower)],
            upper: self.p(upper),
            work: self.p(work),
        }
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
        let o = self.exec(&self.req(script, true)).unwrap();
        assert_eq!(
            o.record.exit.code,
            Some(0),
            "{script}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }

    /// Every entry under `rel` with its contents, sorted.
    fn tree(&self, rel: &str) -> Vec<(String, String)> {
        ollie_testkit::fstree::tree(&self.p(rel))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // The prepared sandboxes (and their calls) end first.
        self.prepared.lock().unwrap().clear();
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

fn union_reads_members_in_order_and_writes_only_the_shadow_layer(mode: Mode) {
    if !features_ok(&format!(
        "union_reads_members_in_order_and_writes_only_the_shadow_layer {mode:?}"
    )) {
        return;
    }
    let sc = Scratch::new("rw", mode);
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

fn union_leaves_everything_else_as_it_was(mode: Mode) {
    if !features_ok(&format!("union_leaves_everything_else_as_it_was {mode:?}")) {
        return;
    }
    let sc = Scratch::new("deny", mode);
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

fn new_root_keeps_the_hosts_top_level_and_mounts(mode: Mode) {
    if !features_ok(&format!(
        "new_root_keeps_the_hosts_top_level_and_mounts {mode:?}"
    )) {
        return;
    }
    let sc = Scratch::new("root", mode);
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
        let o = sc.exec(&sc.req("ls / 2>&1; echo $?", unions)).unwrap();
        String::from_utf8_lossy(&o.stdout).replace(" ", "")
    };
    assert_eq!(ls(true), ls(false));
}

fn unions_are_checked_before_anything_runs(mode: Mode) {
    if !features_ok(&format!("unions_are_checked_before_anything_runs {mode:?}")) {
        return;
    }
    let sc = Scratch::new("refuse", mode);
    let marker = sc.p("ws/ran");
    let script = format!("touch {}", marker.display());
    let refused = |u: UnionMount| {
        let mut r = sc.req(&script, false);
        r.unions = vec![u];
        match sc.exec(&r) {
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
fn nested_lower_layers_are_merged_in_search_order(mode: Mode) {
    if !features_ok(&format!(
        "nested_lower_layers_are_merged_in_search_order {mode:?}"
    )) {
        return;
    }
    let sc = Scratch::new("nested", mode);
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
    let o = sc.exec(&r).unwrap();
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

/// The runner's state directory holds the layers and is hidden from the tool (an empty mode-0
/// tmpfs): the union works, but the layers cannot be reached by their host paths, so a write
/// only lands in the shadow layer through the union.
fn layers_in_a_hidden_directory_stay_hidden(mode: Mode) {
    if !features_ok(&format!(
        "layers_in_a_hidden_directory_stay_hidden {mode:?}"
    )) {
        return;
    }
    let sc = Scratch::new("hidden", mode);
    sc.layout(&[
        ("state/A", Some("a\n")),
        ("state/U", None),
        ("state/W", None),
    ]);
    let state = sc.p("state");
    let member = sc.tree("state/A");
    // Each `try` prints `ok` or `denied`; the other lines print what the tool saw. `stat` is
    // not a Landlock right: only the hiding keeps the layers' names from it.
    let script = format!(
        r#"
try() {{ if ( eval "$1" ) >/dev/null 2>&1; then echo "ok $1"; else echo "denied $1"; fi; }}
echo "x=$(cat /ctx/x)"
try 'echo n > /ctx/new'
echo "ls=[$(ls -A {s} 2>/dev/null)]"
echo "hidden=$(stat -c %a:%F {s})"
try 'ls {s}/A'
try 'cat {s}/A/x'
try 'stat {s}/A'
try 'stat {s}/U'
try 'stat {s}/W'
try 'echo no > {s}/U/direct'
try 'echo no > {s}/A/x'
echo "ctx=[$(ls /ctx | tr '\n' ' ')]"
"#,
        s = state.display()
    );
    let mut r = sc.req(&script, false);
    r.unions = vec![sc.union_of(POINT, "state/A", "state/U", "state/W")];
    r.hidden = vec![state.clone()];
    let o = sc.exec(&r).unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.record.exit.code,
        Some(0),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let verdicts: Vec<&str> = out.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(
        verdicts,
        [
            "x=a",
            "ok",
            "ls=[]",
            "hidden=0:directory",
            "denied",
            "denied",
            "denied",
            "denied",
            "denied",
            "denied",
            "denied",
            "ctx=[new"
        ],
        "{out}"
    );
    assert!(out.ends_with("ctx=[new x ]\n"), "{out}");
    assert!(
        o.record.layers.mounts.hidden.contains(&state),
        "{:?}",
        o.record.layers.mounts.hidden
    );
    // On the host: the member as it was, the shadow layer holding only the union's write.
    assert_eq!(sc.tree("state/A"), member);
    assert_eq!(sc.tree("state/U"), s(&[("new", "n\n")]));
    assert!(std::fs::symlink_metadata(POINT).is_err());
}

/// One prepared sandbox serving two agents, each with its own layers at `/ctx`: a call sees
/// and changes only its own union, one after the other and at the same time.
#[test]
fn one_prepared_sandbox_keeps_each_calls_unions_apart() {
    if !features_ok("one_prepared_sandbox_keeps_each_calls_unions_apart") {
        return;
    }
    let sc = Scratch::new("agents", Mode::Prepared);
    sc.layout(&[
        ("A1", Some("one\n")),
        ("U1", None),
        ("W1", None),
        ("A2", Some("two\n")),
        ("U2", None),
        ("W2", None),
    ]);
    let members = (sc.tree("A1"), sc.tree("A2"));
    let agent = |n: u8| sc.union_of(POINT, &format!("A{n}"), &format!("U{n}"), &format!("W{n}"));
    let req = |n: u8, script: &str| {
        let mut r = sc.req(script, false);
        r.unions = vec![agent(n)];
        r
    };
    let r0 = req(1, "true");
    let prepared = Prepared::new_with_points(
        &policy(),
        &r0.workdir,
        &r0.home,
        &r0.hidden,
        &[PathBuf::from(POINT)],
    )
    .unwrap();
    let call = |n: u8, script: &str| {
        let o = prepared.run(&req(n, script)).unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert_eq!(
            o.record.exit.code,
            Some(0),
            "agent {n}: {script}: {out} {}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    };

    // One after the other.
    assert_eq!(call(1, "echo 1 > /ctx/f && cat /ctx/x /ctx/f"), "one\n1\n");
    let script = format!(
        r#"
try() {{ if ( eval "$1" ) >/dev/null 2>&1; then echo "ok $1"; else echo "denied $1"; fi; }}
cat /ctx/x
ls /ctx
try 'cat /ctx/f'
try 'echo no > {u1}/g'
try 'echo no > {u1}/f'
try 'echo no > {a1}/x'
try 'echo no > {a1}/g'
try 'echo 2 > /ctx/g'
"#,
        u1 = sc.p("U1").display(),
        a1 = sc.p("A1").display(),
    );
    let out = call(2, &script);
    let lines: Vec<&str> = out.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(
        lines,
        [
            "two", "x", "denied", "denied", "denied", "denied", "denied", "ok"
        ],
        "{out}"
    );
    // Agent 1 does not see agent 2's write either.
    assert_eq!(call(1, "ls /ctx; cat /ctx/x"), "f\nx\none\n");
    assert_eq!(sc.tree("U1"), s(&[("f", "1\n")]));
    assert_eq!(sc.tree("U2"), s(&[("g", "2\n")]));
    assert_eq!((sc.tree("A1"), sc.tree("A2")), members);

    // At the same time: call 1 mounts its union and waits for call 2, which mounts its own
    // while call 1's is still there. Each bounded wait gives up after about 30 s (a failure,
    // not a hang).
    let (first, second) = ollie_testkit::fstree::meeting_scripts(
        &sc.p("ws"),
        "cat /ctx/x && echo c1 > /ctx/c",
        "cat /ctx/x && echo c2 > /ctx/c",
    );
    let (out1, out2) = std::thread::scope(|t| {
        let one = t.spawn(|| call(1, &first));
        let two = t.spawn(|| call(2, &second));
        (one.join().unwrap(), two.join().unwrap())
    });
    assert_eq!((out1.as_str(), out2.as_str()), ("one\n", "two\n"));
    assert_eq!(sc.tree("U1"), s(&[("c", "c1\n"), ("f", "1\n")]));
    assert_eq!(sc.tree("U2"), s(&[("c", "c2\n"), ("g", "2\n")]));
    assert_eq!((sc.tree("A1"), sc.tree("A2")), members);
    assert!(std::fs::symlink_metadata(POINT).is_err());
}

/// A prepared sandbox's calls give a union for each of its points and no other; a point that
/// exists in the host's `/` or is not `/NAME` is refused when the sandbox is made.
#[test]
fn prepared_calls_must_give_exactly_the_sessions_points() {
    if !features_ok("prepared_calls_must_give_exactly_the_sessions_points") {
        return;
    }
    let sc = Scratch::new("points", Mode::Prepared);
    sc.layout(&[("U2", None), ("W2", None)]);
    let marker = sc.p("ws/ran");
    let script = format!("touch {}", marker.display());
    let base = sc.req(&script, false);
    let make = |points: &[&str]| {
        let points: Vec<PathBuf> = points.iter().map(PathBuf::from).collect();
        Prepared::new_with_points(&policy(), &base.workdir, &base.home, &base.hidden, &points)
    };
    let prepared = make(&[POINT]).unwrap();
    // Its session record says what is set up once and what each call does.
    let session = prepared.session();
    assert!(
        session
            .set_up_once
            .contains(&"a new root holding the union points")
    );
    assert!(
        session
            .per_call
            .iter()
            .any(|s| s.starts_with("union overlays"))
    );
    let refused = |unions: Vec<UnionMount>| {
        let mut r = sc.req(&script, false);
        r.unions = unions;
        match prepared.run(&r) {
            Err(SandboxError::InvalidRequest { reason }) => reason,
            other => panic!("{:?}", other.map(|o| o.record.exit)),
        }
    };
    let ctx2 = || sc.union_of("/ctx2", "B", "U2", "W2");
    assert!(std::fs::symlink_metadata("/ctx2").is_err());
    let want = "prepared for unions at /ctx;";
    for (unions, gives) in [
        (vec![], "the call gives none"),
        (vec![ctx2()], "the call gives /ctx2"),
        (vec![sc.union(), ctx2()], "the call gives /ctx, /ctx2"),
    ] {
        let reason = refused(unions);
        assert!(reason.contains(want) && reason.contains(gives), "{reason}");
    }
    assert!(!marker.exists());
    assert!(std::fs::symlink_metadata("/ctx2").is_err());
    assert_eq!(sc.tree("U"), Vec::new());
    assert_eq!(sc.tree("U2"), Vec::new());

    for point in ["/tmp", "/a/b"] {
        match make(&[point]) {
            Err(SandboxError::Union { point: p, reason }) => {
                assert_eq!(p, Path::new(point), "{reason}")
            }
            other => panic!("{point}: {other:?}"),
        }
    }
    // The same command with exactly the session's point runs (so the refusals above are why
    // the marker is missing).
    let o = prepared.run(&sc.req(&script, true)).unwrap();
    assert_eq!(o.record.exit.code, Some(0));
    assert!(marker.exists());
}
