//! Validated policy types and the conversion from the raw TOML shape.

use crate::raw::{RawEnv, RawEscalations, RawFs, RawLimits, RawNetwork, RawPolicy, RawSyscalls};
use crate::secrets;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};

/// The Landlock ABI required unless a policy says otherwise (Linux 6.15+: all filesystem
/// rights, TCP rights, both scopes).
pub const DEFAULT_LANDLOCK_MIN_ABI: u32 = 7;

/// Errors from parsing, validating or resolving a policy. Each names the key path.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The text is not TOML of the policy's shape (unknown key, wrong type…).
    #[error("policy is not valid toml at line {line}: {message}")]
    Parse {
        /// 1-based line of the offending text (0 when unknown).
        line: usize,
        /// The decoder's one-line explanation (names the key and what is valid).
        message: String,
    },
    /// A value is out of range or malformed.
    #[error("{key}: {reason}")]
    Invalid {
        /// Key path, e.g. `fs.write[2]`.
        key: String,
        /// What was wrong and what is valid.
        reason: String,
    },
    /// A shipped profile name that does not exist.
    #[error("unknown profile {name:?} (valid: {valid})")]
    UnknownProfile {
        /// The requested name.
        name: String,
        /// The shipped names.
        valid: String,
    },
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> PolicyError {
    PolicyError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// Where a policy path is anchored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathAnchor {
    /// An absolute path.
    Root,
    /// `{workdir}`: the tool's working directory (the workspace).
    Workdir,
    /// `{home}`: the invoking user's home directory.
    Home,
}

/// A validated path: an anchor plus normal relative components.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathTemplate {
    /// What the path is relative to.
    pub anchor: PathAnchor,
    /// Normal components only (no `.`, `..`, or root).
    pub rest: PathBuf,
}

impl PathTemplate {
    /// Parses `/abs/path`, `{workdir}/sub` or `{home}/sub`.
    pub fn parse(key: &str, s: &str) -> Result<Self, PolicyError> {
        let (anchor, rest) = if let Some(r) = s.strip_prefix("{workdir}") {
            (PathAnchor::Workdir, r)
        } else if let Some(r) = s.strip_prefix("{home}") {
            (PathAnchor::Home, r)
        } else if s.starts_with('/') {
            (PathAnchor::Root, s)
        } else {
            return Err(invalid(
                key,
                format!("{s:?} must be an absolute path or start with {{workdir}} or {{home}}"),
            ));
        };
        if !rest.is_empty() && !rest.starts_with('/') {
            return Err(invalid(
                key,
                format!("{s:?}: expected '/' after the anchor"),
            ));
        }
        if s.contains('\0') {
            return Err(invalid(key, "path contains a NUL byte"));
        }
        let mut clean = PathBuf::new();
        for c in Path::new(rest).components() {
            match c {
                Component::RootDir => {}
                Component::Normal(n) => clean.push(n),
                Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                    return Err(invalid(
                        key,
                        format!("{s:?} must not contain '.' or '..' components"),
                    ));
                }
            }
        }
        Ok(PathTemplate {
            anchor,
            rest: clean,
        })
    }

    /// The absolute path for a context.
    pub fn resolve(&self, ctx: &ResolveContext) -> PathBuf {
        let base: &Path = match self.anchor {
            PathAnchor::Root => Path::new("/"),
            PathAnchor::Workdir => &ctx.workdir,
            PathAnchor::Home => &ctx.home,
        };
        base.join(&self.rest)
    }
}

impl fmt::Display for PathTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rest = self.rest.display();
        match self.anchor {
            PathAnchor::Root => write!(f, "/{rest}"),
            PathAnchor::Workdir if self.rest.as_os_str().is_empty() => write!(f, "{{workdir}}"),
            PathAnchor::Workdir => write!(f, "{{workdir}}/{rest}"),
            PathAnchor::Home if self.rest.as_os_str().is_empty() => write!(f, "{{home}}"),
            PathAnchor::Home => write!(f, "{{home}}/{rest}"),
        }
    }
}

/// Filesystem access levels, ordered from weakest to strongest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Access {
    /// Read files and list directories.
    Read,
    /// Read and execute.
    ReadExec,
    /// Read, write, create, remove, rename (not execute).
    ReadWrite,
}

/// Filesystem rules as written (anchored, not yet resolved).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FsRules {
    /// Read-only paths.
    pub read: Vec<PathTemplate>,
    /// Read + execute paths.
    pub exec: Vec<PathTemplate>,
    /// Read-write paths.
    pub write: Vec<PathTemplate>,
    /// Paths inside writable paths that must stay read-only (git and editor metadata). A
    /// write rule inside a protected path is an explicit exception to it (the innermost rule
    /// wins), e.g. `{workdir}/.git/objects` for commits inside the sandbox.
    pub protected: Vec<PathTemplate>,
    /// Read-only access to the whole filesystem except secret locations.
    pub read_all: bool,
}

