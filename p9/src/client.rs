//! An async 9P2000 client with explicit fids.
//!
//! Requests are multiplexed by tag over one connection: any number may be in flight. Dropping a
//! request's future before its reply arrives sends `Tflush` and keeps the tag reserved until the
//! `Rflush` comes back, so a blocked read on a stream file can be abandoned cleanly. A [`Fid`]
//! dropped without [`Fid::clunk`] is clunked in the background.
//!
//! On a unix socket a Tread's payload can also go from the socket straight into a pipe
//! ([`Fid::read_call_spliced`]): a FUSE bridge then splices it on into `/dev/fuse`, and the
//! payload is never copied through this process.

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::{oneshot, watch};

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
    /// A caller wants the payload of this Tread's Rread in `pipe` (see
    /// [`Fid::read_call_spliced`]).
    Spliced {
        tx: oneshot::Sender<Result<Spliced>>,
        pipe: Arc<OwnedFd>,
        /// Counts this entry in [`Inner::splicing`].
        _counted: SpliceCount,
    },
    /// Nobody wants the reply (background clunk); free this fid number when it comes.
    Discard { free_fid: Option<u32> },
    /// The caller gave up and a Tflush was sent; the tag stays reserved until the Rflush.
    Flushed,
    /// A Tflush for `oldtag`.
    Flusher { oldtag: u16 },
}

/// One spliced read counted in [`Inner::splicing`] for as long as its [`Pending`] entry lives:
/// however the entry leaves the map (its reply, a flush, the connection closing), dropping it
/// takes the count back, so the count cannot drift.
struct SpliceCount(Arc<AtomicUsize>);

impl SpliceCount {
    fn new(count: &Arc<AtomicUsize>) -> SpliceCount {
        count.fetch_add(1, Ordering::Relaxed);
        SpliceCount(Arc::clone(count))
    }
}

impl Drop for SpliceCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a spliced Tread's payload went: the first `in_pipe` bytes of the payload were put in the
/// pipe (in order), and `rest` is what follows them, in memory. payload == pipe contents ++ rest.
#[derive(Debug)]
pub struct Spliced {
    /// How many bytes of the payload were written into the pipe: 0 when the connection cannot
    /// splice (not a unix socket) or the reply had already been read into memory.
    pub in_pipe: usize,
    /// The payload after those bytes: what did not fit in the pipe.
    pub rest: Bytes,
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
    gone: watch::Receiver<bool>,
    /// How many spliced reads are pending ([`SpliceCount`]). A reader that can splice reads
    /// frame by frame only while this is non-zero; it is a hint (the pending map decides), so
    /// relaxed loads and stores do.
    splicing: Arc<AtomicUsize>,
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

    /// Gives up on the request under `tag` (its future was dropped): sends Tflush and keeps the
    /// tag reserved until the Rflush. Nothing to do if the reply has already been taken.
    fn abandon(&self, tag: u16) {
        let mut st = self.lock();
        let waiting = matches!(
            st.pending.get(&tag),
            Some(Pending::Waiting(_) | Pending::Spliced { .. })
        );
        if !waiting || st.closed {
            return;
        }
        let Ok(ftag) = st.alloc_tag() else {
            // No tag for the flush: let the reply arrive and be discarded.
            st.pending.insert(tag, Pending::Discard { free_fid: None });
            return;
        };
        st.pending.insert(tag, Pending::Flushed);
        st.pending.insert(ftag, Pending::Flusher { oldtag: tag });
        drop(st);
        if self.send_frame(ftag, &Tmsg::Flush { oldtag: tag }).is_err() {
            let mut st = self.lock();
            st.pending.remove(&ftag);
            st.pending.remove(&tag);
        }
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
        if !self.done {
            self.inner.abandon(self.tag);
        }
    }
}

/// The reply to a spliced Tread on its way (see [`Fid::read_call_spliced`]). Like [`Call`]:
/// dropping it before it resolves sends Tflush, and the tag stays reserved until the Rflush.
pub struct SplicedCall {
    inner: Arc<Inner>,
    tag: u16,
    rx: oneshot::Receiver<Result<Spliced>>,
    done: bool,
}

impl std::fmt::Debug for SplicedCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SplicedCall")
            .field("tag", &self.tag)
            .finish()
    }
}

impl Future for SplicedCall {
    type Output = Result<Spliced>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                self.done = true;
                Poll::Ready(r.unwrap_or(Err(ClientError::Closed)))
            }
        }
    }
}

