#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Latency and throughput of the 9P core against the bare socket it runs on.
//!
//! `cargo bench -p ollie-p9 --bench p9` prints one table:
//! 1. raw socketpair ping-pong (23-byte request, 11+N-byte reply, like Tread/Rread), and the
//!    same with the server waiting in `epoll_wait` before each read (an event loop's floor) and
//!    with the server a bare tokio task (the runtime's floor);
//! 2. Tread on an open fid, from a blocking raw client (server cost only) and from our async
//!    `Client`, pinned to one CPU and unpinned; plus an experiment with the sockets registered
//!    READABLE-only;
//! 3. walk+open+read+clunk of a small file, sequential and pipelined;
//! 4. bulk read of a 64 MiB file at msize 64 KiB and 1 MiB against a raw socket stream of the
//!    same bytes.
//!
//! Every figure comes with the CPU time both ends spent on it, which stays put when other
//! processes load the machine. Targets are printed next to the figures; timing never fails the
//! run. Knobs: `P9_BENCH_SCALE=0.1` shortens every loop (for profilers),
//! `P9_BENCH_PROFILE=<case>` runs one case alone (see `profile_one`), `P9_BENCH_SOCKBUF=<bytes>`
//! sets the socket buffers.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;
use ollie_p9::client::OREAD;
use ollie_p9::util::read_at;
use ollie_p9::wire::{self, qt};
use ollie_p9::{Client, ConnInfo, Filesystem, Qid, Rmsg, Server, Stat, Tmsg, Walked};
use tokio::io::unix::AsyncFd;
use tokio::io::{Interest, ReadBuf};

/// Contents of `small`: N bytes, so an Rread of it is 11+N bytes.
const SMALL: &[u8] = b"ollie-p9 benchmark small file: 64 bytes of fixed contents.....\n";
const BIG_LEN: usize = 64 << 20;
const RREAD: u8 = 117;
const TREAD_LEN: usize = 23;
const RREAD_HDR: usize = 11;
/// The CPU both ends share in the pinned comparison.
const PIN_CPU: usize = 0;
/// A fid number the async client never allocates (it counts up from 0).
const PIPE_FID: u32 = 0x4000_0000;
/// Bulk placement: sender (server) and receiver (client) both on CPU 0, so that throughput is
/// 1 / (CPU per byte of both ends). Unpinned, or pinned to different CPUs, the figures swing by
/// 2x on this kind of VM with where the two ends run (a cross-CPU wakeup is an IPI to a halted
/// vCPU).
const BULK_PLACE: Option<(usize, usize)> = Some((0, 0));

// ---------------------------------------------------------------------------------------------
// The file tree: / (dir), /small (SMALL), /big (64 MiB).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Root,
    Small,
    Big,
}

#[derive(Debug)]
struct BenchFs {
    small: Bytes,
    big: Bytes,
}

fn qid_of(n: Node) -> Qid {
    match n {
        Node::Root => Qid {
            ty: qt::DIR,
            version: 0,
            path: 1,
        },
        Node::Small => Qid {
            ty: qt::FILE,
            version: 0,
            path: 2,
        },
        Node::Big => Qid {
            ty: qt::FILE,
            version: 0,
            path: 3,
        },
    }
}

impl Filesystem for BenchFs {
    type Fid = Node;

    async fn attach(
        &self,
        _conn: &ConnInfo,
        _auth: Option<&mut Node>,
        _uname: &str,
        _aname: &str,
    ) -> ollie_p9::Result<(Node, Qid)> {
        Ok((Node::Root, qid_of(Node::Root)))
    }

    async fn walk(&self, fid: &Node, names: &[String]) -> ollie_p9::Result<Walked<Node>> {
        let to = match (fid, names) {
            (n, []) => *n,
            (Node::Root, [one]) if one == "small" => Node::Small,
            (Node::Root, [one]) if one == "big" => Node::Big,
            _ => return Err(ollie_p9::Error::not_found()),
        };
        Ok(Walked {
            qids: if names.is_empty() {
                vec![]
            } else {
                vec![qid_of(to)]
            },
            fid: Some(to),
        })
    }

    async fn open(&self, fid: &mut Node, _mode: u8) -> ollie_p9::Result<(Qid, u32)> {
        Ok((qid_of(*fid), 0))
    }

    async fn read(&self, fid: &mut Node, offset: u64, count: u32) -> ollie_p9::Result<Bytes> {
        Ok(match fid {
            Node::Root => Bytes::new(),
            Node::Small => read_at(&self.small, offset, count),
            Node::Big => read_at(&self.big, offset, count),
        })
    }

    async fn write(&self, _fid: &mut Node, _offset: u64, _data: Bytes) -> ollie_p9::Result<u32> {
        Err(ollie_p9::Error::read_only())
    }

