#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Differential property tests of our 9P2000 codec (`ollie_p9::wire`) against an independent
//! implementation, the `ninep` crate (0.6), plus "never panics" properties of our decoder.
//!
//! For every T- and R-message type (all 13 pairs plus Rerror) we check that
//! - a frame encoded by us decodes with ninep to the same fields,
//! - a frame encoded by ninep decodes with us to the same message,
//! - both encoders produce byte-identical frames,
//!
//! and likewise for single stat entries and directory-read payloads.
//!
//! Known differences of ninep from 9P2000, mapped here rather than bent in our codec:
//! - Qid type: ninep keeps it as `FileType`, a bitflags type. Its encoder writes whatever bits
//!   the value holds (we build it with `from_bits_retain`), but its decoder uses
//!   `from_bits_truncate`, so qid type bits outside QTDIR|QTAPPEND|QTEXCL|QTAUTH|QTTMP (0xEC)
//!   are dropped. intro(5) calls qid.type a bit vector of the mode's high byte and does not make
//!   other bits illegal, so we keep all eight bits; when comparing a ninep-decoded message we
//!   mask the original with [`KNOWN_QT`].
//! - Twstat/Rstat sizes: ninep has no notion of derived sizes. `Tdata::Wstat` and `Rdata::Stat`
//!   carry the `n[2]` prefix of `stat[n]` as an explicit `size` field, and `RawStat` carries the
//!   stat's own `size[2]` as `RawStat::size`; its encoder writes them as given and its decoder
//!   does not check them. Per stat(5) the stat's `size[2]` counts the bytes that follow it, and
//!   `n` is the length of the whole stat including that field, so `n = size + 2`. We fill them in
//!   that way and, when mapping ninep's decoded values back, assert those relations.
//! - ninep's decoder is more lenient than intro(5)/walk(5): it accepts NUL bytes in strings,
//!   more than MAXWELEM (16) walk elements, trailing bytes after a message body and stat size
//!   fields that disagree with the contents. Ours rejects all of these, so the generators here
//!   stay inside the spec (strings without NUL, 0..=16 walk elements) and the "never panics"
//!   properties only ask ninep to agree with frames that *we* accepted.
//! - ninep's `Data` (Twrite/Rread payload) has no public accessor; we read it back through its
//!   own encoder (`count[4] data[count]`).

use bytes::{Bytes, BytesMut};
use ninep::sansio::protocol::{
    Data, FileType, NineP, Qid as NQid, RawStat, Rdata, Rmessage, SharedBuf, Tdata, Tmessage,
};
use ninep::sync::SyncNineP;
use ollie_p9::wire::{
    self, DecodeError, HEADER_LEN, MAXWELEM, NOFID, NOTAG, Qid, Rmsg, Stat, Tmsg, qt,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;

/// The qid type bits ninep's `FileType` knows; its decoder drops all others.
const KNOWN_QT: u8 = qt::DIR | qt::APPEND | qt::EXCL | qt::AUTH | qt::TMP;

/// Largest Twrite/Rread payload we generate.
const MAX_PAYLOAD: usize = 4096;

type TestResult = Result<(), TestCaseError>;

fn fail(what: &str, e: impl std::fmt::Debug) -> TestCaseError {
    TestCaseError::fail(format!("{what}: {e:?}"))
}

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

/// A 9P string: any Unicode text without NUL (illegal in all 9P strings, intro(5)), of at most
/// `max` characters. Mostly short ASCII names, sometimes arbitrary Unicode.
fn s9(max: usize) -> BoxedStrategy<String> {
    let ascii = proptest::string::string_regex(&format!("[ -~]{{0,{max}}}")).unwrap();
    let any_text = proptest::string::string_regex(&format!("[^\\x00]{{0,{max}}}")).unwrap();
    prop_oneof![3 => ascii, 2 => any_text].boxed()
}

fn qid() -> impl Strategy<Value = Qid> {
    let ty = prop_oneof![
        Just(qt::FILE),
        Just(qt::DIR),
        Just(qt::APPEND | qt::EXCL),
        Just(qt::AUTH),
        Just(qt::TMP),
        any::<u8>(),
    ];
    (ty, any::<u32>(), any::<u64>()).prop_map(|(ty, version, path)| Qid { ty, version, path })
}

fn stat() -> impl Strategy<Value = Stat> {
    let random = (
        any::<u16>(),
        any::<u32>(),
        qid(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        s9(40),
        s9(16),
        s9(16),
        s9(16),
    )
        .prop_map(
            |(ty, dev, qid, mode, atime, mtime, length, name, uid, gid, muid)| Stat {
                ty,
                dev,
                qid,
                mode,
                atime,
                mtime,
                length,
                name,
                uid,
                gid,
                muid,
            },
        );
    prop_oneof![9 => random, 1 => Just(Stat::dont_touch())]
}

fn payload() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        1 => Just(Bytes::new()),
        6 => vec(any::<u8>(), 0..=MAX_PAYLOAD).prop_map(Bytes::from),
    ]
}

