//! Helpers shared by the cross-process suites: finding the built binaries, starting a real
//! `olliesrv` in its own temporary directory, running client processes with a bounded wait, and
//! speaking raw 9P frames over a unix socket.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod memory;
pub mod toolsrv;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ollie_p9::wire::{self, NOFID, NOTAG, Qid, Rmsg, Tmsg};

/// Poll step while waiting for an event (a socket appearing, a process exiting).
pub const STEP: Duration = Duration::from_millis(10);
/// Failure guard: how long a server may take to come up or go down.
pub const UP_TIMEOUT: Duration = Duration::from_secs(10);
/// Failure guard for client processes and replies.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// A small configuration with two backends.
pub const CONFIG: &str = r#"
[backends.alpha]
kind = "openai"
base_url = "http://127.0.0.1:1/v1"

[backends.beta]
kind = "ollama"
base_url = "http://127.0.0.1:9"
"#;

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

/// The login name of the user running the tests (what SO_PEERCRED will report).
pub fn me() -> String {
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(u)) => u.name,
        _ => uid.as_raw().to_string(),
    }
}

/// Waits (bounded) for `child` to exit.
pub fn wait_child(child: &mut Child, timeout: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {timeout:?}");
        }
        std::thread::sleep(STEP);
    }
}

/// Runs `cmd` with `stdin` as its input and collects its output, killing it (and failing) if it
/// runs longer than [`IO_TIMEOUT`].
pub fn run(cmd: &mut Command, stdin: &[u8]) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
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
    let status = wait_child(&mut child, IO_TIMEOUT, &what);
    let _ = writer.join();
    Output {
        status,
        stdout: out_t.join().expect("stdout reader"),
        stderr: err_t.join().expect("stderr reader"),
    }
}

/// `ollie-9p -a ADDR ARGS…` with `stdin`.
pub fn ollie9p(addr: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut cmd = Command::new(bin("ollie-9p"));
    cmd.arg("-a").arg(addr).args(args);
    run(&mut cmd, stdin)
}

/// Stdout as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A running `olliesrv`, killed when dropped.
#[derive(Debug)]
pub struct Srv {
    pub dir: tempfile::TempDir,
    /// The socket (`<dir>/ns/ollie`).
    pub sock: PathBuf,
    /// The `--config` file.
    pub config: PathBuf,
    stderr_path: PathBuf,
    child: Option<Child>,
    status: Option<ExitStatus>,
    /// Whether `--config` is passed (see [`Srv::start_without_config_flag`]).
    flag: bool,
    /// `XDG_CONFIG_HOME`, if not the default empty one.
    xdg: Option<PathBuf>,
}

impl Srv {
    /// Starts a server with `config` as its config file, in a fresh temporary directory.
    pub fn start(config: &str) -> Srv {
        Srv::start_with(tempfile::tempdir().expect("tempdir"), config, |_| {})
    }

    /// Starts a server in `dir`; `tweak` may adjust the command (uid, env) before it runs.
    pub fn start_with(
        dir: tempfile::TempDir,
        config: &str,
        tweak: impl FnOnce(&mut Command),
    ) -> Srv {
        let cfg = dir.path().join("config.toml");
        std::fs::write(&cfg, config).expect("write config");
        Srv::launch(dir, cfg, true, None, tweak)
    }

    /// Starts a server without `--config`, with `XDG_CONFIG_HOME=xdg` (so it reads
    /// `xdg/ollie/config.toml`).
    pub fn start_without_config_flag(dir: tempfile::TempDir, xdg: &Path) -> Srv {
        let cfg = xdg.join("ollie").join("config.toml");
        Srv::launch(dir, cfg, false, Some(xdg.to_path_buf()), |_| {})
    }

    fn launch(
        dir: tempfile::TempDir,
        cfg: PathBuf,
        flag: bool,
        xdg: Option<PathBuf>,
        tweak: impl FnOnce(&mut Command),
    ) -> Srv {
        let sock = dir.path().join("ns").join("ollie");
        let stderr_path = dir.path().join("olliesrv.stderr");
        let mut srv = Srv {
            dir,
            sock,
            config: cfg,
            stderr_path,
            child: None,
            status: None,
            flag,
            xdg,
        };
        srv.spawn(tweak);
        srv
    }

