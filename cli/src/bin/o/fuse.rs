//! The FUSE session under `o mount`: the kernel mount, the `/dev/fuse` device, and the
//! encoding of requests and replies (the kernel's protocol 7.31, `linux/fuse.h`).
//!
//! It is ours rather than a crate's so that a read's reply can be spliced: the payload of a
//! Tread goes from the 9P socket into a pipe and from there into `/dev/fuse`, with one copy
//! (the kernel's, into the reader's pages) instead of two through a buffer of ours
//! (docs/benchmarks.md, "Where `cat` through `o mount` goes").
//!
//! Every number on the wire is in the machine's byte order. Every request is one `read(2)` of
//! the device and every reply one `writev(2)` or one `splice(2)` into it.

use std::ffi::OsStr;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use nix::errno::Errno as Sys;
use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// The protocol version we speak. 7.31 has everything the bridge uses (`max_pages`,
/// `FOPEN_DIRECT_IO`, `READDIRPLUS`, `RENAME2`) and fixes every structure's size.
const MAJOR: u32 = 7;
const MINOR: u32 = 31;

/// Sizes of the fixed headers.
pub(crate) const IN_HEADER: usize = 40;
pub(crate) const OUT_HEADER: usize = 16;
/// `fuse_attr`, `fuse_entry_out`.
const ATTR_LEN: usize = 88;
const ENTRY_LEN: usize = 40 + ATTR_LEN;
/// `fuse_dirent` without its name.
const DIRENT_LEN: usize = 24;

/// Opcodes the bridge answers (anything else gets ENOSYS).
pub(crate) mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
}

/// `fuse_init_out.flags` we take when the kernel offers them: reads of one file in parallel,
/// O_TRUNC passed to open, writes of `max_write`, readdirplus when the kernel thinks it pays,
/// parallel direct I/O and lookups, and `max_pages` (reads and writes of 1 MiB). Not the lock
/// flags: locks stay local to this machine, as on any FUSE file system that does not serve
/// them.
const ASYNC_READ: u32 = 1 << 0;
const ATOMIC_O_TRUNC: u32 = 1 << 3;
const BIG_WRITES: u32 = 1 << 5;
const DO_READDIRPLUS: u32 = 1 << 13;
const READDIRPLUS_AUTO: u32 = 1 << 14;
const ASYNC_DIO: u32 = 1 << 15;
const PARALLEL_DIROPS: u32 = 1 << 18;
const MAX_PAGES: u32 = 1 << 22;
const WANTED: u32 = ASYNC_READ
    | ATOMIC_O_TRUNC
    | BIG_WRITES
    | DO_READDIRPLUS
    | READDIRPLUS_AUTO
    | ASYNC_DIO
    | PARALLEL_DIROPS
    | MAX_PAGES;

/// `fuse_getattr_in.getattr_flags`: `fh` names the open file.
pub(crate) const GETATTR_FH: u32 = 1;
/// `fuse_setattr_in.valid` bits.
pub(crate) mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
}

/// A pipe is asked to hold this much: one whole read reply (the most an unprivileged process
/// may ask for by default, `/proc/sys/fs/pipe-max-size`).
const PIPE_SIZE: i32 = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Mounting.

/// Mounts a FUSE file system on `dir` and returns its device: as root with mount(2) (nosuid,
/// nodev, as fusermount3 would), otherwise through the setuid `fusermount3`, which sends the
/// device back over a socket.
pub(crate) fn mount(dir: &Path, allow_other: bool) -> Result<OwnedFd, String> {
    // What is in the directory would be hidden while mounted.
    let mut entries = std::fs::read_dir(dir).map_err(|e| e.to_string())?;
    if entries.next().is_some() {
        return Err("it is not empty".to_owned());
    }
    if nix::unistd::geteuid().is_root() {
        mount_root(dir, allow_other)
    } else {
        mount_user(dir, allow_other)
    }
}

fn mount_root(dir: &Path, allow_other: bool) -> Result<OwnedFd, String> {
    use nix::mount::MsFlags;
    let dev: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| format!("cannot open /dev/fuse: {e}"))?
        .into();
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={}",
        dev.as_raw_fd(),
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    if allow_other {
        data.push_str(",allow_other");
    }
    nix::mount::mount(
        Some("ollie"),
        dir,
        Some("fuse.ollie"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|e| format!("mount: {}", e.desc()))?;
    Ok(dev)
}