fn version_string() -> BoxedStrategy<String> {
    prop_oneof![
        Just("9P2000".to_owned()),
        Just("unknown".to_owned()),
        s9(16)
    ]
    .boxed()
}

fn fid() -> impl Strategy<Value = u32> {
    prop_oneof![Just(NOFID), any::<u32>(), 0u32..8]
}

fn tag() -> impl Strategy<Value = u16> {
    prop_oneof![Just(NOTAG), any::<u16>()]
}

fn tmsg() -> impl Strategy<Value = Tmsg> {
    prop_oneof![
        (any::<u32>(), version_string())
            .prop_map(|(msize, version)| Tmsg::Version { msize, version }),
        (fid(), s9(32), s9(32)).prop_map(|(afid, uname, aname)| Tmsg::Auth { afid, uname, aname }),
        (fid(), fid(), s9(32), s9(32)).prop_map(|(fid, afid, uname, aname)| Tmsg::Attach {
            fid,
            afid,
            uname,
            aname
        }),
        tag().prop_map(|oldtag| Tmsg::Flush { oldtag }),
        (fid(), fid(), vec(s9(24), 0..=MAXWELEM)).prop_map(|(fid, newfid, wnames)| Tmsg::Walk {
            fid,
            newfid,
            wnames
        }),
        (fid(), any::<u8>()).prop_map(|(fid, mode)| Tmsg::Open { fid, mode }),
        (fid(), s9(40), any::<u32>(), any::<u8>()).prop_map(|(fid, name, perm, mode)| {
            Tmsg::Create {
                fid,
                name,
                perm,
                mode,
            }
        }),
        (fid(), any::<u64>(), any::<u32>()).prop_map(|(fid, offset, count)| Tmsg::Read {
            fid,
            offset,
            count
        }),
        (fid(), any::<u64>(), payload()).prop_map(|(fid, offset, data)| Tmsg::Write {
            fid,
            offset,
            data
        }),
        fid().prop_map(|fid| Tmsg::Clunk { fid }),
        fid().prop_map(|fid| Tmsg::Remove { fid }),
        fid().prop_map(|fid| Tmsg::Stat { fid }),
        (fid(), stat()).prop_map(|(fid, stat)| Tmsg::Wstat { fid, stat }),
    ]
}

fn rmsg() -> impl Strategy<Value = Rmsg> {
    prop_oneof![
        (any::<u32>(), version_string())
            .prop_map(|(msize, version)| Rmsg::Version { msize, version }),
        qid().prop_map(|aqid| Rmsg::Auth { aqid }),
        qid().prop_map(|qid| Rmsg::Attach { qid }),
        s9(120).prop_map(|ename| Rmsg::Error { ename }),
        Just(Rmsg::Flush),
        vec(qid(), 0..=MAXWELEM).prop_map(|wqids| Rmsg::Walk { wqids }),
        (qid(), any::<u32>()).prop_map(|(qid, iounit)| Rmsg::Open { qid, iounit }),
        (qid(), any::<u32>()).prop_map(|(qid, iounit)| Rmsg::Create { qid, iounit }),
        payload().prop_map(|data| Rmsg::Read { data }),
        any::<u32>().prop_map(|count| Rmsg::Write { count }),
        Just(Rmsg::Clunk),
        Just(Rmsg::Remove),
        stat().prop_map(|stat| Rmsg::Stat { stat }),
        Just(Rmsg::Wstat),
    ]
}

// ---------------------------------------------------------------------------------------------
// Ours -> ninep
// ---------------------------------------------------------------------------------------------

fn n_qid(q: &Qid) -> NQid {
    NQid {
        // Retain every bit so ninep's encoder writes the same byte we do.
        ty: FileType::from_bits_retain(q.ty),
        version: q.version,
        path: q.path,
    }
}

/// `n[2]` of a `stat[n]` field in Twstat/Rstat: the whole entry, its own size[2] included.
fn stat_n(st: &Stat) -> u16 {
    u16::try_from(st.encoded_len()).unwrap()
}

fn n_stat(st: &Stat) -> RawStat {
    RawStat {
        // stat(5): size[2] counts the bytes that follow it.
        size: u16::try_from(st.encoded_len() - 2).unwrap(),
        ty: st.ty,
        dev: st.dev,
        qid: n_qid(&st.qid),
        mode: st.mode,
        atime: st.atime,
        mtime: st.mtime,
        length: st.length,
        name: st.name.clone(),
        uid: st.uid.clone(),
        gid: st.gid.clone(),
        muid: st.muid.clone(),
    }
}

fn n_data(b: &Bytes) -> Data {
    Data::from(b.to_vec())
}