/// Network policy, from narrowest to widest: `Off` < `Proxy(..)`, `Tcp { .. }` < `All` (a
/// layer may only move down this order: [`Policy::narrow`]; a proxy layer on a TCP base keeps
/// only ports the base lists).
///
/// In a policy file: `network.mode = "off"` (the default; no port lists), `"tcp"` (with
/// `connect` and `bind` port lists), `"proxy"` (with `allow_domains`, `deny_domains`,
/// `presets` and `ports`: [`crate::proxynet`]) or `"all"` (no port lists: every port is
/// allowed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// No sockets except AF_UNIX socketpairs; no connect/bind/listen.
    Off,
    /// TCP only, to/from the listed ports (Landlock), no UDP, no raw sockets.
    Tcp {
        /// Ports that may be connected to.
        connect: BTreeSet<u16>,
        /// Ports that may be bound.
        bind: BTreeSet<u16>,
    },
    /// Egress by domain: the run has a network namespace of its own whose only peer is the
    /// session's proxy at `127.0.0.1:`[`crate::PROXY_PORT`]; the proxy allows a request by its
    /// domain and port ([`crate::ProxyNetwork`]). TCP sockets only, connect to the proxy's
    /// port only, no bind.
    Proxy(crate::ProxyNetwork),
    /// The host network: TCP and UDP over IPv4 and IPv6 to any host and port (so DNS over
    /// UDP works), bind and listen allowed, ports unfiltered. Raw, packet, netlink and
    /// AF_UNIX sockets stay denied, as under `Tcp`. What an approved `net` grant gives
    /// ([`ResolvedPolicy::with_grants`]).
    All,
}

impl Network {
    /// Whether runs use the host's resolver: TCP or the whole host network. Their policy then
    /// reads [`RESOLVER_FILES`] too ([`Policy::resolve`], and so every widened copy), since a
    /// name that cannot be resolved makes the granted network useless. Under `Proxy` the
    /// proxy resolves, and under `Off` there is nothing to reach.
    pub fn uses_host_resolver(&self) -> bool {
        matches!(self, Network::Tcp { .. } | Network::All)
    }
}

/// What the C library's resolver reads (glibc and musl): the name service switch, the hosts
/// file, the resolver configuration and address sorting, and systemd-resolved's stub file,
/// which `/etc/resolv.conf` usually links to (a rule on a link also covers its target; the
/// stub is named for hosts where a tool opens it directly). Read-only; none holds a secret.
pub const RESOLVER_FILES: &[&str] = &[
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/run/systemd/resolve/stub-resolv.conf",
    "/run/systemd/resolve/resolv.conf",
];

/// Adds read rules for [`RESOLVER_FILES`] a policy does not cover yet.
pub(crate) fn add_resolver_reads(fs: &mut ResolvedFs) {
    for f in RESOLVER_FILES {
        let p = Path::new(f);
        let covered = fs.read_all
            || fs
                .read
                .iter()
                .chain(&fs.exec)
                .chain(&fs.write)
                .any(|r| p.starts_with(r));
        if !covered {
            fs.read.push(p.to_path_buf());
        }
    }
}

/// The seccomp profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyscallProfile {
    /// The default allowlist (named syscall groups).
    Default,
}

/// The seccomp rules of a policy: a profile, narrowed by calls taken out of it. Nothing can
/// add a call; a denied call fails with EPERM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Syscalls {
    /// The allowlist the tool starts from (`syscalls.profile`).
    pub profile: SyscallProfile,
    /// Calls the profile allows that this policy takes out (`syscalls.deny`, x86_64 names
    /// such as `"memfd_create"`, from [`crate::syscalls::DEFAULT_PROFILE_CALLS`]). A name the
    /// profile does not allow is refused, so a typo cannot pass for a restriction.
    pub deny: BTreeSet<String>,
}

/// At most this many names in `syscalls.deny`.
pub const MAX_DENIED_SYSCALLS: usize = 256;

/// Why `name` cannot be taken out of the default profile, if it cannot.
pub(crate) fn deny_name_error(name: &str) -> Option<String> {
    (!crate::syscalls::in_default_profile(name)).then(|| {
        format!(
            "{name:?} is not a call the default profile allows, so denying it would do nothing (valid: x86_64 names such as \"memfd_create\" or \"socketpair\"; \"ptrace\" is never allowed)"
        )
    })
}

/// Resource limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// RLIMIT_CPU in seconds.
    pub cpu_seconds: u64,
    /// RLIMIT_AS in bytes.
    pub address_space_bytes: u64,
    /// The run's memory cgroup (`memory.max` / `memory.limit_in_bytes`, swap included):
    /// everything the run's processes charge, also what RLIMIT_AS does not count (shared
    /// memory held by file descriptors: memfd, tmpfs files, the private `/dev/shm`). A
    /// prepared session shares one for all its calls. Where no memory cgroup can be made
    /// (an unprivileged user without a delegated cgroup) only RLIMIT_AS applies, and the
    /// run record says so.
    pub memory_bytes: u64,
    /// Maximum processes (RLIMIT_NPROC, and the pids cgroup where available).
    pub processes: u64,
    /// RLIMIT_FSIZE in bytes.
    pub file_size_bytes: u64,
    /// RLIMIT_NOFILE.
    pub open_files: u64,
    /// Captured bytes per output stream; the rest is counted and dropped.
    pub output_bytes: u64,
    /// Wall-clock timeout in seconds.
    pub timeout_seconds: u64,
    /// Time between SIGTERM and SIGKILL when a run is stopped.
    pub kill_grace_ms: u64,
    /// Size of the run's private tmpfs at `/dev/shm` (POSIX shared memory and semaphores);
    /// 0 means no `/dev/shm` at all.
    pub shm_bytes: u64,
    /// How far the free space of each writable tree's filesystem may shrink during the run
    /// (bytes). The runner samples `statfs` while the tool runs and stops the run (SIGTERM,
    /// SIGKILL after the grace period) when it is crossed. Other writers on the same
    /// filesystem count too (conservative). Independently, a run may never push free space
    /// below a reserve (5% of the filesystem or 1 GiB, whichever is smaller).
    pub disk_bytes: u64,
    /// The same for free inodes (reserve: 5% of the filesystem's inodes or 100,000,
    /// whichever is smaller).
    pub disk_inodes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_seconds: 60,
            address_space_bytes: 4 << 30,
            memory_bytes: 4 << 30,
            processes: 256,
            file_size_bytes: 1 << 30,
            open_files: 256,
            output_bytes: 1 << 20,
            timeout_seconds: 120,
            kill_grace_ms: 2000,
            shm_bytes: 64 << 20,
            disk_bytes: 4 << 30,
            disk_inodes: 1_000_000,
        }
    }
}

