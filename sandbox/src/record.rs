//! The record of a run: the layers enforced, the limits applied, how it ended, and what was
//! captured of its output.

use crate::cgroup::MemoryRecord;
use crate::landlock::{self, LandlockRecord};
use crate::request::file_size_limit;
use crate::seccomp::SeccompRecord;
use crate::unions::UnionMount;
use ollie_policy::{Network, PROXY_PORT};
use serde::Serialize;
use std::path::PathBuf;

/// Capability sets after the drop.
#[derive(Debug, Clone, Serialize)]
pub struct CapabilityRecord {
    /// Effective set.
    pub effective: u64,
    /// Permitted set.
    pub permitted: u64,
    /// Inheritable set.
    pub inheritable: u64,
    /// Bounding set.
    pub bounding: u64,
    /// Ambient set.
    pub ambient: u64,
    /// Securebits locked (NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE, KEEP_CAPS).
    pub securebits_locked: bool,
}

/// The mount namespace's effect.
#[derive(Debug, Clone, Serialize)]
pub struct MountRecord {
    /// Every mount is read-only and nosuid except the writable trees.
    pub read_only_root: bool,
    /// Writable trees (bound read-write).
    pub writable: Vec<PathBuf>,
    /// Protected islands inside writable trees (read-only).
    pub protected: Vec<PathBuf>,
    /// Protected paths that did not exist: the first missing component of each was created
    /// as an empty directory, bound read-only for the run, and removed afterwards.
    pub placeholders: Vec<PathBuf>,
    /// The run's private tmpfs at `/dev/shm` (size in `limits.shm_bytes`), if any.
    pub private_shm: Option<PathBuf>,
    /// The run's private temporary directory (a tmpfs over `/tmp`, or `/var/tmp` when a
    /// writable tree lies in `/tmp`; `TMPDIR` unless the policy sets one), if any.
    pub private_tmp: Option<PathBuf>,
    /// Union mounts, paths resolved (missing lower layers left out). Not empty: the root was
    /// a new read-only tmpfs holding the host's top-level entries and the points.
    pub unions: Vec<UnionMount>,
    /// Paths hidden from the tool (an empty, inaccessible tmpfs over a directory, `/dev/null`
    /// over a file): secret locations, the runner's state and configuration, homes and
    /// `/run/user` that hold none of the policy's paths.
    pub hidden: Vec<PathBuf>,
    /// The resolver configuration (the real path of `/etc/resolv.conf`) replaced, read-only,
    /// by one without a `nameserver` line: `network.mode = "proxy"`, where names are the
    /// proxy's business (`crate::proxy`).
    pub resolv_conf: Option<PathBuf>,
}

/// The layers active for a run.
#[derive(Debug, Clone, Serialize)]
pub struct Layers {
    /// A human approved this run unsandboxed (an `unsandboxed` grant): Landlock was not
    /// applied (`landlock.status` is `not_applied`, `landlock.not_applied` says why), nothing
    /// was mounted read-only (`mounts.read_only_root` is false) and the network was the
    /// host's (TCP and UDP, any port). Capabilities, `no_new_privs`, seccomp, the namespaces,
    /// the limits and the environment allowlist applied as to every run.
    pub unsandboxed: bool,
    /// Landlock.
    pub landlock: LandlockRecord,
    /// seccomp.
    pub seccomp: SeccompRecord,
    /// Capabilities of the tool.
    pub capabilities: CapabilityRecord,
    /// `no_new_privs` is set.
    pub no_new_privs: bool,
    /// Namespaces the tool runs in (`net` only for `network.mode = "proxy"`: otherwise the
    /// tool shares the runner's network namespace).
    pub namespaces: Vec<&'static str>,
    /// The network: the policy's mode, whose network namespace, the proxy's address.
    pub network: NetworkRecord,
    /// Mounts.
    pub mounts: MountRecord,
    /// The pids cgroup, when one was made (required as root: RLIMIT_NPROC does not bind
    /// uid 0; unprivileged runs get one only where a cgroup is delegated to the user).
    pub cgroup: Option<PathBuf>,
    /// What bounds the run's memory: its memory cgroup (`limits.memory_bytes`), or, where none
    /// could be made, only RLIMIT_AS (with the reason).
    pub memory: MemoryRecord,
    /// Whether the run had to degrade (only possible with `best_effort`; an approved
    /// unsandboxed run is not a degradation).
    pub best_effort_degraded: bool,
}