fn to_ninep_t(m: &Tmsg) -> Tdata {
    match m {
        Tmsg::Version { msize, version } => Tdata::Version {
            msize: *msize,
            version: version.clone(),
        },
        Tmsg::Auth { afid, uname, aname } => Tdata::Auth {
            afid: *afid,
            uname: uname.clone(),
            aname: aname.clone(),
        },
        Tmsg::Attach {
            fid,
            afid,
            uname,
            aname,
        } => Tdata::Attach {
            fid: *fid,
            afid: *afid,
            uname: uname.clone(),
            aname: aname.clone(),
        },
        Tmsg::Flush { oldtag } => Tdata::Flush { old_tag: *oldtag },
        Tmsg::Walk {
            fid,
            newfid,
            wnames,
        } => Tdata::Walk {
            fid: *fid,
            new_fid: *newfid,
            wnames: wnames.clone(),
        },
        Tmsg::Open { fid, mode } => Tdata::Open {
            fid: *fid,
            mode: *mode,
        },
        Tmsg::Create {
            fid,
            name,
            perm,
            mode,
        } => Tdata::Create {
            fid: *fid,
            name: name.clone(),
            perm: *perm,
            mode: *mode,
        },
        Tmsg::Read { fid, offset, count } => Tdata::Read {
            fid: *fid,
            offset: *offset,
            count: *count,
        },
        Tmsg::Write { fid, offset, data } => Tdata::Write {
            fid: *fid,
            offset: *offset,
            data: n_data(data),
        },
        Tmsg::Clunk { fid } => Tdata::Clunk { fid: *fid },
        Tmsg::Remove { fid } => Tdata::Remove { fid: *fid },
        Tmsg::Stat { fid } => Tdata::Stat { fid: *fid },
        Tmsg::Wstat { fid, stat } => Tdata::Wstat {
            fid: *fid,
            size: stat_n(stat),
            stat: n_stat(stat),
        },
    }
}

fn to_ninep_r(m: &Rmsg) -> Rdata {
    match m {
        Rmsg::Version { msize, version } => Rdata::Version {
            msize: *msize,
            version: version.clone(),
        },
        Rmsg::Auth { aqid } => Rdata::Auth { aqid: n_qid(aqid) },
        Rmsg::Attach { qid } => Rdata::Attach { aqid: n_qid(qid) },
        Rmsg::Error { ename } => Rdata::Error {
            ename: ename.clone(),
        },
        Rmsg::Flush => Rdata::Flush {},
        Rmsg::Walk { wqids } => Rdata::Walk {
            wqids: wqids.iter().map(n_qid).collect(),
        },
        Rmsg::Open { qid, iounit } => Rdata::Open {
            qid: n_qid(qid),
            iounit: *iounit,
        },
        Rmsg::Create { qid, iounit } => Rdata::Create {
            qid: n_qid(qid),
            iounit: *iounit,
        },
        Rmsg::Read { data } => Rdata::Read { data: n_data(data) },
        Rmsg::Write { count } => Rdata::Write { count: *count },
        Rmsg::Clunk => Rdata::Clunk {},
        Rmsg::Remove => Rdata::Remove {},
        Rmsg::Stat { stat } => Rdata::Stat {
            size: stat_n(stat),
            stat: n_stat(stat),
        },
        Rmsg::Wstat => Rdata::Wstat {},
    }
}

// ---------------------------------------------------------------------------------------------
// ninep -> ours (field by field; the derived size fields are checked, not copied)
// ---------------------------------------------------------------------------------------------

fn from_n_qid(q: &NQid) -> Qid {
    Qid {
        ty: q.ty.bits(),
        version: q.version,
        path: q.path,
    }
}

fn from_n_stat(rs: &RawStat) -> Result<Stat, TestCaseError> {
    let st = Stat {
        ty: rs.ty,
        dev: rs.dev,
        qid: from_n_qid(&rs.qid),
        mode: rs.mode,
        atime: rs.atime,
        mtime: rs.mtime,
        length: rs.length,
        name: rs.name.clone(),
        uid: rs.uid.clone(),
        gid: rs.gid.clone(),
        muid: rs.muid.clone(),
    };
    prop_assert_eq!(
        usize::from(rs.size),
        st.encoded_len() - 2,
        "stat size[2] must count the bytes after it"
    );
    Ok(st)
}

/// The `n[2]` before a Twstat/Rstat stat must be the entry's size[2] plus 2.
fn check_stat_n(n: u16, rs: &RawStat) -> TestResult {
    prop_assert_eq!(
        usize::from(n),
        usize::from(rs.size) + 2,
        "stat[n]: n must be the stat's size[2] + 2"
    );
    Ok(())
}

fn from_n_data(d: &Data) -> Result<Bytes, TestCaseError> {
    // count[4] data[count], through ninep's own encoder.
    let enc = d
        .write_9p_bytes()
        .map_err(|e| fail("re-encoding ninep Data", e))?;
    prop_assert!(enc.len() >= 4);
    let count = u32::from_le_bytes([enc[0], enc[1], enc[2], enc[3]]) as usize;
    prop_assert_eq!(count, enc.len() - 4);
    Ok(Bytes::from(enc).slice(4..))
}

