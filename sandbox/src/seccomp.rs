//! The seccomp profile: an allowlist built from named, commented syscall groups (x86_64),
//! compiled with seccompiler (which also kills foreign-architecture calls), plus two small
//! filters that answer a few calls with another errno: `clone3` and `openat2` fail with
//! ENOSYS (libc falls back to the flag-filtered `clone`, and to `openat`, whose mode this
//! filter can read), and `fallocate` that would allocate space fails with EOPNOTSUPP.
//!
//! Everything not listed fails with EPERM. That includes io_uring, ptrace,
//! process_vm_readv/writev, pidfd_getfd, kcmp, bpf, perf_event_open, userfaultfd, the keyring
//! calls, the whole mount family, chroot, pivot_root, setns, SysV IPC and POSIX message queues,
//! kexec, modules, swap, reboot, syslog, acct, quotactl, ioperm/iopl, open_by_handle_at and
//! name_to_handle_at, fanotify, process_madvise. x32 numbers (bit 30 set) match no rule and
//! fail with EPERM too. Integer arguments are compared as 32-bit values (`Dword`), so high
//! garbage bits in a 64-bit register cannot dodge a rule (TIOCSTI with bits 32..63 set).
//!
//! Argument rules that keep a tool from leaving privilege or reaching the host behind the
//! other layers' backs:
//! - **No set-id files** (systemd's `RestrictSUIDSGID=`): `chmod`, `fchmod`, `fchmodat`,
//!   `fchmodat2`, `creat`, `mkdir`, `mkdirat`, `mknod`, `mknodat` with S_ISUID or S_ISGID in
//!   the mode, and `open`/`openat` that create (O_CREAT or O_TMPFILE) with either bit, fail
//!   with EPERM; `openat2`, whose mode sits in a struct no filter can read, is ENOSYS.
//! - **No datagrams or descriptors to host sockets**: `socketpair` makes only AF_UNIX stream
//!   and seqpacket pairs (a connected stream or seqpacket socket ignores or refuses a
//!   destination address, so `sendto`/`sendmsg` with SCM_RIGHTS cannot reach `/dev/log` or
//!   another daemon, and `connect` fails with EISCONN); `sendto` with an address fails except
//!   in the `all` network mode (UDP), and `MSG_FASTOPEN` (a TCP connect that Landlock's
//!   connect rule never sees) fails in every mode.
//! - **No listening without a bind grant**: under `tcp` with no bind port, `bind`, `listen`
//!   and `accept` are not allowed at all (`listen` on an unbound socket would bind an
//!   ephemeral port Landlock never sees); with bind ports or `all`, `bind` takes only an
//!   address of the size of `sockaddr_in` or `sockaddr_in6` (16 or 28 bytes), which refuses
//!   pathname and nearly every abstract unix name (a 14- or 26-byte abstract name remains:
//!   squatting it on a socketpair socket, which can never listen, can only deny the name).
//! - **No instant disk allocation**: `fallocate` is allowed only to punch holes or collapse
//!   ranges (modes that free space); anything else is EOPNOTSUPP (glibc's `posix_fallocate`
//!   then writes the range), so disk use grows no faster than the tool writes, within
//!   RLIMIT_FSIZE per file and the disk watchdog's limits.

use ollie_policy::Network;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op,
    SeccompCondition as Cond, SeccompFilter, SeccompRule, TargetArch,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

/// Errors compiling the filters.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// seccompiler rejected the rules.
    #[error("seccomp filter could not be compiled")]
    Compile {
        /// The cause.
        #[source]
        source: seccompiler::BackendError,
    },
    /// `syscalls.deny` names a call the profile does not allow (or none at all).
    #[error(
        "syscalls.deny: {name:?} is not a call the default profile allows, so denying it would do nothing (valid: the profile's calls, e.g. \"ptrace\" is not one, \"memfd_create\" is)"
    )]
    UnknownCall {
        /// The name.
        name: String,
    },
}

/// Compiled filters and their description.
#[derive(Debug, Clone)]
pub struct Filters {
    /// BPF programs, in installation order.
    pub programs: Vec<BpfProgram>,
    /// For the run record.
    pub record: SeccompRecord,
}

/// What the seccomp layer does, for the run record.
#[derive(Debug, Clone, Serialize)]
pub struct SeccompRecord {
    /// Profile name.
    pub profile: &'static str,
    /// SHA-256 over the BPF instructions of every filter.
    pub hash: String,
    /// Number of filters.
    pub filters: usize,
    /// Total BPF instructions.
    pub instructions: usize,
    /// Number of allowed syscalls.
    pub allowed_syscalls: usize,
    /// The default action for anything not allowed.
    pub default_action: &'static str,
    /// Calls the policy took out of the profile (`syscalls.deny`).
    pub denied: Vec<String>,
}

