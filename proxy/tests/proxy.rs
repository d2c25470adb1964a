//! The proxy against origins this test starts on 127.0.0.1 (never anything else): a raw TCP
//! echo origin (optionally speaking first) and a small hyper HTTP origin. Names are pinned
//! (`allowed.test -> 127.0.0.1`); the system resolver is off, so nothing is ever looked up.
//! Clients are raw TCP, and curl when installed (`SKIP` without it, a failure with
//! `OLLIE_TEST_REQUIRE=all`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use ollie_policy::domains::{DomainPattern, DomainRules};
use ollie_proxy::{
    AddressPolicy, AskFuture, AskRequest, AskVerdict, Asker, Caller, Event, EventSink, Proxy,
    ProxyConfig, Resolver, Verdict,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const CURL_EVIL: &[u8] = include_bytes!("../testdata/client_hello_curl_evil.test.bin");
const CURL_ALLOWED: &[u8] = include_bytes!("../testdata/client_hello_curl_allowed.test.bin");
const WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Events(Mutex<Vec<Event>>);

impl EventSink for Events {
    fn event(&self, e: &Event) {
        self.0.lock().unwrap().push(e.clone());
    }
}

impl Events {
    /// Waits for the `n`th event and returns all of them.
    async fn wait(&self, n: usize) -> Vec<Event> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let events = self.0.lock().unwrap().clone();
            if events.len() >= n {
                return events;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "only {} events: {events:?}",
                events.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A raw TCP origin: echoes (after sending `banner`, if any); counts connections and bytes.
struct Echo {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    received: Arc<AtomicU64>,
}

async fn echo_origin(banner: &'static [u8]) -> Echo {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let received = Arc::new(AtomicU64::new(0));
    let (c, r) = (connections.clone(), received.clone());
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            c.fetch_add(1, Ordering::SeqCst);
            let r = r.clone();
            tokio::spawn(async move {
                let _ = s.write_all(banner).await;
                let mut buf = vec![0u8; 65536];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            r.fetch_add(n as u64, Ordering::SeqCst);
                            if s.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
    Echo {
        addr,
        connections,
        received,
    }
}

/// An echo origin, and a proxy with the default test settings for its port.
async fn start_echo() -> (Echo, Running) {
    let echo = echo_origin(b"").await;
    let p = start(&[echo.addr.port()], |_| {}).await;
    (echo, p)
}

/// A hyper HTTP origin answering every request with what it saw.
async fn http_origin() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let c = connections.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            c.fetch_add(1, Ordering::SeqCst);
            let service = service_fn(|req: Request<hyper::body::Incoming>| async move {
                let h = |n: &str| {
                    req.headers()
                        .get(n)
                        .map_or("-".to_string(), |v| v.to_str().unwrap().to_string())
                };
                let head = format!(
                    "origin saw {} {} host={} proxy-authorization={} x-hop={}",
                    req.method(),
                    req.uri(),
                    h("host"),
                    h("proxy-authorization"),
                    h("x-hop"),
                );
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let text = format!("{head} body={}\n", body.len());
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), service)
                    .await;
            });
        }
    });
    (addr, connections)
}

fn rules(allow: &[&str], deny: &[&str]) -> DomainRules {
    let p = |v: &[&str]| v.iter().map(|s| DomainPattern::parse(s).unwrap()).collect();
    DomainRules::new(p(allow), p(deny))
}

/// Every name the tests use, pinned to 127.0.0.1.
fn resolver() -> Resolver {
    let mut r = Resolver::pinned_only();
    for n in [
        "allowed.test",
        "other.test",
        "a.ok.test",
        "x.bad.ok.test",
        "evil.test",
    ] {
        r = r.pin(n, vec!["127.0.0.1".parse().unwrap()]).unwrap();
    }
    r
}

struct Running {
    addr: SocketAddr,
    events: Arc<Events>,
    proxy: Arc<Proxy>,
    task: JoinHandle<()>,
}

