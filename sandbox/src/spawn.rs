//! Running one command under a policy: the one-shot spawn path ([`run`]), and the child plan
//! and cgroup placement it shares with prepared sandboxes.

use crate::cgroup::{MemoryRecord, MemoryScope, RunCgroups};
use crate::error::{SandboxError, cstr, io_err};
use crate::landlock;
use crate::mounts::MountPlan;
use crate::placeholder::Protected;
use crate::record::NetworkRecord;
use crate::record::{Layers, LimitsRecord, MountRecord, RunOutput, RusageRecord};
use crate::request::{
    CancelWatch, MAX_PASS_FDS, RunRequest, Stream, ToolEnv, canonical_workdir, child_fault,
    effective_limits, open_devnull, rlimits, simulated_abi, tool_command, tool_cwd, tool_stdin,
    watch_cancel,
};
use crate::supervise::{
    Capture, DiskWatch, Finished, Watch, exit_of, read_report, run_output, stage_error, supervise,
};
use crate::sys::{self, ChildFault, ChildPlan, MountStep};
use ollie_policy::{Policy, ResolveContext, ResolvedPolicy};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

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
    let shot = plan_run(policy, req)?;
    let l = shot.limits;

    let (stdin_child, stdin_feed) = tool_stdin(req, open_devnull)?;
    let (out_r, out_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (errout_r, errout_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (err_r, err_w) = sys::pipe().map_err(io_err("create pipes"))?;
    let (status_r, status_w) = sys::pipe().map_err(io_err("create pipes"))?;
    // A proxied run's init hands its listener back on the start-up link: a socket then.
    let proxy_port = crate::proxy::listen_port(&shot.resolved.network);
    let (sync_r, sync_w) = if proxy_port != 0 {
        sys::seqpacket_pair()
    } else {
        sys::pipe()
    }
    .map_err(io_err("create pipes"))?;
    let (uid, _) = sys::ids();
    let mut plan = child_plan(
        shot.ruleset.fd.as_ref().map(AsRawFd::as_raw_fd),
        shot.mounts,
        rlimits(&l),
        shot.filters,
    )?;
    plan.stdin = stdin_child.as_raw_fd();
    plan.stdout = out_w.as_raw_fd();
    plan.stderr = errout_w.as_raw_fd();
    plan.err_w = err_w.as_raw_fd();
    plan.status_w = status_w.as_raw_fd();
    plan.sync_r = sync_r.as_raw_fd();
    plan.proxy_port = proxy_port;
    set_exec(
        &mut plan,
        req,
        &shot.program,
        &shot.cwd,
        shot.cwd != shot.workdir,
        &shot.strings,
        shot.exec_fd_inherit,
    )?;

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
        shot.cgroups,
        shot.resolved.policy.best_effort,
        &mut running.cgroups,
    )?;
    let cgroup = running
        .cgroups
        .as_ref()
        .and_then(RunCgroups::pids)
        .map(Path::to_path_buf);
    // The disk watchdog's baseline, taken before the tool can write anything.
    let disk = DiskWatch::start(&shot.watched, &l, Instant::now())?;
    let go = sys::write_all(sync_w.as_raw_fd(), b"g");
    if go.is_ok()
        && proxy_port != 0
        && let Some(handoff) = &req.proxy
    {
        // Before the tool exists: the caller serves the listener from here on.
        let listener =
            crate::supervise::take_proxy_listener(&sync_w, &err_r, &shot.program, &shot.cwd)?;
        handoff.hand(listener);
    }
    drop(sync_w);
    go.map_err(io_err("start the sandbox"))?;

    // Wait for exec (EOF on the close-on-exec error pipe) or a failure report.
    if let Some(msg) = read_report(&err_r)? {
        drop(running);
        return Err(stage_error(msg, &shot.program, &shot.cwd));
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
            cancel: shot.cancel,
        },
        &mut out,
        &mut errc,
        sink,
    )?;
    let ended = reap_run(&mut running, &status_r)?;
    // Every process of the run is gone (init reaped): remove the placeholders no other run
    // uses, then compare with the baseline.
    drop(shot.islands);
    let mut post_run = shot
        .snapshot_before
        .map(|b| b.diff(&crate::postrun::Snapshot::take(&shot.workdir)))
        .unwrap_or_default();
    post_run.add(crate::postrun::setid_flags(&shot.watched, &shot.workdir));
    post_run.add(
        shot.trees_before
            .diff(&crate::treescan::scan(&shot.watched), &shot.workdir),
    );
    let shm_bytes = l.shm_bytes.min(shot.resolved.policy.limits.memory_bytes);
    Ok(run_output(
        req,
        &shot.env,
        started,
        Finished {
            cwd: shot.cwd,
            program: shot.program,
            policy_hash: policy_hash(&shot.resolved),
            layers: Layers::enforced(
                shot.ruleset.record,
                shot.seccomp,
                sys::namespace_names(proxy_port != 0),
                NetworkRecord::of(&shot.resolved.network, false),
                shot.mount_record,
                cgroup,
                cgroup_degraded,
                ended.memory,
            ),
            limits: LimitsRecord::new(&l, shm_bytes),
            stopped,
            exit: ended.exit,
            rusage: ended.rusage,
            post_run,
        },
        out,
        errc,
    ))
}

