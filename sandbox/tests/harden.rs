//! `ollie_sandbox::harden_server`, applied in a child process: this suite re-executes its own
//! binary as the probe (`harden-probe …` as the first argument), because hardening is
//! irreversible and refuses a multithreaded process, and libtest runs every test in a thread
//! of its own. Hence `harness = false` and the small harness in `main`, which accepts (and
//! mostly ignores) libtest's arguments: names filter tests, `--skip NAME` skips them.
//!
//! The hardened probe must lose what it never needs, keep what sandboxes need, and bound the
//! tools it starts:
//!
//! - `harden-probe threads`: starts a second thread first; hardening must be refused.
//! - `harden-probe serve ALLOW_INET(0|1) WORKDIR HOME OUTSIDE`: opens two fds (keeps one) and
//!   a loopback TCP listener (kept) before hardening; afterwards probes itself
//!   (`harden::self_check`, before and after), runs tools in a `Prepared` sandbox of the
//!   shipped `workspace` profile (`/bin/true`, a write into WORKDIR, a write into OUTSIDE) and
//!   a one-shot run, and one tool under the shipped `network` profile with the listener's port
//!   added to `connect` (so only the server's own restriction can stop it) that connects to
//!   the listener; and, under `network.mode = "proxy"`, a one-shot run and a prepared call
//!   that connect to the proxy's listener (handed out by the sandbox). Prints one JSON
//!   object.
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_sandbox::harden::{self, ServerHardening};
use ollie_sandbox::{Prepared, RunRequest};
use serde_json::{Value, json};
use std::ffi::OsString;
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod common;
use common::features_ok;

/// The first argument that makes this binary the probe.
const PROBE: &str = "harden-probe";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(PROBE) {
        return probe_main(&args[1..]);
    }
    let tests: [(&str, fn()); 3] = [
        (
            "harden_refuses_a_process_with_a_second_thread",
            harden_refuses_a_process_with_a_second_thread,
        ),
        (
            "hardened_server_denies_and_still_runs_sandboxes",
            hardened_server_denies_and_still_runs_sandboxes,
        ),
        (
            "allow_inet_keeps_tcp_for_the_server_and_its_tools",
            allow_inet_keeps_tcp_for_the_server_and_its_tools,
        ),
    ];
    common::run_harness(&tests, &args)
}

fn probe_main(args: &[String]) -> ExitCode {
    let out = match args.first().map(String::as_str) {
        Some("threads") => threads(),
        Some("serve") if args.len() == 5 => serve_probe(
            args[1] == "1",
            Path::new(&args[2]),
            Path::new(&args[3]),
            Path::new(&args[4]),
        ),
        _ => {
            eprintln!("usage: {PROBE} threads | serve ALLOW_INET(0|1) WORKDIR HOME OUTSIDE");
            return ExitCode::from(2);
        }
    };
    println!("{out}");
    ExitCode::SUCCESS
}

// ---------------------------------------------------------------------------------------------
// The probe (a child process; single-threaded until `threads` starts its second thread).

/// Hardening with a second thread alive.
fn threads() -> Value {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let _ = rx.recv();
    });
    let r = ollie_sandbox::harden_server(&ServerHardening::default());
    drop(tx);
    let _ = t.join();
    match r {
        Ok(rec) => json!({ "refused": false, "record": rec }),
        Err(e) => json!({ "refused": true, "error": e.to_string() }),
    }
}

fn fd_open(fd: RawFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok()
}

fn profile(name: &str) -> Option<&'static str> {
    ollie_policy::SHIPPED_PROFILES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
}

fn req(argv: &[&str], workdir: &Path, home: &Path) -> RunRequest {
    let mut r = RunRequest::new(argv.iter().map(OsString::from).collect(), workdir.into());
    r.home = home.to_path_buf();
    r
}