/// Environment policy: the tool's environment is cleared, then only these are passed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnvPolicy {
    /// Variables copied from the runner's environment when present.
    pub allow: BTreeSet<String>,
    /// Variables set to fixed values (`{workdir}` and `{home}` are substituted).
    pub set: BTreeMap<String, String>,
}

/// Kinds of escalation an agent may ask a human for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EscalationKind {
    /// Network access.
    Net,
    /// Extra read access.
    Read,
    /// Extra write access.
    Write,
    /// Running without the sandbox.
    Unsandboxed,
}

impl std::fmt::Display for EscalationKind {
    /// What the kind asks for, in the words a person reads in an error.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Net => "network access",
            Self::Read => "extra read access",
            Self::Write => "extra write access",
            Self::Unsandboxed => "running without the sandbox",
        })
    }
}

impl EscalationKind {
    fn parse(key: &str, s: &str) -> Result<Self, PolicyError> {
        Ok(match s {
            "net" => Self::Net,
            "read" => Self::Read,
            "write" => Self::Write,
            "unsandboxed" => Self::Unsandboxed,
            _ => {
                return Err(invalid(
                    key,
                    format!("unknown escalation {s:?} (valid: net, read, write, unsandboxed)"),
                ));
            }
        })
    }
}

/// A validated policy (paths still anchored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Minimum Landlock ABI.
    pub landlock_min_abi: u32,
    /// Whether weaker enforcement is acceptable (and recorded).
    pub best_effort: bool,
    /// Filesystem rules.
    pub fs: FsRules,
    /// Network rules.
    pub network: Network,
    /// Syscall profile and the calls taken out of it.
    pub syscalls: Syscalls,
    /// Resource limits.
    pub limits: Limits,
    /// Environment allowlist.
    pub env: EnvPolicy,
    /// Escalations that may be requested.
    pub escalations: BTreeSet<EscalationKind>,
    /// Set only by an approved `unsandboxed` grant ([`Policy::with_grants`]); no policy file
    /// and no layer can set it (private, no TOML key): see [`Policy::unsandboxed`].
    unsandboxed: bool,
}

/// Variable-name fragments that mark a secret; such names can never be allowlisted.
const SECRET_ENV_FRAGMENTS: &[&str] = &[
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "AUTH",
    "COOKIE",
    "SESSION",
];

/// Variables that point at daemons or the runner and can never be allowlisted.
const FORBIDDEN_ENV: &[&str] = &[
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "GPG_AGENT_INFO",
    "DBUS_SESSION_BUS_ADDRESS",
    "DBUS_SYSTEM_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
    "KUBECONFIG",
    "NAMESPACE",
    "TMUX",
    "STY",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "BASH_ENV",
    "ENV",
    "PROMPT_COMMAND",
];

/// Whether an environment variable name may never reach a tool.
pub fn env_name_is_forbidden(name: &str) -> bool {
    let up = name.to_ascii_uppercase();
    FORBIDDEN_ENV.contains(&up.as_str())
        || up.starts_with("OLLIE_")
        || SECRET_ENV_FRAGMENTS.iter().any(|f| up.contains(f))
}

fn positive(key: &str, v: Option<i64>, default: u64, max: u64) -> Result<u64, PolicyError> {
    match v {
        None => Ok(default),
        Some(v) if v >= 1 && (v as u64) <= max => Ok(v as u64),
        Some(v) => Err(invalid(
            key,
            format!("{v} is out of range (valid: 1..={max})"),
        )),
    }
}

fn port(key: &str, v: i64) -> Result<u16, PolicyError> {
    crate::raw::port_value(v).map_err(|why| invalid(key, why))
}

fn paths(section: &str, v: &[String]) -> Result<Vec<PathTemplate>, PolicyError> {
    v.iter()
        .enumerate()
        .map(|(i, s)| PathTemplate::parse(&format!("{section}[{i}]"), s))
        .collect()
}

