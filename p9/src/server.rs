//! The async 9P2000 server core.
//!
//! A [`Filesystem`] implements the file operations on its own per-fid state (`F::Fid`); the core
//! owns the wire, the fid table, tags, flushes and ordering:
//!
//! - Requests on different fids run concurrently: a parked read never delays another fid.
//! - Requests on the same fid run in arrival order (each fid has a fair FIFO lock, taken by the
//!   first poll of the request, which happens inline in arrival order), so a client may pipeline
//!   walk/open/read/clunk.
//! - A request that does not finish on its first poll runs in its own task; `Tflush` aborts that
//!   task (dropping its future) and is answered at once. A request that already finished is
//!   answered before the `Rflush`, a flushed one never.
//! - Frames are assembled in a buffer that is only ever filled, never dropped, so a reply sent
//!   while a large `Twrite` is half received cannot lose bytes.
//! - Malformed messages get `Rerror` with their tag; unframeable input (size below a header or
//!   above msize) closes that connection only.
//! - Every connection is bounded ([`Limits`]): fids, authentication fids and running requests
//!   past their caps get `Rerror` (the connection keeps working); a connection that has not
//!   attached within `attach_timeout` is closed; connections past the global or per-peer cap
//!   are answered with one `Rerror` and closed. Accept errors never spin: out of file
//!   descriptors, the listener sheds pending connections through a reserved descriptor and
//!   backs off.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, OwnedMutexGuard, mpsc};
use tokio::task::AbortHandle;

use crate::error::{Error, Result};
use crate::wire::{self, DecodeError, HEADER_LEN, IOHDRSZ, NOFID, Qid, Rmsg, Stat, Tmsg, om, qt};

/// Largest msize we accept by default (1 MiB).
pub const DEFAULT_MAX_MSIZE: u32 = 1 << 20;
/// Smallest msize we accept: enough for any stat a server here produces.
pub const MIN_MSIZE: u32 = 512;
/// Requests a connection may have running at once by default; more get `Rerror` until some
/// finish.
pub const MAX_INFLIGHT: usize = 4096;
/// Unsent reply bytes after which the connection stops reading requests until the peer reads.
const OUT_HIGH_WATER: usize = 4 << 20;

/// The bounds a [`Server`] keeps on its peers. The caller fills it (olliesrv from its
/// configuration); [`Limits::default`] suits an interactive server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Fids one connection may hold at once (authentication fids included). A request that
    /// would create one more gets `Rerror` ("too many fids on this connection (limit N)").
    pub max_fids: usize,
    /// Authentication fids (Tauth) one connection may hold at once.
    pub max_afids: usize,
    /// Requests one connection may have running (not finished on arrival, such as a blocked
    /// read) at once. At the cap every new request gets `Rerror` (before it runs: a refused
    /// request has done nothing) until some finish or are flushed; `Tflush`, `Tclunk` and
    /// `Tversion` are always served, so a client at the cap can always free requests. The
    /// socket keeps being read: backpressure would hold back the very Tflush that frees one.
    pub max_inflight: usize,
    /// Connections accepted by `serve_unix`/`serve_tcp` being served at once (all listeners of
    /// this server together); more are answered with one `Rerror` and closed.
    pub max_conns: usize,
    /// Connections at once from one peer: one uid (SO_PEERCRED) on unix sockets, one IP
    /// address on TCP.
    pub max_conns_per_peer: usize,
    /// A connection that has not completed a Tattach this long after it was accepted is
    /// closed (`None`: never).
    pub attach_timeout: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_fids: 16_384,
            max_afids: 16,
            max_inflight: MAX_INFLIGHT,
            max_conns: 512,
            max_conns_per_peer: 64,
            attach_timeout: Some(Duration::from_secs(10)),
        }
    }
}

impl Limits {
    /// Bounds for a server with one trusted link (toolsrv's socketpair to olliesrv): that link
    /// carries the fids and blocked requests of every olliesrv client of the session, so its
    /// fid and request caps are larger, and it has no attach deadline.
    pub fn link() -> Limits {
        Limits {
            max_fids: 65_536,
            max_afids: 64,
            max_inflight: 16_384,
            max_conns: 4,
            max_conns_per_peer: 4,
            attach_timeout: None,
        }
    }
}

/// The credentials of the process at the other end of a unix socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
}

/// What the server knows about one connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Unique per server process.
    pub id: u64,
    /// SO_PEERCRED of a unix-socket peer; `None` for TCP and other streams.
    pub peer: Option<PeerCred>,
    /// How the peer reached us: `unix`, `tcp` or `stream`.
    pub transport: &'static str,
    /// The peer's address, for logs.
    pub remote: String,
}

/// What a walk found: the qids of the names walked, and the new fid's state when every name
/// was walked.
#[derive(Debug)]
pub struct Walked<T> {
    pub qids: Vec<Qid>,
    pub fid: Option<T>,
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A 9P file tree. Every method gets the fid's state exclusively: requests on one fid never
/// overlap. Futures may be dropped at any await point (Tflush, disconnect), so keep them
/// cancel-safe.
pub trait Filesystem: Send + Sync + 'static {
    /// Per-fid state.
    type Fid: Send + 'static;

    /// Tauth: start an authentication exchange on a new fid. The default refuses, which tells
    /// plan9port-style clients to attach with NOFID.
    fn auth(
        &self,
        _conn: &ConnInfo,
        _uname: &str,
        _aname: &str,
    ) -> impl Future<Output = Result<(Self::Fid, Qid)>> + Send {
        async { Err(Error::new("authentication not required")) }
    }

    /// Tattach: the root of the tree for this user. `auth` is the afid's state, if one was given.
    fn attach(
        &self,
        conn: &ConnInfo,
        auth: Option<&mut Self::Fid>,
        uname: &str,
        aname: &str,
    ) -> impl Future<Output = Result<(Self::Fid, Qid)>> + Send;

    /// Twalk from `fid` (never open) through `names` (0 to 16; `..` arrives verbatim). With no
    /// names, return a clone. A walk that fails at the first name returns `Err`; one that fails
    /// later returns the qids walked and no fid.
    fn walk(
        &self,
        fid: &Self::Fid,
        names: &[String],
    ) -> impl Future<Output = Result<Walked<Self::Fid>>> + Send;

    /// Topen. Returns the qid and an iounit (0 means msize − 24).
    fn open(
        &self,
        fid: &mut Self::Fid,
        mode: u8,
    ) -> impl Future<Output = Result<(Qid, u32)>> + Send;

    /// Tcreate in the directory `fid`; on success `fid` is the new file, opened with `mode`.
    fn create(
        &self,
        _fid: &mut Self::Fid,
        _name: &str,
        _perm: u32,
        _mode: u8,
    ) -> impl Future<Output = Result<(Qid, u32)>> + Send {
        async { Err(Error::new("permission denied: cannot create files here")) }
    }

