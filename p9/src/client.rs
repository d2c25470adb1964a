//! An async 9P2000 client with explicit fids.
//!
//! Requests are multiplexed by tag over one connection: any number may be in flight. Dropping a
//! request's future before its reply arrives sends `Tflush` and keeps the tag reserved until the
//! `Rflush` comes back, so a blocked read on a stream file can be abandoned cleanly. A [`Fid`]
//! dropped without [`Fid::clunk`] is clunked in the background.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::dial::Addr;
use crate::wire::{self, IOHDRSZ, MAXWELEM, NOFID, NOTAG, Qid, Rmsg, Stat, Tmsg, om};

/// The msize a client offers by default.
pub const DEFAULT_MSIZE: u32 = 1 << 20;

/// What can go wrong talking to a server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with Rerror.
    #[error("{0}")]
    Server(String),
    #[error("cannot connect to {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("i/o error on the 9P connection")]
    Io(#[from] std::io::Error),
    #[error("connection closed")]
    Closed,
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("cannot encode request")]
    Encode(#[from] wire::EncodeError),
    #[error("too many outstanding requests")]
    NoTags,
    #[error("{0}")]
    Usage(String),
}

impl ClientError {
    /// The server's error string, if this is an Rerror.
    pub fn server_message(&self) -> Option<&str> {
        match self {
            ClientError::Server(s) => Some(s),
            _ => None,
        }
    }
}

type Result<T> = std::result::Result<T, ClientError>;

/// What a tag is waiting for.
enum Pending {
    /// A caller wants the reply.
    Waiting(oneshot::Sender<Rmsg>),
    /// Nobody wants the reply (background clunk); free this fid number when it comes.
    Discard { free_fid: Option<u32> },
    /// The caller gave up and a Tflush was sent; the tag stays reserved until the Rflush.
    Flushed,
    /// A Tflush for `oldtag`.
    Flusher { oldtag: u16 },
}

#[derive(Default)]
struct State {
    pending: HashMap<u16, Pending>,
    next_tag: u16,
    fids: std::collections::HashSet<u32>,
    next_fid: u32,
    closed: bool,
}

impl State {
    fn alloc_tag(&mut self) -> Result<u16> {
        if self.pending.len() >= usize::from(NOTAG) {
            return Err(ClientError::NoTags);
        }
        loop {
            let t = self.next_tag;
            self.next_tag = if self.next_tag >= NOTAG - 1 {
                0
            } else {
                self.next_tag + 1
            };
            if !self.pending.contains_key(&t) {
                return Ok(t);
            }
        }
    }

    fn alloc_fid(&mut self) -> u32 {
        loop {
            let f = self.next_fid;
            self.next_fid = self.next_fid.wrapping_add(1);
            if self.next_fid == NOFID {
                self.next_fid = 0;
            }
            if f != NOFID && self.fids.insert(f) {
                return f;
            }
        }
    }
}

/// The sending side. Frames are written inline by the sender when the socket takes them at
/// once (no task hop); what it does not take is queued for the writer task, in order.
struct Writer {
    w: Pin<Box<dyn AsyncWrite + Send>>,
    queue: std::collections::VecDeque<Bytes>,
    /// Reused encoding buffer.
    enc: BytesMut,
    /// The writer task, waiting for work.
    waker: Option<Waker>,
    /// No more frames: set when the client goes away or a write fails.
    closed: bool,
}

type SharedWriter = Arc<Mutex<Writer>>;

fn lock_writer(w: &Mutex<Writer>) -> MutexGuard<'_, Writer> {
    w.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes as much of `buf` as the socket takes right now. Returns false if the connection is
/// broken.
fn write_now(w: &mut Pin<Box<dyn AsyncWrite + Send>>, buf: &mut Bytes) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    while !buf.is_empty() {
        match w.as_mut().poll_write(&mut cx, buf) {
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return false,
            Poll::Ready(Ok(n)) => {
                let _ = buf.split_to(n);
            }
            Poll::Pending => return true,
        }
    }
    true
}

