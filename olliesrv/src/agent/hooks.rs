//! Lifecycle hooks: commands an agent profile attaches to points of the agent loop.
//!
//! A profile (`agents/NAME.toml`) maps events to bash commands:
//!
//! ```toml
//! hook_policy = "readonly"   # the policy they run under (default readonly)
//! hook_timeout_s = 10        # each command's time bound (1..=300, default 10)
//! [hooks]
//! pre_tool = ["./scripts/check-call"]
//! post_turn = ["cargo test -q 2>&1 | tail -5 >&2 || exit 2"]
//! ```
//!
//! Events ([`EVENTS`](crate::config::hook_limits::EVENTS)): `agent_spawn` (once, when the agent is created), `pre_turn` and
//! `post_turn` (around each prompt's turn), `pre_tool` and `post_tool` (around each tool
//! call), `pre_compact` and `post_compact` (around a compaction), `turn_error` (a turn ended
//! in an error).
//!
//! A hook never runs in olliesrv. Each command runs in the session's toolsrv through
//! `proc/new` as `execute_code` (bash), under its own toolsrv identity `<agent-id>.hook`
//! configured with `hook_policy`, no escalations and no other tool, in the agent's working
//! directory, with the policy's limits and `hook_timeout_s` as its timeout. It reads the event
//! as one JSON object on stdin (`event`, `session_id`, `session_name`, `agent_id`,
//! `agent_name`, `cwd`, `profile`, and the event's own fields: [`Event`]) and finds the same
//! facts in `OLLIE_EVENT`, `OLLIE_SESSION_ID`, `OLLIE_SESSION_NAME`, `OLLIE_AGENT_ID`,
//! `OLLIE_AGENT_NAME`, `OLLIE_CWD`, `OLLIE_PROFILE` and, for tool events, `OLLIE_TOOL`.
//!
//! What its exit status means:
//! - 0: its stdout (if any) is context the model gets, as `<hook event="…">…</hook>`;
//! - 2: the step is blocked and its stderr is the reason (what "blocked" means is per event,
//!   see [`Event`]); the event's later commands do not run;
//! - anything else, a signal, the timeout, or toolsrv failing: the chat says so (an `info`
//!   block with `hook=EVENT failed`), the log too, and the step goes on as if the hook had
//!   said nothing.
//!
//! Bounds: at most [`MAX_PER_EVENT`](crate::config::hook_limits::MAX_PER_EVENT) commands of [`MAX_COMMAND`](crate::config::hook_limits::MAX_COMMAND) bytes per event; string
//! fields of the event are cut at [`MAX_FIELD`] bytes, and shorter while the whole event is
//! over [`MAX_EVENT`] (an event that still does not fit — arguments made of a great many
//! small values — is not given to the hooks: a `pre_tool` or `pre_turn` step is then blocked,
//! so an oversized call cannot slip past a guard; other events count it as the hooks
//! failing); of each stream only [`MAX_TEXT`] bytes are used; olliesrv gives up on a command [`GRACE`] after its timeout (the call is flushed,
//! so toolsrv stops it).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::agent::history::clip;
use crate::config::{Config, HookSet};
use crate::state::{Agent, Registry};

/// Bytes of a hook's stdout (context) or stderr (reason) that are used.
pub const MAX_TEXT: usize = 16 * 1024;
/// Bytes of any string in the event (a tool's result or a file's content in its arguments).
pub const MAX_FIELD: usize = 64 * 1024;
/// Bytes of the whole event (escaped in the payload it may double: it must fit one request).
pub const MAX_EVENT: usize = 256 * 1024;
/// The shortest the strings of an event are cut to, to make it fit [`MAX_EVENT`].
const MIN_FIELD: usize = 256;
/// How long after its timeout olliesrv stops waiting for a command.
pub const GRACE: Duration = Duration::from_secs(5);

