//! Kernel feature probes: what this kernel and service manager allow (namespaces, seccomp,
//! capabilities), and the side-effect-free probes that check server hardening. Uses `raw`.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use super::raw::*;

/// The last capability number of the running kernel.
/// The highest capability number the kernel knows. Asked of the kernel itself
/// (`PR_CAPBSET_READ` fails with EINVAL past the last one), not of
/// `/proc/sys/kernel/cap_last_cap`, which a service manager may hide (systemd's
/// `ProcSubset=pid`): guessing too high would make every bounding-set drop fail.
pub(crate) fn cap_last_cap() -> u32 {
    const PR_CAPBSET_READ: libc::c_int = 23;
    let mut last = 0;
    for cap in 0..64u32 {
        // SAFETY: raw prctl on integer arguments.
        if unsafe { libc::prctl(PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) } < 0 {
            break;
        }
        last = cap;
    }
    last
}

/// Whether user namespaces can be created here (probed once: a forked child tries
/// `unshare(CLONE_NEWUSER)`), which says more than `/proc/sys/user/max_user_namespaces`
/// (a sysctl a service manager may hide, and not the only way to forbid them).
pub fn user_namespaces() -> bool {
    static PROBED: OnceLock<bool> = OnceLock::new();
    *PROBED.get_or_init(|| can_unshare(libc::CLONE_NEWUSER))
}

/// Whether network namespaces can be created in a new user namespace (probed once: a
/// forked child tries `unshare(CLONE_NEWUSER | CLONE_NEWNET)`), as every run under
/// `network.mode = "proxy"` needs. A service manager may forbid them (systemd's
/// `RestrictNamespaces=` without `net`).
pub fn network_namespaces() -> bool {
    static PROBED: OnceLock<bool> = OnceLock::new();
    *PROBED.get_or_init(|| can_unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET))
}

/// Whether the kernel has seccomp filtering (`PR_GET_SECCOMP` answers instead of EINVAL).
pub fn seccomp_available() -> bool {
    // SAFETY: raw prctl without pointers.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

/// Whether a forked child may `unshare(flags)`. The child runs only unshare and _exit.
fn can_unshare(flags: libc::c_int) -> bool {
    // SAFETY: the child runs only unshare and _exit (async-signal-safe) and never returns;
    // the parent reaps it.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            let r = libc::unshare(flags);
            libc::_exit(if r == 0 { 0 } else { 1 });
        }
        if pid < 0 {
            return false;
        }
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 {
            if errno() != libc::EINTR {
                return false;
            }
        }
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }
}

/// Whether new IPC namespaces can be created here. A service manager may forbid them
/// (systemd's `RestrictNamespaces=` without `ipc`: each allowed kind counts against the unit's
/// exposure). Runs then share the runner's IPC namespace, which loses nothing a tool could
/// reach: the tool filter allows none of the SysV IPC or POSIX message-queue calls (`shmget`,
/// `shmat`, `semget`, `semop`, `msgget`, `msgsnd`, `mq_open`, …), and POSIX shared memory is
/// files under Landlock.
///
/// Known once either a sandbox's clone answered it (`learn_ipc_namespaces`: a one-shot run
/// asks no more than that) or this probed it (a forked child tries
/// `unshare(CLONE_NEWUSER | CLONE_NEWIPC)`).
pub fn ipc_namespaces() -> bool {
    if let Some(known) = ipc_namespaces_known() {
        return known;
    }
    let allowed = can_unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWIPC);
    learn_ipc_namespaces(allowed);
    allowed
}

const IPC_UNKNOWN: u8 = 0;
const IPC_ALLOWED: u8 = 1;
const IPC_REFUSED: u8 = 2;
static IPC_NAMESPACES: AtomicU8 = AtomicU8::new(IPC_UNKNOWN);

/// What [`ipc_namespaces`] would answer, if it is known without a probe.
pub(crate) fn ipc_namespaces_known() -> Option<bool> {
    match IPC_NAMESPACES.load(Ordering::Relaxed) {
        IPC_ALLOWED => Some(true),
        IPC_REFUSED => Some(false),
        _ => None,
    }
}

/// Records what a clone found out about IPC namespaces.
pub(crate) fn learn_ipc_namespaces(allowed: bool) {
    let v = if allowed { IPC_ALLOWED } else { IPC_REFUSED };
    IPC_NAMESPACES.store(v, Ordering::Relaxed);
}

/// Probes whether `ptrace` reaches the kernel, without side effects: an unknown request for
/// pid -1 (no such process), so ESRCH means the call reached the kernel.
pub(crate) fn probe_ptrace() -> io::Result<()> {
    // SAFETY: no pointers are dereferenced (addr and data are 0); pid -1 names no process.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_ptrace,
            -1 as libc::c_long,
            -1 as libc::c_long,
            0,
            0,
        )
    })
    .map(drop)
}

/// Probes whether `io_uring_setup` reaches the kernel, without side effects: 0 entries and a
/// NULL parameter block (EINVAL or EFAULT when it does; nothing is created).
pub(crate) fn probe_io_uring_setup() -> io::Result<()> {
    // SAFETY: the kernel rejects the NULL pointer / zero size before creating anything.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_io_uring_setup,
            0u32,
            std::ptr::null_mut::<libc::c_void>(),
        )
    })?;
    // Cannot happen with these arguments; never leak an fd if it does.
    // SAFETY: a new fd owned by nobody else.
    drop(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
    Ok(())
}

/// Probes whether `bpf` reaches the kernel, without side effects: an unknown command with a
/// NULL, zero-sized attribute (EINVAL when it does).
pub(crate) fn probe_bpf() -> io::Result<()> {
    // SAFETY: no attribute is read (size 0); the command number is invalid.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_bpf,
            -1 as libc::c_int,
            std::ptr::null_mut::<libc::c_void>(),
            0u32,
        )
    })
    .map(drop)
}

/// Probes whether `socketpair(AF_UNIX, SOCK_STREAM)` works (both ends closed at once).
pub(crate) fn probe_socketpair() -> io::Result<()> {
    socketpair().map(drop)
}