/// The writer task's body: drains the queue, then shuts the socket down once closed.
async fn drain_writer(shared: SharedWriter) {
    std::future::poll_fn(|cx| {
        let mut guard = lock_writer(&shared);
        let st = &mut *guard;
        loop {
            let Some(front) = st.queue.front_mut() else {
                if st.closed {
                    return Poll::Ready(());
                }
                st.waker = Some(cx.waker().clone());
                return Poll::Pending;
            };
            match st.w.as_mut().poll_write(cx, front) {
                Poll::Ready(Ok(n)) if n > 0 => {
                    let _ = front.split_to(n);
                    if front.is_empty() {
                        st.queue.pop_front();
                    }
                }
                Poll::Ready(_) => {
                    st.closed = true;
                    st.queue.clear();
                    return Poll::Ready(());
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await;
    let _ = std::future::poll_fn(|cx| lock_writer(&shared).w.as_mut().poll_shutdown(cx)).await;
}

struct Inner {
    msize: u32,
    state: Mutex<State>,
    writer: SharedWriter,
    /// Becomes true when the reader task ends (the server closed the connection, or sent
    /// something undecodable).
    gone: tokio::sync::watch::Receiver<bool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let mut w = lock_writer(&self.writer);
        w.closed = true;
        if let Some(k) = w.waker.take() {
            k.wake();
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the map inconsistent in a way that
        // matters more than losing the connection, so a poisoned lock is simply taken.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send_frame(&self, tag: u16, m: &Tmsg) -> Result<()> {
        let mut guard = lock_writer(&self.writer);
        let st = &mut *guard;
        if st.closed {
            return Err(ClientError::Closed);
        }
        wire::encode_t(&mut st.enc, tag, m)?;
        let mut frame = st.enc.split().freeze();
        if st.enc.capacity() < 512 {
            st.enc.reserve(16 * 1024);
        }
        if st.queue.is_empty() {
            if !write_now(&mut st.w, &mut frame) {
                st.closed = true;
                return Err(ClientError::Closed);
            }
            if frame.is_empty() {
                return Ok(());
            }
        }
        st.queue.push_back(frame);
        if let Some(k) = st.waker.take() {
            k.wake();
        }
        Ok(())
    }

    /// Sends a request whose reply nobody awaits (used from `Drop`).
    fn send_detached(&self, m: Tmsg, free_fid: Option<u32>) {
        let mut st = self.lock();
        if st.closed {
            return;
        }
        let Ok(tag) = st.alloc_tag() else {
            return;
        };
        st.pending.insert(tag, Pending::Discard { free_fid });
        drop(st);
        if self.send_frame(tag, &m).is_err() {
            self.lock().pending.remove(&tag);
        }
    }
}

/// A connection to a 9P server.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("msize", &self.inner.msize)
            .finish_non_exhaustive()
    }
}

/// A reply on its way. Dropping it before it resolves flushes the request.
pub struct Call {
    inner: Arc<Inner>,
    tag: u16,
    rx: oneshot::Receiver<Rmsg>,
    done: bool,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call").field("tag", &self.tag).finish()
    }
}

impl Future for Call {
    type Output = Result<Rmsg>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                self.done = true;
                Poll::Ready(match r {
                    Ok(Rmsg::Error { ename }) => Err(ClientError::Server(ename)),
                    Ok(m) => Ok(m),
                    Err(_) => Err(ClientError::Closed),
                })
            }
        }
    }
}