    /// Tread on an open fid. At most `count` bytes are sent back.
    fn read(
        &self,
        fid: &mut Self::Fid,
        offset: u64,
        count: u32,
    ) -> impl Future<Output = Result<Bytes>> + Send;

    /// Twrite on an open fid. Returns how many bytes were taken (0 for a non-empty write is
    /// turned into an error, since plan9port clients would retry forever).
    fn write(
        &self,
        fid: &mut Self::Fid,
        offset: u64,
        data: Bytes,
    ) -> impl Future<Output = Result<u32>> + Send;

    /// Tclunk (and connection teardown): the fid is gone. The fid is released whatever this
    /// returns; an error reaches the client as the Rclunk's Rerror when nothing else was
    /// queued on the fid (the reply then follows the clunk's effect), and is dropped otherwise
    /// (the reply went at once, see [`Filesystem`]'s clunk rule in the server loop) and at
    /// teardown.
    fn clunk(&self, _fid: Self::Fid) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// Tremove: remove the file; the fid is gone whether or not this succeeds.
    fn remove(&self, _fid: Self::Fid) -> impl Future<Output = Result<()>> + Send {
        async { Err(Error::new("permission denied: cannot remove this file")) }
    }

    /// Tstat.
    fn stat(&self, fid: &mut Self::Fid) -> impl Future<Output = Result<Stat>> + Send;

    /// Twstat with at least one field to change (the all-"don't touch" stat is answered by the
    /// core). `length = 0` with everything else untouched is what `echo x > file` sends first.
    fn wstat(&self, _fid: &mut Self::Fid, _stat: &Stat) -> impl Future<Output = Result<()>> + Send {
        async {
            Err(Error::new(
                "permission denied: cannot change file attributes",
            ))
        }
    }
}

/// One fid's state as the core tracks it.
struct Entry<T> {
    fs: T,
    qid: Qid,
    /// The mode it was opened with, if it is open.
    open: Option<u8>,
}

/// A fid table slot. Its lock orders the requests on that fid. `None` means the fid is being
/// created or has died.
type Slot<T> = Arc<Mutex<Option<Entry<T>>>>;
/// A new fid's slot, already locked by the request creating it.
type NewSlot<T> = (SlotGuard<T>, Slot<T>);
/// The fid a request creates, so it can be dropped if the request fails or is flushed.
type Created<T> = Option<(u32, Slot<T>)>;
/// A resolved request and the fid it creates.
type Resolved<T> = (Op<T>, Created<T>);
/// A slot's lock, held.
type SlotGuard<T> = OwnedMutexGuard<Option<Entry<T>>>;

/// A request ready to run, with the slots it needs already resolved at arrival.
enum Op<T> {
    Auth {
        guard: SlotGuard<T>,
        uname: String,
        aname: String,
    },
    Attach {
        guard: SlotGuard<T>,
        afid: Option<Slot<T>>,
        uname: String,
        aname: String,
    },
    Walk {
        src: Slot<T>,
        /// The new fid's slot, locked; `None` when newfid == fid.
        new: Option<SlotGuard<T>>,
        wnames: Vec<String>,
    },
    Open {
        slot: Slot<T>,
        mode: u8,
    },
    Create {
        slot: Slot<T>,
        name: String,
        perm: u32,
        mode: u8,
    },
    Read {
        slot: Slot<T>,
        offset: u64,
        count: u32,
    },
    Write {
        slot: Slot<T>,
        offset: u64,
        data: Bytes,
    },
    Remove {
        slot: Slot<T>,
    },
    /// A Tclunk of a fid no other request holds: replied once the filesystem has clunked it.
    Clunk {
        slot: Slot<T>,
    },
    Stat {
        slot: Slot<T>,
    },
    Wstat {
        slot: Slot<T>,
        stat: Stat,
    },
}

/// The outcome of a request: the reply, and whether a fid it created came to life.
struct Outcome {
    reply: Rmsg,
    created: bool,
}

impl Outcome {
    fn ok(reply: Rmsg) -> Outcome {
        Outcome {
            reply,
            created: true,
        }
    }
    fn err(e: Error) -> Outcome {
        Outcome {
            reply: Rmsg::Error { ename: e.message() },
            created: false,
        }
    }
}

fn unknown_fid() -> Error {
    Error::new("unknown fid")
}

fn can_read(mode: u8) -> bool {
    matches!(mode & 3, om::OREAD | om::ORDWR | om::OEXEC)
}

fn can_write(mode: u8) -> bool {
    matches!(mode & 3, om::OWRITE | om::ORDWR)
}

/// What every request of one connection needs, shared by one `Arc`.
struct ConnCtx<F> {
    fs: Arc<F>,
    info: ConnInfo,
}

async fn run_op<F: Filesystem>(ctx: Arc<ConnCtx<F>>, msize: u32, op: Op<F::Fid>) -> Outcome {
    match exec(&*ctx.fs, &ctx.info, msize, op).await {
        Ok(o) => o,
        Err(e) => Outcome::err(e),
    }
}

