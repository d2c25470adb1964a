//! The toolsrv harness shared by the cross-process suites that start the real `toolsrv`
//! (`toolsrv.rs`, `broker.rs`): the binary started with `Toolsrv::spawn` over a socketpair (the
//! way olliesrv starts it) on a temporary workspace with the shipped policies, clients that
//! attach with Tauth, 9P file helpers, `proc/new` payloads and results, and bounded polls.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ollie_p9::wire::om;
use ollie_p9::{ClientError, Fid};
use ollie_testkit::cases::Cases;
use ollie_testkit::client;

use super::{IO_TIMEOUT, STEP, within};

/// The uname every client here uses.
pub const UNAME: &str = "ollie";

// ---------------------------------------------------------------------------------------------
// Harness

// Visible SKIP lines and the kernel feature gate: the shared test kit.
#[allow(unused_imports)] // each suite uses some of these
pub use ollie_testkit::{features_ok, print_skip as skip};
// The toolsrv harness (start/stop, Tauth attach, the shipped policies): the shared test kit.
#[allow(unused_imports)]
pub use ollie_testkit::toolsrv::{
    Dirs, NETWORK_TOML, READONLY_TOML, Ts, WORKSPACE_TOML, shipped_policies, unique,
};

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A `sleep` duration that marks the process in `/proc` (`1000.<pid><n>`): GNU sleep takes
/// any number of fraction digits.
pub fn sleep_marker() -> String {
    format!("1000.{}{:04}", std::process::id(), unique())
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

/// Walks to `path` and opens it with `mode`.
pub async fn open(root: &Fid, path: &str, mode: u8) -> Result<Fid, String> {
    client::open(root, path, mode).await.map_err(|e| msg(&e))
}

/// Reads a whole file through a fresh fid.
pub async fn read(root: &Fid, path: &str) -> Result<String, String> {
    let d = client::read_bytes(root, path).await.map_err(|e| msg(&e))?;
    Ok(String::from_utf8_lossy(&d).into_owned())
}

/// One write through a fresh fid.
pub async fn write(root: &Fid, path: &str, data: &str) -> Result<(), String> {
    client::write(root, path, data).await.map_err(|e| msg(&e))
}

/// Writes `data` and reads the reply on the same fid (`tools`, `proc/new`, `proc/new.bg`).
pub async fn rdwr(root: &Fid, path: &str, data: &str) -> Result<String, String> {
    let d = client::rdwr_bytes(root, path, data)
        .await
        .map_err(|e| msg(&e))?;
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

// ---------------------------------------------------------------------------------------------
// Table-driven `proc/new` cases: every case runs, each failure is reported by the case's name.

/// One check of a `proc/new` result.
#[derive(Debug, Clone)]
pub enum Check {
    /// `exit=` is this status.
    Exit(i32),
    /// `exit=` is not this status (or absent).
    ExitNot(i32),
    /// The body is exactly this.
    Body(String),
    /// The body, trimmed, is exactly this.
    BodyTrim(String),
    /// The body contains this.
    Has(String),
    /// The body does not contain this.
    Lacks(String),
    /// The whole reply (header included) does not contain this.
    RawLacks(String),
    /// The body contains one of these.
    HasAny(Vec<String>),
    /// The body starts with this.
    StartsWith(String),
    /// The body does not start with this.
    NotStartsWith(String),
    /// The body has this many lines.
    Lines(usize),
    /// `pid=` is a positive number.
    Pid,
    /// After the run, this file holds exactly this.
    File(PathBuf, String),
    /// After the run, this path does not exist (removed if it does, so an escape is cleaned up).
    Absent(PathBuf),
}

impl Check {
    /// What is wrong with `r` by this check, if anything.
    fn failure(&self, r: &Run) -> Option<String> {
        let b = &r.body;
        let ok = match self {
            Check::Exit(n) => r.exit() == Some(*n),
            Check::ExitNot(n) => r.exit() != Some(*n),
            Check::Body(s) => b == s,
            Check::BodyTrim(s) => b.trim() == s,
            Check::Has(s) => b.contains(s.as_str()),
            Check::Lacks(s) => !b.contains(s.as_str()),
            Check::RawLacks(s) => !r.raw.contains(s.as_str()),
            Check::HasAny(v) => v.iter().any(|s| b.contains(s.as_str())),
            Check::StartsWith(s) => b.starts_with(s.as_str()),
            Check::NotStartsWith(s) => !b.starts_with(s.as_str()),
            Check::Lines(n) => b.lines().count() == *n,
            Check::Pid => r.pid() > 0,
            Check::File(p, want) => {
                let got = std::fs::read_to_string(p).ok();
                if got.as_deref() == Some(want.as_str()) {
                    return None;
                }
                return Some(format!("{} holds {got:?}, not {want:?}", p.display()));
            }
            Check::Absent(p) => {
                let exists = p.exists();
                if exists {
                    let _ = std::fs::remove_file(p);
                }
                !exists
            }
        };
        (!ok).then(|| format!("{self:?} does not hold: {r:?}"))
    }
}

/// What a case must answer.
#[derive(Debug, Clone)]
pub enum Want {
    /// The tool ran (the reply is a result) and every check holds.
    Ran(Vec<Check>),
    /// `proc/new` refuses the payload with an error containing each of these.
    Refused(Vec<String>),
    /// Both `proc/new` and `proc/new.bg` refuse it with an error containing each of these.
    RefusedBoth(Vec<String>),
    /// `proc/new` refuses the payload with an error starting with this.
    RefusedPrefix(String),
}

/// One row of a table: a name to report, a `proc/new` payload and what it must answer.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub payload: String,
    pub want: Want,
}

/// A [`Case`].
pub fn case(name: impl Into<String>, payload: impl Into<String>, want: Want) -> Case {
    Case {
        name: name.into(),
        payload: payload.into(),
        want,
    }
}

/// [`Check::Has`].
pub fn has(s: &str) -> Check {
    Check::Has(s.to_owned())
}

/// [`Check::Body`].
pub fn body(s: &str) -> Check {
    Check::Body(s.to_owned())
}

/// [`Want::Ran`] with these checks.
pub fn ran(checks: &[Check]) -> Want {
    Want::Ran(checks.to_vec())
}

/// [`Want::Refused`] with these texts.
pub fn refused(wants: &[&str]) -> Want {
    Want::Refused(wants.iter().map(|s| (*s).to_owned()).collect())
}

/// [`Want::RefusedBoth`] with these texts.
pub fn refused_both(wants: &[&str]) -> Want {
    Want::RefusedBoth(wants.iter().map(|s| (*s).to_owned()).collect())
}

/// What is wrong with the error `e` of `what` by `wants`, if anything: each text missing.
fn missing(what: &str, e: &str, wants: &[String]) -> Vec<String> {
    wants
        .iter()
        .filter(|w| !e.contains(w.as_str()))
        .map(|w| format!("{what}: {w:?} not in {e}"))
        .collect()
}

/// What is wrong with one case's answers, if anything (every problem, not only the first).
async fn case_failures(root: &Fid, c: &Case) -> Vec<String> {
    let mut out = Vec::new();
    match &c.want {
        Want::Ran(checks) => match run(root, &c.payload).await {
            Ok(r) => out.extend(checks.iter().filter_map(|k| k.failure(&r))),
            Err(e) => out.push(format!("refused: {e}")),
        },
        Want::RefusedPrefix(p) => match run(root, &c.payload).await {
            Ok(r) => out.push(format!("payload accepted: {r:?}")),
            Err(e) if !e.starts_with(p.as_str()) => {
                out.push(format!(
                    "proc/new: the error does not start with {p:?}: {e}"
                ));
            }
            Err(_) => {}
        },
        Want::Refused(wants) | Want::RefusedBoth(wants) => {
            match run(root, &c.payload).await {
                Ok(r) => out.push(format!("payload accepted: {r:?}")),
                Err(e) => out.extend(missing("proc/new", &e, wants)),
            }
            if matches!(c.want, Want::RefusedBoth(_)) {
                match run_bg(root, &c.payload).await {
                    Ok(pid) => out.push(format!("payload accepted (bg): pid {pid}")),
                    Err(e) => out.extend(missing("proc/new.bg", &e, wants)),
                }
            }
        }
    }
    out
}

/// Runs every case in order through `root` and fails, naming each failed case with its payload
/// and what was wrong, if any failed. Returns how many cases ran.
pub async fn run_cases(root: &Fid, cases: &[Case]) -> usize {
    let mut table = Cases::new();
    for c in cases {
        let problems = case_failures(root, c).await;
        table.check(&c.name, &format!("payload {:?}", c.payload), problems);
    }
    table.finish()
}
