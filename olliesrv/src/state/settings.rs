//! An agent's settings: the `cfg` keys and how each is checked, the working-directory rules,
//! and the usage counters `stats` shows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::util::clip;

/// The keys of an agent's `cfg` (besides `name`, which has its own file).
pub const CFG_KEYS: &[&str] = &[
    "backend",
    "model",
    "profile",
    "cwd",
    "temperature",
    "max_tokens",
    "top_p",
    "max_steps",
    "context_limit",
    "feed",
    "feed_prompt",
];

/// Where `feed_prompt` puts the feed's value.
pub const FEED_PLACEHOLDER: &str = "{feed}";
/// Longest `feed_prompt`.
pub const MAX_FEED_PROMPT: usize = 4096;

/// Mutable settings of an agent.
#[derive(Debug, Clone, Default)]
pub struct AgentSettings {
    pub cwd: PathBuf,
    pub backend: Option<String>,
    pub model: Option<String>,
    pub profile: Option<String>,
    /// Other cfg keys (`temperature`, `max_tokens`, …), validated.
    pub cfg: BTreeMap<String, String>,
    /// The agent's tool set, if changed from its profile's.
    pub tools: Option<Vec<String>>,
}

/// Token and cost counters (`stats`).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub requests: u64,
    pub cost_usd: f64,
    pub context_tokens: u64,
    pub context_limit: u64,
    pub tool_calls: u64,
    pub turns: u64,
    pub errors: u64,
}

impl Stats {
    pub fn text(&self) -> String {
        format!(
            "tokens_in={}\ntokens_out={}\nrequests={}\ncost_usd={:.6}\ncontext_tokens={}\ncontext_limit={}\ntool_calls={}\nturns={}\nerrors={}\n",
            self.tokens_in,
            self.tokens_out,
            self.requests,
            self.cost_usd,
            self.context_tokens,
            self.context_limit,
            self.tool_calls,
            self.turns,
            self.errors
        )
    }

    pub(crate) fn to_map(&self) -> BTreeMap<String, String> {
        self.text()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    pub(crate) fn from_map(m: &BTreeMap<String, String>) -> Stats {
        let u = |k: &str| m.get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
        Stats {
            tokens_in: u("tokens_in"),
            tokens_out: u("tokens_out"),
            requests: u("requests"),
            cost_usd: m
                .get("cost_usd")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0),
            context_tokens: u("context_tokens"),
            context_limit: u("context_limit"),
            tool_calls: u("tool_calls"),
            turns: u("turns"),
            errors: u("errors"),
        }
    }
}

/// Validates and applies one cfg key.
pub fn apply_setting(
    s: &mut AgentSettings,
    k: &str,
    v: &str,
    config: &Config,
) -> Result<(), String> {
    let opt = |v: &str| (!v.is_empty()).then(|| v.to_owned());
    match k {
        "backend" => {
            if !v.is_empty() && !config.backends.contains_key(v) {
                return Err(format!(
                    "unknown backend {:?} (configured: {})",
                    clip(v),
                    list_or_none(config.backends.keys())
                ));
            }
            s.backend = opt(v);
        }
        "model" => {
            if v.len() > 200 || v.contains(char::is_control) {
                return Err("model: at most 200 printable characters".into());
            }
            s.model = opt(v);
        }
        "profile" => {
            if !v.is_empty() && !config.profiles.contains_key(v) {
                return Err(format!(
                    "unknown profile {:?} (available: {})",
                    clip(v),
                    list_or_none(config.profiles.keys())
                ));
            }
            s.profile = opt(v);
        }
        "cwd" => s.cwd = workspace_dir(v, false)?,
        "temperature" | "top_p" => {
            let max = if k == "temperature" { 2.0 } else { 1.0 };
            if !v.is_empty() {
                let x: f64 = v
                    .parse()
                    .ok()
                    .filter(|x: &f64| (0.0..=max).contains(x))
                    .ok_or_else(|| format!("{k}: {:?} is not a number from 0 to {max}", clip(v)))?;
                s.cfg.insert(k.to_owned(), x.to_string());
            } else {
                s.cfg.remove(k);
            }
        }
        "max_tokens" | "max_steps" | "context_limit" => {
            let max: u64 = match k {
                "max_tokens" => 1_000_000,
                "max_steps" => 1000,
                _ => 10_000_000,
            };
            if !v.is_empty() {
                let x: u64 = v
                    .parse()
                    .ok()
                    .filter(|x| (1..=max).contains(x))
                    .ok_or_else(|| format!("{k}: {:?} is not a number from 1 to {max}", clip(v)))?;
                s.cfg.insert(k.to_owned(), x.to_string());
            } else {
                s.cfg.remove(k);
            }
        }
        "feed" => match v {
            "" | "turn" => {
                s.cfg.remove(k);
            }
            "off" => {
                s.cfg.insert(k.to_owned(), v.to_owned());
            }
            _ => return Err(format!("feed: {:?} is not turn or off", clip(v))),
        },
        "feed_prompt" => {
            if v.is_empty() {
                s.cfg.remove(k);
            } else if !v.contains(FEED_PLACEHOLDER) {
                return Err(format!(
                    "feed_prompt: {:?} has no {FEED_PLACEHOLDER} (where the value goes)",
                    clip(v)
                ));
            } else if v.len() > MAX_FEED_PROMPT || v.contains(char::is_control) {
                return Err(format!(
                    "feed_prompt: at most {MAX_FEED_PROMPT} printable characters (\\n for a newline)"
                ));
            } else {
                s.cfg.insert(k.to_owned(), v.to_owned());
            }
        }
        other => {
            return Err(format!(
                "unknown key {:?} (valid: {})",
                clip(other),
                CFG_KEYS.join(", ")
            ));
        }
    }
    Ok(())
}

