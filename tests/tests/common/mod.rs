//! Helpers shared by the cross-process suites: finding the built binaries, starting a real
//! `olliesrv` in its own temporary directory, running client processes with a bounded wait, and
//! speaking raw 9P frames over a unix socket.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod broker;
pub mod memory;
pub mod toolsrv;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ollie_p9::wire::{self, NOFID, NOTAG, Qid, Rmsg, Tmsg};

// The binaries, bounded runs and waits, and the 9P client helper: the shared test kit.
#[allow(unused_imports)] // each suite uses some of these
pub use ollie_testkit::client::{wait_for_text, within};
#[allow(unused_imports)]
pub use ollie_testkit::server::{
    IO_TIMEOUT, STEP, UP_TIMEOUT, bin, bin_dir, free_port, wait_child, wait_tcp,
};

/// A small configuration with two backends.
pub const CONFIG: &str = r#"
[backends.alpha]
kind = "openai"
base_url = "http://127.0.0.1:1/v1"

[backends.beta]
kind = "ollama"
base_url = "http://127.0.0.1:9"
"#;

/// The login name of the user running the tests (what SO_PEERCRED will report).
pub fn me() -> String {
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(u)) => u.name,
        _ => uid.as_raw().to_string(),
    }
}

/// Runs `cmd` with `stdin` as its input and collects its output, killing it (and failing) if it
/// runs longer than [`IO_TIMEOUT`].
pub fn run(cmd: &mut Command, stdin: &[u8]) -> Output {
    ollie_testkit::server::run_output(cmd, stdin, IO_TIMEOUT)
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
        let mut cmd = ollie_testkit::server::olliesrv_command(&self.sock, &self.state_dir());
        if self.flag {
            cmd.arg("--config").arg(&self.config);
        }
        cmd.env(
            "XDG_CONFIG_HOME",
            self.xdg
                .clone()
                .unwrap_or_else(|| self.dir.path().join("xdg-empty")),
        )
        .env("OLLIE_LOG", "info")
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
        let child = self.child.as_mut().expect("no server process");
        let stderr_path = &self.stderr_path;
        ollie_testkit::server::wait_listening(child, &self.sock, UP_TIMEOUT, "olliesrv", || {
            std::fs::read_to_string(stderr_path).unwrap_or_default()
        });
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
    ollie_testkit::client::dial_attach(&srv.p9addr(), uname).await
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

/// The value of `key=` in a `key=value` text (a stats or cfg file), or "" when it has none.
pub fn kv_value(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or("")
        .to_owned()
}

/// Creates session `s` working in `work` and in it the agent `agent_spec` (what
/// `session/s/agent/new` takes: `name=a`, `name=a profile=p`).
pub async fn new_session(root: &ollie_p9::Fid, work: &Path, agent_spec: &str) {
    let new = format!("name=s cwd={}", work.display());
    ollie_testkit::client::rdwr_text(root, "session/new", &new)
        .await
        .unwrap_or_else(|e| panic!("session/new {new}: {e}"));
    ollie_testkit::client::rdwr_text(root, "session/s/agent/new", agent_spec)
        .await
        .unwrap_or_else(|e| panic!("session/s/agent/new {agent_spec}: {e}"));
}
