//! The per-agent worker and the agent loop.
//!
//! The worker takes queued prompts in order (not while the session is paused) and runs a
//! turn for each: the prompt goes into the chat and the history; then, up to `max_steps`
//! times, the model is called with the history and the agent's tool schemas (streamed into
//! the chat: `reasoning` and `assistant` blocks); each tool call it makes runs in the
//! session's toolsrv with the agent's identity (`tool_call` / `tool_result` blocks) and its
//! result goes back to the model; the turn ends when the model answers without tool calls.
//! `stop` interrupts the model call or the running tool (its 9P read is flushed, so toolsrv
//! stops the process). Rate limits and transient failures are retried (at most
//! [`RETRIES`] times, `limitretry` while waiting).
//!
//! The history the model sees is `history.jsonl` in the state directory: one JSON object per
//! message (`role`, `content`, `tool_calls`, `tool_call_id`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ollie_p9::wire::om;
use serde_json::{Value, json};

use crate::backend::{
    Backend, BackendError, Event, Message, ModelReply, ModelRequest, Role, ToolCall, ToolSpec,
};
use crate::config::Config;
use crate::model::{Agent, AgentState, Registry, lock};

/// The error every turn and `generate` give when no backend is configured.
pub const NO_BACKEND: &str = "no backend configured: add [backends.NAME] to config.toml and set default_backend (or backend= on the session or agent)";

/// Retries of a rate-limited or transiently failed model call.
pub const RETRIES: u32 = 3;

/// The system prompt when the profile has none.
const DEFAULT_SYSTEM: &str = "You are a coding agent. You work in the directory given below, through the tools you are offered; every command runs in a sandbox. Inspect before you change things, keep changes small, and say briefly what you did when you are done.";

/// Starts the worker of `a` (it ends when the agent is killed).
pub fn start_worker(a: Arc<Agent>, reg: Arc<Registry>) {
    tokio::spawn(async move {
        while reg.next_prompt(&a).await.is_some() {
            let Some(prompt) = reg.take_prompt(&a) else {
                continue;
            };
            reg.state_changed(&a, AgentState::Running);
            let result = run_turn(&reg, &a, &prompt).await;
            if let Err(e) = &result
                && let Err(w) = a.say("error", "", e)
            {
                tracing::warn!(agent = %a.id, error = %w, "cannot record the turn's error");
            }
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
            let paused = a.session.upgrade().is_none_or(|s| s.paused());
            reg.state_changed(
                &a,
                if paused {
                    AgentState::Paused
                } else {
                    AgentState::Idle
                },
            );
        }
    });
}

/// The backend name an agent uses: its own, its profile's, its session's, the default.
fn backend_name(a: &Agent, config: &Config) -> Option<String> {
    let s = a.settings();
    let profile = s
        .profile
        .as_deref()
        .and_then(|p| config.profiles.get(p))
        .or_else(|| config.profiles.get("default"));
    s.backend
        .or_else(|| profile.and_then(|p| p.backend.clone()))
        .or_else(|| a.session.upgrade().and_then(|x| x.backend.clone()))
        .or_else(|| config.default_backend.clone())
}

