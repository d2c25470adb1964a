//! `o sandbox` as a real process: stdin forwarding and post-run warnings.
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ollie_testkit::features_ok;

fn workspace(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ollie-o-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn o(ws: &PathBuf, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_o"));
    c.args(["sandbox", "--workdir"])
        .arg(ws)
        .arg("--")
        .args(args);
    c
}

#[test]
fn stdin_pipe_is_forwarded() {
    if !features_ok("stdin_pipe_is_forwarded") {
        return;
    }
    let ws = workspace("stdin");
    let mut child = o(&ws, &["sh", "-c", "tr a-z A-Z; echo \"eof $?\""])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        input.write_all(&b"hello pipe\n".repeat(20_000)).unwrap();
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.matches("HELLO PIPE\n").count(), 20_000);
    assert!(text.ends_with("eof 0\n"), "{}", &text[text.len() - 40..]);
    // No stdin (null): the tool reads EOF at once.
    let out = o(&ws, &["wc", "-c"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
    let _ = std::fs::remove_dir_all(&ws);
}

#[test]
fn post_run_flags_are_printed_as_warnings() {
    if !features_ok("post_run_flags_are_printed_as_warnings") {
        return;
    }
    let ws = workspace("flags");
    let out = o(
        &ws,
        &[
            "sh",
            "-c",
            "mkdir -p vendor/x && git -C vendor/x init -q && echo 'touch /tmp/x' > vendor/x/.git/hooks/post-checkout",
        ],
    )
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("o sandbox: warning: "))
        .collect();
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("git hook vendor/x/.git/hooks/post-checkout")),
        "{err}"
    );
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("new git repository vendor/x/.git")),
        "{err}"
    );
    // A quiet run prints no warning.
    let out = o(&ws, &["true"]).stdin(Stdio::null()).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&ws);
}

/// The injection probe run inside the sandbox: TIOCSTI against fds 0, 1 and 2 (byte by byte,
/// a whole command line), the same request with high bits set in the 64-bit argument (the
/// filter must compare the low 32 bits), TIOCLINUX, then the terminal itself through
/// `/dev/tty` and by its `/dev/pts` name. Prints `<label> <ERRNO|ok>` per attempt, then `END`.
const TTY_PROBE: &str = r#"
import ctypes, errno, fcntl, os, sys, termios
libc = ctypes.CDLL(None, use_errno=True)
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
buf = ctypes.create_string_buffer(b"x")
marker, pts = sys.argv[1], sys.argv[2]
def name(e):
    return errno.errorcode.get(e, str(e))
def raw(label, fd, req):
    ctypes.set_errno(0)
    rc = libc.ioctl(fd, req, ctypes.addressof(buf))
    print(label, "ok" if rc >= 0 else name(ctypes.get_errno()), flush=True)
def sti(label, fd):
    try:
        for ch in b"touch " + marker.encode() + b"\n":
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
        print(label, "ok", flush=True)
    except OSError as e:
        print(label, name(e.errno), flush=True)
for fd in (0, 1, 2):
    sti("sti%d" % fd, fd)
    raw("stihigh%d" % fd, fd, 0x5412 | (0xDEADBEEF << 32))
    raw("linux%d" % fd, fd, 0x541C)
for label, path in (("devtty", "/dev/tty"), ("pts", pts)):
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    except OSError as e:
        print(label, name(e.errno), flush=True)
        continue
    print(label, "ok", flush=True)
    sti(label + "sti", fd)
print("END", flush=True)
"#;

/// Reads the pty master until `sentinel` appears (a hang guard, not a timing check: it only
/// fails a test that would otherwise block forever).
fn read_until(master: &OwnedFd, sentinel: &str) -> String {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut text = Vec::new();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !String::from_utf8_lossy(&text).contains(sentinel) {
        assert!(
            std::time::Instant::now() < give_up,
            "no {sentinel:?} from the terminal; got {:?}",
            String::from_utf8_lossy(&text)
        );
        let mut fds = [PollFd::new(master.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::from(1000u16)).unwrap() == 0 {
            continue;
        }
        let mut chunk = [0u8; 4096];
        match nix::unistd::read(master.as_raw_fd(), &mut chunk) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&chunk[..n]),
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
            Err(e) => panic!("reading the pty master: {e}"),
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// Whether input is waiting on the terminal's input side (what a shell reading it would get).
fn input_pending(slave: &OwnedFd) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(slave.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).unwrap() > 0
}

/// Runs `argv` under `setsid -c` (a new session whose controlling terminal is the pty) with the
/// pty slave as stdin, stdout and stderr; returns its exit status.
fn on_pty(slave: &OwnedFd, argv: &[&std::ffi::OsStr]) -> std::process::ExitStatus {
    Command::new("setsid")
        .arg("-c")
        .args(argv)
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()))
        .status()
        .unwrap()
}

