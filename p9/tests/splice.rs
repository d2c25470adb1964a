//! Spliced reads (`Fid::read_call_spliced`): a Tread's payload goes from the unix socket into a
//! pipe, and what does not fit comes in memory. Every test checks the payload byte for byte
//! (pipe contents followed by `rest`) against a file of pseudo-random bytes, so a lost, doubled
//! or misplaced piece fails it; most also check that the stream stayed in step afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use ollie_p9::client::{ClientError, Fid, OREAD, Spliced};
use ollie_p9::dial::Addr;
use ollie_p9::server::{ConnInfo, Filesystem, Limits, Server, Walked};
use ollie_p9::util::read_at;
use ollie_p9::wire::{self, Qid, Rmsg, Stat, Tmsg, dm, qt};
use ollie_p9::{Client, Error, Result};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

mod common;

/// One Rread carries at most 1 MiB of payload.
const IOUNIT: u32 = 1 << 20;
const MSIZE: u32 = IOUNIT + wire::IOHDRSZ;
/// An odd length, so the last read is short.
const DATA_LEN: usize = (5 << 20) + 777;

/// Deterministic pseudo-random bytes (xorshift64*): no piece repeats elsewhere in the file.
fn content(len: usize) -> Bytes {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Node {
    Root,
    /// `data`: [`DATA_LEN`] pseudo-random bytes.
    Data,
    /// `block`: a read that never finishes (until flushed).
    Block,
}

struct SpliceFs {
    data: Bytes,
    /// Told when a read of `block` has reached the server.
    blocked: tokio::sync::Notify,
}

fn qid(n: Node) -> Qid {
    Qid {
        ty: if n == Node::Root { qt::DIR } else { qt::FILE },
        version: 0,
        path: n as u64,
    }
}

impl Filesystem for SpliceFs {
    type Fid = Node;

    async fn attach(
        &self,
        _c: &ConnInfo,
        _a: Option<&mut Node>,
        _uname: &str,
        _aname: &str,
    ) -> Result<(Node, Qid)> {
        Ok((Node::Root, qid(Node::Root)))
    }

    async fn walk(&self, fid: &Node, names: &[String]) -> Result<Walked<Node>> {
        let node = match (fid, names) {
            (n, []) => *n,
            (Node::Root, [name]) if name == "data" => Node::Data,
            (Node::Root, [name]) if name == "block" => Node::Block,
            _ => return Err(Error::not_found()),
        };
        Ok(Walked {
            qids: names.iter().map(|_| qid(node)).collect(),
            fid: Some(node),
        })
    }

    async fn open(&self, fid: &mut Node, _mode: u8) -> Result<(Qid, u32)> {
        Ok((qid(*fid), 0))
    }

    async fn read(&self, fid: &mut Node, offset: u64, count: u32) -> Result<Bytes> {
        match fid {
            Node::Data => Ok(read_at(&self.data, offset, count)),
            Node::Block => {
                self.blocked.notify_one();
                std::future::pending().await
            }
            Node::Root => Err(Error::is_dir()),
        }
    }

    async fn write(&self, _fid: &mut Node, _offset: u64, _data: Bytes) -> Result<u32> {
        Err(Error::permission_denied())
    }

    async fn stat(&self, fid: &mut Node) -> Result<Stat> {
        Ok(Stat {
            qid: qid(*fid),
            mode: if *fid == Node::Root {
                dm::DIR | 0o755
            } else {
                0o444
            },
            length: if *fid == Node::Data {
                self.data.len() as u64
            } else {
                0
            },
            name: format!("{fid:?}").to_lowercase(),
            uid: "test".into(),
            gid: "test".into(),
            muid: "test".into(),
            ..Stat::default()
        })
    }
}

/// Our server for `fs` (msize up to [`MSIZE`]) on one end of a socketpair; returns the other.
fn serve(fs: &Arc<SpliceFs>) -> UnixStream {
    common::serve_fs(Arc::clone(fs), MSIZE, Limits::default())
}

fn new_fs() -> Arc<SpliceFs> {
    Arc::new(SpliceFs {
        data: content(DATA_LEN),
        blocked: tokio::sync::Notify::new(),
    })
}

/// A splicing client (on a unix socket) and the root fid.
async fn connect(fs: &Arc<SpliceFs>) -> (Client, Fid) {
    let c = Client::handshake_unix(serve(fs), MSIZE).await.unwrap();
    assert_eq!(c.max_io(), IOUNIT);
    let root = c.attach(None, "u", "").await.unwrap();
    (c, root)
}

async fn open(root: &Fid, name: &str) -> Fid {
    let mut f = root.walk(&[name]).await.unwrap();
    f.open(OREAD).await.unwrap();
    f
}

/// A non-blocking pipe, its capacity set if asked: the write end to splice into, and the read
/// end.
fn pipe(size: Option<i32>) -> (Arc<OwnedFd>, File) {
    let (r, w) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).unwrap();
    if let Some(n) = size {
        fcntl(w.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(n)).unwrap();
    }
    (Arc::new(w), File::from(r))
}

