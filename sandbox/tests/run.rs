//! The public API of `ollie_sandbox::run`: refusals, exit reporting, output capture, the
//! environment and the JSON run record.
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_policy::Policy;
use ollie_sandbox::{RunRequest, SandboxError};
use std::path::{Path, PathBuf};

mod common;
use common::features_ok;

struct Ws(PathBuf);

impl Ws {
    fn new(name: &str) -> Ws {
        let d = std::env::temp_dir().join(format!("ollie-run-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Ws(d)
    }
    fn req(&self, argv: &[&str]) -> RunRequest {
        let mut r = RunRequest::new(argv.iter().map(Into::into).collect(), self.0.clone());
        r.base_env = vec![
            ("LANG".into(), "C.UTF-8".into()),
            ("OPENAI_API_KEY".into(), "sk-canary".into()),
        ];
        r
    }
}

impl Drop for Ws {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn policy(extra: &str) -> Policy {
    common::profile_with_limits("workspace", extra)
}

#[test]
fn refusals_name_the_problem_and_run_nothing() {
    if !features_ok("refusals_name_the_problem_and_run_nothing") {
        return;
    }
    let ws = Ws::new("refuse");
    let p = policy("");
    let e = ollie_sandbox::run(&p, &ws.req(&[])).unwrap_err();
    assert!(matches!(e, SandboxError::InvalidRequest { .. }), "{e}");
    let mut r = ws.req(&["true"]);
    r.workdir = ws.0.join("missing");
    assert!(matches!(
        ollie_sandbox::run(&p, &r),
        Err(SandboxError::Workdir { .. })
    ));
    let e = ollie_sandbox::run(&p, &ws.req(&["no-such-program-ollie"])).unwrap_err();
    match e {
        SandboxError::Exec { source, .. } => {
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
        }
        other => panic!("{other}"),
    }
    // A workspace inside a secret location is refused by the policy.
    let home = ws.0.join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    let mut r = ws.req(&["true"]);
    r.home = home.clone();
    r.workdir = home.join(".ssh");
    let e = ollie_sandbox::run(&p, &r).unwrap_err();
    let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(chain.contains("secret location"), "{chain}");
    // Executing a non-executable file in the workspace fails at exec with EACCES.
    std::fs::write(ws.0.join("data"), "x").unwrap();
    let e = ollie_sandbox::run(&p, &ws.req(&["./data"])).unwrap_err();
    assert!(matches!(e, SandboxError::Exec { .. }), "{e}");
}

#[test]
fn exit_codes_signals_and_output_caps() {
    if !features_ok("exit_codes_signals_and_output_caps") {
        return;
    }
    let ws = Ws::new("exit");
    let p = policy("output_bytes = 10");
    let o = ollie_sandbox::run(
        &p,
        &ws.req(&["sh", "-c", "echo 0123456789abc; echo err >&2; exit 3"]),
    )
    .unwrap();
    assert_eq!((o.record.exit.code, o.record.exit.status), (Some(3), 3));
    assert_eq!(o.stdout, b"0123456789");
    assert!(o.record.stdout.truncated);
    assert_eq!(o.record.stdout.total_bytes, 14);
    assert_eq!(o.stderr, b"err\n");
    assert!(!o.record.stderr.truncated);
    let o = ollie_sandbox::run(&p, &ws.req(&["sh", "-c", "kill -KILL $$"])).unwrap();
    assert_eq!((o.record.exit.signal, o.record.exit.status), (Some(9), 137));
    // SIGPIPE is back to its default in the tool even though the runner ignores it.
    let o = ollie_sandbox::run(
        &p,
        &ws.req(&[
            "bash",
            "-c",
            "yes | head -c 1 >/dev/null; echo ${PIPESTATUS[0]}",
        ]),
    )
    .unwrap();
    assert_eq!(o.stdout, b"141\n");
}

#[test]
fn wall_timeout_kills_the_tree_and_is_recorded() {
    if !features_ok("wall_timeout_kills_the_tree_and_is_recorded") {
        return;
    }
    let ws = Ws::new("timeout");
    let p = policy("timeout_seconds = 1\nkill_grace_ms = 100");
    let o = ollie_sandbox::run(
        &p,
        &ws.req(&[
            "sh",
            "-c",
            "trap '' TERM; (trap '' TERM; sleep 1000) & sleep 1000",
        ]),
    )
    .unwrap();
    assert!(o.record.exit.timed_out);
    assert_eq!(o.record.exit.signal, Some(libc::SIGKILL));
    assert!(!o.record.exit.cancelled);
    assert_eq!(
        o.record.exit.killed_by,
        Some(ollie_sandbox::KilledBy::Timeout)
    );
    assert_eq!(o.record.exit.disk_limit, None);
}

#[test]
fn environment_is_the_allowlist_only_and_record_is_json() {
    if !features_ok("environment_is_the_allowlist_only_and_record_is_json") {
        return;
    }
    let ws = Ws::new("env");
    let o = ollie_sandbox::run(&policy(""), &ws.req(&["env"])).unwrap();
    let env = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(!env.contains("sk-canary"));
    assert!(env.contains("LANG=C.UTF-8"));
    // TMPDIR is the run's private tmpfs: over /tmp, or /var/tmp when the workspace is in
    // /tmp; nothing of it is in the workspace.
    let real = ws.0.canonicalize().unwrap();
    let tmp = if real.starts_with("/tmp") {
        "/var/tmp"
    } else {
        "/tmp"
    };
    assert!(env.contains(&format!("\nTMPDIR={tmp}\n")), "{env}");
    assert_eq!(
        o.record.layers.mounts.private_tmp.as_deref(),
        Some(Path::new(tmp))
    );
    assert!(!ws.0.join(".tmp").exists(), "TMPDIR left in the workspace");
    let v: serde_json::Value = serde_json::from_str(&o.record.to_json()).unwrap();
    for key in [
        "argv",
        "cwd",
        "program",
        "policy_hash",
        "layers",
        "limits",
        "env_names",
        "exit",
        "duration_ms",
        "rusage",
        "stdout",
        "stderr",
    ] {
        assert!(v.get(key).is_some(), "record lacks {key}");
    }
    assert_eq!(v["layers"]["landlock"]["status"], "fully_enforced");
    assert_eq!(v["layers"]["seccomp"]["profile"], "default");
    assert_eq!(v["layers"]["capabilities"]["bounding"], 0);
    assert_eq!(v["layers"]["namespaces"].as_array().unwrap().len(), 4);
    assert!(!o.record.to_json().contains("sk-canary"));
    assert_eq!(v["policy_hash"].as_str().unwrap().len(), 64);
}

#[test]
fn stdin_is_fed_and_output_streams() {
    if !features_ok("stdin_is_fed_and_output_streams") {
        return;
    }
    let ws = Ws::new("stdin");
    let p = policy("output_bytes = 16");
    let mut r = ws.req(&["wc", "-c"]);
    r.stdin = Some(vec![b'x'; 3 << 20]);
    let o = ollie_sandbox::run(&p, &r).unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "3145728");
    // A tool that stops reading early does not hurt the runner (no SIGPIPE).
    let mut r = ws.req(&["head", "-c", "1"]);
    r.stdin = Some(vec![b'y'; 4 << 20]);
    let o = ollie_sandbox::run(&p, &r).unwrap();
    assert_eq!(o.stdout, b"y");
    assert_eq!(o.record.exit.status, 0);
    // Without stdin data the tool reads EOF from /dev/null.
    let o = ollie_sandbox::run(&p, &ws.req(&["wc", "-c"])).unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0");
    // Streaming sees everything; the capture keeps the first 16 bytes.
    let mut streamed = Vec::new();
    let o = ollie_sandbox::run_streaming(&p, &ws.req(&["seq", "1", "1000"]), &mut |s, b| {
        assert_eq!(s, ollie_sandbox::Stream::Stdout);
        streamed.extend_from_slice(b);
    })
    .unwrap();
    assert_eq!(streamed.len() as u64, o.record.stdout.total_bytes);
    assert!(String::from_utf8_lossy(&streamed).ends_with("999\n1000\n"));
    assert_eq!(o.stdout.len(), 16);
    assert!(o.record.stdout.truncated);
}

#[test]
fn dev_shm_is_private_and_size_limited() {
    if !features_ok("dev_shm_is_private_and_size_limited") {
        return;
    }
    let ws = Ws::new("shm");
    let tag = format!("ollie-run-{}", std::process::id());
    let host = std::path::Path::new("/dev/shm").join(format!("{tag}-host"));
    std::fs::write(&host, "host").unwrap();
    let p = policy("shm_bytes = 1048576");
    // multiprocessing.Pool (POSIX semaphores) works; the host's /dev/shm is not visible; a
    // file written there stays in the run; the tmpfs is capped at shm_bytes.
    let script = format!(
        "python3 -c 'import multiprocessing as m\nwith m.Pool(2) as p: print(\"pool\", sum(p.map(abs, [-1, -2, -3])))' && \
         ls -a /dev/shm | grep -c {tag} ; echo x > /dev/shm/{tag}-inside && echo inside ok; \
         head -c 4194304 /dev/zero > /dev/shm/big; echo \"big $?\"; rm -f /dev/shm/big"
    );
    let o = ollie_sandbox::run(&p, &ws.req(&["bash", "-c", &script])).unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("pool 6"),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("\n0\n"), "host /dev/shm visible inside: {out}");
    assert!(out.contains("inside ok"), "{out}");
    assert!(!out.contains("big 0"), "shm_bytes not enforced: {out}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("No space left"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "host");
    assert!(
        !std::path::Path::new("/dev/shm")
            .join(format!("{tag}-inside"))
            .exists()
    );
    assert_eq!(o.record.limits.shm_bytes, 1 << 20);
    // Not shared between runs: the next run starts empty.
    let o = ollie_sandbox::run(&p, &ws.req(&["ls", "-A", "/dev/shm"])).unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "");
    // shm_bytes = 0: no private tmpfs, and /dev/shm is read-only host territory again.
    let p0 = policy("shm_bytes = 0");
    let o = ollie_sandbox::run(
        &p0,
        &ws.req(&[
            "bash",
            "-c",
            &format!("echo x > /dev/shm/{tag}-zero; echo \"w $?\""),
        ]),
    )
    .unwrap();
    assert!(o.record.layers.mounts.private_shm.is_none());
    assert!(!String::from_utf8_lossy(&o.stdout).contains("w 0"));
    assert!(
        !std::path::Path::new("/dev/shm")
            .join(format!("{tag}-zero"))
            .exists()
    );
    let _ = std::fs::remove_file(&host);
}

#[test]
fn stdin_is_relayed_from_a_pipe() {
    if !features_ok("stdin_is_relayed_from_a_pipe") {
        return;
    }
    let ws = Ws::new("relay");
    let p = policy("");
    // A pipe with more data than any pipe buffer, written by a thread; the tool reads it all.
    let (r, w) = std::io::pipe().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let mut w = w;
        let _ = w.write_all(&vec![b'z'; 1 << 20]);
    });
    let mut req = ws.req(&["wc", "-c"]);
    req.stdin_fd = Some(std::sync::Arc::new(std::os::fd::OwnedFd::from(r)));
    let o = ollie_sandbox::run(&p, &req).unwrap();
    writer.join().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "1048576");
    // The tool gets a socket the runner feeds, never the runner's fd: it cannot write back.
    let (r, w) = std::io::pipe().unwrap();
    drop(w);
    let mut req = ws.req(&[
        "bash",
        "-c",
        "readlink /proc/self/fd/0 | cut -d: -f1; echo back >&0; echo \"wr $?\"",
    ]);
    req.stdin_fd = Some(std::sync::Arc::new(std::os::fd::OwnedFd::from(r)));
    let o = ollie_sandbox::run(&p, &req).unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("socket\n"), "{out}");
    assert!(!out.contains("wr 0"), "{out}");
    // A source that never ends does not keep the run alive once the tool exits.
    let (r, w) = std::io::pipe().unwrap();
    let mut req = ws.req(&["head", "-c", "0"]);
    req.stdin_fd = Some(std::sync::Arc::new(std::os::fd::OwnedFd::from(r)));
    let o = ollie_sandbox::run(&p, &req).unwrap();
    assert_eq!(o.record.exit.status, 0);
    drop(w);
}

