//! Random request streams thrown at the server: valid frames with random fids, tags and
//! offsets mixed with garbage. The server must never panic, must answer or close, and other
//! connections must keep working.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::*;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use ollie_p9::server::{ConnInfo, Server};
use ollie_p9::wire::{self, NOFID, NOTAG, Stat, Tmsg};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("static".to_string()),
        Just("ctl".to_string()),
        Just("big".to_string()),
        Just("sub".to_string()),
        Just("sink".to_string()),
        Just("..".to_string()),
        "[a-z.]{0,4}",
    ]
}

fn tmsg() -> impl Strategy<Value = Tmsg> {
    let fid = 0u32..6;
    prop_oneof![
        (
            1u32..2_000_000,
            prop_oneof![Just("9P2000".to_string()), "[0-9P.]{0,8}"]
        )
            .prop_map(|(msize, version)| Tmsg::Version { msize, version }),
        (fid.clone(), "[a-z]{0,3}").prop_map(|(afid, uname)| Tmsg::Auth {
            afid,
            uname,
            aname: String::new()
        }),
        (fid.clone(), prop_oneof![Just(NOFID), 0u32..6]).prop_map(|(fid, afid)| Tmsg::Attach {
            fid,
            afid,
            uname: "u".into(),
            aname: String::new()
        }),
        any::<u16>().prop_map(|oldtag| Tmsg::Flush { oldtag }),
        (
            fid.clone(),
            fid.clone(),
            prop::collection::vec(name(), 0..4)
        )
            .prop_map(|(fid, newfid, wnames)| Tmsg::Walk {
                fid,
                newfid,
                wnames
            }),
        (fid.clone(), any::<u8>()).prop_map(|(fid, mode)| Tmsg::Open { fid, mode }),
        (fid.clone(), name(), any::<u32>(), any::<u8>()).prop_map(|(fid, name, perm, mode)| {
            Tmsg::Create {
                fid,
                name,
                perm,
                mode,
            }
        }),
        (fid.clone(), any::<u64>(), any::<u32>()).prop_map(|(fid, offset, count)| Tmsg::Read {
            fid,
            offset,
            count
        }),
        (
            fid.clone(),
            0u64..100,
            prop::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(fid, offset, d)| Tmsg::Write {
                fid,
                offset,
                data: Bytes::from(d)
            }),
        fid.clone().prop_map(|fid| Tmsg::Clunk { fid }),
        fid.clone().prop_map(|fid| Tmsg::Remove { fid }),
        fid.clone().prop_map(|fid| Tmsg::Stat { fid }),
        (fid, any::<u64>()).prop_map(|(fid, length)| {
            let mut stat = Stat::dont_touch();
            stat.length = length;
            Tmsg::Wstat { fid, stat }
        }),
    ]
}

#[derive(Debug, Clone)]
enum Chunk {
    Msg(u16, Tmsg),
    Garbage(Vec<u8>),
}

fn chunk() -> impl Strategy<Value = Chunk> {
    prop_oneof![
        8 => (0u16..8, tmsg()).prop_map(|(t, m)| Chunk::Msg(t, m)),
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Chunk::Garbage),
    ]
}

async fn serve(fs: Arc<TestFs>) -> (UnixStream, tokio::task::JoinHandle<()>) {
    let (a, b) = UnixStream::pair().unwrap();
    let srv = Server::new(fs);
    let h = tokio::spawn(async move {
        let info = ConnInfo {
            id: srv.next_conn_id(),
            peer: None,
            transport: "stream",
            remote: "fuzz".into(),
        };
        let (r, w) = b.into_split();
        srv.serve_conn(r, w, info).await;
    });
    (a, h)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn random_streams_never_break_the_server(chunks in prop::collection::vec(chunk(), 1..40)) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let fs = TestFs::new();
            let (mut s, h) = serve(Arc::clone(&fs)).await;
            // Start well-formed so the stream reaches the interesting states.
            let mut b = BytesMut::new();
            wire::encode_t(&mut b, NOTAG, &Tmsg::Version { msize: 8192, version: "9P2000".into() }).unwrap();
            wire::encode_t(&mut b, 0, &Tmsg::Attach { fid: 0, afid: NOFID, uname: "u".into(), aname: String::new() }).unwrap();
            for c in &chunks {
                match c {
                    Chunk::Msg(tag, m) => { let _ = wire::encode_t(&mut b, *tag, m); }
                    Chunk::Garbage(g) => b.extend_from_slice(g),
                }
            }
            let _ = s.write_all(&b).await;
            let _ = s.shutdown().await;
            // Unblock any parked reads so the connection can drain, then read to EOF.
            fs.poke.send_modify(|v| *v += 1);
            let mut sink = Vec::new();
            let read = tokio::time::timeout(std::time::Duration::from_secs(20), s.read_to_end(&mut sink)).await;
            prop_assert!(read.is_ok(), "server neither answered nor closed");
            drop(s);
            let joined = tokio::time::timeout(std::time::Duration::from_secs(20), h).await;
            prop_assert!(matches!(joined, Ok(Ok(()))), "connection task panicked or hung: {joined:?}");
            // Every reply that came back is a well-formed R-message.
            let mut buf = Bytes::from(sink);
            while buf.len() >= 4 {
                let n = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                prop_assert!(n >= 7 && n <= buf.len(), "bad reply frame size {n}");
                let frame = buf.split_to(n);
                prop_assert!(wire::decode_r(frame).is_ok());
            }
            prop_assert!(buf.is_empty(), "trailing partial reply");
            // A fresh connection to the same filesystem still works.
            let (mut s2, _h2) = serve(fs).await;
            let mut v = BytesMut::new();
            wire::encode_t(&mut v, NOTAG, &Tmsg::Version { msize: 8192, version: "9P2000".into() }).unwrap();
            s2.write_all(&v).await.unwrap();
            let mut hdr = [0u8; 7];
            s2.read_exact(&mut hdr).await.unwrap();
            prop_assert_eq!(hdr[4], 101);
            Ok(())
        })?;
    }
}
