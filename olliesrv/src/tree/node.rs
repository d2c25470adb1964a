//! Nodes of the tree and per-fid state: what a path names ([`Node`]), who a fid acts for
//! ([`Class`]), the qid, mode and stat of each node, and walking from one node to the next.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use ollie_p9::server::Walked;
use ollie_p9::util::DirSnapshot;
use ollie_p9::wire::{Qid, Stat, dm, om, qt};
use ollie_p9::{Error, Fid as RemoteFid, Result};

use crate::state::{Agent, ChatKind, Session};

use super::skills::SkillNode;
use super::table::{
    AFile, AGENT_FILES, AGENT_NS_FILES, AGENTS_FILES, BYPASS_FILES, PROC_FILES, ROOT_FILES,
    RootFile, SESSION_FILES, SESSION_NS_FILES, SESSIONS_FILES, SFile, SKILLS_FILES, help_text,
};
use super::union::{self, NsOwner, UnionFile, UnionNode};
use super::{GROUP, OllieFs, err, gone};

/// Who a fid acts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The server's own user, root, the `operators` of config.toml, and a TCP client holding
    /// the key: owner bits.
    Owner,
    /// Any other user attached as itself (checked with SO_PEERCRED): group bits.
    Group,
    /// Anything attached as `agent` (or over a transport without credentials): group bits,
    /// without any right to manage sessions or agents ([`manages`]).
    Agent,
}

/// What writing `node` manages, if it manages sessions or agents (creates, renames,
/// configures, pauses or kills them, or changes a namespace): what a fid of [`Class::Agent`]
/// may never write. Reading these files is not managing; prompts, feeds, plans and union views
/// are data, not management.
pub fn manages(node: &Node) -> Option<&'static str> {
    Some(match node {
        Node::R(RootFile::SessionNew) => "session/new",
        Node::R(RootFile::Ctl) => "the root ctl",
        Node::S(_, SFile::Cfg) => "a session's cfg",
        Node::S(_, SFile::Ctl) => "a session's ctl",
        Node::S(_, SFile::Name) => "a session's name",
        Node::S(_, SFile::AgentNew) => "agent/new",
        Node::S(_, SFile::NsCtl) | Node::A(_, AFile::NsCtl) => "ns/ctl",
        Node::A(_, AFile::Cfg) => "an agent's cfg",
        Node::A(_, AFile::Ctl) => "an agent's ctl",
        Node::A(_, AFile::Name) => "an agent's name",
        _ => return None,
    })
}

/// A view of a session's toolsrv tree through olliesrv.
#[derive(Debug)]
pub struct Proxy {
    pub(super) session: Arc<Session>,
    /// `Some`: the agent's `proc/` (its identity, process directories only); `None`: the
    /// session's `toolsrv/` (the operator's identity, read-only except `bypass/`).
    pub(super) agent: Option<Arc<Agent>>,
    /// Path in toolsrv's tree.
    pub(super) path: Vec<String>,
    /// The remote fid for `path`.
    pub(super) remote: Option<RemoteFid>,
    pub(super) qid: Qid,
}

/// A node of the tree.
#[derive(Debug, Clone)]
pub enum Node {
    Root,
    R(RootFile),
    S(Arc<Session>, SFile),
    A(Arc<Agent>, AFile),
    /// A name in a union view of a bead namespace (`…/ns/POINT/…`).
    U(UnionNode),
    /// A file or directory of a skill (`skills/NAME/…`).
    K(SkillNode),
}

/// Per-fid state.
#[derive(Debug)]
pub struct OllieFid {
    pub(super) node: Node,
    pub(super) proxy: Option<Proxy>,
    pub(super) class: Class,
    /// The uname of the attach this fid descends from (who wrote a verdict, in the audit).
    pub(super) user: Arc<str>,
    /// Reply of the last write (ctl, new, generate).
    pub(super) reply: Option<Bytes>,
    /// Contents frozen at open (help, backends, …).
    pub(super) content: Option<Bytes>,
    pub(super) dir: Option<DirSnapshot>,
    /// eventwait: the last event this fid has been given; statewait: the last state seq.
    pub(super) cursor: u64,
    pub(super) pending: Bytes,
    /// feed: the value this fid read last.
    pub(super) last_feed: Option<Bytes>,
    /// feed: the value this fid is writing ([`super::feed`] has the boundary rule).
    pub(super) feed: Option<super::feed::FeedWriter>,
    /// bypass/pending: the requests this fid was shown.
    pub(super) seen: std::collections::HashSet<String>,
    /// agent/new with prompt=: the agent and the turn to wait for.
    pub(super) waiting: Option<(Arc<Agent>, u64)>,
    /// prompt, fifo, agent/new's prompt=: the prompt being written ([`super::prompt`]).
    pub(super) prompt: Option<super::prompt::PromptWriter>,
    /// Opened for writing with OTRUNC (plan).
    pub(super) trunc: bool,
    /// An auth fid (TCP): where its exchange is.
    pub(super) auth: Option<TcpAuth>,
    /// An open file of a union view.
    pub(super) ufile: Option<UnionFile>,
}