fn mount_user(dir: &Path, allow_other: bool) -> Result<OwnedFd, String> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    // fusermount3 gets its end through _FUSE_COMMFD, so that end is made without
    // close-on-exec (ours has it) and closed here once the child has it.
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::empty(),
    )
    .map_err(|e| format!("socketpair: {}", e.desc()))?;
    nix::fcntl::fcntl(
        ours.as_raw_fd(),
        FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|e| format!("fcntl: {}", e.desc()))?;
    let mut opts = String::from("fsname=ollie,subtype=ollie");
    if allow_other {
        opts.push_str(",allow_other");
    }
    let mut child = Command::new("fusermount3")
        .arg("-o")
        .arg(&opts)
        .arg("--")
        .arg(dir)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                "fusermount3 not found: install the fuse3 package (or mount as root)".to_owned()
            }
            _ => format!("cannot run fusermount3: {e}"),
        })?;
    drop(theirs);
    let got = ollie_sandbox::recv_fd(&ours, &mut [0u8; 1]);
    // fusermount3 has said why on standard error if it failed; its status is the verdict.
    let status = child
        .wait()
        .map_err(|e| format!("waiting for fusermount3: {e}"))?;
    match got {
        Ok((_, Some(dev))) if status.success() => Ok(dev),
        _ if !status.success() => Err(format!("fusermount3 failed ({status})")),
        Ok(_) => Err("fusermount3 sent no device".to_owned()),
        Err(e) => Err(format!("receiving the device from fusermount3: {e}")),
    }
}

// ---------------------------------------------------------------------------------------------
// The device.

/// A mounted file system's `/dev/fuse`: requests are read from it, replies written to it.
pub(crate) struct Device {
    fd: AsyncFd<OwnedFd>,
}

impl Device {
    pub(crate) fn new(fd: OwnedFd) -> std::io::Result<Device> {
        set_nonblocking(&fd)?;
        // Deprecated for an `unsafe` constructor whose one condition (the descriptor stays
        // open and the same for the AsyncFd's life) an `OwnedFd` meets by its type; this
        // crate has no unsafe code.
        #[allow(deprecated)]
        let fd = AsyncFd::with_interest(fd, Interest::READABLE)?;
        Ok(Device { fd })
    }

    /// Reads the next request into `buf` (which must hold the largest, a write of
    /// `max_write`); `None` once the file system is unmounted.
    pub(crate) async fn next(&self, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
        loop {
            let mut ready = self.fd.readable().await?;
            let got = ready.try_io(|fd| {
                nix::unistd::read(fd.get_ref().as_raw_fd(), buf).map_err(std::io::Error::from)
            });
            match got {
                Ok(Ok(n)) => return Ok(Some(n)),
                // A request interrupted before it was read is gone (ENOENT).
                Ok(Err(e)) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINTR)) => {}
                Ok(Err(e)) if e.raw_os_error() == Some(libc::ENODEV) => return Ok(None),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
    }

    /// Answers request `unique` with `body` (the header is added).
    pub(crate) fn reply(&self, unique: u64, body: &[&[u8]]) {
        let len: usize = OUT_HEADER + body.iter().map(|b| b.len()).sum::<usize>();
        let head = out_header(len, 0, unique);
        let mut iov = Vec::with_capacity(body.len() + 1);
        iov.push(IoSlice::new(&head));
        iov.extend(
            body.iter()
                .filter(|b| !b.is_empty())
                .map(|b| IoSlice::new(b)),
        );
        self.send(&iov);
    }

    /// Answers request `unique` with an error number.
    pub(crate) fn reply_err(&self, unique: u64, errno: i32) {
        let head = out_header(OUT_HEADER, -errno, unique);
        self.send(&[IoSlice::new(&head)]);
    }

