//! How the code between `clone` and `execve` reports a failed step: the stages, the error
//! pipe ([`FD_ERR`]) and [`fail`]; and the descriptor of the run's Landlock ruleset
//! ([`FD_RULESET`]), which the mount steps add rules to. Uses `raw`.

use std::os::fd::RawFd;

use super::raw::errno;

/// The error pipe (close-on-exec) in pid 1 and the tool: a failed step writes
/// `(stage, errno)` there.
pub(super) const FD_ERR: RawFd = 3;
/// The run's Landlock ruleset in pid 1 and the tool (until `restrict_self`).
pub(super) const FD_RULESET: RawFd = 6;

/// A failure inside the child: the stage and errno, sent over the error pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Stage {
    Sync = 1,
    UserNamespaceMap,
    Mount,
    FdLayout,
    Fork,
    Setsid,
    Rlimit,
    Capabilities,
    NoNewPrivs,
    Landlock,
    Seccomp,
    Chdir,
    Exec,
    OomScore,
    Signals,
    Dumpable,
    UnionRoot,
    CallIslands,
    CallUnions,
    Network,
}

impl Stage {
    pub(crate) fn from_u32(v: u32) -> Option<Stage> {
        use Stage::*;
        [
            Sync,
            UserNamespaceMap,
            Mount,
            FdLayout,
            Fork,
            Setsid,
            Rlimit,
            Capabilities,
            NoNewPrivs,
            Landlock,
            Seccomp,
            Chdir,
            Exec,
            OomScore,
            Signals,
            Dumpable,
            UnionRoot,
            CallIslands,
            CallUnions,
            Network,
        ]
        .into_iter()
        .find(|s| *s as u32 == v)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Sync => "start-up handshake",
            Stage::UserNamespaceMap => "user namespace id maps",
            Stage::Mount => "mount namespace set-up",
            Stage::FdLayout => "file descriptor layout",
            Stage::Fork => "fork of the tool under the init stage",
            Stage::Setsid => "setsid",
            Stage::Rlimit => "resource limits",
            Stage::Capabilities => "capability drop",
            Stage::NoNewPrivs => "no_new_privs",
            Stage::Landlock => "landlock restrict_self",
            Stage::Seccomp => "seccomp filter installation",
            Stage::Chdir => "chdir to the working directory",
            Stage::Exec => "execve",
            Stage::OomScore => "oom_score_adj",
            Stage::Signals => "signal set-up",
            Stage::Dumpable => "PR_SET_DUMPABLE",
            Stage::UnionRoot => {
                "pivot_root into the union root (under the shipped systemd unit, bead unions \
                 need the drop-in /usr/share/ollie/systemd/unions.conf)"
            }
            Stage::CallIslands => "binding the call's protected paths",
            Stage::CallUnions => "mounting the call's unions",
            Stage::Network => "network namespace set-up (loopback and the proxy's listener)",
        }
    }
}

/// Reports a failed stage on the error pipe and exits. Child only.
pub(super) fn fail(stage: Stage, err: i32) -> ! {
    let mut msg = [0u8; 8];
    msg[..4].copy_from_slice(&(stage as u32).to_ne_bytes());
    msg[4..].copy_from_slice(&err.to_ne_bytes());
    // SAFETY: raw write of a stack buffer, then _exit; both async-signal-safe.
    unsafe {
        libc::write(FD_ERR, msg.as_ptr().cast(), msg.len());
        libc::_exit(126)
    }
}

pub(super) fn check(stage: Stage, r: libc::c_long) {
    if r < 0 {
        fail(stage, errno());
    }
}