fn env_name_ok(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl TryFrom<RawPolicy> for Policy {
    type Error = PolicyError;

    fn try_from(raw: RawPolicy) -> Result<Self, PolicyError> {
        let landlock_min_abi = match raw.landlock_min_abi {
            None => DEFAULT_LANDLOCK_MIN_ABI,
            Some(v @ 1..=64) => v,
            Some(v) => {
                return Err(invalid(
                    "landlock_min_abi",
                    format!("{v} is out of range (valid: 1..=64)"),
                ));
            }
        };
        let fs = fs_rules(&raw.fs)?;
        let network = network(&raw.network)?;
        let syscalls = syscalls(&raw.syscalls)?;
        let limits = limits(&raw.limits)?;
        let env = env_policy(&raw.env)?;
        let escalations = escalations(&raw.escalations)?;
        Ok(Policy {
            landlock_min_abi,
            best_effort: raw.best_effort.unwrap_or(false),
            fs,
            network,
            syscalls,
            limits,
            env,
            escalations,
            unsandboxed: false,
        })
    }
}

/// `fs`: the path lists, each `protected` path strictly inside a `write` one.
fn fs_rules(raw: &RawFs) -> Result<FsRules, PolicyError> {
    let fs = FsRules {
        read: paths("fs.read", &raw.read)?,
        exec: paths("fs.exec", &raw.exec)?,
        write: paths("fs.write", &raw.write)?,
        protected: paths("fs.protected", &raw.protected)?,
        read_all: raw.read_all,
    };
    for (i, p) in fs.protected.iter().enumerate() {
        let inside = fs
            .write
            .iter()
            .any(|w| w.anchor == p.anchor && p.rest.starts_with(&w.rest) && p.rest != w.rest);
        if !inside {
            return Err(invalid(
                format!("fs.protected[{i}]"),
                format!("{p} must lie strictly inside one of fs.write (same anchor)"),
            ));
        }
    }
    Ok(fs)
}

/// `network`: the mode and, for `tcp`, its port lists.
fn network(raw: &RawNetwork) -> Result<Network, PolicyError> {
    let mode = raw.mode.as_deref().unwrap_or("off");
    if mode != "proxy" {
        crate::proxynet::refuse_proxy_keys(raw, mode).map_err(|(k, r)| invalid(k, r))?;
    }
    Ok(match raw.mode.as_deref() {
        Some("proxy") => {
            Network::Proxy(crate::proxynet::parse(raw).map_err(|(k, r)| invalid(k, r))?)
        }
        None | Some("off") => {
            if !raw.connect.is_empty() || !raw.bind.is_empty() {
                return Err(invalid(
                    "network.connect",
                    "ports need network.mode = \"tcp\"",
                ));
            }
            Network::Off
        }
        Some("all") => {
            if let Some(key) = raw.port_list_set() {
                return Err(invalid(
                    key,
                    "mode \"all\" allows every port; port lists need network.mode = \"tcp\"",
                ));
            }
            Network::All
        }
        Some("tcp") => {
            let mut connect = BTreeSet::new();
            for (i, p) in raw.connect.iter().enumerate() {
                connect.insert(port(&format!("network.connect[{i}]"), *p)?);
            }
            let mut bind = BTreeSet::new();
            for (i, p) in raw.bind.iter().enumerate() {
                bind.insert(port(&format!("network.bind[{i}]"), *p)?);
            }
            Network::Tcp { connect, bind }
        }
        Some(m) => {
            return Err(invalid(
                "network.mode",
                format!("unknown mode {m:?} (valid: off, tcp, proxy, all)"),
            ));
        }
    })
}

/// `syscalls`: the profile and the extra denied names.
fn syscalls(raw: &RawSyscalls) -> Result<Syscalls, PolicyError> {
    let profile = match raw.profile.as_deref() {
        None | Some("default") => SyscallProfile::Default,
        Some(p) => {
            return Err(invalid(
                "syscalls.profile",
                format!("unknown profile {p:?} (valid: default)"),
            ));
        }
    };
    if raw.deny.len() > MAX_DENIED_SYSCALLS {
        return Err(invalid(
            "syscalls.deny",
            format!("{} names; at most {MAX_DENIED_SYSCALLS}", raw.deny.len()),
        ));
    }
    let mut deny = BTreeSet::new();
    for (i, name) in raw.deny.iter().enumerate() {
        if let Some(why) = deny_name_error(name) {
            return Err(invalid(format!("syscalls.deny[{i}]"), why));
        }
        deny.insert(name.clone());
    }
    Ok(Syscalls { profile, deny })
}

/// `limits`: each given value in its range, the others the defaults.
fn limits(l: &RawLimits) -> Result<Limits, PolicyError> {
    let d = Limits::default();
    Ok(Limits {
        cpu_seconds: positive("limits.cpu_seconds", l.cpu_seconds, d.cpu_seconds, 86_400)?,
        address_space_bytes: positive(
            "limits.address_space_bytes",
            l.address_space_bytes,
            d.address_space_bytes,
            1 << 46,
        )?,
        memory_bytes: positive(
            "limits.memory_bytes",
            l.memory_bytes,
            d.memory_bytes,
            1 << 46,
        )?,
        processes: positive("limits.processes", l.processes, d.processes, 65_536)?,
        file_size_bytes: positive(
            "limits.file_size_bytes",
            l.file_size_bytes,
            d.file_size_bytes,
            1 << 46,
        )?,
        open_files: positive("limits.open_files", l.open_files, d.open_files, 65_536)?,
        output_bytes: positive(
            "limits.output_bytes",
            l.output_bytes,
            d.output_bytes,
            1 << 32,
        )?,
        timeout_seconds: positive(
            "limits.timeout_seconds",
            l.timeout_seconds,
            d.timeout_seconds,
            86_400,
        )?,
        kill_grace_ms: positive(
            "limits.kill_grace_ms",
            l.kill_grace_ms,
            d.kill_grace_ms,
            60_000,
        )?,
        shm_bytes: match l.shm_bytes {
            None => d.shm_bytes,
            Some(0) => 0,
            Some(_) => positive("limits.shm_bytes", l.shm_bytes, d.shm_bytes, 1 << 34)?,
        },
        disk_bytes: positive("limits.disk_bytes", l.disk_bytes, d.disk_bytes, 1 << 50)?,
        disk_inodes: positive("limits.disk_inodes", l.disk_inodes, d.disk_inodes, 1 << 40)?,
    })
}

/// `env`: the passed and the set variables, none that may carry a secret.
fn env_policy(raw: &RawEnv) -> Result<EnvPolicy, PolicyError> {
    let mut env = EnvPolicy::default();
    for (i, name) in raw.allow.iter().enumerate() {
        let key = format!("env.allow[{i}]");
        if !env_name_ok(name) {
            return Err(invalid(key, format!("{name:?} is not a variable name")));
        }
        if env_name_is_forbidden(name) {
            return Err(invalid(
                key,
                format!("{name} may carry a secret or a daemon address and cannot be passed"),
            ));
        }
        env.allow.insert(name.clone());
    }
    for (name, value) in &raw.set {
        let key = format!("env.set.{name}");
        if !env_name_ok(name) {
            return Err(invalid(key, format!("{name:?} is not a variable name")));
        }
        if env_name_is_forbidden(name) {
            return Err(invalid(
                key,
                format!("{name} may carry a secret or a daemon address and cannot be set"),
            ));
        }
        if value.contains('\0') {
            return Err(invalid(key, "value contains a NUL byte"));
        }
        env.set.insert(name.clone(), value.clone());
    }
    Ok(env)
}

/// `escalations.allow`: the kinds that may be asked for.
fn escalations(raw: &RawEscalations) -> Result<BTreeSet<EscalationKind>, PolicyError> {
    let mut escalations = BTreeSet::new();
    for (i, e) in raw.allow.iter().enumerate() {
        escalations.insert(EscalationKind::parse(
            &format!("escalations.allow[{i}]"),
            e,
        )?);
    }
    Ok(escalations)
}

/// What anchored paths resolve against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolveContext {
    /// The workspace (absolute, normal).
    pub workdir: PathBuf,
    /// The user's home (absolute, normal).
    pub home: PathBuf,
    /// Secret locations besides the defaults of [`secrets::secret_locations`]: the runner's
    /// own directories where they are not at the default paths (olliesrv's state,
    /// configuration and socket directories, its key files, other instances' state
    /// directories), absolute and canonical. They are secret in every way the defaults are.
    pub extra_secrets: Vec<PathBuf>,
}

