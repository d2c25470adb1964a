//! The one-shot child runtime: the plan prepared by the parent, and the init and tool stages
//! that run between `clone` and `execve`. Uses `mount`, `netns`, `stage`, `probe` and `raw`.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use super::mount::{MAX_ROOT_ENTRIES, MAX_SLOTS, MountStep, run_mounts};
use super::netns::hand_over_proxy_listener;
use super::probe::*;
use super::raw::*;
use super::stage::*;

/// Forced failures for tests of the fail-closed paths (the numbers travel in
/// [`CallHeader::fault`](super::zygote::CallHeader::fault)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum ChildFault {
    None = 0,
    SeccompInstall = 1,
    CapDrop = 2,
    LandlockRestrict = 3,
}

impl ChildFault {
    /// The fault a call header names (unknown numbers: none). Allocation-free.
    pub(super) fn from_u32(v: u32) -> ChildFault {
        match v {
            1 => ChildFault::SeccompInstall,
            2 => ChildFault::CapDrop,
            3 => ChildFault::LandlockRestrict,
            _ => ChildFault::None,
        }
    }
}

/// Everything the child needs, prepared by the parent before `clone`.
#[derive(Debug)]
pub(crate) struct ChildPlan {
    pub stdin: RawFd,
    pub stdout: RawFd,
    pub stderr: RawFd,
    /// Close-on-exec pipe: the child writes `(stage, errno)` here when a step fails.
    pub err_w: RawFd,
    /// The init stage writes the tool's raw wait status here.
    pub status_w: RawFd,
    /// The parent writes one byte here once it has placed the child in its cgroup.
    pub sync_r: RawFd,
    /// The Landlock ruleset (-1 when `landlock` is false).
    pub ruleset: RawFd,
    /// Whether the tool restricts itself with `ruleset`; false only for a run approved
    /// unsandboxed, which has no ruleset.
    pub landlock: bool,
    pub setgroups_path: CString,
    pub uid_map_path: CString,
    pub gid_map_path: CString,
    pub oom_path: CString,
    pub uid_map: CString,
    pub gid_map: CString,
    pub mounts: Vec<MountStep>,
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    pub cap_last: u32,
    /// BPF programs in installation order.
    pub filters: Vec<Vec<libc::sock_filter>>,
    pub exe: CString,
    pub argv: Vec<*const libc::c_char>,
    pub envp: Vec<*const libc::c_char>,
    pub cwd: CString,
    /// `cwd` is not the workspace (see `restrict_and_exec`).
    pub check_cwd: bool,
    pub fault: ChildFault,
    /// Descriptors the tool inherits as [`FD_PASS_BASE`], [`FD_PASS_BASE`] + 1, … (at most
    /// [`MAX_PASS_FDS`]; one-shot runs only).
    pub pass: Vec<RawFd>,
    /// The descriptor the tool executes (`execveat(fd, "", …, AT_EMPTY_PATH)`) instead of
    /// `exe`; -1: `execve(exe)`. The tool holds it as the number after the passed ones.
    pub exec_fd: RawFd,
    /// `exec_fd` stays open across the exec (a `#!` script: the kernel hands its interpreter
    /// `/dev/fd/N`); otherwise it is close-on-exec.
    pub exec_fd_inherit: bool,
    /// Non-zero: pid 1 gets a network namespace of its own and hands the runner a listener
    /// at `127.0.0.1:proxy_port` over its start-up socket (`sync_r`, then a unix socket; the
    /// zygote's control link), before the tool exists (`netns.rs`).
    pub proxy_port: u16,
}

/// Namespaces the init stage is always created in.
const BASE_NAMESPACE_FLAGS: libc::c_ulong =
    (libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS) as libc::c_ulong;

/// The namespaces a run's init stage gets, as recorded (`net`: a proxied run's own).
pub(crate) fn namespace_names(net: bool) -> Vec<&'static str> {
    let mut v = vec!["user", "pid", "mount"];
    if ipc_namespaces() {
        v.push("ipc");
    }
    if net {
        v.push("net");
    }
    v
}

