//! The session and agent commands of `o` (`ls`, `new`, `attach`, `prompt`, `ctl`, `kill`,
//! `logs`, and `approve`, which lives in the `approve` module): thin clients of olliesrv's files over 9P, as a person would use them with
//! `ollie-9p`, but resolving names, waiting for turns and rendering chat.
//!
//! Exit statuses: 0 ok, 1 the server refused or the turn failed (its message is printed as
//! `o: …`), 2 usage, 3 cannot connect, 130 interrupted (`attach`, second Ctrl-C).
//!
//! Everything printed that the server, a model, a tool or an agent chose (chat, replies,
//! names, states, error messages, `--json` output) goes through the escaping of the `render`
//! module first (its "Untrusted text on the terminal" section has the rule).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Subcommand;
use ollie_p9::client::Fid;
use ollie_p9::wire::om;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;

use crate::conn::{
    Conn, EXIT_QUEUED, EXIT_SERVER, Fail, is_gone, open, read_all, remote, stdout_write, walk,
    write_one,
};
use crate::progress::{self, Status};
use crate::render::{self, Renderer, Stats, Target};

const EXIT_INTERRUPTED: u8 = 130;
/// A second Ctrl-C within this long after the first ends `o attach`.
const DOUBLE_INTERRUPT: Duration = Duration::from_secs(1);

/// The session and agent commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List sessions and their agents.
    #[command(
        after_help = "One line per session (name, id, agent count, toolsrv state, paused), \
        and under it one indented line per agent (name, id, state, tokens in+out, cost, context \
        window use; \"-\" when the context limit is unknown).\n\n\
        EXAMPLES:\n  o ls\n  o ls --json | jq '.[].agents[].state'"
    )]
    Ls {
        /// Print one JSON array of sessions, each with its agents.
        #[arg(long)]
        json: bool,
    },
    /// Create a session (NAME), or an agent in a session (SESSION/AGENT).
    #[command(
        after_help = "Prints the new session's name, or the new agent's id; with --json, one \
        object: {\"session\": NAME} or {\"session\": NAME, \"agent\": AGENT, \"id\": ID}.\n\n\
        EXAMPLES:\n  o new proj --cwd ~/src/proj\n  o new proj/reviewer --profile readonly\n  \
        o new far --remote build --cwd /srv/x\n  \
        o new proj/fast --backend local --model small\n  o new proj/b --json | jq -r .id"
    )]
    New {
        /// NAME for a session, SESSION/AGENT for an agent.
        #[arg(add = clap_complete::engine::ArgValueCompleter::new(complete_target))]
        target: String,
        #[command(flatten)]
        spec: SpecArgs,
        /// Print one JSON object (session, and agent and id for an agent).
        #[arg(long)]
        json: bool,
    },
    /// Talk to an agent: stream its chat, send each input line as a prompt.
    #[command(
        after_help = "AGENT defaults to the session's first agent; a session without \
        agents gets one named \"main\". Output starts at the current end of the chat (use \
        --history for all of it); on a terminal, chat blocks are coloured and their markers \
        shown as [kind]. State changes go to standard error (· idle, · error); while a \
        turn runs and standard error is a terminal, one self-overwriting line there shows what \
        the agent does and for how long (⠋ thinking · 12s; --quiet or OLLIE_NO_PROGRESS=1 turn \
        it off; without it, each state is a line of its own).\n\
        Each line typed is a prompt; a multi-line paste on a terminal is one prompt, and from \
        a pipe each line is one.\n\
        Ctrl-C stops the running turn; a second Ctrl-C within a second quits. End of input \
        (Ctrl-D) quits once the agent is idle.\n\n\
        EXAMPLES:\n  o attach proj\n  o attach proj/reviewer --history\n  \
        echo 'run the tests' | o attach -q proj"
    )]
    Attach {
        /// SESSION or SESSION/AGENT.
        #[arg(add = clap_complete::engine::ArgValueCompleter::new(complete_target))]
        target: String,
        /// Show the whole conversation first, not only what comes next.
        #[arg(long)]
        history: bool,
        /// No progress line on standard error.
        #[arg(short = 'q', long)]
        quiet: bool,
    },
    /// Send one prompt, wait for the turn to end, print what it added to the chat.
    #[command(
        after_help = "AGENT defaults to the session's first agent (one named \"main\" \
        is created if there is none). The words of TEXT are joined by spaces. While the turn \
        runs and standard error is a terminal, one self-overwriting line there shows what the \
        agent does and for how long (⠋ thinking · 12s); --quiet or OLLIE_NO_PROGRESS=1 turn it \
        off. With --json, one object is printed when the turn has ended: session, agent, ok, \
        state (after the turn), reply (what the turn added to the chat besides the prompt and \
        its error), error (null, or the turn's error), tokens_in, tokens_out and cost_usd (the \
        agent's totals after the turn).\n\
        EXIT STATUS: 0 the turn ended normally, 1 it ended with an error (printed to standard \
        error, or as \"error\" with --json), or the server refused.\n\n\
        EXAMPLES:\n  o prompt proj 'summarise README.md'\n  o prompt proj/reviewer review the last commit\n  \
        o prompt --json proj 'list the TODOs' | jq -r .reply\n  \
        o prompt -q proj 'fix the build' > reply.txt"
    )]
    Prompt {
        /// SESSION or SESSION/AGENT.
        #[arg(add = clap_complete::engine::ArgValueCompleter::new(complete_target))]
        target: String,
        /// The prompt.
        #[arg(required = true, num_args = 1..)]
        text: Vec<String>,
        /// Print one JSON object with the reply, the outcome and the agent's stats.
        #[arg(long)]
        json: bool,
        /// No progress line on standard error.
        #[arg(short = 'q', long)]
        quiet: bool,
    },
    /// Write a command to a session's or agent's ctl and print the reply.
    #[command(after_help = "EXAMPLES:\n  o ctl proj help\n  o ctl proj pause\n  \
        o ctl proj/main help\n  o ctl proj/main model some-model\n  o ctl proj/main proc top")]
    Ctl {
        /// SESSION or SESSION/AGENT.
        #[arg(add = clap_complete::engine::ArgValueCompleter::new(complete_target))]
        target: String,
        /// The command and its arguments (`help` lists them).
        #[arg(required = true, num_args = 1.., allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Kill a session (its agents, toolsrv and tools) or one agent.
    #[command(
        after_help = "Prints nothing on success.\n\nEXAMPLES:\n  o kill proj/reviewer\n  o kill proj"
    )]
    Kill {
        /// SESSION or SESSION/AGENT.
        #[arg(add = clap_complete::engine::ArgValueCompleter::new(complete_target))]
        target: String,
    },
    /// Print an agent's chat.
    #[command(
        after_help = "Without -f, prints the conversation so far and exits; with -f, \
        keeps printing as it grows until the agent is killed. AGENT defaults to the session's \
        first agent. Control, bidi and invisible characters are shown escaped (ESC as \\u{1B}), \
        with --raw too; ollie-9p read gives the exact bytes.\n\n\
        EXAMPLES:\n  o logs proj/main\n  o logs -f proj/main\n  o logs --raw proj/main | grep -c '^\\[\\[\\[user'"
    )]
    Logs {
        /// SESSION or SESSION/AGENT.
        #[arg(add = clap_complete::engine::ArgValueCompleter::new(complete_target))]
        target: String,
        /// Follow: keep streaming.
        #[arg(short = 'f', long)]
        follow: bool,
        /// Print chat.raw, with its [[[kind … ]]] block markers.
        #[arg(long)]
        raw: bool,
    },
    /// Compose beads into a chat's namespace (start, mount, unmount, ns, rfork), list them (ls).
    #[command(
        after_help = "Writes the command to the namespace's ctl (session/S/ns/ctl, or \
        session/S/agent/A/ns/ctl with --agent) and prints the reply. Without --session, the \
        only session (an error when there are several). The union views are served as \
        session/S/ns/ctx/ for the point /ctx.\n\n\
        EXAMPLES:\n  o bead start sensor-fusion-notes\n  o bead mount -b 883c513f-… /ctx\n  \
        o bead mount -ac sensor-fusion-notes /ctx\n  o bead ns\n  \
        o bead --session proj --agent coder unmount storm-event /ctx"
    )]
    Bead {
        /// The session (default: the only one).
        #[arg(long, value_name = "NAME")]
        session: Option<String>,
        /// An agent's own namespace instead of the session's.
        #[arg(long, value_name = "AGENT")]
        agent: Option<String>,
        #[command(subcommand)]
        verb: crate::bead::Verb,
    },
    /// Answer escalation requests: show each in full, ask y/N/s, send the verdict.
    #[command(
        after_help = "Waits for the next request (every session's, or one session's \
        with --session), prints what would run and what it asks for, and asks on standard \
        input: y approves once, s approves identical requests for the rest of the session, \
        anything else denies (then an optional reason line is sent to the agent). Nothing is \
        ever approved without an answer. End of input (Ctrl-D) quits; Ctrl-C quits.\n\n\
        EXAMPLES:\n  o approve\n  o approve --session proj\n  o approve --once"
    )]
    Approve {
        /// Only this session's requests (SESSION/toolsrv/bypass/).
        #[arg(long, value_name = "NAME")]
        session: Option<String>,
        /// Answer one request, then exit.
        #[arg(long)]
        once: bool,
    },
}

