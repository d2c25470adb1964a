//! Agent profiles (`agents/NAME.toml`): the validated [`Profile`] and its [`HookSet`], the
//! tools and escalation kinds a profile may name, and the parsing of one against a
//! [`Config`]'s backends and policies, with the range checks only it uses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{
    Config, ConfigError, ReadFile, hook_limits, invalid_at, list_or_none, shown, syntax_error,
};

/// The tools a profile may enable (toolsrv's tool names; olliesrv does not depend on toolsrv,
/// so they are listed here).
pub const TOOL_NAMES: &[&str] = &[
    "execute_code",
    "execute_tool",
    "execute_pipe",
    "file_read",
    "file_write",
];

/// The escalation kinds a profile may ask for (the names `ollie_policy` uses for
/// `EscalationKind` in policy files).
pub const ESCALATION_NAMES: &[&str] = &["net", "read", "write", "unsandboxed"];

/// The name of the profile that always exists (`agents/default.toml` replaces it).
pub const DEFAULT_PROFILE: &str = "default";

/// The largest `system_prompt_file` accepted.
pub const MAX_PROMPT_FILE_BYTES: u64 = 256 * 1024;

const DEFAULT_MAX_STEPS: u32 = 50;

/// A validated agent profile (`agents/NAME.toml`).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// The file stem.
    pub name: String,
    /// A backend in `config.toml` (`None`: the session's or the config's default).
    pub backend: Option<String>,
    /// The model (`None`: the backend's).
    pub model: Option<String>,
    /// The system prompt, read from `system_prompt_file` at load time if that was used.
    pub system_prompt: Option<String>,
    /// Enabled tools, from `TOOL_NAMES` (default: all of them).
    pub tools: Vec<String>,
    /// A key of [`Config::policies`] (default: `ollie_policy::DEFAULT_PROFILE`).
    pub policy: String,
    /// The most model turns per prompt (1..=1000, default 50).
    pub max_steps: u32,
    /// Escalation kinds the agent may ask for, from `ESCALATION_NAMES` (default: none).
    pub escalations: Vec<String>,
    /// Sampling temperature (0.0..=2.0).
    pub temperature: Option<f64>,
    /// Most tokens per model reply (1..=1_000_000).
    pub max_tokens: Option<u32>,
    /// Nucleus sampling (0.0..=1.0).
    pub top_p: Option<f64>,
    /// The context window in tokens (1..=10_000_000).
    pub context_limit: Option<u64>,
    /// Lifecycle hooks (`[hooks]`, `hook_policy`, `hook_timeout_s`).
    pub hooks: HookSet,
}

/// A profile's lifecycle hooks ([`crate::agent::hooks`]): commands by event, and the policy and time
/// bound they run under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookSet {
    /// Event name (from [`hook_limits::EVENTS`]) → bash commands, run in order.
    pub commands: BTreeMap<String, Vec<String>>,
    /// A key of [`Config::policies`] (default `readonly`).
    pub policy: String,
    /// Each command's time bound in seconds (1..=300, default 10).
    pub timeout_s: u64,
}

impl Default for HookSet {
    fn default() -> HookSet {
        HookSet {
            commands: BTreeMap::new(),
            policy: hook_limits::DEFAULT_POLICY.to_owned(),
            timeout_s: hook_limits::DEFAULT_TIMEOUT_S,
        }
    }
}

impl Profile {
    /// The built-in `default` profile: all tools, the default policy, the session's or the
    /// config's backend and model, 50 steps.
    pub fn builtin_default() -> Profile {
        Profile {
            name: DEFAULT_PROFILE.to_owned(),
            backend: None,
            model: None,
            system_prompt: None,
            tools: TOOL_NAMES.iter().map(|t| (*t).to_owned()).collect(),
            policy: ollie_policy::DEFAULT_PROFILE.to_owned(),
            max_steps: DEFAULT_MAX_STEPS,
            escalations: Vec::new(),
            temperature: None,
            max_tokens: None,
            top_p: None,
            context_limit: None,
            hooks: HookSet::default(),
        }
    }
}

