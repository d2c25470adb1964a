//! The per-agent worker and the agent loop.
//!
//! The worker takes queued prompts in order (not while the session is paused) and runs a
//! turn for each: the prompt goes into the chat and the history; then, up to `max_steps`
//! times, the model is called with the history and the agent's tool schemas (streamed into
//! the chat: `reasoning` and `assistant` blocks); each tool call it makes runs in the
//! session's toolsrv with the agent's identity (`tool_call` / `tool_result` blocks, the
//! sandbox's run record on the result's marker line) and its result goes back to the
//! model; the turn ends when the model answers without tool calls.
//!
//! Around that:
//! - consecutive read-only calls (`file_read`) run in parallel; the rest one at a time, in
//!   order;
//! - a call to a tool the agent does not have is answered with an error, without toolsrv;
//! - a call carrying `escalate` shows the state `waiting: bypass`: toolsrv holds it until
//!   the operator answers on `bypass/resolve` (or refuses it at once);
//! - `execute_code` / `execute_pipe` with `"background": true` start in the background
//!   (`proc/new.bg`); their end arrives later as the seed's `<system-proc-complete …>`
//!   message, queued as a prompt when the agent is idle, added to the running turn otherwise;
//! - an answer that writes a tool call as text is detected and the model is told to use
//!   the tool interface (twice at most per turn);
//! - [`NUDGE_AFTER`] rounds in a row in which every tool call failed bring a nudge to
//!   reconsider; [`ABORT_AFTER`] end the turn;
//! - the `plan` is shown to the model again every [`PLAN_EVERY`] steps and after a
//!   compaction;
//! - the context is compacted (`compact.rs`) at the threshold, on `ctl compact`, and on a
//!   context-overflow error (then the call is retried once);
//! - rate limits and transient failures are retried ([`RETRIES`] times; `limitretry` while
//!   waiting, with the countdown in an `info` block);
//! - the session's cost cap is checked before every model call;
//! - `stop` interrupts the model call or the running tool (its 9P read is flushed, so
//!   toolsrv stops the process); tool calls that never got a result are answered as
//!   interrupted, so the history stays well-formed for the next turn.
//!
//! The history the model sees is `history.jsonl` in the state directory: one JSON object per
//! message (`role`, `content`, `tool_calls`, `tool_call_id`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use ollie_p9::wire::om;
use serde_json::Value;

use crate::agent::RETRIES;
use crate::agent::history::{message_of, remember, remember_sync, sync_chat_and_history};
use crate::agent::outcome::Outcome;
use crate::backend::{
    Backend, BackendError, Event, Message, ModelReply, ModelRequest, Role, ToolCall, ToolChoice,
    ToolSpec, select,
};
use crate::config::Config;
use crate::state::store::Sync;
use crate::state::{Agent, AgentState, Registry};
use crate::util::lock;

/// The longest wait a `Retry-After` may impose.
const MAX_RETRY_WAIT: u64 = 300;
/// The plan is shown to the model again every this many steps.
pub const PLAN_EVERY: u32 = 8;
/// Rounds in a row with every tool call failing before the model is nudged…
pub const NUDGE_AFTER: u32 = 3;
/// …and before the turn is aborted.
pub const ABORT_AFTER: u32 = 5;
/// Times per turn the model is told that it wrote a tool call as text.
const TEXT_CALL_NUDGES: u32 = 2;

/// How long the worker waits before trying again to record the start of a turn that the
/// state directory refused (full, read-only).
const TAKE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// The system prompt when the profile has none.
const DEFAULT_SYSTEM: &str = "You are a coding agent. You work in the directory given below, through the tools you are offered; every command runs in a sandbox. Inspect before you change things, keep changes small, and say briefly what you did when you are done.";

/// Starts the worker of `a` (it ends when the agent is killed). `spawned`: the agent was
/// just created, so its `agent_spawn` hooks run before its first prompt.
pub fn start_worker(a: Arc<Agent>, reg: Arc<Registry>, spawned: bool) {
    tokio::spawn(async move {
        if spawned {
            spawn_hooks(&reg, &a).await;
        }
        // Whether the last attempt to start a turn could not be recorded (said once).
        let mut refused = false;
        while reg.next_prompt(&a).await {
            // A compaction by `ctl compact` finishes first (it holds the history).
            let history = a.history_lock.lock().await;
            let prompt = match reg.take_prompt(&a) {
                Ok(Some(p)) => p,
                Ok(None) => continue,
                Err(e) => {
                    if !std::mem::replace(&mut refused, true) {
                        tracing::warn!(agent = %a.id, error = %e, "cannot record the start of the next turn; it waits, retried every second");
                    }
                    drop(history);
                    tokio::time::sleep(TAKE_RETRY).await;
                    continue;
                }
            };
            let config = reg.config();
            let tools = Prefetch::start(&a, &config);
            if std::mem::replace(&mut refused, false) {
                tracing::info!(agent = %a.id, "the next turn could be recorded again: it starts");
            }
            reg.state_changed(&a, AgentState::Running);
            let result = run_turn(&reg, &a, &config, tools, &prompt).await;
            if let Err(e) = &result {
                if let Err(w) = a.say("error", "", e) {
                    tracing::warn!(agent = %a.id, error = %w, "cannot record the turn's error");
                }
                if e != STOPPED {
                    turn_error_hooks(&reg, &a, &prompt, e).await;
                }
            }
            drop(history);
            let failed = matches!(&result, Err(e) if e != STOPPED);
            {
                let mut st = lock(&a.stats);
                st.turns += 1;
                if result.is_err() {
                    st.errors += 1;
                }
            }
            reg.turn_ended(&a, result);
            reg.finish_turn(&a);
            if a.is_killed() {
                break;
            }
            reg.state_changed(&a, resting(&a, failed));
        }
    });
}

/// The turn's result when `stop` ended it.
const STOPPED: &str = "stopped";

/// The state an agent rests in between turns.
fn resting(a: &Agent, failed: bool) -> AgentState {
    if a.session.upgrade().is_none_or(|s| s.paused()) {
        AgentState::Paused
    } else if failed {
        AgentState::Error
    } else {
        AgentState::Idle
    }
}