/// What `session/new` and `agent/new` take besides the name.
#[derive(Debug, clap::Args)]
pub struct SpecArgs {
    /// Working directory (made absolute against the current directory). A new session
    /// without it works in the current directory; an agent inherits its session's.
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,
    /// Accept a working directory that is /, your home directory or a system tree (/etc,
    /// /usr, /var, …), which the server otherwise refuses: tools may write in it.
    #[arg(long)]
    force: bool,
    /// A configured backend.
    #[arg(long, value_name = "B")]
    backend: Option<String>,
    /// The model.
    #[arg(long, value_name = "M")]
    model: Option<String>,
    /// An agent profile.
    #[arg(long, value_name = "P")]
    profile: Option<String>,
    /// Run the session's tools on a configured remote (`[remotes.R]`); --cwd is then an
    /// absolute directory on that host.
    #[arg(long, value_name = "R")]
    remote: Option<String>,
}

/// Runs one session command against the server at `addr` (default `unix!$NAMESPACE/ollie`).
pub fn main(addr: Option<String>, key: Option<std::path::PathBuf>, cmd: Command) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return Fail::Connect(format!("cannot start the runtime: {e}")).exit(),
    };
    let r = rt.block_on(run(addr, key, cmd));
    // A task may still be blocked reading standard input; do not wait for it.
    rt.shutdown_background();
    match r {
        Ok(code) => code,
        Err(f) => f.exit(),
    }
}

