//! Remote sessions (`session/new … remote=NAME`) over a real ssh: the test starts its own
//! `sshd` on 127.0.0.1 (a free port, a generated host key, a generated client key in an
//! AuthorizedKeysFile of its temporary directory) for the user running it, and olliesrv's
//! `[remotes.far]` command is `ssh … 127.0.0.1 /abs/toolsrv --stdio`. Checked: the session's
//! tools run sandboxed under the toolsrv sshd started (not one of olliesrv's children), a
//! bypass request from it reaches the root `bypass/pending` and the verdict reaches the tool,
//! and killing the ssh client fails the call in flight with a clear error, announces the loss
//! and reconnects. Without sshd, ssh or ssh-keygen the ssh test prints `SKIP <test>: <reason>`
//! (and fails under `OLLIE_TEST_REQUIRE=all`).
// Scenario tests read top to bottom; splitting them would hide the story.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::kv_value as kv;
use common::toolsrv::{features_ok, skip};
use common::*;
use ollie_p9::Fid;
use ollie_p9::wire::om;
use ollie_testkit::client::{rdwr_text as rdwr, read_ok as read, write_ok as write};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// 9P helpers

/// Waits (bounded) until `path` contains `needle`; returns the content.
async fn wait_for(root: &Fid, path: &str, needle: &str) -> String {
    wait_for_text(root, path, needle, Duration::from_secs(60)).await
}

/// An `eventwait` fid opened before what it is to see.
struct Events {
    f: Fid,
}

impl Events {
    async fn open(root: &Fid) -> Events {
        let mut f = root.walk_path("eventwait").await.unwrap();
        f.open(om::OREAD).await.unwrap();
        Events { f }
    }

    /// The next event of `kind` for session `sid` (bounded).
    async fn until(&mut self, kind: &str, sid: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let d = tokio::time::timeout_at(deadline, self.f.read(0, 65536))
                .await
                .unwrap_or_else(|_| panic!("no {kind} event for {sid} within 60 s"))
                .expect("eventwait");
            assert!(!d.is_empty(), "eventwait ended while waiting for {kind}");
            let v: Value = serde_json::from_slice(&d).unwrap();
            if v["event"] == kind && v["session"] == sid {
                return v;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Processes

/// The parent pid and the command name of `pid`.
fn stat(pid: u32) -> Option<(u32, String)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = s.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_owned();
    let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
    Some((ppid, comm))
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// `pid`'s ancestors, nearest first, as (pid, comm).
fn ancestors(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let mut cur = pid;
    while let Some((ppid, _)) = stat(cur) {
        if ppid == 0 || out.len() > 64 {
            break;
        }
        let comm = stat(ppid).map(|(_, c)| c).unwrap_or_default();
        out.push((ppid, comm));
        cur = ppid;
    }
    out
}

/// The direct children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Some(c) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok())
            && stat(c).is_some_and(|(pp, _)| pp == pid)
        {
            out.push(c);
        }
    }
    out
}

/// Waits (bounded) until `pid` is gone (or a zombie).
async fn wait_pid_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().next().map(str::to_owned))
            });
        if state.is_none_or(|s| s == "Z") {
            return;
        }
        assert!(Instant::now() < deadline, "process {pid} is still there");
        tokio::time::sleep(STEP).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The ssh server

/// `name` in PATH or in the sbin directories (sshd is in /usr/sbin, often not in a user's
/// PATH).
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// SKIP (or a failure under `OLLIE_TEST_REQUIRE=all`).
fn missing(case: &str, why: &str) {
    if ollie_testkit::require_all() {
        panic!("{case}: {why} (OLLIE_TEST_REQUIRE=all; scripts/deps.sh installs it)");
    }
    skip(&format!("SKIP {case}: {why}"));
}

/// Our own sshd on 127.0.0.1, for the user running the test, killed when dropped.
struct Sshd {
    child: Child,
    port: u16,
    /// The client's private key.
    key: PathBuf,
    ssh: PathBuf,
    log: PathBuf,
}

