//! `config.toml`: the backends and remotes olliesrv knows about.
//!
//! Parsed strictly (unknown keys are errors) from raw serde types into validated ones; every
//! error names the key path and fits on one line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Why the configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: line {line}: {message}")]
    Syntax {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("config {path}: {key}: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
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
    pub model: Option<String>,
    /// Replay backends: the JSON-lines file of model turns.
    pub file: Option<PathBuf>,
}

/// A validated remote (a command that speaks 9P on its stdio, e.g. `ssh host toolsrv --stdio`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub command: Vec<String>,
}

/// The whole validated configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// Where it was read from (`None`: built-in defaults, no file).
    pub path: Option<PathBuf>,
    pub default_backend: Option<String>,
    pub backends: BTreeMap<String, Backend>,
    pub remotes: BTreeMap<String, Remote>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    default_backend: Option<String>,
    #[serde(default)]
    backends: BTreeMap<String, RawBackend>,
    #[serde(default)]
    remotes: BTreeMap<String, RawRemote>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    kind: String,
    base_url: Option<String>,
    api_key_env: Option<String>,
    model: Option<String>,
    file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRemote {
    command: Vec<String>,
}

/// The default config file: `$XDG_CONFIG_HOME/ollie/config.toml` (or `~/.config/...`).
pub fn default_path() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".config"),
    };
    Some(base.join("ollie").join("config.toml"))
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && s != "."
        && s != ".."
}

impl Config {
    /// Loads `explicit` if given (it must exist), else the default path if it exists, else the
    /// empty configuration.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        match explicit {
            Some(p) => Config::load_file(p),
            None => match default_path() {
                Some(p) if p.exists() => Config::load_file(&p),
                _ => Ok(Config::default()),
            },
        }
    }

    /// Reads and validates one file.
    pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, path)
    }

    /// Validates config text (`path` is for messages).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |s| {
                text[..s.start.min(text.len())].lines().count().max(1)
            });
            ConfigError::Syntax {
                path: path.to_owned(),
                line,
                message: e.message().replace('\n', " "),
            }
        })?;
        let invalid = |key: String, message: String| ConfigError::Invalid {
            path: path.to_owned(),
            key,
            message,
        };
        let mut backends = BTreeMap::new();
        for (name, b) in raw.backends {
            let key = format!("backends.{name}");
            if !valid_name(&name) {
                return Err(invalid(
                    key,
                    "backend names use letters, digits, '-', '_' and '.'".into(),
                ));
            }
            let kind = BackendKind::parse(&b.kind).ok_or_else(|| {
                invalid(
                    format!("{key}.kind"),
                    format!("unknown kind {:?} (valid: {})", b.kind, BackendKind::NAMES),
                )
            })?;
            if kind == BackendKind::Replay {
                if b.file.is_none() {
                    return Err(invalid(
                        format!("{key}.file"),
                        "a replay backend needs the file of turns it replays".into(),
                    ));
                }
            } else if b.file.is_some() {
                return Err(invalid(
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
                return Err(invalid(
                    format!("{key}.base_url"),
                    format!("{u:?} is not an http:// or https:// url"),
                ));
            }
            if let Some(v) = &b.api_key_env
                && (v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            {
                return Err(invalid(
                    format!("{key}.api_key_env"),
                    format!("{v:?} is not an environment variable name"),
                ));
            }
            backends.insert(
                name,
                Backend {
                    kind,
                    base_url: b.base_url,
                    api_key_env: b.api_key_env,
                    model: b.model,
                    file: b.file,
                },
            );
        }
        let mut remotes = BTreeMap::new();
        for (name, r) in raw.remotes {
            let key = format!("remotes.{name}");
            if !valid_name(&name) {
                return Err(invalid(
                    key,
                    "remote names use letters, digits, '-', '_' and '.'".into(),
                ));
            }
            if r.command.is_empty() || r.command[0].is_empty() {
                return Err(invalid(
                    format!("{key}.command"),
                    "must name a program to run".into(),
                ));
            }
            remotes.insert(name, Remote { command: r.command });
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
        Ok(Config {
            path: Some(path.to_owned()),
            default_backend: raw.default_backend,
            backends,
            remotes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(s, Path::new("config.toml"))
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
            ("default_backend = ", "line 1"),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
