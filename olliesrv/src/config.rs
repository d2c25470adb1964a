//! The configuration directory: `config.toml` (the backends and remotes olliesrv knows about),
//! `agents/NAME.toml` (agent profiles) and `policy/NAME.toml` (user policies), all beside the
//! main file.
//!
//! Parsed strictly (unknown keys are errors) from raw serde types into validated ones; every
//! error names the file and the key path and fits on one line, with the text the file chose
//! (keys, file names, what the decoder quotes) display-escaped. The `config` fuzz target
//! (`fuzz/fuzz_targets/config.rs`) drives the parsers through [`fuzzing`].
//!
//! Top-level keys of `config.toml`: `default_backend`, `[backends.NAME]`, `[remotes.NAME]`,
//! `[prices."MODEL"]`, `cost_cap_usd`, `compact_at`, `bypass_timeout_s`, `toolsrv_liveness_s`
//! (how long a session's toolsrv may leave a liveness check unanswered; 0: no check), `beads_dir` (the
//! bead registry of the session and agent namespaces, an absolute path; default
//! `$XDG_DATA_HOME/ollie/beads`, else `~/.local/share/ollie/beads`; see [`crate::state::ns`]), and
//! `operators` (who else attaches as the owner: user names, and `@group` for the members of a
//! group; for a system service that people reach through a shared socket), and `skill_paths`
//! (where skills are found, in order: absolute or `~/` paths; default:
//! `$XDG_DATA_HOME/ollie/skills`, else `~/.local/share/ollie/skills`; see [`crate::skills`]),
//! and `[limits]` (the 9P server's bounds on its clients: `fids_per_connection`,
//! `afids_per_connection`, `requests_per_connection`, `connections`, `connections_per_peer`,
//! `attach_timeout_s`; read at start, [`ollie_p9::server::Limits`]). A `[backends.NAME]` of an
//! HTTP kind also takes `connect_timeout_s`, `first_byte_timeout_s` and `idle_timeout_s`
//! ([`Timeouts`]); an `openai` or `anthropic` one `tool_choice` (`auto`, `required_first`),
//! and an `openai` one forcing calls `tool_prefill` ([`Backend::tool_prefill`]).
//!
//! [`Timeouts`]: crate::config::Timeouts
//! [`Backend::tool_prefill`]: crate::config::Backend::tool_prefill

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Why the configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The path may be a name in `agents/` or `policy/`, shown escaped.
    #[error("cannot read config {}", shown(.path))]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The message is display-escaped: the decoder quotes the file's text in it (an unknown
    /// key, a bad character), and this line reaches a terminal.
    #[error("config {path}: line {line}: {}", ollie_link::bypass::display_escape(.message))]
    Syntax {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// The key is display-escaped: a key is text the file chose, and this line reaches a
    /// terminal.
    #[error("config {path}: {}: {message}", ollie_link::bypass::display_escape(.key))]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
    /// A file a key refers to (e.g. `system_prompt_file`) could not be read. Its name is
    /// shown escaped, as the file chose it.
    #[error("config {path}: {key}: cannot read {}", shown(.file))]
    ReadReferenced {
        path: PathBuf,
        key: String,
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A file name from a config file as an error shows it: display-escaped, so that it stays on
/// the error's line and cannot drive the terminal.
fn shown(file: &Path) -> String {
    ollie_link::bypass::display_escape(&file.display().to_string())
}

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

/// The price of a model, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

/// How long an escalation request waits for the operator by default (10 minutes).
pub const DEFAULT_BYPASS_TIMEOUT_S: u64 = 600;

/// How long a toolsrv may leave a liveness check unanswered by default.
pub const DEFAULT_TOOLSRV_LIVENESS_S: u64 = 10;

/// The default fraction of the context window at which a conversation is compacted.
pub const DEFAULT_COMPACT_AT: f64 = 0.8;

/// A validated remote: the command olliesrv runs (no shell) to reach a `toolsrv --stdio` on
/// another host. `[remotes.NAME]` gives either `command = [ARGV…]` or `host = "H"` (with an
/// optional `toolsrv = "PATH"`, default `toolsrv`), which means [`Remote::ssh_command`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub command: Vec<String>,
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

impl Remote {
    /// The command for `host = "H"`: `ssh` without a terminal, never prompting (olliesrv has
    /// nobody to answer), noticing a dead connection within about 45 s, then the remote
    /// `toolsrv --stdio`.
    pub fn ssh_command(host: &str, toolsrv: &str) -> Vec<String> {
        [
            "ssh",
            "-T",
            "-o",
            "BatchMode=yes",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=3",
            host,
            toolsrv,
            "--stdio",
        ]
        .map(str::to_owned)
        .to_vec()
    }
}

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

/// The whole validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where it was read from (`None`: built-in defaults, no file).
    pub path: Option<PathBuf>,
    pub default_backend: Option<String>,
    pub backends: BTreeMap<String, Backend>,
    pub remotes: BTreeMap<String, Remote>,
    /// Agent profiles by name; always holds `DEFAULT_PROFILE`.
    pub profiles: BTreeMap<String, Profile>,
    /// The TOML text of every available policy by name: the shipped profiles
    /// (`ollie_policy::SHIPPED_PROFILES`) and the user's `policy/NAME.toml`, each validated.
    pub policies: BTreeMap<String, String>,
    /// Prices by model name (`[prices."MODEL"]`), for models whose backend reports no cost.
    pub prices: BTreeMap<String, Price>,
    /// The most a session may spend, in US dollars, unless its `cfg` says otherwise.
    pub cost_cap_usd: Option<f64>,
    /// Compact when the context reaches this fraction of the context limit.
    pub compact_at: f64,
    /// How long an escalation request waits for the operator before it is denied.
    pub bypass_timeout_s: u64,
    /// How long a session's toolsrv may leave a liveness check unanswered before the
    /// session shows it as unresponsive (`toolsrv_liveness_s`; `None`: not checked).
    pub toolsrv_liveness: Option<std::time::Duration>,
    /// The bead registry (`beads_dir`, absolute); `None`: `ollie_beads::Registry::from_env`.
    pub beads_dir: Option<PathBuf>,
    /// Besides the server's own user and root, who attaches as the owner (the operator).
    pub operators: Vec<Operator>,
    /// Where skills are found, in order (`skill_paths`, `~` expanded); `None` until
    /// [`Config::load_dir`] sets the default (`$XDG_DATA_HOME/ollie/skills`); read through
    /// `crate::skills::paths`.
    pub skill_paths: Option<Vec<PathBuf>>,
    /// `[limits]`: the bounds of every listener on its clients; read at start (a reload
    /// keeps the running ones and says so).
    pub limits: ollie_p9::server::Limits,
}

/// An entry of `operators`: a user, or every member of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operator {
    User(String),
    Group(String),
}

impl Operator {
    /// Parses `NAME` or `@GROUP` (names as `useradd` allows them: letters, digits, `_`, `-`,
    /// `.`, not starting with `-`; a trailing `$` for machine accounts).
    pub fn parse(s: &str) -> Result<Operator, String> {
        let (group, name) = match s.strip_prefix('@') {
            Some(g) => (true, g),
            None => (false, s),
        };
        let body = name.strip_suffix('$').unwrap_or(name);
        let ok = !body.is_empty()
            && body.len() <= 64
            && !body.starts_with('-')
            && body
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !ok {
            return Err(format!(
                "{s:?} is not a user name or @group (letters, digits, '_', '-', '.')"
            ));
        }
        Ok(if group {
            Operator::Group(name.to_owned())
        } else {
            Operator::User(name.to_owned())
        })
    }
}

