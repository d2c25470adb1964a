//! Runs widened by approved grants (`Policy::with_grants`), end to end through
//! `ollie_sandbox::run`: what `net`, `net:PORT` and `unsandboxed` open, and what stays denied.
//!
//! Network probes only use loopback (127.0.0.1 and ::1) and listeners this test starts. Every
//! probe is `python3` printing the errno name of the failed call (or `ok`), so a denial shows
//! which layer refused: EPERM from seccomp (`socket(2)` of a family or type the mode does not
//! allow), EACCES from Landlock (a TCP port outside the connect set, a path outside the
//! rules).
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead. Run as root and as an
//! unprivileged user (`scripts/test-unprivileged.sh`).
// Scenario tests read top to bottom; splitting them would hide the story.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_policy::{Grant, Network, Policy, ResolveContext};
use ollie_sandbox::{Prepared, RunOutput, RunRequest, SandboxError};
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};

mod common;
use common::features_ok;

/// Probes given as `KIND HOST PORT` triples; prints one result per probe: `ok` or the errno
/// name. Kinds: `tcp` (connect, send `hello-tcp`), `udp` (send `hello-udp`), `udp-bind` and
/// `tcp-listen` (on HOST, port 0), `unix` (an AF_UNIX socket).
const NET_PROBE: &str = r#"
import errno, socket, sys
def probe(kind, host, port):
    fam = socket.AF_INET6 if ':' in host else socket.AF_INET
    try:
        if kind == 'tcp':
            s = socket.socket(fam, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect((host, port))
            s.sendall(b'hello-tcp')
            s.close()
        elif kind == 'udp':
            s = socket.socket(fam, socket.SOCK_DGRAM)
            s.sendto(b'hello-udp', (host, port))
        elif kind == 'udp-bind':
            s = socket.socket(fam, socket.SOCK_DGRAM)
            s.bind((host, 0))
        elif kind == 'tcp-listen':
            s = socket.socket(fam, socket.SOCK_STREAM)
            s.bind((host, 0))
            s.listen(1)
        elif kind == 'unix':
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            return 'bad-kind'
        return 'ok'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
a = sys.argv[1:]
for i in range(0, len(a), 3):
    print(probe(a[i], a[i + 1], int(a[i + 2])), flush=True)
"#;

/// Syscalls the default seccomp profile denies, called raw: prints `ok` or the errno name per
/// call (`unshare(CLONE_NEWUSER)`, `keyctl(KEYCTL_GET_KEYRING_ID, session)`,
/// `io_uring_setup(1, NULL)`).
const SYSCALL_PROBE: &str = r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
for nr, args in [(272, (0x10000000,)), (250, (0, -3, 0)), (425, (1, None))]:
    r = libc.syscall(nr, *args)
    print('ok' if r >= 0 else errno.errorcode.get(ctypes.get_errno(), '?'), flush=True)
"#;

const PYTHON: &str = "/usr/bin/python3";

/// A scratch tree: `w` (the workspace), `home` (the user's home, with a secret), `outside`
/// (granted by no rule of the policy).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("ollie-grants-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for sub in ["w", "home/.ssh", "home/notes", "outside"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        Scratch(d.canonicalize().unwrap())
    }
    fn w(&self) -> PathBuf {
        self.0.join("w")
    }
    fn home(&self) -> PathBuf {
        self.0.join("home")
    }
    fn ctx(&self) -> ResolveContext {
        ResolveContext {
            workdir: self.w(),
            home: self.home(),
            extra_secrets: Vec::new(),
        }
    }
    fn req(&self, argv: &[&str]) -> RunRequest {
        let mut r = RunRequest::new(argv.iter().map(Into::into).collect(), self.w());
        r.home = self.home();
        r.base_env = vec![
            ("LANG".into(), "C.UTF-8".into()),
            ("OPENAI_API_KEY".into(), "sk-canary".into()),
        ];
        r
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The shipped `workspace` profile (network off, escalations net/read/write) with short
/// limits.
fn base() -> Policy {
    let p = common::profile_with_limits(
        "workspace",
        "timeout_seconds = 30\nkill_grace_ms = 200\noutput_bytes = 65536",
    );
    assert_eq!(p.network, Network::Off);
    assert!(!p.unsandboxed());
    p
}

fn run(p: &Policy, req: &RunRequest) -> RunOutput {
    match ollie_sandbox::run(p, req) {
        Ok(o) => o,
        Err(e) => panic!("run failed: {}", common::error_chain(&e)),
    }
}

fn stdout_lines(o: &RunOutput) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// What the listeners received: the bytes of a connection to the granted TCP port, of one to
/// the other TCP port, and a datagram.
type Seen = (Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>);

/// Loopback listeners the probes talk to: two TCP ports (the granted one and another) and a
/// UDP port, on 127.0.0.1 and, where the machine has it, ::1.
struct Listeners {
    tcp: TcpListener,
    tcp_other: TcpListener,
    udp: UdpSocket,
}

impl Listeners {
    fn on(host: &str) -> std::io::Result<Listeners> {
        let at = format!("{host}:0");
        let l = Listeners {
            tcp: TcpListener::bind(&at)?,
            tcp_other: TcpListener::bind(&at)?,
            udp: UdpSocket::bind(&at)?,
        };
        l.tcp.set_nonblocking(true)?;
        l.tcp_other.set_nonblocking(true)?;
        l.udp.set_nonblocking(true)?;
        Ok(l)
    }

    fn port(a: std::io::Result<SocketAddr>) -> u16 {
        a.unwrap().port()
    }

    fn ports(&self) -> (u16, u16, u16) {
        (
            Self::port(self.tcp.local_addr()),
            Self::port(self.tcp_other.local_addr()),
            Self::port(self.udp.local_addr()),
        )
    }

    /// What reached each listener since the last call: the bytes of one accepted TCP
    /// connection each (or `None`), and one datagram (or `None`).
    fn take(&self) -> Seen {
        let tcp = |l: &TcpListener| match l.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                    .unwrap();
                let mut b = Vec::new();
                s.read_to_end(&mut b).unwrap();
                Some(b)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => None,
            Err(e) => panic!("accept: {e}"),
        };
        let mut buf = [0u8; 64];
        let udp = match self.udp.recv_from(&mut buf) {
            Ok((n, _)) => Some(buf[..n].to_vec()),
            Err(e) if e.kind() == ErrorKind::WouldBlock => None,
            Err(e) => panic!("recv: {e}"),
        };
        (tcp(&self.tcp), tcp(&self.tcp_other), udp)
    }
}

