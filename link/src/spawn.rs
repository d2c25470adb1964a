//! The spawning side, for olliesrv and tests: start a toolsrv over a socketpair, and
//! authenticate to it.
//!
//! Two ways to start one:
//! - [`Toolsrv::spawn`]: the local `toolsrv` binary, the link as fd 3, the boot message in a
//!   sealed memfd as fd 4.
//! - [`Toolsrv::spawn_stdio`]: a command that reaches a `toolsrv --stdio` elsewhere (`ssh
//!   HOST toolsrv --stdio` for remote sessions). Its stdin and stdout are one end of a
//!   socketpair (so, as for the local link, [`LinkCloser`] can end it for both sides whoever
//!   holds the client); the boot message is the first bytes [`Toolsrv::connect`] writes on it,
//!   so the master key never appears in argv or the environment; stderr is a pipe for the
//!   caller to log ([`Toolsrv::take_stderr`]).

use std::io::{Seek, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};

use command_fds::{CommandFdExt, FdMapping};
use ollie_p9::{Client, Fid};

use crate::auth::{Identity, MasterKey, hex};
use crate::boot::{self, Bootstrap};

/// The fd number of the link in toolsrv.
pub const LINK_FD: i32 = 3;
/// The fd number of the boot memfd in toolsrv.
pub const BOOT_FD: i32 = 4;

/// A running toolsrv.
#[derive(Debug)]
pub struct Toolsrv {
    child: Child,
    key: MasterKey,
    link: Option<UnixStream>,
    /// A second handle on the connected link, to end it whoever still holds the client.
    closer: Option<LinkCloser>,
    /// `--stdio`: the boot message, still to be sent as the first bytes on the link.
    first: Option<BootBytes>,
}

/// A boot message waiting to be sent: it holds the master key, so its `Debug` shows only the
/// length, and it is zeroed once sent.
struct BootBytes(Vec<u8>);

impl std::fmt::Debug for BootBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BootBytes({} bytes, redacted)", self.0.len())
    }
}

/// Ends a toolsrv link for both sides at once (`shutdown(2)`), however many holders of the
/// client remain: toolsrv reads end of file, stops its tools and exits, and every pending
/// request on our side fails.
#[derive(Debug)]
pub struct LinkCloser(UnixStream);

impl LinkCloser {
    pub fn close(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

/// The variables a [`Toolsrv::spawn_stdio`] command keeps from our environment: what `ssh`
/// needs to find its configuration, keys and agent, and the locale. Nothing else (API keys
/// in olliesrv's environment stay there).
pub const STDIO_ENV: &[&str] = &[
    "HOME",
    "USER",
    "LOGNAME",
    "PATH",
    "SHELL",
    "SSH_AUTH_SOCK",
    "KRB5CCNAME",
    "XDG_RUNTIME_DIR",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
];

/// The toolsrv binary next to the current executable (or the one named by
/// `$OLLIE_TOOLSRV`), else `toolsrv` from `PATH`.
pub fn default_program() -> PathBuf {
    if let Some(p) = std::env::var_os("OLLIE_TOOLSRV") {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        for d in [Some(dir), dir.parent()].into_iter().flatten() {
            let c = d.join("toolsrv");
            if c.is_file() {
                return c;
            }
        }
    }
    PathBuf::from("toolsrv")
}

fn boot_memfd(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    use nix::fcntl::{FcntlArg, SealFlag, fcntl};
    use nix::sys::memfd::{MemFdCreateFlag, memfd_create};
    let fd = memfd_create(
        c"ollie-toolsrv-boot",
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes)?;
    f.rewind()?;
    let fd = OwnedFd::from(f);
    use std::os::fd::AsRawFd;
    fcntl(
        fd.as_raw_fd(),
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_WRITE
                | SealFlag::F_SEAL_GROW
                | SealFlag::F_SEAL_SHRINK
                | SealFlag::F_SEAL_SEAL,
        ),
    )?;
    Ok(fd)
}

impl Toolsrv {
    /// Starts `program` for a session with a fresh master key. The child gets an empty
    /// environment (plus `RUST_LOG` and `JOURNAL_STREAM` if set), stdin and stdout on /dev/null, stderr inherited
    /// (its log), the link as fd 3 and the boot memfd as fd 4.
    pub fn spawn(program: &Path, boot: &Bootstrap) -> std::io::Result<Toolsrv> {
        Self::spawn_with_key(program, MasterKey::generate()?, boot)
    }

