//! The harness of `o`'s tier-2 tests: a real olliesrv (and the toolsrv it starts) in a
//! temporary directory, and bounded runs of `o` against it. Used by `o_sessions.rs` and
//! `o_approve.rs`; each uses a part of it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

pub mod mount;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Failure guard for a server to come up and for one `o` run.
pub const GUARD: Duration = Duration::from_secs(30);
pub const STEP: Duration = Duration::from_millis(10);

pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("OLLIE_BIN_DIR")
        && !d.is_empty()
    {
        return PathBuf::from(d);
    }
    PathBuf::from(env!("CARGO_BIN_EXE_o"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} not found: run `cargo build --workspace --bins` first (or set OLLIE_BIN_DIR)",
        p.display()
    );
    p
}

pub fn wait_child(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + GUARD;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {GUARD:?}");
        }
        std::thread::sleep(STEP);
    }
}

/// A running olliesrv in its own temporary directory, killed when dropped.
pub struct Srv {
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    child: Child,
}

impl Srv {
    pub fn start() -> Srv {
        Srv::start_with(|_| {})
    }

    /// Starts a server after `configure` has filled its config directory
    /// (`$XDG_CONFIG_HOME/ollie`: `config.toml`, `agents/`), which exists when it is called.
    pub fn start_with(configure: impl FnOnce(&Path)) -> Srv {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("xdg").join("ollie");
        std::fs::create_dir_all(&config).unwrap();
        configure(&config);
        let sock = dir.path().join("ns").join("ollie");
        let log = std::fs::File::create(dir.path().join("olliesrv.stderr")).unwrap();
        let child = Command::new(bin("olliesrv"))
            .arg("-a")
            .arg(format!("unix!{}", sock.display()))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--toolsrv")
            .arg(bin("toolsrv"))
            .env("XDG_CONFIG_HOME", dir.path().join("xdg"))
            // A private bead registry (XDG_DATA_HOME/ollie/beads).
            .env("XDG_DATA_HOME", dir.path().join("data"))
            .env("OLLIE_LOG", "warn")
            // No discovered default backend (see tests/tests/common).
            .env("OLLAMA_HOST", "127.0.0.1:9")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENROUTER_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut srv = Srv { dir, sock, child };
        let deadline = Instant::now() + GUARD;
        while UnixStream::connect(&srv.sock).is_err() {
            if let Some(st) = srv.child.try_wait().unwrap() {
                panic!("olliesrv exited ({st}): {}", srv.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "olliesrv did not listen: {}",
                srv.stderr()
            );
            std::thread::sleep(STEP);
        }
        srv
    }

    /// Kills the server (SIGKILL) and reaps it: the server going away under its clients.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("olliesrv.stderr")).unwrap_or_default()
    }

    pub fn addr(&self) -> String {
        format!("unix!{}", self.sock.display())
    }

    /// A directory for sessions to work in.
    pub fn workdir(&self) -> PathBuf {
        let d = self.dir.path().join("work");
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// `o -a ADDR ARGS…`.
    pub fn o(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_o"));
        c.arg("-a").arg(self.addr()).args(args);
        c
    }

    /// Runs `o ARGS…` with `stdin`, bounded.
    pub fn run(&self, args: &[&str], stdin: &[u8]) -> Out {
        run(&mut self.o(args), stdin)
    }
}

impl Drop for Srv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Out {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(cmd: &mut Command, stdin: &[u8]) -> Out {
    let o = run_bytes(cmd, stdin);
    Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// [`run`], keeping the exact bytes of the output.
pub fn run_bytes(cmd: &mut Command, stdin: &[u8]) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    // Writes the input and closes it: end of input follows.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
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
    let status = wait_child(&mut child, &what);
    let _ = writer.join();
    Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

pub fn ok(out: &Out) -> &str {
    assert_eq!(out.code, Some(0), "{out:?}");
    &out.stdout
}

/// One `o: …` line on stderr, exit status `code`.
pub fn fails(out: &Out, code: i32, contains: &str) {
    assert_eq!(out.code, Some(code), "{out:?}");
    assert!(out.stderr.starts_with("o: "), "{out:?}");
    assert_eq!(out.stderr.trim_end().lines().count(), 1, "{out:?}");
    assert!(out.stderr.contains(contains), "{out:?}");
}
