//! The 9P2000 wire format: message types, qids, stats, and a codec that never panics.
//!
//! Decoding works on one whole frame (`size[4] type[1] tag[2] body`) that the caller has already
//! read and bounded by msize, so nothing here allocates more than the frame it was given (plus at
//! most [`MAXWELEM`] small vectors). Payloads of `Twrite` and `Rread` are zero-copy slices of the
//! frame's [`Bytes`]. Encoding writes into a [`BytesMut`]; large payloads can be emitted as a
//! separate chunk ([`encode_r_parts`]) so the writer can hand them to `writev` without a copy.

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;

/// The version string we speak.
pub const VERSION: &str = "9P2000";
/// The tag used by Tversion/Rversion.
pub const NOTAG: u16 = 0xFFFF;
/// "No fid": used as afid when attaching without authentication.
pub const NOFID: u32 = 0xFFFF_FFFF;
/// Most names one Twalk may carry.
pub const MAXWELEM: usize = 16;
/// Bytes of header a Twrite/Rread adds around its payload; iounit = msize − IOHDRSZ.
pub const IOHDRSZ: u32 = 24;
/// `size[4] type[1] tag[2]`.
pub const HEADER_LEN: usize = 7;
/// Fixed part of a stat entry (everything but the four strings' bytes), including `size[2]`.
pub const STAT_FIXED_LEN: usize = 2 + 2 + 4 + 13 + 4 + 4 + 4 + 8 + 4 * 2;

/// Open modes (the low two bits) and flags.
pub mod om {
    pub const OREAD: u8 = 0;
    pub const OWRITE: u8 = 1;
    pub const ORDWR: u8 = 2;
    pub const OEXEC: u8 = 3;
    pub const OTRUNC: u8 = 0x10;
    pub const ORCLOSE: u8 = 0x40;
}

/// Qid types.
pub mod qt {
    pub const DIR: u8 = 0x80;
    pub const APPEND: u8 = 0x40;
    pub const EXCL: u8 = 0x20;
    pub const AUTH: u8 = 0x08;
    pub const TMP: u8 = 0x04;
    pub const FILE: u8 = 0x00;
}

/// Permission/mode bits of a stat.
pub mod dm {
    pub const DIR: u32 = 0x8000_0000;
    pub const APPEND: u32 = 0x4000_0000;
    pub const EXCL: u32 = 0x2000_0000;
    pub const AUTH: u32 = 0x0800_0000;
    pub const TMP: u32 = 0x0400_0000;
}

/// Message type numbers.
mod ty {
    pub const TVERSION: u8 = 100;
    pub const RVERSION: u8 = 101;
    pub const TAUTH: u8 = 102;
    pub const RAUTH: u8 = 103;
    pub const TATTACH: u8 = 104;
    pub const RATTACH: u8 = 105;
    pub const RERROR: u8 = 107;
    pub const TFLUSH: u8 = 108;
    pub const RFLUSH: u8 = 109;
    pub const TWALK: u8 = 110;
    pub const RWALK: u8 = 111;
    pub const TOPEN: u8 = 112;
    pub const ROPEN: u8 = 113;
    pub const TCREATE: u8 = 114;
    pub const RCREATE: u8 = 115;
    pub const TREAD: u8 = 116;
    pub const RREAD: u8 = 117;
    pub const TWRITE: u8 = 118;
    pub const RWRITE: u8 = 119;
    pub const TCLUNK: u8 = 120;
    pub const RCLUNK: u8 = 121;
    pub const TREMOVE: u8 = 122;
    pub const RREMOVE: u8 = 123;
    pub const TSTAT: u8 = 124;
    pub const RSTAT: u8 = 125;
    pub const TWSTAT: u8 = 126;
    pub const RWSTAT: u8 = 127;
}

/// A server's unique identification of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Qid {
    /// File type bits ([`qt`]).
    pub ty: u8,
    /// Changes whenever the file's contents change.
    pub version: u32,
    /// Unique among all files of the server.
    pub path: u64,
}

impl Qid {
    pub const LEN: usize = 13;

    /// Whether this qid names a directory.
    pub fn is_dir(&self) -> bool {
        self.ty & qt::DIR != 0
    }
}

/// A directory entry (strict 9P2000: no .u extensions).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stat {
    /// For kernel use.
    pub ty: u16,
    /// For kernel use.
    pub dev: u32,
    /// The file's qid.
    pub qid: Qid,
    /// Permission bits and [`dm`] flags.
    pub mode: u32,
    /// Last access time, seconds since the epoch.
    pub atime: u32,
    /// Last modification time, seconds since the epoch.
    pub mtime: u32,
    /// Length in bytes (0 for directories and most synthetic files).
    pub length: u64,
    /// Last path element.
    pub name: String,
    /// Owner.
    pub uid: String,
    /// Group.
    pub gid: String,
    /// Last modifier.
    pub muid: String,
}

