//! One test (or more) per rule of seed 002, over real directories in temporary dirs.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::libc;

use crate::*;

struct Fixture {
    tmp: tempfile::TempDir,
    env: Env,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let env = Env {
            registry: Registry::new(tmp.path().join("registry")),
            uid: current_uid(),
            shadow_root: tmp.path().join("state/ns/s1"),
        };
        Fixture { tmp, env }
    }

    /// A bead outside the registry, `<tmp>/beads/NAME/` with an empty `agent.json`; returns its
    /// canonical path (what mount commands name it by).
    fn plain(&self, name: &str) -> PathBuf {
        let dir = self.tmp.path().join("beads").join(name);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("agent.json"), "{}\n").unwrap();
        fs::canonicalize(dir).unwrap()
    }

    fn shadow(&self) -> PathBuf {
        self.env.shadow_root.join("ctx")
    }

    fn run(&self, ns: &mut Namespace, line: &str) -> Result<Outcome, Error> {
        let cmd = Command::parse(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        ns.execute(&self.env, &cmd)
    }

    fn ok(&self, ns: &mut Namespace, line: &str) -> Outcome {
        self.run(ns, line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }
}

fn put(dir: &Path, rel: &str, content: &str) {
    let p = dir.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
}

fn read(r: &Resolved) -> String {
    fs::read_to_string(&r.path).unwrap()
}

fn names(ns: &Namespace, point: &str) -> Vec<String> {
    ns.point(point)
        .map(|p| p.members().iter().map(|m| m.name().to_string()).collect())
        .unwrap_or_default()
}

fn layer_name(l: &Layer) -> String {
    match l {
        Layer::Shadow => "shadow".into(),
        Layer::Member { name, .. } => name.clone(),
    }
}

fn uri(p: &Path) -> String {
    file_uri(p)
}

/// Prints past the test harness's capture, so the skip shows in every run.
fn skip(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn is_root() -> bool {
    current_uid() == 0
}

// ---- registry: start -------------------------------------------------------------------------

#[test]
fn start_creates_the_bead_layout_privately() {
    let fx = Fixture::new();
    let bead = fx.env.registry.start(Some("plan9-beads")).unwrap();
    let dir = bead.dir();
    let uuid = dir.file_name().unwrap().to_str().unwrap().to_string();
    assert!(is_uuid(&uuid), "{uuid}");
    assert_eq!(
        dir.parent().unwrap(),
        fs::canonicalize(fx.env.registry.root()).unwrap()
    );
    assert_eq!(bead.uri(), format!("file://{}/", dir.display()));
    let today = utc_today();
    for d in [
        dir.to_path_buf(),
        dir.join(&today),
        dir.join(&today).join("notes"),
        dir.join(&today).join("skills"),
        dir.join(&today).join("artifacts"),
    ] {
        let md = fs::metadata(&d).unwrap();
        assert!(md.is_dir(), "{}", d.display());
        assert_eq!(md.permissions().mode() & 0o777, 0o700, "{}", d.display());
    }
    for f in ["about.md", "agent.json", "names.json"] {
        let md = fs::symlink_metadata(dir.join(f)).unwrap();
        assert!(md.is_file());
        assert_eq!(md.permissions().mode() & 0o777, 0o600, "{f}");
    }
    let info = bead.info().unwrap();
    assert_eq!(info.uuid.as_deref(), Some(uuid.as_str()));
    assert_eq!(info.slug.as_deref(), Some("plan9-beads"));
    assert_eq!(info.owner, Some(current_uid()));
    assert!(info.created.unwrap().starts_with(&today));
    let about = fs::read_to_string(dir.join("about.md")).unwrap();
    assert!(about.starts_with("# plan9-beads\n"), "{about}");
    assert!(about.contains(&format!("created: {today}")), "{about}");
    assert_eq!(bead.names().unwrap().get("plan9-beads"), Some(&bead.uri()));
    // No temporary directory is left in the registry.
    let entries: Vec<_> = fs::read_dir(fx.env.registry.root()).unwrap().collect();
    assert_eq!(entries.len(), 1);

    let untitled = fx.env.registry.start(None).unwrap();
    let about = fs::read_to_string(untitled.dir().join("about.md")).unwrap();
    assert!(about.starts_with("# untitled\n"));
    assert!(untitled.names().unwrap().is_empty());
    assert_eq!(untitled.info().unwrap().slug, None);
    assert_eq!(fx.env.registry.beads().unwrap().len(), 2);
}

#[test]
fn start_refuses_bad_and_taken_slugs() {
    let fx = Fixture::new();
    for bad in ["", "Upper", ".hidden", "-x", "a/b", &"x".repeat(65)] {
        let e = fx.env.registry.start(Some(bad)).unwrap_err();
        assert!(matches!(e, Error::InvalidSlug { .. }), "{bad:?}: {e}");
    }
    assert!(fx.env.registry.beads().unwrap().is_empty());
    let first = fx.env.registry.start(Some("taken")).unwrap();
    let e = fx.env.registry.start(Some("taken")).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "slug \"taken\" is already used by bead {}: file already exists",
            first.uri()
        )
    );
    assert_eq!(e.errno(), libc::EEXIST);
    assert_eq!(fx.env.registry.beads().unwrap().len(), 1);
}

#[test]
fn start_opens_once_then_records_the_slug() {
    let fx = Fixture::new();
    let mut ns = Namespace::new("s1");
    let Outcome::Started { uri } = fx.ok(&mut ns, "start") else {
        panic!()
    };
    let bead = ns.started().unwrap().clone();
    assert_eq!(uri, bead.uri());
    // Already open: no new bead, the slug is recorded in the open one.
    let Outcome::Started { uri: again } = fx.ok(&mut ns, "bead-start sensor-fusion-notes") else {
        panic!()
    };
    assert_eq!(again, uri);
    assert_eq!(fx.env.registry.beads().unwrap().len(), 1);
    assert_eq!(
        bead.info().unwrap().slug.as_deref(),
        Some("sensor-fusion-notes")
    );
    assert_eq!(bead.names().unwrap().get("sensor-fusion-notes"), Some(&uri));
    let about = fs::read_to_string(bead.dir().join("about.md")).unwrap();
    assert!(
        about.starts_with("# sensor-fusion-notes\n\ncreated: "),
        "{about}"
    );
    // The recorded slug is a short name now.
    fx.ok(&mut ns, "mount -ac sensor-fusion-notes /ctx");
    assert_eq!(names(&ns, "/ctx"), ["sensor-fusion-notes"]);
    // The same name again is fine; another name does not rename the open bead: it says so,
    // and nothing changes.
    fx.ok(&mut ns, "start sensor-fusion-notes");
    let table = ns.table();
    let e = fx.run(&mut ns, "start other-name").unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "a bead is already open here: {uri} (slug \"sensor-fusion-notes\"); start other-name would rename it, so nothing changed (start alone prints the open bead)"
        )
    );
    assert_eq!(e.errno(), libc::EEXIST);
    assert_eq!(
        bead.info().unwrap().slug.as_deref(),
        Some("sensor-fusion-notes")
    );
    assert!(!bead.names().unwrap().contains_key("other-name"));
    assert_eq!(ns.table(), table);
    assert_eq!(fx.env.registry.beads().unwrap().len(), 1);
}

// ---- mount order -----------------------------------------------------------------------------

#[test]
fn mount_before_and_after_set_the_search_order() {
    let fx = Fixture::new();
    let (a, b, c) = (fx.plain("A"), fx.plain("B"), fx.plain("C"));
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount {} /ctx", a.display()));
    fx.ok(&mut ns, &format!("mount -b {} /ctx", b.display()));
    fx.ok(&mut ns, &format!("mount -a {} /ctx", c.display()));
    assert_eq!(names(&ns, "/ctx"), ["B", "A", "C"]);
    let d = fx.plain("D");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", d.display()));
    assert_eq!(names(&ns, "/ctx"), ["D", "B", "A", "C"]);
}

