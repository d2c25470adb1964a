//! The olliesrv file tree served over 9P.
//!
//! Static tables ([`ROOT_FILES`], [`SESSION_FILES`], [`AGENT_FILES`], …) define every file,
//! its mode and its `help` text, so listings, permissions and the reference can never
//! disagree. Sessions and agents are live objects ([`crate::model`]); fids hold them, so a
//! rename keeps open fids valid, and a killed one reads as gone. The union directories of a
//! bead namespace (`…/ns/POINT/…`) are dynamic: [`Node::U`] names a path in a view and
//! [`crate::ns`] resolves it on every request (so `help` lists them as a pattern).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ollie_p9::server::{ConnInfo, Filesystem, Walked};
use ollie_p9::util::{DirSnapshot, read_at};
use ollie_p9::wire::{Qid, Stat, dm, om, qt};
use ollie_p9::{Error, Fid as RemoteFid, Result};
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::config::Config;
use crate::events::Events;
use crate::link::LinkState;
use crate::model::{Agent, ChatKind, Registry, Session, clip, parse_spec};
use crate::ns::{NsOwner, UnionFile, UnionNode};

/// The group every file belongs to; everyone but the owner gets its bits.
pub const GROUP: &str = "agent";

/// How long a file that needs toolsrv waits for it to come up.
const LINK_WAIT: Duration = Duration::from_secs(10);
/// How long each backend may take to list its models.
const MODELS_TIMEOUT: Duration = Duration::from_secs(10);

/// Root files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootFile {
    Backends,
    Models,
    Agents,
    Tools,
    Help,
    Aliases,
    Ctl,
    Eventwait,
    Generate,
    SessionDir,
    SessionNew,
    SessionIdx,
    BypassDir,
    BypassPending,
    BypassResolve,
    BypassAudit,
    BypassFull,
    SkillsDir,
    SkillsIdx,
}

/// Files of a session directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SFile {
    Dir,
    Env,
    Cfg,
    Paused,
    Ctl,
    Name,
    Id,
    AgentDir,
    AgentNew,
    AgentIdx,
    Toolsrv,
    Ns,
    NsCtl,
    NsTable,
}

/// Files of an agent directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AFile {
    Dir,
    Prompt,
    Fifo,
    Feed,
    Chat,
    ChatRaw,
    Statewait,
    Log,
    Plan,
    Cfg,
    Ctl,
    Stats,
    Name,
    Id,
    ProcDir,
    ProcTop,
    Ns,
    NsCtl,
    NsTable,
}

/// A file's definition: name, mode, one line for `help`.
#[derive(Debug)]
pub struct FileDef<K: 'static> {
    pub name: &'static str,
    pub kind: K,
    pub mode: u32,
    pub help: &'static str,
}

const fn f<K>(name: &'static str, kind: K, mode: u32, help: &'static str) -> FileDef<K> {
    FileDef {
        name,
        kind,
        mode,
        help,
    }
}

/// The root's files, in listing order.
pub const ROOT_FILES: &[FileDef<RootFile>] = &[
    f(
        "backends",
        RootFile::Backends,
        0o444,
        "configured backend names, one per line",
    ),
    f(
        "models",
        RootFile::Models,
        0o444,
        "available models: backend<TAB>model per line",
    ),
    f(
        "agents",
        RootFile::Agents,
        0o444,
        "agent profile names, one per line",
    ),
    f(
        "tools",
        RootFile::Tools,
        0o444,
        "the tools: name<spaces>description per line",
    ),
    f("help", RootFile::Help, 0o444, "this filesystem reference"),
    f(
        "aliases",
        RootFile::Aliases,
        0o444,
        "id<TAB>path of every session and agent",
    ),
    f(
        "ctl",
        RootFile::Ctl,
        0o600,
        "server control (owner only): write a command, read its reply on the same fid; commands: help, invalidate, kill",
    ),
    f(
        "eventwait",
        RootFile::Eventwait,
        0o444,
        "blocks until a server event newer than when the fid was opened; each read returns one JSON line; end of file once the server stops",
    ),
    f(
        "generate",
        RootFile::Generate,
        0o666,
        "one-shot generation: write a prompt (or {\"prompt\":…}), read the reply on the same fid",
    ),
    f("session", RootFile::SessionDir, dm::DIR | 0o555, "sessions"),
    f(
        "bypass",
        RootFile::BypassDir,
        dm::DIR | 0o500,
        "escalation requests of every session (owner only)",
    ),
    f(
        "skills",
        RootFile::SkillsDir,
        dm::DIR | 0o755,
        "the skills agents see (agents read; the owner creates skills here; see skills below)",
    ),
];

/// `skills/`'s own files (each winning skill is a directory beside them).
pub const SKILLS_FILES: &[FileDef<RootFile>] = &[f(
    "idx",
    RootFile::SkillsIdx,
    0o444,
    "every skill: name<TAB>active|shadowed<TAB>directory<TAB>description per line",
)];

/// `bypass/`'s files (every session's requests; each session's own are in its toolsrv/).
pub const BYPASS_FILES: &[FileDef<RootFile>] = &[
    f(
        "pending",
        RootFile::BypassPending,
        0o400,
        "blocks until a request of any session is pending that this fid has not seen; one JSON object per read",
    ),
    f(
        "resolve",
        RootFile::BypassResolve,
        0o200,
        "write {\"id\":…,\"approved\":true} or {\"id\":…,\"error\":…} (optional \"scope\":\"session\")",
    ),
    f(
        "audit",
        RootFile::BypassAudit,
        0o400,
        "the audit log: every request and verdict, one JSON object per line (its last MiB)",
    ),
    f(
        "full",
        RootFile::BypassFull,
        0o600,
        "write a pending request's id, read the whole request on the same fid (display-escaped; pending shows long ones cut)",
    ),
];

/// `session/`'s files.
pub const SESSIONS_FILES: &[FileDef<RootFile>] = &[
    f(
        "new",
        RootFile::SessionNew,
        0o666,
        "create a session: write name= cwd= backend= model= profile= remote=, read its name; remote=NAME (a [remotes.NAME] of config.toml) runs its tools on that host over ssh, and cwd= is then a directory there",
    ),
    f(
        "idx",
        RootFile::SessionIdx,
        0o444,
        "name<TAB>id<TAB>agents<TAB>toolsrv state<TAB>paused, one line per session",
    ),
];

/// Files of `session/NAME/`.
pub const SESSION_FILES: &[FileDef<SFile>] = &[
    f(
        "env",
        SFile::Env,
        0o444,
        "OLLIE_SESSION_ID and the other non-secret OLLIE_* variables",
    ),
    f("paused", SFile::Paused, 0o444, "true or false"),
    f(
        "cfg",
        SFile::Cfg,
        0o444,
        "key=value: name, id, cwd, backend, model, profile, remote (where tools run: empty for this host), toolsrv (up, starting, restarting, failed) and toolsrv_reason while not up",
    ),
    f(
        "ctl",
        SFile::Ctl,
        0o660,
        "session control: kill, save, invalidate, pause, resume, help; reply on the same fid",
    ),
    f(
        "name",
        SFile::Name,
        0o666,
        "the session's name; write to rename (open fids stay valid)",
    ),
    f("id", SFile::Id, 0o444, "the session's immutable UUID"),
    f(
        "agent",
        SFile::AgentDir,
        dm::DIR | 0o555,
        "the session's agents",
    ),
    f(
        "toolsrv",
        SFile::Toolsrv,
        dm::DIR | 0o500,
        "the session's toolsrv tree (owner only): read-only views, and bypass/ for approvals",
    ),
    f(
        "ns",
        SFile::Ns,
        dm::DIR | 0o555,
        "the session's bead namespace: ctl, table, one union directory per mount point; agents created later copy it",
    ),
];

