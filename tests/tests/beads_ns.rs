//! Cross-process suite for bead namespaces: the real `olliesrv` serving `session/S/ns/` and
//! `session/S/agent/A/ns/` (DESIGN.md §7, §9), driven through our 9P client (and py9p for one
//! listing). Every server gets a private bead registry (`beads_dir` in its config, and
//! `XDG_DATA_HOME` pointing into its temporary directory), so nothing touches the user's.
//!
//! Covers `start`, the three mount orders and the table byte for byte, first-hit reads, the
//! shadow layer, create routing to the `-c` member and settling into it, one `-c` per point,
//! write authority (mode bit as any user; another owner and delegations as root), unmounts,
//! removes and renames through the view, union listings, forking into agents, `rfork`,
//! persistence across a restart, a corrupt namespace file, malformed ctl lines, and the
//! `ns-changed` event.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use common::*;
use ollie_p9::Fid;
use ollie_p9::wire::{Stat, dm, om};
use ollie_testkit::client::{self, open_text as try_open, read_text as try_read};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// Helpers

async fn open(root: &Fid, path: &str, mode: u8) -> Fid {
    try_open(root, path, mode)
        .await
        .unwrap_or_else(|e| panic!("open {path}: {e}"))
}

async fn read_all(root: &Fid, path: &str) -> String {
    try_read(root, path)
        .await
        .unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Opens `path` ORDWR, writes `data` in one Twrite, reads the reply on the same fid.
async fn rdwr(root: &Fid, path: &str, data: &str) -> Result<String, String> {
    let f = open(root, path, om::ORDWR).await;
    let d = client::exchange(&f, data)
        .await
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8(d).expect("utf-8"))
}

/// Opens `path` with `OWRITE|OTRUNC` (as `echo data > path`) and writes `data`.
async fn write(root: &Fid, path: &str, data: &str) -> Result<(), String> {
    client::write_mode(root, path, om::OWRITE | om::OTRUNC, data)
        .await
        .map_err(|e| e.to_string())
}