impl ResolveContext {
    /// A context with no [`extra_secrets`](Self::extra_secrets).
    pub fn new(workdir: PathBuf, home: PathBuf) -> ResolveContext {
        ResolveContext {
            workdir,
            home,
            extra_secrets: Vec::new(),
        }
    }

    /// Every secret location of this context: the defaults for its home and the
    /// [`extra_secrets`](Self::extra_secrets).
    pub fn secret_locations(&self) -> Vec<PathBuf> {
        let mut out = secrets::secret_locations(&self.home);
        for s in &self.extra_secrets {
            if !out.contains(s) {
                out.push(s.clone());
            }
        }
        out
    }

    /// The secret location `path` is equal to or lies inside, if any.
    pub fn secret_containing(&self, path: &Path) -> Option<PathBuf> {
        secrets::secret_in(path, &self.secret_locations())
    }
}

/// Filesystem rules with absolute paths.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResolvedFs {
    /// Read-only paths.
    pub read: Vec<PathBuf>,
    /// Read + execute paths.
    pub exec: Vec<PathBuf>,
    /// Read-write paths.
    pub write: Vec<PathBuf>,
    /// Read-only islands inside writable paths.
    pub protected: Vec<PathBuf>,
    /// Read-only access to everything except secrets.
    pub read_all: bool,
}

/// A policy with every path made absolute for one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedPolicy {
    /// The validated policy it came from.
    pub policy: Policy,
    /// The context used.
    pub ctx: ResolveContext,
    /// Absolute filesystem rules.
    pub fs: ResolvedFs,
    /// Network rules.
    pub network: Network,
    /// Environment values to set, with anchors substituted.
    pub env_set: BTreeMap<String, String>,
    /// Set only by an approved `unsandboxed` grant: see [`ResolvedPolicy::unsandboxed`].
    unsandboxed: bool,
}

fn normal_abs(key: &str, p: &Path) -> Result<(), PolicyError> {
    let ok = p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!("{} must be an absolute normal path", p.display()),
        ))
    }
}

