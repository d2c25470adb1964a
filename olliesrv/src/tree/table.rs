//! The file tables of the tree: every file's name, kind, mode and `help` text, and the ctl
//! verbs of each ctl file, from which listings, permissions and the `help` reference are all
//! made (so they can never disagree).

use ollie_p9::wire::dm;

/// Root files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootFile {
    Backends,
    Models,
    Agents,
    Tools,
    Help,
    Aliases,
    LastError,
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
    Net,
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
        "lasterror",
        RootFile::LastError,
        0o444,
        "the last error one of your writes got (any file, any connection of your user; not kept for agents): TIME PATH: MESSAGE, or nothing; what a shell redirect through o mount cannot show",
    ),
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
        "create a session: write name= [cwd=] backend= model= profile= remote= [force=yes], read its name; without cwd= the session has no working directory until its first agent names one (agent/new cwd=); remote=NAME (a [remotes.NAME] of config.toml) runs its tools on that host over ssh, and cwd= is then a directory there; a cwd of /, your home directory or a system tree (/etc, /usr, /var, …) is refused without force=yes",
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
        "key=value: name, id, cwd, backend, model, profile, remote (where tools run: empty for this host), toolsrv (up, starting, restarting, failed, unresponsive: up but not answering) and toolsrv_reason while not up",
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
        "net",
        SFile::Net,
        0o400,
        "the egress proxy's decisions for this session's runs (owner only), one JSON object per line: time, agent, call, command, method, domain, port, address, verdict, reason, bytes_up, bytes_down, duration_ms; the last 1024, then each as it happens (a read blocks until the next)",
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
        "create an agent: write name= cwd= backend= model= profile= [force=yes] [prompt=], read its id (with prompt=, the reply); cwd= as for session/new (required when the session has none); prompt= comes last and its value is the rest of what the open writes (see prompts below; \\n is a newline)",
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
        "write a prompt: what one open writes is one prompt, queued when the fid is clunked (see prompts below); it runs as a turn",
    ),
    f(
        "fifo",
        AFile::Fifo,
        0o666,
        "the prompt queue: write enqueues (one open's writes are one prompt, as for prompt), read dequeues the next prompt (empty when none)",
    ),
    f(
        "feed",
        AFile::Feed,
        0o666,
        "the agent's input: write a value (see feed values below), and each new one becomes a turn (cfg feed=turn; feed=off: not); a read blocks until the value differs from the one current at the open (then from what that fid read last) and returns all of it",
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
        "the conversation with [[[kind … ]]] block markers (user, assistant, reasoning, tool_call, tool_result, error, info); a body line that begins like a marker is indented by one space; a streamed reply shows each piece as it comes",
    ),
    f(
        "statewait",
        AFile::Statewait,
        0o444,
        "blocks until the agent's state changes after the fid was opened (or last read); returns the state then. So `cat statewait` of an agent that is already idle waits for its next turn to start (forever if none comes), and of a busy one returns at its next step (calling: TOOL), not only at idle: to wait until a turn is over, read the state in agent/idx and block in statewait only while it is not idle",
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
        "key=value settings; write key=value lines to change them (unknown keys and bad values are errors); feed=turn|off, feed_prompt=TEMPLATE ({feed} is the value, \\n a newline)",
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
        "birth a bead in the registry and open it; one already open: replies its uri, and names it SLUG only if it has no name yet (another name is refused); replies its file:// uri",
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
        "list",
        "the registry's beads, one per line: SLUG<TAB>UUID<TAB>CREATED<TAB>URI (- when unnamed), oldest first",
    ),
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
        "add TEXT (the rest of the write, any number of lines) to the context without starting a turn (alias: i)",
    ),
    ("agent [PROFILE]", "show or switch the agent profile"),
    (
        "model [NAME]",
        "show the agent's own model (an empty line: its profile's, session's or backend's applies) or switch it",
    ),
    ("models", "list available models"),
    (
        "backend",
        "show the current backend: NAME<TAB>KIND (read-only: switch with backend=NAME in cfg)",
    ),
    ("name [NAME]", "show or set the name"),
    (
        "cwd [PATH [force]]",
        "show or change the working directory (as for session/new: force accepts /, home or a system tree)",
    ),
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
         session or agent goes away.\n",
    );
    s.push_str(&prompts());
    s.push_str(&feed_values());
    s.push_str(
        "  bead namespaces (ns/): reads search the members in order, first hit wins, and the\n  \
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

/// The `help` paragraph on how writes become prompts (the rule is in `tree/prompt.rs`).
fn prompts() -> String {
    format!(
        "  prompts (prompt, fifo, agent/new's prompt=): a prompt is what one fid writes from offset\n  \
         0 on, in any number of writes (a pipe's chunks, msize-sized pieces, a FUSE mount's\n  \
         writes); it is queued when the fid is clunked, or when the fid writes at offset 0 again\n  \
         (that write starts the next one); agent/new queues it when the fid is read or clunked.\n  \
         A prompt over {} bytes is refused whole: the write that crosses the limit fails with\n  \
         the size, and nothing of it is queued; a blank one is not queued (the clunk says so).\n",
        crate::state::session::MAX_PROMPT
    )
}

/// The `help` paragraph on how `feed` writes become values (the rule is in `tree/feed.rs`).
fn feed_values() -> String {
    let q = super::feed::FEED_QUIET.as_secs();
    format!(
        "  feed values: the writes one fid makes, each at the offset where the last ended and less\n  \
         than {q}s after it, are one value (so a value may come in any number of writes: a pipe's\n  \
         chunks, msize-sized pieces); a write at offset 0, on a fresh open, at another offset or\n  \
         after a pause of {q}s starts the next. A value is published when it is complete: {q}s\n  \
         after its last write, when the next one starts, or when the fid is clunked; readers\n  \
         never see part of one. A block of whole lines written more than once in one value is\n  \
         that block, and a value equal to the current one wakes nobody. So\n  \
         `while :; do git diff HEAD --; sleep 5; done | ollie-9p write …/feed` gives one value\n  \
         per iteration (iterations less than {q}s apart join into one). At most {} bytes.\n  \
         Each new value is the agent's next turn (after its queued prompts); while a turn runs\n  \
         only the newest value waits, so a fast producer never builds a queue. A reader's first\n  \
         read waits for a value newer than the one current at its open, so `while :; do cat\n  \
         feed; done` returns once per new value.\n",
        crate::state::session::MAX_FEED
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