/// Tcreate of `name` in the directory `dir` (a file, or with `perm & DMDIR` a directory),
/// opened `mode`; for a file, `data` is written.
async fn create(root: &Fid, dir: &str, name: &str, perm: u32, data: &str) -> Result<(), String> {
    let mut d = within("walk", root.walk_path(dir))
        .await
        .map_err(|e| e.to_string())?;
    let mode = if perm & dm::DIR != 0 {
        om::OREAD
    } else {
        om::ORDWR
    };
    within("create", d.create(name, perm, mode))
        .await
        .map_err(|e| e.to_string())?;
    if perm & dm::DIR == 0 && !data.is_empty() {
        within("write", d.write(0, Bytes::from(data.to_owned())))
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn remove(root: &Fid, path: &str) -> Result<(), String> {
    let f = within("walk", root.walk_path(path))
        .await
        .map_err(|e| e.to_string())?;
    within("remove", f.remove())
        .await
        .map_err(|e| e.to_string())
}

async fn stat(root: &Fid, path: &str) -> Result<Stat, String> {
    let f = within("walk", root.walk_path(path))
        .await
        .map_err(|e| e.to_string())?;
    within("stat", f.stat()).await.map_err(|e| e.to_string())
}

async fn wstat(root: &Fid, path: &str, st: &Stat) -> Result<(), String> {
    let f = within("walk", root.walk_path(path))
        .await
        .map_err(|e| e.to_string())?;
    within("wstat", f.wstat(st))
        .await
        .map_err(|e| e.to_string())
}

/// The entries of a directory.
async fn ls(root: &Fid, path: &str) -> Vec<Stat> {
    let d = open(root, path, om::OREAD).await;
    within("read dir", d.read_dir())
        .await
        .unwrap_or_else(|e| panic!("ls {path}: {e}"))
}

async fn names(root: &Fid, path: &str) -> BTreeSet<String> {
    ls(root, path).await.into_iter().map(|s| s.name).collect()
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn expect_err<T: std::fmt::Debug>(r: Result<T, String>, what: &str) -> String {
    match r {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => {
            assert!(!e.contains('\n'), "{what}: error is not one line: {e:?}");
            e
        }
    }
}

/// A server whose bead registry is `<dir>/beads` (config `beads_dir`), with `XDG_DATA_HOME`
/// also inside its directory.
fn beads_srv() -> (Srv, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = dir.path().join("beads");
    std::fs::create_dir(&reg).unwrap();
    let reg = std::fs::canonicalize(&reg).unwrap();
    let data = dir.path().join("xdg-data");
    let config = format!("beads_dir = {:?}\n{CONFIG}", reg.display().to_string());
    let srv = Srv::start_with(dir, &config, |c| {
        c.env("XDG_DATA_HOME", &data);
    });
    (srv, reg)
}

fn relaunch(srv: &mut Srv) {
    let data = srv.dir.path().join("xdg-data");
    srv.relaunch(|c| {
        c.env("XDG_DATA_HOME", &data);
    });
}

/// A bead made on disk: `<reg>/<uuid>/agent.json` with `slug`, and `files` (paths relative to
/// the bead). Returns its canonical directory.
fn make_bead(reg: &Path, n: u32, slug: &str, files: &[(&str, &str)]) -> PathBuf {
    let uuid = format!("{n:08x}-0000-4000-8000-000000000000");
    let dir = reg.join(&uuid);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(
        dir.join("agent.json"),
        format!("{{\"uuid\": \"{uuid}\", \"slug\": \"{slug}\"}}\n"),
    )
    .unwrap();
    for (p, c) in files {
        let f = dir.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, c).unwrap();
    }
    std::fs::canonicalize(&dir).unwrap()
}

fn uri(dir: &Path) -> String {
    format!("file://{}/", dir.display())
}

/// Today's date (UTC) as the beads' dated kind folders name it.
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (y, m, d, ..) = ollie_p9::util::civil(secs);
    format!("{y:04}-{m:02}-{d:02}")
}

/// A session named `name`; returns its id.
async fn session(root: &Fid, name: &str) -> String {
    let r = rdwr(root, "session/new", &format!("name={name} cwd=/tmp"))
        .await
        .unwrap_or_else(|e| panic!("session/new: {e}"));
    assert_eq!(r, format!("{name}\n"));
    read_all(root, &format!("session/{name}/id"))
        .await
        .trim_end()
        .to_owned()
}

/// An agent `name` in session `s`; returns its id.
async fn agent(root: &Fid, s: &str, name: &str) -> String {
    let r = rdwr(
        root,
        &format!("session/{s}/agent/new"),
        &format!("name={name}"),
    )
    .await
    .unwrap_or_else(|e| panic!("agent/new: {e}"));
    r.trim_end().to_owned()
}

/// One line to `ns/ctl` of the session (`who` = "S") or agent (`who` = "S/agent/A").
async fn ns(root: &Fid, who: &str, line: &str) -> Result<String, String> {
    rdwr(root, &format!("session/{who}/ns/ctl"), line).await
}

async fn table(root: &Fid, who: &str) -> String {
    read_all(root, &format!("session/{who}/ns/table")).await
}

/// The next `ns-changed` event on an open `eventwait` fid (others are skipped).
async fn ns_event(ev: &Fid) -> Value {
    loop {
        let d = within("eventwait", ev.read(0, 65536)).await.unwrap();
        assert!(!d.is_empty(), "eventwait ended");
        let v: Value = serde_json::from_slice(&d).unwrap();
        if v["event"] == "ns-changed" {
            return v;
        }
    }
}

fn line(name: &str, dir: &Path, create: bool) -> String {
    let access = if create { "read,create*" } else { "read" };
    format!("{name} {} {access}", uri(dir))
}

/// The table text for one point: `[N] NAME URI access` lines as given.
fn point_table(point: &str, members: &[String]) -> String {
    let mut s = format!("{point} (union)\n");
    for (i, m) in members.iter().enumerate() {
        s.push_str(&format!("  [{}] {m}\n", i + 1));
    }
    s
}

// ---------------------------------------------------------------------------------------------
// start, mount, the table

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_returns_a_file_uri_creates_the_bead_and_announces_it() {
    let (srv, reg) = beads_srv();
    let (_c, root) = attach(&srv, &me()).await;
    let sid = session(&root, "s").await;
    let ev = open(&root, "eventwait", om::OREAD).await;

    let r = ns(&root, "s", "start field-notes").await.unwrap();
    assert!(r.starts_with("file:///") && r.ends_with("/\n"), "{r:?}");
    assert_eq!(r.lines().count(), 1, "{r:?}");
    let dir = PathBuf::from(
        r.trim_end()
            .strip_prefix("file://")
            .unwrap()
            .trim_end_matches('/'),
    );
    assert!(
        dir.starts_with(&reg),
        "{} is not in {}",
        dir.display(),
        reg.display()
    );
    for f in ["agent.json", "about.md", "names.json"] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    for k in ["notes", "skills", "artifacts"] {
        assert!(dir.join(today()).join(k).is_dir(), "{k}");
    }
    let agent_json: Value =
        serde_json::from_slice(&std::fs::read(dir.join("agent.json")).unwrap()).unwrap();
    assert_eq!(agent_json["slug"], "field-notes");
    // A second start (with the seed's prefix) returns the open bead.
    assert_eq!(ns(&root, "s", "bead-start").await.unwrap(), r);
    assert_eq!(std::fs::read_dir(&reg).unwrap().count(), 1);

    let v = ns_event(&ev).await;
    assert_eq!(v["session"], sid.as_str());
    assert_eq!(v["agent"], Value::Null);
    assert_eq!(v["command"], "start field-notes");

    // The started bead mounts by its slug.
    let m = ns(&root, "s", "mount -c field-notes /ctx").await.unwrap();
    assert_eq!(m, format!("mounted field-notes {} at /ctx\n", uri(&dir)));
}

/// Without `beads_dir` the registry is `$XDG_DATA_HOME/ollie/beads`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_beads_dir_the_registry_is_under_xdg_data_home() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = std::fs::canonicalize(dir.path()).unwrap().join("data");
    let env_data = data.clone();
    let srv = Srv::start_with(dir, CONFIG, move |c| {
        c.env("XDG_DATA_HOME", &env_data);
    });
    let (_c, root) = attach(&srv, &me()).await;
    session(&root, "s").await;
    let r = ns(&root, "s", "start").await.unwrap();
    let bead = PathBuf::from(
        r.trim_end()
            .strip_prefix("file://")
            .unwrap()
            .trim_end_matches('/'),
    );
    assert_eq!(
        bead.parent(),
        Some(data.join("ollie/beads").as_path()),
        "{r}"
    );
    assert!(bead.join("agent.json").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_before_after_and_replace_and_the_table_byte_exact() {
    let (srv, reg) = beads_srv();
    let alpha = make_bead(&reg, 1, "alpha", &[]);
    let beta = make_bead(&reg, 2, "beta", &[]);
    let gamma = make_bead(&reg, 3, "gamma", &[]);
    let delta = make_bead(&reg, 4, "delta", &[]);
    let (_c, root) = attach(&srv, &me()).await;
    session(&root, "s").await;
    assert_eq!(table(&root, "s").await, "");
    assert_eq!(set(&["ctl", "table"]), names(&root, "session/s/ns").await);

    let r = ns(&root, "s", "mount alpha /ctx").await.unwrap();
    assert_eq!(r, format!("mounted alpha {} at /ctx\n", uri(&alpha)));
    assert_eq!(
        table(&root, "s").await,
        point_table("/ctx", &[line("alpha", &alpha, false)])
    );
    ns(&root, "s", "mount -b beta /ctx").await.unwrap();
    ns(&root, "s", "mount -ac gamma /ctx").await.unwrap();
    let want = point_table(
        "/ctx",
        &[
            line("beta", &beta, false),
            line("alpha", &alpha, false),
            line("gamma", &gamma, true),
        ],
    );
    assert_eq!(table(&root, "s").await, want);
    // `ns` on ctl says the same.
    assert_eq!(ns(&root, "s", "ns").await.unwrap(), want);
    assert_eq!(ns(&root, "s", "bead-ns").await.unwrap(), want);
    // The table's stat has its length (9pfuse appends at it).
    assert_eq!(
        stat(&root, "session/s/ns/table").await.unwrap().length,
        want.len() as u64
    );
    // A second point, by URI and by absolute path.
    ns(&root, "s", &format!("mount {} /lib", uri(&delta)))
        .await
        .unwrap();
    ns(&root, "s", &format!("mount -a {} /lib", alpha.display()))
        .await
        .unwrap();
    let both = format!(
        "{want}{}",
        point_table(
            "/lib",
            &[line("delta", &delta, false), line("alpha", &alpha, false)]
        )
    );
    assert_eq!(table(&root, "s").await, both);
    assert_eq!(
        names(&root, "session/s/ns").await,
        set(&["ctl", "table", "ctx", "lib"])
    );
    // Neither flag replaces everything at the point.
    ns(&root, "s", "mount delta /ctx").await.unwrap();
    assert_eq!(
        table(&root, "s").await,
        format!(
            "{}{}",
            point_table("/ctx", &[line("delta", &delta, false)]),
            point_table(
                "/lib",
                &[line("delta", &delta, false), line("alpha", &alpha, false)]
            )
        )
    );
    // The stats of ns/ and its files.
    let entries = ls(&root, "session/s/ns").await;
    let mode = |n: &str| entries.iter().find(|e| e.name == n).unwrap().mode;
    assert_eq!(mode("ctl"), 0o660);
    assert_eq!(mode("table"), 0o444);
    assert_eq!(mode("ctx") & dm::DIR, dm::DIR);
    assert_eq!(mode("ctx") & 0o777, 0o770);
    assert_eq!(
        stat(&root, "session/s/ns").await.unwrap().mode,
        dm::DIR | 0o555
    );
}

// ---------------------------------------------------------------------------------------------
// Reads, the shadow layer, creates

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_take_the_first_hit_and_the_chats_own_files_shadow_members() {
    let (srv, reg) = beads_srv();
    let alpha = make_bead(
        &reg,
        1,
        "alpha",
        &[("x", "from alpha\n"), ("only-a", "a\n")],
    );
    let beta = make_bead(&reg, 2, "beta", &[("x", "from beta\n"), ("only-b", "b\n")]);
    let (_c, root) = attach(&srv, &me()).await;
    let sid = session(&root, "s").await;
    ns(&root, "s", "mount alpha /ctx").await.unwrap();
    ns(&root, "s", "mount -a beta /ctx").await.unwrap();
    assert_eq!(read_all(&root, "session/s/ns/ctx/x").await, "from alpha\n");
    assert_eq!(read_all(&root, "session/s/ns/ctx/only-b").await, "b\n");
    ns(&root, "s", "mount -b beta /ctx").await.unwrap();
    assert_eq!(read_all(&root, "session/s/ns/ctx/x").await, "from beta\n");
    let st = stat(&root, "session/s/ns/ctx/x").await.unwrap();
    assert_eq!(st.length, 10);
    assert_eq!(st.name, "x");
    assert_eq!(
        st.mode, 0o660,
        "a 0644 file shows its owner bits to the group"
    );
    assert!(!st.qid.is_dir());
    // Reads at an offset.
    let f = open(&root, "session/s/ns/ctx/x", om::OREAD).await;
    assert_eq!(&within("read", f.read(5, 4)).await.unwrap()[..], b"beta");

    // A file the chat creates shadows every member, even one that appears later.
    create(&root, "session/s/ns/ctx", "mine", 0o644, "my own\n")
        .await
        .unwrap();
    std::fs::write(alpha.join("mine"), "alpha's\n").unwrap();
    assert_eq!(read_all(&root, "session/s/ns/ctx/mine").await, "my own\n");
    let shadow = srv
        .state_dir()
        .join("sessions")
        .join(&sid)
        .join("ns-shadow/ctx");
    assert_eq!(
        std::fs::read_to_string(shadow.join("mine")).unwrap(),
        "my own\n"
    );
    // Creating a name the view has is refused.
    let e = expect_err(
        create(&root, "session/s/ns/ctx", "x", 0o644, "").await,
        "create x",
    );
    assert!(e.contains("file already exists"), "{e}");

    // Writing a member's file copies it up: the member is never written.
    write(&root, "session/s/ns/ctx/x", "rewritten\n")
        .await
        .unwrap();
    assert_eq!(read_all(&root, "session/s/ns/ctx/x").await, "rewritten\n");
    assert_eq!(
        std::fs::read_to_string(beta.join("x")).unwrap(),
        "from beta\n"
    );
    assert_eq!(
        std::fs::read_to_string(alpha.join("x")).unwrap(),
        "from alpha\n"
    );
    assert_eq!(
        std::fs::read_to_string(shadow.join("x")).unwrap(),
        "rewritten\n"
    );
    // A write at an offset (9pfuse's >>), then the stat length follows.
    let f = open(&root, "session/s/ns/ctx/x", om::OWRITE).await;
    within("append", f.write(10, Bytes::from_static(b"more\n")))
        .await
        .unwrap();
    assert_eq!(
        read_all(&root, "session/s/ns/ctx/x").await,
        "rewritten\nmore\n"
    );
    assert_eq!(stat(&root, "session/s/ns/ctx/x").await.unwrap().length, 15);
    // Missing names and walks through files.
    let e = expect_err(try_read(&root, "session/s/ns/ctx/nope").await, "nope");
    assert!(e.contains("file does not exist"), "{e}");
    let e = expect_err(try_read(&root, "session/s/ns/nopoint/x").await, "nopoint");
    assert!(e.contains("file does not exist"), "{e}");
    // `..` walks back out of the view.
    let up = within(
        "walk ..",
        root.walk_path("session/s/ns/ctx/notes/../../ctx/.."),
    )
    .await
    .unwrap();
    let st = within("stat", up.stat()).await.unwrap();
    assert_eq!(st.name, "ns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_land_in_the_create_members_dated_kind_folder() {
    let (srv, reg) = beads_srv();
    let alpha = make_bead(&reg, 1, "alpha", &[]);
    let gamma = make_bead(&reg, 3, "gamma", &[]);
    let (_c, root) = attach(&srv, &me()).await;
    session(&root, "s").await;
    ns(&root, "s", "mount alpha /ctx").await.unwrap();
    ns(&root, "s", "mount -ac gamma /ctx").await.unwrap();
    create(&root, "session/s/ns/ctx/notes", "n.md", 0o644, "a note\n")
        .await
        .unwrap();
    let landed = gamma.join(today()).join("notes/n.md");
    assert_eq!(std::fs::read_to_string(&landed).unwrap(), "a note\n");
    assert!(!alpha.join("notes").exists());
    assert_eq!(
        read_all(&root, "session/s/ns/ctx/notes/n.md").await,
        "a note\n"
    );
    // A directory, then a file in it.
    create(&root, "session/s/ns/ctx/skills", "sub", dm::DIR | 0o755, "")
        .await
        .unwrap();
    create(
        &root,
        "session/s/ns/ctx/skills/sub",
        "s.md",
        0o644,
        "skill\n",
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(gamma.join(today()).join("skills/sub/s.md")).unwrap(),
        "skill\n"
    );
    let st = stat(&root, "session/s/ns/ctx/skills/sub").await.unwrap();
    assert!(st.qid.is_dir());
    assert_eq!(st.mode & dm::DIR, dm::DIR);
    // The target's file is written in place (no copy-up) and removable.
    write(&root, "session/s/ns/ctx/notes/n.md", "edited\n")
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&landed).unwrap(), "edited\n");
    remove(&root, "session/s/ns/ctx/notes/n.md").await.unwrap();
    assert!(!landed.exists());
    // Outside the kind folders, creates stay in the shadow layer.
    create(&root, "session/s/ns/ctx", "top.txt", 0o644, "t\n")
        .await
        .unwrap();
    assert!(!gamma.join("top.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_create_member_files_shadow_until_one_is_mounted() {
    let (srv, reg) = beads_srv();
    let alpha = make_bead(&reg, 1, "alpha", &[]);
    let gamma = make_bead(&reg, 3, "gamma", &[]);
    let (_c, root) = attach(&srv, &me()).await;
    let sid = session(&root, "s").await;
    ns(&root, "s", "mount alpha /ctx").await.unwrap();
    create(&root, "session/s/ns/ctx/notes", "s.md", 0o644, "shadowed\n")
        .await
        .unwrap();
    let shadow = srv
        .state_dir()
        .join("sessions")
        .join(&sid)
        .join("ns-shadow/ctx/notes/s.md");
    assert_eq!(std::fs::read_to_string(&shadow).unwrap(), "shadowed\n");
    assert!(!alpha.join(today()).exists());
    let r = ns(&root, "s", "mount -ac gamma /ctx").await.unwrap();
    let landed = gamma.join(today()).join("notes/s.md");
    assert_eq!(
        r,
        format!(
            "mounted gamma {} at /ctx\nmoved notes/s.md to {}\n",
            uri(&gamma),
            landed.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&landed).unwrap(), "shadowed\n");
    assert!(!shadow.exists());
    assert_eq!(
        read_all(&root, "session/s/ns/ctx/notes/s.md").await,
        "shadowed\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_create_member_is_an_error_naming_the_first() {
    let (srv, reg) = beads_srv();
    make_bead(&reg, 2, "beta", &[]);
    let gamma = make_bead(&reg, 3, "gamma", &[]);
    let (_c, root) = attach(&srv, &me()).await;
    session(&root, "s").await;
    ns(&root, "s", "mount -c gamma /ctx").await.unwrap();
    let before = table(&root, "s").await;
    let e = expect_err(ns(&root, "s", "mount -ac beta /ctx").await, "second -c");
    assert!(
        e.contains(&format!(
            "/ctx already has a create target: gamma ({})",
            uri(&gamma)
        )),
        "{e}"
    );
    assert_eq!(table(&root, "s").await, before);
    // Without -c the same bead mounts.
    ns(&root, "s", "mount -a beta /ctx").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_member_needs_write_authority_mode_bit() {
    let (srv, reg) = beads_srv();
    let ro = make_bead(&reg, 5, "readonly", &[]);
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o500)).unwrap();
    let (_c, root) = attach(&srv, &me()).await;
    session(&root, "s").await;
    let e = expect_err(ns(&root, "s", "mount -c readonly /ctx").await, "-c ro");
    assert!(e.contains("permission denied: no write authority"), "{e}");
    assert!(e.contains("not writable by its owner"), "{e}");
    assert_eq!(table(&root, "s").await, "");
    // Read-only is fine.
    ns(&root, "s", "mount readonly /ctx").await.unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o700)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_member_needs_write_authority_owner_and_delegation() {
    let test = "create_member_needs_write_authority_owner_and_delegation";
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP {test}: needs root to chown a bead to another uid");
        return;
    }
    let (srv, reg) = beads_srv();
    let other = make_bead(&reg, 6, "other", &[]);
    let uid = nix::unistd::Uid::from_raw(54321);
    nix::unistd::chown(&other, Some(uid), None).unwrap();
    let (_c, root) = attach(&srv, &me()).await;
    session(&root, "s").await;
    let e = expect_err(ns(&root, "s", "mount -c other /ctx").await, "-c other");
    assert!(e.contains("permission denied: no write authority"), "{e}");
    assert!(e.contains("owned by uid 54321"), "{e}");
    assert_eq!(table(&root, "s").await, "");
    // A delegation of artifacts/ only: -c is allowed, a note is not.
    let d = other.join("delegations.json");
    let me_uid = nix::unistd::geteuid().as_raw();
    std::fs::write(
        &d,
        format!("[{{\"uid\": {me_uid}, \"write_paths\": [\"artifacts/\"]}}]"),
    )
    .unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o644)).unwrap();
    nix::unistd::chown(&d, Some(uid), None).unwrap();
    ns(&root, "s", "mount -c other /ctx").await.unwrap();
    create(&root, "session/s/ns/ctx/artifacts", "a.txt", 0o644, "ok\n")
        .await
        .unwrap();
    assert!(other.join(today()).join("artifacts/a.txt").is_file());
    let e = expect_err(
        create(&root, "session/s/ns/ctx/notes", "n.md", 0o644, "").await,
        "note",
    );
    assert!(e.contains("notes/ is not delegated to uid"), "{e}");
    assert!(e.contains("permission denied"), "{e}");
    assert!(!other.join(today()).join("notes/n.md").exists());
}