type Rules = BTreeMap<i64, Vec<SeccompRule>>;

/// `TIOCSTI`: push a byte into the terminal's input queue.
pub const TIOCSTI: u64 = 0x5412;
/// `TIOCLINUX`: console multiplexing, includes selection paste.
pub const TIOCLINUX: u64 = 0x541C;
pub(crate) const CLONE_NS_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;
pub(crate) const CLONE_NEWTIME: u64 = 0x80;
/// S_ISUID | S_ISGID: the mode bits no tool may set.
pub(crate) const SETID_BITS: u64 = 0o6000;
/// The `open` flags that create a file, and so make the mode argument count: O_CREAT and
/// `__O_TMPFILE` (O_TMPFILE without O_DIRECTORY).
pub(crate) const CREATE_FLAGS: u64 = 0o100 | 0o20000000;
/// `MSG_FASTOPEN`: data with a TCP connect (`sendto`/`sendmsg` on an unconnected socket).
pub(crate) const MSG_FASTOPEN: u64 = 0x2000_0000;
/// Address lengths `bind` takes: `sockaddr_in` and `sockaddr_in6`.
pub(crate) const INET_ADDR_LENS: [u64; 2] = [16, 28];
/// `fallocate` modes that only free space: punch a hole (with KEEP_SIZE), collapse a range.
pub(crate) const FALLOCATE_FREEING: [u64; 2] = [0x01 | 0x02, 0x08];

/// Calls whose mode argument (at the given index) may not carry [`SETID_BITS`].
pub(crate) const MODE_ARGS: &[(i64, u8)] = &[
    (SYS_chmod, 1),
    (SYS_fchmod, 1),
    (SYS_fchmodat, 2),
    (SYS_fchmodat2, 2),
    (SYS_creat, 1),
    (SYS_mkdir, 1),
    (SYS_mkdirat, 2),
    (SYS_mknod, 1),
    (SYS_mknodat, 2),
];

/// Calls that create with a mode when their flags say so: `(nr, flags arg, mode arg)`.
pub(crate) const OPEN_ARGS: &[(i64, u8, u8)] = &[(SYS_open, 1, 2), (SYS_openat, 2, 3)];

/// Calls whose flags argument (at the given index) may not carry [`MSG_FASTOPEN`];
/// `sendto` (flags 3, address length 5) is handled on its own.
pub(crate) const SEND_FLAGS: &[(i64, u8)] = &[(SYS_sendmsg, 2), (SYS_sendmmsg, 3)];

fn allow(rules: &mut Rules, calls: &[Call]) {
    for (_, nr) in calls {
        rules.insert(*nr, vec![]);
    }
}

pub(crate) fn cond(arg: u8, op: Op, v: u64) -> Result<Cond, SeccompError> {
    Cond::new(arg, Len::Dword, op, v).map_err(|source| SeccompError::Compile { source })
}

pub(crate) fn rule(conds: Vec<Cond>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conds).map_err(|source| SeccompError::Compile { source })
}

use libc::*;