impl Policy {
    /// Parses and validates TOML text.
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        let raw: RawPolicy = toml::from_str(text).map_err(|e| PolicyError::Parse {
            line: e.span().map_or(0, |s| {
                let end = s.start.min(text.len());
                text.as_bytes()[..end]
                    .iter()
                    .filter(|b| **b == b'\n')
                    .count()
                    + 1
            }),
            message: e.message().replace('\n', " "),
        })?;
        Policy::try_from(raw)
    }

    /// Resolves anchored paths; rejects rules that name a secret location.
    pub fn resolve(&self, ctx: &ResolveContext) -> Result<ResolvedPolicy, PolicyError> {
        normal_abs("workdir", &ctx.workdir)?;
        normal_abs("home", &ctx.home)?;
        let mut fs = ResolvedFs {
            read_all: self.fs.read_all,
            ..ResolvedFs::default()
        };
        let sections: [(&str, &Vec<PathTemplate>, &mut Vec<PathBuf>); 4] = [
            ("fs.read", &self.fs.read, &mut fs.read),
            ("fs.exec", &self.fs.exec, &mut fs.exec),
            ("fs.write", &self.fs.write, &mut fs.write),
            ("fs.protected", &self.fs.protected, &mut fs.protected),
        ];
        let secret_list = ctx.secret_locations();
        for (section, list, out) in sections {
            for (i, t) in list.iter().enumerate() {
                let p = t.resolve(ctx);
                if section != "fs.protected"
                    && let Some(s) = secrets::secret_in(&p, &secret_list)
                {
                    return Err(invalid(
                        format!("{section}[{i}]"),
                        format!(
                            "{} is inside the secret location {} and can never be granted",
                            p.display(),
                            s.display()
                        ),
                    ));
                }
                out.push(p);
            }
        }
        if self.network.uses_host_resolver() {
            add_resolver_reads(&mut fs);
        }
        let subst = |v: &str| {
            v.replace("{workdir}", &ctx.workdir.to_string_lossy())
                .replace("{home}", &ctx.home.to_string_lossy())
        };
        let env_set = self
            .env
            .set
            .iter()
            .map(|(k, v)| (k.clone(), subst(v)))
            .collect();
        Ok(ResolvedPolicy {
            policy: self.clone(),
            ctx: ctx.clone(),
            fs,
            network: self.network.clone(),
            env_set,
            unsandboxed: self.unsandboxed,
        })
    }

    /// Whether this policy was widened by an approved `unsandboxed` grant
    /// ([`Policy::with_grants`]; never true for a policy read from TOML or narrowed by a
    /// layer). Such a policy's network is [`Network::All`], and the enforcer applies none of
    /// its filesystem rules: no Landlock (so no secret-location carve-outs either), no
    /// read-only mounts or protected islands. Everything else still applies: capabilities
    /// dropped, `no_new_privs`, the seccomp profile (with the `All` network rules), limits and
    /// the environment allowlist. The filesystem rules are kept only as data (what
    /// [`ResolvedPolicy::access_of`] reports).
    pub fn unsandboxed(&self) -> bool {
        self.unsandboxed
    }

    pub(crate) fn set_unsandboxed(&mut self) {
        self.unsandboxed = true;
        self.network = Network::All;
    }
}

impl ResolvedPolicy {
    /// Whether the run was approved unsandboxed (an `unsandboxed` grant through
    /// [`ResolvedPolicy::with_grants`], or a [`Policy`] made so by [`Policy::with_grants`]).
    /// The enforcer then applies no filesystem rule and uses the host network: see
    /// [`Policy::unsandboxed`].
    pub fn unsandboxed(&self) -> bool {
        self.unsandboxed
    }

    pub(crate) fn set_unsandboxed(&mut self) {
        self.unsandboxed = true;
        self.network = Network::All;
    }

