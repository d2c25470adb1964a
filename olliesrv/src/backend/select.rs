//! Which backend an agent or `generate` uses, and making it.
//!
//! The name comes from the agent's `cfg`, its profile, its session, then `default_backend`
//! in `config.toml`. With none of those, a default is discovered:
//! 1. Ollama, when a server answers at `$OLLAMA_HOST` (default `127.0.0.1:11434`), with the
//!    first model it lists;
//! 2. else the first of `ANTHROPIC_API_KEY`, `OPENAI_API_KEY`, `OPENROUTER_API_KEY` that is
//!    set, with that service's public API and [`DEFAULT_MODELS`];
//! 3. else the call fails with [`no_backend`], which says how to configure one.
//!
//! `OLLIE_MODEL` overrides the model of a discovered backend.

use std::sync::Arc;
use std::time::Duration;

use ollie_link::text::one_line;

use super::Backend;
use crate::config::{Backend as BackendCfg, BackendKind, Config};

/// The error when no backend is configured and none was found: where Ollama was looked
/// for, and the configuration file the server reads (or would read).
pub fn no_backend(config: &Config) -> String {
    let file = config
        .path
        .clone()
        .or_else(|| crate::config::default_dir().map(|d| d.join("config.toml")))
        .map_or_else(|| "config.toml".to_owned(), |p| p.display().to_string());
    let ollama = ollama_url();
    let how = if env("OLLAMA_HOST").is_some() {
        "OLLAMA_HOST"
    } else {
        "or set OLLAMA_HOST"
    };
    format!(
        "no backend: start Ollama on {ollama} ({how}), or set ANTHROPIC_API_KEY, OPENAI_API_KEY or OPENROUTER_API_KEY, or add [backends.NAME] to {file} and set default_backend (then restart olliesrv or write invalidate to ctl)"
    )
}

/// How long the Ollama probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(700);

/// Models used for discovered key-based backends when `OLLIE_MODEL` is not set.
pub const DEFAULT_MODELS: &[(&str, &str)] = &[
    ("anthropic", "claude-sonnet-4-5"),
    ("openai", "gpt-4.1-mini"),
    ("openrouter", "openai/gpt-4.1-mini"),
];

/// The services tried, in order, by key variable: (name, kind, variable, base URL).
const KEYED: &[(&str, BackendKind, &str, Option<&str>)] = &[
    (
        "anthropic",
        BackendKind::Anthropic,
        "ANTHROPIC_API_KEY",
        None,
    ),
    ("openai", BackendKind::OpenAi, "OPENAI_API_KEY", None),
    (
        "openrouter",
        BackendKind::OpenAi,
        "OPENROUTER_API_KEY",
        Some("https://openrouter.ai/api/v1"),
    ),
];

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The Ollama server to probe: `$OLLAMA_HOST` (`host:port`, `host`, or a URL) or the default.
fn ollama_url() -> String {
    // A server told to listen on every address (a common OLLAMA_HOST) is asked on loopback.
    let host = env("OLLAMA_HOST").map(|h| h.replacen("0.0.0.0", "127.0.0.1", 1));
    match host {
        None => super::ollama::DEFAULT_BASE_URL.to_owned(),
        Some(h) if h.starts_with("http://") || h.starts_with("https://") => h,
        Some(h) if h.contains(':') => format!("http://{h}"),
        Some(h) => format!("http://{h}:11434"),
    }
}

/// A backend found without configuration: its name and entry.
pub async fn discover() -> Option<(String, BackendCfg)> {
    let model = env("OLLIE_MODEL");
    let url = ollama_url();
    if super::ollama::probe(&url, PROBE_TIMEOUT).await {
        let mut cfg = entry(BackendKind::Ollama, Some(url), None, model.clone());
        if cfg.model.is_none() {
            let b = super::ollama::Ollama::new("ollama", &cfg).ok()?;
            cfg.model = b.list_models().await.ok()?.into_iter().next();
        }
        if cfg.model.is_some() {
            return Some(("ollama".to_owned(), cfg));
        }
    }
    KEYED.iter().find_map(|(name, kind, var, base)| {
        env(var)?;
        let model = model.clone().or_else(|| {
            DEFAULT_MODELS
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, m)| (*m).to_owned())
        });
        Some((
            (*name).to_owned(),
            entry(
                *kind,
                base.map(str::to_owned),
                Some((*var).to_owned()),
                model,
            ),
        ))
    })
}

