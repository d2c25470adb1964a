//! The broker harness shared by the approval suites (`broker.rs`, `approval_hold.rs`): a
//! toolsrv with agent `a` and the operator attached and a directory beside the workspace that
//! the workspace policy does not let tools write; escalated calls in flight; `bypass/pending`,
//! `bypass/log` and `bypass/resolve`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ollie_p9::client::Call;
use ollie_p9::wire::om;
use ollie_p9::{Fid, Rmsg};
use serde_json::{Value, json};

use super::toolsrv::*;
use super::{IO_TIMEOUT, STEP, within};

/// How long a read must stay unanswered to count as blocked.
pub const QUIET: Duration = Duration::from_millis(300);

/// The reason every request here gives.
pub const REASON: &str = "write the report beside the workspace";

// ---------------------------------------------------------------------------------------------
// Harness

/// A toolsrv with agent `a` and the operator attached, and a directory beside the workspace
/// (`outside/`) that the workspace policy does not let tools write.
pub struct Case {
    pub t: Ts,
    pub session: String,
    pub a: Fid,
    pub op: Fid,
    pub outside: PathBuf,
}

impl Case {
    pub async fn start(case: &str) -> Option<Case> {
        Case::start_with(case, |_| {}).await
    }

    pub async fn start_with(
        case: &str,
        f: impl FnOnce(&mut ollie_link::boot::Bootstrap),
    ) -> Option<Case> {
        if !features_ok(case) {
            return None;
        }
        let dirs = Dirs::new();
        let outside = dirs.dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut boot = dirs.boot();
        f(&mut boot);
        let session = boot.session.clone();
        let t = Ts::start_with(dirs, &boot).await;
        let a = t.attach("a").await;
        let op = t.attach("operator").await;
        Some(Case {
            t,
            session,
            a,
            op,
            outside,
        })
    }

    /// The grant that lets a tool write `outside/`.
    pub fn grant(&self) -> String {
        format!("write:{}", self.outside.display())
    }

    /// A file in `outside/`.
    pub fn out(&self, name: &str) -> PathBuf {
        self.outside.join(name)
    }
}

/// An `execute_code` (bash) payload asking for `grants`.
pub fn esc(cmd: &str, grants: &[&str]) -> String {
    tool(
        "execute_code",
        json!({"language": "bash", "code": cmd, "escalate": {"grants": grants, "reason": REASON}}),
    )
}

/// `echo WORD >> FILE` (appends, so a second run shows).
pub fn append(word: &str, file: &Path) -> String {
    format!("echo {word} >> {}", file.display())
}

/// A blocking `proc/new` call whose read is in flight (dropping it flushes the read).
pub struct InFlight {
    pub f: Fid,
    pub call: Call,
}

/// Writes `payload` to a fresh `proc/new` fid and sends its first read.
pub async fn start_call(root: &Fid, payload: &str) -> InFlight {
    let f = open(root, "proc/new", om::ORDWR)
        .await
        .expect("open proc/new");
    within("write", f.write(0, Bytes::from(payload.to_owned())))
        .await
        .unwrap_or_else(|e| panic!("payload refused: {}", msg(&e)));
    let call = f.read_call(0, f.iounit()).expect("send the read");
    InFlight { f, call }
}

impl InFlight {
    /// The call's result (bounded): the run, or the read's error message.
    pub async fn finish(self) -> Result<Run, String> {
        let InFlight { f, call } = self;
        let first = match within("proc/new read", call).await {
            Ok(Rmsg::Read { data }) => data,
            Ok(other) => panic!("proc/new read: unexpected reply {other:?}"),
            Err(e) => return Err(msg(&e)),
        };
        let mut out = first.to_vec();
        loop {
            let d = within("read", f.read(out.len() as u64, f.iounit()))
                .await
                .map_err(|e| msg(&e))?;
            if d.is_empty() {
                break;
            }
            out.extend_from_slice(&d);
        }
        let _ = within("clunk", f.clunk()).await;
        Ok(Run::parse(&String::from_utf8_lossy(&out)))
    }

    /// Whether the call is still waiting after [`QUIET`].
    pub async fn still_waiting(&mut self) -> bool {
        tokio::time::timeout(QUIET, &mut self.call).await.is_err()
    }
}

/// A `bypass/pending` fid.
pub struct Pending(pub Fid);