    /// Like [`Toolsrv::spawn`] with a given key.
    pub fn spawn_with_key(
        program: &Path,
        key: MasterKey,
        boot: &Bootstrap,
    ) -> std::io::Result<Toolsrv> {
        let msg = boot::encode(&key, boot).map_err(std::io::Error::other)?;
        let memfd = boot_memfd(&msg)?;
        let (ours, theirs) = UnixStream::pair()?;
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // RUST_LOG sets toolsrv's log level; JOURNAL_STREAM lets it log in the journal's
        // format when the inherited stderr is the journal.
        for k in ["RUST_LOG", "JOURNAL_STREAM"] {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        cmd.fd_mappings(vec![
            FdMapping {
                parent_fd: OwnedFd::from(theirs),
                child_fd: LINK_FD,
            },
            FdMapping {
                parent_fd: memfd,
                child_fd: BOOT_FD,
            },
        ])
        .map_err(std::io::Error::other)?;
        let child = cmd.spawn()?;
        // The Command holds the child's ends; dropping it closes ours of them.
        drop(cmd);
        Ok(Toolsrv {
            child,
            key,
            link: Some(ours),
            closer: None,
            first: None,
        })
    }

    /// Starts `argv` (no shell), a command that runs `toolsrv --stdio` somewhere (`ssh HOST
    /// toolsrv --stdio`), with a fresh master key. The child gets the [`STDIO_ENV`] variables
    /// of our environment, its own process group (a terminal's ^C reaches olliesrv, which
    /// then ends the link in order), stdin and stdout on one end of a socketpair, stderr a
    /// pipe ([`Toolsrv::take_stderr`]). Nothing is written yet: [`Toolsrv::connect`] sends the
    /// boot message, then speaks 9P.
    pub fn spawn_stdio(argv: &[String], boot: &Bootstrap) -> std::io::Result<Toolsrv> {
        let Some((program, args)) = argv.split_first() else {
            return Err(std::io::Error::other("empty command"));
        };
        let key = MasterKey::generate()?;
        let msg = boot::encode(&key, boot).map_err(std::io::Error::other)?;
        let (ours, theirs) = UnixStream::pair()?;
        let out = theirs.try_clone()?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::from(OwnedFd::from(out)))
            .stderr(Stdio::piped());
        for k in STDIO_ENV {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let child = cmd.spawn()?;
        drop(cmd);
        Ok(Toolsrv {
            child,
            key,
            link: Some(ours),
            closer: None,
            first: Some(BootBytes(msg)),
        })
    }

    /// The pipe of a [`Toolsrv::spawn_stdio`] command's stderr (once).
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    /// toolsrv's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The master key (to derive identities' secrets).
    pub fn key(&self) -> &MasterKey {
        &self.key
    }

    /// Takes the link (once).
    pub fn take_link(&mut self) -> Option<UnixStream> {
        self.link.take()
    }

    /// Takes the link and does the 9P version handshake on it.
    pub async fn connect(&mut self, msize: u32) -> Result<Client, ollie_p9::ClientError> {
        let link = self.take_link().ok_or_else(|| {
            ollie_p9::ClientError::from(std::io::Error::other("the link was already taken"))
        })?;
        self.closer = Some(LinkCloser(link.try_clone()?));
        link.set_nonblocking(true)?;
        let s = tokio::net::UnixStream::from_std(link)?;
        let (r, mut w) = s.into_split();
        if let Some(BootBytes(mut first)) = self.first.take() {
            // `--stdio`: the boot message first, then 9P on the same stream.
            use tokio::io::AsyncWriteExt;
            let sent = w.write_all(&first).await;
            first.fill(0);
            sent?;
        }
        Client::handshake(r, w, msize).await
    }

    /// The handle that ends the link (after [`Toolsrv::connect`]).
    pub fn take_closer(&mut self) -> Option<LinkCloser> {
        self.closer.take()
    }

    /// The child process (to kill it, or to reap it without waiting).
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Waits for the child to exit and reaps it, without holding a thread: it looks again
    /// at every SIGCHLD the process receives (each listener hears each one), and at least
    /// every [`EXIT_POLL`] should no signal stream be had. Cancel-safe: dropped before the
    /// child exits, nothing is reaped and a later call waits again. Needs a Tokio runtime
    /// with its signal and time drivers.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        use tokio::signal::unix::{SignalKind, signal};
        // Listening before the first look: an exit between the two is still heard.
        let mut sigchld = signal(SignalKind::child()).ok();
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st);
            }
            match &mut sigchld {
                Some(s) => {
                    let _ = tokio::time::timeout(EXIT_POLL, s.recv()).await;
                }
                None => tokio::time::sleep(EXIT_POLL).await,
            }
        }
    }
}

/// The longest [`Toolsrv::wait`] goes without looking for the child's exit.
pub const EXIT_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Authenticates as `id` on a toolsrv connection and attaches: Tauth, write the secret,
/// read the token, Tattach with the afid. Returns the root fid.
pub async fn attach(
    client: &Client,
    key: &MasterKey,
    id: &Identity,
) -> Result<Fid, ollie_p9::ClientError> {
    let uname = "ollie";
    let afid = client.auth(uname, id.aname()).await?;
    let secret = hex(&key.secret(id));
    afid.write(0, bytes::Bytes::from(secret)).await?;
    let _token = afid.read(0, 64).await?;
    let root = client.attach(Some(&afid), uname, id.aname()).await;
    let _ = afid.clunk().await;
    root
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A [`Toolsrv`] around any child (the waiting does not care what runs).
    fn around(child: Child) -> Toolsrv {
        Toolsrv {
            child,
            key: MasterKey::generate().unwrap(),
            link: None,
            closer: None,
            first: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wait_reaps_the_child_and_a_cancelled_wait_reaps_nothing() {
        // A child that runs until its stdin closes.
        let child = Command::new("sh")
            .args(["-c", "read x; exit 7"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let mut t = around(child);
        let pid = nix::unistd::Pid::from_raw(t.child().id() as i32);
        // Polled once and given up on while the child runs: nothing is reaped, the child
        // lives on.
        tokio::select! {
            biased;
            r = t.wait() => panic!("the wait ended while the child ran: {r:?}"),
            () = std::future::ready(()) => {}
        }
        assert!(t.child().try_wait().unwrap().is_none());
        assert!(
            nix::sys::signal::kill(pid, None).is_ok(),
            "the child is gone"
        );
        // Its stdin closed, it exits; the wait hears it and reaps it.
        drop(t.child().stdin.take());
        let st = t.wait().await.unwrap();
        assert_eq!(st.code(), Some(7));
        // Reaped: the pid no longer names a child of ours (not even a zombie).
        let again = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        assert_eq!(again, Err(nix::errno::Errno::ECHILD));
        // Waiting again returns the same status at once.
        assert_eq!(t.wait().await.unwrap().code(), Some(7));
    }
}