#[test]
fn mount_without_flags_replaces_the_point() {
    let fx = Fixture::new();
    let (a, b, c) = (fx.plain("A"), fx.plain("B"), fx.plain("C"));
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    fx.ok(&mut ns, &format!("mount -ac {} /ctx", b.display()));
    fx.ok(&mut ns, &format!("mount {} /other", a.display()));
    fx.ok(&mut ns, &format!("mount {} /ctx", c.display()));
    assert_eq!(names(&ns, "/ctx"), ["C"]);
    assert!(ns.point("/ctx").unwrap().create_target().is_none());
    // Other points are untouched.
    assert_eq!(names(&ns, "/other"), ["A"]);
}

#[test]
fn mounting_a_member_again_moves_it() {
    let fx = Fixture::new();
    let (a, b) = (fx.plain("A"), fx.plain("B"));
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -a {} /ctx", a.display()));
    fx.ok(&mut ns, &format!("mount -a {} /ctx", b.display()));
    fx.ok(&mut ns, &format!("mount -b {} /ctx", b.display()));
    assert_eq!(names(&ns, "/ctx"), ["B", "A"]);
    fx.ok(&mut ns, &format!("mount -ac {} /ctx", b.display()));
    assert_eq!(names(&ns, "/ctx"), ["A", "B"]);
    assert_eq!(
        ns.point("/ctx").unwrap().create_target().unwrap().1.name(),
        "B"
    );
    // Mounting it again without -c drops its create bit.
    fx.ok(&mut ns, &format!("mount -a {} /ctx", b.display()));
    assert!(ns.point("/ctx").unwrap().create_target().is_none());
}

#[test]
fn distinct_beads_with_one_name_get_unique_names() {
    let fx = Fixture::new();
    let a1 = fx.plain("A");
    let a2 = fx.tmp.path().join("elsewhere/A");
    fs::create_dir_all(&a2).unwrap();
    fs::write(a2.join("agent.json"), "{}").unwrap();
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -a {} /ctx", a1.display()));
    let Outcome::Mounted(r) = fx.ok(&mut ns, &format!("mount -a {} /ctx", a2.display())) else {
        panic!()
    };
    assert_eq!(r.name, "A-2");
    assert_eq!(names(&ns, "/ctx"), ["A", "A-2"]);
}

// ---- reads -----------------------------------------------------------------------------------

#[test]
fn first_hit_wins_in_search_order() {
    let fx = Fixture::new();
    let (a, b, c) = (fx.plain("A"), fx.plain("B"), fx.plain("C"));
    put(&a, "notes/x.md", "from A");
    put(&b, "notes/x.md", "from B");
    put(&c, "notes/x.md", "from C");
    put(&a, "readme", "A readme");
    put(&c, "readme", "C readme");
    put(&c, "only-c", "C only");
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    fx.ok(&mut ns, &format!("mount -a {} /ctx", b.display()));
    fx.ok(&mut ns, &format!("mount -a {} /ctx", c.display()));
    let r = ns.lookup(&fx.env, "/ctx", "notes/x.md").unwrap().unwrap();
    assert_eq!(read(&r), "from A");
    assert_eq!(layer_name(&r.layer), "A");
    assert_eq!(
        read(&ns.lookup(&fx.env, "/ctx", "readme").unwrap().unwrap()),
        "A readme"
    );
    assert_eq!(
        read(&ns.lookup(&fx.env, "/ctx", "only-c").unwrap().unwrap()),
        "C only"
    );
    assert_eq!(ns.lookup(&fx.env, "/ctx", "absent").unwrap(), None);
    // -b puts B first: B's copy wins now.
    fx.ok(&mut ns, &format!("mount -b {} /ctx", b.display()));
    assert_eq!(
        read(&ns.lookup(&fx.env, "/ctx", "notes/x.md").unwrap().unwrap()),
        "from B"
    );
}

#[test]
fn the_chats_own_files_shadow_every_member() {
    let fx = Fixture::new();
    let a = fx.plain("A");
    put(&a, "notes/x.md", "from A");
    put(&a, "top.txt", "from A");
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    put(&fx.shadow(), "notes/x.md", "mine");
    put(&fx.shadow(), "top.txt", "mine");
    for rel in ["notes/x.md", "top.txt"] {
        let r = ns.lookup(&fx.env, "/ctx", rel).unwrap().unwrap();
        assert_eq!(r.layer, Layer::Shadow, "{rel}");
        assert_eq!(read(&r), "mine");
    }
}

#[test]
fn dated_kind_folders_merge_newest_first() {
    let fx = Fixture::new();
    let c = fx.plain("C");
    put(&c, "2026-01-01/notes/x.md", "old");
    put(&c, "2026-02-01/notes/x.md", "new");
    put(&c, "notes/x.md", "plain");
    put(&c, "notes/only-plain.md", "p");
    put(&c, "2026-01-01/notes/only-old.md", "o");
    put(&c, "2026-01-01/artifacts/a.md", "a");
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount {} /ctx", c.display()));
    assert_eq!(
        read(&ns.lookup(&fx.env, "/ctx", "notes/x.md").unwrap().unwrap()),
        "new"
    );
    let notes: Vec<String> = ns
        .read_dir(&fx.env, "/ctx", "notes")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(notes, ["only-old.md", "only-plain.md", "x.md"]);
    let top: Vec<String> = ns
        .read_dir(&fx.env, "/ctx", "")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(
        top,
        [
            "2026-01-01",
            "2026-02-01",
            "agent.json",
            "artifacts",
            "notes",
            "skills"
        ]
    );
    // The dated folders themselves stay reachable as they are.
    assert_eq!(
        read(
            &ns.lookup(&fx.env, "/ctx", "2026-01-01/notes/x.md")
                .unwrap()
                .unwrap()
        ),
        "old"
    );
}

#[test]
fn listing_is_the_union_with_shadowing() {
    let fx = Fixture::new();
    let (a, b, c) = (fx.plain("A"), fx.plain("B"), fx.plain("C"));
    put(&fx.shadow(), "same.txt", "shadow");
    put(&fx.shadow(), "notes/s.md", "s");
    put(&fx.shadow(), "blocker", "a file");
    put(&a, "same.txt", "A");
    put(&a, "notes/a.md", "a");
    put(&a, "dir/a1", "a1");
    put(&a, "blocker/inner", "hidden");
    put(&a, "d2/a", "a");
    put(&b, "dir/b1", "b1");
    put(&b, "d2", "b's d2 is a file");
    put(&c, "d2/c", "c");
    put(&c, "2026-03-01/skills/k.md", "k");
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -a {} /ctx", a.display()));
    fx.ok(&mut ns, &format!("mount -a {} /ctx", b.display()));
    fx.ok(&mut ns, &format!("mount -a {} /ctx", c.display()));
    let top = ns.read_dir(&fx.env, "/ctx", "").unwrap();
    let got: Vec<(String, NodeKind, String)> = top
        .iter()
        .map(|e| (e.name.clone(), e.node, layer_name(&e.layer)))
        .collect();
    let want: Vec<(String, NodeKind, String)> = [
        ("2026-03-01", NodeKind::Dir, "C"),
        ("agent.json", NodeKind::File, "A"),
        ("artifacts", NodeKind::Dir, "shadow"),
        ("blocker", NodeKind::File, "shadow"),
        ("d2", NodeKind::Dir, "A"),
        ("dir", NodeKind::Dir, "A"),
        ("notes", NodeKind::Dir, "shadow"),
        ("same.txt", NodeKind::File, "shadow"),
        ("skills", NodeKind::Dir, "shadow"),
    ]
    .into_iter()
    .map(|(n, k, l)| (n.to_string(), k, l.to_string()))
    .collect();
    assert_eq!(got, want);
    let list = |rel: &str| -> Vec<String> {
        ns.read_dir(&fx.env, "/ctx", rel)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect()
    };
    // Directories merge across layers.
    assert_eq!(list("dir"), ["a1", "b1"]);
    assert_eq!(list("notes"), ["a.md", "s.md"]);
    assert_eq!(list("skills"), ["k.md"]);
    // A later directory merges only when the winner is a directory: B's file `d2` is skipped
    // (A's directory won), C's directory `d2` merges.
    assert_eq!(list("d2"), ["a", "c"]);
    // The shadow's file `blocker` hides A's directory entirely.
    let e = ns.read_dir(&fx.env, "/ctx", "blocker").unwrap_err();
    assert_eq!(e.errno(), libc::ENOTDIR);
    let e = ns.lookup(&fx.env, "/ctx", "blocker/inner").unwrap_err();
    assert!(matches!(e, Error::NotDir { .. }), "{e}");
    // Listing a file is ENOTDIR.
    assert_eq!(
        ns.read_dir(&fx.env, "/ctx", "same.txt")
            .unwrap_err()
            .errno(),
        libc::ENOTDIR
    );
}

