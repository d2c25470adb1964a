//! The toolsrv harness shared by the cross-process suites that start the real `toolsrv`
//! (`toolsrv.rs`, `broker.rs`): the binary started with `Toolsrv::spawn` over a socketpair (the
//! way olliesrv starts it) on a temporary workspace with the shipped policies, clients that
//! attach with Tauth, 9P file helpers, `proc/new` payloads and results, and bounded polls.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ollie_link::auth::{Identity, MasterKey};
use ollie_link::boot::Bootstrap;
use ollie_link::spawn::{Toolsrv, attach};
use ollie_p9::wire::om;
use ollie_p9::{Client, ClientError, Fid};

use super::{IO_TIMEOUT, STEP, bin, within};

pub const WORKSPACE_TOML: &str = include_str!("../../../packaging/policy/workspace.toml");
pub const READONLY_TOML: &str = include_str!("../../../packaging/policy/readonly.toml");
pub const NETWORK_TOML: &str = include_str!("../../../packaging/policy/network.toml");

/// The uname every client here uses.
pub const UNAME: &str = "ollie";

// ---------------------------------------------------------------------------------------------
// Harness

// Visible SKIP lines and the kernel feature gate: the shared test kit.
#[allow(unused_imports)] // each suite uses some of these
pub use ollie_testkit::{features_ok, print_skip as skip};

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The shipped policies, by name.
pub fn shipped_policies() -> BTreeMap<String, String> {
    let mut p = BTreeMap::new();
    p.insert("workspace".to_owned(), WORKSPACE_TOML.to_owned());
    p.insert("readonly".to_owned(), READONLY_TOML.to_owned());
    p.insert("network".to_owned(), NETWORK_TOML.to_owned());
    p
}

/// A number unique in this test process (for `sleep` markers and file names).
pub fn unique() -> u32 {
    static N: AtomicU32 = AtomicU32::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A `sleep` duration that marks the process in `/proc` (`1000.<pid><n>`): GNU sleep takes
/// any number of fraction digits.
pub fn sleep_marker() -> String {
    format!("1000.{}{:04}", std::process::id(), unique())
}

/// A session's directories: the workspace `w/` and the home `home/` under one tempdir.
pub struct Dirs {
    pub dir: tempfile::TempDir,
    pub ws: PathBuf,
    pub home: PathBuf,
}

impl Dirs {
    pub fn new() -> Dirs {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = dir.path().join("w");
        let home = dir.path().join("home");
        std::fs::create_dir(&ws).unwrap();
        std::fs::create_dir(&home).unwrap();
        // The sandbox user (root or not) must be able to enter the tree.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Dirs { dir, ws, home }
    }

    /// A boot configuration with the shipped policies and "workspace" as the default.
    pub fn boot(&self) -> Bootstrap {
        Bootstrap::new(
            format!("test-{}", unique()),
            self.ws.clone(),
            self.home.clone(),
            shipped_policies(),
            "workspace",
        )
    }
}

/// A running toolsrv and our connection to it; the child is killed (if still running) and
/// reaped when dropped.
pub struct Ts {
    pub ts: Toolsrv,
    /// Our end of the link (`None` once closed).
    pub c: Option<Client>,
    pub dirs: Dirs,
}

impl Drop for Ts {
    fn drop(&mut self) {
        let _ = self.ts.child().kill();
        let _ = self.ts.child().wait();
    }
}

impl Ts {
    /// Starts toolsrv with the default boot configuration.
    pub async fn start() -> Ts {
        let dirs = Dirs::new();
        let boot = dirs.boot();
        Ts::start_with(dirs, &boot).await
    }

    pub async fn start_with(dirs: Dirs, boot: &Bootstrap) -> Ts {
        let mut ts = Toolsrv::spawn(&bin("toolsrv"), boot).expect("spawn toolsrv");
        let c = within("version handshake", ts.connect(1 << 16))
            .await
            .expect("version handshake with toolsrv");
        Ts {
            ts,
            c: Some(c),
            dirs,
        }
    }

    pub fn c(&self) -> &Client {
        self.c.as_ref().expect("the link was closed")
    }

    pub fn key(&self) -> &MasterKey {
        self.ts.key()
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.ts.pid()).unwrap()
    }

    /// Attaches as agent `a` (or the operator for "operator").
    pub async fn attach(&self, aname: &str) -> Fid {
        let id = Identity::from_aname(aname).unwrap();
        within("attach", attach(self.c(), self.key(), &id))
            .await
            .unwrap_or_else(|e| panic!("attach as {aname}: {e}"))
    }

    pub fn ws(&self) -> &Path {
        &self.dirs.ws
    }
}

/// The server's message of an error (or the client error itself), asserting it is one line.
pub fn msg(e: &ClientError) -> String {
    let m = e
        .server_message()
        .map_or_else(|| e.to_string(), str::to_owned);
    assert!(!m.contains('\n'), "error is not one line: {m:?}");
    assert!(!m.is_empty(), "empty error");
    m
}

pub async fn open(root: &Fid, path: &str, mode: u8) -> Result<Fid, String> {
    let mut f = within("walk", root.walk_path(path))
        .await
        .map_err(|e| msg(&e))?;
    within("open", f.open(mode)).await.map_err(|e| msg(&e))?;
    Ok(f)
}