/// What a one-shot run decided before anything of it exists ([`plan_run`]).
struct OneShot {
    /// The run's registration with its cancellation handle.
    cancel: Option<CancelWatch>,
    /// The canonical workspace.
    workdir: PathBuf,
    resolved: ResolvedPolicy,
    /// The Landlock ruleset (`fd` is `None` for an approved unsandboxed run).
    ruleset: landlock::Ruleset,
    /// The seccomp programs to install ([`crate::bpf::programs`]: the range tree for the
    /// shipped profiles) and their record.
    filters: Vec<Vec<libc::sock_filter>>,
    seccomp: crate::seccomp::SeccompRecord,
    /// The run's cgroups, made but not yet entered ([`place_in_cgroup`]).
    cgroups: RunCgroups,
    /// The tool's working directory.
    cwd: PathBuf,
    /// The policy's limits, narrowed by the request.
    limits: ollie_policy::Limits,
    env: ToolEnv,
    program: PathBuf,
    strings: ExecStrings,
    /// The post-run diff's baseline, if the tool can write in the workspace.
    snapshot_before: Option<crate::postrun::Snapshot>,
    /// Every `.git` and special file of the writable trees before the run.
    trees_before: crate::treescan::TreeScan,
    /// The trees whose filesystems the disk watchdog watches.
    watched: Vec<PathBuf>,
    mounts: Vec<MountStep>,
    mount_record: MountRecord,
    /// Protected islands and placeholders, kept until every process of the run is gone.
    islands: Protected,
    /// The program descriptor is a script: it stays open in the tool.
    exec_fd_inherit: bool,
}

