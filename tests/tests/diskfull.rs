//! The state directory full, or remounted read-only, under a running olliesrv: writes that
//! cannot be made durable are refused with the cause named (ENOSPC, EROFS), nothing already
//! durable is damaged, reads keep being served, and the server recovers by itself when space
//! (or write access) returns. The state directory is a small tmpfs mounted for the test, so
//! this needs root; without it the test is skipped (a failure under OLLIE_TEST_REQUIRE=all).
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use common::*;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use ollie_p9::Fid;
use ollie_testkit::client::{rdwr_text, read_text, write_text};

/// A tmpfs of `size` mounted at `dir` until dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(format!("size={size},mode=0700").as_str()),
        )
        .unwrap_or_else(|e| panic!("mount tmpfs on {}: {e}", dir.display()));
        Tmpfs(dir.to_path_buf())
    }

    /// Makes the state directory read-only (`true`) or writable again (`false`), as an
    /// administrator or the kernel remounting it would: a read-only bind mount over it
    /// (olliesrv's open append handles would make a remount of the tmpfs itself busy).
    fn read_only(&self, on: bool) {
        if on {
            mount(
                Some(&self.0),
                &self.0,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .unwrap_or_else(|e| panic!("bind {}: {e}", self.0.display()));
            mount(
                None::<&str>,
                &self.0,
                None::<&str>,
                MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .unwrap_or_else(|e| panic!("remount {} read-only: {e}", self.0.display()));
        } else {
            umount2(&self.0, MntFlags::MNT_DETACH)
                .unwrap_or_else(|e| panic!("unmount the read-only {}: {e}", self.0.display()));
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = umount2(&self.0, MntFlags::MNT_DETACH);
    }
}

/// Can this process mount? (root, or CAP_SYS_ADMIN in its namespace.)
fn can_mount() -> bool {
    let probe = tempfile::tempdir().unwrap();
    let ok = mount(
        Some("tmpfs"),
        probe.path(),
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=64k"),
    )
    .is_ok();
    if ok {
        let _ = umount2(probe.path(), MntFlags::MNT_DETACH);
    }
    ok
}

/// Whether the test can mount its tmpfs; if not, the SKIP line (a failure under
/// OLLIE_TEST_REQUIRE=all).
fn mount_or_skip() -> bool {
    can_mount()
        || ollie_testkit::skip_or_fail(
            "diskfull",
            "cannot mount a tmpfs (needs root)",
            "diskfull: cannot mount a tmpfs for the state directory (needs root)",
        )
}

/// Fills the filesystem of `dir` with `dir/filler` until it is full.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let p = dir.join("filler");
    let mut f = std::fs::File::create(&p).unwrap();
    let block = vec![0x55u8; 64 * 1024];
    loop {
        match f.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", p.display()),
        }
    }
    // The last partial block too.
    while f.write(&[1]).is_ok_and(|n| n == 1) {}
    p
}

fn refused(r: Result<impl std::fmt::Debug, String>, what: &str, cause: &str) -> String {
    match r {
        Ok(v) => panic!("{what} succeeded ({v:?}) on a state directory that cannot take it"),
        Err(e) => {
            assert!(
                e.to_lowercase().contains(cause),
                "{what}: the error does not name {cause:?}: {e}"
            );
            assert!(!e.contains('\n'), "{what}: not one line: {e}");
            println!("{what}: {e}");
            e
        }
    }
}

/// Every write the test makes, refused with `cause` in its error.
async fn writes_refused(root: &Fid, cause: &str) {
    let a = "session/s/agent/a";
    refused(
        write_text(root, &format!("{a}/plan"), "2. never\n").await,
        "plan",
        cause,
    );
    refused(
        write_text(root, &format!("{a}/prompt"), "never queued").await,
        "prompt",
        cause,
    );
    refused(
        write_text(root, &format!("{a}/cfg"), "temperature=0.9").await,
        "cfg",
        cause,
    );
    refused(
        rdwr_text(root, "session/s/agent/new", "name=b").await,
        "agent/new",
        cause,
    );
    refused(
        rdwr_text(root, "session/new", "name=t cwd=/tmp").await,
        "session/new",
        cause,
    );
    refused(
        write_text(root, "session/s/name", "renamed").await,
        "rename",
        cause,
    );
}

