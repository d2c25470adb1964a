//! The proxy's cost on loopback, in one process: a 64 MiB download through a CONNECT tunnel
//! vs the same download direct (median MiB/s of several rounds, and the ratio; goal ≥ 0.9×),
//! beside the floor of any two-hop relay on this machine (blocking splice threads),
//! and the added latency of one request: connect + CONNECT + one small round trip through
//! the proxy vs connect + the round trip direct (median µs, and the difference; goal ≤ 1 ms).
//! Prints figures, asserts no timing. Run with `cargo bench -p ollie-proxy`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ollie_policy::domains::{DomainPattern, DomainRules};
use ollie_proxy::{AddressPolicy, Caller, Event, EventSink, Proxy, ProxyConfig, Resolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const DOWNLOAD: usize = 64 << 20;
const ROUNDS: usize = 7;
const PINGS: usize = 300;

struct Discard;

impl EventSink for Discard {
    fn event(&self, e: &Event) {
        std::hint::black_box(e);
    }
}

/// An origin that, after one byte from the client, sends `DOWNLOAD` bytes and closes.
async fn download_origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let chunk = vec![0x5au8; 1 << 20];
        let chunk = Arc::new(chunk);
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let chunk = chunk.clone();
            tokio::spawn(async move {
                let mut b = [0u8; 1];
                if s.read_exact(&mut b).await.is_err() {
                    return;
                }
                for _ in 0..DOWNLOAD / chunk.len() {
                    if s.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// An origin echoing whatever it reads.
async fn echo_origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut b = [0u8; 64];
                while let Ok(n) = s.read(&mut b).await {
                    if n == 0 || s.write_all(&b[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

async fn start_proxy(ports: &[u16]) -> SocketAddr {
    let rules = DomainRules::new(vec![DomainPattern::parse("bench.test").unwrap()], vec![]);
    let mut config = ProxyConfig::new(rules, Arc::new(Discard));
    config.ports = ports.iter().copied().collect();
    config.addresses = AddressPolicy::new(vec!["127.0.0.1/32".parse().unwrap()]);
    config.resolver = Resolver::pinned_only()
        .pin("bench.test", vec!["127.0.0.1".parse().unwrap()])
        .unwrap();
    let proxy = Arc::new(Proxy::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = proxy.serve(listener, Caller::default()).await;
    });
    addr
}

/// A bare relay (accept, connect to `origin`, copy both ways): what any user-space relay
/// costs on this machine, for comparison.
async fn start_relay(origin: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut o = TcpStream::connect(origin).await.unwrap();
                let _ =
                    tokio::io::copy_bidirectional_with_sizes(&mut s, &mut o, 256 << 10, 256 << 10)
                        .await;
            });
        }
    });
    addr
}

/// The floor of any relay between two loopback connections: accept, connect to `origin`,
/// and move each direction with blocking `splice(2)` through a 1 MiB pipe on a thread of its
/// own (no runtime, no checks, no counting). Every byte still crosses the loopback stack
/// twice, which is what costs the proxy its share of a direct transfer.
fn start_floor(origin: SocketAddr) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let s = s.unwrap();
            let o = std::net::TcpStream::connect(origin).unwrap();
            let (s2, o2) = (s.try_clone().unwrap(), o.try_clone().unwrap());
            std::thread::spawn(move || splice_all(&s, &o));
            std::thread::spawn(move || splice_all(&o2, &s2));
        }
    });
    addr
}

/// Blocking splice from `from` to `to` until `from` ends; then shuts `to` for writing.
fn splice_all(from: &std::net::TcpStream, to: &std::net::TcpStream) {
    use nix::fcntl::{FcntlArg, SpliceFFlags, fcntl, splice};
    use std::os::fd::AsRawFd;
    let (r, w) = nix::unistd::pipe().unwrap();
    let _ = fcntl(w.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(1 << 20));
    loop {
        let n = splice(from, None, &w, None, 1 << 20, SpliceFFlags::SPLICE_F_MOVE).unwrap_or(0);
        if n == 0 {
            let _ = to.shutdown(std::net::Shutdown::Write);
            return;
        }
        let mut left = n;
        while left > 0 {
            match splice(&r, None, to, None, left, SpliceFFlags::SPLICE_F_MOVE) {
                Ok(m) if m > 0 => left -= m,
                _ => return,
            }
        }
    }
}

/// Connects to `origin`, through `proxy` with CONNECT when given.
async fn open(origin: SocketAddr, proxy: Option<SocketAddr>) -> TcpStream {
    let Some(proxy) = proxy else {
        let s = TcpStream::connect(origin).await.unwrap();
        s.set_nodelay(true).unwrap();
        return s;
    };
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.set_nodelay(true).unwrap();
    let target = format!("bench.test:{}", origin.port());
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    // The origins send nothing before the client does, so nothing follows the head yet.
    let mut head = Vec::new();
    let mut buf = [0u8; 256];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "the proxy closed: {}",
            String::from_utf8_lossy(&head)
        );
        head.extend_from_slice(&buf[..n]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// One download; MiB/s.
async fn download(origin: SocketAddr, proxy: Option<SocketAddr>) -> f64 {
    let mut s = open(origin, proxy).await;
    let start = Instant::now();
    s.write_all(b"g").await.unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0usize;
    loop {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        total += n;
    }
    assert_eq!(total, DOWNLOAD);
    total as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64()
}

/// One connect and small round trip; its duration.
async fn ping(origin: SocketAddr, proxy: Option<SocketAddr>) -> Duration {
    let start = Instant::now();
    let mut s = open(origin, proxy).await;
    s.write_all(b"ping").await.unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).await.unwrap();
    start.elapsed()
}

fn median<T: PartialOrd + Copy>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let big = download_origin().await;
        let small = echo_origin().await;
        let proxy = start_proxy(&[big.port(), small.port()]).await;

        download(big, None).await;
        download(big, Some(proxy)).await;
        let relay = start_relay(big).await;
        let floor = start_floor(big);
        let (mut direct, mut proxied) = (Vec::new(), Vec::new());
        let (mut relayed, mut floored) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            direct.push(download(big, None).await);
            proxied.push(download(big, Some(proxy)).await);
            relayed.push(download(relay, None).await);
            floored.push(download(floor, None).await);
        }
        let (d, p) = (median(direct), median(proxied));
        let (r, f) = (median(relayed), median(floored));
        println!(
            "download 64 MiB, median of {ROUNDS}: direct {d:.0} MiB/s, through the proxy {p:.0} MiB/s, ratio {:.2}",
            p / d
        );
        println!(
            "  two-hop floor (blocking splice relay) {f:.0} MiB/s, {:.2} of direct; the proxy is {:.2} of the floor; a user-space copy relay {r:.0} MiB/s, {:.2}",
            f / d,
            p / f,
            r / d
        );

        let (mut direct, mut proxied) = (Vec::new(), Vec::new());
        for _ in 0..PINGS {
            direct.push(ping(small, None).await);
            proxied.push(ping(small, Some(proxy)).await);
        }
        let (d, p) = (median(direct), median(proxied));
        println!(
            "connect + one round trip, median of {PINGS}: direct {} µs, through the proxy {} µs, added {} µs",
            d.as_micros(),
            p.as_micros(),
            p.as_micros().saturating_sub(d.as_micros())
        );
    });
}