/// Checks the request, resolves the policy and builds everything the child needs: the
/// Landlock ruleset, the seccomp programs, the command and its environment, the mount plan
/// (which creates placeholders), and the post-run baseline before it.
fn plan_run(policy: &Policy, req: &RunRequest) -> Result<OneShot, SandboxError> {
    let exec_fd_inherit = check_request(req)?;
    // From here on the run is started: signals sent to its handle are queued for it.
    let cancel = watch_cancel(req)?;
    let workdir = canonical_workdir(&req.workdir)?;
    let ctx = ResolveContext {
        workdir: workdir.clone(),
        home: req.home.clone(),
        extra_secrets: crate::request::secret_forms(&req.hidden),
    };
    let resolved = policy
        .resolve(&ctx)
        .map_err(|source| SandboxError::Policy { source })?;
    if crate::proxy::own_namespace(&resolved.network) && req.proxy.is_none() {
        return Err(crate::proxy::no_handoff());
    }

    // Landlock ruleset (parent side).
    // (None for an approved unsandboxed run: no Landlock, recorded.)
    let ruleset = landlock::build(&resolved, simulated_abi(req.fault))?;
    let limits = effective_limits(&resolved.policy.limits, req)?;
    // The cgroups first: without a memory cgroup the filter also denies `memfd_create`.
    let cgroups = make_cgroups(&limits);
    let (filters, seccomp, _) = crate::bpf::programs(
        &resolved.network,
        &tool_deny(&resolved.policy.syscalls.deny, &cgroups),
        crate::bpf::Unproven::Reference,
    )?;

    let cwd = tool_cwd(&workdir, req.cwd.as_deref())?;
    let writable = crate::mounts::writable_trees(&resolved);
    let private_tmp = crate::mounts::private_tmp(&resolved, &writable);
    let (env, program) = tool_command(&resolved, req, &workdir, &cwd, private_tmp.as_deref())?;
    let strings = ExecStrings::new(&req.argv, &env)?;

    // The post-run diff's baseline: the workspace as the host has it (before placeholders);
    // only when the tool can write somewhere in it (always when it runs unsandboxed).
    let snapshot_before = (resolved.unsandboxed()
        || writable
            .iter()
            .any(|w| workdir.starts_with(w) || w.starts_with(&workdir)))
    .then(|| crate::postrun::Snapshot::take(&workdir));
    // Without unions (most runs) there is nothing to check against the secret locations, so
    // they are not resolved (a canonicalisation of each, some eighty paths).
    let unions = if req.unions.is_empty() {
        Vec::new()
    } else {
        crate::unions::validate(
            &req.unions,
            &crate::unions::resolved_secrets(&resolved.ctx),
            &writable,
        )?
    };
    // The disk watchdog watches the policy's writable trees' filesystems, also when an
    // unsandboxed run mounts none of them, and the filesystems of the unions' upper layers.
    let mut watched = writable.clone();
    watched.extend(unions.iter().map(|u| u.upper.clone()));
    // Every `.git` in them (protected by the mount plan) and what else host-side programs
    // trip on, as the host has it (before placeholders).
    let mut trees_before = crate::treescan::scan(&watched);
    let MountPlan {
        steps: mounts,
        record: mount_record,
        islands,
    } = MountPlan::new(
        &resolved,
        writable,
        ruleset.record.abi,
        crate::mounts::Unions::Mounted(&unions),
        ruleset.root_access,
        &req.hidden,
        false,
        &mut trees_before,
    )?;
    Ok(OneShot {
        cancel,
        workdir,
        resolved,
        ruleset,
        filters,
        seccomp,
        cgroups,
        cwd,
        limits,
        env,
        program,
        strings,
        snapshot_before,
        trees_before,
        watched,
        mounts,
        mount_record,
        islands,
        exec_fd_inherit,
    })
}

/// Refuses a request without a command or with too many descriptors to pass; whether the
/// program descriptor ([`RunRequest::exec_fd`], if any) is a script.
fn check_request(req: &RunRequest) -> Result<bool, SandboxError> {
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
    match &req.exec_fd {
        None => Ok(false),
        Some(x) => is_script(&x.fd),
    }
}

/// The tool's arguments and `NAME=value` environment as C strings, kept alive for the child
/// plan's pointers into them.
struct ExecStrings {
    argv: Vec<CString>,
    env: Vec<CString>,
}

impl ExecStrings {
    fn new(argv: &[OsString], env: &ToolEnv) -> Result<ExecStrings, SandboxError> {
        let argv = argv
            .iter()
            .map(|a| cstr(a.as_bytes(), "argument"))
            .collect::<Result<_, _>>()?;
        let env = env
            .iter()
            .map(|(k, v)| {
                let mut b = k.as_bytes().to_vec();
                b.push(b'=');
                b.extend_from_slice(v);
                cstr(&b, "environment value")
            })
            .collect::<Result<_, _>>()?;
        Ok(ExecStrings { argv, env })
    }
}

/// Null-terminated pointers to `strings` (valid while `strings` lives).
fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    let mut p: Vec<*const libc::c_char> = strings.iter().map(|c| c.as_ptr()).collect();
    p.push(std::ptr::null());
    p
}

/// Fills in what the tool stage executes: the program (its path, or the request's
/// descriptor), arguments, environment, working directory (`check_cwd`: check it is listable
/// under Landlock), the test fault and the descriptors to pass.
fn set_exec(
    plan: &mut ChildPlan,
    req: &RunRequest,
    program: &Path,
    cwd: &Path,
    check_cwd: bool,
    strings: &ExecStrings,
    exec_fd_inherit: bool,
) -> Result<(), SandboxError> {
    plan.exe = sys::cstring(program).map_err(io_err("prepare exec"))?;
    plan.argv = pointers(&strings.argv);
    plan.envp = pointers(&strings.env);
    plan.cwd = sys::cstring(cwd).map_err(io_err("prepare exec"))?;
    plan.check_cwd = check_cwd;
    plan.fault = child_fault(req.fault);
    plan.pass = req.pass_fds.iter().map(|f| f.as_raw_fd()).collect();
    if let Some(x) = &req.exec_fd {
        plan.exec_fd = x.fd.as_raw_fd();
        plan.exec_fd_inherit = exec_fd_inherit;
    }
    Ok(())
}