async fn run(
    addr: Option<String>,
    key: Option<std::path::PathBuf>,
    cmd: Command,
) -> Result<ExitCode, Fail> {
    // Parse what can be checked before dialling.
    let target = match &cmd {
        Command::Ls { .. } => None,
        Command::Approve {
            session: Some(s), ..
        } if s.is_empty() || s.contains('/') => {
            return Err(Fail::Usage(format!(
                "--session {s:?}: give a session name (o ls lists them)"
            )));
        }
        Command::Approve { .. } => None,
        Command::Bead { verb, .. } => {
            verb.check().map_err(Fail::Usage)?;
            None
        }
        Command::New { target, .. }
        | Command::Attach { target, .. }
        | Command::Prompt { target, .. }
        | Command::Ctl { target, .. }
        | Command::Kill { target }
        | Command::Logs { target, .. } => Some(Target::parse(target).map_err(Fail::Usage)?),
    };
    let conn = Conn::connect(addr.as_deref(), key.as_deref()).await?;
    let ok = Ok(ExitCode::SUCCESS);
    match (cmd, target) {
        (Command::Ls { json }, _) => ls(&conn, json).await.and(ok),
        (Command::Approve { session, once }, _) => {
            crate::approve::approve(&conn, session.as_deref(), once).await
        }
        (
            Command::Bead {
                session,
                agent,
                verb,
            },
            _,
        ) => {
            let session = match session {
                Some(s) => s,
                None => only_session(&conn).await?,
            };
            let dir = conn.target_dir(&Target { session, agent }).await?;
            let reply = request(&dir, &["ns", "ctl"], &verb.line()).await?;
            stdout_write(render::terminal_safe(&reply).as_bytes()).and(ok)
        }
        (Command::New { spec, json, .. }, Some(t)) => new(&conn, &t, &spec, json).await.and(ok),
        (Command::Attach { history, quiet, .. }, Some(t)) => {
            attach(&conn, &t, history, Status::on_stderr(quiet)).await
        }
        (
            Command::Prompt {
                text, json, quiet, ..
            },
            Some(t),
        ) => prompt(&conn, &t, &text.join(" "), json, Status::on_stderr(quiet)).await,
        (Command::Ctl { command, .. }, Some(t)) => {
            let dir = conn.target_dir(&t).await?;
            let reply = request(&dir, &["ctl"], &command.join(" ")).await?;
            stdout_write(render::terminal_safe(&reply).as_bytes()).and(ok)
        }
        (Command::Kill { .. }, Some(t)) => {
            let dir = conn.target_dir(&t).await?;
            request(&dir, &["ctl"], "kill").await.and(ok)
        }
        (Command::Logs { follow, raw, .. }, Some(t)) => {
            let a = conn.agent(&t, false).await?;
            logs(&a, follow, raw).await.and(ok)
        }
        (_, None) => Err(Fail::Usage("missing NAME".into())),
    }
}