/// Target fd numbers in the child (besides `stage::FD_ERR` 3 and `stage::FD_RULESET` 6).
const FD_STATUS: RawFd = 4;
const FD_SYNC: RawFd = 5;
/// The first of the descriptors a one-shot tool inherits ([`ChildPlan::pass`]): 7, 8, ….
pub(crate) const FD_PASS_BASE: RawFd = 7;
/// At most this many passed descriptors.
pub(crate) const MAX_PASS_FDS: usize = 16;
/// The longest fd list the child arranges: its own 0–6, the passed ones and the exec fd.
const FD_LIST_MAX: usize = FD_PASS_BASE as usize + MAX_PASS_FDS + 1;
/// Slots of an fd list that stay open across `execve`: stdin, stdout and stderr.
const KEEP_STDIO: u32 = 0b111;

/// Starts the init stage (pid 1 of new user, pid, mount and IPC namespaces), which sets up the
/// mounts and forks the tool. Returns `(pid, pidfd)` in the parent.
pub(crate) fn spawn_init(plan: &ChildPlan) -> io::Result<(libc::pid_t, OwnedFd)> {
    if plan.pass.len() > MAX_PASS_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors to pass",
        ));
    }
    clone_namespaced(&plan.mounts, plan.proxy_port != 0, init_main, plan)
}

/// Clones `child_main(arg)` as pid 1 of new user, pid, mount and IPC namespaces, and of a new
/// network namespace with `net` (the one-shot init stage, or a prepared sandbox's zygote),
/// with every signal blocked across the clone (as posix_spawn does): no handler of the
/// runner can run in the child. Returns `(pid, pidfd)`.
pub(super) fn clone_namespaced<T>(
    mounts: &[MountStep],
    net: bool,
    child_main: fn(&T) -> !,
    arg: &T,
) -> io::Result<(libc::pid_t, OwnedFd)> {
    if mounts.iter().any(|m| match m {
        MountStep::CloneTree { slot, .. }
        | MountStep::Attach { slot, .. }
        | MountStep::UnionCreate { slot, .. }
        | MountStep::UnionAttach { slot, .. } => *slot >= MAX_SLOTS,
        MountStep::NewRoot { entries, .. } => entries.len() > MAX_ROOT_ENTRIES,
        _ => false,
    }) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many writable paths",
        ));
    }
    let newnet = if net {
        libc::CLONE_NEWNET as libc::c_ulong
    } else {
        0
    };
    let flags = BASE_NAMESPACE_FLAGS | newnet | CLONE_PIDFD | libc::SIGCHLD as libc::c_ulong;
    let ipc = libc::CLONE_NEWIPC as libc::c_ulong;
    let mut pidfd: RawFd = -1;
    // SAFETY: plain sigset manipulation on stack values; pthread_sigmask only affects this
    // thread and is restored right after the clone.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut saved: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to stack sigsets.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut saved);
    }
    let mut clone = |flags: libc::c_ulong| {
        // SAFETY: a fork-style clone (no new stack, no CLONE_VM): the child gets a copy of the
        // address space and only runs `child_main`, which uses async-signal-safe syscalls on
        // data prepared before this call and never returns.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                flags,
                0usize,
                &mut pidfd as *mut RawFd,
                0usize,
                0usize,
            )
        };
        if pid == 0 {
            child_main(arg);
        }
        (pid, io::Error::last_os_error())
    };
    // A new IPC namespace too, unless this process knows it may not create one. Not knowing,
    // the clone is the probe: refused (EPERM) with IPC and done without it, the answer is no.
    let (pid, err) = match ipc_namespaces_known() {
        Some(false) => clone(flags),
        Some(true) => clone(flags | ipc),
        None => match clone(flags | ipc) {
            (pid, _) if pid > 0 => {
                learn_ipc_namespaces(true);
                (pid, io::Error::from_raw_os_error(0))
            }
            (_, e) if e.raw_os_error() == Some(libc::EPERM) => {
                let (pid, err) = clone(flags);
                if pid > 0 {
                    learn_ipc_namespaces(false);
                }
                (pid, err)
            }
            failed => failed,
        },
    };
    // SAFETY: restores this thread's mask saved above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut());
    }
    if pid < 0 {
        return Err(err);
    }
    // SAFETY: the kernel stored a new pidfd for the child (CLONE_PIDFD).
    Ok((pid as libc::pid_t, unsafe { OwnedFd::from_raw_fd(pidfd) }))
}

