//! Running one command under a policy, and the run record.

use crate::cgroup::{MemoryRecord, MemoryScope, RunCgroups};
use crate::landlock::{self, LandlockError, LandlockRecord};
use crate::mounts::MountPlan;
use crate::seccomp::{self, SeccompError, SeccompRecord};
use crate::sys::{self, ChildFault, ChildPlan, MountStep, Stage};
use ollie_policy::{Policy, PolicyError, ResolveContext, ResolvedPolicy};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Forced failures, for tests of the fail-closed paths (never set in production).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Pretend the kernel only offers this Landlock ABI.
    LandlockAbi(u32),
    /// Make the seccomp installation fail in the child.
    SeccompInstall,
    /// Make the capability drop fail in the child.
    CapDrop,
    /// Make `landlock_restrict_self` fail in the child.
    LandlockRestrict,
}

/// A handle that stops or signals a running command. Cloneable; usable from any thread, also
/// while [`run`] or [`crate::Prepared::run`] blocks in another.
///
/// - [`Cancel::cancel`]: SIGTERM to every process of the run, SIGKILL to the whole run after
///   `limits.kill_grace_ms`.
/// - [`Cancel::kill`]: SIGKILL to the whole run at once.
/// - [`Cancel::signal`]: one signal to every process of the run, nothing else.
///
/// `cancel` and `kill` are sticky: a run that starts watching the handle later (or another
/// run sharing it) is stopped as soon as it starts; both are recorded
/// ([`ExitRecord::cancelled`], `killed_by = "cancel"`). A signal reaches the runs watching
/// the handle when it is sent: from the moment [`run`] or [`crate::Prepared::run`] is
/// entered (signals sent while the sandbox is being set up are queued and delivered once its
/// pid 1 exists) until that pid 1 has exited. Before a run starts or after it has ended it is
/// a no-op.
#[derive(Debug, Clone)]
pub struct Cancel {
    state: Arc<Mutex<CancelState>>,
}

/// What a [`Cancel`] asks of the runs watching it.
#[derive(Debug, Default)]
struct CancelState {
    /// [`Cancel::cancel`] was called.
    cancelled: bool,
    /// [`Cancel::kill`] was called.
    killed: bool,
    /// The runs watching the handle now.
    watchers: Vec<Watcher>,
    next_id: u64,
}

/// One run watching a [`Cancel`]: its own wake-up eventfd (several runs may share a handle,
/// and reading an eventfd resets it for every reader) and the signals queued for it.
#[derive(Debug)]
struct Watcher {
    id: u64,
    wake: Arc<OwnedFd>,
    signals: Vec<i32>,
}

impl CancelState {
    fn wake_all(&self) {
        for w in &self.watchers {
            let _ = sys::write_all(w.wake.as_raw_fd(), &1u64.to_ne_bytes());
        }
    }
}

/// What a watching run has been asked to do since it last looked.
#[derive(Debug, Default)]
pub(crate) struct Requests {
    /// [`Cancel::cancel`] (sticky: reported every time).
    pub(crate) cancel: bool,
    /// [`Cancel::kill`] (sticky: reported every time).
    pub(crate) kill: bool,
    /// Signals to forward, in the order they were sent.
    pub(crate) signals: Vec<i32>,
}

/// A run's registration with a [`Cancel`]; dropping it ends the watch (later signals are
/// no-ops for this run).
pub(crate) struct CancelWatch {
    state: Arc<Mutex<CancelState>>,
    id: u64,
    wake: Arc<OwnedFd>,
}

impl CancelWatch {
    /// Readable when there is something to [`CancelWatch::take`].
    pub(crate) fn fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Resets the wake-up and returns what was asked (a request arriving after the reset
    /// wakes the next poll again).
    pub(crate) fn take(&self) -> Requests {
        let mut counter = [0u8; 8];
        let _ = sys::read(self.wake.as_raw_fd(), &mut counter);
        let mut st = lock_state(&self.state);
        let (cancel, kill) = (st.cancelled, st.killed);
        let signals = st
            .watchers
            .iter_mut()
            .find(|w| w.id == self.id)
            .map(|w| std::mem::take(&mut w.signals))
            .unwrap_or_default();
        Requests {
            cancel,
            kill,
            signals,
        }
    }
}

impl Drop for CancelWatch {
    fn drop(&mut self) {
        lock_state(&self.state).watchers.retain(|w| w.id != self.id);
    }
}

fn lock_state(m: &Mutex<CancelState>) -> std::sync::MutexGuard<'_, CancelState> {
    // Every update is a single field or vector operation: a poisoned lock is still consistent.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Cancel {
    /// A new, untriggered handle.
    pub fn new() -> io::Result<Cancel> {
        Ok(Cancel {
            state: Arc::new(Mutex::new(CancelState::default())),
        })
    }

    /// Requests cancellation: SIGTERM to every process of the run (forwarded by its pid 1),
    /// SIGKILL to the whole run after the grace period.
    pub fn cancel(&self) {
        let mut st = lock_state(&self.state);
        st.cancelled = true;
        st.wake_all();
    }

    /// Kills the run at once: SIGKILL to its pid 1 (the one-shot init stage, or a prepared
    /// call's init), and the kernel kills every process of its pid namespace with it,
    /// setsid'd and double-forked ones included. Recorded like [`Cancel::cancel`].
    pub fn kill(&self) {
        let mut st = lock_state(&self.state);
        st.killed = true;
        st.wake_all();
    }

    /// Delivers `sig` once to every process of the run (sent to its pid 1, which forwards it
    /// with `kill(-1, sig)`), and nothing else: no escalation, not recorded as a cancel.
    /// `SIGKILL` is [`Cancel::kill`]. Allowed: [`Cancel::SIGNALS`]; anything else is refused
    /// with [`SandboxError::UnsupportedSignal`] and the run goes on. A no-op for runs that
    /// have not started or have ended.
    pub fn signal(&self, sig: i32) -> Result<(), SandboxError> {
        if sig == libc::SIGKILL {
            self.kill();
            return Ok(());
        }
        if !sys::FORWARDED.contains(&sig) {
            return Err(SandboxError::UnsupportedSignal { signal: sig });
        }
        let mut st = lock_state(&self.state);
        for w in &mut st.watchers {
            w.signals.push(sig);
        }
        st.wake_all();
        Ok(())
    }

    /// The signals [`Cancel::signal`] accepts: SIGHUP, SIGINT, SIGQUIT, SIGKILL, SIGUSR1,
    /// SIGUSR2, SIGALRM, SIGTERM, SIGCONT, SIGWINCH.
    pub const SIGNALS: [i32; 10] = [
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGKILL,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGTERM,
        libc::SIGCONT,
        libc::SIGWINCH,
    ];

    /// Starts watching the handle for one run (its own wake-up eventfd, already readable if
    /// the handle was cancelled or killed before).
    pub(crate) fn watch(&self) -> io::Result<CancelWatch> {
        let wake = Arc::new(sys::eventfd()?);
        let mut st = lock_state(&self.state);
        let id = st.next_id;
        st.next_id += 1;
        if st.cancelled || st.killed {
            sys::write_all(wake.as_raw_fd(), &1u64.to_ne_bytes())?;
        }
        st.watchers.push(Watcher {
            id,
            wake: wake.clone(),
            signals: Vec::new(),
        });
        Ok(CancelWatch {
            state: self.state.clone(),
            id,
            wake,
        })
    }
}

/// The run's registration with `req.cancel`, taken first thing in a run.
pub(crate) fn watch_cancel(req: &RunRequest) -> Result<Option<CancelWatch>, SandboxError> {
    req.cancel
        .as_ref()
        .map(Cancel::watch)
        .transpose()
        .map_err(io_err("watch the cancellation handle"))
}