/// The Tauth exchange of a TCP connection: write the key (from `<state>/tcp.key`), then
/// attach with the afid, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpAuth {
    Fresh,
    Verified,
    Failed,
    Used,
}

impl OllieFid {
    pub(super) fn new(node: Node, class: Class) -> OllieFid {
        OllieFid {
            node,
            proxy: None,
            class,
            user: Arc::from(""),
            reply: None,
            content: None,
            dir: None,
            cursor: 0,
            pending: Bytes::new(),
            last_feed: None,
            feed: None,
            seen: std::collections::HashSet::new(),
            waiting: None,
            prompt: None,
            trunc: false,
            auth: None,
            ufile: None,
        }
    }
}

/// Whether `class` may open a file of `mode` bits with open mode `omode`.
pub fn may_open(mode: u32, class: Class, omode: u8) -> bool {
    let bits = match class {
        Class::Owner => (mode >> 6) & 7,
        Class::Group | Class::Agent => (mode >> 3) & 7,
    };
    let need = ollie_p9::util::open_needs(omode);
    bits & need == need
}

impl OllieFs {
    pub(super) fn qid(&self, node: &Node) -> Qid {
        if let Node::U(u) = node {
            return u.qid;
        }
        if let Node::K(k) = node {
            return k.qid;
        }
        let (path, dir) = match node {
            Node::Root => (0, true),
            Node::R(r) => (
                1 + *r as u64,
                matches!(
                    r,
                    RootFile::SessionDir | RootFile::BypassDir | RootFile::SkillsDir
                ),
            ),
            Node::S(s, k) => (
                (1 << 40) | (u64::from(s.handle) << 8) | *k as u64,
                matches!(k, SFile::Dir | SFile::AgentDir | SFile::Toolsrv | SFile::Ns),
            ),
            Node::A(a, k) => (
                (2 << 40) | (u64::from(a.handle) << 8) | *k as u64,
                matches!(k, AFile::Dir | AFile::ProcDir | AFile::Ns),
            ),
            Node::U(u) => (u.qid.path, u.qid.is_dir()),
            Node::K(k) => (k.qid.path, k.qid.is_dir()),
        };
        let version = match node {
            Node::R(RootFile::Eventwait) => self.shared.events.cursor() as u32,
            Node::R(RootFile::Backends | RootFile::Models | RootFile::Agents) => {
                self.shared.config_version.load(Ordering::Relaxed)
            }
            _ => 0,
        };
        Qid {
            ty: if dir { qt::DIR } else { qt::FILE },
            version,
            path,
        }
    }

    pub(super) fn mode(node: &Node) -> u32 {
        let find = |n: &str| {
            ROOT_FILES
                .iter()
                .chain(SESSIONS_FILES)
                .chain(BYPASS_FILES)
                .chain(SKILLS_FILES)
                .find(|d| d.name == n)
                .map_or(0, |d| d.mode)
        };
        match node {
            Node::Root => dm::DIR | 0o555,
            Node::R(r) => ROOT_FILES
                .iter()
                .chain(SESSIONS_FILES)
                .chain(BYPASS_FILES)
                .chain(SKILLS_FILES)
                .find(|d| d.kind == *r)
                .map_or_else(|| find(""), |d| d.mode),
            Node::S(_, SFile::Dir) => dm::DIR | 0o555,
            Node::S(_, k) => SESSION_FILES
                .iter()
                .chain(AGENTS_FILES)
                .chain(SESSION_NS_FILES)
                .find(|d| d.kind == *k)
                .map_or(0, |d| d.mode),
            Node::A(_, AFile::Dir) => dm::DIR | 0o555,
            Node::A(_, k) => AGENT_FILES
                .iter()
                .chain(PROC_FILES)
                .chain(AGENT_NS_FILES)
                .find(|d| d.kind == *k)
                .map_or(0, |d| d.mode),
            Node::U(u) => u.mode(),
            Node::K(k) => k.mode(),
        }
    }