/// Runs the TCP (granted port), TCP (other port), UDP, UDP bind, TCP listen and AF_UNIX
/// probes against `host` under `p`; returns their results and what the listeners saw.
fn probe_network(s: &Scratch, p: &Policy, l: &Listeners, host: &str) -> (Vec<String>, Seen) {
    let (tcp, other, udp) = l.ports();
    let (tcp, other, udp) = (tcp.to_string(), other.to_string(), udp.to_string());
    let mut argv = vec![PYTHON, "-c", NET_PROBE];
    for probe in [
        ["tcp", host, tcp.as_str()],
        ["tcp", host, other.as_str()],
        ["udp", host, udp.as_str()],
        ["udp-bind", host, "0"],
        ["tcp-listen", host, "0"],
        ["unix", host, "0"],
    ] {
        argv.extend(probe);
    }
    let o = run(p, &s.req(&argv));
    assert_eq!(
        o.record.exit.code,
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines = stdout_lines(&o);
    assert_eq!(lines.len(), 6, "{lines:?}");
    (lines, l.take())
}

fn hosts() -> Vec<(&'static str, Listeners)> {
    let mut out = vec![("127.0.0.1", Listeners::on("127.0.0.1").unwrap())];
    match Listeners::on("[::1]") {
        Ok(l) => out.push(("::1", l)),
        Err(e) => common::skip(&format!(
            "SKIP grants (IPv6 part): no ::1 loopback here ({e}); IPv4 only"
        )),
    }
    out
}

#[test]
fn network_off_denies_tcp_and_udp() {
    if !features_ok("network_off_denies_tcp_and_udp") {
        return;
    }
    let s = Scratch::new("off");
    for (host, l) in hosts() {
        let (r, seen) = probe_network(&s, &base(), &l, host);
        // No inet socket at all: seccomp refuses socket(2).
        assert_eq!(r, ["EPERM"; 6], "{host}");
        assert_eq!(seen, (None, None, None), "{host}: a listener was reached");
    }
}

#[test]
fn net_grant_opens_tcp_and_udp_on_every_port() {
    if !features_ok("net_grant_opens_tcp_and_udp_on_every_port") {
        return;
    }
    let s = Scratch::new("net");
    let p = base().with_grants(&[Grant::Net], &s.ctx()).unwrap();
    assert_eq!(p.network, Network::All);
    assert!(!p.unsandboxed());
    for (host, l) in hosts() {
        let (r, seen) = probe_network(&s, &p, &l, host);
        assert_eq!(
            r,
            ["ok", "ok", "ok", "ok", "ok", "EPERM"],
            "{host}: tcp, tcp (other port), udp, udp bind, tcp listen, unix"
        );
        assert_eq!(
            seen,
            (
                Some(b"hello-tcp".to_vec()),
                Some(b"hello-tcp".to_vec()),
                Some(b"hello-udp".to_vec())
            ),
            "{host}"
        );
    }
    // The grant was for that run only: the stored policy still refuses.
    let l = Listeners::on("127.0.0.1").unwrap();
    let (r, seen) = probe_network(&s, &base(), &l, "127.0.0.1");
    assert_eq!(r, ["EPERM"; 6]);
    assert_eq!(seen, (None, None, None));
}

#[test]
fn net_port_grant_opens_that_tcp_port_only() {
    if !features_ok("net_port_grant_opens_that_tcp_port_only") {
        return;
    }
    let s = Scratch::new("port");
    for (host, l) in hosts() {
        let (port, _, _) = l.ports();
        let p = base()
            .with_grants(&[Grant::NetPort(port)], &s.ctx())
            .unwrap();
        assert!(matches!(&p.network, Network::Tcp { connect, bind }
            if connect.iter().eq([&port]) && bind.is_empty()));
        let (r, seen) = probe_network(&s, &p, &l, host);
        // The granted port connects; another port is refused by Landlock; UDP and AF_UNIX
        // sockets by seccomp; binding any port (none granted) by seccomp too (with no bind
        // port, bind, listen and accept are not allowed at all).
        assert_eq!(
            r,
            ["ok", "EACCES", "EPERM", "EPERM", "EPERM", "EPERM"],
            "{host}: tcp, tcp (other port), udp, udp bind, tcp listen, unix"
        );
        assert_eq!(seen, (Some(b"hello-tcp".to_vec()), None, None), "{host}");
    }
}

/// `grep` of the fields that show the process's privileges.
fn status_fields(o: &RunOutput) -> std::collections::BTreeMap<String, String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[test]
fn unsandboxed_grant_lifts_filesystem_confinement_only() {
    if !features_ok("unsandboxed_grant_lifts_filesystem_confinement_only") {
        return;
    }
    let s = Scratch::new("unsandboxed");
    let root = is_root();
    let outside = s.0.join("outside/data.txt");
    std::fs::write(&outside, "outside-canary\n").unwrap();
    let secret = s.home().join(".ssh/id_test");
    std::fs::write(&secret, "secret-canary\n").unwrap();
    std::fs::write(s.home().join("notes/todo"), "notes-canary\n").unwrap();
    let out = outside.to_str().unwrap();
    let sec = secret.to_str().unwrap();
    let rw = format!("cat {out} && echo appended >> {out} && echo written");

    // Under the base policy: nothing outside the workspace, not even for reading.
    let b = base();
    let o = run(&b, &s.req(&["sh", "-c", &rw]));
    assert_ne!(o.record.exit.code, Some(0));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!o.stdout.starts_with(b"outside-canary"));
    assert!(!o.record.layers.unsandboxed);
    assert_eq!(o.record.layers.landlock.not_applied, None);
    assert!(o.record.layers.mounts.read_only_root);
    // Reading the home is grantable; its secret stays carved out.
    let home = b.with_grants(&[Grant::Read(s.home())], &s.ctx()).unwrap();
    let o = run(
        &home,
        &s.req(&[
            "sh",
            "-c",
            &format!("cat {}/notes/todo; cat {sec}", s.home().display()),
        ]),
    );
    assert_eq!(o.stdout, b"notes-canary\n");
    assert!(String::from_utf8_lossy(&o.stderr).contains("Permission denied"));

    // With the grant: the file reads and writes, and the secret location is not carved out.
    let u = b.with_grants(&[Grant::Unsandboxed], &s.ctx()).unwrap();
    assert!(u.unsandboxed() && u.network == Network::All);
    let o = run(&u, &s.req(&["sh", "-c", &format!("{rw}; cat {sec}")]));
    assert_eq!(
        (o.record.exit.code, String::from_utf8_lossy(&o.stdout)),
        (Some(0), "outside-canary\nwritten\nsecret-canary\n".into()),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "outside-canary\nappended\n"
    );
    // The record says what was not applied, and why.
    let layers = &o.record.layers;
    assert!(layers.unsandboxed);
    assert_eq!(
        layers.landlock.status,
        ollie_sandbox::landlock::EnforcementStatus::NotApplied
    );
    assert_eq!(
        layers.landlock.not_applied,
        Some(ollie_sandbox::landlock::NOT_APPLIED_UNSANDBOXED)
    );
    assert!(layers.landlock.handled_fs.is_empty() && layers.landlock.path_rules == 0);
    assert!(!layers.mounts.read_only_root && layers.mounts.writable.is_empty());
    assert!(!layers.best_effort_degraded);
    let v: serde_json::Value = serde_json::from_str(&o.record.to_json()).unwrap();
    assert_eq!(v["layers"]["unsandboxed"], true);
    assert_eq!(v["layers"]["landlock"]["status"], "not_applied");
    assert_eq!(
        v["layers"]["landlock"]["not_applied"],
        ollie_sandbox::landlock::NOT_APPLIED_UNSANDBOXED
    );
    assert_eq!(v["layers"]["no_new_privs"], true);
    assert_eq!(v["layers"]["capabilities"]["effective"], 0);
    assert_eq!(v["layers"]["seccomp"]["profile"], "default");

    // What it keeps: no capabilities (also as root), no_new_privs, the seccomp filter.
    let o = run(
        &u,
        &s.req(&[
            "grep",
            "-E",
            "^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):",
            "/proc/self/status",
        ]),
    );
    let st = status_fields(&o);
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            st.get(cap).map(String::as_str),
            Some("0000000000000000"),
            "{cap} (root: {root}): {st:?}"
        );
    }
    assert_eq!(
        st.get("NoNewPrivs").map(String::as_str),
        Some("1"),
        "{st:?}"
    );
    assert_eq!(st.get("Seccomp").map(String::as_str), Some("2"), "{st:?}");
    let o = run(&u, &s.req(&[PYTHON, "-c", SYSCALL_PROBE]));
    assert_eq!(
        stdout_lines(&o),
        ["EPERM", "EPERM", "EPERM"],
        "unshare, keyctl, io_uring_setup: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The environment is still the allowlist.
    let o = run(&u, &s.req(&["env"]));
    let env = String::from_utf8_lossy(&o.stdout);
    assert!(
        !env.contains("sk-canary") && env.contains("LANG=C.UTF-8"),
        "{env}"
    );
    // The wall-clock timeout and the output cap still hold.
    let mut r = s.req(&["sh", "-c", "head -c 100000 /dev/zero; sleep 30"]);
    r.timeout_seconds = Some(1);
    let o = run(&u, &r);
    assert!(o.record.exit.timed_out);
    assert_eq!(
        o.record.exit.killed_by,
        Some(ollie_sandbox::KilledBy::Timeout)
    );
    assert_eq!(o.stdout.len(), 65536);
    assert!(o.record.stdout.truncated);
    // And the network is the whole network (the grant implies `net`), AF_UNIX still denied.
    let l = Listeners::on("127.0.0.1").unwrap();
    let (r, seen) = probe_network(&s, &u, &l, "127.0.0.1");
    assert_eq!(r, ["ok", "ok", "ok", "ok", "ok", "EPERM"]);
    assert_eq!(
        seen,
        (
            Some(b"hello-tcp".to_vec()),
            Some(b"hello-tcp".to_vec()),
            Some(b"hello-udp".to_vec())
        )
    );

    // The grant covered that run only: the base policy still refuses the same command.
    let o = run(&b, &s.req(&["sh", "-c", &rw]));
    assert_ne!(o.record.exit.code, Some(0));
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "outside-canary\nappended\n"
    );
}