/// `Cancel::SIGNALS` as `"1 (SIGHUP), 2 (SIGINT), …"`, for the refusal message.
fn allowed_signals() -> String {
    Cancel::SIGNALS
        .iter()
        .map(|s| format!("{s} ({})", signal_name(*s)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGCONT => "SIGCONT",
        libc::SIGWINCH => "SIGWINCH",
        _ => "?",
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// Program and arguments; a program without `/` is looked up in the sandbox's `PATH`.
    pub argv: Vec<OsString>,
    /// The workspace and working directory (absolute).
    pub workdir: PathBuf,
    /// The user's home (for `{home}` and secret locations).
    pub home: PathBuf,
    /// Optional cancellation handle.
    pub cancel: Option<Cancel>,
    /// The environment to pick allowlisted variables from (normally the runner's).
    pub base_env: Vec<(OsString, OsString)>,
    /// Bytes fed to the tool's stdin (then EOF); `None` means stdin is `/dev/null`.
    pub stdin: Option<Vec<u8>>,
    /// Relay this fd (a pipe or file, ideally non-blocking: see [`forwardable_stdin`]) to the
    /// tool's stdin until EOF; takes precedence over `stdin`. The tool never gets the fd
    /// itself, only a socket the runner copies into.
    pub stdin_fd: Option<Arc<OwnedFd>>,
    /// The directory the tool starts in (default: the workdir). Absolute, or relative to the
    /// workdir; resolved lexically (`.` dropped, `..` pops a component; climbing above `/` is
    /// refused), never through the host's symlinks. It need not be inside the workspace: the
    /// tool changes to it inside the sandbox and, unless it is the workdir, checks after
    /// Landlock is applied that it may list it, so the policy decides. (The workdir is exempt:
    /// it may be a carved-out home without a Landlock rule of its own.) A failure is
    /// [`SandboxError::Cwd`], naming the directory, and the command does not run.
    pub cwd: Option<PathBuf>,
    /// A timeout for this run that can only narrow the policy's: the effective wall timeout
    /// is the smaller of `limits.timeout_seconds` and this (recorded in
    /// [`RunRecord::limits`]). 0 is refused.
    pub timeout_seconds: Option<u64>,
    /// More paths to hide from the tool, besides the secret locations and other homes (the
    /// runner's own state and configuration directories): see [`MountRecord::hidden`].
    pub hidden: Vec<PathBuf>,
    /// Union mounts (bead namespaces): each an overlay of read-only lower layers over a
    /// writable upper layer, at a point that need not exist on the host (see
    /// [`crate::UnionMount`]). Not empty: the run gets a new root that holds the points. One-shot
    /// runs only; [`crate::Prepared::run`] refuses them.
    pub unions: Vec<crate::UnionMount>,
    /// Execute this descriptor (`execveat(fd, "", argv, envp, AT_EMPTY_PATH)`) instead of
    /// looking `argv[0]` up: what runs is the file the caller opened (and checked), whatever
    /// its path names by then. `argv` is passed unchanged. One-shot runs only;
    /// [`crate::Prepared::run`] refuses it.
    pub exec_fd: Option<ExecFd>,
    /// Descriptors the tool inherits: `pass_fds[i]` is fd 7 + i in the tool, reachable as
    /// [`pass_fd_path`]`(i)` (`/proc/self/fd/7`, …), open across its `execve`. At most
    /// [`MAX_PASS_FDS`]. One-shot runs only; [`crate::Prepared::run`] refuses them.
    pub pass_fds: Vec<Arc<OwnedFd>>,
    /// Tests only: force a failure.
    pub fault: Option<Fault>,
}

/// The program of a run as a descriptor ([`RunRequest::exec_fd`]).
#[derive(Debug, Clone)]
pub struct ExecFd {
    /// The program: an ELF file or a `#!` script, open for reading. A script's descriptor is
    /// left open in the tool (as the number after the passed ones: the kernel hands its
    /// interpreter `/dev/fd/N`); an ELF file's is closed by the exec.
    pub fd: Arc<OwnedFd>,
    /// Where it was opened from: the record's `program` and error messages (never looked up).
    pub path: PathBuf,
}

/// The most descriptors a run can pass to its tool ([`RunRequest::pass_fds`]).
pub const MAX_PASS_FDS: usize = sys::MAX_PASS_FDS;

/// The path the tool reaches `pass_fds[i]` by ([`RunRequest::pass_fds`]): `/proc/self/fd/N`,
/// N = 7 + i.
pub fn pass_fd_path(i: usize) -> String {
    format!("/proc/self/fd/{}", sys::FD_PASS_BASE as usize + i)
}

/// Which output stream a chunk came from (see [`run_streaming`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The tool's stdout.
    Stdout,
    /// The tool's stderr.
    Stderr,
}

impl RunRequest {
    /// A request with the current environment and `$HOME`.
    pub fn new(argv: Vec<OsString>, workdir: PathBuf) -> RunRequest {
        RunRequest {
            argv,
            workdir,
            home: std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from),
            cancel: None,
            base_env: std::env::vars_os().collect(),
            stdin: None,
            stdin_fd: None,
            cwd: None,
            timeout_seconds: None,
            hidden: Vec::new(),
            unions: Vec::new(),
            exec_fd: None,
            pass_fds: Vec::new(),
            fault: None,
        }
    }
}

