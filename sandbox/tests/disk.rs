//! Aggregate disk limits (ESCAPES cases 44 and 45): RLIMIT_FSIZE bounds one file, the runner's
//! disk watchdog bounds the sum. A tool that writes many files or creates many inodes is
//! stopped once the free space (inodes) of the workspace's filesystem shrank by more than
//! `limits.disk_bytes` (`limits.disk_inodes`); the record says why; the workspace can be
//! cleaned afterwards.
//!
//! The workspace is a temp directory on the normal disk. Free-space figures include other
//! writers on that filesystem, so the host-side checks carry generous slack; the precise
//! checks count what the tool left in its workspace.
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_policy::Policy;
use ollie_sandbox::{DiskLimit, KilledBy, RunRequest};
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

mod common;
use common::features_ok;

/// A workspace; while it exists no other test of this file runs. The watchdog samples the
/// whole filesystem, so files another test deletes meanwhile would hide what the tool wrote.
struct Ws(
    PathBuf,
    #[allow(dead_code, reason = "held for the workspace's life, never read")]
    std::sync::MutexGuard<'static, ()>,
);

static QUIET: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Ws {
    fn new(name: &str) -> Ws {
        let quiet = QUIET.lock().unwrap_or_else(|p| p.into_inner());
        let d = std::env::temp_dir().join(format!("ollie-disk-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Ws(std::fs::canonicalize(&d).unwrap(), quiet)
    }
    fn req(&self, script: &str) -> RunRequest {
        let mut r = RunRequest::new(
            ["sh", "-c", script].iter().map(Into::into).collect(),
            self.0.clone(),
        );
        r.base_env = vec![("LANG".into(), "C.UTF-8".into())];
        r
    }
}

impl Drop for Ws {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn policy(limits: &str) -> Policy {
    common::profile_with_limits("workspace", limits)
}

/// `(free bytes, free inodes)` of the filesystem holding `p`, from `stat -f`.
fn host_free(p: &Path) -> (u64, u64) {
    let out = std::process::Command::new("stat")
        .args(["-f", "--format=%f %S %d"])
        .arg(p)
        .output()
        .unwrap();
    assert!(out.status.success(), "stat -f failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let v: Vec<u64> = text
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    (v[0] * v[1], v[2])
}

/// Bytes allocated and entries under `dir` (recursive, not following symlinks).
fn usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let (mut bytes, mut entries) = (0, 0);
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let md = e.path().symlink_metadata().unwrap();
        entries += 1;
        bytes += md.blocks() * 512;
        if md.is_dir() {
            let (b, n) = usage(&e.path());
            bytes += b;
            entries += n;
        }
    }
    (bytes, entries)
}

/// Removes everything the tool left (as the runner would) and checks nothing is left.
fn clean(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            std::fs::remove_dir_all(e.path()).unwrap();
        } else {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    assert_eq!(usage(dir), (0, 0));
}

fn healthy(ws: &Ws) {
    let o = ollie_sandbox::run(&policy(""), &ws.req("echo ok")).unwrap();
    assert_eq!(o.record.exit.status, 0);
    assert_eq!(o.record.exit.killed_by, None);
    assert_eq!(o.record.exit.disk_limit, None);
}

#[test]
fn many_files_are_stopped_at_disk_bytes() {
    let name = "many_files_are_stopped_at_disk_bytes";
    if !features_ok(name) {
        return;
    }
    let ws = Ws::new("bytes");
    let limit = 64 * MIB;
    let p = policy(&format!(
        "disk_bytes = {limit}\nfile_size_bytes = 2097152\nkill_grace_ms = 500"
    ));
    // 2 GiB in 1 MiB files, each under RLIMIT_FSIZE: only the aggregate limit can stop it.
    let script = "i=0; while [ $i -lt 2048 ]; do head -c 1048576 /dev/zero > f$i || exit 3; i=$((i+1)); done; echo finished";
    let before = host_free(&ws.0);
    let o = ollie_sandbox::run(&p, &ws.req(script)).unwrap();
    let after = host_free(&ws.0);
    let (written, files) = usage(&ws.0);
    eprintln!(
        "{name}: exit {:?}; workspace {written} bytes in {files} files; host free {} -> {}",
        o.record.exit, before.0, after.0
    );
    // The loop never finished: the run was stopped, and the record says why.
    assert!(!String::from_utf8_lossy(&o.stdout).contains("finished"));
    assert_eq!(o.record.exit.killed_by, Some(KilledBy::DiskLimit));
    assert!(!o.record.exit.timed_out);
    assert!(o.record.exit.signal.is_some(), "{:?}", o.record.exit);
    let hit = o.record.exit.disk_limit.clone().unwrap();
    assert_eq!(hit.limit, DiskLimit::DiskBytes);
    assert_eq!(hit.allowed, limit);
    assert!(hit.observed > limit);
    assert!(hit.free_bytes_start - hit.free_bytes_stop == hit.observed);
    assert_eq!(hit.path, ws.0);
    assert_eq!(o.record.limits.disk_bytes, limit);
    let json: serde_json::Value = serde_json::from_str(&o.record.to_json()).unwrap();
    assert_eq!(json["exit"]["killed_by"], "disk_limit");
    assert_eq!(json["exit"]["disk_limit"]["limit"], "disk_bytes");
    // What the tool left: at most the limit plus what it writes between two samples and
    // before the gross-overshoot SIGKILL (an eighth of the limit) — far below 2 GiB.
    assert!(written <= limit + 64 * MIB, "tool wrote {written} bytes");
    // Host free space dropped by no more than the limit plus slack (other writers on this
    // filesystem count too, hence the wide slack).
    assert!(
        before.0.saturating_sub(after.0) <= limit + 512 * MIB,
        "host free space dropped by {}",
        before.0.saturating_sub(after.0)
    );
    // The workspace can be cleaned, and the runner still works.
    clean(&ws.0);
    healthy(&ws);
}

#[test]
fn many_inodes_are_stopped_at_disk_inodes() {
    let name = "many_inodes_are_stopped_at_disk_inodes";
    if !features_ok(name) {
        return;
    }
    let ws = Ws::new("inodes");
    let limit = 20_000;
    let p = policy(&format!("disk_inodes = {limit}\nkill_grace_ms = 500"));
    // 400,000 empty files: only the inode limit can stop it before the timeout.
    let script = "mkdir d && cd d && seq 1 400000 | xargs touch; echo finished";
    let before = host_free(&ws.0);
    let o = ollie_sandbox::run(&p, &ws.req(script)).unwrap();
    let after = host_free(&ws.0);
    let (_, entries) = usage(&ws.0);
    eprintln!(
        "{name}: exit {:?}; workspace {entries} entries; host free inodes {} -> {}",
        o.record.exit, before.1, after.1
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("finished"));
    assert_eq!(o.record.exit.killed_by, Some(KilledBy::DiskLimit));
    assert!(!o.record.exit.timed_out);
    let hit = o.record.exit.disk_limit.clone().unwrap();
    assert_eq!(hit.limit, DiskLimit::DiskInodes);
    assert_eq!(hit.allowed, limit);
    assert!(hit.observed > limit);
    assert_eq!(o.record.limits.disk_inodes, limit);
    // At most the limit plus one `touch` batch and the overshoot margin — far below 400,000.
    assert!(entries <= 3 * limit, "tool created {entries} entries");
    assert!(
        before.1.saturating_sub(after.1) <= 3 * limit + 50_000,
        "host free inodes dropped by {}",
        before.1.saturating_sub(after.1)
    );
    // The runner can clean the workspace afterwards.
    clean(&ws.0);
    healthy(&ws);
}

#[test]
fn runs_within_the_limits_are_not_stopped() {
    let name = "runs_within_the_limits_are_not_stopped";
    if !features_ok(name) {
        return;
    }
    let ws = Ws::new("within");
    // Limits well above what this test and its siblings (running in parallel on the same
    // filesystem) consume.
    let p = policy(&format!("disk_bytes = {}", 1024 * MIB));
    // 8 MiB and 100 files; the tool also removes what it wrote (free space grows back).
    let o = ollie_sandbox::run(
        &p,
        &ws.req("head -c 8388608 /dev/zero > big && mkdir d && cd d && seq 1 100 | xargs touch && cd .. && rm -r d big && echo finished"),
    )
    .unwrap();
    assert_eq!(o.stdout, b"finished\n");
    assert_eq!(o.record.exit.status, 0);
    assert_eq!(o.record.exit.killed_by, None);
    assert_eq!(o.record.exit.disk_limit, None);
}

/// Runs `writers` parallel writers (each endless: 8 MiB files, RLIMIT_FSIZE, one after
/// another, in large `write`s) under a 32 MiB `disk_bytes` with a long grace period; returns the bytes the run
/// left in its workspace and what the watchdog had seen taken when it noticed, and checks the
/// record says the disk limit stopped it.
fn parallel_writers(name: &str, writers: u32) -> (u64, u64) {
    parallel_writers_in(name, writers, false)
}

/// [`parallel_writers`], `escalated`: run as an approved escalation is (the program from a
/// descriptor the caller opened, `RunRequest::exec_fd`).
fn parallel_writers_in(name: &str, writers: u32, escalated: bool) -> (u64, u64) {
    let ws = Ws::new(&format!("par{writers}{escalated}"));
    let limit = 32 * MIB;
    let p = policy(&format!(
        "disk_bytes = {limit}\nfile_size_bytes = 8388608\nkill_grace_ms = 5000"
    ));
    let script = format!(
        "for i in $(seq {writers}); do (trap 'touch termed_$i; exit 7' TERM; j=0; while [ $j -lt 64 ]; do head -c 268435456 /dev/zero > w${{i}}_$j 2>/dev/null; j=$((j+1)); done) & done; wait; echo finished"
    );
    let mut req = ws.req(&script);
    if escalated {
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        req.exec_fd = Some(ollie_sandbox::ExecFd {
            fd: std::sync::Arc::new(std::fs::File::open(&sh).unwrap().into()),
            path: sh,
        });
    }
    let o = ollie_sandbox::run(&p, &req).unwrap();
    if escalated {
        assert_eq!(o.record.exec, ollie_sandbox::ExecFrom::Fd);
    }
    let (written, files) = usage(&ws.0);
    let hit = o.record.exit.disk_limit.clone();
    // No grace: no writer got a SIGTERM to keep running through (its trap leaves a file).
    let termed = std::fs::read_dir(&ws.0)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("termed"))
        .count();
    assert_eq!(termed, 0, "{termed} writers got SIGTERM");
    eprintln!(
        "{name}: {writers} writers: workspace {written} bytes ({:.2}x the limit) in {files} files; noticed at {:?}",
        written as f64 / limit as f64,
        hit.as_ref().map(|h| h.observed)
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("finished"));
    assert_eq!(o.record.exit.killed_by, Some(KilledBy::DiskLimit));
    // Killed at once (SIGKILL), not after the grace period.
    assert_eq!(o.record.exit.signal, Some(9), "{:?}", o.record.exit);
    let json: serde_json::Value = serde_json::from_str(&o.record.to_json()).unwrap();
    assert_eq!(json["exit"]["killed_by"], "disk_limit");
    clean(&ws.0);
    (written, hit.map_or(u64::MAX, |h| h.observed))
}

/// A sanity bound on what the watchdog had seen taken when it noticed. Near the limit it
/// samples every millisecond, so on an idle machine the run is noticed within about an eighth
/// of the budget past it however many writers share it (docs/sandbox.md "Disk and inode
/// limits" has the figures); but the runner is a thread like any other, and on a loaded
/// machine it is scheduled late (measured up to 2.25x here while other builds ran). The
/// figures are printed; what is asserted holds under any load.
const NOTICED_BOUND: u64 = 4 * 32 * MIB;
/// What the run takes after that, until every writer is dead (the runner kills pid 1 and
/// then each other process of the run itself): a loose bound.
const LEFT_BOUND: u64 = 8 * 32 * MIB;

fn within_bounds(writers: u32, (written, noticed): (u64, u64)) {
    assert!(
        noticed <= NOTICED_BOUND,
        "{writers} writers had taken {noticed} bytes when noticed"
    );
    assert!(
        written <= LEFT_BOUND,
        "{writers} writers left {written} bytes"
    );
}

#[test]
fn sixteen_parallel_writers_stay_within_the_bound() {
    let name = "sixteen_parallel_writers_stay_within_the_bound";
    if !features_ok(name) {
        return;
    }
    // Three rounds: the overshoot varies with the machine's load; the bound holds in each.
    for _ in 0..3 {
        within_bounds(16, parallel_writers(name, 16));
    }
}

#[test]
fn one_and_four_parallel_writers_stay_within_the_bound() {
    let name = "one_and_four_parallel_writers_stay_within_the_bound";
    if !features_ok(name) {
        return;
    }
    for n in [1, 4] {
        within_bounds(n, parallel_writers(name, n));
    }
}

#[test]
fn sixteen_parallel_writers_of_an_escalated_run_stay_within_the_bound() {
    let name = "sixteen_parallel_writers_of_an_escalated_run_stay_within_the_bound";
    if !features_ok(name) {
        return;
    }
    within_bounds(16, parallel_writers_in(name, 16, true));
}

/// The stop is a SIGKILL at once, never SIGTERM and a grace period to write through: a
/// writer appending 1 MiB every 5 ms crosses a 32 MiB budget by less than an eighth (the
/// watchdog notices within a few chunks), and its SIGTERM trap, which would leave a file,
/// never runs. (Before, such a crossing got SIGTERM and `kill_grace_ms` to go on writing.)
#[test]
fn a_disk_limit_stops_the_run_at_once_without_a_grace_period() {
    let name = "a_disk_limit_stops_the_run_at_once_without_a_grace_period";
    if !features_ok(name) {
        return;
    }
    let ws = Ws::new("nograce");
    let limit = 32 * MIB;
    let p = policy(&format!(
        "disk_bytes = {limit}\nfile_size_bytes = 8388608\nkill_grace_ms = 60000"
    ));
    let script = "trap 'touch termed; exit 7' TERM; i=0; \
        while [ $i -lt 96 ]; do head -c 1048576 /dev/zero > f_$i; i=$((i+1)); sleep 0.005; done; \
        echo finished";
    let o = ollie_sandbox::run(&p, &ws.req(script)).unwrap();
    assert_eq!(
        o.record.exit.killed_by,
        Some(KilledBy::DiskLimit),
        "{:?}",
        o.record.exit
    );
    assert_eq!(o.record.exit.signal, Some(9), "{:?}", o.record.exit);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("finished"));
    assert!(
        !ws.0.join("termed").exists(),
        "the run got SIGTERM and a grace period"
    );
    clean(&ws.0);
}