impl Call {
    /// The data of the reply to a Tread sent with [`Fid::read_call`].
    pub async fn read_data(self) -> Result<Bytes> {
        match self.await? {
            Rmsg::Read { data } => Ok(data),
            other => Err(unexpected("Rread", &other)),
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = self.inner.lock();
        if !matches!(st.pending.get(&self.tag), Some(Pending::Waiting(_))) || st.closed {
            return;
        }
        let Ok(ftag) = st.alloc_tag() else {
            // No tag for the flush: let the reply arrive and be discarded.
            st.pending
                .insert(self.tag, Pending::Discard { free_fid: None });
            return;
        };
        st.pending.insert(self.tag, Pending::Flushed);
        st.pending
            .insert(ftag, Pending::Flusher { oldtag: self.tag });
        drop(st);
        if self
            .inner
            .send_frame(ftag, &Tmsg::Flush { oldtag: self.tag })
            .is_err()
        {
            let mut st = self.inner.lock();
            st.pending.remove(&ftag);
            st.pending.remove(&self.tag);
        }
    }
}

/// Reads whole frames through one buffer: one `read` per batch of replies, no per-frame
/// allocation or zero-fill; payloads are slices of the buffer.
struct FrameReader<R> {
    r: R,
    buf: BytesMut,
    /// The size of the allocation `buf` is a view of.
    buf_cap: usize,
    max: u32,
    /// Large buffers given up while frames sliced from them were still held, with their sizes:
    /// taken again once those frames are all dropped (see [`FrameReader::room`]).
    spare: Vec<(BytesMut, usize)>,
    /// How many buffers [`FrameReader::room`] allocated.
    #[cfg(test)]
    allocated: usize,
}

/// The smallest buffer the reader allocates.
const MIN_BUFFER: usize = 64 * 1024;
/// How many given-up buffers a connection keeps.
const SPARE_BUFFERS: usize = 2;

impl<R: AsyncRead + Unpin> FrameReader<R> {
    fn new(r: R, max: u32) -> FrameReader<R> {
        FrameReader {
            r,
            buf: BytesMut::with_capacity(16 * 1024),
            buf_cap: 16 * 1024,
            max,
            spare: Vec::new(),
            #[cfg(test)]
            allocated: 0,
        }
    }

    /// Makes `buf` able to hold `total` bytes from its start.
    ///
    /// A large reply (a Tread of a bulk read) usually arrives while the caller still holds
    /// the one before it, which shares `buf`'s memory. Allocating afresh each time costs more
    /// than the allocation: the allocator hands large freed blocks back to the system, so the
    /// kernel's copy into the new one faults on every page. So a large buffer given up here is
    /// kept, and taken again once every frame sliced from it has been dropped.
    fn room(&mut self, total: usize) {
        let len = self.buf.len();
        if self.buf.capacity() >= total || self.buf.try_reclaim(total - len) {
            return;
        }
        let want = total.max(MIN_BUFFER);
        let (mut fresh, cap) = match self
            .spare
            .iter_mut()
            .position(|(b, cap)| *cap >= want && b.try_reclaim(want))
        {
            Some(i) => self.spare.swap_remove(i),
            None => {
                #[cfg(test)]
                {
                    self.allocated += 1;
                }
                let b = BytesMut::with_capacity(want);
                let cap = b.capacity();
                (b, cap)
            }
        };
        fresh.extend_from_slice(&self.buf);
        let mut old = std::mem::replace(&mut self.buf, fresh);
        let old_cap = std::mem::replace(&mut self.buf_cap, cap);
        if old_cap >= MIN_BUFFER {
            old.clear();
            if self.spare.len() == SPARE_BUFFERS {
                self.spare.remove(0);
            }
            self.spare.push((old, old_cap));
        }
    }

    /// The next frame, or `None` at a clean end of stream.
    async fn next(&mut self) -> Result<Option<Bytes>> {
        loop {
            if self.buf.len() >= 4 {
                let size = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
                if (size as usize) < wire::HEADER_LEN || size > self.max {
                    return Err(ClientError::Protocol(format!(
                        "reply of {size} bytes outside 7..={}",
                        self.max
                    )));
                }
                let size = size as usize;
                if self.buf.len() >= size {
                    return Ok(Some(self.buf.split_to(size).freeze()));
                }
                self.room(size);
            } else if self.buf.capacity() - self.buf.len() < 4096 {
                self.room(self.buf.len() + MIN_BUFFER);
            }
            if self.r.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ClientError::Protocol(
                        "connection closed inside a reply".into(),
                    ))
                };
            }
        }
    }
}