/// A call of the profile: `(name, number)`, the name as libc spells the constant
/// (`SYS_read`; [`call_number`] takes it without the prefix).
pub(crate) type Call = (&'static str, i64);

/// A list of [`Call`]s from libc's `SYS_*` constants.
macro_rules! calls {
    ($($nr:ident),* $(,)?) => {
        &[$((stringify!($nr), $nr)),*]
    };
}

/// Calls allowed with argument rules (not in a group): what `syscalls.deny` may also name.
pub(crate) const FILTERED: &[Call] = calls![
    SYS_ioctl,
    SYS_clone,
    SYS_unshare,
    SYS_personality,
    SYS_socketpair,
    SYS_socket,
];

/// The calls that send a signal, with the index of the signal argument: a tool may send any
/// signal but SIGCONT.
pub(crate) const SIGNAL_ARGS: &[(i64, u8)] = &[
    (SYS_kill, 1),
    (SYS_tkill, 1),
    (SYS_tgkill, 2),
    (SYS_rt_sigqueueinfo, 1),
    (SYS_rt_tgsigqueueinfo, 2),
    (SYS_pidfd_send_signal, 1),
];

/// Reading, writing and waiting on fds that are already open.
pub(crate) const GROUP_FD_IO: &[Call] = calls![
    SYS_read,
    SYS_write,
    SYS_readv,
    SYS_writev,
    SYS_pread64,
    SYS_pwrite64,
    SYS_preadv,
    SYS_pwritev,
    SYS_preadv2,
    SYS_pwritev2,
    SYS_lseek,
    SYS_close,
    SYS_close_range,
    SYS_dup,
    SYS_dup2,
    SYS_dup3,
    SYS_fcntl,
    SYS_flock,
    SYS_fsync,
    SYS_fdatasync,
    SYS_sync_file_range,
    SYS_ftruncate,
    SYS_fallocate,
    SYS_sendfile,
    SYS_splice,
    SYS_tee,
    SYS_vmsplice,
    SYS_copy_file_range,
    SYS_pipe,
    SYS_pipe2,
    SYS_select,
    SYS_pselect6,
    SYS_poll,
    SYS_ppoll,
    SYS_epoll_create,
    SYS_epoll_create1,
    SYS_epoll_ctl,
    SYS_epoll_wait,
    SYS_epoll_pwait,
    SYS_epoll_pwait2,
    SYS_eventfd,
    SYS_eventfd2,
    SYS_timerfd_create,
    SYS_timerfd_settime,
    SYS_timerfd_gettime,
    SYS_signalfd,
    SYS_signalfd4,
    SYS_inotify_init,
    SYS_inotify_init1,
    SYS_inotify_add_watch,
    SYS_inotify_rm_watch,
    SYS_fadvise64,
    SYS_readahead,
    SYS_memfd_create,
    SYS_sync,
    SYS_syncfs,
];

/// Path-based filesystem calls. Landlock decides which paths; the read-only mounts of the
/// mount namespace stop metadata changes (chmod/chown/xattr/utime) outside writable trees.
pub(crate) const GROUP_FS: &[Call] = calls![
    SYS_open,
    SYS_openat,
    SYS_openat2,
    SYS_creat,
    SYS_stat,
    SYS_fstat,
    SYS_lstat,
    SYS_newfstatat,
    SYS_statx,
    SYS_statfs,
    SYS_fstatfs,
    SYS_access,
    SYS_faccessat,
    SYS_faccessat2,
    SYS_getdents,
    SYS_getdents64,
    SYS_getcwd,
    SYS_chdir,
    SYS_fchdir,
    SYS_mkdir,
    SYS_mkdirat,
    SYS_rmdir,
    SYS_unlink,
    SYS_unlinkat,
    SYS_rename,
    SYS_renameat,
    SYS_renameat2,
    SYS_link,
    SYS_linkat,
    SYS_symlink,
    SYS_symlinkat,
    SYS_readlink,
    SYS_readlinkat,
    SYS_truncate,
    SYS_chmod,
    SYS_fchmod,
    SYS_fchmodat,
    SYS_fchmodat2,
    SYS_chown,
    SYS_fchown,
    SYS_lchown,
    SYS_fchownat,
    SYS_utime,
    SYS_utimes,
    SYS_utimensat,
    SYS_futimesat,
    SYS_umask,
    SYS_mknod,
    SYS_mknodat,
    SYS_getxattr,
    SYS_lgetxattr,
    SYS_fgetxattr,
    SYS_listxattr,
    SYS_llistxattr,
    SYS_flistxattr,
    SYS_setxattr,
    SYS_lsetxattr,
    SYS_fsetxattr,
    SYS_removexattr,
    SYS_lremovexattr,
    SYS_fremovexattr,
];

/// Memory management of the process itself.
pub(crate) const GROUP_MEMORY: &[Call] = calls![
    SYS_mmap,
    SYS_munmap,
    SYS_mprotect,
    SYS_mremap,
    SYS_madvise,
    SYS_brk,
    SYS_msync,
    SYS_mincore,
    SYS_mlock,
    SYS_mlock2,
    SYS_munlock,
    SYS_mlockall,
    SYS_munlockall,
    SYS_membarrier,
    SYS_pkey_alloc,
    SYS_pkey_free,
    SYS_pkey_mprotect,
    SYS_mseal,
    SYS_get_mempolicy,
];

/// Process life cycle, identity queries and scheduling of the caller's own processes.
/// (`clone` and `unshare` are flag-filtered below; `clone3` is answered ENOSYS.)
pub(crate) const GROUP_PROCESS: &[Call] = calls![
    SYS_fork,
    SYS_vfork,
    SYS_execve,
    SYS_execveat,
    SYS_exit,
    SYS_exit_group,
    SYS_wait4,
    SYS_waitid,
    SYS_getpid,
    SYS_getppid,
    SYS_gettid,
    SYS_getpgid,
    SYS_setpgid,
    SYS_getpgrp,
    SYS_getsid,
    SYS_setsid,
    SYS_getuid,
    SYS_geteuid,
    SYS_getgid,
    SYS_getegid,
    SYS_getgroups,
    SYS_getresuid,
    SYS_getresgid,
    SYS_setuid,
    SYS_setgid,
    SYS_setreuid,
    SYS_setregid,
    SYS_setresuid,
    SYS_setresgid,
    SYS_setgroups,
    SYS_setfsuid,
    SYS_setfsgid,
    SYS_capget,
    SYS_capset,
    SYS_prctl,
    SYS_arch_prctl,
    SYS_set_tid_address,
    SYS_set_robust_list,
    SYS_get_robust_list,
    SYS_rseq,
    SYS_futex,
    SYS_futex_waitv,
    SYS_sched_yield,
    SYS_sched_getaffinity,
    SYS_sched_setaffinity,
    SYS_sched_getparam,
    SYS_sched_getscheduler,
    SYS_sched_get_priority_max,
    SYS_sched_get_priority_min,
    SYS_sched_rr_get_interval,
    SYS_sched_getattr,
    SYS_getpriority,
    SYS_setpriority,
    SYS_getrusage,
    SYS_getrlimit,
    SYS_setrlimit,
    SYS_prlimit64,
    SYS_times,
    SYS_getcpu,
    SYS_pidfd_open,
    SYS_clone3,
    // Further restriction of oneself is always allowed.
    SYS_seccomp,
    SYS_landlock_create_ruleset,
    SYS_landlock_add_rule,
    SYS_landlock_restrict_self,
];

/// Signals (Landlock's signal scope confines them to the sandbox).
pub(crate) const GROUP_SIGNALS: &[Call] = calls![
    SYS_kill,
    SYS_tkill,
    SYS_tgkill,
    SYS_rt_sigaction,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_rt_sigsuspend,
    SYS_rt_sigpending,
    SYS_rt_sigtimedwait,
    SYS_rt_sigqueueinfo,
    SYS_rt_tgsigqueueinfo,
    SYS_sigaltstack,
    SYS_pidfd_send_signal,
    SYS_pause,
    SYS_alarm,
    SYS_restart_syscall,
];

/// Clocks, timers and system information.
pub(crate) const GROUP_TIME_INFO: &[Call] = calls![
    SYS_nanosleep,
    SYS_clock_nanosleep,
    SYS_clock_gettime,
    SYS_clock_getres,
    SYS_gettimeofday,
    SYS_time,
    SYS_setitimer,
    SYS_getitimer,
    SYS_timer_create,
    SYS_timer_settime,
    SYS_timer_gettime,
    SYS_timer_getoverrun,
    SYS_timer_delete,
    SYS_uname,
    SYS_sysinfo,
    SYS_getrandom,
];

/// Socket calls that only make sense on an existing (socketpair) socket.
pub(crate) const GROUP_SOCKET_IO: &[Call] = calls![
    SYS_sendmsg,
    SYS_recvmsg,
    SYS_sendto,
    SYS_recvfrom,
    SYS_sendmmsg,
    SYS_recvmmsg,
    SYS_shutdown,
    SYS_getsockopt,
    SYS_setsockopt,
    SYS_getsockname,
    SYS_getpeername,
];

/// Client/server socket calls when the policy grants bind ports or the whole network
/// (`bind` is argument-filtered: [`INET_ADDR_LENS`]). A `tcp` policy without bind ports gets
/// `connect` alone ([`GROUP_CONNECT`]).
pub(crate) const GROUP_INET: &[Call] =
    calls![SYS_connect, SYS_bind, SYS_listen, SYS_accept, SYS_accept4];

/// The client call of a `tcp` policy without bind ports (Landlock filters the ports).
pub(crate) const GROUP_CONNECT: &[Call] = calls![SYS_connect];

/// What a network mode changes in the filter. `Tcp` splits on whether a bind port is
/// granted: without one, nothing may bind or listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum NetFilter {
    /// `Network::Off`: no inet socket.
    Off,
    /// `Network::Tcp` without bind ports, and `Network::Proxy`: TCP sockets that connect.
    Connect,
    /// `Network::Tcp` with bind ports: TCP sockets that connect, bind, listen and accept.
    ConnectBind,
    /// `Network::All`: TCP and UDP, any port; datagrams to addresses.
    All,
}

