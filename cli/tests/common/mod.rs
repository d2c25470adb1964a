//! The harness of `o`'s tier-2 tests: a real olliesrv (and the toolsrv it starts) in a
//! temporary directory, and bounded runs of `o` against it. Used by `o_sessions.rs` and
//! `o_approve.rs`; each uses a part of it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

pub mod mount;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::time::Duration;

/// Failure guard for a server to come up and for one `o` run.
pub const GUARD: Duration = Duration::from_secs(30);

// The binaries and bounded runs: the shared test kit.
#[allow(unused_imports)] // each suite uses some of these
pub use ollie_testkit::server::{STEP, bin, bin_dir};

/// Waits (bounded by [`GUARD`]) for `child` to exit; kills it and fails if it does not.
pub fn wait_child(child: &mut Child, what: &str) -> ExitStatus {
    ollie_testkit::server::wait_child(child, GUARD, what)
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
        Srv::start_full(&bin("toolsrv"), configure)
    }

    /// [`Srv::start_with`], starting sessions with the toolsrv binary `toolsrv`.
    pub fn start_full(toolsrv: &Path, configure: impl FnOnce(&Path)) -> Srv {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("xdg").join("ollie");
        std::fs::create_dir_all(&config).unwrap();
        configure(&config);
        let sock = dir.path().join("ns").join("ollie");
        let log = std::fs::File::create(dir.path().join("olliesrv.stderr")).unwrap();
        let child = ollie_testkit::server::olliesrv_command(&sock, &dir.path().join("state"))
            .arg("--toolsrv")
            .arg(toolsrv)
            .env("XDG_CONFIG_HOME", dir.path().join("xdg"))
            // A private bead registry (XDG_DATA_HOME/ollie/beads).
            .env("XDG_DATA_HOME", dir.path().join("data"))
            .env("OLLIE_LOG", "warn")
            .stderr(log)
            .spawn()
            .unwrap();
        let mut srv = Srv { dir, sock, child };
        let log = srv.dir.path().join("olliesrv.stderr");
        ollie_testkit::server::wait_listening(&mut srv.child, &srv.sock, GUARD, "olliesrv", || {
            std::fs::read_to_string(&log).unwrap_or_default()
        });
        srv
    }

    /// Kills the server (SIGKILL) and reaps it: the server going away under its clients.
    pub fn stop(&mut self) {
        ollie_testkit::server::kill_and_reap(&mut self.child);
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
        ollie_testkit::server::kill_and_reap(&mut self.child);
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
    ollie_testkit::server::run_output(cmd, stdin, GUARD)
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

/// Reads the pty master until the writer side is closed everywhere (EIO on Linux), on a thread.
pub fn drain_pty(master: OwnedFd) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match nix::unistd::read(master.as_raw_fd(), &mut chunk) {
                Ok(0) | Err(_) => return out,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
    })
}

/// What `o` offers to complete for `words` (the last one being completed), asked as bash
/// asks it (`COMPLETE=bash o -- WORDS…`), with `NAMESPACE=ns` when given (the server the
/// names come from).
pub fn complete(words: &[&str], ns: Option<&Path>) -> Vec<String> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_o"));
    c.env("COMPLETE", "bash")
        .env("_CLAP_COMPLETE_INDEX", (words.len() - 1).to_string())
        .env("_CLAP_IFS", "\n")
        .arg("--")
        .args(words);
    if let Some(ns) = ns {
        c.env("NAMESPACE", ns);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}
