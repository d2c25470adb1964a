//! What to run: the request, its cancellation handle, and what both spawn paths derive from
//! it (workdir and cwd, limits and rlimits, environment, program, stdin).

use crate::error::{SandboxError, io_err};
use crate::sys::{self, ChildFault};
use crate::unions::UnionMount;
use ollie_policy::ResolvedPolicy;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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
/// while [`run`](crate::run) or [`crate::Prepared::run`] blocks in another.
///
/// - [`Cancel::cancel`]: SIGTERM to every process of the run, SIGKILL to the whole run after
///   `limits.kill_grace_ms`.
/// - [`Cancel::kill`]: SIGKILL to the whole run at once.
/// - [`Cancel::signal`]: one signal to every process of the run, nothing else.
/// - [`Cancel::freeze`] / [`Cancel::thaw`]: stop every process of the run (SIGSTOP, sent by
///   its pid 1 from inside the pid namespace) and let them go on; [`Cancel::wait_frozen`]
///   returns once every process of every run watching the handle is seen stopped. Freezes
///   nest: the run goes on at the last thaw. The timeout does not count while a run is frozen.
///
/// `cancel` and `kill` are sticky: a run that starts watching the handle later (or another run
/// sharing it) is stopped as soon as it starts; both are recorded
/// ([`ExitRecord::cancelled`](crate::ExitRecord::cancelled), `killed_by = "cancel"`). A signal
/// reaches the runs watching the handle when it is sent: from the moment [`run`](crate::run) or
/// [`crate::Prepared::run`] is entered (signals sent while the sandbox is being set up are queued
/// and delivered once its pid 1 exists) until that pid 1 has exited. Before a run starts or after
/// it has ended it is a no-op.
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
    /// [`Cancel::freeze`] calls not yet matched by a [`Cancel::thaw`].
    freezes: u32,
}

/// One run watching a [`Cancel`]: its own wake-up eventfd (several runs may share a handle,
/// and reading an eventfd resets it for every reader) and the signals queued for it.
#[derive(Debug)]
struct Watcher {
    id: u64,
    wake: Arc<OwnedFd>,
    signals: Vec<i32>,
    /// The run's processes were all seen stopped while a freeze is asked
    /// ([`CancelWatch::frozen`]).
    frozen: bool,
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
    /// A freeze is asked ([`Cancel::freeze`] more often than [`Cancel::thaw`]).
    pub(crate) freeze: bool,
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
            freeze: st.freezes > 0,
        }
    }

    /// Reports whether every process of this run is stopped, as a freeze asked (see
    /// [`Cancel::wait_frozen`]). Reporting `true` when no freeze is asked any more is ignored.
    pub(crate) fn frozen(&self, frozen: bool) {
        let mut st = lock_state(&self.state);
        let asked = st.freezes > 0;
        if let Some(w) = st.watchers.iter_mut().find(|w| w.id == self.id) {
            w.frozen = frozen && asked;
        }
        drop(st);
        FROZEN.notify_all();
    }
}

/// Wakes [`Cancel::wait_frozen`] callers when a run reports its freeze (one condition for
/// every handle: freezes are rare, and each waiter re-checks its own handle).
static FROZEN: std::sync::Condvar = std::sync::Condvar::new();

impl Drop for CancelWatch {
    fn drop(&mut self) {
        lock_state(&self.state).watchers.retain(|w| w.id != self.id);
        FROZEN.notify_all();
    }
}