pub(crate) fn list_or_none<'a>(it: impl Iterator<Item = &'a String>) -> String {
    let v: Vec<&str> = it.map(String::as_str).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// An existing absolute directory, canonicalised.
pub fn existing_dir(v: &str) -> Result<PathBuf, String> {
    let p = Path::new(v);
    if !p.is_absolute() {
        return Err(format!("cwd {:?} must be an absolute path", clip(v)));
    }
    let c = std::fs::canonicalize(p).map_err(|e| format!("cwd {:?}: {e}", clip(v)))?;
    if !c.is_dir() {
        return Err(format!("cwd {:?} is not a directory", clip(v)));
    }
    Ok(c)
}

// The trees too broad for a workspace are decided on the secrets floor, below this one (its
// set of the server's own directories needs them too).
pub use crate::secrets::too_broad;

/// The home directory of the server's user, canonicalised.
fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME").and_then(|h| std::fs::canonicalize(h).ok())
}

/// A session's or agent's working directory: [`existing_dir`], refused when it touches one of
/// ollie's secret locations ([`crate::secrets::refuse_workspace`], whatever `force` says), and
/// when it is [`too_broad`] unless `force` (`force=yes`).
pub fn workspace_dir(v: &str, force: bool) -> Result<PathBuf, String> {
    let c = existing_dir(v)?;
    let home = home_dir();
    refuse_broad(&c, home.as_deref(), force)?;
    crate::secrets::refuse_workspace(&c, home.as_deref())?;
    Ok(c)
}

/// The error of a [`too_broad`] directory, unless `force`.
pub fn refuse_broad(dir: &Path, home: Option<&Path>, force: bool) -> Result<(), String> {
    match too_broad(dir, home) {
        Some(why) if !force => Err(format!(
            "cwd {} {why}: give a project directory (o new uses the current one), or add force=yes",
            dir.display()
        )),
        _ => Ok(()),
    }
}

/// A remote session's `cwd=`: absolute, without `.` or `..` components (it names a directory
/// on the remote host, so it cannot be checked here; the remote toolsrv refuses a missing one).
pub fn remote_dir(v: &str) -> Result<PathBuf, String> {
    use std::path::Component;
    let p = Path::new(v);
    if !p.is_absolute() {
        return Err(format!(
            "cwd {:?} must be an absolute path (on the remote host)",
            clip(v)
        ));
    }
    if p.components()
        .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
    {
        return Err(format!(
            "cwd {:?}: give the directory without . or .. components",
            clip(v)
        ));
    }
    Ok(p.components().collect())
}
