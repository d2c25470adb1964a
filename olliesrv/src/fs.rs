//! The olliesrv file tree served over 9P.
//!
//! One static table ([`ROOT_FILES`]) defines the root's files, their modes and their `help`
//! text, so the directory listing and the reference can never disagree.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ollie_p9::server::{ConnInfo, Filesystem, Walked};
use ollie_p9::util::{DirSnapshot, read_at};
use ollie_p9::wire::{Qid, Stat, dm, om, qt};
use ollie_p9::{Error, Result};
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::config::Config;
use crate::events::Events;

/// The group every file belongs to; everyone but the owner gets its bits.
pub const GROUP: &str = "agent";

/// A node of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    Root,
    Backends,
    Ctl,
    Eventwait,
    Help,
}

impl Node {
    fn path(self) -> u64 {
        match self {
            Node::Root => 0,
            Node::Backends => 1,
            Node::Ctl => 2,
            Node::Eventwait => 3,
            Node::Help => 4,
        }
    }
}

/// A file in the root directory.
#[derive(Debug)]
pub struct FileDef {
    pub name: &'static str,
    pub node: Node,
    /// Permission bits (owner, group `agent`, other).
    pub mode: u32,
    /// One line for `help`.
    pub help: &'static str,
}

/// The root's files, in listing order.
pub const ROOT_FILES: &[FileDef] = &[
    FileDef {
        name: "backends",
        node: Node::Backends,
        mode: 0o444,
        help: "available backend names from config.toml, one per line",
    },
    FileDef {
        name: "ctl",
        node: Node::Ctl,
        mode: 0o600,
        help: "server control (owner only): write a command, read its reply on the same fid; commands: help, invalidate, kill",
    },
    FileDef {
        name: "eventwait",
        node: Node::Eventwait,
        mode: 0o444,
        help: "blocks until a server event newer than when the fid was opened; each read returns one JSON line; end of file once the server stops",
    },
    FileDef {
        name: "help",
        node: Node::Help,
        mode: 0o444,
        help: "this filesystem reference",
    },
];

/// Commands of the root `ctl`.
pub const CTL_COMMANDS: &[(&str, &str)] = &[
    ("help", "list these commands"),
    (
        "invalidate",
        "re-read config.toml; on error the old configuration stays",
    ),
    (
        "kill",
        "stop the server (eventwait readers get a server-stopping event)",
    ),
];

/// The text of `help`.
pub fn help_text() -> String {
    let mut s = String::from(
        "ollie — everything is a file\n\
         \n\
         Files (path, mode, meaning). Owner is the server's user, group is \"agent\":\n\
         \n",
    );
    s.push_str(&format!(
        "  {:<12} {:<5} {}\n",
        "/", "d555", "the server root"
    ));
    for f in ROOT_FILES {
        s.push_str(&format!("  {:<12} {:04o}  {}\n", f.name, f.mode, f.help));
    }
    s.push_str("\nctl commands:\n");
    for (c, h) in CTL_COMMANDS {
        s.push_str(&format!("  {c:<12} {h}\n"));
    }
    s.push_str(
        "\nConventions:\n  \
         request/response files (ctl): the write is processed when it arrives; its reply is read\n  \
         back on the same fid; an error is the write's own error, one line.\n  \
         blocking files (eventwait): a read waits for something new for that fid; flushing the\n  \
         read cancels it.\n  \
         attach as your own user (or as \"agent\" to get only the group's rights).\n",
    );
    s
}

/// Who a fid acts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The server's own user: owner bits.
    Owner,
    /// Anyone else (including agents): group bits.
    Group,
}

/// Shared server state behind the tree.
#[derive(Debug)]
pub struct Shared {
    /// The server's user name (file owner).
    pub owner: String,
    pub owner_uid: u32,
    /// mtime/atime of every file.
    pub started: u32,
    pub config: RwLock<Arc<Config>>,
    /// The `--config` file, if one was given (re-read by `invalidate`).
    pub config_path: Option<PathBuf>,
    pub events: Arc<Events>,
    /// Set to true to stop the server.
    pub stop: watch::Sender<bool>,
    /// Bumped when `backends` changes.
    backends_version: AtomicU32,
}

impl Shared {
    pub fn new(
        config: Config,
        config_path: Option<PathBuf>,
        events: Arc<Events>,
        stop: watch::Sender<bool>,
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
            config: RwLock::new(Arc::new(config)),
            config_path,
            events,
            stop,
            backends_version: AtomicU32::new(0),
        }
    }

    fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .map_or_else(|p| Arc::clone(&p.into_inner()), |c| Arc::clone(&c))
    }

    fn backends_text(&self) -> Bytes {
        let c = self.config();
        let mut s = String::new();
        for name in c.backends.keys() {
            s.push_str(name);
            s.push('\n');
        }
        Bytes::from(s)
    }
}

/// Per-fid state.
#[derive(Debug)]
pub struct OllieFid {
    node: Node,
    class: Class,
    /// Reply of the last write (ctl).
    reply: Option<Bytes>,
    /// Contents frozen at open (help, backends).
    content: Option<Bytes>,
    dir: Option<DirSnapshot>,
    /// eventwait: the last event this fid has been given, and any unread rest of it.
    cursor: u64,
    pending: Bytes,
}