impl Client {
    /// Dials `addr` and negotiates the version with [`DEFAULT_MSIZE`].
    pub async fn dial(addr: &Addr) -> Result<Client> {
        Client::dial_msize(addr, DEFAULT_MSIZE).await
    }

    /// Dials `addr` offering `msize`.
    pub async fn dial_msize(addr: &Addr, msize: u32) -> Result<Client> {
        let cerr = |source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        };
        match addr {
            Addr::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p).await.map_err(cerr)?;
                let (r, w) = s.into_split();
                Client::handshake(r, w, msize).await
            }
            Addr::Tcp { host, port } => {
                let s = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(cerr)?;
                s.set_nodelay(true).map_err(cerr)?;
                let (r, w) = s.into_split();
                Client::handshake(r, w, msize).await
            }
        }
    }

    /// Runs Tversion over an established stream, then starts the connection's reader and writer
    /// tasks (on the current tokio runtime).
    pub async fn handshake<R, W>(r: R, mut w: W, msize: u32) -> Result<Client>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let mut b = BytesMut::new();
        wire::encode_t(
            &mut b,
            NOTAG,
            &Tmsg::Version {
                msize,
                version: wire::VERSION.into(),
            },
        )?;
        w.write_all(&b).await?;
        w.flush().await?;
        let mut reader = FrameReader::new(r, msize.max(8192));
        let frame = reader.next().await?.ok_or(ClientError::Closed)?;
        let (_, reply) = wire::decode_r(frame).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let got = match reply {
            Rmsg::Version { msize: m, version } if version == wire::VERSION => m,
            Rmsg::Version { version, .. } => {
                return Err(ClientError::Protocol(format!(
                    "server speaks {version:?}, not 9P2000"
                )));
            }
            Rmsg::Error { ename } => return Err(ClientError::Server(ename)),
            other => {
                return Err(ClientError::Protocol(format!(
                    "expected Rversion, got {other:?}"
                )));
            }
        };
        if got > msize || got < 256 {
            return Err(ClientError::Protocol(format!(
                "server chose msize {got}, offered {msize}"
            )));
        }
        reader.max = got;
        let writer: SharedWriter = Arc::new(Mutex::new(Writer {
            w: Box::pin(w),
            queue: std::collections::VecDeque::new(),
            enc: BytesMut::with_capacity(16 * 1024),
            waker: None,
            closed: false,
        }));
        let (gone_tx, gone) = tokio::sync::watch::channel(false);
        let inner = Arc::new(Inner {
            msize: got,
            state: Mutex::new(State::default()),
            writer: Arc::clone(&writer),
            gone,
        });
        tokio::spawn(drain_writer(writer));
        // Reader: routes replies to their tags.
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            loop {
                let frame = match reader.next().await {
                    Ok(Some(f)) => f,
                    _ => break,
                };
                let Some(inner) = weak.upgrade() else {
                    break;
                };
                let Ok((tag, m)) = wire::decode_r(frame) else {
                    break;
                };
                let mut st = inner.lock();
                match st.pending.remove(&tag) {
                    Some(Pending::Waiting(tx)) => {
                        drop(st);
                        let _ = tx.send(m);
                    }
                    Some(Pending::Discard { free_fid: Some(f) }) => {
                        st.fids.remove(&f);
                    }
                    Some(Pending::Discard { free_fid: None }) => {}
                    Some(Pending::Flushed) => {
                        // The reply beat the Rflush; keep the tag until the Rflush arrives.
                        st.pending.insert(tag, Pending::Flushed);
                    }
                    Some(Pending::Flusher { oldtag }) => {
                        st.pending.remove(&oldtag);
                    }
                    None => {}
                }
            }
            if let Some(inner) = weak.upgrade() {
                let mut st = inner.lock();
                st.closed = true;
                // Dropping the senders wakes every waiter with "connection closed".
                st.pending.clear();
            }
            gone_tx.send_replace(true);
        });
        Ok(Client { inner })
    }

    /// Resolves once the connection is gone: the server closed it or sent something that does
    /// not decode. Every request in flight has then failed with [`ClientError::Closed`].
    pub async fn closed(&self) {
        let mut gone = self.inner.gone.clone();
        // An error means the reader task (the sender) is gone, which is also the end.
        let _ = gone.wait_for(|g| *g).await;
    }

    /// The negotiated msize.
    pub fn msize(&self) -> u32 {
        self.inner.msize
    }

    /// The largest payload one Tread/Twrite can carry.
    pub fn max_io(&self) -> u32 {
        self.inner.msize - IOHDRSZ
    }

    /// Sends a request now and returns its reply future. Dropping the future before it resolves
    /// sends Tflush.
    pub fn send(&self, m: &Tmsg) -> Result<Call> {
        let (tx, rx) = oneshot::channel();
        let tag = {
            let mut st = self.inner.lock();
            if st.closed {
                return Err(ClientError::Closed);
            }
            let tag = st.alloc_tag()?;
            st.pending.insert(tag, Pending::Waiting(tx));
            tag
        };
        if let Err(e) = self.inner.send_frame(tag, m) {
            self.inner.lock().pending.remove(&tag);
            return Err(e);
        }
        Ok(Call {
            inner: Arc::clone(&self.inner),
            tag,
            rx,
            done: false,
        })
    }

    /// One request, one reply.
    pub async fn rpc(&self, m: &Tmsg) -> Result<Rmsg> {
        self.send(m)?.await
    }

    fn new_fid(&self, num: u32, qid: Qid) -> Fid {
        Fid {
            client: self.clone(),
            num,
            qid,
            iounit: AtomicU32::new(0),
            live: true,
        }
    }

    fn release_fid(&self, num: u32) {
        self.inner.lock().fids.remove(&num);
    }

    /// Tauth: returns the auth fid to exchange credentials on.
    pub async fn auth(&self, uname: &str, aname: &str) -> Result<Fid> {
        let afid = self.inner.lock().alloc_fid();
        let r = self
            .rpc(&Tmsg::Auth {
                afid,
                uname: uname.into(),
                aname: aname.into(),
            })
            .await;
        match r {
            Ok(Rmsg::Auth { aqid }) => {
                let f = self.new_fid(afid, aqid);
                f.iounit.store(self.max_io(), Ordering::Relaxed);
                Ok(f)
            }
            Ok(other) => {
                self.release_fid(afid);
                Err(unexpected("Rauth", &other))
            }
            Err(e) => {
                self.release_fid(afid);
                Err(e)
            }
        }
    }

    /// Tattach, optionally with an auth fid.
    pub async fn attach(&self, afid: Option<&Fid>, uname: &str, aname: &str) -> Result<Fid> {
        let fid = self.inner.lock().alloc_fid();
        let r = self
            .rpc(&Tmsg::Attach {
                fid,
                afid: afid.map_or(NOFID, |a| a.num),
                uname: uname.into(),
                aname: aname.into(),
            })
            .await;
        match r {
            Ok(Rmsg::Attach { qid }) => Ok(self.new_fid(fid, qid)),
            Ok(other) => {
                self.release_fid(fid);
                Err(unexpected("Rattach", &other))
            }
            Err(e) => {
                self.release_fid(fid);
                Err(e)
            }
        }
    }
}

