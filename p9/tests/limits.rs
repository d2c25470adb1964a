//! The server core's limits: fids, authentication fids and running requests per connection,
//! the attach deadline, and the connection caps of `serve_unix`. Every refusal is checked for
//! its message, for the refused thing being absent, and for the connection (or the other
//! connections) still being served.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use ollie_p9::server::{Limits, Server};
use ollie_p9::wire::{self, NOFID, NOTAG, Rmsg, Tmsg, om};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

mod common;
use common::*;

/// Failure guard for every reply.
const GUARD: Duration = Duration::from_secs(20);

struct Raw {
    s: UnixStream,
}

impl Raw {
    async fn over(s: UnixStream) -> Raw {
        let mut r = Raw { s };
        let m = r
            .rpc(
                NOTAG,
                &Tmsg::Version {
                    msize: 8192,
                    version: "9P2000".into(),
                },
            )
            .await;
        assert!(matches!(m, Rmsg::Version { .. }), "{m:?}");
        r
    }

    async fn send(&mut self, tag: u16, m: &Tmsg) {
        let mut b = BytesMut::new();
        wire::encode_t(&mut b, tag, m).unwrap();
        self.s.write_all(&b).await.unwrap();
    }

    async fn recv(&mut self) -> (u16, Rmsg) {
        tokio::time::timeout(GUARD, async {
            wire::decode_r(common::read_frame(&mut self.s).await).unwrap()
        })
        .await
        .expect("no reply within the guard")
    }

    async fn rpc(&mut self, tag: u16, m: &Tmsg) -> Rmsg {
        self.send(tag, m).await;
        let (t, r) = self.recv().await;
        assert_eq!(t, tag, "{r:?}");
        r
    }

    async fn attach(&mut self, fid: u32) -> Rmsg {
        self.rpc(
            1,
            &Tmsg::Attach {
                fid,
                afid: NOFID,
                uname: "u".into(),
                aname: String::new(),
            },
        )
        .await
    }

    async fn clone_fid(&mut self, from: u32, newfid: u32) -> Rmsg {
        self.rpc(
            2,
            &Tmsg::Walk {
                fid: from,
                newfid,
                wnames: vec![],
            },
        )
        .await
    }

    async fn auth(&mut self, afid: u32) -> Rmsg {
        self.rpc(
            3,
            &Tmsg::Auth {
                afid,
                uname: "u".into(),
                aname: "auth".into(),
            },
        )
        .await
    }

    async fn stat(&mut self, fid: u32) -> Rmsg {
        self.rpc(4, &Tmsg::Stat { fid }).await
    }