    pub(super) fn name_of(node: &Node) -> String {
        match node {
            Node::Root => "/".into(),
            Node::R(r) => ROOT_FILES
                .iter()
                .chain(SESSIONS_FILES)
                .chain(BYPASS_FILES)
                .chain(SKILLS_FILES)
                .find(|d| d.kind == *r)
                .map_or("?", |d| d.name)
                .into(),
            Node::S(s, SFile::Dir) => s.name(),
            Node::S(_, k) => SESSION_FILES
                .iter()
                .chain(AGENTS_FILES)
                .chain(SESSION_NS_FILES)
                .find(|d| d.kind == *k)
                .map_or("?", |d| d.name)
                .into(),
            Node::A(a, AFile::Dir) => a.name(),
            Node::A(_, k) => AGENT_FILES
                .iter()
                .chain(PROC_FILES)
                .chain(AGENT_NS_FILES)
                .find(|d| d.kind == *k)
                .map_or("?", |d| d.name)
                .into(),
            Node::U(u) => u.name(),
            Node::K(k) => k.name(),
        }
    }

    /// Where `node` is, from the root (`session/proj/agent/coder/ctl`), for messages; the
    /// files of a union or a skill by their own name.
    pub(super) fn path_of(&self, node: &Node) -> String {
        let name = Self::name_of(node);
        match node {
            Node::R(r) if SESSIONS_FILES.iter().any(|d| d.kind == *r) => format!("session/{name}"),
            Node::R(r) if BYPASS_FILES.iter().any(|d| d.kind == *r) => format!("bypass/{name}"),
            Node::R(r) if SKILLS_FILES.iter().any(|d| d.kind == *r) => format!("skills/{name}"),
            Node::S(s, SFile::Dir) => format!("session/{}", s.name()),
            Node::S(s, k) => {
                let under = if SESSION_NS_FILES.iter().any(|d| d.kind == *k) {
                    "ns/"
                } else if AGENTS_FILES.iter().any(|d| d.kind == *k) {
                    "agent/"
                } else {
                    ""
                };
                format!("session/{}/{under}{name}", s.name())
            }
            Node::A(a, AFile::Dir) => format!("{}/agent/{name}", Self::session_path(a)),
            Node::A(a, k) => {
                let under = if AGENT_NS_FILES.iter().any(|d| d.kind == *k) {
                    "ns/"
                } else if PROC_FILES.iter().any(|d| d.kind == *k) {
                    "proc/"
                } else {
                    ""
                };
                let agent = a.name();
                format!("{}/agent/{agent}/{under}{name}", Self::session_path(a))
            }
            _ => name,
        }
    }

    fn session_path(a: &Agent) -> String {
        a.session.upgrade().map_or_else(
            || "session/?".to_owned(),
            |s| format!("session/{}", s.name()),
        )
    }

    pub(super) fn stat_of(&self, node: &Node) -> Stat {
        if let Node::U(u) = node
            && let Ok(st) = u.stat(&self.shared.owner)
        {
            return st;
        }
        if let Node::K(k) = node
            && let Ok(st) = k.stat(&self.shared.config(), &self.shared.owner)
        {
            return st;
        }
        let length = match node {
            Node::R(RootFile::Help) => help_text().len() as u64,
            Node::A(a, AFile::ChatRaw) => a.chat.len(ChatKind::Raw),
            Node::A(a, AFile::Chat) => a.chat.len(ChatKind::Text),
            Node::A(a, AFile::Plan) => a.plan().len() as u64,
            Node::S(s, SFile::NsTable) => s.ns.table().len() as u64,
            Node::A(a, AFile::NsTable) => a.ns.table().len() as u64,
            _ => 0,
        };
        let mtime = match node {
            Node::S(s, _) => s.created as u32,
            Node::A(a, _) => a.created as u32,
            _ => self.shared.started,
        };
        Stat {
            ty: 0,
            dev: 0,
            qid: self.qid(node),
            mode: Self::mode(node),
            atime: mtime,
            mtime,
            length,
            name: Self::name_of(node),
            uid: self.shared.owner.clone(),
            gid: GROUP.to_owned(),
            muid: self.shared.owner.clone(),
        }
    }

