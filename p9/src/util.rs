//! Helpers for [`Filesystem`](crate::Filesystem) implementations: directory reads that return
//! whole entries only, and byte-range reads of in-memory contents.

use bytes::{Bytes, BytesMut};

use crate::error::{Error, Result};
use crate::wire::{self, Stat};

/// A directory listing frozen when a fid reads it from offset 0, so that later reads at the
/// offsets the client got back see consistent, whole entries.
#[derive(Debug, Clone, Default)]
pub struct DirSnapshot {
    buf: Bytes,
    /// Start offset of every entry, ascending.
    starts: Vec<usize>,
}

impl DirSnapshot {
    /// Encodes `entries`. Entries too large for a stat are skipped.
    pub fn new(entries: &[Stat]) -> DirSnapshot {
        let mut buf = BytesMut::new();
        let mut starts = Vec::with_capacity(entries.len());
        for st in entries {
            let at = buf.len();
            if wire::encode_stat(&mut buf, st).is_ok() {
                starts.push(at);
            } else {
                buf.truncate(at);
            }
        }
        DirSnapshot {
            buf: buf.freeze(),
            starts,
        }
    }

    /// The whole entries that start at or after `offset` and fit in `count` bytes. An offset in
    /// the middle of an entry moves to the next entry; at or past the end the result is empty.
    pub fn read(&self, offset: u64, count: u32) -> Result<Bytes> {
        let Ok(off) = usize::try_from(offset) else {
            return Ok(Bytes::new());
        };
        let i = self.starts.partition_point(|&s| s < off);
        let Some(&first) = self.starts.get(i) else {
            return Ok(Bytes::new());
        };
        let limit = first.saturating_add(count as usize);
        let mut end = first;
        for k in i..self.starts.len() {
            let next = self.starts.get(k + 1).copied().unwrap_or(self.buf.len());
            if next > limit {
                break;
            }
            end = next;
        }
        if end == first {
            return Err(Error::invalid(format!(
                "read count {count} is too small for a directory entry"
            )));
        }
        Ok(self.buf.slice(first..end))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }
}

/// The permission bits (4 read, 2 write, 1 execute) that an open with mode `omode` needs;
/// `OTRUNC` needs write as well.
pub fn open_needs(omode: u8) -> u32 {
    use crate::wire::om;
    let base = match omode & 3 {
        om::OREAD => 4,
        om::OWRITE => 2,
        om::ORDWR => 6,
        _ => 1,
    };
    base | if omode & om::OTRUNC != 0 { 2 } else { 0 }
}

/// `count` bytes of `data` from `offset` (empty at or past the end). Zero-copy.
pub fn read_at(data: &Bytes, offset: u64, count: u32) -> Bytes {
    let Ok(off) = usize::try_from(offset) else {
        return Bytes::new();
    };
    if off >= data.len() {
        return Bytes::new();
    }
    let end = off.saturating_add(count as usize).min(data.len());
    data.slice(off..end)
}

/// A UTC calendar time: year, month (1-12), day, hour, minute, second.
pub type Civil = (i64, u32, u32, u32, u32, u32);

/// Converts seconds since the Unix epoch to a UTC calendar time (Howard Hinnant's days-to-civil
/// algorithm), for stat times and event timestamps.
pub fn civil(secs: u64) -> Civil {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = if m <= 2 { y + 1 } else { y };
    (
        y,
        m,
        d,
        (rem / 3600) as u32,
        ((rem / 60) % 60) as u32,
        (rem % 60) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(name: &str) -> Stat {
        Stat {
            name: name.into(),
            ..Stat::default()
        }
    }

    #[test]
    fn dir_reads_whole_entries_and_rereads_from_zero() {
        let d = DirSnapshot::new(&[st("a"), st("bb"), st("ccc")]);
        let one = st("a").encoded_len();
        let two = st("bb").encoded_len();
        let r = d.read(0, (one + two - 1) as u32).unwrap();
        assert_eq!(r.len(), one);
        let r2 = d.read(one as u64, 10_000).unwrap();
        let names: Vec<_> = wire::decode_dir(&r2)
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["bb", "ccc"]);
        assert!(d.read(10_000, 100).unwrap().is_empty());
        assert_eq!(d.read(0, 10_000).unwrap().len(), d.buf.len());
        assert!(d.read(0, 3).is_err());
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(civil(951_782_400), (2000, 2, 29, 0, 0, 0));
        assert_eq!(civil(1_796_034_119), (2026, 11, 30, 10, 21, 59));
    }

    #[test]
    fn read_at_bounds() {
        let b = Bytes::from_static(b"hello");
        assert_eq!(&read_at(&b, 1, 3)[..], b"ell");
        assert_eq!(&read_at(&b, 3, 100)[..], b"lo");
        assert!(read_at(&b, 5, 1).is_empty());
        assert!(read_at(&b, u64::MAX, 1).is_empty());
    }
}