impl NetFilter {
    /// The filter shape of `network`.
    pub(crate) fn of(network: &Network) -> NetFilter {
        match network {
            Network::Off => NetFilter::Off,
            Network::Tcp { bind, .. } if bind.is_empty() => NetFilter::Connect,
            // Its own network namespace; TCP connects only (Landlock: to the proxy's port).
            Network::Proxy(_) => NetFilter::Connect,
            Network::Tcp { .. } => NetFilter::ConnectBind,
            Network::All => NetFilter::All,
        }
    }

    /// The client/server calls allowed (before argument rules).
    pub(crate) fn inet_calls(self) -> &'static [Call] {
        match self {
            NetFilter::Off => &[],
            NetFilter::Connect => GROUP_CONNECT,
            NetFilter::ConnectBind | NetFilter::All => GROUP_INET,
        }
    }

    /// Whether `bind` is allowed (with its address-length rule).
    pub(crate) fn binds(self) -> bool {
        self.inet_calls().iter().any(|(_, nr)| *nr == SYS_bind)
    }

    /// Whether `sendto` may name a destination (UDP needs it; nothing else does).
    pub(crate) fn sendto_address(self) -> bool {
        self == NetFilter::All
    }
}

/// The `socket(2)` calls a network mode allows, as `(family, type & 0xf, protocol)`: none
/// without network; TCP over IPv4/IPv6 for `Tcp` and `Proxy` (no UDP, raw, MPTCP or SCTP, and no AF_UNIX
/// sockets that could reach pathname sockets); TCP and UDP over IPv4/IPv6 for `All` (still no
/// raw, packet, ICMP, MPTCP, SCTP, netlink or AF_UNIX sockets). Protocol 0 is the family's
/// default for the type (TCP for streams, UDP for datagrams).
pub(crate) fn socket_triples(network: &Network) -> Vec<(i32, i32, i32)> {
    let types: &[(i32, i32)] = match network {
        Network::Off => &[],
        Network::Tcp { .. } | Network::Proxy(_) => &[(SOCK_STREAM, IPPROTO_TCP)],
        Network::All => &[(SOCK_STREAM, IPPROTO_TCP), (SOCK_DGRAM, IPPROTO_UDP)],
    };
    let mut out = Vec::new();
    for family in [AF_INET, AF_INET6] {
        for (ty, proto) in types {
            for p in [0, *proto] {
                out.push((family, *ty, p));
            }
        }
    }
    out
}