/// Files of `session/NAME/ns/` (besides one union directory per mount point).
pub const SESSION_NS_FILES: &[FileDef<SFile>] = &[
    f(
        "ctl",
        SFile::NsCtl,
        0o660,
        "write a bead command (start, mount, unmount, ns, rfork; see below), read its reply on the same fid",
    ),
    f(
        "table",
        SFile::NsTable,
        0o444,
        "the mount table: POINT (union), then [N] NAME URI read|read,create* per member in search order",
    ),
];

/// Files of `session/NAME/agent/NAME/ns/` (besides one union directory per mount point).
pub const AGENT_NS_FILES: &[FileDef<AFile>] = &[
    f(
        "ctl",
        AFile::NsCtl,
        0o660,
        "write a bead command to the agent's own namespace, read its reply on the same fid",
    ),
    f(
        "table",
        AFile::NsTable,
        0o444,
        "the agent's mount table (as session/NAME/ns/table)",
    ),
];

/// Files of `session/NAME/agent/`.
pub const AGENTS_FILES: &[FileDef<SFile>] = &[
    f(
        "new",
        SFile::AgentNew,
        0o666,
        "create an agent: write name= cwd= backend= model= profile= [prompt=], read its id (with prompt=, the reply)",
    ),
    f(
        "idx",
        SFile::AgentIdx,
        0o444,
        "name<TAB>id<TAB>state, one line per agent",
    ),
];

/// Files of `session/NAME/agent/NAME/`.
pub const AGENT_FILES: &[FileDef<AFile>] = &[
    f(
        "prompt",
        AFile::Prompt,
        0o222,
        "write a prompt: it is queued and runs as a turn",
    ),
    f(
        "fifo",
        AFile::Fifo,
        0o666,
        "the prompt queue: write enqueues, read dequeues the next prompt (empty when none)",
    ),
    f(
        "feed",
        AFile::Feed,
        0o666,
        "write replaces the value (a write continuing the same fid's last one extends it); a read blocks until the value differs from what that fid read last",
    ),
    f(
        "chat",
        AFile::Chat,
        0o444,
        "the conversation without block markers; a read at the end blocks for more; end of file when the agent is killed",
    ),
    f(
        "chat.raw",
        AFile::ChatRaw,
        0o444,
        "the conversation with [[[kind … ]]] block markers (user, assistant, reasoning, tool_call, tool_result, error, info)",
    ),
    f(
        "statewait",
        AFile::Statewait,
        0o444,
        "blocks until the agent's state changes after the fid was opened (or last read); returns it",
    ),
    f(
        "log",
        AFile::Log,
        0o444,
        "the last 64 KiB of chat.raw (a snapshot, never blocks)",
    ),
    f(
        "plan",
        AFile::Plan,
        0o666,
        "scratch space for the agent's plan (kept across compaction and restarts)",
    ),
    f(
        "cfg",
        AFile::Cfg,
        0o666,
        "key=value settings; write key=value lines to change them (unknown keys and bad values are errors)",
    ),
    f(
        "ctl",
        AFile::Ctl,
        0o666,
        "agent control: write a command, read its reply on the same fid (write help for the list)",
    ),
    f(
        "stats",
        AFile::Stats,
        0o444,
        "key=value: tokens_in tokens_out requests cost_usd context_tokens context_limit tool_calls turns errors",
    ),
    f(
        "name",
        AFile::Name,
        0o666,
        "the agent's name; write to rename",
    ),
    f("id", AFile::Id, 0o444, "the agent's immutable UUID"),
    f(
        "proc",
        AFile::ProcDir,
        dm::DIR | 0o555,
        "the agent's processes in toolsrv: top, and N/out wait stat record ctl",
    ),
    f(
        "ns",
        AFile::Ns,
        dm::DIR | 0o555,
        "the agent's own bead namespace, a copy of the session's made when the agent was created (its file tools see it)",
    ),
];

/// Files of `…/agent/NAME/proc/`.
pub const PROC_FILES: &[FileDef<AFile>] = &[f(
    "top",
    AFile::ProcTop,
    0o444,
    "process table: PID STATE TOOL CMD",
)];

/// Files of a process directory `…/proc/N/` (served by toolsrv with the agent's identity).
pub const PID_FILES: &[(&str, u32, &str)] = &[
    ("out", 0o444, "output captured so far"),
    ("wait", 0o444, "blocks until the process ends; its status"),
    ("stat", 0o444, "key=value status"),
    (
        "record",
        0o444,
        "the sandbox's run record, one JSON object (an error while it runs)",
    ),
    ("ctl", 0o222, "term, kill, signal N, dismiss"),
];

/// Commands of the root `ctl`.
pub const CTL_COMMANDS: &[(&str, &str)] = &[
    ("help", "list these commands"),
    (
        "invalidate",
        "re-read config.toml, profiles and policies; on error the old configuration stays",
    ),
    (
        "kill",
        "stop the server (eventwait readers get a server-stopping event)",
    ),
];

/// Commands of a session's `ctl`.
pub const SESSION_CTL: &[(&str, &str)] = &[
    (
        "kill",
        "kill the session: its agents, its toolsrv and every tool",
    ),
    ("save", "write the session and its agents to disk now"),
    (
        "invalidate",
        "re-read the configuration and re-apply profiles in toolsrv",
    ),
    ("pause", "queued prompts wait until resume"),
    ("resume", "let queued prompts run again"),
    (
        "status",
        "where tools run and the toolsrv link: remote=, toolsrv=STATE, toolsrv_reason= while not up",
    ),
    (
        "cost",
        "what the session's agents spent (cost_usd) and the cap (cost_cap_usd)",
    ),
    (
        "cost_cap",
        "cost_cap [USD|off]: show or set the session's cost cap (off: the config's cost_cap_usd)",
    ),
    ("help", "list these commands"),
];

/// Commands of `ns/ctl` (a session's or an agent's), also accepted with the `bead-` prefix.
pub const NS_CTL: &[(&str, &str)] = &[
    (
        "start [SLUG]",
        "birth a bead in the registry and open it (one already open: name it SLUG); replies its file:// uri",
    ),
    (
        "mount [-b|-a] [-c] BEAD POINT",
        "union BEAD (uri, path, uuid or short name) at POINT (/NAME): -b searched first, -a last, neither replaces; -c: creates land in it",
    ),
    (
        "unmount [BEAD] POINT",
        "remove one member from POINT, or the whole point",
    ),
    ("ns", "the mount table (as table)"),
    (
        "rfork",
        "changes nothing: every agent's namespace is already private, and the session's is the template new agents copy",
    ),
];

/// Commands of an agent's `ctl`.
pub const AGENT_CTL: &[(&str, &str)] = &[
    ("stop", "interrupt the running turn"),
    ("compact", "compact the context window (needs a backend)"),
    ("clear", "clear the conversation history the model sees"),
    ("kill", "remove the agent"),
    (
        "inject TEXT",
        "add TEXT to the context without starting a turn (alias: i)",
    ),
    ("agent [PROFILE]", "show or switch the agent profile"),
    ("model [NAME]", "show or switch the model"),
    ("models", "list available models"),
    ("backend", "show the current backend"),
    ("name [NAME]", "show or set the name"),
    ("cwd [PATH]", "show or change the working directory"),
    ("tools", "list loaded tools"),
    ("tool_load NAME", "load a tool"),
    ("tool_unload NAME", "unload a tool"),
    ("proc", "list processes (pid, state, tool)"),
    ("proc top", "formatted process table"),
    ("proc term|kill|out|dismiss PID", "act on a process"),
    ("systemprompt", "the resolved system prompt"),
    ("help", "list these commands"),
];

fn table<K>(s: &mut String, prefix: &str, defs: &[FileDef<K>]) {
    for d in defs {
        let name = format!("{prefix}{}", d.name);
        let mode = if d.mode & dm::DIR != 0 {
            format!("d{:03o}", d.mode & 0o777)
        } else {
            format!("{:04o}", d.mode)
        };
        s.push_str(&format!("  {name:<38} {mode}  {}\n", d.help));
    }
}