impl Stat {
    /// The "don't touch" stat a Twstat uses for fields it leaves alone: all integers ~0, all
    /// strings empty.
    pub fn dont_touch() -> Stat {
        Stat {
            ty: u16::MAX,
            dev: u32::MAX,
            qid: Qid {
                ty: u8::MAX,
                version: u32::MAX,
                path: u64::MAX,
            },
            mode: u32::MAX,
            atime: u32::MAX,
            mtime: u32::MAX,
            length: u64::MAX,
            name: String::new(),
            uid: String::new(),
            gid: String::new(),
            muid: String::new(),
        }
    }

    /// Whether every field is "don't touch" (such a Twstat asks only for a sync).
    pub fn is_dont_touch(&self) -> bool {
        *self == Stat::dont_touch()
    }

    /// Whether this Twstat asks only to truncate to length 0 (what `open(…, O_TRUNC)` through
    /// a FUSE bridge sends before writing, e.g. `echo cmd > ctl`).
    pub fn is_truncation(&self) -> bool {
        let mut trunc = Stat::dont_touch();
        trunc.length = 0;
        *self == trunc
    }

    /// Encoded size of this entry, including its own `size[2]` field.
    pub fn encoded_len(&self) -> usize {
        STAT_FIXED_LEN + self.name.len() + self.uid.len() + self.gid.len() + self.muid.len()
    }
}

/// A request (T-message) body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tmsg {
    Version {
        msize: u32,
        version: String,
    },
    Auth {
        afid: u32,
        uname: String,
        aname: String,
    },
    Attach {
        fid: u32,
        afid: u32,
        uname: String,
        aname: String,
    },
    Flush {
        oldtag: u16,
    },
    Walk {
        fid: u32,
        newfid: u32,
        wnames: Vec<String>,
    },
    Open {
        fid: u32,
        mode: u8,
    },
    Create {
        fid: u32,
        name: String,
        perm: u32,
        mode: u8,
    },
    Read {
        fid: u32,
        offset: u64,
        count: u32,
    },
    Write {
        fid: u32,
        offset: u64,
        data: Bytes,
    },
    Clunk {
        fid: u32,
    },
    Remove {
        fid: u32,
    },
    Stat {
        fid: u32,
    },
    Wstat {
        fid: u32,
        stat: Stat,
    },
}

impl Tmsg {
    /// The fid a request acts on, if any (Twalk: the source fid).
    pub fn fid(&self) -> Option<u32> {
        match self {
            Tmsg::Version { .. } | Tmsg::Flush { .. } => None,
            Tmsg::Auth { afid, .. } => Some(*afid),
            Tmsg::Attach { fid, .. }
            | Tmsg::Walk { fid, .. }
            | Tmsg::Open { fid, .. }
            | Tmsg::Create { fid, .. }
            | Tmsg::Read { fid, .. }
            | Tmsg::Write { fid, .. }
            | Tmsg::Clunk { fid }
            | Tmsg::Remove { fid }
            | Tmsg::Stat { fid }
            | Tmsg::Wstat { fid, .. } => Some(*fid),
        }
    }

    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Tmsg::Version { .. } => "Tversion",
            Tmsg::Auth { .. } => "Tauth",
            Tmsg::Attach { .. } => "Tattach",
            Tmsg::Flush { .. } => "Tflush",
            Tmsg::Walk { .. } => "Twalk",
            Tmsg::Open { .. } => "Topen",
            Tmsg::Create { .. } => "Tcreate",
            Tmsg::Read { .. } => "Tread",
            Tmsg::Write { .. } => "Twrite",
            Tmsg::Clunk { .. } => "Tclunk",
            Tmsg::Remove { .. } => "Tremove",
            Tmsg::Stat { .. } => "Tstat",
            Tmsg::Wstat { .. } => "Twstat",
        }
    }
}

/// A reply (R-message) body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rmsg {
    Version { msize: u32, version: String },
    Auth { aqid: Qid },
    Attach { qid: Qid },
    Error { ename: String },
    Flush,
    Walk { wqids: Vec<Qid> },
    Open { qid: Qid, iounit: u32 },
    Create { qid: Qid, iounit: u32 },
    Read { data: Bytes },
    Write { count: u32 },
    Clunk,
    Remove,
    Stat { stat: Stat },
    Wstat,
}

impl Rmsg {
    /// An Rerror with this message.
    pub fn error(ename: impl Into<String>) -> Rmsg {
        Rmsg::Error {
            ename: ename.into(),
        }
    }
}

