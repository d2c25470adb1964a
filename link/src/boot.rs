//! What olliesrv hands a new toolsrv: the master key and the session's configuration.
//!
//! toolsrv reads no configuration file (DESIGN.md §2): everything arrives on its boot fd
//! (a sealed memfd normally; the first bytes of the channel with `--stdio`) as
//!
//! ```text
//! "ollie-toolsrv-boot 1\n" · 32-byte master key · u32 LE length · JSON (Bootstrap)
//! ```
//!
//! The JSON is strict: unknown keys are errors.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::auth::MasterKey;

/// First bytes of a boot message.
pub const MAGIC: &[u8] = b"ollie-toolsrv-boot 1\n";
/// Largest JSON part accepted.
pub const MAX_CONFIG: usize = 4 << 20;

/// The session's configuration for toolsrv.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Bootstrap {
    /// The session id (for logs, `info` and completion messages).
    pub session: String,
    /// The session's workspace (absolute; must exist).
    pub workdir: PathBuf,
    /// The user's home (for `{home}` in policies and the secret locations). Empty: toolsrv's
    /// own (`$HOME`, else its user's passwd entry) — what remote sessions send, since olliesrv
    /// does not know the home of the user its ssh logs in as.
    pub home: PathBuf,
    /// Policies by name, as TOML text. Every agent runs under one of them.
    pub policies: BTreeMap<String, String>,
    /// The policy of agents (and the operator) not given another with `ctl policy`.
    pub default_policy: String,
    /// Where `execute_tool` finds its scripts (read + execute is added to every policy).
    #[serde(default)]
    pub tools_dir: Option<PathBuf>,
    /// Environment the policies' allowlists pick from (never secrets).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Processes one agent may have running at once.
    #[serde(default = "default_agent_procs")]
    pub max_procs_per_agent: usize,
    /// Processes the session may have running at once.
    #[serde(default = "default_session_procs")]
    pub max_procs: usize,
    /// Exited processes kept for `out`/`wait`/`stat` before the oldest are reaped.
    #[serde(default = "default_kept")]
    pub max_exited: usize,
    /// Read grants added to every policy with `Policy::with_grants` (the skill paths): the
    /// one documented way to widen, so secret locations stay refused.
    #[serde(default)]
    pub read_grants: Vec<PathBuf>,
    /// olliesrv's own secret locations (its state directory, configuration file and the
    /// `agents/` and `policy/` beside it, sockets, key files, other instances' state
    /// directories): hidden from every tool (see `ollie_sandbox::MountRecord::hidden`) and
    /// secret in every other way (`ollie_policy::ResolveContext::extra_secrets`).
    #[serde(default)]
    pub hidden: Vec<PathBuf>,
    /// Whether olliesrv holds the other sessions working in the same trees while one of this
    /// session's escalations is decided: toolsrv then logs `hold` on `bypass/log` and waits
    /// for `ctl held ID` before it shows the request (local sessions; a remote toolsrv's
    /// trees are on another host).
    #[serde(default)]
    pub hold_peers: bool,
    /// The operator's settings for the egress proxy of runs under `network.mode = "proxy"`
    /// (olliesrv's `[proxy]`).
    #[serde(default)]
    pub proxy: ProxyBoot,
}

/// The operator's egress proxy settings (`[proxy]` in olliesrv's `config.toml`): what only
/// the operator may open, never a policy or an agent.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProxyBoot {
    /// Address ranges (CIDR, or a single address) the proxy may connect to although they are
    /// loopback, private, link-local, multicast or unspecified, e.g. `127.0.0.1/32` for
    /// integration tests against local services.
    #[serde(default)]
    pub allow_addresses: Vec<String>,
    /// Names the proxy resolves to these addresses without asking DNS (as curl's
    /// `--resolve`): a pinned address still passes the address check.
    #[serde(default)]
    pub resolve: BTreeMap<String, Vec<String>>,
}

fn default_agent_procs() -> usize {
    16
}
fn default_session_procs() -> usize {
    64
}
fn default_kept() -> usize {
    128
}

impl Bootstrap {
    /// A configuration with the shipped default limits.
    pub fn new(
        session: impl Into<String>,
        workdir: PathBuf,
        home: PathBuf,
        policies: BTreeMap<String, String>,
        default_policy: impl Into<String>,
    ) -> Bootstrap {
        Bootstrap {
            session: session.into(),
            workdir,
            home,
            policies,
            default_policy: default_policy.into(),
            tools_dir: None,
            env: Vec::new(),
            max_procs_per_agent: default_agent_procs(),
            max_procs: default_session_procs(),
            max_exited: default_kept(),
            read_grants: Vec::new(),
            hidden: Vec::new(),
            hold_peers: false,
            proxy: ProxyBoot::default(),
        }
    }
}

/// Errors reading a boot message.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("boot message: {0}")]
    Io(#[from] std::io::Error),
    #[error("boot message: {0}")]
    Format(String),
    #[error("boot configuration: {0}")]
    Json(#[from] serde_json::Error),
}

/// Encodes a boot message.
pub fn encode(key: &MasterKey, boot: &Bootstrap) -> Result<Vec<u8>, BootError> {
    let json = serde_json::to_vec(boot)?;
    if json.len() > MAX_CONFIG {
        return Err(BootError::Format(format!(
            "configuration is {} bytes; at most {MAX_CONFIG}",
            json.len()
        )));
    }
    let mut out = Vec::with_capacity(MAGIC.len() + 36 + json.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// Reads exactly one boot message from `r` (nothing after it is consumed).
pub fn decode(r: &mut impl Read) -> Result<(MasterKey, Bootstrap), BootError> {
    let mut magic = vec![0u8; MAGIC.len()];
    r.read_exact(&mut magic)?;
    if magic != MAGIC {
        return Err(BootError::Format("not a toolsrv boot message".into()));
    }
    let mut key = [0u8; 32];
    r.read_exact(&mut key)?;
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_CONFIG {
        return Err(BootError::Format(format!(
            "configuration is {len} bytes; at most {MAX_CONFIG}"
        )));
    }
    let mut json = vec![0u8; len];
    r.read_exact(&mut json)?;
    let boot: Bootstrap = serde_json::from_slice(&json)?;
    Ok((MasterKey::from_bytes(key), boot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_strictness() {
        let key = MasterKey::from_bytes([3; 32]);
        let mut p = BTreeMap::new();
        p.insert("workspace".to_owned(), "x".to_owned());
        let b = Bootstrap::new("s1", "/w".into(), "/h".into(), p, "workspace");
        let msg = encode(&key, &b).unwrap();
        let (k, got) = decode(&mut msg.as_slice()).unwrap();
        assert_eq!(k.as_bytes(), key.as_bytes());
        assert_eq!(got, b);
        // Truncated, wrong magic, unknown key.
        assert!(decode(&mut &msg[..msg.len() - 1]).is_err());
        let mut bad = msg.clone();
        bad[0] = b'X';
        assert!(decode(&mut bad.as_slice()).is_err());
        let json = br#"{"session":"s","workdir":"/w","home":"/h","policies":{},"default_policy":"p","bogus":1}"#;
        let mut m = MAGIC.to_vec();
        m.extend_from_slice(&[0; 32]);
        m.extend_from_slice(&(json.len() as u32).to_le_bytes());
        m.extend_from_slice(json);
        let e = decode(&mut m.as_slice()).unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
    }
}