fn write_file(stage: Stage, path: &CStr, data: &CStr) {
    // SAFETY: C strings are valid; raw open/write/close.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            fail(stage, errno());
        }
        let bytes = data.to_bytes();
        let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        if n < 0 || n as usize != bytes.len() {
            fail(stage, errno());
        }
        libc::close(fd);
    }
}

/// The namespaces' one-time set-up, in pid 1 (the init stage or the zygote): id maps
/// (setgroups denied), `oom_score_adj`, then the mount plan. Child only.
///
/// pid 1 holds a copy of the runner's memory, so it is not dumpable except while it writes
/// its own `/proc/self` files: a runner hardened with `PR_SET_DUMPABLE 0`
/// ([`crate::harden::harden_server`]) passes that on to the clone, and the `/proc/self` files
/// of a non-dumpable process belong to the host's root, which an unprivileged pid 1 cannot
/// open for writing. Dumpable again only for those writes (as every pid 1 was before), and
/// never again afterwards.
pub(super) fn map_ids_and_mount(plan: &ChildPlan) {
    // SAFETY: raw prctl on integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    write_file(Stage::UserNamespaceMap, &plan.setgroups_path, c"deny");
    write_file(Stage::UserNamespaceMap, &plan.uid_map_path, &plan.uid_map);
    write_file(Stage::UserNamespaceMap, &plan.gid_map_path, &plan.gid_map);
    write_file(Stage::OomScore, &plan.oom_path, c"1000");
    // SAFETY: as above.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } < 0 {
        fail(Stage::Dumpable, errno());
    }
    run_mounts(&plan.mounts);
}

/// The signals a run's cancellation handle delivers (`Cancel::SIGNALS`): [`FORWARDED`] and
/// SIGKILL, in numeric order.
pub(crate) const CANCEL_SIGNALS: [libc::c_int; 10] = [
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

/// Signals pid 1 of a run (the one-shot init stage or a prepared call's init) forwards to every
/// process of its pid namespace. They stay blocked in pid 1 from the clone on (every signal
/// is blocked across `clone_namespaced`, and the zygote never unblocks any), so they are
/// queued for its `sigwaitinfo` instead of acting on it. `Cancel::signal` accepts exactly
/// these, plus SIGKILL (which kills pid 1 and with it the namespace).
pub(crate) const FORWARDED: [libc::c_int; 9] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGTERM,
    libc::SIGCONT,
    libc::SIGWINCH,
];

/// The signal the runner sends pid 1 of a run to freeze it ([`crate::Cancel::freeze`]): pid
/// 1 then sends SIGSTOP to every other process of its pid namespace. Only accepted from
/// outside the namespace; never forwarded as it is. SIGCONT from the runner thaws.
pub(crate) const FREEZE_SIGNAL: libc::c_int = libc::SIGTSTP;