async fn exec<F: Filesystem>(
    fs: &F,
    conn: &ConnInfo,
    msize: u32,
    op: Op<F::Fid>,
) -> Result<Outcome> {
    let iounit = msize - IOHDRSZ;
    match op {
        Op::Auth {
            mut guard,
            uname,
            aname,
        } => {
            let (st, mut aqid) = fs.auth(conn, &uname, &aname).await?;
            aqid.ty |= qt::AUTH;
            *guard = Some(Entry {
                fs: st,
                qid: aqid,
                open: Some(om::ORDWR),
            });
            Ok(Outcome::ok(Rmsg::Auth { aqid }))
        }
        Op::Attach {
            guard,
            afid,
            uname,
            aname,
        } => attach(fs, conn, guard, afid, &uname, &aname).await,
        Op::Walk { src, new, wnames } => walk(fs, src, new, wnames).await,
        Op::Open { slot, mode } => {
            let mut g = slot.lock().await;
            let e = g.as_mut().ok_or_else(unknown_fid)?;
            if e.open.is_some() {
                return Err(Error::new("fid is already open (in use)"));
            }
            if e.qid.is_dir() && (can_write(mode) || mode & om::OTRUNC != 0) {
                return Err(Error::is_dir());
            }
            let (qid, unit) = fs.open(&mut e.fs, mode).await?;
            e.qid = qid;
            e.open = Some(mode);
            Ok(Outcome::ok(Rmsg::Open {
                qid,
                iounit: if unit == 0 { iounit } else { unit.min(iounit) },
            }))
        }
        Op::Create {
            slot,
            name,
            perm,
            mode,
        } => create(fs, iounit, slot, &name, perm, mode).await,
        Op::Read {
            slot,
            offset,
            count,
        } => {
            let mut g = slot.lock().await;
            let e = g.as_mut().ok_or_else(unknown_fid)?;
            match e.open {
                Some(m) if can_read(m) => {}
                Some(_) => return Err(Error::new("permission denied: fid not open for reading")),
                None => return Err(Error::new("fid not open (invalid argument)")),
            }
            let count = count.min(iounit);
            let mut data = fs.read(&mut e.fs, offset, count).await?;
            data.truncate(count as usize);
            Ok(Outcome::ok(Rmsg::Read { data }))
        }
        Op::Write { slot, offset, data } => {
            let mut g = slot.lock().await;
            let e = g.as_mut().ok_or_else(unknown_fid)?;
            match e.open {
                Some(m) if can_write(m) => {}
                Some(_) => return Err(Error::new("permission denied: fid not open for writing")),
                None => return Err(Error::new("fid not open (invalid argument)")),
            }
            if e.qid.is_dir() {
                return Err(Error::is_dir());
            }
            let len = data.len();
            let n = fs.write(&mut e.fs, offset, data).await?;
            if n == 0 && len > 0 {
                return Err(Error::new("write accepted no bytes (invalid argument)"));
            }
            Ok(Outcome::ok(Rmsg::Write {
                count: n.min(len as u32),
            }))
        }
        Op::Remove { slot } => {
            let e = slot.lock().await.take().ok_or_else(unknown_fid)?;
            fs.remove(e.fs).await?;
            Ok(Outcome::ok(Rmsg::Remove))
        }
        Op::Clunk { slot } => {
            retire_slot(fs, slot).await?;
            Ok(Outcome::ok(Rmsg::Clunk))
        }
        Op::Stat { slot } => {
            let mut g = slot.lock().await;
            let e = g.as_mut().ok_or_else(unknown_fid)?;
            let stat = fs.stat(&mut e.fs).await?;
            if stat.encoded_len() + HEADER_LEN + 2 > msize as usize {
                return Err(Error::new("stat does not fit msize"));
            }
            Ok(Outcome::ok(Rmsg::Stat { stat }))
        }
        Op::Wstat { slot, stat } => {
            let mut g = slot.lock().await;
            let e = g.as_mut().ok_or_else(unknown_fid)?;
            if !stat.is_dont_touch() {
                fs.wstat(&mut e.fs, &stat).await?;
            }
            Ok(Outcome::ok(Rmsg::Wstat))
        }
    }
}

/// Tattach: a new fid for the filesystem's root, authenticated by `afid` if given.
async fn attach<F: Filesystem>(
    fs: &F,
    conn: &ConnInfo,
    mut guard: SlotGuard<F::Fid>,
    afid: Option<Slot<F::Fid>>,
    uname: &str,
    aname: &str,
) -> Result<Outcome> {
    let (st, qid) = match afid {
        None => fs.attach(conn, None, uname, aname).await?,
        Some(slot) => {
            let mut a = slot.lock().await;
            let a = a.as_mut().ok_or_else(|| Error::new("unknown afid"))?;
            if a.qid.ty & qt::AUTH == 0 {
                return Err(Error::new("afid is not an authentication fid"));
            }
            fs.attach(conn, Some(&mut a.fs), uname, aname).await?
        }
    };
    *guard = Some(Entry {
        fs: st,
        qid,
        open: None,
    });
    Ok(Outcome::ok(Rmsg::Attach { qid }))
}

/// Twalk: from an unopened directory fid to `new` (or in place when `new` is `None`).
async fn walk<F: Filesystem>(
    fs: &F,
    src: Slot<F::Fid>,
    new: Option<SlotGuard<F::Fid>>,
    wnames: Vec<String>,
) -> Result<Outcome> {
    let mut g = src.lock().await;
    let e = g.as_mut().ok_or_else(unknown_fid)?;
    if e.open.is_some() {
        return Err(Error::new("cannot walk an open fid (in use)"));
    }
    if e.qid.ty & qt::AUTH != 0 {
        return Err(Error::new("cannot walk an authentication fid"));
    }
    if !wnames.is_empty() && !e.qid.is_dir() {
        return Err(Error::not_dir());
    }
    let walked = fs.walk(&e.fs, &wnames).await?;
    let mut qids = walked.qids;
    qids.truncate(wnames.len());
    if qids.is_empty() && !wnames.is_empty() {
        return Err(Error::not_found());
    }
    match walked.fid {
        Some(st) if qids.len() == wnames.len() => {
            let qid = qids.last().copied().unwrap_or(e.qid);
            let entry = Entry {
                fs: st,
                qid,
                open: None,
            };
            match new {
                Some(mut ng) => *ng = Some(entry),
                None => {
                    let old = std::mem::replace(e, entry);
                    let _ = fs.clunk(old.fs).await;
                }
            }
            Ok(Outcome::ok(Rmsg::Walk { wqids: qids }))
        }
        _ => {
            if qids.len() == wnames.len() {
                // A full walk must yield a fid; a filesystem that forgot one failed.
                return Err(Error::not_found());
            }
            // Partial walk: a successful Rwalk, but newfid is not created.
            Ok(Outcome {
                reply: Rmsg::Walk { wqids: qids },
                created: false,
            })
        }
    }
}

/// Tcreate: `name` in the directory fid `slot`, which then stands for the opened file.
async fn create<F: Filesystem>(
    fs: &F,
    iounit: u32,
    slot: Slot<F::Fid>,
    name: &str,
    perm: u32,
    mode: u8,
) -> Result<Outcome> {
    let mut g = slot.lock().await;
    let e = g.as_mut().ok_or_else(unknown_fid)?;
    if e.open.is_some() {
        return Err(Error::new("fid is already open (in use)"));
    }
    if !e.qid.is_dir() {
        return Err(Error::not_dir());
    }
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(Error::invalid(format!("bad file name {name:?}")));
    }
    let (qid, unit) = fs.create(&mut e.fs, name, perm, mode).await?;
    e.qid = qid;
    e.open = Some(mode);
    Ok(Outcome::ok(Rmsg::Create {
        qid,
        iounit: if unit == 0 { iounit } else { unit.min(iounit) },
    }))
}

/// Hashes the small integer keys of the fid and tag tables (chosen by the peer, who can only
/// slow down its own connection) with one multiply instead of SipHash.
#[derive(Default, Clone, Copy)]
struct SmallIntHash;

impl std::hash::BuildHasher for SmallIntHash {
    type Hasher = SmallIntHasher;
    fn build_hasher(&self) -> SmallIntHasher {
        SmallIntHasher(0)
    }
}

struct SmallIntHasher(u64);

