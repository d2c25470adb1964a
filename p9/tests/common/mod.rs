//! The test filesystem shared by the server tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use ollie_p9::server::{ConnInfo, Filesystem, Limits, Server, Walked};
use ollie_p9::util::{DirSnapshot, read_at};
use ollie_p9::wire::{Qid, Stat, dm, qt};
use ollie_p9::{Error, Result};
use tokio::net::UnixStream;
use tokio::sync::watch;

/// Files of the test tree.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Node {
    Root,
    Static,
    Big,
    Ctl,
    Block,
    Poke,
    Sink,
    Sub,
}

pub const NODES: [(Node, &str); 7] = [
    (Node::Static, "static"),
    (Node::Big, "big"),
    (Node::Ctl, "ctl"),
    (Node::Block, "block"),
    (Node::Poke, "poke"),
    (Node::Sink, "sink"),
    (Node::Sub, "sub"),
];

pub fn qid(n: Node) -> Qid {
    Qid {
        ty: if matches!(n, Node::Root | Node::Sub) {
            qt::DIR
        } else {
            qt::FILE
        },
        version: 0,
        path: n as u64,
    }
}

pub struct TestFid {
    node: Node,
    reply: Option<Bytes>,
    dir: Option<DirSnapshot>,
    /// The last poke value this fid saw (blocking reads return only newer ones).
    seen: u64,
}

pub struct TestFs {
    pub big: Bytes,
    pub poke: watch::Sender<u64>,
    pub sink_len: AtomicUsize,
    /// Blocking reads that were cancelled (dropped before finishing).
    pub cancelled: Arc<AtomicUsize>,
    pub clunks: AtomicUsize,
}

impl TestFs {
    pub fn new() -> Arc<TestFs> {
        let big: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
        Arc::new(TestFs {
            big: Bytes::from(big),
            poke: watch::channel(0).0,
            sink_len: AtomicUsize::new(0),
            cancelled: Arc::new(AtomicUsize::new(0)),
            clunks: AtomicUsize::new(0),
        })
    }

    fn stat_of(&self, n: Node, name: &str) -> Stat {
        let q = qid(n);
        Stat {
            qid: q,
            mode: if q.is_dir() { dm::DIR | 0o755 } else { 0o666 },
            length: if n == Node::Big {
                self.big.len() as u64
            } else {
                0
            },
            name: name.into(),
            uid: "test".into(),
            gid: "test".into(),
            muid: "test".into(),
            ..Stat::default()
        }
    }
}