/// pid 1 of the sandbox. Never returns.
fn init_main(plan: &ChildPlan) -> ! {
    // SAFETY: (whole function) only raw, async-signal-safe syscalls on prepared data.
    unsafe {
        // Die with the runner; the kernel then kills the whole pid namespace.
        libc::prctl(PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
        // 0–6, then the passed descriptors and the exec fd (spawn_init bounded their count).
        let mut fds = [-1 as RawFd; FD_LIST_MAX];
        fds[..FD_PASS_BASE as usize].copy_from_slice(&[
            plan.stdin,
            plan.stdout,
            plan.stderr,
            plan.err_w,
            plan.status_w,
            plan.sync_r,
            plan.ruleset,
        ]);
        let mut n = FD_PASS_BASE as usize;
        let mut keep = KEEP_STDIO;
        for fd in plan.pass.iter().take(MAX_PASS_FDS) {
            fds[n] = *fd;
            keep |= 1 << n;
            n += 1;
        }
        if plan.exec_fd >= 0 {
            fds[n] = plan.exec_fd;
            if plan.exec_fd_inherit {
                keep |= 1 << n;
            }
            n += 1;
        }
        arrange_fd_list_keeping(&fds[..n], keep, plan.err_w);
        let mut b = [0u8; 1];
        // Wait until the parent has placed us in a cgroup (EOF = parent gone).
        if libc::read(FD_SYNC, b.as_mut_ptr().cast(), 1) != 1 {
            fail(Stage::Sync, libc::ECANCELED);
        }
        map_ids_and_mount(plan);
        // A proxied run's network: loopback up, the proxy's listener handed to the runner
        // over the start-up socket (every capability still held; the tool does not exist).
        if plan.proxy_port != 0
            && let Err(e) = hand_over_proxy_listener(FD_SYNC, plan.proxy_port)
        {
            fail(Stage::Network, e);
        }
        libc::close(FD_SYNC);

        // The tool shares init's memory until it execs (CLONE_VM | CLONE_VFORK, like
        // posix_spawn), on its own freshly mapped stack: no second copy of the runner's
        // address space.
        let stack = libc::mmap(
            std::ptr::null_mut(),
            TOOL_STACK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        );
        if stack == libc::MAP_FAILED {
            fail(Stage::Fork, errno());
        }
        let top = (stack as usize + TOOL_STACK_BYTES) & !0xf;
        let child = libc::clone(
            tool_entry,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            plan as *const ChildPlan as *mut libc::c_void,
        );
        if child < 0 {
            fail(Stage::Fork, errno());
        }
        let child = child as libc::pid_t;
        // The tool holds the error pipe until execve; drop ours so the parent sees EOF then.
        libc::close(FD_ERR);
        libc::close(FD_RULESET);
        libc::close(0);
        libc::close(1);
        libc::close(2);
        // The tool's copies of the passed descriptors and the exec fd are its own.
        if n > FD_PASS_BASE as usize {
            libc::syscall(
                SYS_CLOSE_RANGE,
                FD_PASS_BASE as libc::c_uint,
                libc::c_uint::MAX,
                0u32,
            );
        }
        wait_for_tool(child, StatusReport::Status)
    }
}

/// What pid 1 reports on `FD_STATUS` when the tool exits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum StatusReport {
    /// The tool's raw wait status (4 bytes; the runner reaps pid 1 for the rusage).
    Status,
    /// The wait status, then user and system CPU time (µs) and peak RSS (KiB) of everything
    /// reaped (28 bytes; the runner cannot reap a prepared call's pid 1).
    StatusAndRusage,
}

/// pid 1's loop once the tool is forked (the one-shot init stage or a per-call init): every
/// signal is blocked since the clone; forwards [`FORWARDED`] ones to every process of the pid
/// namespace (pid 1 itself is exempt), reaps children, and when `tool` exits reports as
/// `report` says and exits, which kills every remaining process of the namespace. Child only.
pub(super) fn wait_for_tool(tool: libc::pid_t, report: StatusReport) -> ! {
    // SAFETY: (whole function) only raw, async-signal-safe syscalls on stack values.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigaddset(&mut set, FREEZE_SIGNAL);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
        // A freeze asked by the runner is in force (the runner's SIGCONT ends it).
        let mut frozen = false;
        loop {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let sig = libc::sigwaitinfo(&set, &mut info);
            if sig < 0 {
                continue;
            }
            // Sent from outside the pid namespace (the runner): the sender's pid is not
            // mapped here, so the kernel reports 0. Processes of the run cannot freeze or
            // thaw it.
            let from_runner = info.si_pid() == 0;
            if sig == FREEZE_SIGNAL {
                if from_runner {
                    frozen = true;
                    libc::kill(-1, libc::SIGSTOP);
                }
                continue;
            }
            if sig == libc::SIGCONT && frozen && !from_runner {
                continue;
            }
            if sig == libc::SIGCONT && from_runner {
                frozen = false;
            }
            if sig != libc::SIGCHLD {
                libc::kill(-1, sig);
                continue;
            }
            loop {
                let mut status = 0;
                let r = libc::wait4(
                    -1,
                    &mut status,
                    libc::WNOHANG | libc::__WALL,
                    std::ptr::null_mut(),
                );
                if r <= 0 {
                    break;
                }
                if r != tool {
                    continue;
                }
                let mut out = [0u8; 28];
                out[..4].copy_from_slice(&status.to_ne_bytes());
                let len = match report {
                    StatusReport::Status => 4,
                    StatusReport::StatusAndRusage => {
                        let mut ru: libc::rusage = std::mem::zeroed();
                        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
                        let us =
                            |t: libc::timeval| (t.tv_sec as u64) * 1_000_000 + t.tv_usec as u64;
                        out[4..12].copy_from_slice(&us(ru.ru_utime).to_ne_bytes());
                        out[12..20].copy_from_slice(&us(ru.ru_stime).to_ne_bytes());
                        out[20..].copy_from_slice(&(ru.ru_maxrss as u64).to_ne_bytes());
                        28
                    }
                };
                libc::write(FD_STATUS, out.as_ptr().cast(), len);
                libc::_exit(0);
            }
        }
    }
}