    /// Reads until the server closes the connection (bounded by the guard).
    async fn expect_closed(&mut self) {
        let mut b = [0u8; 256];
        tokio::time::timeout(GUARD, async {
            loop {
                match self.s.read(&mut b).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .expect("the server did not close the connection");
    }
}

fn err_of(m: &Rmsg) -> &str {
    match m {
        Rmsg::Error { ename } => ename,
        other => panic!("expected Rerror, got {other:?}"),
    }
}

fn limits() -> Limits {
    Limits {
        max_fids: 8,
        max_afids: 2,
        max_inflight: 4,
        ..Limits::default()
    }
}

#[tokio::test]
async fn fid_cap_refuses_new_fids_and_the_connection_keeps_working() {
    let fs = TestFs::new();
    let mut r = Raw::over(start_with(Arc::clone(&fs), limits())).await;
    assert!(matches!(r.attach(0).await, Rmsg::Attach { .. }));
    for f in 1..8 {
        let m = r.clone_fid(0, f).await;
        assert!(matches!(m, Rmsg::Walk { .. }), "fid {f}: {m:?}");
    }
    // The ninth fid, by walk and by attach: refused with the limit named.
    let m = r.clone_fid(0, 8).await;
    assert_eq!(
        err_of(&m),
        "too many fids on this connection (limit 8); clunk some"
    );
    let m = r.attach(9).await;
    assert!(err_of(&m).contains("too many fids"), "{m:?}");
    // Neither was created.
    assert!(err_of(&r.stat(8).await).contains("unknown fid"));
    assert!(err_of(&r.stat(9).await).contains("unknown fid"));
    // Everything else still works, and a clunk makes room.
    assert!(matches!(r.stat(0).await, Rmsg::Stat { .. }));
    assert_eq!(r.rpc(5, &Tmsg::Clunk { fid: 1 }).await, Rmsg::Clunk);
    assert!(matches!(r.clone_fid(0, 8).await, Rmsg::Walk { .. }));
    assert!(matches!(r.stat(8).await, Rmsg::Stat { .. }));
    // Tversion starts afresh: the whole quota again.
    let m = r
        .rpc(
            NOTAG,
            &Tmsg::Version {
                msize: 8192,
                version: "9P2000".into(),
            },
        )
        .await;
    assert!(matches!(m, Rmsg::Version { .. }));
    assert!(matches!(r.attach(0).await, Rmsg::Attach { .. }));
    for f in 1..8 {
        assert!(matches!(r.clone_fid(0, f).await, Rmsg::Walk { .. }));
    }
}

#[tokio::test]
async fn afid_cap_refuses_tauth_and_clunked_afids_give_their_place_back() {
    let fs = TestFs::new();
    let mut r = Raw::over(start_with(Arc::clone(&fs), limits())).await;
    assert!(matches!(r.auth(100).await, Rmsg::Auth { .. }));
    assert!(matches!(r.auth(101).await, Rmsg::Auth { .. }));
    let m = r.auth(102).await;
    assert_eq!(
        err_of(&m),
        "too many authentication fids on this connection (limit 2); clunk some"
    );
    assert!(err_of(&r.stat(102).await).contains("unknown fid"));
    // Attaching still works (an attach fid is not an afid).
    assert!(matches!(r.attach(0).await, Rmsg::Attach { .. }));
    // A failed Tauth takes no place: refused ones never count.
    for _ in 0..10 {
        let m = r
            .rpc(
                3,
                &Tmsg::Auth {
                    afid: 103,
                    uname: "u".into(),
                    aname: "other".into(),
                },
            )
            .await;
        assert!(err_of(&m).contains("too many authentication fids"), "{m:?}");
    }
    // Clunking one afid makes room for exactly one more.
    assert_eq!(r.rpc(5, &Tmsg::Clunk { fid: 100 }).await, Rmsg::Clunk);
    assert!(matches!(r.auth(102).await, Rmsg::Auth { .. }));
    assert!(err_of(&r.auth(104).await).contains("too many authentication fids"));
    // Many Tauth/Tclunk rounds on one connection never accumulate.
    for _ in 0..2000 {
        assert_eq!(r.rpc(5, &Tmsg::Clunk { fid: 102 }).await, Rmsg::Clunk);
        assert!(matches!(r.auth(102).await, Rmsg::Auth { .. }));
    }
    assert!(err_of(&r.auth(105).await).contains("too many authentication fids"));
}

#[tokio::test]
async fn request_cap_answers_rerror_and_flush_frees_a_place() {
    let fs = TestFs::new();
    let mut r = Raw::over(start_with(Arc::clone(&fs), limits())).await;
    assert!(matches!(r.attach(0).await, Rmsg::Attach { .. }));
    for f in 1..=5 {
        assert!(matches!(
            r.rpc(
                1,
                &Tmsg::Walk {
                    fid: 0,
                    newfid: f,
                    wnames: vec!["block".into()]
                }
            )
            .await,
            Rmsg::Walk { .. }
        ));
        assert!(matches!(
            r.rpc(
                1,
                &Tmsg::Open {
                    fid: f,
                    mode: om::OREAD
                }
            )
            .await,
            Rmsg::Open { .. }
        ));
    }
    assert!(matches!(r.clone_fid(0, 6).await, Rmsg::Walk { .. }));
    // Four blocked reads: the cap.
    for (tag, fid) in [(10u16, 1u32), (11, 2), (12, 3), (13, 4)] {
        r.send(
            tag,
            &Tmsg::Read {
                fid,
                offset: 0,
                count: 10,
            },
        )
        .await;
    }
    // The fifth is refused at once, as is anything but Tflush, Tclunk and Tversion (before it
    // runs, so a refused request never did anything).
    let read5 = Tmsg::Read {
        fid: 5,
        offset: 0,
        count: 10,
    };
    let m = r.rpc(14, &read5).await;
    assert_eq!(
        err_of(&m),
        "too many outstanding requests on this connection (limit 4; in use)"
    );
    assert!(err_of(&r.stat(0).await).contains("too many outstanding requests"));
    assert!(err_of(&r.clone_fid(0, 9).await).contains("too many outstanding requests"));
    // Tclunk is served at the cap.
    assert_eq!(r.rpc(5, &Tmsg::Clunk { fid: 6 }).await, Rmsg::Clunk);
    // Tflush is always served and frees a place: the next read is accepted. It blocks, so
    // the next reply is the stat's (rpc checks the tag; a refusal of tag 16 would have come
    // first), and that stat is refused because the read took the freed place.
    assert_eq!(r.rpc(15, &Tmsg::Flush { oldtag: 10 }).await, Rmsg::Flush);
    r.send(16, &read5).await;
    assert!(err_of(&r.stat(0).await).contains("too many outstanding requests"));
    // Below the cap again, what was refused or clunked is absent.
    assert_eq!(r.rpc(18, &Tmsg::Flush { oldtag: 11 }).await, Rmsg::Flush);
    assert!(err_of(&r.stat(9).await).contains("unknown fid"));
    assert!(err_of(&r.stat(6).await).contains("unknown fid"));
}

#[tokio::test]
async fn a_connection_that_never_attaches_is_closed_after_the_deadline() {
    let fs = TestFs::new();
    let l = Limits {
        attach_timeout: Some(Duration::from_millis(300)),
        ..Limits::default()
    };
    // One connection attaches, one only negotiates a version, one sends nothing at all, one
    // only holds afids.
    let mut good = Raw::over(start_with(Arc::clone(&fs), l)).await;
    assert!(matches!(good.attach(0).await, Rmsg::Attach { .. }));
    let mut idle = Raw::over(start_with(Arc::clone(&fs), l)).await;
    let mut silent = Raw {
        s: start_with(Arc::clone(&fs), l),
    };
    let mut authing = Raw::over(start_with(Arc::clone(&fs), l)).await;
    assert!(matches!(authing.auth(100).await, Rmsg::Auth { .. }));
    idle.expect_closed().await;
    silent.expect_closed().await;
    authing.expect_closed().await;
    // The attached one outlived them and is still served.
    assert!(matches!(good.stat(0).await, Rmsg::Stat { .. }));
}

/// A `serve_unix` server on a fresh socket with these limits.
fn listen(l: Limits) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let srv = Server::with_limits(TestFs::new(), ollie_p9::server::DEFAULT_MAX_MSIZE, l);
    tokio::spawn(async move {
        let _ = srv
            .serve_unix(listener, std::future::pending(), Duration::ZERO)
            .await;
    });
    (dir, path)
}

/// Connects and sends Tversion: `Ok` with the connection if served, `Err` with the refusal.
async fn try_conn(path: &std::path::Path) -> Result<Raw, String> {
    let mut r = Raw {
        s: UnixStream::connect(path).await.unwrap(),
    };
    r.send(
        NOTAG,
        &Tmsg::Version {
            msize: 8192,
            version: "9P2000".into(),
        },
    )
    .await;
    match r.recv().await {
        (NOTAG, Rmsg::Version { .. }) => Ok(r),
        (NOTAG, Rmsg::Error { ename }) => {
            r.expect_closed().await;
            Err(ename)
        }
        other => panic!("{other:?}"),
    }
}

/// Opens connections until one is refused: the ones served, and the refusal.
async fn fill(path: &std::path::Path, at_most: usize) -> (Vec<Raw>, String) {
    let mut held = Vec::new();
    for _ in 0..at_most {
        match try_conn(path).await {
            Ok(r) => held.push(r),
            Err(e) => return (held, e),
        }
    }
    panic!("{at_most} connections were all served");
}

#[tokio::test]
async fn connection_caps_refuse_the_excess_and_the_served_ones_keep_working() {
    let uid = nix::unistd::getuid().as_raw();
    // Per peer (all of ours share a uid).
    let (_d, path) = listen(Limits {
        max_conns: 100,
        max_conns_per_peer: 3,
        ..Limits::default()
    });
    let (mut held, why) = fill(&path, 10).await;
    assert_eq!(held.len(), 3);
    assert_eq!(
        why,
        format!("too many connections from uid {uid} (limit 3)")
    );
    // The served ones work; after one closes, a new one is served.
    for r in &mut held {
        assert!(matches!(r.attach(0).await, Rmsg::Attach { .. }));
        assert!(matches!(r.stat(0).await, Rmsg::Stat { .. }));
    }
    drop(held.pop());
    let again = tokio::time::timeout(GUARD, async {
        loop {
            if let Ok(r) = try_conn(&path).await {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a place freed by a closed connection was never given back");
    held.push(again);
    assert!(try_conn(&path).await.is_err());

    // Globally.
    let (_d, path) = listen(Limits {
        max_conns: 2,
        max_conns_per_peer: 100,
        ..Limits::default()
    });
    let (mut held, why) = fill(&path, 10).await;
    assert_eq!(held.len(), 2);
    assert_eq!(why, "too many connections to this server (limit 2)");
    for r in &mut held {
        assert!(matches!(r.attach(0).await, Rmsg::Attach { .. }));
    }
}