fn from_ninep_t(d: &Tdata) -> Result<Tmsg, TestCaseError> {
    Ok(match d {
        Tdata::Version { msize, version } => Tmsg::Version {
            msize: *msize,
            version: version.clone(),
        },
        Tdata::Auth { afid, uname, aname } => Tmsg::Auth {
            afid: *afid,
            uname: uname.clone(),
            aname: aname.clone(),
        },
        Tdata::Attach {
            fid,
            afid,
            uname,
            aname,
        } => Tmsg::Attach {
            fid: *fid,
            afid: *afid,
            uname: uname.clone(),
            aname: aname.clone(),
        },
        Tdata::Flush { old_tag } => Tmsg::Flush { oldtag: *old_tag },
        Tdata::Walk {
            fid,
            new_fid,
            wnames,
        } => Tmsg::Walk {
            fid: *fid,
            newfid: *new_fid,
            wnames: wnames.clone(),
        },
        Tdata::Open { fid, mode } => Tmsg::Open {
            fid: *fid,
            mode: *mode,
        },
        Tdata::Create {
            fid,
            name,
            perm,
            mode,
        } => Tmsg::Create {
            fid: *fid,
            name: name.clone(),
            perm: *perm,
            mode: *mode,
        },
        Tdata::Read { fid, offset, count } => Tmsg::Read {
            fid: *fid,
            offset: *offset,
            count: *count,
        },
        Tdata::Write { fid, offset, data } => Tmsg::Write {
            fid: *fid,
            offset: *offset,
            data: from_n_data(data)?,
        },
        Tdata::Clunk { fid } => Tmsg::Clunk { fid: *fid },
        Tdata::Remove { fid } => Tmsg::Remove { fid: *fid },
        Tdata::Stat { fid } => Tmsg::Stat { fid: *fid },
        Tdata::Wstat { fid, size, stat } => {
            check_stat_n(*size, stat)?;
            Tmsg::Wstat {
                fid: *fid,
                stat: from_n_stat(stat)?,
            }
        }
    })
}

fn from_ninep_r(d: &Rdata) -> Result<Rmsg, TestCaseError> {
    Ok(match d {
        Rdata::Version { msize, version } => Rmsg::Version {
            msize: *msize,
            version: version.clone(),
        },
        Rdata::Auth { aqid } => Rmsg::Auth {
            aqid: from_n_qid(aqid),
        },
        Rdata::Attach { aqid } => Rmsg::Attach {
            qid: from_n_qid(aqid),
        },
        Rdata::Error { ename } => Rmsg::Error {
            ename: ename.clone(),
        },
        Rdata::Flush {} => Rmsg::Flush,
        Rdata::Walk { wqids } => Rmsg::Walk {
            wqids: wqids.iter().map(from_n_qid).collect(),
        },
        Rdata::Open { qid, iounit } => Rmsg::Open {
            qid: from_n_qid(qid),
            iounit: *iounit,
        },
        Rdata::Create { qid, iounit } => Rmsg::Create {
            qid: from_n_qid(qid),
            iounit: *iounit,
        },
        Rdata::Read { data } => Rmsg::Read {
            data: from_n_data(data)?,
        },
        Rdata::Write { count } => Rmsg::Write { count: *count },
        Rdata::Clunk {} => Rmsg::Clunk,
        Rdata::Remove {} => Rmsg::Remove,
        Rdata::Stat { size, stat } => {
            check_stat_n(*size, stat)?;
            Rmsg::Stat {
                stat: from_n_stat(stat)?,
            }
        }
        Rdata::Wstat {} => Rmsg::Wstat,
    })
}

// ---------------------------------------------------------------------------------------------
// What ninep's decoder is expected to give back: the original with the qid type masked.
// ---------------------------------------------------------------------------------------------

fn mask_qid(q: &Qid) -> Qid {
    Qid {
        ty: q.ty & KNOWN_QT,
        ..*q
    }
}

fn mask_stat(st: &Stat) -> Stat {
    Stat {
        qid: mask_qid(&st.qid),
        ..st.clone()
    }
}

fn mask_t(m: &Tmsg) -> Tmsg {
    match m {
        Tmsg::Wstat { fid, stat } => Tmsg::Wstat {
            fid: *fid,
            stat: mask_stat(stat),
        },
        other => other.clone(),
    }
}