/// A request/response file: write `req`, read the reply on the same fid.
/// The name of the only session (for commands whose session may be left out).
async fn only_session(conn: &Conn) -> Result<String, Fail> {
    let all = collect(conn).await?;
    match all.as_slice() {
        [one] => Ok(one.name.clone()),
        [] => Err(Fail::Server(
            "there is no session (o new NAME creates one)".into(),
        )),
        many => Err(Fail::Usage(format!(
            "there are {} sessions: give --session ({})",
            many.len(),
            many.iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

async fn request(dir: &Fid, path: &[&str], req: &str) -> Result<String, Fail> {
    let f = open(dir, path, om::ORDWR).await?;
    write_one(&f, req).await?;
    let b = f.read_to_end().await.map_err(remote)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// The current length of a chat stream (its stat length).
async fn stream_len(dir: &Fid, name: &str) -> Result<u64, Fail> {
    let f = walk(dir, &[name]).await?;
    Ok(f.stat().await.map_err(remote)?.length)
}

/// A chat stream from `from` to its current end, without waiting for more.
async fn read_range(dir: &Fid, name: &str, from: u64) -> Result<Vec<u8>, Fail> {
    let mut f = walk(dir, &[name]).await?;
    let len = f.stat().await.map_err(remote)?.length;
    if len <= from {
        return Ok(Vec::new());
    }
    f.open(om::OREAD).await.map_err(remote)?;
    f.read_bulk(from, len - from, 4).await.map_err(remote)
}

/// An agent's directory, held by fid (so a rename does not lose it).
#[derive(Debug)]
struct AgentRef {
    dir: Fid,
    id: String,
    /// Its name when it was looked up.
    name: String,
    /// `SESSION/AGENT`, for messages.
    label: String,
}

impl Conn {
    /// The session's or the agent's directory, for `ctl` and `kill`.
    async fn target_dir(&self, t: &Target) -> Result<Fid, Fail> {
        match &t.agent {
            None => self.session(&t.session).await,
            Some(_) => Ok(self.agent(t, false).await?.dir),
        }
    }

    /// The agent `t` names; without an agent part, the session's first agent, created as
    /// "main" when there is none and `create` is set.
    async fn agent(&self, t: &Target, create: bool) -> Result<AgentRef, Fail> {
        let s = self.session(&t.session).await?;
        let key = match &t.agent {
            Some(a) => a.clone(),
            None => {
                let idx = render::parse_agent_idx(&read_all(&s, &["agent", "idx"]).await?);
                match idx.first() {
                    Some(a) => a.id.clone(),
                    None if create => request(&s, &["agent", "new"], "name=main")
                        .await?
                        .trim()
                        .to_owned(),
                    None => {
                        return Err(Fail::Server(format!(
                            "session {:?} has no agents (o new {}/NAME creates one)",
                            t.session, t.session
                        )));
                    }
                }
            }
        };
        let missing = || {
            Fail::Server(format!(
                "session {:?} has no agent named {key:?} (o ls lists them)",
                t.session
            ))
        };
        let dir = match s.walk(&["agent", key.as_str()]).await {
            Ok(f) if f.qid().is_dir() => f,
            Ok(_) => return Err(missing()),
            Err(e) if is_gone(&e) => return Err(missing()),
            Err(e) => return Err(remote(e)),
        };
        let id = read_all(&dir, &["id"]).await?.trim().to_owned();
        let name = read_all(&dir, &["name"]).await?.trim().to_owned();
        Ok(AgentRef {
            dir,
            id,
            label: format!("{}/{name}", t.session),
            name,
        })
    }
}

impl AgentRef {
    /// The agent's state now (from `agent/idx`, which is fresh on every open).
    async fn state(&self) -> Result<String, Fail> {
        let idx = match self.dir.walk(&["..", "idx"]).await {
            Ok(mut f) => {
                f.open(om::OREAD).await.map_err(remote)?;
                f.read_to_end().await.map_err(remote)?
            }
            Err(e) if is_gone(&e) => return Ok("killed".into()),
            Err(e) => return Err(remote(e)),
        };
        Ok(render::parse_agent_idx(&String::from_utf8_lossy(&idx))
            .into_iter()
            .find(|a| a.id == self.id)
            .map_or_else(|| "killed".to_owned(), |a| a.state))
    }

    fn killed(&self) -> Fail {
        Fail::Server(format!("agent {} was killed", self.label))
    }
}

// ---------------------------------------------------------------------------------------
// ls

#[derive(Debug, Serialize)]
struct SessionInfo {
    name: String,
    id: String,
    toolsrv: String,
    paused: bool,
    agents: Vec<AgentInfo>,
}

#[derive(Debug, Serialize)]
struct AgentInfo {
    name: String,
    id: String,
    state: String,
    /// tokens_in + tokens_out.
    tokens: u64,
    tokens_in: u64,
    tokens_out: u64,
    cost_usd: f64,
    context_tokens: u64,
    context_limit: u64,
    /// context_tokens / context_limit in percent; null when the limit is unknown.
    context_percent: Option<f64>,
}

/// Reads a file, or `None` if what holds it went away meanwhile.
async fn read_if_there(dir: &Fid, path: &[&str]) -> Result<Option<String>, Fail> {
    let mut f = match dir.walk(path).await {
        Ok(f) => f,
        Err(e) if is_gone(&e) => return Ok(None),
        Err(e) => return Err(remote(e)),
    };
    match f.open(om::OREAD).await {
        Ok(_) => {}
        Err(e) if is_gone(&e) => return Ok(None),
        Err(e) => return Err(remote(e)),
    }
    match f.read_to_end().await {
        Ok(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
        Err(e) if is_gone(&e) => Ok(None),
        Err(e) => Err(remote(e)),
    }
}

/// Completion candidates for a SESSION or SESSION/AGENT argument: the names on the default
/// server (`$NAMESPACE`'s, else the first socket found) that start with `current`; nothing
/// when no server answers within a second (completion never hangs the shell).
fn complete_target(current: &std::ffi::OsStr) -> Vec<clap_complete::engine::CompletionCandidate> {
    let Some(prefix) = current.to_str() else {
        return Vec::new();
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Vec::new();
    };
    let names = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(1), async {
            let conn = Conn::connect(None, None).await.ok()?;
            target_names(&conn).await.ok()
        })
        .await
        .ok()
        .flatten()
    });
    names
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .map(clap_complete::engine::CompletionCandidate::new)
        .collect()
}

/// Every session's name and every agent's `SESSION/AGENT`.
async fn target_names(conn: &Conn) -> Result<Vec<String>, Fail> {
    let idx = read_all(&conn.root, &["session", "idx"]).await?;
    let mut out = Vec::new();
    for s in render::parse_session_idx(&idx) {
        let agents = read_if_there(&conn.root, &["session", &s.id, "agent", "idx"]).await?;
        for a in render::parse_agent_idx(&agents.unwrap_or_default()) {
            out.push(format!("{}/{}", s.name, a.name));
        }
        out.push(s.name);
    }
    out.sort();
    Ok(out)
}

async fn collect(conn: &Conn) -> Result<Vec<SessionInfo>, Fail> {
    let idx = read_all(&conn.root, &["session", "idx"]).await?;
    let mut out = Vec::new();
    for s in render::parse_session_idx(&idx) {
        let Some(agents) = read_if_there(&conn.root, &["session", &s.id, "agent", "idx"]).await?
        else {
            continue;
        };
        let mut info = SessionInfo {
            name: s.name,
            id: s.id.clone(),
            toolsrv: s.toolsrv,
            paused: s.paused,
            agents: Vec::new(),
        };
        for a in render::parse_agent_idx(&agents) {
            let path = ["session", s.id.as_str(), "agent", a.id.as_str(), "stats"];
            let Some(stats) = read_if_there(&conn.root, &path).await? else {
                continue;
            };
            let st = Stats::parse(&stats);
            info.agents.push(AgentInfo {
                name: a.name,
                id: a.id,
                state: a.state,
                tokens: st.tokens(),
                tokens_in: st.tokens_in,
                tokens_out: st.tokens_out,
                cost_usd: st.cost_usd,
                context_tokens: st.context_tokens,
                context_limit: st.context_limit,
                context_percent: st.context_percent(),
            });
        }
        out.push(info);
    }
    Ok(out)
}

/// The `o ls` table; every field from the server is shown through [`render::line_safe`] (the
/// columns are measured after escaping).
fn ls_text(sessions: &[SessionInfo]) -> String {
    use render::line_safe as safe;
    let w = sessions
        .iter()
        .flat_map(|s| {
            std::iter::once(safe(&s.name).chars().count())
                .chain(s.agents.iter().map(|a| safe(&a.name).chars().count() + 2))
        })
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for s in sessions {
        out.push_str(&format!(
            "{:<w$}  {}  agents {}  toolsrv {}  paused {}\n",
            safe(&s.name),
            safe(&s.id),
            s.agents.len(),
            safe(&s.toolsrv),
            if s.paused { "yes" } else { "no" },
        ));
        for a in &s.agents {
            let ctx = a
                .context_percent
                .map_or_else(|| "-".to_owned(), |p| format!("{p:.0}%"));
            out.push_str(&format!(
                "  {:<aw$}  {}  {:<7}  tokens {}  cost ${:.4}  context {ctx}\n",
                safe(&a.name),
                safe(&a.id),
                safe(&a.state),
                a.tokens,
                a.cost_usd,
                aw = w.saturating_sub(2),
            ));
        }
    }
    out
}

async fn ls(conn: &Conn, json: bool) -> Result<(), Fail> {
    let sessions = collect(conn).await?;
    let text = if json {
        let mut j = serde_json::to_string_pretty(&sessions)
            .map_err(|e| Fail::Server(format!("cannot encode JSON: {e}")))?;
        j.push('\n');
        render::json_safe(&j).into_owned()
    } else {
        ls_text(&sessions)
    };
    stdout_write(text.as_bytes())
}

// ---------------------------------------------------------------------------------------
// new

/// `key=value …` for `session/new` / `agent/new`. Values cannot hold whitespace (the server
/// splits on it), so such values are refused here rather than misread there. A new local
/// session (`session`) without `--cwd` gets the current directory.
fn spec_line(name: &str, spec: &SpecArgs, session: bool) -> Result<String, Fail> {
    if name.contains(|c: char| c.is_whitespace() || c == '=') {
        return Err(Fail::Usage(format!(
            "invalid name {name:?}: use A-Z a-z 0-9 . _ -"
        )));
    }
    let cwd = match &spec.cwd {
        // A directory on the remote host: nothing to resolve here.
        Some(d) if d.is_relative() && spec.remote.is_some() => {
            return Err(Fail::Usage(format!(
                "--cwd {}: give an absolute directory on the remote host",
                d.display()
            )));
        }
        Some(d) if d.is_relative() => Some(current_dir()?.join(d)),
        None if session && spec.remote.is_none() => Some(current_dir()?),
        other => other.clone(),
    };
    let cwd = cwd
        .map(|p| {
            p.into_os_string()
                .into_string()
                .map_err(|_| Fail::Usage("--cwd: the path is not UTF-8".into()))
        })
        .transpose()?;
    let mut parts = vec![format!("name={name}")];
    for (k, v) in [
        ("cwd", &cwd),
        ("backend", &spec.backend),
        ("model", &spec.model),
        ("profile", &spec.profile),
        ("remote", &spec.remote),
    ] {
        if let Some(v) = v {
            if v.is_empty() || v.contains(char::is_whitespace) {
                return Err(Fail::Usage(format!(
                    "--{k} {v:?}: give a non-empty value without whitespace"
                )));
            }
            parts.push(format!("{k}={v}"));
        }
    }
    if spec.force {
        parts.push("force=yes".into());
    }
    Ok(parts.join(" "))
}

fn current_dir() -> Result<PathBuf, Fail> {
    std::env::current_dir()
        .map_err(|e| Fail::Usage(format!("cannot determine the current directory: {e}")))
}

/// How long `o new` waits for a new session's toolsrv (a remote one starts over ssh).
const TOOLSRV_WAIT: Duration = Duration::from_secs(60);

/// Waits until session `name`'s toolsrv is up; its reason when it failed to start.
async fn wait_toolsrv(conn: &Conn, name: &str) -> Result<(), Fail> {
    let s = conn.session(name).await?;
    let deadline = tokio::time::Instant::now() + TOOLSRV_WAIT;
    loop {
        let cfg = read_all(&s, &["cfg"]).await?;
        let field = |k: &str| {
            cfg.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .unwrap_or("")
                .to_owned()
        };
        match field("toolsrv").as_str() {
            "up" => return Ok(()),
            "failed" => {
                return Err(Fail::Server(format!(
                    "session {name} was created, but its toolsrv failed: {}; the server \
                     keeps retrying (o ls shows its state; o kill {name} removes it)",
                    render::line_safe(&field("toolsrv_reason"))
                )));
            }
            _ if tokio::time::Instant::now() >= deadline => {
                return Err(Fail::Server(format!(
                    "session {name} was created, but its toolsrv is not up after {} s \
                     (o ls shows its state)",
                    TOOLSRV_WAIT.as_secs()
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}

/// What `o new --json` prints.
#[derive(Debug, Serialize)]
struct NewInfo<'a> {
    session: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent: Option<&'a str>,
    /// The new agent's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
}

/// One JSON object and a newline, safe to print ([`render::json_safe`]).
fn json_line(v: &impl Serialize) -> Result<String, Fail> {
    let mut j =
        serde_json::to_string(v).map_err(|e| Fail::Server(format!("cannot encode JSON: {e}")))?;
    j.push('\n');
    Ok(render::json_safe(&j).into_owned())
}

async fn new(conn: &Conn, t: &Target, spec: &SpecArgs, json: bool) -> Result<(), Fail> {
    let reply = match &t.agent {
        None => {
            request(
                &conn.root,
                &["session", "new"],
                &spec_line(&t.session, spec, true)?,
            )
            .await?
        }
        Some(a) => {
            let s = conn.session(&t.session).await?;
            request(&s, &["agent", "new"], &spec_line(a, spec, false)?).await?
        }
    };
    let reply = reply.trim();
    if t.agent.is_none() {
        wait_toolsrv(conn, reply).await?;
    }
    if !json {
        return stdout_write(format!("{}\n", render::terminal_safe(reply)).as_bytes());
    }
    let info = match &t.agent {
        // session/new answers with the session's name.
        None => NewInfo {
            session: reply,
            agent: None,
            id: None,
        },
        Some(a) => NewInfo {
            session: &t.session,
            agent: Some(a),
            id: Some(reply),
        },
    };
    stdout_write(json_line(&info)?.as_bytes())
}

// ---------------------------------------------------------------------------------------
// Turns

/// The agent's states as `statewait` reports them, from a fid opened now (so no change after
/// this point is missed); each goes to `status` (the progress line), and with `print` it is
/// also shown on standard error as a line of its own (running states only when the progress
/// line is off: it shows them).
struct StateFeed {
    rx: watch::Receiver<Option<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl StateFeed {
    async fn start(a: &AgentRef, print: bool, status: Status) -> Result<StateFeed, Fail> {
        let f = open(&a.dir, &["statewait"], om::OREAD).await?;
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(async move {
            // One state per read at offset 0 on the same fid: its cursor moves with each.
            while let Ok(d) = f.read(0, 256).await {
                if d.is_empty() {
                    break;
                }
                let st = String::from_utf8_lossy(&d).trim().to_owned();
                if print && !(status.is_on() && progress::is_running(&st)) {
                    status.eprintln(&format!("· {}", render::line_safe(&st)));
                }
                status.state(&st);
                let killed = st == "killed";
                tx.send_replace(Some(st));
                if killed {
                    break;
                }
            }
        });
        Ok(StateFeed { rx, task })
    }
}

/// A prompt as its `[[[user` block's body shows it (lines that look like markers indented).
fn user_body(prompt: &str) -> String {
    prompt
        .lines()
        .map(|l| {
            if render::is_marker(l.as_bytes()) {
                format!(" {l}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect()
}

/// Whether the turn of `sent` (the chat.raw length before a prompt, and the prompt) has
/// ended: its user block is in the chat and the agent is not running. The chat is read
/// before the state, so an idle seen before the turn started cannot count.
async fn turn_done(a: &AgentRef, sent: Option<&(u64, String)>) -> Result<bool, Fail> {
    if let Some((off, prompt)) = sent {
        let raw = read_range(&a.dir, "chat.raw", *off).await?;
        let want = user_body(prompt);
        let seen = render::parse_blocks(&raw).iter().any(|b| {
            b.kind == "user" && b.attrs.is_empty() && b.body.trim_end() == want.trim_end()
        });
        if !seen {
            return Ok(false);
        }
    }
    Ok(matches!(
        a.state().await?.as_str(),
        "idle" | "error" | "paused" | "killed"
    ))
}

/// Waits until the turn of `sent` has ended (with no prompt: until the agent is not running).
async fn wait_turn(
    a: &AgentRef,
    sent: Option<&(u64, String)>,
    rx: &mut watch::Receiver<Option<String>>,
) -> Result<(), Fail> {
    loop {
        if rx.borrow_and_update().as_deref() == Some("killed") {
            return Err(a.killed());
        }
        match turn_done(a, sent).await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            // Its files went away: it was killed.
            Err(Fail::Server(m)) if m.starts_with("file does not exist") => {
                return Err(a.killed());
            }
            Err(e) => return Err(e),
        }
        if rx.changed().await.is_err() {
            return Err(if rx.borrow().as_deref() == Some("killed") {
                a.killed()
            } else {
                Fail::Server(format!("lost the state of agent {}", a.label))
            });
        }
    }
}

/// Sends one prompt: its own open of `prompt`, written in as many pieces as it takes, queued
/// at the clunk (whose error is the prompt's).
async fn send_prompt(agent_dir: &Fid, text: &str) -> Result<(), Fail> {
    let pf = open(agent_dir, &["prompt"], om::OWRITE).await?;
    pf.write_all(0, text.as_bytes()).await.map_err(remote)?;
    pf.clunk().await.map_err(remote)
}

/// What `o prompt --json` prints when the turn has ended.
#[derive(Debug, Serialize)]
struct PromptResult<'a> {
    session: &'a str,
    agent: &'a str,
    /// The turn ended without an error.
    ok: bool,
    /// The agent's state after the turn.
    state: String,
    /// What the turn added to the chat, without the prompt's own block and error blocks.
    reply: String,
    /// The error the turn ended with.
    error: Option<String>,
    /// The agent's totals after the turn (its `stats`).
    tokens_in: u64,
    tokens_out: u64,
    cost_usd: f64,
}

/// The reply of a turn from its blocks: everything but the block of `prompt` itself (the
/// first user block with its text) and error blocks; and the error it ended with, if its
/// last block is one.
fn turn_reply(blocks: &[render::Block], prompt: &str) -> (String, Option<String>) {
    let want = user_body(prompt);
    let mut own_prompt_seen = false;
    let mut reply = String::new();
    for b in blocks {
        if b.kind == "error" {
            continue;
        }
        if !own_prompt_seen
            && b.kind == "user"
            && b.attrs.is_empty()
            && b.body.trim_end() == want.trim_end()
        {
            own_prompt_seen = true;
            continue;
        }
        reply.push_str(&b.body);
    }
    let error = blocks
        .last()
        .filter(|b| b.kind == "error")
        .map(|b| b.body.trim_end().to_owned());
    (reply, error)
}

async fn prompt(
    conn: &Conn,
    t: &Target,
    text: &str,
    json: bool,
    status: Status,
) -> Result<ExitCode, Fail> {
    if text.trim().is_empty() {
        return Err(Fail::Usage("empty prompt".into()));
    }
    let a = conn.agent(t, true).await?;
    let mut states = StateFeed::start(&a, false, status.clone()).await?;
    let off = stream_len(&a.dir, "chat.raw").await?;
    // From here until the turn has ended (or this fails): the progress line.
    status.begin("waiting");
    let animation = status.animate();
    send_prompt(&a.dir, text).await?;
    if read_all(&conn.session(&t.session).await?, &["paused"])
        .await?
        .trim()
        == "true"
    {
        states.task.abort();
        drop(animation);
        eprintln!(
            "o: session {} is paused: the prompt is queued and runs after `o ctl {} resume`",
            render::line_safe(&t.session),
            render::line_safe(&t.session)
        );
        return Ok(ExitCode::from(EXIT_QUEUED));
    }
    let sent = (off, text.to_owned());
    wait_turn(&a, Some(&sent), &mut states.rx).await?;
    states.task.abort();
    drop(animation);
    let blocks = render::parse_blocks(&read_range(&a.dir, "chat.raw", off).await?);
    let failed = blocks.last().is_some_and(|b| b.kind == "error");
    let code = if failed {
        ExitCode::from(EXIT_SERVER)
    } else {
        ExitCode::SUCCESS
    };
    if json {
        let (reply, error) = turn_reply(&blocks, text);
        let stats = Stats::parse(&read_all(&a.dir, &["stats"]).await?);
        let result = PromptResult {
            session: &t.session,
            agent: &a.name,
            ok: error.is_none(),
            state: a.state().await?,
            reply,
            error,
            tokens_in: stats.tokens_in,
            tokens_out: stats.tokens_out,
            cost_usd: stats.cost_usd,
        };
        stdout_write(json_line(&result)?.as_bytes())?;
        return Ok(code);
    }
    let mut text_out = String::new();
    for b in &blocks {
        if b.kind == "error" {
            // Flush what came before, so the two streams keep their order on a terminal.
            stdout_write(std::mem::take(&mut text_out).as_bytes())?;
            eprintln!("o: {}", render::terminal_safe(b.body.trim_end()));
        } else {
            text_out.push_str(&render::terminal_safe(&b.body));
        }
    }
    stdout_write(text_out.as_bytes())?;
    Ok(code)
}

// ---------------------------------------------------------------------------------------
// logs and attach

/// Copies a chat stream from `from` to standard output as it grows, through `renderer` when
/// there is one (escaped either way: [`render::SafeStream`]), with the progress line of
/// `status` out of its way; reports how far it got on `printed`. Ends at end of file (the
/// agent killed).
async fn stream_chat(
    f: Fid,
    from: u64,
    mut renderer: Option<Renderer>,
    printed: watch::Sender<u64>,
    status: Status,
) -> Result<(), Fail> {
    let mut off = from;
    let mut buf = Vec::new();
    let mut safe = render::SafeStream::default();
    loop {
        let d = f.read(off, f.iounit()).await.map_err(remote)?;
        buf.clear();
        if d.is_empty() {
            // The end: a UTF-8 sequence left open is shown as such.
            match &mut renderer {
                Some(r) => r.finish(&mut buf),
                None => safe.finish(&mut buf),
            }
            if !buf.is_empty() {
                status.output(&buf, || stdout_write(&buf))?;
            }
            return Ok(());
        }
        off += d.len() as u64;
        match &mut renderer {
            Some(r) => r.feed(&d, &mut buf),
            None => safe.feed(&d, &mut buf),
        }
        if !buf.is_empty() {
            status.output(&buf, || stdout_write(&buf))?;
        }
        printed.send_replace(off);
    }
}

async fn logs(a: &AgentRef, follow: bool, raw: bool) -> Result<(), Fail> {
    let name = if raw { "chat.raw" } else { "chat" };
    if !follow {
        let text = render::terminal_safe_bytes(&read_range(&a.dir, name, 0).await?);
        return stdout_write(text.as_bytes());
    }
    let f = open(&a.dir, &[name], om::OREAD).await?;
    let (tx, _rx) = watch::channel(0);
    stream_chat(f, 0, None, tx, Status::off()).await
}

/// On a terminal, lines that arrive closer together than this are one prompt: a paste
/// delivers its lines at once, a person presses Enter far more slowly.
const PASTE_GAP: std::time::Duration = std::time::Duration::from_millis(30);

/// Reads prompts from standard input until end of input, then waits for the last one's turn
/// (or a running one) to end. A line is a prompt; on a terminal, a multi-line paste is one.
async fn read_prompts(
    a: Arc<AgentRef>,
    mut rx: watch::Receiver<Option<String>>,
    status: Status,
) -> Result<(), Fail> {
    let tty = std::io::stdin().is_terminal();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut last: Option<(u64, String)> = None;
    let read_err = |e: std::io::Error| Fail::Usage(format!("reading standard input: {e}"));
    loop {
        let mut prompt = match lines.next_line().await {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(e) => return Err(read_err(e)),
        };
        let mut ended = false;
        // More lines already there (a paste) belong to this prompt.
        while tty && !ended {
            match tokio::time::timeout(PASTE_GAP, lines.next_line()).await {
                Err(_) => break,
                Ok(Ok(Some(l))) => {
                    prompt.push('\n');
                    prompt.push_str(&l);
                }
                Ok(Ok(None)) => ended = true,
                Ok(Err(e)) => return Err(read_err(e)),
            }
        }
        if !prompt.trim().is_empty() {
            let off = stream_len(&a.dir, "chat.raw").await?;
            match send_prompt(&a.dir, &prompt).await {
                Ok(()) => last = Some((off, prompt)),
                Err(Fail::Server(m)) | Err(Fail::Usage(m)) => status.eprintln(&format!("o: {m}")),
                Err(e) => return Err(e),
            }
        }
        if ended {
            break;
        }
    }
    wait_turn(&a, last.as_ref(), &mut rx).await
}

async fn attach(conn: &Conn, t: &Target, history: bool, status: Status) -> Result<ExitCode, Fail> {
    let a = Arc::new(conn.agent(t, true).await?);
    let tty = std::io::stdout().is_terminal();
    let colour = tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    // On a terminal the blocks are rendered from chat.raw; otherwise chat goes out as it is.
    let stream = if tty { "chat.raw" } else { "chat" };
    let mut chat = walk(&a.dir, &[stream]).await?;
    let start = if history {
        0
    } else {
        chat.stat().await.map_err(remote)?.length
    };
    chat.open(om::OREAD).await.map_err(remote)?;
    let states = StateFeed::start(&a, true, status.clone()).await?;
    // A turn that runs already shows at once (until statewait reports the next state).
    if status.is_on() {
        status.initial(&a.state().await?);
    }
    let _animation = status.animate();
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| Fail::Server(format!("cannot handle Ctrl-C: {e}")))?;
    if std::io::stdin().is_terminal() {
        eprintln!(
            "· attached to {} (Ctrl-C stops a turn, twice quits; Ctrl-D quits when idle)",
            render::line_safe(&a.label)
        );
    }
    let (printed_tx, mut printed) = watch::channel(start);
    let mut chat_task = tokio::spawn(stream_chat(
        chat,
        start,
        tty.then(|| Renderer::new(colour)),
        printed_tx,
        status.clone(),
    ));
    let mut input_task = tokio::spawn(read_prompts(
        Arc::clone(&a),
        states.rx.clone(),
        status.clone(),
    ));
    let mut last_interrupt: Option<Instant> = None;
    loop {
        tokio::select! {
            r = &mut chat_task => {
                let r = r.map_err(|e| Fail::Server(format!("chat reader failed: {e}")))?;
                if r.is_ok() {
                    // End of the chat: the agent was killed; let its last state show.
                    let _ = states.task.await;
                }
                return r.map(|()| ExitCode::SUCCESS);
            }
            r = &mut input_task => {
                r.map_err(|e| Fail::Server(format!("input reader failed: {e}")))??;
                // Show the end of the turn before leaving.
                let end = stream_len(&a.dir, stream).await?;
                let _ = printed.wait_for(|p| *p >= end).await;
                return Ok(ExitCode::SUCCESS);
            }
            _ = sigint.recv() => {
                if last_interrupt.is_some_and(|t| t.elapsed() < DOUBLE_INTERRUPT) {
                    return Ok(ExitCode::from(EXIT_INTERRUPTED));
                }
                last_interrupt = Some(Instant::now());
                match request(&a.dir, &["ctl"], "stop").await {
                    Ok(r) => status.eprintln(&format!("· {}", r.trim())),
                    Err(Fail::Server(m)) => status.eprintln(&format!("o: {m}")),
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_lines() {
        let spec = SpecArgs {
            cwd: Some(PathBuf::from("/tmp")),
            backend: None,
            model: Some("m1".into()),
            profile: None,
            remote: None,
            force: false,
        };
        assert_eq!(
            spec_line("p", &spec, false).unwrap(),
            "name=p cwd=/tmp model=m1"
        );
        let rel = SpecArgs {
            cwd: Some(PathBuf::from("sub")),
            backend: None,
            model: None,
            profile: None,
            remote: None,
            force: false,
        };
        let line = spec_line("p", &rel, false).unwrap();
        assert!(line.starts_with("name=p cwd=/"), "{line}");
        assert!(line.ends_with("/sub"), "{line}");
        let bad = SpecArgs {
            cwd: None,
            backend: Some("a b".into()),
            model: None,
            profile: None,
            remote: None,
            force: false,
        };
        assert!(
            matches!(spec_line("p", &bad, false), Err(Fail::Usage(m)) if m.contains("--backend"))
        );
        let far = SpecArgs {
            cwd: Some(PathBuf::from("/srv/x")),
            backend: None,
            model: None,
            profile: None,
            remote: Some("build".into()),
            force: false,
        };
        assert_eq!(
            spec_line("p", &far, false).unwrap(),
            "name=p cwd=/srv/x remote=build"
        );
        let far_rel = SpecArgs {
            cwd: Some(PathBuf::from("x")),
            ..far
        };
        assert!(
            matches!(spec_line("p", &far_rel, false), Err(Fail::Usage(m)) if m.contains("remote host"))
        );
        assert!(
            matches!(spec_line("a b", &rel, false), Err(Fail::Usage(m)) if m.contains("invalid name"))
        );
        // A new session without --cwd works in the current directory; an agent inherits its
        // session's (no cwd= sent); --force is passed on.
        let none = SpecArgs {
            cwd: None,
            backend: None,
            model: None,
            profile: None,
            remote: None,
            force: true,
        };
        let here = std::env::current_dir().unwrap();
        assert_eq!(
            spec_line("p", &none, true).unwrap(),
            format!("name=p cwd={} force=yes", here.display())
        );
        assert_eq!(spec_line("p", &none, false).unwrap(), "name=p force=yes");
    }

    #[test]
    fn a_turns_reply_leaves_out_its_prompt_and_errors() {
        let raw = b"[[[user\nsay hi\n]]]\n[[[reasoning\nhm\n]]]\n[[[assistant\nhi\n]]]\n";
        let blocks = render::parse_blocks(raw);
        assert_eq!(turn_reply(&blocks, "say hi"), ("hm\nhi\n".to_owned(), None));
        // A failed turn: its last block is the error.
        let raw = b"[[[user\nsay hi\n]]]\n[[[assistant\npart\n]]]\n[[[error\nboom\n]]]\n";
        let blocks = render::parse_blocks(raw);
        assert_eq!(
            turn_reply(&blocks, "say hi"),
            ("part\n".to_owned(), Some("boom".to_owned()))
        );
        // An error the turn got over is not its outcome; an injected user block is kept.
        let raw = b"[[[user\nx\n]]]\n[[[error\nretrying\n]]]\n[[[user injected\nx\n]]]\n\
            [[[assistant\nok\n]]]\n";
        let blocks = render::parse_blocks(raw);
        assert_eq!(turn_reply(&blocks, "x"), ("x\nok\n".to_owned(), None));
    }

    #[test]
    fn user_bodies_match_the_servers_blocks() {
        assert_eq!(user_body("hi"), "hi\n");
        assert_eq!(user_body("a\n]]]\n[[[x"), "a\n ]]]\n [[[x\n");
    }

    #[test]
    fn ls_lines() {
        let s = vec![SessionInfo {
            name: "proj".into(),
            id: "sid".into(),
            toolsrv: "up".into(),
            paused: false,
            agents: vec![AgentInfo {
                name: "main".into(),
                id: "aid".into(),
                state: "idle".into(),
                tokens: 15,
                tokens_in: 10,
                tokens_out: 5,
                cost_usd: 0.5,
                context_tokens: 1,
                context_limit: 4,
                context_percent: Some(25.0),
            }],
        }];
        assert_eq!(
            ls_text(&s),
            "proj    sid  agents 1  toolsrv up  paused no\n  \
             main  aid  idle     tokens 15  cost $0.5000  context 25%\n"
        );
        // Whatever the server sends, every field is one escaped line: no control reaches the
        // terminal, no tab or newline breaks the table.
        let mut hostile = s;
        hostile[0].name = "p\x1b]52;c;SGVsbG8=\x07".into();
        hostile[0].toolsrv = "up\n\u{9b}2J".into();
        hostile[0].agents[0].state = "idle\t\u{202e}".into();
        let text = ls_text(&hostile);
        assert_eq!(
            text,
            "p\\u{1B}]52;c;SGVsbG8=\\u{7}  sid  agents 1  toolsrv up\\u{A}\\u{9B}2J  paused no\n  \
             main                      aid  idle\\u{9}\\u{202E}  tokens 15  cost $0.5000  context 25%\n"
        );
    }
}