impl Drop for SplicedCall {
    fn drop(&mut self) {
        if !self.done {
            self.inner.abandon(self.tag);
        }
    }
}

/// The answer to a spliced read whose reply was received into memory: all of it in `rest`.
fn spliced_in_memory(m: Rmsg) -> Result<Spliced> {
    match m {
        Rmsg::Read { data } => Ok(Spliced {
            in_pipe: 0,
            rest: data,
        }),
        Rmsg::Error { ename } => Err(ClientError::Server(ename)),
        other => Err(unexpected("Rread", &other)),
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

impl<R> FrameReader<R> {
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

    /// The declared size of the frame at the front of the buffer, once its first 4 bytes are
    /// in; an error if it is outside 7..=max.
    fn front_size(&self) -> Result<Option<usize>> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let size = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        if (size as usize) < wire::HEADER_LEN || size > self.max {
            return Err(ClientError::Protocol(format!(
                "reply of {size} bytes outside 7..={}",
                self.max
            )));
        }
        Ok(Some(size as usize))
    }

    /// The front frame split off the buffer if it is all there; otherwise makes room to read the
    /// rest of it (or, before its size is known, a batch of frames).
    fn frame_or_room(&mut self) -> Result<Option<Bytes>> {
        match self.front_size()? {
            Some(size) if self.buf.len() >= size => {
                return Ok(Some(self.buf.split_to(size).freeze()));
            }
            Some(size) => self.room(size),
            None => self.room_for_batch(),
        }
        Ok(None)
    }

    /// Makes room for a batch of frames if little is left.
    fn room_for_batch(&mut self) {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.room(self.buf.len() + MIN_BUFFER);
        }
    }

    /// What a read of 0 bytes (end of stream) means: a clean end between frames, or a
    /// truncated reply.
    fn at_end(&self) -> Result<Option<Bytes>> {
        if self.buf.is_empty() {
            Ok(None)
        } else {
            Err(truncated())
        }
    }
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// The next frame, or `None` at a clean end of stream.
    async fn next(&mut self) -> Result<Option<Bytes>> {
        loop {
            if let Some(frame) = self.frame_or_room()? {
                return Ok(Some(frame));
            }
            if self.r.read_buf(&mut self.buf).await? == 0 {
                return self.at_end();
            }
        }
    }
}

fn truncated() -> ClientError {
    ClientError::Protocol("connection closed inside a reply".into())
}

/// Bytes of an Rread before its payload: `size[4] type[1] tag[2] count[4]`.
const RREAD_HEAD: usize = wire::HEADER_LEN + 4;
/// The Rread message type.
const RREAD: u8 = 117;

/// Where the reader task gets reply frames from.
trait ReplySource: Send + 'static {
    /// The next frame to route, or `None` at a clean end of stream. A source that can splice
    /// answers the spliced reads it serves itself, and returns only the other frames.
    fn next_frame(
        &mut self,
        conn: &Weak<Inner>,
    ) -> impl Future<Output = Result<Option<Bytes>>> + Send;
}

impl<R: AsyncRead + Unpin + Send + 'static> ReplySource for FrameReader<R> {
    fn next_frame(
        &mut self,
        _conn: &Weak<Inner>,
    ) -> impl Future<Output = Result<Option<Bytes>>> + Send {
        self.next()
    }
}

/// The reader task: hands each reply to whoever waits for its tag until the stream ends or
/// something undecodable arrives; then every request still waiting fails with
/// [`ClientError::Closed`].
async fn read_replies<S: ReplySource>(mut src: S, conn: Weak<Inner>, gone: watch::Sender<bool>) {
    while let Ok(Some(frame)) = src.next_frame(&conn).await {
        let Some(inner) = conn.upgrade() else {
            break;
        };
        if !route(&inner, frame) {
            break;
        }
    }
    if let Some(inner) = conn.upgrade() {
        let mut st = inner.lock();
        st.closed = true;
        // Dropping the senders wakes every waiter with "connection closed".
        st.pending.clear();
    }
    gone.send_replace(true);
}

