//! Running one command under a policy, and the run record.

use crate::landlock::{self, LandlockError, LandlockRecord};
use crate::seccomp::{self, SeccompError, SeccompRecord};
use crate::sys::{self, ChildFault, ChildPlan, MountStep, Stage};
use ollie_policy::{Network, Policy, PolicyError, ResolveContext, ResolvedPolicy};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// A handle that stops a running command (SIGTERM to the whole tree, SIGKILL after the grace
/// period). Cloneable; usable from any thread.
#[derive(Debug, Clone)]
pub struct Cancel {
    pub(crate) fd: Arc<OwnedFd>,
}

impl Cancel {
    /// A new, untriggered handle.
    pub fn new() -> io::Result<Cancel> {
        Ok(Cancel {
            fd: Arc::new(sys::eventfd()?),
        })
    }

    /// Requests cancellation.
    pub fn cancel(&self) {
        let _ = sys::write_all(self.fd.as_raw_fd(), &1u64.to_ne_bytes());
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
    /// Tests only: force a failure.
    pub fault: Option<Fault>,
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
}

/// The layers active for a run.
#[derive(Debug, Clone, Serialize)]
pub struct Layers {
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
    /// The pids cgroup, when one was used (root only).
    pub cgroup: Option<PathBuf>,
    /// Whether the run had to degrade (only possible with `best_effort`).
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
    /// Why the runner stopped the run (the first cause), if it did.
    pub killed_by: Option<KilledBy>,
    /// The aggregate disk limit the run crossed (`killed_by = "disk_limit"`), with the figures.
    pub disk_limit: Option<DiskLimitRecord>,
}

/// Why the runner stopped a run (SIGTERM to the tree, SIGKILL after the grace period).
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
    /// What the run left behind that host-side tools would execute later (git hooks, risky
    /// git config, new repositories, `.envrc`, editor/agent settings); see `postrun`.
    pub post_run: crate::postrun::PostRunRecord,
}

/// Limits as recorded.
#[derive(Debug, Clone, Serialize)]
pub struct LimitsRecord {
    /// RLIMIT_CPU.
    pub cpu_seconds: u64,
    /// RLIMIT_AS.
    pub address_space_bytes: u64,
    /// RLIMIT_NPROC / pids.max.
    pub processes: u64,
    /// RLIMIT_FSIZE.
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

pub(crate) fn find_program(argv0: &Path, path_var: Option<&str>, cwd: &Path) -> Option<PathBuf> {
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

/// Candidate parents for the run's pids cgroup: the runner's own cgroup in the v1 `pids`
/// hierarchy, or in the v2 hierarchy (nested, so the run never leaves the runner's limits).
fn cgroup_parents() -> Vec<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut out = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => continue,
        };
        let rel = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "pids") {
            out.push(Path::new("/sys/fs/cgroup/pids").join(rel));
        } else if controllers.is_empty() {
            for mount in ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"] {
                out.push(Path::new(mount).join(rel));
            }
        }
    }
    out
}

/// Creates a fresh pids cgroup with `pids.max` = `max` under the runner's own cgroup (root).
pub(crate) fn make_cgroup(max: u64) -> Option<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "ollie-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    for base in cgroup_parents() {
        let dir = base.join(&name);
        if std::fs::create_dir(&dir).is_ok() {
            if std::fs::write(dir.join("pids.max"), max.to_string()).is_ok() {
                return Some(dir);
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
    None
}

pub(crate) fn remove_cgroup(dir: &Path) {
    // The namespace's processes are being torn down by the kernel; the directory can only be
    // removed once they are gone.
    for _ in 0..200 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return,
        }
    }
}

/// The running sandbox (its init stage). Dropping it without [`Running::reap`] kills and
/// reaps the whole run, so no early return can leave a sandbox behind.
struct Running {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    cgroup: Option<PathBuf>,
    reaped: bool,
}

impl Running {
    fn signal(&self, sig: i32) {
        let _ = sys::pidfd_send_signal(&self.pidfd, sig);
    }

