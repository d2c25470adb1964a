//! The olliesrv file tree served over 9P.
//!
//! Static tables (`ROOT_FILES`, `SESSION_FILES`, `AGENT_FILES`, …) define every file,
//! its mode and its `help` text, so listings, permissions and the reference can never
//! disagree. Sessions and agents are live objects ([`crate::state`]); fids hold them, so a
//! rename keeps open fids valid, and a killed one reads as gone. The union directories of a
//! bead namespace (`…/ns/POINT/…`) are dynamic: `Node::U` names a path in a view and
//! [`crate::state::ns`] resolves it on every request (so `help` lists them as a pattern).

mod ctl;
mod feed;
mod node;
mod prompt;
mod proxy;
mod read;
mod skills;
mod table;
mod union;
mod write;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ollie_p9::server::{ConnInfo, Filesystem, Walked};
use ollie_p9::util::{DirSnapshot, read_at};
use ollie_p9::wire::{Qid, Stat, dm, om, qt};
use ollie_p9::{Error, Result};
use tokio::sync::watch;

use crate::config::Config;
use crate::state::events::Events;
use crate::state::{ChatKind, Registry, Session};
use node::{Class, Node, OllieFid, TcpAuth, manages, may_open};
use read::{content_at, dir_at, reply_at};
use table::{AFile, RootFile, SFile, help_text};

/// The group every file belongs to; everyone but the owner gets its bits.
pub const GROUP: &str = "agent";

/// How long a file that needs toolsrv waits for it to come up.
const LINK_WAIT: Duration = Duration::from_secs(10);
/// How long each backend may take to list its models.
const MODELS_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `operators` names user `name` (whose primary group is `primary`), or a group it
/// belongs to: its primary group, or one listing it as a member. `group` looks a group up by
/// name: its gid and members.
fn operator_matches(
    operators: &[crate::config::Operator],
    name: &str,
    primary: Option<u32>,
    group: impl Fn(&str) -> Option<(u32, Vec<String>)>,
) -> bool {
    use crate::config::Operator;
    operators.iter().any(|o| match o {
        Operator::User(u) => u == name,
        Operator::Group(g) => {
            group(g).is_some_and(|(gid, mem)| Some(gid) == primary || mem.iter().any(|m| m == name))
        }
    })
}

/// The error for a [`Class::Agent`] fid writing a file that [`manages`] (or a process `ctl`).
fn agent_denied(what: &str) -> Error {
    Error::new(format!(
        "permission denied: {what} manages sessions and agents, which a client attached as \"agent\" may not do (attach as yourself)"
    ))
}

/// Shared server state behind the tree.
#[derive(Debug)]
pub struct Shared {
    /// The server's user name (file owner).
    pub owner: String,
    pub owner_uid: u32,
    /// mtime/atime of every file.
    pub started: u32,
    pub config: Arc<RwLock<Arc<Config>>>,
    /// The `--config` file, if one was given (re-read by `invalidate`).
    pub config_path: Option<PathBuf>,
    pub events: Arc<Events>,
    pub reg: Arc<Registry>,
    /// Set to true to stop the server.
    pub stop: watch::Sender<bool>,
    /// Bumped when the configuration changes.
    config_version: AtomicU32,
    /// The key TCP clients must present with Tauth (hex, as in `<state>/tcp.key`).
    tcp_key: Option<Vec<u8>>,
    /// The last error of each user's writes, as `lasterror` shows it.
    last_errors: std::sync::Mutex<std::collections::HashMap<Arc<str>, String>>,
}

/// At most this many users' last errors are kept (more: the map starts afresh).
const MAX_ERROR_USERS: usize = 1024;