pub struct CancelGuard(Arc<AtomicUsize>, bool);
impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Filesystem for TestFs {
    type Fid = TestFid;

    /// Tauth succeeds for aname "auth" (the limit tests need afids); anything else is refused
    /// as by default.
    async fn auth(&self, _c: &ConnInfo, _uname: &str, aname: &str) -> Result<(TestFid, Qid)> {
        if aname != "auth" {
            return Err(Error::new("authentication not required"));
        }
        Ok((
            TestFid {
                node: Node::Static,
                reply: None,
                dir: None,
                seen: 0,
            },
            Qid {
                ty: qt::AUTH,
                version: 0,
                path: 999,
            },
        ))
    }

    async fn attach(
        &self,
        _c: &ConnInfo,
        _a: Option<&mut TestFid>,
        uname: &str,
        _aname: &str,
    ) -> Result<(TestFid, Qid)> {
        if uname == "nobody" {
            return Err(Error::permission_denied());
        }
        Ok((
            TestFid {
                node: Node::Root,
                reply: None,
                dir: None,
                seen: 0,
            },
            qid(Node::Root),
        ))
    }

    async fn walk(&self, fid: &TestFid, names: &[String]) -> Result<Walked<TestFid>> {
        let mut cur = fid.node;
        let mut qids = Vec::new();
        for (i, n) in names.iter().enumerate() {
            let next = match (cur, n.as_str()) {
                (Node::Root, "..") => Some(Node::Root),
                (Node::Sub, "..") => Some(Node::Root),
                (Node::Root, name) => NODES.iter().find(|(_, s)| *s == name).map(|(n, _)| *n),
                _ => None,
            };
            match next {
                Some(nx) => {
                    cur = nx;
                    qids.push(qid(nx));
                }
                None if i == 0 => return Err(Error::not_found()),
                None => return Ok(Walked { qids, fid: None }),
            }
        }
        Ok(Walked {
            qids,
            fid: Some(TestFid {
                node: cur,
                reply: None,
                dir: None,
                seen: *self.poke.borrow(),
            }),
        })
    }

    async fn open(&self, fid: &mut TestFid, _mode: u8) -> Result<(Qid, u32)> {
        Ok((qid(fid.node), 0))
    }

    async fn read(&self, fid: &mut TestFid, offset: u64, count: u32) -> Result<Bytes> {
        match fid.node {
            Node::Root => {
                if offset == 0 {
                    let entries: Vec<Stat> =
                        NODES.iter().map(|(n, s)| self.stat_of(*n, s)).collect();
                    fid.dir = Some(DirSnapshot::new(&entries));
                }
                fid.dir
                    .as_ref()
                    .map_or(Ok(Bytes::new()), |d| d.read(offset, count))
            }
            Node::Sub => Ok(Bytes::new()),
            Node::Static => Ok(read_at(&Bytes::from_static(b"hello\n"), offset, count)),
            Node::Big => Ok(read_at(&self.big, offset, count)),
            Node::Ctl => Ok(fid
                .reply
                .as_ref()
                .map_or(Bytes::new(), |r| read_at(r, offset, count))),
            Node::Block => {
                let mut guard = CancelGuard(Arc::clone(&self.cancelled), false);
                let mut rx = self.poke.subscribe();
                let v = loop {
                    let v = *rx.borrow_and_update();
                    if v != fid.seen {
                        break v;
                    }
                    if rx.changed().await.is_err() {
                        return Err(Error::interrupted());
                    }
                };
                guard.1 = true;
                fid.seen = v;
                Ok(Bytes::from(format!("poke {v}\n")))
            }
            Node::Poke => Ok(Bytes::new()),
            Node::Sink => Ok(Bytes::from(format!(
                "{}\n",
                self.sink_len.load(Ordering::SeqCst)
            ))),
        }
    }

    async fn write(&self, fid: &mut TestFid, _offset: u64, data: Bytes) -> Result<u32> {
        match fid.node {
            Node::Ctl => {
                if data.starts_with(b"bad") {
                    return Err(Error::new(format!(
                        "unknown command {:?} (valid: anything else)",
                        String::from_utf8_lossy(&data)
                    )));
                }
                let mut r = BytesMut::from(&b"ok: "[..]);
                r.extend_from_slice(&data);
                fid.reply = Some(r.freeze());
                Ok(data.len() as u32)
            }
            Node::Poke => {
                self.poke.send_modify(|v| *v += 1);
                Ok(data.len() as u32)
            }
            Node::Sink => {
                self.sink_len.fetch_add(data.len(), Ordering::SeqCst);
                Ok(data.len() as u32)
            }
            Node::Static => Ok(0),
            _ => Err(Error::permission_denied()),
        }
    }

    async fn clunk(&self, _fid: TestFid) -> Result<()> {
        self.clunks.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn remove(&self, _fid: TestFid) -> Result<()> {
        Err(Error::permission_denied())
    }

    async fn stat(&self, fid: &mut TestFid) -> Result<Stat> {
        let name = NODES
            .iter()
            .find(|(n, _)| *n == fid.node)
            .map_or("/", |(_, s)| s);
        Ok(self.stat_of(fid.node, name))
    }

    async fn wstat(&self, fid: &mut TestFid, st: &Stat) -> Result<()> {
        // Accept only truncation of a synthetic file (what `echo x > f` sends).
        let mut only_len = Stat::dont_touch();
        only_len.length = 0;
        if *st == only_len && !qid(fid.node).is_dir() {
            Ok(())
        } else {
            Err(Error::permission_denied())
        }
    }
}

pub fn start(fs: Arc<TestFs>) -> UnixStream {
    start_with(fs, Limits::default())
}

/// The next whole 9P frame on `s` (size[4] included), as a peer reads it.
pub async fn read_frame(s: &mut UnixStream) -> Bytes {
    use tokio::io::AsyncReadExt;
    let mut h = [0u8; 4];
    s.read_exact(&mut h).await.unwrap();
    let n = u32::from_le_bytes(h) as usize;
    let mut b = vec![0u8; n];
    b[..4].copy_from_slice(&h);
    s.read_exact(&mut b[4..]).await.unwrap();
    Bytes::from(b)
}

/// One connection to a server with these limits.
pub fn start_with(fs: Arc<TestFs>, limits: Limits) -> UnixStream {
    serve_fs(fs, ollie_p9::server::DEFAULT_MAX_MSIZE, limits)
}

/// One connection to a server of any file system, with this maximum msize and these limits.
pub fn serve_fs<F: Filesystem>(fs: Arc<F>, max_msize: u32, limits: Limits) -> UnixStream {
    let (a, b) = UnixStream::pair().unwrap();
    let srv = Server::with_limits(fs, max_msize, limits);
    tokio::spawn(async move {
        let info = ConnInfo {
            id: srv.next_conn_id(),
            peer: None,
            transport: "stream",
            remote: "test".into(),
        };
        let (r, w) = b.into_split();
        srv.serve_conn(r, w, info).await;
    });
    a
}