impl Default for Config {
    fn default() -> Config {
        Config::builtin()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    default_backend: Option<String>,
    #[serde(default)]
    backends: BTreeMap<String, RawBackend>,
    #[serde(default)]
    remotes: BTreeMap<String, RawRemote>,
    #[serde(default)]
    prices: BTreeMap<String, RawPrice>,
    cost_cap_usd: Option<f64>,
    compact_at: Option<f64>,
    bypass_timeout_s: Option<i64>,
    toolsrv_liveness_s: Option<i64>,
    beads_dir: Option<PathBuf>,
    #[serde(default)]
    operators: Vec<String>,
    skill_paths: Option<Vec<String>>,
    limits: Option<RawLimits>,
}

/// `[limits]`: the 9P server's bounds on its clients ([`ollie_p9::server::Limits`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    fids_per_connection: Option<i64>,
    afids_per_connection: Option<i64>,
    requests_per_connection: Option<i64>,
    connections: Option<i64>,
    connections_per_peer: Option<i64>,
    attach_timeout_s: Option<i64>,
}

/// The largest count a `[limits]` key takes.
const MAX_LIMIT: i64 = 1 << 20;

impl RawLimits {
    /// The bounds over [`ollie_p9::server::Limits::default`]; errors: (key, message).
    fn resolve(&self) -> Result<ollie_p9::server::Limits, (String, String)> {
        let mut l = ollie_p9::server::Limits::default();
        let count = |key: &str, v: Option<i64>, into: &mut usize| match v {
            None => Ok(()),
            Some(n @ 1..=MAX_LIMIT) => {
                *into = n as usize;
                Ok(())
            }
            Some(n) => Err((
                format!("limits.{key}"),
                format!("{n} is out of range (1..={MAX_LIMIT})"),
            )),
        };
        count(
            "fids_per_connection",
            self.fids_per_connection,
            &mut l.max_fids,
        )?;
        count(
            "afids_per_connection",
            self.afids_per_connection,
            &mut l.max_afids,
        )?;
        count(
            "requests_per_connection",
            self.requests_per_connection,
            &mut l.max_inflight,
        )?;
        count("connections", self.connections, &mut l.max_conns)?;
        count(
            "connections_per_peer",
            self.connections_per_peer,
            &mut l.max_conns_per_peer,
        )?;
        if l.max_afids > l.max_fids {
            return Err((
                "limits.afids_per_connection".into(),
                format!(
                    "{} is more than fids_per_connection ({}): authentication fids are fids",
                    l.max_afids, l.max_fids
                ),
            ));
        }
        match self.attach_timeout_s {
            None => {}
            Some(0) => l.attach_timeout = None,
            Some(n @ 1..=3600) => l.attach_timeout = Some(std::time::Duration::from_secs(n as u64)),
            Some(n) => {
                return Err((
                    "limits.attach_timeout_s".into(),
                    format!("{n} is out of range (seconds, 1..=3600; 0: no deadline)"),
                ));
            }
        }
        Ok(l)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrice {
    input_per_mtok: f64,
    output_per_mtok: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRemote {
    command: Option<Vec<String>>,
    host: Option<String>,
    toolsrv: Option<String>,
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

/// The default config directory: `$XDG_CONFIG_HOME/ollie` (or `~/.config/ollie`).
pub fn default_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".config"),
    };
    Some(base.join("ollie"))
}

/// Where skills are by default: `$XDG_DATA_HOME/ollie/skills`, else
/// `~/.local/share/ollie/skills` (beside the bead registry). Not beside config.toml: that
/// directory holds API keys, so no policy may grant an agent reads there.
fn default_skill_dir() -> Option<PathBuf> {
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(".local/share"))
        })?;
    Some(data.join("ollie/skills"))
}

/// The directory holding `agents/` and `policy/` for a main config file: the file's directory.
pub fn dir_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && s != "."
        && s != ".."
}

/// Names of profile and policy files: 1-64 letters, digits, '.', '_', '-', no leading '.'.
fn valid_file_name(s: &str) -> bool {
    ollie_policy::is_policy_name(s)
}

/// A decoder error as one line: the line number and, when that line is `KEY = …` and the
/// decoder did not name the key itself, the key.
fn syntax_error(text: &str, path: &Path, e: &toml::de::Error) -> ConfigError {
    let mut message = e.message().replace('\n', " ");
    let line = match e.span() {
        Some(s) => {
            let bytes = text.as_bytes();
            let before = &bytes[..s.start.min(bytes.len())];
            let line_start = before
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1);
            let line_text = bytes[line_start..].split(|b| *b == b'\n').next();
            if let Some(key) = line_text
                .and_then(|l| std::str::from_utf8(l).ok())
                .and_then(leading_key)
                && !message.contains(&format!("`{key}`"))
            {
                message = format!("{key}: {message}");
            }
            before.iter().filter(|b| **b == b'\n').count() + 1
        }
        None => 0,
    };
    ConfigError::Syntax {
        path: path.to_owned(),
        line,
        message,
    }
}

/// `KEY` of a `KEY = value` line (bare or dotted keys only).
fn leading_key(line: &str) -> Option<&str> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    let bare = key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    (!key.is_empty() && bare).then_some(key)
}

fn read_error(path: &Path, source: std::io::Error) -> ConfigError {
    ConfigError::Read {
        path: path.to_owned(),
        source,
    }
}

/// `toolsrv_liveness_s`: the default when unset, `None` for 0 (no check).
fn liveness(v: Option<i64>) -> Result<Option<std::time::Duration>, String> {
    match v {
        None => Ok(Some(std::time::Duration::from_secs(
            DEFAULT_TOOLSRV_LIVENESS_S,
        ))),
        Some(0) => Ok(None),
        Some(n @ 1..=3600) => Ok(Some(std::time::Duration::from_secs(n as u64))),
        Some(n) => Err(format!(
            "{n} is out of range (seconds, 1..=3600, or 0 for no check)"
        )),
    }
}

fn invalid_at(path: &Path, key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        path: path.to_owned(),
        key: key.into(),
        message: message.into(),
    }
}

fn list_or_none<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<&str> = names.collect();
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.join(", ")
    }
}

/// The `NAME.toml` files of `dir`, sorted by name, as (NAME, path). A missing directory has
/// none; files not ending in `.toml`, directories and other non-regular files are skipped; a
/// `.toml` file with an invalid NAME is an error.
fn toml_files(dir: &Path, what: &str) -> Result<Vec<(String, PathBuf)>, ConfigError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read_error(dir, e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| read_error(dir, e))?;
        let file_name = entry.file_name();
        let lossy = file_name.to_string_lossy();
        let Some(stem) = lossy.strip_suffix(".toml") else {
            continue;
        };
        let path = entry.path();
        // Follows symlinks: a link to a profile is a profile.
        let meta = std::fs::metadata(&path).map_err(|e| read_error(&path, e))?;
        if !meta.is_file() {
            continue;
        }
        if file_name.to_str().is_none() || !valid_file_name(stem) {
            return Err(invalid_at(
                dir,
                lossy.to_string(),
                format!(
                    "bad {what} name {stem:?}: use 1-64 letters, digits, '.', '_' or '-', \
                     not starting with '.'"
                ),
            ));
        }
        files.push((stem.to_owned(), path));
    }
    files.sort();
    Ok(files)
}

/// How a file a key refers to is read: at most `limit` bytes of it, `Ok(None)` if it is not a
/// regular file. [`Config::load_dir`] reads the file system ([`read_file`]); the fuzz target
/// passes a stand-in ([`fuzzing`]).
type ReadFile = fn(file: &Path, limit: u64) -> std::io::Result<Option<Vec<u8>>>;