impl Shared {
    pub fn new(
        config: Arc<RwLock<Arc<Config>>>,
        config_path: Option<PathBuf>,
        events: Arc<Events>,
        reg: Arc<Registry>,
        stop: watch::Sender<bool>,
        tcp_key: Option<Vec<u8>>,
    ) -> Shared {
        let uid = nix::unistd::getuid();
        let owner = match nix::unistd::User::from_uid(uid) {
            Ok(Some(u)) => u.name,
            _ => uid.as_raw().to_string(),
        };
        Shared {
            owner,
            owner_uid: uid.as_raw(),
            started: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as u32),
            config,
            config_path,
            events,
            reg,
            stop,
            config_version: AtomicU32::new(0),
            tcp_key,
            last_errors: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Keeps `e`, the error a write of `user` to `path` got, for `lasterror`.
    fn note_error(&self, user: &Arc<str>, path: &str, e: &Error) {
        let line = format!(
            "{} {path}: {}\n",
            crate::state::events::rfc3339(SystemTime::now()),
            e.message().replace('\n', " ")
        );
        let mut m = crate::util::lock(&self.last_errors);
        if m.len() >= MAX_ERROR_USERS && !m.contains_key(user) {
            m.clear();
        }
        m.insert(Arc::clone(user), line);
    }

    /// What `lasterror` shows `user`.
    fn last_error(&self, user: &str) -> String {
        crate::util::lock(&self.last_errors)
            .get(user)
            .cloned()
            .unwrap_or_default()
    }

    fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .map_or_else(|p| Arc::clone(&p.into_inner()), |c| Arc::clone(&c))
    }

    /// Re-reads the configuration; on error the old one stays.
    pub fn reload(&self) -> std::result::Result<Arc<Config>, String> {
        let cfg = Config::load(self.config_path.as_deref()).map_err(|e| crate::error_chain(&e))?;
        if cfg.limits != self.config().limits {
            // The listeners were built with the first ones; keep what is enforced on record.
            tracing::warn!("[limits] changed: they take effect when olliesrv next starts");
        }
        let cfg = Arc::new(cfg);
        if let Ok(mut c) = self.config.write() {
            *c = Arc::clone(&cfg);
        }
        self.config_version.fetch_add(1, Ordering::Relaxed);
        Ok(cfg)
    }
}

fn lines<'a>(it: impl Iterator<Item = &'a String>) -> String {
    it.map(|s| format!("{s}\n")).collect()
}

/// The olliesrv filesystem.
#[derive(Debug)]
pub struct OllieFs {
    pub shared: Arc<Shared>,
}

fn err(s: impl Into<String>) -> Error {
    Error::new(s.into())
}

fn gone() -> Error {
    Error::new("file does not exist: it was killed")
}

/// Why a change under `skills/` is refused: a skill from a later skill path is read-only for
/// everyone; otherwise the caller is not the owner.
fn skill_denied(node: &Node) -> Error {
    err(match node {
        Node::K(k) if !k.writable => {
            "permission denied: this skill is not in the first skill path, so it is read-only"
        }
        _ => "permission denied: skills are read-only for agents",
    })
}

fn text(data: &[u8]) -> Result<&str> {
    std::str::from_utf8(data).map_err(|_| Error::invalid("not utf-8"))
}

/// One command per write (blank lines ignored).
fn single_command(t: &str) -> Result<&str> {
    let l: Vec<&str> = t.lines().filter(|l| !l.trim().is_empty()).collect();
    match l.as_slice() {
        [one] => Ok(one.trim()),
        [] => Err(Error::invalid("empty command (write help for the list)")),
        _ => Err(err(format!(
            "one command per write, got {} lines (invalid argument)",
            l.len()
        ))),
    }
}

impl OllieFs {
    pub fn new(shared: Arc<Shared>) -> OllieFs {
        OllieFs { shared }
    }

    fn reg(&self) -> &Arc<Registry> {
        &self.shared.reg
    }

