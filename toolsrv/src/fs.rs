//! The toolsrv tree, served over 9P on the link (the seed's tree, DESIGN.md §4):
//!
//! ```text
//! ctl            w     load AGENT TOOL | unload AGENT TOOL | policy AGENT NAME | escalations AGENT KINDS|none
//!                      | unions AGENT JSON|none | bypass_timeout SECONDS
//!                      | hold ID TREES | release ID | held ID | unheld ID (all but load/unload: operator)
//! tools          rw    write an agent id (optionally followed by " json"), read its tools
//! info           r     host=, pid=, platform=, arch=, the sandbox layers the kernel offers, the session
//! bypass/pending r     (operator) blocks until an escalation request is pending
//! bypass/resolve w     (operator) {"id":"…","approved":true} | {"id":"…","error":"…"}
//! bypass/log     r     (operator) blocks; one broker event (JSON line) per read, from the first kept
//! bypass/full    rw    (operator) write a pending request's id, read the whole request, escaped
//! proc/list      r     pid<TAB>state<TAB>tool, one line per visible process
//! proc/new       rw    write a payload; read blocks until the process ends, then the result
//! proc/new.bg    rw    write a payload; read the pid
//! proc/complete  r     blocks; one <system-proc-complete> message per background process end
//! proc/N/out     r     output captured so far
//! proc/N/wait    r     blocks until N ends; its status (exit code or 128+signal)
//! proc/N/stat    r     key=value status (held=no|waiting|frozen while it runs: crate::quiesce)
//! proc/N/record  r     the sandbox's run record: one JSON object and "\n" (an error while N runs)
//! proc/N/ctl     w     term | kill | signal N | dismiss
//! ```
//!
//! `proc/N/record` is `ollie_sandbox::RunRecord` as compact JSON (argv, cwd, program, the
//! enforced layers — Landlock ABI and status, seccomp, capabilities, namespaces, mounts —
//! limits, exit, rusage, output sizes, post-run findings); when the sandbox refused or failed
//! to start the tool it is `{"error":"…"}` (the sandbox's error). Reading it while N still
//! runs fails with `process N is still running (read wait first)`.
//!
//! A blocking `proc/new` payload may carry `record=1`: the reply then starts with one more
//! line, `{"pid":N,"record":{…}}` (the same object `proc/N/record` holds), or
//! `{"pid":N,"record":null,"error":"…"}` when the tool never ran — then that line is the
//! whole reply (without the key such a read is the error `tool did not run: …`). After the
//! line comes the result exactly as without the key. `record=0` is the default; other values
//! are refused, and so is the key on `proc/new.bg` (its record is in `proc/N/record`).
//!
//! Payload keys are listed in [`crate::payload`]; `stdin=` and `output=split` (stdout and
//! stderr apart, as one JSON line) are what olliesrv's lifecycle hooks run with.
//!
//! Every connection must authenticate (see [`crate::auth`]); the aname it attached with
//! scopes what it sees: an agent sees only its own processes (another agent's pid does not
//! exist for it) and may change only its own tool set; the operator sees everything and is
//! the only one who may use `bypass/` and `ctl policy`.

use std::sync::Arc;

use bytes::Bytes;
use ollie_p9::server::{ConnInfo, Filesystem, Walked};
use ollie_p9::util::{DirSnapshot, read_at};
use ollie_p9::wire::{Qid, Stat, dm, om, qt};
use ollie_p9::{Error, Result};

use crate::auth::{AuthState, Identity, MasterKey};
use crate::procs::{Proc, State};
use crate::session::Session;

/// Files of a process directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidFile {
    Dir,
    Out,
    Wait,
    Stat,
    Record,
    Ctl,
}

impl PidFile {
    const FILES: [(&'static str, PidFile, u32); 5] = [
        ("out", PidFile::Out, 0o444),
        ("wait", PidFile::Wait, 0o444),
        ("stat", PidFile::Stat, 0o444),
        ("record", PidFile::Record, 0o444),
        ("ctl", PidFile::Ctl, 0o222),
    ];
}

/// A node of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    Auth,
    Root,
    Ctl,
    Tools,
    Info,
    Bypass,
    Pending,
    Resolve,
    Log,
    Full,
    Proc,
    List,
    New,
    NewBg,
    Complete,
    Pid(u32, PidFile),
}