/// Integers are read wide so range errors carry our message and the key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    backend: Option<String>,
    model: Option<String>,
    system_prompt: Option<String>,
    system_prompt_file: Option<PathBuf>,
    tools: Option<Vec<String>>,
    policy: Option<String>,
    max_steps: Option<i64>,
    escalations: Option<Vec<String>>,
    temperature: Option<f64>,
    max_tokens: Option<i64>,
    top_p: Option<f64>,
    context_limit: Option<i64>,
    hooks: Option<BTreeMap<String, Vec<String>>>,
    hook_policy: Option<String>,
    hook_timeout_s: Option<i64>,
}

/// Reads a referenced text file: a regular file, UTF-8, at most [`MAX_PROMPT_FILE_BYTES`].
fn read_prompt_file(
    profile: &Path,
    key: &str,
    file: &Path,
    read: ReadFile,
) -> Result<String, ConfigError> {
    let unreadable = |source| ConfigError::ReadReferenced {
        path: profile.to_owned(),
        key: key.to_owned(),
        file: file.to_owned(),
        source,
    };
    let Some(bytes) = read(file, MAX_PROMPT_FILE_BYTES + 1).map_err(unreadable)? else {
        return Err(invalid_at(
            profile,
            key,
            format!("{} is not a regular file", shown(file)),
        ));
    };
    if bytes.len() as u64 > MAX_PROMPT_FILE_BYTES {
        return Err(invalid_at(
            profile,
            key,
            format!(
                "{} is larger than {} KiB",
                shown(file),
                MAX_PROMPT_FILE_BYTES / 1024
            ),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|_| invalid_at(profile, key, format!("{} is not utf-8 text", shown(file))))
}

/// Checks that every entry of a list is one of `valid` and appears once.
fn check_names(
    path: &Path,
    key: &str,
    list: &[String],
    valid: &[&str],
    what: &str,
) -> Result<(), ConfigError> {
    for (i, item) in list.iter().enumerate() {
        if !valid.contains(&item.as_str()) {
            return Err(invalid_at(
                path,
                format!("{key}[{i}]"),
                format!("unknown {what} {item:?} (valid: {})", valid.join(", ")),
            ));
        }
        if list[..i].contains(item) {
            return Err(invalid_at(
                path,
                format!("{key}[{i}]"),
                format!("{item:?} is listed twice"),
            ));
        }
    }
    Ok(())
}

fn int_in(
    path: &Path,
    key: &str,
    v: Option<i64>,
    lo: i64,
    hi: i64,
) -> Result<Option<i64>, ConfigError> {
    match v {
        Some(n) if !(lo..=hi).contains(&n) => Err(invalid_at(
            path,
            key,
            format!("{n} is out of range (valid: {lo} to {hi})"),
        )),
        _ => Ok(v),
    }
}

fn float_in(
    path: &Path,
    key: &str,
    v: Option<f64>,
    lo: f64,
    hi: f64,
) -> Result<Option<f64>, ConfigError> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) => Err(invalid_at(
            path,
            key,
            format!("{x} is out of range (valid: {lo:?} to {hi:?})"),
        )),
        _ => Ok(v),
    }
}