    fn reap(&mut self) -> io::Result<(i32, sys::Rusage)> {
        let r = sys::wait4(self.pid);
        self.reaped = r.is_ok();
        if let Some(dir) = self.cgroup.take() {
            remove_cgroup(&dir);
        }
        r
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.reaped {
            self.signal(libc::SIGKILL);
            let _ = sys::wait4(self.pid);
        }
        if let Some(dir) = self.cgroup.take() {
            remove_cgroup(&dir);
        }
    }
}

pub(crate) struct Capture {
    pub(crate) kind: Stream,
    pub(crate) fd: OwnedFd,
    pub(crate) buf: Vec<u8>,
    pub(crate) total: u64,
    pub(crate) cap: u64,
    pub(crate) open: bool,
}

impl Capture {
    /// Reads what is available, at most 1 MiB per call so a flood cannot starve the
    /// deadline checks of the poll loop.
    pub(crate) fn drain(
        &mut self,
        sink: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<(), SandboxError> {
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

/// Directories strictly between the innermost writable tree containing a protected path and
/// that path, outermost first, each once.
fn pinned_ancestors(protected: &[PathBuf], writable: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in protected {
        let Some(w) = writable
            .iter()
            .filter(|w| p.starts_with(w) && p != *w)
            .max_by_key(|w| w.components().count())
        else {
            continue;
        };
        let mut a = p.parent();
        while let Some(anc) = a {
            if anc == w.as_path() || !anc.starts_with(w) {
                break;
            }
            if !out.iter().any(|o| o == anc) {
                out.push(anc.to_path_buf());
            }
            a = anc.parent();
        }
    }
    out.sort_by_key(|p| p.components().count());
    out
}

/// How often the runner samples the free space of the writable filesystems.
const DISK_SAMPLE: Duration = Duration::from_millis(50);
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

/// Where the private shared-memory tmpfs goes.
const SHM_DIR: &str = "/dev/shm";
/// Bytes read from a relayed stdin per poll round (the relay buffer's bound).
const RELAY_CHUNK: usize = 64 * 1024;
/// Upper bound on inodes of the private `/dev/shm`.
const SHM_INODES: u64 = 16384;

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
/// and the error says which layer.
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
    let workdir = std::fs::canonicalize(&req.workdir).map_err(|source| SandboxError::Workdir {
        path: req.workdir.clone(),
        source,
    })?;
    if !workdir.is_dir() {
        return Err(SandboxError::InvalidRequest {
            reason: format!("workdir {} is not a directory", workdir.display()),
        });
    }
    let ctx = ResolveContext {
        workdir: workdir.clone(),
        home: req.home.clone(),
    };
    let resolved = policy
        .resolve(&ctx)
        .map_err(|source| SandboxError::Policy { source })?;

    // Landlock ruleset (parent side).
    let simulated = match req.fault {
        Some(Fault::LandlockAbi(a)) => Some(a),
        _ => None,
    };
    let ruleset = landlock::build(&resolved, simulated)?;
    let filters = seccomp::filters(&resolved.network)?;

    let env = tool_env(&resolved, req, &workdir)?;
    let path_var = env
        .iter()
        .find(|(n, _)| n == "PATH")
        .and_then(|(_, v)| std::str::from_utf8(v).ok().map(str::to_string));
    let program =
        find_program(Path::new(&req.argv[0]), path_var.as_deref(), &workdir).ok_or_else(|| {
            SandboxError::Exec {
                program: req.argv[0].to_string_lossy().into_owned(),
                source: io::Error::from_raw_os_error(libc::ENOENT),
            }
        })?;

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

    // Mount plan: clone writable trees, make everything read-only, re-attach, protect.
    let mut writable: Vec<PathBuf> = Vec::new();
    for w in &resolved.fs.write {
        if let Ok(real) = std::fs::canonicalize(w)
            && let Ok(md) = std::fs::metadata(&real)
            && (md.is_dir() || md.is_file())
            && !writable.contains(&real)
        {
            writable.push(real);
        }
    }
    writable.sort_by_key(|p| p.components().count());
    // The post-run diff's baseline: the workspace as the host has it (before placeholders);
    // only when the tool can write somewhere in it.
    let snapshot_before = writable
        .iter()
        .any(|w| workdir.starts_with(w) || w.starts_with(&workdir))
        .then(|| crate::postrun::Snapshot::take(&workdir));
    // Protected islands: existing ones are bound read-only; for missing ones the first missing
    // component is created as an empty placeholder and bound read-only (removed when `islands`
    // is dropped, after the run's namespaces are gone).
    let islands = crate::placeholder::Protected::prepare(&resolved.fs.protected, &writable)?;
    let mut protected: Vec<PathBuf> = islands.paths.clone();
    // Secret locations inside a writable tree (e.g. a workspace that is $HOME) are carved out
    // of the Landlock grant; bind them read-only too, so their metadata (chmod ~/.ssh) is safe.
    for s in ollie_policy::secrets::secret_locations(&resolved.ctx.home) {
        if let Ok(real) = std::fs::canonicalize(&s)
            && writable.iter().any(|w| real.starts_with(w) && &real != w)
            && !protected.contains(&real)
        {
            protected.push(real);
        }
    }
    let mut mounts = vec![MountStep::MakePrivate];
    for (slot, w) in writable.iter().enumerate() {
        mounts.push(MountStep::CloneTree {
            path: sys::cstring(w).map_err(io_err("prepare mounts"))?,
            slot,
        });
    }
    mounts.push(MountStep::ReadOnlyAll);
    for (slot, w) in writable.iter().enumerate() {
        mounts.push(MountStep::Attach {
            slot,
            path: sys::cstring(w).map_err(io_err("prepare mounts"))?,
        });
    }
    // Pin every directory between a writable root and a protected island with a read-write
    // bind onto itself: a mount point cannot be renamed or removed (EBUSY), so the tool cannot
    // move `.git` (and the read-only `.git/hooks` inside it) aside and create a fresh one.
    for (i, a) in pinned_ancestors(&protected, &writable).iter().enumerate() {
        let slot = writable.len() + i;
        let path = sys::cstring(a).map_err(io_err("prepare mounts"))?;
        mounts.push(MountStep::CloneTree {
            path: path.clone(),
            slot,
        });
        mounts.push(MountStep::Attach { slot, path });
    }
    for p in &protected {
        mounts.push(MountStep::ProtectReadOnly {
            path: sys::cstring(p).map_err(io_err("prepare mounts"))?,
        });
    }
    // A private /dev/shm (POSIX shared memory, semaphores): never the host's, never another
    // run's. Mounted last, so it is writable while everything around it is read-only.
    let l = resolved.policy.limits;
    let private_shm = match std::fs::canonicalize(SHM_DIR) {
        Ok(real) if l.shm_bytes > 0 && real.is_dir() => {
            mounts.push(MountStep::PrivateTmpfs {
                path: sys::cstring(&real).map_err(io_err("prepare mounts"))?,
                options: cstr(
                    format!(
                        "size={},nr_inodes={},mode=1777",
                        l.shm_bytes,
                        SHM_INODES.min(l.shm_bytes / 1024 + 16)
                    )
                    .as_bytes(),
                    "tmpfs options",
                )?,
                rule_access: landlock::writable_rights(ruleset.record.abi),
            });
            Some(real)
        }
        _ => None,
    };

    let rlimits = vec![
        (libc::RLIMIT_CPU, l.cpu_seconds),
        (libc::RLIMIT_AS, l.address_space_bytes),
        (libc::RLIMIT_NPROC, l.processes),
        (libc::RLIMIT_FSIZE, l.file_size_bytes),
        (libc::RLIMIT_NOFILE, l.open_files),
        (libc::RLIMIT_CORE, 0),
    ];

    // stdin: /dev/null, or a socketpair the runner feeds (a socket, so a tool that closes its
    // stdin early gives EPIPE without SIGPIPE in the runner: MSG_NOSIGNAL).
    let relay = req.stdin_fd.clone();
    let (stdin_child, stdin_feed): (OwnedFd, Option<OwnedFd>) = match (&req.stdin, &relay) {
        (None, None) => (
            std::fs::File::open("/dev/null")
                .map_err(io_err("open /dev/null"))?
                .into(),
            None,
        ),
        _ => {
            let (a, b) = sys::socketpair().map_err(io_err("create the stdin socket"))?;
            sys::shutdown_read(&b).map_err(io_err("create the stdin socket"))?;
            (a, Some(b))
        }
    };
    let (out_r, out_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (errout_r, errout_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (err_r, err_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (status_r, status_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (sync_r, sync_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (uid, gid) = sys::ids();
    let fault = match req.fault {
        Some(Fault::SeccompInstall) => ChildFault::SeccompInstall,
        Some(Fault::CapDrop) => ChildFault::CapDrop,
        Some(Fault::LandlockRestrict) => ChildFault::LandlockRestrict,
        _ => ChildFault::None,
    };
    let plan = ChildPlan {
        stdin: stdin_child.as_raw_fd(),
        stdout: out_w.as_raw_fd(),
        stderr: errout_w.as_raw_fd(),
        err_w: err_w.as_raw_fd(),
        status_w: status_w.as_raw_fd(),
        sync_r: sync_r.as_raw_fd(),
        ruleset: ruleset.fd.as_raw_fd(),
        setgroups_path: c"/proc/self/setgroups".to_owned(),
        uid_map_path: c"/proc/self/uid_map".to_owned(),
        gid_map_path: c"/proc/self/gid_map".to_owned(),
        oom_path: c"/proc/self/oom_score_adj".to_owned(),
        uid_map: cstr(format!("{uid} {uid} 1").as_bytes(), "uid map")?,
        gid_map: cstr(format!("{gid} {gid} 1").as_bytes(), "gid map")?,
        mounts,
        rlimits,
        cap_last: sys::cap_last_cap(),
        filters: filters
            .programs
            .iter()
            .map(|p| {
                p.iter()
                    .map(|i| libc::sock_filter {
                        code: i.code,
                        jt: i.jt,
                        jf: i.jf,
                        k: i.k,
                    })
                    .collect()
            })
            .collect(),
        exe: sys::cstring(&program).map_err(io_err("prepare exec"))?,
        argv: argv_p,
        envp: envp_p,
        cwd: sys::cstring(&workdir).map_err(io_err("prepare exec"))?,
        fault,
    };

    let (pid, pidfd) =
        sys::spawn_init(&plan).map_err(|source| SandboxError::Namespaces { source })?;
    let mut running = Running {
        pid,
        pidfd,
        cgroup: None,
        reaped: false,
    };
    // The child's ends.
    drop((stdin_child, out_w, errout_w, err_w, status_w, sync_r));
    // RLIMIT_NPROC does not bind uid 0, so root runs need a pids cgroup (fail closed).
    let mut cgroup_degraded = false;
    if uid == 0 {
        running.cgroup = make_cgroup(l.processes).and_then(|dir| {
            match std::fs::write(dir.join("cgroup.procs"), pid.to_string()) {
                Ok(()) => Some(dir),
                Err(_) => {
                    let _ = std::fs::remove_dir(&dir);
                    None
                }
            }
        });
        if running.cgroup.is_none() {
            if !resolved.policy.best_effort {
                return Err(SandboxError::ProcessLimit);
            }
            cgroup_degraded = true;
        }
    }
    // The disk watchdog's baseline, taken before the tool can write anything.
    let mut disk = DiskWatch::start(&writable, &l, Instant::now())?;
    let go = sys::write_all(sync_w.as_raw_fd(), b"g");
    drop(sync_w);
    go.map_err(io_err("start the sandbox"))?;

    // Wait for exec (EOF on the close-on-exec error pipe) or a failure report.
    let mut msg = [0u8; 8];
    let mut got = 0;
    while got < msg.len() {
        match sys::read(err_r.as_raw_fd(), &mut msg[got..])
            .map_err(io_err("read the start-up report"))?
        {
            0 => break,
            n => got += n,
        }
    }
    if got > 0 {
        drop(running);
        let stage_n = u32::from_ne_bytes([msg[0], msg[1], msg[2], msg[3]]);
        let errno = i32::from_ne_bytes([msg[4], msg[5], msg[6], msg[7]]);
        let source = io::Error::from_raw_os_error(errno);
        return Err(match Stage::from_u32(stage_n) {
            Some(Stage::Exec) => SandboxError::Exec {
                program: program.display().to_string(),
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
        });
    }
    drop(err_r);

    let mut out = Capture {
        kind: Stream::Stdout,
        fd: out_r,
        buf: Vec::new(),
        total: 0,
        cap: l.output_bytes,
        open: true,
    };
    let mut errc = Capture {
        kind: Stream::Stderr,
        fd: errout_r,
        buf: Vec::new(),
        total: 0,
        cap: l.output_bytes,
        open: true,
    };
    for c in [&out, &errc] {
        sys::set_nonblocking(c.fd.as_raw_fd()).map_err(io_err("configure pipes"))?;
    }
    let deadline = started + Duration::from_secs(l.timeout_seconds);
    let grace = Duration::from_millis(l.kill_grace_ms);
    let mut term_sent: Option<Instant> = None;
    let mut killed = false;
    let mut timed_out = false;
    let mut cancelled = false;
    let mut killed_by: Option<KilledBy> = None;
    let mut disk_hit: Option<DiskLimitRecord> = None;
    let mut init_done = false;
    let mut feed = stdin_feed;
    let mut fed = 0usize;
    let input = req.stdin.as_deref().unwrap_or_default();
    let mut relay_src = relay;
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
                    running.signal(libc::SIGTERM);
                }
                if hit.forced_kill {
                    killed = true;
                    running.signal(libc::SIGKILL);
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
                running.signal(libc::SIGTERM);
            }
            if let Some(t) = term_sent
                && !killed
                && now >= t + grace
            {
                killed = true;
                running.signal(libc::SIGKILL);
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
        let mut fds = vec![
            libc::pollfd {
                fd: if out.open { out.fd.as_raw_fd() } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if errc.open { errc.fd.as_raw_fd() } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if init_done {
                    -1
                } else {
                    running.pidfd.as_raw_fd()
                },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
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
        fds.push(libc::pollfd {
            fd: feed
                .as_ref()
                .filter(|_| pending > 0)
                .map_or(-1, |f| f.as_raw_fd()),
            events: libc::POLLOUT,
            revents: 0,
        });
        fds.push(libc::pollfd {
            fd: relay_src
                .as_ref()
                .filter(|_| feed.is_some() && pending == 0 && !relay_eof)
                .map_or(-1, |f| f.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        });
        let cancel_fd = req.cancel.as_ref().filter(|_| !cancelled && !init_done);
        if let Some(c) = cancel_fd {
            fds.push(libc::pollfd {
                fd: c.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
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
        if fds.len() > 5 && fds[5].revents != 0 {
            cancelled = true;
            if term_sent.is_none() {
                killed_by = Some(KilledBy::Cancel);
                term_sent = Some(Instant::now());
                running.signal(libc::SIGTERM);
            }
        }
    }
    let cgroup = running.cgroup.clone();
    let (init_status, rusage) = running.reap().map_err(io_err("reap the sandbox"))?;
    let mut st = [0u8; 4];
    let tool_status = match sys::read(status_r.as_raw_fd(), &mut st) {
        Ok(4) => Some(i32::from_ne_bytes(st)),
        _ => None,
    };
    let (code, signal) = match tool_status {
        Some(s) if libc::WIFEXITED(s) => (Some(libc::WEXITSTATUS(s)), None),
        Some(s) if libc::WIFSIGNALED(s) => (None, Some(libc::WTERMSIG(s))),
        // The init stage itself was killed (timeout after the grace period, or cancel).
        _ if libc::WIFSIGNALED(init_status) => (None, Some(libc::WTERMSIG(init_status))),
        _ => (None, Some(libc::SIGKILL)),
    };
    let status = code.unwrap_or_else(|| 128 + signal.unwrap_or(0));
    // Every process of the run is gone (init reaped): remove the placeholders no other run
    // uses, then compare with the baseline.
    let placeholders = islands.placeholders.clone();
    drop(islands);
    let post_run = snapshot_before
        .map(|b| b.diff(&crate::postrun::Snapshot::take(&workdir)))
        .unwrap_or_default();

    let record = RunRecord {
        argv: req
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: workdir,
        program,
        policy_hash: policy_hash(&resolved),
        layers: Layers {
            best_effort_degraded: cgroup_degraded
                || ruleset.record.status != landlock::EnforcementStatus::FullyEnforced,
            landlock: ruleset.record,
            seccomp: filters.record,
            capabilities: CapabilityRecord {
                effective: 0,
                permitted: 0,
                inheritable: 0,
                bounding: 0,
                ambient: 0,
                securebits_locked: true,
            },
            no_new_privs: true,
            namespaces: vec!["user", "pid", "mount", "ipc"],
            mounts: MountRecord {
                read_only_root: true,
                writable,
                protected,
                placeholders,
                private_shm,
            },
            cgroup,
        },
        limits: LimitsRecord {
            cpu_seconds: l.cpu_seconds,
            address_space_bytes: l.address_space_bytes,
            processes: l.processes,
            file_size_bytes: l.file_size_bytes,
            open_files: l.open_files,
            core_bytes: 0,
            output_bytes: l.output_bytes,
            timeout_seconds: l.timeout_seconds,
            kill_grace_ms: l.kill_grace_ms,
            shm_bytes: l.shm_bytes,
            disk_bytes: l.disk_bytes,
            disk_inodes: l.disk_inodes,
        },
        env_names: env.iter().map(|(k, _)| k.clone()).collect(),
        exit: ExitRecord {
            code,
            signal,
            status,
            timed_out,
            cancelled,
            killed_by,
            disk_limit: disk_hit,
        },
        duration_ms: started.elapsed().as_millis() as u64,
        rusage: RusageRecord {
            user_ms: rusage.user_us / 1000,
            sys_ms: rusage.sys_us / 1000,
            max_rss_kb: rusage.max_rss_kb,
        },
        stdout: OutputRecord {
            total_bytes: out.total,
            captured_bytes: out.buf.len() as u64,
            truncated: out.total > out.buf.len() as u64,
        },
        stderr: OutputRecord {
            total_bytes: errc.total,
            captured_bytes: errc.buf.len() as u64,
            truncated: errc.total > errc.buf.len() as u64,
        },
        post_run,
    };
    Ok(RunOutput {
        record,
        stdout: out.buf,
        stderr: errc.buf,
    })
}

/// The tool's environment: cleared, then the policy's allowlist, then its fixed values
/// (creating `TMPDIR` inside the workspace when it points there).
pub(crate) fn tool_env(
    resolved: &ResolvedPolicy,
    req: &RunRequest,
    workdir: &Path,
) -> Result<Vec<(String, Vec<u8>)>, SandboxError> {
    // Environment: cleared, then the allowlist, then fixed values.
    let mut env: Vec<(String, Vec<u8>)> = Vec::new();
    for (k, v) in &req.base_env {
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

/// Whether the kernel offers what the sandbox needs, for callers that want to check up front.
pub fn probe() -> Probe {
    Probe {
        landlock_abi: landlock::kernel_abi(),
        user_namespaces: std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0),
    }
}

/// Kernel features found by [`probe`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Probe {
    /// Landlock ABI (0 = none).
    pub landlock_abi: u32,
    /// User namespaces are enabled.
    pub user_namespaces: bool,
}

#[allow(dead_code)]
fn _network_is_used(n: &Network) -> bool {
    matches!(n, Network::Tcp { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

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