fn unexpected(want: &str, got: &Rmsg) -> ClientError {
    ClientError::Protocol(format!("expected {want}, got {got:?}"))
}

/// A fid on the server. Clunked by [`Fid::clunk`], or in the background when dropped.
pub struct Fid {
    client: Client,
    num: u32,
    qid: Qid,
    iounit: AtomicU32,
    live: bool,
}

impl std::fmt::Debug for Fid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fid")
            .field("num", &self.num)
            .field("qid", &self.qid)
            .finish()
    }
}

impl Drop for Fid {
    fn drop(&mut self) {
        if self.live {
            self.client
                .inner
                .send_detached(Tmsg::Clunk { fid: self.num }, Some(self.num));
        }
    }
}

/// Splits a slash-separated path into walk names (empty elements and `.` dropped).
pub fn path_names(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .map(str::to_owned)
        .collect()
}

impl Fid {
    /// The fid number.
    pub fn num(&self) -> u32 {
        self.num
    }

    /// The qid from attach/walk/open/create.
    pub fn qid(&self) -> Qid {
        self.qid
    }

    /// The client this fid belongs to.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The iounit after open (or the connection's maximum payload).
    pub fn iounit(&self) -> u32 {
        match self.iounit.load(Ordering::Relaxed) {
            0 => self.client.max_io(),
            n => n.min(self.client.max_io()),
        }
    }