/// Whose network namespace a run's tool is in ([`NetworkRecord::namespace`]).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NetNamespace {
    /// The runner's (the host's network, loopback included, as far as the filters allow).
    Host,
    /// Its own, made for this run and gone with it.
    Run,
    /// A prepared session's own, shared by the session's calls.
    Session,
}

/// The network of a run, as enforced.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NetworkRecord {
    /// The policy's `network.mode`: `off`, `tcp`, `all` or `proxy`.
    pub mode: &'static str,
    /// Whose network namespace the tool ran in.
    pub namespace: NetNamespace,
    /// Where the tool reached the proxy (`127.0.0.1:3128`), under `proxy`.
    pub proxy: Option<String>,
}

impl NetworkRecord {
    /// The record of `network`, for a prepared call (`session`) or a one-shot run.
    pub(crate) fn of(network: &Network, session: bool) -> NetworkRecord {
        let mode = match network {
            Network::Off => "off",
            Network::Tcp { .. } => "tcp",
            Network::All => "all",
            Network::Proxy(_) => "proxy",
        };
        let own = matches!(network, Network::Proxy(_));
        let (namespace, proxy) = match (own, session) {
            (false, _) => (NetNamespace::Host, None),
            (true, false) => (NetNamespace::Run, Some(format!("127.0.0.1:{PROXY_PORT}"))),
            (true, true) => (
                NetNamespace::Session,
                Some(format!("127.0.0.1:{PROXY_PORT}")),
            ),
        };
        NetworkRecord {
            mode,
            namespace,
            proxy,
        }
    }
}

/// How the run ended.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ExitRecord {
    /// Exit code, if the tool exited.
    pub code: Option<i32>,
    /// Signal, if the tool was killed.
    pub signal: Option<i32>,
    /// Shell-style status: the code, or 128 + signal.
    pub status: i32,
    /// The wall-clock timeout expired.
    pub timed_out: bool,
    /// The run was cancelled.
    pub cancelled: bool,
    /// Why the run was stopped (the first cause), if the runner or the memory cgroup did.
    pub killed_by: Option<KilledBy>,
    /// The aggregate disk limit the run crossed (`killed_by = "disk_limit"`), with the figures.
    pub disk_limit: Option<DiskLimitRecord>,
}

/// Why a run was stopped: by the runner (SIGTERM to the tree, SIGKILL after the grace
/// period), or by the kernel at the memory cgroup's limit.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KilledBy {
    /// The wall-clock timeout expired.
    Timeout,
    /// The caller cancelled the run.
    Cancel,
    /// An aggregate disk limit (`limits.disk_bytes`, `limits.disk_inodes` or a reserve) was
    /// crossed; see [`ExitRecord::disk_limit`].
    DiskLimit,
    /// The memory cgroup's OOM killer killed the tool (SIGKILL) at `limits.memory_bytes`;
    /// see [`MemoryRecord::oom_kills`].
    MemoryLimit,
}

impl KilledBy {
    /// The cause for a run that only the timeout or a cancel can stop.
    pub fn from_flags(timed_out: bool, cancelled: bool) -> Option<KilledBy> {
        if timed_out {
            Some(KilledBy::Timeout)
        } else if cancelled {
            Some(KilledBy::Cancel)
        } else {
            None
        }
    }
}

/// Which aggregate disk limit was crossed.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DiskLimit {
    /// Free bytes shrank by more than `limits.disk_bytes`.
    DiskBytes,
    /// Free inodes shrank by more than `limits.disk_inodes`.
    DiskInodes,
    /// Free bytes (for unprivileged users) fell below the reserve while the run consumed space.
    ReserveBytes,
    /// Free inodes fell below the reserve while the run consumed inodes.
    ReserveInodes,
}