    /// Decides who an attach acts for, from the uname and the peer's credentials.
    fn class_for(&self, conn: &ConnInfo, uname: &str) -> Result<Class> {
        if uname == GROUP {
            // Anyone may give up rights and act as an agent.
            return Ok(Class::Agent);
        }
        let Some(peer) = conn.peer else {
            // No credentials to check (not a unix socket): the least rights.
            return Ok(Class::Agent);
        };
        let peer_name = match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(peer.uid)) {
            Ok(Some(u)) => u.name,
            _ => peer.uid.to_string(),
        };
        if uname != peer_name {
            return Err(Error::new(format!(
                "permission denied: attach as {uname:?} refused; you are {peer_name:?} (attach as yourself or as \"agent\")"
            )));
        }
        if uname == self.shared.owner
            || peer.uid == self.shared.owner_uid
            || peer.uid == 0
            || self.is_operator(uname, peer.uid)
        {
            Ok(Class::Owner)
        } else {
            Ok(Class::Group)
        }
    }

    /// Whether config `operators` names this user, or a group it belongs to.
    fn is_operator(&self, name: &str, uid: u32) -> bool {
        let config = self.shared.config();
        if config.operators.is_empty() {
            return false;
        }
        let primary = match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
            Ok(Some(u)) => Some(u.gid.as_raw()),
            _ => None,
        };
        operator_matches(
            &config.operators,
            name,
            primary,
            |g| match nix::unistd::Group::from_name(g) {
                Ok(Some(grp)) => Some((grp.gid.as_raw(), grp.mem)),
                _ => None,
            },
        )
    }

    // --- root files ---

    async fn models_text(&self) -> String {
        crate::backend::select::models_text(&self.shared.config(), MODELS_TIMEOUT).await
    }

    async fn backends_text(&self) -> String {
        crate::backend::select::all(&self.shared.config())
            .await
            .into_iter()
            .map(|(n, _)| format!("{n}\n"))
            .collect()
    }

    fn tools_text() -> String {
        ollie_link::tools::TOOLS
            .iter()
            .map(|t| format!("{:<14}{}\n", t.name, t.description))
            .collect()
    }

    fn sessions_idx(&self) -> String {
        let mut out = String::new();
        for s in self.reg().sessions() {
            out.push_str(&format!(
                "{}\t{}\t{}\t{}\t{}\n",
                s.name(),
                s.id,
                s.agents().len(),
                s.link.state_name(),
                s.paused()
            ));
        }
        out
    }

    fn agents_idx(s: &Session) -> String {
        s.agents()
            .iter()
            .map(|a| format!("{}\t{}\t{}\n", a.name(), a.id, a.state_text()))
            .collect()
    }
}

impl Filesystem for OllieFs {
    type Fid = OllieFid;

    async fn auth(&self, conn: &ConnInfo, _uname: &str, _aname: &str) -> Result<(OllieFid, Qid)> {
        if conn.transport != "tcp" {
            // Unix clients are identified by their credentials.
            return Err(Error::new("authentication not required"));
        }
        let mut f = OllieFid::new(Node::Root, Class::Agent);
        f.auth = Some(TcpAuth::Fresh);
        Ok((
            f,
            Qid {
                ty: qt::AUTH,
                version: 0,
                path: u64::MAX,
            },
        ))
    }

    async fn attach(
        &self,
        conn: &ConnInfo,
        auth: Option<&mut OllieFid>,
        uname: &str,
        aname: &str,
    ) -> Result<(OllieFid, Qid)> {
        if !aname.is_empty() {
            return Err(Error::new(format!(
                "file does not exist: no tree named {aname:?} (attach with an empty aname)"
            )));
        }
        let class = if conn.transport == "tcp" {
            // TCP: only with the key. Who holds it is the operator, unless they attach as
            // "agent" to use only the group's rights.
            let afid = auth.ok_or_else(|| {
                Error::new("permission denied: tcp connections must authenticate (Tauth with the key in the state directory's tcp.key)")
            })?;
            match afid.auth {
                Some(TcpAuth::Verified) => afid.auth = Some(TcpAuth::Used),
                Some(TcpAuth::Used) => {
                    return Err(Error::new("permission denied: afid already used"));
                }
                Some(_) => return Err(Error::new("permission denied: not authenticated")),
                None => return Err(Error::new("permission denied: not an authentication fid")),
            }
            if uname == GROUP {
                Class::Agent
            } else {
                Class::Owner
            }
        } else {
            self.class_for(conn, uname)?
        };
        tracing::debug!(conn = conn.id, uname, ?class, "attach");
        let mut f = OllieFid::new(Node::Root, class);
        f.user = Arc::from(uname);
        Ok((f, self.qid(&Node::Root)))
    }