    /// Walks `names` (any number; sent 16 at a time) to a new fid. A walk that stops early is
    /// an error naming the first element that was not found.
    pub async fn walk<S: AsRef<str>>(&self, names: &[S]) -> Result<Fid> {
        let names: Vec<String> = names.iter().map(|s| s.as_ref().to_owned()).collect();
        let first: Vec<String> = names.iter().take(MAXWELEM).cloned().collect();
        let mut fid = self.walk_once(self.num, &first).await?;
        let mut done = first.len();
        while done < names.len() {
            let chunk: Vec<String> = names[done..].iter().take(MAXWELEM).cloned().collect();
            let next = fid.walk_once(fid.num, &chunk).await?;
            drop(fid);
            fid = next;
            done += chunk.len();
        }
        Ok(fid)
    }

    /// Walks a slash-separated path.
    pub async fn walk_path(&self, path: &str) -> Result<Fid> {
        self.walk(&path_names(path)).await
    }

    /// Clones this fid (a walk of no names).
    pub async fn clone_fid(&self) -> Result<Fid> {
        self.walk_once(self.num, &[]).await
    }

    async fn walk_once(&self, from: u32, names: &[String]) -> Result<Fid> {
        let newfid = self.client.inner.lock().alloc_fid();
        let r = self
            .client
            .rpc(&Tmsg::Walk {
                fid: from,
                newfid,
                wnames: names.to_vec(),
            })
            .await;
        match r {
            Ok(Rmsg::Walk { wqids }) if wqids.len() == names.len() => {
                let qid = wqids.last().copied().unwrap_or(self.qid);
                Ok(self.client.new_fid(newfid, qid))
            }
            Ok(Rmsg::Walk { wqids }) => {
                self.client.release_fid(newfid);
                let missing = names.get(wqids.len()).map_or("", String::as_str);
                Err(ClientError::Server(format!(
                    "file does not exist: {missing:?}"
                )))
            }
            Ok(other) => {
                self.client.release_fid(newfid);
                Err(unexpected("Rwalk", &other))
            }
            Err(e) => {
                self.client.release_fid(newfid);
                Err(e)
            }
        }
    }

    /// Topen.
    pub async fn open(&mut self, mode: u8) -> Result<Qid> {
        match self
            .client
            .rpc(&Tmsg::Open {
                fid: self.num,
                mode,
            })
            .await?
        {
            Rmsg::Open { qid, iounit } => {
                self.qid = qid;
                self.iounit.store(iounit, Ordering::Relaxed);
                Ok(qid)
            }
            other => Err(unexpected("Ropen", &other)),
        }
    }