// ---- creates ---------------------------------------------------------------------------------

#[test]
fn creates_land_in_the_create_targets_dated_kind_folder() {
    let fx = Fixture::new();
    let (a, c) = (fx.plain("A"), fx.plain("C"));
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    fx.ok(&mut ns, &format!("mount -ac {} /ctx", c.display()));
    let today = utc_today();
    for kind in ["notes", "skills", "artifacts"] {
        let rel = format!("{kind}/new.md");
        let r = ns.create(&fx.env, "/ctx", &rel, NodeKind::File).unwrap();
        assert_eq!(r.path, c.join(&today).join(kind).join("new.md"));
        assert!(matches!(&r.layer, Layer::Member { name, create: true, .. } if name == "C"));
        let md = fs::metadata(&r.path).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, 0o600);
        fs::write(&r.path, "hello").unwrap();
        assert_eq!(
            read(&ns.lookup(&fx.env, "/ctx", &rel).unwrap().unwrap()),
            "hello"
        );
    }
    // Subdirectories of a kind folder are created in the target as well.
    ns.create(&fx.env, "/ctx", "notes/sub", NodeKind::Dir)
        .unwrap();
    let r = ns
        .create(&fx.env, "/ctx", "notes/sub/deep.md", NodeKind::File)
        .unwrap();
    assert_eq!(r.path, c.join(&today).join("notes/sub/deep.md"));
    // Creating an existing name is EEXIST; a missing parent is ENOENT.
    let e = ns
        .create(&fx.env, "/ctx", "notes/new.md", NodeKind::File)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EEXIST);
    let e = ns
        .create(&fx.env, "/ctx", "notes/nope/x.md", NodeKind::File)
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENOENT, "{e}");
    // Nothing was written into the read-only member.
    assert!(!a.join(&today).exists());
}

#[test]
fn creates_outside_kind_folders_go_to_the_shadow_layer() {
    let fx = Fixture::new();
    let c = fx.plain("C");
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -c {} /ctx", c.display()));
    let r = ns
        .create(&fx.env, "/ctx", "scratch.txt", NodeKind::File)
        .unwrap();
    assert_eq!(r.layer, Layer::Shadow);
    assert_eq!(
        r.path,
        fs::canonicalize(fx.shadow()).unwrap().join("scratch.txt")
    );
    let r = ns.create(&fx.env, "/ctx", "work", NodeKind::Dir).unwrap();
    assert_eq!(r.layer, Layer::Shadow);
    assert_eq!(
        fs::metadata(&r.path).unwrap().permissions().mode() & 0o777,
        0o700
    );
}

#[test]
fn without_a_create_target_files_shadow_locally_then_move_when_one_is_pinned() {
    let fx = Fixture::new();
    let (a, c) = (fx.plain("A"), fx.plain("C"));
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    let r = ns
        .create(&fx.env, "/ctx", "notes/draft.md", NodeKind::File)
        .unwrap();
    let shadow = fs::canonicalize(fx.shadow()).unwrap();
    assert_eq!(r.path, shadow.join("notes/draft.md"));
    fs::write(&r.path, "draft").unwrap();
    ns.create(&fx.env, "/ctx", "artifacts/sub", NodeKind::Dir)
        .unwrap();
    let r = ns
        .create(&fx.env, "/ctx", "artifacts/sub/deep.md", NodeKind::File)
        .unwrap();
    assert_eq!(r.layer, Layer::Shadow);
    let loose = ns
        .create(&fx.env, "/ctx", "loose.txt", NodeKind::File)
        .unwrap();

    let Outcome::Mounted(report) = fx.ok(&mut ns, &format!("mount -ac {} /ctx", c.display()))
    else {
        panic!()
    };
    let today = utc_today();
    let settled = report.settled.unwrap();
    let moved: Vec<(&str, PathBuf)> = settled
        .moved
        .iter()
        .map(|m| (m.rel.as_str(), m.to.clone()))
        .collect();
    assert_eq!(
        moved,
        [
            ("notes/draft.md", c.join(&today).join("notes/draft.md")),
            (
                "artifacts/sub/deep.md",
                c.join(&today).join("artifacts/sub/deep.md")
            ),
        ]
    );
    assert!(settled.kept.is_empty(), "{:?}", settled.kept);
    assert_eq!(
        fs::read_to_string(c.join(&today).join("notes/draft.md")).unwrap(),
        "draft"
    );
    assert!(!shadow.join("notes/draft.md").exists());
    assert!(
        !shadow.join("artifacts/sub").exists(),
        "emptied directories are removed"
    );
    // Files outside the kind folders stay in the shadow layer.
    assert!(loose.path.exists());
    let r = ns
        .lookup(&fx.env, "/ctx", "notes/draft.md")
        .unwrap()
        .unwrap();
    assert!(matches!(&r.layer, Layer::Member { name, .. } if name == "C"));
    // From now on, creates land in the target directly.
    let r = ns
        .create(&fx.env, "/ctx", "notes/next.md", NodeKind::File)
        .unwrap();
    assert_eq!(r.path, c.join(&today).join("notes/next.md"));
}

#[test]
fn pinning_keeps_files_that_an_earlier_member_would_hide() {
    let fx = Fixture::new();
    let (a, c) = (fx.plain("A"), fx.plain("C"));
    put(&a, "notes/clash.md", "A's");
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    put(&fx.shadow(), "notes/clash.md", "mine");
    put(&fx.shadow(), "notes/free.md", "mine too");
    let Outcome::Mounted(report) = fx.ok(&mut ns, &format!("mount -ac {} /ctx", c.display()))
    else {
        panic!()
    };
    let settled = report.settled.unwrap();
    assert_eq!(settled.moved.len(), 1);
    assert_eq!(settled.moved[0].rel, "notes/free.md");
    assert_eq!(settled.kept.len(), 1);
    assert_eq!(settled.kept[0].rel, "notes/clash.md");
    assert_eq!(
        settled.kept[0].reason,
        "moving it would hide it behind bead A"
    );
    // The shadow copy still wins.
    assert_eq!(
        read(
            &ns.lookup(&fx.env, "/ctx", "notes/clash.md")
                .unwrap()
                .unwrap()
        ),
        "mine"
    );
    let reply = Outcome::Mounted(MountReport {
        settled: Some(settled),
        ..report
    })
    .reply();
    assert!(
        reply.contains(
            "kept notes/clash.md in the shadow layer: moving it would hide it behind bead A\n"
        ),
        "{reply}"
    );
}

// ---- the create bit --------------------------------------------------------------------------