/// Reads a whole file through a fresh fid.
pub async fn read(root: &Fid, path: &str) -> Result<String, String> {
    let f = open(root, path, om::OREAD).await?;
    let d = within("read", f.read_to_end()).await.map_err(|e| msg(&e))?;
    let _ = within("clunk", f.clunk()).await;
    Ok(String::from_utf8_lossy(&d).into_owned())
}

/// One write through a fresh fid.
pub async fn write(root: &Fid, path: &str, data: &str) -> Result<(), String> {
    let f = open(root, path, om::OWRITE).await?;
    let r = within("write", f.write(0, Bytes::from(data.to_owned())))
        .await
        .map(|_| ())
        .map_err(|e| msg(&e));
    let _ = within("clunk", f.clunk()).await;
    r
}

/// Writes `data` and reads the reply on the same fid (`tools`, `proc/new`, `proc/new.bg`).
pub async fn rdwr(root: &Fid, path: &str, data: &str) -> Result<String, String> {
    let f = open(root, path, om::ORDWR).await?;
    within("write", f.write(0, Bytes::from(data.to_owned())))
        .await
        .map_err(|e| msg(&e))?;
    let d = within("read", f.read_to_end()).await.map_err(|e| msg(&e))?;
    let _ = within("clunk", f.clunk()).await;
    Ok(String::from_utf8_lossy(&d).into_owned())
}

/// A blocking `proc/new`: the result (header line, then the tool's output).
pub async fn run(root: &Fid, payload: &str) -> Result<Run, String> {
    rdwr(root, "proc/new", payload)
        .await
        .map(|s| Run::parse(&s))
}

/// A `proc/new.bg`: the pid.
pub async fn run_bg(root: &Fid, payload: &str) -> Result<u32, String> {
    let s = rdwr(root, "proc/new.bg", payload).await?;
    assert!(s.ends_with('\n'), "pid line {s:?}");
    Ok(s.trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a pid: {s:?}")))
}

/// An `execute_code` payload.
pub fn code(language: &str, code: &str) -> String {
    let args = serde_json::json!({ "language": language, "code": code });
    format!("tool=execute_code\nargs={args}\n")
}

/// A payload for `tool` with JSON `args`.
pub fn tool(tool: &str, args: serde_json::Value) -> String {
    format!("tool={tool}\nargs={args}\n")
}

/// A `proc/new` result.
#[derive(Debug)]
pub struct Run {
    pub header: BTreeMap<String, String>,
    pub body: String,
    pub raw: String,
}

impl Run {
    pub fn parse(s: &str) -> Run {
        let (head, body) = s.split_once('\n').unwrap_or((s, ""));
        let mut header = BTreeMap::new();
        for w in head.split(' ') {
            let (k, v) = w
                .split_once('=')
                .unwrap_or_else(|| panic!("header word {w:?} is not key=value in {s:?}"));
            header.insert(k.to_owned(), v.to_owned());
        }
        for k in ["pid", "time"] {
            assert!(header.contains_key(k), "header has no {k}=: {head:?}");
        }
        assert!(header["time"].ends_with('s'), "time= {head:?}");
        Run {
            header,
            body: body.to_owned(),
            raw: s.to_owned(),
        }
    }

    pub fn exit(&self) -> Option<i32> {
        self.header.get("exit").map(|e| e.parse().unwrap())
    }

    pub fn pid(&self) -> u32 {
        self.header["pid"].parse().unwrap()
    }
}

/// `key=value` lines as a map.
pub fn kv(s: &str) -> BTreeMap<String, String> {
    s.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `proc/list` as pid → (state, tool).
pub async fn list(root: &Fid) -> BTreeMap<u32, (String, String)> {
    let s = read(root, "proc/list").await.expect("read proc/list");
    s.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 3, "proc/list line {l:?}");
            (f[0].parse().unwrap(), (f[1].to_owned(), f[2].to_owned()))
        })
        .collect()
}

/// Names in a directory.
pub async fn ls(root: &Fid, path: &str) -> BTreeSet<String> {
    let d = open(root, path, om::OREAD).await.expect("open dir");
    let e = within("readdir", d.read_dir()).await.expect("read dir");
    let _ = within("clunk", d.clunk()).await;
    e.into_iter().map(|s| s.name).collect()
}

/// Processes whose command line contains `marker` (zombies have none, so they never match).
pub fn procs_with(marker: &str) -> Vec<i32> {
    let mut v = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return v;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(marker) {
                v.push(pid);
            }
        }
    }
    v
}

/// Polls until `f` holds (bounded by `timeout`); false if it never did.
pub async fn poll(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(STEP).await;
    }
}

/// Waits (bounded) until a process carrying `marker` exists.
pub async fn wait_marker_up(marker: &str) {
    assert!(
        poll(IO_TIMEOUT, || !procs_with(marker).is_empty()).await,
        "no process with {marker} appeared"
    );
}

/// Waits (bounded) until no process carries `marker`.
pub async fn wait_marker_gone(marker: &str) {
    assert!(
        poll(IO_TIMEOUT, || procs_with(marker).is_empty()).await,
        "processes with {marker} remain: {:?}",
        procs_with(marker)
    );
}

/// Waits (bounded) until `out` of `pid` contains `needle`.
pub async fn wait_out(root: &Fid, pid: u32, needle: &str) -> String {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let o = read(root, &format!("proc/{pid}/out")).await.expect("out");
        if o.contains(needle) {
            return o;
        }
        assert!(
            Instant::now() < deadline,
            "{needle:?} never appeared in proc/{pid}/out: {o:?}"
        );
        tokio::time::sleep(STEP).await;
    }
}