/// How a reaped one-shot run ended ([`reap_run`]).
struct Ended {
    /// From [`exit_of`].
    exit: (Option<i32>, Option<i32>),
    rusage: RusageRecord,
    memory: MemoryRecord,
}

/// Reaps the init stage and reads how the tool ended: its wait status as init reported it on
/// `status_r` (else the signal that killed init), the tree's rusage, and the memory cgroup's
/// record with its OOM kills.
fn reap_run(running: &mut Running, status_r: &OwnedFd) -> Result<Ended, SandboxError> {
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
    Ok(Ended {
        exit: exit_of(tool_status, init_signal),
        rusage: RusageRecord {
            user_ms: rusage.user_us / 1000,
            sys_ms: rusage.sys_us / 1000,
            max_rss_kb: rusage.max_rss_kb,
        },
        memory,
    })
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
        proxy_port: 0,
    })
}

/// Fresh cgroups under the runner's own for a run or session: pids (`pids.max` =
/// `limits.processes`) and memory (`limits.memory_bytes`), made before the seccomp filter
/// is chosen ([`tool_deny`]) and entered by [`place_in_cgroup`].
pub(crate) fn make_cgroups(l: &ollie_policy::Limits) -> RunCgroups {
    RunCgroups::make(crate::cgroup::Want {
        processes: l.processes,
        memory_bytes: l.memory_bytes,
    })
}

/// The calls taken out of the tool's profile: the policy's `syscalls.deny`, and
/// `memfd_create` where there is no memory cgroup. RLIMIT_AS counts only mappings, per
/// process; a memfd's pages are charged to nothing else, so a tool could hold any amount in
/// memfds it does not map. EPERM like every denial (glibc has no fallback either way;
/// programs that need anonymous shared memory fall back to `shm_open` or a file in `$TMPDIR`,
/// which the `/dev/shm` cap and the disk watchdog bound). Memfds the tool inherits (toolsrv's
/// sealed scripts) stay usable.
pub(crate) fn tool_deny<'a>(
    deny: &'a std::collections::BTreeSet<String>,
    cgroups: &RunCgroups,
) -> std::borrow::Cow<'a, std::collections::BTreeSet<String>> {
    if cgroups.has_memory() || deny.contains(MEMFD_CREATE) {
        return std::borrow::Cow::Borrowed(deny);
    }
    let mut d = deny.clone();
    d.insert(MEMFD_CREATE.to_owned());
    std::borrow::Cow::Owned(d)
}

/// The call denied without a memory cgroup ([`tool_deny`]).
const MEMFD_CREATE: &str = "memfd_create";

/// Places `pid` (a sandbox's pid 1, before it does anything) in `cgroups` ([`make_cgroups`]),
/// kept in `slot`, whose owner kills `pid` before it drops them. As root (`uid` 0:
/// RLIMIT_NPROC does not bind it) a missing pids cgroup fails closed unless `best_effort`;
/// a missing memory cgroup is recorded ([`MemoryRecord::reason`]), never fatal, but one
/// that was made and then could not take `pid` fails closed: the filter was chosen for a
/// cgroup that bounds memfds. Returns whether the run degraded.
pub(crate) fn place_in_cgroup(
    uid: u32,
    pid: libc::pid_t,
    mut cgroups: RunCgroups,
    best_effort: bool,
    slot: &mut Option<RunCgroups>,
) -> Result<bool, SandboxError> {
    let had_memory = cgroups.has_memory();
    cgroups.place(pid);
    let pids = cgroups.pids().is_some();
    let lost_memory = had_memory && !cgroups.has_memory();
    let reason = cgroups
        .memory_record(MemoryScope::Run, 0)
        .reason
        .unwrap_or_default();
    *slot = Some(cgroups);
    if lost_memory {
        return Err(SandboxError::MemoryCgroup { reason });
    }
    match (uid, pids) {
        (0, false) if best_effort => Ok(true),
        (0, false) => Err(SandboxError::ProcessLimit),
        _ => Ok(false),
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
        network_namespaces: sys::network_namespaces(),
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
    /// Network namespaces may be created (runs under `network.mode = "proxy"` need one each;
    /// without, they fail with the reason).
    pub network_namespaces: bool,
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
}