/// `(name, node, mode)` of the root's entries.
const ROOT: &[(&str, Node, u32)] = &[
    ("ctl", Node::Ctl, 0o222),
    ("tools", Node::Tools, 0o666),
    ("info", Node::Info, 0o444),
    ("bypass", Node::Bypass, dm::DIR | 0o555),
    ("proc", Node::Proc, dm::DIR | 0o555),
];
const BYPASS: &[(&str, Node, u32)] = &[
    ("pending", Node::Pending, 0o400),
    ("resolve", Node::Resolve, 0o200),
    ("log", Node::Log, 0o400),
    ("full", Node::Full, 0o600),
];
const PROC: &[(&str, Node, u32)] = &[
    ("list", Node::List, 0o444),
    ("new", Node::New, 0o666),
    ("new.bg", Node::NewBg, 0o666),
    ("complete", Node::Complete, 0o444),
];

impl Node {
    fn is_dir(self) -> bool {
        matches!(
            self,
            Node::Root | Node::Bypass | Node::Proc | Node::Pid(_, PidFile::Dir)
        )
    }

    fn qid_path(self) -> u64 {
        match self {
            Node::Auth => 1,
            Node::Root => 2,
            Node::Ctl => 3,
            Node::Tools => 4,
            Node::Info => 5,
            Node::Bypass => 6,
            Node::Pending => 7,
            Node::Resolve => 8,
            Node::Proc => 9,
            Node::List => 10,
            Node::New => 11,
            Node::NewBg => 12,
            Node::Complete => 13,
            Node::Log => 14,
            Node::Full => 15,
            Node::Pid(id, f) => {
                (1 << 40)
                    | (u64::from(id) << 4)
                    | match f {
                        PidFile::Dir => 0,
                        PidFile::Out => 1,
                        PidFile::Wait => 2,
                        PidFile::Stat => 3,
                        PidFile::Ctl => 4,
                        PidFile::Record => 5,
                    }
            }
        }
    }

    fn qid(self) -> Qid {
        Qid {
            ty: match self {
                Node::Auth => qt::AUTH,
                n if n.is_dir() => qt::DIR,
                _ => qt::FILE,
            },
            version: 0,
            path: self.qid_path(),
        }
    }

    fn name_mode(self) -> (String, u32) {
        let find = |t: &[(&str, Node, u32)]| {
            t.iter()
                .find(|e| e.1 == self)
                .map(|e| (e.0.to_owned(), e.2))
        };
        match self {
            Node::Root => ("/".into(), dm::DIR | 0o555),
            Node::Auth => ("auth".into(), dm::AUTH | 0o600),
            Node::Pid(id, PidFile::Dir) => (id.to_string(), dm::DIR | 0o555),
            Node::Pid(_, f) => PidFile::FILES
                .iter()
                .find(|e| e.1 == f)
                .map_or(("?".into(), 0), |e| (e.0.to_owned(), e.2)),
            n => find(ROOT)
                .or_else(|| find(BYPASS))
                .or_else(|| find(PROC))
                .unwrap_or_else(|| (format!("{n:?}"), 0)),
        }
    }
}

/// Per-fid state.
#[derive(Debug)]
pub struct ToolFid {
    node: Node,
    /// Who the fid acts for (`None` on an auth fid).
    who: Option<Identity>,
    auth: Option<AuthState>,
    /// Frozen content (info, stat, list, the reply to a `tools` write, a bg pid).
    content: Option<Bytes>,
    dir: Option<DirSnapshot>,
    /// `proc/new`: the process started by the last write, and its result once read.
    started: Option<Arc<Proc>>,
    result: Option<Bytes>,
    /// `proc/new`: the last write asked for the run record (`record=1`).
    with_record: bool,
    /// `proc/complete`: the last completion given, and the unread rest of the current one
    /// (also `bypass/pending`'s unread rest).
    cursor: u64,
    pending: Bytes,
    /// `bypass/pending`: the requests this fid was shown.
    seen: std::collections::HashSet<String>,
    /// `proc/N/wait`: the status line once known.
    status: Option<Bytes>,
}

impl ToolFid {
    fn new(node: Node, who: Option<Identity>) -> ToolFid {
        ToolFid {
            node,
            who,
            auth: None,
            content: None,
            dir: None,
            started: None,
            result: None,
            with_record: false,
            cursor: 0,
            pending: Bytes::new(),
            seen: std::collections::HashSet::new(),
            status: None,
        }
    }
}

