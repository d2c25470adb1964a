//! Hardening of the long-lived server that creates sandboxes (the per-session tool server),
//! applied by that server to itself, once, at start, before it creates any thread.
//!
//! [`harden_server`] takes these steps, in this order; each one fails closed with an error
//! naming it ([`HardenError`]), and everything that can fail without changing the process
//! (reading `/proc`, compiling the filter) happens before the first irreversible step:
//!
//! 1. Refuses a process with more than one thread (entries of `/proc/self/task`): the filter
//!    and the Landlock domain must cover every thread, and a thread the server does not know
//!    about (a library's) could hold fds step 2 closes.
//! 2. Closes every fd ≥ 3 not in [`ServerHardening::keep_fds`] (`close_range` over the gaps;
//!    one `close` per entry of `/proc/self/fd` where `close_range` is unavailable) and makes
//!    stdin `/dev/null`. stdout and stderr stay: they are the server's log. The caller must
//!    not keep an owning handle (`File`, `OwnedFd`, socket) of an fd it does not list.
//! 3. `PR_SET_DUMPABLE 0` (no ptrace or `/proc/<pid>/mem` for same-uid processes, no core
//!    dumps) and `RLIMIT_CORE = 0`.
//! 4. `no_new_privs` (needed for 5 and 6 without privileges; inherited by every tool).
//! 5. Landlock for the server, **handling no filesystem right**: a domain that handles any
//!    filesystem right forbids `mount(2)` and `pivot_root` to the process and everything it
//!    later forks, and the server must still create [`crate::Prepared`] sandboxes, whose
//!    zygote mounts inside its own user and mount namespaces (checked by
//!    `tests/harden.rs` on the CI kernel, Landlock ABI 7). It scopes abstract unix sockets and
//!    signals to the server's own domain (ABI ≥ 6) and, unless
//!    [`ServerHardening::allow_inet`], handles TCP bind and connect with no rule, so neither
//!    the server nor any tool it starts can use TCP whatever a tool's policy says (ABI ≥ 4).
//!    A kernel too old for a part records it as unavailable ([`ServerLandlockRecord`])
//!    instead of failing: this is defence in depth for the server; every tool's sandbox keeps
//!    its own fail-closed floor (`landlock_min_abi`).
//! 6. A seccomp filter (default allow; foreign architectures kill the process; x32 numbers
//!    and the listed calls fail with EPERM) denying what the server never needs and no tool
//!    may ever have: io_uring, ptrace, cross-process memory and fd access, bpf, perf,
//!    userfaultfd, the keyrings, kexec, modules, reboot, swap, acct, clock setting, port I/O,
//!    syslog, quotactl, file handles, vhangup; `socket(2)` of every family but
//!    AF_INET/AF_INET6, and of those too unless `allow_inet` (tools whose policy grants TCP
//!    need them, and they inherit this filter). `socketpair(2)` stays allowed, and so does
//!    everything [`crate::run`], [`crate::Prepared::new`] and [`crate::Prepared::run`] use
//!    (namespaced `clone`, the mount API, Landlock, seccomp, prctl, rlimits, capset, pidfds,
//!    `SCM_RIGHTS`, memfds).
//!
//! Every process the server starts inherits 3–6: the sandboxes' pid 1 stages and zygotes,
//! and the tools (whose own, stricter layers come on top). pid 1 of a sandbox becomes
//! dumpable again only while it writes its own id maps (an unprivileged process cannot write
//! the `/proc/self` files of a non-dumpable one) and not afterwards.
//!
//! [`self_check`] probes, without side effects, what a process can still do (for the
//! server's start-up log, and for tests).
//!
//! Tested by the unit tests below (the filter's verdict for every syscall number) and
//! `tests/harden.rs`, which re-executes itself as a single-threaded probe process (hardening
//! is irreversible and refuses threads, so never in a test harness): denials before and after,
//! fds, and `Prepared`/`run` sandboxes under a hardened server, as root and unprivileged.