/// The figures of a crossed disk limit, as sampled when the runner noticed.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DiskLimitRecord {
    /// The limit.
    pub limit: DiskLimit,
    /// The writable tree whose filesystem crossed it.
    pub path: PathBuf,
    /// The limit's value: the allowed shrink (`disk_*`) or the reserve (`reserve_*`).
    pub allowed: u64,
    /// The observed value: the shrink since the start, or what was left free.
    pub observed: u64,
    /// Free bytes of that filesystem when the run started.
    pub free_bytes_start: u64,
    /// Free bytes when the limit was noticed.
    pub free_bytes_stop: u64,
    /// Free inodes when the run started.
    pub free_inodes_start: u64,
    /// Free inodes when the limit was noticed.
    pub free_inodes_stop: u64,
    /// The tool overshot by more than an eighth of the limit (or half the reserve) by the
    /// time the limit was noticed. (Every disk-limit stop is a SIGKILL of the whole run at
    /// once, without a grace period.)
    pub forced_kill: bool,
}

/// One captured output stream.
#[derive(Debug, Clone, Serialize)]
pub struct OutputRecord {
    /// Bytes the tool wrote.
    pub total_bytes: u64,
    /// Bytes kept.
    pub captured_bytes: u64,
    /// Whether bytes were dropped.
    pub truncated: bool,
}

/// Resource usage of the tool tree (as reaped by the init stage).
#[derive(Debug, Clone, Serialize)]
pub struct RusageRecord {
    /// User CPU time.
    pub user_ms: u64,
    /// System CPU time.
    pub sys_ms: u64,
    /// Peak resident set size.
    pub max_rss_kb: u64,
}

/// The JSON record of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    /// Program and arguments (lossy UTF-8).
    pub argv: Vec<String>,
    /// Working directory.
    pub cwd: PathBuf,
    /// The resolved program.
    pub program: PathBuf,
    /// SHA-256 of the resolved policy.
    pub policy_hash: String,
    /// Active layers.
    pub layers: Layers,
    /// Limits applied.
    pub limits: LimitsRecord,
    /// Names (never values) of the environment passed.
    pub env_names: Vec<String>,
    /// Exit.
    pub exit: ExitRecord,
    /// Wall time.
    pub duration_ms: u64,
    /// rusage.
    pub rusage: RusageRecord,
    /// stdout.
    pub stdout: OutputRecord,
    /// stderr.
    pub stderr: OutputRecord,
    /// How the program was started: `path` (`execve` of `program`) or `fd` (`execveat` of the
    /// caller's descriptor, [`RunRequest::exec_fd`](crate::RunRequest::exec_fd), opened from
    /// `program`).
    pub exec: ExecFrom,
    /// The paths the tool reached the descriptors it inherited by
    /// ([`RunRequest::pass_fds`](crate::RunRequest::pass_fds)), in order; empty for ordinary runs.
    pub pass_fds: Vec<String>,
    /// What the run left behind that host-side tools would execute later (git hooks, risky
    /// git config, new repositories, `.envrc`, editor/agent settings); see `postrun`.
    pub post_run: crate::postrun::PostRunRecord,
}

/// How a run's program was started ([`RunRecord::exec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecFrom {
    /// `execve` of the program's path.
    Path,
    /// `execveat` of the descriptor the caller gave
    /// ([`RunRequest::exec_fd`](crate::RunRequest::exec_fd)).
    Fd,
}