/// Runs `script` in a thread; returns once the script has written a line to `ready` (a FIFO in
/// the workspace), and the handle yields the run's stdout.
fn start_waiting(
    ws: &Ws,
    p: &Policy,
    script: &str,
) -> std::thread::JoinHandle<ollie_sandbox::RunOutput> {
    let req = ws.req(&["bash", "-c", script]);
    let p = p.clone();
    let h = std::thread::spawn(move || ollie_sandbox::run(&p, &req).unwrap());
    let mut s = String::new();
    use std::io::Read;
    std::fs::File::open(ws.0.join("ready"))
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s.trim(), "ready");
    h
}

fn mkfifo(p: &std::path::Path) {
    assert!(
        std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn placeholders_survive_concurrent_runs_and_are_removed_by_the_last() {
    if !features_ok("placeholders_survive_concurrent_runs_and_are_removed_by_the_last") {
        return;
    }
    let ws = Ws::new("concurrent");
    let p = policy("");
    let envrc = ws.0.join(".envrc");
    for first_ends_first in [false, true] {
        for f in ["ready", "go-a", "go-b"] {
            mkfifo(&ws.0.join(f));
        }
        // Run A creates the placeholders and waits; run B starts while A runs.
        let a = start_waiting(
            &ws,
            &p,
            "echo ready > ready; read x < go-a; echo x > .envrc; echo \"envrc $?\"",
        );
        assert!(envrc.is_dir(), "placeholder missing while A runs");
        let b = if first_ends_first {
            // B waits too, and outlives A.
            let b = start_waiting(
                &ws,
                &p,
                "echo ready > ready; read x < go-b; echo x > .envrc; echo \"envrc $?\"",
            );
            std::fs::write(ws.0.join("go-a"), "1\n").unwrap();
            let oa = a.join().unwrap();
            assert!(envrc.is_dir(), "A removed the placeholder B still binds");
            std::fs::write(ws.0.join("go-b"), "1\n").unwrap();
            let ob = b.join().unwrap();
            for o in [&oa, &ob] {
                assert!(
                    !String::from_utf8_lossy(&o.stdout).contains("envrc 0"),
                    "{}",
                    String::from_utf8_lossy(&o.stdout)
                );
            }
            ob
        } else {
            // B is short: its end must not pull A's mount point away.
            let ob = ollie_sandbox::run(&p, &ws.req(&["true"])).unwrap();
            assert_eq!(ob.record.exit.status, 0);
            assert!(envrc.is_dir(), "B removed the placeholder A still binds");
            std::fs::write(ws.0.join("go-a"), "1\n").unwrap();
            let oa = a.join().unwrap();
            let out = String::from_utf8_lossy(&oa.stdout).to_string();
            assert!(out.contains("envrc ") && !out.contains("envrc 0"), "{out}");
            oa
        };
        assert!(
            b.record
                .layers
                .mounts
                .placeholders
                .iter()
                .any(|p| p.ends_with(".envrc"))
        );
        // The last run removed every placeholder; nothing was created on the host.
        for name in [".envrc", ".git", ".claude", ".vscode", ".idea"] {
            assert!(!ws.0.join(name).exists(), "{name} left behind");
        }
        for f in ["ready", "go-a", "go-b"] {
            std::fs::remove_file(ws.0.join(f)).unwrap();
        }
    }
}