    async fn stat(&self, fid: &mut Node) -> ollie_p9::Result<Stat> {
        let (name, length) = match fid {
            Node::Root => ("/", 0),
            Node::Small => ("small", self.small.len() as u64),
            Node::Big => ("big", self.big.len() as u64),
        };
        Ok(Stat {
            qid: qid_of(*fid),
            mode: 0o444,
            length,
            name: name.into(),
            uid: "bench".into(),
            gid: "bench".into(),
            muid: "bench".into(),
            ..Stat::default()
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Plumbing: pinning, runtimes, the served socket.

/// Lets the calling thread run anywhere again.
fn unpin() {
    let mut set = CpuSet::new();
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    for cpu in 0..n.min(CpuSet::count()) {
        set.set(cpu).unwrap();
    }
    sched_setaffinity(Pid::from_raw(0), &set).unwrap();
}

fn pin_to(cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu).unwrap();
    sched_setaffinity(Pid::from_raw(0), &set).unwrap();
}

/// How a side's threads and runtime are set up.
#[derive(Debug, Clone, Copy)]
enum Rt {
    /// `current_thread` runtime, the thread pinned to [`PIN_CPU`].
    Pinned,
    /// `current_thread` runtime, unpinned.
    Single,
    /// `multi_thread` runtime with 2 workers, unpinned (the block_on thread only drives I/O).
    Multi,
    /// `current_thread` runtime pinned to this CPU (bulk: the two ends on different CPUs).
    Cpu(usize),
}

impl Rt {
    fn build(self) -> tokio::runtime::Runtime {
        match self {
            Rt::Pinned => Rt::Cpu(PIN_CPU).build(),
            Rt::Cpu(cpu) => {
                pin_to(cpu);
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .on_thread_start(move || pin_to(cpu))
                    .build()
                    .unwrap()
            }
            Rt::Single => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            Rt::Multi => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap(),
        }
    }
}

/// A socketpair; `P9_BENCH_SOCKBUF=<bytes>` sets SO_SNDBUF/SO_RCVBUF on both ends (an experiment:
/// the default unix-socket buffer is ~208 KiB, smaller than one 1 MiB Rread).
fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    if let Some(n) = std::env::var("P9_BENCH_SOCKBUF")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        use nix::sys::socket::{setsockopt, sockopt};
        for s in [&a, &b] {
            setsockopt(s, sockopt::SndBuf, &n).unwrap();
            setsockopt(s, sockopt::RcvBuf, &n).unwrap();
        }
    }
    (a, b)
}

fn tokio_stream(s: UnixStream) -> tokio::net::UnixStream {
    s.set_nonblocking(true).unwrap();
    tokio::net::UnixStream::from_std(s).unwrap()
}

/// How a side's socket is registered with the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// `tokio::net::UnixStream` halves (registered for READABLE | WRITABLE).
    Tokio,
    /// Experiment: registered for READABLE only; writes go straight to the socket and a
    /// WRITABLE registration is made only once a write would block. Unix stream sockets signal
    /// EPOLLOUT every time the peer drains them, so with a WRITABLE registration every round
    /// trip wakes each side once for nothing.
    ReadableOnly,
}

type BoxRead = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
type BoxWrite = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

// `AsyncFd::with_interest` is deprecated in favour of an `unsafe` constructor; the workspace
// forbids `unsafe`, and the fd here is an owned `UnixStream`, which is what makes it sound.
#[allow(deprecated)]
fn split(s: UnixStream, t: Transport) -> (BoxRead, BoxWrite) {
    match t {
        Transport::Tokio => {
            let (r, w) = tokio_stream(s).into_split();
            (Box::new(r), Box::new(w))
        }
        Transport::ReadableOnly => {
            s.set_nonblocking(true).unwrap();
            let w = WrHalf {
                s: s.try_clone().unwrap(),
                fd: None,
            };
            let r = RdHalf {
                fd: AsyncFd::with_interest(s, Interest::READABLE).unwrap(),
            };
            (Box::new(r), Box::new(w))
        }
    }
}

struct RdHalf {
    fd: AsyncFd<UnixStream>,
}

impl tokio::io::AsyncRead for RdHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            let mut g = std::task::ready!(self.fd.poll_read_ready(cx))?;
            // Safe code must initialise what it reads into; keep that small (latency runs only).
            let want = buf.remaining().min(512);
            let dst = buf.initialize_unfilled_to(want);
            match g.try_io(|fd| fd.get_ref().read(dst)) {
                Ok(r) => {
                    let n = r?;
                    if n > 0 && n < want {
                        // A short read drained the socket: wait for the next edge instead of
                        // finding out with an EAGAIN read (what tokio's own streams do).
                        g.clear_ready();
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(_would_block) => continue,
            }
        }
    }
}

struct WrHalf {
    s: UnixStream,
    /// WRITABLE registration, made the first time a write would block.
    fd: Option<AsyncFd<UnixStream>>,
}

impl WrHalf {
    #[allow(deprecated)]
    fn poll_with(
        &mut self,
        cx: &mut Context<'_>,
        mut f: impl FnMut(&UnixStream) -> std::io::Result<usize>,
    ) -> Poll<std::io::Result<usize>> {
        if self.fd.is_none() {
            match f(&self.s) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                r => return Poll::Ready(r),
            }
            let c = self.s.try_clone()?;
            self.fd = Some(AsyncFd::with_interest(c, Interest::WRITABLE)?);
        }
        let fd = self.fd.as_ref().unwrap();
        loop {
            let mut g = std::task::ready!(fd.poll_write_ready(cx))?;
            match g.try_io(|fd| f(fd.get_ref())) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }
}

impl tokio::io::AsyncWrite for WrHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().poll_with(cx, |mut s| s.write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().poll_with(cx, |mut s| s.write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(self.s.shutdown(std::net::Shutdown::Write))
    }
}

/// Serves `fs` on one end of a fresh socketpair in its own thread; returns the other end.
fn serve(fs: &Arc<BenchFs>, rt: Rt) -> (UnixStream, JoinHandle<()>) {
    serve_t(fs, rt, Transport::Tokio)
}

fn serve_t(fs: &Arc<BenchFs>, rt: Rt, t: Transport) -> (UnixStream, JoinHandle<()>) {
    let (a, b) = pair();
    let fs = Arc::clone(fs);
    let multi = matches!(rt, Rt::Multi);
    let h = std::thread::spawn(move || {
        let rt = rt.build();
        rt.block_on(async move {
            let srv = Server::new(fs);
            let info = ConnInfo {
                id: srv.next_conn_id(),
                peer: None,
                transport: "unix",
                remote: "bench".into(),
            };
            if t != Transport::Tokio {
                let (r, w) = split(b, t);
                srv.serve_conn(r, w, info).await;
                return;
            }
            let (r, w) = tokio_stream(b).into_split();
            if multi {
                // On a multi-thread runtime the connection runs as a task on a worker, as it
                // would under `serve_unix`.
                tokio::spawn(async move { srv.serve_conn(r, w, info).await })
                    .await
                    .unwrap();
            } else {
                srv.serve_conn(r, w, info).await;
            }
        });
    });
    (a, h)
}