/// Limits as recorded.
#[derive(Debug, Clone, Serialize)]
pub struct LimitsRecord {
    /// RLIMIT_CPU.
    pub cpu_seconds: u64,
    /// RLIMIT_AS.
    pub address_space_bytes: u64,
    /// The memory cgroup's limit (see [`Layers::memory`] for whether one was made).
    pub memory_bytes: u64,
    /// RLIMIT_NPROC / pids.max.
    pub processes: u64,
    /// RLIMIT_FSIZE: the policy's `file_size_bytes`, capped at `disk_bytes`.
    pub file_size_bytes: u64,
    /// RLIMIT_NOFILE.
    pub open_files: u64,
    /// RLIMIT_CORE.
    pub core_bytes: u64,
    /// Output cap per stream.
    pub output_bytes: u64,
    /// Wall timeout.
    pub timeout_seconds: u64,
    /// SIGTERM → SIGKILL grace.
    pub kill_grace_ms: u64,
    /// Size of the private `/dev/shm` tmpfs (0: none).
    pub shm_bytes: u64,
    /// Allowed shrink of free space per writable filesystem.
    pub disk_bytes: u64,
    /// Allowed shrink of free inodes per writable filesystem.
    pub disk_inodes: u64,
}

/// The result of a run: the record and the captured output.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// The record.
    pub record: RunRecord,
    /// Captured stdout (at most `limits.output_bytes`).
    pub stdout: Vec<u8>,
    /// Captured stderr (at most `limits.output_bytes`).
    pub stderr: Vec<u8>,
}

impl Layers {
    /// The layers of a run that started: capabilities all empty with securebits locked and
    /// `no_new_privs` (the child fails closed otherwise); degraded when the cgroup was
    /// missing or Landlock only partially enforced (`best_effort` only); unsandboxed when
    /// Landlock was not applied (which only an approved `unsandboxed` grant does).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enforced(
        landlock: LandlockRecord,
        seccomp: SeccompRecord,
        namespaces: Vec<&'static str>,
        network: NetworkRecord,
        mounts: MountRecord,
        cgroup: Option<PathBuf>,
        cgroup_degraded: bool,
        memory: MemoryRecord,
    ) -> Layers {
        Layers {
            best_effort_degraded: cgroup_degraded
                || landlock.status == landlock::EnforcementStatus::PartiallyEnforced,
            unsandboxed: landlock.status == landlock::EnforcementStatus::NotApplied,
            landlock,
            seccomp,
            capabilities: CapabilityRecord {
                effective: 0,
                permitted: 0,
                inheritable: 0,
                bounding: 0,
                ambient: 0,
                securebits_locked: true,
            },
            no_new_privs: true,
            namespaces,
            network,
            mounts,
            cgroup,
            memory,
        }
    }
}

impl LimitsRecord {
    /// The policy's limits as applied, with the private `/dev/shm` size recorded as `shm_bytes`.
    pub(crate) fn new(l: &ollie_policy::Limits, shm_bytes: u64) -> LimitsRecord {
        LimitsRecord {
            cpu_seconds: l.cpu_seconds,
            address_space_bytes: l.address_space_bytes,
            memory_bytes: l.memory_bytes,
            processes: l.processes,
            file_size_bytes: file_size_limit(l),
            open_files: l.open_files,
            core_bytes: 0,
            output_bytes: l.output_bytes,
            timeout_seconds: l.timeout_seconds,
            kill_grace_ms: l.kill_grace_ms,
            shm_bytes,
            disk_bytes: l.disk_bytes,
            disk_inodes: l.disk_inodes,
        }
    }
}

impl RunRecord {
    /// The record as one JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_record_says_whose_namespace() {
        let proxy = Network::Proxy(ollie_policy::ProxyNetwork::closed());
        let r = NetworkRecord::of(&proxy, false);
        assert_eq!(
            (r.mode, r.namespace, r.proxy.as_deref()),
            ("proxy", NetNamespace::Run, Some("127.0.0.1:3128"))
        );
        assert_eq!(
            NetworkRecord::of(&proxy, true).namespace,
            NetNamespace::Session
        );
        for n in [Network::Off, Network::All] {
            let r = NetworkRecord::of(&n, false);
            assert_eq!((r.namespace, r.proxy), (NetNamespace::Host, None));
        }
    }
}