/// The `socketpair(2)` types allowed (AF_UNIX only): stream and seqpacket. A datagram pair
/// could send to any pathname socket of the host (`sendto`/`sendmsg` with an address, or
/// `connect` to retarget it).
pub(crate) const SOCKETPAIR_TYPES: [i32; 2] = [SOCK_STREAM, SOCK_SEQPACKET];

/// The groups every network mode allows (before argument rules).
pub(crate) const BASE_GROUPS: [&[Call]; 7] = [
    GROUP_FD_IO,
    GROUP_FS,
    GROUP_MEMORY,
    GROUP_PROCESS,
    GROUP_SIGNALS,
    GROUP_TIME_INFO,
    GROUP_SOCKET_IO,
];

fn build_allowlist(network: &Network, deny: &BTreeSet<i64>) -> Result<Rules, SeccompError> {
    let net = NetFilter::of(network);
    let mut rules = Rules::new();
    for g in BASE_GROUPS {
        allow(&mut rules, g);
    }
    // ioctl: anything but terminal input injection.
    rules.insert(
        SYS_ioctl,
        vec![rule(vec![
            cond(1, Op::Ne, TIOCSTI)?,
            cond(1, Op::Ne, TIOCLINUX)?,
        ])?],
    );
    // No SIGCONT from a tool: a frozen run (`Cancel::freeze`) stays stopped until the
    // runner thaws it, since nothing in the run can continue a stopped process.
    for (nr, sig) in SIGNAL_ARGS {
        rules.insert(*nr, vec![rule(vec![cond(*sig, Op::Ne, SIGCONT as u64)?])?]);
    }
    // clone/unshare: no new namespaces (CLONE_NEWTIME is only meaningful for unshare; in
    // clone the low byte is the exit signal).
    rules.insert(
        SYS_clone,
        vec![rule(vec![cond(0, Op::MaskedEq(CLONE_NS_FLAGS), 0)?])?],
    );
    rules.insert(
        SYS_unshare,
        vec![rule(vec![cond(
            0,
            Op::MaskedEq(CLONE_NS_FLAGS | CLONE_NEWTIME),
            0,
        )?])?],
    );
    // personality: query and PER_LINUX only (no READ_IMPLIES_EXEC, no ADDR_NO_RANDOMIZE).
    rules.insert(
        SYS_personality,
        vec![
            rule(vec![cond(0, Op::Eq, 0)?])?,
            rule(vec![cond(0, Op::Eq, 0xffff_ffff)?])?,
        ],
    );
    // No set-id bits in any mode a call sets or creates with.
    for (nr, arg) in MODE_ARGS {
        rules.insert(
            *nr,
            vec![rule(vec![cond(*arg, Op::MaskedEq(SETID_BITS), 0)?])?],
        );
    }
    for (nr, flags, mode) in OPEN_ARGS {
        rules.insert(
            *nr,
            vec![
                rule(vec![cond(*flags, Op::MaskedEq(CREATE_FLAGS), 0)?])?,
                rule(vec![cond(*mode, Op::MaskedEq(SETID_BITS), 0)?])?,
            ],
        );
    }
    // No TCP fast open; no destination address but for UDP.
    for (nr, flags) in SEND_FLAGS {
        rules.insert(
            *nr,
            vec![rule(vec![cond(*flags, Op::MaskedEq(MSG_FASTOPEN), 0)?])?],
        );
    }
    let mut sendto = vec![cond(3, Op::MaskedEq(MSG_FASTOPEN), 0)?];
    if !net.sendto_address() {
        sendto.push(cond(5, Op::Eq, 0)?);
    }
    rules.insert(SYS_sendto, vec![rule(sendto)?]);
    // socketpair: AF_UNIX stream and seqpacket pairs only.
    let mut pairs = Vec::new();
    for ty in SOCKETPAIR_TYPES {
        pairs.push(rule(vec![
            cond(0, Op::Eq, AF_UNIX as u64)?,
            cond(1, Op::MaskedEq(0xf), ty as u64)?,
        ])?);
    }
    rules.insert(SYS_socketpair, pairs);
    let triples = socket_triples(network);
    if !triples.is_empty() {
        allow(&mut rules, net.inet_calls());
        if net.binds() {
            let mut binds = Vec::new();
            for len in INET_ADDR_LENS {
                binds.push(rule(vec![cond(2, Op::Eq, len)?])?);
            }
            rules.insert(SYS_bind, binds);
        }
        let mut socket_rules = Vec::new();
        for (family, ty, proto) in triples {
            socket_rules.push(rule(vec![
                cond(0, Op::Eq, family as u64)?,
                cond(1, Op::MaskedEq(0xf), ty as u64)?,
                cond(2, Op::Eq, proto as u64)?,
            ])?);
        }
        rules.insert(SYS_socket, socket_rules);
    }
    // What the policy takes out (`syscalls.deny`): EPERM like everything not listed.
    for nr in deny {
        rules.remove(nr);
    }
    Ok(rules)
}