    async fn walk(&self, fid: &OllieFid, names: &[String]) -> Result<Walked<OllieFid>> {
        let mut w = self.walk_from(fid, names).await?;
        if let Some(f) = &mut w.fid {
            f.user = Arc::clone(&fid.user);
        }
        Ok(w)
    }
    async fn open(&self, fid: &mut OllieFid, mode: u8) -> Result<(Qid, u32)> {
        if let Some(p) = &mut fid.proxy {
            if p.session.is_killed() {
                return Err(gone());
            }
            let rm = p
                .remote
                .as_ref()
                .map_or(0, |r| if r.qid().is_dir() { dm::DIR } else { 0 });
            let shown = Self::proxy_mode(p, rm);
            if !may_open(shown, fid.class, mode) {
                return Err(Error::permission_denied());
            }
            if mode & 3 != om::OREAD && !Self::may_write_proxy(p) {
                return Err(err("permission denied: a read-only view of toolsrv"));
            }
            if mode & 3 != om::OREAD && fid.class == Class::Agent {
                return Err(agent_denied("a process's ctl"));
            }
            let r = p.remote.as_mut().ok_or_else(Error::not_found)?;
            // A directory stays unopened in toolsrv: each listing reads a fresh clone.
            if !r.qid().is_dir() {
                r.open(mode & !om::OTRUNC)
                    .await
                    .map_err(|e| err(e.to_string()))?;
            }
            return Ok((p.qid, 0));
        }
        Self::alive(&fid.node)?;
        if let Node::U(u) = &fid.node {
            if !may_open(u.mode(), fid.class, mode) {
                return Err(Error::permission_denied());
            }
            let (qid, file) = u.open(mode).map_err(err)?;
            fid.ufile = file;
            return Ok((qid, 0));
        }
        if let Node::K(k) = &fid.node {
            if !may_open(k.mode(), fid.class, mode) {
                return Err(skill_denied(&fid.node));
            }
            let (qid, file) = k.open(&self.shared.config(), mode).map_err(err)?;
            fid.ufile = file;
            return Ok((qid, 0));
        }
        if !may_open(Self::mode(&fid.node), fid.class, mode) {
            return Err(Error::permission_denied());
        }
        if fid.class == Class::Agent
            && (mode & 3 != om::OREAD || mode & om::OTRUNC != 0)
            && let Some(what) = manages(&fid.node)
        {
            return Err(agent_denied(what));
        }
        let reg = Arc::clone(self.reg());
        match &fid.node {
            Node::R(RootFile::Help) => fid.content = Some(Bytes::from(help_text())),
            Node::R(RootFile::Backends) => {
                fid.content = Some(Bytes::from(self.backends_text().await))
            }
            Node::R(RootFile::Models) => fid.content = Some(Bytes::from(self.models_text().await)),
            Node::R(RootFile::Agents) => {
                fid.content = Some(Bytes::from(lines(self.shared.config().profiles.keys())))
            }
            Node::R(RootFile::Tools) => fid.content = Some(Bytes::from(Self::tools_text())),
            Node::R(RootFile::Aliases) => fid.content = Some(Bytes::from(reg.aliases_text())),
            Node::R(RootFile::LastError) => {
                fid.content = Some(Bytes::from(self.shared.last_error(&fid.user)));
            }
            Node::R(RootFile::Eventwait) => fid.cursor = self.shared.events.cursor(),
            // From the oldest decision kept.
            Node::S(_, SFile::Net) => fid.cursor = 0,
            Node::R(RootFile::SessionIdx) => fid.content = Some(Bytes::from(self.sessions_idx())),
            Node::R(RootFile::BypassAudit) => fid.content = Some(self.reg().bypass.audit_text()),
            Node::R(RootFile::SkillsIdx) => {
                let cat = crate::skills::scan(&self.shared.config());
                fid.content = Some(Bytes::from(crate::skills::idx_text(&cat)));
            }
            Node::S(s, SFile::Env) => fid.content = Some(Bytes::from(s.env_text())),
            Node::S(s, SFile::Cfg) => fid.content = Some(Bytes::from(s.cfg_text())),
            Node::S(s, SFile::Paused) => {
                fid.content = Some(Bytes::from(format!("{}\n", s.paused())))
            }
            Node::S(s, SFile::Name) => fid.content = Some(Bytes::from(format!("{}\n", s.name()))),
            Node::S(s, SFile::Id) => fid.content = Some(Bytes::from(format!("{}\n", s.id))),
            Node::S(s, SFile::AgentIdx) => fid.content = Some(Bytes::from(Self::agents_idx(s))),
            Node::A(a, AFile::Statewait) => fid.cursor = a.state().0,
            // Like statewait: the value current at the open is this reader's baseline, so a
            // loop of opens (`while :; do cat feed; done`) returns once per new value.
            Node::A(a, AFile::Feed) => fid.last_feed = a.feed_value(),
            Node::A(a, AFile::Log) => fid.content = Some(a.chat.tail(64 * 1024)),
            Node::A(a, AFile::Cfg) => fid.content = Some(Bytes::from(a.cfg_text())),
            Node::A(a, AFile::Stats) => {
                fid.content = Some(Bytes::from(crate::util::lock(&a.stats).text()))
            }
            Node::A(a, AFile::Name) => fid.content = Some(Bytes::from(format!("{}\n", a.name()))),
            Node::A(a, AFile::Id) => fid.content = Some(Bytes::from(format!("{}\n", a.id))),
            Node::A(a, AFile::Plan) => {
                if mode & om::OTRUNC != 0 {
                    a.clear_plan().map_err(err)?;
                }
                fid.trunc = mode & om::OTRUNC != 0;
            }
            Node::A(a, AFile::ProcTop) => {
                fid.content = Some(Bytes::from(self.proc_top(a).await?));
            }
            Node::S(s, SFile::NsTable) => fid.content = Some(Bytes::from(s.ns.table())),
            Node::A(a, AFile::NsTable) => fid.content = Some(Bytes::from(a.ns.table())),
            _ => {}
        }
        Ok((self.qid(&fid.node), 0))
    }