/// A point in the agent loop, with the fields its event carries.
#[derive(Debug, Clone)]
pub enum Event<'a> {
    /// The agent was created (not when olliesrv restores it). Exit 2: the agent is blocked,
    /// every turn of it fails with the reason.
    AgentSpawn,
    /// A prompt's turn starts (`prompt`). Exit 2: the model is not called; the turn fails.
    PreTurn { prompt: &'a str },
    /// The model answered without tool calls (`prompt`, `reply`). Exit 2: the turn goes on,
    /// with the reason as the next user message.
    PostTurn { prompt: &'a str, reply: &'a str },
    /// A tool call is about to run (`tool`, `call_id`, `arguments`). Exit 2: it does not run;
    /// its result is the reason.
    PreTool {
        tool: &'a str,
        call_id: &'a str,
        arguments: &'a Value,
    },
    /// A tool call finished (`tool`, `call_id`, `arguments`, `result`, `ok`). Exit 2: the
    /// reason is added to the result, which counts as failed.
    PostTool {
        tool: &'a str,
        call_id: &'a str,
        arguments: &'a Value,
        result: &'a str,
        ok: bool,
    },
    /// A compaction is about to run (`reason`, `messages`). Exit 2: it is skipped. Context
    /// is added to the summarizing instruction.
    PreCompact { reason: &'a str, messages: usize },
    /// A compaction finished (`reason`, `summarized`, `kept`, `summary`).
    PostCompact {
        reason: &'a str,
        summarized: usize,
        kept: usize,
        summary: &'a str,
    },
    /// A turn ended in an error (`prompt`, `error`).
    TurnError { prompt: &'a str, error: &'a str },
}

impl Event<'_> {
    pub fn name(&self) -> &'static str {
        match self {
            Event::AgentSpawn => "agent_spawn",
            Event::PreTurn { .. } => "pre_turn",
            Event::PostTurn { .. } => "post_turn",
            Event::PreTool { .. } => "pre_tool",
            Event::PostTool { .. } => "post_tool",
            Event::PreCompact { .. } => "pre_compact",
            Event::PostCompact { .. } => "post_compact",
            Event::TurnError { .. } => "turn_error",
        }
    }

    /// The event's own fields.
    fn fields(&self) -> Map<String, Value> {
        let v = match self {
            Event::AgentSpawn => json!({}),
            Event::PreTurn { prompt } => json!({ "prompt": prompt }),
            Event::PostTurn { prompt, reply } => json!({ "prompt": prompt, "reply": reply }),
            Event::PreTool {
                tool,
                call_id,
                arguments,
            } => json!({ "tool": tool, "call_id": call_id, "arguments": arguments }),
            Event::PostTool {
                tool,
                call_id,
                arguments,
                result,
                ok,
            } => json!({
                "tool": tool, "call_id": call_id, "arguments": arguments,
                "result": result, "ok": ok,
            }),
            Event::PreCompact { reason, messages } => {
                json!({ "reason": reason, "messages": messages })
            }
            Event::PostCompact {
                reason,
                summarized,
                kept,
                summary,
            } => json!({
                "reason": reason, "summarized": summarized, "kept": kept, "summary": summary,
            }),
            Event::TurnError { prompt, error } => json!({ "prompt": prompt, "error": error }),
        };
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    fn tool(&self) -> Option<&str> {
        match self {
            Event::PreTool { tool, .. } | Event::PostTool { tool, .. } => Some(tool),
            _ => None,
        }
    }
}

/// What an event's hooks came to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fired {
    /// What the hooks that exited 0 printed, wrapped as `<hook event="…">…</hook>`.
    pub context: Option<String>,
    /// The reason of the hook that exited 2.
    pub blocked: Option<String>,
}

impl Fired {
    /// For events after which nothing can be blocked (`turn_error`, `post_compact`): the
    /// context and the reason, each as a message for the history.
    pub fn notes(self, event: &str) -> impl Iterator<Item = String> {
        let reason = self.blocked.map(|why| wrap(event, &why));
        self.context.into_iter().chain(reason)
    }
}

/// `text` wrapped as context from `event`'s hooks.
pub fn wrap(event: &str, text: &str) -> String {
    format!("<hook event=\"{event}\">\n{text}\n</hook>")
}