/// Stack size of the tool between clone and execve (raw syscalls only, small frames).
pub(super) const TOOL_STACK_BYTES: usize = 256 * 1024;

/// Entry point of the tool on its own stack.
extern "C" fn tool_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `&ChildPlan` init passed to clone; init is suspended (CLONE_VFORK)
    // and the plan stays alive and unmodified until the tool execs or exits.
    let plan = unsafe { &*(arg as *const ChildPlan) };
    tool_main(plan)
}

/// Empties the capability bounding set (`0..=cap_last`; it can only shrink). Child only.
pub(super) fn drop_bounding_set(cap_last: u32) {
    for cap in 0..=cap_last {
        // SAFETY: raw prctl on integer arguments.
        if unsafe { libc::prctl(PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } < 0 {
            fail(Stage::Capabilities, errno());
        }
    }
}

/// Whether `execve` will leave this process no capability although it still holds some: by
/// capabilities(7) the new permitted set is (inheritable & file inheritable) | (file permitted
/// & bounding) | ambient, and root's implicit full file sets do not apply under SECBIT_NOROOT.
/// So it suffices that the bounding set (`0..=cap_last`), the ambient set and the inheritable
/// set are empty and SECBIT_NOROOT is set and locked. Each is read back from the kernel.
/// Child only.
fn execve_drops_every_capability(cap_last: u32) -> bool {
    const SECBIT_NOROOT: libc::c_int = 1 << 0;
    const SECBIT_NOROOT_LOCKED: libc::c_int = 1 << 1;
    const PR_CAPBSET_READ: libc::c_int = 23;
    const PR_GET_SECUREBITS: libc::c_int = 27;
    const PR_CAP_AMBIENT_IS_SET: libc::c_ulong = 1;
    // SAFETY: (the block) raw prctl on integer arguments.
    unsafe {
        for cap in 0..=cap_last {
            if libc::prctl(PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) != 0 {
                return false;
            }
            if libc::prctl(
                PR_CAP_AMBIENT,
                PR_CAP_AMBIENT_IS_SET,
                cap as libc::c_ulong,
                0,
                0,
            ) != 0
            {
                return false;
            }
        }
        let bits = libc::prctl(PR_GET_SECUREBITS, 0, 0, 0, 0);
        if bits < 0
            || bits & (SECBIT_NOROOT | SECBIT_NOROOT_LOCKED) != SECBIT_NOROOT | SECBIT_NOROOT_LOCKED
        {
            return false;
        }
    }
    capget().is_ok_and(|data| data.iter().all(|d| d.inheritable == 0))
}

/// Resets every signal disposition to the default (signals stay blocked). Child only.
pub(super) fn reset_signal_dispositions() {
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: raw signal(2) with SIG_DFL; no handler is installed.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// The one-shot tool: the per-call sequence, including the once-per-session steps.
fn tool_main(plan: &ChildPlan) -> ! {
    restrict_and_exec(&ToolExec {
        rlimits: &plan.rlimits,
        cap_last: plan.cap_last,
        cwd: plan.cwd.as_ptr(),
        check_cwd: plan.check_cwd,
        landlock: plan.landlock,
        session: SessionSteps::InTool {
            cap_last: plan.cap_last,
        },
        filters: &plan.filters,
        fault: plan.fault,
        exe: plan.exe.as_ptr(),
        exec_fd: if plan.exec_fd >= 0 {
            FD_PASS_BASE + plan.pass.len() as RawFd
        } else {
            -1
        },
        argv: plan.argv.as_ptr(),
        envp: plan.envp.as_ptr(),
    })
}

/// Where the steps a prepared sandbox takes once per session happen.
#[derive(Clone, Copy)]
pub(super) enum SessionSteps {
    /// In the tool (one-shot runs): empty the capability bounding set (`0..=cap_last`) and
    /// reset every signal disposition to the default.
    InTool { cap_last: u32 },
    /// Once in the zygote, inherited by every call.
    InZygote,
}

/// What the tool applies between its fork and `execve`: pointers into data prepared before the
/// clone (the one-shot plan, or a call's region in the zygote).
pub(super) struct ToolExec<'a> {
    pub(super) rlimits: &'a [(libc::__rlimit_resource_t, u64)],
    /// The highest capability number (`/proc/sys/kernel/cap_last_cap`).
    pub(super) cap_last: u32,
    pub(super) cwd: *const libc::c_char,
    /// `cwd` is not the workspace: check under Landlock that the tool may list it.
    pub(super) check_cwd: bool,
    /// Restrict the tool with the ruleset at `FD_RULESET` (false: an unsandboxed run, no
    /// ruleset).
    pub(super) landlock: bool,
    pub(super) session: SessionSteps,
    /// BPF programs in installation order.
    pub(super) filters: &'a [Vec<libc::sock_filter>],
    pub(super) fault: ChildFault,
    pub(super) exe: *const libc::c_char,
    /// Execute this fd (`execveat` with `AT_EMPTY_PATH`) instead of `exe`; -1: none.
    pub(super) exec_fd: RawFd,
    pub(super) argv: *const *const libc::c_char,
    pub(super) envp: *const *const libc::c_char,
}

/// The tool's fixed sequence, shared by both spawn paths (STYLE.md): fds ≥ 3 are already
/// closed except the close-on-exec error pipe and ruleset; then setsid, rlimits, chdir,
/// capabilities (bounding set, ambient set, locked securebits, then the three sets),
/// no_new_privs, Landlock `restrict_self` (skipped only for a run approved unsandboxed; then,
/// for a working directory other than the workspace, a check that the tool may list it),
/// signals (dispositions, then an empty mask), seccomp last, execve. Reports the failed stage
/// on the error pipe instead. Never returns.
pub(super) fn restrict_and_exec(t: &ToolExec<'_>) -> ! {
    // The irreversible steps, in this order, one call each (raw, async-signal-safe syscalls
    // on prepared data in every helper; a failure reports its stage and exits).
    //  1. close the status fd, setsid;
    close_status_and_setsid();
    //  2. rlimits;
    apply_rlimits(t.rlimits);
    //  3. chdir;
    change_to_cwd(t.cwd);
    //  4. capabilities: bounding set (in-tool sessions), ambient set cleared, securebits
    //     locked, then capset of the three sets to empty;
    drop_capabilities(t);
    //  5. no_new_privs;
    forbid_new_privs();
    //  6. Landlock restrict_self (unless unsandboxed), then close the ruleset fd, then the
    //     working-directory listing check;
    restrict_self_landlock(t);
    //  7. signals: default dispositions, then an empty mask;
    unblock_signals(t.session);
    //  8. seccomp filters;
    attach_seccomp(t.filters, t.fault);
    //  9. execve (or execveat on the exec fd).
    exec_tool(t)
}

/// Step 1 of [`restrict_and_exec`]: closes the status fd (pid 1's) and starts a new session.
fn close_status_and_setsid() {
    // SAFETY: raw syscalls on integers.
    unsafe {
        libc::close(FD_STATUS);
        if libc::setsid() < 0 {
            fail(Stage::Setsid, errno());
        }
    }
}

/// Step 2 of [`restrict_and_exec`]: every rlimit, soft = hard.
fn apply_rlimits(rlimits: &[(libc::__rlimit_resource_t, u64)]) {
    for (res, v) in rlimits {
        let rl = libc::rlimit64 {
            rlim_cur: *v,
            rlim_max: *v,
        };
        // SAFETY: raw syscall on a live struct.
        if unsafe { libc::setrlimit64(*res, &rl) } < 0 {
            fail(Stage::Rlimit, errno());
        }
    }
}

/// Step 3 of [`restrict_and_exec`]: changes to the tool's working directory.
fn change_to_cwd(cwd: *const libc::c_char) {
    // SAFETY: `cwd` points to a C string prepared before the clone.
    if unsafe { libc::chdir(cwd) } < 0 {
        fail(Stage::Chdir, errno());
    }
}

/// Step 4 of [`restrict_and_exec`]: the bounding set emptied (in-tool sessions), the ambient
/// set cleared, securebits locked, then the effective, permitted and inheritable sets emptied
/// (where a service manager refuses capset, only if `execve` is verified to leave none).
fn drop_capabilities(t: &ToolExec<'_>) {
    if t.fault == ChildFault::CapDrop {
        fail(Stage::Capabilities, libc::EPERM);
    }
    if let SessionSteps::InTool { cap_last } = t.session {
        drop_bounding_set(cap_last);
    }
    // SAFETY: raw prctl syscalls on integers.
    unsafe {
        if libc::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 {
            fail(Stage::Capabilities, errno());
        }
        if libc::prctl(PR_SET_SECUREBITS, SECURE_BITS_LOCKED, 0, 0, 0) < 0 {
            fail(Stage::Capabilities, errno());
        }
    }
    let none = CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    };
    if let Err(e) = capset(&[none; 2]) {
        // A service manager's filter may refuse capset (systemd counts it as @privileged).
        // execve then leaves the tool no capability, provided what makes that so is verified
        // here; otherwise the run fails as before.
        let e = e.raw_os_error().unwrap_or(libc::EIO);
        if e != libc::EPERM || !execve_drops_every_capability(t.cap_last) {
            fail(Stage::Capabilities, e);
        }
    }
}