/// `{"status": …, "stdout": …}` of a run, or `{"error": …}`.
fn outcome(r: Result<ollie_sandbox::RunOutput, ollie_sandbox::SandboxError>) -> Value {
    match r {
        Ok(o) => json!({
            "status": o.record.exit.status,
            "stdout": String::from_utf8_lossy(&o.stdout),
            "stderr": String::from_utf8_lossy(&o.stderr),
        }),
        Err(e) => json!({ "error": error_chain(&e) }),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn serve_probe(allow_inet: bool, workdir: &Path, home: &Path, outside: &Path) -> Value {
    let before = harden::self_check();
    // Two fds opened before hardening: one closed by it, one kept.
    let dropped = std::fs::File::open("/dev/null").map(IntoRawFd::into_raw_fd);
    let kept = std::fs::File::open("/dev/null").map(IntoRawFd::into_raw_fd);
    let listener = std::net::TcpListener::bind("127.0.0.1:0");
    let (Ok(dropped), Ok(kept), Ok(listener)) = (dropped, kept, listener) else {
        return json!({ "setup_error": "cannot open the probe's fds or listener" });
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let record = match ollie_sandbox::harden_server(&ServerHardening {
        keep_fds: vec![kept, listener.as_raw_fd()],
        allow_inet,
    }) {
        Ok(r) => r,
        Err(e) => return json!({ "harden_error": error_chain(&e) }),
    };
    let after = harden::self_check();
    let mut v = json!({
        "record": record,
        "before": before,
        "after": after,
        "dropped_fd_open": fd_open(dropped),
        "kept_fd_open": fd_open(kept),
        "listener_port": port,
    });

    // Sandboxes under the hardened server.
    let workspace = profile("workspace").and_then(|t| ollie_policy::Policy::from_toml(t).ok());
    let Some(workspace) = workspace else {
        v["setup_error"] = json!("no shipped workspace profile");
        return v;
    };
    match Prepared::new(&workspace, workdir, home) {
        Err(e) => v["prepared_new"] = json!({ "error": error_chain(&e) }),
        Ok(sb) => {
            v["prepared_new"] = json!("ok");
            v["prepared_true"] = outcome(sb.run(&req(&["/bin/true"], workdir, home)));
            v["prepared_write_inside"] = outcome(sb.run(&req(
                &["sh", "-c", "echo ok > inside && cat inside"],
                workdir,
                home,
            )));
            let target: PathBuf = outside.join("pwned");
            v["prepared_write_outside"] = outcome(sb.run(&req(
                &[
                    "sh",
                    "-c",
                    &format!("echo x > {}; echo \"write $?\"", target.display()),
                ],
                workdir,
                home,
            )));
        }
    }
    v["oneshot_true"] = outcome(ollie_sandbox::run(
        &workspace,
        &req(&["/bin/true"], workdir, home),
    ));

    // A tool whose own policy allows the listener's port.
    let network = profile("network").and_then(|t| {
        ollie_policy::Policy::from_toml(&t.replace(
            "connect = [53, 80, 443]",
            &format!("connect = [53, 80, 443, {port}]"),
        ))
        .ok()
    });
    let Some(network) = network else {
        v["setup_error"] = json!("no shipped network profile");
        return v;
    };
    let _ = listener.set_nonblocking(true);
    match Prepared::new(&network, workdir, home) {
        Err(e) => v["net_prepared_new"] = json!({ "error": error_chain(&e) }),
        Ok(sb) => {
            v["net_prepared_new"] = json!("ok");
            v["net_tool"] = outcome(sb.run(&req(
                &[
                    "bash",
                    "-c",
                    &format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"),
                ],
                workdir,
                home,
            )));
        }
    }
    // The tool has exited: a connection it made waits in the listener's queue.
    v["listener_saw_connection"] = json!(listener.accept().is_ok());
    proxied_probe(&mut v, workspace, workdir, home);
    v
}

/// `network.mode = "proxy"` under the hardened server: pid 1 makes the proxy's listener in
/// the run's (or session's) own network namespace, and a tool's connection to
/// 127.0.0.1:3128 waits on it (one-shot `proxy_oneshot`, prepared `proxy_prepared`; whether
/// the handed listener holds a connection afterwards in `…_connected`).
fn proxied_probe(v: &mut Value, mut policy: ollie_policy::Policy, workdir: &Path, home: &Path) {
    policy.network = ollie_policy::Network::Proxy(ollie_policy::ProxyNetwork::closed());
    let connect = || {
        req(
            &[
                "bash",
                "-c",
                "exec 3<>/dev/tcp/127.0.0.1/3128 && echo connected",
            ],
            workdir,
            home,
        )
    };
    let waiting = |l: Option<std::net::TcpListener>| {
        json!(l.is_some_and(|l| l.set_nonblocking(true).is_ok() && l.accept().is_ok()))
    };
    let (handoff, rx) = ollie_sandbox::ProxyHandoff::channel();
    let mut r = connect();
    r.proxy = Some(handoff);
    v["proxy_oneshot"] = outcome(ollie_sandbox::run(&policy, &r));
    v["proxy_oneshot_connected"] = waiting(rx.try_recv().ok());
    match Prepared::new(&policy, workdir, home) {
        Err(e) => v["proxy_prepared"] = json!({ "error": error_chain(&e) }),
        Ok(sb) => {
            let l = sb.take_proxy_listener();
            v["proxy_prepared"] = outcome(sb.run(&connect()));
            v["proxy_prepared_connected"] = waiting(l);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The tests (in the harness process).

struct Dirs(PathBuf);

impl Dirs {
    fn new(name: &str) -> Dirs {
        let d = std::env::temp_dir().join(format!("ollie-harden-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for sub in ["w", "home", "outside"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        Dirs(d.canonicalize().unwrap())
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn probe(args: &[&str]) -> Value {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(&exe)
        .arg(PROBE)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "probe failed: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn serve(d: &Dirs, allow_inet: bool) -> Value {
    let path = |s: &str| d.0.join(s).to_str().unwrap().to_string();
    let v = probe(&[
        "serve",
        if allow_inet { "1" } else { "0" },
        &path("w"),
        &path("home"),
        &path("outside"),
    ]);
    assert!(v.get("harden_error").is_none(), "{v:#}");
    assert!(v.get("setup_error").is_none(), "{v:#}");
    v
}

fn denied(v: &Value) -> bool {
    v["failed"]["errno"] == libc::EPERM
}

fn succeeded(v: &Value) -> bool {
    v == "succeeded"
}

fn harden_refuses_a_process_with_a_second_thread() {
    if !features_ok("harden_refuses_a_process_with_a_second_thread") {
        return;
    }
    let v = probe(&["threads"]);
    assert_eq!(v["refused"], true, "{v:#}");
    assert!(v["error"].as_str().unwrap().contains("2 threads"), "{v:#}");
}

fn hardened_server_denies_and_still_runs_sandboxes() {
    if !features_ok("hardened_server_denies_and_still_runs_sandboxes") {
        return;
    }
    let d = Dirs::new("deny");
    let v = serve(&d, false);
    let (before, after) = (&v["before"], &v["after"]);
    // Denied after hardening; where the call reached the kernel before, the filter did it.
    for call in [
        "ptrace",
        "io_uring_setup",
        "bpf",
        "socket_unix",
        "socket_netlink",
        "socket_inet",
    ] {
        assert!(denied(&after[call]), "{call} not denied: {v:#}");
    }
    for call in ["ptrace", "socket_unix", "socket_netlink", "socket_inet"] {
        assert!(
            !denied(&before[call]),
            "{call} denied before hardening: {v:#}"
        );
    }
    assert!(succeeded(&after["socketpair_unix"]), "{v:#}");
    assert_eq!(after["dumpable"], false, "{v:#}");
    assert_eq!(before["no_new_privs"], false, "{v:#}");
    assert_eq!(after["no_new_privs"], true, "{v:#}");
    assert!(after["seccomp_filters"].as_u64().unwrap() >= 2, "{v:#}");
    assert_eq!(after["threads"], 1);
    // fds: the unlisted one is closed, the kept one and the listener are open.
    assert_eq!(v["dropped_fd_open"], false, "{v:#}");
    assert_eq!(v["kept_fd_open"], true, "{v:#}");
    let rec = &v["record"];
    assert!(rec["fds_closed"].as_u64().unwrap() >= 1, "{v:#}");
    assert_eq!(rec["fds_kept"].as_array().unwrap().len(), 2, "{v:#}");
    assert_eq!(rec["landlock"]["status"], "enforced", "{v:#}");
    assert_eq!(rec["landlock"]["abi"], 7);
    assert!(rec["landlock"]["handled_fs"].as_array().unwrap().is_empty());
    assert_eq!(
        rec["landlock"]["handled_net"],
        serde_json::json!(["bind_tcp", "connect_tcp"])
    );
    assert_eq!(
        rec["landlock"]["scopes"],
        serde_json::json!(["abstract_unix_socket", "signal"])
    );
    assert_eq!(rec["seccomp"]["socket"], "denied");
    assert_eq!(rec["seccomp"]["hash"].as_str().unwrap().len(), 64);
    assert!(
        rec["seccomp"]["denied_syscalls"]
            .as_array()
            .unwrap()
            .contains(&Value::from("ptrace"))
    );

    // Sandboxes still work under it (the zygote and the init stage mount in their own
    // namespaces: the server's domain handles no filesystem right).
    assert_eq!(v["prepared_new"], "ok", "{v:#}");
    assert_eq!(v["prepared_true"]["status"], 0, "{v:#}");
    assert_eq!(v["prepared_write_inside"]["status"], 0, "{v:#}");
    assert_eq!(v["prepared_write_inside"]["stdout"], "ok\n", "{v:#}");
    assert_eq!(
        std::fs::read_to_string(d.0.join("w/inside")).unwrap(),
        "ok\n"
    );
    assert_eq!(v["oneshot_true"]["status"], 0, "{v:#}");
    // A tool still cannot write outside its workspace.
    let out = v["prepared_write_outside"]["stdout"].as_str().unwrap();
    assert!(out.starts_with("write ") && out != "write 0\n", "{v:#}");
    assert!(!d.0.join("outside/pwned").exists());
    // The server's restriction bounds its tools: a tool whose own policy allows the
    // listener's port cannot connect, and the listener saw nothing.
    assert_eq!(v["net_prepared_new"], "ok", "{v:#}");
    assert!(
        !v["net_tool"]["stdout"]
            .as_str()
            .unwrap()
            .contains("connected"),
        "{v:#}"
    );
    assert_ne!(v["net_tool"]["status"], 0, "{v:#}");
    assert_eq!(v["listener_saw_connection"], false, "{v:#}");
    // A server without inet sockets cannot make a proxied run's listener: refused, naming
    // the step.
    for k in ["proxy_oneshot", "proxy_prepared"] {
        let e = v[k]["error"].as_str().unwrap_or_default();
        assert!(e.contains("network namespace set-up"), "{k}: {v:#}");
    }
}

fn allow_inet_keeps_tcp_for_the_server_and_its_tools() {
    if !features_ok("allow_inet_keeps_tcp_for_the_server_and_its_tools") {
        return;
    }
    let d = Dirs::new("inet");
    let v = serve(&d, true);
    let after = &v["after"];
    // The control for the test above: the same tool connects when the server allows inet.
    assert!(succeeded(&after["socket_inet"]), "{v:#}");
    for call in ["ptrace", "socket_unix", "socket_netlink"] {
        assert!(denied(&after[call]), "{call} not denied: {v:#}");
    }
    let rec = &v["record"];
    assert_eq!(rec["seccomp"]["socket"], "af_inet and af_inet6 only");
    assert!(
        rec["landlock"]["handled_net"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        rec["landlock"]["scopes"],
        serde_json::json!(["abstract_unix_socket", "signal"])
    );
    assert_eq!(v["net_prepared_new"], "ok", "{v:#}");
    assert_eq!(v["net_tool"]["stdout"], "connected\n", "{v:#}");
    assert_eq!(v["listener_saw_connection"], true, "{v:#}");
    // network.mode = "proxy" works under the server's restriction (what toolsrv's
    // `needs_inet` gives a session with such a policy): one-shot and prepared.
    for k in ["proxy_oneshot", "proxy_prepared"] {
        assert_eq!(v[k]["stdout"], "connected\n", "{k}: {v:#}");
        assert_eq!(v[format!("{k}_connected")], true, "{k}: {v:#}");
    }
}