    async fn read(&self, fid: &mut OllieFid, offset: u64, count: u32) -> Result<Bytes> {
        if let Some(a) = fid.auth {
            return match a {
                TcpAuth::Verified => Ok(read_at(&Bytes::from_static(b"ok\n"), offset, count)),
                _ => Err(Error::new("permission denied: write the key first")),
            };
        }
        if fid.proxy.is_some() {
            return self.proxy_read(fid, offset, count).await;
        }
        let node = fid.node.clone();
        match &node {
            Node::K(_) | Node::U(_) => self.read_real(fid, &node, offset, count),
            Node::Root
            | Node::R(RootFile::SessionDir | RootFile::BypassDir | RootFile::SkillsDir)
            | Node::S(_, SFile::Dir | SFile::AgentDir | SFile::Ns)
            | Node::A(_, AFile::Dir | AFile::ProcDir | AFile::Ns) => {
                if offset == 0 || fid.dir.is_none() {
                    let entries = self.dir_entries(&node).await;
                    fid.dir = Some(DirSnapshot::new(&entries));
                }
                dir_at(fid, offset, count)
            }
            Node::R(
                RootFile::Ctl | RootFile::Generate | RootFile::SessionNew | RootFile::BypassFull,
            )
            | Node::S(_, SFile::Ctl | SFile::NsCtl)
            | Node::A(_, AFile::Ctl | AFile::NsCtl) => Ok(reply_at(fid, offset, count)),
            Node::S(_, SFile::AgentNew) => {
                // The request written so far is complete: its prompt is queued.
                self.finish_prompt(fid, true)?;
                if fid.reply.is_none()
                    && let Some((a, after)) = fid.waiting.clone()
                {
                    let end = a.next_turn_end(after).await.ok_or_else(gone)?;
                    fid.reply = Some(Bytes::from(end.result.map_err(err)?));
                }
                Ok(reply_at(fid, offset, count))
            }
            Node::A(a, AFile::Chat) => a
                .chat
                .read(ChatKind::Text, offset, count)
                .await
                .map_err(err),
            Node::A(a, AFile::ChatRaw) => {
                a.chat.read(ChatKind::Raw, offset, count).await.map_err(err)
            }
            // One value per open-and-read: a read at offset 0 waits for the next change; the
            // rest of that value follows at later offsets, then end of file (so `cat
            // statewait` returns after one change, and repeated reads at 0 stream them).
            Node::A(_, AFile::Statewait | AFile::Feed) if offset > 0 && fid.pending.is_empty() => {
                Ok(Bytes::new())
            }
            Node::R(RootFile::BypassPending | RootFile::Eventwait)
            | Node::S(_, SFile::Net)
            | Node::A(_, AFile::Statewait | AFile::Feed) => {
                if fid.pending.is_empty() && !self.next_value(fid, &node).await? {
                    return Ok(Bytes::new());
                }
                let n = fid.pending.len().min(count as usize);
                Ok(fid.pending.split_to(n))
            }
            Node::A(a, AFile::Fifo) => {
                if offset == 0 || fid.content.is_none() {
                    // What this fid wrote is queued before it reads.
                    self.finish_prompt(fid, true)?;
                    let p = a.dequeue().map_err(err)?;
                    fid.content = Some(Bytes::from(p.unwrap_or_default()));
                }
                Ok(content_at(fid, offset, count))
            }
            Node::A(a, AFile::Plan) => Ok(read_at(&a.plan(), offset, count)),
            Node::R(RootFile::Help)
            | Node::R(RootFile::Backends)
            | Node::R(RootFile::Models)
            | Node::R(RootFile::Agents)
            | Node::R(RootFile::Tools)
            | Node::R(RootFile::Aliases)
            | Node::R(RootFile::LastError)
            | Node::R(RootFile::SessionIdx)
            | Node::R(RootFile::BypassAudit)
            | Node::R(RootFile::SkillsIdx)
            | Node::S(
                _,
                SFile::Env
                | SFile::Cfg
                | SFile::Paused
                | SFile::Name
                | SFile::Id
                | SFile::AgentIdx
                | SFile::NsTable,
            )
            | Node::A(
                _,
                AFile::Log
                | AFile::Cfg
                | AFile::Stats
                | AFile::Name
                | AFile::Id
                | AFile::ProcTop
                | AFile::NsTable,
            ) => Ok(content_at(fid, offset, count)),
            _ => Err(Error::permission_denied()),
        }
    }