/// Whether this test runs as root (read from `/proc`, no `unsafe`).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        == Some("0")
}

#[test]
fn unsandboxed_is_never_a_prepared_session_nor_narrowed() {
    let s = Scratch::new("prepared-refusal");
    let u = base().with_grants(&[Grant::Unsandboxed], &s.ctx()).unwrap();
    let e = Prepared::new(&u, &s.w(), &s.home()).unwrap_err();
    assert!(
        matches!(&e, SandboxError::InvalidRequest { reason } if reason.contains("unsandboxed")),
        "{e}"
    );
    let e = u.narrow(&ollie_policy::Layer::default()).unwrap_err();
    assert_eq!(e, ollie_policy::NarrowError::Unsandboxed);
}

#[test]
fn policy_file_network_all_in_a_prepared_session() {
    if !features_ok("policy_file_network_all_in_a_prepared_session") {
        return;
    }
    let s = Scratch::new("prepared-all");
    let text = ollie_policy::SHIPPED_PROFILES
        .iter()
        .find(|(n, _)| *n == "workspace")
        .unwrap()
        .1
        .replace("[network]\nmode = \"off\"", "[network]\nmode = \"all\"");
    let p = Policy::from_toml(&text).unwrap();
    assert_eq!(p.network, Network::All);
    assert!(!p.unsandboxed());
    let prep = Prepared::new(&p, &s.w(), &s.home()).unwrap();
    assert_eq!(prep.session().seccomp_layout, "range-tree");
    let l = Listeners::on("127.0.0.1").unwrap();
    let (tcp, other, udp) = l.ports();
    let (tcp, other, udp) = (tcp.to_string(), other.to_string(), udp.to_string());
    let argv = [
        PYTHON,
        "-c",
        NET_PROBE,
        "tcp",
        "127.0.0.1",
        &tcp,
        "tcp",
        "127.0.0.1",
        &other,
        "udp",
        "127.0.0.1",
        &udp,
        "unix",
        "127.0.0.1",
        "0",
    ];
    let o = prep.run(&s.req(&argv)).unwrap();
    assert_eq!(stdout_lines(&o), ["ok", "ok", "ok", "EPERM"]);
    assert_eq!(
        l.take(),
        (
            Some(b"hello-tcp".to_vec()),
            Some(b"hello-tcp".to_vec()),
            Some(b"hello-udp".to_vec())
        )
    );
    // The filesystem is as confined as ever: Landlock still applies, without port rules.
    let ll = &o.record.layers.landlock;
    assert!(ll.handled_net.is_empty() && ll.port_rules == 0);
    assert!(!ll.handled_fs.is_empty() && !o.record.layers.unsandboxed);
    let outside: &Path = &s.0.join("outside");
    let o = prep
        .run(&s.req(&["ls", outside.to_str().unwrap()]))
        .unwrap();
    assert_ne!(o.record.exit.code, Some(0));
}