    /// Tcreate: this fid (a directory) becomes the new file, open with `mode`.
    pub async fn create(&mut self, name: &str, perm: u32, mode: u8) -> Result<Qid> {
        match self
            .client
            .rpc(&Tmsg::Create {
                fid: self.num,
                name: name.into(),
                perm,
                mode,
            })
            .await?
        {
            Rmsg::Create { qid, iounit } => {
                self.qid = qid;
                self.iounit.store(iounit, Ordering::Relaxed);
                Ok(qid)
            }
            other => Err(unexpected("Rcreate", &other)),
        }
    }

    /// Starts one Tread now (for pipelining); the count is clamped to the iounit.
    pub fn read_call(&self, offset: u64, count: u32) -> Result<Call> {
        self.client.send(&Tmsg::Read {
            fid: self.num,
            offset,
            count: count.min(self.iounit()),
        })
    }

    /// Exactly one Tread: what a stream file returns for one read.
    pub async fn read(&self, offset: u64, count: u32) -> Result<Bytes> {
        self.read_call(offset, count)?.read_data().await
    }

    /// Reads sequentially from 0 until a read returns nothing.
    pub async fn read_to_end(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let d = self.read(out.len() as u64, self.iounit()).await?;
            if d.is_empty() {
                return Ok(out);
            }
            out.extend_from_slice(&d);
        }
    }

    /// Reads `len` bytes from `offset` with up to `depth` Treads in flight (for files whose size
    /// is known). Stops early at end of file.
    pub async fn read_bulk(&self, offset: u64, len: u64, depth: usize) -> Result<Vec<u8>> {
        let unit = u64::from(self.iounit());
        let end = offset.saturating_add(len);
        let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0).min(1 << 30));
        let mut next = offset;
        let mut q = std::collections::VecDeque::new();
        loop {
            while q.len() < depth.max(1) && next < end {
                let n = (end - next).min(unit) as u32;
                q.push_back((n, self.read_call(next, n)?));
                next += u64::from(n);
            }
            let Some((want, call)) = q.pop_front() else {
                return Ok(out);
            };
            let data = match call.await? {
                Rmsg::Read { data } => data,
                other => return Err(unexpected("Rread", &other)),
            };
            out.extend_from_slice(&data);
            if (data.len() as u32) < want {
                // Short read: end of file (later calls in flight are flushed on drop).
                return Ok(out);
            }
        }
    }

    /// Reads a directory: every entry, parsed.
    pub async fn read_dir(&self) -> Result<Vec<Stat>> {
        let mut out = Vec::new();
        let mut off = 0u64;
        loop {
            let d = self.read(off, self.iounit()).await?;
            if d.is_empty() {
                return Ok(out);
            }
            off += d.len() as u64;
            out.extend(wire::decode_dir(&d).map_err(|e| ClientError::Protocol(e.to_string()))?);
        }
    }

    /// One Twrite; returns the count the server took.
    pub async fn write(&self, offset: u64, data: Bytes) -> Result<u32> {
        if data.len() > self.iounit() as usize {
            return Err(ClientError::Usage(format!(
                "write of {} bytes exceeds iounit {}",
                data.len(),
                self.iounit()
            )));
        }
        match self
            .client
            .rpc(&Tmsg::Write {
                fid: self.num,
                offset,
                data,
            })
            .await?
        {
            Rmsg::Write { count } => Ok(count),
            other => Err(unexpected("Rwrite", &other)),
        }
    }

    /// Writes all of `data` from `offset`, in iounit-sized Twrites. Returns the bytes written.
    pub async fn write_all(&self, offset: u64, data: &[u8]) -> Result<u64> {
        let unit = self.iounit() as usize;
        let mut done = 0usize;
        while done < data.len() {
            let n = (data.len() - done).min(unit);
            let chunk = Bytes::copy_from_slice(&data[done..done + n]);
            let c = self.write(offset + done as u64, chunk).await? as usize;
            if c == 0 {
                return Err(ClientError::Protocol("server accepted no bytes".into()));
            }
            done += c;
        }
        Ok(done as u64)
    }

    /// Tstat.
    pub async fn stat(&self) -> Result<Stat> {
        match self.client.rpc(&Tmsg::Stat { fid: self.num }).await? {
            Rmsg::Stat { stat } => Ok(stat),
            other => Err(unexpected("Rstat", &other)),
        }
    }

    /// Twstat.
    pub async fn wstat(&self, stat: &Stat) -> Result<()> {
        match self
            .client
            .rpc(&Tmsg::Wstat {
                fid: self.num,
                stat: stat.clone(),
            })
            .await?
        {
            Rmsg::Wstat => Ok(()),
            other => Err(unexpected("Rwstat", &other)),
        }
    }

    /// Tclunk, waiting for the reply.
    pub async fn clunk(mut self) -> Result<()> {
        self.live = false;
        let r = self.client.rpc(&Tmsg::Clunk { fid: self.num }).await;
        self.client.release_fid(self.num);
        match r? {
            Rmsg::Clunk => Ok(()),
            other => Err(unexpected("Rclunk", &other)),
        }
    }

    /// Tremove (the fid is gone either way).
    pub async fn remove(mut self) -> Result<()> {
        self.live = false;
        let r = self.client.rpc(&Tmsg::Remove { fid: self.num }).await;
        self.client.release_fid(self.num);
        match r? {
            Rmsg::Remove => Ok(()),
            other => Err(unexpected("Rremove", &other)),
        }
    }
}