    fn send(&self, iov: &[IoSlice<'_>]) {
        match nix::sys::uio::writev(self.fd.get_ref(), iov) {
            // ENOENT: the request was interrupted and the kernel no longer waits for it.
            Ok(_) | Err(Sys::ENOENT) => {}
            Err(e) => eprintln!("o mount: a reply to the kernel failed: {}", e.desc()),
        }
    }

    /// Answers read `unique` with the `len` bytes waiting in `pipes`' data pipe (all it
    /// holds): the header goes into the head pipe, the payload's pages are moved behind it,
    /// and the whole reply is spliced into the device, which copies it once, into the
    /// reader's pages. Should a pipe refuse its part (the head pipe cannot take all of the
    /// data pipe's pieces), what the pipes hold is read back and sent by copy. Returns
    /// whether the pipes are empty again, to be used for another reply.
    pub(crate) fn reply_spliced(&self, unique: u64, pipes: &Pipes, len: usize) -> bool {
        let head = out_header(OUT_HEADER + len, 0, unique);
        let mut headed = false;
        let staged = (|| {
            if nix::unistd::write(&pipes.head_w, &head)? != head.len() {
                return Err(Sys::EAGAIN);
            }
            headed = true;
            let mut moved = 0;
            while moved < len {
                match nix::fcntl::splice(
                    pipes.data_r.as_fd(),
                    None,
                    pipes.head_w.as_fd(),
                    None,
                    len - moved,
                    SPLICE,
                )? {
                    0 => return Err(Sys::EPIPE),
                    n => moved += n,
                }
            }
            Ok(())
        })();
        if staged.is_err() {
            // Nothing has reached the device: send what the pipes hold by copy.
            let mut bytes = Vec::with_capacity(OUT_HEADER + len);
            let drained =
                drain(&pipes.head_r, &mut bytes).and_then(|()| drain(&pipes.data_r, &mut bytes));
            let body = if headed {
                bytes.get(OUT_HEADER..)
            } else {
                Some(&bytes[..])
            };
            match (drained, body) {
                (Ok(()), Some(body)) if body.len() == len => {
                    self.reply(unique, &[body]);
                    return true;
                }
                _ => {
                    self.reply_err(unique, libc::EIO);
                    return false;
                }
            }
        }
        match nix::fcntl::splice(
            pipes.head_r.as_fd(),
            None,
            self.fd.get_ref().as_fd(),
            None,
            OUT_HEADER + len,
            SPLICE,
        ) {
            Ok(n) if n == OUT_HEADER + len => true,
            // The request was interrupted and is gone: nothing to answer.
            Err(Sys::ENOENT) => false,
            other => {
                eprintln!("o mount: a spliced reply to the kernel failed: {other:?}");
                self.reply_err(unique, libc::EIO);
                false
            }
        }
    }
}

/// Pipes never wait; pages move between them rather than being copied where they can.
const SPLICE: SpliceFFlags = SpliceFFlags::SPLICE_F_NONBLOCK.union(SpliceFFlags::SPLICE_F_MOVE);

/// Appends what the pipe `r` holds to `into`.
fn drain(r: &OwnedFd, into: &mut Vec<u8>) -> Result<(), Sys> {
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match nix::unistd::read(r.as_raw_fd(), &mut chunk) {
            Ok(0) | Err(Sys::EAGAIN) => return Ok(()),
            Ok(n) => into.extend_from_slice(&chunk[..n]),
            Err(Sys::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
}

fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    let flags = nix::fcntl::fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// The two pipes of a spliced read reply: `data` receives the payload from the 9P socket,
/// `head` the reply's header and then the payload behind it. Both are non-blocking and asked
/// to hold one whole reply; they are empty whenever they are not in use.
#[derive(Debug)]
pub(crate) struct Pipes {
    data_r: OwnedFd,
    pub(crate) data_w: std::sync::Arc<OwnedFd>,
    head_r: OwnedFd,
    head_w: OwnedFd,
}

impl Pipes {
    pub(crate) fn new() -> std::io::Result<Pipes> {
        let flags = OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let (data_r, data_w) = nix::unistd::pipe2(flags)?;
        let (head_r, head_w) = nix::unistd::pipe2(flags)?;
        for p in [&data_w, &head_w] {
            // Beyond this user's limit the default size still works; more replies then take
            // the copying path.
            let _ = nix::fcntl::fcntl(p.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        }
        Ok(Pipes {
            data_r,
            data_w: std::sync::Arc::new(data_w),
            head_r,
            head_w,
        })
    }

    /// Appends what the data pipe holds to `into` (a reply that is copied after all).
    pub(crate) fn drain_data(&self, into: &mut Vec<u8>) -> Result<(), Sys> {
        drain(&self.data_r, into)
    }
}

fn out_header(len: usize, error: i32, unique: u64) -> [u8; OUT_HEADER] {
    let mut h = [0u8; OUT_HEADER];
    h[..4].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..].copy_from_slice(&unique.to_ne_bytes());
    h
}

// ---------------------------------------------------------------------------------------------
// Requests.

/// One request from the kernel.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) unique: u64,
    pub(crate) opcode: u32,
    pub(crate) nodeid: u64,
    /// The request's arguments, after the header.
    pub(crate) body: Bytes,
}

impl Request {
    /// Decodes what one read of the device returned.
    pub(crate) fn parse(raw: &[u8]) -> Result<Request, String> {
        let mut a = Args::new(raw);
        let (Some(len), Some(opcode), Some(unique), Some(nodeid)) =
            (a.u32(), a.u32(), a.u64(), a.u64())
        else {
            return Err(format!(
                "a request of {} bytes, shorter than its header",
                raw.len()
            ));
        };
        if len as usize != raw.len() || raw.len() < IN_HEADER {
            return Err(format!(
                "a request of {} bytes says it has {len}",
                raw.len()
            ));
        }
        Ok(Request {
            unique,
            opcode,
            nodeid,
            body: Bytes::copy_from_slice(&raw[IN_HEADER..]),
        })
    }

    pub(crate) fn args(&self) -> Args<'_> {
        Args::new(&self.body)
    }
}

/// Reads a request's arguments in order; `None` when they run out (a malformed request).
pub(crate) struct Args<'a> {
    b: &'a [u8],
}