impl std::hash::Hasher for SmallIntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u16(&mut self, v: u16) {
        self.0 = u64::from(v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A request running in its own task.
struct Inflight<T> {
    /// Distinguishes this request from a later one that reuses the tag.
    seq: u64,
    abort: Option<AbortHandle>,
    /// A fid this request creates: removed from the table if the request fails or is flushed.
    creates: Created<T>,
}

/// A finished task's reply, sent back to the connection loop.
struct Done {
    tag: u16,
    seq: u64,
    outcome: Outcome,
}

/// Serves 9P2000 to any number of connections from one [`Filesystem`].
pub struct Server<F: Filesystem> {
    fs: Arc<F>,
    max_msize: u32,
    limits: Limits,
    next_conn: AtomicU64,
    conns: Arc<ConnTable>,
}

impl<F: Filesystem> std::fmt::Debug for Server<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("max_msize", &self.max_msize)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Who a connection counts against for [`Limits::max_conns_per_peer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PeerKey {
    Uid(u32),
    /// A unix peer whose credentials could not be read: all such share one budget.
    UnknownUid,
    Ip(std::net::IpAddr),
}

impl std::fmt::Display for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerKey::Uid(u) => write!(f, "uid {u}"),
            PeerKey::UnknownUid => f.write_str("unix peers without credentials"),
            PeerKey::Ip(a) => write!(f, "{a}"),
        }
    }
}

/// The connections being served, in total and per peer.
#[derive(Debug, Default)]
struct ConnTable {
    inner: std::sync::Mutex<ConnCounts>,
}

#[derive(Debug, Default)]
struct ConnCounts {
    total: usize,
    per_peer: HashMap<PeerKey, usize>,
}

/// A connection's place in the [`ConnTable`], given back when dropped.
#[derive(Debug)]
struct Permit {
    table: Arc<ConnTable>,
    key: PeerKey,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut c = self
            .table
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_peer.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_peer.remove(&self.key);
            }
        }
    }
}

impl ConnTable {
    /// Counts one more connection from `key`, or says which cap it is over.
    fn admit(
        self: &Arc<Self>,
        key: PeerKey,
        limits: &Limits,
    ) -> std::result::Result<Permit, String> {
        let mut c = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if c.total >= limits.max_conns {
            return Err(format!(
                "too many connections to this server (limit {})",
                limits.max_conns
            ));
        }
        let mine = c.per_peer.get(&key).copied().unwrap_or(0);
        if mine >= limits.max_conns_per_peer {
            return Err(format!(
                "too many connections from {key} (limit {})",
                limits.max_conns_per_peer
            ));
        }
        c.total += 1;
        c.per_peer.insert(key, mine + 1);
        Ok(Permit {
            table: Arc::clone(self),
            key,
        })
    }
}

/// Lets a repeated log line through at most once per `every`, counting the ones held back.
#[derive(Debug)]
struct LogGate {
    every: Duration,
    state: std::sync::Mutex<(Option<Instant>, u64)>,
}

impl LogGate {
    fn new(every: Duration) -> LogGate {
        LogGate {
            every,
            state: std::sync::Mutex::new((None, 0)),
        }
    }

    /// `Some(held back since the last one)` when this occurrence may be logged.
    fn pass(&self) -> Option<u64> {
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        match s.0 {
            Some(t) if now.duration_since(t) < self.every => {
                s.1 += 1;
                None
            }
            _ => {
                let held = s.1;
                *s = (Some(now), 0);
                Some(held)
            }
        }
    }
}

/// Asks the kernel for a unix socket send buffer of `max_msize` (it doubles the figure for its
/// bookkeeping and caps it at `net.core.wmem_max`). The default, about 208 KiB, is smaller than
/// one large Rread: a server that has answered one read and has the next ready (a client's
/// read ahead) then waits for the reader to take most of the first out of the socket, so the
/// two sides take turns instead of working at once. With room for a whole reply, `o mount`'s
/// `cat` of a large file runs about 10 % faster (docs/benchmarks.md). TCP sockets size their
/// buffers themselves and are left alone. The buffer is a bound, not an allocation: only
/// replies a client has not read yet take memory, so a client that stops reading holds up to
/// twice `max_msize` in the kernel besides the unsent replies the connection keeps before it
/// stops reading requests ([`OUT_HIGH_WATER`]).
fn widen_send_buffer(sock: &impl std::os::fd::AsFd, max_msize: u32) {
    let want = usize::try_from(max_msize).unwrap_or(usize::MAX);
    if let Err(e) = nix::sys::socket::setsockopt(sock, nix::sys::socket::sockopt::SndBuf, &want) {
        tracing::debug!("could not widen a connection's send buffer: {e}");
    }
}

/// An accepted stream, either kind.
enum Accepted {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream, std::net::SocketAddr),
}

/// What `serve_unix` and `serve_tcp` accept from.
trait Listener: Send + Sync {
    fn accept_one(&self) -> impl Future<Output = std::io::Result<Accepted>> + Send;
}

impl Listener for tokio::net::UnixListener {
    async fn accept_one(&self) -> std::io::Result<Accepted> {
        self.accept().await.map(|(s, _)| Accepted::Unix(s))
    }
}

impl Listener for tokio::net::TcpListener {
    async fn accept_one(&self) -> std::io::Result<Accepted> {
        self.accept().await.map(|(s, a)| Accepted::Tcp(s, a))
    }
}

/// The first pause after a failed accept; it doubles up to [`ACCEPT_BACKOFF_MAX`] while accept
/// keeps failing.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Pending connections closed per round when out of file descriptors.
const SHED_BATCH: usize = 64;

/// Whether an accept error means this process or the system is out of file descriptors.
fn out_of_fds(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if code == nix::libc::EMFILE || code == nix::libc::ENFILE
    )
}

/// A descriptor held in reserve, closed to make room for accepting (and closing) a pending
/// connection when the process is out of descriptors.
fn reserve_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// `Rerror` with tag NOTAG, the answer a refused peer finds as the reply to its Tversion.
fn refusal_frame(why: &str) -> Vec<u8> {
    let mut b = BytesMut::new();
    match wire::encode_r(&mut b, wire::NOTAG, &Rmsg::error(why.to_owned())) {
        Ok(()) => b.to_vec(),
        Err(_) => Vec::new(),
    }
}

impl<F: Filesystem> Server<F> {
    /// A server for `fs` with the default maximum msize (1 MiB) and [`Limits::default`].
    pub fn new(fs: Arc<F>) -> Arc<Server<F>> {
        Server::with_limits(fs, DEFAULT_MAX_MSIZE, Limits::default())
    }

    /// A server with another maximum msize (clamped to at least [`MIN_MSIZE`]).
    pub fn with_max_msize(fs: Arc<F>, max_msize: u32) -> Arc<Server<F>> {
        Server::with_limits(fs, max_msize, Limits::default())
    }

    /// A server with a maximum msize (clamped to at least [`MIN_MSIZE`]) and these limits
    /// (each cap at least 1).
    pub fn with_limits(fs: Arc<F>, max_msize: u32, limits: Limits) -> Arc<Server<F>> {
        let limits = Limits {
            max_fids: limits.max_fids.max(1),
            max_afids: limits.max_afids.max(1),
            max_inflight: limits.max_inflight.max(1),
            max_conns: limits.max_conns.max(1),
            max_conns_per_peer: limits.max_conns_per_peer.max(1),
            attach_timeout: limits.attach_timeout,
        };
        Arc::new(Server {
            fs,
            max_msize: max_msize.max(MIN_MSIZE),
            limits,
            next_conn: AtomicU64::new(1),
            conns: Arc::new(ConnTable::default()),
        })
    }

    /// The filesystem being served.
    pub fn fs(&self) -> &Arc<F> {
        &self.fs
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A fresh connection id.
    pub fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// Accepts unix-socket connections until `shutdown` completes; then gives open connections
    /// up to `grace` to end by themselves and drops the rest. Each peer uid may have
    /// [`Limits::max_conns_per_peer`] connections.
    pub async fn serve_unix(
        self: &Arc<Self>,
        listener: tokio::net::UnixListener,
        shutdown: impl Future<Output = ()>,
        grace: std::time::Duration,
    ) -> std::io::Result<()> {
        self.serve_listener(listener, shutdown, grace).await
    }

    /// Accepts TCP connections until `shutdown` completes (then as [`Server::serve_unix`]).
    /// Authentication is the filesystem's business (its `auth`/`attach`); `ConnInfo::peer` is
    /// `None` here. Each peer IP address may have [`Limits::max_conns_per_peer`] connections.
    pub async fn serve_tcp(
        self: &Arc<Self>,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()>,
        grace: std::time::Duration,
    ) -> std::io::Result<()> {
        self.serve_listener(listener, shutdown, grace).await
    }

    async fn serve_listener<L: Listener>(
        self: &Arc<Self>,
        listener: L,
        shutdown: impl Future<Output = ()>,
        grace: std::time::Duration,
    ) -> std::io::Result<()> {
        let mut conns = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        let mut reserve = reserve_fd();
        let mut backoff = Duration::ZERO;
        let pause = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(pause);
        let mut paused = false;
        let accept_gate = LogGate::new(Duration::from_secs(5));
        let refuse_gate = LogGate::new(Duration::from_secs(1));
        loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                () = &mut pause, if paused => paused = false,
                r = listener.accept_one(), if !paused => match r {
                    Ok(a) => {
                        backoff = Duration::ZERO;
                        self.admit(a, &mut conns, &refuse_gate);
                    }
                    Err(e) => {
                        // Never retry at once: the error (EMFILE above all) would repeat as
                        // fast as we can log it.
                        backoff = (backoff * 2).clamp(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX);
                        let shed = if out_of_fds(&e) {
                            drop(reserve.take());
                            let n = shed_pending(&listener).await;
                            reserve = reserve_fd();
                            n
                        } else {
                            0
                        };
                        if let Some(held) = accept_gate.pass() {
                            tracing::warn!(
                                error = %e,
                                shed,
                                pause_ms = backoff.as_millis() as u64,
                                suppressed = held,
                                "accept failed; pausing the listener"
                            );
                        }
                        pause.as_mut().reset(tokio::time::Instant::now() + backoff);
                        paused = true;
                    }
                },
            }
        }
        drain(conns, grace).await;
        Ok(())
    }

    /// Serves an accepted connection if it is within the connection caps; otherwise answers
    /// it with one `Rerror` and closes it.
    fn admit(
        self: &Arc<Self>,
        a: Accepted,
        conns: &mut tokio::task::JoinSet<()>,
        refuse_gate: &LogGate,
    ) {
        let (key, peer, transport, remote) = match &a {
            Accepted::Unix(s) => {
                let peer = s.peer_cred().ok().map(|c| PeerCred {
                    uid: c.uid(),
                    gid: c.gid(),
                    pid: c.pid(),
                });
                let key = peer.map_or(PeerKey::UnknownUid, |p| PeerKey::Uid(p.uid));
                let remote = peer.map_or_else(
                    || "unix".into(),
                    |p| format!("unix:pid={}", p.pid.unwrap_or(-1)),
                );
                (key, peer, "unix", remote)
            }
            Accepted::Tcp(_, addr) => {
                let ip = match addr.ip() {
                    std::net::IpAddr::V6(v6) => v6
                        .to_ipv4_mapped()
                        .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
                    v4 => v4,
                };
                (PeerKey::Ip(ip), None, "tcp", addr.to_string())
            }
        };
        let permit = match self.conns.admit(key, &self.limits) {
            Ok(p) => p,
            Err(why) => {
                // Best effort and never blocking: a fresh socket's buffer takes one small
                // frame.
                let frame = refusal_frame(&why);
                let _ = match &a {
                    Accepted::Unix(s) => s.try_write(&frame),
                    Accepted::Tcp(s, _) => s.try_write(&frame),
                };
                if let Some(held) = refuse_gate.pass() {
                    tracing::warn!(remote = %remote, suppressed = held, "refused a connection: {why}");
                }
                return;
            }
        };
        let info = ConnInfo {
            id: self.next_conn_id(),
            peer,
            transport,
            remote,
        };
        let srv = Arc::clone(self);
        match a {
            Accepted::Unix(s) => {
                widen_send_buffer(&s, self.max_msize);
                let (r, w) = s.into_split();
                conns.spawn(async move {
                    let _permit = permit;
                    srv.serve_conn(r, w, info).await;
                });
            }
            Accepted::Tcp(s, _) => {
                let _ = s.set_nodelay(true);
                let (r, w) = s.into_split();
                conns.spawn(async move {
                    let _permit = permit;
                    srv.serve_conn(r, w, info).await;
                });
            }
        }
    }

    /// Serves one already-connected unix socket, such as one end of a socketpair inherited as a
    /// file descriptor (`UnixStream::from(OwnedFd)`). Returns when the connection ends.
    pub async fn serve_unix_stream(
        self: &Arc<Self>,
        stream: std::os::unix::net::UnixStream,
    ) -> std::io::Result<()> {
        stream.set_nonblocking(true)?;
        widen_send_buffer(&stream, self.max_msize);
        let stream = tokio::net::UnixStream::from_std(stream)?;
        let peer = stream.peer_cred().ok().map(|c| PeerCred {
            uid: c.uid(),
            gid: c.gid(),
            pid: c.pid(),
        });
        let info = ConnInfo {
            id: self.next_conn_id(),
            peer,
            transport: "unix",
            remote: "inherited".into(),
        };
        let (r, w) = stream.into_split();
        self.serve_conn(r, w, info).await;
        Ok(())
    }

    /// Serves one connection until the peer closes it, it breaks the framing, it does not
    /// attach within [`Limits::attach_timeout`], or the returned future is dropped. In every
    /// case all its requests are cancelled and its fids clunked.
    pub async fn serve_conn<R, W>(self: &Arc<Self>, reader: R, writer: W, info: ConnInfo)
    where
        R: AsyncRead + Unpin + Send,
        W: AsyncWrite + Unpin + Send,
    {
        let span = tracing::debug_span!("9p-conn", id = info.id, remote = %info.remote);
        let _g = span.enter();
        let (tx, rx) = mpsc::channel(256);
        let mut conn = Conn {
            srv: Arc::clone(self),
            ctx: Arc::new(ConnCtx {
                fs: Arc::clone(&self.fs),
                info,
            }),
            msize: 0,
            fids: HashMap::default(),
            afids: HashSet::default(),
            inflight: HashMap::default(),
            seq: 0,
            tx,
            out: Out::default(),
            closing: false,
            attached: false,
        };
        if let Err(e) = conn.run(reader, writer, rx).await {
            tracing::debug!(error = %e, "connection ended");
        }
    }
}

/// Out of file descriptors, with one freed: accepts and closes up to [`SHED_BATCH`] pending
/// connections (each closed before the next is accepted, so one descriptor serves all).
async fn shed_pending<L: Listener>(listener: &L) -> usize {
    let mut n = 0;
    while n < SHED_BATCH {
        match tokio::time::timeout(Duration::from_millis(20), listener.accept_one()).await {
            Ok(Ok(a)) => {
                drop(a);
                n += 1;
            }
            _ => break,
        }
    }
    n
}

/// Clunks a slot's state once every request queued on it is done (removing the file if it was
/// opened with ORCLOSE; a failed remove is not reported, as with Tclunk).
async fn retire_slot<F: Filesystem>(fs: &F, slot: Slot<F::Fid>) -> Result<()> {
    let e = slot.lock().await.take();
    if let Some(e) = e {
        if e.open.is_some_and(|m| m & om::ORCLOSE != 0) {
            let _ = fs.remove(e.fs).await;
        } else {
            return fs.clunk(e.fs).await;
        }
    }
    Ok(())
}

/// After the listener stops: lets connections finish on their own for up to `grace` (so replies
/// already due, such as a final event, reach their clients), then drops the rest.
async fn drain(mut conns: tokio::task::JoinSet<()>, grace: std::time::Duration) {
    let all_done = async { while conns.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(grace, all_done).await;
    conns.shutdown().await;
}

/// Queued reply bytes, sent with `writev`.
#[derive(Default)]
struct Out {
    chunks: VecDeque<Bytes>,
    len: usize,
    scratch: BytesMut,
}

impl Out {
    /// Queues a reply. An Rerror longer than `msize` allows is cut to fit.
    fn push_reply(&mut self, tag: u16, m: &Rmsg, msize: u32) {
        let cut;
        let m = match m {
            // size[4] type[1] tag[2] len[2] = 9 bytes around the message.
            Rmsg::Error { ename } if ename.len() + 9 > msize as usize => {
                let mut end = (msize as usize).saturating_sub(9);
                while !ename.is_char_boundary(end) {
                    end -= 1;
                }
                cut = Rmsg::Error {
                    ename: ename[..end].to_owned(),
                };
                &cut
            }
            other => other,
        };
        let r = wire::encode_r_parts(&mut self.scratch, tag, m);
        let payload = match r {
            Ok(p) => p,
            Err(e) => {
                // Only oversized strings can fail here; answer with a short error instead.
                tracing::warn!(error = %e, "reply could not be encoded");
                self.scratch.clear();
                let fallback = Rmsg::error(format!("reply could not be encoded: {e}"));
                match wire::encode_r_parts(&mut self.scratch, tag, &fallback) {
                    Ok(p) => p,
                    Err(_) => return,
                }
            }
        };
        match payload {
            // Small payloads are copied next to their header; large ones go out as their own
            // iovec, straight from the filesystem's buffer.
            Some(p) if p.len() >= 4096 => {
                let h = self.scratch.split().freeze();
                self.len += h.len() + p.len();
                self.chunks.push_back(h);
                self.chunks.push_back(p);
            }
            Some(p) => {
                self.scratch.extend_from_slice(&p);
                let h = self.scratch.split().freeze();
                self.len += h.len();
                self.chunks.push_back(h);
            }
            None => {
                let h = self.scratch.split().freeze();
                self.len += h.len();
                self.chunks.push_back(h);
            }
        }
        if self.scratch.capacity() < 256 {
            self.scratch.reserve(8 * 1024);
        }
    }

    fn advance(&mut self, mut n: usize) {
        self.len -= n;
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                return;
            };
            if n >= front.len() {
                n -= front.len();
                self.chunks.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
}

async fn write_some<W: AsyncWrite + Unpin>(w: &mut W, out: &Out) -> std::io::Result<usize> {
    let mut slices = [IoSlice::new(&[]); 64];
    let mut k = 0;
    for c in out.chunks.iter().take(64) {
        slices[k] = IoSlice::new(c);
        k += 1;
    }
    w.write_vectored(&slices[..k]).await
}

struct Conn<F: Filesystem> {
    srv: Arc<Server<F>>,
    ctx: Arc<ConnCtx<F>>,
    /// 0 until Tversion succeeds.
    msize: u32,
    fids: HashMap<u32, Slot<F::Fid>, SmallIntHash>,
    /// The fids in `fids` that were created by Tauth.
    afids: HashSet<u32, SmallIntHash>,
    inflight: HashMap<u16, Inflight<F::Fid>, SmallIntHash>,
    seq: u64,
    tx: mpsc::Sender<Done>,
    out: Out,
    /// Set after a framing error: send what is queued, then close.
    closing: bool,
    /// Whether a Tattach has succeeded on this connection (ends the attach deadline).
    attached: bool,
}

impl<F: Filesystem> Drop for Conn<F> {
    fn drop(&mut self) {
        self.reset();
    }
}

impl<F: Filesystem> Conn<F> {
    async fn run<R, W>(
        &mut self,
        mut reader: R,
        mut writer: W,
        mut rx: mpsc::Receiver<Done>,
    ) -> std::io::Result<()>
    where
        R: AsyncRead + Unpin + Send,
        W: AsyncWrite + Unpin + Send,
    {
        let mut rbuf = BytesMut::with_capacity(8 * 1024);
        let timeout = self.srv.limits.attach_timeout;
        let deadline = tokio::time::sleep(timeout.unwrap_or(Duration::ZERO));
        tokio::pin!(deadline);
        loop {
            // Take every complete frame out of the buffer.
            while !self.closing {
                match self.next_frame(&mut rbuf) {
                    Ok(Some(frame)) => self.dispatch(frame),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "framing error; closing connection");
                        self.closing = true;
                    }
                }
            }
            if self.closing && self.out.len == 0 {
                let _ = writer.shutdown().await;
                return Ok(());
            }
            let want_read = !self.closing && self.out.len < OUT_HIGH_WATER;
            if want_read && rbuf.capacity() - rbuf.len() < 4096 {
                rbuf.reserve(32 * 1024);
            }
            tokio::select! {
                biased;
                () = &mut deadline, if timeout.is_some() && !self.attached => {
                    tracing::debug!("no Tattach within the attach timeout; closing connection");
                    return Ok(());
                }
                // Only tasks of in-flight requests send here; a reply that raced a flush waits
                // harmlessly and is dropped by its sequence number later.
                Some(done) = rx.recv(), if !self.inflight.is_empty() => self.finish(done),
                r = write_some(&mut writer, &self.out), if self.out.len > 0 => {
                    let n = r?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::WriteZero.into());
                    }
                    self.out.advance(n);
                }
                r = reader.read_buf(&mut rbuf), if want_read => {
                    if r? == 0 {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Splits one whole frame off the front of `rbuf`, or says more bytes are needed.
    fn next_frame(
        &mut self,
        rbuf: &mut BytesMut,
    ) -> std::result::Result<Option<Bytes>, DecodeError> {
        if rbuf.len() < 4 {
            return Ok(None);
        }
        let size = u32::from_le_bytes([rbuf[0], rbuf[1], rbuf[2], rbuf[3]]) as usize;
        let max = if self.msize == 0 {
            self.srv.max_msize
        } else {
            self.msize
        } as usize;
        if size < HEADER_LEN {
            return Err(DecodeError::Short {
                need: HEADER_LEN - size,
            });
        }
        if size > max {
            // Tell the client why, if we can see its tag, before closing.
            if rbuf.len() >= HEADER_LEN {
                let tag = u16::from_le_bytes([rbuf[5], rbuf[6]]);
                self.reply(
                    tag,
                    &Rmsg::error(format!("message of {size} bytes exceeds msize {max}")),
                );
            }
            return Err(DecodeError::TooLarge { size, max });
        }
        if rbuf.len() < size {
            rbuf.reserve(size - rbuf.len());
            return Ok(None);
        }
        Ok(Some(rbuf.split_to(size).freeze()))
    }

    fn reply(&mut self, tag: u16, m: &Rmsg) {
        let msize = if self.msize == 0 {
            MIN_MSIZE
        } else {
            self.msize
        };
        self.out.push_reply(tag, m, msize);
    }

    fn dispatch(&mut self, frame: Bytes) {
        let Ok(h) = wire::decode_header(&frame) else {
            return;
        };
        let (tag, msg) = match wire::decode_t(frame) {
            Ok(x) => x,
            Err(e) => {
                self.reply(h.tag, &Rmsg::error(format!("malformed message: {e}")));
                return;
            }
        };
        tracing::trace!(tag, msg = msg.name(), "request");
        if let Tmsg::Version { msize, version } = msg {
            self.version(tag, msize, &version);
            return;
        }
        if self.msize == 0 {
            self.reply(
                tag,
                &Rmsg::error("version not negotiated: send Tversion first"),
            );
            return;
        }
        if let Tmsg::Flush { oldtag } = msg {
            if let Some(f) = self.inflight.remove(&oldtag) {
                if let Some(a) = f.abort {
                    a.abort();
                }
                if let Some((fid, slot)) = f.creates {
                    self.forget_created(fid, &slot);
                }
            }
            self.reply(tag, &Rmsg::Flush);
            return;
        }
        if self.inflight.contains_key(&tag) {
            self.reply(tag, &Rmsg::error("tag in use by an outstanding request"));
            return;
        }
        if let Tmsg::Clunk { fid } = msg {
            // The fid is gone now: its number may be reused at once. With requests still
            // queued on it, the reply does not wait for them (a parked read would otherwise
            // hold it forever); the filesystem sees the clunk after them, in order. Without,
            // the clunk runs as a request, so its reply follows its effect (a prompt written
            // on the fid is queued) and carries its error.
            match self.take_fid(fid) {
                Some(slot) if Arc::strong_count(&slot) == 1 => {
                    self.start(tag, Op::Clunk { slot }, None);
                }
                Some(slot) => {
                    self.retire(slot);
                    self.reply(tag, &Rmsg::Clunk);
                }
                None => self.reply(
                    tag,
                    &Rmsg::Error {
                        ename: unknown_fid().message(),
                    },
                ),
            }
            return;
        }
        if self.inflight.len() >= self.srv.limits.max_inflight {
            self.reply(
                tag,
                &Rmsg::error(format!(
                    "too many outstanding requests on this connection (limit {}; in use)",
                    self.srv.limits.max_inflight
                )),
            );
            return;
        }
        let (op, creates) = match self.resolve(msg) {
            Ok(x) => x,
            Err(e) => {
                self.reply(tag, &Rmsg::Error { ename: e.message() });
                return;
            }
        };
        self.start(tag, op, creates);
    }

    /// Runs a request: polled once inline, else as a task whose reply comes back through the
    /// channel. A clunk's task is not aborted by Tflush (its effect happens; only the reply
    /// is dropped), so a flushed clunk still clunks.
    fn start(&mut self, tag: u16, op: Op<F::Fid>, creates: Created<F::Fid>) {
        let abortable = !matches!(op, Op::Clunk { .. });
        let mut fut: BoxFuture<'static, Outcome> =
            Box::pin(run_op(Arc::clone(&self.ctx), self.msize, op));
        // First poll inline, in arrival order: this takes the fid lock's place in line, and most
        // requests finish right here without a task or a channel hop.
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(outcome) = fut.as_mut().poll(&mut cx) {
            self.complete(tag, outcome, creates);
            return;
        }
        self.seq += 1;
        let seq = self.seq;
        let tx = self.tx.clone();
        let handle = tokio::spawn(async move {
            let outcome = fut.await;
            let _ = tx.send(Done { tag, seq, outcome }).await;
        });
        self.inflight.insert(
            tag,
            Inflight {
                seq,
                abort: abortable.then(|| handle.abort_handle()),
                creates,
            },
        );
    }

    fn finish(&mut self, done: Done) {
        match self.inflight.get(&done.tag) {
            Some(f) if f.seq == done.seq => {}
            // Flushed (or the tag now belongs to a newer request): the reply is dropped.
            _ => return,
        }
        if let Some(f) = self.inflight.remove(&done.tag) {
            self.complete(done.tag, done.outcome, f.creates);
        }
    }

    fn complete(&mut self, tag: u16, outcome: Outcome, creates: Created<F::Fid>) {
        let Outcome { reply, created } = outcome;
        if !created && let Some((fid, slot)) = creates {
            self.forget_created(fid, &slot);
        }
        if matches!(reply, Rmsg::Attach { .. }) {
            self.attached = true;
        }
        self.reply(tag, &reply);
    }

    /// Drops a fid that a failed or flushed request was creating, if the table still holds it.
    fn forget_created(&mut self, fid: u32, slot: &Slot<F::Fid>) {
        if self.fids.get(&fid).is_some_and(|s| Arc::ptr_eq(s, slot))
            && let Some(s) = self.take_fid(fid)
        {
            self.retire(s);
        }
    }

    /// Removes a fid from the table (and from the afids), giving the table's memory back once
    /// it is mostly empty.
    fn take_fid(&mut self, fid: u32) -> Option<Slot<F::Fid>> {
        let s = self.fids.remove(&fid)?;
        self.afids.remove(&fid);
        let cap = self.fids.capacity();
        if cap > 1024 && self.fids.len() < cap / 4 {
            self.fids.shrink_to(self.fids.len() * 2);
        }
        Some(s)
    }

    /// Clunks a slot's state once every request queued on it is done (removing the file if it
    /// was opened with ORCLOSE; a failed remove is not reported, as with Tclunk).
    fn retire(&self, slot: Slot<F::Fid>) {
        // A slot nobody else holds (no request queued on it) that is empty (a failed Tauth or
        // walk) needs no task at all.
        if Arc::strong_count(&slot) == 1
            && let Ok(g) = slot.try_lock()
            && g.is_none()
        {
            return;
        }
        let fs = Arc::clone(&self.srv.fs);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = retire_slot(&*fs, slot).await;
            });
        }
    }

    /// Cancels every request and clunks every fid (Tversion, and connection teardown). The
    /// fids are clunked by one task, one after another, not a task each: a connection holding
    /// its full quota must not double its memory as it goes.
    fn reset(&mut self) {
        for (_, f) in self.inflight.drain() {
            if let Some(a) = f.abort {
                a.abort();
            }
        }
        self.inflight = HashMap::default();
        self.afids = HashSet::default();
        let fids: Vec<_> = std::mem::take(&mut self.fids).into_values().collect();
        if fids.is_empty() {
            return;
        }
        let fs = Arc::clone(&self.srv.fs);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for slot in fids {
                    let _ = retire_slot(&*fs, slot).await;
                }
            });
        }
    }

    fn version(&mut self, tag: u16, msize: u32, version: &str) {
        self.reset();
        self.msize = 0;
        if msize < MIN_MSIZE {
            self.reply(
                tag,
                &Rmsg::error(format!("msize {msize} is too small (at least {MIN_MSIZE})")),
            );
            return;
        }
        let base = version.split('.').next().unwrap_or("");
        if base != wire::VERSION {
            self.reply(
                tag,
                &Rmsg::Version {
                    msize: msize.min(self.srv.max_msize),
                    version: "unknown".into(),
                },
            );
            return;
        }
        self.msize = msize.min(self.srv.max_msize);
        self.reply(
            tag,
            &Rmsg::Version {
                msize: self.msize,
                version: wire::VERSION.into(),
            },
        );
    }

    fn slot(&self, fid: u32) -> Result<Slot<F::Fid>> {
        self.fids.get(&fid).cloned().ok_or_else(unknown_fid)
    }

    /// Creates a locked, empty slot for a new fid.
    fn new_slot(&mut self, fid: u32) -> Result<NewSlot<F::Fid>> {
        if fid == NOFID {
            return Err(Error::invalid("fid NOFID cannot be used"));
        }
        if self.fids.contains_key(&fid) {
            return Err(Error::new("fid already in use"));
        }
        let max = self.srv.limits.max_fids;
        if self.fids.len() >= max {
            return Err(Error::new(format!(
                "too many fids on this connection (limit {max}); clunk some"
            )));
        }
        let slot: Slot<F::Fid> = Arc::new(Mutex::new(None));
        let guard = Arc::clone(&slot)
            .try_lock_owned()
            .map_err(|_| Error::new("fid already in use"))?;
        self.fids.insert(fid, Arc::clone(&slot));
        Ok((guard, slot))
    }

    /// Turns a request into an [`Op`], resolving and (for clunk/remove) freeing fids now, in
    /// arrival order.
    fn resolve(&mut self, msg: Tmsg) -> Result<Resolved<F::Fid>> {
        Ok(match msg {
            Tmsg::Version { .. } | Tmsg::Flush { .. } => {
                return Err(Error::new("internal: unexpected message"));
            }
            Tmsg::Auth { afid, uname, aname } => return self.resolve_auth(afid, uname, aname),
            Tmsg::Attach {
                fid,
                afid,
                uname,
                aname,
            } => return self.resolve_attach(fid, afid, uname, aname),
            Tmsg::Walk {
                fid,
                newfid,
                wnames,
            } => return self.resolve_walk(fid, newfid, wnames),
            Tmsg::Open { fid, mode } => (
                Op::Open {
                    slot: self.slot(fid)?,
                    mode,
                },
                None,
            ),
            Tmsg::Create {
                fid,
                name,
                perm,
                mode,
            } => (
                Op::Create {
                    slot: self.slot(fid)?,
                    name,
                    perm,
                    mode,
                },
                None,
            ),
            Tmsg::Read { fid, offset, count } => (
                Op::Read {
                    slot: self.slot(fid)?,
                    offset,
                    count,
                },
                None,
            ),
            Tmsg::Write { fid, offset, data } => (
                Op::Write {
                    slot: self.slot(fid)?,
                    offset,
                    data,
                },
                None,
            ),
            Tmsg::Clunk { .. } => {
                return Err(Error::new("internal: unexpected message"));
            }
            Tmsg::Remove { fid } => {
                let slot = self.take_fid(fid).ok_or_else(unknown_fid)?;
                (Op::Remove { slot }, None)
            }
            Tmsg::Stat { fid } => (
                Op::Stat {
                    slot: self.slot(fid)?,
                },
                None,
            ),
            Tmsg::Wstat { fid, stat } => (
                Op::Wstat {
                    slot: self.slot(fid)?,
                    stat,
                },
                None,
            ),
        })
    }

    /// Tauth: a new authentication fid, within the connection's limit.
    fn resolve_auth(
        &mut self,
        afid: u32,
        uname: String,
        aname: String,
    ) -> Result<Resolved<F::Fid>> {
        let max = self.srv.limits.max_afids;
        if self.afids.len() >= max {
            return Err(Error::new(format!(
                "too many authentication fids on this connection (limit {max}); clunk some"
            )));
        }
        let (guard, slot) = self.new_slot(afid)?;
        self.afids.insert(afid);
        Ok((
            Op::Auth {
                guard,
                uname,
                aname,
            },
            Some((afid, slot)),
        ))
    }

    /// Tattach: the new fid, and the authentication fid's slot if one is named.
    fn resolve_attach(
        &mut self,
        fid: u32,
        afid: u32,
        uname: String,
        aname: String,
    ) -> Result<Resolved<F::Fid>> {
        let afid = if afid == NOFID {
            None
        } else {
            Some(
                self.fids
                    .get(&afid)
                    .cloned()
                    .ok_or_else(|| Error::new("unknown afid"))?,
            )
        };
        let (guard, slot) = self.new_slot(fid)?;
        Ok((
            Op::Attach {
                guard,
                afid,
                uname,
                aname,
            },
            Some((fid, slot)),
        ))
    }

    /// Twalk: the source fid, and the new fid unless it is the same.
    fn resolve_walk(
        &mut self,
        fid: u32,
        newfid: u32,
        wnames: Vec<String>,
    ) -> Result<Resolved<F::Fid>> {
        let src = self.slot(fid)?;
        Ok(if newfid == fid {
            (
                Op::Walk {
                    src,
                    new: None,
                    wnames,
                },
                None,
            )
        } else {
            let (guard, slot) = self.new_slot(newfid)?;
            (
                Op::Walk {
                    src,
                    new: Some(guard),
                    wnames,
                },
                Some((newfid, slot)),
            )
        })
    }
}
