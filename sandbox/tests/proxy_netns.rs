//! `network.mode = "proxy"`: a network namespace per proxied run (per session for a prepared
//! sandbox) whose only way out is the listener handed to the runner at `127.0.0.1:3128`.
//! For one-shot runs and prepared calls: the tool's connection arrives on the handed
//! listener and bytes go both ways; everything else is denied (a loopback listener of the
//! host sees nothing, no UDP socket, no bind or listen, a non-loopback address is
//! unreachable at once); two concurrent runs each get their own listener; the environment
//! names the proxy and `/etc/resolv.conf` has no `nameserver` line; runs of other modes
//! keep the host's network namespace. The last test prints the spawn cost (no assertion).
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7, user namespaces or
//! network namespaces; with `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead.
//! Every address the tools try is on this machine, except one documentation address
//! (192.0.2.1, TEST-NET-1) that the probe only tries after it has seen that its namespace
//! has no interface but `lo`, so no packet can leave.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_policy::{Network, Policy, ProxyNetwork};
use ollie_sandbox::{NetNamespace, Prepared, ProxyHandoff, RunOutput, RunRequest, SandboxError};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;
use common::features_ok;

const PYTHON: &str = "/usr/bin/python3";

struct Ws(PathBuf);

impl Ws {
    fn new(name: &str) -> Ws {
        let d = std::env::temp_dir().join(format!("ollie-proxy-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("w")).unwrap();
        std::fs::create_dir_all(d.join("home")).unwrap();
        Ws(d.canonicalize().unwrap())
    }
    fn req(&self, argv: &[&str]) -> RunRequest {
        let mut r = RunRequest::new(argv.iter().map(Into::into).collect(), self.0.join("w"));
        r.home = self.0.join("home");
        r.base_env = vec![
            ("LANG".into(), "C.UTF-8".into()),
            // A runner's own proxy settings never reach the tool: the sandbox's replace them.
            ("HTTPS_PROXY".into(), "http://10.0.0.1:8080".into()),
        ];
        r
    }
    fn python(&self, script: &str) -> RunRequest {
        self.req(&[PYTHON, "-c", script])
    }
    fn prepare(&self, p: &Policy) -> Prepared {
        Prepared::new(p, &self.0.join("w"), &self.0.join("home")).unwrap()
    }
}

impl Drop for Ws {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The shipped `workspace` profile under `network.mode = "proxy"` (no domains, ports 80
/// and 443), with short limits.
fn proxied() -> Policy {
    let mut p = common::profile_with_limits(
        "workspace",
        "timeout_seconds = 30\nkill_grace_ms = 200\noutput_bytes = 65536",
    );
    p.network = Network::Proxy(ProxyNetwork::closed());
    p
}

/// `run` with the error chain in the panic message.
fn ok<T>(r: Result<T, SandboxError>) -> T {
    match r {
        Ok(o) => o,
        Err(e) => panic!("run failed: {}", common::error_chain(&e)),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Whether the kernel lets this user make the sandbox and a network namespace (a proxied
/// run of `true`, once per process); prints the SKIP line otherwise.
fn netns_ok(name: &str) -> bool {
    if !features_ok(name) {
        return false;
    }
    if !std::path::Path::new(PYTHON).exists() {
        common::skip(&format!("SKIP {name}: no {PYTHON}"));
        return false;
    }
    static PROBE: OnceLock<Option<String>> = OnceLock::new();
    let why = PROBE.get_or_init(|| {
        let ws = Ws::new("probe");
        let mut req = ws.req(&["true"]);
        req.proxy = Some(ProxyHandoff::new(drop));
        match ollie_sandbox::run(&proxied(), &req) {
            Err(SandboxError::Namespaces { source }) => {
                Some(format!("network namespaces cannot be created: {source}"))
            }
            _ => None,
        }
    });
    match why {
        None => true,
        Some(r) => {
            common::skip(&format!("SKIP {name}: {r}"));
            false
        }
    }
}

/// The tool side of the exchange: connects to the proxy's address, sends `tag`, prints the
/// line it gets back.
fn exchange_script(tag: &str) -> String {
    format!(
        "import socket\n\
         s = socket.create_connection(('127.0.0.1', 3128), timeout=20)\n\
         s.sendall(b'{tag}\\n')\n\
         print('got', s.makefile().readline().strip(), flush=True)\n"
    )
}

/// Accepts one connection on `l` (within 20 s), reads its first line and answers
/// `reply:LINE`; returns the line.
fn serve_one(l: &TcpListener) -> String {
    l.set_nonblocking(true).unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let (mut c, peer) = loop {
        match l.accept() {
            Ok(c) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("no connection on the proxy's listener: {e}"),
        }
    };
    assert!(peer.ip().is_loopback(), "{peer}");
    c.set_nonblocking(false).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut line = String::new();
    BufReader::new(&c).read_line(&mut line).unwrap();
    let line = line.trim().to_owned();
    c.write_all(format!("reply:{line}\n").as_bytes()).unwrap();
    line
}

/// Whether a connection is waiting on `l` (none may be).
fn nothing_waits(l: &TcpListener) -> bool {
    l.set_nonblocking(true).unwrap();
    matches!(l.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// The denial probe: prints `name result` per line (`ok` or the errno name). `canary` is a
/// port of a listener on the host's loopback.
fn denial_script(canary: u16) -> String {
    format!(
        r#"
import errno, os, socket
def e(f):
    try:
        f()
        return 'ok'
    except OSError as x:
        return errno.errorcode.get(x.errno, str(x.errno))
ifs = sorted(l.split(':')[0].strip() for l in open('/proc/self/net/dev').readlines()[2:])
print('ifs', ','.join(ifs))
print('udp', e(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)))
print('udp6', e(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)))
print('raw', e(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)))
print('unix', e(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)))
s = socket.socket()
print('bind', e(lambda: s.bind(('127.0.0.1', 0))))
s = socket.socket()
print('bind3128', e(lambda: s.bind(('127.0.0.1', 3128))))
s = socket.socket()
print('listen', e(lambda: s.listen(8)))
s = socket.socket()
s.settimeout(5)
print('canary', e(lambda: s.connect(('127.0.0.1', {canary}))))
if ifs == ['lo']:
    s = socket.socket()
    s.settimeout(5)
    print('far', e(lambda: s.connect(('192.0.2.1', 3128))))
else:
    print('far', 'not-isolated')
try:
    socket.getaddrinfo('example.com', 443)
    print('dns', 'ok')
except OSError as x:
    print('dns', 'failed')
conf = open('/etc/resolv.conf').read()
print('conf', 'proxy' in conf, any(l.split()[:1] == ['nameserver'] for l in conf.splitlines()))
for k in ['HTTP_PROXY', 'HTTPS_PROXY', 'ALL_PROXY', 'NO_PROXY', 'http_proxy', 'https_proxy', 'all_proxy', 'no_proxy']:
    print('env', k, os.environ.get(k))
"#
    )
}

/// Checks the denial probe's output: everything but the proxy is unreachable.
fn assert_denied(out: &RunOutput) {
    let stdout = text(&out.stdout);
    let got = |key: &str| -> String {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no {key} in {stdout:?} / {}", text(&out.stderr)))
            .to_owned()
    };
    assert_eq!(got("ifs"), "lo", "{stdout}");
    for k in ["udp", "udp6", "raw", "unix", "bind", "bind3128", "listen"] {
        assert_eq!(got(k), "EPERM", "{k}: {stdout}");
    }
    // Landlock refuses the port before the namespace could: nothing of the host is there.
    assert_ne!(got("canary"), "ok", "{stdout}");
    // No route in an empty namespace: refused at once, nothing leaves the machine.
    assert_eq!(got("far"), "ENETUNREACH", "{stdout}");
    assert_eq!(got("dns"), "failed", "{stdout}");
    // The resolver configuration says why there is none, and names no server.
    assert_eq!(got("conf"), "True False", "{stdout}");
    for (k, v) in ollie_sandbox::proxy_env() {
        assert!(stdout.contains(&format!("env {k} {v}\n")), "{k}: {stdout}");
    }
}

#[test]
fn a_one_shot_run_reaches_the_handed_listener_and_nothing_else() {
    let name = "a_one_shot_run_reaches_the_handed_listener_and_nothing_else";
    if !netns_ok(name) {
        return;
    }
    let ws = Ws::new("oneshot");
    let p = proxied();
    // A listener on the host's 127.0.0.1:3128, where it can be had: the tool's 127.0.0.1:3128
    // is the handed listener, never this one.
    let host_3128 = TcpListener::bind("127.0.0.1:3128").ok();
    let (handoff, rx) = ProxyHandoff::channel();
    let server = std::thread::spawn(move || {
        let l = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(l.local_addr().unwrap().to_string(), "127.0.0.1:3128");
        let line = serve_one(&l);
        (line, l)
    });
    let mut req = ws.python(&exchange_script("hello-from-tool"));
    req.proxy = Some(handoff);
    let o = ok(ollie_sandbox::run(&p, &req));
    let (line, listener) = server.join().unwrap();
    assert_eq!(line, "hello-from-tool");
    assert_eq!(
        text(&o.stdout),
        "got reply:hello-from-tool\n",
        "{}",
        text(&o.stderr)
    );
    assert_eq!(o.record.exit.code, Some(0));
    assert!(nothing_waits(&listener));
    match &host_3128 {
        Some(h) => assert!(
            nothing_waits(h),
            "the host's 127.0.0.1:3128 saw a connection"
        ),
        None => println!("{name}: 127.0.0.1:3128 is in use on the host; that check is left out"),
    }
    // The record: the mode, the run's own namespace, the proxy's address, the filters.
    let l = &o.record.layers;
    assert!(l.namespaces.contains(&"net"), "{:?}", l.namespaces);
    assert_eq!(l.network.mode, "proxy");
    assert_eq!(l.network.namespace, NetNamespace::Run);
    assert_eq!(l.network.proxy.as_deref(), Some("127.0.0.1:3128"));
    assert_eq!(l.landlock.port_rules, 1);
    assert!(l.landlock.handled_net.contains(&"connect_tcp"));
    let json = o.record.to_json();
    assert!(
        json.contains(r#""network":{"mode":"proxy","namespace":"run","proxy":"127.0.0.1:3128"}"#),
        "{json}"
    );
    assert_eq!(
        l.mounts.resolv_conf,
        std::fs::canonicalize("/etc/resolv.conf").ok()
    );

    // Denials, with a canary on the host's loopback that must see nothing.
    let canary = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = canary.local_addr().unwrap().port();
    let mut req = ws.python(&denial_script(port));
    req.proxy = Some(ProxyHandoff::new(drop));
    let o = ok(ollie_sandbox::run(&p, &req));
    assert_denied(&o);
    assert!(
        nothing_waits(&canary),
        "the host's loopback canary saw a connection"
    );
}

#[test]
fn a_proxied_run_without_a_receiver_is_refused() {
    if !features_ok("a_proxied_run_without_a_receiver_is_refused") {
        return;
    }
    let ws = Ws::new("refused");
    let e = ollie_sandbox::run(&proxied(), &ws.req(&["true"])).unwrap_err();
    assert!(
        matches!(&e, SandboxError::InvalidRequest { reason } if reason.contains("RunRequest::proxy")),
        "{e}"
    );
}

#[test]
fn concurrent_runs_get_a_listener_each() {
    if !netns_ok("concurrent_runs_get_a_listener_each") {
        return;
    }
    let ws = std::sync::Arc::new(Ws::new("concurrent"));
    let runs: Vec<_> = ["run-a", "run-b"]
        .into_iter()
        .map(|tag| {
            let ws = ws.clone();
            std::thread::spawn(move || {
                let (handoff, rx) = ProxyHandoff::channel();
                // Both tools wait for their answer: their connections are open at once.
                let server = std::thread::spawn(move || {
                    let l = rx.recv_timeout(Duration::from_secs(30)).unwrap();
                    let line = serve_one(&l);
                    (line, l)
                });
                let mut req = ws.python(&format!(
                    "import time\ntime.sleep(0.3)\n{}",
                    exchange_script(tag)
                ));
                req.proxy = Some(handoff);
                let o = ok(ollie_sandbox::run(&proxied(), &req));
                let (line, l) = server.join().unwrap();
                (tag, line, text(&o.stdout), nothing_waits(&l))
            })
        })
        .collect();
    for r in runs {
        let (tag, line, stdout, drained) = r.join().unwrap();
        assert_eq!(
            line, tag,
            "run {tag}'s connection arrived on another listener"
        );
        assert_eq!(stdout, format!("got reply:{tag}\n"));
        assert!(drained, "run {tag}'s listener saw a second connection");
    }
}

#[test]
fn prepared_calls_share_the_session_listener_and_nothing_else() {
    if !netns_ok("prepared_calls_share_the_session_listener_and_nothing_else") {
        return;
    }
    let ws = Ws::new("prepared");
    let sb = ws.prepare(&proxied());
    let l = sb.take_proxy_listener().expect("the session's listener");
    assert!(sb.take_proxy_listener().is_none(), "handed out once");
    assert_eq!(l.local_addr().unwrap().to_string(), "127.0.0.1:3128");
    assert!(
        sb.session()
            .set_up_once
            .iter()
            .any(|s| s.starts_with("network namespace")),
        "{:?}",
        sb.session().set_up_once
    );
    // Two calls, one after the other, both on the session's listener.
    for tag in ["call-1", "call-2"] {
        let server = std::thread::scope(|s| {
            let h = s.spawn(|| serve_one(&l));
            let o = ok(sb.run(&ws.python(&exchange_script(tag))));
            assert_eq!(
                text(&o.stdout),
                format!("got reply:{tag}\n"),
                "{}",
                text(&o.stderr)
            );
            let n = &o.record.layers;
            assert!(
                n.namespaces.contains(&"net (session, inherited)"),
                "{:?}",
                n.namespaces
            );
            assert_eq!(n.network.namespace, NetNamespace::Session);
            assert_eq!(n.network.proxy.as_deref(), Some("127.0.0.1:3128"));
            h.join().unwrap()
        });
        assert_eq!(server, tag);
    }
    assert!(nothing_waits(&l));
    // Denials, as in one-shot runs.
    let canary = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = canary.local_addr().unwrap().port();
    let o = ok(sb.run(&ws.python(&denial_script(port))));
    assert_denied(&o);
    assert!(
        nothing_waits(&canary),
        "the host's loopback canary saw a connection"
    );
    assert!(nothing_waits(&l));
    // A call cannot ask for a listener of its own.
    let mut req = ws.req(&["true"]);
    req.proxy = Some(ProxyHandoff::new(drop));
    let e = sb.run(&req).unwrap_err();
    assert!(
        e.to_string().contains("one proxy listener per session"),
        "{e}"
    );
}

#[test]
fn other_modes_keep_the_host_network_namespace() {
    if !netns_ok("other_modes_keep_the_host_network_namespace") {
        return;
    }
    let ws = Ws::new("host");
    // network.mode = "tcp" to a port of a listener on the host's loopback: it connects there.
    let canary = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = canary.local_addr().unwrap().port();
    let mut p = proxied();
    p.network = Network::Tcp {
        connect: [port].into(),
        bind: Default::default(),
    };
    let o = ok(ollie_sandbox::run(
        &p,
        &ws.python(&format!(
            "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)\nprint('connected')"
        )),
    ));
    assert_eq!(text(&o.stdout), "connected\n", "{}", text(&o.stderr));
    canary.set_nonblocking(true).unwrap();
    assert!(
        canary.accept().is_ok(),
        "the host's listener saw no connection"
    );
    let l = &o.record.layers;
    assert!(
        !l.namespaces.iter().any(|n| n.starts_with("net")),
        "{:?}",
        l.namespaces
    );
    assert_eq!(
        (l.network.mode, l.network.namespace, l.network.proxy.clone()),
        ("tcp", NetNamespace::Host, None)
    );
    assert_eq!(l.mounts.resolv_conf, None);
    // No proxy variables outside the proxy mode (the runner's own never pass).
    assert!(
        !o.record
            .env_names
            .iter()
            .any(|n| n.eq_ignore_ascii_case("https_proxy"))
    );
    // The same for a prepared session (network off).
    p.network = Network::Off;
    let sb = ws.prepare(&p);
    assert!(sb.take_proxy_listener().is_none());
    let o = ok(sb.run(&ws.req(&["true"])));
    let l = &o.record.layers;
    assert!(
        !l.namespaces.iter().any(|n| n.starts_with("net")),
        "{:?}",
        l.namespaces
    );
    assert_eq!(l.network.namespace, NetNamespace::Host);
}

/// The cost of the network namespace: the wall time of a one-shot run of `true`, plain
/// (network off) and proxied, of `Prepared::new`, and of a prepared call of each, the two
/// kinds interleaved (so load on the machine falls on both alike); the minimum and the
/// median of each are printed, not asserted.
#[test]
fn spawn_cost_of_a_proxied_run() {
    if !netns_ok("spawn_cost_of_a_proxied_run") {
        return;
    }
    const N: usize = 21;
    let ws = Ws::new("cost");
    let mut plain = proxied();
    plain.network = Network::Off;
    let proxy = proxied();
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        start.elapsed()
    };
    // (plain, proxied) samples of one step, interleaved.
    let pairs = |f: &mut dyn FnMut(&Policy)| -> [String; 2] {
        let mut t: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..N {
            t[0].push(time(&mut || f(&plain)));
            t[1].push(time(&mut || f(&proxy)));
        }
        t.map(|mut v| {
            v.sort();
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            format!("{:.2}/{:.2}", ms(v[0]), ms(v[N / 2]))
        })
    };
    let mut req = ws.req(&["true"]);
    req.proxy = Some(ProxyHandoff::new(drop));
    let one_shot = pairs(&mut |p| drop(ok(ollie_sandbox::run(p, &req))));
    let new = pairs(&mut |p| drop(ws.prepare(p)));
    let sb = [ws.prepare(&plain), ws.prepare(&proxy)];
    let call = pairs(&mut |p| {
        let i = usize::from(p.network != Network::Off);
        drop(ok(sb[i].run(&ws.req(&["true"]))));
    });
    println!(
        "proxy netns cost (min/median of {N}, ms): one-shot run plain {}, proxied {}; \
         Prepared::new plain {}, proxied {}; prepared call plain {}, proxied {}",
        one_shot[0], one_shot[1], new[0], new[1], call[0], call[1]
    );
}