/// Step 5 of [`restrict_and_exec`]: `no_new_privs`.
fn forbid_new_privs() {
    // SAFETY: raw prctl on integers.
    if unsafe { libc::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } < 0 {
        fail(Stage::NoNewPrivs, errno());
    }
}

/// Step 6 of [`restrict_and_exec`]: Landlock `restrict_self` with the ruleset at `FD_RULESET`
/// (unless the run is unsandboxed), the ruleset fd closed, then, for a working directory
/// other than the workspace, the check that the tool may list it.
fn restrict_self_landlock(t: &ToolExec<'_>) {
    // SAFETY: raw syscalls on integers and a C string literal.
    unsafe {
        if t.landlock {
            if t.fault == ChildFault::LandlockRestrict {
                fail(Stage::Landlock, libc::EINVAL);
            }
            check(
                Stage::Landlock,
                libc::syscall(SYS_LANDLOCK_RESTRICT_SELF, FD_RULESET, 0u32),
            );
        }
        // Closed either way: without a ruleset the number may hold anything inherited.
        libc::close(FD_RULESET);
        // A working directory other than the workspace must be listable under Landlock
        // (which has no chdir hook, but decides this open): the tool starts only where the
        // policy lets it look. The workspace itself is exempt: it may be a carved-out
        // directory without a rule of its own (a home holding secrets).
        if t.check_cwd {
            let dir = libc::open(
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            );
            if dir < 0 {
                fail(Stage::Chdir, errno());
            }
            libc::close(dir);
        }
    }
}