/// The text of `help`.
pub fn help_text() -> String {
    let mut s = String::from(
        "ollie — everything is a file\n\
         \n\
         Files (path, mode, meaning). Owner is the server's user, group is \"agent\":\n\
         \n",
    );
    s.push_str(&format!(
        "  {:<38} {}  {}\n",
        "/", "d555", "the server root"
    ));
    table(&mut s, "", ROOT_FILES);
    table(&mut s, "session/", SESSIONS_FILES);
    table(&mut s, "bypass/", BYPASS_FILES);
    table(&mut s, "skills/", SKILLS_FILES);
    s.push_str(&format!(
        "  {:<38} {}\n",
        "skills/NAME/",
        "(one per active skill) its directory, read-only: SKILL.md and its other files"
    ));
    s.push_str(&format!(
        "  {:<38} {}  {}\n",
        "session/NAME/", "d555", "one session (NAME or its id)"
    ));
    table(&mut s, "session/NAME/", SESSION_FILES);
    table(&mut s, "session/NAME/ns/", SESSION_NS_FILES);
    s.push_str(&format!(
        "  {:<38} {}\n",
        "session/NAME/ns/POINT/",
        "(one per mount point, /ctx as ctx/) the union view; entries show the real file's owner bits to owner and group"
    ));
    table(&mut s, "session/NAME/agent/", AGENTS_FILES);
    s.push_str(&format!(
        "  {:<38} {}  {}\n",
        "session/NAME/agent/NAME/", "d555", "one agent (NAME or its id)"
    ));
    table(&mut s, "session/NAME/agent/NAME/", AGENT_FILES);
    table(&mut s, "session/NAME/agent/NAME/proc/", PROC_FILES);
    table(&mut s, "session/NAME/agent/NAME/ns/", AGENT_NS_FILES);
    s.push_str(&format!(
        "  {:<38} {}\n",
        "session/NAME/agent/NAME/ns/POINT/", "(one per mount point) the agent's union view"
    ));
    for (n, m, h) in PID_FILES {
        s.push_str(&format!(
            "  {:<38} {m:04o}  {h}\n",
            format!("session/NAME/agent/NAME/proc/N/{n}")
        ));
    }
    s.push_str("\nctl commands:\n");
    for (c, h) in CTL_COMMANDS {
        s.push_str(&format!("  {c:<12} {h}\n"));
    }
    s.push_str("\nsession ctl commands:\n");
    for (c, h) in SESSION_CTL {
        s.push_str(&format!("  {c:<12} {h}\n"));
    }
    s.push_str("\nagent ctl commands:\n");
    for (c, h) in AGENT_CTL {
        s.push_str(&format!("  {c:<32} {h}\n"));
    }
    s.push_str("\nns/ctl commands (bead namespaces; the bead- prefix is optional):\n");
    for (c, h) in NS_CTL {
        s.push_str(&format!("  {c:<32} {h}\n"));
    }
    s.push_str(
        "\nConventions:\n  \
         request/response files (ctl, new, generate, cfg): the write is processed when it\n  \
         arrives; its reply is read back on the same fid; an error is the write's own error,\n  \
         one line.\n  \
         blocking files (eventwait, statewait, feed, chat at its end, proc/N/wait): a read waits\n  \
         for something new for that fid; flushing the read cancels it; they end when their\n  \
         session or agent goes away.\n  \
         bead namespaces (ns/): reads search the members in order, first hit wins, and the\n  \
         shadow layer (files written here) hides them all; creates under notes/, skills/ and\n  \
         artifacts/ land in the -c member's dated kind folder, or stay in the shadow layer\n  \
         until a -c member is mounted; read-only members are never changed (writes copy up).\n  \
         Each agent has a private copy of its session's namespace, made when it was created.\n  \
         skills: directories with a SKILL.md (front matter: name, description) in config.toml's\n  \
         skill_paths (default: ~/.local/share/ollie/skills), searched in order; the first path\n  \
         wins a name, later ones are shadowed (skills/idx says so). Agents' system prompts list\n  \
         the active ones; agents read them with file_read (read-only). The owner creates a\n  \
         skill with mkdir skills/NAME, then writes skills/NAME/SKILL.md: it goes into the first\n  \
         skill path, and only skills there can be changed over 9P; it is active once valid.\n  \
         attach as your own user (or as \"agent\" to get only the group's rights); the server's\n  \
         user, root and config.toml's operators get the owner's rights. Attached as \"agent\"\n  \
         (or without credentials), the group's rights shrink further: no write to session/new,\n  \
         a session's or agent's ctl, cfg or name, agent/new, ns/ctl, or a process's ctl.\n",
    );
    s
}

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
}

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
        }
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

/// A view of a session's toolsrv tree through olliesrv.
#[derive(Debug)]
pub struct Proxy {
    session: Arc<Session>,
    /// `Some`: the agent's `proc/` (its identity, process directories only); `None`: the
    /// session's `toolsrv/` (the operator's identity, read-only except `bypass/`).
    agent: Option<Arc<Agent>>,
    /// Path in toolsrv's tree.
    path: Vec<String>,
    /// The remote fid for `path`.
    remote: Option<RemoteFid>,
    qid: Qid,
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
    K(crate::skills::SkillNode),
}

/// Per-fid state.
#[derive(Debug)]
pub struct OllieFid {
    node: Node,
    proxy: Option<Proxy>,
    class: Class,
    /// The uname of the attach this fid descends from (who wrote a verdict, in the audit).
    user: Arc<str>,
    /// Reply of the last write (ctl, new, generate).
    reply: Option<Bytes>,
    /// Contents frozen at open (help, backends, …).
    content: Option<Bytes>,
    dir: Option<DirSnapshot>,
    /// eventwait: the last event this fid has been given; statewait: the last state seq.
    cursor: u64,
    pending: Bytes,
    /// feed: the value this fid read last.
    last_feed: Option<Bytes>,
    /// feed: the value this fid wrote last (a write at its end extends it).
    wrote_feed: Option<Bytes>,
    /// bypass/pending: the requests this fid was shown.
    seen: std::collections::HashSet<String>,
    /// agent/new with prompt=: the agent and the turn to wait for.
    waiting: Option<(Arc<Agent>, u64)>,
    /// Opened for writing with OTRUNC (plan).
    trunc: bool,
    /// An auth fid (TCP): where its exchange is.
    auth: Option<TcpAuth>,
    /// An open file of a union view.
    ufile: Option<UnionFile>,
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
    fn new(node: Node, class: Class) -> OllieFid {
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
            wrote_feed: None,
            seen: std::collections::HashSet::new(),
            waiting: None,
            trunc: false,
            auth: None,
            ufile: None,
        }
    }
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