    /// Spawns the server process (with a fresh stderr file) and waits until it serves.
    fn spawn(&mut self, tweak: impl FnOnce(&mut Command)) {
        let stderr = std::fs::File::create(&self.stderr_path).expect("stderr file");
        let mut cmd = Command::new(bin("olliesrv"));
        if self.flag {
            cmd.arg("--config").arg(&self.config);
        }
        cmd.arg("-a")
            .arg(format!("unix!{}", self.sock.display()))
            .env(
                "XDG_CONFIG_HOME",
                self.xdg
                    .clone()
                    .unwrap_or_else(|| self.dir.path().join("xdg-empty")),
            )
            .env("OLLIE_LOG", "info")
            // No discovered default backend: nothing answers on the discard port, and no
            // key variable of the caller's environment reaches the server.
            .env("OLLAMA_HOST", "127.0.0.1:9")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENROUTER_API_KEY")
            .env_remove("OLLIE_MODEL")
            .arg("--state-dir")
            .arg(self.state_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        tweak(&mut cmd);
        self.child = Some(cmd.spawn().expect("spawn olliesrv"));
        self.status = None;
        self.wait_up();
    }

    /// The `--state-dir` (`<dir>/state`).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// SIGKILLs the server (no clean shutdown) and reaps it.
    pub fn kill9(&mut self) {
        let mut c = self.child.take().expect("no server process");
        let _ = c.kill();
        self.status = Some(c.wait().expect("wait olliesrv"));
    }

    /// Starts the server again in the same directory (same config, socket and state
    /// directory) after it exited or was killed; `tweak` as for [`Srv::start_with`]. Its
    /// stderr file starts afresh.
    pub fn relaunch(&mut self, tweak: impl FnOnce(&mut Command)) {
        assert!(
            self.child.is_none(),
            "relaunch: the server is still running (kill9 or wait_exit first)"
        );
        self.spawn(tweak);
    }

    /// Waits until the socket accepts connections (bounded; fails with the server's stderr).
    fn wait_up(&mut self) {
        let deadline = Instant::now() + UP_TIMEOUT;
        loop {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().expect("try_wait"))
            {
                panic!(
                    "olliesrv exited before serving ({st}); stderr:\n{}",
                    self.stderr()
                );
            }
            if UnixStream::connect(&self.sock).is_ok() {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "olliesrv did not listen on {} within {UP_TIMEOUT:?}; stderr:\n{}",
                    self.sock.display(),
                    self.stderr()
                );
            }
            std::thread::sleep(STEP);
        }
    }

    /// `unix!<socket>`.
    pub fn addr(&self) -> String {
        format!("unix!{}", self.sock.display())
    }

    /// The address for our client.
    pub fn p9addr(&self) -> ollie_p9::dial::Addr {
        ollie_p9::dial::Addr::Unix(self.sock.clone())
    }

    pub fn pid(&self) -> nix::unistd::Pid {
        let c = self.child.as_ref().expect("server already reaped");
        nix::unistd::Pid::from_raw(i32::try_from(c.id()).expect("pid"))
    }

    /// Sends `sig` to the server.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(self.pid(), sig).expect("kill");
    }

    /// What the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Waits (bounded) for the server to exit and returns its status.
    pub fn wait_exit(&mut self) -> ExitStatus {
        if let Some(st) = self.status {
            return st;
        }
        let mut c = self.child.take().expect("no server process");
        let st = wait_child(&mut c, UP_TIMEOUT, "olliesrv");
        self.status = Some(st);
        st
    }
}