#[test]
fn terminal_injection_from_a_real_tty_fails() {
    use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
    use std::ffi::OsStr;
    let name = "terminal_injection_from_a_real_tty_fails";
    if !features_ok(name) {
        return;
    }
    if Command::new("setsid").arg("--help").output().is_err() {
        if ollie_testkit::require_all() {
            panic!("{name}: setsid (util-linux) is missing");
        }
        let _ = writeln!(
            std::io::stderr(),
            "SKIP {name}: setsid (util-linux) is missing"
        );
        return;
    }
    let pty = nix::pty::openpty(None, None).unwrap();
    let (master, slave) = (pty.master, pty.slave);
    // Raw mode: every injected byte would be readable at once, and output is passed as is.
    let mut t = tcgetattr(&slave).unwrap();
    cfmakeraw(&mut t);
    tcsetattr(&slave, SetArg::TCSANOW, &t).unwrap();
    let pts = std::fs::read_link(format!("/proc/self/fd/{}", slave.as_raw_fd())).unwrap();
    let ws = workspace("tty");
    let marker = std::env::temp_dir().join(format!("tiocsti-pwned-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);

    // Control, outside the sandbox: `setsid -c` gives the process this pty as its controlling
    // terminal, and an injection there is seen by `input_pending` (so the check below can see
    // one). TIOCSTI on one's own controlling tty works with legacy_tiocsti=1 or as root.
    let status = on_pty(
        &slave,
        &[
            OsStr::new("python3"),
            OsStr::new("-c"),
            OsStr::new(
                "import fcntl, os, termios\n\
                 os.close(os.open('/dev/tty', os.O_RDWR))\n\
                 try:\n    fcntl.ioctl(0, termios.TIOCSTI, b'z'); r = 'injected'\n\
                 except OSError as e:\n    r = 'refused %d' % e.errno\n\
                 print('CONTROL ctty', r, 'END-CONTROL', flush=True)",
            ),
        ],
    );
    let control = read_until(&master, "END-CONTROL");
    assert!(status.success(), "control run failed: {control}");
    assert!(control.contains("CONTROL ctty"), "{control}");
    if control.contains("injected") {
        assert!(
            input_pending(&slave),
            "the control injection is not visible"
        );
        let mut b = [0u8; 16];
        let n = nix::unistd::read(slave.as_raw_fd(), &mut b).unwrap();
        assert_eq!(&b[..n], b"z");
    } else {
        let _ = writeln!(
            std::io::stderr(),
            "{name}: control injection refused by this kernel ({control:?}); checking the sandbox anyway"
        );
    }
    assert!(!input_pending(&slave));

    // The real run: `o` is a session leader with the pty as its controlling terminal and as
    // stdin/stdout/stderr; the tool tries to inject into it.
    let status = on_pty(
        &slave,
        &[
            OsStr::new(env!("CARGO_BIN_EXE_o")),
            OsStr::new("sandbox"),
            OsStr::new("--workdir"),
            ws.as_os_str(),
            OsStr::new("--"),
            OsStr::new("python3"),
            OsStr::new("-c"),
            OsStr::new(TTY_PROBE),
            marker.as_os_str(),
            pts.as_os_str(),
        ],
    );
    let text = read_until(&master, "\nEND\n");
    eprintln!("{name}: o exited {status:?}; tool said:\n{text}");
    // Nothing was injected into the terminal's input, and nothing ran it.
    assert!(
        !input_pending(&slave),
        "bytes were injected into the terminal"
    );
    assert!(!marker.exists());
    assert!(status.success(), "{text}");
    // Every attempt failed: EPERM from seccomp (low 32 bits compared), or the tool never
    // holds the terminal (stdin /dev/null, pipes, no controlling tty: ENXIO; the pts node is
    // outside the Landlock grant: EACCES).
    let results: std::collections::BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').split_once(' '))
        .collect();
    let mut labels: Vec<String> = Vec::new();
    for fd in 0..3 {
        labels.extend([
            format!("sti{fd}"),
            format!("stihigh{fd}"),
            format!("linux{fd}"),
        ]);
    }
    for l in &labels {
        let got = results.get(l.as_str()).copied();
        assert!(
            matches!(got, Some("EPERM")),
            "{l}: expected EPERM from seccomp, got {got:?}\n{text}"
        );
    }
    let devtty = results.get("devtty").copied();
    assert!(
        matches!(
            devtty,
            Some("ENXIO" | "EIO" | "ENOTTY" | "EPERM" | "EACCES")
        ),
        "/dev/tty: {devtty:?}\n{text}"
    );
    let pts_open = results.get("pts").copied();
    assert!(
        matches!(pts_open, Some("EACCES" | "EPERM" | "ENXIO" | "EIO")),
        "{}: {pts_open:?}\n{text}",
        pts.display()
    );
    assert!(!results.contains_key("devttysti") && !results.contains_key("ptssti"));
    let _ = std::fs::remove_dir_all(&ws);
}

#[test]
fn a_disk_limit_stop_is_explained_in_one_line() {
    if !features_ok("a_disk_limit_stop_is_explained_in_one_line") {
        return;
    }
    let ws = workspace("disk");
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/policy/workspace.toml"
    ))
    .unwrap();
    let policy_text = shipped.replace("disk_bytes = 4294967296", "disk_bytes = 33554432");
    assert_ne!(
        policy_text, shipped,
        "the shipped profile changed its disk_bytes line"
    );
    let policy = ws.with_extension("toml");
    std::fs::write(&policy, policy_text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_o"))
        .args(["sandbox", "--policy"])
        .arg(&policy)
        .arg("--workdir")
        .arg(&ws)
        .args([
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 2000 ]; do head -c 1048576 /dev/zero > f$i || exit 3; i=$((i+1)); done; echo finished",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Stopped by the runner (SIGTERM or SIGKILL), never finished, and told why in one line.
    assert!(!stdout.contains("finished"), "{stdout}");
    assert!(
        matches!(out.status.code(), Some(137 | 143)),
        "{:?} {stderr}",
        out.status
    );
    let line = stderr
        .lines()
        .find(|l| l.starts_with("o sandbox: stopped:"))
        .unwrap_or_else(|| panic!("no stop line in {stderr:?}"));
    assert!(line.contains("limits.disk_bytes = 32 MiB"), "{line}");
    let _ = std::fs::remove_dir_all(&ws);
    let _ = std::fs::remove_file(&policy);
}

/// `--profile NAME` resolves names as olliesrv does: a file in the user's policy directory
/// with a shipped name is refused (exit 125, nothing runs) instead of silently replacing the
/// shipped profile; another name is the user's file.
#[test]
fn a_profile_name_resolves_as_olliesrv_resolves_it() {
    let ws = workspace("profile-name");
    let xdg = ws.join("xdg");
    let dir = xdg.join("ollie/policy");
    std::fs::create_dir_all(&dir).unwrap();
    let shipped = |n: &str| {
        ollie_policy::SHIPPED_PROFILES
            .iter()
            .find(|(name, _)| *name == n)
            .unwrap()
            .1
    };
    // A user "workspace" that would grant the network.
    std::fs::write(dir.join("workspace.toml"), shipped("network")).unwrap();
    std::fs::write(dir.join("mine.toml"), shipped("readonly")).unwrap();
    let marker = ws.join("ran");
    let run = |profile: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_o"));
        c.env("XDG_CONFIG_HOME", &xdg)
            .args(["sandbox", "--profile", profile, "--workdir"])
            .arg(&ws)
            .args(["--", "sh", "-c", "touch ran && echo ok"]);
        c.output().unwrap()
    };
    let out = run("workspace");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("workspace.toml: \"workspace\" is a shipped policy and cannot be redefined"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        !marker.exists(),
        "the command ran under the refused override"
    );
    if features_ok("a_profile_name_resolves_as_olliesrv_resolves_it") {
        // "mine" is the user's read-only copy: the command runs (touch's own failure, not
        // the sandbox's 125), and cannot write.
        let out = run("mine");
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).is_empty());
        assert!(!marker.exists(), "a read-only profile wrote the workspace");
    }
    let _ = std::fs::remove_dir_all(&ws);
}

