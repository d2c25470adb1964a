//! olliesrv under a service manager, without booting one: `systemd-socket-activate` (systemd's
//! own implementation of the activation protocol) holds the socket and starts olliesrv on the
//! first connection, a datagram socket stands in for `NOTIFY_SOCKET`, and `JOURNAL_STREAM`
//! names the file stderr goes to. The booted version of all this (the real units in a
//! container) is `scripts/boot-test.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::toolsrv::{features_ok, skip};
use common::{IO_TIMEOUT, STEP, UP_TIMEOUT, bin, ollie9p, text, wait_child};

const ACTIVATE: &str = "systemd-socket-activate";

/// Whether systemd-socket-activate is installed (SKIP, or failure under
/// `OLLIE_TEST_REQUIRE=all`, when not).
fn activate_available(case: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(ACTIVATE).is_file()));
    if found {
        return true;
    }
    if ollie_testkit::require_all() {
        panic!("{case}: {ACTIVATE} is missing (Debian package systemd)");
    }
    skip(&format!("SKIP {case}: {ACTIVATE} is missing"));
    false
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The children of `pid` (from /proc/*/stat).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // pid (comm) state ppid …; comm may contain spaces, so split after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        if rest.split_whitespace().nth(1) == Some(&pid.to_string()) {
            out.push(child);
        }
    }
    out
}

/// The socket inodes a process holds (`socket:[N]` links in /proc/PID/fd).
fn socket_inodes(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in rd.flatten() {
            if let Ok(l) = std::fs::read_link(e.path()) {
                let l = l.display().to_string();
                if l.starts_with("socket:") {
                    out.push(l);
                }
            }
        }
    }
    out
}

fn pid_alive(pid: u32) -> bool {
    // A zombie still has /proc/PID; only a reaped process is really gone.
    Path::new(&format!("/proc/{pid}")).exists()
}

/// A datagram socket playing the service manager's notify socket.
struct Notify {
    sock: UnixDatagram,
    path: PathBuf,
}

impl Notify {
    fn bind(dir: &Path) -> Notify {
        let path = dir.join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        Notify { sock, path }
    }

    /// The next notification within `timeout`, if any.
    fn next(&self, timeout: Duration) -> Option<String> {
        self.sock.set_read_timeout(Some(timeout)).unwrap();
        let mut buf = [0u8; 4096];
        match self.sock.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(_) => None,
        }
    }
}

/// olliesrv started by systemd-socket-activate on the first connection to `sock`.
struct Activated {
    child: Child,
    stderr: PathBuf,
}

impl Activated {
    fn start(dir: &Path, sock: &Path, notify: &Notify, extra: &[&str]) -> Activated {
        std::fs::create_dir_all(dir.join("xdg-empty")).unwrap();
        let cfg = dir.join("config.toml");
        std::fs::write(&cfg, "").unwrap();
        let stderr = dir.join("olliesrv.stderr");
        let mut cmd = Command::new(ACTIVATE);
        cmd.args(extra).arg("-l").arg(sock);
        for (k, v) in [
            ("NOTIFY_SOCKET", notify.path.display().to_string()),
            (
                "XDG_CONFIG_HOME",
                dir.join("xdg-empty").display().to_string(),
            ),
            ("NAMESPACE", dir.join("ns-default").display().to_string()),
            ("OLLIE_LOG", "info".to_owned()),
            ("OLLAMA_HOST", "127.0.0.1:9".to_owned()),
        ] {
            cmd.arg("-E").arg(format!("{k}={v}"));
        }
        cmd.arg(bin("olliesrv"))
            .arg("--config")
            .arg(&cfg)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap());
        let child = cmd.spawn().expect("spawn systemd-socket-activate");
        // The socket file appears at bind(2), before listen(2): a connection in between is
        // refused. systemd-socket-activate says "Listening on …" once it listens.
        let deadline = Instant::now() + UP_TIMEOUT;
        while !std::fs::read_to_string(&stderr).is_ok_and(|e| e.contains("Listening on")) {
            assert!(Instant::now() < deadline, "{ACTIVATE} never listened");
            std::thread::sleep(STEP);
        }
        assert!(sock.exists(), "{} is missing", sock.display());
        Activated { child, stderr }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Activated {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn activation_starts_on_first_connect_reports_ready_and_stops_with_every_toolsrv_gone() {
    let case = "activation_starts_on_first_connect_reports_ready_and_stops_with_every_toolsrv_gone";
    if !activate_available(case) || !features_ok(case) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let sock = run.join("ollie");
    let addr = format!("unix!{}", sock.display());
    let notify = Notify::bind(dir.path());
    let mut srv = Activated::start(dir.path(), &sock, &notify, &[]);

    // Nothing runs until someone connects: the manager still holds the socket alone.
    assert_eq!(notify.next(Duration::from_millis(300)), None);
    // (comm is cut at 15 bytes: "systemd-socket-")
    assert_eq!(comm(srv.pid()), ACTIVATE[..15]);

    // The first connection starts olliesrv, which serves that very connection.
    let out = ollie9p(&addr, &["ls"], b"");
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stderr),
        srv.stderr()
    );
    assert!(
        text(&out.stdout).contains("session"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(comm(srv.pid()), "olliesrv");
    let ready = notify.next(IO_TIMEOUT).expect("no READY=1 notification");
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(
        ready.contains(&format!("STATUS=serving unix!{}", sock.display())),
        "{ready:?}"
    );
    // The passed socket replaces the default address: nothing was bound there.
    assert!(!dir.path().join("ns-default").join("ollie").exists());

    // A session brings a toolsrv; it must not have inherited the listening socket.
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let spec = format!("name=proj cwd={}", work.display());
    let out = ollie9p(&addr, &["rdwr", "session/new"], spec.as_bytes());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let deadline = Instant::now() + UP_TIMEOUT;
    let toolsrv = loop {
        if let Some(c) = children(srv.pid())
            .into_iter()
            .find(|c| comm(*c) == "toolsrv")
        {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "no toolsrv child: {}",
            srv.stderr()
        );
        std::thread::sleep(STEP);
    };
    let listener = std::fs::read_link(format!("/proc/{}/fd/3", srv.pid()))
        .unwrap()
        .display()
        .to_string();
    assert!(listener.starts_with("socket:"), "{listener}");
    // The passed descriptor is close-on-exec (O_CLOEXEC in fdinfo's octal flags), so no
    // program olliesrv starts can inherit it.
    let fdinfo = std::fs::read_to_string(format!("/proc/{}/fdinfo/3", srv.pid())).unwrap();
    let flags = fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
        .unwrap();
    assert_ne!(flags & libc::O_CLOEXEC as u32, 0, "{fdinfo}");
    assert!(
        !socket_inodes(toolsrv).contains(&listener),
        "toolsrv inherited the listening socket {listener}"
    );

    // Stop: STOPPING=1, exit 0, and toolsrv is gone (reaped) by the time olliesrv exits.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(srv.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let stopping = notify.next(IO_TIMEOUT).expect("no STOPPING=1 notification");
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let st = wait_child(&mut srv.child, UP_TIMEOUT, "olliesrv");
    assert!(st.success(), "{st}: {}", srv.stderr());
    assert!(!pid_alive(toolsrv), "toolsrv {toolsrv} outlived olliesrv");
    assert!(
        srv.stderr().contains("every toolsrv has exited"),
        "{}",
        srv.stderr()
    );
    // The socket belongs to the manager: olliesrv leaves it in place.
    assert!(
        std::fs::symlink_metadata(&sock)
            .unwrap()
            .file_type()
            .is_socket()
    );
}

#[test]
fn state_survives_a_restart_through_the_same_activated_socket() {
    let case = "state_survives_a_restart_through_the_same_activated_socket";
    if !activate_available(case) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ollie");
    let addr = format!("unix!{}", sock.display());
    let notify = Notify::bind(dir.path());
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    {
        let mut srv = Activated::start(dir.path(), &sock, &notify, &[]);
        let spec = format!("name=keep cwd={}", work.display());
        let out = ollie9p(&addr, &["rdwr", "session/new"], spec.as_bytes());
        assert!(
            out.status.success(),
            "{}{}",
            text(&out.stderr),
            srv.stderr()
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(srv.pid() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        assert!(wait_child(&mut srv.child, UP_TIMEOUT, "olliesrv").success());
    }
    // A new manager process on the same path (as after `systemctl restart`).
    let _ = std::fs::remove_file(&sock);
    let srv = Activated::start(dir.path(), &sock, &notify, &[]);
    let out = ollie9p(&addr, &["ls", "session"], b"");
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stderr),
        srv.stderr()
    );
    assert!(text(&out.stdout).contains("keep"), "{}", text(&out.stdout));
}

#[test]
fn a_passed_socket_that_cannot_serve_9p_is_refused_in_one_line() {
    let case = "a_passed_socket_that_cannot_serve_9p_is_refused_in_one_line";
    if !activate_available(case) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("dgram");
    let notify = Notify::bind(dir.path());
    let mut srv = Activated::start(dir.path(), &sock, &notify, &["--datagram"]);
    // The first datagram starts the program.
    let tx = UnixDatagram::unbound().unwrap();
    tx.send_to(b"x", &sock).unwrap();
    let st = wait_child(&mut srv.child, UP_TIMEOUT, "olliesrv");
    assert_eq!(st.code(), Some(3), "{}", srv.stderr());
    let err = srv.stderr();
    let line = err
        .lines()
        .find(|l| l.starts_with("olliesrv: socket activation:"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("not a listening stream socket"), "{line}");
    assert!(line.contains("ListenStream="), "{line}");
    // It never reported readiness.
    assert_eq!(notify.next(Duration::from_millis(100)), None);
}

/// Runs olliesrv until it serves, stops it with SIGTERM, and returns what it logged to
/// `stderr` (a file), with `JOURNAL_STREAM` set to `journal_stream`.
fn serve_once(dir: &Path, stderr: &Path, journal_stream: &str) -> String {
    let sock = dir.join("ns").join("ollie");
    std::fs::create_dir_all(dir.join("xdg-empty")).unwrap();
    let mut child = Command::new(bin("olliesrv"))
        .arg("-a")
        .arg(format!("unix!{}", sock.display()))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("XDG_CONFIG_HOME", dir.join("xdg-empty"))
        .env("OLLAMA_HOST", "127.0.0.1:9")
        .env("OLLIE_LOG", "info")
        .env("JOURNAL_STREAM", journal_stream)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .append(true)
                .open(stderr)
                .unwrap(),
        )
        .spawn()
        .unwrap();
    let deadline = Instant::now() + UP_TIMEOUT;
    while UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "olliesrv did not come up");
        std::thread::sleep(STEP);
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(wait_child(&mut child, UP_TIMEOUT, "olliesrv").success());
    std::fs::read_to_string(stderr).unwrap()
}

#[test]
fn logs_carry_journal_priorities_when_stderr_is_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let m = std::fs::File::create(&journal).unwrap().metadata().unwrap();
    let stream = format!("{}:{}", m.dev(), m.ino());
    let log = serve_once(dir.path(), &journal, &stream);
    let serving = log
        .lines()
        .find(|l| l.contains("serving"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(serving.starts_with("<6>"), "{serving}");
    // No timestamp and no colour: the level follows the priority.
    assert!(
        serving["<6>".len()..].trim_start().starts_with("INFO"),
        "{serving}"
    );
    assert!(!log.contains('\u{1b}'), "{log}");
    assert!(log.lines().all(|l| l.starts_with('<')), "{log}");

    // The same server with stderr elsewhere than JOURNAL_STREAM names logs normally.
    let plain = dir.path().join("plain");
    std::fs::File::create(&plain).unwrap();
    let log = serve_once(dir.path(), &plain, &stream);
    assert!(log.contains("serving"), "{log}");
    assert!(!log.starts_with("<6>"), "{log}");
}

/// What `systemctl stop` (SIGTERM to olliesrv) does to a tool that is still running: it gets
/// SIGTERM and its grace period before anything is killed, even while an agent's turn still
/// holds the session's toolsrv connection (a background tool).
#[test]
fn stopping_the_server_gives_running_tools_their_sigterm() {
    let case = "stopping_the_server_gives_running_tools_their_sigterm";
    if !features_ok(case) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let turns = dir.path().join("turns.jsonl");
    std::fs::write(
        &turns,
        concat!(
            r#"{"tool_calls":[{"name":"execute_code","arguments":{"language":"bash","code":"trap 'echo got-term > got-term.txt; exit 0' TERM; echo started > started.txt; sleep 300 & wait","background":true}}]}"#,
            "\n",
            r#"{"text":"started"}"#,
            "\n"
        ),
    )
    .unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let config = format!(
        "default_backend = \"bg\"\n[backends.bg]\nkind = \"replay\"\nfile = \"{}\"\n",
        turns.display()
    );
    let mut srv = common::Srv::start(&config);
    let addr = srv.addr();
    let spec = format!("name=p cwd={}", work.display());
    let out = ollie9p(&addr, &["rdwr", "session/new"], spec.as_bytes());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = ollie9p(
        &addr,
        &["rdwr", "session/p/agent/new"],
        b"name=bg prompt=start it\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let deadline = Instant::now() + IO_TIMEOUT;
    while !work.join("started.txt").exists() {
        assert!(
            Instant::now() < deadline,
            "the tool never started: {}",
            srv.stderr()
        );
        std::thread::sleep(STEP);
    }
    srv.signal(nix::sys::signal::Signal::SIGTERM);
    let st = srv.wait_exit();
    assert!(st.success(), "{st}: {}", srv.stderr());
    assert_eq!(
        std::fs::read_to_string(work.join("got-term.txt")).unwrap_or_default(),
        "got-term\n",
        "the tool was killed without its SIGTERM: {}",
        srv.stderr()
    );
}