    /// The strongest access any rule grants on `path` (lexically), ignoring secrets. These
    /// are the rules as data; for an [`unsandboxed`](Self::unsandboxed) run the enforcer
    /// applies none of them.
    pub fn access_of(&self, path: &Path) -> Option<Access> {
        if self.ctx.secret_containing(path).is_some() {
            return None;
        }
        let covers = |list: &[PathBuf]| list.iter().any(|r| path.starts_with(r));
        let in_protected = covers(&self.fs.protected);
        // The innermost rule wins: a write rule inside a protected path (a policy's explicit
        // exception, e.g. `.git/objects`, or an approved `write:` grant) makes it writable.
        let depth = |list: &[PathBuf]| {
            list.iter()
                .filter(|r| path.starts_with(r))
                .map(|r| r.components().count())
                .max()
        };
        let writable = match (depth(&self.fs.write), depth(&self.fs.protected)) {
            (Some(w), Some(p)) => w >= p,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if writable {
            Some(Access::ReadWrite)
        } else if covers(&self.fs.exec) {
            Some(Access::ReadExec)
        } else if covers(&self.fs.read) || self.fs.read_all || in_protected {
            Some(Access::Read)
        } else {
            None
        }
    }

    /// Secret locations strictly inside `path`, which a grant on `path` must exclude.
    pub fn secrets_within(&self, path: &Path) -> Vec<PathBuf> {
        self.ctx
            .secret_locations()
            .into_iter()
            .filter(|s| s.starts_with(path) && s != path)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Policy::from_toml(text).unwrap_err().to_string()
    }

    #[test]
    fn shm_bytes_defaults_can_be_zero_and_is_bounded() {
        let p = Policy::from_toml("").unwrap();
        assert_eq!(p.limits.shm_bytes, 64 << 20);
        let p = Policy::from_toml("[limits]\nshm_bytes = 0").unwrap();
        assert_eq!(p.limits.shm_bytes, 0);
        assert!(err("[limits]\nshm_bytes = -1").starts_with("limits.shm_bytes:"));
        assert!(err("[limits]\nshm_bytes = 99999999999999").starts_with("limits.shm_bytes:"));
        // A layer can shrink it, never grow it.
        let base = Policy::from_toml("[limits]\nshm_bytes = 1024").unwrap();
        let grow = crate::Layer {
            limits: Some(Limits {
                shm_bytes: 2048,
                ..base.limits
            }),
            ..crate::Layer::default()
        };
        assert!(base.narrow(&grow).is_err());
        let shrink = crate::Layer {
            limits: Some(Limits {
                shm_bytes: 0,
                ..base.limits
            }),
            ..crate::Layer::default()
        };
        assert_eq!(base.narrow(&shrink).unwrap().limits.shm_bytes, 0);
    }

    #[test]
    fn memory_bytes_defaults_validates_and_only_narrows() {
        let p = Policy::from_toml("").unwrap();
        assert_eq!(p.limits.memory_bytes, 4 << 30);
        let p = Policy::from_toml("[limits]\nmemory_bytes = 268435456").unwrap();
        assert_eq!(p.limits.memory_bytes, 256 << 20);
        for bad in ["0", "-1", "70368744177665"] {
            let e = err(&format!("[limits]\nmemory_bytes = {bad}"));
            assert_eq!(
                e,
                format!("limits.memory_bytes: {bad} is out of range (valid: 1..=70368744177664)")
            );
        }
        let e = err("[limits]\nmemory_bytes = \"1G\"");
        assert!(e.contains("line 2") && e.contains("expected i64"), "{e}");
        let base = Policy::from_toml("[limits]\nmemory_bytes = 1048576").unwrap();
        let layer = |memory_bytes| crate::Layer {
            limits: Some(Limits {
                memory_bytes,
                ..base.limits
            }),
            ..crate::Layer::default()
        };
        let e = base.narrow(&layer(1048577)).unwrap_err().to_string();
        assert!(e.contains("limits.memory_bytes"), "{e}");
        assert_eq!(base.narrow(&layer(4096)).unwrap().limits.memory_bytes, 4096);
    }

    #[test]
    fn disk_limits_default_validate_and_only_narrow() {
        let p = Policy::from_toml("").unwrap();
        assert_eq!(p.limits.disk_bytes, 4 << 30);
        assert_eq!(p.limits.disk_inodes, 1_000_000);
        let p = Policy::from_toml("[limits]\ndisk_bytes = 65536\ndisk_inodes = 20").unwrap();
        assert_eq!((p.limits.disk_bytes, p.limits.disk_inodes), (65536, 20));
        for bad in ["0", "-1", "1125899906842625"] {
            let e = err(&format!("[limits]\ndisk_bytes = {bad}"));
            assert!(e.starts_with("limits.disk_bytes:"), "{e}");
        }
        assert!(err("[limits]\ndisk_inodes = 0").starts_with("limits.disk_inodes:"));
        assert!(err("[limits]\ndisk_inodes = 1099511627777").starts_with("limits.disk_inodes:"));
        let base = Policy::from_toml("[limits]\ndisk_bytes = 1024\ndisk_inodes = 10").unwrap();
        for grow in [
            Limits {
                disk_bytes: 2048,
                ..base.limits
            },
            Limits {
                disk_inodes: 11,
                ..base.limits
            },
        ] {
            let layer = crate::Layer {
                limits: Some(grow),
                ..crate::Layer::default()
            };
            let e = base.narrow(&layer).unwrap_err().to_string();
            assert!(e.contains("limits.disk_"), "{e}");
        }
        let shrink = crate::Layer {
            limits: Some(Limits {
                disk_bytes: 512,
                disk_inodes: 5,
                ..base.limits
            }),
            ..crate::Layer::default()
        };
        let n = base.narrow(&shrink).unwrap();
        assert_eq!((n.limits.disk_bytes, n.limits.disk_inodes), (512, 5));
    }

    #[test]
    fn errors_name_the_key_path() {
        assert_eq!(
            err("[fs]\nwrite = [\"/a\", \"/b\", \"rel\"]"),
            "fs.write[2]: \"rel\" must be an absolute path or start with {workdir} or {home}"
        );
        assert!(err("[fs]\nread = [\"/a/../b\"]").starts_with("fs.read[0]:"));
        assert!(err("[network]\nmode = \"udp\"").starts_with("network.mode:"));
        assert!(
            err("[network]\nmode = \"tcp\"\nconnect = [70000]").starts_with("network.connect[0]:")
        );
        assert!(err("[limits]\ncpu_seconds = 0").starts_with("limits.cpu_seconds:"));
        assert!(err("[env]\nallow = [\"OPENAI_API_KEY\"]").starts_with("env.allow[0]:"));
        assert!(err("[env]\nallow = [\"SSH_AUTH_SOCK\"]").starts_with("env.allow[0]:"));
        assert!(err("[escalations]\nallow = [\"root\"]").starts_with("escalations.allow[0]:"));
        assert!(err("landlock_min_abi = 0").starts_with("landlock_min_abi:"));
        assert!(err("[fs]\nprotected = [\"{workdir}/.git\"]").starts_with("fs.protected[0]:"));
    }

    #[test]
    fn network_mode_all_is_strict() {
        let p = Policy::from_toml("[network]\nmode = \"all\"").unwrap();
        assert_eq!(p.network, Network::All);
        assert!(
            !p.unsandboxed(),
            "a policy file never makes an unsandboxed policy"
        );
        assert_eq!(
            err("[network]\nmode = \"all\"\nconnect = [443]"),
            "network.connect: mode \"all\" allows every port; port lists need network.mode = \"tcp\""
        );
        assert!(err("[network]\nmode = \"all\"\nbind = [8080]").starts_with("network.bind:"));
        for bad in ["ALL", "any", "unsandboxed", "all "] {
            let e = err(&format!("[network]\nmode = {bad:?}"));
            assert!(e.ends_with("(valid: off, tcp, proxy, all)"), "{e}");
        }
        // There is no key that turns the sandbox off.
        for text in [
            "unsandboxed = true",
            "[fs]\nunsandboxed = true",
            "[network]\nunsandboxed = true",
            "[syscalls]\nprofile = \"unsandboxed\"",
        ] {
            assert!(Policy::from_toml(text).is_err(), "{text}");
        }
    }

    #[test]
    fn syscalls_deny_narrows_and_refuses_what_it_cannot_take_out() {
        let p = Policy::from_toml(
            "[syscalls]\nprofile = \"default\"\ndeny = [\"memfd_create\", \"ioctl\"]",
        )
        .unwrap();
        assert_eq!(
            p.syscalls
                .deny
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ["ioctl", "memfd_create"]
        );
        assert!(Policy::from_toml("").unwrap().syscalls.deny.is_empty());
        for (bad, key) in [
            ("deny = [\"ptrace\"]", "syscalls.deny[0]:"),
            ("deny = [\"read\", \"no_such_call\"]", "syscalls.deny[1]:"),
            ("deny = [\"SYS_read\"]", "syscalls.deny[0]:"),
            ("deny = [\"\"]", "syscalls.deny[0]:"),
        ] {
            let e = err(&format!("[syscalls]\n{bad}"));
            assert!(e.starts_with(key) && e.contains("valid:"), "{e}");
        }
        assert!(err("[syscalls]\nallow = [\"ptrace\"]").contains("unknown field `allow`"));
        // A layer can take more out, never put one back.
        let layer = crate::Layer {
            deny_syscalls: ["socketpair".to_string()].into(),
            ..crate::Layer::default()
        };
        let n = p.narrow(&layer).unwrap();
        assert_eq!(n.syscalls.deny.len(), 3);
        let bad = crate::Layer {
            deny_syscalls: ["mount".to_string()].into(),
            ..crate::Layer::default()
        };
        assert!(
            p.narrow(&bad)
                .unwrap_err()
                .to_string()
                .starts_with("syscalls.deny[0]:")
        );
        // An empty layer keeps what the base took out.
        assert_eq!(
            p.narrow(&crate::Layer::default()).unwrap().syscalls,
            p.syscalls
        );
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let e = Policy::from_toml("[fs]\nwritable = []")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("policy is not valid toml at line 2: unknown field `writable`"),
            "{e}"
        );
        assert!(e.contains("expected one of `read`"), "{e}");
        assert!(Policy::from_toml("colour = 1").is_err());
        assert!(Policy::from_toml("[limits]\nmemory = 1").is_err());
    }

