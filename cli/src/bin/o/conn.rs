//! The connection layer of `o`'s server commands: dialling and attaching to olliesrv
//! ([`Conn`]), the 9P steps every command takes (walk, open, read a snapshot, one write), and
//! [`Fail`], why a command failed with its exit status. The commands (`sessions`, `approve`,
//! `mount`) are built on this; it uses only `render` for printing a failure.

use std::io::Write;
use std::process::ExitCode;

use bytes::Bytes;
use ollie_link::error_chain;
use ollie_p9::client::{Client, ClientError, Fid};
use ollie_p9::dial::{self, Addr};
use ollie_p9::wire::om;

use crate::render;

pub(crate) const EXIT_SERVER: u8 = 1;
pub(crate) const EXIT_USAGE: u8 = 2;
pub(crate) const EXIT_CONNECT: u8 = 3;
/// `o prompt` on a paused session: the prompt is queued, no turn ran.
pub(crate) const EXIT_QUEUED: u8 = 4;

/// Why a command failed; each has its exit status.
#[derive(Debug)]
pub(crate) enum Fail {
    Usage(String),
    Connect(String),
    Server(String),
    /// Standard output went away (`| head`).
    BrokenPipe,
}

impl Fail {
    /// The message, without the exit status.
    pub(crate) fn message(&self) -> &str {
        match self {
            Fail::Usage(m) | Fail::Connect(m) | Fail::Server(m) => m,
            Fail::BrokenPipe => "broken pipe",
        }
    }

    pub(crate) fn exit(self) -> ExitCode {
        let (code, msg) = match self {
            Fail::Usage(m) => (EXIT_USAGE, m),
            Fail::Connect(m) => (EXIT_CONNECT, m),
            Fail::Server(m) => (EXIT_SERVER, m),
            Fail::BrokenPipe => return ExitCode::from(141),
        };
        eprintln!("o: {}", render::terminal_safe(&msg.replace('\n', " ")));
        ExitCode::from(code)
    }
}

/// A 9P failure: the server's own message, or what went wrong with the connection.
pub(crate) fn remote(e: ClientError) -> Fail {
    match e {
        ClientError::Server(m) => Fail::Server(m),
        other => Fail::Server(format!("olliesrv connection: {}", error_chain(&other))),
    }
}

pub(crate) fn is_gone(e: &ClientError) -> bool {
    e.server_message()
        .is_some_and(|m| m.starts_with("file does not exist"))
}

pub(crate) fn stdout_write(data: &[u8]) -> Result<(), Fail> {
    let mut out = std::io::stdout().lock();
    out.write_all(data)
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => Fail::BrokenPipe,
            _ => Fail::Server(format!("writing standard output: {e}")),
        })
}

// ---------------------------------------------------------------------------------------
// 9P glue

pub(crate) async fn walk(dir: &Fid, path: &[&str]) -> Result<Fid, Fail> {
    dir.walk(path).await.map_err(remote)
}

pub(crate) async fn open(dir: &Fid, path: &[&str], mode: u8) -> Result<Fid, Fail> {
    let mut f = walk(dir, path).await?;
    f.open(mode).await.map_err(remote)?;
    Ok(f)
}

/// A snapshot file, whole.
pub(crate) async fn read_all(dir: &Fid, path: &[&str]) -> Result<String, Fail> {
    let f = open(dir, path, om::OREAD).await?;
    let b = f.read_to_end().await.map_err(remote)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// One Twrite of `data` (one request, one prompt); refused when it does not fit one message.
pub(crate) async fn write_one(f: &Fid, data: &str) -> Result<(), Fail> {
    if data.len() > f.iounit() as usize {
        return Err(Fail::Usage(format!(
            "{} bytes do not fit in one 9P message (at most {})",
            data.len(),
            f.iounit()
        )));
    }
    f.write(0, Bytes::copy_from_slice(data.as_bytes()))
        .await
        .map_err(remote)?;
    Ok(())
}

/// A connection, attached as the current user.
pub(crate) struct Conn {
    pub(crate) root: Fid,
}

impl Conn {
    pub(crate) async fn connect(
        addr: Option<&str>,
        key: Option<&std::path::Path>,
    ) -> Result<Conn, Fail> {
        let addr = match addr {
            Some(a) => Addr::parse(a).map_err(|e| Fail::Usage(e.to_string()))?,
            None => dial::default_server(),
        };
        let client = Client::dial(&addr)
            .await
            .map_err(|e| Fail::Connect(format!("{} (is olliesrv running?)", error_chain(&e))))?;
        let user = dial::current_user();
        let afid = match key {
            None => None,
            Some(path) => {
                let k = std::fs::read(path).map_err(|e| {
                    Fail::Usage(format!("cannot read key file {}: {e}", path.display()))
                })?;
                let k = k.strip_suffix(b"\n").unwrap_or(&k).to_vec();
                let afid = client
                    .auth(&user, "")
                    .await
                    .map_err(|e| Fail::Connect(format!("auth to {addr}: {}", error_chain(&e))))?;
                afid.write(0, bytes::Bytes::from(k))
                    .await
                    .map_err(|e| Fail::Connect(format!("auth to {addr}: {}", error_chain(&e))))?;
                Some(afid)
            }
        };
        let root = client
            .attach(afid.as_ref(), &user, "")
            .await
            .map_err(|e| Fail::Connect(format!("attach to {addr}: {}", error_chain(&e))))?;
        Ok(Conn { root })
    }

    pub(crate) async fn session(&self, name: &str) -> Result<Fid, Fail> {
        let missing = || Fail::Server(format!("no session named {name:?} (o ls lists them)"));
        match self.root.walk(&["session", name]).await {
            Ok(f) if f.qid().is_dir() => Ok(f),
            Ok(_) => Err(missing()),
            Err(e) if is_gone(&e) => Err(missing()),
            Err(e) => Err(remote(e)),
        }
    }
}
