//! Why a run was refused or could not start ([`SandboxError`]; [`HardenError`] for the
//! server's own hardening), and the small helpers that build one (`io_err`, `cstr`).
//!
//! The lowest floor of the spawn modules: it names only the layers whose errors it wraps
//! (Landlock, seccomp, protected paths) and `sys`.

use crate::landlock::LandlockError;
use crate::placeholder::ProtectError;
use crate::seccomp::SeccompError;
use crate::sys;
use ollie_policy::PolicyError;
use std::ffi::CString;
use std::io;
use std::path::PathBuf;

/// `Cancel::SIGNALS` as `"1 (SIGHUP), 2 (SIGINT), …"`, for the refusal message.
fn allowed_signals() -> String {
    sys::CANCEL_SIGNALS
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
    /// A union mount ([`RunRequest::unions`](crate::RunRequest::unions)) is malformed or unsafe;
    /// nothing ran.
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
    /// The run's memory cgroup was made but could not take the sandbox.
    #[error("the sandbox could not enter its memory cgroup: {reason}")]
    MemoryCgroup {
        /// Why.
        reason: String,
    },
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
    Protect(#[from] ProtectError),
    /// The tool could not start in its working directory
    /// ([`RunRequest::cwd`](crate::RunRequest::cwd), or the workdir): missing, not a directory, or
    /// not listable under the policy. The command did not run.
    #[error("cannot start in working directory {path}")]
    Cwd {
        /// The directory, as resolved.
        path: PathBuf,
        /// The cause (EACCES: the policy does not let the tool list it).
        #[source]
        source: io::Error,
    },
    /// [`Cancel::signal`](crate::Cancel::signal) was asked for a signal it does not deliver;
    /// nothing was sent.
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
    Harden(#[from] HardenError),
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

pub(crate) fn cstr(b: &[u8], what: &str) -> Result<CString, SandboxError> {
    CString::new(b).map_err(|_| SandboxError::InvalidRequest {
        reason: format!("{what} contains a NUL byte"),
    })
}

/// Why [`harden_server`](crate::harden::harden_server) failed. After an `Step` failure the
/// process may be partly hardened; it should report the error and exit.
#[derive(Debug, thiserror::Error)]
pub enum HardenError {
    /// The process has more than one thread.
    #[error(
        "server hardening refused: the process has {threads} threads (harden before creating any thread: the filter and Landlock must cover every thread)"
    )]
    Threads {
        /// Threads found in `/proc/self/task`.
        threads: usize,
    },
    /// A step failed.
    #[error("server hardening failed at {step}")]
    Step {
        /// The step.
        step: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The seccomp filter could not be compiled (nothing was changed yet).
    #[error("server hardening failed to compile its seccomp filter")]
    Filter {
        /// The cause.
        #[source]
        source: SeccompError,
    },
}