impl Sshd {
    /// Starts it in `dir`, or says SKIP and returns `None` without openssh.
    fn start(case: &str, dir: &Path) -> Option<Sshd> {
        let (Some(sshd), Some(ssh), Some(keygen)) = (
            find_program("sshd"),
            find_program("ssh"),
            find_program("ssh-keygen"),
        ) else {
            missing(
                case,
                "sshd, ssh or ssh-keygen is missing (Debian openssh-server, openssh-client)",
            );
            return None;
        };
        let dir = dir.join("sshd");
        std::fs::create_dir(&dir).unwrap();
        let keygen = |file: &Path| {
            let out = run(
                Command::new(&keygen)
                    .args(["-q", "-t", "ed25519", "-N", "", "-C", "ollie-test", "-f"])
                    .arg(file),
                b"",
            );
            assert!(out.status.success(), "ssh-keygen: {}", text(&out.stderr));
        };
        let host_key = dir.join("host_ed25519");
        let key = dir.join("client_ed25519");
        keygen(&host_key);
        keygen(&key);
        let authorized = dir.join("authorized_keys");
        std::fs::copy(dir.join("client_ed25519.pub"), &authorized).unwrap();
        if nix::unistd::geteuid().is_root() {
            // sshd as root chroots its pre-authentication child into its privilege
            // separation directory (the package's service unit would create it).
            std::fs::create_dir_all("/run/sshd").unwrap();
        }
        let log = dir.join("sshd.log");
        // A free port may be taken between our probe and sshd's bind: try a few.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let config = dir.join("sshd_config");
            std::fs::write(
                &config,
                format!(
                    "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nPidFile {}\nAuthorizedKeysFile {}\n\
                     StrictModes no\nUsePAM no\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
                     KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nAllowUsers {}\n\
                     PrintMotd no\nX11Forwarding no\nAllowTcpForwarding no\nLogLevel VERBOSE\n",
                    host_key.display(),
                    dir.join("sshd.pid").display(),
                    authorized.display(),
                    me(),
                ),
            )
            .unwrap();
            let child = Command::new(&sshd)
                .arg("-D")
                .arg("-e")
                .arg("-f")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", sshd.display()));
            let mut s = Sshd {
                child,
                port,
                key: key.clone(),
                ssh: ssh.clone(),
                log: log.clone(),
            };
            // Up when it says so in its log (bounded).
            let deadline = Instant::now() + UP_TIMEOUT;
            loop {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.contains("Server listening on") {
                    s.check_login();
                    return Some(s);
                }
                if let Some(st) = s.child.try_wait().unwrap() {
                    if text.contains("Address already in use") {
                        break;
                    }
                    panic!("sshd exited ({st}):\n{text}");
                }
                assert!(
                    Instant::now() < deadline,
                    "sshd did not listen within {UP_TIMEOUT:?}:\n{text}"
                );
                std::thread::sleep(STEP);
            }
        }
        panic!("sshd: no free port after 5 tries");
    }

    /// The ssh client's arguments up to the destination (no user configuration, our key, no
    /// host key checks, never a prompt).
    fn ssh_args(&self) -> Vec<String> {
        [
            self.ssh.display().to_string(),
            "-F".into(),
            "/dev/null".into(),
            "-i".into(),
            self.key.display().to_string(),
            "-p".into(),
            self.port.to_string(),
            "-o".into(),
            "StrictHostKeyChecking=no".into(),
            "-o".into(),
            "UserKnownHostsFile=/dev/null".into(),
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            "IdentitiesOnly=yes".into(),
            "-o".into(),
            "LogLevel=ERROR".into(),
            "-l".into(),
            me(),
            "127.0.0.1".into(),
        ]
        .to_vec()
    }

    /// The `[remotes.far]` command: ssh to it, then toolsrv in stdio mode.
    fn remote_command(&self) -> Vec<String> {
        let mut v = self.ssh_args();
        v.push(bin("toolsrv").display().to_string());
        v.push("--stdio".into());
        v
    }

    /// One login by hand first, so a broken sshd set-up fails here with its log.
    fn check_login(&self) {
        let args = self.ssh_args();
        let out = run(
            Command::new(&args[0])
                .args(&args[1..])
                .arg("echo ollie-ssh-ok")
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env("HOME", std::env::var_os("HOME").unwrap_or_default()),
            b"",
        );
        assert!(
            text(&out.stdout).contains("ollie-ssh-ok"),
            "ssh login to our sshd failed ({}): {}\nsshd log:\n{}",
            out.status,
            text(&out.stderr),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The tests

/// A toml array of strings.
fn toml_array(v: &[String]) -> String {
    let items: Vec<String> = v
        .iter()
        .map(|s| serde_json::to_string(s).unwrap())
        .collect();
    format!("[{}]", items.join(", "))
}

/// The first `tool_result` marker after `from` in a raw chat: its attributes and its body.
fn tool_result(raw: &str, from: &str) -> (String, String) {
    let rest = raw
        .split(from)
        .nth(1)
        .unwrap_or_else(|| panic!("no {from:?} in:\n{raw}"));
    let start = rest
        .find("[[[tool_result ")
        .unwrap_or_else(|| panic!("no tool_result after {from:?}:\n{raw}"));
    let block = &rest[start..];
    let (head, body) = block.split_once('\n').unwrap();
    let body = body.split("\n]]]").next().unwrap_or("");
    // The result's own header line (`pid=1 exit=0 time=…`), then the output.
    let body = match body.split_once('\n') {
        Some((first, rest)) if first.starts_with("pid=") => rest,
        _ => body,
    };
    (head.to_owned(), body.to_owned())
}

/// The `record=` attribute of a `tool_result` marker, parsed.
fn record_of(head: &str) -> Value {
    let at = head
        .find(" record=")
        .unwrap_or_else(|| panic!("no record in {head}"));
    serde_json::Deserializer::from_str(&head[at + " record=".len()..])
        .into_iter::<Value>()
        .next()
        .unwrap_or_else(|| panic!("no record JSON in {head}"))
        .unwrap_or_else(|e| panic!("record JSON in {head}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_session_runs_tools_under_sshd_and_survives_a_lost_link() {
    const CASE: &str = "a_remote_session_runs_tools_under_sshd_and_survives_a_lost_link";
    if !features_ok(CASE) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // sshd as root reads nothing of the user's; as another user the directory must be its.
    let Some(sshd) = Sshd::start(CASE, dir.path()) else {
        return;
    };
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let canary = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = canary.local_addr().unwrap().port();
    let call = |code: &str| -> Value {
        serde_json::json!({"tool_calls": [{"name": "execute_code", "arguments": {
            "language": "bash", "code": code}}]})
    };
    let mut ask = call(&format!(
        "if exec 3<>/dev/tcp/127.0.0.1/{port}; then echo connected-{port}; else echo refused; fi"
    ));
    ask["tool_calls"][0]["arguments"]["escalate"] = serde_json::json!({
        "grants": [format!("net:{port}")], "reason": "reach the test canary"});
    let turns = [
        call("echo ran-remote; echo made > made.txt"),
        serde_json::json!({"text": "first done"}),
        ask,
        serde_json::json!({"text": "escalated"}),
        // Blocks until its toolsrv goes away (the workload, not a synchronisation).
        call("echo started > hang.txt; exec sleep 600"),
        serde_json::json!({"text": "after the loss"}),
        call("echo back-again"),
        serde_json::json!({"text": "all done"}),
    ]
    .iter()
    .map(|v| format!("{v}\n"))
    .collect::<String>();
    std::fs::write(dir.path().join("turns.jsonl"), turns).unwrap();
    std::fs::create_dir(dir.path().join("agents")).unwrap();
    std::fs::write(
        dir.path().join("agents").join("asker.toml"),
        "escalations = [\"net\"]\n",
    )
    .unwrap();
    let config = format!(
        "default_backend = \"demo\"\n\n[backends.demo]\nkind = \"replay\"\nfile = \"{}\"\n\n[remotes.far]\ncommand = {}\n",
        dir.path().join("turns.jsonl").display(),
        toml_array(&sshd.remote_command())
    );
    let srv = Srv::start_with(dir, &config, |_| {});
    let olliesrv = u32::try_from(srv.pid().as_raw()).unwrap();
    let (_c, root) = attach(&srv, &me()).await;
    let mut ev = Events::open(&root).await;
    rdwr(
        &root,
        "session/new",
        &format!("name=s cwd={} remote=far", work.display()),
    )
    .await
    .unwrap();
    let sid = read(&root, "session/s/id").await.trim().to_owned();
    rdwr(&root, "session/s/agent/new", "name=a profile=asker")
        .await
        .unwrap();

    // Started over ssh: the event names the remote, the ssh client (olliesrv's child) and
    // the toolsrv sshd started.
    let started = ev.until("toolsrv-started", &sid).await;
    assert_eq!(started["remote"], "far", "{started}");
    let ssh_pid = u32::try_from(started["pid"].as_u64().unwrap()).unwrap();
    assert_eq!(stat(ssh_pid).map(|s| s.0), Some(olliesrv), "{started}");
    assert!(cmdline(ssh_pid).contains("ssh"), "{}", cmdline(ssh_pid));
    let tpid = u32::try_from(started["toolsrv_pid"].as_u64().unwrap()).unwrap();
    let info = read(&root, "session/s/toolsrv/info").await;
    assert_eq!(kv(&info, "pid"), tpid.to_string(), "{info}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(kv(&info, "host"), host.trim(), "{info}");
    assert_eq!(started["host"], kv(&info, "host").as_str(), "{started}");
    assert_eq!(
        kv(&info, "workdir"),
        std::fs::canonicalize(&work).unwrap().display().to_string(),
        "{info}"
    );
    let up = ancestors(tpid);
    assert!(
        up.iter().any(|(_, c)| c.contains("sshd")),
        "toolsrv {tpid} does not run under sshd: {up:?}"
    );
    assert!(
        !up.iter().any(|(p, _)| *p == olliesrv),
        "toolsrv {tpid} is olliesrv's descendant: {up:?}"
    );
    assert!(
        !children(olliesrv)
            .iter()
            .any(|c| stat(*c).is_some_and(|(_, n)| n == "toolsrv")),
        "olliesrv started a local toolsrv for a remote session"
    );
    let cfg = read(&root, "session/s/cfg").await;
    assert_eq!(kv(&cfg, "remote"), "far", "{cfg}");
    assert_eq!(kv(&cfg, "toolsrv"), "up", "{cfg}");
    assert_eq!(kv(&cfg, "cwd"), work.display().to_string(), "{cfg}");
    let status = rdwr(&root, "session/s/ctl", "status").await.unwrap();
    assert!(status.contains("remote=far\ntoolsrv=up\n"), "{status}");

    // 1. A sandboxed tool through the remote toolsrv; the run record shows the layers.
    write(&root, "session/s/agent/a/prompt", "P1 make a file").await;
    let raw = wait_for(&root, "session/s/agent/a/log", "first done").await;
    let (head, body) = tool_result(&raw, "P1 make a file");
    assert_eq!(body.trim(), "ran-remote", "{raw}");
    assert!(head.contains(" exit=0 "), "{head}");
    let rec = record_of(&head);
    assert_eq!(
        rec["layers"]["landlock"]["status"], "fully_enforced",
        "{rec}"
    );
    assert!(
        rec["layers"]["seccomp"]["filters"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{rec}"
    );
    assert_eq!(rec["layers"]["no_new_privs"], true, "{rec}");
    assert_eq!(
        std::fs::read_to_string(work.join("made.txt")).unwrap(),
        "made\n"
    );
    // The run is in the remote toolsrv's process table (served from that toolsrv).
    let top = read(&root, "session/s/agent/a/proc/top").await;
    assert!(top.contains("execute_code"), "{top}");

    // 2. A bypass request from the remote session: in the root bypass/pending, approved
    //    through the root bypass/resolve, run once with the grant.
    write(&root, "session/s/agent/a/prompt", "P2 reach the canary").await;
    let mut pending = root.walk_path("bypass/pending").await.unwrap();
    pending.open(om::OREAD).await.unwrap();
    let req = within("bypass/pending", pending.read(0, 65536))
        .await
        .unwrap();
    let req: Value = serde_json::from_slice(&req).unwrap();
    assert_eq!(req["session_name"], "s", "{req}");
    assert_eq!(req["agent_name"], "a", "{req}");
    assert_eq!(
        req["grants"],
        serde_json::json!([format!("net:{port}")]),
        "{req}"
    );
    let id = req["id"].as_str().unwrap().to_owned();
    write(
        &root,
        "bypass/resolve",
        &format!(r#"{{"id":"{id}","approved":true}}"#),
    )
    .await;
    let raw = wait_for(&root, "session/s/agent/a/log", "escalated").await;
    let (_, body) = tool_result(&raw, "P2 reach the canary");
    assert_eq!(body.trim(), format!("connected-{port}"), "{raw}");
    let audit = wait_for(&root, "bypass/audit", "\"event\":\"ran\"").await;
    assert!(audit.contains(&id), "{audit}");

    // 3. The ssh connection dies during a call: the call fails with a clear error, the
    //    session says restarting (toolsrv-died) and comes back over a new ssh.
    write(
        &root,
        "session/s/agent/a/prompt",
        "P3 wait for the link to die",
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(work.join("hang.txt")).unwrap_or_default() != "started\n" {
        assert!(Instant::now() < deadline, "the hanging call never started");
        tokio::time::sleep(STEP).await;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(ssh_pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill ssh");
    let died = ev.until("toolsrv-died", &sid).await;
    assert_eq!(died["remote"], "far", "{died}");
    assert_eq!(died["pid"].as_u64(), Some(u64::from(ssh_pid)), "{died}");
    let reason = died["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("remote far: the link was lost") && reason.contains("signal: 9"),
        "{died}"
    );
    let again = ev.until("toolsrv-started", &sid).await;
    assert_eq!(again["remote"], "far", "{again}");
    assert_ne!(again["pid"], started["pid"], "{again}");
    assert_ne!(again["toolsrv_pid"], started["toolsrv_pid"], "{again}");
    let raw = wait_for(&root, "session/s/agent/a/log", "after the loss").await;
    let (_, body) = tool_result(&raw, "P3 wait for the link to die");
    assert!(
        body.contains("the link to the session's toolsrv was lost during the call"),
        "{raw}"
    );
    // The old remote toolsrv saw the end of its stdin and ended (and its tool with it).
    wait_pid_gone(tpid).await;
    let cfg = wait_for(&root, "session/s/cfg", "toolsrv=up").await;
    assert_eq!(kv(&cfg, "remote"), "far", "{cfg}");

    // A new call works over the new connection.
    write(&root, "session/s/agent/a/prompt", "P4 once more").await;
    let raw = wait_for(&root, "session/s/agent/a/log", "all done").await;
    let (head, body) = tool_result(&raw, "P4 once more");
    assert_eq!(body.trim(), "back-again", "{raw}");
    assert!(head.contains(" exit=0 "), "{head}");
    drop(canary);
}

/// Without ssh: a remote whose command fails shows `failed` with the command's last stderr
/// line in the session's `cfg` and `ctl status`; `session/new` checks `remote=` and `cwd=`;
/// a remote session restores as remote after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_that_cannot_connect_says_why_and_persists() {
    let config = "[remotes.bad]\ncommand = [\"sh\", \"-c\", \"echo 'ssh: connect to host nowhere port 22: Connection refused' >&2; exit 255\"]\n\n[remotes.other]\nhost = \"nowhere.invalid\"\n";
    let mut srv = Srv::start(config);
    let (_c, root) = attach(&srv, &me()).await;
    let mut f = root.walk_path("session/new").await.unwrap();
    f.open(om::ORDWR).await.unwrap();
    for (spec, want) in [
        (
            "name=x cwd=/srv/x remote=nope",
            r#"unknown remote "nope" (configured: bad, other)"#,
        ),
        (
            "name=x remote=bad",
            r#"remote "bad": give cwd= (an absolute directory on the remote host)"#,
        ),
        (
            "name=x cwd=srv remote=bad",
            r#"cwd "srv" must be an absolute path (on the remote host)"#,
        ),
        ("name=x cwd=/srv/../etc remote=bad", "without . or .."),
    ] {
        let e = f
            .write(0, Bytes::from(spec.to_owned()))
            .await
            .expect_err(spec)
            .to_string();
        assert!(e.contains(want), "{spec}: {e}");
    }
    let mut ev = Events::open(&root).await;
    // The directory need not exist here: it names one on the remote host.
    rdwr(
        &root,
        "session/new",
        "name=r cwd=/srv/not/here/x remote=bad",
    )
    .await
    .unwrap();
    let sid = read(&root, "session/r/id").await.trim().to_owned();
    let failed = ev.until("toolsrv-failed", &sid).await;
    assert_eq!(failed["remote"], "bad", "{failed}");
    let reason = failed["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("remote bad: toolsrv did not answer")
            && reason
                .contains("(stderr: ssh: connect to host nowhere port 22: Connection refused)"),
        "{failed}"
    );
    let cfg = read(&root, "session/r/cfg").await;
    assert_eq!(kv(&cfg, "remote"), "bad", "{cfg}");
    assert_eq!(kv(&cfg, "cwd"), "/srv/not/here/x", "{cfg}");
    assert_eq!(kv(&cfg, "toolsrv"), "failed", "{cfg}");
    assert!(
        kv(&cfg, "toolsrv_reason").contains("Connection refused"),
        "{cfg}"
    );
    let status = rdwr(&root, "session/r/ctl", "status").await.unwrap();
    assert!(
        status.starts_with("remote=bad\ntoolsrv=failed\ntoolsrv_reason=remote bad: "),
        "{status}"
    );
    // A tool call would wait for the link, then fail with its reason.
    let idx = read(&root, "session/idx").await;
    assert!(idx.contains("\tfailed\t"), "{idx}");

    // Persisted as remote: after a restart the session comes back with its remote.
    drop(ev);
    drop(f);
    srv.kill9();
    srv.relaunch(|_| {});
    let (_c2, root) = attach(&srv, &me()).await;
    let mut ev = Events::open(&root).await;
    let cfg = read(&root, "session/r/cfg").await;
    assert_eq!(kv(&cfg, "remote"), "bad", "{cfg}");
    assert_eq!(kv(&cfg, "id"), sid, "{cfg}");
    let failed = ev.until("toolsrv-failed", &sid).await;
    assert_eq!(failed["remote"], "bad", "{failed}");
}

/// Without ssh: a remote whose command is the local `toolsrv --stdio` itself. The boot
/// message (the master key) travels on its stdin only: its argv is the configured command and
/// its environment holds nothing but `STDIO_ENV` variables; tools run through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_remote_gets_its_key_on_stdin_only_and_runs_tools() {
    const CASE: &str = "a_stdio_remote_gets_its_key_on_stdin_only_and_runs_tools";
    if !features_ok(CASE) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let turns = format!(
        "{}\n{}\n",
        serde_json::json!({"tool_calls": [{"name": "execute_code", "arguments": {
            "language": "bash", "code": "echo via-stdio"}}]}),
        serde_json::json!({"text": "done"})
    );
    std::fs::write(dir.path().join("turns.jsonl"), turns).unwrap();
    let toolsrv = bin("toolsrv").display().to_string();
    // The command notes the environment it got (toolsrv itself is not dumpable, so its
    // /proc/PID/environ is closed to an unprivileged test), then becomes toolsrv.
    let env_file = dir.path().join("env.txt");
    let config = format!(
        "default_backend = \"demo\"\n\n[backends.demo]\nkind = \"replay\"\nfile = \"{}\"\n\n[remotes.loop]\ncommand = {}\n",
        dir.path().join("turns.jsonl").display(),
        toml_array(&[
            "/bin/sh".into(),
            "-c".into(),
            format!("env > '{}'; exec '{toolsrv}' --stdio", env_file.display()),
        ])
    );
    // A secret-looking variable in olliesrv's environment must not reach the command.
    let srv = Srv::start_with(dir, &config, |c| {
        c.env("OPENAI_API_KEY", "sk-test-not-for-remotes");
    });
    let (_c, root) = attach(&srv, &me()).await;
    let mut ev = Events::open(&root).await;
    rdwr(
        &root,
        "session/new",
        &format!("name=s cwd={} remote=loop", work.display()),
    )
    .await
    .unwrap();
    let sid = read(&root, "session/s/id").await.trim().to_owned();
    let started = ev.until("toolsrv-started", &sid).await;
    assert_eq!(started["remote"], "loop", "{started}");
    let pid = u32::try_from(started["pid"].as_u64().unwrap()).unwrap();
    // Here the command is toolsrv itself, so both pids agree.
    assert_eq!(
        started["toolsrv_pid"].as_u64(),
        Some(u64::from(pid)),
        "{started}"
    );
    assert_eq!(cmdline(pid).trim_end(), format!("{toolsrv} --stdio"));
    let environ = std::fs::read_to_string(&env_file).unwrap();
    assert!(environ.contains("PATH="), "{environ}");
    for var in environ.lines() {
        let key = var.split('=').next().unwrap_or("");
        assert!(
            ollie_link::spawn::STDIO_ENV.contains(&key)
                || ["PWD", "OLDPWD", "SHLVL", "_"].contains(&key),
            "{key} reached the remote command's environment:\n{environ}"
        );
    }
    assert!(!environ.contains("sk-test-not-for-remotes"), "{environ}");
    rdwr(&root, "session/s/agent/new", "name=a").await.unwrap();
    write(&root, "session/s/agent/a/prompt", "P1 go").await;
    let raw = wait_for(&root, "session/s/agent/a/log", "[[[assistant\ndone").await;
    let (head, body) = tool_result(&raw, "P1 go");
    assert_eq!(body.trim(), "via-stdio", "{raw}");
    assert_eq!(
        record_of(&head)["layers"]["landlock"]["status"],
        "fully_enforced",
        "{head}"
    );
    let cfg = read(&root, "session/s/cfg").await;
    assert_eq!(kv(&cfg, "remote"), "loop", "{cfg}");
}