/// The payload a spliced read delivered: exactly `in_pipe` bytes from the pipe (no more may be
/// there), then `rest`.
fn payload(sp: &Spliced, pipe: &mut File) -> Vec<u8> {
    let mut v = vec![0u8; sp.in_pipe];
    pipe.read_exact(&mut v).unwrap();
    let mut one = [0u8; 1];
    match pipe.read(&mut one) {
        // Empty; or empty and closed, once the write end is gone.
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok(0) => {}
        other => panic!(
            "the pipe holds more than in_pipe = {}: {other:?}",
            sp.in_pipe
        ),
    }
    v.extend_from_slice(&sp.rest);
    v
}

/// `f`, or a failure naming `what` if it takes more than 10 s: a reader that waits for the wrong
/// thing (say, the socket when the pipe is full) fails the test instead of hanging it.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(10), f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer in 10 s"),
    }
}

/// What the file holds at `off`, `count` bytes at most.
fn expected(fs: &SpliceFs, off: u64, count: u32) -> &[u8] {
    let start = (off as usize).min(fs.data.len());
    let end = (start + count as usize).min(fs.data.len());
    &fs.data[start..end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spliced_reads_match_plain_reads_with_other_requests_in_flight() {
    let fs = new_fs();
    let (_c, root) = connect(&fs).await;
    let data = open(&root, "data").await;
    // Three spliced reads in flight at a time, each beside a plain read of the same range, a
    // Tstat, and a walk + clunk (Rclunk is 7 bytes: shorter than an Rread's head).
    let mut inflight = std::collections::VecDeque::new();
    let mut spliced_total = 0;
    let mut off = 0u64;
    while off < DATA_LEN as u64 || !inflight.is_empty() {
        if off < DATA_LEN as u64 && inflight.len() < 3 {
            let (pw, pr) = pipe(Some(1 << 20));
            let call = data
                .read_call_spliced(off, IOUNIT, Arc::clone(&pw))
                .unwrap();
            let plain = data.read_call(off, IOUNIT).unwrap();
            inflight.push_back((off, call, plain, pw, pr));
            off += u64::from(IOUNIT);
            continue;
        }
        let (at, call, plain, pw, mut pr) = inflight.pop_front().unwrap();
        let clunked = async { root.clone_fid().await.unwrap().clunk().await.unwrap() };
        let all = async { tokio::join!(call, plain.read_data(), data.stat(), clunked) };
        let (sp, plain, st, ()) = within("reads", all).await;
        let sp = sp.unwrap();
        let want = expected(&fs, at, IOUNIT);
        assert!(
            sp.in_pipe > 0,
            "read at {at}: nothing was spliced ({} in rest)",
            sp.rest.len()
        );
        spliced_total += sp.in_pipe;
        assert!(
            payload(&sp, &mut pr) == want,
            "spliced read at {at} differs"
        );
        assert!(plain.unwrap() == want, "plain read at {at} differs");
        assert_eq!(st.unwrap().length, DATA_LEN as u64);
        assert_eq!(Arc::strong_count(&pw), 1, "the client still holds the pipe");
    }
    eprintln!("{spliced_total} of {DATA_LEN} bytes went through pipes");
    // A 1 MiB pipe has room for nearly all of a 1 MiB payload (all of it, on Linux 6.x): the
    // reader splices until the pipe is full, not only what the socket held at first.
    assert!(
        spliced_total >= DATA_LEN / 2,
        "only {spliced_total} bytes spliced"
    );
    // And a last plain read of the whole tail, to show nothing is left over in the stream.
    let tail = data.read((DATA_LEN - 777) as u64, IOUNIT).await.unwrap();
    assert!(tail == fs.data[DATA_LEN - 777..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_pipe_takes_what_fits_and_the_rest_comes_in_memory() {
    let fs = new_fs();
    let (_c, root) = connect(&fs).await;
    let data = open(&root, "data").await;
    for at in [0u64, 12_345, 3 << 20] {
        let (pw, mut pr) = pipe(Some(4096));
        let sp = within("read", data.read_spliced(at, IOUNIT, pw))
            .await
            .unwrap();
        assert!(sp.in_pipe > 0, "read at {at}: nothing went into the pipe");
        assert!(
            !sp.rest.is_empty(),
            "read at {at}: a 4 KiB pipe took {}",
            sp.in_pipe
        );
        assert!(
            payload(&sp, &mut pr) == expected(&fs, at, IOUNIT),
            "read at {at} differs"
        );
    }
    let next = data.read(7, 100).await.unwrap();
    assert!(next == fs.data[7..107]);
}

#[tokio::test]
async fn reads_at_and_past_the_end_give_the_short_or_empty_payload() {
    let fs = new_fs();
    let (_c, root) = connect(&fs).await;
    let data = open(&root, "data").await;
    for at in [DATA_LEN as u64, DATA_LEN as u64 + 10, u64::MAX / 2] {
        let (pw, mut pr) = pipe(None);
        let sp = data.read_spliced(at, IOUNIT, pw).await.unwrap();
        assert_eq!((sp.in_pipe, sp.rest.len()), (0, 0), "read at {at}");
        assert!(payload(&sp, &mut pr).is_empty());
    }
    let at = DATA_LEN as u64 - 100;
    let (pw, mut pr) = pipe(None);
    let sp = data.read_spliced(at, IOUNIT, pw).await.unwrap();
    assert!(payload(&sp, &mut pr) == fs.data[DATA_LEN - 100..]);
}

#[tokio::test]
async fn an_rerror_for_a_spliced_read_is_a_server_error() {
    let fs = new_fs();
    let (_c, root) = connect(&fs).await;
    // Walked to, never opened: the server refuses the read.
    let unopened = root.walk(&["data"]).await.unwrap();
    let (pw, mut pr) = pipe(None);
    let err = unopened
        .read_spliced(0, 100, Arc::clone(&pw))
        .await
        .unwrap_err();
    match &err {
        ClientError::Server(m) => assert!(m.contains("not open"), "{m}"),
        other => panic!("expected a server error, got {other:?}"),
    }
    assert_eq!(Arc::strong_count(&pw), 1);
    let mut one = [0u8; 1];
    assert_eq!(pr.read(&mut one).unwrap_err().kind(), ErrorKind::WouldBlock);
    // A blocking pipe is refused before anything is sent.
    let (r, w) = nix::unistd::pipe().unwrap();
    let data = open(&root, "data").await;
    let err = data.read_spliced(0, 100, Arc::new(w)).await.unwrap_err();
    assert!(matches!(err, ClientError::Usage(_)), "{err:?}");
    drop(r);
    // The connection carries on.
    let (pw, mut pr) = pipe(None);
    let sp = data.read_spliced(5, 1000, pw).await.unwrap();
    assert!(payload(&sp, &mut pr) == fs.data[5..1005]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_spliced_calls_leave_the_stream_in_step() {
    let fs = new_fs();
    let (_c, root) = connect(&fs).await;
    let data = open(&root, "data").await;
    // A read that never finishes, given up: Tflush, and the pipe is let go at once.
    let block = open(&root, "block").await;
    let (pw, _pr) = pipe(None);
    let mut call = Box::pin(block.read_call_spliced(0, 100, Arc::clone(&pw)).unwrap());
    within(
        "the blocking read to reach the server",
        fs.blocked.notified(),
    )
    .await;
    let pending =
        std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx).is_pending()))
            .await;
    assert!(pending, "a read of block answered");
    drop(call);
    assert_eq!(Arc::strong_count(&pw), 1);
    // Big reads given up at various points while their replies arrive: before, during
    // (sometimes with the pipe's read end closed under the splice), or after.
    let mut given_up = Vec::new();
    for round in 0..12u64 {
        let mut calls = Vec::new();
        for i in 0..6u64 {
            let at = (round * 6 + i) * 65_537 % (4 << 20);
            let (pw, pr) = pipe(Some(1 << 20));
            let call = data.read_call_spliced(at, IOUNIT, Arc::clone(&pw)).unwrap();
            calls.push((at, call, pw, pr));
        }
        // Later rounds let the replies get further before the drops (no clock: the reader
        // runs on the other worker meanwhile).
        for _ in 0..round * 8 {
            tokio::task::yield_now().await;
        }
        for (i, (at, call, pw, mut pr)) in calls.into_iter().enumerate() {
            if (i as u64 + round) & 1 == 0 {
                drop(call);
                if i % 4 == 0 {
                    drop(pr);
                }
                given_up.push(pw);
            } else {
                let sp = within("read", call).await.unwrap();
                assert!(
                    payload(&sp, &mut pr) == expected(&fs, at, IOUNIT),
                    "round {round}: read at {at} differs"
                );
            }
        }
    }
    // Everything after is answered in order, spliced and plain.
    for at in [0u64, 1 << 20, 77_777] {
        let (pw, mut pr) = pipe(Some(1 << 20));
        let (sp, plain) = tokio::join!(data.read_spliced(at, IOUNIT, pw), data.read(at + 1, 4096));
        assert!(payload(&sp.unwrap(), &mut pr) == expected(&fs, at, IOUNIT));
        assert!(plain.unwrap() == expected(&fs, at + 1, 4096));
    }
    // By now the client has let go of every given-up call's pipe.
    assert!(given_up.iter().all(|p| Arc::strong_count(p) == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_cannot_splice_return_everything_in_memory() {
    let fs = new_fs();
    // The generic handshake, even over a unix socket.
    let (r, w) = serve(&fs).into_split();
    let generic = Client::handshake(r, w, MSIZE).await.unwrap();
    // TCP.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let srv = Server::with_max_msize(Arc::clone(&fs), MSIZE);
    tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let info = ConnInfo {
            id: srv.next_conn_id(),
            peer: None,
            transport: "tcp",
            remote: "test".into(),
        };
        let (r, w) = s.into_split();
        srv.serve_conn(r, w, info).await;
    });
    let addr = Addr::Tcp {
        host: "127.0.0.1".into(),
        port,
    };
    let tcp = Client::dial_msize(&addr, MSIZE).await.unwrap();
    for c in [generic, tcp] {
        let root = c.attach(None, "u", "").await.unwrap();
        let data = open(&root, "data").await;
        for at in [0u64, 999, 4 << 20] {
            let (pw, mut pr) = pipe(Some(1 << 20));
            let sp = data
                .read_spliced(at, IOUNIT, Arc::clone(&pw))
                .await
                .unwrap();
            assert_eq!(sp.in_pipe, 0);
            assert!(
                payload(&sp, &mut pr) == expected(&fs, at, IOUNIT),
                "read at {at}"
            );
            assert_eq!(Arc::strong_count(&pw), 1);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Against a scripted server, for what a real one cannot be made to do on cue.

/// The server end of a socketpair, speaking raw frames.
struct Fake {
    s: UnixStream,
}

impl Fake {
    async fn recv(&mut self) -> (u16, Tmsg) {
        wire::decode_t(common::read_frame(&mut self.s).await).unwrap()
    }

    async fn send_raw(&mut self, b: &[u8]) {
        self.s.write_all(b).await.unwrap();
    }

    async fn send(&mut self, tag: u16, m: &Rmsg) {
        self.send_raw(&frame(tag, m)).await;
    }

    /// Receives a Tread; returns its tag.
    async fn recv_read(&mut self) -> u16 {
        let (tag, m) = self.recv().await;
        assert!(matches!(m, Tmsg::Read { .. }), "{m:?}");
        tag
    }
}

fn frame(tag: u16, m: &Rmsg) -> Vec<u8> {
    let mut b = BytesMut::new();
    wire::encode_r(&mut b, tag, m).unwrap();
    b.to_vec()
}

/// A splicing client attached to a scripted server.
async fn fake_client() -> (Client, Fid, Fake) {
    let (a, b) = UnixStream::pair().unwrap();
    let mut fake = Fake { s: b };
    let (c, ()) = tokio::join!(Client::handshake_unix(a, 65_536), async {
        let (tag, m) = fake.recv().await;
        assert!(matches!(m, Tmsg::Version { .. }), "{m:?}");
        let v = Rmsg::Version {
            msize: 65_536,
            version: "9P2000".into(),
        };
        fake.send(tag, &v).await;
    });
    let c = c.unwrap();
    let (root, ()) = tokio::join!(c.attach(None, "u", ""), async {
        let (tag, m) = fake.recv().await;
        assert!(matches!(m, Tmsg::Attach { .. }), "{m:?}");
        fake.send(
            tag,
            &Rmsg::Attach {
                qid: qid(Node::Root),
            },
        )
        .await;
    });
    (c, root.unwrap(), fake)
}

/// Part of an Rread already read into memory when its spliced read is sent: that part goes into
/// the pipe first (write), the rest after it (splice), or into memory once the pipe is full.
///
/// The reply to a plain Tread arrives together with the head and first 20000 bytes of an Rread
/// for the next tag, before the client has sent that Tread (the client numbers tags in order),
/// so the reader takes them in greedily, as it would have had the reply raced the request. On
/// one thread the order of events is fixed.
#[tokio::test]
async fn payload_already_read_goes_into_the_pipe_first() {
    let p = content(40_000);
    for pipe_size in [1 << 20, 4096] {
        let (_c, root, mut fake) = fake_client().await;
        let plain = root.read_call(0, 5).unwrap();
        let ta = fake.recv_read().await;
        let rb = frame(ta + 1, &Rmsg::Read { data: p.clone() });
        let mut out = frame(
            ta,
            &Rmsg::Read {
                data: "hello".into(),
            },
        );
        out.extend_from_slice(&rb[..11 + 20_000]);
        fake.send_raw(&out).await;
        assert_eq!(&plain.read_data().await.unwrap()[..], b"hello");
        let (pw, mut pr) = pipe(Some(pipe_size));
        let call = root.read_call_spliced(0, 40_000, pw).unwrap();
        assert_eq!(fake.recv_read().await, ta + 1);
        fake.send_raw(&rb[11 + 20_000..]).await;
        let sp = within("spliced read", call).await.unwrap();
        if pipe_size == 4096 {
            // The 20000 bytes in memory overflow the pipe: the rest of them and all that was
            // still in the socket come in memory.
            assert!(
                sp.in_pipe > 0 && sp.in_pipe < 20_000,
                "in_pipe {}",
                sp.in_pipe
            );
        } else {
            assert_eq!(sp.in_pipe, 40_000, "the pipe had room for all of it");
        }
        assert!(payload(&sp, &mut pr) == p[..], "pipe size {pipe_size}");
        // In step: the next reply is read as such.
        let plain = root.read_call(0, 5).unwrap();
        let tc = fake.recv_read().await;
        fake.send(
            tc,
            &Rmsg::Read {
                data: "after".into(),
            },
        )
        .await;
        assert_eq!(&plain.read_data().await.unwrap()[..], b"after");
    }
}

/// An Rread whose count is not its size less its head is a protocol error: the connection is
/// dropped, not read out of step.
#[tokio::test]
async fn an_rread_with_a_wrong_count_closes_the_connection() {
    let (c, root, mut fake) = fake_client().await;
    let (pw, _pr) = pipe(None);
    let call = root.read_call_spliced(0, 100, pw).unwrap();
    let tag = fake.recv_read().await;
    let mut b = Vec::new();
    b.extend_from_slice(&(11u32 + 100).to_le_bytes());
    b.push(117);
    b.extend_from_slice(&tag.to_le_bytes());
    b.extend_from_slice(&50u32.to_le_bytes());
    b.extend_from_slice(&[7u8; 100]);
    fake.send_raw(&b).await;
    let err = call.await.unwrap_err();
    assert!(matches!(err, ClientError::Closed), "{err:?}");
    tokio::time::timeout(Duration::from_secs(5), c.closed())
        .await
        .unwrap();
}

/// The server going away in the middle of a spliced payload fails the read and closes the
/// client.
#[tokio::test]
async fn end_of_stream_inside_a_spliced_payload_closes_the_connection() {
    let (c, root, mut fake) = fake_client().await;
    let (pw, _pr) = pipe(None);
    let call = root.read_call_spliced(0, 1000, pw).unwrap();
    let tag = fake.recv_read().await;
    let whole = frame(
        tag,
        &Rmsg::Read {
            data: content(1000),
        },
    );
    fake.send_raw(&whole[..11 + 300]).await;
    drop(fake);
    let err = call.await.unwrap_err();
    assert!(matches!(err, ClientError::Closed), "{err:?}");
    tokio::time::timeout(Duration::from_secs(5), c.closed())
        .await
        .unwrap();
    assert!(root.read(0, 10).await.is_err());
}