    pub(super) fn entries(&self, node: &Node) -> Vec<Stat> {
        let reg = self.reg();
        let st = |n: Node| self.stat_of(&n);
        match node {
            Node::Root => ROOT_FILES.iter().map(|d| st(Node::R(d.kind))).collect(),
            Node::R(RootFile::SessionDir) => {
                let mut v: Vec<Stat> = SESSIONS_FILES.iter().map(|d| st(Node::R(d.kind))).collect();
                for s in reg.sessions() {
                    v.push(st(Node::S(s, SFile::Dir)));
                }
                v
            }
            Node::R(RootFile::BypassDir) => {
                BYPASS_FILES.iter().map(|d| st(Node::R(d.kind))).collect()
            }
            Node::R(RootFile::SkillsDir) => {
                let mut v: Vec<Stat> = SKILLS_FILES.iter().map(|d| st(Node::R(d.kind))).collect();
                let cat = crate::skills::scan(&self.shared.config());
                v.extend(super::skills::dir_stats(
                    &self.shared.config(),
                    &cat,
                    &self.shared.owner,
                ));
                v
            }
            Node::S(s, SFile::Dir) => SESSION_FILES
                .iter()
                .map(|d| st(Node::S(Arc::clone(s), d.kind)))
                .collect(),
            Node::S(s, SFile::AgentDir) => {
                let mut v: Vec<Stat> = AGENTS_FILES
                    .iter()
                    .map(|d| st(Node::S(Arc::clone(s), d.kind)))
                    .collect();
                for a in s.agents() {
                    v.push(st(Node::A(a, AFile::Dir)));
                }
                v
            }
            Node::A(a, AFile::Dir) => AGENT_FILES
                .iter()
                .map(|d| st(Node::A(Arc::clone(a), d.kind)))
                .collect(),
            Node::A(a, AFile::ProcDir) => PROC_FILES
                .iter()
                .map(|d| st(Node::A(Arc::clone(a), d.kind)))
                .collect(),
            Node::S(s, SFile::Ns) => {
                let mut v: Vec<Stat> = SESSION_NS_FILES
                    .iter()
                    .map(|d| st(Node::S(Arc::clone(s), d.kind)))
                    .collect();
                let owner = NsOwner::Session(Arc::clone(s));
                v.extend(union::point_stats(&owner, &self.shared.owner));
                v
            }
            Node::A(a, AFile::Ns) => {
                let mut v: Vec<Stat> = AGENT_NS_FILES
                    .iter()
                    .map(|d| st(Node::A(Arc::clone(a), d.kind)))
                    .collect();
                let owner = NsOwner::Agent(Arc::clone(a));
                v.extend(union::point_stats(&owner, &self.shared.owner));
                v
            }
            _ => Vec::new(),
        }
    }

