//! `olliesrv --check-config [--probe]`: the configuration checked exactly as the server reads
//! it at start, and, with `--probe`, one cheap request to each backend (its model list, at
//! the configured URL only), without serving anything. `o doctor` shows the result.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::backend::select;
use crate::config::{Backend, BackendKind, Config};

/// How long one backend may take to list its models.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// What `--check-config` found.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The file read (`None`: none exists, the built-in defaults apply).
    pub path: Option<PathBuf>,
    /// Why the configuration is refused, on one line.
    pub error: Option<String>,
    /// Each backend asked (with `--probe`): the configured ones, and the discovered one when
    /// no default is configured.
    pub backends: Vec<BackendReport>,
}

/// One backend's answer.
#[derive(Debug, Serialize)]
pub struct BackendReport {
    pub name: String,
    pub kind: &'static str,
    /// Where it was asked: the base URL, or the replay script.
    pub url: String,
    pub ok: bool,
    /// How many models it lists, or the error.
    pub detail: String,
}

impl Report {
    /// 0: valid and every backend answered; 1: a backend did not; 2: the file is refused.
    pub fn exit_code(&self) -> u8 {
        if self.error.is_some() {
            2
        } else if self.backends.iter().any(|b| !b.ok) {
            1
        } else {
            0
        }
    }

    /// The report in lines for a person.
    pub fn text(&self) -> String {
        let file = self.path.as_ref().map_or_else(
            || "(no file: built-in defaults)".to_owned(),
            |p| p.display().to_string(),
        );
        let mut out = match &self.error {
            Some(e) => format!("config {file}: {e}\n"),
            None => format!("config {file}: ok\n"),
        };
        for b in &self.backends {
            let state = if b.ok { "ok" } else { "failed" };
            out.push_str(&format!(
                "backend {} ({}, {}): {state}: {}\n",
                b.name, b.kind, b.url, b.detail
            ));
        }
        out
    }
}

/// Checks the configuration `explicit` (else the default file) and, with `probe`, asks each
/// backend for its models.
pub async fn check(explicit: Option<&Path>, probe: bool) -> Report {
    let config = match Config::load(explicit) {
        Ok(c) => c,
        Err(e) => {
            return Report {
                path: explicit.map(Path::to_path_buf).or_else(default_file),
                error: Some(crate::error_chain(&e).replace('\n', " ")),
                backends: Vec::new(),
            };
        }
    };
    let mut backends = Vec::new();
    if probe {
        for (name, cfg) in select::all(&config).await {
            backends.push(ask(&name, &cfg).await);
        }
    }
    Report {
        path: config.path.clone(),
        error: None,
        backends,
    }
}

/// The default file when it exists.
fn default_file() -> Option<PathBuf> {
    crate::config::default_dir()
        .map(|d| d.join("config.toml"))
        .filter(|f| f.exists())
}

async fn ask(name: &str, cfg: &Backend) -> BackendReport {
    let url = match cfg.kind {
        BackendKind::Replay => cfg
            .file
            .as_ref()
            .map_or_else(String::new, |f| f.display().to_string()),
        kind => cfg
            .base_url
            .clone()
            .unwrap_or_else(|| default_url(kind).to_owned()),
    };
    let answer = match select::make(name, cfg) {
        Err(e) => Err(e),
        Ok(b) => match tokio::time::timeout(PROBE_TIMEOUT, b.list_models()).await {
            Ok(Ok(models)) => Ok(models.len()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "timed out after {} s listing models",
                PROBE_TIMEOUT.as_secs()
            )),
        },
    };
    let (ok, detail) = match answer {
        Ok(n) => (true, format!("{n} models")),
        Err(e) => (false, e.replace('\n', " ")),
    };
    BackendReport {
        name: name.to_owned(),
        kind: cfg.kind.name(),
        url,
        ok,
        detail,
    }
}

fn default_url(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::OpenAi => crate::backend::openai::DEFAULT_BASE_URL,
        BackendKind::Anthropic => crate::backend::anthropic::DEFAULT_BASE_URL,
        BackendKind::Ollama | BackendKind::Replay => crate::backend::ollama::DEFAULT_BASE_URL,
    }
}