/// Step 7 of [`restrict_and_exec`]: default dispositions first (in-tool sessions; signals are
/// still blocked), then an empty mask.
fn unblock_signals(session: SessionSteps) {
    if let SessionSteps::InTool { .. } = session {
        reset_signal_dispositions();
    }
    // SAFETY: a zeroed sigset_t is a valid argument to sigemptyset; raw sigprocmask on it.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        if libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) < 0 {
            fail(Stage::Signals, errno());
        }
    }
}

/// Step 8 of [`restrict_and_exec`]: attaches the seccomp programs in order (a test fault
/// attaches an empty one, which the kernel refuses).
fn attach_seccomp(filters: &[Vec<libc::sock_filter>], fault: ChildFault) {
    for f in filters {
        let (ptr, len) = if fault == ChildFault::SeccompInstall {
            (std::ptr::null_mut(), 0u16)
        } else {
            (f.as_ptr() as *mut libc::sock_filter, f.len() as u16)
        };
        let prog = libc::sock_fprog { len, filter: ptr };
        // SAFETY: raw seccomp syscall on a live sock_fprog pointing to `f` (or null with
        // length 0), which outlives the call.
        check(Stage::Seccomp, unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                SECCOMP_SET_MODE_FILTER,
                0u32,
                &prog as *const libc::sock_fprog,
            )
        });
    }
}