/// A proxy on its own 127.0.0.1 listener: allow `allowed.test` and `*.ok.test`, deny
/// `*.bad.ok.test`, the given ports, `127.0.0.1/32` allowed as an address; `edit` changes
/// the rest.
async fn start(ports: &[u16], edit: impl FnOnce(&mut ProxyConfig)) -> Running {
    let events = Arc::new(Events::default());
    let mut config = ProxyConfig::new(
        rules(&["allowed.test", "*.ok.test"], &["*.bad.ok.test"]),
        events.clone(),
    );
    config.ports = ports.iter().copied().collect::<BTreeSet<u16>>();
    config.addresses = AddressPolicy::new(vec!["127.0.0.1/32".parse().unwrap()]);
    config.resolver = resolver();
    config.connect_timeout = Duration::from_secs(5);
    edit(&mut config);
    let proxy = Arc::new(Proxy::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let caller = Caller {
        agent: "coder".into(),
        call: "12".into(),
        command: "pip install x".into(),
    };
    let p = proxy.clone();
    let task = tokio::spawn(async move {
        let _ = p.serve(listener, caller).await;
    });
    Running {
        addr,
        events,
        proxy,
        task,
    }
}

/// Sends `request` and reads the response head (up to the blank line, not a byte more).
async fn send_head(proxy: SocketAddr, request: &[u8]) -> (TcpStream, String) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(WAIT, s.read(&mut b)).await.unwrap() {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    (s, String::from_utf8_lossy(&head).into_owned())
}

/// Sends `request` and reads the whole response, until the proxy closes.
async fn exchange(proxy: SocketAddr, request: &[u8]) -> String {
    let (mut s, mut text) = send_head(proxy, request).await;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
        .await
        .unwrap();
    text.push_str(&String::from_utf8_lossy(&rest));
    text
}

fn connect_request(target: &str) -> Vec<u8> {
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").into_bytes()
}

/// Reads until `n` bytes came or the stream ends.
async fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut got = vec![0u8; n];
    tokio::time::timeout(WAIT, s.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    got
}

#[tokio::test]
async fn connect_tunnels_bytes_both_ways_and_counts_them() {
    let (echo, p) = start_echo().await;
    let target = format!("allowed.test:{}", echo.addr.port());
    let (mut s, head) = send_head(p.addr, &connect_request(&target)).await;
    assert!(
        head.starts_with("HTTP/1.1 200 Connection established\r\n"),
        "{head}"
    );
    s.write_all(b"hello world").await.unwrap();
    assert_eq!(read_n(&mut s, 11).await, b"hello world");
    s.write_all(b"!").await.unwrap();
    assert_eq!(read_n(&mut s, 1).await, b"!");
    s.shutdown().await.unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    let e = &p.events.wait(1).await[0];
    assert_eq!(e.method, "CONNECT");
    assert_eq!(e.domain, "allowed.test");
    assert_eq!(e.port, echo.addr.port());
    assert_eq!(e.verdict, Verdict::Allowed);
    assert_eq!(e.reason.as_deref(), Some("allowed by allowed.test"));
    assert_eq!(e.address.as_deref(), Some(echo.addr.to_string().as_str()));
    assert_eq!((e.bytes_up, e.bytes_down), (12, 12));
    assert_eq!((e.agent.as_str(), e.call.as_str()), ("coder", "12"));
}

#[tokio::test]
async fn a_server_that_speaks_first_is_heard_before_the_client_speaks() {
    let echo = echo_origin(b"220 ready\r\n").await;
    let p = start(&[echo.addr.port()], |_| {}).await;
    let (mut s, head) = send_head(
        p.addr,
        &connect_request(&format!("a.ok.test:{}", echo.addr.port())),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(read_n(&mut s, 11).await, b"220 ready\r\n");
    s.write_all(b"QUIT\r\n").await.unwrap();
    assert_eq!(read_n(&mut s, 6).await, b"QUIT\r\n");
    drop(s);
    let e = &p.events.wait(1).await[0];
    assert_eq!((e.bytes_up, e.bytes_down), (6, 17));
    assert_eq!(e.reason.as_deref(), Some("allowed by *.ok.test"));
}

#[tokio::test]
async fn plain_get_is_forwarded_in_origin_form_without_proxy_headers() {
    let (origin, connections) = http_origin().await;
    let p = start(&[origin.port()], |_| {}).await;
    let port = origin.port();
    let request = format!(
        "GET http://allowed.test:{port}/x?y=1 HTTP/1.1\r\nHost: allowed.test:{port}\r\n\
         Proxy-Authorization: Basic c2VjcmV0\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\n\r\n"
    );
    let response = exchange(p.addr, request.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    let body = format!(
        "origin saw GET /x?y=1 host=allowed.test:{port} proxy-authorization=- x-hop=- body=0\n"
    );
    assert!(response.ends_with(&body), "{response}");
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    let e = &p.events.wait(1).await[0];
    assert_eq!((e.method.as_str(), e.verdict), ("GET", Verdict::Allowed));
    assert_eq!((e.bytes_up, e.bytes_down), (0, body.len() as u64));

    // A body goes up (chunked here), counted; no Host header is fine (the URI's is sent).
    let request = format!(
        "POST http://allowed.test:{port}/up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n5\r\nhello\r\n3\r\n!!!\r\n0\r\n\r\n"
    );
    let response = exchange(p.addr, request.as_bytes()).await;
    let want = format!(
        "origin saw POST /up host=allowed.test:{port} proxy-authorization=- x-hop=- body=8\n"
    );
    assert!(response.ends_with(&want), "{response}");
    let e = &p.events.wait(2).await[1];
    assert_eq!((e.method.as_str(), e.bytes_up), ("POST", 8));
}

#[tokio::test]
async fn a_name_not_listed_is_refused_with_a_hint_and_no_connection() {
    let (echo, p) = start_echo().await;
    let port = echo.addr.port();
    let response = exchange(p.addr, &connect_request(&format!("other.test:{port}"))).await;
    assert!(
        response.starts_with("HTTP/1.1 403 Forbidden\r\n"),
        "{response}"
    );
    assert!(
        response.contains("\r\ncontent-type: text/plain\r\n"),
        "{response}"
    );
    assert!(response.contains("\r\nconnection: close\r\n"), "{response}");
    let body = format!(
        "ollie proxy: refused other.test:{port}: not in the session's allowed domains; add it to [network] allow_domains in the agent's policy, or allow net escalations\n"
    );
    assert!(response.ends_with(&body), "{response}");
    let e = &p.events.wait(1).await[0];
    assert_eq!(e.verdict, Verdict::Refused);
    assert_eq!(
        e.reason.as_deref(),
        Some("not in the session's allowed domains")
    );
    assert_eq!(e.address, None);
    assert_eq!(echo.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_denied_wildcard_wins_over_the_allowed_one() {
    let (origin, connections) = http_origin().await;
    let p = start(&[origin.port()], |_| {}).await;
    let port = origin.port();
    let response = exchange(p.addr, &connect_request(&format!("x.bad.ok.test:{port}"))).await;
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(response.contains("denied by *.bad.ok.test"), "{response}");
    let request = format!("GET http://x.bad.ok.test:{port}/ HTTP/1.1\r\n\r\n");
    let response = exchange(p.addr, request.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    let events = p.events.wait(2).await;
    assert!(events.iter().all(|e| e.verdict == Verdict::Refused));
    assert_eq!(connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn hostile_host_spellings_are_refused_without_a_connection() {
    let (echo, p) = start_echo().await;
    let port = echo.addr.port();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            connect_request(&format!("attacker%00.allowed.test:{port}")),
            "HTTP/1.1 400",
        ),
        (
            format!("CONNECT attacker\0.allowed.test:{port} HTTP/1.1\r\n\r\n").into_bytes(),
            "HTTP/1.1 400",
        ),
        (
            connect_request(&format!("a*b.allowed.test:{port}")),
            "HTTP/1.1 400",
        ),
        (connect_request(&format!("127.1:{port}")), "HTTP/1.1 400"),
        (
            connect_request(&format!("2130706433:{port}")),
            "HTTP/1.1 400",
        ),
        (
            connect_request(&format!("user@allowed.test:{port}")),
            "HTTP/1.1 400",
        ),
        (
            connect_request(&format!("127.0.0.1:{port}")),
            "HTTP/1.1 403",
        ),
        (connect_request("allowed.test"), "HTTP/1.1 400"),
        (
            b"GET /x HTTP/1.1\r\nHost: allowed.test\r\n\r\n".to_vec(),
            "HTTP/1.1 400",
        ),
        (
            b"GET https://allowed.test/ HTTP/1.1\r\n\r\n".to_vec(),
            "HTTP/1.1 400",
        ),
    ];
    let n = cases.len();
    for (request, want) in cases {
        let response = exchange(p.addr, &request).await;
        assert!(
            response.starts_with(want),
            "{:?}: {response}",
            String::from_utf8_lossy(&request)
        );
    }
    let events = p.events.wait(n).await;
    assert!(
        events.iter().all(|e| e.verdict == Verdict::Refused),
        "{events:?}"
    );
    assert_eq!(
        events.iter().filter(|e| e.method == "-").count(),
        2,
        "{events:?}"
    );
    assert_eq!(echo.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn loopback_is_refused_unless_the_operator_allows_it() {
    let echo = echo_origin(b"").await;
    let p = start(&[echo.addr.port()], |c| {
        c.addresses = AddressPolicy::default()
    })
    .await;
    let port = echo.addr.port();
    let response = exchange(p.addr, &connect_request(&format!("allowed.test:{port}"))).await;
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(response.contains("127.0.0.1: loopback"), "{response}");
    assert!(response.contains("allow_addresses"), "{response}");
    let e = &p.events.wait(1).await[0];
    assert_eq!(e.verdict, Verdict::Refused);
    assert!(e.reason.as_deref().unwrap().contains("loopback"), "{e:?}");
    assert_eq!(echo.connections.load(Ordering::SeqCst), 0);
}

/// An asker that answers `verdict` and counts its questions.
struct Answer {
    verdict: AskVerdict,
    asked: AtomicUsize,
    last: Mutex<Option<AskRequest>>,
}

impl Asker for Answer {
    fn ask(&self, request: AskRequest) -> AskFuture {
        self.asked.fetch_add(1, Ordering::SeqCst);
        *self.last.lock().unwrap() = Some(request);
        let v = self.verdict.clone();
        Box::pin(async move { v })
    }
}

/// An echo origin, and a proxy whose asker answers `verdict`.
async fn start_asking(verdict: AskVerdict) -> (Echo, Arc<Answer>, Running) {
    let echo = echo_origin(b"").await;
    let asker = Arc::new(Answer {
        verdict,
        asked: AtomicUsize::new(0),
        last: Mutex::new(None),
    });
    let a = asker.clone();
    let p = start(&[echo.addr.port()], move |c| c.asker = Some(a)).await;
    (echo, asker, p)
}

#[tokio::test]
async fn a_port_not_listed_is_refused_without_asking() {
    let (echo, asker, p) = start_asking(AskVerdict::Allow { for_session: true }).await;
    for target in ["allowed.test:1", "other.test:22"] {
        let response = exchange(p.addr, &connect_request(target)).await;
        assert!(response.starts_with("HTTP/1.1 403"), "{response}");
        assert!(response.contains("port not allowed"), "{response}");
    }
    assert_eq!(asker.asked.load(Ordering::SeqCst), 0);
    assert_eq!(echo.connections.load(Ordering::SeqCst), 0);
    assert_eq!(p.events.wait(2).await[1].verdict, Verdict::Refused);
}

#[tokio::test]
async fn an_approval_for_the_session_is_asked_once() {
    let (echo, asker, p) = start_asking(AskVerdict::Allow { for_session: true }).await;
    let target = format!("Other.Test:{}", echo.addr.port());
    for _ in 0..2 {
        let (mut s, head) = send_head(p.addr, &connect_request(&target)).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        s.write_all(b"ping").await.unwrap();
        assert_eq!(read_n(&mut s, 4).await, b"ping");
    }
    assert_eq!(asker.asked.load(Ordering::SeqCst), 1);
    let asked = asker.last.lock().unwrap().clone().unwrap();
    assert_eq!(
        (asked.domain.as_str(), asked.port),
        ("other.test", echo.addr.port())
    );
    assert_eq!(asked.caller.agent, "coder");
    assert_eq!(p.proxy.approved_for_session(), ["other.test"]);
    let events = p.events.wait(2).await;
    assert!(
        events.iter().all(|e| e.verdict == Verdict::Approved),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_one_time_approval_is_asked_each_time_and_a_denial_refuses() {
    let (echo, once, p) = start_asking(AskVerdict::Allow { for_session: false }).await;
    let target = format!("other.test:{}", echo.addr.port());
    for _ in 0..2 {
        let (_s, head) = send_head(p.addr, &connect_request(&target)).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    assert_eq!(once.asked.load(Ordering::SeqCst), 2);

    let (echo, no, p) = start_asking(AskVerdict::Deny {
        reason: "not today".into(),
    })
    .await;
    let target = format!("other.test:{}", echo.addr.port());
    let response = exchange(p.addr, &connect_request(&target)).await;
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(
        response.contains("denied on escalation: not today"),
        "{response}"
    );
    let e = &p.events.wait(1).await[0];
    assert_eq!(e.verdict, Verdict::Denied);
    assert_eq!(no.asked.load(Ordering::SeqCst), 1);
    assert_eq!(echo.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_tls_server_name_other_than_the_connect_host_closes_the_tunnel() {
    let (echo, p) = start_echo().await;
    let target = format!("allowed.test:{}", echo.addr.port());
    let (mut s, head) = send_head(p.addr, &connect_request(&target)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.write_all(CURL_EVIL).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
        .await
        .unwrap();
    assert!(rest.is_empty());
    let e = &p.events.wait(1).await[0];
    assert_eq!(e.verdict, Verdict::Refused);
    assert!(
        e.reason.as_deref().unwrap().contains("domain fronting"),
        "{e:?}"
    );
    assert_eq!(echo.received.load(Ordering::SeqCst), 0);
    assert_eq!(e.bytes_up, 0);

    // The right name passes, byte for byte.
    let (mut s, _) = send_head(p.addr, &connect_request(&target)).await;
    s.write_all(CURL_ALLOWED).await.unwrap();
    assert_eq!(read_n(&mut s, CURL_ALLOWED.len()).await, CURL_ALLOWED);
    // Split in two writes, as a slow client might send it.
    let (mut s, _) = send_head(p.addr, &connect_request(&target)).await;
    s.write_all(&CURL_ALLOWED[..3]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    s.write_all(&CURL_ALLOWED[3..]).await.unwrap();
    assert_eq!(read_n(&mut s, CURL_ALLOWED.len()).await, CURL_ALLOWED);
}

#[tokio::test]
async fn a_host_header_other_than_the_uri_host_is_refused() {
    let (origin, connections) = http_origin().await;
    let p = start(&[origin.port()], |_| {}).await;
    let port = origin.port();
    let request = format!("GET http://allowed.test:{port}/ HTTP/1.1\r\nHost: evil.test\r\n\r\n");
    let response = exchange(p.addr, request.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(
        response.contains("the host header names evil.test"),
        "{response}"
    );
    assert_eq!(connections.load(Ordering::SeqCst), 0);
    assert_eq!(p.events.wait(1).await[0].verdict, Verdict::Refused);
}

#[tokio::test]
async fn over_the_connection_limit_is_503_and_new_rules_apply_at_once() {
    let echo = echo_origin(b"").await;
    let p = start(&[echo.addr.port()], |c| c.max_connections = 1).await;
    let target = format!("allowed.test:{}", echo.addr.port());
    let (held, head) = send_head(p.addr, &connect_request(&target)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let response = exchange(p.addr, &connect_request(&target)).await;
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert!(
        response.contains("too many connections (at most 1)"),
        "{response}"
    );
    drop(held);
    p.events.wait(2).await;

    p.proxy.set_rules(rules(&["*.ok.test"], &[]));
    let response = exchange(p.addr, &connect_request(&target)).await;
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(
        response.contains("not in the session's allowed domains"),
        "{response}"
    );
}

#[tokio::test]
async fn dropping_serve_closes_open_tunnels_and_each_reports() {
    let (echo, p) = start_echo().await;
    let target = format!("allowed.test:{}", echo.addr.port());
    let (mut s, _) = send_head(p.addr, &connect_request(&target)).await;
    s.write_all(b"abc").await.unwrap();
    assert_eq!(read_n(&mut s, 3).await, b"abc");
    p.task.abort();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
        .await
        .unwrap();
    let e = &p.events.wait(1).await[0];
    assert_eq!(
        (e.verdict, e.bytes_up, e.bytes_down),
        (Verdict::Allowed, 3, 3)
    );
    assert!(TcpStream::connect(p.addr).await.is_err());
}

/// Runs curl with a clean environment (no proxy variables), through the proxy.
async fn curl(args: Vec<String>) -> Option<(bool, String)> {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("curl")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .args(["-sS", "--max-time", "10"])
            .args(&args)
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        Some((out.status.success(), text))
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn curl_through_the_proxy() {
    if curl(vec!["--version".into()]).await.is_none() {
        assert!(
            std::env::var("OLLIE_TEST_REQUIRE").as_deref() != Ok("all"),
            "curl_through_the_proxy: curl is not installed"
        );
        println!("SKIP curl_through_the_proxy: curl is not installed");
        return;
    }
    let (origin, _) = http_origin().await;
    let p = start(&[origin.port()], |_| {}).await;
    let proxy = format!("http://{}", p.addr);
    let url = format!("http://allowed.test:{}/x", origin.port());
    // Plain HTTP with an absolute URI, then the same through a CONNECT tunnel (-p).
    for tunnel in [false, true] {
        let mut args = vec!["-x".to_string(), proxy.clone(), url.clone()];
        if tunnel {
            args.insert(0, "-p".into());
        }
        let (ok, out) = curl(args).await.unwrap();
        assert!(ok, "{out}");
        assert!(
            out.starts_with("origin saw GET /x host=allowed.test:"),
            "{out}"
        );
    }
    let refused = format!("http://other.test:{}/", origin.port());
    let (_, out) = curl(vec!["-x".into(), proxy, refused]).await.unwrap();
    assert!(out.contains("ollie proxy: refused other.test:"), "{out}");
    let events = p.events.wait(3).await;
    let verdicts: Vec<Verdict> = events.iter().map(|e| e.verdict).collect();
    assert_eq!(
        verdicts,
        [Verdict::Allowed, Verdict::Allowed, Verdict::Refused]
    );
    assert_eq!(events[1].method, "CONNECT");
}

#[tokio::test]
async fn serve_connection_tunnels_over_any_stream() {
    let (echo, p) = start_echo().await;
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let caller = Caller {
        agent: "other".into(),
        ..Caller::default()
    };
    tokio::spawn(p.proxy.clone().serve_connection(server, caller));
    let target = format!("allowed.test:{}", echo.addr.port());
    client.write_all(&connect_request(&target)).await.unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        client.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"));
    client.write_all(CURL_ALLOWED).await.unwrap();
    let mut got = vec![0u8; CURL_ALLOWED.len()];
    client.read_exact(&mut got).await.unwrap();
    assert_eq!(got, CURL_ALLOWED);
    drop(client);
    let e = &p.events.wait(1).await[0];
    assert_eq!(e.agent, "other");
    let n = CURL_ALLOWED.len() as u64;
    assert_eq!((e.bytes_up, e.bytes_down), (n, n));
}

#[tokio::test]
async fn a_client_hello_sent_with_the_connect_request_is_checked_too() {
    let (echo, p) = start_echo().await;
    let target = format!("allowed.test:{}", echo.addr.port());
    let mut evil = connect_request(&target);
    evil.extend_from_slice(CURL_EVIL);
    let (mut s, head) = send_head(p.addr, &evil).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
        .await
        .unwrap();
    assert!(rest.is_empty());
    assert_eq!(p.events.wait(1).await[0].verdict, Verdict::Refused);
    assert_eq!(echo.received.load(Ordering::SeqCst), 0);

    let mut good = connect_request(&target);
    good.extend_from_slice(CURL_ALLOWED);
    let (mut s, _) = send_head(p.addr, &good).await;
    assert_eq!(read_n(&mut s, CURL_ALLOWED.len()).await, CURL_ALLOWED);
}