/// Runs a new agent's `agent_spawn` hooks (holding its history): what they print starts
/// the history; a block is kept on the agent, and every turn of it fails with the reason.
async fn spawn_hooks(reg: &Arc<Registry>, a: &Arc<Agent>) {
    let config = reg.config();
    if crate::agent::hooks::configured(a, &config, "agent_spawn").is_none() {
        return;
    }
    let _history = a.history_lock.lock().await;
    reg.state_changed(a, AgentState::Running);
    let fired =
        crate::agent::hooks::fire(reg, a, &config, crate::agent::hooks::Event::AgentSpawn).await;
    let mut r = Ok(());
    if let Some(ctx) = &fired.context {
        r = remember(reg, a, &Message::user(ctx.as_str()));
    }
    if let Some(why) = &fired.blocked {
        r = r.and(a.block(why));
    }
    if let Err(e) = r {
        tracing::warn!(agent = %a.id, error = %e, "cannot record the agent_spawn hooks");
    }
    if !a.is_killed() {
        reg.state_changed(a, resting(a, fired.blocked.is_some()));
    }
}

/// Runs the `turn_error` hooks of a turn that failed: what they print (or the reason of one
/// exiting 2) goes into the history for the next turn.
async fn turn_error_hooks(reg: &Arc<Registry>, a: &Arc<Agent>, prompt: &str, error: &str) {
    let config = reg.config();
    let fired = crate::agent::hooks::fire(
        reg,
        a,
        &config,
        crate::agent::hooks::Event::TurnError { prompt, error },
    )
    .await;
    for n in fired.notes("turn_error") {
        if let Err(e) = remember(reg, a, &Message::user(n)) {
            tracing::warn!(agent = %a.id, error = %e, "cannot record the turn_error hooks");
        }
    }
}

/// The backend name an agent uses: its own, its profile's, its session's, the default.
pub fn backend_name(a: &Agent, config: &Config) -> Option<String> {
    a.settings()
        .backend
        .or_else(|| a.profile(config).and_then(|p| p.backend.clone()))
        .or_else(|| a.session.upgrade().and_then(|x| x.backend.clone()))
        .or_else(|| config.default_backend.clone())
}

/// The agent's backend (made on first use, and again when its name changes) with its
/// configuration entry.
async fn backend_for(
    a: &Agent,
    config: &Config,
) -> Result<(Arc<dyn Backend>, crate::config::Backend), String> {
    let (name, cfg) = select::resolve(backend_name(a, config), config).await?;
    let mut cur = a.backend.lock().await;
    if let Some((n, b)) = cur.as_ref()
        && *n == name
    {
        return Ok((Arc::clone(b), cfg));
    }
    let b = select::make(&name, &cfg)?;
    *cur = Some((name, Arc::clone(&b)));
    Ok((b, cfg))
}

/// The model an agent uses: its own, its profile's, its session's, its backend's.
pub fn model_name(a: &Agent, config: &Config, backend: &crate::config::Backend) -> Option<String> {
    a.settings()
        .model
        .or_else(|| a.profile(config).and_then(|p| p.model.clone()))
        .or_else(|| a.session.upgrade().and_then(|s| s.model.clone()))
        .or_else(|| backend.model.clone())
}

/// The system prompt as the model sees it (`ctl systemprompt`).
pub fn system_prompt(a: &Agent, config: &Config) -> String {
    let (profile, cwd) = (a.profile(config), a.settings().cwd);
    // A remote session's workspace is on its toolsrv's host: not read from here.
    let local = a.session.upgrade().is_some_and(|s| s.remote.is_none());
    format!(
        "{}{}\n\nWorking directory: {}{}{}",
        profile
            .and_then(|p| p.system_prompt.clone())
            .unwrap_or_else(|| DEFAULT_SYSTEM.to_owned()),
        super::sandbox::section(profile, &config.policies, &cwd).unwrap_or_default(),
        cwd.display(),
        crate::skills::prompt_section(&crate::skills::scan(config)),
        if local {
            super::instructions::section(&cwd)
        } else {
            String::new()
        }
    )
}

