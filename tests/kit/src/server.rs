//! Starting and stopping the workspace binaries for a test, every wait bounded.
//!
//! Finds the built binaries, runs a client process to completion with its output collected,
//! waits for a server child to listen on its unix socket (failing with its stderr if it exits
//! or never does), and finds and waits for loopback TCP ports.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Poll step while waiting for an event (a socket appearing, a process exiting).
pub const STEP: Duration = Duration::from_millis(10);
/// Failure guard: how long a server may take to come up or go down.
pub const UP_TIMEOUT: Duration = Duration::from_secs(10);
/// Failure guard for client processes and replies.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// Where the workspace binaries are: `$OLLIE_BIN_DIR`, else `target/<profile>/` next to this
/// test executable (`target/<profile>/deps/<test>-<hash>`).
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("OLLIE_BIN_DIR")
        && !d.is_empty()
    {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("cannot find target dir from {}", exe.display()))
}

/// The path of a workspace binary; panics with a hint if it has not been built.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} not found: run `cargo build --workspace --bins` first (or set OLLIE_BIN_DIR)",
        p.display()
    );
    p
}

/// Waits (bounded by `timeout`) for `child` to exit; kills it and fails if it does not,
/// saying where it was ([`proc_report`]).
pub fn wait_child(child: &mut Child, timeout: Duration, what: &str) -> ExitStatus {
    wait_child_or_report(child, timeout, what, "")
}

/// [`wait_child`], whose failure also reports every other process whose command line
/// contains `related` (e.g. a mount's directory, to find its bridge); none if it is empty.
pub fn wait_child_or_report(
    child: &mut Child,
    timeout: Duration,
    what: &str,
    related: &str,
) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if Instant::now() >= deadline {
            let mut report = proc_report(child.id());
            if !related.is_empty() {
                report.push_str(&related_report(related, child.id()));
            }
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {timeout:?}; where it was:\n{report}");
        }
        std::thread::sleep(STEP);
    }
}

/// [`proc_report`] of every process but `except` whose command line contains `needle`, each
/// after its command line.
fn related_report(needle: &str, except: u32) -> String {
    let mut out = String::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if pid != except && cmd.contains(needle) {
            out.push_str(&format!("{cmd}\n{}", proc_report(pid)));
        }
    }
    out
}

/// Where process `pid` is, for a failure message: each of its threads' state, the kernel
/// function it waits in and, where readable (root), its kernel stack.
pub fn proc_report(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("  {pid}: gone\n");
    };
    let mut out = String::new();
    for t in tasks.flatten() {
        let dir = t.path();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let status = read("status");
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .unwrap_or("?")
                .trim()
                .to_owned()
        };
        out.push_str(&format!(
            "  {pid}/{} {} {}: waits in {}\n",
            t.file_name().to_string_lossy(),
            field("Name:"),
            field("State:"),
            read("wchan")
        ));
        for frame in read("stack").lines() {
            out.push_str(&format!("      {frame}\n"));
        }
    }
    out
}

/// Runs `cmd` with `stdin` as its input (then end of input) and collects its output, killing it
/// (and failing) if it runs longer than `timeout`.
pub fn run_output(cmd: &mut Command, stdin: &[u8], timeout: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    // Writes the input and closes it: end of input follows.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status = wait_child(&mut child, timeout, &what);
    let _ = writer.join();
    Output {
        status,
        stdout: out_t.join().expect("stdout reader"),
        stderr: err_t.join().expect("stderr reader"),
    }
}

/// Waits until `sock` accepts connections, bounded by `timeout`. Fails with `stderr()` (the
/// server's output so far) if `child` exits first or the socket never listens.
pub fn wait_listening(
    child: &mut Child,
    sock: &Path,
    timeout: Duration,
    what: &str,
    stderr: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            panic!("{what} exited before serving ({st}); stderr:\n{}", stderr());
        }
        if UnixStream::connect(sock).is_ok() {
            return;
        }
        if Instant::now() >= deadline {
            panic!(
                "{what} did not listen on {} within {timeout:?}; stderr:\n{}",
                sock.display(),
                stderr()
            );
        }
        std::thread::sleep(STEP);
    }
}

/// Kills `child` (SIGKILL) and reaps it, ignoring a child that is already gone.
pub fn kill_and_reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A loopback TCP port that was free a moment ago (another process may still take it; a suite
/// should start only one TCP listener at a time).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .expect("local_addr")
        .port()
}

/// Whether something listens on loopback `port` now.
pub fn tcp_listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Waits (bounded by `timeout`, blocking the thread) until something listens on `port`.
pub fn wait_tcp_blocking(port: u16, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !tcp_listening(port) {
        assert!(Instant::now() < deadline, "tcp port {port} never listened");
        std::thread::sleep(STEP);
    }
}

/// Waits (bounded by [`IO_TIMEOUT`]) until something listens on loopback `port`.
pub async fn wait_tcp(port: u16) {
    let deadline = Instant::now() + IO_TIMEOUT;
    while !tcp_listening(port) {
        assert!(Instant::now() < deadline, "tcp port {port} never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `olliesrv -a unix!<sock> --state-dir <state>`, isolated from the caller's environment: no
/// discovered default backend (nothing answers on the discard port) and no key variable or
/// model choice of the caller's reaches the server; stdin and stdout are null. Callers add
/// their config, log level, stderr and anything else, then spawn it and [`wait_listening`].
pub fn olliesrv_command(sock: &Path, state: &Path) -> Command {
    let mut cmd = Command::new(bin("olliesrv"));
    cmd.arg("-a")
        .arg(format!("unix!{}", sock.display()))
        .arg("--state-dir")
        .arg(state)
        .env("OLLAMA_HOST", "127.0.0.1:9")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENROUTER_API_KEY")
        .env_remove("OLLIE_MODEL")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

/// The `q` quantile (0.0 to 1.0) of `v` (sorted in place); zero for none.
pub fn percentile(v: &mut [Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`, …).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// The resident set of `pid`, KiB.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS")
}

/// How many descriptors `pid` has open.
pub fn fd_count(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// The direct children of `pid` whose command name is `name`, not counting those that have
/// exited and wait to be reaped (zombies).
pub fn children_named(pid: u32, name: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // pid (comm) state ppid …
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let comm = stat[..close].split_once('(').map_or("", |x| x.1);
        let mut fields = stat[close + 2..].split_whitespace();
        let state = fields.next().unwrap_or("");
        let ppid: u32 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        if ppid == pid && comm == name && !matches!(state, "Z" | "X") {
            out.push(p);
        }
    }
    out
}
