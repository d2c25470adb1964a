//! The `ollie-9p` binary's failure modes: usage errors and unreachable servers get one line and
//! distinct exit statuses; and `read` of files larger than one message, whatever their stat
//! length says, against a small server of this test's own. (Talking to olliesrv is covered by
//! `tests/tests/olliesrv.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ollie_p9::util::read_at;
use ollie_p9::wire::{dm, qt};
use ollie_p9::{ConnInfo, Filesystem, Qid, Server, Stat, Walked};

fn ollie9p() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ollie-9p"))
}

#[test]
fn bad_address_is_a_usage_error() {
    let out = ollie9p().args(["-a", "bogus!x", "ls"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown network"), "{err}");
    assert!(err.contains("unix!/path"), "{err}");
}

#[test]
fn unreachable_server_exits_3() {
    let out = ollie9p()
        .args(["-a", "unix!/nonexistent/dir/ollie", "read", "help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot connect to unix!/nonexistent/dir/ollie"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn default_address_follows_namespace() {
    let out = ollie9p()
        .env("NAMESPACE", "/nonexistent/ns")
        .args(["read", "help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unix!/nonexistent/ns/ollie"));
}

#[test]
fn missing_subcommand_is_a_usage_error() {
    let out = ollie9p().output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The files `read_matches_the_bytes_whatever_the_stat_length_says` reads: the same bytes under
/// three stat lengths and answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Root,
    /// Its stat length is its size.
    Exact,
    /// Stat length twice its size, and every read answered with at most a third of what it
    /// asked (a file that shrank, or a server that answers short).
    Short,
    /// Stat length one message: it grew since.
    Grown,
}

const NAMES: [(&str, Node); 3] = [
    ("exact", Node::Exact),
    ("short", Node::Short),
    ("grown", Node::Grown),
];

#[derive(Debug)]
struct Files {
    data: Bytes,
}

fn qid(n: Node) -> Qid {
    Qid {
        ty: if n == Node::Root { qt::DIR } else { qt::FILE },
        version: 0,
        path: n as u64,
    }
}

impl Filesystem for Files {
    type Fid = Node;

    async fn attach(
        &self,
        _conn: &ConnInfo,
        _auth: Option<&mut Node>,
        _uname: &str,
        _aname: &str,
    ) -> ollie_p9::Result<(Node, Qid)> {
        Ok((Node::Root, qid(Node::Root)))
    }

    async fn walk(&self, fid: &Node, names: &[String]) -> ollie_p9::Result<Walked<Node>> {
        match (fid, names) {
            (_, []) => Ok(Walked {
                qids: vec![],
                fid: Some(*fid),
            }),
            (Node::Root, [name]) => {
                let (_, n) = NAMES
                    .iter()
                    .find(|(m, _)| m == name)
                    .ok_or_else(ollie_p9::Error::not_found)?;
                Ok(Walked {
                    qids: vec![qid(*n)],
                    fid: Some(*n),
                })
            }
            _ => Err(ollie_p9::Error::not_found()),
        }
    }

    async fn open(&self, fid: &mut Node, _mode: u8) -> ollie_p9::Result<(Qid, u32)> {
        Ok((qid(*fid), 0))
    }

    async fn read(&self, fid: &mut Node, offset: u64, count: u32) -> ollie_p9::Result<Bytes> {
        let count = if *fid == Node::Short {
            count / 3
        } else {
            count
        };
        Ok(read_at(&self.data, offset, count))
    }

    async fn write(&self, _fid: &mut Node, _offset: u64, _data: Bytes) -> ollie_p9::Result<u32> {
        Err(ollie_p9::Error::read_only())
    }

    async fn stat(&self, fid: &mut Node) -> ollie_p9::Result<Stat> {
        let size = self.data.len() as u64;
        let length = match fid {
            Node::Root => 0,
            Node::Exact => size,
            Node::Short => 2 * size,
            Node::Grown => 1 << 20,
        };
        Ok(Stat {
            qid: qid(*fid),
            mode: if *fid == Node::Root {
                dm::DIR | 0o555
            } else {
                0o444
            },
            length,
            name: "f".into(),
            uid: "t".into(),
            gid: "t".into(),
            muid: "t".into(),
            ..Stat::default()
        })
    }
}

/// `read` pipelines Treads within a file's stat length: whatever that length says, the output
/// is exactly the file's bytes, in order, none twice.
#[test]
fn read_matches_the_bytes_whatever_the_stat_length_says() {
    // Several messages' worth, not a multiple of one, each byte telling its offset apart.
    let data: Bytes = (0..(5u32 << 20) + 12_345)
        .map(|i| (i % 251) as u8 ^ (i >> 16) as u8)
        .collect::<Vec<u8>>()
        .into();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    let files = Arc::new(Files { data: data.clone() });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::UnixListener::from_std(listener).unwrap();
            Server::new(files)
                .serve_unix(
                    listener,
                    async { drop(stopped.await) },
                    Duration::from_millis(200),
                )
                .await
                .unwrap();
        });
    });
    let addr = format!("unix!{}", sock.display());
    for (name, _) in NAMES {
        let out = ollie9p()
            .args(["-a", &addr, "read", name])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout.len(), data.len(), "{name}: length");
        assert!(out.stdout == data[..], "{name}: the bytes differ");
    }
    stop.send(()).unwrap();
    server.join().unwrap();
}