fn scale() -> f64 {
    std::env::var("P9_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0)
}

fn n(base: usize) -> usize {
    ((base as f64 * scale()) as usize).max(1)
}

/// The best of a measurement's rounds: other load on the machine only ever makes a round
/// slower, so the best round is the steadiest estimate of what the code costs.
fn best(v: Vec<f64>, pick: fn(f64, f64) -> f64) -> f64 {
    v.into_iter().reduce(pick).unwrap_or(f64::NAN)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Wall and CPU time per iteration, µs. CPU time is summed over every thread of this process
/// (both ends of the connection), so it is what one operation costs regardless of what else
/// the machine is doing; wall time is what a caller sees.
#[derive(Debug, Default, Clone, Copy)]
struct Lat {
    wall: f64,
    cpu: f64,
}

/// CPU time consumed so far by every thread of this process, ns (`/proc/self/task/*/schedstat`).
fn proc_cpu_ns() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Runs `$body` `$warm` times, then `$rounds` rounds of `$iters`; the best round's wall and CPU
/// µs per iteration. A macro so that `$body` may `.await`.
macro_rules! per_iter_us {
    ($warm:expr, $rounds:expr, $iters:expr, $body:block) => {{
        let t = Instant::now();
        for i in 0..$warm {
            $body
            if i % 64 == 63 && t.elapsed() > WARM_BUDGET {
                break;
            }
        }
        let mut wall = Vec::with_capacity($rounds);
        let mut cpu = Vec::with_capacity($rounds);
        for _ in 0..$rounds {
            let c0 = proc_cpu_ns();
            let t = Instant::now();
            let mut done = 0usize;
            while done < $iters {
                $body
                done += 1;
                if done % 64 == 0 && t.elapsed() > ROUND_BUDGET {
                    break;
                }
            }
            wall.push(t.elapsed().as_secs_f64() * 1e6 / done as f64);
            cpu.push((proc_cpu_ns() - c0) as f64 / 1e3 / done as f64);
        }
        Lat {
            wall: best(wall, f64::min),
            cpu: best(cpu, f64::min),
        }
    }};
}

/// Time limits that keep a slow configuration from stretching the run (a round stops early,
/// and its per-iteration figure is over what it did).
const WARM_BUDGET: std::time::Duration = std::time::Duration::from_millis(40);
const ROUND_BUDGET: std::time::Duration = std::time::Duration::from_millis(100);

/// Timed rounds per measurement (the best is kept).
const ROUNDS: usize = 5;
/// Every comparison runs this many times, raw and 9P alternating, so that load from other
/// processes hits both alike; the table shows medians over passes, ratios are per pass.
const PASSES: usize = 3;

// ---------------------------------------------------------------------------------------------
// 1. Raw socketpair ping-pong.

fn raw_pingpong(pinned: bool) -> Lat {
    pingpong(pinned, |mut s| {
        let mut req = [0u8; TREAD_LEN];
        let reply = rread_reply();
        while s.read_exact(&mut req).is_ok() {
            if s.write_all(&reply).is_err() {
                break;
            }
        }
    })
}

/// An Rread frame of [`SMALL`]'s length (the bytes after its type do not matter here).
fn rread_reply() -> Vec<u8> {
    let mut reply = vec![0u8; RREAD_HDR + SMALL.len()];
    let len = reply.len() as u32;
    reply[..4].copy_from_slice(&len.to_le_bytes());
    reply[4] = RREAD;
    reply
}

/// Round trips of a blocking client against `server` (run on a thread of its own, both
/// pinned to [`PIN_CPU`] if `pinned`): a Tread-sized request, an Rread-sized reply.
fn pingpong(pinned: bool, server: impl FnOnce(UnixStream) + Send + 'static) -> Lat {
    let (mut c, s) = pair();
    let srv = std::thread::spawn(move || {
        if pinned {
            pin_to(PIN_CPU);
        }
        server(s);
    });
    let us = std::thread::spawn(move || {
        if pinned {
            pin_to(PIN_CPU);
        }
        let mut req = [0u8; TREAD_LEN];
        req[..4].copy_from_slice(&(TREAD_LEN as u32).to_le_bytes());
        let mut reply = vec![0u8; RREAD_HDR + SMALL.len()];
        per_iter_us!(n(3_000), ROUNDS, n(10_000), {
            c.write_all(&req).unwrap();
            c.read_exact(&mut reply).unwrap();
        })
    })
    .join()
    .unwrap();
    srv.join().unwrap();
    us
}

/// 1'. As 1, but the server side waits in `epoll_wait` (edge-triggered) before each read and
/// takes a short read as a drained socket, as a reactor does at best: epoll_wait + read + write
/// per round trip, and no runtime. The floor of any event-driven server on this kernel.
fn epoll_pingpong(pinned: bool) -> Lat {
    use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
    pingpong(pinned, |mut s| {
        s.set_nonblocking(true).unwrap();
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).unwrap();
        let on = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET;
        ep.add(&s, EpollEvent::new(on, 0)).unwrap();
        let mut events = [EpollEvent::empty(); 4];
        let mut req = [0u8; 512];
        let reply = rread_reply();
        'serve: loop {
            ep.wait(&mut events, EpollTimeout::NONE).unwrap();
            // Whole requests only come here (23 bytes, written at once): answer each.
            loop {
                match s.read(&mut req) {
                    Ok(0) => break 'serve,
                    Ok(n) => {
                        for _ in 0..n / TREAD_LEN {
                            s.write_all(&reply).unwrap();
                        }
                        if n < req.len() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => break 'serve,
                }
            }
        }
    })
}

/// 1''. As 1, but the server is the least a tokio server can be: one task on the runtime the
/// `Server` rows use, reading into a buffer through the same socket halves (registered
/// READABLE | WRITABLE) and writing each reply, with no 9P in between. What this row adds to 1'
/// is the runtime's own cost per round trip, which every server on it pays.
fn tokio_pingpong(rt: Rt) -> Lat {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pinned = matches!(rt, Rt::Pinned);
    pingpong(pinned, move |s| {
        rt.build().block_on(async move {
            let (mut r, mut w) = tokio_stream(s).into_split();
            let mut req = BytesMut::with_capacity(8 * 1024);
            let reply = rread_reply();
            loop {
                match r.read_buf(&mut req).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                while req.len() >= TREAD_LEN {
                    let _ = req.split_to(TREAD_LEN);
                    if w.write_all(&reply).await.is_err() {
                        return;
                    }
                }
                if req.capacity() - req.len() < 4096 {
                    req.reserve(32 * 1024);
                }
            }
        });
    })
}

// ---------------------------------------------------------------------------------------------
// A minimal blocking 9P client over std I/O: buffered frame reads, no tasks, no channels.

struct RawConn {
    s: UnixStream,
    rbuf: Vec<u8>,
    lo: usize,
    hi: usize,
    wbuf: BytesMut,
}

impl RawConn {
    fn new(s: UnixStream, msize: u32) -> RawConn {
        let mut c = RawConn {
            s,
            rbuf: vec![0; 64 * 1024],
            lo: 0,
            hi: 0,
            wbuf: BytesMut::new(),
        };
        let r = c.rpc(
            0xFFFF,
            &Tmsg::Version {
                msize,
                version: "9P2000".into(),
            },
        );
        assert!(matches!(r, Rmsg::Version { .. }), "{r:?}");
        let r = c.rpc(
            1,
            &Tmsg::Attach {
                fid: 0,
                afid: wire::NOFID,
                uname: "bench".into(),
                aname: String::new(),
            },
        );
        assert!(matches!(r, Rmsg::Attach { .. }), "{r:?}");
        c
    }

    fn queue(&mut self, tag: u16, m: &Tmsg) {
        wire::encode_t(&mut self.wbuf, tag, m).unwrap();
    }

    fn flush(&mut self) {
        self.s.write_all(&self.wbuf).unwrap();
        self.wbuf.clear();
    }

    /// The next whole reply frame.
    fn frame(&mut self) -> &[u8] {
        loop {
            let have = self.hi - self.lo;
            if have >= 4 {
                let b = &self.rbuf[self.lo..];
                let size = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
                if have >= size {
                    let at = self.lo;
                    self.lo += size;
                    return &self.rbuf[at..at + size];
                }
                if self.rbuf.len() < size {
                    self.rbuf.resize(size, 0);
                }
            }
            if self.lo == self.hi {
                self.lo = 0;
                self.hi = 0;
            } else if self.rbuf.len() - self.lo < 64 * 1024 || self.hi == self.rbuf.len() {
                self.rbuf.copy_within(self.lo..self.hi, 0);
                self.hi -= self.lo;
                self.lo = 0;
            }
            let n = self.s.read(&mut self.rbuf[self.hi..]).unwrap();
            assert!(n > 0, "server closed the connection");
            self.hi += n;
        }
    }

    fn reply(&mut self) -> Rmsg {
        let f = Bytes::copy_from_slice(self.frame());
        let m = wire::decode_r(f).unwrap().1;
        assert!(!matches!(m, Rmsg::Error { .. }), "{m:?}");
        m
    }

    fn rpc(&mut self, tag: u16, m: &Tmsg) -> Rmsg {
        self.queue(tag, m);
        self.flush();
        self.reply()
    }

    /// Walks fid 0 to `name` as `fid` and opens it for reading.
    fn open(&mut self, name: &str, fid: u32) {
        self.rpc(
            2,
            &Tmsg::Walk {
                fid: 0,
                newfid: fid,
                wnames: vec![name.into()],
            },
        );
        self.rpc(3, &Tmsg::Open { fid, mode: OREAD });
    }
}

/// Tread latency from the blocking raw client against a server on `rt`.
fn raw_client_tread(fs: &Arc<BenchFs>, rt: Rt) -> Lat {
    raw_client_tread_t(fs, rt, Transport::Tokio)
}

fn raw_client_tread_t(fs: &Arc<BenchFs>, rt: Rt, t: Transport) -> Lat {
    let (sock, srv) = serve_t(fs, rt, t);
    let pinned = matches!(rt, Rt::Pinned);
    let us = std::thread::spawn(move || {
        if pinned {
            pin_to(PIN_CPU);
        }
        let mut c = RawConn::new(sock, 8192);
        c.open("small", 1);
        let mut req = BytesMut::new();
        wire::encode_t(
            &mut req,
            7,
            &Tmsg::Read {
                fid: 1,
                offset: 0,
                count: 8192,
            },
        )
        .unwrap();
        assert_eq!(req.len(), TREAD_LEN);
        let want = RREAD_HDR + SMALL.len();
        per_iter_us!(n(3_000), ROUNDS, n(10_000), {
            c.s.write_all(&req).unwrap();
            let f = c.frame();
            assert!(f.len() == want && f[4] == RREAD);
        })
    })
    .join()
    .unwrap();
    srv.join().unwrap();
    us
}

/// walk+open+read+clunk with the raw client: (sequential µs, pipelined µs).
fn raw_client_wocr(fs: &Arc<BenchFs>, rt: Rt) -> (Lat, Lat) {
    let (sock, srv) = serve(fs, rt);
    let pinned = matches!(rt, Rt::Pinned);
    let r = std::thread::spawn(move || {
        if pinned {
            pin_to(PIN_CPU);
        }
        let mut c = RawConn::new(sock, 8192);
        let msgs = wocr_msgs(0, 5);
        let seq = per_iter_us!(n(1_000), ROUNDS, n(3_000), {
            for (i, m) in msgs.iter().enumerate() {
                c.queue(i as u16, m);
                c.flush();
                c.frame();
            }
        });
        let pipe = per_iter_us!(n(1_000), ROUNDS, n(3_000), {
            for (i, m) in msgs.iter().enumerate() {
                c.queue(i as u16, m);
            }
            c.flush();
            for _ in 0..4 {
                let f = c.frame();
                assert!(f[4] != 107, "Rerror in pipelined batch");
            }
        });
        (seq, pipe)
    })
    .join()
    .unwrap();
    srv.join().unwrap();
    r
}

fn wocr_msgs(from: u32, newfid: u32) -> [Tmsg; 4] {
    [
        Tmsg::Walk {
            fid: from,
            newfid,
            wnames: vec!["small".into()],
        },
        Tmsg::Open {
            fid: newfid,
            mode: OREAD,
        },
        Tmsg::Read {
            fid: newfid,
            offset: 0,
            count: 8192,
        },
        Tmsg::Clunk { fid: newfid },
    ]
}

// ---------------------------------------------------------------------------------------------
// Our async client.

#[derive(Debug, Default)]
struct AsyncLat {
    tread: Lat,
    seq: Lat,
    pipe: Lat,
}

/// Tread and walk/open/read/clunk latencies of the async client, client runtime `crt`, server
/// runtime `srt`.
fn async_client_lat(fs: &Arc<BenchFs>, srt: Rt, crt: Rt) -> AsyncLat {
    async_client_lat_opt(fs, srt, crt, false, Transport::Tokio)
}

fn async_client_lat_opt(
    fs: &Arc<BenchFs>,
    srt: Rt,
    crt: Rt,
    tread_only: bool,
    t: Transport,
) -> AsyncLat {
    // The multi-thread setup is an order of magnitude slower per round trip; fewer iterations.
    let div = if matches!(crt, Rt::Multi) { 10 } else { 1 };
    let (sock, srv) = serve_t(fs, srt, t);
    let r = std::thread::spawn(move || {
        let rt = crt.build();
        rt.block_on(async move {
            let (r, w) = split(sock, t);
            let client = Client::handshake(r, w, 8192).await.unwrap();
            let root = client.attach(None, "bench", "").await.unwrap();
            let mut f = root.walk(&["small"]).await.unwrap();
            f.open(OREAD).await.unwrap();
            let tread = per_iter_us!(n(3_000 / div), ROUNDS, n(10_000 / div), {
                let d = f.read(0, 8192).await.unwrap();
                assert_eq!(d.len(), SMALL.len());
            });
            f.clunk().await.unwrap();
            if tread_only {
                return AsyncLat {
                    tread,
                    ..AsyncLat::default()
                };
            }
            let seq = per_iter_us!(n(1_000 / div), ROUNDS, n(3_000 / div), {
                let mut f = root.walk(&["small"]).await.unwrap();
                f.open(OREAD).await.unwrap();
                let d = f.read(0, 8192).await.unwrap();
                assert_eq!(d.len(), SMALL.len());
                f.clunk().await.unwrap();
            });
            let msgs = wocr_msgs(root.num(), PIPE_FID);
            let pipe = per_iter_us!(n(1_000 / div), ROUNDS, n(3_000 / div), {
                let calls = [
                    client.send(&msgs[0]).unwrap(),
                    client.send(&msgs[1]).unwrap(),
                    client.send(&msgs[2]).unwrap(),
                    client.send(&msgs[3]).unwrap(),
                ];
                for c in calls {
                    c.await.unwrap();
                }
            });
            drop(root);
            AsyncLat { tread, seq, pipe }
        })
    })
    .join()
    .unwrap();
    srv.join().unwrap();
    r
}

// ---------------------------------------------------------------------------------------------
// 4. Bulk throughput.

/// Throughput (MB/s) and CPU µs per MiB moved, summed over every thread of this process.
#[derive(Debug, Default, Clone, Copy)]
struct Tput {
    mbps: f64,
    cpu: f64,
}

fn mbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

/// Where the two ends of a bulk transfer run: the sender (server) on `.0`, the receiver (client)
/// on `.1`, or both unpinned.
type Place = Option<(usize, usize)>;

/// Raw socket stream: the reader asks with one byte, the writer answers with `src` (the big
/// file's bytes) in `chunk`-sized writes, the reader reads them into a fresh buffer. MB/s.
fn raw_bulk(chunk: usize, place: Place, src: &Bytes) -> Tput {
    let src = src.clone();
    let (mut c, mut s) = pair();
    if let Some((_, cpu)) = place {
        pin_to(cpu);
    }
    let w = std::thread::spawn(move || {
        if let Some((cpu, _)) = place {
            pin_to(cpu);
        }
        // From the same 64 MiB the server sends (cold memory, like a file's contents), not from
        // one hot chunk.
        let mut go = [0u8; 1];
        while s.read_exact(&mut go).is_ok() {
            for piece in src.chunks(chunk) {
                s.write_all(piece).unwrap();
            }
        }
    });
    let rounds = n(4).max(2);
    let mut v = Vec::new();
    let mut cpu = Vec::new();
    for i in 0..rounds + 1 {
        let t = Instant::now();
        let c0 = proc_cpu_ns();
        c.write_all(&[1]).unwrap();
        let mut out = vec![0u8; BIG_LEN];
        let mut at = 0;
        while at < BIG_LEN {
            let end = (at + chunk).min(BIG_LEN);
            let k = c.read(&mut out[at..end]).unwrap();
            assert!(k > 0);
            at += k;
        }
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(&out);
        if i > 0 {
            v.push(mbps(BIG_LEN, secs));
            cpu.push((proc_cpu_ns() - c0) as f64 / 1e3 / (BIG_LEN >> 20) as f64);
        }
    }
    drop(c);
    w.join().unwrap();
    unpin();
    Tput {
        mbps: best(v, f64::max),
        cpu: best(cpu, f64::min),
    }
}

/// The raw 9P client reading the big file with `depth` Treads in flight, payloads read straight
/// into the destination. MB/s.
fn raw_client_bulk(fs: &Arc<BenchFs>, msize: u32, depth: usize, place: Place) -> Tput {
    let (sock, srv) = serve(fs, place.map_or(Rt::Single, |p| Rt::Cpu(p.0)));
    let r = std::thread::spawn(move || {
        if let Some((_, cpu)) = place {
            pin_to(cpu);
        }
        let mut c = RawConn::new(sock, msize);
        c.open("big", 1);
        let unit = (msize - wire::IOHDRSZ) as usize;
        let rounds = n(4).max(2);
        let mut v = Vec::new();
        let mut cpu = Vec::new();
        for i in 0..rounds + 1 {
            let t = Instant::now();
            let c0 = proc_cpu_ns();
            let mut out = vec![0u8; BIG_LEN];
            let (mut sent, mut got, mut inflight) = (0usize, 0usize, 0usize);
            while got < BIG_LEN {
                while inflight < depth && sent < BIG_LEN {
                    let k = unit.min(BIG_LEN - sent);
                    c.queue(
                        (sent / unit) as u16,
                        &Tmsg::Read {
                            fid: 1,
                            offset: sent as u64,
                            count: k as u32,
                        },
                    );
                    sent += k;
                    inflight += 1;
                }
                c.flush();
                // Header through the buffer (it holds nothing else: replies come in order and
                // payloads are read past it), payload straight into `out`.
                let mut hdr = [0u8; RREAD_HDR];
                c.s.read_exact(&mut hdr).unwrap();
                assert_eq!(hdr[4], RREAD);
                let k = u32::from_le_bytes([hdr[7], hdr[8], hdr[9], hdr[10]]) as usize;
                c.s.read_exact(&mut out[got..got + k]).unwrap();
                got += k;
                inflight -= 1;
            }
            let secs = t.elapsed().as_secs_f64();
            std::hint::black_box(&out);
            if i > 0 {
                v.push(mbps(BIG_LEN, secs));
                cpu.push((proc_cpu_ns() - c0) as f64 / 1e3 / (BIG_LEN >> 20) as f64);
            }
        }
        Tput {
            mbps: best(v, f64::max),
            cpu: best(cpu, f64::min),
        }
    })
    .join()
    .unwrap();
    srv.join().unwrap();
    r
}

/// Our async client's `read_bulk` of the big file. MB/s.
fn async_bulk(fs: &Arc<BenchFs>, msize: u32, depth: usize, srt: Rt, crt: Rt) -> Tput {
    let (sock, srv) = serve(fs, srt);
    let r = std::thread::spawn(move || {
        let crt = crt.build();
        crt.block_on(async move {
            let (r, w) = tokio_stream(sock).into_split();
            let client = Client::handshake(r, w, msize).await.unwrap();
            assert_eq!(client.msize(), msize);
            let root = client.attach(None, "bench", "").await.unwrap();
            let mut f = root.walk(&["big"]).await.unwrap();
            f.open(OREAD).await.unwrap();
            let rounds = n(4).max(2);
            let mut v = Vec::new();
            let mut cpu = Vec::new();
            for i in 0..rounds + 1 {
                let t = Instant::now();
                let c0 = proc_cpu_ns();
                let out = f.read_bulk(0, BIG_LEN as u64, depth).await.unwrap();
                let secs = t.elapsed().as_secs_f64();
                assert_eq!(out.len(), BIG_LEN);
                if i > 0 {
                    v.push(mbps(BIG_LEN, secs));
                    cpu.push((proc_cpu_ns() - c0) as f64 / 1e3 / (BIG_LEN >> 20) as f64);
                }
            }
            f.clunk().await.unwrap();
            Tput {
                mbps: best(v, f64::max),
                cpu: best(cpu, f64::min),
            }
        })
    })
    .join()
    .unwrap();
    srv.join().unwrap();
    r
}

// ---------------------------------------------------------------------------------------------
// The table.

const COLS: usize = 7;

/// Rows of the report; a section is a title line of its own.
struct Table {
    rows: Vec<Result<[String; COLS], String>>,
}

impl Table {
    fn section(&mut self, title: &str) {
        self.rows.push(Err(format!("-- {title}")));
    }

    /// `cpu`: CPU µs per operation (all threads) and its ratio to raw.
    fn row(
        &mut self,
        what: &str,
        value: String,
        ratio: Option<f64>,
        cpu: Option<(String, f64)>,
        target: &str,
        ok: Option<bool>,
    ) {
        let x = |r: f64| format!("{r:.2}x");
        self.rows.push(Ok([
            format!("  {what}"),
            value,
            ratio.map_or(String::new(), x),
            cpu.as_ref().map_or(String::new(), |c| c.0.clone()),
            cpu.as_ref().map_or(String::new(), |c| x(c.1)),
            target.to_string(),
            match ok {
                Some(true) => "PASS".into(),
                Some(false) => "MISS".into(),
                None => String::new(),
            },
        ]));
    }

    fn print(&self) {
        let head = [
            "case",
            "value",
            "vs raw",
            "cpu/op",
            "cpu vs raw",
            "target",
            "",
        ];
        let mut w = [0usize; COLS];
        let cells = self.rows.iter().filter_map(|r| r.as_ref().ok());
        for r in cells
            .map(|r| r.each_ref().map(String::as_str))
            .chain([head])
        {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |r: [&str; COLS]| {
            let mut out = format!("{:<1$}", r[0], w[0]);
            for i in 1..5 {
                out += &format!("  {:>1$}", r[i], w[i]);
            }
            out += &format!("  {:<1$}  {2}", r[5], w[5], r[6]);
            println!("{}", out.trim_end());
        };
        line(head);
        println!("{}", "-".repeat(w.iter().sum::<usize>() + 2 * (COLS - 1)));
        for r in &self.rows {
            match r {
                Ok(r) => line(r.each_ref().map(String::as_str)),
                Err(title) => println!("{title}"),
            }
        }
    }
}

fn us(v: f64) -> String {
    format!("{v:.2} us")
}

/// `P9_BENCH_PROFILE=<case>` runs one case alone (for strace/perf/callgrind) and prints it.
fn profile_one(fs: &Arc<BenchFs>, spec: &str) {
    // `<case>[:<depth>]`
    let (case, depth) = match spec.split_once(':') {
        Some((c, d)) => (c, d.parse().unwrap()),
        None => (spec, 16),
    };
    let r = match case {
        "pingpong" => format!("{:?}", raw_pingpong(true)),
        "pingpong-unpinned" => format!("{:?}", raw_pingpong(false)),
        "epoll-pingpong" => format!("{:?}", epoll_pingpong(true)),
        "tokio-pingpong" => format!("{:?}", tokio_pingpong(Rt::Pinned)),
        "raw-tread" => format!("{:?}", raw_client_tread(fs, Rt::Pinned)),
        "raw-tread-ro" => format!(
            "{:?}",
            raw_client_tread_t(fs, Rt::Pinned, Transport::ReadableOnly)
        ),
        "async-tread" => format!("{:?}", async_client_lat(fs, Rt::Pinned, Rt::Pinned)),
        "async-tread-only" => format!(
            "{:?}",
            async_client_lat_opt(fs, Rt::Pinned, Rt::Pinned, true, Transport::Tokio)
        ),
        "async-tread-ro" => format!(
            "{:?}",
            async_client_lat_opt(fs, Rt::Pinned, Rt::Pinned, true, Transport::ReadableOnly)
        ),
        "multi-tread" => format!("{:?}", async_client_lat(fs, Rt::Multi, Rt::Multi)),
        "single-tread" => format!(
            "{:?}",
            async_client_lat_opt(fs, Rt::Single, Rt::Single, true, Transport::Tokio)
        ),
        "srv-multi-tread" => format!(
            "{:?}",
            async_client_lat_opt(fs, Rt::Multi, Rt::Single, true, Transport::Tokio)
        ),
        "cli-multi-tread" => format!(
            "{:?}",
            async_client_lat_opt(fs, Rt::Single, Rt::Multi, true, Transport::Tokio)
        ),
        "raw-bulk64" => format!("{:?}", raw_bulk((64 << 10) - 24, BULK_PLACE, &fs.big)),
        "raw-bulk1m" => format!("{:?}", raw_bulk((1 << 20) - 24, BULK_PLACE, &fs.big)),
        "rawc-bulk64" => format!("{:?}", raw_client_bulk(fs, 64 << 10, depth, BULK_PLACE)),
        "rawc-bulk1m" => format!("{:?}", raw_client_bulk(fs, 1 << 20, depth, BULK_PLACE)),
        "async-bulk64" => format!(
            "{:?}",
            async_bulk(fs, 64 << 10, depth, Rt::Pinned, Rt::Pinned)
        ),
        "async-bulk1m" => format!(
            "{:?}",
            async_bulk(fs, 1 << 20, depth, Rt::Pinned, Rt::Pinned)
        ),
        other => format!("unknown case {other:?}"),
    };
    println!("{spec}: {r}");
}

/// All passes of every case, alternating so that load on the machine hits them alike.
/// Latency: `[pinned, unpinned]` x passes; bulk: `[64 KiB, 1 MiB]` x passes.
fn measure(fs: &Arc<BenchFs>) -> ([Vec<LatPass>; 2], [Vec<BulkPass>; 2]) {
    let mut lat: [Vec<LatPass>; 2] = [Vec::new(), Vec::new()];
    let mut bulk: [Vec<BulkPass>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..PASSES {
        for (k, pinned) in [true, false].into_iter().enumerate() {
            let rt = if pinned { Rt::Pinned } else { Rt::Single };
            let raw = raw_pingpong(pinned);
            let ep = epoll_pingpong(pinned);
            let tk = tokio_pingpong(rt);
            let rawc = raw_client_tread(fs, rt);
            let a = async_client_lat(fs, rt, rt);
            let (rseq, rpipe) = raw_client_wocr(fs, rt);
            let m = (!pinned).then(|| async_client_lat(fs, Rt::Multi, Rt::Multi));
            let ro = Transport::ReadableOnly;
            let rawc_ro = raw_client_tread_t(fs, rt, ro);
            let a_ro = async_client_lat_opt(fs, rt, rt, true, ro).tread;
            lat[k].push(LatPass {
                raw,
                ep,
                tk,
                rawc,
                a,
                rseq,
                rpipe,
                m: m.unwrap_or_default(),
                rawc_ro,
                a_ro,
            });
        }
        for (k, msize) in [64u32 << 10, 1 << 20].into_iter().enumerate() {
            let unit = (msize - wire::IOHDRSZ) as usize;
            bulk[k].push(BulkPass {
                raw: raw_bulk(unit, BULK_PLACE, &fs.big),
                rawc: [4, 16].map(|d| raw_client_bulk(fs, msize, d, BULK_PLACE)),
                a: [4, 16].map(|d| async_bulk(fs, msize, d, Rt::Pinned, Rt::Pinned)),
                single: async_bulk(fs, msize, 16, Rt::Single, Rt::Single),
                multi: async_bulk(fs, msize, 16, Rt::Multi, Rt::Multi),
            });
        }
    }
    (lat, bulk)
}

/// Which figure of a pass a latency row shows.
type LatOf = fn(&LatPass) -> Lat;

/// One latency row: the medians over the passes of `f`'s wall and CPU time, and of their
/// ratios to the same pass's raw ping-pong; `ok` judges the wall time ratio.
fn lat_row(
    t: &mut Table,
    p: &[LatPass],
    what: &str,
    f: &dyn Fn(&LatPass) -> Lat,
    target: &str,
    ok: &dyn Fn(f64) -> Option<bool>,
) {
    let (v, r) = (med(p, |x| f(x).wall), med(p, |x| f(x).wall / x.raw.wall));
    let (c, cr) = (med(p, |x| f(x).cpu), med(p, |x| f(x).cpu / x.raw.cpu));
    t.row(what, us(v), Some(r), Some((us(c), cr)), target, ok(r));
}

/// Latency sections 1 and 2 (`pinned` or not): the raw ping-pong and Tread on an open fid.
fn latency_section(t: &mut Table, pinned: bool, p: &[LatPass]) {
    let label = if pinned {
        "pinned: both ends on CPU 0"
    } else {
        "unpinned"
    };
    t.section(&format!(
        "latency, {label} (current_thread runtimes, one thread per side)"
    ));
    let what = "1. raw socketpair ping-pong (23 B / 74 B)";
    lat_row(t, p, what, &|x| x.raw, "", &|_| None);
    let what = "1'. as 1, server waits in epoll_wait (a reactor's floor)";
    lat_row(t, p, what, &|x| x.ep, "(info)", &|_| None);
    let what = "1''. as 1, server a bare tokio task (a tokio server's floor)";
    lat_row(t, p, what, &|x| x.tk, "(info)", &|_| None);
    let target = if pinned { "<= 1.30x" } else { "(info)" };
    let ok = |r: f64| pinned.then_some(r <= 1.3);
    let rows: [(&str, LatOf); 4] = [
        ("2a. Tread, blocking raw client -> Server", |x| x.rawc),
        ("2b. Tread, async Client::read -> Server", |x| x.a.tread),
        ("2a'. as 2a, sockets READABLE-only (experiment)", |x| {
            x.rawc_ro
        }),
        ("2b'. as 2b, sockets READABLE-only (experiment)", |x| x.a_ro),
    ];
    for (what, f) in rows {
        lat_row(t, p, what, &f, target, &ok);
    }
}

/// The rest of a latency section: walk+open+read+clunk (case 3), and unpinned the
/// multi-threaded runtimes.
fn wocr_rows(t: &mut Table, pinned: bool, p: &[LatPass]) {
    let rows: [(&str, LatOf, &str); 3] = [
        (
            "3. w+o+r+c sequential, raw client",
            |x| x.rseq,
            "(4 RTT = 4.00x)",
        ),
        (
            "3. w+o+r+c sequential, async Client",
            |x| x.a.seq,
            "(4 RTT = 4.00x)",
        ),
        (
            "3. w+o+r+c pipelined, raw client",
            |x| x.rpipe,
            "(< sequential)",
        ),
    ];
    for (what, f, target) in rows {
        lat_row(t, p, what, &f, target, &|_| None);
    }
    let piped = med(p, |x| x.a.pipe.wall) < med(p, |x| x.a.seq.wall);
    let what = "3. w+o+r+c pipelined, async Client::send";
    lat_row(t, p, what, &|x| x.a.pipe, "(< sequential)", &|_| {
        Some(piped)
    });
    if !pinned {
        let rows: [(&str, LatOf); 3] = [
            ("2b. Tread, async Client, multi_thread(2) both", |x| {
                x.m.tread
            }),
            ("3. w+o+r+c sequential, multi_thread(2) both", |x| x.m.seq),
            ("3. w+o+r+c pipelined, multi_thread(2) both", |x| x.m.pipe),
        ];
        for (what, f) in rows {
            lat_row(t, p, what, &f, "(info)", &|_| None);
        }
    }
}

/// One bulk row: the medians over the passes of `f`'s MB/s and CPU time per MiB, and of
/// their ratios to the same pass's raw stream; `pass` rows have the 0.60x target.
fn bulk_row(t: &mut Table, p: &[BulkPass], what: &str, f: &dyn Fn(&BulkPass) -> Tput, pass: bool) {
    let (v, r) = (med(p, |x| f(x).mbps), med(p, |x| f(x).mbps / x.raw.mbps));
    let (c, cr) = (med(p, |x| f(x).cpu), med(p, |x| f(x).cpu / x.raw.cpu));
    let (target, ok) = if pass {
        (">= 0.60x", Some(r >= 0.6))
    } else {
        ("", None)
    };
    t.row(
        what,
        format!("{v:.0} MB/s"),
        Some(r),
        Some((format!("{c:.0} us/MiB"), cr)),
        target,
        ok,
    );
}

/// Bulk section 4 at `msize`.
fn bulk_section(t: &mut Table, msize: u32, p: &[BulkPass]) {
    let unit = msize - wire::IOHDRSZ;
    t.section(&format!(
        "bulk read 64 MiB, msize {} KiB (iounit {unit}); both ends on CPU 0, current_thread \
         per side; last two rows unpinned (vs the pinned raw)",
        msize >> 10
    ));
    bulk_row(
        t,
        p,
        &format!("4. raw socket stream, {unit} B writes"),
        &|x| x.raw,
        false,
    );
    for (i, d) in [4, 16].into_iter().enumerate() {
        let what = format!("4. raw client -> Server, depth {d}");
        bulk_row(t, p, &what, &|x| x.rawc[i], true);
    }
    for (i, d) in [4, 16].into_iter().enumerate() {
        let what = format!("4. async read_bulk, depth {d}");
        bulk_row(t, p, &what, &|x| x.a[i], true);
    }
    bulk_row(
        t,
        p,
        "4. async read_bulk, depth 16, unpinned",
        &|x| x.single,
        true,
    );
    bulk_row(
        t,
        p,
        "4. async read_bulk, depth 16, unpinned multi_thread(2)",
        &|x| x.multi,
        true,
    );
}

/// No collapse at 1 MiB: each 1 MiB figure against the same pass's 64 KiB figure.
fn msize_section(t: &mut Table, bulk: &[Vec<BulkPass>; 2]) {
    t.section("1 MiB vs 64 KiB (same pass)");
    let cmp = |f: &dyn Fn(&BulkPass) -> f64| {
        // f64: MB/s
        let r: Vec<f64> = bulk[0]
            .iter()
            .zip(&bulk[1])
            .map(|(a, b)| f(b) / f(a))
            .collect();
        median(r)
    };
    let raw_r = cmp(&|x| x.raw.mbps);
    t.row(
        "   raw socket stream",
        String::new(),
        Some(raw_r),
        None,
        "(info)",
        None,
    );
    for (i, d) in [4, 16].into_iter().enumerate() {
        let r = cmp(&|x| x.a[i].mbps);
        t.row(
            &format!("   async read_bulk, depth {d}"),
            String::new(),
            Some(r),
            None,
            ">= 0.80x (no collapse)",
            Some(r >= 0.8),
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument is ignored too.
    let t0 = Instant::now();
    let big: Vec<u8> = (0..BIG_LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
    let fs = Arc::new(BenchFs {
        small: Bytes::from_static(SMALL),
        big: Bytes::from(big),
    });
    if let Ok(case) = std::env::var("P9_BENCH_PROFILE") {
        profile_one(&fs, &case);
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "ollie-p9 bench: {cpus} CPUs, small file {} B (Rread {} B), big file {} MiB; \
         {PASSES} alternating passes x {ROUNDS} rounds; best round, median pass; scale {}\n\
         value = wall time per op (latency) or MB/s (bulk); cpu/op = CPU time of all threads \
         (both ends) per op or per MiB; ratios are per pass, vs the raw row of the section",
        SMALL.len(),
        RREAD_HDR + SMALL.len(),
        BIG_LEN >> 20,
        scale()
    );

    let (lat, bulk) = measure(&fs);
    let mut t = Table { rows: Vec::new() };
    for (k, pinned) in [true, false].into_iter().enumerate() {
        latency_section(&mut t, pinned, &lat[k]);
        wocr_rows(&mut t, pinned, &lat[k]);
    }
    for (k, msize) in [64u32 << 10, 1 << 20].into_iter().enumerate() {
        bulk_section(&mut t, msize, &bulk[k]);
    }
    msize_section(&mut t, &bulk);
    t.print();
    println!("(total bench time {:.1} s)", t0.elapsed().as_secs_f64());
}

#[derive(Debug, Default)]
struct LatPass {
    raw: Lat,
    /// The raw ping-pong with the server waiting in `epoll_wait` ([`epoll_pingpong`]).
    ep: Lat,
    /// The raw ping-pong with the server a bare tokio task ([`tokio_pingpong`]).
    tk: Lat,
    rawc: Lat,
    a: AsyncLat,
    rseq: Lat,
    rpipe: Lat,
    m: AsyncLat,
    /// Experiment: both ends' sockets registered READABLE-only ([`Transport::ReadableOnly`]).
    rawc_ro: Lat,
    a_ro: Lat,
}

#[derive(Debug, Default)]
struct BulkPass {
    raw: Tput,
    rawc: [Tput; 2],
    a: [Tput; 2],
    single: Tput,
    multi: Tput,
}

fn med<P>(passes: &[P], f: impl Fn(&P) -> f64) -> f64 {
    median(passes.iter().map(f).collect())
}