pub use crate::error::HardenError;
use crate::landlock::{
    self, NET_BIND_TCP, NET_CONNECT_TCP, SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL,
};

use crate::error::SandboxError;
use crate::seccomp::{SeccompError, cond, program_hash, rule, to_sock_filters};
use crate::sys;
use seccompiler::{SeccompAction, SeccompCmpOp as Op, SeccompFilter, SeccompRule, TargetArch};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{OwnedFd, RawFd};

/// What [`harden_server`] should keep.
#[derive(Debug, Clone, Default)]
pub struct ServerHardening {
    /// Fds ≥ 3 that stay open (the server's control socket, listeners, …). Every other fd ≥ 3
    /// is closed; 0–2 are never closed (stdin becomes `/dev/null`).
    pub keep_fds: Vec<RawFd>,
    /// Whether AF_INET/AF_INET6 sockets (TCP and UDP) stay possible for the server and every
    /// tool it starts. Must be true when any tool's policy grants network (`mode = "tcp"` or
    /// `"all"`) or may be widened to it by an approved grant (`net`, `net:PORT`,
    /// `unsandboxed`): the tools inherit the server's filter and Landlock domain, which only
    /// narrow.
    pub allow_inet: bool,
}

fn step(step: &'static str) -> impl FnOnce(io::Error) -> HardenError {
    move |source| HardenError::Step { step, source }
}

/// How much of the server's Landlock domain the kernel could enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerLandlockStatus {
    /// Everything asked for is enforced.
    Enforced,
    /// Part of it is enforced; the rest is listed as unavailable.
    PartiallyEnforced,
    /// Nothing could be enforced (no Landlock, or an ABI below 4, or below 6 with
    /// `allow_inet`); no domain was created.
    Unavailable,
}

/// The server's own Landlock domain.
#[derive(Debug, Clone, Serialize)]
pub struct ServerLandlockRecord {
    /// The kernel's Landlock ABI (0: none).
    pub abi: u32,
    /// The status.
    pub status: ServerLandlockStatus,
    /// Handled filesystem rights: always none, so `mount(2)` stays possible for sandboxes.
    pub handled_fs: Vec<&'static str>,
    /// Handled network rights (no rule: denied): `bind_tcp`, `connect_tcp` unless
    /// `allow_inet`.
    pub handled_net: Vec<&'static str>,
    /// Scopes: `abstract_unix_socket`, `signal`.
    pub scopes: Vec<&'static str>,
    /// What was asked for but the kernel's ABI cannot enforce.
    pub unavailable: Vec<&'static str>,
}

/// The server's seccomp filter.
#[derive(Debug, Clone, Serialize)]
pub struct ServerSeccompRecord {
    /// SHA-256 over the BPF instructions of every program.
    pub hash: String,
    /// Number of programs attached.
    pub filters: usize,
    /// Total BPF instructions.
    pub instructions: usize,
    /// System calls that always fail with EPERM.
    pub denied_syscalls: Vec<&'static str>,
    /// What `socket(2)` may create.
    pub socket: &'static str,
    /// Actions.
    pub default_action: &'static str,
}

/// What [`harden_server`] applied.
#[derive(Debug, Clone, Serialize)]
pub struct HardeningRecord {
    /// Fds ≥ 3 that were open and got closed.
    pub fds_closed: usize,
    /// Fds ≥ 3 kept open, as asked.
    pub fds_kept: Vec<RawFd>,
    /// How they were closed: `"close_range"` or `"/proc/self/fd"` (one `close` each).
    pub fd_close_method: &'static str,
    /// stdin is `/dev/null`.
    pub stdin_devnull: bool,
    /// `PR_GET_DUMPABLE` afterwards (false).
    pub dumpable: bool,
    /// `RLIMIT_CORE` (0).
    pub core_bytes: u64,
    /// `no_new_privs` is set.
    pub no_new_privs: bool,
    /// The server's Landlock domain.
    pub landlock: ServerLandlockRecord,
    /// The server's seccomp filter.
    pub seccomp: ServerSeccompRecord,
}