/// Why a frame could not be decoded. Every variant is a protocol error by the peer.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    #[error("message too short: needed {need} more bytes")]
    Short { need: usize },
    #[error("declared size {declared} does not match frame length {actual}")]
    SizeMismatch { declared: usize, actual: usize },
    #[error("message of {size} bytes is larger than msize {max}")]
    TooLarge { size: usize, max: usize },
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("string is not valid utf-8")]
    BadUtf8,
    #[error("string contains a nul byte")]
    Nul,
    #[error("too many walk elements: {0} (at most 16)")]
    TooManyNames(usize),
    #[error("{0} trailing bytes after message")]
    Trailing(usize),
    #[error("stat size {declared} does not match its contents ({actual})")]
    BadStatSize { declared: usize, actual: usize },
}

/// Why a message could not be encoded.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EncodeError {
    #[error("string of {0} bytes is longer than 65535")]
    StringTooLong(usize),
    #[error("too many walk elements: {0} (at most 16)")]
    TooManyNames(usize),
    #[error("payload of {0} bytes does not fit a 9P count")]
    PayloadTooLarge(usize),
    #[error("stat entry of {0} bytes does not fit a 9P stat")]
    StatTooLarge(usize),
    #[error("string contains a nul byte")]
    Nul,
}

/// A bounds-checked little-endian reader over one frame.
struct Cursor {
    buf: Bytes,
    pos: usize,
}

impl Cursor {
    fn need(&self, n: usize) -> Result<(), DecodeError> {
        let left = self.buf.len() - self.pos;
        if left < n {
            Err(DecodeError::Short { need: n - left })
        } else {
            Ok(())
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        self.need(n)?;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        let n = usize::from(self.u16()?);
        let s = self.take(n)?;
        if s.contains(&0) {
            return Err(DecodeError::Nul);
        }
        std::str::from_utf8(s)
            .map(str::to_owned)
            .map_err(|_| DecodeError::BadUtf8)
    }

    fn qid(&mut self) -> Result<Qid, DecodeError> {
        Ok(Qid {
            ty: self.u8()?,
            version: self.u32()?,
            path: self.u64()?,
        })
    }

    fn data(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.u32()? as usize;
        self.need(n)?;
        let d = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(d)
    }

    fn stat(&mut self) -> Result<Stat, DecodeError> {
        let start = self.pos;
        let size = usize::from(self.u16()?);
        self.need(size)?;
        let st = Stat {
            ty: self.u16()?,
            dev: self.u32()?,
            qid: self.qid()?,
            mode: self.u32()?,
            atime: self.u32()?,
            mtime: self.u32()?,
            length: self.u64()?,
            name: self.string()?,
            uid: self.string()?,
            gid: self.string()?,
            muid: self.string()?,
        };
        let actual = self.pos - start - 2;
        if actual != size {
            return Err(DecodeError::BadStatSize {
                declared: size,
                actual,
            });
        }
        Ok(st)
    }

    fn finish(&self) -> Result<(), DecodeError> {
        let left = self.buf.len() - self.pos;
        if left != 0 {
            return Err(DecodeError::Trailing(left));
        }
        Ok(())
    }
}

/// The fixed header of a frame: its declared size, type and tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub size: u32,
    pub ty: u8,
    pub tag: u16,
}

/// Reads the header of a frame. `buf` must hold at least [`HEADER_LEN`] bytes.
pub fn decode_header(buf: &[u8]) -> Result<Header, DecodeError> {
    if buf.len() < HEADER_LEN {
        return Err(DecodeError::Short {
            need: HEADER_LEN - buf.len(),
        });
    }
    Ok(Header {
        size: u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]),
        ty: buf[4],
        tag: u16::from_le_bytes([buf[5], buf[6]]),
    })
}

fn open_frame(frame: Bytes) -> Result<(Header, Cursor), DecodeError> {
    let h = decode_header(&frame)?;
    if h.size as usize != frame.len() {
        return Err(DecodeError::SizeMismatch {
            declared: h.size as usize,
            actual: frame.len(),
        });
    }
    Ok((
        h,
        Cursor {
            buf: frame,
            pos: HEADER_LEN,
        },
    ))
}

fn wnames(c: &mut Cursor) -> Result<Vec<String>, DecodeError> {
    let n = usize::from(c.u16()?);
    if n > MAXWELEM {
        return Err(DecodeError::TooManyNames(n));
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(c.string()?);
    }
    Ok(v)
}