    async fn write(&self, fid: &mut OllieFid, offset: u64, data: Bytes) -> Result<u32> {
        let r = self.write_file(fid, offset, data).await;
        // Not for agents: every sandboxed agent attaches as `agent`, and one agent must not
        // read another session's errors.
        if let Err(e) = &r
            && fid.auth.is_none()
            && fid.class != Class::Agent
        {
            self.shared
                .note_error(&fid.user, &self.path_of(&fid.node), e);
        }
        r
    }

    async fn create(
        &self,
        fid: &mut OllieFid,
        name: &str,
        perm: u32,
        mode: u8,
    ) -> Result<(Qid, u32)> {
        if fid.proxy.is_some() {
            return Err(err(
                "permission denied: cannot create files in a view of toolsrv",
            ));
        }
        Self::alive(&fid.node)?;
        let is_dir = perm & dm::DIR != 0;
        if is_dir && (mode & 3 != om::OREAD || mode & om::OTRUNC != 0) {
            return Err(err(
                "a directory is created open for reading only (invalid argument)",
            ));
        }
        // Skills: the owner creates them (in the first skill path) and their files.
        if matches!(fid.node, Node::R(RootFile::SkillsDir) | Node::K(_)) {
            if !may_open(Self::mode(&fid.node), fid.class, om::OWRITE) {
                return Err(skill_denied(&fid.node));
            }
            let config = self.shared.config();
            let (node, file) = match &fid.node {
                Node::K(k) => k.create(&config, name, is_dir).map_err(err)?,
                _ => (
                    skills::create_skill(&config, name, is_dir).map_err(err)?,
                    None,
                ),
            };
            let qid = node.qid;
            fid.node = Node::K(node);
            fid.ufile = file;
            fid.dir = None;
            return Ok((qid, 0));
        }
        let Node::U(dir) = &fid.node else {
            return Err(match &fid.node {
                Node::S(_, SFile::Ns) | Node::A(_, AFile::Ns) => err(
                    "permission denied: mount points are made by mount (write mount [-b|-a] [-c] BEAD /NAME to ctl)",
                ),
                _ => err("permission denied: cannot create files here"),
            });
        };
        if !may_open(dir.mode(), fid.class, om::OWRITE) {
            return Err(Error::permission_denied());
        }
        let (node, file) = dir.create(name, is_dir, mode).map_err(err)?;
        let qid = node.qid;
        fid.node = Node::U(node);
        fid.ufile = file;
        fid.dir = None;
        Ok((qid, 0))
    }