/// Creates a backend from the configuration.
pub fn make_backend(name: &str, config: &Config) -> Result<Arc<dyn Backend>, String> {
    use crate::config::BackendKind;
    let cfg = config.backends.get(name).ok_or_else(|| {
        format!(
            "unknown backend {name:?} (configured: {})",
            config
                .backends
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    match cfg.kind {
        BackendKind::Replay => {
            let file = cfg
                .file
                .as_ref()
                .ok_or_else(|| format!("backend {name}: replay needs file = \"…\""))?;
            Ok(Arc::new(crate::backend::replay::Replay::load(name, file)?))
        }
        BackendKind::OpenAi => Ok(Arc::new(crate::backend::openai::OpenAi::new(name, cfg)?)),
        k => Err(format!(
            "backend {name}: kind {} cannot be called yet (replay and openai are implemented)",
            k.name()
        )),
    }
}

async fn backend_for(a: &Agent, config: &Config) -> Result<Arc<dyn Backend>, String> {
    let name = backend_name(a, config).ok_or_else(|| NO_BACKEND.to_owned())?;
    let mut cur = a.backend.lock().await;
    if let Some((n, b)) = cur.as_ref()
        && *n == name
    {
        return Ok(Arc::clone(b));
    }
    let b = make_backend(&name, config)?;
    *cur = Some((name, Arc::clone(&b)));
    Ok(b)
}

fn message_json(m: &Message) -> Value {
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut v = json!({"role": role, "content": m.content});
    if !m.tool_calls.is_empty() {
        v["tool_calls"] = Value::Array(
            m.tool_calls
                .iter()
                .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
                .collect(),
        );
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = Value::from(id.clone());
    }
    v
}

fn message_of(v: &Value) -> Option<Message> {
    let role = match v.get("role")?.as_str()? {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        _ => return None,
    };
    let tool_calls = v
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter_map(|c| {
                    Some(ToolCall {
                        id: c.get("id")?.as_str()?.to_owned(),
                        name: c.get("name")?.as_str()?.to_owned(),
                        arguments: c.get("arguments").cloned().unwrap_or(Value::Null),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Message {
        role,
        content: v
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        tool_calls,
        tool_call_id: v
            .get("tool_call_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

fn remember(reg: &Registry, a: &Agent, m: &Message) -> Result<(), String> {
    reg.store
        .append_history(&a.session_id, &a.id, &message_json(m))
        .map_err(|e| crate::error_chain(&e))
}

/// The tool schemas toolsrv offers this agent.
async fn tool_specs(a: &Agent, config: &Config) -> Result<Vec<ToolSpec>, String> {
    let s = a.session.upgrade().ok_or("the session was killed")?;
    let c = s.link.conn(Duration::from_secs(10)).await?;
    let root = c.agent_root(a, config).await?;
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

/// Runs one tool call in toolsrv as the agent; the result text for the model.
async fn run_tool(a: &Agent, call: &ToolCall, config: &Config) -> Result<String, String> {
    let s = a.session.upgrade().ok_or("the session was killed")?;
    let c = s.link.conn(Duration::from_secs(10)).await?;
    let root = c.agent_root(a, config).await?;
    let mut f = root
        .walk(&["proc", "new"])
        .await
        .map_err(|e| format!("toolsrv: {e}"))?;
    f.open(om::ORDWR)
        .await
        .map_err(|e| format!("toolsrv: {e}"))?;
    let payload = format!(
        "tool={}\nargs={}\ncwd={}\n",
        call.name,
        call.arguments,
        ollie_link::escape_value(&a.settings().cwd.display().to_string())
    );
    f.write(0, Bytes::from(payload))
        .await
        .map_err(|e| e.to_string())?;
    let b = f.read_to_end().await.map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// One model call, streamed into the chat, with retries.
async fn call_model(
    reg: &Registry,
    a: &Agent,
    backend: &Arc<dyn Backend>,
    req: &ModelRequest,
) -> Result<ModelReply, String> {
    let mut attempt = 0;
    loop {
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
            return Err(e);
        }
        {
            let mut st = lock(&a.stats);
            st.requests += 1;
            if let Ok(r) = &result {
                st.tokens_in += r.usage.input_tokens;
                st.tokens_out += r.usage.output_tokens;
                st.context_tokens = r.usage.input_tokens + r.usage.output_tokens;
                if let Some(c) = r.usage.cost_usd {
                    st.cost_usd += c;
                }
            }
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
                    } => Duration::from_secs((*s).min(300)),
                    _ => Duration::from_millis(500 << attempt),
                };
                reg.detail(a, "limitretry");
                a.say(
                    "info",
                    "",
                    &format!(
                        "{e}; retrying in {:.1} s ({attempt} of {RETRIES})",
                        wait.as_secs_f64()
                    ),
                )?;
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(format!("model call failed: {e}")),
        }
    }
}

/// One turn.
async fn run_turn(reg: &Arc<Registry>, a: &Arc<Agent>, prompt: &str) -> Result<String, String> {
    a.say("user", "", prompt)?;
    let user = Message::user(prompt);
    remember(reg, a, &user)?;
    let config = reg.config();
    let backend = backend_for(a, &config).await?;
    let mut stop = reg.stop_signal(a);
    stop.borrow_and_update();
    let stopped = || Err::<String, String>("stopped".to_owned());
    tokio::select! {
        r = steps(reg, a, &config, &backend) => r,
        _ = stop.changed() => {
            a.stream_end()?;
            a.say("info", "", "stopped by ctl stop")?;
            stopped()
        }
    }
}

async fn steps(
    reg: &Arc<Registry>,
    a: &Arc<Agent>,
    config: &Config,
    backend: &Arc<dyn Backend>,
) -> Result<String, String> {
    let settings = a.settings();
    let profile = settings
        .profile
        .as_deref()
        .and_then(|p| config.profiles.get(p))
        .or_else(|| config.profiles.get("default"));
    let max_steps = settings
        .cfg
        .get("max_steps")
        .and_then(|v| v.parse().ok())
        .or(profile.map(|p| p.max_steps))
        .unwrap_or(50);
    let system = format!(
        "{}\n\nWorking directory: {}",
        profile
            .and_then(|p| p.system_prompt.clone())
            .unwrap_or_else(|| DEFAULT_SYSTEM.to_owned()),
        settings.cwd.display()
    );
    let model = settings
        .model
        .clone()
        .or_else(|| profile.and_then(|p| p.model.clone()))
        .or_else(|| a.session.upgrade().and_then(|s| s.model.clone()))
        .or_else(|| {
            backend_name(a, config)
                .and_then(|n| config.backends.get(&n).and_then(|b| b.model.clone()))
        });
    let tools = tool_specs(a, config).await?;
    let parse = |k: &str| settings.cfg.get(k).and_then(|v| v.parse().ok());
    for _ in 0..max_steps {
        let (history, problems) = reg.store.read_history(&a.session_id, &a.id);
        for p in problems {
            tracing::warn!(agent = %a.id, problem = %p, "history");
        }
        let req = ModelRequest {
            model: model.clone(),
            system: Some(system.clone()),
            messages: history.iter().filter_map(message_of).collect(),
            tools: tools.clone(),
            temperature: parse("temperature"),
            top_p: parse("top_p"),
            max_tokens: settings.cfg.get("max_tokens").and_then(|v| v.parse().ok()),
        };
        let reply = call_model(reg, a, backend, &req).await?;
        let assistant = Message {
            role: Role::Assistant,
            content: reply.text.clone(),
            tool_calls: reply.tool_calls.clone(),
            tool_call_id: None,
        };
        remember(reg, a, &assistant)?;
        if reply.tool_calls.is_empty() {
            return Ok(reply.text);
        }
        for call in &reply.tool_calls {
            reg.detail(a, &format!("calling: {}", call.name));
            a.say(
                "tool_call",
                &format!("name={} id={}", call.name, call.id),
                &call.arguments.to_string(),
            )?;
            let result = match run_tool(a, call, config).await {
                Ok(r) => r,
                Err(e) => format!("error: {e}"),
            };
            lock(&a.stats).tool_calls += 1;
            a.say(
                "tool_result",
                &format!("name={} id={}", call.name, call.id),
                &result,
            )?;
            remember(
                reg,
                a,
                &Message {
                    role: Role::Tool,
                    content: result,
                    tool_calls: Vec::new(),
                    tool_call_id: Some(call.id.clone()),
                },
            )?;
        }
    }
    Err(format!(
        "stopped after {max_steps} steps (max_steps); the model was still calling tools"
    ))
}

/// `generate`: one completion without tools or history, with the default backend.
pub async fn generate(
    config: &Config,
    prompt: &str,
    backend: Option<&str>,
) -> Result<String, String> {
    let name = backend
        .map(str::to_owned)
        .or_else(|| config.default_backend.clone())
        .ok_or_else(|| NO_BACKEND.to_owned())?;
    let b = make_backend(&name, config)?;
    let req = ModelRequest {
        model: config.backends.get(&name).and_then(|c| c.model.clone()),
        messages: vec![Message::user(prompt)],
        ..ModelRequest::default()
    };
    let reply = b
        .call(&req, &mut |_| {})
        .await
        .map_err(|e| format!("model call failed: {e}"))?;
    Ok(reply.text)
}
