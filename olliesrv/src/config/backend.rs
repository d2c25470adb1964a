//! `[backends.NAME]` of `config.toml`: the kinds of LLM backend, a validated backend entry
//! (its HTTP timeouts, its forced tool calls), and the raw serde form it is checked from.

use std::path::PathBuf;

use serde::Deserialize;

use super::valid_name;

/// The kinds of LLM backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    OpenAi,
    Anthropic,
    Ollama,
    Replay,
}

impl BackendKind {
    const NAMES: &'static str = "openai, anthropic, ollama, replay";

    fn parse(s: &str) -> Option<BackendKind> {
        Some(match s {
            "openai" => BackendKind::OpenAi,
            "anthropic" => BackendKind::Anthropic,
            "ollama" => BackendKind::Ollama,
            "replay" => BackendKind::Replay,
            _ => return None,
        })
    }

    /// The name used in config files.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::OpenAi => "openai",
            BackendKind::Anthropic => "anthropic",
            BackendKind::Ollama => "ollama",
            BackendKind::Replay => "replay",
        }
    }
}

/// A validated backend entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub kind: BackendKind,
    pub base_url: Option<String>,
    /// The environment variable holding the API key (keys never live in the config).
    pub api_key_env: Option<String>,
    /// A file holding the API key (absolute; owned by this user, mode 0600 or stricter;
    /// checked when the key is read). `api_key_env` wins when both are set.
    pub api_key_file: Option<PathBuf>,
    pub model: Option<String>,
    /// Replay backends: the JSON-lines file of model turns.
    pub file: Option<PathBuf>,
    /// The context window of this backend's models in tokens (profiles and `cfg` may say
    /// otherwise).
    pub context_limit: Option<u64>,
    /// How long its HTTP requests may wait (HTTP backends only).
    pub timeouts: Timeouts,
    /// `tool_choice = "required_first"`: the first model call of every turn must be a tool
    /// call (later ones are free, so the turn can end). `openai` and `anthropic` kinds.
    pub force_first_tool: bool,
    /// `tool_prefill`: what a forced reply starts with, sent as an unfinished assistant
    /// message (llama-server with a Hermes-style template needs `"<tool_call>\n"`; see
    /// docs/local-model.md). `openai` kind, with `tool_choice = "required_first"`.
    pub tool_prefill: Option<String>,
}

/// How long an HTTP backend's requests may wait, each a `[backends.NAME]` key in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `connect_timeout_s`: for the connection (TCP and TLS) to be made.
    pub connect: std::time::Duration,
    /// `first_byte_timeout_s`: from sending any request to the first byte of the reply's
    /// body, which is when the model starts answering (a long prompt on a slow local model
    /// takes a while).
    pub first_byte: std::time::Duration,
    /// `idle_timeout_s`: the longest silence of a reply once it has begun (a stalled stream).
    pub idle: std::time::Duration,
}

impl Timeouts {
    /// The keys, their defaults and their ranges (seconds).
    pub const KEYS: [(&'static str, u64); 3] = [
        ("connect_timeout_s", 10),
        ("first_byte_timeout_s", 300),
        ("idle_timeout_s", 120),
    ];
    /// The largest value of each key (an hour).
    pub const MAX_S: u64 = 3600;
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        let s = |i: usize| std::time::Duration::from_secs(Timeouts::KEYS[i].1);
        Timeouts {
            connect: s(0),
            first_byte: s(1),
            idle: s(2),
        }
    }
}