/// The toolsrv filesystem.
#[derive(Debug)]
pub struct ToolFs {
    pub session: Arc<Session>,
    key: MasterKey,
    owner: String,
    started: u32,
}

fn err(s: String) -> Error {
    Error::new(s)
}

/// Stops a blocking `proc/new` process when its read is flushed (the caller gave up).
struct CancelOnDrop(Option<Arc<Proc>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take()
            && p.running()
        {
            tracing::debug!(pid = p.id, "proc/new read flushed: stopping the process");
            p.stop.send_replace(true);
            p.cancel.cancel();
        }
    }
}

/// The reply of a `new` fid once its tool has finished (the payload's header and result, or
/// with `record=1` the record line); a flushed read stops the tool.
async fn new_result(fid: &ToolFid) -> Result<String> {
    let p = fid
        .started
        .clone()
        .ok_or_else(|| Error::invalid("write a payload first"))?;
    let mut guard = CancelOnDrop(Some(Arc::clone(&p)));
    let f = p.finished().await;
    guard.0 = None;
    let mut r = if fid.with_record {
        p.record_line(&f)
    } else {
        String::new()
    };
    match &f.error {
        // With record=1 the record line (carrying the error) is the reply.
        Some(_) if fid.with_record => {}
        Some(e) => return Err(err(format!("tool did not run: {e}"))),
        None => {
            r.push_str(&p.header(&f));
            r.push('\n');
            r.push_str(&f.result);
        }
    }
    Ok(r)
}

