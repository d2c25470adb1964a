//! `[remotes.NAME]` of `config.toml`: the command olliesrv runs to reach a `toolsrv --stdio`
//! on another host (given, or `ssh` to a host), and the raw serde form it is checked from.

use serde::Deserialize;

use super::valid_name;

/// A validated remote: the command olliesrv runs (no shell) to reach a `toolsrv --stdio` on
/// another host. `[remotes.NAME]` gives either `command = [ARGV…]` or `host = "H"` (with an
/// optional `toolsrv = "PATH"`, default `toolsrv`), which means [`Remote::ssh_command`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub command: Vec<String>,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRemote {
    command: Option<Vec<String>>,
    host: Option<String>,
    toolsrv: Option<String>,
}

impl Remote {
    /// Checks `[remotes.NAME]`; an error names the key and what is wrong with it.
    pub(super) fn parse(name: &str, r: RawRemote) -> Result<Remote, (String, String)> {
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
