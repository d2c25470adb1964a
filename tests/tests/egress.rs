//! Egress by domain (docs/egress.md, issue 50) through the real toolsrv: tools under
//! `network.mode = "proxy"` reach origins the test starts on loopback only through the
//! run's proxy, with real clients — curl, pip, npm and git — and everything else is refused
//! with nothing reaching an origin.
//!
//! Every origin is the test's own on `127.0.0.1` (one HTTPS origin with a test CA's
//! certificate for the test names, one plain HTTP origin, both serving static files from one
//! directory; `egress/origin.rs`), and toolsrv's boot message pins every test name to a
//! loopback address (`proxy.resolve`, with `proxy.allow_addresses = ["127.0.0.1/32"]`), so
//! no name is ever looked up in DNS and no packet leaves the machine; canaries on
//! `127.0.0.1`/`127.0.0.2` stand where a refused connection would have gone. The CA's
//! certificate is in the workspace and the test policies point `SSL_CERT_FILE`,
//! `CURL_CA_BUNDLE`, `PIP_CERT`, `NODE_EXTRA_CA_CERTS` and `GIT_SSL_CAINFO` at it
//! (`[env] set`); the proxy variables are the sandbox's own.
//!
//! Covers: curl over HTTPS (CONNECT) and plain HTTP; `pip install` of a wheel from a local
//! simple index; `npm install` from a local registry; `git clone` over the dumb HTTP
//! protocol; refusals (a name not listed, a denied wildcard, NUL and `%00` in the name, a
//! port not listed, a pinned loopback address without `allow_addresses`, names rebinding to
//! loopback or unspecified addresses outside it), each a 403/400 naming the host and no
//! connection at the origin; net escalations approved (once, and for the session) and
//! denied, the request showing domain, port and command; the `net` events on `bypass/log`;
//! two sessions that cannot reach each other's proxy; no resolver and no UDP under the proxy
//! mode; and the resolver files readable where a run has the host's network.
//!
//! Without Landlock ABI 7, user or network namespaces, or a client (curl, pip, npm, git), a
//! test prints `SKIP <test>: <reason>` and returns; with `OLLIE_TEST_REQUIRE=all` it fails
//! instead. Every wait is bounded; nothing sleeps to synchronise.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "egress/origin.rs"]
mod origin;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::broker::*;
use common::toolsrv::*;
use common::{IO_TIMEOUT, STEP, within};
use ollie_link::boot::Bootstrap;
use ollie_p9::Fid;
use ollie_p9::wire::om;
use origin::{Canary, Origin, Tls};
use serde_json::{Value, json};

/// The names the HTTPS origin's certificate holds.
const CERT_NAMES: &[&str] = &[
    "pypi.test",
    "registry.test",
    "git.test",
    "other.test",
    "asked.test",
    "plain.test",
    "y.corp.test",
];

/// Names pinned to loopback addresses that `127.0.0.1/32` does not cover (rebinding).
const REBINDING: &[(&str, &str)] = &[
    ("rebind.test", "127.0.0.2"),
    ("mapped.test", "::ffff:127.0.0.2"),
    ("zero.test", "0.0.0.0"),
];

/// What the `proxied` policy allows: the names the clients use, the [`REBINDING`] names,
/// and a wildcard whose `*.bad.corp.test` part it denies (a one-label wildcard such as
/// `*.test` is refused as too broad).
const ALLOWED: &[&str] = &[
    "pypi.test",
    "registry.test",
    "git.test",
    "plain.test",
    "rebind.test",
    "mapped.test",
    "zero.test",
    "*.corp.test",
];