impl<'a> Args<'a> {
    fn new(b: &'a [u8]) -> Args<'a> {
        Args { b }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.b.len() < n {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_ne_bytes)
    }

    pub(crate) fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }

    /// A NUL-terminated name.
    pub(crate) fn name(&mut self) -> Option<&'a OsStr> {
        let end = self.b.iter().position(|&c| c == 0)?;
        let name = self.take(end)?;
        self.skip(1)?;
        Some(OsStr::from_bytes(name))
    }

    /// Everything that is left (a write's data).
    pub(crate) fn rest(self) -> &'a [u8] {
        self.b
    }
}

// ---------------------------------------------------------------------------------------------
// Replies.

/// A file's attributes as FUSE carries them (`fuse_attr`); times are whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attr {
    pub(crate) ino: u64,
    pub(crate) size: u64,
    pub(crate) atime: u64,
    pub(crate) mtime: u64,
    /// The type bits (S_IFDIR or S_IFREG) and the permissions.
    pub(crate) mode: u32,
    pub(crate) nlink: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) blksize: u32,
}

impl Attr {
    fn put(&self, out: &mut Vec<u8>) {
        let ctime = self.mtime;
        for v in [
            self.ino,
            self.size,
            self.size.div_ceil(512),
            self.atime,
            self.mtime,
            ctime,
        ] {
            out.extend_from_slice(&v.to_ne_bytes());
        }
        // atimensec, mtimensec, ctimensec, mode, nlink, uid, gid, rdev, blksize, flags.
        for v in [
            0,
            0,
            0,
            self.mode,
            self.nlink,
            self.uid,
            self.gid,
            0,
            self.blksize,
            0,
        ] {
            out.extend_from_slice(&v.to_ne_bytes());
        }
    }
}

fn put_valid(out: &mut Vec<u8>, ttl: Duration) {
    out.extend_from_slice(&ttl.as_secs().to_ne_bytes());
}

fn put_valid_nsec(out: &mut Vec<u8>, ttl: Duration) {
    out.extend_from_slice(&ttl.subsec_nanos().to_ne_bytes());
}

/// `fuse_entry_out`: a node the kernel now holds one more reference to.
pub(crate) fn entry_out(out: &mut Vec<u8>, attr: &Attr, entry_ttl: Duration, attr_ttl: Duration) {
    out.extend_from_slice(&attr.ino.to_ne_bytes());
    out.extend_from_slice(&0u64.to_ne_bytes()); // generation
    put_valid(out, entry_ttl);
    put_valid(out, attr_ttl);
    put_valid_nsec(out, entry_ttl);
    put_valid_nsec(out, attr_ttl);
    attr.put(out);
}

/// `fuse_attr_out`.
pub(crate) fn attr_out(attr: &Attr, ttl: Duration) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + ATTR_LEN);
    put_valid(&mut out, ttl);
    put_valid_nsec(&mut out, ttl);
    out.extend_from_slice(&0u32.to_ne_bytes());
    attr.put(&mut out);
    out
}