impl Pending {
    pub async fn open(op: &Fid) -> Pending {
        Pending(
            open(op, "bypass/pending", om::OREAD)
                .await
                .expect("open bypass/pending"),
        )
    }

    /// The next request this fid has not shown, if one comes within `d` (else the read is
    /// flushed and `None`). Checks it is one JSON object on one line.
    pub async fn next_within(&self, d: Duration) -> Option<Value> {
        let f = &self.0;
        let got = tokio::time::timeout(d, async {
            let mut buf = Vec::new();
            loop {
                let b = f
                    .read(0, 8192)
                    .await
                    .unwrap_or_else(|e| panic!("read bypass/pending: {}", msg(&e)));
                assert!(!b.is_empty(), "bypass/pending returned end of file");
                buf.extend_from_slice(&b);
                if buf.ends_with(b"\n") {
                    return buf;
                }
            }
        })
        .await
        .ok()?;
        let s = String::from_utf8(got).expect("pending is UTF-8");
        assert_eq!(s.matches('\n').count(), 1, "not one line: {s:?}");
        let v: Value =
            serde_json::from_str(&s).unwrap_or_else(|e| panic!("pending is not JSON ({e}): {s:?}"));
        assert!(v.is_object(), "pending is not an object: {s:?}");
        Some(v)
    }

    /// The next request (bounded by [`IO_TIMEOUT`]).
    pub async fn next(&self) -> Value {
        self.next_within(IO_TIMEOUT)
            .await
            .expect("no request appeared on bypass/pending")
    }
}

/// The id of the oldest pending request, read through a fresh fid (waits for one).
pub async fn next_id(op: &Fid) -> String {
    let v = Pending::open(op).await.next().await;
    v["id"].as_str().expect("id is a string").to_owned()
}

/// Whether nothing is pending: a fresh fid's read stays unanswered for [`QUIET`].
pub async fn nothing_pending(op: &Fid) -> bool {
    Pending::open(op).await.next_within(QUIET).await.is_none()
}

/// Polls until nothing is pending (bounded); false if something stayed.
pub async fn wait_nothing_pending(op: &Fid) -> bool {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        if nothing_pending(op).await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(STEP).await;
    }
}

/// Every event `bypass/log` holds now, through a fresh fid (it stops at the first read
/// that gets no answer within [`QUIET`]).
pub async fn log_events(op: &Fid) -> Vec<Value> {
    let f = open(op, "bypass/log", om::OREAD)
        .await
        .expect("open bypass/log");
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while let Ok(r) = tokio::time::timeout(QUIET, f.read(0, 8192)).await {
        let b = r.unwrap_or_else(|e| panic!("read bypass/log: {}", msg(&e)));
        assert!(!b.is_empty(), "bypass/log returned end of file");
        buf.extend_from_slice(&b);
        if buf.ends_with(b"\n") {
            let line = String::from_utf8(std::mem::take(&mut buf)).expect("UTF-8");
            out.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}")));
        }
    }
    out
}

/// One write of `data` to `bypass/resolve`.
pub async fn resolve(root: &Fid, data: &str) -> Result<(), String> {
    write(root, "bypass/resolve", data).await
}

pub fn approve(id: &str) -> String {
    json!({"id": id, "approved": true}).to_string()
}

pub fn deny(id: &str, why: &str) -> String {
    json!({"id": id, "error": why}).to_string()
}

pub fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `YYYY-MM-DDTHH:MM:SSZ`.
pub fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 20
        && b.iter().enumerate().all(|(i, &c)| match i {
            4 | 7 => c == b'-',
            10 => c == b'T',
            13 | 16 => c == b':',
            19 => c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

/// Asserts the write `cmd` does without a grant is denied and leaves `file` absent.
pub async fn assert_denied_without_grant(a: &Fid, cmd: &str, file: &Path) {
    let r = run(a, &code("bash", cmd)).await.expect("ungranted run");
    assert_ne!(r.exit(), Some(0), "the ungranted write succeeded: {r:?}");
    assert!(
        r.body.contains("Permission denied") || r.body.contains("Read-only"),
        "{r:?}"
    );
    assert!(
        !file.exists(),
        "the ungranted write created {}",
        file.display()
    );
}

/// Writes an executable script.
pub fn script(path: &Path, body: &str) {
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}