#[test]
fn at_most_one_create_target_per_point_and_the_error_names_the_first() {
    let fx = Fixture::new();
    let (b, c) = (fx.plain("B"), fx.plain("C"));
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -ac {} /ctx", c.display()));
    let before = ns.clone();
    let e = fx
        .run(&mut ns, &format!("mount -bc {} /ctx", b.display()))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "/ctx already has a create target: C ({}); mount without -c, or unmount C first",
            uri(&c)
        )
    );
    assert_eq!(e.errno(), libc::EBUSY);
    assert_eq!(ns, before, "a failed mount changes nothing");
    // Without -c the same bead mounts fine; another point may have its own -c.
    fx.ok(&mut ns, &format!("mount -b {} /ctx", b.display()));
    fx.ok(&mut ns, &format!("mount -c {} /other", b.display()));
    // Replacing the point drops the old create target, so -c is fine then.
    fx.ok(&mut ns, &format!("mount -c {} /ctx", b.display()));
    assert_eq!(
        ns.point("/ctx").unwrap().create_target().unwrap().1.name(),
        "B"
    );
}

#[test]
fn create_bit_is_refused_on_a_bead_owned_by_another_uid() {
    if !is_root() {
        skip("SKIP create_bit_is_refused_on_a_bead_owned_by_another_uid: needs root to chown");
        return;
    }
    let fx = Fixture::new();
    let other = fx.plain("other");
    std::os::unix::fs::chown(&other, Some(65534), Some(65534)).unwrap();
    let mut ns = Namespace::new("s1");
    let e = fx
        .run(&mut ns, &format!("mount -ac {} /ctx", other.display()))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "permission denied: no write authority over bead {}: the bead is owned by uid 65534, not uid 0, and it has no delegations.json",
            uri(&other)
        )
    );
    assert_eq!(e.errno(), libc::EACCES);
    assert!(ns.points().is_empty());
    // Read-only is fine.
    fx.ok(&mut ns, &format!("mount -a {} /ctx", other.display()));
    // A delegation from the owner makes it writable for root too.
    let d = other.join(DELEGATIONS_FILE);
    fs::write(
        &d,
        r#"[{"uid": 0, "write_paths": ["notes/", "skills/", "artifacts/"]}]"#,
    )
    .unwrap();
    std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
    fx.ok(&mut ns, &format!("mount -ac {} /ctx", other.display()));
}

#[test]
fn create_bit_is_refused_for_a_caller_without_authority() {
    let mut fx = Fixture::new();
    let c = fx.plain("C");
    fx.env.uid = current_uid().wrapping_add(4242);
    let mut ns = Namespace::new("s1");
    let e = fx
        .run(&mut ns, &format!("mount -ac {} /ctx", c.display()))
        .unwrap_err();
    assert!(matches!(e, Error::NoWriteAuthority { .. }), "{e}");
    assert!(e.to_string().contains(&uri(&c)), "{e}");
    assert!(ns.points().is_empty());
    fx.ok(&mut ns, &format!("mount -a {} /ctx", c.display()));
    assert!(ns.point("/ctx").unwrap().create_target().is_none());
    // With no create target, kind files shadow locally instead.
    let r = ns
        .create(&fx.env, "/ctx", "notes/x.md", NodeKind::File)
        .unwrap();
    assert_eq!(r.layer, Layer::Shadow);
}

#[test]
fn a_delegation_allows_the_create_bit_for_the_kinds_it_lists() {
    let mut fx = Fixture::new();
    let c = fx.plain("C");
    let caller = current_uid().wrapping_add(4242);
    fx.env.uid = caller;
    fs::set_permissions(&c, fs::Permissions::from_mode(0o700)).unwrap();
    let d = c.join(DELEGATIONS_FILE);
    fs::write(
        &d,
        format!(r#"[{{"uid": {caller}, "write_paths": ["notes/"]}}]"#),
    )
    .unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o600)).unwrap();
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -ac {} /ctx", c.display()));
    let r = ns
        .create(&fx.env, "/ctx", "notes/x.md", NodeKind::File)
        .unwrap();
    assert_eq!(r.path, c.join(utc_today()).join("notes/x.md"));
    let e = ns
        .create(&fx.env, "/ctx", "artifacts/y.md", NodeKind::File)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "permission denied: no write authority over bead {}: artifacts/ is not delegated to uid {caller}",
            uri(&c)
        )
    );
    // Authority is checked again on every write: revoking the delegation stops creates.
    fs::remove_file(&d).unwrap();
    let e = ns
        .create(&fx.env, "/ctx", "notes/z.md", NodeKind::File)
        .unwrap_err();
    assert!(matches!(e, Error::NoWriteAuthority { .. }), "{e}");
    // And an existing file is no longer written in place: it is copied up.
    let w = ns.open_write(&fx.env, "/ctx", "notes/x.md").unwrap();
    assert_eq!(w.layer, Layer::Shadow);
}

#[test]
fn an_untrusted_delegation_file_grants_nothing() {
    let mut fx = Fixture::new();
    let c = fx.plain("C");
    let caller = current_uid().wrapping_add(4242);
    fx.env.uid = caller;
    let d = c.join(DELEGATIONS_FILE);
    fs::write(
        &d,
        format!(r#"[{{"uid": {caller}, "write_paths": ["notes/"]}}]"#),
    )
    .unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o666)).unwrap();
    let mut ns = Namespace::new("s1");
    let e = fx
        .run(&mut ns, &format!("mount -ac {} /ctx", c.display()))
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "delegations.json is not trusted: it is writable by group or others (mode 0666)"
        ),
        "{e}"
    );
    // A symlinked delegation file is not trusted either.
    fs::remove_file(&d).unwrap();
    let real = fx.tmp.path().join("deleg.json");
    fs::write(
        &real,
        format!(r#"[{{"uid": {caller}, "write_paths": ["notes/"]}}]"#),
    )
    .unwrap();
    std::os::unix::fs::symlink(&real, &d).unwrap();
    let e = fx
        .run(&mut ns, &format!("mount -ac {} /ctx", c.display()))
        .unwrap_err();
    assert!(e.to_string().contains("it is not a regular file"), "{e}");
    // A group-writable bead directory makes any delegation file untrusted.
    fs::remove_file(&d).unwrap();
    fs::write(
        &d,
        format!(r#"[{{"uid": {caller}, "write_paths": ["notes/"]}}]"#),
    )
    .unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(&c, fs::Permissions::from_mode(0o770)).unwrap();
    let e = fx
        .run(&mut ns, &format!("mount -ac {} /ctx", c.display()))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("the bead directory is writable by group or others"),
        "{e}"
    );
    assert!(ns.points().is_empty());
}

// ---- unmount ---------------------------------------------------------------------------------

#[test]
fn unmount_removes_one_member_or_the_whole_point() {
    let fx = Fixture::new();
    let (a, b, c) = (fx.plain("A"), fx.plain("B"), fx.plain("C"));
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    fx.ok(&mut ns, &format!("mount -a {} /ctx", b.display()));
    fx.ok(&mut ns, &format!("mount -ac {} /ctx", c.display()));
    fx.ok(&mut ns, &format!("mount {} /other", a.display()));
    let Outcome::Unmounted { point, removed } = fx.ok(&mut ns, "bead-unmount B /ctx") else {
        panic!()
    };
    assert_eq!((point.as_str(), removed), ("/ctx", vec!["B".to_string()]));
    assert_eq!(names(&ns, "/ctx"), ["A", "C"]);
    // By URI as well.
    fx.ok(&mut ns, &format!("unmount {} /ctx", uri(&a)));
    assert_eq!(names(&ns, "/ctx"), ["C"]);
    // Errors name what is wrong and change nothing.
    let before = ns.clone();
    let e = fx.run(&mut ns, "unmount B /ctx").unwrap_err();
    assert_eq!(
        e.to_string(),
        "\"B\" is not mounted at /ctx (members: C): file does not exist"
    );
    let e = fx.run(&mut ns, "unmount /nope").unwrap_err();
    assert_eq!(
        e.to_string(),
        "nothing is mounted at /nope: file does not exist"
    );
    assert_eq!(e.errno(), libc::ENOENT);
    assert_eq!(ns, before);
    // The whole point.
    let Outcome::Unmounted { removed, .. } = fx.ok(&mut ns, "unmount /ctx") else {
        panic!()
    };
    assert_eq!(removed, ["C"]);
    assert!(ns.point("/ctx").is_none());
    assert_eq!(names(&ns, "/other"), ["A"]);
    // Unmounting the last member removes the point too.
    fx.ok(&mut ns, "unmount A /other");
    assert!(ns.points().is_empty());
    assert_eq!(ns.table(), "");
}

