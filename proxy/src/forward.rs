//! Plain HTTP through the proxy: an absolute-URI request forwarded over a fresh HTTP/1.1
//! connection to the vetted address, in origin form, without hop-by-hop or `Proxy-*`
//! headers; the response streamed back, counted.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, Uri, Version};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::decide::{Refusal, Target};
use crate::event::Record;

/// The body of every response the proxy sends.
pub(crate) type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), besides those the
/// `Connection` header names and every `Proxy-*` header.
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers: those above, `Keep-Alive`, every `Proxy-*` header, and every
/// header the `Connection` header names.
pub(crate) fn scrub(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named.iter().chain(HOP_BY_HOP) {
        headers.remove(n);
    }
    headers.remove("keep-alive");
    let proxy: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for n in proxy {
        headers.remove(n);
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A body that counts its data bytes, holding `hold` (the event, the origin connection's
/// task) for as long as it lives.
struct Counted<B, H> {
    inner: B,
    count: Arc<AtomicU64>,
    _hold: H,
}

impl<B, H> Body for Counted<B, H>
where
    B: Body<Data = Bytes> + Unpin,
    H: Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &r
            && let Some(data) = frame.data_ref()
        {
            this.count.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Forwards `req` to `target` over `stream` (connected to a vetted address). On success the
/// response's body holds `record`, so the event is reported when the body is done or
/// dropped; on failure the refusal is handed back with the record.
pub(crate) async fn forward(
    req: Request<Incoming>,
    target: &Target,
    stream: TcpStream,
    record: Record,
) -> Result<Response<ProxyBody>, (Record, Refusal)> {
    let (up, down) = record.counters();
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    parts.uri = match path.parse::<Uri>() {
        Ok(u) => u,
        Err(e) => return Err((record, Refusal::Upstream(format!("bad path: {e}")))),
    };
    parts.version = Version::HTTP_11;
    scrub(&mut parts.headers);
    let authority = match target.port {
        80 => target.host.to_string(),
        p => format!("{}:{p}", target.host),
    };
    match HeaderValue::from_str(&authority) {
        Ok(v) => {
            parts.headers.insert(header::HOST, v);
        }
        Err(e) => return Err((record, Refusal::Upstream(format!("bad host: {e}")))),
    }
    let body = Counted {
        inner: body,
        count: up,
        _hold: (),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => return Err((record, Refusal::Upstream(e.to_string()))),
    };
    let driver = AbortOnDrop(tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("proxy: origin connection ended: {e}");
        }
    }));
    let response = match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(r) => r,
        Err(e) => return Err((record, Refusal::Upstream(e.to_string()))),
    };
    let (mut parts, body) = response.into_parts();
    scrub(&mut parts.headers);
    let body = Counted {
        inner: body,
        count: down,
        _hold: (record, driver),
    };
    Ok(Response::from_parts(parts, body.boxed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_proxy_headers_are_removed() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, X-Secret-Hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("proxy-authorization", "Basic eA=="),
            ("proxy-connection", "keep-alive"),
            ("proxy-anything", "x"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("accept", "*/*"),
            ("user-agent", "pip"),
            ("content-length", "3"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        scrub(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "content-length", "user-agent"]);
    }
}