    async fn remove(&self, mut fid: OllieFid) -> Result<()> {
        if let Some(w) = &fid.feed {
            w.finish();
        }
        // Tremove clunks the fid: what it wrote is queued as at a clunk.
        self.finish_prompt(&mut fid, true)?;
        if fid.proxy.is_some() {
            return Err(err("permission denied: a view of toolsrv is read-only"));
        }
        Self::alive(&fid.node)?;
        if let Node::K(k) = &fid.node {
            let config = self.shared.config();
            let dir_mode = match k.parent(&config) {
                Some(p) => p.map_err(err)?.mode(),
                None => Self::mode(&Node::R(RootFile::SkillsDir)),
            };
            if !may_open(dir_mode, fid.class, om::OWRITE) {
                return Err(skill_denied(&fid.node));
            }
            return k.remove(&config).map_err(err);
        }
        let Node::U(u) = &fid.node else {
            return Err(err("permission denied: cannot remove this file"));
        };
        if let Some(p) = u.parent() {
            let m = p.map_err(err)?.mode();
            if !may_open(m, fid.class, om::OWRITE) {
                return Err(Error::permission_denied());
            }
        }
        u.remove().map_err(err)
    }

    async fn clunk(&self, mut fid: OllieFid) -> Result<()> {
        // A feed value or a prompt being written is complete when its writer lets go.
        if let Some(w) = &fid.feed {
            w.finish();
        }
        let r = self.finish_prompt(&mut fid, true);
        if let Err(e) = &r
            && fid.class != Class::Agent
        {
            self.shared
                .note_error(&fid.user, &self.path_of(&fid.node), e);
        }
        r
    }

    async fn stat(&self, fid: &mut OllieFid) -> Result<Stat> {
        if let Some(p) = &fid.proxy {
            let r = p.remote.as_ref().ok_or_else(Error::not_found)?;
            let mut st = r.stat().await.map_err(|e| err(e.to_string()))?;
            st.mode = Self::proxy_mode(p, st.mode);
            st.qid = p.qid;
            st.uid = self.shared.owner.clone();
            st.gid = GROUP.to_owned();
            st.muid = self.shared.owner.clone();
            return Ok(st);
        }
        Self::alive(&fid.node)?;
        if let Node::U(u) = &fid.node {
            return u.stat(&self.shared.owner).map_err(err);
        }
        if let Node::K(k) = &fid.node {
            return k
                .stat(&self.shared.config(), &self.shared.owner)
                .map_err(err);
        }
        Ok(self.stat_of(&fid.node))
    }

    async fn wstat(&self, fid: &mut OllieFid, st: &Stat) -> Result<()> {
        if fid.proxy.is_none()
            && let Node::U(u) = &mut fid.node
        {
            if u.owner.is_killed() {
                return Err(gone());
            }
            // A length change needs write permission on the file, a rename on its directory.
            if st.length != u64::MAX && !may_open(u.mode(), fid.class, om::OWRITE) {
                return Err(Error::permission_denied());
            }
            if !st.name.is_empty() {
                let dir_mode = match u.parent() {
                    Some(p) => p.map_err(err)?.mode(),
                    None => 0,
                };
                if dir_mode != 0 && !may_open(dir_mode, fid.class, om::OWRITE) {
                    return Err(Error::permission_denied());
                }
            }
            return u.wstat(st, &self.shared.owner).map_err(err);
        }
        if fid.proxy.is_none()
            && let Node::K(k) = &mut fid.node
        {
            let config = self.shared.config();
            let length = (st.length != u64::MAX).then_some(st.length);
            let renaming = !st.name.is_empty() && st.name != k.name();
            if (length.is_some() || renaming) && !may_open(k.mode(), fid.class, om::OWRITE) {
                return Err(skill_denied(&fid.node));
            }
            if length.is_none() && !renaming {
                // Nothing this server keeps (modes, times) changes: accepted as a no-op.
                return Ok(());
            }
            return k.wstat(&config, length, &st.name).map_err(err);
        }
        // `echo cmd > ctl` through 9pfuse truncates first: a no-op for synthetic files the
        // caller may write (the plan really is truncated).
        let mode = match &fid.proxy {
            Some(p) => Self::proxy_mode(p, 0),
            None => Self::mode(&fid.node),
        };
        let managed =
            fid.class == Class::Agent && (fid.proxy.is_some() || manages(&fid.node).is_some());
        if st.is_truncation() && may_open(mode, fid.class, om::OWRITE) && !managed {
            if let Node::A(a, AFile::Plan) = &fid.node
                && fid.proxy.is_none()
            {
                a.clear_plan().map_err(err)?;
            }
            return Ok(());
        }
        Err(Error::new(
            "permission denied: only truncation of writable files is allowed",
        ))
    }
}