/// `tool_choice` and `tool_prefill` of `[backends.NAME]` (`key`): whether the first call of a
/// turn is forced to be a tool call, and what its reply starts with.
fn forced_calls(
    key: &str,
    kind: BackendKind,
    b: &RawBackend,
) -> Result<(bool, Option<String>), (String, String)> {
    let force_first_tool = match b.tool_choice.as_deref() {
        None | Some("auto") => false,
        Some("required_first") => true,
        Some(v) => {
            return Err((
                format!("{key}.tool_choice"),
                format!("unknown value {v:?} (valid: auto, required_first)"),
            ));
        }
    };
    if force_first_tool && !matches!(kind, BackendKind::OpenAi | BackendKind::Anthropic) {
        return Err((
            format!("{key}.tool_choice"),
            format!(
                "only openai and anthropic backends can force a tool call (this one is {})",
                kind.name()
            ),
        ));
    }
    if let Some(p) = &b.tool_prefill {
        let why = if kind != BackendKind::OpenAi {
            Some(format!(
                "only openai backends take a prefill (this one is {})",
                kind.name()
            ))
        } else if !force_first_tool {
            Some("a prefill starts forced tool calls: set tool_choice = \"required_first\"".into())
        } else if p.is_empty() {
            Some("empty (leave the key out for none)".into())
        } else {
            None
        };
        if let Some(why) = why {
            return Err((format!("{key}.tool_prefill"), why));
        }
    }
    Ok((force_first_tool, b.tool_prefill.clone()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackend {
    kind: String,
    base_url: Option<String>,
    api_key_env: Option<String>,
    api_key_file: Option<PathBuf>,
    model: Option<String>,
    file: Option<PathBuf>,
    context_limit: Option<i64>,
    connect_timeout_s: Option<i64>,
    first_byte_timeout_s: Option<i64>,
    idle_timeout_s: Option<i64>,
    tool_choice: Option<String>,
    tool_prefill: Option<String>,
}

impl Backend {
    /// Checks `[backends.NAME]`; an error names the key and what is wrong with it.
    pub(super) fn parse(name: &str, b: RawBackend) -> Result<Backend, (String, String)> {
        let key = format!("backends.{name}");
        if !valid_name(name) {
            return Err((
                key,
                "backend names use letters, digits, '-', '_' and '.'".into(),
            ));
        }
        let kind = BackendKind::parse(&b.kind).ok_or_else(|| {
            (
                format!("{key}.kind"),
                format!("unknown kind {:?} (valid: {})", b.kind, BackendKind::NAMES),
            )
        })?;
        if kind == BackendKind::Replay {
            if b.file.is_none() {
                return Err((
                    format!("{key}.file"),
                    "a replay backend needs the file of turns it replays".into(),
                ));
            }
        } else if b.file.is_some() {
            return Err((
                format!("{key}.file"),
                format!(
                    "only replay backends take a file (this one is {})",
                    kind.name()
                ),
            ));
        }
        if let Some(u) = &b.base_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            return Err((
                format!("{key}.base_url"),
                format!("{u:?} is not an http:// or https:// url"),
            ));
        }
        if let Some(v) = &b.api_key_env
            && (v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        {
            return Err((
                format!("{key}.api_key_env"),
                format!("{v:?} is not an environment variable name"),
            ));
        }
        if let Some(f) = &b.api_key_file
            && !f.is_absolute()
        {
            return Err((
                format!("{key}.api_key_file"),
                "must be an absolute path".into(),
            ));
        }
        let context_limit = match b.context_limit {
            None => None,
            Some(n @ 1..=10_000_000) => Some(n as u64),
            Some(n) => {
                return Err((
                    format!("{key}.context_limit"),
                    format!("{n} is out of range (1..=10000000)"),
                ));
            }
        };
        let mut timeouts = Timeouts::default();
        for ((k, _), (v, slot)) in Timeouts::KEYS.iter().zip([
            (b.connect_timeout_s, &mut timeouts.connect),
            (b.first_byte_timeout_s, &mut timeouts.first_byte),
            (b.idle_timeout_s, &mut timeouts.idle),
        ]) {
            let Some(n) = v else { continue };
            if kind == BackendKind::Replay {
                return Err((
                    format!("{key}.{k}"),
                    "only HTTP backends take timeouts (a replay backend makes no requests)".into(),
                ));
            }
            match u64::try_from(n) {
                Ok(n @ 1..=Timeouts::MAX_S) => *slot = std::time::Duration::from_secs(n),
                _ => {
                    return Err((
                        format!("{key}.{k}"),
                        format!("{n} is out of range (1..={})", Timeouts::MAX_S),
                    ));
                }
            }
        }
        let (force_first_tool, tool_prefill) = forced_calls(&key, kind, &b)?;
        Ok(Backend {
            kind,
            base_url: b.base_url,
            api_key_env: b.api_key_env,
            api_key_file: b.api_key_file,
            model: b.model,
            file: b.file,
            context_limit,
            timeouts,
            force_first_tool,
            tool_prefill,
        })
    }
}
