//! A small 9P client helper for tests: dial and attach, walk and open, read a whole file, write
//! a string, write then read the reply on one fid; every step bounded by [`IO_TIMEOUT`].
//!
//! Errors are the client's own ([`ClientError`]); each suite maps them to the text it checks
//! (`to_string()`, or the server's one-line message).

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ollie_p9::dial::Addr;
use ollie_p9::wire::om;
use ollie_p9::{Client, ClientError, Fid};

use crate::server::IO_TIMEOUT;

/// Bounds an async step with [`IO_TIMEOUT`]; fails naming `what` when it runs out.
pub async fn within<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(IO_TIMEOUT, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer within {IO_TIMEOUT:?}"),
    }
}

/// Dials `addr` and attaches as `uname` (no auth, empty aname).
pub async fn dial_attach(addr: &Addr, uname: &str) -> (Client, Fid) {
    let c = within("dial", Client::dial(addr)).await.expect("dial");
    let root = within("attach", c.attach(None, uname, ""))
        .await
        .expect("attach");
    (c, root)
}

/// Walks from `root` to `path` on a fresh fid.
pub async fn walk(root: &Fid, path: &str) -> Result<Fid, ClientError> {
    within(path, root.walk_path(path)).await
}

/// Walks to `path` and opens it with `mode`.
pub async fn open(root: &Fid, path: &str, mode: u8) -> Result<Fid, ClientError> {
    let mut f = walk(root, path).await?;
    within(path, f.open(mode)).await?;
    Ok(f)
}

/// The whole of the file at `path`, read through a fresh fid (clunked after).
pub async fn read_bytes(root: &Fid, path: &str) -> Result<Vec<u8>, ClientError> {
    let f = open(root, path, om::OREAD).await?;
    let d = within(path, f.read_to_end()).await?;
    let _ = within(path, f.clunk()).await;
    Ok(d)
}

/// [`read_bytes`] as text; fails if it is not UTF-8.
pub async fn read(root: &Fid, path: &str) -> Result<String, ClientError> {
    read_bytes(root, path)
        .await
        .map(|d| String::from_utf8(d).unwrap_or_else(|e| panic!("{path} is not utf-8: {e}")))
}

/// Opens `path` with `mode` (`OWRITE`, maybe with `OTRUNC`) and writes `data` in one Twrite.
pub async fn write_mode(root: &Fid, path: &str, mode: u8, data: &str) -> Result<(), ClientError> {
    let f = open(root, path, mode).await?;
    let r = within(path, f.write(0, Bytes::from(data.to_owned())))
        .await
        .map(|_| ());
    // A prompt is queued at the clunk: its error is the write's.
    let c = within(path, f.clunk()).await;
    r.and(c)
}

/// Opens `path` OWRITE and writes `data` in one Twrite.
pub async fn write(root: &Fid, path: &str, data: &str) -> Result<(), ClientError> {
    write_mode(root, path, om::OWRITE, data).await
}

/// On an open fid: writes `data` in one Twrite and reads the whole reply.
pub async fn exchange(f: &Fid, data: &str) -> Result<Vec<u8>, ClientError> {
    within("write", f.write(0, Bytes::from(data.to_owned()))).await?;
    within("read reply", f.read_to_end()).await
}

/// Opens `path` ORDWR, writes `data` in one Twrite and reads the whole reply on the same fid.
pub async fn rdwr_bytes(root: &Fid, path: &str, data: &str) -> Result<Vec<u8>, ClientError> {
    let f = open(root, path, om::ORDWR).await?;
    let d = exchange(&f, data).await?;
    let _ = within(path, f.clunk()).await;
    Ok(d)
}

/// [`rdwr_bytes`] as text; fails if it is not UTF-8.
pub async fn rdwr(root: &Fid, path: &str, data: &str) -> Result<String, ClientError> {
    rdwr_bytes(root, path, data)
        .await
        .map(|d| String::from_utf8(d).unwrap_or_else(|e| panic!("{path} reply is not utf-8: {e}")))
}

/// Polls `path` until it contains `needle` (failing after `guard`); returns the content.
pub async fn wait_for_text(root: &Fid, path: &str, needle: &str, guard: Duration) -> String {
    let deadline = Instant::now() + guard;
    loop {
        let t = read(root, path)
            .await
            .unwrap_or_else(|e| panic!("read {path}: {e}"));
        if t.contains(needle) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "{path} never contained {needle:?}:\n{t}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// The same steps for suites that check errors as text (the error's `Display`) or only need
// them to succeed; import them under the short names (`read_ok as read`).

/// [`open`] with the error as text.
pub async fn open_text(root: &Fid, path: &str, mode: u8) -> Result<Fid, String> {
    open(root, path, mode).await.map_err(|e| e.to_string())
}

/// [`read`] with the error as text.
pub async fn read_text(root: &Fid, path: &str) -> Result<String, String> {
    read(root, path).await.map_err(|e| e.to_string())
}

/// [`read`], failing the test on an error.
pub async fn read_ok(root: &Fid, path: &str) -> String {
    read(root, path)
        .await
        .unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// [`write()`] with the error as text.
pub async fn write_text(root: &Fid, path: &str, data: &str) -> Result<(), String> {
    write(root, path, data).await.map_err(|e| e.to_string())
}

/// [`write()`], failing the test on an error.
pub async fn write_ok(root: &Fid, path: &str, data: &str) {
    write(root, path, data)
        .await
        .unwrap_or_else(|e| panic!("write {path}: {e}"));
}

/// [`rdwr`] with the error as text.
pub async fn rdwr_text(root: &Fid, path: &str, data: &str) -> Result<String, String> {
    rdwr(root, path, data).await.map_err(|e| e.to_string())
}