/// Decodes one whole T-message frame (including its size field). Returns the tag and body.
///
/// On a body error the tag is still known: use [`decode_header`] to answer with Rerror.
pub fn decode_t(frame: Bytes) -> Result<(u16, Tmsg), DecodeError> {
    let (h, mut c) = open_frame(frame)?;
    let m = match h.ty {
        ty::TVERSION => Tmsg::Version {
            msize: c.u32()?,
            version: c.string()?,
        },
        ty::TAUTH => Tmsg::Auth {
            afid: c.u32()?,
            uname: c.string()?,
            aname: c.string()?,
        },
        ty::TATTACH => Tmsg::Attach {
            fid: c.u32()?,
            afid: c.u32()?,
            uname: c.string()?,
            aname: c.string()?,
        },
        ty::TFLUSH => Tmsg::Flush { oldtag: c.u16()? },
        ty::TWALK => Tmsg::Walk {
            fid: c.u32()?,
            newfid: c.u32()?,
            wnames: wnames(&mut c)?,
        },
        ty::TOPEN => Tmsg::Open {
            fid: c.u32()?,
            mode: c.u8()?,
        },
        ty::TCREATE => Tmsg::Create {
            fid: c.u32()?,
            name: c.string()?,
            perm: c.u32()?,
            mode: c.u8()?,
        },
        ty::TREAD => Tmsg::Read {
            fid: c.u32()?,
            offset: c.u64()?,
            count: c.u32()?,
        },
        ty::TWRITE => Tmsg::Write {
            fid: c.u32()?,
            offset: c.u64()?,
            data: c.data()?,
        },
        ty::TCLUNK => Tmsg::Clunk { fid: c.u32()? },
        ty::TREMOVE => Tmsg::Remove { fid: c.u32()? },
        ty::TSTAT => Tmsg::Stat { fid: c.u32()? },
        ty::TWSTAT => {
            let fid = c.u32()?;
            let n = usize::from(c.u16()?);
            let start = c.pos;
            let stat = c.stat()?;
            if c.pos - start != n {
                return Err(DecodeError::BadStatSize {
                    declared: n,
                    actual: c.pos - start,
                });
            }
            Tmsg::Wstat { fid, stat }
        }
        other => return Err(DecodeError::UnknownType(other)),
    };
    c.finish()?;
    Ok((h.tag, m))
}

/// Decodes one whole R-message frame (including its size field). Returns the tag and body.
pub fn decode_r(frame: Bytes) -> Result<(u16, Rmsg), DecodeError> {
    let (h, mut c) = open_frame(frame)?;
    let m = match h.ty {
        ty::RVERSION => Rmsg::Version {
            msize: c.u32()?,
            version: c.string()?,
        },
        ty::RAUTH => Rmsg::Auth { aqid: c.qid()? },
        ty::RATTACH => Rmsg::Attach { qid: c.qid()? },
        ty::RERROR => Rmsg::Error { ename: c.string()? },
        ty::RFLUSH => Rmsg::Flush,
        ty::RWALK => {
            let n = usize::from(c.u16()?);
            if n > MAXWELEM {
                return Err(DecodeError::TooManyNames(n));
            }
            let mut wqids = Vec::with_capacity(n);
            for _ in 0..n {
                wqids.push(c.qid()?);
            }
            Rmsg::Walk { wqids }
        }
        ty::ROPEN => Rmsg::Open {
            qid: c.qid()?,
            iounit: c.u32()?,
        },
        ty::RCREATE => Rmsg::Create {
            qid: c.qid()?,
            iounit: c.u32()?,
        },
        ty::RREAD => Rmsg::Read { data: c.data()? },
        ty::RWRITE => Rmsg::Write { count: c.u32()? },
        ty::RCLUNK => Rmsg::Clunk,
        ty::RREMOVE => Rmsg::Remove,
        ty::RSTAT => {
            let n = usize::from(c.u16()?);
            let start = c.pos;
            let stat = c.stat()?;
            if c.pos - start != n {
                return Err(DecodeError::BadStatSize {
                    declared: n,
                    actual: c.pos - start,
                });
            }
            Rmsg::Stat { stat }
        }
        ty::RWSTAT => Rmsg::Wstat,
        other => return Err(DecodeError::UnknownType(other)),
    };
    c.finish()?;
    Ok((h.tag, m))
}

/// Decodes the stat entries of a directory read. Fails if the data holds a partial entry.
pub fn decode_dir(data: &Bytes) -> Result<Vec<Stat>, DecodeError> {
    let mut c = Cursor {
        buf: data.clone(),
        pos: 0,
    };
    let mut v = Vec::new();
    while c.pos < c.buf.len() {
        v.push(c.stat()?);
    }
    Ok(v)
}

/// Decodes a single stat entry (with its own size field) that fills `data` exactly.
pub fn decode_stat(data: &Bytes) -> Result<Stat, DecodeError> {
    let mut c = Cursor {
        buf: data.clone(),
        pos: 0,
    };
    let st = c.stat()?;
    c.finish()?;
    Ok(st)
}

fn put_str(out: &mut BytesMut, s: &str) -> Result<(), EncodeError> {
    // NUL is illegal in 9P strings (intro(5)); the decoder refuses it, so never send one.
    if s.as_bytes().contains(&0) {
        return Err(EncodeError::Nul);
    }
    let n = u16::try_from(s.len()).map_err(|_| EncodeError::StringTooLong(s.len()))?;
    out.put_u16_le(n);
    out.put_slice(s.as_bytes());
    Ok(())
}

