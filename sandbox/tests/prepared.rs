//! The prepared (zygote) path: `Prepared::new` once, then `Prepared::run` per call. It must
//! deny what the one-shot path denies, kill each call's whole tree and only that call's, and
//! leave nothing behind when dropped.
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead. Restrictions are applied
//! only in the sandbox's children, never in this harness.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_policy::Policy;
use ollie_sandbox::{Cancel, MemoryBound, MemoryScope, Prepared, RunRequest, SandboxError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
use common::{features_ok, procs_with, wait_gone};

struct Ws(PathBuf);

impl Ws {
    fn new(name: &str) -> Ws {
        let d = std::env::temp_dir().join(format!("ollie-prep-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Ws(d.canonicalize().unwrap())
    }
    fn home(&self) -> PathBuf {
        let h = self.0.join("home");
        std::fs::create_dir_all(&h).unwrap();
        h
    }
    fn req(&self, argv: &[&str]) -> RunRequest {
        let mut r = RunRequest::new(argv.iter().map(Into::into).collect(), self.0.join("w"));
        r.home = self.home();
        r.base_env = vec![
            ("LANG".into(), "C.UTF-8".into()),
            ("OPENAI_API_KEY".into(), "sk-canary".into()),
        ];
        r
    }
    fn prepare(&self, p: &Policy) -> Prepared {
        std::fs::create_dir_all(self.0.join("w")).unwrap();
        Prepared::new(p, &self.0.join("w"), &self.home()).unwrap()
    }
}

impl Drop for Ws {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn policy(profile: &str, limits: &str) -> Policy {
    common::profile_with_limits(profile, limits)
}

#[test]
fn exit_status_signals_output_and_record() {
    if !features_ok("exit_status_signals_output_and_record") {
        return;
    }
    let ws = Ws::new("exit");
    let sb = ws.prepare(&policy("workspace", "output_bytes = 10"));
    let o = sb
        .run(&ws.req(&["sh", "-c", "echo 0123456789abc; echo err >&2; exit 3"]))
        .unwrap();
    assert_eq!((o.record.exit.code, o.record.exit.status), (Some(3), 3));
    assert_eq!(o.stdout, b"0123456789");
    assert!(o.record.stdout.truncated);
    assert_eq!(o.record.stdout.total_bytes, 14);
    assert_eq!(o.stderr, b"err\n");
    let o = sb.run(&ws.req(&["sh", "-c", "kill -KILL $$"])).unwrap();
    assert_eq!((o.record.exit.signal, o.record.exit.status), (Some(9), 137));
    let o = sb.run(&ws.req(&["sh", "-c", "kill -SEGV $$"])).unwrap();
    assert_eq!(
        (o.record.exit.signal, o.record.exit.status),
        (Some(11), 139)
    );
    let o = sb.run(&ws.req(&["true"])).unwrap();
    assert_eq!((o.record.exit.code, o.record.exit.signal), (Some(0), None));
    // SIGPIPE is back to its default in the tool.
    let o = sb
        .run(&ws.req(&[
            "bash",
            "-c",
            "yes | head -c 1 >/dev/null; echo ${PIPESTATUS[0]}",
        ]))
        .unwrap();
    assert_eq!(o.stdout, b"141\n");
    // The environment is the allowlist; stdin is fed; the record is complete JSON.
    let mut r = ws.req(&["sh", "-c", "env; wc -c"]);
    r.stdin = Some(vec![b'x'; 100_000]);
    let sb2 = ws.prepare(&policy("workspace", ""));
    let o = sb2.run(&r).unwrap();
    let text = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(text.contains("LANG=C.UTF-8"), "{text}");
    assert!(!text.contains("sk-canary"));
    assert!(text.trim_end().ends_with("100000"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&o.record.to_json()).unwrap();
    assert_eq!(v["layers"]["landlock"]["status"], "fully_enforced");
    assert_eq!(v["layers"]["capabilities"]["bounding"], 0);
    assert_eq!(v["layers"]["no_new_privs"], true);
    let ns: Vec<String> = v["layers"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    assert!(ns.iter().any(|n| n == "pid (per call)"), "{ns:?}");
    assert!(ns.iter().any(|n| n.starts_with("user (session")), "{ns:?}");
    assert!(
        v["layers"]["seccomp"]["instructions"].as_u64().unwrap() > 0,
        "{v}"
    );
    let session = sb2.session();
    assert!(!session.set_up_once.is_empty() && !session.per_call.is_empty());
    // No unions: no new root, no overlays per call.
    assert!(!session.set_up_once.iter().any(|s| s.contains("union")));
    assert!(!session.per_call.iter().any(|s| s.contains("union")));
    // Refusals name the problem: another workspace, a missing program.
    let mut other = ws.req(&["true"]);
    other.workdir = ws.0.clone();
    assert!(matches!(
        sb2.run(&other),
        Err(SandboxError::InvalidRequest { .. })
    ));
    match sb2.run(&ws.req(&["no-such-program-ollie"])).unwrap_err() {
        SandboxError::Exec { source, .. } => {
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
        }
        e => panic!("{e}"),
    }
}

#[test]
fn filesystem_and_network_denials() {
    if !features_ok("filesystem_and_network_denials") {
        return;
    }
    let ws = Ws::new("deny");
    let outside = ws.0.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let sb = ws.prepare(&policy("workspace", ""));
    // Writing outside the workspace is denied; inside works.
    let target = outside.join("pwned");
    let o = sb
        .run(&ws.req(&[
            "sh",
            "-c",
            &format!("echo x > {}; echo $?", target.display()),
        ]))
        .unwrap();
    assert_ne!(String::from_utf8_lossy(&o.stdout).trim(), "0");
    assert!(!target.exists(), "write outside the workspace succeeded");
    let o = sb
        .run(&ws.req(&[
            "sh",
            "-c",
            "echo ok > inside && chmod +x inside && cat inside",
        ]))
        .unwrap();
    assert_eq!(o.stdout, b"ok\n");
    // Metadata outside writable trees: EROFS from the session's read-only mounts.
    let o = sb
        .run(&ws.req(&["sh", "-c", &format!("chmod 777 {}", outside.display())]))
        .unwrap();
    assert_ne!(o.record.exit.code, Some(0));
    // A loopback TCP canary on the host: connect must be denied (no socket at all).
    let canary = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    canary.set_nonblocking(true).unwrap();
    let port = canary.local_addr().unwrap().port();
    let o = sb
        .run(&ws.req(&[
            "bash",
            "-c",
            &format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"),
        ]))
        .unwrap();
    assert!(!String::from_utf8_lossy(&o.stdout).contains("connected"));
    assert_ne!(o.record.exit.code, Some(0));
    assert!(canary.accept().is_err(), "the canary saw a connection");
    // seccomp: namespaces cannot be created, clone3 says ENOSYS, io_uring is denied.
    let o = sb.run(&ws.req(&["unshare", "-U", "true"])).unwrap();
    assert_ne!(o.record.exit.code, Some(0));
    if Path::new("/usr/bin/python3").exists() {
        let o = sb
            .run(&ws.req(&[
                "python3",
                "-c",
                "import ctypes,os\nl=ctypes.CDLL(None,use_errno=True)\nr=l.syscall(435,0,0)\nprint(r,ctypes.get_errno())\nr=l.syscall(425,1,0)\nprint(r,ctypes.get_errno())",
            ]))
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            format!("-1 {}\n-1 {}\n", libc::ENOSYS, libc::EPERM),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn timeout_kills_a_setsid_double_forked_tree() {
    if !features_ok("timeout_kills_a_setsid_double_forked_tree") {
        return;
    }
    let ws = Ws::new("timeout");
    let sb = ws.prepare(&policy(
        "workspace",
        "timeout_seconds = 1\nkill_grace_ms = 100",
    ));
    let marker = format!("ollie-prep-orphan-{}", std::process::id());
    let script = format!(
        "trap '' TERM HUP; setsid bash -c '(trap \"\" TERM HUP; exec -a {marker} sleep 1000) &' ; nohup bash -c 'exec -a {marker} sleep 1000' >/dev/null 2>&1 & sleep 1000"
    );
    // Watch the descendants appear (so the test cannot pass because they never existed).
    let m2 = marker.clone();
    let watcher = std::thread::spawn(move || {
        let mut most = 0;
        let until = Instant::now() + Duration::from_millis(900);
        while Instant::now() < until {
            most = most.max(procs_with(&m2).len());
            std::thread::sleep(Duration::from_millis(20));
        }
        most
    });
    let o = sb.run(&ws.req(&["bash", "-c", &script])).unwrap();
    assert!(
        watcher.join().unwrap() >= 2,
        "both descendants were running"
    );
    assert!(o.record.exit.timed_out);
    assert_eq!(o.record.exit.signal, Some(libc::SIGKILL));
    assert!(
        wait_gone(&marker),
        "descendants survived: {:?}",
        procs_with(&marker)
    );
    // The sandbox still works afterwards.
    assert_eq!(sb.run(&ws.req(&["true"])).unwrap().record.exit.status, 0);
    // Cancel works the same way: once the tool is seen running, cancel it.
    let cancel = Cancel::new().unwrap();
    let c2 = cancel.clone();
    let cmarker = format!("{marker}-cancel");
    let m3 = cmarker.clone();
    let t = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(10);
        while procs_with(&m3).is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        c2.cancel();
    });
    let mut r = ws.req(&["bash", "-c", &format!("exec -a {cmarker} sleep 1000")]);
    r.cancel = Some(cancel);
    let o = sb.run(&r).unwrap();
    t.join().unwrap();
    assert!(o.record.exit.cancelled);
    assert_eq!(o.record.exit.signal, Some(libc::SIGTERM));
}

#[test]
fn concurrent_calls_do_not_see_or_kill_each_other() {
    if !features_ok("concurrent_calls_do_not_see_or_kill_each_other") {
        return;
    }
    let ws = Ws::new("pair");
    let sb = std::sync::Arc::new(ws.prepare(&policy("workspace", "timeout_seconds = 20")));
    let marker = format!("ollie-prep-victim-{}", std::process::id());
    // Call A: a long-lived victim that reports its (host-visible) pid via a file.
    let sb_a = sb.clone();
    let req_a = ws.req(&["bash", "-c", &format!("exec -a {marker} sleep 3")]);
    let a = std::thread::spawn(move || sb_a.run(&req_a).unwrap());
    // (One read: a process seen between its shell and the exec of `sleep` may be missed by a
    // second read a moment later.)
    let until = Instant::now() + Duration::from_secs(5);
    let victim = loop {
        if let Some(p) = procs_with(&marker).first() {
            break *p;
        }
        assert!(Instant::now() < until, "call A never ran");
        std::thread::sleep(Duration::from_millis(10));
    };
    // Call B runs in its own pid namespace (its shell is pid 2 there, like A's): A's
    // processes do not exist in it (kill: ESRCH), A's environment is unreadable (Landlock
    // scopes ptrace-mode access to its own domain), and kill -1 reaches B's processes only.
    let o = sb
        .run(&ws.req(&[
            "bash",
            "-c",
            &format!(
                "echo self=$$; kill -KILL {victim} 2>/dev/null; echo k=$?; cat /proc/{victim}/environ >/dev/null 2>&1; echo env=$?; sleep 5 & kill -KILL -1; wait $!; echo after=$?"
            ),
        ]))
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(text.contains("self=2\n"), "{text}");
    assert!(text.contains("k=1\n"), "{text}");
    assert!(text.contains("env=1\n"), "{text}");
    assert!(text.contains("after=137\n"), "{text}");
    // A was untouched and exits normally.
    let oa = a.join().unwrap();
    assert_eq!(oa.record.exit.status, 0, "{:?}", oa.record.exit);
    assert!(wait_gone(&marker));
}

#[test]
fn dropping_prepared_leaves_no_process() {
    if !features_ok("dropping_prepared_leaves_no_process") {
        return;
    }
    let ws = Ws::new("drop");
    let p = policy("workspace", "timeout_seconds = 60");
    // 1. Dropping the sandbox ends the zygote (and so its namespaces).
    let sb = ws.prepare(&p);
    assert_eq!(sb.run(&ws.req(&["true"])).unwrap().record.exit.status, 0);
    let zygote = sb.zygote_pid();
    assert!(Path::new(&format!("/proc/{zygote}")).exists());
    drop(sb);
    assert!(
        !Path::new(&format!("/proc/{zygote}")).exists(),
        "zygote {zygote} survived the drop"
    );
    // 2. The link closing (here: the zygote dying, as when its owner dies) kills a call in
    //    flight and everything it started, and the sandbox then refuses to run (fail closed).
    let sb = std::sync::Arc::new(ws.prepare(&p));
    let marker = format!("ollie-prep-linger-{}", std::process::id());
    let sb2 = sb.clone();
    let req = ws.req(&[
        "bash",
        "-c",
        &format!("setsid bash -c 'exec -a {marker} sleep 1000' & exec -a {marker} sleep 1000"),
    ]);
    let t = std::thread::spawn(move || sb2.run(&req));
    // Both sleeps, once their shells have exec'd (a shell still holding the marker in its
    // command line counts while it runs, so wait for exactly the two).
    let until = Instant::now() + Duration::from_secs(5);
    while procs_with(&marker).len() != 2 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(procs_with(&marker).len(), 2);
    let zygote = sb.zygote_pid();
    // Kill the zygote from outside, as if its owner had died.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &zygote.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let o = t.join().unwrap().unwrap();
    assert_eq!(o.record.exit.signal, Some(libc::SIGKILL));
    assert!(wait_gone(&marker), "left behind: {:?}", procs_with(&marker));
    assert!(sb.run(&ws.req(&["true"])).is_err());
    drop(sb);
}

#[test]
fn the_session_shares_one_memory_cgroup_and_reports_a_dead_zygote() {
    if !features_ok("the_session_shares_one_memory_cgroup_and_reports_a_dead_zygote") {
        return;
    }
    let ws = Ws::new("memcg");
    let bound: u64 = 128 << 20;
    let sb = ws.prepare(&policy("workspace", &format!("memory_bytes = {bound}")));
    assert!(sb.is_alive());
    let s = sb.session();
    let o = sb.run(&ws.req(&["true"])).unwrap();
    let m = &o.record.layers.memory;
    assert_eq!(m.scope, MemoryScope::Session);
    assert_eq!(o.record.limits.memory_bytes, bound);
    // Every call names the session's cgroup (or the same reason for having none).
    assert_eq!(m.cgroup, s.memory.cgroup);
    assert_eq!(m.reason, s.memory.reason);
    let cg = match &s.memory.cgroup {
        Some(cg) => {
            assert_eq!(s.memory.bound, MemoryBound::Cgroup);
            assert_eq!(s.memory.max_bytes, Some(bound));
            assert_eq!(m.oom_kills, 0);
            // The zygote was placed in it before it did anything (calls are its children).
            let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap();
            let zygote = sb.zygote_pid().to_string();
            assert!(procs.lines().any(|p| p == zygote), "{procs}");
            Some(cg.clone())
        }
        None => {
            assert_eq!(s.memory.bound, MemoryBound::RlimitAsOnly);
            assert!(s.memory.reason.as_deref().is_some_and(|r| !r.is_empty()));
            None
        }
    };
    // The cgroup's OOM killer may pick the zygote (the per-call inits share its memory): the
    // session then reports it is gone, so its owner can prepare a new one.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &sb.zygote_pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(sb.wait_gone(Duration::from_secs(5)));
    assert!(!sb.is_alive());
    assert!(sb.run(&ws.req(&["true"])).is_err());
    drop(sb);
    if let Some(cg) = cg {
        assert!(!cg.exists(), "{} left behind", cg.display());
    }
}

#[test]
fn fail_closed_names_the_layer() {
    if !features_ok("fail_closed_names_the_layer") {
        return;
    }
    let ws = Ws::new("fault");
    let sb = ws.prepare(&policy("workspace", ""));
    for (fault, stage) in [
        (ollie_sandbox::Fault::SeccompInstall, "seccomp"),
        (ollie_sandbox::Fault::CapDrop, "capability"),
        (ollie_sandbox::Fault::LandlockRestrict, "landlock"),
    ] {
        let mut r = ws.req(&["true"]);
        r.fault = Some(fault);
        match sb.run(&r).unwrap_err() {
            SandboxError::ChildSetup { stage: s, .. } => assert!(s.contains(stage), "{s}"),
            e => panic!("{e}"),
        }
    }
    assert_eq!(sb.run(&ws.req(&["true"])).unwrap().record.exit.status, 0);
}

#[test]
fn large_arguments_and_many_calls() {
    if !features_ok("large_arguments_and_many_calls") {
        return;
    }
    let ws = Ws::new("large");
    let sb = ws.prepare(&policy("workspace", ""));
    // Above the inline limit: the payload travels in a memfd.
    let big = "x".repeat(100_000);
    let o = sb
        .run(&ws.req(&["sh", "-c", "echo ${#1}", "sh", &big]))
        .unwrap();
    assert_eq!(o.stdout, b"100000\n");
    // A NUL byte in an argument is refused before anything is sent.
    let mut r = ws.req(&["echo"]);
    r.argv
        .push(std::os::unix::ffi::OsStringExt::from_vec(b"a\0b".to_vec()));
    assert!(matches!(
        sb.run(&r),
        Err(SandboxError::InvalidRequest { .. })
    ));
    // More calls than the zygote has slots: per-call inits are reaped, regions reclaimed.
    for i in 0..300 {
        let o = sb
            .run(&ws.req(&["sh", "-c", &format!("exit {}", i % 7)]))
            .unwrap();
        assert_eq!(o.record.exit.code, Some(i % 7));
    }
}

/// Held by the disk-watchdog tests: it samples the whole filesystem, so what one of them
/// deletes while the other runs would hide that one's writes.
static DISK_QUIET: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn disk_watchdog_stops_a_call_at_disk_bytes() {
    let name = "disk_watchdog_stops_a_call_at_disk_bytes";
    if !features_ok(name) {
        return;
    }
    const MIB: u64 = 1 << 20;
    let _quiet = DISK_QUIET.lock().unwrap_or_else(|p| p.into_inner());
    let ws = Ws::new("disk");
    let limit = 32 * MIB;
    let sb = ws.prepare(&policy(
        "workspace",
        &format!("disk_bytes = {limit}\nfile_size_bytes = 2097152\nkill_grace_ms = 500"),
    ));
    // 2 GiB in 1 MiB files, each under RLIMIT_FSIZE: only the aggregate limit can stop it.
    let script = "i=0; while [ $i -lt 2048 ]; do head -c 1048576 /dev/zero > f$i || exit 3; i=$((i+1)); done; echo finished";
    let o = sb.run(&ws.req(&["sh", "-c", script])).unwrap();
    eprintln!("{name}: exit {:?}", o.record.exit);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("finished"));
    assert_eq!(
        o.record.exit.killed_by,
        Some(ollie_sandbox::KilledBy::DiskLimit)
    );
    assert!(!o.record.exit.timed_out);
    assert!(o.record.exit.signal.is_some(), "{:?}", o.record.exit);
    let hit = o.record.exit.disk_limit.clone().unwrap();
    assert_eq!(hit.limit, ollie_sandbox::DiskLimit::DiskBytes);
    assert_eq!(hit.allowed, limit);
    assert!(hit.observed > limit);
    // The watched filesystem is named by a writable tree on it (the outermost one).
    assert!(ws.0.join("w").starts_with(&hit.path), "{:?}", hit.path);
    assert_eq!(o.record.limits.disk_bytes, limit);
    let json: serde_json::Value = serde_json::from_str(&o.record.to_json()).unwrap();
    assert_eq!(json["exit"]["killed_by"], "disk_limit");
    // What the call left: at most the limit plus what it writes between two samples and
    // before the gross-overshoot SIGKILL — far below 2 GiB.
    let written: u64 = std::fs::read_dir(ws.0.join("w"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    assert!(written <= limit + 64 * MIB, "call wrote {written} bytes");
    // The session survives: the next call (after cleaning up) runs and is not stopped.
    for e in std::fs::read_dir(ws.0.join("w")).unwrap().flatten() {
        if e.file_type().unwrap().is_file() {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    let o = sb.run(&ws.req(&["echo", "ok"])).unwrap();
    assert_eq!(o.record.exit.status, 0);
    assert_eq!(o.record.exit.killed_by, None);
    assert_eq!(o.record.exit.disk_limit, None);
}

#[test]
fn protected_island_cannot_be_moved_aside() {
    let name = "protected_island_cannot_be_moved_aside";
    if !features_ok(name) {
        return;
    }
    let ws = Ws::new("pin");
    std::fs::create_dir_all(ws.0.join("w/.git/hooks")).unwrap();
    std::fs::create_dir_all(ws.0.join("w/.git/objects")).unwrap();
    std::fs::write(ws.0.join("w/.git/HEAD"), "ref: refs/heads/main\n").unwrap();
    let sb = ws.prepare(&policy("workspace", ""));
    // The whole of `.git` is read-only for the session, as in one-shot runs: it cannot be
    // renamed or removed, nothing in it can be created or changed (no `commondir` redirect,
    // no hook), so no fresh `.git` can replace the protected one.
    let o = sb
        .run(&ws.req(&[
            "sh",
            "-c",
            "mv .git .g2; echo \"mvgit $?\"; mv .git/hooks .git/h2; echo \"mvhooks $?\"; \
             echo x > .git/hooks/pre-commit; echo \"hook $?\"; touch .git/ok; echo \"git $?\"; \
             echo \"$PWD/ev\" > .git/commondir; echo \"commondir $?\"; \
             echo x > .git/objects/o; echo \"objects $?\"; echo x > .git/HEAD; echo \"head $?\"",
        ]))
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    for l in [
        "mvgit",
        "mvhooks",
        "hook",
        "git",
        "commondir",
        "objects",
        "head",
    ] {
        assert!(
            text.lines().any(|x| x.starts_with(l) && !x.ends_with(" 0")),
            "{l} succeeded: {text}"
        );
    }
    assert!(!ws.0.join("w/.g2").exists());
    for f in [
        ".git/hooks/pre-commit",
        ".git/ok",
        ".git/commondir",
        ".git/objects/o",
    ] {
        assert!(!ws.0.join("w").join(f).exists(), "{f} was created");
    }
    assert_eq!(
        std::fs::read_to_string(ws.0.join("w/.git/HEAD")).unwrap(),
        "ref: refs/heads/main\n"
    );
    let dotgit = ws.0.join("w/.git");
    assert!(
        o.record.layers.mounts.protected.contains(&dotgit),
        "{:?}",
        o.record.layers.mounts
    );
    drop(sb);
    // A policy's write rule inside the island is an explicit exception (the innermost rule
    // wins): `.git/objects` is writable, everything else in `.git` is not.
    let text = common::workspace_with_write("{workdir}/.git/objects");
    let sb = ws.prepare(&Policy::from_toml(&text).unwrap());
    let o = sb
        .run(&ws.req(&[
            "sh",
            "-c",
            "echo x > .git/objects/o; echo \"objects $?\"; echo x > .git/commondir; echo \"commondir $?\"",
        ]))
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.contains("objects 0"), "{text}");
    assert!(!text.contains("commondir 0"), "{text}");
    assert!(ws.0.join("w/.git/objects/o").exists());
    assert!(!ws.0.join("w/.git/commondir").exists());
}

#[test]
fn stdin_is_relayed_from_a_pipe() {
    if !features_ok("prepared stdin_is_relayed_from_a_pipe") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let ws = Ws::new("relay");
    let sb = ws.prepare(&policy("workspace", ""));
    // More data than any pipe buffer (and than the relay's 64 KiB buffer), written by a
    // thread; the tool reads it all.
    let (r, w) = std::io::pipe().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let mut w = w;
        let _ = w.write_all(&vec![b'z'; 1 << 20]);
    });
    let mut req = ws.req(&["wc", "-c"]);
    req.stdin_fd = Some(std::sync::Arc::new(std::os::fd::OwnedFd::from(r)));
    let o = sb.run(&req).unwrap();
    writer.join().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "1048576");
    assert_eq!(o.record.exit.status, 0);

    // The tool gets a socket the runner feeds, never the caller's fd: the only sockets and
    // pipes it holds are its stdio (0 a socket, 1 and 2 the capture pipes), and it cannot
    // write back into its stdin's source.
    let (r, w) = std::io::pipe().unwrap();
    let caller_ino = std::fs::File::from(std::os::fd::OwnedFd::from(r.try_clone().unwrap()))
        .metadata()
        .unwrap()
        .ino();
    drop(w);
    let mut req = ws.req(&[
        "bash",
        "-c",
        "ls -l /proc/self/fd; echo back >&0; echo \"wr $?\"",
    ]);
    req.stdin_fd = Some(std::sync::Arc::new(std::os::fd::OwnedFd::from(r)));
    let o = sb.run(&req).unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let mut links: Vec<(u32, String)> = Vec::new();
    for line in out.lines() {
        if let Some((left, target)) = line.split_once(" -> ") {
            let fd = left.rsplit(' ').next().unwrap().parse::<u32>().unwrap();
            links.push((fd, target.to_string()));
        }
    }
    assert!(
        links
            .iter()
            .any(|(fd, t)| *fd == 0 && t.starts_with("socket:")),
        "{out}"
    );
    for (fd, t) in &links {
        if t.starts_with("socket:") || t.starts_with("pipe:") {
            assert!(*fd <= 2, "fd {fd} -> {t}\n{out}");
        }
        assert_ne!(t, &format!("pipe:[{caller_ino}]"), "{out}");
    }
    // (A write to it fails: EPIPE, or SIGPIPE kills the shell.)
    assert!(!out.contains("wr 0"), "{out}");

    // A source that never ends does not keep the call alive once the tool exits.
    let (r, w) = std::io::pipe().unwrap();
    let mut req = ws.req(&["head", "-c", "0"]);
    req.stdin_fd = Some(std::sync::Arc::new(std::os::fd::OwnedFd::from(r)));
    let o = sb.run(&req).unwrap();
    assert_eq!(o.record.exit.status, 0);
    drop(w);
}

#[test]
fn simulated_landlock_abi_fails_closed_or_runs_recorded_with_best_effort() {
    if !features_ok("simulated_landlock_abi_fails_closed_or_runs_recorded_with_best_effort") {
        return;
    }
    let ws = Ws::new("abi");
    let marker = ws.0.join("w").join("ran");
    let strict = policy("workspace", "");
    assert_eq!(strict.landlock_min_abi, 7);
    assert!(!strict.best_effort);
    let sb = ws.prepare(&strict);
    let mut req = ws.req(&["touch", "ran"]);
    req.fault = Some(ollie_sandbox::Fault::LandlockAbi(5));
    let err = sb.run(&req).unwrap_err();
    assert!(matches!(err, SandboxError::Landlock(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.starts_with("landlock ABI 5 < required 7"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert!(!marker.exists(), "the command ran");
    // The session is unaffected: the next call runs fully enforced.
    let o = sb.run(&ws.req(&["true"])).unwrap();
    assert_eq!(o.record.layers.landlock.abi, 7);
    assert!(!o.record.layers.best_effort_degraded);
    drop(sb);

    // best_effort is the only way to run degraded, and the call records it.
    let text =
        ollie_sandbox_profile("workspace").replace("best_effort = false", "best_effort = true");
    let lenient = Policy::from_toml(&text).unwrap();
    assert!(lenient.best_effort);
    let sb = ws.prepare(&lenient);
    let o = sb.run(&req).unwrap();
    assert_eq!(o.record.exit.status, 0);
    assert!(marker.exists());
    assert!(o.record.layers.best_effort_degraded);
    assert_eq!(o.record.layers.landlock.abi, 5);
    assert_eq!(
        o.record.layers.landlock.status,
        ollie_sandbox::landlock::EnforcementStatus::PartiallyEnforced
    );
    // ABI 5 has no scopes: the ruleset the call applied is the lower one.
    assert!(o.record.layers.landlock.scopes.is_empty());
    // Still Landlock-enforced at ABI 5: a file outside the policy's read list (visible in
    // the mount namespace) cannot be read.
    let secret = ws.0.join("outside-secret");
    std::fs::write(&secret, "canary-abi\n").unwrap();
    let mut probe = ws.req(&["cat", secret.to_str().unwrap()]);
    probe.fault = Some(ollie_sandbox::Fault::LandlockAbi(5));
    let o = sb.run(&probe).unwrap();
    assert_ne!(o.record.exit.code, Some(0));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("canary-abi"));
    assert_eq!(o.record.layers.landlock.abi, 5);
    // Without the fault the same session runs fully enforced.
    let o = sb.run(&ws.req(&["true"])).unwrap();
    assert_eq!(o.record.layers.landlock.abi, 7);
    assert!(!o.record.layers.best_effort_degraded);
}

fn ollie_sandbox_profile(name: &str) -> &'static str {
    ollie_policy::SHIPPED_PROFILES
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap()
        .1
}

/// The protected paths of a prepared session are bound per call, in the call's own mount
/// namespace: while a call runs it cannot create `.envrc`, `.git` or `.vscode` (the
/// placeholders are read-only mount points there), and once it has returned the workspace has
/// no placeholder left (`git init` and `ls -a` on the host see only what tools wrote). TMPDIR
/// is the call's private tmpfs, not a directory in the workspace.
#[test]
fn placeholders_exist_only_while_a_prepared_call_runs() {
    if !features_ok("placeholders_exist_only_while_a_prepared_call_runs") {
        return;
    }
    let ws = Ws::new("islands");
    let sb = ws.prepare(&policy("workspace", "timeout_seconds = 20"));
    let w = ws.0.join("w");
    let listing = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert!(listing(&w).is_empty(), "{:?}", listing(&w));
    let o = sb
        .run(&ws.req(&[
            "bash",
            "-c",
            "echo made > made.txt; \
             echo x > .envrc 2>/dev/null; echo envrc=$?; \
             mkdir .git/hooks 2>/dev/null; echo git=$?; \
             rmdir .vscode 2>/dev/null; echo vscode=$?; \
             echo t > \"$TMPDIR/t\" && cat \"$TMPDIR/t\"; echo tmpdir=$TMPDIR",
        ]))
        .unwrap();
    let out = String::from_utf8(o.stdout.clone()).unwrap();
    assert_eq!(o.record.exit.status, 0, "{out}");
    // Denied inside the call.
    for denied in ["envrc=", "git=", "vscode="] {
        let line = out.lines().find(|l| l.starts_with(denied)).unwrap();
        assert_ne!(line, format!("{denied}0"), "{out}");
    }
    assert!(out.contains("\nt\n"), "TMPDIR is writable: {out}");
    let tmp = out.lines().find_map(|l| l.strip_prefix("tmpdir=")).unwrap();
    assert!(
        !Path::new(tmp).starts_with(&w),
        "TMPDIR {tmp} is in the workspace"
    );
    // The record names the islands the call had.
    assert!(
        !o.record.layers.mounts.placeholders.is_empty(),
        "{:?}",
        o.record.layers.mounts
    );
    // After the call: exactly what the tool wrote.
    assert_eq!(listing(&w), ["made.txt"]);
    // The host can make what the placeholders stood for.
    std::fs::create_dir(w.join(".git")).unwrap();
    std::fs::write(w.join(".envrc"), "x").unwrap();
    // The next call sees them, and they are protected in it (an existing `.git` is bound
    // read-only as it is now, not as it was when the session started).
    let o = sb
        .run(&ws.req(&[
            "bash",
            "-c",
            "echo y > .envrc 2>/dev/null; echo envrc=$?; touch .git/new 2>/dev/null; echo git=$?",
        ]))
        .unwrap();
    let out = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(out.contains("envrc=1") && out.contains("git=1"), "{out}");
    assert_eq!(std::fs::read_to_string(w.join(".envrc")).unwrap(), "x");
    assert!(!w.join(".git/new").exists());
    assert_eq!(listing(&w), [".envrc", ".git", "made.txt"]);
}

/// Calls of several prepared sandboxes (several sessions) on one workspace at once: every one
/// runs (no "cannot prepare protected path" while another call creates or removes the same
/// placeholder), each is denied the protected paths, and none is left behind.
#[test]
fn concurrent_calls_on_one_workspace_share_its_placeholders() {
    if !features_ok("concurrent_calls_on_one_workspace_share_its_placeholders") {
        return;
    }
    let ws = std::sync::Arc::new(Ws::new("shared-islands"));
    let w = ws.0.join("w");
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let ws = std::sync::Arc::clone(&ws);
            std::thread::spawn(move || {
                let sb = ws.prepare(&policy("workspace", "timeout_seconds = 20"));
                for i in 0..60 {
                    let o = sb
                        .run(&ws.req(&["bash", "-c", "echo x > .envrc 2>/dev/null; echo envrc=$?"]))
                        .unwrap_or_else(|e| panic!("thread {t}, call {i}: {e}"));
                    let out = String::from_utf8_lossy(&o.stdout).into_owned();
                    assert_eq!(o.record.exit.status, 0, "thread {t}, call {i}: {out}");
                    assert!(!out.contains("envrc=0"), "thread {t}, call {i}: {out}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let left: Vec<_> = std::fs::read_dir(&w)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in the workspace: {left:?}");
}

#[test]
fn sixteen_parallel_writers_stay_within_the_disk_bound() {
    let name = "sixteen_parallel_writers_stay_within_the_disk_bound";
    if !features_ok(name) {
        return;
    }
    const MIB: u64 = 1 << 20;
    let _quiet = DISK_QUIET.lock().unwrap_or_else(|p| p.into_inner());
    let ws = Ws::new("disk16");
    let limit = 32 * MIB;
    // A long grace period: a disk-limit stop must not wait for it.
    let sb = ws.prepare(&policy(
        "workspace",
        &format!("disk_bytes = {limit}\nfile_size_bytes = 8388608\nkill_grace_ms = 5000"),
    ));
    // Sixteen endless writers of 8 MiB files (RLIMIT_FSIZE) in large writes.
    let script = "for i in $(seq 16); do (trap 'touch termed_$i; exit 7' TERM; j=0; while [ $j -lt 64 ]; do head -c 268435456 /dev/zero > w${i}_$j 2>/dev/null; j=$((j+1)); done) & done; wait; echo finished";
    let o = sb.run(&ws.req(&["sh", "-c", script])).unwrap();
    let written: u64 = std::fs::read_dir(ws.0.join("w"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
        .sum();
    eprintln!(
        "{name}: {written} bytes ({:.2}x the limit); exit {:?}",
        written as f64 / limit as f64,
        o.record.exit
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("finished"));
    assert_eq!(
        o.record.exit.killed_by,
        Some(ollie_sandbox::KilledBy::DiskLimit)
    );
    // No grace: no writer got a SIGTERM to keep running through (its trap leaves a file).
    let termed = std::fs::read_dir(ws.0.join("w"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("termed"))
        .count();
    assert_eq!(termed, 0, "{termed} writers got SIGTERM");
    // Killed at once, not after the grace period.
    assert_eq!(
        o.record.exit.signal,
        Some(libc::SIGKILL),
        "{:?}",
        o.record.exit
    );
    let json: serde_json::Value = serde_json::from_str(&o.record.to_json()).unwrap();
    assert_eq!(json["exit"]["killed_by"], "disk_limit");
    // Sanity bounds (the figures: docs/sandbox.md "Disk and inode limits"): when noticed,
    // and once every writer is dead; the runner's own scheduling on a loaded machine is in
    // both, so neither is tight.
    let noticed = o.record.exit.disk_limit.as_ref().unwrap().observed;
    assert!(
        noticed <= 4 * limit,
        "16 writers had taken {noticed} bytes when noticed"
    );
    assert!(written <= 8 * limit, "16 writers left {written} bytes");
}