/// Every call the profile can allow, by name without the `SYS_` prefix.
fn profile_calls() -> impl Iterator<Item = (&'static str, i64)> {
    BASE_GROUPS
        .into_iter()
        .chain([GROUP_INET, FILTERED])
        .flatten()
        .map(|(name, nr)| (name.strip_prefix("SYS_").unwrap_or(name), *nr))
}

/// The number of a call the default profile can allow (`"ptrace"` is not one).
pub fn call_number(name: &str) -> Option<i64> {
    profile_calls().find(|(n, _)| *n == name).map(|(_, nr)| nr)
}

/// The numbers of a policy's `syscalls.deny` names; a name the profile does not allow is an
/// error (a typo must not pass for a restriction).
pub(crate) fn denied_numbers(deny: &BTreeSet<String>) -> Result<BTreeSet<i64>, SeccompError> {
    deny.iter()
        .map(|name| {
            call_number(name).ok_or_else(|| SeccompError::UnknownCall { name: name.clone() })
        })
        .collect()
}

fn compile(
    rules: Rules,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, SeccompError> {
    let f = SeccompFilter::new(rules, mismatch, matched, TargetArch::x86_64)
        .map_err(|source| SeccompError::Compile { source })?;
    f.try_into()
        .map_err(|source| SeccompError::Compile { source })
}

fn build_uncached(network: &Network, deny: &BTreeSet<String>) -> Result<Filters, SeccompError> {
    let denied = denied_numbers(deny)?;
    let allowlist = build_allowlist(network, &denied)?;
    let allowed = allowlist.len();
    let main = compile(
        allowlist,
        SeccompAction::Errno(EPERM as u32),
        SeccompAction::Allow,
    )?;
    // Installed after the allowlist so that their errno is the one returned (the most
    // recently installed filter wins among equal actions): ENOSYS for clone3 (libc falls
    // back to the filtered clone) and openat2 (libc and careful programs fall back to
    // openat), EOPNOTSUPP for fallocate that would allocate. A call the policy denies is
    // EPERM, so it is left out of these.
    let mut nosys = Rules::new();
    for nr in [SYS_clone3, SYS_openat2] {
        if !denied.contains(&nr) {
            nosys.insert(nr, vec![]);
        }
    }
    let enosys = compile(
        nosys,
        SeccompAction::Allow,
        SeccompAction::Errno(ENOSYS as u32),
    )?;
    let mut alloc = Rules::new();
    if !denied.contains(&SYS_fallocate) {
        alloc.insert(
            SYS_fallocate,
            vec![rule(
                FALLOCATE_FREEING
                    .iter()
                    .map(|m| cond(1, Op::Ne, *m))
                    .collect::<Result<_, _>>()?,
            )?],
        );
    }
    let eopnotsupp = compile(
        alloc,
        SeccompAction::Allow,
        SeccompAction::Errno(EOPNOTSUPP as u32),
    )?;
    let programs = vec![main, enosys, eopnotsupp];
    let mut h = Sha256::new();
    let mut instructions = 0;
    for p in &programs {
        for ins in p {
            h.update(ins.code.to_le_bytes());
            h.update([ins.jt, ins.jf]);
            h.update(ins.k.to_le_bytes());
        }
        instructions += p.len();
        h.update(b"\n");
    }
    let hash = h
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    Ok(Filters {
        record: SeccompRecord {
            profile: "default",
            hash,
            filters: programs.len(),
            instructions,
            allowed_syscalls: allowed,
            default_action: "errno(EPERM); foreign arch: kill process; clone3, openat2: errno(ENOSYS); allocating fallocate: errno(EOPNOTSUPP)",
            denied: deny.iter().cloned().collect(),
        },
        programs,
    })
}

/// The compiled filters for a network mode and the calls a policy takes out (compiled once
/// per network shape (`NetFilter`) when nothing is taken out; the ports of `Tcp` are Landlock's
/// business, not seccomp's).
pub fn filters(network: &Network, deny: &BTreeSet<String>) -> Result<Filters, SeccompError> {
    static OFF: OnceLock<Filters> = OnceLock::new();
    static CONNECT: OnceLock<Filters> = OnceLock::new();
    static CONNECT_BIND: OnceLock<Filters> = OnceLock::new();
    static ALL: OnceLock<Filters> = OnceLock::new();
    if !deny.is_empty() {
        return build_uncached(network, deny);
    }
    let cell = match NetFilter::of(network) {
        NetFilter::Off => &OFF,
        NetFilter::Connect => &CONNECT,
        NetFilter::ConnectBind => &CONNECT_BIND,
        NetFilter::All => &ALL,
    };
    if let Some(f) = cell.get() {
        return Ok(f.clone());
    }
    let f = build_uncached(network, deny)?;
    Ok(cell.get_or_init(|| f).clone())
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

/// SHA-256 over programs in the kernel's form (each instruction's code, jumps and operand,
/// a newline after each program), for the records.
pub(crate) fn program_hash<P: AsRef<[libc::sock_filter]>>(
    programs: impl IntoIterator<Item = P>,
) -> String {
    let mut h = Sha256::new();
    for p in programs {
        for ins in p.as_ref() {
            let mut b = [0u8; 8];
            b[..2].copy_from_slice(&ins.code.to_le_bytes());
            b[2] = ins.jt;
            b[3] = ins.jf;
            b[4..].copy_from_slice(&ins.k.to_le_bytes());
            h.update(b);
        }
        h.update(b"\n");
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_for_every_mode_and_denies_by_default() {
        let none = BTreeSet::new();
        let off = filters(&Network::Off, &none).unwrap();
        let tcp = filters(
            &Network::Tcp {
                connect: [80].into(),
                bind: Default::default(),
            },
            &none,
        )
        .unwrap();
        let all = filters(&Network::All, &BTreeSet::new()).unwrap();
        assert_ne!(off.record.hash, tcp.record.hash);
        assert_ne!(tcp.record.hash, all.record.hash);
        assert_ne!(off.record.hash, all.record.hash);
        assert_eq!(off.programs.len(), 3);
        assert_eq!(all.programs.len(), 3);
        // The network modes differ in the client/server calls and socket(2) only.
        let keys = |n: &Network| -> Vec<i64> {
            build_allowlist(n, &BTreeSet::new())
                .unwrap()
                .keys()
                .copied()
                .collect()
        };
        let extra = |n: &Network| -> Vec<i64> {
            let off = keys(&Network::Off);
            keys(n).into_iter().filter(|k| !off.contains(k)).collect()
        };
        let with = |calls: &[Call]| {
            let mut v: Vec<i64> = calls.iter().map(|(_, nr)| *nr).collect();
            v.push(SYS_socket);
            v.sort_unstable();
            v
        };
        let tcp_bind = Network::Tcp {
            connect: Default::default(),
            bind: [8080].into(),
        };
        let tcp_connect = Network::Tcp {
            connect: [443].into(),
            bind: Default::default(),
        };
        assert_eq!(extra(&Network::All), with(GROUP_INET));
        assert_eq!(extra(&tcp_bind), with(GROUP_INET));
        // Without a bind port nothing binds, listens or accepts.
        assert_eq!(extra(&tcp_connect), with(GROUP_CONNECT));
        let fc = filters(&tcp_connect, &BTreeSet::new()).unwrap();
        let fb = filters(&tcp_bind, &BTreeSet::new()).unwrap();
        assert_ne!(fc.record.hash, fb.record.hash);
        // The proxy mode's filter is the connect-only one (its network namespace and
        // Landlock's single connect port do the rest).
        let proxy = Network::Proxy(ollie_policy::ProxyNetwork::closed());
        assert_eq!(extra(&proxy), with(GROUP_CONNECT));
        assert_eq!(socket_triples(&proxy), socket_triples(&tcp_connect));
        let fp = filters(&proxy, &BTreeSet::new()).unwrap();
        assert_eq!(fp.record.hash, fc.record.hash);
        let rules = build_allowlist(&Network::Off, &BTreeSet::new()).unwrap();
        for denied in [
            SYS_io_uring_setup,
            SYS_io_uring_enter,
            SYS_ptrace,
            SYS_process_vm_readv,
            SYS_process_vm_writev,
            SYS_pidfd_getfd,
            SYS_kcmp,
            SYS_bpf,
            SYS_perf_event_open,
            SYS_userfaultfd,
            SYS_add_key,
            SYS_request_key,
            SYS_keyctl,
            SYS_mount,
            SYS_umount2,
            SYS_pivot_root,
            SYS_move_mount,
            SYS_fsopen,
            SYS_fsmount,
            SYS_open_tree,
            SYS_mount_setattr,
            SYS_chroot,
            SYS_setns,
            SYS_shmget,
            SYS_msgget,
            SYS_semget,
            SYS_mq_open,
            SYS_socket,
            SYS_connect,
            SYS_bind,
            SYS_listen,
            SYS_kexec_load,
            SYS_init_module,
            SYS_open_by_handle_at,
            SYS_name_to_handle_at,
        ] {
            assert!(!rules.contains_key(&denied), "{denied} must not be allowed");
        }
    }

    #[test]
    fn socket_families_and_types_per_mode() {
        let tcp = Network::Tcp {
            connect: Default::default(),
            bind: Default::default(),
        };
        assert!(socket_triples(&Network::Off).is_empty());
        for (family, ty, proto) in socket_triples(&tcp) {
            assert!([AF_INET, AF_INET6].contains(&family));
            assert_eq!(ty, SOCK_STREAM);
            assert!([0, IPPROTO_TCP].contains(&proto));
        }
        let all = socket_triples(&Network::All);
        assert_eq!(all.len(), 8);
        for want in [
            (AF_INET, SOCK_STREAM, 0),
            (AF_INET6, SOCK_STREAM, IPPROTO_TCP),
            (AF_INET, SOCK_DGRAM, 0),
            (AF_INET, SOCK_DGRAM, IPPROTO_UDP),
            (AF_INET6, SOCK_DGRAM, 0),
        ] {
            assert!(all.contains(&want), "{want:?}");
        }
        // Never raw, packet, netlink or AF_UNIX sockets, ICMP datagrams, MPTCP or SCTP.
        for (family, ty, proto) in all {
            assert!([AF_INET, AF_INET6].contains(&family));
            assert!([SOCK_STREAM, SOCK_DGRAM].contains(&ty));
            assert!(![IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_MPTCP, IPPROTO_SCTP].contains(&proto));
        }
    }

    #[test]
    fn deny_takes_calls_out_and_refuses_names_the_profile_lacks() {
        let deny: BTreeSet<String> = ["memfd_create", "ioctl", "connect"]
            .into_iter()
            .map(String::from)
            .collect();
        let nrs = denied_numbers(&deny).unwrap();
        assert_eq!(
            nrs,
            [SYS_memfd_create, SYS_ioctl, SYS_connect]
                .into_iter()
                .collect()
        );
        let base = build_allowlist(&Network::All, &BTreeSet::new()).unwrap();
        let narrowed = build_allowlist(&Network::All, &nrs).unwrap();
        for nr in &nrs {
            assert!(base.contains_key(nr) && !narrowed.contains_key(nr));
        }
        assert_eq!(base.len(), narrowed.len() + nrs.len());
        let f = filters(&Network::All, &deny).unwrap();
        assert_eq!(f.record.denied, ["connect", "ioctl", "memfd_create"]);
        assert_ne!(
            f.record.hash,
            filters(&Network::All, &BTreeSet::new())
                .unwrap()
                .record
                .hash
        );
        // Names the profile never allows (or no call at all) are refused, not ignored.
        for bad in ["ptrace", "mount", "no_such_call", "SYS_read"] {
            let one: BTreeSet<String> = [bad.to_string()].into();
            let e = filters(&Network::Off, &one).unwrap_err().to_string();
            assert!(e.starts_with("syscalls.deny:") && e.contains(bad), "{e}");
        }
        assert_eq!(call_number("read"), Some(SYS_read));
        assert_eq!(call_number("socket"), Some(SYS_socket));
    }

    #[test]
    fn the_policy_crate_names_exactly_the_profile_calls() {
        let mut ours: Vec<&str> = profile_calls().map(|(n, _)| n).collect();
        ours.sort_unstable();
        ours.dedup();
        assert_eq!(ours, ollie_policy::syscalls::DEFAULT_PROFILE_CALLS);
    }
}