/// The hooks of `a`'s profile for `event`, if it has any.
pub fn configured<'c>(a: &Agent, config: &'c Config, event: &str) -> Option<&'c HookSet> {
    let p = a.profile(config)?;
    p.hooks
        .commands
        .get(event)
        .is_some_and(|c| !c.is_empty())
        .then_some(&p.hooks)
}

/// Runs `a`'s hooks for `event`, in order, until one blocks. The chat records what they
/// added, blocked or failed (`info` blocks with `hook=EVENT`).
pub async fn fire(reg: &Registry, a: &Arc<Agent>, config: &Config, event: Event<'_>) -> Fired {
    let name = event.name();
    let Some(set) = configured(a, config, name) else {
        return Fired::default();
    };
    let Some(input) = event_json(a, config, &event) else {
        let why = format!(
            "the {name} event is too large to give to its hooks (over {} KiB even with its strings cut to {MIN_FIELD} bytes)",
            MAX_EVENT / 1024
        );
        return if matches!(event, Event::PreTool { .. } | Event::PreTurn { .. }) {
            note(a, name, "blocked", &format!("blocked: {why}"));
            Fired {
                context: None,
                blocked: Some(why),
            }
        } else {
            note(a, name, "failed", &format!("hooks not run: {why}"));
            Fired::default()
        };
    };
    let env = exports(a, config, &event);
    let mut context = Vec::new();
    let mut blocked = None;
    for command in &set.commands[name] {
        reg.detail(a, &format!("hook: {name}"));
        let said = match run(a, set, command, &env, &input).await {
            Ok(ran) => ran,
            Err(e) => {
                note(
                    a,
                    name,
                    "failed",
                    &format!("hook {} failed: {e}; ignored", shown(command)),
                );
                continue;
            }
        };
        // A hook the runner stopped (its timeout) failed, whatever status it managed.
        let code = if said.stopped_by.is_some() {
            None
        } else {
            said.code
        };
        match (code, said.signal) {
            (Some(0), _) => {
                let out = clip(said.stdout.trim(), MAX_TEXT);
                if !out.is_empty() {
                    note(a, name, "", &out);
                    context.push(out);
                }
            }
            (Some(2), _) => {
                let why = clip(said.stderr.trim(), MAX_TEXT);
                let why = if why.is_empty() {
                    "(the hook gave no reason)".to_owned()
                } else {
                    why
                };
                note(
                    a,
                    name,
                    "blocked",
                    &format!("blocked by {name} hook: {why}"),
                );
                blocked = Some(why);
                break;
            }
            (_, signal) => {
                let status = match (said.code, signal, &said.stopped_by) {
                    (_, _, Some(by)) => format!("stopped ({by})"),
                    (Some(c), _, _) => format!("exited {c}"),
                    (None, Some(s), _) => format!("was killed by signal {s}"),
                    (None, None, _) => "ended without a status".to_owned(),
                };
                let err = clip(said.stderr.trim(), 2048);
                let mut text = format!("hook {} {status}; ignored", shown(command));
                if !err.is_empty() {
                    text.push_str(&format!("\n{err}"));
                }
                note(a, name, "failed", &text);
            }
        }
    }
    Fired {
        context: (!context.is_empty()).then(|| wrap(name, &context.join("\n\n"))),
        blocked,
    }
}

/// An `info` block in the chat (`hook=EVENT`, and `outcome` when not plain context) and a
/// log line for failures.
fn note(a: &Agent, event: &str, outcome: &str, text: &str) {
    if outcome == "failed" {
        tracing::warn!(agent = %a.id, event, "{text}");
    }
    let attrs = if outcome.is_empty() {
        format!("hook={event}")
    } else {
        format!("hook={event} {outcome}")
    };
    if let Err(e) = a.say("info", &attrs, text) {
        tracing::warn!(agent = %a.id, error = %e, "cannot record a hook's outcome");
    }
}

/// A command as the chat names it: its first line, cut short.
fn shown(command: &str) -> String {
    let first = command.trim().lines().next().unwrap_or("");
    let mut s = ollie_link::text::clip(first, 60);
    if s == first && first.len() < command.trim().len() {
        s.push('…');
    }
    format!("`{s}`")
}