/// The tool schemas toolsrv offers this agent.
async fn tool_specs(a: &Agent, config: &Config) -> Result<Vec<ToolSpec>, String> {
    let s = a.session.upgrade().ok_or("the session was killed")?;
    let c = s.link.conn(Duration::from_secs(10)).await?;
    let root = c.agent_root(&a.tools_spec(), config).await?;
    let mut f = root
        .walk(&["tools"])
        .await
        .map_err(|e| format!("toolsrv: {e}"))?;
    f.open(om::ORDWR)
        .await
        .map_err(|e| format!("toolsrv: {e}"))?;
    f.write(0, Bytes::from(format!("{} json", a.id)))
        .await
        .map_err(|e| format!("toolsrv: {e}"))?;
    let b = f.read_to_end().await.map_err(|e| format!("toolsrv: {e}"))?;
    let v: Value = serde_json::from_slice(&b).map_err(|e| format!("toolsrv tools: {e}"))?;
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| {
                    Some(ToolSpec {
                        name: t.get("name")?.as_str()?.to_owned(),
                        description: t
                            .get("description")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                        parameters: t.get("parameters").cloned().unwrap_or(Value::Null),
                    })
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The agent's tool list, asked of toolsrv in the background as a turn starts, so that it
/// arrives while the prompt is made durable; dropped unused (a blocked or stopped turn), the
/// question is given up.
struct Prefetch(tokio::task::JoinHandle<Result<Vec<ToolSpec>, String>>);

/// How often a turn asks toolsrv for its tool list before the turn fails, and the pause before
/// the second question (it grows with each one). Each question waits up to 10 s for the link.
const PREFETCH_TRIES: u32 = 4;
const PREFETCH_PAUSE: Duration = Duration::from_millis(200);

impl Prefetch {
    fn start(a: &Arc<Agent>, config: &Arc<Config>) -> Prefetch {
        let (a, config) = (Arc::clone(a), Arc::clone(config));
        Prefetch(tokio::spawn(async move {
            // Asked again after a failure (the list is only read): a toolsrv that died while
            // it was asked is waited for as it restarts, rather than failing the whole turn.
            // The pause lets the link see the death first, so the next question does not go to
            // the dead connection again.
            let (ra, rc) = (&a, &config);
            ask_again(
                PREFETCH_TRIES,
                PREFETCH_PAUSE,
                || ra.is_killed(),
                || tool_specs(ra, rc),
            )
            .await
        }))
    }

    async fn get(mut self) -> Result<Vec<ToolSpec>, String> {
        (&mut self.0)
            .await
            .map_err(|e| format!("the tool list could not be had: {e}"))?
    }
}

/// Asks `ask` until it answers, at most `tries` times, pausing `pause` times the number of
/// questions so far after each failure; stops at the first failure once `stop` holds. The last
/// failure is the answer.
async fn ask_again<T, Fut>(
    tries: u32,
    pause: Duration,
    stop: impl Fn() -> bool,
    mut ask: impl FnMut() -> Fut,
) -> Result<T, String>
where
    Fut: Future<Output = Result<T, String>>,
{
    let mut asked = 1;
    loop {
        match ask().await {
            Ok(v) => return Ok(v),
            Err(e) if asked >= tries || stop() => return Err(e),
            Err(_) => {
                tokio::time::sleep(pause * asked).await;
                asked += 1;
            }
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Whether a call asks to run in the background.
fn background(call: &ToolCall) -> bool {
    call.arguments.get("background").and_then(Value::as_bool) == Some(true)
}

/// Runs one tool call in toolsrv as the agent, between its `pre_tool` and `post_tool`
/// hooks: a `pre_tool` block answers the call with the reason instead of running it, a
/// `post_tool` block adds the reason to the result and fails it, and what the hooks print
/// follows the result.
async fn run_tool(
    reg: &Arc<Registry>,
    a: &Arc<Agent>,
    call: &ToolCall,
    config: &Config,
) -> Outcome {
    use crate::agent::hooks::{Event, fire};
    let pre = fire(
        reg,
        a,
        config,
        Event::PreTool {
            tool: &call.name,
            call_id: &call.id,
            arguments: &call.arguments,
        },
    )
    .await;
    if let Some(why) = pre.blocked {
        return Outcome {
            text: format!("blocked by pre_tool hook: {why}"),
            ok: false,
            attrs: "hook=blocked".to_owned(),
        };
    }
    let mut o = match run_tool_inner(reg, a, call, config).await {
        Ok(o) => o,
        Err(e) => Outcome::error(e),
    };
    let post = fire(
        reg,
        a,
        config,
        Event::PostTool {
            tool: &call.name,
            call_id: &call.id,
            arguments: &call.arguments,
            result: &o.text,
            ok: o.ok,
        },
    )
    .await;
    let blocked = post
        .blocked
        .map(|why| format!("blocked by post_tool hook: {why}"));
    for more in [pre.context, post.context, blocked.clone()]
        .into_iter()
        .flatten()
    {
        if !o.text.is_empty() && !o.text.ends_with('\n') {
            o.text.push('\n');
        }
        o.text.push_str(&more);
        o.text.push('\n');
    }
    if blocked.is_some() {
        o.ok = false;
    }
    o
}

async fn run_tool_inner(
    reg: &Arc<Registry>,
    a: &Arc<Agent>,
    call: &ToolCall,
    config: &Config,
) -> Result<Outcome, String> {
    // File tools on the agent's bead namespace are served here, through the union (off the
    // async workers: it is filesystem work).
    let served =
        if matches!(call.name.as_str(), "file_read" | "file_write") && !a.ns_points().is_empty() {
            let (me, name, args) = (Arc::clone(a), call.name.clone(), call.arguments.clone());
            tokio::task::spawn_blocking(move || crate::agent::nstools::file_tool(&me, &name, &args))
                .await
                .unwrap_or_else(|e| Some(Err(format!("the namespace thread failed: {e}"))))
        } else {
            None
        };
    if let Some(r) = served {
        return Ok(match r {
            Ok(text) => Outcome {
                text,
                ok: true,
                attrs: "namespace=1".to_owned(),
            },
            Err(e) => Outcome::error(e),
        });
    }
    // Skill files no policy can grant (inside a secret location), and every skill file when
    // the tools run on another host, are read here, if the agent has file_read at all.
    let has_tool = |t: &str| {
        a.settings()
            .tools
            .or_else(|| a.profile(config).map(|p| p.tools.clone()))
            .is_some_and(|l| l.iter().any(|x| x == t))
    };
    let remote = a.session.upgrade().is_some_and(|s| s.remote.is_some());
    if has_tool(&call.name)
        && let Some(r) = crate::skills::file_read(config, &call.name, &call.arguments, remote)
    {
        return Ok(match r {
            Ok(text) => Outcome {
                text,
                ok: true,
                attrs: "skill=1".to_owned(),
            },
            Err(e) => Outcome::error(e),
        });
    }
    let s = a.session.upgrade().ok_or("the session was killed")?;
    let c = s.link.conn(Duration::from_secs(10)).await?;
    let root = c.agent_root(&a.tools_spec(), config).await?;
    // A remote toolsrv cannot mount the bead layers: they are directories on this host.
    if s.remote.is_none() {
        send_unions(a, &c).await?;
    }
    let bg = background(call);
    if bg {
        watch_completions(reg, a);
    }
    let mut args = call.arguments.clone();
    if let Some(o) = args.as_object_mut() {
        o.remove("background");
    }
    let mut payload = format!(
        "tool={}\nargs={}\ncwd={}\n",
        call.name,
        args,
        ollie_link::escape_value(&a.settings().cwd.display().to_string())
    );
    if !bg {
        payload.push_str("record=1\n");
    }
    let b = crate::link::proc_call(&root, if bg { "new.bg" } else { "new" }, payload).await?;
    let reply = String::from_utf8_lossy(&b).into_owned();
    if !bg && a.ns.unions_sent.load(std::sync::atomic::Ordering::SeqCst) {
        // What the command created under /ctx/notes/… reaches the create target now.
        let me = Arc::clone(a);
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || me.ns_settle()).await {
            tracing::warn!(agent = %a.id, error = %e, "cannot settle the agent's namespace");
        }
    }
    if bg {
        let pid = reply.trim();
        return Ok(Outcome {
            text: format!(
                "started in the background as process {pid}; its output arrives as a <system-proc-complete> message when it ends"
            ),
            ok: true,
            attrs: format!("pid={pid} background=true"),
        });
    }
    Ok(super::outcome::of_reply(
        &reply,
        a.profile(config),
        &config.policies,
    ))
}

/// Tells toolsrv the agent's bead namespace as overlay mounts before one of its runs (its
/// commands then see `/ctx` as the file tools do), or that it has none any more; and moves
/// what earlier runs created under the kind folders into the create targets.
async fn send_unions(a: &Arc<Agent>, c: &crate::link::Conn) -> Result<(), String> {
    use std::sync::atomic::Ordering;
    if a.ns_points().is_empty() && !a.ns.unions_sent.load(Ordering::SeqCst) {
        // No namespace now and none sent: nothing to do (most agents, every call).
        return Ok(());
    }
    let me = Arc::clone(a);
    let overlays = tokio::task::spawn_blocking(move || {
        me.ns_settle()?;
        me.ns_overlays()
    })
    .await
    .map_err(|e| format!("the namespace thread failed: {e}"))?
    .map_err(|e| format!("the agent's namespace: {e}"))?;
    if overlays.is_empty() {
        if a.ns.unions_sent.swap(false, Ordering::SeqCst) {
            c.ctl(&format!("unions {} none", a.id)).await?;
        }
        return Ok(());
    }
    let json = serde_json::to_string(&overlays).map_err(|e| e.to_string())?;
    c.ctl(&format!("unions {} {json}", a.id)).await?;
    a.ns.unions_sent.store(true, Ordering::SeqCst);
    Ok(())
}

/// Why a model call failed.
enum CallError {
    /// The request does not fit the context window.
    Overflow(String),
    Other(String),
}

impl From<String> for CallError {
    fn from(e: String) -> CallError {
        CallError::Other(e)
    }
}

/// The dollars a reply cost: what the backend reported, else the price table's figure.
fn reply_cost(config: &Config, model: Option<&str>, r: &ModelReply) -> f64 {
    if let Some(c) = r.usage.cost_usd {
        return c;
    }
    model.and_then(|m| config.prices.get(m)).map_or(0.0, |p| {
        (r.usage.input_tokens as f64 * p.input_per_mtok
            + r.usage.output_tokens as f64 * p.output_per_mtok)
            / 1e6
    })
}

/// Fails when the session has spent its cost cap.
fn check_cost_cap(a: &Agent, config: &Config) -> Result<(), String> {
    let Some(s) = a.session.upgrade() else {
        return Ok(());
    };
    let Some(cap) = s.cost_cap().or(config.cost_cap_usd) else {
        return Ok(());
    };
    let spent = s.cost_usd();
    if spent >= cap {
        return Err(format!(
            "session cost cap reached: ${spent:.4} spent of ${cap:.2} (raise it with \"cost_cap USD\" on the session's ctl, or cost_cap_usd in config.toml)"
        ));
    }
    Ok(())
}

/// One model call, streamed into the chat, with retries.
async fn call_model(
    reg: &Registry,
    a: &Agent,
    config: &Config,
    backend: &Arc<dyn Backend>,
    req: &ModelRequest,
) -> Result<ModelReply, CallError> {
    let mut attempt = 0;
    loop {
        check_cost_cap(a, config)?;
        reg.detail(a, "thinking");
        let mut failed = None;
        let result = {
            let mut sink = |e: Event| {
                let r = match e {
                    Event::Reasoning(r) => a.stream("reasoning", &r),
                    Event::Text(t) => a.stream("assistant", &t),
                    Event::ToolCall(_) | Event::Usage(_) => Ok(()),
                };
                if let Err(e) = r {
                    failed.get_or_insert(e);
                }
            };
            backend.call(req, &mut sink).await
        };
        a.stream_end()?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        {
            let mut st = lock(&a.stats);
            st.requests += 1;
            if let Ok(r) = &result {
                st.tokens_in += r.usage.input_tokens;
                st.tokens_out += r.usage.output_tokens;
                st.context_tokens = r.usage.input_tokens + r.usage.output_tokens;
                st.cost_usd += reply_cost(config, req.model.as_deref(), r);
            }
        }
        if let Err(e) = &result {
            let name = a.backend.lock().await.as_ref().map(|(n, _)| n.clone());
            tracing::warn!(
                agent = %a.id,
                backend = name.as_deref().unwrap_or("?"),
                attempt,
                error = %e,
                "model call failed"
            );
        }
        match result {
            Ok(r) => return Ok(r),
            Err(e @ (BackendError::RateLimited { .. } | BackendError::Transient(_)))
                if attempt < RETRIES =>
            {
                attempt += 1;
                let wait = match &e {
                    BackendError::RateLimited {
                        retry_after: Some(s),
                    } => Duration::from_secs((*s).min(MAX_RETRY_WAIT)),
                    _ => Duration::from_millis(500 << attempt),
                };
                reg.detail(a, "limitretry");
                a.say(
                    "info",
                    "retry",
                    &format!(
                        "{e}; retrying in {:.1} s ({attempt} of {RETRIES})",
                        wait.as_secs_f64()
                    ),
                )?;
                countdown(a, wait).await?;
            }
            Err(BackendError::ContextOverflow(m)) => return Err(CallError::Overflow(m)),
            Err(e) => return Err(format!("model call failed: {e}").into()),
        }
    }
}

/// Waits `wait`, with a visible countdown in the chat for long waits (one line every
/// 10 s).
async fn countdown(a: &Agent, wait: Duration) -> Result<(), String> {
    const STEP: Duration = Duration::from_secs(10);
    let end = tokio::time::Instant::now() + wait;
    loop {
        let left = end.saturating_duration_since(tokio::time::Instant::now());
        if left <= STEP {
            tokio::time::sleep(left).await;
            return Ok(());
        }
        tokio::time::sleep(STEP).await;
        let left = end.saturating_duration_since(tokio::time::Instant::now());
        if left > Duration::ZERO {
            a.say(
                "info",
                "retry",
                &format!("retrying in {} s", left.as_secs()),
            )?;
        }
    }
}

/// One turn; the caller holds `a.history_lock`.
async fn run_turn(
    reg: &Arc<Registry>,
    a: &Arc<Agent>,
    config: &Arc<Config>,
    tools: Prefetch,
    prompt: &str,
) -> Result<String, String> {
    // The prompt goes into the chat and the history, then both are synced at once.
    a.say_sync("user", "", prompt, Sync::WithNext)?;
    remember_sync(reg, a, &Message::user(prompt), Sync::WithNext)?;
    sync_chat_and_history(reg, a)?;
    if let Some(why) = a.blocked() {
        return Err(format!("blocked by agent_spawn hook: {why}"));
    }
    let mut stop = reg.stop_signal(a);
    stop.borrow_and_update();
    let pending = Arc::new(std::sync::Mutex::new(Vec::<ToolCall>::new()));
    let body = async {
        pre_turn(reg, a, config, prompt).await?;
        let (backend, cfg) = backend_for(a, config).await?;
        let ctx = turn_ctx(a, config, &cfg, tools.get().await?);
        steps(reg, a, config, &backend, ctx, &pending, prompt).await
    };
    let r = tokio::select! {
        r = body => r,
        _ = stop.changed() => {
            a.stream_end()?;
            a.say("info", "", "stopped by ctl stop")?;
            Err(STOPPED.to_owned())
        }
    };
    // Calls the model made that never got a result (stopped while running): answer them,
    // so the next request is well-formed.
    let unanswered = std::mem::take(&mut *lock(&pending));
    for call in unanswered {
        remember(
            reg,
            a,
            &Message {
                role: Role::Tool,
                content: "error: interrupted by ctl stop before the tool finished".to_owned(),
                tool_calls: Vec::new(),
                tool_call_id: Some(call.id),
            },
        )?;
    }
    r
}

/// The `pre_turn` hooks: what they print follows the prompt; a block ends the turn before
/// the model is called (the history keeps the reason, so the model knows next time).
async fn pre_turn(
    reg: &Arc<Registry>,
    a: &Arc<Agent>,
    config: &Config,
    prompt: &str,
) -> Result<(), String> {
    let fired = crate::agent::hooks::fire(
        reg,
        a,
        config,
        crate::agent::hooks::Event::PreTurn { prompt },
    )
    .await;
    if let Some(why) = fired.blocked {
        remember(
            reg,
            a,
            &Message::user(crate::agent::hooks::wrap(
                "pre_turn",
                &format!("The prompt above was blocked by a pre_turn hook and not answered: {why}"),
            )),
        )?;
        return Err(format!("blocked by pre_turn hook: {why}"));
    }
    if let Some(ctx) = fired.context {
        remember(reg, a, &Message::user(ctx))?;
    }
    Ok(())
}

/// Turn settings resolved once per turn.
struct TurnCtx {
    model: Option<String>,
    system: String,
    tools: Vec<ToolSpec>,
    max_steps: u32,
    context_limit: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    max_tokens: Option<u32>,
    /// The backend forces a tool call on a turn's first step (`tool_choice`).
    force_first_tool: bool,
    /// What a forced reply starts with (`tool_prefill`).
    tool_prefill: Option<String>,
}

fn turn_ctx(
    a: &Agent,
    config: &Config,
    cfg: &crate::config::Backend,
    tools: Vec<ToolSpec>,
) -> TurnCtx {
    let settings = a.settings();
    let p = a.profile(config);
    let parse_f = |k: &str| settings.cfg.get(k).and_then(|v| v.parse::<f64>().ok());
    TurnCtx {
        model: model_name(a, config, cfg),
        system: system_prompt(a, config),
        tools,
        max_steps: settings
            .cfg
            .get("max_steps")
            .and_then(|v| v.parse().ok())
            .or(p.map(|p| p.max_steps))
            .unwrap_or(50),
        context_limit: settings
            .cfg
            .get("context_limit")
            .and_then(|v| v.parse().ok())
            .or(p.and_then(|p| p.context_limit))
            .or(cfg.context_limit),
        temperature: parse_f("temperature").or(p.and_then(|p| p.temperature)),
        top_p: parse_f("top_p").or(p.and_then(|p| p.top_p)),
        max_tokens: settings
            .cfg
            .get("max_tokens")
            .and_then(|v| v.parse().ok())
            .or(p.and_then(|p| p.max_tokens)),
        force_first_tool: cfg.force_first_tool,
        tool_prefill: cfg.tool_prefill.clone(),
    }
}

/// The tool a text seems to call, if it writes a tool call out instead of making one.
pub fn text_tool_call(text: &str, tools: &[ToolSpec]) -> Option<String> {
    const MARKERS: &[&str] = &[
        "<tool_call>",
        "<function=",
        "<function_calls>",
        "[TOOL_CALLS]",
        "<|tool_call",
        "<tool_use>",
        "<invoke name=",
    ];
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    for t in tools {
        let n = &t.name;
        let named = compact.contains(&format!("\"name\":\"{n}\""))
            || compact.contains(&format!("\"function\":\"{n}\""))
            || compact.contains(&format!("\"tool\":\"{n}\""));
        let with_args = [
            "\"arguments\":",
            "\"parameters\":",
            "\"input\":",
            "\"args\":",
        ]
        .iter()
        .any(|k| compact.contains(k));
        if (named && with_args)
            || compact.contains(&format!("{n}({{"))
            || compact.contains(&format!("<{n}>"))
        {
            return Some(n.clone());
        }
    }
    if MARKERS.iter().any(|m| text.contains(m)) {
        return Some(
            tools
                .iter()
                .find(|t| text.contains(&t.name))
                .map_or_else(|| "a tool".to_owned(), |t| t.name.clone()),
        );
    }
    None
}

/// Groups calls into runs: consecutive read-only calls form one run (they may run in
/// parallel); every other call is a run of its own.
fn runs(calls: &[ToolCall]) -> Vec<&[ToolCall]> {
    let read_only = |c: &ToolCall| {
        !background(c)
            && ollie_link::tools::TOOLS
                .iter()
                .any(|t| t.name == c.name && t.read_only)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < calls.len() {
        let mut j = i + 1;
        if read_only(&calls[i]) {
            while j < calls.len() && read_only(&calls[j]) {
                j += 1;
            }
        }
        out.push(&calls[i..j]);
        i = j;
    }
    out
}

/// The context limit when no `context_limit` is set (agent, profile or backend): what the
/// backend's server says of the model, else [`DEFAULT_CONTEXT_LIMIT`]. `stats` shows it.
async fn learn_context_limit(a: &Agent, backend: &Arc<dyn Backend>, ctx: &mut TurnCtx) {
    if ctx.context_limit.is_none() {
        let learned = match ctx.model.as_deref() {
            Some(m) => backend.context_limit(m).await,
            None => None,
        };
        ctx.context_limit = Some(learned.unwrap_or(DEFAULT_CONTEXT_LIMIT));
    }
    lock(&a.stats).context_limit = ctx.context_limit.unwrap_or(0);
}

/// The context limit assumed for a model whose limit is neither configured nor told by its
/// server, in tokens: the common size of current models' windows.
pub const DEFAULT_CONTEXT_LIMIT: u64 = 128_000;

/// Why the history should be compacted before the next model call, if it should: asked for
/// with `ctl compact`, or the context is near its limit.
fn compaction_due(a: &Agent, config: &Config, ctx: &TurnCtx) -> Option<String> {
    let near_limit = ctx
        .context_limit
        .is_some_and(|l| lock(&a.stats).context_tokens as f64 >= config.compact_at * l as f64);
    if a.compact_requested.swap(false, Ordering::SeqCst) {
        Some("requested with ctl compact".to_owned())
    } else {
        near_limit.then(|| {
            format!(
                "the context reached {:.0}% of its {}-token limit",
                config.compact_at * 100.0,
                ctx.context_limit.unwrap_or(0)
            )
        })
    }
}

/// One model call of a step; an overflowing context is compacted once and the call made
/// again.
async fn model_reply(
    reg: &Arc<Registry>,
    a: &Arc<Agent>,
    config: &Arc<Config>,
    backend: &Arc<dyn Backend>,
    ctx: &mut TurnCtx,
    show_plan: &mut bool,
    force_tool: bool,
) -> Result<ModelReply, String> {
    let mut overflowed = false;
    loop {
        let req = request(reg, a, ctx, std::mem::take(show_plan), force_tool);
        match call_model(reg, a, config, backend, &req).await {
            Ok(r) => return Ok(r),
            Err(CallError::Overflow(m)) if !overflowed => {
                overflowed = true;
                a.say("info", "", &format!("context overflow: {m}"))?;
                // A server that names its window smaller than the limit assumed (configured
                // too large, or not known) is believed for the rest of the turn, so that
                // the compaction fits it.
                if let Some(w) = crate::backend::overflow_window(&m)
                    && ctx.context_limit.is_none_or(|l| w < l)
                {
                    ctx.context_limit = Some(w);
                    lock(&a.stats).context_limit = w;
                }
                run_compaction(reg, a, backend, ctx, "the model's context overflowed")
                    .await
                    .map_err(|e| {
                        format!("model call failed: the context overflows ({m}) and {e}")
                    })?;
                *show_plan = true;
            }
            Err(CallError::Overflow(m)) => {
                return Err(format!(
                    "model call failed: the context still overflows after compaction: {m}"
                ));
            }
            Err(CallError::Other(e)) => return Err(e),
        }
    }
}

/// Runs a reply's tool calls (runs of parallel ones together), records each call and its
/// result, and says whether every one failed.
async fn run_round(
    reg: &Arc<Registry>,
    a: &Arc<Agent>,
    config: &Arc<Config>,
    ctx: &TurnCtx,
    pending: &Arc<std::sync::Mutex<Vec<ToolCall>>>,
    calls: &[ToolCall],
) -> Result<bool, String> {
    *lock(pending) = calls.to_vec();
    let mut all_failed = true;
    for run in runs(calls) {
        for call in run {
            // Its result block follows (also when the call fails or is stopped).
            a.say_sync(
                "tool_call",
                &format!("name={} id={}", call.name, call.id),
                &call.arguments.to_string(),
                Sync::WithNext,
            )?;
        }
        let names: Vec<&str> = run.iter().map(|c| c.name.as_str()).collect();
        // A call asking for more than its sandbox allows may wait for the operator
        // (toolsrv answers at once when it refuses or the grant is already covered).
        if run.iter().any(|c| c.arguments.get("escalate").is_some()) {
            reg.detail(a, "waiting: bypass");
        } else {
            reg.detail(a, &format!("calling: {}", names.join(", ")));
        }
        let outcomes = run_calls(reg, a, config, &ctx.tools, run).await;
        for (call, o) in run.iter().zip(outcomes) {
            lock(&a.stats).tool_calls += 1;
            all_failed &= !o.ok;
            let mut attrs = format!("name={} id={}", call.name, call.id);
            if !o.attrs.is_empty() {
                attrs.push(' ');
                attrs.push_str(&o.attrs);
            }
            // The result goes into the chat and the history, then both are synced at once.
            a.say_sync("tool_result", &attrs, &o.text, Sync::WithNext)?;
            remember_sync(
                reg,
                a,
                &Message {
                    role: Role::Tool,
                    content: o.text,
                    tool_calls: Vec::new(),
                    tool_call_id: Some(call.id.clone()),
                },
                Sync::WithNext,
            )?;
            sync_chat_and_history(reg, a)?;
            lock(pending).retain(|c| c.id != call.id);
        }
    }
    Ok(all_failed)
}

async fn steps(
    reg: &Arc<Registry>,
    a: &Arc<Agent>,
    config: &Arc<Config>,
    backend: &Arc<dyn Backend>,
    mut ctx: TurnCtx,
    pending: &Arc<std::sync::Mutex<Vec<ToolCall>>>,
    prompt: &str,
) -> Result<String, String> {
    learn_context_limit(a, backend, &mut ctx).await;
    let mut failing_rounds = 0;
    let mut text_nudges = 0;
    let mut show_plan = false;
    for step in 0..ctx.max_steps {
        // Compaction before the call: asked for, or the context is near its limit.
        if let Some(why) = compaction_due(a, config, &ctx) {
            // Not fatal here: the call may still fit (an overflow compacts again, or fails).
            match run_compaction(reg, a, backend, &ctx, &why).await {
                Ok(()) => show_plan = true,
                Err(e) => a.say("info", "", &format!("compaction skipped: {e}"))?,
            }
        }
        if step > 0 && step % PLAN_EVERY == 0 {
            show_plan = true;
        }
        // A backend set to force a tool call does so on the first step only, so that the
        // model can still end the turn with text after the results.
        let force_tool = ctx.force_first_tool && step == 0;
        let reply = model_reply(
            reg,
            a,
            config,
            backend,
            &mut ctx,
            &mut show_plan,
            force_tool,
        )
        .await?;
        if reply.truncated {
            a.say(
                "info",
                "truncated",
                &format!(
                    "the reply stopped at the model's token limit{}; it may be incomplete",
                    ctx.max_tokens
                        .map(|n| format!(" (max_tokens {n})"))
                        .unwrap_or_default()
                ),
            )?;
        }
        let assistant = Message {
            role: Role::Assistant,
            content: reply.text.clone(),
            tool_calls: reply.tool_calls.clone(),
            tool_call_id: None,
        };
        // A reply with tool calls is always followed by their results, whose synced appends
        // make it durable too.
        let sync = if reply.tool_calls.is_empty() {
            Sync::Now
        } else {
            Sync::WithNext
        };
        remember_sync(reg, a, &assistant, sync)?;
        if reply.tool_calls.is_empty() {
            if text_nudges < TEXT_CALL_NUDGES
                && let Some(tool) = text_tool_call(&reply.text, &ctx.tools)
            {
                text_nudges += 1;
                let note = format!(
                    "Your reply wrote a call to {tool} as text, so nothing ran. To run a tool, make a structured tool call through the tool interface; do not write the call in your reply."
                );
                a.say("info", "text-tool-call", &note)?;
                remember(reg, a, &Message::user(note))?;
                continue;
            }
            // The post_turn hooks may keep the turn going (exit 2: the reason is the next
            // user message); what they print is there for the next turn.
            let fired = crate::agent::hooks::fire(
                reg,
                a,
                config,
                crate::agent::hooks::Event::PostTurn {
                    prompt,
                    reply: &reply.text,
                },
            )
            .await;
            if let Some(ctx) = fired.context {
                remember(reg, a, &Message::user(ctx))?;
            }
            if let Some(why) = fired.blocked {
                remember(
                    reg,
                    a,
                    &Message::user(crate::agent::hooks::wrap("post_turn", &why)),
                )?;
                continue;
            }
            return Ok(reply.text);
        }
        let all_failed = run_round(reg, a, config, &ctx, pending, &reply.tool_calls).await?;
        failing_rounds = if all_failed { failing_rounds + 1 } else { 0 };
        if failing_rounds >= ABORT_AFTER {
            return Err(format!(
                "aborted: in {ABORT_AFTER} rounds in a row every tool call failed"
            ));
        }
        if failing_rounds == NUDGE_AFTER {
            let note = format!(
                "In your last {NUDGE_AFTER} rounds every tool call failed. Stop and reconsider: read the errors above, check your assumptions (paths, tool arguments, what the sandbox allows), and try a different approach, or explain what is blocking you. After {ABORT_AFTER} such rounds the turn is aborted."
            );
            a.say("info", "nudge", &note)?;
            remember(reg, a, &Message::user(note))?;
        }
    }
    Err(format!(
        "stopped after {} steps (max_steps); the model was still calling tools",
        ctx.max_steps
    ))
}

/// Runs one run of calls: several read-only ones in parallel, else the one call.
async fn run_calls(
    reg: &Arc<Registry>,
    a: &Arc<Agent>,
    config: &Arc<Config>,
    tools: &[ToolSpec],
    run: &[ToolCall],
) -> Vec<Outcome> {
    let known = |c: &ToolCall| tools.iter().any(|t| t.name == c.name);
    let unknown = |c: &ToolCall| {
        Outcome::error(format!(
            "unknown tool {:?} (available: {})",
            c.name,
            tools
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    // The backends wrap arguments that are not a JSON object as {"_raw": text}.
    let malformed = |c: &ToolCall| {
        let raw = c
            .arguments
            .as_object()
            .filter(|o| o.len() == 1)?
            .get("_raw")?;
        let raw = raw.as_str().unwrap_or_default();
        Some(Outcome::error(format!(
            "the arguments of {} are not a JSON object: {}; call it again with an object of its parameters",
            c.name,
            ollie_link::text::clip(&ollie_link::text::one_line(raw), 200)
        )))
    };
    let refused = |c: &ToolCall| {
        if known(c) {
            malformed(c)
        } else {
            Some(unknown(c))
        }
    };
    if run.len() == 1 {
        let c = &run[0];
        return vec![match refused(c) {
            Some(o) => o,
            None => run_tool(reg, a, c, config).await,
        }];
    }
    // Dropping the set (on stop) aborts the tasks, which flushes their reads in toolsrv.
    let mut set = tokio::task::JoinSet::new();
    let mut out: Vec<Option<Outcome>> = vec![None; run.len()];
    for (i, c) in run.iter().enumerate() {
        if let Some(o) = refused(c) {
            out[i] = Some(o);
            continue;
        }
        let (reg, a, config, c) = (
            Arc::clone(reg),
            Arc::clone(a),
            Arc::clone(config),
            c.clone(),
        );
        set.spawn(async move { (i, run_tool(&reg, &a, &c, &config).await) });
    }
    while let Some(r) = set.join_next().await {
        match r {
            Ok((i, o)) => out[i] = Some(o),
            Err(e) => tracing::warn!(error = %e, "a tool task failed"),
        }
    }
    out.into_iter()
        .map(|o| o.unwrap_or_else(|| Outcome::error("the tool call was lost")))
        .collect()
}

/// The request for the next model call (with the plan shown again when `show_plan`, and a
/// tool call required when `force_tool`).
fn request(
    reg: &Registry,
    a: &Agent,
    ctx: &TurnCtx,
    show_plan: bool,
    force_tool: bool,
) -> ModelRequest {
    let (mut messages, problems) = reg
        .store
        .read_history(&a.session_id, &a.id, |v| message_of(&v));
    for p in problems {
        tracing::warn!(agent = %a.id, problem = %p, "history");
    }
    if show_plan {
        let plan = a.plan();
        let plan = String::from_utf8_lossy(&plan);
        if !plan.trim().is_empty() {
            messages.push(Message::user(format!(
                "<plan>\n{}\n</plan>\nThis is your plan (the agent's plan file), shown again as a reminder. Keep to it, or say what changed.",
                plan.trim_end()
            )));
        }
    }
    ModelRequest {
        model: ctx.model.clone(),
        system: Some(ctx.system.clone()),
        messages,
        tools: ctx.tools.clone(),
        temperature: ctx.temperature,
        top_p: ctx.top_p,
        max_tokens: ctx.max_tokens,
        tool_choice: if force_tool {
            ToolChoice::Required
        } else {
            ToolChoice::Auto
        },
        prefill: ctx.tool_prefill.clone().filter(|_| force_tool),
    }
}

async fn run_compaction(
    reg: &Arc<Registry>,
    a: &Arc<Agent>,
    backend: &Arc<dyn Backend>,
    ctx: &TurnCtx,
    why: &str,
) -> Result<(), String> {
    reg.detail(a, "compacting");
    crate::agent::compact::compact(reg, a, backend, ctx.model.clone(), ctx.context_limit, why)
        .await
        .map(|_| ())
}

/// `ctl compact`: compacts now when the agent is idle; during a turn, asks the turn to
/// compact before its next model call.
pub async fn compact_now(reg: &Arc<Registry>, a: &Arc<Agent>) -> Result<String, String> {
    let Ok(guard) = a.history_lock.try_lock() else {
        a.compact_requested.store(true, Ordering::SeqCst);
        return Ok("compaction requested: it runs before the turn's next model call\n".into());
    };
    let config = reg.config();
    let (backend, cfg) = backend_for(a, &config).await?;
    let ctx = turn_ctx(a, &config, &cfg, Vec::new());
    let before = a.state().1;
    reg.state_changed(a, AgentState::Running);
    reg.detail(a, "compacting");
    let r = crate::agent::compact::compact(
        reg,
        a,
        &backend,
        ctx.model,
        ctx.context_limit,
        "requested with ctl compact",
    )
    .await;
    // Back to the state before, while still holding the history: a turn waiting for it
    // sets its own state afterwards.
    reg.state_changed(
        a,
        if before == AgentState::Running {
            AgentState::Idle
        } else {
            before
        },
    );
    drop(guard);
    let c = r?;
    Ok(format!(
        "compacted: {} messages summarized, {} kept\n",
        c.summarized, c.kept
    ))
}

// ---------------------------------------------------------------------------------------
// Background completions

/// Starts (once per agent) the reader of toolsrv's `proc/complete` for `a`: every
/// `<system-proc-complete …>` message goes to the agent, queued as a prompt when it is idle
/// or added to the running turn's history otherwise. It re-attaches after toolsrv restarts
/// and ends with the agent.
pub fn watch_completions(reg: &Arc<Registry>, a: &Arc<Agent>) {
    if a.completions_watched.swap(true, Ordering::SeqCst) {
        return;
    }
    let (reg, a) = (Arc::clone(reg), Arc::clone(a));
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            if a.is_killed() {
                return;
            }
            if let Err(e) = read_completions(&reg, &a).await {
                tracing::debug!(agent = %a.id, error = %e, "proc/complete reader");
            }
            if a.is_killed() {
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    });
}

async fn read_completions(reg: &Arc<Registry>, a: &Arc<Agent>) -> Result<(), String> {
    let s = a.session.upgrade().ok_or("the session was killed")?;
    let c = s.link.conn(Duration::from_secs(30)).await?;
    let config = reg.config();
    let root = c.agent_root(&a.tools_spec(), &config).await?;
    let mut f = root
        .walk(&["proc", "complete"])
        .await
        .map_err(|e| format!("toolsrv: {e}"))?;
    f.open(om::OREAD)
        .await
        .map_err(|e| format!("toolsrv: {e}"))?;
    let mut killed = a.killed_signal();
    let mut buf = String::new();
    loop {
        let b = tokio::select! {
            r = f.read(0, 64 * 1024) => r.map_err(|e| format!("toolsrv: {e}"))?,
            _ = killed.wait_for(|k| *k) => return Ok(()),
        };
        if b.is_empty() {
            return Err("proc/complete ended".into());
        }
        buf.push_str(&String::from_utf8_lossy(&b));
        while let Some(end) = buf.find("</system-proc-complete>\n") {
            let msg: String = buf
                .drain(..end + "</system-proc-complete>\n".len())
                .collect();
            deliver(reg, a, msg.trim_end());
        }
    }
}

/// Hands a completion message to the agent.
fn deliver(reg: &Registry, a: &Agent, msg: &str) {
    let running = a.state().1 == AgentState::Running;
    let r = if running {
        a.say("user", "proc-complete", msg)
            .and_then(|()| remember(reg, a, &Message::user(msg)))
    } else {
        a.enqueue(msg.to_owned())
    };
    if let Err(e) = r {
        tracing::warn!(agent = %a.id, error = %e, "cannot deliver a process completion");
    }
}

/// `generate`: one completion without tools or history (shown without API keys).
pub async fn generate(
    config: &Config,
    prompt: &str,
    backend: Option<&str>,
) -> Result<String, String> {
    let (name, cfg) = select::resolve(backend.map(str::to_owned), config).await?;
    let b = select::make(&name, &cfg)?;
    let req = ModelRequest {
        model: cfg.model.clone(),
        messages: vec![Message::user(prompt)],
        ..ModelRequest::default()
    };
    let reply = b
        .call(&req, &mut |_| {})
        .await
        .map_err(|e| format!("model call failed: {e}"))?;
    Ok(crate::redact::redact(&reply.text).into_owned())
}

#[cfg(test)]
#[path = "turn_tests.rs"]
mod tests;