/// Hands a reply frame to whoever waits for its tag. False if it does not decode.
fn route(inner: &Inner, frame: Bytes) -> bool {
    let Ok((tag, m)) = wire::decode_r(frame) else {
        return false;
    };
    let mut st = inner.lock();
    match st.pending.remove(&tag) {
        Some(Pending::Waiting(tx)) => {
            drop(st);
            let _ = tx.send(m);
        }
        Some(Pending::Spliced { tx, pipe, .. }) => {
            drop(st);
            // Let go of the pipe before the caller hears: then it is the caller's alone.
            drop(pipe);
            let _ = tx.send(spliced_in_memory(m));
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
    true
}

/// The reader of a unix-socket connection, which can splice an Rread's payload into the pipe
/// of the spliced read it answers.
///
/// With no spliced read pending it reads as [`FrameReader::next`] does: greedily, a batch of
/// frames per read. While one is pending it reads nothing it does not know to be the front
/// frame's: first the frame's head ([`RREAD_HEAD`] bytes), then, unless the frame is the Rread
/// a spliced read waits for, the rest of that frame. So such an Rread's payload is still in the
/// socket when its head has been seen, and can be spliced.
struct UnixReplies {
    frames: FrameReader<OwnedReadHalf>,
    /// [`Inner::splicing`].
    splicing: Arc<AtomicUsize>,
    /// The front frame's head has been looked up, and no spliced read waits for it.
    looked_up: bool,
}

/// A spliced read whose Rread is arriving.
struct SpliceTarget {
    tx: oneshot::Sender<Result<Spliced>>,
    pipe: Arc<OwnedFd>,
    /// The payload's length.
    count: usize,
}

/// What one splice(2) did.
enum Piped {
    /// Moved this many bytes (0: try again).
    Moved(usize),
    /// The socket reached the end of the stream.
    End,
    /// The pipe takes no more: it is full, or it failed with this error (its reader gone, or
    /// not a pipe at all).
    Stop(Option<Errno>),
}

/// Which side of a splice(2) that said EAGAIN was not ready.
enum Blocked {
    Socket,
    Pipe,
    /// Both are ready now: something changed since the splice.
    Neither,
}

impl ReplySource for UnixReplies {
    fn next_frame(
        &mut self,
        conn: &Weak<Inner>,
    ) -> impl Future<Output = Result<Option<Bytes>>> + Send {
        self.next(conn)
    }
}

impl UnixReplies {
    /// The next frame that is not the Rread of a spliced read (those are answered here).
    async fn next(&mut self, conn: &Weak<Inner>) -> Result<Option<Bytes>> {
        loop {
            let size = self.frames.front_size()?;
            if let Some(size) = size.filter(|s| self.frames.buf.len() >= *s) {
                self.looked_up = false;
                return Ok(Some(self.frames.buf.split_to(size).freeze()));
            }
            // Wait before choosing how to read: a spliced read sent meanwhile changes that.
            self.frames.r.readable().await?;
            let exact = self.splicing.load(Ordering::Relaxed) > 0;
            if exact && !self.looked_up && self.frames.buf.len() >= RREAD_HEAD {
                self.looked_up = true;
                if let Some(target) = self.splice_target(conn)? {
                    self.splice_reply(target).await?;
                    self.looked_up = false;
                    continue;
                }
            }
            let read = if exact {
                let limit = self.exact_room(size);
                let mut buf = (&mut self.frames.buf).limit(limit);
                self.frames.r.try_read_buf(&mut buf)
            } else {
                match size {
                    Some(size) => self.frames.room(size),
                    None => self.frames.room_for_batch(),
                }
                self.frames.r.try_read_buf(&mut self.frames.buf)
            };
            match read {
                Ok(0) => return self.frames.at_end(),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Makes room for a read while a spliced read is pending and says how much it may take: up
    /// to the end of the front frame's head, or once that is in, up to the end of the frame.
    fn exact_room(&mut self, size: Option<usize>) -> usize {
        let len = self.frames.buf.len();
        match size {
            Some(size) if len >= RREAD_HEAD => {
                self.frames.room(size);
                size.saturating_sub(len)
            }
            // A frame shorter than a head (Rclunk, 7 bytes) is followed by at most 4 bytes of
            // the next one's head: still nothing past a head.
            _ => {
                self.frames.room(RREAD_HEAD);
                RREAD_HEAD - len
            }
        }
    }

    /// The spliced read that the front frame answers, taken out of the pending map, if the
    /// frame is an Rread and one waits for its tag. The frame's head is in the buffer, its end
    /// is not.
    fn splice_target(&self, conn: &Weak<Inner>) -> Result<Option<SpliceTarget>> {
        let head = self
            .frames
            .buf
            .get(..RREAD_HEAD)
            .map(<[u8; RREAD_HEAD]>::try_from);
        let Some(Ok([s0, s1, s2, s3, ty, t0, t1, c0, c1, c2, c3])) = head else {
            return Ok(None);
        };
        if ty != RREAD {
            return Ok(None);
        }
        let size = u32::from_le_bytes([s0, s1, s2, s3]) as usize;
        let count = u32::from_le_bytes([c0, c1, c2, c3]) as usize;
        if size.checked_sub(RREAD_HEAD) != Some(count) {
            return Err(ClientError::Protocol(format!(
                "Rread of {size} bytes declares a payload of {count}"
            )));
        }
        let tag = u16::from_le_bytes([t0, t1]);
        let Some(inner) = conn.upgrade() else {
            return Ok(None);
        };
        let mut st = inner.lock();
        match st.pending.remove(&tag) {
            Some(Pending::Spliced { tx, pipe, .. }) => Ok(Some(SpliceTarget { tx, pipe, count })),
            Some(other) => {
                st.pending.insert(tag, other);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// Receives the rest of the Rread whose head is at the front of the buffer and answers `t`:
    /// the payload bytes already read are written into the pipe, the rest is spliced from the
    /// socket into it, and what the pipe does not take is read into memory. The whole frame is
    /// consumed whatever the pipe does, so the stream stays in step.
    async fn splice_reply(&mut self, t: SpliceTarget) -> Result<()> {
        let SpliceTarget { tx, pipe, count } = t;
        self.frames.buf.advance(RREAD_HEAD);
        // The buffer now holds the start of the payload, if anything, and nothing past it.
        let mut in_pipe = 0;
        let mut piping = true;
        while piping && !self.frames.buf.is_empty() {
            match nix::unistd::write(&*pipe, &self.frames.buf) {
                Ok(n) if n > 0 => {
                    self.frames.buf.advance(n);
                    in_pipe += n;
                }
                Err(Errno::EINTR) => {}
                Ok(_) | Err(Errno::EAGAIN) => piping = false,
                Err(e) => {
                    tracing::debug!(error = %e, "spliced read: the pipe refused the payload");
                    piping = false;
                }
            }
        }
        let mut unread = count.saturating_sub(in_pipe + self.frames.buf.len());
        while piping && unread > 0 {
            match self.splice_some(&pipe, unread).await? {
                Piped::Moved(n) => {
                    in_pipe += n;
                    unread = unread.saturating_sub(n);
                }
                Piped::End => return Err(truncated()),
                Piped::Stop(None) => piping = false,
                Piped::Stop(Some(e)) => {
                    tracing::debug!(error = %e, "spliced read: cannot splice into the pipe");
                    piping = false;
                }
            }
        }
        if unread > 0 {
            self.read_more(unread).await?;
        }
        let rest_len = count.saturating_sub(in_pipe).min(self.frames.buf.len());
        let rest = self.frames.buf.split_to(rest_len).freeze();
        // Let go of the pipe before the caller hears: then it is the caller's alone.
        drop(pipe);
        let _ = tx.send(Ok(Spliced { in_pipe, rest }));
        Ok(())
    }

    /// Reads exactly `n` more bytes into the buffer.
    async fn read_more(&mut self, n: usize) -> Result<()> {
        let want = self.frames.buf.len() + n;
        self.frames.room(want);
        while self.frames.buf.len() < want {
            self.frames.r.readable().await?;
            let left = want - self.frames.buf.len();
            let mut buf = (&mut self.frames.buf).limit(left);
            match self.frames.r.try_read_buf(&mut buf) {
                Ok(0) => return Err(truncated()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Splices up to `len` bytes from the socket into `pipe`, waiting until the socket has some.
    async fn splice_some(&self, pipe: &OwnedFd, len: usize) -> Result<Piped> {
        let sock: &UnixStream = self.frames.r.as_ref();
        loop {
            sock.readable().await?;
            // `try_io` clears the socket's readiness when the closure says WouldBlock, which
            // `splice_once` says only once it has seen the socket empty.
            match sock.try_io(Interest::READABLE, || splice_once(sock, pipe, len)) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                r => return Ok(r?),
            }
        }
    }
}

/// One non-blocking splice(2) of up to `len` bytes from `sock` into `pipe`.
///
/// EAGAIN says that the socket is empty or that the pipe is full: the kernel checks the pipe for
/// a free slot first, then reads the socket without waiting. A poll(2) of both without waiting
/// tells which. A full pipe stops the splicing ([`Piped::Stop`]), also if the socket is empty
/// (what follows waits for it). Only an empty socket with room in the pipe is `WouldBlock`, for
/// `try_io` to clear the readiness: data arriving after that poll raises it again. If both are
/// ready by the time of the poll (data came just after the splice, or the pipe's reader made
/// room) it tries once more, then gives up on the pipe rather than spin.
fn splice_once(sock: &UnixStream, pipe: &OwnedFd, len: usize) -> std::io::Result<Piped> {
    let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
    for _ in 0..2 {
        match splice(sock, None, pipe, None, len, flags) {
            Ok(0) => return Ok(Piped::End),
            Ok(n) => return Ok(Piped::Moved(n)),
            Err(Errno::EINTR) => return Ok(Piped::Moved(0)),
            Err(Errno::EAGAIN) => match blocked_side(sock, pipe) {
                Blocked::Socket => return Err(std::io::ErrorKind::WouldBlock.into()),
                Blocked::Pipe => return Ok(Piped::Stop(None)),
                Blocked::Neither => {}
            },
            // The socket's own failures end the connection, as they would a read.
            Err(e @ (Errno::ECONNRESET | Errno::ENOTCONN | Errno::ECONNABORTED)) => {
                return Err(e.into());
            }
            Err(e) => return Ok(Piped::Stop(Some(e))),
        }
    }
    Ok(Piped::Stop(Some(Errno::EAGAIN)))
}

/// Which of `sock` (for reading) and `pipe` (for writing) is not ready, by poll(2) without
/// waiting.
fn blocked_side(sock: &UnixStream, pipe: &OwnedFd) -> Blocked {
    let mut fds = [
        PollFd::new(sock.as_fd(), PollFlags::POLLIN),
        PollFd::new(pipe.as_fd(), PollFlags::POLLOUT),
    ];
    if poll(&mut fds, PollTimeout::ZERO).is_err() {
        // Cannot tell: giving up on the pipe for this reply is right either way.
        return Blocked::Pipe;
    }
    let [s, p] = fds;
    // Flags nix does not know make `revents` None: then each side is taken to be in the state
    // that cannot hang the reader (a pipe not to use, a socket to try again).
    let want_in = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
    if !p.revents().is_some_and(|r| r.contains(PollFlags::POLLOUT)) {
        Blocked::Pipe
    } else if !s.revents().is_none_or(|r| r.intersects(want_in)) {
        Blocked::Socket
    } else {
        Blocked::Neither
    }
}

/// Refuses a pipe that would block: the reader task writes into it, and must never wait for the
/// caller to read (who reads only once the reply is in).
fn require_nonblocking(pipe: &OwnedFd) -> Result<()> {
    // nix's fcntl takes the number; it does not outlive the borrow of `pipe`.
    let flags = fcntl(pipe.as_raw_fd(), FcntlArg::F_GETFL).map_err(std::io::Error::from)?;
    if OFlag::from_bits_truncate(flags).contains(OFlag::O_NONBLOCK) {
        Ok(())
    } else {
        Err(ClientError::Usage(
            "the pipe of a spliced read must be non-blocking (O_NONBLOCK)".into(),
        ))
    }
}

/// Tversion offering `msize`; returns the msize the server chose, which then bounds the frames
/// `frames` accepts.
async fn negotiate<R, W>(frames: &mut FrameReader<R>, w: &mut W, msize: u32) -> Result<u32>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
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
    let frame = frames.next().await?.ok_or(ClientError::Closed)?;
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
    frames.max = got;
    Ok(got)
}

impl Client {
    /// Dials `addr` and negotiates the version with [`DEFAULT_MSIZE`]. On a unix socket the
    /// client can splice ([`Client::handshake_unix`]).
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
                let s = UnixStream::connect(p).await.map_err(cerr)?;
                Client::handshake_unix(s, msize).await
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
    /// tasks (on the current tokio runtime). A client made so cannot splice: its spliced reads
    /// come back whole in memory ([`Spliced::rest`]).
    pub async fn handshake<R, W>(r: R, mut w: W, msize: u32) -> Result<Client>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let mut frames = FrameReader::new(r, msize.max(8192));
        let got = negotiate(&mut frames, &mut w, msize).await?;
        Ok(Client::run(frames, w, got, Arc::new(AtomicUsize::new(0))))
    }

    /// [`Client::handshake`] over a connected unix socket, with a reader that can splice the
    /// payload of a spliced read's reply into its pipe ([`Fid::read_call_spliced`]).
    pub async fn handshake_unix(stream: UnixStream, msize: u32) -> Result<Client> {
        let (r, mut w) = stream.into_split();
        let mut frames = FrameReader::new(r, msize.max(8192));
        let got = negotiate(&mut frames, &mut w, msize).await?;
        let splicing = Arc::new(AtomicUsize::new(0));
        let replies = UnixReplies {
            frames,
            splicing: Arc::clone(&splicing),
            looked_up: false,
        };
        Ok(Client::run(replies, w, got, splicing))
    }

    /// Starts the writer task and the reader task reading `replies`.
    fn run<S, W>(replies: S, w: W, msize: u32, splicing: Arc<AtomicUsize>) -> Client
    where
        S: ReplySource,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let writer: SharedWriter = Arc::new(Mutex::new(Writer {
            w: Box::pin(w),
            queue: std::collections::VecDeque::new(),
            enc: BytesMut::with_capacity(16 * 1024),
            waker: None,
            closed: false,
        }));
        let (gone_tx, gone) = watch::channel(false);
        let inner = Arc::new(Inner {
            msize,
            state: Mutex::new(State::default()),
            writer: Arc::clone(&writer),
            gone,
            splicing,
        });
        tokio::spawn(drain_writer(writer));
        tokio::spawn(read_replies(replies, Arc::downgrade(&inner), gone_tx));
        Client { inner }
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
        let tag = self.begin(m, Pending::Waiting(tx))?;
        Ok(Call {
            inner: Arc::clone(&self.inner),
            tag,
            rx,
            done: false,
        })
    }

    /// Sends a Tread whose Rread's payload goes into `pipe` as far as the reader can splice it.
    fn send_spliced(&self, m: &Tmsg, pipe: Arc<OwnedFd>) -> Result<SplicedCall> {
        let (tx, rx) = oneshot::channel();
        let pending = Pending::Spliced {
            tx,
            pipe,
            _counted: SpliceCount::new(&self.inner.splicing),
        };
        let tag = self.begin(m, pending)?;
        Ok(SplicedCall {
            inner: Arc::clone(&self.inner),
            tag,
            rx,
            done: false,
        })
    }

    /// Registers `pending` under a new tag, then sends `m` with that tag.
    fn begin(&self, m: &Tmsg, pending: Pending) -> Result<u16> {
        let tag = {
            let mut st = self.inner.lock();
            if st.closed {
                return Err(ClientError::Closed);
            }
            let tag = st.alloc_tag()?;
            st.pending.insert(tag, pending);
            tag
        };
        if let Err(e) = self.inner.send_frame(tag, m) {
            self.inner.lock().pending.remove(&tag);
            return Err(e);
        }
        Ok(tag)
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

    /// Sends a Tread now (the count clamped to the iounit); the reply's payload goes into `pipe`
    /// (the write end of a pipe, already non-blocking, empty, owned by this one request) as far
    /// as it fits, and the rest comes in memory: see [`Spliced`].
    ///
    /// Only a client on a unix socket ([`Client::dial`], [`Client::handshake_unix`]) splices;
    /// others, and a reply that was already read when it was recognised, give all of it in
    /// memory. A blocking pipe is refused ([`ClientError::Usage`]): the connection's reader
    /// writes into it and must never wait for the caller. If the pipe fails (its read end
    /// closed: EPIPE, with SIGPIPE ignored as Rust programs do by default) the rest of the
    /// payload comes in memory.
    ///
    /// The client holds a clone of `pipe` until it is done with the reply, and lets go of it
    /// before the call resolves. A call dropped while its reply was being received may have
    /// left part of the payload in the pipe: reuse such a pipe only once
    /// `Arc::strong_count(&pipe) == 1` (the client has let go) and it has been emptied.
    pub fn read_call_spliced(
        &self,
        offset: u64,
        count: u32,
        pipe: Arc<OwnedFd>,
    ) -> Result<SplicedCall> {
        require_nonblocking(&pipe)?;
        self.client.send_spliced(
            &Tmsg::Read {
                fid: self.num,
                offset,
                count: count.min(self.iounit()),
            },
            pipe,
        )
    }

    /// One spliced Tread ([`Fid::read_call_spliced`]).
    pub async fn read_spliced(
        &self,
        offset: u64,
        count: u32,
        pipe: Arc<OwnedFd>,
    ) -> Result<Spliced> {
        self.read_call_spliced(offset, count, pipe)?.await
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