// ---- ns --------------------------------------------------------------------------------------

#[test]
fn ns_prints_the_seeds_table_format_byte_for_byte() {
    let fx = Fixture::new();
    let (a, b, c) = (fx.plain("A"), fx.plain("B"), fx.plain("C"));
    let mut ns = Namespace::new("s1");
    fx.ok(
        &mut ns,
        &format!("bead-mount -b {}/ /ctx", uri(&a).trim_end_matches('/')),
    );
    fx.ok(&mut ns, &format!("bead-mount -a {} /ctx", b.display()));
    fx.ok(&mut ns, &format!("bead-mount -ac {} /ctx", uri(&c)));
    let want = format!(
        "/ctx (union)\n  [1] A {} read\n  [2] B {} read\n  [3] C {} read,create*\n",
        uri(&a),
        uri(&b),
        uri(&c)
    );
    let Outcome::Table(table) = fx.ok(&mut ns, "bead-ns") else {
        panic!()
    };
    assert_eq!(table, want);
    assert_eq!(uri(&a), format!("file://{}/", a.display()));
    fx.ok(&mut ns, &format!("mount {} /work", b.display()));
    assert_eq!(
        ns.table(),
        format!("{want}/work (union)\n  [1] B {} read\n", uri(&b))
    );
}

// ---- rfork -----------------------------------------------------------------------------------

#[test]
fn rfork_isolates_the_copy_from_the_original() {
    let fx = Fixture::new();
    let (a, b, c) = (fx.plain("A"), fx.plain("B"), fx.plain("C"));
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    assert_eq!(fx.ok(&mut ns, "bead-rfork"), Outcome::Rfork);
    let original = ns.clone();
    let mut fork = ns.rfork();
    fork.set_session("s1/agent-2");
    fx.ok(&mut fork, &format!("mount -ac {} /ctx", b.display()));
    fx.ok(&mut fork, &format!("mount {} /mine", c.display()));
    assert_eq!(ns, original);
    assert_eq!(names(&ns, "/ctx"), ["A"]);
    assert!(ns.point("/mine").is_none());
    fx.ok(&mut ns, "unmount /ctx");
    assert_eq!(names(&fork, "/ctx"), ["A", "B"]);
    assert_eq!(fork.session(), "s1/agent-2");
    assert_eq!(ns.session(), "s1");
}

// ---- the session namespace file --------------------------------------------------------------

#[test]
fn namespace_file_round_trips_and_replays() {
    let fx = Fixture::new();
    let (a, b, c) = (fx.plain("A"), fx.plain("B"), fx.plain("C"));
    let mut ns = Namespace::new("chat-42");
    fx.ok(&mut ns, "start design");
    // A history whose flags alone would not replay: B replaced, then A put before it.
    fx.ok(&mut ns, &format!("mount {} /ctx", b.display()));
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    fx.ok(&mut ns, &format!("mount -ac {} /ctx", c.display()));
    fx.ok(&mut ns, "mount -c design /work");
    let json = ns.to_json();
    let started = ns.started().unwrap().uri();
    let want = format!(
        r#"{{
  "profile": "acequia/session-namespace",
  "session": "chat-42",
  "mounts": [
    {{ "bead": "{ua}", "point": "/ctx", "order": "before", "create": false, "name": "A" }},
    {{ "bead": "{ub}", "point": "/ctx", "order": "after", "create": false, "name": "B" }},
    {{ "bead": "{uc}", "point": "/ctx", "order": "after", "create": true, "name": "C" }},
    {{ "bead": "{started}", "point": "/work", "order": "replace", "create": true, "name": "design" }}
  ],
  "started": "{started}"
}}
"#,
        ua = uri(&a),
        ub = uri(&b),
        uc = uri(&c),
    );
    assert_eq!(json, want);
    let replayed = Namespace::from_json(&json).unwrap();
    assert_eq!(replayed, ns);
    assert_eq!(replayed.to_json(), json);
    assert_eq!(replayed.table(), ns.table());
    // save/load.
    let path = fx.tmp.path().join("state/ns.json");
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    ns.save(&path).unwrap();
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(Namespace::load(&path).unwrap(), ns);
    // A replayed namespace keeps working: the open bead is still open.
    let mut replayed = replayed;
    let Outcome::Started { uri: again } = fx.ok(&mut replayed, "start") else {
        panic!()
    };
    assert_eq!(again, started);
    // The empty namespace.
    let empty = Namespace::new("e");
    assert_eq!(
        empty.to_json(),
        "{\n  \"profile\": \"acequia/session-namespace\",\n  \"session\": \"e\",\n  \"mounts\": []\n}\n"
    );
    assert_eq!(Namespace::from_json(&empty.to_json()).unwrap(), empty);
}

#[test]
fn the_seeds_example_file_replays() {
    let fx = Fixture::new();
    let (a, b, c) = (fx.plain("A"), fx.plain("B"), fx.plain("C"));
    let text = format!(
        r#"{{ "profile": "acequia/session-namespace", "session": "chat-1", "mounts": [
  {{ "bead": "{}", "point": "/ctx", "order": "before", "create": false, "name": "A" }},
  {{ "bead": "{}", "point": "/ctx", "order": "after", "create": false, "name": "B" }},
  {{ "bead": "{}", "point": "/ctx", "order": "after", "create": true, "name": "C" }} ] }}"#,
        uri(&a),
        uri(&b),
        uri(&c)
    );
    let ns = Namespace::from_json(&text).unwrap();
    assert_eq!(
        ns.table(),
        format!(
            "/ctx (union)\n  [1] A {} read\n  [2] B {} read\n  [3] C {} read,create*\n",
            uri(&a),
            uri(&b),
            uri(&c)
        )
    );
    // Replayed members are usable for lookups.
    put(&b, "notes/n.md", "B");
    assert_eq!(
        read(&ns.lookup(&fx.env, "/ctx", "notes/n.md").unwrap().unwrap()),
        "B"
    );
}