/// What must still read as before.
async fn reads_served(root: &Fid) {
    let a = "session/s/agent/a";
    assert_eq!(
        read_text(root, &format!("{a}/plan")).await.unwrap(),
        "1. kept\n"
    );
    let cfg = read_text(root, &format!("{a}/cfg")).await.unwrap();
    assert!(cfg.contains("temperature=0.5"), "{cfg}");
    let idx = read_text(root, "session/idx").await.unwrap();
    assert_eq!(idx.lines().count(), 1, "{idx}");
    assert!(idx.starts_with("s\t"), "{idx}");
    let agents = read_text(root, "session/s/agent/idx").await.unwrap();
    assert_eq!(agents.lines().count(), 1, "{agents}");
    read_text(root, &format!("{a}/stats")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_or_read_only_state_directory_refuses_writes_and_recovers() {
    if !mount_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(&dir.path().join("state"), "2m");
    let mut srv = Srv::start_with(dir, CONFIG, |_| {});
    let state = srv.state_dir();
    {
        let (_c, root) = attach(&srv, &me()).await;
        rdwr_text(&root, "session/new", "name=s cwd=/tmp")
            .await
            .unwrap();
        rdwr_text(&root, "session/s/agent/new", "name=a")
            .await
            .unwrap();
        write_text(&root, "session/s/agent/a/plan", "1. kept\n")
            .await
            .unwrap();
        write_text(&root, "session/s/agent/a/cfg", "temperature=0.5")
            .await
            .unwrap();

        // Full: every write refused, naming the cause; reads as before.
        let filler = fill(&state);
        writes_refused(&root, "no space left on device").await;
        reads_served(&root).await;
        // Space returns: the same connection's writes work again.
        std::fs::remove_file(&filler).unwrap();
        write_text(&root, "session/s/agent/a/plan", "1. kept\n")
            .await
            .unwrap();
        write_text(&root, "session/s/agent/a/cfg", "temperature=0.5")
            .await
            .expect("cfg after space returned");

        // Read-only: the same.
        fs.read_only(true);
        writes_refused(&root, "read-only file system").await;
        reads_served(&root).await;
        fs.read_only(false);
        rdwr_text(&root, "session/s/agent/new", "name=b")
            .await
            .expect("agent/new after the remount");
        rdwr_text(&root, "session/s/agent/b/ctl", "kill")
            .await
            .unwrap();
    }
    // Nothing durable was damaged: the restarted server has what was acknowledged.
    srv.kill9();
    let out = run(
        std::process::Command::new(bin("olliesrv"))
            .arg("--check-state")
            .arg(&state),
        b"",
    );
    assert!(out.status.success(), "{}", text(&out.stdout));
    srv.relaunch(|_| {});
    let (_c, root) = attach(&srv, &me()).await;
    reads_served(&root).await;
    // A refused prompt was not queued: no turn ever ran for it.
    let log = read_text(&root, "session/s/agent/a/log").await.unwrap();
    assert!(!log.contains("never queued"), "{log}");
    drop(srv);
    drop(fs);
}

/// A prompt acknowledged before the state directory turned read-only does not start its turn
/// while the start cannot be recorded (a crash would otherwise run it a second time: the disk
/// still shows it queued); it starts once the directory is writable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_start_cannot_be_recorded_waits_for_the_disk() {
    if !mount_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(&dir.path().join("state"), "8m");
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let turns = dir.path().join("turns.jsonl");
    std::fs::write(
        &turns,
        concat!(
            r#"{"tool_calls": [{"name": "execute_code", "arguments": {"language": "bash", "code": "sleep 5"}}]}"#,
            "\n",
            r#"{"text": "first done"}"#,
            "\n",
            r#"{"text": "second done"}"#,
            "\n"
        ),
    )
    .unwrap();
    let config = format!(
        "default_backend = \"demo\"\n\n[backends.demo]\nkind = \"replay\"\nfile = \"{}\"\n",
        turns.display()
    );
    let srv = Srv::start_with(dir, &config, |_| {});
    let (_c, root) = attach(&srv, &me()).await;
    new_session(&root, &work, "name=a").await;
    let log = "session/s/agent/a/log";
    let guard = std::time::Duration::from_secs(30);
    write_text(&root, "session/s/agent/a/prompt", "first")
        .await
        .unwrap();
    ollie_testkit::client::wait_for_text(&root, log, "[[[tool_call", guard).await;
    write_text(&root, "session/s/agent/a/prompt", "second")
        .await
        .unwrap();
    fs.read_only(true);
    ollie_testkit::client::wait_for_text(&root, log, "first done", guard).await;
    // Only a start that wrongly ran would show within this pause; passing never depends on
    // the machine's speed.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let text = read_text(&root, log).await.unwrap();
    assert!(
        !text.contains("second done"),
        "ran while unrecordable:\n{text}"
    );
    assert_eq!(text.matches("[[[user").count(), 1, "{text}");
    assert!(
        srv.stderr()
            .contains("cannot record the start of the next turn"),
        "{}",
        srv.stderr()
    );
    fs.read_only(false);
    ollie_testkit::client::wait_for_text(&root, log, "second done", guard).await;
    let text = read_text(&root, log).await.unwrap();
    assert_eq!(text.matches("[[[user").count(), 2, "{text}");
    drop(srv);
    drop(fs);
}