fn mask_r(m: &Rmsg) -> Rmsg {
    match m {
        Rmsg::Auth { aqid } => Rmsg::Auth {
            aqid: mask_qid(aqid),
        },
        Rmsg::Attach { qid } => Rmsg::Attach { qid: mask_qid(qid) },
        Rmsg::Walk { wqids } => Rmsg::Walk {
            wqids: wqids.iter().map(mask_qid).collect(),
        },
        Rmsg::Open { qid, iounit } => Rmsg::Open {
            qid: mask_qid(qid),
            iounit: *iounit,
        },
        Rmsg::Create { qid, iounit } => Rmsg::Create {
            qid: mask_qid(qid),
            iounit: *iounit,
        },
        Rmsg::Stat { stat } => Rmsg::Stat {
            stat: mask_stat(stat),
        },
        other => other.clone(),
    }
}

// ---------------------------------------------------------------------------------------------
// Encoding / decoding helpers
// ---------------------------------------------------------------------------------------------

fn ours_t(tag: u16, m: &Tmsg) -> Result<Vec<u8>, TestCaseError> {
    let mut b = BytesMut::new();
    wire::encode_t(&mut b, tag, m).map_err(|e| fail("encode_t", e))?;
    Ok(b.to_vec())
}

/// Encodes with `encode_r`, and checks that `encode_r_parts` yields the same bytes when its
/// separate payload is appended.
fn ours_r(tag: u16, m: &Rmsg) -> Result<Vec<u8>, TestCaseError> {
    let mut whole = BytesMut::new();
    wire::encode_r(&mut whole, tag, m).map_err(|e| fail("encode_r", e))?;
    let mut head = BytesMut::new();
    let payload = wire::encode_r_parts(&mut head, tag, m).map_err(|e| fail("encode_r_parts", e))?;
    if !matches!(m, Rmsg::Read { .. }) {
        prop_assert!(payload.is_none(), "only Rread splits off a payload");
    }
    let mut joined = head.to_vec();
    joined.extend_from_slice(payload.as_deref().unwrap_or_default());
    prop_assert_eq!(
        &joined[..],
        &whole[..],
        "encode_r_parts + payload != encode_r"
    );
    Ok(whole.to_vec())
}

fn ninep_t(tag: u16, m: &Tmsg) -> Result<Vec<u8>, TestCaseError> {
    Tmessage::new(tag, to_ninep_t(m))
        .write_9p_bytes()
        .map_err(|e| fail("ninep Tmessage encode", e))
}

fn ninep_r(tag: u16, m: &Rmsg) -> Result<Vec<u8>, TestCaseError> {
    Rmessage::new(tag, to_ninep_r(m))
        .write_9p_bytes()
        .map_err(|e| fail("ninep Rmessage encode", e))
}