/// [`ReadFile`] on the file system (following symlinks).
fn read_file(file: &Path, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    if !std::fs::metadata(file)?.is_file() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    std::fs::File::open(file)?
        .take(limit)
        .read_to_end(&mut bytes)?;
    Ok(Some(bytes))
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
    /// The configuration without any file: no backends or remotes, the built-in `default`
    /// profile and the shipped policies.
    pub fn builtin() -> Config {
        Config {
            path: None,
            default_backend: None,
            backends: BTreeMap::new(),
            remotes: BTreeMap::new(),
            prices: BTreeMap::new(),
            cost_cap_usd: None,
            compact_at: DEFAULT_COMPACT_AT,
            bypass_timeout_s: DEFAULT_BYPASS_TIMEOUT_S,
            toolsrv_liveness: Some(std::time::Duration::from_secs(DEFAULT_TOOLSRV_LIVENESS_S)),
            beads_dir: None,
            operators: Vec::new(),
            skill_paths: None,
            limits: ollie_p9::server::Limits::default(),
            profiles: BTreeMap::from([(DEFAULT_PROFILE.to_owned(), Profile::builtin_default())]),
            policies: ollie_policy::SHIPPED_PROFILES
                .iter()
                .map(|(name, text)| ((*name).to_owned(), (*text).to_owned()))
                .collect(),
        }
    }

    /// Loads `explicit` if given (it must exist), else the default path if it exists, else the
    /// built-in configuration; then the profiles and policies beside the main file (for no file,
    /// in `default_dir`).
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        match explicit {
            Some(p) => Config::load_file(p),
            None => match default_dir() {
                Some(dir) => {
                    let file = dir.join("config.toml");
                    if file.exists() {
                        Config::load_file(&file)
                    } else {
                        Config::builtin().load_dir(&dir)
                    }
                }
                None => Ok(Config::builtin()),
            },
        }
    }

    /// Reads and validates one main file, then the `policy/` and `agents/` directories beside
    /// it (see [`Config::load_dir`]).
    pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| read_error(path, source))?;
        Config::parse(&text, path)?.load_dir(&dir_of(path))
    }

    /// Adds the user policies in `dir/policy/` and the agent profiles in `dir/agents/` (a
    /// missing directory adds nothing). Policies come first: profiles may name them.
    pub fn load_dir(mut self, dir: &Path) -> Result<Config, ConfigError> {
        if self.skill_paths.is_none() {
            self.skill_paths = Some(vec![
                default_skill_dir().unwrap_or_else(|| dir.join("skills")),
            ]);
        }
        for (name, path) in toml_files(&dir.join("policy"), "policy")? {
            let text = std::fs::read_to_string(&path).map_err(|e| read_error(&path, e))?;
            self.policies
                .insert(name.clone(), parse_user_policy(&name, &text, &path)?);
        }
        let agents = dir.join("agents");
        for (name, path) in toml_files(&agents, "profile")? {
            let text = std::fs::read_to_string(&path).map_err(|e| read_error(&path, e))?;
            let profile = self.parse_profile(&name, &text, &path, &agents, read_file)?;
            self.profiles.insert(name, profile);
        }
        Ok(self)
    }

    /// Validates one profile's text against this configuration's backends and policies.
    /// `name` was checked by the caller; `path` is for messages; a relative
    /// `system_prompt_file` is read from `agents_dir`, with `read`.
    fn parse_profile(
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

    /// Validates config text (`path` is for messages). The result has the built-in profile and
    /// the shipped policies; [`Config::load_dir`] adds the user's.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| syntax_error(text, path, &e))?;
        let invalid = |key: String, message: String| ConfigError::Invalid {
            path: path.to_owned(),
            key,
            message,
        };
        let mut backends = BTreeMap::new();
        for (name, b) in raw.backends {
            let b = Backend::parse(&name, b).map_err(|(k, m)| invalid(k, m))?;
            backends.insert(name, b);
        }
        let mut remotes = BTreeMap::new();
        for (name, r) in raw.remotes {
            let r = Remote::parse(&name, r).map_err(|(k, m)| invalid(k, m))?;
            remotes.insert(name, r);
        }
        if let Some(d) = &raw.default_backend
            && !backends.contains_key(d)
        {
            let known: Vec<&str> = backends.keys().map(String::as_str).collect();
            return Err(invalid(
                "default_backend".into(),
                format!(
                    "no backend named {d:?} (defined: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        let mut prices = BTreeMap::new();
        for (model, p) in raw.prices {
            for (k, v) in [
                ("input_per_mtok", p.input_per_mtok),
                ("output_per_mtok", p.output_per_mtok),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(invalid(
                        format!("prices.{model:?}.{k}"),
                        format!("{v} is not a price (dollars per million tokens, >= 0)"),
                    ));
                }
            }
            prices.insert(
                model,
                Price {
                    input_per_mtok: p.input_per_mtok,
                    output_per_mtok: p.output_per_mtok,
                },
            );
        }
        if let Some(c) = raw.cost_cap_usd
            && !(c.is_finite() && c > 0.0)
        {
            return Err(invalid(
                "cost_cap_usd".into(),
                format!("{c} is not a positive amount of dollars"),
            ));
        }
        let compact_at = match raw.compact_at {
            None => DEFAULT_COMPACT_AT,
            Some(f) if (0.1..=1.0).contains(&f) => f,
            Some(f) => {
                return Err(invalid(
                    "compact_at".into(),
                    format!("{f} is out of range (a fraction of the context limit, 0.1..=1.0)"),
                ));
            }
        };
        let bypass_timeout_s = match raw.bypass_timeout_s {
            None => DEFAULT_BYPASS_TIMEOUT_S,
            Some(n @ 1..=86_400) => n as u64,
            Some(n) => {
                return Err(invalid(
                    "bypass_timeout_s".into(),
                    format!("{n} is out of range (seconds, 1..=86400)"),
                ));
            }
        };
        let toolsrv_liveness = liveness(raw.toolsrv_liveness_s)
            .map_err(|m| invalid("toolsrv_liveness_s".into(), m))?;
        if let Some(d) = &raw.beads_dir
            && !d.is_absolute()
        {
            return Err(invalid(
                "beads_dir".into(),
                format!("{:?} must be an absolute path", d.display().to_string()),
            ));
        }
        let skill_paths = match &raw.skill_paths {
            None => None,
            Some(list) => Some(skill_paths(list).map_err(|(k, m)| invalid(k, m))?),
        };
        let limits = match &raw.limits {
            None => ollie_p9::server::Limits::default(),
            Some(l) => l.resolve().map_err(|(k, m)| invalid(k, m))?,
        };
        let mut operators = Vec::new();
        for (i, o) in raw.operators.iter().enumerate() {
            operators.push(Operator::parse(o).map_err(|m| invalid(format!("operators[{i}]"), m))?);
        }
        Ok(Config {
            path: Some(path.to_owned()),
            default_backend: raw.default_backend,
            backends,
            remotes,
            prices,
            cost_cap_usd: raw.cost_cap_usd,
            compact_at,
            bypass_timeout_s,
            toolsrv_liveness,
            beads_dir: raw.beads_dir,
            operators,
            skill_paths,
            limits,
            ..Config::builtin()
        })
    }
}

/// Validates `skill_paths`: each absolute or `~/…` (expanded with `$HOME`), without `.` or
/// `..` elements, each once. Errors: (key, message).
fn skill_paths(list: &[String]) -> Result<Vec<PathBuf>, (String, String)> {
    let mut out: Vec<PathBuf> = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let key = format!("skill_paths[{i}]");
        let p = match s.strip_prefix("~/") {
            Some(rest) => match std::env::var_os("HOME") {
                Some(h) if !h.is_empty() => PathBuf::from(h).join(rest),
                _ => return Err((key, format!("{s:?}: ~ needs $HOME, which is not set"))),
            },
            None if s == "~" => {
                return Err((
                    key,
                    "\"~\" itself cannot be a skill path (name a directory in it)".into(),
                ));
            }
            None => PathBuf::from(s),
        };
        if !p.is_absolute() {
            return Err((
                key,
                format!("{s:?} must be an absolute path or start with ~/"),
            ));
        }
        if p.components().any(|c| {
            matches!(
                c,
                std::path::Component::CurDir | std::path::Component::ParentDir
            )
        }) || s.contains("/./")
            || s.ends_with("/.")
        {
            return Err((key, format!("{s:?} must not contain . or .. elements")));
        }
        if out.contains(&p) {
            return Err((key, format!("{s:?} is listed twice")));
        }
        out.push(p);
    }
    Ok(out)
}

/// Validates a user policy (`policy/NAME.toml`) and returns its text.
fn parse_user_policy(name: &str, text: &str, path: &Path) -> Result<String, ConfigError> {
    if let Err(why) = ollie_policy::check_user_policy_name(name) {
        return Err(invalid_at(
            path.parent().unwrap_or(path),
            format!("{name}.toml"),
            why,
        ));
    }
    match ollie_policy::Policy::from_toml(text) {
        Ok(_) => Ok(text.to_owned()),
        Err(ollie_policy::PolicyError::Parse { line, message }) => Err(ConfigError::Syntax {
            path: path.to_owned(),
            line,
            message,
        }),
        Err(ollie_policy::PolicyError::Invalid { key, reason }) => {
            Err(invalid_at(path, key, reason))
        }
        Err(e @ ollie_policy::PolicyError::UnknownProfile { .. }) => {
            Err(invalid_at(path, "policy", e.to_string()))
        }
    }
}

impl Backend {
    /// Checks `[backends.NAME]`; an error names the key and what is wrong with it.
    fn parse(name: &str, b: RawBackend) -> Result<Backend, (String, String)> {
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

impl Remote {
    /// Checks `[remotes.NAME]`; an error names the key and what is wrong with it.
    fn parse(name: &str, r: RawRemote) -> Result<Remote, (String, String)> {
        let key = format!("remotes.{name}");
        if !valid_name(name) {
            return Err((
                key,
                "remote names use letters, digits, '-', '_' and '.'".into(),
            ));
        }
        let command = match (r.command, r.host) {
            (Some(_), Some(_)) => {
                return Err((key, "give either command or host, not both".into()));
            }
            (None, None) => {
                return Err((
                    key,
                    "needs command = [\"PROGRAM\", …] or host = \"HOST\"".into(),
                ));
            }
            (Some(c), None) => {
                if r.toolsrv.is_some() {
                    return Err((
                        format!("{key}.toolsrv"),
                        "only with host (put the path in command instead)".into(),
                    ));
                }
                if c.first().is_none_or(String::is_empty) {
                    return Err((
                        format!("{key}.command"),
                        "must name a program to run".into(),
                    ));
                }
                c
            }
            (None, Some(h)) => {
                if h.is_empty()
                    || h.starts_with('-')
                    || h.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    return Err((
                        format!("{key}.host"),
                        "must be an ssh destination (HOST or USER@HOST, no spaces, not starting with '-')".into(),
                    ));
                }
                let t = r.toolsrv.unwrap_or_else(|| "toolsrv".to_owned());
                if t.is_empty() || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err((
                        format!("{key}.toolsrv"),
                        "must be a program path without spaces".into(),
                    ));
                }
                Remote::ssh_command(&h, &t)
            }
        };
        Ok(Remote { command })
    }
}

/// What a profile's `[profiles.NAME.hooks]` may say ([`crate::agent::hooks`] runs them).
pub mod hook_limits {
    /// Every event a profile may hook, in the order they happen in a turn.
    pub const EVENTS: &[&str] = &[
        "agent_spawn",
        "pre_turn",
        "post_turn",
        "pre_tool",
        "post_tool",
        "pre_compact",
        "post_compact",
        "turn_error",
    ];

    /// The policy hooks run under unless the profile says otherwise.
    pub const DEFAULT_POLICY: &str = "readonly";
    /// A command's time bound unless the profile says otherwise, in seconds…
    pub const DEFAULT_TIMEOUT_S: u64 = 10;
    /// …and the most it may say.
    pub const MAX_TIMEOUT_S: u64 = 300;
    /// Commands per event.
    pub const MAX_PER_EVENT: usize = 16;
    /// Bytes per command.
    pub const MAX_COMMAND: usize = 16 * 1024;
}

/// For the `config` fuzz target (`fuzz/fuzz_targets/config.rs`) only, not an API: the parsers
/// of `config.toml`, a user policy and an agent profile on text, as [`Config::load_file`] runs
/// them, without reading any file. Errors are their `Display`.
#[doc(hidden)]
pub mod fuzzing {
    use std::path::Path;

    use super::parse_user_policy;
    pub use super::{Config, Profile, Timeouts};

    /// `config.toml`'s text, parsed as [`Config::parse`] does for `config.toml`.
    pub fn parse_config(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("config.toml")).map_err(|e| e.to_string())
    }

    /// `config` with `policy/user.toml` of `text` added, as [`Config::load_dir`] adds it.
    pub fn add_policy(mut config: Config, text: &str) -> Result<Config, String> {
        let t = parse_user_policy("user", text, Path::new("policy/user.toml"))
            .map_err(|e| e.to_string())?;
        config.policies.insert("user".to_owned(), t);
        Ok(config)
    }

    /// `agents/p.toml` of `text`, validated against `config`. No file is read: a
    /// `system_prompt_file` is `stand_in`.
    pub fn parse_profile(config: &Config, text: &str) -> Result<Profile, String> {
        config
            .parse_profile(
                "p",
                text,
                Path::new("agents/p.toml"),
                Path::new("agents"),
                stand_in,
            )
            .map_err(|e| e.to_string())
    }

    /// What a referenced file holds, by its extension: `.md` its own path, `.big` one byte
    /// more than the limit, `.bin` invalid UTF-8; `.dir` is a directory and anything else
    /// does not exist.
    fn stand_in(file: &Path, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
        let ext = file.extension().and_then(|e| e.to_str());
        Ok(Some(match ext {
            Some("md") => file.as_os_str().as_encoded_bytes().to_vec(),
            Some("big") => vec![b'x'; usize::try_from(limit).unwrap_or(usize::MAX)],
            Some("bin") => vec![0xff, 0xfe],
            Some("dir") => return Ok(None),
            _ => return Err(std::io::ErrorKind::NotFound.into()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(s, Path::new("config.toml"))
    }

    #[test]
    fn skill_paths_are_absolute_or_home_relative_and_default_beside_the_file() {
        let c = parse("skill_paths = [\"/srv/skills\", \"~/my-skills\"]").unwrap();
        let home = PathBuf::from(std::env::var_os("HOME").unwrap());
        assert_eq!(
            c.skill_paths,
            Some(vec![PathBuf::from("/srv/skills"), home.join("my-skills")])
        );
        assert_eq!(parse("skill_paths = []").unwrap().skill_paths, Some(vec![]));
        for (bad, want) in [
            (
                "[\"skills\"]",
                "skill_paths[0]: \"skills\" must be an absolute path or start with ~/",
            ),
            ("[\"/a\", \"~\"]", "skill_paths[1]: "),
            ("[\"/a/../b\"]", "must not contain . or .. elements"),
            ("[\"/a/./b\"]", "must not contain . or .. elements"),
            ("[\"/a\", \"/a\"]", "skill_paths[1]: \"/a\" is listed twice"),
            ("\"/a\"", "skill_paths: invalid type"),
        ] {
            let e = parse(&format!("skill_paths = {bad}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{bad}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        // Unset: the data directory's (not beside config.toml, whose directory holds keys).
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("config.toml"), "").unwrap();
        let c = Config::load_file(&d.path().join("config.toml")).unwrap();
        let want = default_skill_dir().unwrap_or_else(|| d.path().join("skills"));
        assert_eq!(c.skill_paths, Some(vec![want.clone()]));
        assert!(want.ends_with("ollie/skills") && !want.starts_with(d.path()));
        assert_eq!(Config::builtin().skill_paths, None);
    }

    #[test]
    fn operators_are_users_and_groups_and_bad_names_are_refused() {
        let c = parse("operators = [\"alice\", \"@ollie-admin\", \"svc$\"]").unwrap();
        assert_eq!(
            c.operators,
            vec![
                Operator::User("alice".into()),
                Operator::Group("ollie-admin".into()),
                Operator::User("svc$".into()),
            ]
        );
        assert!(parse("").unwrap().operators.is_empty());
        for bad in [
            "\"\"",
            "\"@\"",
            "\"-rf\"",
            "\"a b\"",
            "\"al/ice\"",
            "\"a\\nb\"",
        ] {
            let e = parse(&format!("operators = [\"ok\", {bad}]"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("operators[1]"), "{bad}: {e}");
            assert!(!e.contains('\n'), "{bad}: {e}");
        }
        assert!(parse("operators = \"alice\"").is_err());
    }

    #[test]
    fn money_context_and_approval_settings() {
        let c = parse(
            "cost_cap_usd = 2.5\ncompact_at = 0.5\nbypass_timeout_s = 30\n\n[prices.\"m-1\"]\ninput_per_mtok = 3.0\noutput_per_mtok = 15.0\n\n[backends.x]\nkind = \"anthropic\"\napi_key_file = \"/k/key\"\ncontext_limit = 200000\n",
        )
        .unwrap();
        assert_eq!(c.cost_cap_usd, Some(2.5));
        assert_eq!(c.compact_at, 0.5);
        assert_eq!(c.bypass_timeout_s, 30);
        assert_eq!(
            c.prices["m-1"],
            Price {
                input_per_mtok: 3.0,
                output_per_mtok: 15.0
            }
        );
        assert_eq!(
            c.backends["x"].api_key_file.as_deref(),
            Some(Path::new("/k/key"))
        );
        assert_eq!(c.backends["x"].context_limit, Some(200_000));
        assert_eq!(c.beads_dir, None);
        let b = parse("beads_dir = \"/srv/beads\"").unwrap();
        assert_eq!(b.beads_dir.as_deref(), Some(Path::new("/srv/beads")));
        let d = parse("").unwrap();
        assert_eq!(
            (d.cost_cap_usd, d.compact_at, d.bypass_timeout_s),
            (None, DEFAULT_COMPACT_AT, DEFAULT_BYPASS_TIMEOUT_S)
        );
        assert_eq!(
            parse("toolsrv_liveness_s = 3").unwrap().toolsrv_liveness,
            Some(std::time::Duration::from_secs(3))
        );
        assert_eq!(
            parse("toolsrv_liveness_s = 0").unwrap().toolsrv_liveness,
            None
        );
        assert_eq!(
            d.toolsrv_liveness,
            Some(std::time::Duration::from_secs(DEFAULT_TOOLSRV_LIVENESS_S))
        );
        for (text, want) in [
            (
                "toolsrv_liveness_s = -1",
                "toolsrv_liveness_s: -1 is out of range",
            ),
            (
                "cost_cap_usd = 0.0",
                "cost_cap_usd: 0 is not a positive amount",
            ),
            ("compact_at = 1.5", "compact_at: 1.5 is out of range"),
            (
                "bypass_timeout_s = 0",
                "bypass_timeout_s: 0 is out of range",
            ),
            (
                "[prices.m]\ninput_per_mtok = -1.0\noutput_per_mtok = 1.0",
                "prices.\"m\".input_per_mtok: -1 is not a price",
            ),
            (
                "[prices.m]\ninput_per_mtok = 1.0",
                "missing field `output_per_mtok`",
            ),
            (
                "[backends.x]\nkind = \"openai\"\napi_key_file = \"key\"",
                "backends.x.api_key_file: must be an absolute path",
            ),
            (
                "[backends.x]\nkind = \"openai\"\ncontext_limit = 0",
                "backends.x.context_limit: 0 is out of range",
            ),
            (
                "beads_dir = \"beads\"",
                "beads_dir: \"beads\" must be an absolute path",
            ),
            ("beads_dir = 1", "beads_dir: invalid type"),
            ("beads-dir = \"/x\"", "beads-dir"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn backend_timeouts_default_parse_and_are_refused_where_they_do_nothing() {
        let c = parse(
            "[backends.x]\nkind = \"openai\"\nconnect_timeout_s = 3\nfirst_byte_timeout_s = 600\nidle_timeout_s = 45\n\n[backends.y]\nkind = \"ollama\"\n",
        )
        .unwrap();
        let s = std::time::Duration::from_secs;
        assert_eq!(
            c.backends["x"].timeouts,
            Timeouts {
                connect: s(3),
                first_byte: s(600),
                idle: s(45)
            }
        );
        assert_eq!(
            c.backends["y"].timeouts,
            Timeouts {
                connect: s(10),
                first_byte: s(300),
                idle: s(120)
            }
        );
        for (text, want) in [
            (
                "[backends.x]\nkind = \"openai\"\nidle_timeout_s = 0",
                "backends.x.idle_timeout_s: 0 is out of range (1..=3600)",
            ),
            (
                "[backends.x]\nkind = \"anthropic\"\nconnect_timeout_s = 3601",
                "backends.x.connect_timeout_s: 3601 is out of range (1..=3600)",
            ),
            (
                "[backends.x]\nkind = \"openai\"\nfirst_byte_timeout_s = \"1\"",
                "invalid type",
            ),
            (
                "[backends.r]\nkind = \"replay\"\nfile = \"/t.jsonl\"\nfirst_byte_timeout_s = 5",
                "backends.r.first_byte_timeout_s: only HTTP backends take timeouts",
            ),
            (
                "[backends.x]\nkind = \"openai\"\nread_timeout_s = 5",
                "read_timeout_s",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn tool_choice_and_prefill_parse_and_are_refused_where_they_do_nothing() {
        let c = parse(
            "[backends.l]\nkind = \"openai\"\ntool_choice = \"required_first\"\ntool_prefill = \"<tool_call>\\n\"\n\n[backends.a]\nkind = \"anthropic\"\ntool_choice = \"required_first\"\n\n[backends.o]\nkind = \"openai\"\ntool_choice = \"auto\"\n",
        )
        .unwrap();
        let l = &c.backends["l"];
        assert!(l.force_first_tool);
        assert_eq!(l.tool_prefill.as_deref(), Some("<tool_call>\n"));
        assert!(c.backends["a"].force_first_tool);
        assert!(!c.backends["o"].force_first_tool);
        assert_eq!(c.backends["o"].tool_prefill, None);
        for (text, want) in [
            (
                "[backends.x]\nkind = \"openai\"\ntool_choice = \"required\"",
                "backends.x.tool_choice: unknown value \"required\" (valid: auto, required_first)",
            ),
            (
                "[backends.x]\nkind = \"ollama\"\ntool_choice = \"required_first\"",
                "backends.x.tool_choice: only openai and anthropic backends can force a tool call (this one is ollama)",
            ),
            (
                "[backends.r]\nkind = \"replay\"\nfile = \"/t.jsonl\"\ntool_choice = \"required_first\"",
                "backends.r.tool_choice: only openai and anthropic backends",
            ),
            (
                "[backends.x]\nkind = \"openai\"\ntool_prefill = \"<tool_call>\"",
                "backends.x.tool_prefill: a prefill starts forced tool calls: set tool_choice = \"required_first\"",
            ),
            (
                "[backends.x]\nkind = \"anthropic\"\ntool_choice = \"required_first\"\ntool_prefill = \"{\"",
                "backends.x.tool_prefill: only openai backends take a prefill (this one is anthropic)",
            ),
            (
                "[backends.x]\nkind = \"openai\"\ntool_choice = \"required_first\"\ntool_prefill = \"\"",
                "backends.x.tool_prefill: empty",
            ),
            (
                "[backends.x]\nkind = \"openai\"\ntool_choice = true",
                "invalid type",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn accepts_the_documented_example() {
        let c = parse(
            r#"
default_backend = "local"

[backends.local]
kind = "openai"
base_url = "http://127.0.0.1:8080/v1"
api_key_env = "OPENAI_API_KEY"
model = "some-model"

[backends.demo]
kind = "replay"
file = "/path/to/turns.jsonl"

[remotes.buildbox]
command = ["ssh", "buildbox", "toolsrv", "--stdio"]
"#,
        )
        .unwrap();
        assert_eq!(c.default_backend.as_deref(), Some("local"));
        assert_eq!(c.backends.keys().collect::<Vec<_>>(), ["demo", "local"]);
        assert_eq!(c.backends["demo"].kind, BackendKind::Replay);
        assert_eq!(c.remotes["buildbox"].command[0], "ssh");
    }

    #[test]
    fn remotes_take_a_command_or_a_host() {
        let c = parse(
            "[remotes.a]\nhost = \"me@build\"\n\n[remotes.b]\nhost = \"b\"\ntoolsrv = \"/opt/ollie/toolsrv\"\n\n[remotes.c]\ncommand = [\"/usr/bin/ssh\", \"c\", \"toolsrv\", \"--stdio\"]\n",
        )
        .unwrap();
        assert_eq!(
            c.remotes["a"].command,
            Remote::ssh_command("me@build", "toolsrv")
        );
        let a = &c.remotes["a"].command;
        assert_eq!(a[0], "ssh");
        assert_eq!(&a[a.len() - 3..], ["me@build", "toolsrv", "--stdio"]);
        assert!(a.iter().any(|w| w == "BatchMode=yes"), "{a:?}");
        let b = &c.remotes["b"].command;
        assert_eq!(&b[b.len() - 2..], ["/opt/ollie/toolsrv", "--stdio"]);
        assert_eq!(c.remotes["c"].command[0], "/usr/bin/ssh");
        for (text, want) in [
            ("[remotes.r]\n", "remotes.r: needs command"),
            (
                "[remotes.r]\nhost = \"h\"\ncommand = [\"x\"]",
                "remotes.r: give either command or host",
            ),
            ("[remotes.r]\nhost = \"-oProxyCommand=x\"", "remotes.r.host"),
            ("[remotes.r]\nhost = \"a b\"", "remotes.r.host"),
            ("[remotes.r]\nhost = \"\"", "remotes.r.host"),
            (
                "[remotes.r]\nhost = \"h\"\ntoolsrv = \"\"",
                "remotes.r.toolsrv",
            ),
            (
                "[remotes.r]\ncommand = [\"ssh\"]\ntoolsrv = \"t\"",
                "remotes.r.toolsrv: only with host",
            ),
            ("[remotes.r]\ncommand = [\"\"]", "remotes.r.command"),
            ("[remotes.r]\nhost = \"h\"\nport = 22", "port"),
            ("[remotes.\"a b\"]\nhost = \"h\"", "remote names use"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn errors_name_the_key_and_fit_one_line() {
        let cases = [
            ("colour = 1", "colour"),
            (
                "[backends.x]\nkind = \"gpt\"",
                "backends.x.kind: unknown kind \"gpt\"",
            ),
            ("[backends.x]\nkind = \"replay\"", "backends.x.file"),
            (
                "[backends.x]\nkind = \"openai\"\nbase_url = \"ftp://x\"",
                "backends.x.base_url",
            ),
            ("[backends.x]\nkind = \"openai\"\nextra = 1", "extra"),
            (
                "default_backend = \"nope\"",
                "default_backend: no backend named \"nope\"",
            ),
            ("[remotes.r]\ncommand = []", "remotes.r.command"),
            ("[backends.\"a/b\"]\nkind = \"openai\"", "backends.a/b"),
            ("default_backend = ", "line 1: default_backend: "),
            (
                "\n\n[remotes.r]\ncommand = 1",
                "line 4: command: invalid type",
            ),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    /// A config directory with a config.toml defining backends `local` and `demo`.
    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("config.toml"),
            "[backends.local]\nkind = \"openai\"\n[backends.demo]\nkind = \"replay\"\nfile = \"/t.jsonl\"\n",
        )
        .unwrap();
        for (name, text) in files {
            let p = d.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    fn load(d: &tempfile::TempDir) -> Result<Config, ConfigError> {
        Config::load_file(&d.path().join("config.toml"))
    }

    fn load_err(files: &[(&str, &str)]) -> String {
        let d = dir_with(files);
        let e = load(&d).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        e
    }

    const USER_POLICY: &str = "[network]\nmode = \"off\"\n";

    #[test]
    fn profile_with_every_key() {
        let d = dir_with(&[
            ("agents/prompts/coder.md", "You write code.\n"),
            ("policy/strict.toml", USER_POLICY),
            (
                "agents/coder.toml",
                r#"
backend = "local"
model = "big-model"
system_prompt_file = "prompts/coder.md"
tools = ["file_read", "execute_code"]
policy = "strict"
max_steps = 1000
escalations = ["net", "write"]
temperature = 0.2
max_tokens = 4096
top_p = 1
context_limit = 128000
"#,
            ),
            (
                "agents/inline.toml",
                "system_prompt = \"hi\"\npolicy = \"network\"\ntemperature = 2\n",
            ),
        ]);
        let c = load(&d).unwrap();
        assert_eq!(
            c.profiles.keys().collect::<Vec<_>>(),
            ["coder", "default", "inline"]
        );
        assert_eq!(
            c.profiles["coder"],
            Profile {
                name: "coder".into(),
                backend: Some("local".into()),
                model: Some("big-model".into()),
                system_prompt: Some("You write code.\n".into()),
                tools: vec!["file_read".into(), "execute_code".into()],
                policy: "strict".into(),
                max_steps: 1000,
                escalations: vec!["net".into(), "write".into()],
                temperature: Some(0.2),
                max_tokens: Some(4096),
                top_p: Some(1.0),
                context_limit: Some(128_000),
                hooks: HookSet::default(),
            }
        );
        let inline = &c.profiles["inline"];
        assert_eq!(inline.system_prompt.as_deref(), Some("hi"));
        assert_eq!(inline.policy, "network");
        assert_eq!(inline.temperature, Some(2.0));
        // Unset keys take the defaults.
        assert_eq!(inline.tools, TOOL_NAMES);
        assert_eq!(inline.max_steps, 50);
        assert!(inline.escalations.is_empty() && inline.backend.is_none());
    }

    #[test]
    fn absolute_prompt_file() {
        let other = tempfile::tempdir().unwrap();
        let prompt = other.path().join("p.txt");
        std::fs::write(&prompt, "abs").unwrap();
        let text = format!("system_prompt_file = {:?}\n", prompt.to_str().unwrap());
        let d = dir_with(&[("agents/a.toml", &text)]);
        assert_eq!(
            load(&d).unwrap().profiles["a"].system_prompt.as_deref(),
            Some("abs")
        );
    }

    #[test]
    fn profile_errors_name_the_file_and_key() {
        let cases: &[(&str, &str)] = &[
            ("colour = 1", "unknown field `colour`"),
            (
                "backend = \"nope\"",
                "backend: no backend named \"nope\" in config.toml (defined: demo, local)",
            ),
            ("model = \"\"", "model: must not be empty"),
            (
                "system_prompt = \"a\"\nsystem_prompt_file = \"p.md\"",
                "system_prompt_file: set system_prompt or system_prompt_file, not both",
            ),
            (
                "system_prompt_file = \"missing.md\"",
                "system_prompt_file: cannot read ",
            ),
            (
                "system_prompt_file = \"\"",
                "system_prompt_file: must name a file",
            ),
            ("system_prompt_file = \".\"", "is not a regular file"),
            (
                "tools = [\"file_read\", \"rm_rf\"]",
                "tools[1]: unknown tool \"rm_rf\" (valid: execute_code, execute_tool, execute_pipe, file_read, file_write)",
            ),
            (
                "tools = [\"file_read\", \"file_read\"]",
                "tools[1]: \"file_read\" is listed twice",
            ),
            (
                "policy = \"lax\"",
                "policy: unknown policy \"lax\" (valid: network, readonly, workspace)",
            ),
            (
                "max_steps = 0",
                "max_steps: 0 is out of range (valid: 1 to 1000)",
            ),
            ("max_steps = 1001", "max_steps: 1001 is out of range"),
            (
                "escalations = [\"root\"]",
                "escalations[0]: unknown escalation \"root\" (valid: net, read, write, unsandboxed)",
            ),
            (
                "temperature = 3",
                "temperature: 3 is out of range (valid: 0.0 to 2.0)",
            ),
            ("temperature = nan", "temperature: NaN is out of range"),
            (
                "top_p = -0.1",
                "top_p: -0.1 is out of range (valid: 0.0 to 1.0)",
            ),
            (
                "max_tokens = 0",
                "max_tokens: 0 is out of range (valid: 1 to 1000000)",
            ),
            (
                "context_limit = 10000001",
                "context_limit: 10000001 is out of range",
            ),
            ("\nmax_steps = \"ten\"", "line 2: max_steps: invalid type"),
            ("tools = \"file_read\"", "line 1: tools: invalid type"),
            ("tools = [\n  1,\n]", "line 2: invalid type"),
        ];
        for (text, want) in cases {
            let e = load_err(&[("agents/p.toml", text)]);
            assert!(e.contains("agents/p.toml"), "{text:?}: {e}");
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn hooks_parse_and_errors_name_the_key() {
        let d = dir_with(&[(
            "agents/h.toml",
            "hook_policy = \"workspace\"\nhook_timeout_s = 30\n[hooks]\npre_tool = [\"./check\", \"echo ok\"]\nturn_error = [\"notify\"]\n",
        )]);
        let c = load(&d).unwrap();
        let h = &c.profiles["h"].hooks;
        assert_eq!((h.policy.as_str(), h.timeout_s), ("workspace", 30));
        assert_eq!(h.commands["pre_tool"], ["./check", "echo ok"]);
        assert_eq!(h.commands["turn_error"], ["notify"]);
        assert_eq!(c.profiles["default"].hooks, HookSet::default());
        assert_eq!(HookSet::default().policy, "readonly");
        let many = format!(
            "[hooks]\npost_tool = [{}]",
            vec!["\"x\""; hook_limits::MAX_PER_EVENT + 1].join(", ")
        );
        let long = format!(
            "[hooks]\npre_turn = [\"{}\"]",
            "x".repeat(hook_limits::MAX_COMMAND + 1)
        );
        let cases: &[(&str, &str)] = &[
            (
                "[hooks]\non_save = [\"x\"]",
                "hooks.on_save: unknown event (valid: agent_spawn, pre_turn, post_turn, pre_tool, post_tool, pre_compact, post_compact, turn_error)",
            ),
            (
                "[hooks]\npre_tool = [\" \"]",
                "hooks.pre_tool[0]: empty command",
            ),
            ("[hooks]\npre_tool = \"x\"", "invalid type"),
            (&many, "hooks.post_tool: 17 commands; at most 16"),
            (&long, "hooks.pre_turn[0]: the command is 16385 bytes"),
            (
                "hook_policy = \"lax\"",
                "hook_policy: unknown policy \"lax\" (valid: network, readonly, workspace)",
            ),
            (
                "hook_timeout_s = 0",
                "hook_timeout_s: 0 is out of range (valid: 1 to 300)",
            ),
            (
                "hook_timeout_s = 301",
                "hook_timeout_s: 301 is out of range",
            ),
        ];
        for (text, want) in cases {
            let e = load_err(&[("agents/p.toml", text)]);
            assert!(e.contains("agents/p.toml"), "{text:?}: {e}");
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn prompt_file_must_be_small_utf8() {
        let big = "x".repeat(MAX_PROMPT_FILE_BYTES as usize + 1);
        let e = load_err(&[
            ("agents/big.md", &big),
            ("agents/p.toml", "system_prompt_file = \"big.md\""),
        ]);
        assert!(e.contains("agents/p.toml: system_prompt_file: "), "{e}");
        assert!(e.contains("big.md is larger than 256 KiB"), "{e}");
        let exact = "x".repeat(MAX_PROMPT_FILE_BYTES as usize);
        let d = dir_with(&[
            ("agents/ok.md", &exact),
            ("agents/p.toml", "system_prompt_file = \"ok.md\""),
        ]);
        assert_eq!(load(&d).unwrap().profiles["p"].system_prompt, Some(exact));

        let d = dir_with(&[("agents/p.toml", "system_prompt_file = \"bin.md\"")]);
        std::fs::write(d.path().join("agents/bin.md"), [0xff, 0xfe]).unwrap();
        let e = load(&d).unwrap_err().to_string();
        assert!(e.contains("agents/p.toml: system_prompt_file: "), "{e}");
        assert!(e.contains("bin.md is not utf-8 text"), "{e}");
    }

    #[test]
    fn bad_profile_names_are_errors() {
        for name in [".hidden", "a b", "x".repeat(65).as_str(), ""] {
            let file = format!("agents/{name}.toml");
            let e = load_err(&[(&file, "")]);
            assert!(e.contains(&format!("{name}.toml: bad profile name")), "{e}");
            assert!(e.contains("not starting with '.'"), "{e}");
        }
        let ok = "A-z_0.9".to_owned() + &"x".repeat(57);
        let d = dir_with(&[(&format!("agents/{ok}.toml"), "")]);
        assert!(load(&d).unwrap().profiles.contains_key(&ok));
    }

    #[test]
    fn other_files_and_directories_are_ignored() {
        let d = dir_with(&[
            ("agents/notes.txt", "colour = 1"),
            ("agents/bad name.md", ""),
            ("agents/sub.toml/x.toml", "colour = 1"),
            ("agents/nested/y.toml", "colour = 1"),
            ("agents/.swp", ""),
            ("policy/README", "not toml"),
        ]);
        let c = load(&d).unwrap();
        assert_eq!(c.profiles.keys().collect::<Vec<_>>(), ["default"]);
        assert_eq!(c.policies.len(), ollie_policy::SHIPPED_PROFILES.len());
    }

    #[test]
    fn default_profile_exists_without_files() {
        let want = Profile::builtin_default();
        assert_eq!(want.tools, TOOL_NAMES);
        assert_eq!(want.policy, "workspace");
        assert_eq!(want.max_steps, 50);
        assert!(want.backend.is_none() && want.model.is_none());
        // No agents/ or policy/ directory at all.
        let d = dir_with(&[]);
        let c = load(&d).unwrap();
        assert_eq!(c.profiles.len(), 1);
        assert_eq!(c.profiles[DEFAULT_PROFILE], want);
        // No file at all.
        assert_eq!(Config::builtin().profiles[DEFAULT_PROFILE], want);
        assert_eq!(Config::default(), Config::builtin());
        // Text only.
        assert_eq!(parse("").unwrap().profiles[DEFAULT_PROFILE], want);
    }

    #[test]
    fn default_profile_is_replaceable() {
        let d = dir_with(&[(
            "agents/default.toml",
            "policy = \"readonly\"\nmax_steps = 5",
        )]);
        let c = load(&d).unwrap();
        let p = &c.profiles[DEFAULT_PROFILE];
        assert_eq!((p.policy.as_str(), p.max_steps), ("readonly", 5));
        assert_eq!(p.tools, TOOL_NAMES);
    }

    #[test]
    fn shipped_policies_are_present() {
        let want: BTreeMap<String, String> = ollie_policy::SHIPPED_PROFILES
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect();
        assert_eq!(
            want.keys().collect::<Vec<_>>(),
            ["network", "readonly", "workspace"]
        );
        assert_eq!(Config::builtin().policies, want);
        assert_eq!(parse("").unwrap().policies, want);
        assert_eq!(load(&dir_with(&[])).unwrap().policies, want);
        for text in want.values() {
            ollie_policy::Policy::from_toml(text).unwrap();
        }
    }

    #[test]
    fn user_policy_is_validated_and_kept_as_text() {
        let d = dir_with(&[
            ("policy/strict.toml", USER_POLICY),
            ("agents/a.toml", "policy = \"strict\""),
        ]);
        let c = load(&d).unwrap();
        assert_eq!(c.policies["strict"], USER_POLICY);
        assert_eq!(c.policies.len(), ollie_policy::SHIPPED_PROFILES.len() + 1);
        assert_eq!(c.profiles["a"].policy, "strict");
    }

    #[test]
    fn invalid_user_policy_names_file_and_key() {
        let e = load_err(&[("policy/bad.toml", "[fs]\nwrite = [\"relative\"]\n")]);
        assert!(e.contains("policy/bad.toml: fs.write[0]: "), "{e}");
        let e = load_err(&[("policy/bad.toml", "colour = 1\n")]);
        assert!(
            e.contains("policy/bad.toml: line 1: unknown field `colour`"),
            "{e}"
        );
        let e = load_err(&[("policy/.x.toml", USER_POLICY)]);
        assert!(e.contains(".x.toml: bad policy name"), "{e}");
    }

    #[test]
    fn limits_take_every_key_and_refuse_bad_values() {
        let c = parse(
            "[limits]\nfids_per_connection = 100\nafids_per_connection = 2\nrequests_per_connection = 50\nconnections = 9\nconnections_per_peer = 3\nattach_timeout_s = 0\n",
        )
        .unwrap();
        let l = c.limits;
        assert_eq!(
            (
                l.max_fids,
                l.max_afids,
                l.max_inflight,
                l.max_conns,
                l.max_conns_per_peer
            ),
            (100, 2, 50, 9, 3)
        );
        assert_eq!(l.attach_timeout, None);
        assert_eq!(
            parse("").unwrap().limits,
            ollie_p9::server::Limits::default()
        );
        for (text, want) in [
            (
                "fids_per_connection = 0",
                "limits.fids_per_connection: 0 is out of range",
            ),
            ("connections = -1", "limits.connections: -1 is out of range"),
            (
                "attach_timeout_s = 4000",
                "limits.attach_timeout_s: 4000 is out of range",
            ),
            (
                "fids_per_connection = 4\nafids_per_connection = 8",
                "limits.afids_per_connection: 8 is more than fids_per_connection (4)",
            ),
            ("fids = 1", "unknown field `fids`"),
        ] {
            let e = parse(&format!("[limits]\n{text}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn a_bad_key_is_shown_escaped() {
        let e = parse("[backends.\"x\\u001b]0;title\\u0007\"]\nkind = \"replay\"\n")
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\u{1b}') && !e.contains('\u{7}'), "{e:?}");
        assert!(
            e.contains("backends.x\\u{1B}]0;title\\u{7}: backend names use"),
            "{e}"
        );
    }

    #[test]
    fn text_the_file_chose_is_shown_escaped_in_every_error() {
        // A file name: a prompt file that cannot be read, and one that is not a regular file.
        let e = load_err(&[("agents/p.toml", "system_prompt_file = \"a\\nb\\t.md\"")]);
        assert!(e.contains("system_prompt_file: cannot read "), "{e}");
        assert!(e.contains("a\\u{A}b\\u{9}.md"), "{e}");
        let e = load_err(&[
            ("agents/d\u{1b}[2J/x", ""),
            ("agents/p.toml", "system_prompt_file = \"d\\u001b[2J\""),
        ]);
        assert!(e.contains("d\\u{1B}[2J is not a regular file"), "{e}");
        // A name in agents/ that cannot be read (a dangling link).
        let d = dir_with(&[]);
        std::fs::create_dir(d.path().join("agents")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", d.path().join("agents/a\nb.toml")).unwrap();
        let e = load(&d).unwrap_err().to_string();
        assert!(
            e.starts_with("cannot read config ") && e.ends_with("agents/a\\u{A}b.toml"),
            "{e}"
        );
        // The decoder quoting a key.
        let e = parse("\"x\\u001b]0;t\\u0007\" = 1")
            .unwrap_err()
            .to_string();
        assert!(!e.chars().any(char::is_control), "{e:?}");
        assert!(e.contains("unknown field `x\\u{1B}]0;t\\u{7}`"), "{e}");
    }

    #[test]
    fn user_policy_cannot_use_a_shipped_name() {
        for (name, _) in ollie_policy::SHIPPED_PROFILES {
            let e = load_err(&[(&format!("policy/{name}.toml"), USER_POLICY)]);
            assert!(
                e.contains(&format!(
                    "policy: {name}.toml: \"{name}\" is a shipped policy"
                )),
                "{e}"
            );
            assert!(e.contains("shipped: readonly, workspace, network"), "{e}");
        }
    }

    #[test]
    fn profiles_and_policies_load_without_a_main_file() {
        let d = dir_with(&[
            ("policy/strict.toml", USER_POLICY),
            ("agents/a.toml", "policy = \"strict\""),
        ]);
        let c = Config::builtin().load_dir(d.path()).unwrap();
        assert!(c.path.is_none());
        assert_eq!(c.profiles["a"].policy, "strict");
        // Backends come from config.toml; without one, none are valid.
        std::fs::write(d.path().join("agents/b.toml"), "backend = \"local\"").unwrap();
        let e = Config::builtin()
            .load_dir(d.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("backend: no backend named \"local\" in config.toml (defined: none)"),
            "{e}"
        );
    }

    #[test]
    fn dir_of_a_bare_file_name_is_the_current_directory() {
        assert_eq!(dir_of(Path::new("config.toml")), Path::new("."));
        assert_eq!(
            dir_of(Path::new("/etc/ollie/config.toml")),
            Path::new("/etc/ollie")
        );
    }
}