fn put_qid(out: &mut BytesMut, q: &Qid) {
    out.put_u8(q.ty);
    out.put_u32_le(q.version);
    out.put_u64_le(q.path);
}

/// Appends one stat entry (with its own `size[2]` field).
pub fn encode_stat(out: &mut BytesMut, st: &Stat) -> Result<(), EncodeError> {
    let len = st.encoded_len();
    let inner = u16::try_from(len - 2).map_err(|_| EncodeError::StatTooLarge(len))?;
    out.reserve(len);
    out.put_u16_le(inner);
    out.put_u16_le(st.ty);
    out.put_u32_le(st.dev);
    put_qid(out, &st.qid);
    out.put_u32_le(st.mode);
    out.put_u32_le(st.atime);
    out.put_u32_le(st.mtime);
    out.put_u64_le(st.length);
    put_str(out, &st.name)?;
    put_str(out, &st.uid)?;
    put_str(out, &st.gid)?;
    put_str(out, &st.muid)?;
    Ok(())
}

/// Starts a frame: reserves the size field and writes type and tag. Returns the frame start.
fn begin(out: &mut BytesMut, ty: u8, tag: u16) -> usize {
    let start = out.len();
    out.put_u32_le(0);
    out.put_u8(ty);
    out.put_u16_le(tag);
    start
}

/// Fills in the size field of a frame begun at `start`, counting `extra` bytes the caller will
/// append separately (a zero-copy payload).
fn end(out: &mut BytesMut, start: usize, extra: usize) -> Result<(), EncodeError> {
    let total = out.len() - start + extra;
    let size = u32::try_from(total).map_err(|_| EncodeError::PayloadTooLarge(total))?;
    out[start..start + 4].copy_from_slice(&size.to_le_bytes());
    Ok(())
}

fn put_count(out: &mut BytesMut, n: usize) -> Result<(), EncodeError> {
    let c = u32::try_from(n).map_err(|_| EncodeError::PayloadTooLarge(n))?;
    out.put_u32_le(c);
    Ok(())
}

/// Appends a T-message frame. On error `out` is left as it was.
pub fn encode_t(out: &mut BytesMut, tag: u16, m: &Tmsg) -> Result<(), EncodeError> {
    let mark = out.len();
    let r = encode_t_inner(out, tag, m);
    if r.is_err() {
        out.truncate(mark);
    }
    r
}

fn encode_t_inner(out: &mut BytesMut, tag: u16, m: &Tmsg) -> Result<(), EncodeError> {
    let start;
    match m {
        Tmsg::Version { msize, version } => {
            start = begin(out, ty::TVERSION, tag);
            out.put_u32_le(*msize);
            put_str(out, version)?;
        }
        Tmsg::Auth { afid, uname, aname } => {
            start = begin(out, ty::TAUTH, tag);
            out.put_u32_le(*afid);
            put_str(out, uname)?;
            put_str(out, aname)?;
        }
        Tmsg::Attach {
            fid,
            afid,
            uname,
            aname,
        } => {
            start = begin(out, ty::TATTACH, tag);
            out.put_u32_le(*fid);
            out.put_u32_le(*afid);
            put_str(out, uname)?;
            put_str(out, aname)?;
        }
        Tmsg::Flush { oldtag } => {
            start = begin(out, ty::TFLUSH, tag);
            out.put_u16_le(*oldtag);
        }
        Tmsg::Walk {
            fid,
            newfid,
            wnames,
        } => {
            if wnames.len() > MAXWELEM {
                return Err(EncodeError::TooManyNames(wnames.len()));
            }
            start = begin(out, ty::TWALK, tag);
            out.put_u32_le(*fid);
            out.put_u32_le(*newfid);
            out.put_u16_le(wnames.len() as u16);
            for w in wnames {
                put_str(out, w)?;
            }
        }
        Tmsg::Open { fid, mode } => {
            start = begin(out, ty::TOPEN, tag);
            out.put_u32_le(*fid);
            out.put_u8(*mode);
        }
        Tmsg::Create {
            fid,
            name,
            perm,
            mode,
        } => {
            start = begin(out, ty::TCREATE, tag);
            out.put_u32_le(*fid);
            put_str(out, name)?;
            out.put_u32_le(*perm);
            out.put_u8(*mode);
        }
        Tmsg::Read { fid, offset, count } => {
            start = begin(out, ty::TREAD, tag);
            out.put_u32_le(*fid);
            out.put_u64_le(*offset);
            out.put_u32_le(*count);
        }
        Tmsg::Write { fid, offset, data } => {
            start = begin(out, ty::TWRITE, tag);
            out.put_u32_le(*fid);
            out.put_u64_le(*offset);
            put_count(out, data.len())?;
            out.put_slice(data);
        }
        Tmsg::Clunk { fid } => {
            start = begin(out, ty::TCLUNK, tag);
            out.put_u32_le(*fid);
        }
        Tmsg::Remove { fid } => {
            start = begin(out, ty::TREMOVE, tag);
            out.put_u32_le(*fid);
        }
        Tmsg::Stat { fid } => {
            start = begin(out, ty::TSTAT, tag);
            out.put_u32_le(*fid);
        }
        Tmsg::Wstat { fid, stat } => {
            start = begin(out, ty::TWSTAT, tag);
            out.put_u32_le(*fid);
            let n = stat.encoded_len();
            let n16 = u16::try_from(n).map_err(|_| EncodeError::StatTooLarge(n))?;
            out.put_u16_le(n16);
            encode_stat(out, stat)?;
        }
    }
    end(out, start, 0)
}

