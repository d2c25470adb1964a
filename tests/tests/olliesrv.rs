//! Cross-process interop suite: the real `olliesrv` binary driven by our client, the real
//! `ollie-9p` binary, the `ninep` crate's client and raw 9P frames.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use nix::sys::signal::Signal;
use ollie_p9::wire::{NOFID, NOTAG, Rmsg, Stat, Tmsg, dm, om};
use ollie_p9::{Client, Fid};

const ROOT_NAMES: [&str; 13] = [
    "agents",
    "aliases",
    "backends",
    "bypass",
    "ctl",
    "eventwait",
    "generate",
    "help",
    "lasterror",
    "models",
    "session",
    "skills",
    "tools",
];

fn names(entries: &[Stat]) -> BTreeSet<String> {
    entries.iter().map(|s| s.name.clone()).collect()
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

async fn open(root: &Fid, path: &str, mode: u8) -> Fid {
    let mut f = within("walk", root.walk_path(path))
        .await
        .unwrap_or_else(|e| panic!("walk {path}: {e}"));
    within("open", f.open(mode))
        .await
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    f
}

async fn read_all(root: &Fid, path: &str) -> String {
    let f = open(root, path, om::OREAD).await;
    let d = within("read", f.read_to_end()).await.expect("read");
    within("clunk", f.clunk()).await.expect("clunk");
    String::from_utf8(d).expect("utf-8")
}

/// Opens `ctl` ORDWR, writes `cmd`, reads the reply from offset 0 on the same fid.
async fn rdwr(root: &Fid, cmd: &str) -> Result<String, String> {
    let f = open(root, "ctl", om::ORDWR).await;
    within("write", f.write(0, Bytes::from(cmd.to_owned())))
        .await
        .map_err(|e| e.to_string())?;
    let d = within("read", f.read_to_end()).await.expect("read reply");
    Ok(String::from_utf8(d).expect("utf-8"))
}

fn json(line: &[u8]) -> serde_json::Value {
    let s = std::str::from_utf8(line).expect("utf-8 event");
    assert!(s.ends_with('\n'), "event is not one line: {s:?}");
    assert_eq!(s.matches('\n').count(), 1, "event is not one line: {s:?}");
    serde_json::from_str(s.trim_end()).unwrap_or_else(|e| panic!("bad JSON {s:?}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Our client

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_ls_read_write_rdwr() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;

    let mut d = within("clone", root.clone_fid()).await.expect("clone root");
    within("open /", d.open(om::OREAD)).await.expect("open /");
    let entries = within("readdir", d.read_dir()).await.expect("read dir");
    assert_eq!(names(&entries), set(&ROOT_NAMES));
    let me = me();
    for e in &entries {
        assert_eq!(e.uid, me, "{}", e.name);
        assert_eq!(e.gid, "agent", "{}", e.name);
    }

    let help = read_all(&root, "help").await;
    assert!(help.contains("eventwait"), "{help}");
    let hs = within("stat", root.walk_path("help"))
        .await
        .unwrap()
        .stat()
        .await
        .unwrap();
    assert_eq!(
        hs.length,
        help.len() as u64,
        "help's stat length is its true length"
    );

    assert_eq!(read_all(&root, "backends").await, "alpha\nbeta\n");

    // write: OWRITE|OTRUNC then one Twrite, as `echo help > ctl` does.
    let w = open(&root, "ctl", om::OWRITE | om::OTRUNC).await;
    let n = within("write", w.write(0, Bytes::from_static(b"help\n")))
        .await
        .expect("write help");
    assert_eq!(n, 5);
    within("clunk", w.clunk()).await.unwrap();

    let reply = rdwr(&root, "help\n").await.expect("rdwr help");
    for c in ["help", "invalidate", "kill"] {
        assert!(
            reply.lines().any(|l| l.starts_with(c)),
            "{c} missing: {reply}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// ollie-9p

#[test]
fn cli_ls_read_write_rdwr() {
    let srv = Srv::start(CONFIG);
    let a = srv.addr();

    let o = ollie9p(&a, &["ls"], b"");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "agents\naliases\nbackends\nbypass/\nctl\neventwait\ngenerate\nhelp\nlasterror\nmodels\nsession/\nskills/\ntools\n"
    );

    let o = ollie9p(&a, &["ls", "-l"], b"");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let line = |name: &str| {
        out.lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .unwrap_or_else(|| panic!("{name} missing from ls -l:\n{out}"))
            .to_owned()
    };
    assert!(line("ctl").starts_with("--rw------- "), "{out}");
    assert!(line("help").starts_with("--r--r--r-- "), "{out}");
    assert!(line("eventwait").starts_with("--r--r--r-- "), "{out}");
    assert!(line("ctl").contains(&format!(" {} agent ", me())), "{out}");

    let o = ollie9p(&a, &["ls", "-l", "-d", "/"], b"");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).starts_with("d-r-xr-xr-x "),
        "{}",
        text(&o.stdout)
    );

    let o = ollie9p(&a, &["read", "help"], b"");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("ctl commands"),
        "{}",
        text(&o.stdout)
    );

    let o = ollie9p(&a, &["read", "backends"], b"");
    assert_eq!(text(&o.stdout), "alpha\nbeta\n");

    let o = ollie9p(&a, &["write", "ctl"], b"help\n");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "");

    let o = ollie9p(&a, &["rdwr", "ctl"], b"help\n");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("invalidate") && out.contains("kill"), "{out}");

    let o = ollie9p(&a, &["stat", "ctl"], b"");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains(" m 0600 "), "{}", text(&o.stdout));

    // Server errors: exit 1 with the server's one-line message.
    let o = ollie9p(&a, &["rdwr", "ctl"], b"frobnicate\n");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("frobnicate") && err.contains("help, invalidate, kill"),
        "{err}"
    );

    let o = ollie9p(&a, &["read", "nonexistent"], b"");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("does not exist"),
        "{}",
        text(&o.stderr)
    );

    // Usage: 2; cannot connect: 3.
    let o = ollie9p(&a, &["frob"], b"");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let missing = format!("unix!{}", srv.dir.path().join("nope").display());
    let o = ollie9p(&missing, &["ls"], b"");
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
}