/// Whether `class` may open a file of `mode` bits with open mode `omode`.
pub fn may_open(mode: u32, class: Class, omode: u8) -> bool {
    let bits = match class {
        Class::Owner => (mode >> 6) & 7,
        Class::Group | Class::Agent => (mode >> 3) & 7,
    };
    let need = match omode & 3 {
        om::OREAD => 4,
        om::OWRITE => 2,
        om::ORDWR => 6,
        _ => 1,
    } | if omode & om::OTRUNC != 0 { 2 } else { 0 };
    bits & need == need
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

    fn qid(&self, node: &Node) -> Qid {
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

    fn mode(node: &Node) -> u32 {
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

    fn name_of(node: &Node) -> String {
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

    fn stat_of(&self, node: &Node) -> Stat {
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

    fn entries(&self, node: &Node) -> Vec<Stat> {
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
                v.extend(crate::skills::dir_stats(
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
                v.extend(crate::ns::point_stats(&owner, &self.shared.owner));
                v
            }
            Node::A(a, AFile::Ns) => {
                let mut v: Vec<Stat> = AGENT_NS_FILES
                    .iter()
                    .map(|d| st(Node::A(Arc::clone(a), d.kind)))
                    .collect();
                let owner = NsOwner::Agent(Arc::clone(a));
                v.extend(crate::ns::point_stats(&owner, &self.shared.owner));
                v
            }
            _ => Vec::new(),
        }
    }

    fn step(&self, node: &Node, name: &str) -> Option<Node> {
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
                .or_else(|| {
                    crate::skills::SkillNode::top(&self.shared.config(), n)
                        .ok()
                        .map(Node::K)
                }),
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
    fn ns_step(node: &Node, name: &str) -> Option<Result<Node>> {
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

    fn alive(node: &Node) -> Result<()> {
        match node {
            Node::S(s, _) if s.is_killed() => Err(gone()),
            Node::A(a, _) if a.is_killed() => Err(gone()),
            Node::U(u) if u.owner.is_killed() => Err(gone()),
            _ => Ok(()),
        }
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
                s.link.state().name(),
                s.paused()
            ));
        }
        out
    }

    fn root_ctl(&self, cmd: &str) -> Result<String> {
        let valid = || {
            CTL_COMMANDS
                .iter()
                .map(|(c, _)| *c)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let line = single_command(cmd)?;
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
            "help" => Ok(CTL_COMMANDS
                .iter()
                .map(|(c, h)| format!("{c}\t{h}\n"))
                .collect()),
            "invalidate" => {
                let before = self.shared.config().limits;
                let cfg = self
                    .shared
                    .reload()
                    .map_err(|e| err(format!("invalidate: {e}")))?;
                let n = cfg.backends.len();
                let later = if cfg.limits == before {
                    ""
                } else {
                    "; [limits] take effect at the next start"
                };
                let mut f = Map::new();
                f.insert("backends".into(), Value::from(n));
                f.insert(
                    "skills".into(),
                    Value::from(crate::skills::invalidate(&cfg)),
                );
                self.shared.events.emit("config-reloaded", f);
                Ok(format!("config reloaded: {n} backends{later}\n"))
            }
            "kill" => {
                self.shared.stop.send_replace(true);
                Ok("stopping\n".into())
            }
            other => Err(Error::new(format!(
                "unknown command {other:?} (valid: {})",
                valid()
            ))),
        }
    }

    // --- sessions ---

    async fn session_ctl(&self, s: &Arc<Session>, cmd: &str) -> Result<String> {
        let line = single_command(cmd)?;
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"cost_cap") {
            return Self::cost_cap(s, &words[1..]);
        }
        if words.len() > 1 {
            return Err(err(format!(
                "{}: takes no arguments (invalid argument)",
                words[0]
            )));
        }
        match words[0] {
            "help" => Ok(SESSION_CTL
                .iter()
                .map(|(c, h)| format!("{c}\t{h}\n"))
                .collect()),
            "kill" => {
                self.reg().kill_session(s).map_err(err)?;
                Ok("killed\n".into())
            }
            "save" => {
                s.save().map_err(err)?;
                for a in s.agents() {
                    a.save().map_err(err)?;
                }
                Ok("saved\n".into())
            }
            "invalidate" => {
                let cfg = self
                    .shared
                    .reload()
                    .map_err(|e| err(format!("invalidate: {e}")))?;
                if let LinkState::Up(c) = s.link.state() {
                    c.ctl(&format!("bypass_timeout {}", cfg.bypass_timeout_s))
                        .await
                        .map_err(err)?;
                    for a in s.agents() {
                        crate::link::configure_agent(&c, &a, &cfg)
                            .await
                            .map_err(err)?;
                    }
                }
                Ok("config reloaded\n".into())
            }
            "pause" => {
                let changed = self.reg().set_paused(s, true).map_err(err)?;
                Ok(if changed {
                    "paused\n"
                } else {
                    "already paused\n"
                }
                .into())
            }
            "resume" => {
                let changed = self.reg().set_paused(s, false).map_err(err)?;
                Ok(if changed { "resumed\n" } else { "not paused\n" }.into())
            }
            "status" => Ok(format!(
                "remote={}\n{}",
                s.remote.as_deref().unwrap_or(""),
                s.link.status_lines()
            )),
            "cost" => Ok(format!(
                "cost_usd={:.6}\ncost_cap_usd={}\n",
                s.cost_usd(),
                s.cost_cap()
                    .or(self.shared.config().cost_cap_usd)
                    .map_or_else(|| "none".to_owned(), |c| c.to_string())
            )),
            other => Err(err(format!(
                "unknown command {:?} (valid: {})",
                clip(other),
                SESSION_CTL
                    .iter()
                    .map(|(c, _)| *c)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// `cost_cap` (show), `cost_cap USD` (set), `cost_cap off` (back to the config's).
    fn cost_cap(s: &Session, args: &[&str]) -> Result<String> {
        let show = |c: Option<f64>| c.map_or_else(|| "none".to_owned(), |c| c.to_string());
        match args {
            [] => Ok(format!("{}\n", show(s.cost_cap()))),
            ["off"] => {
                s.set_cost_cap(None).map_err(err)?;
                Ok("cost_cap off\n".into())
            }
            [v] => {
                let c: f64 = v
                    .parse()
                    .ok()
                    .filter(|c: &f64| c.is_finite() && *c > 0.0)
                    .ok_or_else(|| {
                        err(format!(
                            "cost_cap: {:?} is not a positive amount of dollars (or off)",
                            clip(v)
                        ))
                    })?;
                s.set_cost_cap(Some(c)).map_err(err)?;
                Ok(format!("cost_cap {c}\n"))
            }
            _ => Err(err("cost_cap: takes one amount in dollars, or off")),
        }
    }

    fn agents_idx(s: &Session) -> String {
        s.agents()
            .iter()
            .map(|a| format!("{}\t{}\t{}\n", a.name(), a.id, a.state_text()))
            .collect()
    }

    // --- agents ---

    async fn tools_fid(&self, a: &Agent) -> Result<Arc<RemoteFid>> {
        let s = a.session.upgrade().ok_or_else(gone)?;
        let c = s.link.conn(LINK_WAIT).await.map_err(err)?;
        c.agent_root(a, &self.shared.config()).await.map_err(err)
    }

    async fn remote_rdwr(&self, a: &Agent, path: &[&str], data: Option<&str>) -> Result<String> {
        let root = self.tools_fid(a).await?;
        let mut f = root.walk(path).await.map_err(|e| err(e.to_string()))?;
        let mode = if data.is_some() { om::ORDWR } else { om::OREAD };
        f.open(mode).await.map_err(|e| err(e.to_string()))?;
        if let Some(d) = data {
            f.write(0, Bytes::from(d.to_owned()))
                .await
                .map_err(|e| err(e.to_string()))?;
        }
        let b = f.read_to_end().await.map_err(|e| err(e.to_string()))?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    async fn remote_write(&self, a: &Agent, path: &[&str], data: &str) -> Result<()> {
        let root = self.tools_fid(a).await?;
        let mut f = root.walk(path).await.map_err(|e| err(e.to_string()))?;
        f.open(om::OWRITE).await.map_err(|e| err(e.to_string()))?;
        f.write(0, Bytes::from(data.to_owned()))
            .await
            .map_err(|e| err(e.to_string()))?;
        Ok(())
    }

    async fn proc_top(&self, a: &Agent) -> Result<String> {
        let list = self.remote_rdwr(a, &["proc", "list"], None).await?;
        let mut out = format!("{:<6} {:<8} {:<14} {}\n", "PID", "STATE", "TOOL", "CMD");
        for line in list.lines() {
            let mut it = line.split('\t');
            let (Some(pid), Some(state), Some(tool)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let stat = self
                .remote_rdwr(a, &["proc", pid, "stat"], None)
                .await
                .unwrap_or_default();
            let cmd = stat
                .lines()
                .find_map(|l| l.strip_prefix("cmd="))
                .unwrap_or("");
            out.push_str(&format!("{pid:<6} {state:<8} {tool:<14} {cmd}\n"));
        }
        Ok(out)
    }

    async fn agent_ctl(&self, a: &Arc<Agent>, cmd: &str) -> Result<String> {
        let line = single_command(cmd)?;
        let (verb, rest) = match line.split_once(char::is_whitespace) {
            Some((v, r)) => (v, r.trim()),
            None => (line, ""),
        };
        let reg = self.reg();
        let config = self.shared.config();
        let no_args = |v: &str| -> Result<()> {
            if rest.is_empty() {
                Ok(())
            } else {
                Err(err(format!("{v}: takes no arguments (invalid argument)")))
            }
        };
        match verb {
            "help" => {
                no_args(verb)?;
                Ok(AGENT_CTL
                    .iter()
                    .map(|(c, h)| format!("{c}\t{h}\n"))
                    .collect())
            }
            "stop" => {
                no_args(verb)?;
                Ok(if a.stop_turn() {
                    "stopping\n".into()
                } else {
                    "not running\n".into()
                })
            }
            "compact" => {
                no_args(verb)?;
                crate::turn::compact_now(self.reg(), a).await.map_err(err)
            }
            "clear" => {
                no_args(verb)?;
                a.say("info", "", "conversation history cleared")
                    .map_err(err)?;
                self.reg()
                    .store
                    .truncate_history(&a.session_id, &a.id)
                    .map_err(|e| err(crate::error_chain(&e)))?;
                Ok("cleared\n".into())
            }
            "kill" => {
                no_args(verb)?;
                reg.kill_agent(a).map_err(err)?;
                Ok("killed\n".into())
            }
            "inject" | "i" => {
                if rest.is_empty() {
                    return Err(Error::invalid("inject: give the text to add"));
                }
                a.say("user", "injected", rest).map_err(err)?;
                self.reg()
                    .store
                    .append_history(
                        &a.session_id,
                        &a.id,
                        &serde_json::json!({"role": "user", "content": rest, "injected": true}),
                        crate::store::Sync::Now,
                    )
                    .map_err(|e| err(crate::error_chain(&e)))?;
                Ok("injected\n".into())
            }
            "agent" => {
                if rest.is_empty() {
                    return Ok(format!(
                        "{}\n",
                        a.settings().profile.unwrap_or_else(|| "default".into())
                    ));
                }
                let mut s = a.settings();
                crate::model::apply_setting(&mut s, "profile", rest, &config).map_err(err)?;
                a.update_settings(|x| x.profile = s.profile.clone())
                    .map_err(err)?;
                if let Some(sess) = a.session.upgrade()
                    && let LinkState::Up(c) = sess.link.state()
                {
                    crate::link::configure_agent(&c, a, &config)
                        .await
                        .map_err(err)?;
                }
                Ok(format!("profile {rest}\n"))
            }
            "model" => {
                if rest.is_empty() {
                    let s = a.settings();
                    return Ok(format!("{}\n", s.model.unwrap_or_default()));
                }
                let mut s = a.settings();
                crate::model::apply_setting(&mut s, "model", rest, &config).map_err(err)?;
                a.update_settings(|x| x.model = s.model.clone())
                    .map_err(err)?;
                Ok(format!("model {rest}\n"))
            }
            "models" => {
                no_args(verb)?;
                let (name, cfg) =
                    crate::backend::select::resolve(crate::turn::backend_name(a, &config), &config)
                        .await
                        .map_err(err)?;
                let b = crate::backend::select::make(&name, &cfg).map_err(err)?;
                let models = tokio::time::timeout(MODELS_TIMEOUT, b.list_models())
                    .await
                    .map_err(|_| {
                        err(format!(
                            "{name}: no answer within {} s",
                            MODELS_TIMEOUT.as_secs()
                        ))
                    })?
                    .map_err(|e| err(e.to_string()))?;
                Ok(models.iter().map(|m| format!("{m}\n")).collect())
            }
            "backend" => {
                no_args(verb)?;
                let (name, cfg) =
                    crate::backend::select::resolve(crate::turn::backend_name(a, &config), &config)
                        .await
                        .map_err(err)?;
                Ok(format!("{name}\t{}\n", cfg.kind.name()))
            }
            "name" => {
                if rest.is_empty() {
                    return Ok(format!("{}\n", a.name()));
                }
                reg.rename_agent(a, rest).map_err(err)?;
                Ok(format!("name {rest}\n"))
            }
            "cwd" => {
                if rest.is_empty() {
                    return Ok(format!("{}\n", a.settings().cwd.display()));
                }
                let d = crate::model::existing_dir(rest).map_err(err)?;
                a.update_settings(|x| x.cwd = d.clone()).map_err(err)?;
                Ok(format!("cwd {}\n", d.display()))
            }
            "tools" => {
                no_args(verb)?;
                self.remote_rdwr(a, &["tools"], Some(&a.id)).await
            }
            "tool_load" | "tool_unload" => {
                let names = ollie_link::tools::names();
                if !names.contains(&rest) {
                    return Err(err(format!(
                        "{verb}: unknown tool {:?} (tools: {})",
                        clip(rest),
                        names.join(", ")
                    )));
                }
                let load = verb == "tool_load";
                let current = {
                    let s = a.settings();
                    s.tools.clone().unwrap_or_else(|| {
                        let p = s.profile.as_deref().unwrap_or("default");
                        config
                            .profiles
                            .get(p)
                            .map(|p| p.tools.clone())
                            .unwrap_or_default()
                    })
                };
                let mut next: Vec<String> = current.into_iter().filter(|t| t != rest).collect();
                if load {
                    next.push(rest.to_owned());
                }
                let verbword = if load { "load" } else { "unload" };
                let sess = a.session.upgrade().ok_or_else(gone)?;
                let c = sess.link.conn(LINK_WAIT).await.map_err(err)?;
                c.ctl(&format!("{verbword} {} {rest}", a.id))
                    .await
                    .map_err(err)?;
                a.update_settings(|x| x.tools = Some(next)).map_err(err)?;
                Ok(format!("{verbword}ed {rest}\n"))
            }
            "proc" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                match words.as_slice() {
                    [] => self.remote_rdwr(a, &["proc", "list"], None).await,
                    ["top"] => self.proc_top(a).await,
                    [op @ ("term" | "kill"), pid] => {
                        self.remote_write(a, &["proc", pid, "ctl"], op).await?;
                        Ok(format!("{op} {pid}\n"))
                    }
                    ["dismiss", pid] => {
                        self.remote_write(a, &["proc", pid, "ctl"], "dismiss")
                            .await?;
                        Ok(format!("dismissed {pid}\n"))
                    }
                    ["out", pid] => self.remote_rdwr(a, &["proc", pid, "out"], None).await,
                    _ => Err(Error::invalid(
                        "proc: proc, proc top, proc term|kill|out|dismiss PID",
                    )),
                }
            }
            "systemprompt" => {
                no_args(verb)?;
                Ok(format!("{}\n", crate::turn::system_prompt(a, &config)))
            }
            other => Err(err(format!(
                "unknown command {:?} (write help for the list)",
                clip(other)
            ))),
        }
    }

    // --- the proxy ---

    async fn proxy_root(
        &self,
        s: &Arc<Session>,
        agent: Option<&Arc<Agent>>,
    ) -> Result<Arc<RemoteFid>> {
        let c = s.link.conn(LINK_WAIT).await.map_err(err)?;
        match agent {
            Some(a) => c.agent_root(a, &self.shared.config()).await.map_err(err),
            None => {
                let f = c
                    .operator
                    .clone_fid()
                    .await
                    .map_err(|e| err(e.to_string()))?;
                Ok(Arc::new(f))
            }
        }
    }

    fn proxy_qid(s: &Session, agent: bool, q: Qid) -> Qid {
        Qid {
            ty: q.ty,
            version: q.version,
            path: (0xF << 60)
                | (u64::from(agent) << 59)
                | ((u64::from(s.handle) & 0x7_FFFF) << 40)
                | (q.path & ((1 << 40) - 1)),
        }
    }

    /// The mode a proxied file shows: read-only, except `bypass/` (owner only) in the
    /// session view and `ctl` of a process in an agent's view.
    fn proxy_mode(p: &Proxy, remote_mode: u32) -> u32 {
        let dir = remote_mode & dm::DIR;
        let bits = if dir != 0 {
            if p.agent.is_none() { 0o500 } else { 0o555 }
        } else {
            match (p.agent.is_some(), p.path.as_slice()) {
                (false, [b, f]) if b == "bypass" && f == "resolve" => 0o200,
                (false, [b, f]) if b == "bypass" && f == "pending" => 0o400,
                (false, [b, f]) if b == "bypass" && f == "full" => 0o600,
                (false, _) => 0o400,
                (true, [_, _, f]) if f == "ctl" => 0o222,
                (true, _) => 0o444,
            }
        };
        dir | bits
    }

    fn may_write_proxy(p: &Proxy) -> bool {
        match (p.agent.is_some(), p.path.as_slice()) {
            (false, [b, f]) => b == "bypass" && (f == "resolve" || f == "full"),
            (true, [_, _, f]) => f == "ctl",
            _ => false,
        }
    }

    /// Walks a proxy: `names` from `p` (which may be the view's root, path empty).
    async fn proxy_walk(&self, p: &Proxy, names: &[String]) -> Result<Walked<OllieFid>> {
        let mut qids = Vec::new();
        let mut path = p.path.clone();
        for (i, n) in names.iter().enumerate() {
            if n == ".." {
                // Leaving the view is handled by the caller; inside it, go up.
                if path.pop().is_none() {
                    return if i == 0 {
                        Err(Error::not_found())
                    } else {
                        Ok(Walked { qids, fid: None })
                    };
                }
                qids.push(p.qid);
                continue;
            }
            // An agent's view shows process directories only.
            if p.agent.is_some() && path.is_empty() && n.parse::<u32>().is_err() {
                return if i == 0 {
                    Err(Error::not_found())
                } else {
                    Ok(Walked { qids, fid: None })
                };
            }
            path.push(n.clone());
            qids.push(p.qid);
        }
        let root = self.proxy_root(&p.session, p.agent.as_ref()).await?;
        let mut remote_path: Vec<String> = Vec::new();
        if p.agent.is_some() {
            remote_path.push("proc".into());
        }
        remote_path.extend(path.iter().cloned());
        let rf = root
            .walk(&remote_path)
            .await
            .map_err(|e| err(e.to_string()))?;
        let q = Self::proxy_qid(&p.session, p.agent.is_some(), rf.qid());
        let n = qids.len();
        if n > 0 {
            qids[n - 1] = q;
        }
        let mut fid = OllieFid::new(
            match &p.agent {
                Some(a) => Node::A(Arc::clone(a), AFile::ProcDir),
                None => Node::S(Arc::clone(&p.session), SFile::Toolsrv),
            },
            Class::Owner,
        );
        fid.proxy = Some(Proxy {
            session: Arc::clone(&p.session),
            agent: p.agent.clone(),
            path,
            remote: Some(rf),
            qid: q,
        });
        Ok(Walked {
            qids,
            fid: Some(fid),
        })
    }
}

impl OllieFs {
    /// A walk through the tree's own nodes, entering a proxied view where one starts.
    async fn walk_plain(
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
}

impl OllieFs {
    /// A walk from `fid` (the new fid's user is set by the caller).
    async fn walk_from(&self, fid: &OllieFid, names: &[String]) -> Result<Walked<OllieFid>> {
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
            Node::R(RootFile::Eventwait) => fid.cursor = self.shared.events.cursor(),
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
            Node::A(a, AFile::Log) => fid.content = Some(a.chat.tail(64 * 1024)),
            Node::A(a, AFile::Cfg) => fid.content = Some(Bytes::from(a.cfg_text())),
            Node::A(a, AFile::Stats) => {
                fid.content = Some(Bytes::from(crate::model::lock(&a.stats).text()))
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
        if let Some(p) = &mut fid.proxy {
            let r = p.remote.as_ref().ok_or_else(Error::not_found)?;
            if r.qid().is_dir() {
                if offset == 0 || fid.dir.is_none() {
                    let mut rc = r.clone_fid().await.map_err(|e| err(e.to_string()))?;
                    rc.open(om::OREAD).await.map_err(|e| err(e.to_string()))?;
                    let mut entries = rc.read_dir().await.map_err(|e| err(e.to_string()))?;
                    let (session, agent) = (Arc::clone(&p.session), p.agent.is_some());
                    for e in &mut entries {
                        let mut child = Proxy {
                            session: Arc::clone(&session),
                            agent: p.agent.clone(),
                            path: p.path.clone(),
                            remote: None,
                            qid: e.qid,
                        };
                        child.path.push(e.name.clone());
                        e.mode = Self::proxy_mode(&child, e.mode);
                        e.qid = Self::proxy_qid(&session, agent, e.qid);
                        e.uid = self.shared.owner.clone();
                        e.gid = GROUP.to_owned();
                        e.muid = self.shared.owner.clone();
                    }
                    fid.dir = Some(DirSnapshot::new(&entries));
                }
                return fid
                    .dir
                    .as_ref()
                    .map_or(Ok(Bytes::new()), |d| d.read(offset, count));
            }
            return r.read(offset, count).await.map_err(|e| err(e.to_string()));
        }
        let node = fid.node.clone();
        let frozen = |fid: &OllieFid| {
            Ok(fid
                .content
                .as_ref()
                .map_or(Bytes::new(), |c| read_at(c, offset, count)))
        };
        match &node {
            Node::K(k) => match &fid.ufile {
                Some(f) => crate::ns::read_file_at(f, offset, count)
                    .map(Bytes::from)
                    .map_err(err),
                None => {
                    if offset == 0 || fid.dir.is_none() {
                        let entries = k
                            .list(&self.shared.config(), &self.shared.owner)
                            .map_err(err)?;
                        fid.dir = Some(DirSnapshot::new(&entries));
                    }
                    fid.dir
                        .as_ref()
                        .map_or(Ok(Bytes::new()), |d| d.read(offset, count))
                }
            },
            Node::U(u) => match &fid.ufile {
                Some(f) => crate::ns::read_file_at(f, offset, count)
                    .map(Bytes::from)
                    .map_err(err),
                None => {
                    if offset == 0 || fid.dir.is_none() {
                        let entries = u.list(&self.shared.owner).map_err(err)?;
                        fid.dir = Some(DirSnapshot::new(&entries));
                    }
                    fid.dir
                        .as_ref()
                        .map_or(Ok(Bytes::new()), |d| d.read(offset, count))
                }
            },
            Node::Root
            | Node::R(RootFile::SessionDir | RootFile::BypassDir | RootFile::SkillsDir)
            | Node::S(_, SFile::Dir | SFile::AgentDir | SFile::Ns)
            | Node::A(_, AFile::Dir | AFile::ProcDir | AFile::Ns) => {
                if offset == 0 || fid.dir.is_none() {
                    let mut entries = self.entries(&node);
                    if let Node::A(a, AFile::ProcDir) = &node
                        && let Ok(list) = self.remote_rdwr(a, &["proc", "list"], None).await
                        && let Some(s) = a.session.upgrade()
                    {
                        for line in list.lines() {
                            let Some(pid) = line.split('\t').next() else {
                                continue;
                            };
                            let Ok(n) = pid.parse::<u64>() else {
                                continue;
                            };
                            entries.push(Stat {
                                ty: 0,
                                dev: 0,
                                qid: Self::proxy_qid(
                                    &s,
                                    true,
                                    Qid {
                                        ty: qt::DIR,
                                        version: 0,
                                        path: (n << 4) & ((1 << 40) - 1),
                                    },
                                ),
                                mode: dm::DIR | 0o555,
                                atime: self.shared.started,
                                mtime: self.shared.started,
                                length: 0,
                                name: pid.to_owned(),
                                uid: self.shared.owner.clone(),
                                gid: GROUP.to_owned(),
                                muid: self.shared.owner.clone(),
                            });
                        }
                    }
                    fid.dir = Some(DirSnapshot::new(&entries));
                }
                fid.dir
                    .as_ref()
                    .map_or(Ok(Bytes::new()), |d| d.read(offset, count))
            }
            Node::R(
                RootFile::Ctl | RootFile::Generate | RootFile::SessionNew | RootFile::BypassFull,
            )
            | Node::S(_, SFile::Ctl | SFile::NsCtl)
            | Node::A(_, AFile::Ctl | AFile::NsCtl) => Ok(fid
                .reply
                .as_ref()
                .map_or(Bytes::new(), |r| read_at(r, offset, count))),
            Node::S(_, SFile::AgentNew) => {
                if fid.reply.is_none()
                    && let Some((a, after)) = fid.waiting.clone()
                {
                    let end = a.next_turn_end(after).await.ok_or_else(gone)?;
                    match end.result {
                        Ok(t) => fid.reply = Some(Bytes::from(t)),
                        Err(e) => return Err(err(e)),
                    }
                }
                Ok(fid
                    .reply
                    .as_ref()
                    .map_or(Bytes::new(), |r| read_at(r, offset, count)))
            }
            Node::R(RootFile::BypassPending) => {
                if fid.pending.is_empty() {
                    let shown = self.reg().bypass.next(&mut fid.seen).await;
                    fid.pending = Bytes::from(shown.as_bytes().to_vec());
                }
                let n = fid.pending.len().min(count as usize);
                Ok(fid.pending.split_to(n))
            }
            Node::R(RootFile::Eventwait) => {
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
            Node::A(a, AFile::Chat) => Ok(a.chat.read(ChatKind::Text, offset, count).await),
            Node::A(a, AFile::ChatRaw) => Ok(a.chat.read(ChatKind::Raw, offset, count).await),
            // One value per open-and-read: a read at offset 0 waits for the next change; the
            // rest of that value follows at later offsets, then end of file (so `cat
            // statewait` returns after one change, and repeated reads at 0 stream them).
            Node::A(_, AFile::Statewait | AFile::Feed) if offset > 0 && fid.pending.is_empty() => {
                Ok(Bytes::new())
            }
            Node::A(a, AFile::Statewait) => {
                if fid.pending.is_empty() {
                    if a.is_killed() && fid.cursor >= a.state().0 {
                        return Ok(Bytes::new());
                    }
                    let (seq, _) = a.next_state(fid.cursor).await;
                    fid.cursor = seq;
                    fid.pending = Bytes::from(format!("{}\n", a.state_text()));
                }
                let n = fid.pending.len().min(count as usize);
                Ok(fid.pending.split_to(n))
            }
            Node::A(a, AFile::Feed) => {
                if fid.pending.is_empty() {
                    match a.next_feed(fid.last_feed.as_ref()).await {
                        Some(v) => {
                            fid.last_feed = Some(v.clone());
                            fid.pending = v;
                        }
                        None => return Ok(Bytes::new()),
                    }
                }
                let n = fid.pending.len().min(count as usize);
                Ok(fid.pending.split_to(n))
            }
            Node::A(a, AFile::Fifo) => {
                if offset == 0 || fid.content.is_none() {
                    let p = a.dequeue().map_err(err)?;
                    fid.content = Some(Bytes::from(p.unwrap_or_default()));
                }
                frozen(fid)
            }
            Node::A(a, AFile::Plan) => Ok(read_at(&a.plan(), offset, count)),
            Node::R(RootFile::Help)
            | Node::R(RootFile::Backends)
            | Node::R(RootFile::Models)
            | Node::R(RootFile::Agents)
            | Node::R(RootFile::Tools)
            | Node::R(RootFile::Aliases)
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
            ) => frozen(fid),
            _ => Err(Error::permission_denied()),
        }
    }

    async fn write(&self, fid: &mut OllieFid, offset: u64, data: Bytes) -> Result<u32> {
        let n = data.len() as u32;
        if let Some(a) = fid.auth {
            if a != TcpAuth::Fresh {
                return Err(Error::new(
                    "permission denied: this afid is spent; start a new Tauth",
                ));
            }
            let given = data.strip_suffix(b"\n").unwrap_or(&data);
            let ok = self
                .shared
                .tcp_key
                .as_deref()
                .is_some_and(|k| constant_time_eq(k, given));
            if !ok {
                fid.auth = Some(TcpAuth::Failed);
                return Err(Error::new("permission denied: wrong key"));
            }
            fid.auth = Some(TcpAuth::Verified);
            return Ok(n);
        }
        if let Some(p) = &fid.proxy {
            let r = p.remote.as_ref().ok_or_else(Error::not_found)?;
            let result = r
                .write(offset, data.clone())
                .await
                .map_err(|e| err(e.to_string()));
            // A verdict written to the session's own bypass/resolve is audited too.
            if p.agent.is_none() && p.path == ["bypass", "resolve"] {
                let outcome = result.as_ref().map(|_| ()).map_err(|e| e.to_string());
                self.reg()
                    .bypass
                    .decided(&p.session.id, &data, &fid.user, &outcome);
            }
            return result;
        }
        Self::alive(&fid.node)?;
        let reg = Arc::clone(self.reg());
        let node = fid.node.clone();
        match &node {
            Node::R(RootFile::Ctl) => {
                fid.reply = None;
                let reply = self.root_ctl(text(&data)?)?;
                fid.reply = Some(Bytes::from(reply));
                Ok(n)
            }
            Node::R(RootFile::BypassFull) => {
                fid.reply = None;
                let full = self
                    .reg()
                    .bypass
                    .full(self.reg(), &data)
                    .await
                    .map_err(err)?;
                fid.reply = Some(full);
                Ok(n)
            }
            Node::R(RootFile::BypassResolve) => {
                let by = Arc::clone(&fid.user);
                self.reg()
                    .bypass
                    .resolve(self.reg(), offset, &data, &by)
                    .await
                    .map_err(err)?;
                Ok(n)
            }
            Node::R(RootFile::Generate) => {
                fid.reply = None;
                let t = text(&data)?;
                if t.trim().is_empty() {
                    return Err(Error::invalid("empty prompt"));
                }
                let (prompt, backend) = if t.trim_start().starts_with('{') {
                    #[derive(serde::Deserialize)]
                    #[serde(deny_unknown_fields)]
                    struct Gen {
                        prompt: String,
                        #[serde(default)]
                        backend: Option<String>,
                    }
                    let g: Gen = serde_json::from_str(t)
                        .map_err(|e| Error::invalid(format!("generate: {e}")))?;
                    (g.prompt, g.backend)
                } else {
                    (t.to_owned(), None)
                };
                let config = self.shared.config();
                let reply = crate::turn::generate(&config, &prompt, backend.as_deref())
                    .await
                    .map_err(err)?;
                let mut r = reply;
                if !r.ends_with('\n') {
                    r.push('\n');
                }
                fid.reply = Some(Bytes::from(r));
                Ok(n)
            }
            Node::R(RootFile::SessionNew) => {
                fid.reply = None;
                let spec = parse_spec(
                    text(&data)?,
                    &["name", "cwd", "backend", "model", "profile", "remote"],
                )
                .map_err(err)?;
                let s = reg.create_session(spec).map_err(err)?;
                fid.reply = Some(Bytes::from(format!("{}\n", s.name())));
                Ok(n)
            }
            Node::S(s, SFile::Ctl) => {
                fid.reply = None;
                let reply = self.session_ctl(s, text(&data)?).await?;
                fid.reply = Some(Bytes::from(reply));
                Ok(n)
            }
            Node::S(s, SFile::Name) => {
                let t = text(&data)?.trim();
                reg.rename_session(s, t).map_err(err)?;
                fid.content = Some(Bytes::from(format!("{t}\n")));
                Ok(n)
            }
            Node::S(s, SFile::AgentNew) => {
                fid.reply = None;
                fid.waiting = None;
                let spec = parse_spec(
                    text(&data)?,
                    &["name", "cwd", "backend", "model", "profile", "prompt"],
                )
                .map_err(err)?;
                let a = reg.create_agent(s, &spec).map_err(err)?;
                match spec.prompt {
                    Some(p) => {
                        let after = a.turn_seq();
                        a.enqueue(p).map_err(err)?;
                        fid.waiting = Some((a, after));
                    }
                    None => fid.reply = Some(Bytes::from(format!("{}\n", a.id))),
                }
                Ok(n)
            }
            Node::A(a, AFile::Prompt) | Node::A(a, AFile::Fifo) => {
                a.enqueue(text(&data)?.to_owned()).map_err(err)?;
                Ok(n)
            }
            Node::A(a, AFile::Feed) => {
                // A value written in pieces (a pipe through a FUSE mount, a client's 8 KiB
                // Twrites) arrives whole: a write at the end of this fid's last value extends
                // it; any other write replaces the value.
                let value = match fid.wrote_feed.take() {
                    Some(prev) if offset > 0 && offset == prev.len() as u64 => {
                        let mut v = bytes::BytesMut::with_capacity(prev.len() + data.len());
                        v.extend_from_slice(&prev);
                        v.extend_from_slice(&data);
                        v.freeze()
                    }
                    _ => data,
                };
                a.set_feed(value.clone()).map_err(err)?;
                fid.wrote_feed = Some(value);
                Ok(n)
            }
            Node::A(a, AFile::Plan) => {
                a.write_plan(offset, &data, false).map_err(err)?;
                Ok(n)
            }
            Node::A(a, AFile::Cfg) => {
                let config = self.shared.config();
                // `name=` and `id=` are shown too, so `cat cfg > f; cat f > cfg` works: the id
                // must be the agent's own, the name renames.
                let mut rest = String::new();
                let mut rename = None;
                let mut named = false;
                for line in text(&data)?.lines() {
                    match line.trim().split_once('=') {
                        Some(("id", v)) if v.trim() != a.id => {
                            return Err(err(format!(
                                "id is immutable ({} is not {})",
                                clip(v.trim()),
                                a.id
                            )));
                        }
                        Some(("id", _)) => named = true,
                        Some(("name", v)) if v.trim() != a.name() => {
                            crate::model::validate_name(v.trim()).map_err(err)?;
                            rename = Some(v.trim().to_owned());
                            named = true;
                        }
                        Some(("name", _)) => named = true,
                        _ => {
                            rest.push_str(line);
                            rest.push('\n');
                        }
                    }
                }
                let changed = if rest.trim().is_empty() && named {
                    Vec::new()
                } else {
                    a.set_cfg(&rest, &config).map_err(err)?
                };
                if let Some(to) = rename {
                    reg.rename_agent(a, &to).map_err(err)?;
                }
                if changed.iter().any(|(k, _)| k == "profile")
                    && let Some(s) = a.session.upgrade()
                    && let LinkState::Up(c) = s.link.state()
                {
                    crate::link::configure_agent(&c, a, &config)
                        .await
                        .map_err(err)?;
                }
                fid.content = Some(Bytes::from(a.cfg_text()));
                Ok(n)
            }
            Node::A(a, AFile::Ctl) => {
                fid.reply = None;
                let reply = self.agent_ctl(a, text(&data)?).await?;
                fid.reply = Some(Bytes::from(reply));
                Ok(n)
            }
            Node::A(a, AFile::Name) => {
                let t = text(&data)?.trim();
                reg.rename_agent(a, t).map_err(err)?;
                fid.content = Some(Bytes::from(format!("{t}\n")));
                Ok(n)
            }
            Node::S(s, SFile::NsCtl) => {
                fid.reply = None;
                let owner = NsOwner::Session(Arc::clone(s));
                let reply =
                    crate::ns::ctl(&owner, text(&data)?, &self.shared.events).map_err(err)?;
                fid.reply = Some(Bytes::from(reply));
                Ok(n)
            }
            Node::A(a, AFile::NsCtl) => {
                fid.reply = None;
                let owner = NsOwner::Agent(Arc::clone(a));
                let reply =
                    crate::ns::ctl(&owner, text(&data)?, &self.shared.events).map_err(err)?;
                fid.reply = Some(Bytes::from(reply));
                Ok(n)
            }
            Node::U(_) | Node::K(_) => {
                let f = fid
                    .ufile
                    .as_ref()
                    .ok_or_else(|| err("permission denied: not open for writing"))?;
                crate::ns::write_file_at(f, offset, &data).map_err(err)?;
                Ok(n)
            }
            _ => Err(Error::permission_denied()),
        }
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
                    crate::skills::create_skill(&config, name, is_dir).map_err(err)?,
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

    async fn remove(&self, fid: OllieFid) -> Result<()> {
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
        let mut trunc = Stat::dont_touch();
        trunc.length = 0;
        let mode = match &fid.proxy {
            Some(p) => Self::proxy_mode(p, 0),
            None => Self::mode(&fid.node),
        };
        let managed =
            fid.class == Class::Agent && (fid.proxy.is_some() || manages(&fid.node).is_some());
        if *st == trunc && may_open(mode, fid.class, om::OWRITE) && !managed {
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

/// Compares without an early exit on the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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

    #[test]
    fn help_lists_every_file() {
        let h = help_text();
        for d in ROOT_FILES {
            assert!(h.contains(&format!("  {:<38}", d.name)), "{}", d.name);
        }
        for d in SESSIONS_FILES {
            assert!(h.contains(&format!("session/{}", d.name)), "{}", d.name);
        }
        for d in BYPASS_FILES {
            assert!(h.contains(&format!("bypass/{}", d.name)), "{}", d.name);
        }
        for d in SESSION_FILES.iter() {
            assert!(
                h.contains(&format!("session/NAME/{}", d.name)),
                "{}",
                d.name
            );
        }
        for d in AGENT_FILES {
            assert!(
                h.contains(&format!("session/NAME/agent/NAME/{}", d.name)),
                "{}",
                d.name
            );
        }
        for (n, m, _) in PID_FILES {
            assert!(
                h.contains(&format!(
                    "  {:<38} {m:04o}  ",
                    format!("session/NAME/agent/NAME/proc/N/{n}")
                )),
                "{n}"
            );
        }
        assert!(PID_FILES.iter().any(|(n, _, _)| *n == "record"));
        for d in SESSION_NS_FILES {
            assert!(
                h.contains(&format!(
                    "  {:<38} {:04o}  ",
                    format!("session/NAME/ns/{}", d.name),
                    d.mode
                )),
                "{}",
                d.name
            );
        }
        for d in AGENT_NS_FILES {
            assert!(
                h.contains(&format!(
                    "  {:<38} {:04o}  ",
                    format!("session/NAME/agent/NAME/ns/{}", d.name),
                    d.mode
                )),
                "{}",
                d.name
            );
        }
        assert!(h.contains("  session/NAME/ns/POINT/ "), "{h}");
        assert!(h.contains("  session/NAME/agent/NAME/ns/POINT/ "), "{h}");
        for (c, _) in CTL_COMMANDS
            .iter()
            .chain(SESSION_CTL)
            .chain(AGENT_CTL)
            .chain(NS_CTL)
        {
            assert!(h.contains(c), "{c}");
        }
        // The union directories are a pattern, not a path with a mode (so a walk of the
        // served tree never expects one).
        for l in h.lines().filter(|l| l.contains("/ns/POINT/")) {
            let second = l.split_whitespace().nth(1).unwrap_or("");
            assert!(!second.starts_with('d') || second.len() != 4, "{l}");
            assert!(second.parse::<u32>().is_err(), "{l}");
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
        assert!(may_open(0o222, Class::Group, om::OWRITE));
    }
}