impl HardeningRecord {
    /// The record as one JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

use libc::*;

/// Denied for the server and every process it starts (EPERM), with their names. Each is
/// also outside the tools' allowlist (`seccomp.rs`); here they are gone for the server too.
const DENIED: &[(&str, i64)] = &[
    // Kernel attack surface the server never needs.
    ("io_uring_setup", SYS_io_uring_setup),
    ("io_uring_enter", SYS_io_uring_enter),
    ("io_uring_register", SYS_io_uring_register),
    ("bpf", SYS_bpf),
    ("perf_event_open", SYS_perf_event_open),
    ("userfaultfd", SYS_userfaultfd),
    // Reaching into other processes.
    ("ptrace", SYS_ptrace),
    ("process_vm_readv", SYS_process_vm_readv),
    ("process_vm_writev", SYS_process_vm_writev),
    ("pidfd_getfd", SYS_pidfd_getfd),
    ("kcmp", SYS_kcmp),
    // Keyrings.
    ("add_key", SYS_add_key),
    ("request_key", SYS_request_key),
    ("keyctl", SYS_keyctl),
    // The machine.
    ("kexec_load", SYS_kexec_load),
    ("kexec_file_load", SYS_kexec_file_load),
    ("init_module", SYS_init_module),
    ("finit_module", SYS_finit_module),
    ("delete_module", SYS_delete_module),
    ("reboot", SYS_reboot),
    ("swapon", SYS_swapon),
    ("swapoff", SYS_swapoff),
    ("acct", SYS_acct),
    ("settimeofday", SYS_settimeofday),
    ("clock_settime", SYS_clock_settime),
    ("clock_adjtime", SYS_clock_adjtime),
    ("adjtimex", SYS_adjtimex),
    ("iopl", SYS_iopl),
    ("ioperm", SYS_ioperm),
    ("syslog", SYS_syslog),
    ("quotactl", SYS_quotactl),
    ("quotactl_fd", SYS_quotactl_fd),
    ("lookup_dcookie", SYS_lookup_dcookie),
    ("vhangup", SYS_vhangup),
    // File handles bypass path-based checks.
    ("open_by_handle_at", SYS_open_by_handle_at),
    ("name_to_handle_at", SYS_name_to_handle_at),
];

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
/// `__X32_SYSCALL_BIT`.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// A seccomp program: foreign architectures kill the process, x32 numbers (and anything at or
/// above bit 30) fail with EPERM, the rest is left to the other program.
fn x32_guard() -> Vec<sock_filter> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        // seccomp_data.arch
        ins(LD_W_ABS, 0, 0, 4),
        ins(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        ins(RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        // seccomp_data.nr
        ins(LD_W_ABS, 0, 0, 0),
        ins(JGE_K, 0, 1, X32_SYSCALL_BIT),
        ins(RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM as u32),
        ins(RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
}

/// The server's compiled filter and its record.
struct ServerFilter {
    programs: Vec<Vec<sock_filter>>,
    record: ServerSeccompRecord,
}

fn server_rules(allow_inet: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut rules = BTreeMap::new();
    for (_, nr) in DENIED {
        rules.insert(*nr, vec![]);
    }
    // socket: every family but AF_INET/AF_INET6 (AF_UNIX above all: the server only needs
    // socketpair), and those too unless allowed. An empty rule list matches every call.
    let socket = if allow_inet {
        vec![rule(vec![
            cond(0, Op::Ne, AF_INET as u64)?,
            cond(0, Op::Ne, AF_INET6 as u64)?,
        ])?]
    } else {
        vec![]
    };
    rules.insert(SYS_socket, socket);
    Ok(rules)
}

fn server_filter(allow_inet: bool) -> Result<ServerFilter, SeccompError> {
    let main: seccompiler::BpfProgram = SeccompFilter::new(
        server_rules(allow_inet)?,
        SeccompAction::Allow,
        SeccompAction::Errno(EPERM as u32),
        TargetArch::x86_64,
    )
    .and_then(TryInto::try_into)
    .map_err(|source| SeccompError::Compile { source })?;
    let programs = vec![to_sock_filters(&main), x32_guard()];
    let record = ServerSeccompRecord {
        hash: program_hash(&programs),
        filters: programs.len(),
        instructions: programs.iter().map(Vec::len).sum(),
        denied_syscalls: DENIED.iter().map(|(n, _)| *n).collect(),
        socket: if allow_inet {
            "af_inet and af_inet6 only"
        } else {
            "denied"
        },
        default_action: "allow; listed calls and x32 numbers: errno(EPERM); foreign arch: kill process",
    };
    Ok(ServerFilter { programs, record })
}

/// Threads of the calling process.
fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Open fds of the calling process (the listing's own fd excluded).
fn open_fds() -> io::Result<Vec<RawFd>> {
    let mut fds = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd")? {
        if let Some(fd) = e?
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<RawFd>().ok())
        {
            fds.push(fd);
        }
    }
    // The directory's fd is closed now: whatever is still open is the process's.
    fds.retain(|fd| sys::fd_is_open(*fd));
    Ok(fds)
}

const STEP_FDS: &str = "closing inherited fds";

/// Closes every fd ≥ 3 not in `keep` (sorted, ≥ 3, no duplicates). Returns how many were
/// open and the method used.
fn close_other_fds(keep: &[RawFd]) -> Result<(usize, &'static str), HardenError> {
    let doomed: Vec<RawFd> = open_fds()
        .map_err(step(STEP_FDS))?
        .into_iter()
        .filter(|fd| *fd >= 3 && !keep.contains(fd))
        .collect();
    let mut first: u32 = 3;
    let mut closed = Ok(());
    for k in keep {
        let k = *k as u32;
        if k > first {
            closed = sys::close_range(first, k - 1);
            if closed.is_err() {
                break;
            }
        }
        first = k + 1;
    }
    if closed.is_ok() {
        closed = sys::close_range(first, u32::MAX);
    }
    let method = match closed {
        Ok(()) => "close_range",
        // No close_range (kernel < 5.9, or a filter denies it): one close per open fd.
        Err(e) if matches!(e.raw_os_error(), Some(ENOSYS) | Some(EPERM)) => {
            for fd in &doomed {
                match sys::close_raw(*fd) {
                    Err(e) if e.raw_os_error() != Some(EBADF) => return Err(step(STEP_FDS)(e)),
                    _ => {}
                }
            }
            "/proc/self/fd"
        }
        Err(e) => return Err(step(STEP_FDS)(e)),
    };
    // Fail closed: nothing but the kept fds may remain.
    let left: Vec<RawFd> = open_fds()
        .map_err(step(STEP_FDS))?
        .into_iter()
        .filter(|fd| *fd >= 3 && !keep.contains(fd))
        .collect();
    if !left.is_empty() {
        return Err(step(STEP_FDS)(io::Error::other(format!(
            "fds {left:?} are still open"
        ))));
    }
    Ok((doomed.len(), method))
}

/// The server's Landlock domain (step 5): no filesystem right, the two scopes (ABI ≥ 6), TCP
/// bind/connect handled with no rule unless `allow_inet` (ABI ≥ 4).
fn restrict_landlock(abi: u32, allow_inet: bool) -> Result<ServerLandlockRecord, HardenError> {
    let mut unavailable = Vec::new();
    let scoped = if abi >= 6 {
        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    } else {
        unavailable.extend(["scope:abstract_unix_socket", "scope:signal"]);
        0
    };
    let net = match (allow_inet, abi >= 4) {
        (true, _) => 0,
        (false, true) => NET_BIND_TCP | NET_CONNECT_TCP,
        (false, false) => {
            unavailable.extend(["net:bind_tcp", "net:connect_tcp"]);
            0
        }
    };
    let mut record = ServerLandlockRecord {
        abi,
        status: ServerLandlockStatus::Unavailable,
        handled_fs: Vec::new(),
        handled_net: Vec::new(),
        scopes: Vec::new(),
        unavailable,
    };
    if scoped == 0 && net == 0 {
        return Ok(record);
    }
    let ruleset = sys::landlock_create_ruleset(0, net, scoped)
        .map_err(step("landlock ruleset for the server"))?;
    sys::landlock_restrict_self(&ruleset).map_err(step("landlock restrict_self of the server"))?;
    if net != 0 {
        record.handled_net = vec!["bind_tcp", "connect_tcp"];
    }
    if scoped != 0 {
        record.scopes = vec!["abstract_unix_socket", "signal"];
    }
    record.status = if record.unavailable.is_empty() {
        ServerLandlockStatus::Enforced
    } else {
        ServerLandlockStatus::PartiallyEnforced
    };
    Ok(record)
}

/// Hardens the calling process, a long-lived server that creates sandboxes, irreversibly: the
/// steps in the module documentation, in order. Call it first thing in `main`, before any
/// thread exists and while the process holds no owning handle of an fd outside
/// `opts.keep_fds`.
///
/// Fails closed with [`SandboxError::Harden`] naming the step; the process may then be partly
/// hardened and should exit.
pub fn harden_server(opts: &ServerHardening) -> Result<HardeningRecord, SandboxError> {
    // 1. One thread only.
    let threads = thread_count().map_err(step("counting threads"))?;
    if threads != 1 {
        return Err(HardenError::Threads { threads }.into());
    }
    // Everything that can fail without changing the process, first.
    let filter = server_filter(opts.allow_inet).map_err(|source| HardenError::Filter { source })?;
    let abi = landlock::kernel_abi();
    let mut keep: Vec<RawFd> = opts.keep_fds.iter().copied().filter(|f| *f >= 3).collect();
    keep.sort_unstable();
    keep.dedup();
    let devnull: OwnedFd = std::fs::File::open("/dev/null")
        .map_err(step("opening /dev/null for stdin"))?
        .into();

    // 2. fds: stdin first (the /dev/null fd used for it is closed before the count).
    sys::replace_stdin(&devnull).map_err(step("making stdin /dev/null"))?;
    drop(devnull);
    let (fds_closed, fd_close_method) = close_other_fds(&keep)?;

    // 3. No dumps, no ptrace by same-uid processes.
    sys::set_not_dumpable().map_err(step("PR_SET_DUMPABLE"))?;
    sys::set_rlimit(RLIMIT_CORE, 0).map_err(step("RLIMIT_CORE"))?;
    let dumpable = sys::is_dumpable().map_err(step("PR_GET_DUMPABLE"))?;
    if dumpable {
        return Err(
            step("PR_SET_DUMPABLE")(io::Error::other("the process is still dumpable")).into(),
        );
    }

    // 4. no_new_privs.
    sys::set_no_new_privs().map_err(step("no_new_privs"))?;

    // 5. Landlock (no filesystem rights: sandboxes must still mount).
    let landlock = restrict_landlock(abi, opts.allow_inet)?;

    // 6. seccomp, last.
    for p in &filter.programs {
        sys::seccomp_attach(p).map_err(step("seccomp filter of the server"))?;
    }
    Ok(HardeningRecord {
        fds_closed,
        fds_kept: keep,
        fd_close_method,
        stdin_devnull: true,
        dumpable,
        core_bytes: 0,
        no_new_privs: true,
        landlock,
        seccomp: filter.record,
    })
}

/// The outcome of one probe call of [`self_check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallOutcome {
    /// The call succeeded (what it created was closed at once).
    Succeeded,
    /// The call failed with this errno. EPERM: denied (by a seccomp filter, or the kernel's
    /// own policy); anything else means the call reached the kernel's implementation.
    Failed {
        /// The errno.
        errno: i32,
    },
}

impl CallOutcome {
    fn of(r: io::Result<()>) -> CallOutcome {
        match r {
            Ok(()) => CallOutcome::Succeeded,
            Err(e) => CallOutcome::Failed {
                errno: e.raw_os_error().unwrap_or(0),
            },
        }
    }