/// Open-mode constants re-exported for callers.
pub use om::{OEXEC, ORDWR, OREAD, OTRUNC, OWRITE};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    /// A stream that gives at most `chunk` bytes per read, as a socket with a small buffer
    /// does.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        chunk: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let n = self
                .chunk
                .min(self.data.len() - self.at)
                .min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.data[at..at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    /// A frame of `size` bytes whose every byte after the size says which frame it is.
    fn frame(i: u8, size: usize) -> Vec<u8> {
        let mut f = vec![i; size];
        f[..4].copy_from_slice(&(size as u32).to_le_bytes());
        f
    }

    #[test]
    fn large_frames_reuse_buffers_only_once_their_frames_are_dropped() {
        let sizes: Vec<usize> = (0..40)
            .map(|i| match i % 5 {
                0 => 11,
                1 => 300_000,
                2 => 524_311,
                3 => 70_001,
                _ => 1 << 20,
            })
            .collect();
        let mut data = Vec::new();
        for (i, s) in sizes.iter().enumerate() {
            data.extend_from_slice(&frame(i as u8, *s));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut r = FrameReader::new(
                Trickle {
                    data,
                    at: 0,
                    chunk: 200_000,
                },
                1 << 21,
            );
            // Each frame is held until two more have arrived (a bulk reader's read ahead).
            let mut held = std::collections::VecDeque::new();
            for (i, s) in sizes.iter().enumerate() {
                let f = r.next().await.unwrap().unwrap();
                assert_eq!(f.len(), *s, "frame {i}");
                held.push_back((i, f));
                if held.len() > 2 {
                    held.pop_front();
                }
                // Nothing held was written over by a later frame.
                for (j, h) in &held {
                    assert!(h[4..].iter().all(|b| *b == *j as u8), "frame {j} changed");
                }
                assert!(r.spare.len() <= SPARE_BUFFERS);
            }
            assert!(r.next().await.unwrap().is_none());
            // 32 large frames, two held while a third arrives: a handful of buffers (7 here)
            // serve them all; without the reuse every large frame and most refills took a new
            // one (64).
            assert!(r.allocated <= 8, "{} buffers allocated", r.allocated);
        });
    }
}