impl OllieFs {
    /// A Twrite ([`Filesystem::write`] records its error for `lasterror`).
    async fn write_file(&self, fid: &mut OllieFid, offset: u64, data: Bytes) -> Result<u32> {
        let n = data.len() as u32;
        if fid.auth.is_some() {
            return self.write_key(fid, &data).map(|()| n);
        }
        if fid.proxy.is_some() {
            return self.proxy_write(fid, offset, data).await;
        }
        Self::alive(&fid.node)?;
        let reg = Arc::clone(self.reg());
        let node = fid.node.clone();
        match &node {
            // A command: its reply is read back on the same fid.
            Node::R(
                RootFile::Ctl | RootFile::BypassFull | RootFile::Generate | RootFile::SessionNew,
            )
            | Node::S(_, SFile::Ctl | SFile::NsCtl)
            | Node::A(_, AFile::Ctl | AFile::NsCtl) => {
                fid.reply = None;
                fid.reply = Some(self.command(&node, &data).await?);
            }
            Node::R(RootFile::BypassResolve) => {
                let by = Arc::clone(&fid.user);
                reg.bypass
                    .resolve(&reg.sessions(), offset, &data, &by)
                    .await
                    .map_err(err)?;
            }
            Node::S(s, SFile::Name) => {
                let t = text(&data)?.trim();
                reg.rename_session(s, t).map_err(err)?;
                fid.content = Some(Bytes::from(format!("{t}\n")));
            }
            Node::S(s, SFile::AgentNew) => self.write_agent_new(fid, s, offset, &data)?,
            Node::A(a, AFile::Prompt | AFile::Fifo) => {
                if let Some(w) = &mut fid.prompt
                    && w.draft.continues(offset)
                {
                    w.draft.write(offset, &data).map_err(err)?;
                } else {
                    // A write at offset 0 starts the next prompt: the one before is complete.
                    self.finish_prompt(fid, false)?;
                    a.has_room().map_err(err)?;
                    let draft = prompt::PromptDraft::new(offset, &data).map_err(err)?;
                    fid.prompt = Some(prompt::PromptWriter {
                        agent: Arc::clone(a),
                        draft,
                    });
                }
            }
            Node::A(a, AFile::Feed) => fid
                .feed
                .get_or_insert_with(|| feed::FeedWriter::new(Arc::clone(a)))
                .write(offset, &data)
                .map_err(err)?,
            Node::A(a, AFile::Plan) => a.write_plan(offset, &data, false).map_err(err)?,
            Node::A(a, AFile::Cfg) => {
                self.write_agent_cfg(a, text(&data)?).await?;
                fid.content = Some(Bytes::from(a.cfg_text()));
            }
            Node::A(a, AFile::Name) => {
                let t = text(&data)?.trim();
                reg.rename_agent(a, t).map_err(err)?;
                fid.content = Some(Bytes::from(format!("{t}\n")));
            }
            Node::U(_) | Node::K(_) => {
                let f = fid
                    .ufile
                    .as_ref()
                    .ok_or_else(|| err("permission denied: not open for writing"))?;
                union::write_file_at(f, offset, &data).map_err(err)?;
            }
            _ => return Err(Error::permission_denied()),
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_match_users_and_group_members_only() {
        use crate::config::Operator;
        let ops = vec![
            Operator::User("alice".into()),
            Operator::Group("admins".into()),
        ];
        let groups = |g: &str| match g {
            "admins" => Some((500, vec!["carol".to_owned()])),
            _ => None,
        };
        // Named directly.
        assert!(operator_matches(&ops, "alice", Some(1000), groups));
        // A listed member of the group, and a user whose primary group it is.
        assert!(operator_matches(&ops, "carol", Some(1000), groups));
        assert!(operator_matches(&ops, "dave", Some(500), groups));
        // Anyone else, a user without a primary group, a group that does not exist.
        assert!(!operator_matches(&ops, "mallory", Some(1000), groups));
        assert!(!operator_matches(&ops, "mallory", None, groups));
        let missing = vec![Operator::Group("nosuch".into())];
        assert!(!operator_matches(&missing, "carol", Some(500), groups));
        // A prefix of a name is not the name.
        assert!(!operator_matches(&ops, "alic", Some(1000), groups));
        assert!(!operator_matches(&[], "alice", Some(500), groups));
    }
}