/// Cuts every string in `v` to `max` bytes.
fn clip_strings(v: &mut Value, max: usize) {
    match v {
        Value::String(s) if s.len() > max => *s = clip(s, max),
        Value::Array(a) => a.iter_mut().for_each(|v| clip_strings(v, max)),
        Value::Object(m) => m.values_mut().for_each(|v| clip_strings(v, max)),
        _ => {}
    }
}

/// `v` as JSON of at most [`MAX_EVENT`] bytes: its strings cut at [`MAX_FIELD`], then
/// shorter (halving down to [`MIN_FIELD`]) until it fits; `None` if it never does.
fn bounded_json(v: &Value) -> Option<String> {
    let mut max = MAX_FIELD;
    loop {
        let mut c = v.clone();
        clip_strings(&mut c, max);
        let text = c.to_string();
        if text.len() <= MAX_EVENT {
            return Some(text);
        }
        if max <= MIN_FIELD {
            return None;
        }
        max = (max / 2).max(MIN_FIELD);
    }
}

/// The facts every event carries.
fn common(a: &Agent, config: &Config) -> [(&'static str, String); 6] {
    let s = a.session.upgrade();
    [
        ("SESSION_ID", a.session_id.clone()),
        ("SESSION_NAME", s.map(|s| s.name()).unwrap_or_default()),
        ("AGENT_ID", a.id.clone()),
        ("AGENT_NAME", a.name()),
        ("CWD", a.settings().cwd.display().to_string()),
        (
            "PROFILE",
            a.profile(config)
                .map_or_else(String::new, |p| p.name.clone()),
        ),
    ]
}

/// The JSON object a hook reads on stdin (one line), `None` when it cannot be made to fit
/// [`MAX_EVENT`].
pub fn event_json(a: &Agent, config: &Config, event: &Event<'_>) -> Option<String> {
    let mut m = Map::new();
    m.insert("event".into(), event.name().into());
    for (k, v) in common(a, config) {
        m.insert(k.to_ascii_lowercase(), v.into());
    }
    m.extend(event.fields());
    bounded_json(&Value::Object(m))
}

/// The bash line that sets the `OLLIE_*` variables.
fn exports(a: &Agent, config: &Config, event: &Event<'_>) -> String {
    let mut vars = vec![("EVENT", event.name().to_owned())];
    vars.extend(common(a, config));
    if let Some(t) = event.tool() {
        vars.push(("TOOL", t.to_owned()));
    }
    let assignments: Vec<String> = vars
        .iter()
        .map(|(k, v)| format!("OLLIE_{k}={}", shell_quote(v)))
        .collect();
    format!("export {}\n", assignments.join(" "))
}

/// `s` as one bash word.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// How one command ended.
#[derive(Debug, Default)]
struct Ran {
    code: Option<i32>,
    signal: Option<i32>,
    /// Why the runner stopped it (`timeout`, `cancel`, `disk_limit`).
    stopped_by: Option<String>,
    stdout: String,
    stderr: String,
}

/// Runs one command in the session's toolsrv as the agent's hook identity.
async fn run(
    a: &Agent,
    set: &HookSet,
    command: &str,
    env: &str,
    input: &str,
) -> Result<Ran, String> {
    let s = a.session.upgrade().ok_or("the session was killed")?;
    let c = s.link.conn(Duration::from_secs(10)).await?;
    let root = c.hook_root(&a.id, &set.policy).await?;
    let args = json!({
        "language": "bash",
        "code": format!("{env}{command}\n"),
        "timeout_s": set.timeout_s,
    });
    let payload = format!(
        "tool=execute_code\nargs={args}\ncwd={}\nrecord=1\noutput=split\nstdin={}\n",
        ollie_link::escape_value(&a.settings().cwd.display().to_string()),
        ollie_link::escape_value(&format!("{input}\n")),
    );
    let call = crate::link::proc_call(&root, "new", payload);
    let wait = Duration::from_secs(set.timeout_s) + GRACE;
    let reply = tokio::time::timeout(wait, call)
        .await
        .map_err(|_| format!("no answer within {} s; stopped", wait.as_secs()))??;
    parse_reply(&String::from_utf8_lossy(&reply))
}

/// Reads a `record=1`, `output=split` reply: the record line, the header line, then
/// `{"stdout","stderr"}`.
fn parse_reply(reply: &str) -> Result<Ran, String> {
    let mut lines = reply.lines();
    let head: Value = lines
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or("toolsrv sent no run record")?;
    let Some(record) = head.get("record").filter(|r| !r.is_null()) else {
        let e = head
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no reason given");
        return Err(format!("it did not run: {e}"));
    };
    let exit = record.get("exit");
    let num = |k: &str| {
        exit.and_then(|e| e.get(k))
            .and_then(Value::as_i64)
            .and_then(|n| i32::try_from(n).ok())
    };
    let out = lines
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("stdout").is_some())
        .ok_or("toolsrv sent no output")?;
    let text = |k: &str| out.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    Ok(Ran {
        code: num("code"),
        signal: num("signal"),
        stopped_by: exit
            .and_then(|e| e.get("killed_by"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        stdout: text("stdout"),
        stderr: text("stderr"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_give_status_and_streams() {
        let r = parse_reply(
            "{\"pid\":3,\"record\":{\"exit\":{\"code\":2,\"signal\":null,\"killed_by\":null}}}\npid=3 exit=2\n{\"stdout\":\"ctx\\n\",\"stderr\":\"no\\n\"}\n",
        )
        .unwrap();
        assert_eq!((r.code, r.signal), (Some(2), None));
        assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("ctx\n", "no\n"));
        let r = parse_reply(
            "{\"pid\":4,\"record\":{\"exit\":{\"code\":null,\"signal\":9,\"killed_by\":\"timeout\"}}}\npid=4 signal=9 stopped_by=timeout\n{\"stdout\":\"\",\"stderr\":\"\"}\n[output truncated: first 1 of 2 bytes shown]\n",
        )
        .unwrap();
        assert_eq!((r.code, r.signal), (None, Some(9)));
        assert_eq!(r.stopped_by.as_deref(), Some("timeout"));
        let e =
            parse_reply("{\"pid\":5,\"record\":null,\"error\":\"landlock: no\"}\n").unwrap_err();
        assert_eq!(e, "it did not run: landlock: no");
        assert!(parse_reply("garbage").is_err());
        assert!(parse_reply("{\"pid\":6,\"record\":{\"exit\":{}}}\npid=6\n").is_err());
    }

    #[test]
    fn events_are_bounded_as_a_whole() {
        // Many strings under MAX_FIELD that add up past MAX_EVENT are cut shorter.
        let steps: Vec<Value> = (0..16)
            .map(|_| json!({"code": "\n".repeat(42_000)}))
            .collect();
        let v = json!({"arguments": {"steps": steps}});
        let text = bounded_json(&v).unwrap();
        assert!(text.len() <= MAX_EVENT, "{}", text.len());
        assert!(text.contains("more bytes]"));
        // Small events are untouched.
        let small = json!({"prompt": "hi"});
        assert_eq!(bounded_json(&small).unwrap(), small.to_string());
        // A great many tiny values never fit.
        let tiny = json!({"arguments": vec![1u8; MAX_EVENT]});
        assert_eq!(bounded_json(&tiny), None);
    }

    #[test]
    fn quoting_and_clipping() {
        assert_eq!(shell_quote("it's $HOME"), "'it'\\''s $HOME'");
        let mut v = json!({"a": ["x".repeat(MAX_FIELD + 10)], "b": 1});
        clip_strings(&mut v, MAX_FIELD);
        let s = v["a"][0].as_str().unwrap();
        assert!(
            s.len() < MAX_FIELD + 40 && s.ends_with("… [10 more bytes]"),
            "{}",
            s.len()
        );
        assert_eq!(shown("echo a\necho b"), "`echo a…`");
        assert_eq!(
            wrap("pre_turn", "x"),
            "<hook event=\"pre_turn\">\nx\n</hook>"
        );
    }
}
