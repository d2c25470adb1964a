//! Per-run control, on both spawn paths (one-shot `run` and `Prepared::run`): `Cancel::signal`
//! and `Cancel::kill` from another thread while the run blocks, `RunRequest::cwd` and
//! `RunRequest::timeout_seconds`.
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_policy::Policy;
use ollie_sandbox::{Cancel, KilledBy, Prepared, RunOutput, RunRequest, SandboxError};
use std::path::PathBuf;
use std::sync::Arc;

mod common;
use common::{features_ok, procs_with, wait_gone};

struct Ws(PathBuf);

impl Ws {
    fn new(name: &str) -> Ws {
        let d = std::env::temp_dir().join(format!("ollie-ctl-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("w")).unwrap();
        std::fs::create_dir_all(d.join("home")).unwrap();
        Ws(d.canonicalize().unwrap())
    }
    fn w(&self) -> PathBuf {
        self.0.join("w")
    }
    fn req(&self, argv: &[&str]) -> RunRequest {
        let mut r = RunRequest::new(argv.iter().map(Into::into).collect(), self.w());
        r.home = self.0.join("home");
        r.base_env = vec![("LANG".into(), "C.UTF-8".into())];
        r
    }
}

impl Drop for Ws {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One of the two spawn paths.
#[derive(Clone)]
enum Runner {
    OneShot(Arc<Policy>),
    Prepared(Arc<Prepared>),
}

impl Runner {
    /// Both paths for `limits` (TOML lines of the workspace profile's `[limits]`).
    fn both(ws: &Ws, limits: &str) -> [Runner; 2] {
        let p = common::profile_with_limits("workspace", limits);
        let sb = Prepared::new(&p, &ws.w(), &ws.0.join("home")).unwrap();
        [Runner::OneShot(Arc::new(p)), Runner::Prepared(Arc::new(sb))]
    }
    fn name(&self) -> &'static str {
        match self {
            Runner::OneShot(_) => "one-shot",
            Runner::Prepared(_) => "prepared",
        }
    }
    fn run(&self, req: &RunRequest) -> Result<RunOutput, SandboxError> {
        match self {
            Runner::OneShot(p) => ollie_sandbox::run(p, req),
            Runner::Prepared(sb) => sb.run(req),
        }
    }
    /// Runs `script` (bash) in a thread with `cancel` attached; returns once the script has
    /// written `ready` to the FIFO `ready` in the workspace.
    fn start(&self, ws: &Ws, script: &str, cancel: &Cancel) -> std::thread::JoinHandle<RunOutput> {
        let fifo = ws.w().join("ready");
        let _ = std::fs::remove_file(&fifo);
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let mut req = ws.req(&["bash", "-c", script]);
        req.cancel = Some(cancel.clone());
        let me = self.clone();
        let h = std::thread::spawn(move || me.run(&req).unwrap());
        let got = std::fs::read_to_string(&fifo).unwrap();
        assert_eq!(got.trim(), "ready");
        h
    }
}

/// Waits (at most 10 s) until `cond` holds.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < until, "never happened: {what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn stdout(o: &RunOutput) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn signals_reach_the_tool_and_refused_ones_change_nothing() {
    if !features_ok("signals_reach_the_tool_and_refused_ones_change_nothing") {
        return;
    }
    let ws = Ws::new("signal");
    for r in Runner::both(&ws, "timeout_seconds = 30") {
        let c = Cancel::new().unwrap();
        let h = r.start(
            &ws,
            "trap 'echo got-usr1; exit 7' USR1; echo ready > ready; sleep 1000 & wait",
            &c,
        );
        // Refused: nothing is sent, the run goes on (the trap below still runs).
        for sig in [libc::SIGSTOP, libc::SIGTSTP, libc::SIGSEGV, 0, -1, 99] {
            let e = c.signal(sig).unwrap_err();
            assert!(
                matches!(e, SandboxError::UnsupportedSignal { signal } if signal == sig),
                "{e}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains("10 (SIGUSR1)") && msg.contains("15 (SIGTERM)"),
                "{msg}"
            );
        }
        c.signal(libc::SIGUSR1).unwrap();
        let o = h.join().unwrap();
        assert_eq!(stdout(&o), "got-usr1\n", "{}", r.name());
        assert_eq!(o.record.exit.code, Some(7), "{}", r.name());
        assert!(!o.record.exit.cancelled);
        assert_eq!(o.record.exit.killed_by, None);
        // After the run has ended, a signal is a no-op.
        c.signal(libc::SIGUSR1).unwrap();

        // A plain SIGTERM is forwarded once, not a cancel: no escalation, not recorded.
        let c = Cancel::new().unwrap();
        let h = r.start(
            &ws,
            "trap 'echo got-term; exit 0' TERM; echo ready > ready; sleep 1000 & wait",
            &c,
        );
        c.signal(libc::SIGTERM).unwrap();
        let o = h.join().unwrap();
        assert_eq!(stdout(&o), "got-term\n", "{}", r.name());
        assert_eq!(o.record.exit.code, Some(0), "{}", r.name());
        assert!(!o.record.exit.cancelled, "{}", r.name());
        assert_eq!(o.record.exit.killed_by, None, "{}", r.name());
    }
}

#[test]
fn kill_ends_the_whole_tree_at_once() {
    if !features_ok("kill_ends_the_whole_tree_at_once") {
        return;
    }
    let ws = Ws::new("kill");
    // A grace period far longer than `wait_gone`'s bound: only SIGKILL ends these runs in time.
    for r in Runner::both(&ws, "timeout_seconds = 600\nkill_grace_ms = 60000") {
        let marker = format!("ollie-ctl-kill-{}-{}", std::process::id(), r.name());
        let script = format!(
            "trap 'echo term > term' TERM; \
             setsid bash -c '(trap \"\" TERM HUP; exec -a {marker} sleep 1000) &'; \
             (exec -a {marker} sleep 1000) & echo ready > ready; sleep 1000 & wait"
        );
        let c = Cancel::new().unwrap();
        let h = r.start(&ws, &script, &c);
        // Both descendants (one setsid'd and orphaned) are running.
        wait_for("both descendants run", || procs_with(&marker).len() >= 2);
        c.kill();
        assert!(
            wait_gone(&marker),
            "{}: descendants survived kill: {:?}",
            r.name(),
            procs_with(&marker)
        );
        let o = h.join().unwrap();
        assert_eq!(o.record.exit.signal, Some(libc::SIGKILL), "{}", r.name());
        assert_eq!(o.record.exit.status, 137);
        assert!(o.record.exit.cancelled);
        assert_eq!(o.record.exit.killed_by, Some(KilledBy::Cancel));
        assert!(!o.record.exit.timed_out);
        // SIGKILL came first: the TERM trap never ran.
        assert!(!ws.w().join("term").exists(), "{}", r.name());

        // After a cancel (SIGTERM, trapped), kill still works: the handle stays watched.
        let c = Cancel::new().unwrap();
        let h = r.start(
            &ws,
            &format!(
                "trap 'echo term > term' TERM; echo ready > ready; \
                 while :; do (exec -a {marker} sleep 1000); done"
            ),
            &c,
        );
        // Cancel only once the sleep runs: a SIGTERM that lands while bash forks it reaches
        // the subshell before it resets its traps, so the subshell survives and bash, waiting
        // on it, never runs its own trap.
        wait_for("the sleep runs", || !procs_with(&marker).is_empty());
        c.cancel();
        wait_for("the TERM trap ran", || ws.w().join("term").exists());
        c.signal(libc::SIGKILL).unwrap();
        assert!(wait_gone(&marker), "{}: kill after cancel", r.name());
        let o = h.join().unwrap();
        assert_eq!(o.record.exit.signal, Some(libc::SIGKILL), "{}", r.name());
        assert!(o.record.exit.cancelled);
        assert_eq!(o.record.exit.killed_by, Some(KilledBy::Cancel));
        std::fs::remove_file(ws.w().join("term")).unwrap();

        // Killed before the run starts: it is killed as soon as it does (sticky, like cancel).
        let c = Cancel::new().unwrap();
        c.kill();
        let mut req = ws.req(&["bash", "-c", "echo started > started; sleep 1000"]);
        req.cancel = Some(c);
        let o = r.run(&req).unwrap();
        assert_eq!(o.record.exit.signal, Some(libc::SIGKILL), "{}", r.name());
        assert_eq!(o.record.exit.killed_by, Some(KilledBy::Cancel));
        let _ = std::fs::remove_file(ws.w().join("started"));
    }
}

#[test]
fn cwd_is_resolved_lexically_and_decided_inside_the_sandbox() {
    if !features_ok("cwd_is_resolved_lexically_and_decided_inside_the_sandbox") {
        return;
    }
    let ws = Ws::new("cwd");
    let sub = ws.w().join("sub/dir");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("hello.sh"), "#!/bin/sh\necho hello from $(pwd)\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(sub.join("hello.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    for r in Runner::both(&ws, "") {
        let with_cwd = |argv: &[&str], cwd: &str| {
            let mut req = ws.req(argv);
            req.cwd = Some(cwd.into());
            r.run(&req)
        };
        // Relative to the workdir, lexically (`.`, `..`).
        for cwd in ["sub/dir", "./sub/../sub/./dir", sub.to_str().unwrap()] {
            let o = with_cwd(&["pwd"], cwd).unwrap();
            assert_eq!(
                stdout(&o).trim(),
                sub.to_str().unwrap(),
                "{} {cwd}",
                r.name()
            );
            assert_eq!(o.record.cwd, sub);
        }
        // The workdir itself, named explicitly.
        let o = with_cwd(&["pwd"], ".").unwrap();
        assert_eq!(stdout(&o).trim(), ws.w().to_str().unwrap());
        // A program path with a slash is relative to the cwd.
        let o = with_cwd(&["./hello.sh"], "sub/dir").unwrap();
        assert_eq!(
            stdout(&o),
            format!("hello from {}\n", sub.display()),
            "{}",
            r.name()
        );
        // Outside the workspace, where the policy lets the tool list: allowed.
        let o = with_cwd(&["pwd"], "/usr").unwrap();
        assert_eq!(stdout(&o), "/usr\n");
        // Outside every readable area: Landlock refuses, the error names the directory,
        // nothing ran.
        for (cwd, errno) in [("/var/lib", libc::EACCES), ("missing", libc::ENOENT)] {
            let marker = ws.w().join("ran");
            let e = with_cwd(&["sh", "-c", "echo x > ran"], cwd).unwrap_err();
            let want = ws.w().join(cwd);
            match &e {
                SandboxError::Cwd { path, source } => {
                    assert_eq!(path, &want, "{}", r.name());
                    assert_eq!(source.raw_os_error(), Some(errno), "{} {cwd}", r.name());
                }
                other => panic!("{}: {other}", r.name()),
            }
            assert!(e.to_string().contains(want.to_str().unwrap()), "{e}");
            assert!(!marker.exists());
        }
        // Climbing above / and empty paths are refused before anything starts.
        let up = "../".repeat(ws.w().components().count() + 1);
        for cwd in [up.as_str(), ""] {
            let e = with_cwd(&["true"], cwd).unwrap_err();
            assert!(
                matches!(e, SandboxError::InvalidRequest { .. }),
                "{} {cwd:?}: {e}",
                r.name()
            );
        }
    }
}

#[test]
fn per_call_timeout_only_narrows() {
    if !features_ok("per_call_timeout_only_narrows") {
        return;
    }
    let ws = Ws::new("timeout");
    let sleeper = |t: Option<u64>| {
        let mut req = ws.req(&["sleep", "1000"]);
        req.timeout_seconds = t;
        req
    };
    for r in Runner::both(&ws, "timeout_seconds = 600\nkill_grace_ms = 100") {
        // Narrower than the policy: the sleep is stopped by the timeout.
        let o = r.run(&sleeper(Some(1))).unwrap();
        assert!(o.record.exit.timed_out, "{}", r.name());
        assert_eq!(o.record.exit.killed_by, Some(KilledBy::Timeout));
        assert_eq!(o.record.limits.timeout_seconds, 1);
        // 0 is refused.
        let e = r.run(&sleeper(Some(0))).unwrap_err();
        assert!(matches!(e, SandboxError::InvalidRequest { .. }), "{e}");
        // No override: the policy's value is recorded.
        let o = r.run(&ws.req(&["true"])).unwrap();
        assert_eq!(o.record.limits.timeout_seconds, 600);
    }
    for r in Runner::both(&ws, "timeout_seconds = 1\nkill_grace_ms = 100") {
        // Larger than the policy: it does not widen; the policy's timeout stops the sleep.
        let o = r.run(&sleeper(Some(100))).unwrap();
        assert!(o.record.exit.timed_out, "{}", r.name());
        assert_eq!(o.record.exit.killed_by, Some(KilledBy::Timeout));
        assert_eq!(o.record.limits.timeout_seconds, 1);
    }
}

#[test]
fn a_frozen_run_does_nothing_until_thawed_and_cannot_thaw_itself() {
    if !features_ok("a_frozen_run_does_nothing_until_thawed_and_cannot_thaw_itself") {
        return;
    }
    let ws = Ws::new("freeze");
    for r in Runner::both(&ws, "timeout_seconds = 120") {
        let (a, b, cont) = (ws.w().join("a"), ws.w().join("b"), ws.w().join("cont"));
        for f in [&a, &b, &cont] {
            let _ = std::fs::remove_file(f);
        }
        // Two writers; the second also tries to continue everything it can reach.
        let script = "echo ready > ready; (while :; do echo x >> a; done) & \
                      while :; do echo y >> b; kill -CONT $$ 1 2>/dev/null; echo $? > cont; done";
        let c = Cancel::new().unwrap();
        let h = r.start(&ws, script, &c);
        let size = |p: &PathBuf| std::fs::metadata(p).map_or(0, |m| m.len());
        wait_for("both writers write", || size(&a) > 0 && size(&b) > 0);
        c.freeze();
        assert!(
            c.wait_frozen(std::time::Duration::from_secs(20), &|| false),
            "{}: the run was never seen frozen",
            r.name()
        );
        let frozen_at = (size(&a), size(&b));
        // Nothing of the run moves while it is frozen, whatever time passes.
        for _ in 0..30 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            assert_eq!(
                (size(&a), size(&b)),
                frozen_at,
                "{}: wrote while frozen",
                r.name()
            );
        }
        // Neither a SIGCONT through the handle nor a nested freeze's thaw continues it.
        c.signal(libc::SIGCONT).unwrap();
        c.freeze();
        c.thaw();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!((size(&a), size(&b)), frozen_at, "{}", r.name());
        c.thaw();
        wait_for("both writers go on after the thaw", || {
            size(&a) > frozen_at.0 && size(&b) > frozen_at.1
        });
        // SIGCONT from inside was refused every time (kill's status 1: EPERM).
        let st = std::fs::read_to_string(&cont).unwrap_or_default();
        assert!(
            st.is_empty() || st.trim() == "1",
            "{}: kill -CONT said {st:?}",
            r.name()
        );
        c.kill();
        let o = h.join().unwrap();
        assert_eq!(o.record.exit.signal, Some(libc::SIGKILL), "{}", r.name());
        assert!(!o.record.exit.timed_out, "{}", r.name());
    }
}