    pub(super) fn step(&self, node: &Node, name: &str) -> Option<Node> {
        let reg = self.reg();
        match (node, name) {
            (Node::Root, "." | "..") => Some(Node::Root),
            (Node::Root, n) => ROOT_FILES
                .iter()
                .find(|d| d.name == n)
                .map(|d| Node::R(d.kind)),
            (Node::R(RootFile::SessionDir), "..") => Some(Node::Root),
            (Node::R(RootFile::SessionDir), n) => SESSIONS_FILES
                .iter()
                .find(|d| d.name == n)
                .map(|d| Node::R(d.kind))
                .or_else(|| reg.session(n).map(|s| Node::S(s, SFile::Dir))),
            (Node::R(RootFile::BypassDir), "..") => Some(Node::Root),
            (Node::R(RootFile::BypassDir), n) => BYPASS_FILES
                .iter()
                .find(|d| d.name == n)
                .map(|d| Node::R(d.kind)),
            (Node::R(RootFile::SkillsDir), "..") => Some(Node::Root),
            (Node::R(RootFile::SkillsDir), n) => SKILLS_FILES
                .iter()
                .find(|d| d.name == n)
                .map(|d| Node::R(d.kind))
                .or_else(|| SkillNode::top(&self.shared.config(), n).ok().map(Node::K)),
            (Node::K(k), "..") => match k.parent(&self.shared.config()) {
                None => Some(Node::R(RootFile::SkillsDir)),
                Some(p) => p.ok().map(Node::K),
            },
            (Node::K(k), n) => k.child(&self.shared.config(), n).ok().map(Node::K),
            (Node::S(_, SFile::Dir), "..") => Some(Node::R(RootFile::SessionDir)),
            (Node::S(s, SFile::Dir), n) => SESSION_FILES
                .iter()
                .find(|d| d.name == n)
                .map(|d| Node::S(Arc::clone(s), d.kind)),
            (Node::S(s, SFile::AgentDir), "..") => Some(Node::S(Arc::clone(s), SFile::Dir)),
            (Node::S(s, SFile::AgentDir), n) => AGENTS_FILES
                .iter()
                .find(|d| d.name == n)
                .map(|d| Node::S(Arc::clone(s), d.kind))
                .or_else(|| s.agent(n).map(|a| Node::A(a, AFile::Dir))),
            (Node::A(a, AFile::Dir), "..") => {
                a.session.upgrade().map(|s| Node::S(s, SFile::AgentDir))
            }
            (Node::A(a, AFile::Dir), n) => AGENT_FILES
                .iter()
                .find(|d| d.name == n)
                .map(|d| Node::A(Arc::clone(a), d.kind)),
            (Node::A(a, AFile::ProcDir), "..") => Some(Node::A(Arc::clone(a), AFile::Dir)),
            (Node::A(a, AFile::ProcDir), n) => PROC_FILES
                .iter()
                .find(|d| d.name == n)
                .map(|d| Node::A(Arc::clone(a), d.kind)),
            (Node::S(s, SFile::Ns), "..") => Some(Node::S(Arc::clone(s), SFile::Dir)),
            (Node::S(s, SFile::Ns), n) => SESSION_NS_FILES
                .iter()
                .find(|d| d.name == n)
                .map(|d| Node::S(Arc::clone(s), d.kind)),
            (Node::A(a, AFile::Ns), "..") => Some(Node::A(Arc::clone(a), AFile::Dir)),
            (Node::A(a, AFile::Ns), n) => AGENT_NS_FILES
                .iter()
                .find(|d| d.name == n)
                .map(|d| Node::A(Arc::clone(a), d.kind)),
            _ => None,
        }
    }

    /// A step into, inside or out of a union view (`ns/POINT/…`); `None` when `name` is not
    /// one (the tree's own nodes, [`OllieFs::step`]).
    pub(super) fn ns_step(node: &Node, name: &str) -> Option<Result<Node>> {
        let into = |owner: NsOwner| UnionNode::top(owner, name).map(Node::U).map_err(err);
        match node {
            Node::U(u) if name == ".." => Some(match u.parent() {
                Some(p) => p.map(Node::U).map_err(err),
                None => Ok(match &u.owner {
                    NsOwner::Session(s) => Node::S(Arc::clone(s), SFile::Ns),
                    NsOwner::Agent(a) => Node::A(Arc::clone(a), AFile::Ns),
                }),
            }),
            Node::U(u) => Some(u.child(name).map(Node::U).map_err(err)),
            Node::S(s, SFile::Ns)
                if name != ".." && !SESSION_NS_FILES.iter().any(|d| d.name == name) =>
            {
                Some(into(NsOwner::Session(Arc::clone(s))))
            }
            Node::A(a, AFile::Ns)
                if name != ".." && !AGENT_NS_FILES.iter().any(|d| d.name == name) =>
            {
                Some(into(NsOwner::Agent(Arc::clone(a))))
            }
            _ => None,
        }
    }

    pub(super) fn alive(node: &Node) -> Result<()> {
        match node {
            Node::S(s, _) if s.is_killed() => Err(gone()),
            Node::A(a, _) if a.is_killed() => Err(gone()),
            Node::U(u) if u.owner.is_killed() => Err(gone()),
            _ => Ok(()),
        }
    }