/// Step 9 of [`restrict_and_exec`]: `execveat` of the exec fd, or `execve` of the program;
/// reports the exec stage if it returns. Never returns.
fn exec_tool(t: &ToolExec<'_>) -> ! {
    // SAFETY: `argv` and `envp` are null-terminated arrays of C strings and `exe` a C string,
    // all prepared before the clone.
    unsafe {
        if t.exec_fd >= 0 {
            libc::syscall(
                libc::SYS_execveat,
                t.exec_fd,
                c"".as_ptr(),
                t.argv,
                t.envp,
                libc::AT_EMPTY_PATH,
            );
        } else {
            libc::execve(t.exe, t.argv, t.envp);
        }
    }
    fail(Stage::Exec, errno());
}

/// Moves `src[i]` to fd `i` (skipping negative entries; stdio without close-on-exec, the rest
/// with it) and closes every fd from `src.len()` up. An fd already in place only gets its
/// close-on-exec flag set (one syscall instead of two: call fds often arrive in place).
/// Child only.
pub(super) fn arrange_fd_list(src: &[RawFd], report: RawFd) {
    arrange_fd_list_keeping(src, KEEP_STDIO, report);
}

/// [`arrange_fd_list`], with the slots whose bit is set in `keep` (at most [`FD_LIST_MAX`]
/// slots) left open across `execve` instead of stdio. Child only.
fn arrange_fd_list_keeping(src: &[RawFd], keep: u32, report: RawFd) {
    // Before the layout is in place, failures go to `report` (FD_ERR may be anything yet).
    let bail = |err: i32| -> ! {
        let mut msg = [0u8; 8];
        msg[..4].copy_from_slice(&(Stage::FdLayout as u32).to_ne_bytes());
        msg[4..].copy_from_slice(&err.to_ne_bytes());
        // SAFETY: raw write/_exit.
        unsafe {
            libc::write(report, msg.as_ptr().cast(), msg.len());
            libc::_exit(126)
        }
    };
    let kept = |i: usize| keep & (1 << i) != 0;
    let mut tmp = [-1 as RawFd; FD_LIST_MAX];
    if src.len() > tmp.len() {
        bail(libc::EINVAL);
    }
    for (i, fd) in src.iter().enumerate().take(tmp.len()) {
        if *fd < 0 {
            continue;
        }
        if *fd == i as RawFd {
            // In place: the second loop only writes to indices of sources that are not in
            // place, so this fd is never clobbered.
            let flags = if kept(i) { 0 } else { libc::FD_CLOEXEC };
            // SAFETY: F_SETFD on an fd this process holds.
            if unsafe { libc::fcntl(*fd, libc::F_SETFD, flags) } < 0 {
                bail(errno());
            }
            continue;
        }
        // SAFETY: F_DUPFD_CLOEXEC picks the lowest free fd >= 100, never clobbering one.
        let n = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 100) };
        if n < 0 {
            bail(errno());
        }
        tmp[i] = n;
    }
    for (i, fd) in tmp.iter().enumerate().take(src.len()) {
        if *fd < 0 {
            continue;
        }
        let flags = if kept(i) { 0 } else { libc::O_CLOEXEC };
        // SAFETY: dup3 onto a fixed number; the old target (if any) is closed atomically.
        if unsafe { libc::dup3(*fd, i as RawFd, flags) } < 0 {
            fail(Stage::FdLayout, errno());
        }
    }
    // SAFETY: closes every fd from src.len() upwards, including the temporaries.
    check(Stage::FdLayout, unsafe {
        libc::syscall(
            SYS_CLOSE_RANGE,
            src.len() as libc::c_uint,
            libc::c_uint::MAX,
            0u32,
        )
    });
}