    proptest::proptest! {
        #[test]
        fn parser_never_panics(text in "\\PC{0,200}") {
            let _ = Policy::from_toml(&text);
        }

        #[test]
        fn parser_never_panics_on_policy_like_text(
            key in proptest::sample::select(vec!["fs", "network", "limits", "env", "x"]),
            body in "[a-z_\\[\\]=\"{}/., 0-9\n-]{0,120}",
        ) {
            let _ = Policy::from_toml(&format!("[{key}]\n{body}"));
        }
    }

    #[test]
    fn defaults_are_fail_closed() {
        let p = Policy::from_toml("").unwrap();
        assert_eq!(p.landlock_min_abi, 7);
        assert!(!p.best_effort);
        assert_eq!(p.network, Network::Off);
        assert!(p.fs.write.is_empty() && p.fs.read.is_empty() && !p.fs.read_all);
        assert!(p.escalations.is_empty());
    }

    #[test]
    fn secrets_cannot_be_granted_directly() {
        let ctx = ResolveContext {
            workdir: "/w".into(),
            home: "/home/u".into(),
            extra_secrets: Vec::new(),
        };
        for (text, key) in [
            ("[fs]\nread = [\"/usr\", \"{home}/.ssh\"]", "fs.read[1]"),
            ("[fs]\nwrite = [\"/etc/shadow\"]", "fs.write[0]"),
            ("[fs]\nexec = [\"{home}/.aws/bin\"]", "fs.exec[0]"),
            ("[fs]\nread = [\"/root/.ssh\"]", "fs.read[0]"),
        ] {
            let e = Policy::from_toml(text).unwrap().resolve(&ctx).unwrap_err();
            assert!(e.to_string().starts_with(key), "{e}");
        }
        let broad = Policy::from_toml("[fs]\nread = [\"/\"]")
            .unwrap()
            .resolve(&ctx)
            .unwrap();
        assert_eq!(broad.access_of(Path::new("/home/u/.ssh/id_ed25519")), None);
        assert_eq!(broad.access_of(Path::new("/etc/shadow")), None);
        assert_eq!(
            broad.access_of(Path::new("/etc/passwd")),
            Some(Access::Read)
        );
        assert!(broad.secrets_within(Path::new("/")).len() > 10);
    }

    #[test]
    fn anchors_resolve() {
        let ctx = ResolveContext {
            workdir: "/w".into(),
            home: "/home/u".into(),
            extra_secrets: Vec::new(),
        };
        let p = Policy::from_toml(
            "[fs]\nwrite=[\"{workdir}\"]\nprotected=[\"{workdir}/.git\"]\n[env]\nset={TMPDIR=\"{workdir}/.tmp\"}",
        )
        .unwrap()
        .resolve(&ctx)
        .unwrap();
        assert_eq!(p.fs.write, vec![PathBuf::from("/w")]);
        assert_eq!(p.env_set["TMPDIR"], "/w/.tmp");
        assert_eq!(p.access_of(Path::new("/w/a")), Some(Access::ReadWrite));
        assert_eq!(p.access_of(Path::new("/w/.git/config")), Some(Access::Read));
        assert_eq!(p.access_of(Path::new("/x")), None);
    }
}
