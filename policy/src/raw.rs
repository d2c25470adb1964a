//! The TOML shape of a policy, exactly as written. Converted to [`crate::Policy`] by
//! validation; nothing outside this crate sees these types.

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    /// Minimum Landlock ABI the kernel must offer (default 7).
    pub landlock_min_abi: Option<u32>,
    /// Allow running with weaker enforcement than requested (recorded). Default false.
    pub best_effort: Option<bool>,
    #[serde(default)]
    pub fs: RawFs,
    #[serde(default)]
    pub network: RawNetwork,
    #[serde(default)]
    pub syscalls: RawSyscalls,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub env: RawEnv,
    #[serde(default)]
    pub escalations: RawEscalations,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFs {
    #[serde(default)]
    pub read: Vec<String>,
    #[serde(default)]
    pub exec: Vec<String>,
    #[serde(default)]
    pub write: Vec<String>,
    #[serde(default)]
    pub protected: Vec<String>,
    /// Grant read-only access to the whole filesystem except secret locations.
    #[serde(default)]
    pub read_all: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNetwork {
    pub mode: Option<String>,
    #[serde(default)]
    pub connect: Vec<i64>,
    #[serde(default)]
    pub bind: Vec<i64>,
    /// `mode = "proxy"` only: domain patterns requests may reach.
    #[serde(default)]
    pub allow_domains: Vec<String>,
    /// `mode = "proxy"` only: domain patterns refused even when allowed.
    #[serde(default)]
    pub deny_domains: Vec<String>,
    /// `mode = "proxy"` only: named lists of domains to allow.
    #[serde(default)]
    pub presets: Vec<String>,
    /// `mode = "proxy"` only: the ports requests may reach (default 80 and 443).
    pub ports: Option<Vec<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSyscalls {
    pub profile: Option<String>,
    /// Calls taken out of the profile.
    #[serde(default)]
    pub deny: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub cpu_seconds: Option<i64>,
    pub address_space_bytes: Option<i64>,
    pub memory_bytes: Option<i64>,
    pub processes: Option<i64>,
    pub file_size_bytes: Option<i64>,
    pub open_files: Option<i64>,
    pub output_bytes: Option<i64>,
    pub timeout_seconds: Option<i64>,
    pub kill_grace_ms: Option<i64>,
    pub shm_bytes: Option<i64>,
    pub disk_bytes: Option<i64>,
    pub disk_inodes: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEnv {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub set: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEscalations {
    #[serde(default)]
    pub allow: Vec<String>,
}

impl RawNetwork {
    /// The first of `network.connect` and `network.bind` that lists ports, if one does.
    pub(crate) fn port_list_set(&self) -> Option<&'static str> {
        [
            ("network.connect", &self.connect),
            ("network.bind", &self.bind),
        ]
        .into_iter()
        .find(|(_, ports)| !ports.is_empty())
        .map(|(key, _)| key)
    }
}

/// A port number from a policy file: `1..=65535`, or why not.
pub(crate) fn port_value(v: i64) -> Result<u16, String> {
    u16::try_from(v)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{v} is not a port (valid: 1..=65535)"))
}
