//! olliesrv's own directories are secret by their real paths, not only at the default ones
//! (issue 48 item 1): a session's or agent's `cwd=` that is, lies inside or contains the
//! server's state directory (`--state-dir`, `XDG_STATE_HOME`), its configuration (`--config`
//! and the `agents/` beside it, `XDG_CONFIG_HOME/ollie`), or another instance's state
//! directory is refused with one line, `force=yes` or not, and nothing is written there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use common::*;
use ollie_testkit::client::rdwr_text as rdwr;

const REPLAY: &str = "default_backend = \"demo\"\n[backends.demo]\nkind = \"replay\"\nfile = \"/nonexistent-turns.jsonl\"\n";

/// Every file under `dir` with its contents (what a refused request must leave as it was).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                todo.push(p);
            } else if m.is_file() {
                out.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

/// `session/new` with `spec` is refused with one line containing `why`, and creates nothing.
async fn refused(root: &ollie_p9::Fid, spec: &str, why: &str) {
    let e = rdwr(root, "session/new", spec)
        .await
        .expect_err("a cwd touching ollie's own directories was accepted");
    assert!(e.contains(why), "{spec}: {e}");
    assert!(!e.trim_end().contains('\n'), "{spec}: not one line: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cwd_touching_the_servers_own_directories_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let home = base.join("home");
    let xs = base.join("xdg-state");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(xs.join("ollie/sessions")).unwrap();
    std::fs::create_dir_all(base.join("agents")).unwrap();
    std::fs::create_dir_all(base.join("work")).unwrap();
    let srv = Srv::start_with(dir, REPLAY, |c| {
        c.env("HOME", &home).env("XDG_STATE_HOME", &xs);
    });
    let state = srv.state_dir().canonicalize().unwrap();
    assert!(
        state.join(ollie_link::instances::MARKER).is_file(),
        "olliesrv marks its state directory"
    );
    let (_c, root) = attach(&srv, &me()).await;
    let before = snapshot(&state);
    let s = |p: &Path| p.display().to_string();
    for (cwd, why) in [
        (s(&state), "is inside ollie's own"),
        (s(&state.join("sessions")), "is inside ollie's own"),
        // Containing it is as bad: the workspace policy makes the cwd writable.
        (s(&base), "contains ollie's own"),
        (s(&base.join("agents")), "is inside ollie's own"),
        (s(&xs.join("ollie")), "is inside ollie's own"),
        (s(&xs.join("ollie/sessions")), "is inside ollie's own"),
    ] {
        for force in ["", " force=yes"] {
            refused(&root, &format!("name=stx cwd={cwd}{force}"), why).await;
        }
    }
    assert!(
        ollie_testkit::client::walk(&root, "session/stx")
            .await
            .is_err(),
        "a refused session exists"
    );
    // An agent's cwd too.
    rdwr(
        &root,
        "session/new",
        &format!("name=ok cwd={}", s(&base.join("work"))),
    )
    .await
    .unwrap();
    let e = rdwr(
        &root,
        "session/ok/agent/new",
        &format!("name=x cwd={}", s(&state)),
    )
    .await
    .expect_err("an agent cwd in the state directory was accepted");
    assert!(e.contains("is inside ollie's own"), "{e}");
    // Nothing that was in the state directory was changed by the refused requests (the
    // accepted session only added its own files).
    let after = snapshot(&state);
    for (p, text) in &before {
        if p.ends_with("audit.jsonl") || p.starts_with(state.join("sessions")) {
            continue;
        }
        let now = after.iter().find(|(q, _)| q == p).map(|(_, t)| t);
        assert_eq!(now, Some(text), "{} changed", p.display());
    }
    let audit = std::fs::read_to_string(state.join("audit.jsonl")).unwrap_or_default();
    assert!(
        !audit.contains("\"stx\""),
        "a refused session was audited: {audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_config_directory_at_xdg_config_home_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let xdg = base.join("xdg");
    std::fs::create_dir_all(xdg.join("ollie/agents")).unwrap();
    std::fs::write(xdg.join("ollie/config.toml"), REPLAY).unwrap();
    std::fs::write(xdg.join("ollie/agents/esc.toml"), "backend = \"demo\"\n").unwrap();
    let srv = Srv::start_without_config_flag(dir, &xdg);
    let (_c, root) = attach(&srv, &me()).await;
    for cwd in [xdg.join("ollie"), xdg.join("ollie/agents"), xdg.clone()] {
        let why = if cwd == xdg {
            "contains ollie's own"
        } else {
            "is inside ollie's own"
        };
        refused(&root, &format!("name=cfg cwd={}", cwd.display()), why).await;
    }
    assert_eq!(
        std::fs::read_to_string(xdg.join("ollie/agents/esc.toml")).unwrap(),
        "backend = \"demo\"\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instances_state_directory_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let home_p = home.path().canonicalize().unwrap();
    let d1 = tempfile::tempdir().unwrap();
    let b1 = d1.path().canonicalize().unwrap();
    let first = Srv::start_with(d1, REPLAY, |c| {
        c.env("HOME", &home_p);
    });
    let state1 = first.state_dir().canonicalize().unwrap();
    // The first server listed its state directory for this user.
    let listed = std::fs::read_to_string(home_p.join(".local/state/ollie/state-dirs")).unwrap();
    assert!(listed.lines().any(|l| Path::new(l) == state1), "{listed}");
    let second = Srv::start_with(tempfile::tempdir().unwrap(), REPLAY, |c| {
        c.env("HOME", &home_p);
    });
    let (_c, root) = attach(&second, &me()).await;
    refused(
        &root,
        &format!("name=o1 cwd={}", state1.display()),
        "is inside ollie's own",
    )
    .await;
    refused(
        &root,
        &format!("name=o2 cwd={}", b1.display()),
        "contains ollie's own",
    )
    .await;
    // A state directory found by its marker alone (never listed, e.g. copied).
    let stray = home_p.join("copy");
    std::fs::create_dir_all(stray.join("sessions")).unwrap();
    std::fs::write(stray.join(ollie_link::instances::MARKER), "").unwrap();
    refused(
        &root,
        &format!("name=o3 cwd={}", stray.join("sessions").display()),
        "is inside the ollie state directory",
    )
    .await;
    drop(first);
}
