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

mod backend;
mod profile;
mod proxy;
mod remote;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use backend::RawBackend;
use remote::RawRemote;

pub use backend::{Backend, BackendKind, Timeouts};
pub use profile::{DEFAULT_PROFILE, HookSet, Profile};
pub use remote::Remote;

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
    /// `[proxy]`: the operator's settings for the egress proxy of runs under
    /// `network.mode = "proxy"` (addresses it may reach although private, pinned names),
    /// handed to each toolsrv as it starts.
    pub proxy: ollie_link::boot::ProxyBoot,
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
    proxy: Option<proxy::RawProxy>,
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
            proxy: ollie_link::boot::ProxyBoot::default(),
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
        let skill_paths = (raw.skill_paths.as_deref().map(skill_paths).transpose())
            .map_err(|(k, m)| invalid(k, m))?;
        let limits = (raw.limits.as_ref().map(RawLimits::resolve).transpose())
            .map_err(|(k, m)| invalid(k, m))?
            .unwrap_or_default();
        let proxy = (raw.proxy.map(proxy::proxy).transpose())
            .map_err(|(k, m)| invalid(k, m))?
            .unwrap_or_default();
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
            proxy,
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
mod tests;