/// The placeholders of missing protected paths exist while the command runs and are gone
/// once `o sandbox` has returned; the child that makes their last close holds none of the
/// caller's pipes, so reading the output to its end returns with the process.
#[test]
fn placeholders_are_gone_when_o_sandbox_returns() {
    if !features_ok("placeholders_are_gone_when_o_sandbox_returns") {
        return;
    }
    let ws = workspace("placeholders");
    let names = [".envrc", ".claude", ".vscode", ".idea"];
    for _ in 0..3 {
        let out = o(&ws, &["sh", "-c", "ls -a"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let inside = String::from_utf8_lossy(&out.stdout);
        for n in names {
            assert!(
                inside.lines().any(|l| l == n),
                "{n} not bound inside: {inside}"
            );
            assert!(
                std::fs::symlink_metadata(ws.join(n)).is_err(),
                "{n} left in the workspace"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&ws);
}

/// ollie's state directories are secret wherever they are (issue 48 item 1): the one
/// `XDG_STATE_HOME` names, another instance's listed in the per-user registry, and one found
/// by its marker alone. A workspace inside one is refused; a workspace containing one
/// cannot read its `tcp.key` or append to its `audit.jsonl`.
#[test]
fn ollie_state_directories_are_secret_wherever_they_are() {
    if !features_ok("ollie_state_directories_are_secret_wherever_they_are") {
        return;
    }
    let t = workspace("statedirs").canonicalize().unwrap();
    let home = t.join("home");
    let xs = t.join("xs");
    let own = xs.join("ollie");
    let other = t.join("other/state");
    let stray = t.join("stray");
    for d in [&home, &own, &other, &stray.join("sub")] {
        std::fs::create_dir_all(d).unwrap();
    }
    for d in [&own, &other, &stray] {
        std::fs::write(d.join("audit.jsonl"), "{}\n").unwrap();
        std::fs::write(d.join("tcp.key"), "KEY-0123456789\n").unwrap();
    }
    for d in [&other, &stray] {
        std::fs::write(d.join(ollie_link::instances::MARKER), "").unwrap();
    }
    let reg = home.join(".local/state/ollie");
    std::fs::create_dir_all(&reg).unwrap();
    std::fs::write(reg.join("state-dirs"), format!("{}\n", other.display())).unwrap();
    let run = |wd: &std::path::Path, script: &str| {
        o(&wd.to_path_buf(), &["sh", "-c", script])
            .env("HOME", &home)
            .env("XDG_STATE_HOME", &xs)
            .env_remove("STATE_DIRECTORY")
            .env_remove("XDG_CONFIG_HOME")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let attack = "cat tcp.key; echo forged >> audit.jsonl";
    for wd in [own.clone(), other.clone(), stray.join("sub")] {
        let out = run(
            &wd,
            &format!("{attack}; cat ../tcp.key; echo forged >> ../audit.jsonl"),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: ran: {err}", wd.display());
        assert!(err.contains("secret location"), "{}: {err}", wd.display());
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("KEY-"));
    }
    for (wd, sub) in [(&xs, "ollie"), (&t.join("other"), "state")] {
        let out = run(wd, &format!("cd {sub}; {attack}; ls; echo end"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains("KEY-"),
            "{}: tcp.key read: {text}",
            wd.display()
        );
    }
    for d in [&own, &other, &stray] {
        assert_eq!(
            std::fs::read_to_string(d.join("audit.jsonl")).unwrap(),
            "{}\n",
            "{} appended",
            d.display()
        );
    }
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn under_the_proxy_mode_the_run_reaches_only_its_proxy() {
    if !features_ok("under_the_proxy_mode_the_run_reaches_only_its_proxy") {
        return;
    }
    if !ollie_sandbox::probe().network_namespaces {
        ollie_testkit::skip(
            "SKIP under_the_proxy_mode_the_run_reaches_only_its_proxy: network namespaces cannot be created here",
        );
        return;
    }
    let ws = workspace("proxy");
    // A listener on the host's loopback: the run must not reach it.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port();
    // `.invalid` names are never listed, so the proxy refuses them before any lookup.
    let script = format!(
        "echo \"proxy=$HTTPS_PROXY\"; \
         curl -s -o /dev/null -w 'code=%{{http_code}}\\n' http://blocked.invalid/; \
         getent hosts localhost.invalid >/dev/null; echo \"getent=$?\"; \
         (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; echo \"host=$?\""
    );
    let out = Command::new(env!("CARGO_BIN_EXE_o"))
        .args(["sandbox", "--profile", "packages", "--workdir"])
        .arg(&ws)
        .args(["--", "bash", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("proxy=http://127.0.0.1:3128"), "{stdout}");
    assert!(stdout.contains("code=403"), "{stdout}{stderr}");
    assert!(!stdout.contains("getent=0"), "{stdout}");
    assert!(
        !stdout.contains("host=0"),
        "the run reached the host's loopback: {stdout}"
    );
    assert!(
        host.accept().is_err(),
        "the host listener saw a connection from the run"
    );
    assert!(
        stderr.contains("o sandbox: net: refused GET blocked.invalid:80"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&ws);
}