/// The olliesrv filesystem.
#[derive(Debug)]
pub struct OllieFs {
    pub shared: Arc<Shared>,
}

impl OllieFs {
    pub fn new(shared: Arc<Shared>) -> OllieFs {
        OllieFs { shared }
    }

    fn qid(&self, node: Node) -> Qid {
        let version = match node {
            Node::Backends => self.shared.backends_version.load(Ordering::Relaxed),
            Node::Eventwait => self.shared.events.cursor() as u32,
            _ => 0,
        };
        Qid {
            ty: if node == Node::Root {
                qt::DIR
            } else {
                qt::FILE
            },
            version,
            path: node.path(),
        }
    }

    fn def(node: Node) -> Option<&'static FileDef> {
        ROOT_FILES.iter().find(|f| f.node == node)
    }

    fn mode(node: Node) -> u32 {
        match Self::def(node) {
            Some(f) => f.mode,
            None => dm::DIR | 0o555,
        }
    }

    fn stat_of(&self, node: Node) -> Stat {
        let def = Self::def(node);
        let length = match node {
            Node::Help => help_text().len() as u64,
            Node::Backends => self.shared.backends_text().len() as u64,
            _ => 0,
        };
        Stat {
            ty: 0,
            dev: 0,
            qid: self.qid(node),
            mode: Self::mode(node),
            atime: self.shared.started,
            mtime: self.shared.started,
            length,
            name: def.map_or("/", |f| f.name).to_owned(),
            uid: self.shared.owner.clone(),
            gid: GROUP.to_owned(),
            muid: self.shared.owner.clone(),
        }
    }

    /// Decides who an attach acts for, from the uname and the peer's credentials.
    fn class_for(&self, conn: &ConnInfo, uname: &str) -> Result<Class> {
        if uname == GROUP {
            // Anyone may give up rights and act as an agent.
            return Ok(Class::Group);
        }
        let Some(peer) = conn.peer else {
            // No credentials to check (not a unix socket): never the owner.
            return Ok(Class::Group);
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
        if uname == self.shared.owner {
            Ok(Class::Owner)
        } else {
            Ok(Class::Group)
        }
    }

    fn ctl(&self, cmd: &str) -> Result<String> {
        let valid = || {
            CTL_COMMANDS
                .iter()
                .map(|(c, _)| *c)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let lines: Vec<&str> = cmd.lines().filter(|l| !l.trim().is_empty()).collect();
        let line = match lines.as_slice() {
            [] => return Err(Error::new(format!("empty command (valid: {})", valid()))),
            [one] => one.trim(),
            _ => {
                return Err(Error::new(format!(
                    "one command per write, got {} lines (invalid argument)",
                    lines.len()
                )));
            }
        };
        let mut words = line.split_whitespace();
        let verb = words.next().unwrap_or("");
        let extra: Vec<&str> = words.collect();
        if !extra.is_empty() {
            return Err(Error::new(format!(
                "{verb}: takes no arguments, got {:?} (invalid argument)",
                extra.join(" ")
            )));
        }
        match verb {
            "help" => {
                let mut s = String::new();
                for (c, h) in CTL_COMMANDS {
                    s.push_str(&format!("{c}\t{h}\n"));
                }
                Ok(s)
            }
            "invalidate" => {
                let cfg = Config::load(self.shared.config_path.as_deref())
                    .map_err(|e| Error::new(format!("invalidate: {}", crate::error_chain(&e))))?;
                let n = cfg.backends.len();
                if let Ok(mut c) = self.shared.config.write() {
                    *c = Arc::new(cfg);
                }
                self.shared.backends_version.fetch_add(1, Ordering::Relaxed);
                let mut f = Map::new();
                f.insert("backends".into(), Value::from(n));
                self.shared.events.emit("config-reloaded", f);
                Ok(format!("config reloaded: {n} backends\n"))
            }
            "kill" => {
                let _ = self.shared.stop.send(true);
                Ok("stopping\n".into())
            }
            other => Err(Error::new(format!(
                "unknown command {other:?} (valid: {})",
                valid()
            ))),
        }
    }
}

/// Whether `class` may open a file of `mode` bits with open mode `omode`.
pub fn may_open(mode: u32, class: Class, omode: u8) -> bool {
    let bits = match class {
        Class::Owner => (mode >> 6) & 7,
        Class::Group => (mode >> 3) & 7,
    };
    let need = match omode & 3 {
        om::OREAD => 4,
        om::OWRITE => 2,
        om::ORDWR => 6,
        _ => 1,
    } | if omode & om::OTRUNC != 0 { 2 } else { 0 };
    bits & need == need
}

impl Filesystem for OllieFs {
    type Fid = OllieFid;

    async fn attach(
        &self,
        conn: &ConnInfo,
        _auth: Option<&mut OllieFid>,
        uname: &str,
        aname: &str,
    ) -> Result<(OllieFid, Qid)> {
        if !aname.is_empty() {
            return Err(Error::new(format!(
                "file does not exist: no tree named {aname:?} (attach with an empty aname)"
            )));
        }
        let class = self.class_for(conn, uname)?;
        tracing::debug!(conn = conn.id, uname, ?class, "attach");
        Ok((
            OllieFid {
                node: Node::Root,
                class,
                reply: None,
                content: None,
                dir: None,
                cursor: 0,
                pending: Bytes::new(),
            },
            self.qid(Node::Root),
        ))
    }

    async fn walk(&self, fid: &OllieFid, names: &[String]) -> Result<Walked<OllieFid>> {
        let mut node = fid.node;
        let mut qids = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            let next = match (node, name.as_str()) {
                (Node::Root, "..") | (Node::Root, ".") => Some(Node::Root),
                (Node::Root, n) => ROOT_FILES.iter().find(|f| f.name == n).map(|f| f.node),
                _ => None,
            };
            match next {
                Some(n) => {
                    node = n;
                    qids.push(self.qid(n));
                }
                None if i == 0 => return Err(Error::not_found()),
                None => return Ok(Walked { qids, fid: None }),
            }
        }
        Ok(Walked {
            qids,
            fid: Some(OllieFid {
                node,
                class: fid.class,
                reply: None,
                content: None,
                dir: None,
                cursor: 0,
                pending: Bytes::new(),
            }),
        })
    }

    async fn open(&self, fid: &mut OllieFid, mode: u8) -> Result<(Qid, u32)> {
        if !may_open(Self::mode(fid.node), fid.class, mode) {
            return Err(Error::permission_denied());
        }
        match fid.node {
            Node::Help => fid.content = Some(Bytes::from(help_text())),
            Node::Backends => fid.content = Some(self.shared.backends_text()),
            Node::Eventwait => fid.cursor = self.shared.events.cursor(),
            Node::Root | Node::Ctl => {}
        }
        Ok((self.qid(fid.node), 0))
    }

    async fn read(&self, fid: &mut OllieFid, offset: u64, count: u32) -> Result<Bytes> {
        match fid.node {
            Node::Root => {
                if offset == 0 || fid.dir.is_none() {
                    let entries: Vec<Stat> =
                        ROOT_FILES.iter().map(|f| self.stat_of(f.node)).collect();
                    fid.dir = Some(DirSnapshot::new(&entries));
                }
                fid.dir
                    .as_ref()
                    .map_or(Ok(Bytes::new()), |d| d.read(offset, count))
            }
            Node::Help | Node::Backends => Ok(fid
                .content
                .as_ref()
                .map_or(Bytes::new(), |c| read_at(c, offset, count))),
            Node::Ctl => Ok(fid
                .reply
                .as_ref()
                .map_or(Bytes::new(), |r| read_at(r, offset, count))),
            Node::Eventwait => {
                if fid.pending.is_empty() {
                    match self.shared.events.next_after(fid.cursor).await {
                        Some((seq, line)) => {
                            fid.cursor = seq;
                            fid.pending = Bytes::from(line);
                        }
                        None => return Ok(Bytes::new()),
                    }
                }
                let n = fid.pending.len().min(count as usize);
                Ok(fid.pending.split_to(n))
            }
        }
    }

    async fn write(&self, fid: &mut OllieFid, _offset: u64, data: Bytes) -> Result<u32> {
        match fid.node {
            Node::Ctl => {
                // A failed command leaves no reply behind: a read after it returns nothing
                // rather than the answer to an earlier command.
                fid.reply = None;
                let text = std::str::from_utf8(&data)
                    .map_err(|_| Error::invalid("command is not utf-8"))?;
                let reply = self.ctl(text)?;
                fid.reply = Some(Bytes::from(reply));
                Ok(data.len() as u32)
            }
            _ => Err(Error::permission_denied()),
        }
    }

    async fn stat(&self, fid: &mut OllieFid) -> Result<Stat> {
        Ok(self.stat_of(fid.node))
    }

    async fn wstat(&self, fid: &mut OllieFid, st: &Stat) -> Result<()> {
        // `echo cmd > ctl` through 9pfuse truncates first: a no-op for synthetic files the
        // caller may write. Nothing else can be changed.
        let mut trunc = Stat::dont_touch();
        trunc.length = 0;
        if *st == trunc && may_open(Self::mode(fid.node), fid.class, om::OWRITE) {
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
    fn help_lists_every_root_file() {
        let h = help_text();
        for f in ROOT_FILES {
            assert!(
                h.contains(&format!("  {:<12} {:04o}", f.name, f.mode)),
                "{}",
                f.name
            );
        }
        for (c, _) in CTL_COMMANDS {
            assert!(h.contains(c));
        }
    }

    #[test]
    fn open_permissions() {
        assert!(may_open(0o600, Class::Owner, om::ORDWR));
        assert!(!may_open(0o600, Class::Group, om::OREAD));
        assert!(may_open(0o444, Class::Group, om::OREAD));
        assert!(!may_open(0o444, Class::Group, om::OWRITE));
        assert!(!may_open(0o444, Class::Owner, om::OREAD | om::OTRUNC));
        assert!(!may_open(0o444, Class::Owner, om::OEXEC));
    }
}