impl ToolFs {
    pub fn new(session: Arc<Session>, key: MasterKey) -> ToolFs {
        ToolFs {
            session,
            key,
            owner: ollie_p9::dial::current_user(),
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as u32),
        }
    }

    fn who(fid: &ToolFid) -> Result<&Identity> {
        fid.who
            .as_ref()
            .ok_or_else(|| Error::new("not a file: this is an authentication fid"))
    }

    fn stat_of(&self, node: Node, length: u64) -> Stat {
        let (name, mode) = node.name_mode();
        Stat {
            ty: 0,
            dev: 0,
            qid: node.qid(),
            mode,
            atime: self.started,
            mtime: self.started,
            length,
            name,
            uid: self.owner.clone(),
            gid: "agent".into(),
            muid: self.owner.clone(),
        }
    }

    fn entries(&self, node: Node, who: &Identity) -> Vec<Stat> {
        let table = match node {
            Node::Root => ROOT,
            Node::Bypass if *who == Identity::Operator => BYPASS,
            Node::Bypass => &[],
            Node::Proc => PROC,
            Node::Pid(id, PidFile::Dir) => {
                return PidFile::FILES
                    .iter()
                    .map(|e| self.stat_of(Node::Pid(id, e.1), 0))
                    .collect();
            }
            _ => &[],
        };
        let mut v: Vec<Stat> = table.iter().map(|e| self.stat_of(e.1, 0)).collect();
        if node == Node::Proc {
            for p in self.session.procs.visible(who) {
                v.push(self.stat_of(Node::Pid(p.id, PidFile::Dir), 0));
            }
        }
        v
    }

    fn step(&self, node: Node, name: &str, who: &Identity) -> Option<Node> {
        let look = |t: &[(&str, Node, u32)]| t.iter().find(|e| e.0 == name).map(|e| e.1);
        match (node, name) {
            (Node::Root, "." | "..") => Some(Node::Root),
            (Node::Bypass | Node::Proc, "..") => Some(Node::Root),
            (Node::Pid(_, PidFile::Dir), "..") => Some(Node::Proc),
            (Node::Root, n) => look(ROOT).filter(|_| !n.is_empty()),
            (Node::Bypass, _) if *who != Identity::Operator => None,
            (Node::Bypass, _) => look(BYPASS),
            (Node::Proc, n) => look(PROC).or_else(|| {
                let id: u32 = n.parse().ok()?;
                if id.to_string() != n {
                    return None;
                }
                self.session
                    .procs
                    .get(id, who)
                    .map(|_| Node::Pid(id, PidFile::Dir))
            }),
            (Node::Pid(id, PidFile::Dir), n) => PidFile::FILES
                .iter()
                .find(|e| e.0 == n)
                .map(|e| Node::Pid(id, e.1)),
            _ => None,
        }
    }

    fn proc_of(&self, id: u32, who: &Identity) -> Result<Arc<Proc>> {
        self.session.procs.get(id, who).ok_or_else(Error::not_found)
    }

    fn info_text(&self) -> String {
        let pr = ollie_sandbox::probe();
        let s = &self.session;
        // Where tools run: the host (a remote session's is not olliesrv's) and this toolsrv.
        let host = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().replace(char::is_whitespace, "_"))
            .unwrap_or_else(|_| "unknown".to_owned());
        format!(
            "host={host}\npid={}\nplatform={}\narch={}\nlandlock_abi={}\nuser_namespaces={}\nseccomp={}\nsession={}\nworkdir={}\npolicies={}\ndefault_policy={}\nlanguages={}\n",
            std::process::id(),
            std::env::consts::OS,
            std::env::consts::ARCH,
            pr.landlock_abi,
            pr.user_namespaces,
            ollie_sandbox::seccomp_available(),
            s.id,
            s.workdir.display(),
            s.policies.keys().cloned().collect::<Vec<_>>().join(","),
            s.default_policy,
            s.tools
                .languages
                .iter()
                .map(|l| l.name)
                .collect::<Vec<_>>()
                .join(","),
        )
    }

    fn list_text(&self, who: &Identity) -> String {
        let mut s = String::new();
        for p in self.session.procs.visible(who) {
            let state = match p.current() {
                State::Running => "running",
                State::Done(f) => f.state(),
            };
            s.push_str(&format!("{}\t{state}\t{}\n", p.id, p.tool));
        }
        s
    }

    /// `name<spaces>description` lines, or the JSON schemas.
    fn tools_text(&self, agent: Option<&str>, json: bool) -> String {
        let loaded = agent.map(|a| self.session.tools_of(a));
        let defs = crate::tools::TOOLS
            .iter()
            .filter(|t| loaded.as_ref().is_none_or(|l| l.contains(t.name)));
        if json {
            let v: Vec<serde_json::Value> = defs
                .filter_map(|t| self.session.tools.schema(t.name))
                .collect();
            let mut s = serde_json::Value::Array(v).to_string();
            s.push('\n');
            return s;
        }
        defs.map(|t| format!("{:<14}{}\n", t.name, t.description))
            .collect()
    }

    fn tools_write(&self, who: &Identity, text: &str) -> Result<String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let (agent, json) = match words.as_slice() {
            [] => (who.aname().to_owned(), false),
            ["json"] => (who.aname().to_owned(), true),
            [a] => (a.to_string(), false),
            [a, "json"] => (a.to_string(), true),
            _ => {
                return Err(Error::invalid(
                    "write an agent id, optionally followed by \"json\"",
                ));
            }
        };
        if agent == crate::auth::OPERATOR && *who == Identity::Operator {
            return Ok(self.tools_text(None, json));
        }
        crate::auth::validate_agent_id(&agent).map_err(err)?;
        if !who.may_act_for(&agent) {
            return Err(err(format!(
                "permission denied: {} cannot list the tools of {agent}",
                who.aname()
            )));
        }
        Ok(self.tools_text(Some(&agent), json))
    }

    /// A verdict on `bypass/resolve` (strict, and whole in one write at offset 0: see
    /// `ollie_link::bypass::parse_resolve_at`).
    fn resolve(&self, offset: u64, data: &[u8]) -> Result<&'static str> {
        let r = ollie_link::bypass::parse_resolve_at(offset, data)
            .map_err(|e| Error::invalid(e.to_string()))?;
        self.session
            .broker
            .resolve(r)
            .map_err(|e| err(format!("resolve: {e}")))
    }

    fn pid_ctl(&self, p: &Proc, text: &str) -> Result<()> {
        let words: Vec<&str> = text.split_whitespace().collect();
        match words.as_slice() {
            ["term"] => {
                if p.running() {
                    p.stop.send_replace(true);
                    p.cancel.cancel();
                }
                Ok(())
            }
            ["kill"] => {
                if p.running() {
                    p.stop.send_replace(true);
                    p.cancel.kill();
                }
                Ok(())
            }
            ["signal", n] => {
                let sig: i32 = n
                    .parse()
                    .map_err(|_| Error::invalid(format!("signal: {n:?} is not a number")))?;
                if !p.running() {
                    return Err(err(format!("process {} has already ended", p.id)));
                }
                p.cancel
                    .signal(sig)
                    .map_err(|e| err(format!("signal: {e}")))
            }
            ["dismiss"] => self.session.procs.dismiss(p.id).map_err(err),
            _ => Err(Error::invalid("commands: term, kill, signal N, dismiss")),
        }
    }
}