#[test]
fn namespace_file_parsing_is_strict() {
    let m = |extra: &str| {
        format!(r#"{{"profile":"acequia/session-namespace","session":"s","mounts":[{extra}]}}"#)
    };
    let good =
        r#"{"bead":"file:///b/A/","point":"/ctx","order":"before","create":false,"name":"A"}"#;
    Namespace::from_json(&m(good)).unwrap();
    let cases = [
        (
            r#"{"profile":"acequia/session-namespace","session":"s","mounts":[],"colour":1}"#.to_string(),
            "unknown field `colour`",
        ),
        (
            m(r#"{"bead":"file:///b/A/","point":"/ctx","order":"before","create":false,"name":"A","x":1}"#),
            "unknown field `x`",
        ),
        (
            r#"{"profile":"acequia/other","session":"s","mounts":[]}"#.to_string(),
            "profile: expected \"acequia/session-namespace\", got \"acequia/other\"",
        ),
        (
            r#"{"profile":"acequia/session-namespace","mounts":[]}"#.to_string(),
            "missing field `session`",
        ),
        (
            r#"{"profile":"acequia/session-namespace","session":"","mounts":[]}"#.to_string(),
            "session: must be a non-empty string",
        ),
        (
            m(r#"{"bead":"file:///b/A/","point":"/ctx","order":"before","create":false}"#),
            "missing field `name`",
        ),
        (
            m(r#"{"bead":"file:///b/A/","point":"/ctx","order":"sideways","create":false,"name":"A"}"#),
            "unknown variant `sideways`",
        ),
        (
            m(r#"{"bead":"file:///b/A/","point":"ctx","order":"before","create":false,"name":"A"}"#),
            "mounts[0].point: invalid mount point \"ctx\": not absolute",
        ),
        (
            m(r#"{"bead":"https://redfish.acequia.io/.agents/A/","point":"/ctx","order":"before","create":false,"name":"A"}"#),
            "mounts[0].bead: remote beads are not supported: https://redfish.acequia.io/.agents/A/",
        ),
        (
            m(r#"{"bead":"file:///b/../A/","point":"/ctx","order":"before","create":false,"name":"A"}"#),
            "mounts[0].bead: invalid bead uri",
        ),
        (
            m(r#"{"bead":"file:///b/A/","point":"/ctx","order":"before","create":false,"name":"a b"}"#),
            "mounts[0].name: invalid bead name \"a b\"",
        ),
        (
            m(&format!(
                "{good},{}",
                r#"{"bead":"file:///b/B/","point":"/ctx","order":"after","create":false,"name":"A"}"#
            )),
            "mounts[1]: name \"A\" is used twice at /ctx",
        ),
        (
            m(&format!(
                "{},{}",
                r#"{"bead":"file:///b/A/","point":"/ctx","order":"before","create":true,"name":"A"}"#,
                r#"{"bead":"file:///b/B/","point":"/ctx","order":"after","create":true,"name":"B"}"#
            )),
            "mounts[1]: /ctx already has a create target: A (file:///b/A/)",
        ),
        (
            r#"{"profile":"acequia/session-namespace","session":"s","mounts":[],"started":"https://x/"}"#.to_string(),
            "started: remote beads are not supported",
        ),
        ("not json".to_string(), "expected"),
        (
            r#"{"profile":"acequia/session-namespace","profile":"x","session":"s","mounts":[]}"#.to_string(),
            "duplicate field `profile`",
        ),
    ];
    for (text, want) in cases {
        let e = Namespace::from_json(&text).unwrap_err();
        assert!(matches!(e, Error::NamespaceFile { .. }), "{text}: {e}");
        let msg = e.to_string();
        assert!(msg.starts_with("namespace file: "), "{msg}");
        assert!(msg.contains(want), "{text}\n  got: {msg}\n  want: {want}");
        assert!(!msg.contains('\n'));
    }
    // An unknown key split by a newline: the error stays one line.
    let e = Namespace::from_json(r#"{"sta\nrted": 1}"#)
        .unwrap_err()
        .to_string();
    assert!(!e.contains('\n') && e.contains("sta\\nrted"), "{e}");
}

// ---- naming ----------------------------------------------------------------------------------

#[test]
fn beads_are_named_by_uuid_uri_path_or_short_name() {
    let fx = Fixture::new();
    let reg = &fx.env.registry;
    let alpha = reg.start(Some("alpha")).unwrap();
    let beta = reg.start(Some("beta")).unwrap();
    // beta's names.json gives alpha a second name.
    let mut n = beta.names().unwrap();
    n.insert("gamma".into(), alpha.uri());
    write_atomic(
        &beta.dir().join("names.json"),
        serde_json::to_string(&n).unwrap().as_bytes(),
    )
    .unwrap();
    let uuid = beta
        .dir()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let get = |spec: &str| {
        reg.resolve(spec, &[])
            .unwrap_or_else(|e| panic!("{spec}: {e}"))
    };
    assert_eq!(
        get("alpha"),
        Named {
            bead: alpha.clone(),
            short_name: Some("alpha".into())
        }
    );
    assert_eq!(get("alpha/").bead, alpha);
    assert_eq!(
        get("gamma"),
        Named {
            bead: alpha.clone(),
            short_name: Some("gamma".into())
        }
    );
    assert_eq!(
        get(&uuid),
        Named {
            bead: beta.clone(),
            short_name: None
        }
    );
    assert_eq!(get(&format!("{uuid}/")).bead, beta);
    assert_eq!(get(&uuid.to_uppercase()).bead, beta);
    assert_eq!(get(&alpha.uri()).bead, alpha);
    assert_eq!(get(&alpha.dir().display().to_string()).bead, alpha);
    assert_eq!(get(&format!("{}/", alpha.dir().display())).bead, alpha);
    // A path through a symlink names the same bead (identity is the canonical directory).
    let link = fx.tmp.path().join("alias");
    std::os::unix::fs::symlink(alpha.dir(), &link).unwrap();
    assert_eq!(get(&link.display().to_string()).bead, alpha);
    // Local names come first.
    let local = reg.resolve("alpha", &[("alpha", &beta)]).unwrap();
    assert_eq!(local.bead, beta);
    // A mount named by short name takes that name.
    let mut ns = Namespace::new("s");
    fx.ok(&mut ns, "mount -a gamma /ctx");
    fx.ok(&mut ns, &format!("mount -a {uuid} /ctx"));
    assert_eq!(names(&ns, "/ctx"), ["gamma", "beta"]);
}

#[test]
fn naming_errors_are_clear() {
    let fx = Fixture::new();
    let reg = &fx.env.registry;
    let alpha = reg.start(Some("alpha")).unwrap();
    let beta = reg.start(Some("beta")).unwrap();
    let e = reg
        .resolve("https://redfish.acequia.io/guerin/.agents/A/", &[])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "remote beads are not supported: https://redfish.acequia.io/guerin/.agents/A/ (name a local bead by file:// uri, absolute path, uuid or short name)"
    );
    // Ambiguous: beta's names.json says "alpha" is beta.
    let mut n = beta.names().unwrap();
    n.insert("alpha".into(), beta.uri());
    n.insert("far".into(), "https://example.org/.agents/F/".into());
    write_atomic(
        &beta.dir().join("names.json"),
        serde_json::to_string(&n).unwrap().as_bytes(),
    )
    .unwrap();
    let e = reg.resolve("alpha", &[]).unwrap_err();
    let mut cands = [alpha.uri(), beta.uri()];
    cands.sort();
    assert_eq!(
        e.to_string(),
        format!(
            "bead name \"alpha\" is ambiguous: {}, {} (name it by uuid or file:// uri)",
            cands[0], cands[1]
        )
    );
    let e = reg
        .resolve("alpha", &[("alpha", &alpha), ("alpha", &beta)])
        .unwrap_err();
    assert!(matches!(e, Error::AmbiguousName { .. }));
    let e = reg.resolve("far", &[]).unwrap_err();
    assert!(matches!(e, Error::RemoteBead { .. }), "{e}");
    let e = reg.resolve("nobody", &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "no bead named \"nobody\" in this namespace or the registry: file does not exist"
    );
    let e = reg
        .resolve("00000000-0000-4000-8000-000000000000", &[])
        .unwrap_err();
    assert!(matches!(e, Error::UnknownBead { .. }), "{e}");
    let e = reg.resolve("a b", &[]).unwrap_err();
    assert!(matches!(e, Error::InvalidName { .. }), "{e}");
    let e = reg.resolve("ftp://x/", &[]).unwrap_err();
    assert!(matches!(e, Error::InvalidUri { .. }), "{e}");
    // A directory without agent.json is not a bead.
    let plain = fx.tmp.path().join("plain");
    fs::create_dir_all(&plain).unwrap();
    let e = reg.resolve(&plain.display().to_string(), &[]).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("not a bead: no agent.json (a bead is a directory holding agent.json)"),
        "{e}"
    );
    let e = reg.resolve("/nonexistent/dir", &[]).unwrap_err();
    assert!(matches!(e, Error::NotABead { .. }), "{e}");
}

// ---- path safety -----------------------------------------------------------------------------

#[test]
fn path_traversal_is_refused() {
    let fx = Fixture::new();
    let a = fx.plain("A");
    put(&a, "inside.md", "in");
    put(fx.tmp.path(), "secret", "outside");
    std::os::unix::fs::symlink("/etc", a.join("etc-link")).unwrap();
    std::os::unix::fs::symlink("../../secret", a.join("up-link")).unwrap();
    std::os::unix::fs::symlink("inside.md", a.join("ok-link")).unwrap();
    let mut ns = Namespace::new("s");
    fx.ok(&mut ns, &format!("mount -c {} /ctx", a.display()));
    for rel in [
        "../secret",
        "notes/../../secret",
        "/etc/passwd",
        "a\0b",
        "./x",
        "a//b",
    ] {
        let e = ns.lookup(&fx.env, "/ctx", rel).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{rel:?}: {e}");
        let e = ns.create(&fx.env, "/ctx", rel, NodeKind::File).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{rel:?}: {e}");
    }
    for rel in ["etc-link", "etc-link/passwd", "up-link"] {
        let e = ns.lookup(&fx.env, "/ctx", rel).unwrap_err();
        assert_eq!(e.errno(), libc::EACCES, "{rel}: {e}");
        assert!(e.to_string().contains("symlink that leaves bead A"), "{e}");
    }
    let listed: Vec<String> = ns
        .read_dir(&fx.env, "/ctx", "")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(!listed.contains(&"etc-link".to_string()) && !listed.contains(&"up-link".to_string()));
    assert!(listed.contains(&"ok-link".to_string()));
    // A symlink that stays inside the member resolves to its target.
    let r = ns.lookup(&fx.env, "/ctx", "ok-link").unwrap().unwrap();
    assert_eq!(r.path, a.join("inside.md"));
    // Creating through a symlink in the create target is refused.
    fs::remove_dir_all(a.join(utc_today())).ok();
    std::os::unix::fs::symlink(fx.tmp.path(), a.join(utc_today())).unwrap();
    let e = ns
        .create(&fx.env, "/ctx", "notes/x.md", NodeKind::File)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EACCES, "{e}");
    assert!(!fx.tmp.path().join("notes").exists());
    // Unknown and invalid points.
    assert_eq!(
        ns.lookup(&fx.env, "/nope", "").unwrap_err().errno(),
        libc::ENOENT
    );
    assert_eq!(
        ns.lookup(&fx.env, "nope", "").unwrap_err().errno(),
        libc::EINVAL
    );
}

// ---- writes never touch read-only members ----------------------------------------------------

#[test]
fn remove_and_rename_never_touch_read_only_members() {
    let fx = Fixture::new();
    let (a, c) = (fx.plain("A"), fx.plain("C"));
    put(&a, "notes/a.md", "A's note");
    put(&a, "top.md", "A's top");
    put(&c, "about.md", "C's about");
    let mut ns = Namespace::new("s");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    fx.ok(&mut ns, &format!("mount -ac {} /ctx", c.display()));

    let e = ns.remove(&fx.env, "/ctx", "notes/a.md").unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "permission denied: /ctx/notes/a.md is in read-only bead A ({})",
            uri(&a)
        )
    );
    assert_eq!(e.errno(), libc::EACCES);
    let e = ns.rename(&fx.env, "/ctx", "top.md", "top2.md").unwrap_err();
    assert!(matches!(e, Error::ReadOnly { .. }), "{e}");
    let e = ns
        .rename(&fx.env, "/ctx", "notes/a.md", "notes/b.md")
        .unwrap_err();
    assert!(matches!(e, Error::ReadOnly { .. }), "{e}");
    // Outside its kind folders the create target is read-only too.
    let e = ns.remove(&fx.env, "/ctx", "about.md").unwrap_err();
    assert!(
        matches!(e, Error::ReadOnly { ref bead, .. } if bead == "C"),
        "{e}"
    );
    let e = ns.remove(&fx.env, "/ctx", "agent.json").unwrap_err();
    assert!(matches!(e, Error::ReadOnly { .. }), "{e}");
    // Kind folders and the point itself cannot be removed.
    assert_eq!(
        ns.remove(&fx.env, "/ctx", "notes").unwrap_err().errno(),
        libc::EACCES
    );
    assert_eq!(
        ns.remove(&fx.env, "/ctx", "").unwrap_err().errno(),
        libc::EACCES
    );
    assert_eq!(
        fs::read_to_string(a.join("notes/a.md")).unwrap(),
        "A's note"
    );
    assert_eq!(fs::read_to_string(a.join("top.md")).unwrap(), "A's top");
    assert_eq!(fs::read_to_string(c.join("about.md")).unwrap(), "C's about");

    // The create target's kind files can be renamed and removed.
    let today = utc_today();
    ns.create(&fx.env, "/ctx", "notes/c1.md", NodeKind::File)
        .unwrap();
    let r = ns
        .rename(&fx.env, "/ctx", "notes/c1.md", "notes/c2.md")
        .unwrap();
    assert_eq!(r.path, c.join(&today).join("notes/c2.md"));
    assert!(!c.join(&today).join("notes/c1.md").exists());
    // Renaming onto an existing name is EEXIST, even when a read-only member has it.
    let e = ns
        .rename(&fx.env, "/ctx", "notes/c2.md", "notes/a.md")
        .unwrap_err();
    assert_eq!(e.errno(), libc::EEXIST);
    let e = ns
        .rename(&fx.env, "/ctx", "notes/c2.md", "notes/c2.md")
        .unwrap_err();
    assert_eq!(e.errno(), libc::EEXIST);
    ns.create(&fx.env, "/ctx", "notes/dd", NodeKind::Dir)
        .unwrap();
    let e = ns
        .rename(&fx.env, "/ctx", "notes/dd", "notes/dd/inner")
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    ns.remove(&fx.env, "/ctx", "notes/dd").unwrap();
    // Across layers is EXDEV.
    ns.create(&fx.env, "/ctx", "loose.txt", NodeKind::File)
        .unwrap();
    let e = ns
        .rename(&fx.env, "/ctx", "loose.txt", "notes/loose.txt")
        .unwrap_err();
    assert_eq!(e.errno(), libc::EXDEV, "{e}");
    assert_eq!(
        e.to_string(),
        "cannot rename /ctx/loose.txt to /ctx/notes/loose.txt: source is in the shadow layer but /ctx/notes/loose.txt would be created in bead C (cross-device link; copy and remove instead)"
    );
    let e = ns
        .rename(&fx.env, "/ctx", "notes/c2.md", "c2.md")
        .unwrap_err();
    assert_eq!(e.errno(), libc::EXDEV, "{e}");
    // Shadow files can be renamed within the shadow layer and removed.
    let r = ns
        .rename(&fx.env, "/ctx", "loose.txt", "renamed.txt")
        .unwrap();
    assert_eq!(r.layer, Layer::Shadow);
    ns.remove(&fx.env, "/ctx", "renamed.txt").unwrap();
    ns.remove(&fx.env, "/ctx", "notes/c2.md").unwrap();
    assert!(!c.join(&today).join("notes/c2.md").exists());
    assert_eq!(
        ns.remove(&fx.env, "/ctx", "gone").unwrap_err().errno(),
        libc::ENOENT
    );
    // A non-empty directory is not removed.
    ns.create(&fx.env, "/ctx", "notes/d", NodeKind::Dir)
        .unwrap();
    ns.create(&fx.env, "/ctx", "notes/d/f", NodeKind::File)
        .unwrap();
    assert_eq!(
        ns.remove(&fx.env, "/ctx", "notes/d").unwrap_err().errno(),
        libc::ENOTEMPTY
    );
    ns.remove(&fx.env, "/ctx", "notes/d/f").unwrap();
    ns.remove(&fx.env, "/ctx", "notes/d").unwrap();
}

#[test]
fn writing_a_read_only_file_copies_it_up_into_the_shadow_layer() {
    let fx = Fixture::new();
    let (a, c) = (fx.plain("A"), fx.plain("C"));
    put(&a, "notes/a.md", "A's note");
    let mut ns = Namespace::new("s");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    fx.ok(&mut ns, &format!("mount -ac {} /ctx", c.display()));
    let w = ns.open_write(&fx.env, "/ctx", "notes/a.md").unwrap();
    assert_eq!(w.layer, Layer::Shadow);
    assert_eq!(
        w.path,
        fs::canonicalize(fx.shadow()).unwrap().join("notes/a.md")
    );
    assert_eq!(read(&w), "A's note");
    {
        use std::io::Write;
        let mut f = w.open(true).unwrap();
        f.set_len(0).unwrap();
        f.write_all(b"edited").unwrap();
    }
    assert_eq!(
        fs::read_to_string(a.join("notes/a.md")).unwrap(),
        "A's note"
    );
    assert_eq!(
        read(&ns.lookup(&fx.env, "/ctx", "notes/a.md").unwrap().unwrap()),
        "edited"
    );
    // Removing the copy uncovers the original (no whiteouts).
    ns.remove(&fx.env, "/ctx", "notes/a.md").unwrap();
    assert_eq!(
        read(&ns.lookup(&fx.env, "/ctx", "notes/a.md").unwrap().unwrap()),
        "A's note"
    );
    // A file of the create target is written in place.
    let r = ns
        .create(&fx.env, "/ctx", "notes/mine.md", NodeKind::File)
        .unwrap();
    assert_eq!(ns.open_write(&fx.env, "/ctx", "notes/mine.md").unwrap(), r);
    assert_eq!(
        ns.open_write(&fx.env, "/ctx", "notes").unwrap_err().errno(),
        libc::EISDIR
    );
    assert_eq!(
        ns.open_write(&fx.env, "/ctx", "nope").unwrap_err().errno(),
        libc::ENOENT
    );
}

// ---- commands are all-or-nothing -------------------------------------------------------------

#[test]
fn failed_commands_change_nothing() {
    let mut fx = Fixture::new();
    let (a, c) = (fx.plain("A"), fx.plain("C"));
    let mut ns = Namespace::new("s");
    fx.ok(&mut ns, &format!("mount -ac {} /ctx", a.display()));
    let before = ns.clone();
    let failing = [
        "mount https://redfish.acequia.io/.agents/A/ /ctx".to_string(),
        "mount nobody /ctx".to_string(),
        format!("mount -bc {} /ctx", c.display()),
        format!("mount {} ctx", c.display()),
        format!("mount {} /a/b", c.display()),
        format!("mount {} /ctl", c.display()),
        "unmount nobody /ctx".to_string(),
        "unmount /nowhere".to_string(),
        "start Bad_Slug".to_string(),
    ];
    for line in &failing {
        let e = fx.run(&mut ns, line).unwrap_err();
        assert_eq!(ns, before, "{line}: {e}");
    }
    fx.env.uid = current_uid().wrapping_add(7);
    assert!(
        fx.run(&mut ns, &format!("mount -c {} /ctx", c.display()))
            .is_err()
    );
    assert_eq!(ns, before);
    assert!(fx.env.registry.beads().unwrap().is_empty());
}

#[test]
fn execute_replies_are_lines() {
    let fx = Fixture::new();
    let c = fx.plain("C");
    let mut ns = Namespace::new("s");
    let out = fx.ok(&mut ns, "start notes");
    assert_eq!(out.reply(), format!("{}\n", ns.started().unwrap().uri()));
    let out = fx.ok(&mut ns, &format!("mount -ac {} /ctx", c.display()));
    assert_eq!(out.reply(), format!("mounted C {} at /ctx\n", uri(&c)));
    let out = fx.ok(&mut ns, "unmount C /ctx");
    assert_eq!(out.reply(), "unmounted C from /ctx\n");
    assert_eq!(fx.ok(&mut ns, "ns").reply(), "");
    assert_eq!(fx.ok(&mut ns, "rfork").reply(), "forked\n");
}

#[test]
fn the_shadow_layer_lives_under_the_shadow_root_per_point() {
    let fx = Fixture::new();
    let a = fx.plain("A");
    let mut ns = Namespace::new("s");
    fx.ok(&mut ns, &format!("mount {} /ctx", a.display()));
    let r = ns.lookup(&fx.env, "/ctx", "").unwrap().unwrap();
    assert_eq!(r.layer, Layer::Shadow);
    assert_eq!(r.path, fs::canonicalize(fx.shadow()).unwrap());
    let md = fs::metadata(fx.shadow()).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0o700);
    assert_eq!(md.uid(), current_uid());
    for kind in ["notes", "skills", "artifacts"] {
        assert!(fx.shadow().join(kind).is_dir(), "{kind}");
    }
    assert_eq!(point_dir_name(ns.points()[0].path()), "ctx");
    assert_eq!(ns.points()[0].dir_name(), "ctx");
}

#[test]
fn overlay_layers_list_members_with_dated_folders_newest_first() {
    let fx = Fixture::new();
    let (a, c) = (fx.plain("A"), fx.plain("C"));
    for d in ["2026-11-29", "2026-11-30", "not-a-date"] {
        fs::create_dir_all(a.join(d).join("notes")).unwrap();
    }
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    fx.ok(&mut ns, &format!("mount -ac {} /ctx", c.display()));
    let l = ns.overlay_layers(&fx.env, "/ctx").unwrap();
    let a = fs::canonicalize(&a).unwrap();
    let c = fs::canonicalize(&c).unwrap();
    let mut want = vec![a.join("2026-11-30"), a.join("2026-11-29"), a.clone()];
    // C's own dated folders (from start, if any), then C.
    let mut c_dates: Vec<PathBuf> = fs::read_dir(&c)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.file_name().unwrap().len() == 10)
        .collect();
    c_dates.sort();
    c_dates.reverse();
    want.extend(c_dates);
    want.push(c);
    assert_eq!(l.point, "/ctx");
    assert_eq!(l.lowers, want);
    assert_eq!(
        l.upper,
        fs::canonicalize(fx.env.shadow_root.join("ctx")).unwrap()
    );
    assert!(
        l.work.is_dir()
            && l.work
                .starts_with(fs::canonicalize(&fx.env.shadow_root).unwrap())
    );
    assert!(!l.work.starts_with(&l.upper) && !l.upper.starts_with(&l.work));
    assert!(ns.overlay_layers(&fx.env, "/none").is_err());
}

#[test]
fn set_id_files_never_leave_the_shadow_layer() {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::new();
    let (a, c) = (fx.plain("A"), fx.plain("C"));
    let mut ns = Namespace::new("s1");
    fx.ok(&mut ns, &format!("mount -b {} /ctx", a.display()));
    for (name, mode) in [("suid", 0o4755), ("sgid", 0o2755), ("plain", 0o755)] {
        let r = ns
            .create(
                &fx.env,
                "/ctx",
                &format!("artifacts/{name}"),
                NodeKind::File,
            )
            .unwrap();
        fs::write(&r.path, "#!/bin/sh\n").unwrap();
        // What an overlay copy-up of a member's set-id file leaves in the shadow layer.
        fs::set_permissions(&r.path, fs::Permissions::from_mode(mode)).unwrap();
    }
    let shadow = fs::canonicalize(fx.shadow()).unwrap();
    let Outcome::Mounted(report) = fx.ok(&mut ns, &format!("mount -ac {} /ctx", c.display()))
    else {
        panic!()
    };
    let settled = report.settled.unwrap();
    let today = utc_today();
    let moved: Vec<&str> = settled.moved.iter().map(|m| m.rel.as_str()).collect();
    assert_eq!(moved, ["artifacts/plain"]);
    let kept: Vec<(&str, &str)> = settled
        .kept
        .iter()
        .map(|k| (k.rel.as_str(), k.reason.as_str()))
        .collect();
    assert_eq!(kept.len(), 2, "{kept:?}");
    for (rel, why) in kept {
        assert!(rel == "artifacts/suid" || rel == "artifacts/sgid", "{rel}");
        assert!(why.contains("set-id"), "{why}");
    }
    for name in ["suid", "sgid"] {
        assert!(!c.join(&today).join("artifacts").join(name).exists());
        assert!(shadow.join("artifacts").join(name).exists());
    }
}