/// `fuse_open_out`.
pub(crate) fn open_out(out: &mut Vec<u8>, fh: u64, open_flags: u32) {
    out.extend_from_slice(&fh.to_ne_bytes());
    out.extend_from_slice(&open_flags.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
}

/// `fuse_write_out`.
pub(crate) fn write_out(size: u32) -> Vec<u8> {
    let mut out = size.to_ne_bytes().to_vec();
    out.extend_from_slice(&0u32.to_ne_bytes());
    out
}

/// `fuse_statfs_out`: no blocks or inodes to count, 4 KiB blocks, names of up to 255 bytes.
pub(crate) fn statfs_out() -> Vec<u8> {
    let mut out = vec![0u8; 5 * 8];
    for v in [4096u32, 255, 4096] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
    out.resize(80, 0);
    out
}

/// The reply to INIT: our version, the flags we take of those offered, and the largest write
/// (and, through `max_pages`, read) of `max_io` bytes. An error number when the kernel speaks
/// another major version.
pub(crate) fn init_out(body: &[u8], max_io: u32) -> Result<Vec<u8>, i32> {
    let mut a = Args::new(body);
    let (Some(major), Some(_minor), Some(readahead), Some(offered)) =
        (a.u32(), a.u32(), a.u32(), a.u32())
    else {
        return Err(libc::EINVAL);
    };
    if major != MAJOR {
        return Err(libc::EPROTO);
    }
    let pages = u16::try_from(max_io.div_ceil(4096)).unwrap_or(u16::MAX);
    let mut out = Vec::with_capacity(64);
    for v in [MAJOR, MINOR, readahead, offered & WANTED] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
    out.extend_from_slice(&12u16.to_ne_bytes()); // max_background
    out.extend_from_slice(&9u16.to_ne_bytes()); // congestion_threshold
    out.extend_from_slice(&max_io.to_ne_bytes()); // max_write
    out.extend_from_slice(&1u32.to_ne_bytes()); // time_gran (ns)
    out.extend_from_slice(&pages.to_ne_bytes()); // max_pages
    out.resize(64, 0);
    Ok(out)
}

/// How many bytes a directory entry named `name` takes (`fuse_dirent`, after a
/// `fuse_entry_out` with `plus`), padded to 8.
pub(crate) fn dirent_len(name: &OsStr, plus: bool) -> usize {
    let padded = (DIRENT_LEN + name.len()).div_ceil(8) * 8;
    if plus { ENTRY_LEN + padded } else { padded }
}

/// Adds one directory entry whose successor is at offset `next`. With `plus`, `entry` is
/// what its `fuse_entry_out` says (none for "." and "..", for which the kernel takes no
/// reference).
pub(crate) fn put_dirent(
    out: &mut Vec<u8>,
    plus: Option<Option<(&Attr, Duration, Duration)>>,
    ino: u64,
    next: u64,
    dir: bool,
    name: &OsStr,
) {
    let start = out.len();
    match plus {
        Some(Some((attr, e, a))) => entry_out(out, attr, e, a),
        Some(None) => out.resize(start + ENTRY_LEN, 0),
        None => {}
    }
    let kind = u32::from(if dir { libc::DT_DIR } else { libc::DT_REG });
    out.extend_from_slice(&ino.to_ne_bytes());
    out.extend_from_slice(&next.to_ne_bytes());
    out.extend_from_slice(&u32::try_from(name.len()).unwrap_or(0).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(name.as_bytes());
    out.resize(start + dirent_len(name, plus.is_some()), 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(len: usize, opcode: u32, unique: u64, nodeid: u64) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&u32::try_from(len).unwrap().to_ne_bytes());
        h.extend_from_slice(&opcode.to_ne_bytes());
        h.extend_from_slice(&unique.to_ne_bytes());
        h.extend_from_slice(&nodeid.to_ne_bytes());
        h.resize(IN_HEADER, 0);
        h
    }

    #[test]
    fn requests_decode_and_malformed_ones_are_refused() {
        let mut raw = header(IN_HEADER + 6, op::LOOKUP, 7, 1);
        raw.extend_from_slice(b"chat\0\0");
        let r = Request::parse(&raw).unwrap();
        assert_eq!((r.unique, r.opcode, r.nodeid), (7, op::LOOKUP, 1));
        let mut a = r.args();
        assert_eq!(a.name(), Some(OsStr::new("chat")));
        assert_eq!(a.name(), Some(OsStr::new("")));
        assert_eq!(a.name(), None);
        assert_eq!(a.u32(), None);

        // A length that is not what was read, or shorter than the header.
        assert!(Request::parse(&raw[..raw.len() - 1]).is_err());
        assert!(Request::parse(&header(8, op::LOOKUP, 1, 1)[..8]).is_err());
        let short = header(20, op::GETATTR, 1, 1);
        assert!(Request::parse(&short[..20]).is_err());
        // Whatever bytes come, decoding answers without panicking.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..2000 {
            let len = n % 97;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            if let Ok(r) = Request::parse(&bytes) {
                let mut a = r.args();
                let _ = (a.u64(), a.name(), a.u32(), a.skip(3));
                let _ = init_out(&r.body, 1 << 20);
            }
        }
        // A name without its NUL is not a name.
        let mut a = Args::new(b"abc");
        assert_eq!(a.name(), None);
    }

    #[test]
    fn replies_have_the_kernels_sizes() {
        let attr = Attr {
            ino: 5,
            size: 1000,
            atime: 1,
            mtime: 2,
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            uid: 1000,
            gid: 100,
            blksize: 1 << 20,
        };
        let mut e = Vec::new();
        entry_out(&mut e, &attr, Duration::from_millis(1500), Duration::ZERO);
        assert_eq!(e.len(), ENTRY_LEN);
        assert_eq!(&e[..8], &5u64.to_ne_bytes());
        assert_eq!(
            &e[16..24],
            &1u64.to_ne_bytes(),
            "entry_valid: whole seconds"
        );
        assert_eq!(&e[32..36], &500_000_000u32.to_ne_bytes(), "and nanoseconds");
        // fuse_attr: blocks of 512 bytes, then mode at offset 60.
        let a = &e[40..];
        assert_eq!(&a[16..24], &2u64.to_ne_bytes());
        assert_eq!(&a[60..64], &(libc::S_IFREG | 0o644).to_ne_bytes());
        assert_eq!(&a[80..84], &(1u32 << 20).to_ne_bytes());
        assert_eq!(attr_out(&attr, Duration::ZERO).len(), 16 + ATTR_LEN);
        assert_eq!(statfs_out().len(), 80);
        assert_eq!(write_out(3).len(), 8);
        let mut o = Vec::new();
        open_out(&mut o, 9, 1);
        assert_eq!(o.len(), 16);
    }

    #[test]
    fn init_takes_only_what_we_want_and_refuses_another_major() {
        let mut body = Vec::new();
        for v in [7u32, 45, 128 * 1024, u32::MAX] {
            body.extend_from_slice(&v.to_ne_bytes());
        }
        let out = init_out(&body, 1 << 20).unwrap();
        assert_eq!(out.len(), 64);
        let word = |i: usize| u32::from_ne_bytes(out[i..i + 4].try_into().unwrap());
        assert_eq!((word(0), word(4), word(8)), (7, MINOR, 128 * 1024));
        assert_eq!(word(12), WANTED, "no lock flags: locks stay local");
        assert_eq!(word(20), 1 << 20, "max_write");
        assert_eq!(u16::from_ne_bytes([out[28], out[29]]), 256, "max_pages");
        // Only what is offered is taken.
        body[12..16].copy_from_slice(&ASYNC_READ.to_ne_bytes());
        let out = init_out(&body, 4096).unwrap();
        assert_eq!(
            u32::from_ne_bytes(out[12..16].try_into().unwrap()),
            ASYNC_READ
        );
        body[..4].copy_from_slice(&8u32.to_ne_bytes());
        assert_eq!(init_out(&body, 4096), Err(libc::EPROTO));
        assert_eq!(init_out(&body[..8], 4096), Err(libc::EINVAL));
    }

    #[test]
    fn directory_entries_are_padded_to_eight() {
        let mut out = Vec::new();
        put_dirent(&mut out, None, 3, 1, true, OsStr::new("."));
        assert_eq!(out.len(), 32);
        put_dirent(&mut out, None, 4, 2, false, OsStr::new("12345678"));
        assert_eq!(out.len(), 64);
        assert_eq!(
            &out[32 + 20..32 + 24],
            &u32::from(libc::DT_REG).to_ne_bytes()
        );
        assert_eq!(dirent_len(OsStr::new("a"), true), ENTRY_LEN + 32);
        let mut plus = Vec::new();
        put_dirent(&mut plus, Some(None), 1, 1, true, OsStr::new(".."));
        assert_eq!(plus.len(), ENTRY_LEN + 32);
        assert!(
            plus[..ENTRY_LEN].iter().all(|&b| b == 0),
            "nodeid 0: no reference"
        );
    }
}