fn may_open(mode: u32, omode: u8) -> bool {
    // Permission bits are the same for every identity; identity checks are separate.
    let bits = mode & 0o7 | (mode >> 3) & 0o7 | (mode >> 6) & 0o7;
    let need = ollie_p9::util::open_needs(omode);
    bits & need == need
}

fn text(data: &[u8]) -> Result<&str> {
    std::str::from_utf8(data).map_err(|_| Error::invalid("not utf-8"))
}

impl Filesystem for ToolFs {
    type Fid = ToolFid;

    async fn auth(&self, conn: &ConnInfo, uname: &str, aname: &str) -> Result<(ToolFid, Qid)> {
        let st =
            AuthState::new(uname, aname).map_err(|e| err(format!("permission denied: {e}")))?;
        tracing::debug!(conn = conn.id, aname, "tauth");
        let mut f = ToolFid::new(Node::Auth, None);
        f.auth = Some(st);
        Ok((f, Node::Auth.qid()))
    }

    async fn attach(
        &self,
        conn: &ConnInfo,
        auth: Option<&mut ToolFid>,
        uname: &str,
        aname: &str,
    ) -> Result<(ToolFid, Qid)> {
        let Some(afid) = auth else {
            return Err(Error::new(
                "permission denied: authentication required (Tauth with your aname first)",
            ));
        };
        let st = afid
            .auth
            .as_mut()
            .ok_or_else(|| Error::new("permission denied: not an authentication fid"))?;
        let who = st.attach(uname, aname).map_err(err)?;
        tracing::info!(conn = conn.id, identity = who.aname(), "attached");
        Ok((ToolFid::new(Node::Root, Some(who)), Node::Root.qid()))
    }