    /// The call failed with EPERM.
    pub fn is_denied(self) -> bool {
        self == CallOutcome::Failed { errno: EPERM }
    }
}

/// What the calling process can still do, probed by [`self_check`].
#[derive(Debug, Clone, Serialize)]
pub struct SelfCheck {
    /// Threads (`/proc/self/task`), if readable.
    pub threads: Option<usize>,
    /// `PR_GET_DUMPABLE`.
    pub dumpable: Option<bool>,
    /// `NoNewPrivs` of `/proc/self/status`.
    pub no_new_privs: Option<bool>,
    /// `Seccomp_filters` of `/proc/self/status`.
    pub seccomp_filters: Option<u32>,
    /// `ptrace` (an unknown request for no process).
    pub ptrace: CallOutcome,
    /// `io_uring_setup` (0 entries, no parameters).
    pub io_uring_setup: CallOutcome,
    /// `bpf` (an unknown command).
    pub bpf: CallOutcome,
    /// `socket(AF_UNIX, SOCK_STREAM)`.
    pub socket_unix: CallOutcome,
    /// `socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)`.
    pub socket_netlink: CallOutcome,
    /// `socket(AF_INET, SOCK_STREAM)`.
    pub socket_inet: CallOutcome,
    /// `socket(AF_INET6, SOCK_STREAM)`.
    pub socket_inet6: CallOutcome,
    /// `socketpair(AF_UNIX, SOCK_STREAM)`.
    pub socketpair_unix: CallOutcome,
}

impl SelfCheck {
    /// The check as one JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// Probes, without side effects (nothing is attached, traced or kept open), what the calling
/// process can still do: for a hardened server's start-up log, and for tests.
pub fn self_check() -> SelfCheck {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|v| v.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<u32>().ok())
        })
    };
    let socket = |domain, ty, proto| CallOutcome::of(sys::socket(domain, ty, proto).map(drop));
    SelfCheck {
        threads: thread_count().ok(),
        dumpable: sys::is_dumpable().ok(),
        no_new_privs: field("NoNewPrivs").map(|v| v == 1),
        seccomp_filters: field("Seccomp_filters"),
        ptrace: CallOutcome::of(sys::probe_ptrace()),
        io_uring_setup: CallOutcome::of(sys::probe_io_uring_setup()),
        bpf: CallOutcome::of(sys::probe_bpf()),
        socket_unix: socket(AF_UNIX, SOCK_STREAM, 0),
        socket_netlink: socket(AF_NETLINK, SOCK_RAW, 0),
        socket_inet: socket(AF_INET, SOCK_STREAM, 0),
        socket_inet6: socket(AF_INET6, SOCK_STREAM, 0),
        socketpair_unix: CallOutcome::of(sys::probe_socketpair()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::interpret;

    const RET_ALLOW: u32 = SECCOMP_RET_ALLOW;
    const RET_EPERM: u32 = SECCOMP_RET_ERRNO | EPERM as u32;
    const RET_KILL: u32 = SECCOMP_RET_KILL_PROCESS;

    fn data(arch: u32, nr: u32, arg0: u64) -> [u8; 64] {
        let mut d = [0u8; 64];
        d[..4].copy_from_slice(&nr.to_ne_bytes());
        d[4..8].copy_from_slice(&arch.to_ne_bytes());
        d[16..24].copy_from_slice(&arg0.to_ne_bytes());
        d
    }

    /// The kernel's verdict over all programs: the most restrictive action wins.
    fn verdict(programs: &[Vec<sock_filter>], arch: u32, nr: u32, arg0: u64) -> u32 {
        let rank = |r: u32| match r {
            RET_KILL => 0,
            RET_EPERM => 1,
            RET_ALLOW => 2,
            other => panic!("unexpected action {other:#x}"),
        };
        programs
            .iter()
            .map(|p| interpret(p, &data(arch, nr, arg0)).unwrap().0)
            .min_by_key(|r| rank(*r))
            .unwrap()
    }

    #[test]
    fn filter_denies_exactly_the_list_and_the_socket_families() {
        for allow_inet in [false, true] {
            let f = server_filter(allow_inet).unwrap();
            let denied: Vec<u32> = DENIED.iter().map(|(_, nr)| *nr as u32).collect();
            for nr in 0..600u32 {
                let want = if denied.contains(&nr) {
                    RET_EPERM
                } else if nr == SYS_socket as u32 {
                    continue;
                } else {
                    RET_ALLOW
                };
                assert_eq!(verdict(&f.programs, AUDIT_ARCH_X86_64, nr, 0), want, "{nr}");
            }
            let sock = SYS_socket as u32;
            for family in [
                AF_UNIX,
                AF_NETLINK,
                AF_PACKET,
                AF_VSOCK,
                AF_ALG,
                AF_BLUETOOTH,
            ] {
                assert_eq!(
                    verdict(&f.programs, AUDIT_ARCH_X86_64, sock, family as u64),
                    RET_EPERM
                );
                // High bits cannot smuggle AF_UNIX past the 32-bit comparison.
                assert_eq!(
                    verdict(
                        &f.programs,
                        AUDIT_ARCH_X86_64,
                        sock,
                        (1 << 32) | family as u64
                    ),
                    RET_EPERM
                );
            }
            for family in [AF_INET, AF_INET6] {
                let want = if allow_inet { RET_ALLOW } else { RET_EPERM };
                assert_eq!(
                    verdict(&f.programs, AUDIT_ARCH_X86_64, sock, family as u64),
                    want
                );
            }
            // x32 numbers (also of otherwise allowed calls) and foreign architectures.
            for nr in [0u32, SYS_socketpair as u32, SYS_ptrace as u32, 512, 545] {
                assert_eq!(
                    verdict(&f.programs, AUDIT_ARCH_X86_64, X32_SYSCALL_BIT | nr, 0),
                    RET_EPERM
                );
            }
            assert_eq!(verdict(&f.programs, 0x4000_0003 /* i386 */, 1, 0), RET_KILL);
            assert_eq!(f.record.denied_syscalls.len(), DENIED.len());
        }
    }

    #[test]
    fn filter_leaves_what_sandboxes_need() {
        // What run/Prepared::new/Prepared::run (sys/) and a zygote use.
        let needed = [
            SYS_clone,
            SYS_clone3,
            SYS_unshare,
            SYS_mount,
            SYS_umount2,
            SYS_mount_setattr,
            SYS_open_tree,
            SYS_move_mount,
            SYS_pivot_root,
            SYS_fsopen,
            SYS_fsconfig,
            SYS_fsmount,
            SYS_fchdir,
            SYS_symlinkat,
            SYS_mkdirat,
            SYS_setns,
            SYS_pidfd_open,
            SYS_pidfd_send_signal,
            SYS_socketpair,
            SYS_sendmsg,
            SYS_recvmsg,
            SYS_memfd_create,
            SYS_landlock_create_ruleset,
            SYS_landlock_add_rule,
            SYS_landlock_restrict_self,
            SYS_seccomp,
            SYS_prctl,
            SYS_setrlimit,
            SYS_prlimit64,
            SYS_capset,
            SYS_execve,
            SYS_wait4,
            SYS_signalfd4,
            SYS_close_range,
            SYS_openat2,
            SYS_eventfd2,
            SYS_kill,
        ];
        let f = server_filter(false).unwrap();
        for nr in needed {
            assert_eq!(
                verdict(&f.programs, AUDIT_ARCH_X86_64, nr as u32, 0),
                RET_ALLOW,
                "{nr}"
            );
        }
    }

    #[test]
    fn landlock_record_says_what_an_old_kernel_cannot_do() {
        // ABI 0: nothing is created, nothing fails.
        let r = restrict_landlock(0, false).unwrap();
        assert_eq!(r.status, ServerLandlockStatus::Unavailable);
        assert_eq!(r.unavailable.len(), 4);
        assert!(r.handled_fs.is_empty());
    }
}