    /// A walk through the tree's own nodes, entering a proxied view where one starts.
    pub(super) async fn walk_plain(
        &self,
        start: Node,
        class: Class,
        names: &[String],
    ) -> Result<Walked<OllieFid>> {
        let mut node = start;
        let mut qids = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            // Into a proxied view: the rest of the walk is toolsrv's.
            let view = match (&node, name.as_str()) {
                (Node::S(s, SFile::Dir), "toolsrv") => {
                    if !may_open(
                        Self::mode(&Node::S(Arc::clone(s), SFile::Toolsrv)),
                        class,
                        om::OREAD,
                    ) {
                        return if i == 0 {
                            Err(Error::permission_denied())
                        } else {
                            Ok(Walked { qids, fid: None })
                        };
                    }
                    Some((Arc::clone(s), None))
                }
                (Node::A(a, AFile::ProcDir), n) if n.parse::<u32>().is_ok() => {
                    let s = a.session.upgrade().ok_or_else(gone)?;
                    Some((s, Some(Arc::clone(a))))
                }
                _ => None,
            };
            if let Some((s, agent)) = view {
                let is_pid = agent.is_some();
                let top = Proxy {
                    session: s,
                    agent,
                    path: Vec::new(),
                    remote: None,
                    qid: self.qid(&node),
                };
                let rest: &[String] = if is_pid { &names[i..] } else { &names[i + 1..] };
                if !is_pid {
                    // The view's own root.
                    let w = self.proxy_walk(&top, &[]).await;
                    let w = match w {
                        Ok(w) => w,
                        Err(e) if i == 0 => return Err(e),
                        Err(_) => return Ok(Walked { qids, fid: None }),
                    };
                    let Some(mut rootfid) = w.fid else {
                        return Ok(Walked { qids, fid: None });
                    };
                    rootfid.class = class;
                    let rq = rootfid.proxy.as_ref().map_or(top.qid, |p| p.qid);
                    qids.push(rq);
                    if rest.is_empty() {
                        return Ok(Walked {
                            qids,
                            fid: Some(rootfid),
                        });
                    }
                    let Some(rp) = rootfid.proxy.as_ref() else {
                        return Ok(Walked { qids, fid: None });
                    };
                    return match self.proxy_walk(rp, rest).await {
                        Ok(mut w) => {
                            qids.extend(w.qids);
                            if let Some(f) = &mut w.fid {
                                f.class = class;
                            }
                            Ok(Walked { qids, fid: w.fid })
                        }
                        Err(_) => Ok(Walked { qids, fid: None }),
                    };
                }
                return match self.proxy_walk(&top, rest).await {
                    Ok(mut w) => {
                        qids.extend(w.qids);
                        if let Some(f) = &mut w.fid {
                            f.class = class;
                        }
                        Ok(Walked { qids, fid: w.fid })
                    }
                    Err(e) if i == 0 => Err(e),
                    Err(_) => Ok(Walked { qids, fid: None }),
                };
            }
            if let Some(r) = Self::ns_step(&node, name) {
                match r {
                    Ok(n) => {
                        qids.push(self.qid(&n));
                        node = n;
                        continue;
                    }
                    Err(e) if i == 0 => return Err(e),
                    Err(_) => return Ok(Walked { qids, fid: None }),
                }
            }
            match self.step(&node, name) {
                Some(n) => {
                    qids.push(self.qid(&n));
                    node = n;
                }
                None if i == 0 => return Err(Error::not_found()),
                None => return Ok(Walked { qids, fid: None }),
            }
        }
        Ok(Walked {
            qids,
            fid: Some(OllieFid::new(node, class)),
        })
    }

    /// A walk from `fid` (the new fid's user is set by the caller).
    pub(super) async fn walk_from(
        &self,
        fid: &OllieFid,
        names: &[String],
    ) -> Result<Walked<OllieFid>> {
        let class = fid.class;
        if let Some(p) = &fid.proxy {
            // `..` at the top of a view leaves it.
            if names.first().is_some_and(|n| n == "..") && p.path.is_empty() {
                let up = match &p.agent {
                    Some(a) => Node::A(Arc::clone(a), AFile::ProcDir),
                    None => Node::S(Arc::clone(&p.session), SFile::Dir),
                };
                let q = self.qid(&up);
                let mut w = self.walk_plain(up, class, &names[1..]).await?;
                w.qids.insert(0, q);
                return Ok(w);
            }
            let mut w = self.proxy_walk(p, names).await?;
            if let Some(f) = &mut w.fid {
                f.class = class;
            }
            return Ok(w);
        }
        self.walk_plain(fid.node.clone(), class, names).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_permissions() {
        assert!(may_open(0o600, Class::Owner, om::ORDWR));
        assert!(!may_open(0o600, Class::Group, om::OREAD));
        assert!(may_open(0o444, Class::Group, om::OREAD));
        assert!(!may_open(0o444, Class::Group, om::OWRITE));
        assert!(!may_open(0o444, Class::Owner, om::OREAD | om::OTRUNC));
        assert!(!may_open(0o444, Class::Owner, om::OEXEC));
        assert!(may_open(0o222, Class::Group, om::OWRITE));
    }
}