    async fn walk(&self, fid: &ToolFid, names: &[String]) -> Result<Walked<ToolFid>> {
        let who = Self::who(fid)?;
        let mut node = fid.node;
        let mut qids = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            match self.step(node, name, who) {
                Some(n) => {
                    node = n;
                    qids.push(n.qid());
                }
                None if i == 0 => return Err(Error::not_found()),
                None => return Ok(Walked { qids, fid: None }),
            }
        }
        Ok(Walked {
            qids,
            fid: Some(ToolFid::new(node, Some(who.clone()))),
        })
    }

    async fn open(&self, fid: &mut ToolFid, mode: u8) -> Result<(Qid, u32)> {
        let who = Self::who(fid)?.clone();
        let (_, perm) = fid.node.name_mode();
        if !may_open(perm, mode) {
            return Err(Error::permission_denied());
        }
        match fid.node {
            Node::Pending | Node::Resolve | Node::Log | Node::Full if who != Identity::Operator => {
                return Err(err(
                    "permission denied: only the operator uses bypass/".into()
                ));
            }
            Node::Info => fid.content = Some(Bytes::from(self.info_text())),
            Node::List => fid.content = Some(Bytes::from(self.list_text(&who))),
            Node::Pid(id, f) => {
                let p = self.proc_of(id, &who)?;
                if f == PidFile::Stat {
                    fid.content = Some(Bytes::from(p.stat_text()));
                }
            }
            _ => {}
        }
        Ok((fid.node.qid(), 0))
    }

    async fn read(&self, fid: &mut ToolFid, offset: u64, count: u32) -> Result<Bytes> {
        if fid.node == Node::Auth {
            let st = fid
                .auth
                .as_ref()
                .ok_or_else(|| Error::new("not an authentication fid"))?;
            let token = st.read().map_err(err)?;
            return Ok(read_at(&Bytes::from(token), offset, count));
        }
        let who = Self::who(fid)?.clone();
        match fid.node {
            n if n.is_dir() => {
                if offset == 0 || fid.dir.is_none() {
                    fid.dir = Some(DirSnapshot::new(&self.entries(n, &who)));
                }
                fid.dir
                    .as_ref()
                    .map_or(Ok(Bytes::new()), |d| d.read(offset, count))
            }
            Node::NewBg if fid.content.is_none() => Err(Error::invalid("write a payload first")),
            Node::Pid(id, PidFile::Record) => {
                if fid.content.is_none() {
                    let p = self.proc_of(id, &who)?;
                    fid.content = Some(Bytes::from(p.record_file().map_err(err)?));
                }
                Ok(fid
                    .content
                    .as_ref()
                    .map_or(Bytes::new(), |c| read_at(c, offset, count)))
            }
            Node::Full if fid.content.is_none() => {
                Err(Error::invalid("write the id of a pending request first"))
            }
            Node::Info | Node::List | Node::Pid(_, PidFile::Stat) | Node::NewBg | Node::Full => {
                Ok(fid
                    .content
                    .as_ref()
                    .map_or(Bytes::new(), |c| read_at(c, offset, count)))
            }
            Node::Tools => {
                if fid.content.is_none() {
                    let t = self.tools_write(&who, "")?;
                    fid.content = Some(Bytes::from(t));
                }
                Ok(fid
                    .content
                    .as_ref()
                    .map_or(Bytes::new(), |c| read_at(c, offset, count)))
            }
            Node::New => {
                if fid.result.is_none() {
                    fid.result = Some(Bytes::from(new_result(fid).await?));
                }
                Ok(fid
                    .result
                    .as_ref()
                    .map_or(Bytes::new(), |c| read_at(c, offset, count)))
            }
            Node::Complete => {
                if fid.pending.is_empty() {
                    let c = self.session.procs.next_completion(fid.cursor, &who).await;
                    fid.cursor = c.seq;
                    fid.pending = Bytes::from(c.message.as_bytes().to_vec());
                }
                let n = fid.pending.len().min(count as usize);
                Ok(fid.pending.split_to(n))
            }
            Node::Pending => {
                // One request per read, each once per fid; a read waits for the next (flush
                // it to give up). A request larger than the read comes in pieces.
                if fid.pending.is_empty() {
                    let shown = self.session.broker.next_pending(&mut fid.seen).await;
                    fid.pending = Bytes::from(shown.as_bytes().to_vec());
                }
                let n = fid.pending.len().min(count as usize);
                Ok(fid.pending.split_to(n))
            }
            Node::Log => {
                // One event per read, in order, each once per fid (a fid starts at the
                // oldest event kept); a read waits for the next.
                if fid.pending.is_empty() {
                    let (seq, line) = self.session.broker.next_event(fid.cursor).await;
                    fid.cursor = seq;
                    fid.pending = Bytes::from(line.as_bytes().to_vec());
                }
                let n = fid.pending.len().min(count as usize);
                Ok(fid.pending.split_to(n))
            }
            Node::Pid(id, PidFile::Out) => {
                let p = self.proc_of(id, &who)?;
                Ok(Bytes::from(p.out_at(offset, count)))
            }
            Node::Pid(id, PidFile::Wait) => {
                if fid.status.is_none() {
                    let p = self.proc_of(id, &who)?;
                    let f = p.finished().await;
                    if let Some(e) = &f.error {
                        return Err(err(format!("tool did not run: {e}")));
                    }
                    let s = f
                        .status()
                        .map_or_else(|| "-1".to_owned(), |s| s.to_string());
                    fid.status = Some(Bytes::from(format!("{s}\n")));
                }
                Ok(fid
                    .status
                    .as_ref()
                    .map_or(Bytes::new(), |c| read_at(c, offset, count)))
            }
            _ => Err(Error::permission_denied()),
        }
    }

    async fn write(&self, fid: &mut ToolFid, offset: u64, data: Bytes) -> Result<u32> {
        let n = data.len() as u32;
        if fid.node == Node::Auth {
            let st = fid
                .auth
                .as_mut()
                .ok_or_else(|| Error::new("not an authentication fid"))?;
            st.write(&self.key, &data).map_err(err)?;
            return Ok(n);
        }
        let who = Self::who(fid)?.clone();
        match fid.node {
            Node::Ctl => {
                let t = text(&data)?;
                let lines: Vec<&str> = t.lines().filter(|l| !l.trim().is_empty()).collect();
                if lines.is_empty() {
                    return Err(Error::invalid("empty command"));
                }
                for l in lines {
                    // Holding for another session's escalation waits for this session's calls
                    // to stop.
                    if let Some(rest) = l.trim_start().strip_prefix("hold ") {
                        self.session.hold_for_peer(&who, rest).await.map_err(err)?;
                        continue;
                    }
                    self.session.ctl(&who, l).map_err(err)?;
                }
                Ok(n)
            }
            Node::Tools => {
                fid.content = None;
                let reply = self.tools_write(&who, text(&data)?)?;
                fid.content = Some(Bytes::from(reply));
                Ok(n)
            }
            Node::New | Node::NewBg => {
                if let Some(p) = &fid.started
                    && fid.node == Node::New
                    && fid.result.is_none()
                    && p.running()
                {
                    return Err(Error::new(
                        "a process started on this fid is still running; read its result first",
                    ));
                }
                let payload = crate::payload::parse(text(&data)?).map_err(err)?;
                let bg = fid.node == Node::NewBg;
                if bg && payload.record.is_some() {
                    return Err(Error::invalid(
                        "record= is for proc/new only; a background process's run record is in proc/N/record",
                    ));
                }
                let with_record = payload.record == Some(true);
                let p = self.session.start(&who, payload, bg).map_err(err)?;
                tracing::debug!(pid = p.id, owner = %p.owner, tool = %p.tool, bg, "process started");
                fid.result = None;
                fid.with_record = with_record;
                fid.content = bg.then(|| Bytes::from(format!("{}\n", p.id)));
                fid.started = Some(p);
                Ok(n)
            }
            Node::Resolve => {
                if who != Identity::Operator {
                    return Err(Error::permission_denied());
                }
                self.resolve(offset, &data)?;
                Ok(n)
            }
            Node::Full => {
                if who != Identity::Operator {
                    return Err(Error::permission_denied());
                }
                fid.content = None;
                let id = text(&data)?.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
                if !ollie_link::bypass::is_request_id(id) {
                    return Err(Error::invalid(
                        "full: write the id of a pending request (32 lowercase hex digits)",
                    ));
                }
                let full = self
                    .session
                    .broker
                    .full_request(id)
                    .map_err(|e| err(format!("full: {e}")))?;
                fid.content = Some(Bytes::from(full.as_bytes().to_vec()));
                Ok(n)
            }
            Node::Pid(id, PidFile::Ctl) => {
                let p = self.proc_of(id, &who)?;
                self.pid_ctl(&p, text(&data)?)?;
                Ok(n)
            }
            _ => Err(Error::permission_denied()),
        }
    }

    async fn stat(&self, fid: &mut ToolFid) -> Result<Stat> {
        if fid.node == Node::Auth {
            return Ok(self.stat_of(Node::Auth, 0));
        }
        let who = Self::who(fid)?;
        let length = match fid.node {
            Node::Info => self.info_text().len() as u64,
            Node::Pid(id, f) => {
                let p = self.proc_of(id, who)?;
                match f {
                    PidFile::Out => p.out.lock().map_or(0, |o| o.data.len() as u64),
                    PidFile::Stat => p.stat_text().len() as u64,
                    PidFile::Record => p.record_file().map_or(0, |r| r.len() as u64),
                    _ => 0,
                }
            }
            _ => 0,
        };
        Ok(self.stat_of(fid.node, length))
    }

    async fn wstat(&self, fid: &mut ToolFid, st: &Stat) -> Result<()> {
        // Truncation of a writable file (`echo x > ctl` through a FUSE bridge) is a no-op.
        let (_, perm) = fid.node.name_mode();
        if st.is_truncation() && may_open(perm, om::OWRITE) {
            return Ok(());
        }
        Err(Error::new(
            "permission denied: only truncation of writable files is allowed",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_files_have_names_modes_and_distinct_qids() {
        let mut paths = std::collections::BTreeSet::new();
        for (name, f, mode) in PidFile::FILES {
            let n = Node::Pid(7, f);
            assert_eq!(n.name_mode(), (name.to_owned(), mode));
            assert!(!n.is_dir());
            assert!(paths.insert(n.qid_path()), "{name}: qid path reused");
        }
        assert!(paths.insert(Node::Pid(7, PidFile::Dir).qid_path()));
        assert_eq!(
            Node::Pid(7, PidFile::Record).name_mode(),
            ("record".to_owned(), 0o444)
        );
        assert!(may_open(0o444, om::OREAD));
        assert!(!may_open(0o444, om::OWRITE));
    }
}