/// For [`Cancel::wait_frozen`]: `Some(false)` when no freeze is asked any more, `Some(true)`
/// when every watching run reported itself stopped, `None` while still waiting.
fn settled(st: &CancelState) -> Option<bool> {
    if st.freezes == 0 {
        return Some(false);
    }
    if !st.watchers.is_empty() && st.watchers.iter().all(|w| w.frozen) {
        return Some(true);
    }
    None
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
    /// SIGCONT is dropped while the run is frozen ([`Cancel::freeze`]: only the thaw
    /// continues it). `SIGKILL` is [`Cancel::kill`]. Allowed: [`Cancel::SIGNALS`]; anything else is refused
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

    /// Asks every run watching the handle, and every run that starts watching it before the
    /// matching [`Cancel::thaw`], to stop all of its processes: pid 1 of the run sends SIGSTOP
    /// to every other process of its pid namespace, again until all are seen stopped. Tools
    /// cannot send SIGCONT (their syscall filter refuses it), so nothing in the run can undo
    /// it. The wall timeout does not count while the run is frozen. Freezes nest.
    pub fn freeze(&self) {
        let mut st = lock_state(&self.state);
        st.freezes = st.freezes.saturating_add(1);
        st.wake_all();
    }

    /// Ends one [`Cancel::freeze`]; at the last, every process of the run gets SIGCONT. A thaw
    /// without a freeze is a no-op.
    pub fn thaw(&self) {
        let mut st = lock_state(&self.state);
        st.freezes = st.freezes.saturating_sub(1);
        if st.freezes == 0 {
            for w in &mut st.watchers {
                w.frozen = false;
            }
        }
        st.wake_all();
    }

    /// Waits until the runs watching the handle have all reported every process stopped
    /// (true), or `done()` says the caller's run is over, or no run of it can run any more
    /// (true: nothing of it runs); false when `limit` passes first or no freeze is asked any
    /// more. A handle no run watches yet is waited for: its run freezes as soon as it starts.
    /// `done` is checked at least every 20 ms, never while the handle's lock is held: it may
    /// take the caller's own locks, and the caller may hold those while it freezes or thaws
    /// this handle (toolsrv's quiesce registry does both).
    pub fn wait_frozen(&self, limit: std::time::Duration, done: &dyn Fn() -> bool) -> bool {
        let end = std::time::Instant::now() + limit;
        loop {
            if let Some(settled) = self.frozen_state() {
                return settled;
            }
            if done() {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= end {
                return false;
            }
            let wait = (end - now).min(std::time::Duration::from_millis(20));
            let st = lock_state(&self.state);
            // Checked again under the lock the wait releases, so no report is missed.
            if settled(&st).is_some() {
                continue;
            }
            drop(FROZEN.wait_timeout(st, wait));
        }
    }

    /// [`settled`] for this handle, under its lock.
    fn frozen_state(&self) -> Option<bool> {
        settled(&lock_state(&self.state))
    }

    /// The signals [`Cancel::signal`] accepts: SIGHUP, SIGINT, SIGQUIT, SIGKILL, SIGUSR1,
    /// SIGUSR2, SIGALRM, SIGTERM, SIGCONT, SIGWINCH.
    pub const SIGNALS: [i32; 10] = sys::CANCEL_SIGNALS;

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
        if st.freezes > 0 {
            sys::write_all(wake.as_raw_fd(), &1u64.to_ne_bytes())?;
        }
        st.watchers.push(Watcher {
            id,
            wake: wake.clone(),
            signals: Vec::new(),
            frozen: false,
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
    /// [`RunRecord::limits`](crate::RunRecord::limits)). 0 is refused.
    pub timeout_seconds: Option<u64>,
    /// The runner's own secret locations (olliesrv's state directory, configuration files,
    /// sockets, other instances' state directories): hidden from the tool besides the default
    /// secret locations and other homes (see [`MountRecord::hidden`](crate::MountRecord::hidden)),
    /// and secret in every other way too ([`ollie_policy::ResolveContext::extra_secrets`]): no
    /// rule may be or lie inside one (a workspace inside one is refused), and broader grants
    /// are carved around them.
    pub hidden: Vec<PathBuf>,
    /// Union mounts (bead namespaces): each an overlay of read-only lower layers over a
    /// writable upper layer, at a point that need not exist on the host (see
    /// [`crate::UnionMount`]). Not empty: the run gets a new root that holds the points. One-shot
    /// runs only; [`crate::Prepared::run`] refuses them.
    pub unions: Vec<UnionMount>,
    /// Execute this descriptor (`execveat(fd, "", argv, envp, AT_EMPTY_PATH)`) instead of
    /// looking `argv[0]` up: what runs is the file the caller opened (and checked), whatever
    /// its path names by then. `argv` is passed unchanged. One-shot runs only;
    /// [`crate::Prepared::run`] refuses it.
    pub exec_fd: Option<ExecFd>,
    /// Descriptors the tool inherits: `pass_fds[i]` is fd 7 + i in the tool, reachable as
    /// [`pass_fd_path`]`(i)` (`/proc/self/fd/7`, …), open across its `execve`. At most
    /// [`MAX_PASS_FDS`]. One-shot runs only; [`crate::Prepared::run`] refuses them.
    pub pass_fds: Vec<Arc<OwnedFd>>,
    /// Where a one-shot run under `network.mode = "proxy"` hands the proxy's listener
    /// (`127.0.0.1:3128` in the run's own network namespace; see [`crate::ProxyHandoff`]):
    /// required under that mode (the run is refused without it), unused otherwise. A
    /// [`crate::Prepared`] sandbox has one listener per session instead
    /// ([`crate::Prepared::take_proxy_listener`]) and refuses a call that sets this.
    pub proxy: Option<crate::ProxyHandoff>,
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

/// Which output stream a chunk came from (see [`run_streaming`](crate::run_streaming)).
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
            proxy: None,
            fault: None,
        }
    }
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

/// A runner's hidden paths as [`ollie_policy::ResolveContext::extra_secrets`]: each absolute
/// one as given and, where it exists, by its real path
/// ([`ollie_policy::secrets::with_real_paths`]).
pub fn secret_forms(hidden: &[PathBuf]) -> Vec<PathBuf> {
    ollie_policy::secrets::with_real_paths(hidden, |p| std::fs::canonicalize(p).ok())
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
    private_tmp: Option<&Path>,
) -> Result<(ToolEnv, PathBuf), SandboxError> {
    let mut env = tool_env(resolved, req, workdir)?;
    // The private temporary directory is the tool's TMPDIR unless the policy names one.
    if let Some(t) = private_tmp
        && !env.iter().any(|(n, _)| n == "TMPDIR")
    {
        env.push(("TMPDIR".into(), t.as_os_str().as_bytes().to_vec()));
        env.sort();
    }
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
/// allowlist (never a forbidden name), then its fixed values, then, under
/// `network.mode = "proxy"`, the proxy's address ([`crate::proxy_env`]); sorted by name. This is what
/// [`run`](crate::run) gives the tool (it also creates `TMPDIR` when that lies in the workspace).
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
    // The proxy's address last: neither the allowlist nor a fixed value replaces it.
    if crate::proxy::own_namespace(&resolved.network) {
        for (k, v) in crate::proxy::proxy_env() {
            env.retain(|(n, _)| n != k);
            env.push((k.to_owned(), v.as_bytes().to_vec()));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A waiter's `done` takes a lock of the caller's that the caller holds while it freezes
    /// and thaws the handle (toolsrv's quiesce registry does): neither may wait for the other.
    /// Before `done` ran outside the handle's lock this hung toolsrv for good (the crash
    /// suite's "toolsrv still running 10s after the kill").
    #[test]
    fn wait_frozen_calls_done_outside_the_handle_lock() {
        let c = Cancel::new().unwrap();
        c.freeze();
        let registry = Arc::new(Mutex::new(()));
        let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waiter = {
            let (c, registry, over) = (c.clone(), Arc::clone(&registry), Arc::clone(&over));
            std::thread::spawn(move || {
                let done = || {
                    let _g = registry.lock().unwrap();
                    false
                };
                let r = c.wait_frozen(std::time::Duration::from_secs(2), &done);
                over.store(true, std::sync::atomic::Ordering::SeqCst);
                r
            })
        };
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let (c, registry) = (c.clone(), Arc::clone(&registry));
            std::thread::spawn(move || {
                // For the waiter's whole wait (about a hundred calls of `done`).
                while !over.load(std::sync::atomic::Ordering::SeqCst) {
                    let _g = registry.lock().unwrap();
                    c.freeze();
                    c.thaw();
                    drop(_g);
                    std::thread::yield_now();
                }
                let _ = tx.send(());
            });
        }
        assert!(
            rx.recv_timeout(std::time::Duration::from_secs(60)).is_ok(),
            "freezing under the caller's lock waited for the waiter's done: deadlock"
        );
        // Nothing watches the handle, so the waiter gives up at its limit.
        assert!(!waiter.join().unwrap());
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
}
