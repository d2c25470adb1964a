//! A CONNECT tunnel, once the origin is connected and the client told so: the client's
//! first flight is held back until checked ([`crate::sni`]), while whatever the origin sends
//! first already flows down (protocols where the server speaks first work); then both ways
//! are copied as they come, counted.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use ollie_policy::domains::Host;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::event::{Record, Verdict};
use crate::sni::{FirstFlight, MAX_HELLO, SniVerdict, check_sni, parse_first_flight};

/// The copy buffer of each direction.
const BUF: usize = 64 * 1024;

/// A tunnel waiting for hyper to hand over the client's connection.
pub(crate) struct TunnelJob {
    /// The client's side, once the `200` is written.
    pub(crate) on_upgrade: OnUpgrade,
    /// The origin, connected to a vetted address.
    pub(crate) upstream: TcpStream,
    /// The CONNECT host, which a TLS server name must match.
    pub(crate) host: Host,
    /// The request's event, reported when the tunnel closes.
    pub(crate) record: Record,
}

/// Runs a tunnel to its end; the event is reported when this returns.
pub(crate) async fn run(job: TunnelJob) {
    let TunnelJob {
        on_upgrade,
        mut upstream,
        host,
        mut record,
    } = job;
    let client = match on_upgrade.await {
        Ok(c) => c,
        Err(e) => {
            record.note(&format!("the client left before the tunnel opened: {e}"));
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let (up, down) = record.counters();
    let (first, upstream_done) = match gate(&mut client, &mut upstream, &host, &down).await {
        Gate::Open {
            first,
            upstream_done,
        } => (first, upstream_done),
        Gate::Refused(why) => {
            tracing::info!(%host, "proxy tunnel closed: {why}");
            record.decide(Verdict::Refused, Some(why));
            return;
        }
        Gate::Closed(why) => {
            if let Some(why) = why {
                record.note(&why);
            }
            return;
        }
    };
    if let Err(e) = upstream.write_all(&first).await {
        record.note(&format!("the origin failed: {e}"));
        return;
    }
    up.fetch_add(first.len() as u64, Ordering::Relaxed);
    let mut client = Counted {
        inner: client,
        count: up,
    };
    let mut upstream = Counted {
        inner: upstream,
        count: down,
    };
    let result = if upstream_done {
        match tokio::io::copy(&mut client, &mut upstream).await {
            Ok(_) => upstream.shutdown().await,
            Err(e) => Err(e),
        }
    } else {
        tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, BUF, BUF)
            .await
            .map(|_| ())
    };
    if let Err(e) = result {
        record.note(&format!("the tunnel ended with an error: {e}"));
    }
}

/// How the first flight went.
enum Gate {
    /// Checked: forward these bytes, then tunnel. `upstream_done`: the origin has already
    /// closed its side (and the client was told).
    Open { first: Vec<u8>, upstream_done: bool },
    /// Refused: close both sides.
    Refused(String),
    /// A side failed, or both closed, before the check: close (why, if worth saying).
    Closed(Option<String>),
}

/// Reads the client's first flight until [`parse_first_flight`] can tell what it is, while
/// copying whatever the origin sends to the client (counted in `down`).
async fn gate<C, U>(client: &mut C, upstream: &mut U, host: &Host, down: &AtomicU64) -> Gate
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let mut first = Vec::with_capacity(4096);
    let mut buf = vec![0u8; 16 * 1024];
    let mut upstream_done = false;
    loop {
        first.reserve(4096);
        tokio::select! {
            r = client.read_buf(&mut first) => {
                let n = match r {
                    Ok(n) => n,
                    Err(e) => return Gate::Closed(Some(format!("the client failed: {e}"))),
                };
                let flight = parse_first_flight(&first);
                let flight = match (flight, n) {
                    (FirstFlight::Incomplete, 0) if first.is_empty() => FirstFlight::NotTls,
                    (FirstFlight::Incomplete, _) if n > 0 && first.len() < MAX_HELLO => continue,
                    (flight, _) => flight,
                };
                return match check_sni(host, &flight) {
                    SniVerdict::Pass => Gate::Open { first, upstream_done },
                    SniVerdict::Refuse(why) => Gate::Refused(why),
                };
            }
            r = upstream.read(&mut buf), if !upstream_done => {
                match r {
                    Ok(0) => {
                        upstream_done = true;
                        let _ = client.shutdown().await;
                    }
                    Ok(n) => {
                        if let Err(e) = client.write_all(&buf[..n]).await {
                            return Gate::Closed(Some(format!("the client failed: {e}")));
                        }
                        down.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e) => return Gate::Closed(Some(format!("the origin failed: {e}"))),
                }
            }
        }
    }
}

/// A stream that counts the bytes read from it.
struct Counted<S> {
    inner: S,
    count: Arc<AtomicU64>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