/// `"a", "b"`: a TOML list's items.
fn quoted(items: &[&str]) -> String {
    items
        .iter()
        .map(|i| format!("{i:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The CA certificate's name in the workspace.
const CA_FILE: &str = "ca.pem";

/// The longest one tool call may take (the test policies' `timeout_seconds` is 90).
const TOOL_TIMEOUT: Duration = Duration::from_secs(100);

/// The directories the test policies' `PATH` names, in order.
const TOOL_PATH: &[&str] = &["/usr/local/bin", "/usr/bin", "/bin"];

// ---------------------------------------------------------------------------------------------
// The world: origins, policies, toolsrv

/// A toolsrv whose policies reach the test's origins, with agent `a` and the operator
/// attached.
struct World {
    t: Ts,
    a: Fid,
    op: Fid,
    /// The HTTPS origin.
    tls: Origin,
    /// The plain HTTP origin.
    plain: Origin,
    /// A port the policies list where nothing listens.
    dead: u16,
    /// The origins' document root (beside the workspace).
    srv: PathBuf,
}

/// The shipped workspace policy with `network` for its `[network]` section, `escalations`
/// for its `[escalations]`, the CA variables set and a 90 s timeout. It also sets
/// `HTTPS_PROXY` and `no_proxy`, which the sandbox must replace under the proxy mode.
fn policy(network: &str, escalations: &str) -> String {
    let ca = format!("{{workdir}}/{CA_FILE}");
    let set = format!(
        "set = {{ PATH = \"{}\", HOME = \"{{workdir}}\", SSL_CERT_FILE = \"{ca}\", \
         CURL_CA_BUNDLE = \"{ca}\", PIP_CERT = \"{ca}\", REQUESTS_CA_BUNDLE = \"{ca}\", \
         NODE_EXTRA_CA_CERTS = \"{ca}\", GIT_SSL_CAINFO = \"{ca}\", npm_config_cafile = \"{ca}\", \
         npm_config_cache = \"{{workdir}}/.npm\", npm_config_update_notifier = \"false\", \
         npm_config_fetch_retries = \"0\", \
         PIP_DISABLE_PIP_VERSION_CHECK = \"1\", PIP_NO_INPUT = \"1\", \
         HTTPS_PROXY = \"http://127.0.0.2:9\", no_proxy = \"*\" }}",
        TOOL_PATH.join(":")
    );
    let mut text = WORKSPACE_TOML.to_owned();
    for (from, to) in [
        ("[network]\nmode = \"off\"\n", network),
        (
            "set = { PATH = \"/usr/local/bin:/usr/bin:/bin\", HOME = \"{workdir}\" }",
            set.as_str(),
        ),
        (
            "[escalations]\nallow = [\"net\", \"read\", \"write\"]",
            escalations,
        ),
        ("timeout_seconds = 120", "timeout_seconds = 90"),
    ] {
        assert!(text.contains(from), "the workspace policy has no {from:?}");
        text = text.replace(from, to);
    }
    text
}

/// The test policies for origins on `ports`:
/// - `proxied`: proxy mode, [`ALLOWED`] allowed but `*.bad.corp.test`, no escalations;
/// - `asking`: proxy mode, only `pypi.test` allowed (and `*.bad.corp.test` denied), net
///   escalations allowed;
/// - `all`: `mode = "all"` (the host's network), no escalations;
/// - `tcp`: `mode = "tcp"` with port 443, no escalations.
fn test_policies(ports: &[u16]) -> Vec<(&'static str, String)> {
    let ports = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let proxy = |allow: &str| {
        format!(
            "[network]\nmode = \"proxy\"\nallow_domains = [{allow}]\ndeny_domains = [\"*.bad.corp.test\"]\nports = [{ports}]\n"
        )
    };
    vec![
        (
            "proxied",
            policy(&proxy(&quoted(ALLOWED)), "[escalations]\nallow = []"),
        ),
        (
            "asking",
            policy(&proxy("\"pypi.test\""), "[escalations]\nallow = [\"net\"]"),
        ),
        (
            "all",
            policy("[network]\nmode = \"all\"\n", "[escalations]\nallow = []"),
        ),
        (
            "tcp",
            policy(
                "[network]\nmode = \"tcp\"\nconnect = [443]\n",
                "[escalations]\nallow = []",
            ),
        ),
    ]
}

/// Every name the tests use pinned to an address: the certificate's names and
/// `other.example` to 127.0.0.1, the [`REBINDING`] names to theirs.
fn pins() -> BTreeMap<String, Vec<String>> {
    let mut p = BTreeMap::new();
    for n in CERT_NAMES
        .iter()
        .chain(&["x.bad.corp.test", "other.example"])
    {
        p.insert((*n).to_owned(), vec!["127.0.0.1".to_owned()]);
    }
    for (n, a) in REBINDING {
        p.insert((*n).to_owned(), vec![(*a).to_owned()]);
    }
    p
}

impl World {
    /// Starts the origins and a toolsrv whose agents run under `default` (one of
    /// [`test_policies`] or a shipped one), its proxy pinning [`pins`] and allowing
    /// 127.0.0.1/32; `tweak` may change the boot message. `None` (after a SKIP line) when the
    /// kernel lacks what a proxied run needs.
    async fn start(case: &str, default: &str, tweak: impl FnOnce(&mut Bootstrap)) -> Option<World> {
        if !features_ok(case) {
            return None;
        }
        let dirs = Dirs::new();
        let srv = dirs.dir.path().join("srv");
        std::fs::create_dir(&srv).unwrap();
        std::fs::write(srv.join("hello.txt"), "hello from the origin\n").unwrap();
        let tls = Tls::new(CERT_NAMES);
        std::fs::write(dirs.ws.join(CA_FILE), &tls.ca_pem).unwrap();
        let https = Origin::https(&srv, &tls).await;
        let plain = Origin::http(&srv).await;
        let dead = common::free_port();
        let mut boot = dirs.boot();
        for (name, text) in test_policies(&[https.port, plain.port, dead]) {
            boot.policies.insert(name.to_owned(), text);
        }
        boot.default_policy = default.to_owned();
        boot.env = vec![("LANG".into(), "C.UTF-8".into())];
        boot.proxy.resolve = pins();
        boot.proxy.allow_addresses = vec!["127.0.0.1/32".into()];
        tweak(&mut boot);
        let t = Ts::start_with(dirs, &boot).await;
        let a = t.attach("a").await;
        let op = t.attach("operator").await;
        let w = World {
            t,
            a,
            op,
            tls: https,
            plain,
            dead,
            srv,
        };
        w.netns_ok(case).await.then_some(w)
    }

    /// [`World::start`] for `case` under `default` with nothing changed, once [`clients`]
    /// found every client in `needs`.
    async fn for_case(case: &str, needs: &[&str], default: &str) -> Option<World> {
        if !clients(case, needs) {
            return None;
        }
        World::start(case, default, |_| {}).await
    }

    /// Whether a proxied run can be made here (network namespaces); prints the SKIP line,
    /// or fails under the rule, when it cannot.
    async fn netns_ok(&self, case: &str) -> bool {
        let r = run(
            &self.a,
            &tool("execute_code", json!({"language": "bash", "code": "true"})),
        )
        .await;
        let why = match r {
            Ok(r) if r.exit() == Some(0) => return true,
            Ok(r) => r.raw,
            Err(e) => e,
        };
        if !why.contains("namespace") {
            panic!("{case}: a trivial run failed: {why}");
        }
        ollie_testkit::skip_or_fail(
            case,
            &format!("a proxied run cannot be made: {why}"),
            &format!("{case}: required kernel feature missing: {why}"),
        )
    }

    fn ws(&self) -> &Path {
        self.t.ws()
    }

    /// `https://NAME:PORT/PATH` on the HTTPS origin.
    fn https(&self, name: &str, path: &str) -> String {
        format!("https://{name}:{}/{path}", self.tls.port)
    }

    /// `http://NAME:PORT/PATH` on the plain origin.
    fn http(&self, name: &str, path: &str) -> String {
        format!("http://{name}:{}/{path}", self.plain.port)
    }

    /// Runs bash `code` as agent `a` (bounded by [`TOOL_TIMEOUT`]).
    async fn sh(&self, code: &str) -> Run {
        call(&self.a, code)
            .await
            .unwrap_or_else(|e| panic!("{code}: {e}"))
    }
}

/// A blocking `proc/new` of bash `code` as the agent of `root`, bounded by [`TOOL_TIMEOUT`]
/// (pip and npm may take longer than one 9P step's bound).
async fn call(root: &Fid, code: &str) -> Result<Run, String> {
    let payload = tool("execute_code", json!({"language": "bash", "code": code}));
    let f = open(root, "proc/new", om::ORDWR).await?;
    within("write", f.write(0, Bytes::from(payload)))
        .await
        .map_err(|e| msg(&e))?;
    let d = tokio::time::timeout(TOOL_TIMEOUT, f.read_to_end())
        .await
        .unwrap_or_else(|_| panic!("{code}: no result within {TOOL_TIMEOUT:?}"))
        .map_err(|e| msg(&e))?;
    let _ = within("clunk", f.clunk()).await;
    Ok(Run::parse(&String::from_utf8_lossy(&d)))
}

/// A curl command line fetching `url` that ends its output with
/// `http_code=N connect=N` (the origin's status and the proxy's CONNECT answer).
fn curl(url: &str) -> String {
    curl_with("", url)
}

/// [`curl`] with more options (`opts`, as bash words).
fn curl_with(opts: &str, url: &str) -> String {
    format!(
        "curl -sS --max-time 60 {opts} -w '\\nhttp_code=%{{http_code}} connect=%{{http_connect}}\\n' {url}"
    )
}

/// Bash running a Python script from a heredoc, with `{ARG}` in it replaced by `arg`.
fn python(script: &str, arg: &str) -> String {
    format!("python3 - <<'EOF'\n{}\nEOF", script.replace("{ARG}", arg))
}

/// Sends the bytes whose hex is `{ARG}` to the run's proxy and prints the answer (the proxy
/// closes after a refusal).
const RAW_REQUEST_PY: &str = r#"import socket
s = socket.create_connection(('127.0.0.1', 3128), timeout=20)
s.sendall(bytes.fromhex('{ARG}'))
data = b''
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
print(data.decode('utf-8', 'replace'))"#;

/// Bash sending `request` as raw bytes to the run's proxy and printing the answer.
fn raw_request(request: &[u8]) -> String {
    let hex: String = request.iter().map(|b| format!("{b:02x}")).collect();
    python(RAW_REQUEST_PY, &hex)
}

// ---------------------------------------------------------------------------------------------
// Clients and skips

/// The first `name` on the tools' PATH.
fn program(name: &str) -> Option<PathBuf> {
    TOOL_PATH
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Whether every client in `needs` is there for the tools (`pip` means `python3 -m pip`,
/// `git-https` git's HTTPS helper); prints the SKIP line (or fails under the rule) when one
/// is missing.
fn clients(case: &str, needs: &[&str]) -> bool {
    for n in needs {
        let missing = match *n {
            "pip" => match program("python3") {
                None => Some("no python3 on the tools' PATH".to_owned()),
                Some(py) => {
                    let ok = Command::new(py)
                        .args(["-m", "pip", "--version"])
                        .output()
                        .is_ok_and(|o| o.status.success());
                    (!ok).then(|| "python3 -m pip does not run (apt install python3-pip)".into())
                }
            },
            "git-https" => match program("git") {
                None => Some("no git on the tools' PATH".to_owned()),
                Some(git) => {
                    let exec = Command::new(git).arg("--exec-path").output().ok();
                    let dir = exec.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
                    let ok = dir.is_some_and(|d| Path::new(&d).join("git-remote-https").exists());
                    (!ok).then(|| "git has no git-remote-https".into())
                }
            },
            other => program(other)
                .is_none()
                .then(|| format!("no {other} on the tools' PATH (scripts/deps.sh installs it)")),
        };
        if let Some(why) = missing {
            return ollie_testkit::skip_or_fail(
                case,
                &why,
                &format!("{case}: required client missing: {why}"),
            );
        }
    }
    true
}

/// Runs a host command (fixtures), failing with its output.
fn host(cmd: &mut Command) {
    let out = common::run(cmd, b"");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        common::text(&out.stdout),
        common::text(&out.stderr)
    );
}

/// Writes the pip or npm fixture under `srv` (`egress/fixtures.py`).
fn fixture(srv: &Path, port: u16, what: &str) {
    let script = srv.join(".fixtures.py");
    std::fs::write(&script, include_str!("egress/fixtures.py")).unwrap();
    let py = program("python3").expect("python3");
    host(
        Command::new(py)
            .arg(&script)
            .arg(srv)
            .arg(port.to_string())
            .arg(what),
    );
    std::fs::remove_file(&script).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Events

/// The `net` events on `bypass/log` now.
async fn net_events(op: &Fid) -> Vec<Value> {
    log_events(op)
        .await
        .into_iter()
        .filter(|e| e["event"] == "net")
        .collect()
}

/// Polls `bypass/log` until `n` `net` events are there (bounded); returns them all.
async fn wait_net_events(op: &Fid, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let ev = net_events(op).await;
        if ev.len() >= n {
            return ev;
        }
        assert!(
            Instant::now() < deadline,
            "{} net events, not {n}: {ev:?}",
            ev.len()
        );
        tokio::time::sleep(STEP).await;
    }
}

/// The one event for `domain` (fails if there is not exactly one).
fn event_for<'a>(ev: &'a [Value], domain: &str) -> &'a Value {
    let m: Vec<&Value> = ev.iter().filter(|e| e["domain"] == domain).collect();
    assert_eq!(m.len(), 1, "events for {domain}: {ev:?}");
    m[0]
}

/// Checks the fields every event has: the agent, a call id, the command, the method, the
/// counters and the times.
fn check_event_shape(e: &Value) {
    assert_eq!(e["agent"], "a", "{e}");
    assert!(
        e["call"].as_str().is_some_and(|c| c.parse::<u32>().is_ok()),
        "{e}"
    );
    assert!(e["command"].is_string(), "{e}");
    assert!(e["method"].is_string(), "{e}");
    for k in ["port", "bytes_up", "bytes_down", "duration_ms", "time_ms"] {
        assert!(e[k].is_u64(), "{k}: {e}");
    }
    assert!(e["time"].is_string(), "{e}");
}

// ---------------------------------------------------------------------------------------------
// (1) curl, HTTPS and plain HTTP

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reaches_allowed_names_over_https_and_plain_http() {
    let case = "curl_reaches_allowed_names_over_https_and_plain_http";
    let Some(w) = World::for_case(case, &["curl"], "proxied").await else {
        return;
    };
    let r = w
        .sh(&format!(
            "{}\n{}\n{}\nenv | grep -i '^https_proxy=\\|^no_proxy='",
            curl(&w.https("pypi.test", "hello.txt")),
            curl(&w.http("plain.test", "hello.txt")),
            // Under the wildcard whose *.bad.corp.test part is denied.
            curl(&w.https("y.corp.test", "hello.txt"))
        ))
        .await;
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert_eq!(
        r.body.matches("hello from the origin\n").count(),
        3,
        "{r:?}"
    );
    assert!(r.body.contains("http_code=200 connect=200"), "{r:?}");
    assert!(r.body.contains("http_code=200 connect=000"), "{r:?}");
    // The sandbox's proxy variables, not the policy's.
    for v in [
        "HTTPS_PROXY=http://127.0.0.1:3128",
        "https_proxy=http://127.0.0.1:3128",
        "no_proxy=localhost,127.0.0.1,::1",
        "NO_PROXY=localhost,127.0.0.1,::1",
    ] {
        assert!(r.body.contains(&format!("{v}\n")), "{v}: {r:?}");
    }
    assert!(
        !r.body.contains("127.0.0.2:9") && !r.body.contains("no_proxy=*"),
        "{r:?}"
    );
    // The origins saw exactly these requests, by these names.
    let tls = w.tls.requests();
    assert_eq!(tls.len(), 2, "{}", w.tls.report());
    for (seen, name) in tls.iter().zip(["pypi.test", "y.corp.test"]) {
        assert_eq!(seen.sni.as_deref(), Some(name), "{}", w.tls.report());
        assert_eq!(
            (seen.host.as_str(), seen.path.as_str()),
            (name, "/hello.txt")
        );
    }
    let plain = w.plain.requests();
    assert_eq!(plain.len(), 1, "{}", w.plain.report());
    assert_eq!(
        (plain[0].host.as_str(), plain[0].path.as_str()),
        ("plain.test", "/hello.txt")
    );

    // (12) One net event each, as the documentation lists them.
    let ev = wait_net_events(&w.op, 3).await;
    assert_eq!(ev.len(), 3, "{ev:?}");
    let wild = event_for(&ev, "y.corp.test");
    assert_eq!(wild["verdict"], "allowed", "{wild}");
    // (A tunnel's reason may go on with how it ended: a client that closes with bytes
    // unread resets it.)
    assert!(
        wild["reason"]
            .as_str()
            .unwrap()
            .starts_with("allowed by *.corp.test"),
        "{wild}"
    );
    let https = event_for(&ev, "pypi.test");
    check_event_shape(https);
    assert_eq!(https["method"], "CONNECT", "{https}");
    assert_eq!(https["port"], w.tls.port, "{https}");
    assert_eq!(https["verdict"], "allowed", "{https}");
    // (A tunnel's reason may go on with how it ended: a client that closes with bytes
    // unread resets it.)
    assert!(
        https["reason"]
            .as_str()
            .unwrap()
            .starts_with("allowed by pypi.test"),
        "{https}"
    );
    assert_eq!(
        https["address"],
        format!("127.0.0.1:{}", w.tls.port),
        "{https}"
    );
    assert!(
        https["command"].as_str().unwrap().starts_with("curl "),
        "{https}"
    );
    // The tunnel carried the TLS handshake and the request both ways.
    let body_len = "hello from the origin\n".len() as u64;
    assert!(https["bytes_up"].as_u64().unwrap() > 100, "{https}");
    assert!(https["bytes_down"].as_u64().unwrap() > body_len, "{https}");
    let http = event_for(&ev, "plain.test");
    check_event_shape(http);
    assert_eq!(http["method"], "GET", "{http}");
    assert_eq!(http["port"], w.plain.port, "{http}");
    assert_eq!(http["verdict"], "allowed", "{http}");
    assert_eq!(http["bytes_down"], body_len, "{http}");
    assert_eq!(
        http["call"], https["call"],
        "one tool call made both: {ev:?}"
    );

    // A name is normalised before it is decided (case, one trailing dot), and the TLS
    // server name check agrees.
    let r = w
        .sh(&curl(&format!(
            "https://PyPI.Test.:{}/hello.txt",
            w.tls.port
        )))
        .await;
    assert!(r.body.contains("hello from the origin"), "{r:?}");
    let ev = wait_net_events(&w.op, 4).await;
    assert_eq!(ev[3]["domain"], "pypi.test", "{:?}", ev[3]);
    assert_eq!(ev[3]["verdict"], "allowed", "{:?}", ev[3]);

    // The run record says the tool had a namespace of its own with the proxy in it.
    let rec = read(&w.a, &format!("proc/{}/record", r.pid()))
        .await
        .unwrap();
    let rec: Value = serde_json::from_str(&rec).unwrap_or_else(|e| panic!("{e}: {rec}"));
    let net = &rec["layers"]["network"];
    assert_eq!(net["mode"], "proxy", "{rec}");
    assert_eq!(net["namespace"], "run", "{rec}");
    assert_eq!(net["proxy"], "127.0.0.1:3128", "{rec}");
}

// ---------------------------------------------------------------------------------------------
// (2) pip, (3) npm, (4) git

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pip_installs_a_wheel_from_a_local_index() {
    let case = "pip_installs_a_wheel_from_a_local_index";
    let Some(w) = World::for_case(case, &["pip"], "proxied").await else {
        return;
    };
    fixture(&w.srv, w.tls.port, "pip");
    let r = w
        .sh(&format!(
            "python3 -m pip install --index-url {} --no-deps --target site ollie-demo 2>&1; echo pip=$?\n\
             cd site && python3 -c 'import ollie_demo; print(ollie_demo.VALUE)'",
            w.https("pypi.test", "simple/")
        ))
        .await;
    assert!(r.body.contains("pip=0"), "{r:?}");
    assert!(r.body.contains("from the local index"), "{r:?}");
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(w.ws().join("site/ollie_demo/__init__.py")).unwrap(),
        "VALUE = \"from the local index\"\n"
    );
    let paths: Vec<String> = w.tls.requests().iter().map(|s| s.path.clone()).collect();
    assert!(
        paths.iter().any(|p| p == "/simple/ollie-demo/")
            && paths
                .iter()
                .any(|p| p == "/files/ollie_demo-1.0-py3-none-any.whl"),
        "{}",
        w.tls.report()
    );
    assert!(
        w.tls
            .requests()
            .iter()
            .all(|s| s.sni.as_deref() == Some("pypi.test")),
        "{}",
        w.tls.report()
    );
    let ev = net_events(&w.op).await;
    assert!(!ev.is_empty());
    for e in &ev {
        assert_eq!(
            (&e["domain"], &e["verdict"], &e["method"]),
            (&json!("pypi.test"), &json!("allowed"), &json!("CONNECT")),
            "{e}"
        );
        assert!(
            e["command"]
                .as_str()
                .unwrap()
                .starts_with("python3 -m pip install"),
            "{e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npm_installs_from_a_local_registry() {
    let case = "npm_installs_from_a_local_registry";
    let Some(w) = World::for_case(case, &["npm", "node"], "proxied").await else {
        return;
    };
    fixture(&w.srv, w.tls.port, "npm");
    let r = w
        .sh(&format!(
            "npm install --no-audit --no-fund --registry {} ollie-demo 2>&1; echo npm=$?\n\
             node -e 'console.log(require(\"ollie-demo\"))'",
            w.https("registry.test", "")
        ))
        .await;
    assert!(r.body.contains("npm=0"), "{r:?}");
    assert!(r.body.contains("from the local registry"), "{r:?}");
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert!(w.ws().join("node_modules/ollie-demo/index.js").is_file());
    let seen = w.tls.requests();
    for p in ["/ollie-demo", "/ollie-demo/-/ollie-demo-1.0.0.tgz"] {
        assert!(
            seen.iter().any(|s| s.path == p
                && s.sni.as_deref() == Some("registry.test")
                && s.status == 200),
            "{p}: {}",
            w.tls.report()
        );
    }
    let ev = net_events(&w.op).await;
    assert!(
        ev.iter()
            .any(|e| e["domain"] == "registry.test" && e["verdict"] == "allowed"),
        "{ev:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_clones_over_dumb_http() {
    let case = "git_clones_over_dumb_http";
    let Some(w) = World::for_case(case, &["git", "git-https"], "proxied").await else {
        return;
    };
    // A bare repository with one commit, served as static files.
    let src = w.t.dirs.dir.path().join("src");
    let git = |args: &[&str], dir: &Path| {
        host(
            Command::new(program("git").unwrap())
                .args(["-c", "user.name=ollie", "-c", "user.email=ollie@test"])
                .args(args)
                .current_dir(dir)
                .env("HOME", w.t.dirs.dir.path())
                .env("GIT_CONFIG_NOSYSTEM", "1"),
        );
    };
    std::fs::create_dir(&src).unwrap();
    git(&["init", "-q", "-b", "main"], &src);
    std::fs::write(src.join("README"), "cloned through the proxy\n").unwrap();
    git(&["add", "README"], &src);
    git(&["commit", "-q", "-m", "first"], &src);
    git(
        &["clone", "-q", "--bare", "src", "srv/repo.git"],
        w.t.dirs.dir.path(),
    );
    git(&["update-server-info"], &w.srv.join("repo.git"));

    let r = w
        .sh(&format!(
            "git clone {} clone 2>&1; echo git=$?\ncat clone/README",
            w.https("git.test", "repo.git")
        ))
        .await;
    assert!(r.body.contains("git=0"), "{r:?}");
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(w.ws().join("clone/README")).unwrap(),
        "cloned through the proxy\n"
    );
    let seen = w.tls.requests();
    assert!(
        seen.iter()
            .any(|s| s.path == "/repo.git/info/refs" && s.sni.as_deref() == Some("git.test")),
        "{}",
        w.tls.report()
    );
    let ev = net_events(&w.op).await;
    assert!(
        ev.iter()
            .all(|e| e["domain"] == "git.test" && e["verdict"] == "allowed"),
        "{ev:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// (5)–(10) Refusals: the origin sees nothing

/// Opens a tunnel to `{ARG}` through the run's proxy and starts TLS in it naming
/// `other.test` (whose certificate the origin has too).
const FRONTED_PY: &str = r#"import socket, ssl
s = socket.create_connection(('127.0.0.1', 3128), timeout=20)
s.sendall(b'CONNECT {ARG} HTTP/1.1\r\nHost: {ARG}\r\n\r\n')
print(s.recv(4096).decode().splitlines()[0])
ctx = ssl.create_default_context(cafile='ca.pem')
try:
    t = ctx.wrap_socket(s, server_hostname='other.test')
    t.sendall(b'GET /hello.txt HTTP/1.1\r\nHost: other.test\r\n\r\n')
    print('fronted:', t.recv(4096))
except OSError as e:
    print('tls failed:', type(e).__name__)"#;

/// One refused request: the bash code making it, what its output must hold, and the event
/// it must leave (domain, port, verdict, a piece of the reason).
struct Refused {
    name: &'static str,
    code: String,
    output: Vec<String>,
    event: Option<(String, u16, &'static str, String)>,
    /// Refused after the proxy connected to the origin (a TLS server name checked in the
    /// tunnel): the origin may see a connection, but no byte of it (no handshake, no
    /// request).
    after_connect: bool,
}

impl Refused {
    fn new(
        name: &'static str,
        code: String,
        output: Vec<String>,
        event: Option<(String, u16, &'static str, String)>,
    ) -> Refused {
        Refused {
            name,
            code,
            output,
            event,
            after_connect: false,
        }
    }
}

/// Runs each refusal in its own tool call and checks its output, that the origins and
/// canaries saw nothing, and its event.
async fn check_refusals(w: &World, cases: Vec<Refused>, canaries: &[&Canary]) {
    let mut table = ollie_testkit::cases::Cases::new();
    for c in cases {
        let before = (w.tls.connections(), w.plain.connections());
        let seen_before = (
            w.tls.handshakes(),
            w.tls.requests().len(),
            w.plain.requests().len(),
        );
        let events_before = net_events(&w.op).await.len();
        let r = w.sh(&c.code).await;
        let mut problems = Vec::new();
        for o in &c.output {
            if !r.body.contains(o.as_str()) {
                problems.push(format!("{o:?} not in the output {:?}", r.body));
            }
        }
        let seen = (
            w.tls.handshakes(),
            w.tls.requests().len(),
            w.plain.requests().len(),
        );
        if seen != seen_before
            || (!c.after_connect && (w.tls.connections(), w.plain.connections()) != before)
        {
            problems.push(format!(
                "an origin was reached: {} / {}",
                w.tls.report(),
                w.plain.report()
            ));
        }
        for k in canaries {
            if k.connections() != 0 {
                problems.push(format!("the canary at {} was reached", k.addr));
            }
        }
        if let Some((domain, port, verdict, reason)) = &c.event {
            let ev = wait_net_events(&w.op, events_before + 1).await;
            let new = &ev[events_before..];
            match new.iter().find(|e| e["domain"] == domain.as_str()) {
                None => problems.push(format!("no event for {domain}: {new:?}")),
                Some(e) => {
                    check_event_shape(e);
                    let got_reason = e["reason"].as_str().unwrap_or("");
                    let unconnected =
                        e["address"] == Value::Null && e["bytes_up"] == 0 && e["bytes_down"] == 0;
                    if e["port"] != *port
                        || e["verdict"] != *verdict
                        || !got_reason.contains(reason.as_str())
                        || !(unconnected || c.after_connect)
                        || e["bytes_up"] != 0
                    {
                        problems.push(format!(
                            "event {e}, not {domain}:{port} {verdict} ({reason}), unconnected"
                        ));
                    }
                }
            }
        }
        table.check(c.name, &c.code, problems);
    }
    table.finish();
}

/// The event a refusal must leave: domain, port, verdict and a piece of the reason.
fn expect(
    domain: &str,
    port: u16,
    verdict: &'static str,
    reason: &str,
) -> Option<(String, u16, &'static str, String)> {
    Some((domain.to_owned(), port, verdict, reason.to_owned()))
}

/// `http://NAME:PORT/hello.txt`.
fn http(port: u16, name: &str, path: &str) -> String {
    format!("http://{name}:{port}/{path}")
}

/// A fetch of `https://HOST:PORT/hello.txt` the proxy answers with `status` to CONNECT.
fn via_connect(
    name: &'static str,
    host: &str,
    port: u16,
    status: u16,
    verdict: &'static str,
    reason: &str,
) -> Refused {
    Refused::new(
        name,
        curl(&format!("https://{host}:{port}/hello.txt")),
        vec![format!("connect={status}")],
        expect(host, port, verdict, reason),
    )
}

/// A plain fetch of `http://HOST:PORT/hello.txt` the proxy answers with `status` and a body
/// holding `body`.
fn plain(
    name: &'static str,
    host: &str,
    port: u16,
    status: u16,
    body: String,
    verdict: &'static str,
    reason: &str,
) -> Refused {
    Refused::new(
        name,
        curl(&format!("http://{host}:{port}/hello.txt")),
        vec![body, format!("http_code={status}")],
        expect(host, port, verdict, reason),
    )
}

/// (5) a name no pattern lists (and no escalations), (6) a denied wildcard inside an
/// allowed one; `tp` and `pp` are the HTTPS and plain origins' ports.
fn listing_refusals(tp: u16, pp: u16) -> Vec<Refused> {
    vec![
        // (5) Not listed, and the policy allows no escalations.
        Refused::new(
            "a name no pattern lists, over CONNECT",
            curl(&format!("https://other.example:{tp}/hello.txt")),
            vec!["connect=403".into()],
            expect(
                "other.example",
                tp,
                "refused",
                "not in the session's allowed domains",
            ),
        ),
        Refused::new(
            "a name no pattern lists, plain",
            curl(&format!("http://other.example:{pp}/hello.txt")),
            vec![
                format!(
                    "ollie proxy: refused other.example:{pp}: not in the session's allowed domains; add it to [network] allow_domains"
                ),
                "http_code=403".into(),
            ],
            expect(
                "other.example",
                pp,
                "refused",
                "not in the session's allowed domains",
            ),
        ),
        Refused::new(
            "a name no pattern lists: the CONNECT answer's body",
            raw_request(
                format!("CONNECT other.example:{tp} HTTP/1.1\r\nHost: other.example:{tp}\r\n\r\n")
                    .as_bytes(),
            ),
            vec![
                "HTTP/1.1 403 Forbidden".into(),
                format!(
                    "ollie proxy: refused other.example:{tp}: not in the session's allowed domains"
                ),
            ],
            expect(
                "other.example",
                tp,
                "refused",
                "not in the session's allowed domains",
            ),
        ),
        // (6) A denied wildcard inside an allowed one.
        Refused::new(
            "a denied wildcard, over CONNECT",
            curl(&format!("https://x.bad.corp.test:{tp}/hello.txt")),
            vec!["connect=403".into()],
            expect(
                "x.bad.corp.test",
                tp,
                "refused",
                "denied by *.bad.corp.test",
            ),
        ),
        Refused::new(
            "a denied wildcard, plain",
            curl(&format!("http://x.bad.corp.test:{pp}/hello.txt")),
            vec![
                format!(
                    "ollie proxy: refused x.bad.corp.test:{pp}: denied by *.bad.corp.test; the pattern is in [network] deny_domains"
                ),
                "http_code=403".into(),
            ],
            expect(
                "x.bad.corp.test",
                pp,
                "refused",
                "denied by *.bad.corp.test",
            ),
        ),
    ]
}

/// (7) a NUL in the name, escaped and raw (hyper refuses the request line); fronting by
/// TLS server name and by Host header; IP literals.
fn malformed_refusals(tp: u16, pp: u16) -> Vec<Refused> {
    vec![
        // (7) A NUL in the name, escaped and raw: hyper refuses the request line.
        Refused::new(
            "%00 in a CONNECT name",
            raw_request(format!("CONNECT a%00.pypi.test:{tp} HTTP/1.1\r\nHost: a%00.pypi.test:{tp}\r\n\r\n").as_bytes()),
            vec!["HTTP/1.1 400 Bad Request".into()],
            expect("", 0, "refused", "the request is not valid http/1.1"),
        ),
        Refused::new(
            "a raw NUL in a CONNECT name",
            raw_request(format!("CONNECT a\0.pypi.test:{tp} HTTP/1.1\r\nHost: pypi.test:{tp}\r\n\r\n").as_bytes()),
            vec!["HTTP/1.1 400 Bad Request".into()],
            expect("", 0, "refused", "the request is not valid http/1.1"),
        ),
        Refused::new(
            "a raw NUL in a plain request's name",
            raw_request(format!("GET http://pypi.test\0.other.example:{pp}/hello.txt HTTP/1.1\r\nHost: pypi.test:{pp}\r\n\r\n").as_bytes()),
            vec!["HTTP/1.1 400 Bad Request".into()],
            expect("", 0, "refused", "the request is not valid http/1.1"),
        ),
        Refused::new(
            "curl with %00 in the name",
            curl(&format!("https://a%00.pypi.test:{tp}/hello.txt")),
            vec!["http_code=000".into()],
            None,
        ),
        // Fronting: a TLS server name other than the CONNECT host (the tunnel is closed
        // before the origin gets a byte), a Host header other than the URI's.
        Refused {
            after_connect: true,
            ..Refused::new(
                "a TLS server name other than the CONNECT host",
                python(FRONTED_PY, &format!("pypi.test:{tp}")),
                vec![
                    "HTTP/1.1 200 Connection established".into(),
                    "tls failed".into(),
                ],
                expect(
                    "pypi.test",
                    tp,
                    "refused",
                    "the tls server name other.test is not the connect host pypi.test (domain fronting)",
                ),
            )
        },
        Refused::new(
            "a Host header other than the URI's host",
            curl_with("-H 'Host: other.example'", &http(pp, "plain.test", "hello.txt")),
            vec![
                format!("ollie proxy: refused plain.test:{pp}: the host header names other.example, not the request's host"),
                "http_code=403".into(),
            ],
            expect("plain.test", pp, "refused", "the host header names other.example"),
        ),
        // IP literals: only an allow_domains entry naming the literal lets one through, and
        // only the canonical form parses.
        Refused::new(
            "an IP literal no pattern lists",
            curl_with("--noproxy '' -x http://127.0.0.1:3128", &http(pp, "127.0.0.1", "hello.txt")),
            vec![
                format!("ollie proxy: refused 127.0.0.1:{pp}: not in the session's allowed domains"),
                "http_code=403".into(),
            ],
            expect("127.0.0.1", pp, "refused", "not in the session's allowed domains"),
        ),
        Refused::new(
            "a non-canonical IPv4 literal",
            raw_request(format!("GET http://127.1:{pp}/hello.txt HTTP/1.1\r\nHost: 127.1:{pp}\r\n\r\n").as_bytes()),
            vec![
                "HTTP/1.1 400 Bad Request".into(),
                format!("ollie proxy: refused 127.1:{pp}: the name is an ip literal in a non-canonical form"),
            ],
            expect("127.1", pp, "refused", "non-canonical form"),
        ),
    ]
}

/// (9) allowed names pinned to addresses `127.0.0.1/32` does not cover; an origin that is
/// down (`dp`, listed); (10) a port not listed (`up`).
fn address_refusals(tp: u16, pp: u16, dp: u16, up: u16) -> Vec<Refused> {
    vec![
        // (9) Allowed names pinned to addresses 127.0.0.1/32 does not cover.
        Refused::new(
            "an allowed name rebinding to 127.0.0.2",
            curl(&format!("https://rebind.test:{tp}/hello.txt")),
            vec!["connect=403".into()],
            expect(
                "rebind.test",
                tp,
                "refused",
                "it resolves only to refused addresses (127.0.0.2: loopback)",
            ),
        ),
        plain(
            "an allowed name rebinding to 127.0.0.2, plain: the body says why",
            "rebind.test",
            pp,
            403,
            format!(
                "ollie proxy: refused rebind.test:{pp}: it resolves only to refused addresses (127.0.0.2: loopback); the proxy connects to such addresses only if the operator lists them in [proxy] allow_addresses"
            ),
            "refused",
            "127.0.0.2: loopback",
        ),
        via_connect(
            "an allowed name rebinding to ::ffff:127.0.0.2",
            "mapped.test",
            tp,
            403,
            "refused",
            "(::ffff:127.0.0.2: loopback)",
        ),
        via_connect(
            "an allowed name rebinding to 0.0.0.0",
            "zero.test",
            tp,
            403,
            "refused",
            "(0.0.0.0: unspecified)",
        ),
        // Allowed, but nothing listens there: a 502, and the verdict stays "allowed".
        via_connect(
            "an allowed name whose origin is down",
            "pypi.test",
            dp,
            502,
            "allowed",
            "cannot reach the origin",
        ),
        plain(
            "an allowed name whose origin is down, plain",
            "plain.test",
            dp,
            502,
            format!("ollie proxy: plain.test:{dp}: cannot reach the origin: "),
            "allowed",
            "cannot reach the origin",
        ),
        // (10) A port the policy does not list.
        via_connect(
            "a port not listed",
            "pypi.test",
            up,
            403,
            "refused",
            "port not allowed",
        ),
        Refused::new(
            "a bad host on a port not listed: the host is judged first",
            raw_request(
                format!("GET http://127.1:{up}/hello.txt HTTP/1.1\r\nHost: 127.1:{up}\r\n\r\n")
                    .as_bytes(),
            ),
            vec!["HTTP/1.1 400 Bad Request".into()],
            expect("127.1", up, "refused", "non-canonical form"),
        ),
        plain(
            "a port not listed, plain",
            "pypi.test",
            up,
            403,
            format!("ollie proxy: refused pypi.test:{up}: port not allowed (allowed: "),
            "refused",
            "port not allowed",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_name_the_host_and_reach_nothing() {
    let case = "refused_requests_name_the_host_and_reach_nothing";
    let Some(w) = World::for_case(case, &["curl", "python3"], "proxied").await else {
        return;
    };
    let (tp, pp, dp) = (w.tls.port, w.plain.port, w.dead);
    // Where a rebinding name would land (127.0.0.2 at the HTTPS origin's port), and a port
    // no policy lists.
    let rebound = Canary::bind(&format!("127.0.0.2:{tp}"))
        .await
        .expect("a canary on 127.0.0.2");
    let unlisted = Canary::bind("127.0.0.1:0").await.unwrap();
    let up = unlisted.addr.port();
    let mut cases = listing_refusals(tp, pp);
    cases.extend(malformed_refusals(tp, pp));
    cases.extend(address_refusals(tp, pp, dp, up));
    check_refusals(&w, cases, &[&rebound, &unlisted]).await;
    assert_eq!(
        w.tls.saw_name("pypi.test") + w.tls.saw_name("other.example"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_is_refused_unless_the_operator_allows_it() {
    let case = "loopback_is_refused_unless_the_operator_allows_it";
    if !clients(case, &["curl"]) {
        return;
    }
    // (8) The same pins, no allow_addresses.
    let Some(w) = World::start(case, "proxied", |b| b.proxy.allow_addresses.clear()).await else {
        return;
    };
    let (tp, pp) = (w.tls.port, w.plain.port);
    let why = "it resolves only to refused addresses (127.0.0.1: loopback)";
    let cases = vec![
        Refused::new(
            "an allowed name pinned to 127.0.0.1, over CONNECT",
            curl(&w.https("pypi.test", "hello.txt")),
            vec!["connect=403".into()],
            Some(("pypi.test".into(), tp, "refused", why.into())),
        ),
        Refused::new(
            "an allowed name pinned to 127.0.0.1, plain",
            curl(&w.http("plain.test", "hello.txt")),
            vec![
                format!(
                    "ollie proxy: refused plain.test:{pp}: {why}; the proxy connects to such addresses only if the operator lists them in [proxy] allow_addresses"
                ),
                "http_code=403".into(),
            ],
            Some(("plain.test".into(), pp, "refused", why.into())),
        ),
    ];
    check_refusals(&w, cases, &[]).await;
    assert_eq!(w.tls.connections() + w.plain.connections(), 0);
}

// ---------------------------------------------------------------------------------------------
// (11) Net escalations

/// An unlisted name asked about and approved once: the call waits, the request shows
/// domain, port and command; both fetches of the call go through on the one answer.
async fn approved_once(w: &World, url: &str) {
    let tp = w.tls.port;
    // Approved once: the call waits, the request shows domain, port and command; both
    // fetches of the call go through on the one answer.
    let twice = format!("{} && {}", curl(url), curl(url));
    let mut first = start_call(&w.a, &code("bash", &twice)).await;
    let v = Pending::open(&w.op).await.next().await;
    assert_eq!(v["domain"], "asked.test", "{v}");
    assert_eq!(v["port"], tp, "{v}");
    assert_eq!(v["grants"], json!(["net:asked.test"]), "{v}");
    assert_eq!(v["agent"], "a", "{v}");
    assert_eq!(v["tool"], "net", "{v}");
    assert!(
        v["command"].as_str().unwrap().starts_with("curl -sS"),
        "{v}"
    );
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("asked.test:{tp}")),
        "{v}"
    );
    let id = v["id"].as_str().unwrap().to_owned();
    assert!(
        first.still_waiting().await,
        "curl did not wait for the verdict"
    );
    assert_eq!(
        w.tls.connections(),
        0,
        "the origin was reached before the verdict"
    );
    resolve(&w.op, &approve(&id)).await.expect("approve");
    let r = first.finish().await.expect("the approved call");
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert_eq!(r.body.matches("hello from the origin").count(), 2, "{r:?}");
    assert_eq!(w.tls.saw_name("asked.test"), 2, "{}", w.tls.report());
    assert!(nothing_pending(&w.op).await, "the second fetch asked again");
}

/// A new call for the same name asks again; denied, curl gets 403 and the origin nothing;
/// asked again at once, it is refused without a question.
async fn denied_and_not_asked_again(w: &World, url: &str) {
    // A new call asks again; denied, curl gets 403 and the origin nothing.
    let before = w.tls.connections();
    let second = start_call(&w.a, &code("bash", &curl(url))).await;
    let id2 = next_id(&w.op).await;
    resolve(&w.op, &deny(&id2, "not this one"))
        .await
        .expect("deny");
    let r = second.finish().await.expect("the denied call ran");
    assert!(r.body.contains("connect=403"), "{r:?}");
    assert_ne!(r.exit(), Some(0), "{r:?}");
    assert_eq!(w.tls.connections(), before, "{}", w.tls.report());

    // The denied domain is not asked about again for a while (the broker's memo of the
    // operator's denial): refused at once, with the operator's words.
    let r = w.sh(&curl(url)).await;
    assert!(r.body.contains("connect=403"), "{r:?}");
    assert!(
        nothing_pending(&w.op).await,
        "a denied domain was asked again at once"
    );
    assert_eq!(w.tls.connections(), before, "{}", w.tls.report());
}

/// Approved for the session: a later call is not asked.
async fn approved_for_the_session(w: &World) {
    // Approved for the session: a later call is not asked.
    let other = w.https("other.test", "hello.txt");
    let third = start_call(&w.a, &code("bash", &curl(&other))).await;
    let v = Pending::open(&w.op).await.next().await;
    assert_eq!(v["domain"], "other.test", "{v}");
    let id3 = v["id"].as_str().unwrap().to_owned();
    resolve(
        &w.op,
        &json!({"id": id3, "approved": true, "scope": "session"}).to_string(),
    )
    .await
    .expect("approve for the session");
    assert_eq!(third.finish().await.unwrap().exit(), Some(0));
    let r = w.sh(&curl(&other)).await;
    assert_eq!(
        r.exit(),
        Some(0),
        "asked again after a session approval: {r:?}"
    );
    assert!(r.body.contains("hello from the origin"), "{r:?}");
    assert!(nothing_pending(&w.op).await);
    assert_eq!(w.tls.saw_name("other.test"), 2, "{}", w.tls.report());
}

/// (12) The events of [`unlisted_names_are_asked_about_and_wait_for_the_operator`].
fn check_question_events(ev: &[Value], tp: u16) {
    // (12) The events: approved (twice on one answer), denied, refused on the memo,
    // approved, approved for the session without asking, refused, allowed.
    let verdicts: Vec<(&str, &str)> = ev
        .iter()
        .map(|e| {
            (
                e["domain"].as_str().unwrap(),
                e["verdict"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [
            ("asked.test", "approved"),
            ("asked.test", "approved"),
            ("asked.test", "denied"),
            ("asked.test", "denied"),
            ("other.test", "approved"),
            ("other.test", "approved"),
            ("x.bad.corp.test", "refused"),
            ("pypi.test", "allowed"),
        ],
        "{ev:?}"
    );
    for e in ev {
        check_event_shape(e);
        assert_eq!(e["port"], tp, "{e}");
    }
    // The proxy is the run's own: an approval it remembers holds for that run; the scope
    // the operator chose is in the audit's resolve record, not in these words.
    for i in [0, 1, 4, 5] {
        let reason = ev[i]["reason"].as_str().unwrap();
        assert!(reason.starts_with("approved"), "{:?}", ev[i]);
        assert!(reason.contains("remembered by this proxy"), "{:?}", ev[i]);
    }
    assert!(
        ev[2]["reason"]
            .as_str()
            .unwrap()
            .contains("the operator denied net:asked.test: not this one"),
        "{:?}",
        ev[2]
    );
    assert_eq!(ev[2]["bytes_down"], 0);
    assert!(
        ev[3]["reason"]
            .as_str()
            .unwrap()
            .contains("the operator denied this exact request"),
        "{:?}",
        ev[3]
    );
    assert!(ev[5]["bytes_down"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlisted_names_are_asked_about_and_wait_for_the_operator() {
    let case = "unlisted_names_are_asked_about_and_wait_for_the_operator";
    let Some(w) = World::for_case(case, &["curl"], "asking").await else {
        return;
    };
    let url = w.https("asked.test", "hello.txt");
    approved_once(&w, &url).await;
    denied_and_not_asked_again(&w, &url).await;
    approved_for_the_session(&w).await;
    // A denied pattern is never asked about; a listed name is not either.
    let r = w
        .sh(&format!(
            "{}; {}",
            curl(&w.https("x.bad.corp.test", "hello.txt")),
            curl(&w.https("pypi.test", "hello.txt"))
        ))
        .await;
    assert!(r.body.contains("connect=403"), "{r:?}");
    assert!(r.body.contains("hello from the origin"), "{r:?}");
    assert!(
        nothing_pending(&w.op).await,
        "a denied name was asked about"
    );

    let ev = wait_net_events(&w.op, 8).await;
    check_question_events(&ev, w.tls.port);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn net_questions_are_joined_withdrawn_and_expire() {
    let case = "net_questions_are_joined_withdrawn_and_expire";
    let Some(w) = World::for_case(case, &["curl"], "asking").await else {
        return;
    };
    // Two fetches of one name at once: one question, both wait for it, one answer lets
    // both through.
    let url = w.https("asked.test", "hello.txt");
    let both = start_call(
        &w.a,
        &code("bash", &format!("{} &\n{}\nwait", curl(&url), curl(&url))),
    )
    .await;
    let id = next_id(&w.op).await;
    assert!(
        poll_joined(&w.op).await,
        "the second fetch did not join the question: {:?}",
        log_events(&w.op).await
    );
    resolve(&w.op, &approve(&id)).await.expect("approve");
    let r = both.finish().await.expect("the approved call");
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert_eq!(r.body.matches("hello from the origin").count(), 2, "{r:?}");
    assert!(nothing_pending(&w.op).await);

    // A call stopped while its fetch waits: the question is withdrawn, and a late answer
    // finds nothing.
    let other = w.https("other.test", "hello.txt");
    let stopped = start_call(&w.a, &code("bash", &curl(&other))).await;
    let v = Pending::open(&w.op).await.next().await;
    let id = v["id"].as_str().unwrap().to_owned();
    let pid = v["call"].as_str().unwrap().to_owned();
    write(&w.a, &format!("proc/{pid}/ctl"), "kill")
        .await
        .expect("kill the waiting call");
    let r = stopped.finish().await.expect("the stopped call");
    assert_ne!(r.exit(), Some(0), "{r:?}");
    assert!(
        wait_nothing_pending(&w.op).await,
        "the question outlived its run"
    );
    let e = resolve(&w.op, &approve(&id))
        .await
        .expect_err("an answer to a withdrawn question was taken");
    assert!(e.contains("resolve: "), "{e}");
    assert_eq!(w.tls.saw_name("other.test"), 0, "{}", w.tls.report());
    let log = log_events(&w.op).await;
    assert!(
        log.iter()
            .any(|e| e["event"] == "withdrawn" && e["id"] == id.as_str()),
        "{log:?}"
    );

    // No answer within the broker's deadline: refused, and the event says why.
    write(&w.op, "ctl", "bypass_timeout 1")
        .await
        .expect("bypass_timeout");
    let r = w.sh(&curl(&w.https("git.test", "hello.txt"))).await;
    assert!(r.body.contains("connect=403"), "{r:?}");
    assert_eq!(w.tls.saw_name("git.test"), 0, "{}", w.tls.report());
    let ev = net_events(&w.op).await;
    let e = event_for(&ev, "git.test");
    assert_eq!(e["verdict"], "denied", "{e}");
    assert!(
        e["reason"]
            .as_str()
            .unwrap()
            .contains("no answer from the operator about net:git.test within 1 s"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_approval_is_the_asking_agents_only() {
    let case = "a_session_approval_is_the_asking_agents_only";
    let Some(w) = World::for_case(case, &["curl"], "asking").await else {
        return;
    };
    let b = w.t.attach("b").await;
    let url = w.https("other.test", "hello.txt");
    // Agent a's request, approved for the session.
    let first = start_call(&w.a, &code("bash", &curl(&url))).await;
    let v = Pending::open(&w.op).await.next().await;
    assert_eq!(v["agent"], "a", "{v}");
    resolve(
        &w.op,
        &json!({"id": v["id"], "approved": true, "scope": "session"}).to_string(),
    )
    .await
    .expect("approve for the session");
    assert_eq!(first.finish().await.unwrap().exit(), Some(0));
    // Agent b's request for the same domain is b's own question, not a's approval.
    let bs = start_call(&b, &code("bash", &curl(&url))).await;
    let Some(v) = Pending::open(&w.op).await.next_within(IO_TIMEOUT).await else {
        let r = bs.finish().await;
        panic!("agent b was let through on agent a's session approval: {r:?}");
    };
    assert_eq!(v["agent"], "b", "{v}");
    resolve(&w.op, &deny(v["id"].as_str().unwrap(), "not b"))
        .await
        .expect("deny");
    let r = bs.finish().await.expect("b's call");
    assert!(r.body.contains("connect=403"), "{r:?}");
    // a's approval still holds, and b's denial is not a's.
    let r = w.sh(&curl(&url)).await;
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert!(nothing_pending(&w.op).await);
    assert_eq!(w.tls.saw_name("other.test"), 2, "{}", w.tls.report());
    // A profile without net escalations: b's proxy has no one to ask, and says how to
    // allow the name.
    write(&w.op, "ctl", "escalations b none")
        .await
        .expect("ctl escalations");
    let r = call(&b, &curl(&w.http("registry.test", "hello.txt")))
        .await
        .expect("b's call");
    assert!(
        r.body.contains(&format!(
            "ollie proxy: refused registry.test:{}: not in the session's allowed domains; add it to [network] allow_domains in the agent's policy, or allow net escalations",
            w.plain.port
        )),
        "{r:?}"
    );
    assert!(
        nothing_pending(&w.op).await,
        "b's proxy asked without net escalations"
    );
    assert_eq!(w.plain.connections(), 0, "{}", w.plain.report());
}

/// Asks the run's proxy for `{ARG}` (a name no pattern lists), then closes the connection
/// once FIFO `go` is written, and ends once FIFO `end` is.
const ASK_THEN_LEAVE_PY: &str = r#"import socket
s = socket.create_connection(('127.0.0.1', 3128), timeout=60)
s.sendall(b'CONNECT {ARG} HTTP/1.1\r\nHost: {ARG}\r\n\r\n')
print('asked', flush=True)
open('go').read()
s.close()
print('closed', flush=True)
open('end').read()
print('done', flush=True)"#;

/// Writes a line to the FIFO `path` (bounded: the reader must be there or come).
async fn fifo_write(path: &Path) {
    let p = path.to_path_buf();
    tokio::time::timeout(
        IO_TIMEOUT,
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut w = std::fs::OpenOptions::new().write(true).open(p).unwrap();
            w.write_all(b"go\n").unwrap();
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("nobody read {}", path.display()))
    .unwrap();
}

/// Makes a FIFO in the workspace.
fn fifo(w: &World, name: &str) -> PathBuf {
    let p = w.ws().join(name);
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_is_withdrawn_when_its_client_leaves() {
    let case = "a_question_is_withdrawn_when_its_client_leaves";
    let Some(w) = World::for_case(case, &["python3"], "asking").await else {
        return;
    };
    let (go, end) = (fifo(&w, "go"), fifo(&w, "end"));
    let target = format!("other.test:{}", w.tls.port);
    let pid = run_bg(&w.a, &code("bash", &python(ASK_THEN_LEAVE_PY, &target)))
        .await
        .expect("the run");
    let v = Pending::open(&w.op).await.next().await;
    assert_eq!(v["domain"], "other.test", "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    fifo_write(&go).await;
    wait_out(&w.a, pid, "closed").await;
    // The run goes on, but the connection that asked is gone: so is the question.
    let withdrawn = wait_nothing_pending(&w.op).await;
    let late = resolve(&w.op, &approve(&id)).await;
    fifo_write(&end).await;
    wait_out(&w.a, pid, "done").await;
    assert!(
        withdrawn,
        "the question outlived the connection that asked it"
    );
    assert!(late.is_err(), "an answer for a closed connection was taken");
    assert_eq!(w.tls.connections(), 0, "{}", w.tls.report());
}

/// Whether `bypass/log` shows a `joined` event (bounded poll).
async fn poll_joined(op: &Fid) -> bool {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        if log_events(op).await.iter().any(|e| e["event"] == "joined") {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(STEP).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_net_domain_grant_widens_only_that_runs_proxy() {
    let case = "an_approved_net_domain_grant_widens_only_that_runs_proxy";
    let Some(w) = World::for_case(case, &["curl"], "asking").await else {
        return;
    };
    let url = w.https("registry.test", "hello.txt");
    let payload = tool(
        "execute_code",
        json!({"language": "bash", "code": curl(&url),
               "escalate": {"grants": ["net:registry.test"], "reason": "fetch from the registry"}}),
    );
    let asked = start_call(&w.a, &payload).await;
    let v = Pending::open(&w.op).await.next().await;
    assert_eq!(v["tool"], "execute_code", "{v}");
    assert_eq!(v["grants"], json!(["net:registry.test"]), "{v}");
    assert_eq!(w.tls.saw_name("registry.test"), 0);
    resolve(&w.op, &approve(v["id"].as_str().unwrap()))
        .await
        .expect("approve");
    let r = asked.finish().await.expect("the approved call");
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert!(r.body.contains("hello from the origin"), "{r:?}");
    assert!(
        nothing_pending(&w.op).await,
        "the granted domain was asked about again"
    );
    let ev = net_events(&w.op).await;
    let e = event_for(&ev, "registry.test");
    assert_eq!(e["verdict"], "allowed", "{e}");
    assert!(
        e["reason"]
            .as_str()
            .unwrap()
            .starts_with("allowed by registry.test"),
        "{e}"
    );
    assert_eq!(w.tls.saw_name("registry.test"), 1, "{}", w.tls.report());

    // The grant was that run's: the next call's fetch is a question again.
    let again = start_call(&w.a, &code("bash", &curl(&url))).await;
    let v = Pending::open(&w.op).await.next().await;
    assert_eq!(v["tool"], "net", "{v}");
    assert_eq!(v["domain"], "registry.test", "{v}");
    resolve(&w.op, &deny(v["id"].as_str().unwrap(), "once was enough"))
        .await
        .expect("deny");
    let r = again.finish().await.expect("the call");
    assert!(r.body.contains("connect=403"), "{r:?}");
    assert_eq!(w.tls.saw_name("registry.test"), 1, "{}", w.tls.report());

    // Refused without asking: a denied name, a wildcard reaching around one, and the
    // shipped tcp-mode policy (a proxy would take its direct ports away).
    for (grant, why) in [
        (
            "net:x.bad.corp.test",
            "net:x.bad.corp.test is refused by the policy's deny_domains entry *.bad.corp.test",
        ),
        (
            "net:*.corp.test",
            "net:*.corp.test is refused by the policy's deny_domains entry *.bad.corp.test",
        ),
    ] {
        let payload = tool(
            "execute_code",
            json!({"language": "bash", "code": "true",
                   "escalate": {"grants": [grant], "reason": "r"}}),
        );
        let e = run(&w.a, &payload).await.expect_err(grant);
        assert!(
            e.contains("escalation refused without asking"),
            "{grant}: {e}"
        );
        assert!(e.contains(why), "{grant}: {e}");
    }
    write(&w.op, "ctl", "policy a network")
        .await
        .expect("ctl policy");
    let payload = tool(
        "execute_code",
        json!({"language": "bash", "code": "true",
               "escalate": {"grants": ["net:pypi.test"], "reason": "r"}}),
    );
    let e = run(&w.a, &payload).await.expect_err("net:DOMAIN under tcp");
    assert!(e.contains("needs network.mode = \"proxy\""), "{e}");
    assert!(nothing_pending(&w.op).await);

    // On the shipped workspace policy (no network) the grant makes the run a proxied one
    // reaching just that name, on the default ports 80 and 443 only.
    write(&w.op, "ctl", "policy a workspace")
        .await
        .expect("ctl policy");
    let payload = tool(
        "execute_code",
        json!({"language": "bash", "code": curl(&w.http("plain.test", "hello.txt")),
               "escalate": {"grants": ["net:plain.test"], "reason": "r"}}),
    );
    let asked = start_call(&w.a, &payload).await;
    let id = next_id(&w.op).await;
    resolve(&w.op, &approve(&id)).await.expect("approve");
    let r = asked.finish().await.expect("the approved call");
    assert!(
        r.body.contains(&format!(
            "ollie proxy: refused plain.test:{}: port not allowed (allowed: 80, 443)",
            w.plain.port
        )),
        "{r:?}"
    );
    let rec = read(&w.a, &format!("proc/{}/record", r.pid()))
        .await
        .unwrap();
    let rec: Value = serde_json::from_str(&rec).unwrap();
    assert_eq!(rec["layers"]["network"]["mode"], "proxy", "{rec}");
    assert_eq!(w.plain.connections(), 0, "{}", w.plain.report());
}

// ---------------------------------------------------------------------------------------------
// (13) Two sessions

/// Connects to each `(host, port)` of the list `{ARG}` and says how it went.
const CONNECT_EACH_PY: &str = r#"import socket
for host, port in {ARG}:
    try:
        socket.create_connection((host, port), timeout=5).close()
        print('%s:%d connected' % (host, port))
    except OSError as e:
        print('%s:%d failed: %s' % (host, port, e))"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cannot_reach_another_sessions_proxy() {
    let case = "a_session_cannot_reach_another_sessions_proxy";
    if !clients(case, &["curl", "python3"]) {
        return;
    }
    let Some(a) = World::start(case, "proxied", |_| {}).await else {
        return;
    };
    let Some(b) = World::start(case, "proxied", |_| {}).await else {
        return;
    };
    // B's run holds its listener open until the test writes to its FIFO.
    let go = fifo(&b, "go");
    let b_pid = run_bg(
        &b.a,
        &code(
            "bash",
            &format!(
                "echo ready; read line < go; {}",
                curl(&b.https("pypi.test", "hello.txt"))
            ),
        ),
    )
    .await
    .expect("B's run");
    wait_out(&b.a, b_pid, "ready").await;
    // Where else a proxy could be: another loopback address at the proxy's port (a canary
    // on the host's 127.0.0.2:3128, if it can be had), the IPv6 loopback, and both origins'
    // ports directly.
    let canary = Canary::bind("127.0.0.2:3128").await;
    let targets = [
        ("127.0.0.2", 3128),
        ("::1", 3128),
        ("127.0.0.1", a.tls.port),
        ("127.0.0.1", b.tls.port),
        ("127.0.0.1", b.plain.port),
    ];
    let probe = format!(
        "{}\n{}",
        python(CONNECT_EACH_PY, &format!("{targets:?}")),
        curl(&a.https("pypi.test", "hello.txt"))
    );
    let r = a.sh(&probe).await;
    for (host, port) in targets {
        assert!(
            r.body.contains(&format!("{host}:{port} failed")),
            "{host}:{port}: {r:?}"
        );
    }
    assert!(!r.body.contains("connected"), "{r:?}");
    // A's own proxy works, and only A's log heard of it.
    assert!(r.body.contains("hello from the origin"), "{r:?}");
    let a_ev = wait_net_events(&a.op, 1).await;
    assert_eq!(a_ev.len(), 1, "{a_ev:?}");
    assert!(
        net_events(&b.op).await.is_empty(),
        "B's proxy heard of A's call"
    );
    assert_eq!(b.tls.connections() + b.plain.connections(), 0);
    if let Some(c) = &canary {
        assert_eq!(c.connections(), 0, "the host's 127.0.0.2:3128 was reached");
    } else {
        skip("note: 127.0.0.2:3128 is taken on the host; that canary is left out");
    }

    // B's run goes on and uses its own proxy.
    fifo_write(&go).await;
    let out = wait_out(&b.a, b_pid, "http_code=").await;
    assert!(out.contains("hello from the origin"), "{out}");
    let b_ev = wait_net_events(&b.op, 1).await;
    assert_eq!(b_ev.len(), 1, "{b_ev:?}");
    assert_eq!(b_ev[0]["call"], b_pid.to_string(), "{b_ev:?}");
    assert_eq!(b_ev[0]["port"], b.tls.port, "{b_ev:?}");
    assert_eq!(
        net_events(&a.op).await.len(),
        1,
        "A's proxy heard of B's call"
    );
    assert_eq!(a.tls.saw_name("pypi.test"), 1, "{}", a.tls.report());
    assert_eq!(b.tls.saw_name("pypi.test"), 1, "{}", b.tls.report());
}

// ---------------------------------------------------------------------------------------------
// (14), (15) DNS

/// Resolves `pypi.test` and makes a UDP socket of each family, saying how it went.
const RESOLVE_AND_UDP_PY: &str = r#"import socket
try:
    print('resolved', socket.getaddrinfo('pypi.test', 443))
except OSError as e:
    print('getaddrinfo failed:', type(e).__name__)
for family in (socket.AF_INET, socket.AF_INET6):
    try:
        socket.socket(family, socket.SOCK_DGRAM).close()
        print('udp socket made')
    except OSError as e:
        print('udp refused:', e.errno)"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_run_has_no_resolver_and_no_udp() {
    let case = "a_proxied_run_has_no_resolver_and_no_udp";
    let Some(w) = World::for_case(case, &["getent", "python3"], "proxied").await else {
        return;
    };
    let r = w
        .sh(&format!(
            "getent hosts pypi.test; echo getent=$?\n\
             grep -c '^nameserver' /etc/resolv.conf\n\
             grep -q 'No resolver in this sandbox' /etc/resolv.conf && echo comment=yes\n{}",
            python(RESOLVE_AND_UDP_PY, "")
        ))
        .await;
    assert!(!r.body.contains("getent=0"), "{r:?}");
    assert!(r.body.contains("getent="), "{r:?}");
    assert!(
        r.body.contains("\n0\n") || r.body.starts_with("0\n"),
        "{r:?}"
    );
    assert!(r.body.contains("comment=yes"), "{r:?}");
    assert!(r.body.contains("getaddrinfo failed: gaierror"), "{r:?}");
    assert!(!r.body.contains("resolved"), "{r:?}");
    assert_eq!(r.body.matches("udp refused:").count(), 2, "{r:?}");
    assert!(!r.body.contains("udp socket made"), "{r:?}");
    // Nothing reached the proxy or an origin for it.
    assert!(net_events(&w.op).await.is_empty());
    assert_eq!(w.tls.connections() + w.plain.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resolver_files_are_readable_where_the_network_is_granted() {
    let case = "the_resolver_files_are_readable_where_the_network_is_granted";
    if !clients(case, &["getent"]) {
        return;
    }
    let host_conf = match std::fs::read_to_string("/etc/resolv.conf") {
        Ok(t) if !t.is_empty() => t,
        _ => {
            ollie_testkit::skip_or_fail(
                case,
                "this host has no /etc/resolv.conf",
                &format!("{case}: no /etc/resolv.conf to read"),
            );
            return;
        }
    };
    let Some(w) = World::start(case, "all", |_| {}).await else {
        return;
    };
    let show = "cat /etc/resolv.conf; echo cat=$?; getent hosts localhost; echo getent=$?";
    // Neither policy's read list has /etc/resolv.conf (nor /etc/gai.conf); under both it is
    // readable anyway.
    for p in ["all", "tcp"] {
        write(&w.op, "ctl", &format!("policy a {p}"))
            .await
            .expect("ctl policy");
        let r = w.sh(show).await;
        assert!(r.body.contains(&host_conf), "{p}: {r:?}");
        assert!(r.body.contains("cat=0"), "{p}: {r:?}");
        assert!(
            r.body.contains("localhost") && r.body.contains("getent=0"),
            "{p}: {r:?}"
        );
        if Path::new("/etc/gai.conf").is_file() {
            let r = w.sh("cat /etc/gai.conf >/dev/null; echo cat=$?").await;
            assert!(r.body.contains("cat=0"), "{p}: {r:?}");
        }
    }

    // The shipped workspace policy (no network): not readable ...
    write(&w.op, "ctl", "policy a workspace")
        .await
        .expect("ctl policy");
    let cat = "cat /etc/resolv.conf; echo cat=$?";
    let r = w.sh(cat).await;
    assert!(r.body.contains("Permission denied"), "{r:?}");
    assert!(!r.body.contains("cat=0"), "{r:?}");
    // ... until a net grant is approved for the call.
    let call = start_call(
        &w.a,
        &tool(
            "execute_code",
            json!({"language": "bash", "code": cat,
                   "escalate": {"grants": ["net"], "reason": "read the resolver"}}),
        ),
    )
    .await;
    let id = next_id(&w.op).await;
    resolve(&w.op, &approve(&id)).await.expect("approve");
    let r = call.finish().await.expect("the approved call");
    assert!(r.body.contains(&host_conf), "{r:?}");
    assert!(r.body.contains("cat=0"), "{r:?}");
}