impl Drop for Srv {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Our 9P client, dialled and attached as `uname`.
pub async fn attach(srv: &Srv, uname: &str) -> (ollie_p9::Client, ollie_p9::Fid) {
    let c = tokio::time::timeout(IO_TIMEOUT, ollie_p9::Client::dial(&srv.p9addr()))
        .await
        .expect("dial timed out")
        .expect("dial");
    let root = tokio::time::timeout(IO_TIMEOUT, c.attach(None, uname, ""))
        .await
        .expect("attach timed out")
        .expect("attach");
    (c, root)
}

/// Polls `path` until it contains `needle` (failing after `guard`); returns the content.
pub async fn wait_for_text(
    root: &ollie_p9::Fid,
    path: &str,
    needle: &str,
    guard: Duration,
) -> String {
    let deadline = Instant::now() + guard;
    loop {
        let mut f = root.walk_path(path).await.unwrap();
        f.open(wire::om::OREAD).await.unwrap();
        let t = String::from_utf8(f.read_to_end().await.unwrap()).unwrap();
        if t.contains(needle) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "{path} never contained {needle:?}:\n{t}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Bounds an async step with [`IO_TIMEOUT`].
pub async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(IO_TIMEOUT, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer within {IO_TIMEOUT:?}"),
    }
}

/// A raw 9P connection for byte-level checks. Every receive is bounded by a read timeout.
#[derive(Debug)]
pub struct Raw {
    pub s: UnixStream,
}

impl Raw {
    pub fn connect(sock: &Path) -> Raw {
        let s = UnixStream::connect(sock).expect("connect");
        s.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
        Raw { s }
    }

    pub fn send(&mut self, tag: u16, m: &Tmsg) {
        let mut b = BytesMut::new();
        wire::encode_t(&mut b, tag, m).expect("encode");
        self.s.write_all(&b).expect("send");
    }

    pub fn send_bytes(&mut self, b: &[u8]) {
        self.s.write_all(b).expect("send");
    }

    /// One whole frame: exactly `size` bytes, as declared.
    pub fn recv_frame(&mut self) -> Bytes {
        let mut hdr = [0u8; 4];
        self.s
            .read_exact(&mut hdr)
            .expect("reading a reply (timed out or closed)");
        let size = u32::from_le_bytes(hdr) as usize;
        assert!((7..=(1 << 20)).contains(&size), "bad reply size {size}");
        let mut buf = vec![0u8; size];
        buf[..4].copy_from_slice(&hdr);
        self.s
            .read_exact(&mut buf[4..])
            .expect("reading a reply body");
        Bytes::from(buf)
    }

    /// One reply, decoded (the decoder checks the declared size matches).
    pub fn recv(&mut self) -> (u16, Rmsg) {
        let f = self.recv_frame();
        wire::decode_r(f).expect("decode reply")
    }

    /// Sends and expects the reply to carry the same tag.
    pub fn rpc(&mut self, tag: u16, m: &Tmsg) -> Rmsg {
        self.send(tag, m);
        let (t, r) = self.recv();
        assert_eq!(t, tag, "reply tag for {m:?} was {t}, got {r:?}");
        r
    }

    /// Tversion with tag NOTAG; returns the negotiated msize.
    pub fn version(&mut self, msize: u32) -> u32 {
        match self.rpc(
            NOTAG,
            &Tmsg::Version {
                msize,
                version: "9P2000".into(),
            },
        ) {
            Rmsg::Version { msize: m, version } => {
                assert_eq!(version, "9P2000");
                m
            }
            other => panic!("expected Rversion, got {other:?}"),
        }
    }

    /// Tattach of `fid` with no auth.
    pub fn attach(&mut self, tag: u16, fid: u32, uname: &str) -> Rmsg {
        self.rpc(
            tag,
            &Tmsg::Attach {
                fid,
                afid: NOFID,
                uname: uname.into(),
                aname: String::new(),
            },
        )
    }

    /// Version + attach as the current user on fid 0.
    pub fn session(sock: &Path) -> Raw {
        let mut r = Raw::connect(sock);
        r.version(8192);
        match r.attach(1, 0, &me()) {
            Rmsg::Attach { .. } => {}
            other => panic!("attach: {other:?}"),
        }
        r
    }

    /// Walks `from` to `name` as `newfid`, expecting success.
    pub fn walk(&mut self, tag: u16, from: u32, newfid: u32, names: &[&str]) -> Vec<Qid> {
        match self.rpc(
            tag,
            &Tmsg::Walk {
                fid: from,
                newfid,
                wnames: names.iter().map(|s| (*s).to_owned()).collect(),
            },
        ) {
            Rmsg::Walk { wqids } => {
                assert_eq!(wqids.len(), names.len(), "partial walk to {names:?}");
                wqids
            }
            other => panic!("walk {names:?}: {other:?}"),
        }
    }

    /// Topen, expecting success.
    pub fn open(&mut self, tag: u16, fid: u32, mode: u8) -> (Qid, u32) {
        match self.rpc(tag, &Tmsg::Open { fid, mode }) {
            Rmsg::Open { qid, iounit } => (qid, iounit),
            other => panic!("open fid {fid}: {other:?}"),
        }
    }

    /// Tread, expecting data.
    pub fn read(&mut self, tag: u16, fid: u32, offset: u64, count: u32) -> Bytes {
        match self.rpc(tag, &Tmsg::Read { fid, offset, count }) {
            Rmsg::Read { data } => data,
            other => panic!("read fid {fid}: {other:?}"),
        }
    }

    /// Tclunk, expecting success.
    pub fn clunk(&mut self, tag: u16, fid: u32) {
        match self.rpc(tag, &Tmsg::Clunk { fid }) {
            Rmsg::Clunk => {}
            other => panic!("clunk fid {fid}: {other:?}"),
        }
    }

    /// Asserts no frame arrives within `d` (used only after an ordering check already proved the
    /// reply we care about did not come first).
    pub fn assert_quiet(&mut self, d: Duration) {
        self.s.set_read_timeout(Some(d)).expect("timeout");
        let mut b = [0u8; 1];
        match self.s.read(&mut b) {
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Ok(0) => panic!("connection closed"),
            Ok(_) => panic!("unexpected extra bytes from the server"),
            Err(e) => panic!("read: {e}"),
        }
        self.s.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    }
}

/// The root files `help` lists: `(name, mode)` from lines `  NAME  MODE  meaning`.
pub fn help_files(help: &str) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for line in help.lines() {
        if !line.starts_with("  ") {
            continue;
        }
        let mut w = line.split_whitespace();
        let (Some(name), Some(mode)) = (w.next(), w.next()) else {
            continue;
        };
        if name == "/" {
            continue;
        }
        if mode.len() == 4
            && let Ok(m) = u32::from_str_radix(mode, 8)
        {
            out.push((name.to_owned(), m));
        }
    }
    out
}

/// A loopback TCP port that was free a moment ago (another process may still take it; a suite
/// should start only one TCP listener at a time).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (bounded by [`IO_TIMEOUT`]) until something listens on loopback `port`.
pub async fn wait_tcp(port: u16) {
    let deadline = Instant::now() + IO_TIMEOUT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "tcp port {port} never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