// ---------------------------------------------------------------------------------------------
// Unmount, remove, rename, listings

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmount_one_member_then_the_whole_point() {
    let (srv, reg) = beads_srv();
    make_bead(&reg, 1, "alpha", &[("x", "A\n")]);
    let beta = make_bead(&reg, 2, "beta", &[("x", "B\n")]);
    let (_c, root) = attach(&srv, &me()).await;
    session(&root, "s").await;
    ns(&root, "s", "mount alpha /ctx").await.unwrap();
    ns(&root, "s", "mount -a beta /ctx").await.unwrap();
    // A fid open on the point before the unmount.
    let held = within("walk", root.walk_path("session/s/ns/ctx"))
        .await
        .unwrap();
    assert_eq!(
        ns(&root, "s", "unmount alpha /ctx").await.unwrap(),
        "unmounted alpha from /ctx\n"
    );
    assert_eq!(
        table(&root, "s").await,
        point_table("/ctx", &[line("beta", &beta, false)])
    );
    assert_eq!(read_all(&root, "session/s/ns/ctx/x").await, "B\n");
    assert_eq!(
        ns(&root, "s", "bead-unmount /ctx").await.unwrap(),
        "unmounted beta from /ctx\n"
    );
    assert_eq!(table(&root, "s").await, "");
    assert_eq!(names(&root, "session/s/ns").await, set(&["ctl", "table"]));
    let e = expect_err(try_read(&root, "session/s/ns/ctx/x").await, "gone");
    assert!(e.contains("file does not exist"), "{e}");
    let e = expect_err(
        within("stat", held.stat()).await.map_err(|e| e.to_string()),
        "held",
    );
    assert!(e.contains("nothing is mounted at /ctx"), "{e}");
    let e = expect_err(ns(&root, "s", "unmount /ctx").await, "again");
    assert!(e.contains("nothing is mounted at /ctx"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_of_a_read_only_members_file_is_refused() {
    let (srv, reg) = beads_srv();
    let alpha = make_bead(&reg, 1, "alpha", &[("keep.txt", "kept\n"), ("d/in", "i\n")]);
    let (_c, root) = attach(&srv, &me()).await;
    session(&root, "s").await;
    ns(&root, "s", "mount alpha /ctx").await.unwrap();
    let e = expect_err(remove(&root, "session/s/ns/ctx/keep.txt").await, "rm");
    assert!(e.contains("permission denied"), "{e}");
    assert!(e.contains("read-only bead alpha"), "{e}");
    assert_eq!(
        std::fs::read_to_string(alpha.join("keep.txt")).unwrap(),
        "kept\n"
    );
    let e = expect_err(remove(&root, "session/s/ns/ctx/d").await, "rm dir");
    assert!(e.contains("permission denied"), "{e}");
    assert!(alpha.join("d/in").is_file());
    // The point and the kind folders cannot go either.
    let e = expect_err(remove(&root, "session/s/ns/ctx").await, "rm point");
    assert!(e.contains("use unmount"), "{e}");
    let e = expect_err(remove(&root, "session/s/ns/ctx/notes").await, "rm notes");
    assert!(e.contains("kind folders"), "{e}");
    // The chat's own file goes.
    create(&root, "session/s/ns/ctx", "tmp", 0o644, "t")
        .await
        .unwrap();
    remove(&root, "session/s/ns/ctx/tmp").await.unwrap();
    assert!(!names(&root, "session/s/ns/ctx").await.contains("tmp"));
    // ns/ files are not removable.
    let e = expect_err(remove(&root, "session/s/ns/table").await, "rm table");
    assert!(e.contains("permission denied"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wstat_renames_in_the_view_and_refuses_other_changes() {
    let (srv, reg) = beads_srv();
    let alpha = make_bead(&reg, 1, "alpha", &[("ro.txt", "r\n")]);
    let (_c, root) = attach(&srv, &me()).await;
    let sid = session(&root, "s").await;
    ns(&root, "s", "mount alpha /ctx").await.unwrap();
    create(&root, "session/s/ns/ctx", "a.txt", 0o644, "body\n")
        .await
        .unwrap();
    let mut st = Stat::dont_touch();
    st.name = "b.txt".into();
    wstat(&root, "session/s/ns/ctx/a.txt", &st).await.unwrap();
    let n = names(&root, "session/s/ns/ctx").await;
    assert!(n.contains("b.txt") && !n.contains("a.txt"), "{n:?}");
    assert_eq!(read_all(&root, "session/s/ns/ctx/b.txt").await, "body\n");
    let shadow = srv
        .state_dir()
        .join("sessions")
        .join(&sid)
        .join("ns-shadow/ctx");
    assert!(shadow.join("b.txt").is_file() && !shadow.join("a.txt").exists());
    // A read-only member's file cannot be renamed.
    st.name = "moved.txt".into();
    let e = expect_err(wstat(&root, "session/s/ns/ctx/ro.txt", &st).await, "mv ro");
    assert!(e.contains("read-only bead alpha"), "{e}");
    assert!(alpha.join("ro.txt").is_file());
    // Mode changes are refused; the unchanged mode is a no-op.
    let mut m = Stat::dont_touch();
    m.mode = 0o600;
    let e = expect_err(wstat(&root, "session/s/ns/ctx/b.txt", &m).await, "chmod");
    assert!(e.contains("permission denied") && e.contains("mode"), "{e}");
    m.mode = stat(&root, "session/s/ns/ctx/b.txt").await.unwrap().mode;
    wstat(&root, "session/s/ns/ctx/b.txt", &m).await.unwrap();
    // Truncation (what `echo x > file` through 9pfuse sends first).
    let mut t = Stat::dont_touch();
    t.length = 0;
    wstat(&root, "session/s/ns/ctx/b.txt", &t).await.unwrap();
    assert_eq!(read_all(&root, "session/s/ns/ctx/b.txt").await, "");
    // Truncating a member's file copies it up.
    wstat(&root, "session/s/ns/ctx/ro.txt", &t).await.unwrap();
    assert_eq!(read_all(&root, "session/s/ns/ctx/ro.txt").await, "");
    assert_eq!(
        std::fs::read_to_string(alpha.join("ro.txt")).unwrap(),
        "r\n"
    );
    // The don't-touch stat is accepted.
    wstat(&root, "session/s/ns/ctx/b.txt", &Stat::dont_touch())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_is_the_union_with_shadowing() {
    let (srv, reg) = beads_srv();
    make_bead(
        &reg,
        1,
        "alpha",
        &[("x", "alpha x\n"), ("only-a", "a"), ("sub/deep", "d")],
    );
    make_bead(
        &reg,
        2,
        "beta",
        &[("x", "b\n"), ("only-b", "b"), ("sub", "a file")],
    );
    let (_c, root) = attach(&srv, &me()).await;
    session(&root, "s").await;
    ns(&root, "s", "mount alpha /ctx").await.unwrap();
    ns(&root, "s", "mount -a beta /ctx").await.unwrap();
    create(&root, "session/s/ns/ctx", "own", 0o644, "o")
        .await
        .unwrap();
    let entries = ls(&root, "session/s/ns/ctx").await;
    let got: BTreeSet<String> = entries.iter().map(|e| e.name.clone()).collect();
    let want = set(&[
        "agent.json",
        "artifacts",
        "notes",
        "only-a",
        "only-b",
        "own",
        "skills",
        "sub",
        "x",
    ]);
    assert_eq!(got, want);
    let e = |n: &str| entries.iter().find(|e| e.name == n).unwrap().clone();
    assert_eq!(e("x").length, 8, "alpha's x wins");
    assert!(
        e("sub").qid.is_dir(),
        "alpha's directory wins over beta's file"
    );
    assert_eq!(e("sub").mode & dm::DIR, dm::DIR);
    assert!(e("notes").qid.is_dir());
    assert_eq!(e("own").length, 1);
    for s in &entries {
        assert_eq!(s.mode & dm::DIR != 0, s.qid.is_dir(), "{}", s.name);
        assert_eq!(s.gid, "agent");
    }
    assert_eq!(names(&root, "session/s/ns/ctx/sub").await, set(&["deep"]));
    // Re-reading from offset 0 on the same fid sees a change.
    let d = open(&root, "session/s/ns/ctx", om::OREAD).await;
    let first = within("read", d.read_dir()).await.unwrap();
    create(&root, "session/s/ns/ctx", "later", 0o644, "")
        .await
        .unwrap();
    let second = within("read", d.read_dir()).await.unwrap();
    assert_eq!(second.len(), first.len() + 1);
    // qids are stable per real file.
    let q1 = stat(&root, "session/s/ns/ctx/only-a").await.unwrap().qid;
    let q2 = stat(&root, "session/s/ns/ctx/only-a").await.unwrap().qid;
    assert_eq!(q1, q2);
    assert_ne!(
        q1.path,
        stat(&root, "session/s/ns/ctx/only-b")
            .await
            .unwrap()
            .qid
            .path
    );
}

// ---------------------------------------------------------------------------------------------
// Agents: forking

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_copy_the_session_namespace_when_created() {
    let (srv, reg) = beads_srv();
    let alpha = make_bead(&reg, 1, "alpha", &[("x", "A\n")]);
    let beta = make_bead(&reg, 2, "beta", &[("x", "B\n")]);
    let (_c, root) = attach(&srv, &me()).await;
    session(&root, "s").await;
    let early = agent(&root, "s", "early").await;
    assert!(!early.is_empty());
    ns(&root, "s", "mount alpha /ctx").await.unwrap();
    create(&root, "session/s/ns/ctx", "session-own", 0o644, "s")
        .await
        .unwrap();
    let aid = agent(&root, "s", "late").await;
    // The agent created before the mount has none; the one created after has it.
    assert_eq!(table(&root, "s/agent/early").await, "");
    let t = table(&root, "s").await;
    assert_eq!(table(&root, "s/agent/late").await, t);
    assert_eq!(
        read_all(&root, "session/s/agent/late/ns/ctx/x").await,
        "A\n"
    );
    // Its shadow layer starts empty.
    assert!(
        !names(&root, "session/s/agent/late/ns/ctx")
            .await
            .contains("session-own")
    );
    // A mount on the session afterwards does not change the agent.
    let ev = open(&root, "eventwait", om::OREAD).await;
    ns(&root, "s", "mount -b beta /ctx").await.unwrap();
    assert_eq!(read_all(&root, "session/s/ns/ctx/x").await, "B\n");
    assert_eq!(table(&root, "s/agent/late").await, t);
    assert_eq!(
        read_all(&root, "session/s/agent/late/ns/ctx/x").await,
        "A\n"
    );
    // Nor does the agent's own mount change the session, or its sibling.
    let before = table(&root, "s").await;
    ns(&root, "s/agent/late", "mount beta /lib").await.unwrap();
    assert_eq!(table(&root, "s").await, before);
    assert_eq!(table(&root, "s/agent/early").await, "");
    assert!(
        try_read(&root, "session/s/agent/early/ns/lib/x")
            .await
            .is_err()
    );
    assert_eq!(
        table(&root, "s/agent/late").await,
        format!("{t}{}", point_table("/lib", &[line("beta", &beta, false)]))
    );
    // The events say whose namespace changed.
    let e1 = ns_event(&ev).await;
    let e2 = ns_event(&ev).await;
    assert_eq!(e1["agent"], Value::Null);
    assert_eq!(e1["command"], "mount -b beta /ctx");
    assert_eq!(e2["agent"], aid.as_str());
    assert_eq!(e2["command"], "mount beta /lib");
    // rfork changes nothing and says why.
    let r = ns(&root, "s/agent/late", "rfork").await.unwrap();
    assert!(r.contains("already private"), "{r}");
    let r = ns(&root, "s", "bead-rfork").await.unwrap();
    assert!(r.contains("template new agents copy"), "{r}");
    assert_eq!(table(&root, "s").await, before);
    // The agent's namespace file names the agent.
    let f = srv
        .state_dir()
        .join("sessions")
        .join(read_all(&root, "session/s/id").await.trim_end())
        .join("agents")
        .join(&aid)
        .join("ns.json");
    let v: Value = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
    assert_eq!(v["profile"], "acequia/session-namespace");
    assert_eq!(v["session"], aid.as_str());
    assert_eq!(v["mounts"].as_array().unwrap().len(), 2);
    assert_eq!(v["mounts"][0]["bead"], uri(&alpha).as_str());
}

// ---------------------------------------------------------------------------------------------
// Persistence

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_and_their_files_survive_a_restart() {
    let (mut srv, reg) = beads_srv();
    make_bead(&reg, 1, "alpha", &[("x", "A\n")]);
    let gamma = make_bead(&reg, 3, "gamma", &[]);
    let (stables, atable) = {
        let (_c, root) = attach(&srv, &me()).await;
        session(&root, "s").await;
        ns(&root, "s", "mount alpha /ctx").await.unwrap();
        create(&root, "session/s/ns/ctx", "own", 0o644, "mine\n")
            .await
            .unwrap();
        create(&root, "session/s/ns/ctx/notes", "pending.md", 0o644, "p\n")
            .await
            .unwrap();
        agent(&root, "s", "a").await;
        ns(&root, "s/agent/a", "mount -ac gamma /ctx")
            .await
            .unwrap();
        create(
            &root,
            "session/s/agent/a/ns/ctx/notes",
            "n.md",
            0o644,
            "n\n",
        )
        .await
        .unwrap();
        ns(&root, "s", "mount -a gamma /lib").await.unwrap();
        (table(&root, "s").await, table(&root, "s/agent/a").await)
    };
    srv.kill9();
    relaunch(&mut srv);
    let (_c, root) = attach(&srv, &me()).await;
    assert_eq!(table(&root, "s").await, stables);
    assert_eq!(table(&root, "s/agent/a").await, atable);
    assert_eq!(read_all(&root, "session/s/ns/ctx/x").await, "A\n");
    assert_eq!(read_all(&root, "session/s/ns/ctx/own").await, "mine\n");
    assert_eq!(
        read_all(&root, "session/s/ns/ctx/notes/pending.md").await,
        "p\n"
    );
    assert_eq!(
        read_all(&root, "session/s/agent/a/ns/ctx/notes/n.md").await,
        "n\n"
    );
    assert!(gamma.join(today()).join("notes/n.md").is_file());
    // And it keeps working: the session's pending note settles when gamma becomes its target.
    ns(&root, "s", "mount -ac gamma /ctx").await.unwrap();
    assert!(gamma.join(today()).join("notes/pending.md").is_file());
    assert!(
        !srv.stderr().contains("namespace skipped"),
        "{}",
        srv.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_namespace_file_is_skipped_and_the_server_starts() {
    let (mut srv, reg) = beads_srv();
    make_bead(&reg, 1, "alpha", &[("x", "A\n")]);
    let sid = {
        let (_c, root) = attach(&srv, &me()).await;
        let sid = session(&root, "s").await;
        session(&root, "t").await;
        ns(&root, "s", "mount alpha /ctx").await.unwrap();
        ns(&root, "t", "mount alpha /ctx").await.unwrap();
        sid
    };
    srv.kill9();
    let file = srv.state_dir().join("sessions").join(&sid).join("ns.json");
    assert!(file.is_file(), "layout: {}", file.display());
    std::fs::write(&file, b"{\"profile\": garbage\x00\xff").unwrap();
    relaunch(&mut srv);
    let (_c, root) = attach(&srv, &me()).await;
    // The session is there with an empty namespace; the other keeps its own.
    assert_eq!(table(&root, "s").await, "");
    assert!(table(&root, "t").await.starts_with("/ctx (union)\n"));
    let err = srv.stderr();
    assert!(
        err.contains(&file.display().to_string()) && err.contains("namespace skipped"),
        "stderr does not name {}:\n{err}",
        file.display()
    );
    // It works again, and the next change replaces the bad file.
    ns(&root, "s", "mount alpha /ctx").await.unwrap();
    let v: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(v["session"], sid.as_str());
}

// ---------------------------------------------------------------------------------------------
// Malformed commands

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_ctl_lines_are_one_line_errors_and_change_nothing() {
    let (srv, reg) = beads_srv();
    make_bead(&reg, 1, "alpha", &[]);
    make_bead(&reg, 2, "beta", &[]);
    let (_c, root) = attach(&srv, &me()).await;
    let sid = session(&root, "s").await;
    ns(&root, "s", "mount -c alpha /ctx").await.unwrap();
    let file = srv.state_dir().join("sessions").join(&sid).join("ns.json");
    let before = table(&root, "s").await;
    let saved = std::fs::read(&file).unwrap();
    for (line, want) in [
        ("", "empty command"),
        ("   \n\n", "empty command"),
        (
            "frob",
            "unknown command \"frob\" (valid: start, mount, unmount, ns, rfork, list)",
        ),
        ("mount", "usage: mount [-b|-a] [-c] BEAD POINT"),
        ("mount alpha", "usage: mount"),
        ("mount -x beta /ctx", "unknown flag -x"),
        ("mount -ab beta /ctx", "-a and -b exclude each other"),
        ("mount beta ctx", "invalid mount point \"ctx\""),
        ("mount beta /a/b", "invalid mount point"),
        ("mount beta /ctl", "invalid mount point"),
        ("mount -a nosuchbead /ctx", "no bead named \"nosuchbead\""),
        ("mount -a /nonexistent/dir /ctx", "not a bead"),
        (
            "mount -a https://example.com/.agents/A/ /ctx",
            "remote beads are not supported",
        ),
        ("mount -ac beta /ctx", "already has a create target"),
        ("unmount a b c", "usage: unmount"),
        ("unmount beta /ctx", "not mounted at /ctx"),
        ("unmount /nowhere", "nothing is mounted at /nowhere"),
        ("ns extra", "ns: takes no arguments"),
        ("rfork now", "rfork: takes no arguments"),
        ("list all", "list: takes no arguments"),
        ("start Not_A_Slug!", "invalid slug"),
        ("ns\nns", "one command per write"),
    ] {
        let e = expect_err(ns(&root, "s", line).await, line);
        assert!(e.contains(want), "{line:?}: {e}");
        assert_eq!(
            table(&root, "s").await,
            before,
            "{line:?} changed the table"
        );
        assert_eq!(
            std::fs::read(&file).unwrap(),
            saved,
            "{line:?} changed the file"
        );
    }
    // Nothing was born in the registry either (the failed start).
    assert_eq!(std::fs::read_dir(&reg).unwrap().count(), 2);
    // A table cannot be written, a ctl's error is the write's.
    let e = expect_err(
        try_open(&root, "session/s/ns/table", om::OWRITE)
            .await
            .map(|_| ()),
        "write table",
    );
    assert!(e.contains("permission denied"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Another client: py9p

#[test]
fn py9p_lists_and_reads_a_union_view() {
    let test = "py9p_lists_and_reads_a_union_view";
    let why = match Command::new("python3")
        .args(["-c", "from py9p import py9p; py9p.Client"])
        .output()
    {
        Err(e) => Some(format!("python3 not runnable: {e}")),
        Ok(o) if o.status.success() => None,
        Ok(_) => Some("py9p not importable (pip install p9fs==0.0.4)".to_owned()),
    };
    if let Some(why) = why {
        if ollie_testkit::require_all() {
            panic!("{test}: {why} (OLLIE_TEST_REQUIRE=all)");
        }
        println!("SKIP {test}: {why}");
        return;
    }
    let (srv, reg) = beads_srv();
    make_bead(&reg, 1, "alpha", &[("x", "from alpha\n")]);
    make_bead(&reg, 2, "beta", &[("x", "from beta\n"), ("y", "why\n")]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (_c, root) = attach(&srv, &me()).await;
        session(&root, "py").await;
        ns(&root, "py", "mount alpha /ctx").await.unwrap();
        ns(&root, "py", "mount -a beta /ctx").await.unwrap();
    });
    let script = r#"
import sys
sys.path.insert(0, sys.argv[2])
from _common import check, connect, read_all
c = connect(sys.argv[1])
c.open("session/py/ns/ctx")
names = sorted(z.name.decode() if isinstance(z.name, bytes) else z.name for z in c.lsdir())
c.close()
print("ls " + " ".join(names))
print("x " + read_all(c, "session/py/ns/ctx/x").decode().strip())
print("y " + read_all(c, "session/py/ns/ctx/y").decode().strip())
print("table " + read_all(c, "session/py/ns/table").decode().splitlines()[0])
print("ok")
"#;
    let o = run(
        Command::new("python3")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .arg("-c")
            .arg(script)
            .arg(&srv.sock)
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("py9p")),
        b"",
    );
    let out = text(&o.stdout);
    assert!(
        o.status.success(),
        "py9p failed ({}):\n{out}\n{}\nserver:\n{}",
        o.status,
        text(&o.stderr),
        srv.stderr()
    );
    assert!(
        out.contains("ls agent.json artifacts notes skills x y\n"),
        "{out}"
    );
    assert!(out.contains("x from alpha\n"), "{out}");
    assert!(out.contains("y why\n"), "{out}");
    assert!(out.contains("table /ctx (union)\n"), "{out}");
}