impl Config {
    /// Validates one profile's text against this configuration's backends and policies.
    /// `name` was checked by the caller; `path` is for messages; a relative
    /// `system_prompt_file` is read from `agents_dir`, with `read`.
    pub(super) fn parse_profile(
        &self,
        name: &str,
        text: &str,
        path: &Path,
        agents_dir: &Path,
        read: ReadFile,
    ) -> Result<Profile, ConfigError> {
        let raw: RawProfile = toml::from_str(text).map_err(|e| syntax_error(text, path, &e))?;
        if let Some(b) = &raw.backend
            && !self.backends.contains_key(b)
        {
            return Err(invalid_at(
                path,
                "backend",
                format!(
                    "no backend named {b:?} in config.toml (defined: {})",
                    list_or_none(self.backends.keys().map(String::as_str))
                ),
            ));
        }
        if raw.model.as_deref() == Some("") {
            return Err(invalid_at(path, "model", "must not be empty"));
        }
        let system_prompt = match (raw.system_prompt, raw.system_prompt_file) {
            (Some(_), Some(_)) => {
                return Err(invalid_at(
                    path,
                    "system_prompt_file",
                    "set system_prompt or system_prompt_file, not both",
                ));
            }
            (Some(p), None) => Some(p),
            (None, Some(f)) => {
                if f.as_os_str().is_empty() {
                    return Err(invalid_at(path, "system_prompt_file", "must name a file"));
                }
                Some(read_prompt_file(
                    path,
                    "system_prompt_file",
                    &agents_dir.join(f),
                    read,
                )?)
            }
            (None, None) => None,
        };
        let tools = match raw.tools {
            Some(t) => {
                check_names(path, "tools", &t, TOOL_NAMES, "tool")?;
                t
            }
            None => TOOL_NAMES.iter().map(|t| (*t).to_owned()).collect(),
        };
        let policy = raw
            .policy
            .unwrap_or_else(|| ollie_policy::DEFAULT_PROFILE.to_owned());
        if !self.policies.contains_key(&policy) {
            return Err(invalid_at(
                path,
                "policy",
                format!(
                    "unknown policy {policy:?} (valid: {})",
                    list_or_none(self.policies.keys().map(String::as_str))
                ),
            ));
        }
        let escalations = raw.escalations.unwrap_or_default();
        check_names(
            path,
            "escalations",
            &escalations,
            ESCALATION_NAMES,
            "escalation",
        )?;
        let max_steps = int_in(path, "max_steps", raw.max_steps, 1, 1000)?
            .map_or(DEFAULT_MAX_STEPS, |n| n as u32);
        let temperature = float_in(path, "temperature", raw.temperature, 0.0, 2.0)?;
        let max_tokens =
            int_in(path, "max_tokens", raw.max_tokens, 1, 1_000_000)?.map(|n| n as u32);
        let top_p = float_in(path, "top_p", raw.top_p, 0.0, 1.0)?;
        let context_limit =
            int_in(path, "context_limit", raw.context_limit, 1, 10_000_000)?.map(|n| n as u64);
        let hooks = self.parse_hooks(path, raw.hooks, raw.hook_policy, raw.hook_timeout_s)?;
        Ok(Profile {
            name: name.to_owned(),
            backend: raw.backend,
            model: raw.model,
            system_prompt,
            tools,
            policy,
            max_steps,
            escalations,
            temperature,
            max_tokens,
            top_p,
            context_limit,
            hooks,
        })
    }

    /// A profile's `[hooks]`, `hook_policy` and `hook_timeout_s`.
    fn parse_hooks(
        &self,
        path: &Path,
        commands: Option<BTreeMap<String, Vec<String>>>,
        policy: Option<String>,
        timeout_s: Option<i64>,
    ) -> Result<HookSet, ConfigError> {
        use hook_limits::{EVENTS, MAX_COMMAND, MAX_PER_EVENT};
        let commands = commands.unwrap_or_default();
        for (event, list) in &commands {
            if !EVENTS.contains(&event.as_str()) {
                return Err(invalid_at(
                    path,
                    format!("hooks.{event}"),
                    format!("unknown event (valid: {})", EVENTS.join(", ")),
                ));
            }
            if list.len() > MAX_PER_EVENT {
                return Err(invalid_at(
                    path,
                    format!("hooks.{event}"),
                    format!("{} commands; at most {MAX_PER_EVENT}", list.len()),
                ));
            }
            for (i, c) in list.iter().enumerate() {
                let key = format!("hooks.{event}[{i}]");
                if c.trim().is_empty() {
                    return Err(invalid_at(path, key, "empty command"));
                }
                if c.len() > MAX_COMMAND {
                    return Err(invalid_at(
                        path,
                        key,
                        format!("the command is {} bytes; at most {MAX_COMMAND}", c.len()),
                    ));
                }
                if c.contains('\0') {
                    return Err(invalid_at(path, key, "the command contains a NUL byte"));
                }
            }
        }
        let policy = policy.unwrap_or_else(|| hook_limits::DEFAULT_POLICY.to_owned());
        if !self.policies.contains_key(&policy) {
            return Err(invalid_at(
                path,
                "hook_policy",
                format!(
                    "unknown policy {policy:?} (valid: {})",
                    list_or_none(self.policies.keys().map(String::as_str))
                ),
            ));
        }
        let timeout_s = int_in(
            path,
            "hook_timeout_s",
            timeout_s,
            1,
            hook_limits::MAX_TIMEOUT_S as i64,
        )?
        .map_or(hook_limits::DEFAULT_TIMEOUT_S, |n| n as u64);
        Ok(HookSet {
            commands,
            policy,
            timeout_s,
        })
    }
}