/// Decodes a whole frame with ninep and checks it consumed exactly the frame.
fn ninep_read<T: NineP>(frame: &[u8]) -> Result<T, TestCaseError> {
    let mut r = frame;
    let v = T::read_from(u32::MAX, &SharedBuf::default(), &mut r)
        .map_err(|e| fail("ninep decode", e))?;
    prop_assert!(r.is_empty(), "ninep left {} bytes unread", r.len());
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Differential properties: messages
// ---------------------------------------------------------------------------------------------

fn check_t(tag: u16, m: &Tmsg) -> TestResult {
    let ours = ours_t(tag, m)?;
    let theirs = ninep_t(tag, m)?;

    // Ours -> ninep.
    let n: Tmessage = ninep_read(&ours)?;
    prop_assert_eq!(n.tag, tag);
    prop_assert_eq!(from_ninep_t(&n.content)?, mask_t(m));

    // ninep -> ours.
    let (t2, m2) = wire::decode_t(Bytes::from(theirs.clone())).map_err(|e| fail("decode_t", e))?;
    prop_assert_eq!(t2, tag);
    prop_assert_eq!(&m2, m);

    // Same bytes.
    prop_assert_eq!(ours, theirs, "encoders disagree for {}", m.name());
    Ok(())
}

fn check_r(tag: u16, m: &Rmsg) -> TestResult {
    let ours = ours_r(tag, m)?;
    let theirs = ninep_r(tag, m)?;

    let n: Rmessage = ninep_read(&ours)?;
    prop_assert_eq!(n.tag, tag);
    prop_assert_eq!(from_ninep_r(&n.content)?, mask_r(m));

    let (t2, m2) = wire::decode_r(Bytes::from(theirs.clone())).map_err(|e| fail("decode_r", e))?;
    prop_assert_eq!(t2, tag);
    prop_assert_eq!(&m2, m);

    prop_assert_eq!(ours, theirs, "encoders disagree for {:?}", m);
    Ok(())
}

fn check_stats(stats: &[Stat]) -> TestResult {
    let mut ours = BytesMut::new();
    let mut theirs = Vec::new();
    for st in stats {
        let mut one = BytesMut::new();
        wire::encode_stat(&mut one, st).map_err(|e| fail("encode_stat", e))?;
        let n_one = n_stat(st)
            .write_9p_bytes()
            .map_err(|e| fail("ninep RawStat encode", e))?;
        prop_assert_eq!(&one[..], &n_one[..], "stat encoders disagree");
        prop_assert_eq!(one.len(), st.encoded_len());

        // One entry each way.
        let back =
            wire::decode_stat(&Bytes::from(n_one.clone())).map_err(|e| fail("decode_stat", e))?;
        prop_assert_eq!(&back, st);
        let rs: RawStat = ninep_read(&one)?;
        prop_assert_eq!(from_n_stat(&rs)?, mask_stat(st));

        ours.extend_from_slice(&one);
        theirs.extend_from_slice(&n_one);
    }
    // A directory read's payload: concatenated entries.
    prop_assert_eq!(&ours[..], &theirs[..]);
    let dir = wire::decode_dir(&Bytes::from(theirs)).map_err(|e| fail("decode_dir", e))?;
    prop_assert_eq!(&dir[..], stats);
    let n_dir = Vec::<RawStat>::try_from(Data::from(ours.to_vec()))
        .map_err(|e| fail("ninep Vec<RawStat> from Data", e))?;
    prop_assert_eq!(n_dir.len(), stats.len());
    for (rs, st) in n_dir.iter().zip(stats) {
        prop_assert_eq!(from_n_stat(rs)?, mask_stat(st));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every T-message: ours -> ninep, ninep -> ours, identical bytes.
    #[test]
    fn t_messages_match_ninep(tag in tag(), m in tmsg()) {
        check_t(tag, &m)?;
    }

    /// Every R-message (including Rerror): ours -> ninep, ninep -> ours, identical bytes.
    #[test]
    fn r_messages_match_ninep(tag in tag(), m in rmsg()) {
        check_r(tag, &m)?;
    }

    /// Stat entries on their own and concatenated as a directory read.
    #[test]
    fn stats_and_dirs_match_ninep(stats in vec(stat(), 0..6)) {
        check_stats(&stats)?;
    }
}

// Each message type explicitly, so a generator change cannot silently drop one.
#[test]
fn every_message_type_matches_ninep_at_least_once() {
    let st = Stat {
        ty: 1,
        dev: 2,
        qid: Qid {
            ty: qt::DIR | 0x01,
            version: 3,
            path: 4,
        },
        mode: 0o755 | wire::dm::DIR,
        atime: 5,
        mtime: 6,
        length: 7,
        name: "dir".into(),
        uid: "ünïcode".into(),
        gid: "g".into(),
        muid: String::new(),
    };
    let q = st.qid;
    let ts = [
        Tmsg::Version {
            msize: 8192,
            version: "9P2000".into(),
        },
        Tmsg::Auth {
            afid: 1,
            uname: "u".into(),
            aname: String::new(),
        },
        Tmsg::Attach {
            fid: 0,
            afid: NOFID,
            uname: "u".into(),
            aname: "/".into(),
        },
        Tmsg::Flush { oldtag: 3 },
        Tmsg::Walk {
            fid: 0,
            newfid: 1,
            wnames: (0..MAXWELEM).map(|i| format!("n{i}")).collect(),
        },
        Tmsg::Open {
            fid: 1,
            mode: wire::om::ORDWR | wire::om::OTRUNC,
        },
        Tmsg::Create {
            fid: 1,
            name: "f".into(),
            perm: 0o644,
            mode: wire::om::OWRITE,
        },
        Tmsg::Read {
            fid: 1,
            offset: u64::MAX,
            count: 8168,
        },
        Tmsg::Write {
            fid: 1,
            offset: 9,
            data: Bytes::from_static(b"payload"),
        },
        Tmsg::Clunk { fid: 1 },
        Tmsg::Remove { fid: 1 },
        Tmsg::Stat { fid: 1 },
        Tmsg::Wstat {
            fid: 1,
            stat: st.clone(),
        },
        Tmsg::Wstat {
            fid: 1,
            stat: Stat::dont_touch(),
        },
    ];
    for (i, m) in ts.iter().enumerate() {
        check_t(i as u16, m).unwrap();
    }
    let rs = [
        Rmsg::Version {
            msize: 8192,
            version: "9P2000".into(),
        },
        Rmsg::Auth { aqid: q },
        Rmsg::Attach { qid: q },
        Rmsg::error("permission denied"),
        Rmsg::Flush,
        Rmsg::Walk {
            wqids: vec![q; MAXWELEM],
        },
        Rmsg::Open { qid: q, iounit: 0 },
        Rmsg::Create {
            qid: q,
            iounit: 8168,
        },
        Rmsg::Read {
            data: Bytes::from(vec![0xA5; MAX_PAYLOAD]),
        },
        Rmsg::Write { count: 7 },
        Rmsg::Clunk,
        Rmsg::Remove,
        Rmsg::Stat { stat: st },
        Rmsg::Wstat,
    ];
    for (i, m) in rs.iter().enumerate() {
        check_r(i as u16, m).unwrap();
    }
}

/// The documented differences: ninep drops unknown qid type bits when decoding, and accepts
/// Twalk/Rwalk with more than MAXWELEM elements and NUL bytes in strings, which we reject as
/// walk(5) and intro(5) require.
#[test]
fn documented_differences_from_ninep() {
    let q = Qid {
        ty: 0xFF,
        version: 1,
        path: 2,
    };
    let ours = ours_r(1, &Rmsg::Attach { qid: q }).unwrap();
    let n: Rmessage = ninep_read(&ours).unwrap();
    assert_eq!(
        n.content,
        Rdata::Attach {
            aqid: NQid {
                ty: FileType::from_bits_truncate(0xFF),
                version: 1,
                path: 2
            }
        }
    );
    assert_eq!(
        wire::decode_r(Bytes::from(ours)).unwrap().1,
        Rmsg::Attach { qid: q }
    );

    let walk17 = Tmessage::new(
        1,
        Tdata::Walk {
            fid: 0,
            new_fid: 1,
            wnames: vec!["x".to_owned(); MAXWELEM + 1],
        },
    )
    .write_9p_bytes()
    .unwrap();
    assert_eq!(
        wire::decode_t(Bytes::from(walk17)),
        Err(DecodeError::TooManyNames(MAXWELEM + 1))
    );
    let rwalk17 = Rmessage::new(
        1,
        Rdata::Walk {
            wqids: vec![n_qid(&q); MAXWELEM + 1],
        },
    )
    .write_9p_bytes()
    .unwrap();
    assert_eq!(
        wire::decode_r(Bytes::from(rwalk17)),
        Err(DecodeError::TooManyNames(MAXWELEM + 1))
    );

    let nul = Tmessage::new(
        1,
        Tdata::Create {
            fid: 0,
            name: "a\0b".into(),
            perm: 0,
            mode: 0,
        },
    )
    .write_9p_bytes()
    .unwrap();
    assert!(ninep_read::<Tmessage>(&nul).is_ok());
    assert_eq!(wire::decode_t(Bytes::from(nul)), Err(DecodeError::Nul));

    // A Twstat whose n[2] disagrees with the stat's own size: ninep takes it, we do not.
    let st = Stat::dont_touch();
    let bad = Tmessage::new(
        1,
        Tdata::Wstat {
            fid: 0,
            size: stat_n(&st) + 1,
            stat: n_stat(&st),
        },
    )
    .write_9p_bytes()
    .unwrap();
    assert!(matches!(
        wire::decode_t(Bytes::from(bad)),
        Err(DecodeError::BadStatSize { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// The decoder never panics
// ---------------------------------------------------------------------------------------------

/// Runs every decoder over `frame`. They must return (never panic); whatever they accept must
/// re-encode to exactly the input (the 9P2000 encoding is canonical and we reject trailing
/// bytes and inconsistent sizes), and ninep, which is more lenient, must decode it to the same
/// message.
fn check_decoders(frame: &[u8]) -> TestResult {
    let b = Bytes::copy_from_slice(frame);

    match wire::decode_header(frame) {
        Ok(h) => {
            prop_assert!(frame.len() >= HEADER_LEN);
            prop_assert_eq!(
                h.size,
                u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]])
            );
        }
        Err(e) => {
            prop_assert!(frame.len() < HEADER_LEN);
            let _: DecodeError = e;
        }
    }

    match wire::decode_t(b.clone()) {
        Ok((tag, m)) => {
            prop_assert_eq!(&ours_t(tag, &m)?[..], frame, "T re-encoding differs");
            let n: Tmessage = ninep_read(frame)?;
            prop_assert_eq!(n.tag, tag);
            prop_assert_eq!(from_ninep_t(&n.content)?, mask_t(&m));
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }

    match wire::decode_r(b.clone()) {
        Ok((tag, m)) => {
            prop_assert_eq!(&ours_r(tag, &m)?[..], frame, "R re-encoding differs");
            let n: Rmessage = ninep_read(frame)?;
            prop_assert_eq!(n.tag, tag);
            prop_assert_eq!(from_ninep_r(&n.content)?, mask_r(&m));
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }

    // The stat decoders, over the whole input and over what would follow an Rstat's n[2].
    for data in [b.clone(), b.slice(frame.len().min(HEADER_LEN + 2)..)] {
        if let Ok(st) = wire::decode_stat(&data) {
            let mut enc = BytesMut::new();
            wire::encode_stat(&mut enc, &st).map_err(|e| fail("encode_stat", e))?;
            prop_assert_eq!(&enc[..], &data[..], "stat re-encoding differs");
        }
        if let Ok(dir) = wire::decode_dir(&data) {
            let mut enc = BytesMut::new();
            for st in &dir {
                wire::encode_stat(&mut enc, st).map_err(|e| fail("encode_stat", e))?;
            }
            prop_assert_eq!(&enc[..], &data[..], "dir re-encoding differs");
        }
    }
    Ok(())
}

fn frame(ty: u8, tag: u16, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(HEADER_LEN + body.len());
    f.extend_from_slice(&((HEADER_LEN + body.len()) as u32).to_le_bytes());
    f.push(ty);
    f.extend_from_slice(&tag.to_le_bytes());
    f.extend_from_slice(body);
    f
}

fn fix_size(f: &mut [u8]) {
    if f.len() >= 4 {
        let n = (f.len() as u32).to_le_bytes();
        f[..4].copy_from_slice(&n);
    }
}

/// One edit of a valid frame.
#[derive(Debug, Clone)]
enum Mutation {
    Truncate(Index),
    FlipBit(Index, u8),
    SetByte(Index, u8),
    Insert(Index, Vec<u8>),
    Remove(Index, Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Mutation::SetByte(i, v)),
        (any::<Index>(), vec(any::<u8>(), 1..16)).prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<Index>(), any::<Index>()).prop_map(|(i, j)| Mutation::Remove(i, j)),
    ]
}

fn apply(f: &mut Vec<u8>, m: &Mutation) {
    let len = f.len();
    match m {
        Mutation::Truncate(i) => f.truncate(i.index(len + 1)),
        Mutation::FlipBit(i, bit) if len > 0 => f[i.index(len)] ^= 1 << bit,
        Mutation::SetByte(i, v) if len > 0 => f[i.index(len)] = *v,
        Mutation::Insert(i, v) => {
            let at = i.index(len + 1);
            f.splice(at..at, v.iter().copied());
        }
        Mutation::Remove(i, j) if len > 0 => {
            let a = i.index(len);
            let b = a + j.index(len - a + 1);
            f.drain(a..b);
        }
        _ => {}
    }
}

fn mutated(mut f: Vec<u8>, muts: &[Mutation], resize: bool) -> Vec<u8> {
    for m in muts {
        apply(&mut f, m);
    }
    // Half the time keep the size field honest so the body parsers get exercised.
    if resize {
        fix_size(&mut f);
    }
    f
}

fn frame_type() -> impl Strategy<Value = u8> {
    prop_oneof![4 => 100u8..=127, 1 => any::<u8>()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random bodies behind a correct size prefix, mostly with a known message type.
    #[test]
    fn decoders_never_panic_on_random_frames(
        ty in frame_type(),
        tag in any::<u16>(),
        body in prop_oneof![vec(any::<u8>(), 0..16), vec(any::<u8>(), 0..256)],
    ) {
        check_decoders(&frame(ty, tag, &body))?;
    }

    /// Entirely arbitrary bytes (size prefix almost always wrong, frames shorter than a header).
    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(bytes in vec(any::<u8>(), 0..64)) {
        check_decoders(&bytes)?;
    }

    /// Truncations, bit flips, insertions and deletions of valid T-frames.
    #[test]
    fn decoders_never_panic_on_mutated_t_frames(
        tag in any::<u16>(),
        m in tmsg(),
        muts in vec(mutation(), 1..4),
        resize in any::<bool>(),
    ) {
        check_decoders(&mutated(ours_t(tag, &m)?, &muts, resize))?;
    }

    /// Truncations, bit flips, insertions and deletions of valid R-frames.
    #[test]
    fn decoders_never_panic_on_mutated_r_frames(
        tag in any::<u16>(),
        m in rmsg(),
        muts in vec(mutation(), 1..4),
        resize in any::<bool>(),
    ) {
        check_decoders(&mutated(ours_r(tag, &m)?, &muts, resize))?;
    }

    /// Mutations of valid stat entries and directory-read payloads.
    #[test]
    fn decoders_never_panic_on_mutated_stats(
        stats in vec(stat(), 1..4),
        muts in vec(mutation(), 1..4),
    ) {
        let mut dir = BytesMut::new();
        for st in &stats {
            wire::encode_stat(&mut dir, st).map_err(|e| fail("encode_stat", e))?;
        }
        check_decoders(&mutated(dir.to_vec(), &muts, false))?;
    }

    /// Truncations of valid frames at (a sample of) every length, with the size field left
    /// alone and fixed up: no panic, and anything accepted must round-trip (`check_decoders`).
    #[test]
    fn truncations_never_panic(tag in any::<u16>(), m in prop_oneof![
        tmsg().prop_map(Ok),
        rmsg().prop_map(Err),
    ]) {
        let full = match &m {
            Ok(t) => ours_t(tag, t)?,
            Err(r) => ours_r(tag, r)?,
        };
        // Every cut of small frames; a sample of cuts of big ones.
        let step = (full.len() / 64).max(1);
        for cut in (0..full.len()).step_by(step) {
            let mut f = full[..cut].to_vec();
            check_decoders(&f)?;
            fix_size(&mut f);
            check_decoders(&f)?;
        }
    }
}