// ---------------------------------------------------------------------------------------------
// ninep's client

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ninep_client_ls_read_write() {
    use ninep::tokio::client::Client as NClient;
    let srv = Srv::start(CONFIG);
    let c = within(
        "ninep connect",
        NClient::new_unix_with_explicit_path(me(), &srv.sock, ""),
    )
    .await
    .expect("ninep attach");

    // ninep lists "/" by opening its root fid, after which nothing can be walked from it: list
    // on a connection of its own.
    let lister = within(
        "ninep connect",
        NClient::new_unix_with_explicit_path(me(), &srv.sock, ""),
    )
    .await
    .expect("ninep attach");
    let entries = within("ninep ls", lister.read_dir("/"))
        .await
        .expect("read_dir");
    let got: BTreeSet<String> = entries.iter().map(|s| s.name.clone()).collect();
    assert_eq!(got, set(&ROOT_NAMES));
    let ctl = entries.iter().find(|s| s.name == "ctl").unwrap();
    assert_eq!(ctl.perms.bits() & 0o777, 0o600);

    let help = within("ninep read", c.read_str("help"))
        .await
        .expect("help");
    assert!(help.contains("eventwait"), "{help}");
    let b = within("ninep read", c.read_str("backends"))
        .await
        .expect("backends");
    assert_eq!(b, "alpha\nbeta\n");
    let st = within("ninep stat", c.stat("eventwait"))
        .await
        .expect("stat");
    assert_eq!(st.perms.bits() & 0o777, 0o444);

    let n = within("ninep write", c.write_str("ctl", 0, "help\n"))
        .await
        .expect("write help");
    assert_eq!(n, 5);

    // ninep caches one fid per path and re-opens it for each operation, so the error case gets a
    // fresh connection (a fresh fid).
    let c2 = within(
        "ninep connect",
        NClient::new_unix_with_explicit_path(me(), &srv.sock, ""),
    )
    .await
    .expect("ninep attach");
    match within("ninep write", c2.write_str("ctl", 0, "frobnicate\n")).await {
        Err(ninep::tokio::client::Error::Rerror { ename }) => {
            assert!(ename.contains("frobnicate"), "{ename}");
            assert!(ename.contains("help, invalidate, kill"), "{ename}");
        }
        other => panic!("expected Rerror, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ninep_stream_sees_server_stopping_then_eof() {
    use ninep::tokio::client::Client as NClient;
    let mut srv = Srv::start(CONFIG);
    let c = within(
        "ninep connect",
        NClient::new_unix_with_explicit_path(me(), &srv.sock, ""),
    )
    .await
    .expect("ninep attach");
    let mut lines = within("ninep open", c.stream_lines("eventwait"))
        .await
        .expect("stream eventwait");
    let (_oc, root) = attach(&srv, &me()).await;
    // An event after the fid was opened: the stream sees it.
    rdwr(&root, "invalidate").await.expect("invalidate");
    let l = within("event", lines.next()).await.expect("an event");
    assert_eq!(
        json(format!("{l}\n").as_bytes())["event"],
        "config-reloaded"
    );
    let w = open(&root, "ctl", om::OWRITE).await;
    within("kill", w.write(0, Bytes::from_static(b"kill")))
        .await
        .expect("kill");
    let l = within("event", lines.next())
        .await
        .expect("server-stopping");
    assert_eq!(
        json(format!("{l}\n").as_bytes())["event"],
        "server-stopping"
    );
    assert!(
        within("eof", lines.next()).await.is_none(),
        "EOF after stopping"
    );
    assert!(srv.wait_exit().success(), "{}", srv.stderr());
}

// ---------------------------------------------------------------------------------------------
// ctl semantics

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_replies_are_per_fid() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let a = open(&root, "ctl", om::ORDWR).await;
    let b = open(&root, "ctl", om::ORDWR).await;
    let idle = open(&root, "ctl", om::ORDWR).await;
    within("write a", a.write(0, Bytes::from_static(b"help\n")))
        .await
        .expect("help");
    within("write b", b.write(0, Bytes::from_static(b"invalidate\n")))
        .await
        .expect("invalidate");
    let ra = String::from_utf8(within("read a", a.read_to_end()).await.unwrap()).unwrap();
    let rb = String::from_utf8(within("read b", b.read_to_end()).await.unwrap()).unwrap();
    assert!(ra.starts_with("help\t"), "fid a got {ra:?}");
    assert!(!ra.contains("reloaded"), "fid a got b's reply: {ra:?}");
    assert_eq!(rb, "config reloaded: 2 backends\n", "fid b");
    let ri = within("read idle", idle.read_to_end()).await.unwrap();
    assert!(
        ri.is_empty(),
        "a fid that wrote nothing reads nothing: {ri:?}"
    );
    // Reading again from offset 0 gives the same reply (it is kept on the fid).
    let again = within("reread", a.read(0, 8192)).await.unwrap();
    assert_eq!(&again[..], ra.as_bytes());
}

#[test]
fn unknown_ctl_command_is_rerror_on_the_twrite() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::session(&srv.sock);
    r.walk(2, 0, 1, &["ctl"]);
    r.open(3, 1, om::ORDWR);
    match r.rpc(
        4,
        &Tmsg::Write {
            fid: 1,
            offset: 0,
            data: Bytes::from_static(b"frobnicate\n"),
        },
    ) {
        Rmsg::Error { ename } => {
            assert!(!ename.contains('\n'), "one line: {ename:?}");
            assert!(ename.contains("frobnicate"), "{ename}");
            assert!(ename.contains("help, invalidate, kill"), "{ename}");
        }
        other => panic!("expected Rerror on the Twrite, got {other:?}"),
    }
    assert!(
        r.read(5, 1, 0, 4096).is_empty(),
        "a failed write leaves no reply"
    );
    // The fid is still usable.
    match r.rpc(
        6,
        &Tmsg::Write {
            fid: 1,
            offset: 0,
            data: Bytes::from_static(b"help"),
        },
    ) {
        Rmsg::Write { count } => assert_eq!(count, 4),
        other => panic!("{other:?}"),
    }
    assert!(!r.read(7, 1, 0, 4096).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Blocking reads and flush

#[test]
fn raw_flush_of_a_parked_eventwait_read() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::session(&srv.sock);
    r.walk(2, 0, 1, &["eventwait"]);
    r.open(3, 1, om::OREAD);
    r.walk(4, 0, 2, &["help"]);
    r.open(5, 2, om::OREAD);

    // Park a read on eventwait (tag 10).
    r.send(
        10,
        &Tmsg::Read {
            fid: 1,
            offset: 0,
            count: 4096,
        },
    );
    // A read on another fid is answered while it is parked.
    let (t, m) = {
        r.send(
            11,
            &Tmsg::Read {
                fid: 2,
                offset: 0,
                count: 64,
            },
        );
        r.recv()
    };
    assert_eq!(t, 11, "the parked read (tag 10) must not answer: {m:?}");
    assert!(
        matches!(m, Rmsg::Read { ref data } if !data.is_empty()),
        "{m:?}"
    );

    // Tflush: the next frame is the Rflush, not an Rread for tag 10.
    r.send(12, &Tmsg::Flush { oldtag: 10 });
    let (t, m) = r.recv();
    assert_eq!((t, &m), (12, &Rmsg::Flush), "expected Rflush for tag 12");
    // The old tag is free again, and no late Rread for it shows up.
    match r.rpc(10, &Tmsg::Stat { fid: 1 }) {
        Rmsg::Stat { stat } => assert_eq!(stat.name, "eventwait"),
        other => panic!("{other:?}"),
    }
    r.assert_quiet(Duration::from_millis(100));

    // The connection and the fid still work: a new read on the same fid gets the next event.
    r.send(
        13,
        &Tmsg::Read {
            fid: 1,
            offset: 0,
            count: 4096,
        },
    );
    let mut other = Raw::session(&srv.sock);
    other.walk(2, 0, 1, &["ctl"]);
    other.open(3, 1, om::ORDWR);
    match other.rpc(
        4,
        &Tmsg::Write {
            fid: 1,
            offset: 0,
            data: Bytes::from_static(b"invalidate"),
        },
    ) {
        Rmsg::Write { count } => assert_eq!(count, 10),
        m => panic!("{m:?}"),
    }
    let (t, m) = r.recv();
    assert_eq!(t, 13);
    let Rmsg::Read { data } = m else {
        panic!("{m:?}")
    };
    assert_eq!(
        json(&data)["event"],
        "config-reloaded",
        "the flushed read must not have swallowed the event"
    );
    // Flush of a finished request is answered too.
    match r.rpc(14, &Tmsg::Flush { oldtag: 13 }) {
        Rmsg::Flush => {}
        m => panic!("{m:?}"),
    }
    r.clunk(15, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_drops_a_parked_read_and_carries_on() {
    let srv = Srv::start(CONFIG);
    let (c, root) = attach(&srv, &me()).await;
    let ev = open(&root, "eventwait", om::OREAD).await;
    let parked = ev.read_call(0, 4096).expect("send read");
    // Another fid on the same connection is not delayed by the parked read.
    let help = read_all(&root, "help").await;
    assert!(!help.is_empty());
    // Dropping the future sends Tflush.
    drop(parked);

    // The fid is usable: the next read gets the next event (so the flushed read was cancelled
    // rather than left to swallow it), and the connection carries on.
    let next = ev.read_call(0, 4096).expect("send read");
    rdwr(&root, "invalidate").await.expect("invalidate");
    let got = within("eventwait", next).await.expect("event");
    let Rmsg::Read { data } = got else {
        panic!("{got:?}")
    };
    assert_eq!(json(&data)["event"], "config-reloaded");
    assert_eq!(read_all(&root, "backends").await, "alpha\nbeta\n");
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_read_does_not_delay_other_fids_or_clients() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let ev = open(&root, "eventwait", om::OREAD).await;
    let mut parked: Vec<_> = (0..4).map(|_| ev.read_call(0, 4096).unwrap()).collect();
    let (_c2, root2) = attach(&srv, &me()).await;
    let ev2 = open(&root2, "eventwait", om::OREAD).await;
    let parked2 = ev2.read_call(0, 4096).unwrap();
    // Several reads on both connections answer while those are parked.
    for _ in 0..5 {
        assert_eq!(read_all(&root, "backends").await, "alpha\nbeta\n");
        assert_eq!(read_all(&root2, "backends").await, "alpha\nbeta\n");
        let r = rdwr(&root, "help").await.unwrap();
        assert!(r.contains("kill"));
    }
    // The reads on one fid run in arrival order: an event wakes the first queued read.
    rdwr(&root2, "invalidate").await.unwrap();
    let first = within("first parked read", parked.remove(0)).await.unwrap();
    assert!(matches!(first, Rmsg::Read { ref data } if json(data)["event"] == "config-reloaded"));
    let other = within("other client's read", parked2).await.unwrap();
    assert!(matches!(other, Rmsg::Read { ref data } if json(data)["event"] == "config-reloaded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_at_once() {
    use ninep::tokio::client::Client as NClient;
    let srv = Srv::start(CONFIG);
    let (_c1, r1) = attach(&srv, &me()).await;
    let (_c2, r2) = attach(&srv, &me()).await;
    let n = within(
        "ninep connect",
        NClient::new_unix_with_explicit_path(me(), &srv.sock, ""),
    )
    .await
    .expect("ninep attach");

    let a = open(&r1, "ctl", om::ORDWR).await;
    let b = open(&r2, "ctl", om::ORDWR).await;
    let ev = open(&r1, "eventwait", om::OREAD).await;
    let waiting = ev.read_call(0, 4096).unwrap();
    within("a", a.write(0, Bytes::from_static(b"help")))
        .await
        .unwrap();
    within("b", b.write(0, Bytes::from_static(b"invalidate")))
        .await
        .unwrap();
    // Meanwhile the third (ninep) client reads too.
    assert_eq!(
        within("ninep", n.read_str("backends")).await.unwrap(),
        "alpha\nbeta\n"
    );
    let ra = String::from_utf8(a.read_to_end().await.unwrap()).unwrap();
    let rb = String::from_utf8(b.read_to_end().await.unwrap()).unwrap();
    assert!(ra.starts_with("help\t"), "{ra}");
    assert!(rb.starts_with("config reloaded"), "{rb}");
    // Client 2's invalidate woke client 1's eventwait read.
    let Rmsg::Read { data } = within("event", waiting).await.unwrap() else {
        panic!("not an Rread")
    };
    assert_eq!(json(&data)["event"], "config-reloaded");
}

// ---------------------------------------------------------------------------------------------
// The socket

#[test]
fn socket_dir_is_0700_and_socket_0600() {
    let srv = Srv::start(CONFIG);
    let dir = std::fs::metadata(srv.sock.parent().unwrap()).unwrap();
    assert!(dir.is_dir());
    assert_eq!(dir.permissions().mode() & 0o777, 0o700);
    let s = std::fs::symlink_metadata(&srv.sock).unwrap();
    assert!(s.file_type().is_socket());
    assert_eq!(s.permissions().mode() & 0o777, 0o600);
}

#[test]
fn a_stale_socket_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let ns = dir.path().join("ns");
    std::fs::create_dir(&ns).unwrap();
    std::fs::set_permissions(&ns, std::fs::Permissions::from_mode(0o700)).unwrap();
    let stale = ns.join("ollie");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(
        std::os::unix::net::UnixStream::connect(&stale).is_err(),
        "nobody listens on the stale socket"
    );
    // start_with waits until the socket accepts connections: a listener replaced it.
    let srv = Srv::start_with(dir, CONFIG, |_| {});
    assert_eq!(
        std::fs::symlink_metadata(&srv.sock)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let o = ollie9p(&srv.addr(), &["read", "backends"], b"");
    assert_eq!(text(&o.stdout), "alpha\nbeta\n", "{}", text(&o.stderr));
}

#[test]
fn a_second_server_on_the_same_state_directory_exits_3() {
    let srv = Srv::start(CONFIG);
    let mut cmd = Command::new(bin("olliesrv"));
    cmd.arg("--config")
        .arg(&srv.config)
        .arg("-a")
        .arg(format!(
            "unix!{}",
            srv.dir.path().join("ns2").join("ollie").display()
        ))
        .arg("--state-dir")
        .arg(srv.state_dir());
    let o = run(&mut cmd, b"");
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains("in use by another olliesrv"), "{err}");
    // The first keeps serving.
    let o = ollie9p(&srv.addr(), &["read", "backends"], b"");
    assert_eq!(text(&o.stdout), "alpha\nbeta\n");
}

#[test]
fn a_second_server_on_a_live_socket_exits_3() {
    let srv = Srv::start(CONFIG);
    let mut cmd = Command::new(bin("olliesrv"));
    cmd.arg("--config")
        .arg(&srv.config)
        .arg("-a")
        .arg(srv.addr())
        .arg("--state-dir")
        .arg(srv.dir.path().join("state2"));
    let o = run(&mut cmd, b"");
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("already listening"), "{err}");
    // The first keeps serving, on the same socket file.
    assert!(srv.sock.exists());
    let o = ollie9p(&srv.addr(), &["read", "backends"], b"");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "alpha\nbeta\n");
}

// ---------------------------------------------------------------------------------------------
// Stopping

/// Opens eventwait, parks a read, runs `stop`, and checks the reader gets `server-stopping`,
/// then EOF, and the server exits 0 and removes its socket.
async fn check_clean_stop(mut srv: Srv, stop: impl FnOnce(&Srv)) {
    // Idle connections do not hold the server up: one that never sent Tversion, and one
    // attached with a fid open.
    let _silent = Raw::connect(&srv.sock);
    let mut idle = Raw::session(&srv.sock);
    idle.walk(2, 0, 1, &["help"]);
    idle.open(3, 1, om::OREAD);
    let (_c, root) = attach(&srv, &me()).await;
    let ev = open(&root, "eventwait", om::OREAD).await;
    let parked = ev.read_call(0, 8192).unwrap();
    stop(&srv);
    let Rmsg::Read { data } = within("server-stopping", parked).await.expect("read") else {
        panic!("not an Rread")
    };
    let v = json(&data);
    assert_eq!(v["event"], "server-stopping", "{v}");
    let eof = within("eof", ev.read(0, 8192))
        .await
        .expect("read after stopping");
    assert!(eof.is_empty(), "EOF after server-stopping, got {eof:?}");
    let st = srv.wait_exit();
    assert_eq!(st.code(), Some(0), "{}", srv.stderr());
    assert!(!srv.sock.exists(), "the socket is removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_cleanly() {
    let srv = Srv::start(CONFIG);
    check_clean_stop(srv, |s| s.signal(Signal::SIGTERM)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_stops_cleanly() {
    let srv = Srv::start(CONFIG);
    check_clean_stop(srv, |s| s.signal(Signal::SIGINT)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_kill_stops_cleanly() {
    let srv = Srv::start(CONFIG);
    check_clean_stop(srv, |s| {
        let o = ollie9p(&s.addr(), &["rdwr", "ctl"], b"kill\n");
        assert!(o.status.success(), "{}", text(&o.stderr));
        assert_eq!(text(&o.stdout), "stopping\n");
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Configuration

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_rereads_the_config() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    assert_eq!(read_all(&root, "backends").await, "alpha\nbeta\n");
    let v0 = root.walk_path("backends").await.unwrap().qid().version;

    std::fs::write(
        &srv.config,
        format!("{CONFIG}\n[backends.gamma]\nkind = \"anthropic\"\n"),
    )
    .unwrap();
    let r = rdwr(&root, "invalidate\n").await.expect("invalidate");
    assert_eq!(r, "config reloaded: 3 backends\n");
    assert_eq!(read_all(&root, "backends").await, "alpha\nbeta\ngamma\n");
    let v1 = root.walk_path("backends").await.unwrap().qid().version;
    assert_ne!(v0, v1, "backends' qid version changes with its contents");
    // The CLI sees it too.
    let o = ollie9p(&srv.addr(), &["read", "backends"], b"");
    assert_eq!(text(&o.stdout), "alpha\nbeta\ngamma\n");

    // A broken config: the Twrite fails naming the key; the old backends stay.
    std::fs::write(
        &srv.config,
        "[backends.delta]\nkind = \"gpt\"\n[backends.alpha]\nkind = \"openai\"\n",
    )
    .unwrap();
    let e = rdwr(&root, "invalidate").await.expect_err("broken config");
    assert!(e.contains("backends.delta.kind"), "{e}");
    assert!(!e.contains('\n'), "one line: {e:?}");
    assert_eq!(read_all(&root, "backends").await, "alpha\nbeta\ngamma\n");

    // A syntax error names the line.
    std::fs::write(&srv.config, "[backends.x\n").unwrap();
    let e = rdwr(&root, "invalidate").await.expect_err("syntax error");
    assert!(e.contains("line 1"), "{e}");
    assert_eq!(read_all(&root, "backends").await, "alpha\nbeta\ngamma\n");

    // A missing file is an error too, not an empty configuration.
    std::fs::remove_file(&srv.config).unwrap();
    let e = rdwr(&root, "invalidate").await.expect_err("missing config");
    assert!(e.contains("config"), "{e}");
    assert_eq!(read_all(&root, "backends").await, "alpha\nbeta\ngamma\n");
}

// ---------------------------------------------------------------------------------------------
// Permissions

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_cannot_open_ctl_but_reads_help() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, "agent").await;
    for mode in [om::OREAD, om::OWRITE, om::ORDWR, om::OWRITE | om::OTRUNC] {
        let mut f = root.walk_path("ctl").await.expect("agent may walk to ctl");
        let e = within("open", f.open(mode))
            .await
            .expect_err("agent opened ctl");
        assert!(
            e.to_string().contains("permission denied"),
            "mode {mode:#x}: {e}"
        );
    }
    // Nor truncate it with Twstat (what 9pfuse sends before a write).
    let f = root.walk_path("ctl").await.unwrap();
    let mut trunc = Stat::dont_touch();
    trunc.length = 0;
    let e = f.wstat(&trunc).await.expect_err("agent truncated ctl");
    assert!(e.to_string().contains("permission denied"), "{e}");

    assert!(read_all(&root, "help").await.contains("ctl"));
    assert_eq!(read_all(&root, "backends").await, "alpha\nbeta\n");
    let mut d = root.clone_fid().await.unwrap();
    d.open(om::OREAD).await.unwrap();
    assert_eq!(names(&d.read_dir().await.unwrap()), set(&ROOT_NAMES));

    // Through the CLI: exit 1, "permission denied".
    let o = ollie9p(&srv.addr(), &["-u", "agent", "rdwr", "ctl"], b"help");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("permission denied"),
        "{}",
        text(&o.stderr)
    );
    let o = ollie9p(&srv.addr(), &["-u", "agent", "read", "help"], b"");
    assert!(o.status.success(), "{}", text(&o.stderr));
}

/// Adjusts a client command to run as the test's chosen user.
type AsUser = Box<dyn Fn(&mut Command)>;

/// A client attaching under a name that is not its own is refused. Run as root, the server and
/// the client both run as `nobody` (root itself may attach under any name).
#[test]
fn attach_as_another_user_is_refused() {
    let root_run = nix::unistd::geteuid().is_root();
    let nobody = nix::unistd::User::from_name("nobody").ok().flatten();
    if root_run && nobody.is_none() {
        println!("SKIP attach_as_another_user_is_refused: running as root and no user nobody");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (srv, as_user): (Srv, AsUser) = match nobody.filter(|_| root_run) {
        Some(u) => {
            nix::unistd::chown(dir.path(), Some(u.uid), Some(u.gid)).unwrap();
            let (uid, gid) = (u.uid.as_raw(), u.gid.as_raw());
            let srv = Srv::start_with(dir, CONFIG, move |c| {
                c.uid(uid).gid(gid);
            });
            (
                srv,
                Box::new(move |c: &mut Command| {
                    c.uid(uid).gid(gid).env("USER", "nobody");
                }),
            )
        }
        None => (
            Srv::start_with(dir, CONFIG, |_| {}),
            Box::new(|_: &mut Command| {}),
        ),
    };
    let ollie = |args: &[&str], stdin: &[u8]| {
        let mut cmd = Command::new(bin("ollie-9p"));
        cmd.arg("-a").arg(srv.addr()).args(args);
        as_user(&mut cmd);
        run(&mut cmd, stdin)
    };
    let o = ollie(&["-u", "mallory", "ls"], b"");
    assert_eq!(
        o.status.code(),
        Some(1),
        "mallory was let in: {}",
        text(&o.stdout)
    );
    let err = text(&o.stderr);
    assert!(
        err.contains("permission denied") && err.contains("mallory"),
        "{err}"
    );
    // As itself (the server's user) it gets the owner's rights; as agent, the group's.
    let o = ollie(&["read", "backends"], b"");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = ollie(&["rdwr", "ctl"], b"help\n");
    assert!(o.status.success(), "owner may use ctl: {}", text(&o.stderr));
    let o = ollie(&["-u", "agent", "ls"], b"");
    assert!(o.status.success(), "{}", text(&o.stderr));
}

/// Root may attach under another name, but then gets only the group's rights (not the owner's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_name_never_gets_owner_rights() {
    let srv = Srv::start(CONFIG);
    let c = Client::dial(&srv.p9addr()).await.unwrap();
    // Even root may attach only as itself (or as "agent"): the uname must match SO_PEERCRED.
    let e = within("attach", c.attach(None, "mallory", ""))
        .await
        .expect_err("attached as mallory");
    assert!(e.to_string().contains("permission denied"), "{e}");
    assert!(e.to_string().contains("mallory"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// help and the listing

/// Every `path mode` line of `help` (directories as `dNNN`, with [`dm::DIR`] set), with the
/// trailing `/` of directory paths dropped. `/` itself is included.
fn help_tree(help: &str) -> BTreeSet<(String, u32)> {
    let mut out = BTreeSet::new();
    for line in help.lines() {
        if !line.starts_with("  ") {
            continue;
        }
        let mut w = line.split_whitespace();
        let (Some(name), Some(mode)) = (w.next(), w.next()) else {
            continue;
        };
        let m = match mode.strip_prefix('d') {
            Some(bits) if bits.len() == 3 => u32::from_str_radix(bits, 8).ok().map(|b| dm::DIR | b),
            None if mode.len() == 4 => u32::from_str_radix(mode, 8).ok(),
            _ => None,
        };
        if let Some(m) = m {
            let name = if name == "/" {
                name
            } else {
                name.trim_end_matches('/')
            };
            out.insert((name.to_owned(), m));
        }
    }
    out
}

/// Walks the whole served tree from `root` (not into `session/NAME/toolsrv/`, which is
/// toolsrv's own tree): every path with its mode (directory bit and permission bits), session
/// and agent names replaced by `NAME`, process ids by `N`.
async fn served_tree(root: &Fid, sessions: &[&str], agents: &[&str]) -> BTreeSet<(String, u32)> {
    let st = within("stat /", root.stat()).await.expect("stat /");
    let mut out = BTreeSet::from([("/".to_owned(), st.mode & (dm::DIR | 0o777))]);
    let mut todo: Vec<(Vec<String>, Vec<String>)> = vec![(Vec::new(), Vec::new())];
    while let Some((path, shown)) = todo.pop() {
        let mut d = within("walk", root.walk(&path))
            .await
            .unwrap_or_else(|e| panic!("walk {path:?}: {e}"));
        within("open dir", d.open(om::OREAD))
            .await
            .unwrap_or_else(|e| panic!("open {path:?}: {e}"));
        let entries = within("read dir", d.read_dir())
            .await
            .unwrap_or_else(|e| panic!("read {path:?}: {e}"));
        assert!(!entries.is_empty(), "{path:?} is empty");
        for e in entries {
            let parent = path.last().map(String::as_str);
            let placeholder = match parent {
                Some("session") if sessions.contains(&e.name.as_str()) => "NAME".to_owned(),
                Some("agent") if agents.contains(&e.name.as_str()) => "NAME".to_owned(),
                Some("proc") if e.name.parse::<u32>().is_ok() => "N".to_owned(),
                _ => e.name.clone(),
            };
            let mut p = path.clone();
            p.push(e.name.clone());
            let mut s = shown.clone();
            s.push(placeholder);
            let mode = e.mode & (dm::DIR | 0o777);
            assert_eq!(
                mode & dm::DIR != 0,
                e.qid.is_dir(),
                "{p:?}: the mode's directory bit and the qid disagree"
            );
            out.insert((s.join("/"), mode));
            let into_toolsrv = s.len() == 3 && s[2] == "toolsrv";
            if e.qid.is_dir() && !into_toolsrv {
                todo.push((p, s));
            }
        }
    }
    out
}

/// `help` and the served tree agree: with a session and an agent created, every file and
/// directory served (root, `session/`, `session/NAME/`, `…/agent/`, `…/agent/NAME/`,
/// `…/proc/`) is in `help` with the same mode, and every path `help` names is served —
/// except the process directories `…/proc/N/`, which exist only while a process does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_and_the_root_listing_agree() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let new = open(&root, "session/new", om::ORDWR).await;
    let work = srv.dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    within(
        "session/new",
        new.write(
            0,
            Bytes::from(format!("name=walked cwd={}", work.display())),
        ),
    )
    .await
    .expect("session/new");
    let anew = open(&root, "session/walked/agent/new", om::ORDWR).await;
    within(
        "agent/new",
        anew.write(0, Bytes::from_static(b"name=walker")),
    )
    .await
    .expect("agent/new");

    let help = read_all(&root, "help").await;
    let helped = help_tree(&help);
    assert!(
        helped.contains(&("/".to_owned(), dm::DIR | 0o555)),
        "help lists / as d555:\n{help}"
    );
    let served = served_tree(&root, &["walked"], &["walker"]).await;
    let missing_from_help: Vec<_> = served.difference(&helped).collect();
    assert!(
        missing_from_help.is_empty(),
        "served but not in help (or with another mode): {missing_from_help:?}\n{help}"
    );
    let not_served: Vec<_> = helped
        .difference(&served)
        .filter(|(p, _)| !p.starts_with("session/NAME/agent/NAME/proc/N/"))
        .collect();
    assert!(
        not_served.is_empty(),
        "in help but not served (or with another mode): {not_served:?}"
    );
    // The walk reached every level.
    for p in [
        "session/NAME/agent/NAME/proc/top",
        "session/NAME/toolsrv",
        "session/new",
        "generate",
    ] {
        assert!(served.iter().any(|(s, _)| s == p), "{p} not reached");
    }
    // Every command ctl's own help lists is described in help.
    let reply = rdwr(&root, "help").await.unwrap();
    for line in reply.lines() {
        let c = line.split('\t').next().unwrap();
        assert!(
            help.contains(&format!("  {c} ")),
            "ctl command {c} not in help"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// plan9port behaviours (DESIGN §3.1), emulated with raw frames

#[test]
fn p9p_tversion_8192_answers_notag_and_8192() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::connect(&srv.sock);
    r.send(
        NOTAG,
        &Tmsg::Version {
            msize: 8192,
            version: "9P2000".into(),
        },
    );
    let (tag, m) = r.recv();
    assert_eq!(tag, NOTAG);
    assert_eq!(
        m,
        Rmsg::Version {
            msize: 8192,
            version: "9P2000".into()
        }
    );
    // And everything works within 8192: read all of help in 8192-24 byte reads.
    match r.attach(0, 0, &me()) {
        Rmsg::Attach { .. } => {}
        m => panic!("{m:?}"),
    }
    r.walk(1, 0, 1, &["help"]);
    let (_, iounit) = r.open(2, 1, om::OREAD);
    assert!(iounit == 0 || iounit <= 8192 - 24, "iounit {iounit}");
    let d = r.read(3, 1, 0, 8192 - 24);
    assert!(!d.is_empty() && d.len() <= 8192 - 24);

    // A 9P2000.u offer gets 9P2000; an unknown version gets "unknown".
    let mut u = Raw::connect(&srv.sock);
    match u.rpc(
        NOTAG,
        &Tmsg::Version {
            msize: 65536,
            version: "9P2000.u".into(),
        },
    ) {
        Rmsg::Version { msize, version } => {
            assert_eq!(version, "9P2000");
            assert!(msize <= 65536);
        }
        m => panic!("{m:?}"),
    }
}

#[test]
fn p9p_tauth_refused_then_attach_with_nofid() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::connect(&srv.sock);
    r.version(8192);
    match r.rpc(
        1,
        &Tmsg::Auth {
            afid: 7,
            uname: me(),
            aname: String::new(),
        },
    ) {
        Rmsg::Error { ename } => assert!(ename.contains("authentication"), "{ename}"),
        m => panic!("expected Rerror for Tauth, got {m:?}"),
    }
    match r.rpc(
        2,
        &Tmsg::Attach {
            fid: 0,
            afid: NOFID,
            uname: me(),
            aname: String::new(),
        },
    ) {
        Rmsg::Attach { qid } => assert!(qid.is_dir()),
        m => panic!("{m:?}"),
    }
    // The refused afid was not left behind: the number is free for an ordinary fid.
    r.walk(3, 0, 7, &["help"]);
}

#[test]
fn p9p_9pfuse_truncating_wstat_then_write_to_ctl() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::session(&srv.sock);
    // `echo help > ctl` through 9pfuse: walk, Twstat{length=0} on the unopened fid, open
    // OWRITE|OTRUNC, write.
    r.walk(2, 0, 1, &["ctl"]);
    let mut trunc = Stat::dont_touch();
    trunc.length = 0;
    match r.rpc(
        3,
        &Tmsg::Wstat {
            fid: 1,
            stat: trunc,
        },
    ) {
        Rmsg::Wstat => {}
        m => panic!("truncating wstat on an unopened ctl fid: {m:?}"),
    }
    r.open(4, 1, om::OWRITE | om::OTRUNC);
    match r.rpc(
        5,
        &Tmsg::Write {
            fid: 1,
            offset: 0,
            data: Bytes::from_static(b"help\n"),
        },
    ) {
        Rmsg::Write { count } => assert_eq!(count, 5),
        m => panic!("{m:?}"),
    }
    // The same truncating Twstat on an open fid.
    let mut trunc = Stat::dont_touch();
    trunc.length = 0;
    match r.rpc(
        6,
        &Tmsg::Wstat {
            fid: 1,
            stat: trunc,
        },
    ) {
        Rmsg::Wstat => {}
        m => panic!("truncating wstat on an open ctl fid: {m:?}"),
    }
}

#[test]
fn p9p_dont_touch_wstat_succeeds() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::session(&srv.sock);
    let paths: [&[&str]; 4] = [&[], &["help"], &["ctl"], &["eventwait"]];
    for (fid, path) in (1..).zip(paths) {
        r.walk(2, 0, fid, path);
        match r.rpc(
            3,
            &Tmsg::Wstat {
                fid,
                stat: Stat::dont_touch(),
            },
        ) {
            Rmsg::Wstat => {}
            m => panic!("don't-touch wstat on {path:?}: {m:?}"),
        }
    }
    // But a real change to a read-only file is refused.
    r.walk(4, 0, 20, &["help"]);
    let mut st = Stat::dont_touch();
    st.mode = 0o666;
    assert!(
        matches!(
            r.rpc(5, &Tmsg::Wstat { fid: 20, stat: st }),
            Rmsg::Error { .. }
        ),
        "chmod of help must fail"
    );
}

#[test]
fn p9p_directory_reread_from_zero_and_whole_entries() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::session(&srv.sock);
    r.walk(2, 0, 1, &[]);
    r.open(3, 1, om::OREAD);
    let all = |r: &mut Raw, count: u32| {
        let mut off = 0u64;
        let mut out = Vec::new();
        loop {
            let d = r.read(4, 1, off, count);
            if d.is_empty() {
                return out;
            }
            off += d.len() as u64;
            let entries = ollie_p9::wire::decode_dir(&d).expect("whole stat entries");
            let sum: usize = entries.iter().map(Stat::encoded_len).sum();
            assert_eq!(sum, d.len(), "a directory read returns whole entries only");
            out.extend(entries.into_iter().map(|e| e.name));
        }
    };
    let first = all(&mut r, 8192 - 24);
    assert_eq!(
        first.iter().cloned().collect::<BTreeSet<_>>(),
        set(&ROOT_NAMES)
    );
    let again = all(&mut r, 8192 - 24);
    assert_eq!(first, again, "re-read from offset 0 on the same fid");
    // Small reads (one entry's worth) still return whole entries and the same list.
    let one = r.read(5, 1, 0, 8192);
    let entry_len = ollie_p9::wire::decode_dir(&one).unwrap()[0].encoded_len();
    let small = all(&mut r, u32::try_from(entry_len + 10).unwrap());
    assert_eq!(first, small);
}

#[test]
fn p9p_clunk_frees_the_fid_for_immediate_reuse() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::session(&srv.sock);
    for i in 0..3 {
        r.walk(2, 0, 5, &["help"]);
        r.open(3, 5, om::OREAD);
        assert!(!r.read(4, 5, 0, 100).is_empty(), "round {i}");
        r.clunk(5, 5);
        // After the clunk the fid is unknown.
        assert!(matches!(
            r.rpc(6, &Tmsg::Stat { fid: 5 }),
            Rmsg::Error { .. }
        ));
    }
    // Pipelined, as plan9port does: walk/open/read/clunk/walk again without waiting.
    for (tag, m) in [
        (
            10,
            Tmsg::Walk {
                fid: 0,
                newfid: 9,
                wnames: vec!["backends".into()],
            },
        ),
        (
            11,
            Tmsg::Open {
                fid: 9,
                mode: om::OREAD,
            },
        ),
        (
            12,
            Tmsg::Read {
                fid: 9,
                offset: 0,
                count: 100,
            },
        ),
        (13, Tmsg::Clunk { fid: 9 }),
        (
            14,
            Tmsg::Walk {
                fid: 0,
                newfid: 9,
                wnames: vec!["help".into()],
            },
        ),
    ] {
        r.send(tag, &m);
    }
    let mut got = std::collections::BTreeMap::new();
    for _ in 0..5 {
        let (t, m) = r.recv();
        got.insert(t, m);
    }
    assert!(matches!(got[&10], Rmsg::Walk { .. }), "{got:?}");
    assert!(matches!(got[&11], Rmsg::Open { .. }), "{got:?}");
    assert_eq!(
        got[&12],
        Rmsg::Read {
            data: Bytes::from_static(b"alpha\nbeta\n")
        }
    );
    assert_eq!(got[&13], Rmsg::Clunk);
    assert!(
        matches!(got[&14], Rmsg::Walk { ref wqids } if wqids.len() == 1),
        "fid 9 reused at once: {got:?}"
    );
    // A failed Tremove still frees the fid.
    match r.rpc(20, &Tmsg::Remove { fid: 9 }) {
        Rmsg::Error { .. } => {}
        m => panic!("removing help should fail: {m:?}"),
    }
    r.walk(21, 0, 9, &["ctl"]);
}

#[test]
fn p9p_unknown_message_type_gets_rerror_with_the_same_tag() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::session(&srv.sock);
    // Type 150 (no such message), tag 0x1234, 4 bytes of body.
    let mut frame = Vec::new();
    frame.extend_from_slice(&11u32.to_le_bytes());
    frame.push(150);
    frame.extend_from_slice(&0x1234u16.to_le_bytes());
    frame.extend_from_slice(&[1, 2, 3, 4]);
    r.send_bytes(&frame);
    let (tag, m) = r.recv();
    assert_eq!(tag, 0x1234);
    assert!(matches!(m, Rmsg::Error { .. }), "{m:?}");
    // An R-message type sent as a request (Rread = 117) is refused the same way.
    let mut frame = Vec::new();
    frame.extend_from_slice(&11u32.to_le_bytes());
    frame.push(117);
    frame.extend_from_slice(&0x0042u16.to_le_bytes());
    frame.extend_from_slice(&0u32.to_le_bytes());
    r.send_bytes(&frame);
    let (tag, m) = r.recv();
    assert_eq!(tag, 0x42);
    assert!(matches!(m, Rmsg::Error { .. }), "{m:?}");
    // The connection still works.
    r.walk(3, 0, 1, &["help"]);
}

#[test]
fn p9p_walk_edge_cases() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::session(&srv.sock);
    // `..` from the root stays at the root; a partial walk returns the qids walked and does not
    // create newfid.
    r.walk(2, 0, 1, &[".."]);
    match r.rpc(
        3,
        &Tmsg::Walk {
            fid: 0,
            newfid: 2,
            wnames: vec!["help".into(), "nope".into()],
        },
    ) {
        Rmsg::Walk { wqids } => assert_eq!(wqids.len(), 1),
        m => panic!("{m:?}"),
    }
    assert!(
        matches!(r.rpc(4, &Tmsg::Stat { fid: 2 }), Rmsg::Error { .. }),
        "a partial walk must not create newfid"
    );
    match r.rpc(
        5,
        &Tmsg::Walk {
            fid: 0,
            newfid: 2,
            wnames: vec!["nope".into()],
        },
    ) {
        Rmsg::Error { ename } => assert!(ename.contains("does not exist"), "{ename}"),
        m => panic!("{m:?}"),
    }
}

/// A raw `stat` of every root file has the mode the help text promises, and the directory bit
/// on `/`.
#[test]
fn stat_modes() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::session(&srv.sock);
    match r.rpc(2, &Tmsg::Stat { fid: 0 }) {
        Rmsg::Stat { stat } => {
            assert_ne!(stat.mode & dm::DIR, 0);
            assert!(stat.qid.is_dir());
        }
        m => panic!("{m:?}"),
    }
    for (i, (name, mode)) in [("ctl", 0o600), ("help", 0o444), ("backends", 0o444)]
        .into_iter()
        .enumerate()
    {
        let fid = 10 + u32::try_from(i).unwrap();
        r.walk(3, 0, fid, &[name]);
        match r.rpc(4, &Tmsg::Stat { fid }) {
            Rmsg::Stat { stat } => {
                assert_eq!(stat.mode, mode, "{name}");
                assert_eq!(stat.name, name);
            }
            m => panic!("{m:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// eventwait details

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventwait_baseline_is_when_the_fid_was_opened() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    // Opened before the event: a later read returns it at once, even though the read starts
    // after the event happened.
    let before = open(&root, "eventwait", om::OREAD).await;
    rdwr(&root, "invalidate").await.unwrap();
    let d = within("event before read", before.read(0, 8192))
        .await
        .unwrap();
    let v = json(&d);
    assert_eq!(v["event"], "config-reloaded", "{v}");
    assert!(v["seq"].is_u64() && v["time"].is_string(), "{v}");
    // Opened after it (and after server-started): blocks until the next one, and then returns
    // that one, not the older ones.
    let after = open(&root, "eventwait", om::OREAD).await;
    let parked = after.read_call(0, 8192).unwrap();
    let also = open(&root, "help", om::OREAD).await;
    within("help", also.read(0, 10)).await.unwrap();
    rdwr(&root, "invalidate").await.unwrap();
    let Rmsg::Read { data } = within("event after open", parked).await.unwrap() else {
        panic!("not an Rread")
    };
    let w = json(&data);
    assert_eq!(w["event"], "config-reloaded");
    assert!(w["seq"].as_u64() > v["seq"].as_u64(), "{v} then {w}");
    // The first fid also sees the second event, exactly once.
    let d = within("second event", before.read(0, 8192)).await.unwrap();
    assert_eq!(json(&d)["seq"], w["seq"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventwait_small_reads_split_one_line() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let ev = open(&root, "eventwait", om::OREAD).await;
    rdwr(&root, "invalidate").await.unwrap();
    let mut line = Vec::new();
    let mut off = 0u64;
    while !line.ends_with(b"\n") {
        let d = within("piece", ev.read(off, 7)).await.unwrap();
        assert!(!d.is_empty() && d.len() <= 7, "{d:?}");
        off += d.len() as u64;
        line.extend_from_slice(&d);
    }
    assert_eq!(json(&line)["event"], "config-reloaded");
}

#[test]
fn several_attaches_on_one_connection_keep_their_own_rights() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::session(&srv.sock); // fid 0: ourselves
    match r.attach(2, 1, "agent") {
        Rmsg::Attach { .. } => {}
        m => panic!("{m:?}"),
    }
    // An attach on a fid in use is refused.
    assert!(matches!(r.attach(3, 1, "agent"), Rmsg::Error { .. }));
    r.walk(4, 0, 10, &["ctl"]);
    r.walk(5, 1, 11, &["ctl"]);
    r.open(6, 10, om::ORDWR);
    match r.rpc(
        7,
        &Tmsg::Open {
            fid: 11,
            mode: om::OREAD,
        },
    ) {
        Rmsg::Error { ename } => assert!(ename.contains("permission denied"), "{ename}"),
        m => panic!("agent's fid opened ctl: {m:?}"),
    }
    // Fids walked from the agent's root stay agent's after a clone.
    r.walk(8, 1, 12, &[]);
    r.walk(9, 12, 13, &["ctl"]);
    assert!(matches!(
        r.rpc(
            10,
            &Tmsg::Open {
                fid: 13,
                mode: om::OREAD
            }
        ),
        Rmsg::Error { .. }
    ));
}

#[test]
fn cli_write_lines_and_read_errors() {
    let srv = Srv::start(CONFIG);
    let a = srv.addr();
    let o = ollie9p(&a, &["write", "-l", "ctl"], b"help\ninvalidate\n");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = ollie9p(&a, &["write", "-l", "ctl"], b"help\nbogus\n");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("bogus"), "{}", text(&o.stderr));
    let o = ollie9p(&a, &["write", "help"], b"x");
    assert_eq!(o.status.code(), Some(1), "writing help must fail");
    assert!(
        text(&o.stderr).contains("permission denied"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn cli_read_streams_eventwait_until_the_server_stops() {
    use std::io::BufRead;
    let mut srv = Srv::start(CONFIG);
    let mut child = Command::new(bin("ollie-9p"))
        .arg("-a")
        .arg(srv.addr())
        .args(["read", "eventwait"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(l) = line else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    // We cannot see when the CLI has opened its fid, so make events until one reaches it
    // (bounded); every line it prints must be a whole JSON event.
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    let first = loop {
        let o = ollie9p(&srv.addr(), &["write", "ctl"], b"invalidate");
        assert!(o.status.success(), "{}", text(&o.stderr));
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(50)) {
            break l;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ollie-9p read printed nothing"
        );
    };
    assert_eq!(
        json(format!("{first}\n").as_bytes())["event"],
        "config-reloaded"
    );
    srv.signal(Signal::SIGTERM);
    let mut last = String::new();
    while let Ok(l) = rx.recv_timeout(IO_TIMEOUT) {
        last = l;
    }
    assert_eq!(
        json(format!("{last}\n").as_bytes())["event"],
        "server-stopping"
    );
    let st = wait_child(&mut child, IO_TIMEOUT, "ollie-9p read eventwait");
    assert!(st.success(), "the CLI ends cleanly at EOF: {st}");
    reader.join().unwrap();
    assert_eq!(srv.wait_exit().code(), Some(0));
}

// ---------------------------------------------------------------------------------------------
// Start-up failures

fn olliesrv_in(dir: &std::path::Path, config: &str) -> std::process::Output {
    let cfg = dir.join("config.toml");
    std::fs::write(&cfg, config).unwrap();
    let mut cmd = Command::new(bin("olliesrv"));
    cmd.arg("--config")
        .arg(&cfg)
        .arg("-a")
        .arg(format!("unix!{}", dir.join("ns").join("ollie").display()))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("XDG_CONFIG_HOME", dir);
    run(&mut cmd, b"")
}

#[test]
fn a_bad_config_at_start_exits_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let o = olliesrv_in(dir.path(), "[backends.x]\nkind = \"gpt\"\n");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("backends.x.kind"), "{err}");
    assert!(
        !dir.path().join("ns").join("ollie").exists(),
        "no socket was made"
    );
}

#[test]
fn unsafe_socket_locations_are_refused_with_3() {
    // A group/world-accessible directory.
    let dir = tempfile::tempdir().unwrap();
    let ns = dir.path().join("ns");
    std::fs::create_dir(&ns).unwrap();
    std::fs::set_permissions(&ns, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = olliesrv_in(dir.path(), CONFIG);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("chmod 700"), "{}", text(&o.stderr));
    // Something that is not a socket where the socket goes: left alone.
    std::fs::set_permissions(&ns, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(ns.join("ollie"), "precious").unwrap();
    let o = olliesrv_in(dir.path(), CONFIG);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("not a socket"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(ns.join("ollie")).unwrap(),
        "precious"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_without_config_flag_rereads_the_default_file() {
    let dir = tempfile::tempdir().unwrap();
    let xdg = dir.path().join("xdg");
    std::fs::create_dir_all(xdg.join("ollie")).unwrap();
    let default = xdg.join("ollie").join("config.toml");
    std::fs::write(&default, CONFIG).unwrap();
    let srv = Srv::start_without_config_flag(dir, &xdg);
    let (_c, root) = attach(&srv, &me()).await;
    assert_eq!(read_all(&root, "backends").await, "alpha\nbeta\n");
    std::fs::write(&default, "[backends.solo]\nkind = \"ollama\"\n").unwrap();
    assert_eq!(
        rdwr(&root, "invalidate").await.unwrap(),
        "config reloaded: 1 backends\n"
    );
    assert_eq!(read_all(&root, "backends").await, "solo\n");
}

/// Replies never exceed the negotiated msize, even an error quoting a long bad command, and even
/// at the smallest msize the server accepts.
#[test]
fn replies_fit_the_negotiated_msize() {
    let srv = Srv::start(CONFIG);
    for msize in [512u32, 600, 1024, 8192] {
        let mut r = Raw::connect(&srv.sock);
        let got = r.version(msize);
        assert_eq!(got, msize);
        assert!(matches!(r.attach(1, 0, &me()), Rmsg::Attach { .. }));
        r.walk(2, 0, 1, &["ctl"]);
        let (_, iounit) = r.open(3, 1, om::ORDWR);
        let unit = if iounit == 0 { msize - 24 } else { iounit };
        assert!(unit <= msize - 24, "iounit {unit} at msize {msize}");
        for data in [
            vec![b'a'; unit as usize],
            format!("help {}", "b".repeat(unit as usize - 5)).into_bytes(),
        ] {
            r.send(
                4,
                &Tmsg::Write {
                    fid: 1,
                    offset: 0,
                    data: Bytes::from(data),
                },
            );
            let f = r.recv_frame();
            let len = f.len();
            let (tag, m) = ollie_p9::wire::decode_r(f).unwrap();
            assert_eq!(tag, 4);
            let Rmsg::Error { ename } = m else {
                panic!("{m:?}")
            };
            assert!(
                len <= msize as usize,
                "a {len}-byte Rerror at msize {msize} (ename of {} bytes, cut only to \
                 MAX_ERROR_LEN, not to the connection's msize): {}…",
                ename.len(),
                &ename[..40]
            );
        }
        // Reading help in msize-sized pieces: every Rread fits.
        r.walk(5, 0, 2, &["help"]);
        r.open(6, 2, om::OREAD);
        let mut off = 0u64;
        loop {
            r.send(
                7,
                &Tmsg::Read {
                    fid: 2,
                    offset: off,
                    count: msize,
                },
            );
            let f = r.recv_frame();
            assert!(
                f.len() <= msize as usize,
                "Rread of {} at msize {msize}",
                f.len()
            );
            let (_, Rmsg::Read { data }) = ollie_p9::wire::decode_r(f).unwrap() else {
                panic!("not an Rread")
            };
            if data.is_empty() {
                break;
            }
            off += data.len() as u64;
        }
        // A directory read at this msize fits too.
        r.walk(8, 0, 3, &[]);
        r.open(9, 3, om::OREAD);
        r.send(
            10,
            &Tmsg::Read {
                fid: 3,
                offset: 0,
                count: msize,
            },
        );
        let f = r.recv_frame();
        assert!(f.len() <= msize as usize);
        // And Tversion on a live connection forgets every fid.
        assert_eq!(r.version(msize), msize);
        assert!(matches!(
            r.rpc(11, &Tmsg::Stat { fid: 0 }),
            Rmsg::Error { .. }
        ));
    }
}

/// A read queued behind a parked read on the same fid can be flushed on its own; the parked one
/// still gets the next event.
#[test]
fn flush_of_a_read_queued_behind_a_parked_one() {
    let srv = Srv::start(CONFIG);
    let mut r = Raw::session(&srv.sock);
    r.walk(2, 0, 1, &["eventwait"]);
    r.open(3, 1, om::OREAD);
    for tag in [10, 11] {
        r.send(
            tag,
            &Tmsg::Read {
                fid: 1,
                offset: 0,
                count: 4096,
            },
        );
    }
    let (t, m) = {
        r.send(12, &Tmsg::Flush { oldtag: 11 });
        r.recv()
    };
    assert_eq!((t, m), (12, Rmsg::Flush));
    let mut other = Raw::session(&srv.sock);
    other.walk(2, 0, 1, &["ctl"]);
    other.open(3, 1, om::OWRITE);
    assert!(matches!(
        other.rpc(
            4,
            &Tmsg::Write {
                fid: 1,
                offset: 0,
                data: Bytes::from_static(b"invalidate"),
            },
        ),
        Rmsg::Write { .. }
    ));
    let (t, m) = r.recv();
    assert_eq!(
        t, 10,
        "the first (parked) read answers, not the flushed one: {m:?}"
    );
    let Rmsg::Read { data } = m else {
        panic!("{m:?}")
    };
    assert_eq!(json(&data)["event"], "config-reloaded");
    // Nothing more for tag 11: the next frame is the answer to the next request.
    match r.rpc(13, &Tmsg::Stat { fid: 1 }) {
        Rmsg::Stat { .. } => {}
        m => panic!("{m:?}"),
    }
}

/// The root listing docs/using.md shows (`ollie-9p ls -l … # the root: …`) is what the server
/// serves at its root, name for name (directories with a `/`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_root_listing_is_the_served_one() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/using.md"),
    )
    .unwrap();
    let documented: Vec<&str> = doc
        .lines()
        .find_map(|l| l.split_once("# the root: ").map(|(_, r)| r))
        .expect("docs/using.md has a `# the root: …` listing")
        .split_whitespace()
        .collect();
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let mut d = root.walk(&[] as &[&str]).await.unwrap();
    d.open(om::OREAD).await.unwrap();
    let mut served: Vec<String> = d
        .read_dir()
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            if e.qid.is_dir() {
                format!("{}/", e.name)
            } else {
                e.name
            }
        })
        .collect();
    served.sort();
    let mut want: Vec<String> = documented.iter().map(|s| (*s).to_owned()).collect();
    want.sort();
    assert_eq!(
        want, served,
        "docs/using.md's root listing and the served root differ"
    );
}