fn entry(
    kind: BackendKind,
    base_url: Option<String>,
    api_key_env: Option<String>,
    model: Option<String>,
) -> BackendCfg {
    BackendCfg {
        kind,
        base_url,
        api_key_env,
        api_key_file: None,
        model,
        file: None,
        context_limit: None,
        timeouts: Default::default(),
        force_first_tool: false,
        tool_prefill: None,
    }
}

/// Makes the backend of entry `cfg`, called `name`.
pub fn make(name: &str, cfg: &BackendCfg) -> Result<Arc<dyn Backend>, String> {
    Ok(match cfg.kind {
        BackendKind::Replay => {
            let file = cfg
                .file
                .as_ref()
                .ok_or_else(|| format!("backend {name}: replay needs file = \"…\""))?;
            Arc::new(super::replay::Replay::load(name, file)?)
        }
        BackendKind::OpenAi => Arc::new(super::openai::OpenAi::new(name, cfg)?),
        BackendKind::Anthropic => Arc::new(super::anthropic::Anthropic::new(name, cfg)?),
        BackendKind::Ollama => Arc::new(super::ollama::Ollama::new(name, cfg)?),
    })
}

/// The entry of backend `name`: configured, or (when nothing is configured under that name)
/// the discovered one if it has that name.
pub async fn entry_of(name: &str, config: &Config) -> Result<BackendCfg, String> {
    if let Some(c) = config.backends.get(name) {
        return Ok(c.clone());
    }
    if let Some((n, c)) = discover().await
        && n == name
    {
        return Ok(c);
    }
    Err(format!(
        "unknown backend {name:?} (configured: {})",
        if config.backends.is_empty() {
            "none".to_owned()
        } else {
            config
                .backends
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        }
    ))
}

/// `name` if given, else the configured default, else a discovered backend.
pub async fn resolve(
    name: Option<String>,
    config: &Config,
) -> Result<(String, BackendCfg), String> {
    match name.or_else(|| config.default_backend.clone()) {
        Some(n) => {
            let c = entry_of(&n, config).await?;
            Ok((n, c))
        }
        None => discover().await.ok_or_else(|| no_backend(config)),
    }
}

/// Every backend `backends` and `models` show: the configured ones, and the discovered one
/// when nothing is configured as the default.
pub async fn all(config: &Config) -> Vec<(String, BackendCfg)> {
    let mut out: Vec<(String, BackendCfg)> = config
        .backends
        .iter()
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    if config.default_backend.is_none()
        && let Some((n, c)) = discover().await
        && !config.backends.contains_key(&n)
    {
        out.push((n, c));
    }
    out
}

/// `backend<TAB>model` for every model each backend lists (queried concurrently, each
/// within `timeout` and within the backend's own timeouts, whichever ends first), then
/// `# backend: error` lines for those that could not be asked (the error's own leading
/// backend name is not repeated).
pub async fn models_text(config: &Config, timeout: Duration) -> String {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (name, cfg)) in all(config).await.into_iter().enumerate() {
        tasks.spawn(async move {
            let r = match make(&name, &cfg) {
                Err(e) => Err(e),
                Ok(b) => match tokio::time::timeout(timeout, b.list_models()).await {
                    Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
                    Ok(Err(e)) => Err(e.to_string()),
                    Ok(Ok(m)) => Ok(m),
                },
            };
            (i, name, r)
        });
    }
    let mut results = tasks.join_all().await;
    results.sort_by_key(|(i, _, _)| *i);
    let mut text = String::new();
    let mut errors = String::new();
    for (_, name, r) in results {
        match r {
            Ok(models) => {
                for m in models {
                    text.push_str(&format!("{name}\t{m}\n"));
                }
            }
            Err(e) => {
                let e = e.strip_prefix(&format!("{name}: ")).unwrap_or(&e);
                errors.push_str(&format!("# {name}: {}\n", one_line(e)));
            }
        }
    }
    text + &errors
}