/// Appends an R-message frame, copying any payload. On error `out` is left as it was.
pub fn encode_r(out: &mut BytesMut, tag: u16, m: &Rmsg) -> Result<(), EncodeError> {
    let payload = encode_r_parts(out, tag, m)?;
    if let Some(p) = payload {
        out.put_slice(&p);
    }
    Ok(())
}

/// Appends an R-message frame but leaves a `Rread` payload out, returning it: the caller must
/// send it right after the header bytes (zero-copy `writev`). On error `out` is left as it was.
pub fn encode_r_parts(
    out: &mut BytesMut,
    tag: u16,
    m: &Rmsg,
) -> Result<Option<Bytes>, EncodeError> {
    let mark = out.len();
    let r = encode_r_inner(out, tag, m);
    if r.is_err() {
        out.truncate(mark);
    }
    r
}

fn encode_r_inner(out: &mut BytesMut, tag: u16, m: &Rmsg) -> Result<Option<Bytes>, EncodeError> {
    let start;
    let mut payload = None;
    match m {
        Rmsg::Version { msize, version } => {
            start = begin(out, ty::RVERSION, tag);
            out.put_u32_le(*msize);
            put_str(out, version)?;
        }
        Rmsg::Auth { aqid } => {
            start = begin(out, ty::RAUTH, tag);
            put_qid(out, aqid);
        }
        Rmsg::Attach { qid } => {
            start = begin(out, ty::RATTACH, tag);
            put_qid(out, qid);
        }
        Rmsg::Error { ename } => {
            start = begin(out, ty::RERROR, tag);
            put_str(out, ename)?;
        }
        Rmsg::Flush => start = begin(out, ty::RFLUSH, tag),
        Rmsg::Walk { wqids } => {
            if wqids.len() > MAXWELEM {
                return Err(EncodeError::TooManyNames(wqids.len()));
            }
            start = begin(out, ty::RWALK, tag);
            out.put_u16_le(wqids.len() as u16);
            for q in wqids {
                put_qid(out, q);
            }
        }
        Rmsg::Open { qid, iounit } => {
            start = begin(out, ty::ROPEN, tag);
            put_qid(out, qid);
            out.put_u32_le(*iounit);
        }
        Rmsg::Create { qid, iounit } => {
            start = begin(out, ty::RCREATE, tag);
            put_qid(out, qid);
            out.put_u32_le(*iounit);
        }
        Rmsg::Read { data } => {
            start = begin(out, ty::RREAD, tag);
            put_count(out, data.len())?;
            payload = Some(data.clone());
        }
        Rmsg::Write { count } => {
            start = begin(out, ty::RWRITE, tag);
            out.put_u32_le(*count);
        }
        Rmsg::Clunk => start = begin(out, ty::RCLUNK, tag),
        Rmsg::Remove => start = begin(out, ty::RREMOVE, tag),
        Rmsg::Stat { stat } => {
            start = begin(out, ty::RSTAT, tag);
            let n = stat.encoded_len();
            let n16 = u16::try_from(n).map_err(|_| EncodeError::StatTooLarge(n))?;
            out.put_u16_le(n16);
            encode_stat(out, stat)?;
        }
        Rmsg::Wstat => start = begin(out, ty::RWSTAT, tag),
    }
    end(out, start, payload.as_ref().map_or(0, Bytes::len))?;
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t_bytes(tag: u16, m: &Tmsg) -> Vec<u8> {
        let mut b = BytesMut::new();
        encode_t(&mut b, tag, m).unwrap();
        b.to_vec()
    }

    fn r_bytes(tag: u16, m: &Rmsg) -> Vec<u8> {
        let mut b = BytesMut::new();
        encode_r(&mut b, tag, m).unwrap();
        b.to_vec()
    }

    // Byte-exact fixtures, written out by hand from intro(5) and the message pages.
    #[test]
    fn tversion_fixture() {
        let m = Tmsg::Version {
            msize: 8192,
            version: "9P2000".into(),
        };
        let b = t_bytes(NOTAG, &m);
        assert_eq!(
            b,
            [
                19, 0, 0, 0, 100, 0xff, 0xff, 0x00, 0x20, 0, 0, 6, 0, b'9', b'P', b'2', b'0', b'0',
                b'0'
            ]
        );
        assert_eq!(decode_t(Bytes::from(b)).unwrap(), (NOTAG, m));
    }

    #[test]
    fn twalk_fixture() {
        let m = Tmsg::Walk {
            fid: 1,
            newfid: 2,
            wnames: vec!["a".into(), "bc".into()],
        };
        let b = t_bytes(7, &m);
        assert_eq!(
            b,
            [
                24, 0, 0, 0, 110, 7, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 0, 1, 0, b'a', 2, 0, b'b', b'c'
            ]
        );
        assert_eq!(decode_t(Bytes::from(b)).unwrap(), (7, m));
    }

    #[test]
    fn twrite_fixture_and_zero_copy() {
        let m = Tmsg::Write {
            fid: 3,
            offset: 0x0102_0304_0506_0708,
            data: Bytes::from_static(b"hi"),
        };
        let b = t_bytes(1, &m);
        assert_eq!(
            b,
            [
                25, 0, 0, 0, 118, 1, 0, 3, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1, 2, 0, 0, 0, b'h', b'i'
            ]
        );
        let frame = Bytes::from(b);
        let base = frame.as_ptr() as usize;
        let (_, d) = decode_t(frame).unwrap();
        match d {
            Tmsg::Write { data, .. } => {
                assert_eq!(&data[..], b"hi");
                // The payload is a slice of the frame, not a copy.
                assert_eq!(data.as_ptr() as usize, base + 23);
            }
            other => panic!("decoded {other:?}"),
        }
    }

    #[test]
    fn rread_fixture_and_parts() {
        let m = Rmsg::Read {
            data: Bytes::from_static(b"abc"),
        };
        assert_eq!(
            r_bytes(5, &m),
            [14, 0, 0, 0, 117, 5, 0, 3, 0, 0, 0, b'a', b'b', b'c']
        );
        let mut out = BytesMut::new();
        let p = encode_r_parts(&mut out, 5, &m).unwrap();
        assert_eq!(&out[..], &[14, 0, 0, 0, 117, 5, 0, 3, 0, 0, 0]);
        assert_eq!(p.as_deref(), Some(&b"abc"[..]));
    }

    #[test]
    fn rerror_and_small_fixtures() {
        assert_eq!(
            r_bytes(2, &Rmsg::error("no")),
            [11, 0, 0, 0, 107, 2, 0, 2, 0, b'n', b'o']
        );
        assert_eq!(r_bytes(9, &Rmsg::Flush), [7, 0, 0, 0, 109, 9, 0]);
        assert_eq!(r_bytes(9, &Rmsg::Clunk), [7, 0, 0, 0, 121, 9, 0]);
        assert_eq!(
            t_bytes(4, &Tmsg::Flush { oldtag: 3 }),
            [9, 0, 0, 0, 108, 4, 0, 3, 0]
        );
        let q = Qid {
            ty: qt::DIR,
            version: 1,
            path: 2,
        };
        assert_eq!(
            r_bytes(
                1,
                &Rmsg::Open {
                    qid: q,
                    iounit: 8168
                }
            ),
            [
                24, 0, 0, 0, 113, 1, 0, 0x80, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0xe8, 0x1f, 0, 0
            ]
        );
    }

    #[test]
    fn stat_fixture() {
        let st = Stat {
            ty: 0,
            dev: 0,
            qid: Qid {
                ty: 0,
                version: 0,
                path: 1,
            },
            mode: 0o644,
            atime: 0,
            mtime: 0,
            length: 3,
            name: "f".into(),
            uid: "u".into(),
            gid: "g".into(),
            muid: "".into(),
        };
        let mut b = BytesMut::new();
        encode_stat(&mut b, &st).unwrap();
        assert_eq!(b.len(), st.encoded_len());
        assert_eq!(b.len(), 49 + 3);
        assert_eq!(&b[0..2], &[50, 0]);
        assert_eq!(decode_stat(&b.clone().freeze()).unwrap(), st);
        let r = r_bytes(1, &Rmsg::Stat { stat: st.clone() });
        // size[4] type tag n[2] stat
        assert_eq!(r.len(), 7 + 2 + 52);
        assert_eq!(&r[7..9], &[52, 0]);
        assert_eq!(
            decode_r(Bytes::from(r)).unwrap(),
            (1, Rmsg::Stat { stat: st })
        );
    }

    #[test]
    fn dont_touch_wstat_round_trips() {
        let m = Tmsg::Wstat {
            fid: 9,
            stat: Stat::dont_touch(),
        };
        let b = t_bytes(3, &m);
        let (_, d) = decode_t(Bytes::from(b)).unwrap();
        match d {
            Tmsg::Wstat { stat, .. } => assert!(stat.is_dont_touch()),
            other => panic!("decoded {other:?}"),
        }
    }

    #[test]
    fn only_a_bare_length_zero_is_a_truncation() {
        let mut st = Stat::dont_touch();
        assert!(!st.is_truncation());
        st.length = 0;
        assert!(st.is_truncation());
        let mut renamed = st.clone();
        renamed.name = "x".into();
        assert!(!renamed.is_truncation());
        let mut chmod = st.clone();
        chmod.mode = 0o600;
        assert!(!chmod.is_truncation());
        st.length = 1;
        assert!(!st.is_truncation());
    }

    #[test]
    fn malformed_frames_are_errors() {
        // Declared size larger than the frame.
        let mut b = t_bytes(1, &Tmsg::Clunk { fid: 1 });
        b[0] = 20;
        assert!(matches!(
            decode_t(Bytes::from(b)),
            Err(DecodeError::SizeMismatch { .. })
        ));
        // Unknown type and the illegal Terror.
        for t in [0u8, 99, 106, 128, 255] {
            let b = vec![7, 0, 0, 0, t, 0, 0];
            assert_eq!(decode_t(Bytes::from(b)), Err(DecodeError::UnknownType(t)));
        }
        // Truncated body.
        let b = vec![9, 0, 0, 0, 120, 0, 0, 1, 0];
        assert!(matches!(
            decode_t(Bytes::from(b)),
            Err(DecodeError::Short { .. })
        ));
        // Trailing garbage.
        let mut b = t_bytes(1, &Tmsg::Clunk { fid: 1 });
        b.push(0);
        b[0] += 1;
        assert_eq!(decode_t(Bytes::from(b)), Err(DecodeError::Trailing(1)));
        // Twrite whose count overruns the frame.
        let mut b = t_bytes(
            1,
            &Tmsg::Write {
                fid: 1,
                offset: 0,
                data: Bytes::from_static(b"x"),
            },
        );
        b[19] = 200;
        assert!(matches!(
            decode_t(Bytes::from(b)),
            Err(DecodeError::Short { .. })
        ));
        // Bad UTF-8 and NUL in a name.
        let mut b = t_bytes(
            1,
            &Tmsg::Walk {
                fid: 1,
                newfid: 2,
                wnames: vec!["ab".into()],
            },
        );
        let n = b.len();
        b[n - 1] = 0xff;
        assert_eq!(decode_t(Bytes::from(b.clone())), Err(DecodeError::BadUtf8));
        b[n - 1] = 0;
        assert_eq!(decode_t(Bytes::from(b)), Err(DecodeError::Nul));
        // Seventeen walk elements.
        let mut b = t_bytes(
            1,
            &Tmsg::Walk {
                fid: 1,
                newfid: 2,
                wnames: vec![],
            },
        );
        b[15] = 17;
        assert_eq!(decode_t(Bytes::from(b)), Err(DecodeError::TooManyNames(17)));
        // Frames shorter than a header.
        assert!(decode_t(Bytes::from_static(&[1, 0])).is_err());
        assert!(decode_r(Bytes::new()).is_err());
    }

    #[test]
    fn encode_rejects_oversized_fields_without_side_effects() {
        let mut b = BytesMut::from(&b"keep"[..]);
        let long = "x".repeat(70_000);
        let r = encode_t(
            &mut b,
            1,
            &Tmsg::Attach {
                fid: 1,
                afid: NOFID,
                uname: long,
                aname: String::new(),
            },
        );
        assert_eq!(r, Err(EncodeError::StringTooLong(70_000)));
        assert_eq!(&b[..], b"keep");
        let r = encode_t(
            &mut b,
            1,
            &Tmsg::Walk {
                fid: 1,
                newfid: 2,
                wnames: vec![String::new(); 17],
            },
        );
        assert_eq!(r, Err(EncodeError::TooManyNames(17)));
        assert_eq!(&b[..], b"keep");
        let r = encode_r(&mut b, 1, &Rmsg::error("a\0b"));
        assert_eq!(r, Err(EncodeError::Nul));
        assert_eq!(&b[..], b"keep");
    }

    #[test]
    fn decode_dir_rejects_partial_entries() {
        let st = Stat {
            name: "x".into(),
            ..Stat::default()
        };
        let mut b = BytesMut::new();
        encode_stat(&mut b, &st).unwrap();
        encode_stat(&mut b, &st).unwrap();
        let full = b.freeze();
        assert_eq!(decode_dir(&full).unwrap().len(), 2);
        assert!(decode_dir(&full.slice(..full.len() - 1)).is_err());
    }
}
