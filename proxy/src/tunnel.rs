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
const BUF: usize = 256 * 1024;

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

/// Runs a tunnel to its end; the event is reported when this returns. A client connection
/// that is a TCP socket (every one [`crate::Proxy::serve`] accepts) is tunnelled with
/// `splice(2)`; any other with a user-space copy.
pub(crate) async fn run(job: TunnelJob) {
    let TunnelJob {
        on_upgrade,
        mut upstream,
        host,
        mut record,
    } = job;
    let upgraded = match on_upgrade.await {
        Ok(c) => c,
        Err(e) => {
            record.note(&format!("the client left before the tunnel opened: {e}"));
            return;
        }
    };
    let (up, down) = record.counters();
    let result = match upgraded.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => {
            let mut client = parts.io.into_inner();
            let prefix = parts.read_buf;
            match open(&mut client, &prefix, &mut upstream, &host, &mut record).await {
                None => return,
                Some(true) => copy_up(client, upstream, up).await,
                Some(false) => crate::splice::both_ways(client, upstream, &up, &down).await,
            }
        }
        Err(upgraded) => {
            let mut client = TokioIo::new(upgraded);
            match open(&mut client, &[], &mut upstream, &host, &mut record).await {
                None => return,
                Some(true) => copy_up(client, upstream, up).await,
                Some(false) => {
                    let mut client = Counted {
                        inner: client,
                        count: up,
                    };
                    let mut upstream = Counted {
                        inner: upstream,
                        count: down,
                    };
                    tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, BUF, BUF)
                        .await
                        .map(|_| ())
                }
            }
        }
    };
    if let Err(e) = result {
        record.note(&format!("the tunnel ended with an error: {e}"));
    }
}

/// Checks the first flight (`prefix`: what hyper read past the CONNECT head) and forwards
/// it. `None`: the tunnel is over (the record says why); `Some(upstream_done)`: go on
/// copying, only upwards if the origin already closed its side.
async fn open<C>(
    client: &mut C,
    prefix: &[u8],
    upstream: &mut TcpStream,
    host: &Host,
    record: &mut Record,
) -> Option<bool>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (up, down) = record.counters();
    let (first, upstream_done) = match gate(client, prefix, upstream, host, &down).await {
        Gate::Open {
            first,
            upstream_done,
        } => (first, upstream_done),
        Gate::Refused(why) => {
            tracing::info!(%host, "proxy tunnel closed: {why}");
            record.decide(Verdict::Refused, Some(why));
            return None;
        }
        Gate::Closed(why) => {
            if let Some(why) = why {
                record.note(&why);
            }
            return None;
        }
    };
    if let Err(e) = upstream.write_all(&first).await {
        record.note(&format!("the origin failed: {e}"));
        return None;
    }
    up.fetch_add(first.len() as u64, Ordering::Relaxed);
    Some(upstream_done)
}

/// Copies client → origin only (the origin has closed its side), then shuts the origin's
/// side down.
async fn copy_up<C: AsyncRead + Unpin>(
    client: C,
    upstream: TcpStream,
    up: Arc<AtomicU64>,
) -> io::Result<()> {
    let mut client = Counted {
        inner: client,
        count: up,
    };
    let mut upstream = upstream;
    tokio::io::copy(&mut client, &mut upstream).await?;
    upstream.shutdown().await
}

/// How the first flight went.
enum Gate {
    /// Checked: forward these bytes, then tunnel. `upstream_done`: the origin has already
    /// closed its side (and the client was told).
    Open { first: Vec<u8>, upstream_done: bool },
    /// Refused: close both sides.
    Refused(String),
    /// A side failed before the check: close (why, if worth saying).
    Closed(Option<String>),
}

/// What the first flight so far allows: `None` while more is needed.
fn classify(first: &[u8], client_done: bool, host: &Host) -> Option<Result<(), String>> {
    let flight = match parse_first_flight(first) {
        FirstFlight::Incomplete if first.is_empty() && client_done => FirstFlight::NotTls,
        FirstFlight::Incomplete if !client_done && first.len() < MAX_HELLO => return None,
        flight => flight,
    };
    match check_sni(host, &flight) {
        SniVerdict::Pass => Some(Ok(())),
        SniVerdict::Refuse(why) => Some(Err(why)),
    }
}

/// Reads the client's first flight (after `prefix`) until [`classify`] can tell, while
/// copying whatever the origin sends to the client (counted in `down`).
async fn gate<C, U>(
    client: &mut C,
    prefix: &[u8],
    upstream: &mut U,
    host: &Host,
    down: &AtomicU64,
) -> Gate
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let mut first = prefix.to_vec();
    let mut buf = vec![0u8; 16 * 1024];
    let mut upstream_done = false;
    let mut client_done = false;
    loop {
        if !first.is_empty() || client_done {
            match classify(&first, client_done, host) {
                Some(Ok(())) => {
                    return Gate::Open {
                        first,
                        upstream_done,
                    };
                }
                Some(Err(why)) => return Gate::Refused(why),
                None => {}
            }
        }
        first.reserve(4096);
        tokio::select! {
            r = client.read_buf(&mut first) => match r {
                Ok(0) => client_done = true,
                Ok(_) => {}
                Err(e) => return Gate::Closed(Some(format!("the client failed: {e}"))),
            },
            r = upstream.read(&mut buf), if !upstream_done => match r {
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
            },
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