/// Why a run was refused or could not be started. The tool did not run.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The request itself is malformed.
    #[error("invalid run request: {reason}")]
    InvalidRequest {
        /// What was wrong.
        reason: String,
    },
    /// The workspace does not exist or cannot be resolved.
    #[error("workdir {path} is not accessible")]
    Workdir {
        /// The workdir as given.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The policy does not resolve for this workspace/home.
    #[error("policy does not apply")]
    Policy {
        /// The cause.
        #[source]
        source: PolicyError,
    },
    /// Landlock cannot be enforced as required.
    #[error(transparent)]
    Landlock(#[from] LandlockError),
    /// The seccomp filters could not be built.
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    /// The namespaces could not be created (unprivileged user namespaces disabled?).
    #[error("sandbox namespaces could not be created (need unprivileged user namespaces)")]
    Namespaces {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A union mount ([`RunRequest::unions`]) is malformed or unsafe; nothing ran.
    #[error("union at {point} refused: {reason}")]
    Union {
        /// The union's point as given.
        point: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// Running as root without a usable pids cgroup: nothing would bound the process count.
    #[error(
        "no pids cgroup could be created: as root, RLIMIT_NPROC does not limit processes (mount a writable pids cgroup, run unprivileged, or set best_effort = true)"
    )]
    ProcessLimit,
    /// A hardening step failed in the child; the command was not executed.
    #[error("sandbox set-up failed at {stage}; the command did not run")]
    ChildSetup {
        /// The failed step.
        stage: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// The program could not be executed (not found, not executable, denied).
    #[error("cannot execute {program}")]
    Exec {
        /// The program.
        program: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A protected path could not be blocked (the command did not run).
    #[error(transparent)]
    Protect(#[from] crate::placeholder::ProtectError),
    /// The tool could not start in its working directory ([`RunRequest::cwd`], or the
    /// workdir): missing, not a directory, or not listable under the policy. The command did
    /// not run.
    #[error("cannot start in working directory {path}")]
    Cwd {
        /// The directory, as resolved.
        path: PathBuf,
        /// The cause (EACCES: the policy does not let the tool list it).
        #[source]
        source: io::Error,
    },
    /// [`Cancel::signal`] was asked for a signal it does not deliver; nothing was sent.
    #[error(
        "signal {signal} cannot be sent to a run; allowed: {}",
        allowed_signals()
    )]
    UnsupportedSignal {
        /// The refused signal number.
        signal: i32,
    },
    /// [`crate::harden::harden_server`] failed at a step (the process may be partly hardened
    /// and should exit).
    #[error(transparent)]
    Harden(#[from] crate::harden::HardenError),
    /// A runner-side system call failed.
    #[error("sandbox runner failed to {op}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

pub(crate) fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> SandboxError {
    move |source| SandboxError::Io { op, source }
}

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
    /// Union mounts, paths resolved (missing lower layers left out). Not empty: the root was
    /// a new read-only tmpfs holding the host's top-level entries and the points.
    pub unions: Vec<crate::UnionMount>,
    /// Paths hidden from the tool (an empty, inaccessible tmpfs over a directory, `/dev/null`
    /// over a file): secret locations, the runner's state and configuration, homes and
    /// `/run/user` that hold none of the policy's paths.
    pub hidden: Vec<PathBuf>,
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
    /// Namespaces the tool runs in.
    pub namespaces: Vec<&'static str>,
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
    /// The tool overshot by more than an eighth of the limit (or half the reserve): the runner
    /// sent SIGKILL at once instead of waiting for the grace period.
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
    /// How the program was started: `path` (`execve` of `program`) or `fd` (`execveat` of
    /// the caller's descriptor, [`RunRequest::exec_fd`], opened from `program`).
    pub exec: ExecFrom,
    /// The paths the tool reached the descriptors it inherited by ([`RunRequest::pass_fds`]),
    /// in order; empty for ordinary runs.
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
    /// `execveat` of the descriptor the caller gave ([`RunRequest::exec_fd`]).
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

pub(crate) fn cstr(b: &[u8], what: &str) -> Result<CString, SandboxError> {
    CString::new(b).map_err(|_| SandboxError::InvalidRequest {
        reason: format!("{what} contains a NUL byte"),
    })
}

fn find_program(argv0: &Path, path_var: Option<&str>, cwd: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let is_exec = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if argv0.as_os_str().as_bytes().contains(&b'/') {
        return Some(cwd.join(argv0));
    }
    for dir in path_var.unwrap_or("/usr/bin:/bin").split(':') {
        if dir.is_empty() {
            continue;
        }
        let cand = Path::new(dir).join(argv0);
        if is_exec(&cand) {
            return Some(cand);
        }
    }
    None
}

/// The running sandbox (its init stage). Dropping it without [`Running::reap`] kills and
/// reaps the whole run, so no early return can leave a sandbox behind.
struct Running {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    /// The run's cgroups, removed after the run (dropped after the kill in `drop`).
    cgroups: Option<RunCgroups>,
    reaped: bool,
}

impl Running {
    fn signal(&self, sig: i32) {
        let _ = sys::pidfd_send_signal(&self.pidfd, sig);
    }

    fn reap(&mut self) -> io::Result<(i32, sys::Rusage)> {
        let r = sys::wait4(self.pid);
        self.reaped = r.is_ok();
        r
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.reaped {
            self.signal(libc::SIGKILL);
            let _ = sys::wait4(self.pid);
        }
        // Every process of the run is gone: its cgroups can be removed.
        drop(self.cgroups.take());
    }
}

/// One output stream of the tool: what was kept and how much was written.
pub(crate) struct Capture {
    kind: Stream,
    fd: OwnedFd,
    buf: Vec<u8>,
    total: u64,
    cap: u64,
    open: bool,
}

impl Capture {
    /// Captures the read end `fd` of a tool's output pipe (made non-blocking), keeping at
    /// most `cap` bytes.
    pub(crate) fn new(kind: Stream, fd: OwnedFd, cap: u64) -> Result<Capture, SandboxError> {
        sys::set_nonblocking(fd.as_raw_fd()).map_err(io_err("configure pipes"))?;
        Ok(Capture {
            kind,
            fd,
            buf: Vec::new(),
            total: 0,
            cap,
            open: true,
        })
    }

    /// The stream as recorded.
    fn record(&self) -> OutputRecord {
        OutputRecord {
            total_bytes: self.total,
            captured_bytes: self.buf.len() as u64,
            truncated: self.total > self.buf.len() as u64,
        }
    }

    /// Reads what is available, at most 1 MiB per call so a flood cannot starve the
    /// deadline checks of the poll loop.
    fn drain(&mut self, sink: &mut dyn FnMut(Stream, &[u8])) -> Result<(), SandboxError> {
        let mut chunk = [0u8; 65536];
        for _ in 0..16 {
            match sys::read(self.fd.as_raw_fd(), &mut chunk) {
                Ok(0) => {
                    self.open = false;
                    return Ok(());
                }
                Ok(n) => {
                    sink(self.kind, &chunk[..n]);
                    self.total += n as u64;
                    let room = self.cap.saturating_sub(self.buf.len() as u64) as usize;
                    self.buf.extend_from_slice(&chunk[..n.min(room)]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => {
                    return Err(SandboxError::Io {
                        op: "read output",
                        source: e,
                    });
                }
            }
        }
        Ok(())
    }
}

/// How often the runner samples the free space of the writable filesystems. With
/// `fallocate` refused (seccomp) and every file bounded by RLIMIT_FSIZE ≤ `disk_bytes`, a
/// tool takes space only as fast as it writes, so the overshoot is about two samples' worth
/// of writing (the gross-overshoot rule kills at once past an eighth).
const DISK_SAMPLE: Duration = Duration::from_millis(10);
/// The free-space reserve: 1/20 (5%) of the filesystem, at most this many bytes.
const RESERVE_BYTES_MAX: u64 = 1 << 30;
/// The free-inode reserve: 1/20 (5%) of the filesystem's inodes, at most this many.
const RESERVE_INODES_MAX: u64 = 100_000;

/// One watched filesystem (by a writable tree on it).
#[derive(Debug)]
struct WatchedFs {
    path: PathBuf,
    fd: OwnedFd,
    start: sys::FsSpace,
}

/// The aggregate disk watchdog: the free space and inodes of every writable tree's
/// filesystem, sampled with `fstatfs` at the start and every [`DISK_SAMPLE`] while the tool
/// runs. Other writers on the same filesystem count as the tool's (conservative), and space
/// they free hides the tool's use (the reserve still holds).
#[derive(Debug)]
pub(crate) struct DiskWatch {
    fs: Vec<WatchedFs>,
    bytes: u64,
    inodes: u64,
    next: Instant,
}

impl DiskWatch {
    /// Takes the baseline of each distinct filesystem holding a writable tree.
    pub(crate) fn start(
        writable: &[PathBuf],
        l: &ollie_policy::Limits,
        now: Instant,
    ) -> Result<DiskWatch, SandboxError> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut fs: Vec<WatchedFs> = Vec::new();
        let mut devs: Vec<u64> = Vec::new();
        for w in writable {
            let fd: OwnedFd = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
                .open(w)
                .map_err(io_err("open a writable tree to watch its disk use"))?
                .into();
            let (dev, ..) = sys::fstat_ids(&fd).map_err(io_err("sample free disk space"))?;
            if devs.contains(&dev) {
                continue;
            }
            devs.push(dev);
            let start = sys::fstatfs(&fd).map_err(io_err("sample free disk space"))?;
            fs.push(WatchedFs {
                path: w.clone(),
                fd,
                start,
            });
        }
        Ok(DiskWatch {
            fs,
            bytes: l.disk_bytes,
            inodes: l.disk_inodes,
            next: now + DISK_SAMPLE,
        })
    }

    /// When the next sample is due (`None`: nothing to watch).
    pub(crate) fn due(&self) -> Option<Instant> {
        (!self.fs.is_empty()).then_some(self.next)
    }

    /// Samples every filesystem if due; the first limit crossed, if any.
    pub(crate) fn sample(&mut self, now: Instant) -> Option<DiskLimitRecord> {
        if self.fs.is_empty() || now < self.next {
            return None;
        }
        self.next = now + DISK_SAMPLE;
        for w in &self.fs {
            // A failed sample (should not happen on an open fd) is skipped, not fatal: the
            // rlimits and the timeout still bound the run.
            let Ok(cur) = sys::fstatfs(&w.fd) else {
                continue;
            };
            if let Some((limit, allowed, observed, forced_kill)) =
                disk_verdict(&w.start, &cur, self.bytes, self.inodes)
            {
                return Some(DiskLimitRecord {
                    limit,
                    path: w.path.clone(),
                    allowed,
                    observed,
                    free_bytes_start: w.start.free_bytes,
                    free_bytes_stop: cur.free_bytes,
                    free_inodes_start: w.start.free_inodes,
                    free_inodes_stop: cur.free_inodes,
                    forced_kill,
                });
            }
        }
        None
    }
}

/// Whether a filesystem sampled at `cur` (baseline `start`) crossed a limit: which, its value,
/// the observed value, and whether the overshoot is gross (more than an eighth past the
/// limit, or below half the reserve).
fn disk_verdict(
    start: &sys::FsSpace,
    cur: &sys::FsSpace,
    bytes: u64,
    inodes: u64,
) -> Option<(DiskLimit, u64, u64, bool)> {
    let used = start.free_bytes.saturating_sub(cur.free_bytes);
    if used > bytes {
        return Some((DiskLimit::DiskBytes, bytes, used, used > bytes + bytes / 8));
    }
    // Filesystems without inode accounting report 0 inodes (btrfs).
    let has_inodes = start.total_inodes > 0;
    let used_inodes = start.free_inodes.saturating_sub(cur.free_inodes);
    if has_inodes && used_inodes > inodes {
        return Some((
            DiskLimit::DiskInodes,
            inodes,
            used_inodes,
            used_inodes > inodes + inodes / 8,
        ));
    }
    let reserve = (cur.total_bytes / 20).min(RESERVE_BYTES_MAX);
    if cur.avail_bytes < reserve && cur.avail_bytes < start.avail_bytes {
        return Some((
            DiskLimit::ReserveBytes,
            reserve,
            cur.avail_bytes,
            cur.avail_bytes < reserve / 2,
        ));
    }
    let reserve_inodes = (cur.total_inodes / 20).min(RESERVE_INODES_MAX);
    if has_inodes && cur.free_inodes < reserve_inodes && cur.free_inodes < start.free_inodes {
        return Some((
            DiskLimit::ReserveInodes,
            reserve_inodes,
            cur.free_inodes,
            cur.free_inodes < reserve_inodes / 2,
        ));
    }
    None
}

/// Bytes read from a relayed stdin per poll round (the relay buffer's bound).
const RELAY_CHUNK: usize = 64 * 1024;

/// The runner's own stdin, prepared for [`RunRequest::stdin_fd`]: `None` when it is a terminal
/// (the tool then gets `/dev/null`: it must never read the user's keystrokes or reach the
/// tty), otherwise a new non-blocking open file description of the same pipe or file (so the
/// runner's poll loop never blocks on it and the caller's description keeps its flags), or,
/// where it cannot be reopened (a socket), a duplicate.
pub fn forwardable_stdin() -> Option<OwnedFd> {
    use std::io::IsTerminal;
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return None;
    }
    match sys::reopen_nonblocking(0) {
        Ok(fd) => Some(fd),
        Err(_) => stdin.as_fd().try_clone_to_owned().ok(),
    }
}

pub(crate) fn policy_hash(p: &ResolvedPolicy) -> String {
    let mut h = Sha256::new();
    h.update(format!("{p:?}").as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs one command under `policy`. Blocks until the command and every process it started
/// are gone. Fails closed: if any required layer cannot be applied, the command does not run
/// and the error says which layer. A policy widened by an approved `unsandboxed` grant
/// ([`Policy::unsandboxed`]) runs without Landlock and without read-only mounts, with every
/// other layer, and the record says so ([`Layers::unsandboxed`]).
pub fn run(policy: &Policy, req: &RunRequest) -> Result<RunOutput, SandboxError> {
    run_streaming(policy, req, &mut |_, _| {})
}

/// Like [`run`], and also hands every chunk of output to `sink` as it arrives (the whole
/// stream, not only the captured prefix), for live display.
pub fn run_streaming(
    policy: &Policy,
    req: &RunRequest,
    sink: &mut dyn FnMut(Stream, &[u8]),
) -> Result<RunOutput, SandboxError> {
    let started = Instant::now();
    if req.argv.is_empty() {
        return Err(SandboxError::InvalidRequest {
            reason: "no command given".into(),
        });
    }
    if req.pass_fds.len() > MAX_PASS_FDS {
        return Err(SandboxError::InvalidRequest {
            reason: format!(
                "at most {MAX_PASS_FDS} descriptors can be passed to a tool ({} given)",
                req.pass_fds.len()
            ),
        });
    }
    let exec_fd_inherit = match &req.exec_fd {
        None => false,
        Some(x) => is_script(&x.fd)?,
    };
    // From here on the run is started: signals sent to its handle are queued for it.
    let cancel = watch_cancel(req)?;
    let workdir = canonical_workdir(&req.workdir)?;
    let ctx = ResolveContext {
        workdir: workdir.clone(),
        home: req.home.clone(),
    };
    let resolved = policy
        .resolve(&ctx)
        .map_err(|source| SandboxError::Policy { source })?;

    // Landlock ruleset (parent side).
    // (None for an approved unsandboxed run: no Landlock, recorded.)
    let ruleset = landlock::build(&resolved, simulated_abi(req.fault))?;
    let filters = seccomp::filters(&resolved.network, &resolved.policy.syscalls.deny)?;

    let cwd = tool_cwd(&workdir, req.cwd.as_deref())?;
    let l = effective_limits(&resolved.policy.limits, req)?;
    let (env, program) = tool_command(&resolved, req, &workdir, &cwd)?;

    let argv_c: Vec<CString> = req
        .argv
        .iter()
        .map(|a| cstr(a.as_bytes(), "argument"))
        .collect::<Result<_, _>>()?;
    let env_c: Vec<CString> = env
        .iter()
        .map(|(k, v)| {
            let mut b = k.as_bytes().to_vec();
            b.push(b'=');
            b.extend_from_slice(v);
            cstr(&b, "environment value")
        })
        .collect::<Result<_, _>>()?;
    let mut argv_p: Vec<*const libc::c_char> = argv_c.iter().map(|c| c.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut envp_p: Vec<*const libc::c_char> = env_c.iter().map(|c| c.as_ptr()).collect();
    envp_p.push(std::ptr::null());

    let writable = crate::mounts::writable_trees(&resolved);
    // The post-run diff's baseline: the workspace as the host has it (before placeholders);
    // only when the tool can write somewhere in it (always when it runs unsandboxed).
    let snapshot_before = (resolved.unsandboxed()
        || writable
            .iter()
            .any(|w| workdir.starts_with(w) || w.starts_with(&workdir)))
    .then(|| crate::postrun::Snapshot::take(&workdir));
    let unions = crate::unions::validate(
        &req.unions,
        &crate::unions::resolved_secrets(&resolved.ctx.home),
        &writable,
    )?;
    // The disk watchdog watches the policy's writable trees' filesystems, also when an
    // unsandboxed run mounts none of them, and the filesystems of the unions' upper layers.
    let mut watched = writable.clone();
    watched.extend(unions.iter().map(|u| u.upper.clone()));
    let MountPlan {
        steps: mounts,
        record: mount_record,
        islands,
    } = MountPlan::new(
        &resolved,
        writable,
        ruleset.record.abi,
        &unions,
        ruleset.root_access,
        &req.hidden,
    )?;

    let (stdin_child, stdin_feed) = tool_stdin(req, open_devnull)?;
    let (out_r, out_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (errout_r, errout_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (err_r, err_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (status_r, status_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (sync_r, sync_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (uid, _) = sys::ids();
    let mut plan = child_plan(
        ruleset.fd.as_ref().map(AsRawFd::as_raw_fd),
        mounts,
        rlimits(&l),
        filters.programs.iter().map(to_sock_filters).collect(),
    )?;
    plan.stdin = stdin_child.as_raw_fd();
    plan.stdout = out_w.as_raw_fd();
    plan.stderr = errout_w.as_raw_fd();
    plan.err_w = err_w.as_raw_fd();
    plan.status_w = status_w.as_raw_fd();
    plan.sync_r = sync_r.as_raw_fd();
    plan.exe = sys::cstring(&program).map_err(io_err("prepare exec"))?;
    plan.argv = argv_p;
    plan.envp = envp_p;
    plan.cwd = sys::cstring(&cwd).map_err(io_err("prepare exec"))?;
    plan.check_cwd = cwd != workdir;
    plan.fault = child_fault(req.fault);
    plan.pass = req.pass_fds.iter().map(|f| f.as_raw_fd()).collect();
    if let Some(x) = &req.exec_fd {
        plan.exec_fd = x.fd.as_raw_fd();
        plan.exec_fd_inherit = exec_fd_inherit;
    }

    let (pid, pidfd) =
        sys::spawn_init(&plan).map_err(|source| SandboxError::Namespaces { source })?;
    let mut running = Running {
        pid,
        pidfd,
        cgroups: None,
        reaped: false,
    };
    // The child's ends.
    drop((stdin_child, out_w, errout_w, err_w, status_w, sync_r));
    // A fresh pids and memory cgroup before init does anything (root runs need the pids one:
    // RLIMIT_NPROC does not bind uid 0; fail closed).
    let cgroup_degraded = place_in_cgroup(
        uid,
        pid,
        &l,
        resolved.policy.best_effort,
        &mut running.cgroups,
    )?;
    let cgroup = running
        .cgroups
        .as_ref()
        .and_then(RunCgroups::pids)
        .map(Path::to_path_buf);
    // The disk watchdog's baseline, taken before the tool can write anything.
    let disk = DiskWatch::start(&watched, &l, Instant::now())?;
    let go = sys::write_all(sync_w.as_raw_fd(), b"g");
    drop(sync_w);
    go.map_err(io_err("start the sandbox"))?;

    // Wait for exec (EOF on the close-on-exec error pipe) or a failure report.
    if let Some(msg) = read_report(&err_r)? {
        drop(running);
        return Err(stage_error(msg, &program, &cwd));
    }
    drop(err_r);

    let mut out = Capture::new(Stream::Stdout, out_r, l.output_bytes)?;
    let mut errc = Capture::new(Stream::Stderr, errout_r, l.output_bytes)?;
    let stopped = supervise(
        Watch {
            pidfd: running.pidfd.as_raw_fd(),
            signal: &|sig| running.signal(sig),
            req,
            limits: &l,
            started,
            disk,
            feed: stdin_feed,
            cancel,
        },
        &mut out,
        &mut errc,
        sink,
    )?;
    let (init_status, rusage) = running.reap().map_err(io_err("reap the sandbox"))?;
    let memory = running.cgroups.as_ref().map_or_else(
        || MemoryRecord::none(MemoryScope::Run, "no memory cgroup was made"),
        |c| c.memory_record(MemoryScope::Run, c.oom_kills()),
    );
    let mut st = [0u8; 4];
    let tool_status = match sys::read(status_r.as_raw_fd(), &mut st) {
        Ok(4) => Some(i32::from_ne_bytes(st)),
        _ => None,
    };
    // The init stage itself was killed (timeout after the grace period, or cancel).
    let init_signal = libc::WIFSIGNALED(init_status).then(|| libc::WTERMSIG(init_status));
    // Every process of the run is gone (init reaped): remove the placeholders no other run
    // uses, then compare with the baseline.
    drop(islands);
    let mut post_run = snapshot_before
        .map(|b| b.diff(&crate::postrun::Snapshot::take(&workdir)))
        .unwrap_or_default();
    post_run.add(crate::postrun::setid_flags(&watched, &workdir));
    let shm_bytes = l.shm_bytes;
    Ok(run_output(
        req,
        &env,
        started,
        Finished {
            cwd,
            program,
            policy_hash: policy_hash(&resolved),
            layers: Layers::enforced(
                ruleset.record,
                filters.record,
                sys::namespace_names(),
                mount_record,
                cgroup,
                cgroup_degraded,
                memory,
            ),
            limits: LimitsRecord::new(&l, shm_bytes),
            stopped,
            exit: exit_of(tool_status, init_signal),
            rusage: RusageRecord {
                user_ms: rusage.user_us / 1000,
                sys_ms: rusage.sys_us / 1000,
                max_rss_kb: rusage.max_rss_kb,
            },
            post_run,
        },
        out,
        errc,
    ))
}

/// Whether the program descriptor `fd` holds a `#!` script (its first two bytes, read without
/// moving the offset).
fn is_script(fd: &OwnedFd) -> Result<bool, SandboxError> {
    let mut head = [0u8; 2];
    let mut got = 0;
    while got < head.len() {
        match sys::pread(fd.as_raw_fd(), &mut head[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(source) => {
                return Err(SandboxError::Io {
                    op: "read the program descriptor",
                    source,
                });
            }
        }
    }
    Ok(head == *b"#!")
}

/// The Landlock ABI a test fault simulates (the parent builds the ruleset for it).
pub(crate) fn simulated_abi(fault: Option<Fault>) -> Option<u32> {
    match fault {
        Some(Fault::LandlockAbi(a)) => Some(a),
        _ => None,
    }
}

/// The tool's stdin for `req`: `(tool's end, runner's end to feed)`. `/dev/null` (from
/// `devnull`) when the request has neither [`RunRequest::stdin`] nor
/// [`RunRequest::stdin_fd`]; otherwise a socketpair the runner feeds the bytes into or relays
/// the caller's fd through (a socket, so a tool that closes its stdin early gives EPIPE
/// without SIGPIPE in the runner: MSG_NOSIGNAL). The caller's fd itself never reaches the
/// tool.
pub(crate) fn tool_stdin(
    req: &RunRequest,
    devnull: impl FnOnce() -> Result<OwnedFd, SandboxError>,
) -> Result<(OwnedFd, Option<OwnedFd>), SandboxError> {
    match (&req.stdin, &req.stdin_fd) {
        (None, None) => Ok((devnull()?, None)),
        _ => {
            let (child, feed) = stdin_socket()?;
            Ok((child, Some(feed)))
        }
    }
}

/// `/dev/null` for a tool's stdin.
pub(crate) fn open_devnull() -> Result<OwnedFd, SandboxError> {
    Ok(std::fs::File::open("/dev/null")
        .map_err(io_err("open /dev/null"))?
        .into())
}

/// The tool's stdin as a socketpair the runner feeds: `(tool's end, runner's end)`. A socket,
/// so a tool that closes its stdin early gives EPIPE without SIGPIPE in the runner.
fn stdin_socket() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    let (a, b) = sys::socketpair().map_err(io_err("create the stdin socket"))?;
    sys::shutdown_read(&b).map_err(io_err("create the stdin socket"))?;
    Ok((a, b))
}

/// The tool's rlimits (soft = hard), in the order the child sets them.
pub(crate) fn rlimits(l: &ollie_policy::Limits) -> Vec<(libc::__rlimit_resource_t, u64)> {
    vec![
        (libc::RLIMIT_CPU, l.cpu_seconds),
        (libc::RLIMIT_AS, l.address_space_bytes),
        (libc::RLIMIT_NPROC, l.processes),
        (libc::RLIMIT_FSIZE, file_size_limit(l)),
        (libc::RLIMIT_NOFILE, l.open_files),
        (libc::RLIMIT_CORE, 0),
    ]
}

/// RLIMIT_FSIZE: the policy's file size, never more than the run's disk budget, so that no
/// single write, truncate or copy can take more space than the whole run may (the kernel
/// refuses it with SIGXFSZ/EFBIG; the disk watchdog bounds the sum over many files).
pub(crate) fn file_size_limit(l: &ollie_policy::Limits) -> u64 {
    l.file_size_bytes.min(l.disk_bytes)
}

/// A seccompiler program as the kernel takes it.
pub(crate) fn to_sock_filters(p: &seccompiler::BpfProgram) -> Vec<libc::sock_filter> {
    p.iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect()
}

/// The plan of pid 1 of new namespaces (the init stage, or a prepared sandbox's zygote): id
/// maps for the caller's uid and gid, mounts, rlimits, the ruleset (`None`: Landlock is not
/// applied, an approved unsandboxed run) and the seccomp programs.
/// The per-run fields (stdio, pipes, exec) are unset (`-1`, empty) for the caller to fill.
pub(crate) fn child_plan(
    ruleset: Option<RawFd>,
    mounts: Vec<MountStep>,
    rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    filters: Vec<Vec<libc::sock_filter>>,
) -> Result<ChildPlan, SandboxError> {
    let (uid, gid) = sys::ids();
    Ok(ChildPlan {
        stdin: -1,
        stdout: -1,
        stderr: -1,
        err_w: -1,
        status_w: -1,
        sync_r: -1,
        ruleset: ruleset.unwrap_or(-1),
        landlock: ruleset.is_some(),
        setgroups_path: c"/proc/self/setgroups".to_owned(),
        uid_map_path: c"/proc/self/uid_map".to_owned(),
        gid_map_path: c"/proc/self/gid_map".to_owned(),
        oom_path: c"/proc/self/oom_score_adj".to_owned(),
        uid_map: cstr(format!("{uid} {uid} 1").as_bytes(), "uid map")?,
        gid_map: cstr(format!("{gid} {gid} 1").as_bytes(), "gid map")?,
        mounts,
        rlimits,
        cap_last: sys::cap_last_cap(),
        filters,
        exe: CString::default(),
        argv: Vec::new(),
        envp: Vec::new(),
        cwd: CString::default(),
        check_cwd: false,
        fault: ChildFault::None,
        pass: Vec::new(),
        exec_fd: -1,
        exec_fd_inherit: false,
    })
}

/// The child-side failure a test fault forces (a simulated Landlock ABI is applied by the
/// parent, not the child).
pub(crate) fn child_fault(fault: Option<Fault>) -> ChildFault {
    match fault {
        Some(Fault::SeccompInstall) => ChildFault::SeccompInstall,
        Some(Fault::CapDrop) => ChildFault::CapDrop,
        Some(Fault::LandlockRestrict) => ChildFault::LandlockRestrict,
        None | Some(Fault::LandlockAbi(_)) => ChildFault::None,
    }
}

/// Places `pid` (a sandbox's pid 1, before it does anything) in fresh cgroups under the
/// runner's own: pids (`pids.max` = `limits.processes`) and memory (`limits.memory_bytes`),
/// kept in `slot`, whose owner kills `pid` before it drops them. As root (`uid` 0:
/// RLIMIT_NPROC does not bind it) a missing pids cgroup fails closed unless `best_effort`;
/// a missing memory cgroup is recorded ([`MemoryRecord::reason`]), never fatal. Returns
/// whether the run degraded.
pub(crate) fn place_in_cgroup(
    uid: u32,
    pid: libc::pid_t,
    l: &ollie_policy::Limits,
    best_effort: bool,
    slot: &mut Option<RunCgroups>,
) -> Result<bool, SandboxError> {
    let mut cgroups = RunCgroups::make(crate::cgroup::Want {
        processes: l.processes,
        memory_bytes: l.memory_bytes,
    });
    cgroups.place(pid);
    let pids = cgroups.pids().is_some();
    *slot = Some(cgroups);
    match (uid, pids) {
        (0, false) if best_effort => Ok(true),
        (0, false) => Err(SandboxError::ProcessLimit),
        _ => Ok(false),
    }
}

/// Reads the 8-byte failure report from a close-on-exec error pipe; `None` at EOF (the child
/// reached `execve`, or the zygote is ready).
pub(crate) fn read_report(fd: &OwnedFd) -> Result<Option<[u8; 8]>, SandboxError> {
    let mut msg = [0u8; 8];
    let mut got = 0;
    while got < msg.len() {
        match sys::read(fd.as_raw_fd(), &mut msg[got..])
            .map_err(io_err("read the start-up report"))?
        {
            0 => break,
            n => got += n,
        }
    }
    Ok((got > 0).then_some(msg))
}

/// The error a failure report names: the failed stage (or `execve` of `program`, or the
/// working directory `cwd`) and errno.
pub(crate) fn stage_error(msg: [u8; 8], program: &Path, cwd: &Path) -> SandboxError {
    let stage_n = u32::from_ne_bytes([msg[0], msg[1], msg[2], msg[3]]);
    let errno = i32::from_ne_bytes([msg[4], msg[5], msg[6], msg[7]]);
    let source = io::Error::from_raw_os_error(errno);
    match Stage::from_u32(stage_n) {
        Some(Stage::Exec) => SandboxError::Exec {
            program: program.display().to_string(),
            source,
        },
        Some(Stage::Chdir) => SandboxError::Cwd {
            path: cwd.to_path_buf(),
            source,
        },
        Some(s) => SandboxError::ChildSetup {
            stage: s.name(),
            source,
        },
        None => SandboxError::ChildSetup {
            stage: "unknown",
            source,
        },
    }
}

/// What the runner watches while a tool runs (one-shot or prepared).
pub(crate) struct Watch<'a> {
    /// Readable when pid 1 of the run (or call) has exited.
    pub(crate) pidfd: RawFd,
    /// Sends a signal to pid 1 (which forwards `sys::FORWARDED` signals to every process of
    /// the run; SIGKILL kills the run).
    pub(crate) signal: &'a dyn Fn(i32),
    /// The request: stdin bytes or relay (`stdin_fd`), the cancellation handle.
    pub(crate) req: &'a RunRequest,
    /// The timeout (already narrowed by the request: [`effective_limits`]) and grace period.
    pub(crate) limits: &'a ollie_policy::Limits,
    /// When the run started (the timeout counts from here).
    pub(crate) started: Instant,
    /// The aggregate disk watchdog (baseline taken before the tool could write).
    pub(crate) disk: DiskWatch,
    /// The runner's end of the tool's stdin socket, if it is fed.
    pub(crate) feed: Option<OwnedFd>,
    /// The run's registration with its [`Cancel`] handle (taken when the run started, so
    /// signals sent while it was being set up are delivered too).
    pub(crate) cancel: Option<CancelWatch>,
}

/// Why and how the runner stopped a run, if it did.
pub(crate) struct Stopped {
    timed_out: bool,
    cancelled: bool,
    killed_by: Option<KilledBy>,
    disk_limit: Option<DiskLimitRecord>,
}

/// Captures output, feeds stdin and enforces the timeout, the cancellation handle's requests
/// (cancel, kill, signals: watched until pid 1 has exited) and the disk limits until pid 1 of
/// the run has exited and both output streams are at EOF.
pub(crate) fn supervise(
    w: Watch<'_>,
    out: &mut Capture,
    errc: &mut Capture,
    sink: &mut dyn FnMut(Stream, &[u8]),
) -> Result<Stopped, SandboxError> {
    let Watch {
        pidfd,
        signal,
        req,
        limits,
        started,
        mut disk,
        mut feed,
        // Watched until pid 1 has exited: signals and kills keep working after a cancel.
        cancel: mut watch,
    } = w;
    let deadline = started + Duration::from_secs(limits.timeout_seconds);
    let grace = Duration::from_millis(limits.kill_grace_ms);
    let input = req.stdin.as_deref().unwrap_or_default();
    let mut term_sent: Option<Instant> = None;
    let mut killed = false;
    let mut timed_out = false;
    let mut cancelled = false;
    let mut killed_by: Option<KilledBy> = None;
    let mut disk_hit: Option<DiskLimitRecord> = None;
    let mut init_done = false;
    let mut fed = 0usize;
    let mut relay_src = req.stdin_fd.clone();
    let mut relay_buf: Vec<u8> = Vec::new();
    let mut relay_eof = relay_src.is_none();
    if let Some(f) = &feed {
        sys::set_nonblocking(f.as_raw_fd()).map_err(io_err("configure pipes"))?;
    }
    while !init_done || out.open || errc.open {
        let now = Instant::now();
        if !init_done {
            // Aggregate disk use: stopped like a timeout; a gross overshoot is killed at once.
            if !killed && let Some(hit) = disk.sample(now) {
                if term_sent.is_none() {
                    killed_by = Some(KilledBy::DiskLimit);
                    term_sent = Some(now);
                    signal(libc::SIGTERM);
                }
                if hit.forced_kill {
                    killed = true;
                    signal(libc::SIGKILL);
                }
                match &mut disk_hit {
                    None => disk_hit = Some(hit),
                    Some(first) => first.forced_kill |= hit.forced_kill,
                }
            }
            if term_sent.is_none() && now >= deadline {
                timed_out = true;
                killed_by = Some(KilledBy::Timeout);
                term_sent = Some(now);
                signal(libc::SIGTERM);
            }
            if let Some(t) = term_sent
                && !killed
                && now >= t + grace
            {
                killed = true;
                signal(libc::SIGKILL);
            }
        }
        let next = match (init_done, term_sent, killed) {
            (true, _, _) => None,
            (false, None, _) => Some(deadline),
            (false, Some(t), false) => Some(t + grace),
            (false, Some(_), true) => None,
        };
        // Sample the disk again when due (every `DISK_SAMPLE`, never a busy loop).
        let next = match (next, disk.due().filter(|_| !init_done && !killed)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timeout_ms = next.map_or(-1, |n| {
            n.saturating_duration_since(now)
                .as_millis()
                .min(i32::MAX as u128) as i32
                + 1
        });
        // Feed stdin while the tool runs (fixed bytes, or a relay through a bounded buffer);
        // EOF once everything is written or the source ends.
        if relay_src.is_some() && fed >= relay_buf.len() {
            relay_buf.clear();
            fed = 0;
        }
        let pending = if relay_src.is_some() {
            relay_buf.len() - fed
        } else {
            input.len().saturating_sub(fed)
        };
        if feed.is_some() && (init_done || (pending == 0 && relay_eof)) {
            feed = None;
            relay_src = None;
        }
        if init_done {
            // The run has ended: later requests are no-ops for it.
            watch = None;
        }
        let cancel_fd = watch.as_ref().map_or(-1, CancelWatch::fd);
        let mut fds = [
            pollin(if out.open { out.fd.as_raw_fd() } else { -1 }),
            pollin(if errc.open { errc.fd.as_raw_fd() } else { -1 }),
            pollin(if init_done { -1 } else { pidfd }),
            libc::pollfd {
                fd: feed
                    .as_ref()
                    .filter(|_| pending > 0)
                    .map_or(-1, |f| f.as_raw_fd()),
                events: libc::POLLOUT,
                revents: 0,
            },
            pollin(
                relay_src
                    .as_ref()
                    .filter(|_| feed.is_some() && pending == 0 && !relay_eof)
                    .map_or(-1, |f| f.as_raw_fd()),
            ),
            pollin(cancel_fd),
        ];
        sys::poll(&mut fds, timeout_ms).map_err(io_err("poll"))?;
        if fds[0].revents != 0 {
            out.drain(sink)?;
        }
        if fds[1].revents != 0 {
            errc.drain(sink)?;
        }
        if fds[2].revents != 0 {
            init_done = true;
        }
        if fds[3].revents != 0
            && let Some(f) = &feed
        {
            let buf: &[u8] = if relay_src.is_some() {
                &relay_buf
            } else {
                input
            };
            match sys::send_nosignal(f.as_raw_fd(), &buf[fed..]) {
                Ok(n) => fed += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The tool closed its stdin: stop feeding.
                Err(_) => {
                    fed = buf.len();
                    relay_eof = true;
                }
            }
        }
        if fds[4].revents != 0
            && let Some(src) = &relay_src
        {
            relay_buf.resize(RELAY_CHUNK, 0);
            fed = 0;
            match sys::read(src.as_raw_fd(), &mut relay_buf) {
                Ok(0) => {
                    relay_buf.clear();
                    relay_eof = true;
                }
                Ok(n) => relay_buf.truncate(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => relay_buf.clear(),
                Err(_) => {
                    relay_buf.clear();
                    relay_eof = true;
                }
            }
        }
        if fds[5].revents != 0
            && let Some(w) = &watch
        {
            let asked = w.take();
            // Plain signals are forwarded as they are (not a cancel, no escalation).
            for sig in asked.signals {
                signal(sig);
            }
            if asked.cancel || asked.kill {
                cancelled = true;
            }
            if asked.cancel && term_sent.is_none() {
                killed_by = Some(KilledBy::Cancel);
                term_sent = Some(Instant::now());
                signal(libc::SIGTERM);
            }
            if asked.kill && !killed {
                killed_by.get_or_insert(KilledBy::Cancel);
                term_sent.get_or_insert_with(Instant::now);
                killed = true;
                signal(libc::SIGKILL);
            }
        }
    }
    Ok(Stopped {
        timed_out,
        cancelled,
        killed_by,
        disk_limit: disk_hit,
    })
}

fn pollin(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// `(code, signal)` of a run: from the tool's wait status if pid 1 reported it, else the signal
/// that killed pid 1 (timeout after the grace period, or cancel), else SIGKILL.
pub(crate) fn exit_of(
    tool_status: Option<i32>,
    init_signal: Option<i32>,
) -> (Option<i32>, Option<i32>) {
    match tool_status {
        Some(s) if libc::WIFEXITED(s) => (Some(libc::WEXITSTATUS(s)), None),
        Some(s) if libc::WIFSIGNALED(s) => (None, Some(libc::WTERMSIG(s))),
        _ => (None, Some(init_signal.unwrap_or(libc::SIGKILL))),
    }
}

impl Layers {
    /// The layers of a run that started: capabilities all empty with securebits locked and
    /// `no_new_privs` (the child fails closed otherwise); degraded when the cgroup was
    /// missing or Landlock only partially enforced (`best_effort` only); unsandboxed when
    /// Landlock was not applied (which only an approved `unsandboxed` grant does).
    pub(crate) fn enforced(
        landlock: LandlockRecord,
        seccomp: SeccompRecord,
        namespaces: Vec<&'static str>,
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

/// What differs between the records of the two spawn paths; [`run_output`] adds the rest.
pub(crate) struct Finished {
    pub(crate) cwd: PathBuf,
    pub(crate) program: PathBuf,
    pub(crate) policy_hash: String,
    pub(crate) layers: Layers,
    pub(crate) limits: LimitsRecord,
    pub(crate) stopped: Stopped,
    /// From [`exit_of`].
    pub(crate) exit: (Option<i32>, Option<i32>),
    pub(crate) rusage: RusageRecord,
    pub(crate) post_run: crate::postrun::PostRunRecord,
}

/// The record and captured output of a finished run.
pub(crate) fn run_output(
    req: &RunRequest,
    env: &[(String, Vec<u8>)],
    started: Instant,
    f: Finished,
    out: Capture,
    errc: Capture,
) -> RunOutput {
    let (code, signal) = f.exit;
    // Nothing else stopped it, it died of SIGKILL, and the memory cgroup's OOM killer killed
    // during the run: the memory limit.
    let killed_by = f.stopped.killed_by.or_else(|| {
        (signal == Some(libc::SIGKILL) && f.layers.memory.oom_kills > 0)
            .then_some(KilledBy::MemoryLimit)
    });
    let record = RunRecord {
        argv: req
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: f.cwd,
        program: f.program,
        policy_hash: f.policy_hash,
        layers: f.layers,
        limits: f.limits,
        env_names: env.iter().map(|(k, _)| k.clone()).collect(),
        exit: ExitRecord {
            code,
            signal,
            status: code.unwrap_or_else(|| 128 + signal.unwrap_or(0)),
            timed_out: f.stopped.timed_out,
            cancelled: f.stopped.cancelled,
            killed_by,
            disk_limit: f.stopped.disk_limit,
        },
        duration_ms: started.elapsed().as_millis() as u64,
        rusage: f.rusage,
        stdout: out.record(),
        stderr: errc.record(),
        exec: if req.exec_fd.is_some() {
            ExecFrom::Fd
        } else {
            ExecFrom::Path
        },
        pass_fds: (0..req.pass_fds.len()).map(pass_fd_path).collect(),
        post_run: f.post_run,
    };
    RunOutput {
        record,
        stdout: out.buf,
        stderr: errc.buf,
    }
}

/// The workspace, canonical; it must be a directory.
pub(crate) fn canonical_workdir(workdir: &Path) -> Result<PathBuf, SandboxError> {
    let real = std::fs::canonicalize(workdir).map_err(|source| SandboxError::Workdir {
        path: workdir.to_path_buf(),
        source,
    })?;
    if !real.is_dir() {
        return Err(SandboxError::InvalidRequest {
            reason: format!("workdir {} is not a directory", real.display()),
        });
    }
    Ok(real)
}

/// The tool's working directory: `cwd` (absolute, or relative to the canonical `workdir`)
/// resolved lexically, or the workdir. `..` above `/` and empty paths are refused. Whether the
/// tool may start there is decided inside the sandbox ([`RunRequest::cwd`]).
pub(crate) fn tool_cwd(workdir: &Path, cwd: Option<&Path>) -> Result<PathBuf, SandboxError> {
    use std::path::Component;
    let Some(cwd) = cwd else {
        return Ok(workdir.to_path_buf());
    };
    let refuse = |why: &str| SandboxError::InvalidRequest {
        reason: format!("cwd {}: {why}", cwd.display()),
    };
    if cwd.as_os_str().is_empty() {
        return Err(refuse("empty path (omit cwd to start in the workdir)"));
    }
    let mut out = PathBuf::from("/");
    for c in workdir.join(cwd).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return Err(refuse("'..' climbs above /"));
                }
            }
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => return Err(refuse("not a unix path")),
        }
    }
    Ok(out)
}

/// The policy's limits with the request's narrower timeout ([`RunRequest::timeout_seconds`]):
/// `min(policy, request)`; 0 is refused.
pub(crate) fn effective_limits(
    policy: &ollie_policy::Limits,
    req: &RunRequest,
) -> Result<ollie_policy::Limits, SandboxError> {
    let mut l = *policy;
    match req.timeout_seconds {
        None => {}
        Some(0) => {
            return Err(SandboxError::InvalidRequest {
                reason: "timeout_seconds must be at least 1 (it can only narrow the policy's)"
                    .into(),
            });
        }
        Some(t) => l.timeout_seconds = l.timeout_seconds.min(t),
    }
    Ok(l)
}

/// The tool's environment ([`tool_env`]) and its program, looked up in that environment's
/// `PATH`, or relative to the tool's working directory `cwd` when it contains a `/` (ENOENT
/// as an [`SandboxError::Exec`] if it is not found); with [`RunRequest::exec_fd`], the path
/// the descriptor was opened from (nothing is looked up).
pub(crate) fn tool_command(
    resolved: &ResolvedPolicy,
    req: &RunRequest,
    workdir: &Path,
    cwd: &Path,
) -> Result<(ToolEnv, PathBuf), SandboxError> {
    let env = tool_env(resolved, req, workdir)?;
    let path_var = env
        .iter()
        .find(|(n, _)| n == "PATH")
        .and_then(|(_, v)| std::str::from_utf8(v).ok().map(str::to_string));
    if let Some(x) = &req.exec_fd {
        return Ok((env, x.path.clone()));
    }
    let program =
        find_program(Path::new(&req.argv[0]), path_var.as_deref(), cwd).ok_or_else(|| {
            SandboxError::Exec {
                program: req.argv[0].to_string_lossy().into_owned(),
                source: io::Error::from_raw_os_error(libc::ENOENT),
            }
        })?;
    Ok((env, program))
}

/// The tool's environment: `(name, value)` pairs, sorted.
pub(crate) type ToolEnv = Vec<(String, Vec<u8>)>;

/// The environment a tool gets from `base_env` under `resolved`: cleared, then the policy's
/// allowlist (never a forbidden name), then its fixed values; sorted by name. This is what
/// [`run`] gives the tool (it also creates `TMPDIR` when that lies in the workspace).
pub fn tool_environment(
    resolved: &ResolvedPolicy,
    base_env: &[(std::ffi::OsString, std::ffi::OsString)],
) -> Vec<(String, Vec<u8>)> {
    let mut env: Vec<(String, Vec<u8>)> = Vec::new();
    for (k, v) in base_env {
        if let Some(name) = k.to_str()
            && resolved.policy.env.allow.contains(name)
            && !ollie_policy::env_name_is_forbidden(name)
        {
            env.push((name.to_string(), v.as_bytes().to_vec()));
        }
    }
    for (k, v) in &resolved.env_set {
        env.retain(|(n, _)| n != k);
        env.push((k.clone(), v.as_bytes().to_vec()));
    }
    env.sort();
    env
}

/// The tool's environment: [`tool_environment`], creating `TMPDIR` inside the workspace when
/// it points there.
fn tool_env(
    resolved: &ResolvedPolicy,
    req: &RunRequest,
    workdir: &Path,
) -> Result<ToolEnv, SandboxError> {
    let env = tool_environment(resolved, &req.base_env);
    if let Some((_, tmp)) = env.iter().find(|(n, _)| n == "TMPDIR") {
        let tmp = PathBuf::from(std::ffi::OsStr::from_bytes(tmp));
        if let Ok(rel) = tmp.strip_prefix(workdir) {
            crate::workspace::Workspace::open(workdir)
                .and_then(|ws| ws.create_dir_all(rel))
                .map_err(io_err("create TMPDIR inside the workspace"))?;
        }
    }
    Ok(env)
}

impl RunRecord {
    /// The record as one JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// Whether the kernel offers what the sandbox needs, for callers that want to check up front
/// (`o doctor`). The cgroup facts come from trying: a trial cgroup is made where a run's would
/// go, its limit written, and removed.
pub fn probe() -> Probe {
    Probe {
        landlock_abi: landlock::kernel_abi(),
        user_namespaces: sys::user_namespaces(),
        seccomp: sys::seccomp_available(),
        ipc_namespaces: sys::ipc_namespaces(),
        cgroups: crate::cgroup::probe(),
        fuse: std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .is_ok(),
    }
}

/// Kernel features found by [`probe`].
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    /// Landlock ABI (0 = none).
    pub landlock_abi: u32,
    /// User namespaces are enabled.
    pub user_namespaces: bool,
    /// seccomp filter mode is available.
    pub seccomp: bool,
    /// IPC namespaces may be created (optional: runs share the runner's otherwise).
    pub ipc_namespaces: bool,
    /// Whether runs get pids and memory cgroups here, and why not.
    pub cgroups: crate::cgroup::CgroupProbe,
    /// `/dev/fuse` can be opened (`o mount`; not the sandbox).
    pub fuse: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_count_and_kernel_features_are_asked_of_the_kernel() {
        // The kernel's answer matches the sysctl where the sysctl is visible.
        let proc: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(sys::cap_last_cap(), proc);
        assert!(sys::seccomp_available());
        // Where the sysctl allows user namespaces, the probe can make one (the probe is
        // what the sandbox relies on; the sysctl may be hidden under a service manager).
        let sysctl = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
            .map(|s| s.trim() != "0")
            .unwrap_or(false);
        if sysctl {
            assert!(sys::user_namespaces());
        }
    }

    fn space(free: u64, avail: u64, free_inodes: u64) -> sys::FsSpace {
        sys::FsSpace {
            total_bytes: 100 << 30,
            free_bytes: free,
            avail_bytes: avail,
            total_inodes: 1_000_000,
            free_inodes,
        }
    }

    #[test]
    fn cwd_is_resolved_lexically() {
        let w = Path::new("/work/ws");
        let ok = |c: &str| tool_cwd(w, Some(Path::new(c))).unwrap();
        assert_eq!(tool_cwd(w, None).unwrap(), w);
        assert_eq!(ok("sub/dir"), Path::new("/work/ws/sub/dir"));
        assert_eq!(ok("./sub/../sub/./dir/"), Path::new("/work/ws/sub/dir"));
        assert_eq!(ok(".."), Path::new("/work"));
        assert_eq!(ok("/usr/../etc"), Path::new("/etc"));
        assert_eq!(ok("../.."), Path::new("/"));
        for bad in ["", "../../..", "/..", "/a/../../b"] {
            assert!(
                matches!(
                    tool_cwd(w, Some(Path::new(bad))),
                    Err(SandboxError::InvalidRequest { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn request_timeout_only_narrows() {
        let l = ollie_policy::Limits {
            timeout_seconds: 60,
            ..ollie_policy::Limits::default()
        };
        let mut req = RunRequest::new(vec!["true".into()], PathBuf::from("/"));
        assert_eq!(effective_limits(&l, &req).unwrap().timeout_seconds, 60);
        req.timeout_seconds = Some(5);
        assert_eq!(effective_limits(&l, &req).unwrap().timeout_seconds, 5);
        req.timeout_seconds = Some(600);
        assert_eq!(effective_limits(&l, &req).unwrap().timeout_seconds, 60);
        req.timeout_seconds = Some(0);
        assert!(matches!(
            effective_limits(&l, &req),
            Err(SandboxError::InvalidRequest { .. })
        ));
    }

    #[test]
    fn cancel_accepts_the_forwarded_signals_and_sigkill_only() {
        let mut want: Vec<i32> = sys::FORWARDED.to_vec();
        want.push(libc::SIGKILL);
        want.sort_unstable();
        let mut got = Cancel::SIGNALS.to_vec();
        got.sort_unstable();
        assert_eq!(got, want);
        let c = Cancel::new().unwrap();
        // Not watched by any run: accepted signals are no-ops, refused ones are errors.
        for sig in 0..=65 {
            let r = c.signal(sig);
            assert_eq!(r.is_ok(), Cancel::SIGNALS.contains(&sig), "{sig}");
        }
        // A watching run gets the signals sent while it watches, in order, and the sticky
        // requests every time.
        let w = c.watch().unwrap();
        c.signal(libc::SIGUSR1).unwrap();
        c.signal(libc::SIGINT).unwrap();
        let r = w.take();
        assert_eq!(r.signals, vec![libc::SIGUSR1, libc::SIGINT]);
        assert!(r.kill, "SIGKILL from the loop above is sticky");
        assert!(w.take().signals.is_empty());
        drop(w);
        assert!(lock_state(&c.state).watchers.is_empty());
    }

    #[test]
    fn disk_verdict_names_the_limit_and_escalates_gross_overshoots() {
        let start = space(50 << 30, 45 << 30, 900_000);
        let mib = 1u64 << 20;
        // Within both limits.
        assert_eq!(
            disk_verdict(
                &start,
                &space((50 << 30) - 64 * mib, 45 << 30, 899_000),
                64 * mib,
                1000
            ),
            None
        );
        // Bytes: just over → stop; far over → kill.
        let v = disk_verdict(
            &start,
            &space((50 << 30) - 65 * mib, 45 << 30, 900_000),
            64 * mib,
            1000,
        );
        assert_eq!(v, Some((DiskLimit::DiskBytes, 64 * mib, 65 * mib, false)));
        let v = disk_verdict(
            &start,
            &space((50 << 30) - 80 * mib, 45 << 30, 900_000),
            64 * mib,
            1000,
        );
        assert!(matches!(v, Some((DiskLimit::DiskBytes, _, _, true))));
        // Inodes.
        let v = disk_verdict(&start, &space(50 << 30, 45 << 30, 898_999), 64 * mib, 1000);
        assert_eq!(v, Some((DiskLimit::DiskInodes, 1000, 1001, false)));
        // No inode accounting: never an inode verdict.
        let mut no_inodes = start;
        no_inodes.total_inodes = 0;
        let mut cur = space(50 << 30, 45 << 30, 0);
        cur.total_inodes = 0;
        assert_eq!(disk_verdict(&no_inodes, &cur, 64 * mib, 1000), None);
        // Reserve (1 GiB here): crossing it while consuming stops the run even within the
        // limit; being below it without consuming does not.
        let low = space(2 << 30, 1 << 30, 900_000);
        let v = disk_verdict(
            &low,
            &space((2 << 30) - mib, (1 << 30) - mib, 900_000),
            4 << 30,
            1000,
        );
        assert!(matches!(v, Some((DiskLimit::ReserveBytes, r, _, false)) if r == 1 << 30));
        let under = space(1 << 29, 1 << 29, 900_000);
        assert_eq!(disk_verdict(&under, &under, 4 << 30, 1000), None);
        // Inode reserve: 5% of 1,000,000 = 50,000.
        let few = space(50 << 30, 45 << 30, 50_100);
        let v = disk_verdict(
            &few,
            &space(50 << 30, 45 << 30, 49_000),
            64 * mib,
            1_000_000,
        );
        assert_eq!(v, Some((DiskLimit::ReserveInodes, 50_000, 49_000, false)));
    }
}
