//! Prepared sandboxes: what every tool of a session shares is set up once, and only the
//! per-call narrowing stays on the spawn path.
//!
//! [`Prepared::new`] starts a *zygote*: a small single-purpose process cloned (like the
//! one-shot init stage) into new user, pid, mount and IPC namespaces. It writes the id maps,
//! sets up the session's mounts (everything read-only and nosuid except the writable trees,
//! protected islands read-only again, a private `/dev/shm`), empties the capability bounding
//! set, resets every signal disposition, keeps the Landlock ruleset (built once by the
//! parent) and the compiled seccomp program, and then waits on a `SOCK_SEQPACKET` control
//! link.
//!
//! [`Prepared::run`] sends one request (program, cwd, argv, environment; the tool's stdin,
//! stdout/stderr pipes, error pipe and status pipe as `SCM_RIGHTS`). The zygote clones a
//! per-call init into a **new pid namespace nested in the session's** and passes its pidfd
//! back. The per-call init forks the tool, which applies the per-call steps in the documented
//! order (fds, setsid, rlimits, chdir, capability drop with securebits locked, no_new_privs,
//! Landlock `restrict_self` with the prepared ruleset, signals unblocked, seccomp last) and
//! execs. When the tool exits, the per-call init reports its status and rusage and
//! exits, and the kernel kills every other process of that call (setsid'd, double-forked,
//! nohup'd) and nothing of any other call. Timeouts and cancellation signal the per-call
//! init through its pidfd: SIGTERM (forwarded to the call's processes), SIGKILL after the
//! grace period.
//!
//! Dropping the [`Prepared`] (or the runner dying: the control link closes) ends the zygote,
//! and with it every process of every call.
//!
//! The zygote runs in a copy of a possibly multithreaded process: everything between the
//! clone and the tool's execve is raw syscalls on prepared data (see `sys.rs`).
//!
//! seccomp: the same profile as [`crate::seccomp`], compiled as a binary search over
//! syscall-number ranges (`prepared/bpf.rs`), checked equivalent to the reference programs
//! once per process; if the check ever fails, the reference programs are attached instead.

mod bpf;

use crate::landlock::{self, EnforcementStatus, LandlockRecord};
use crate::seccomp::{self, SeccompRecord};
use crate::spawn::{self, Capture};
use crate::sys::{self, ChildFault, ChildPlan, MountStep, Stage, ZygotePlan};
use crate::{
    CapabilityRecord, ExitRecord, Fault, Layers, LimitsRecord, MountRecord, OutputRecord,
    RunOutput, RunRecord, RunRequest, RusageRecord, SandboxError, Stream,
};
use ollie_policy::{Network, Policy, ResolveContext, ResolvedPolicy};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Namespaces of a prepared call, as recorded: the session's four (set up once, inherited)
/// and the call's own pid namespace.
pub const PREPARED_NAMESPACES: [&str; 5] = [
    "user (session, inherited)",
    "pid (session, inherited)",
    "mount (session, inherited)",
    "ipc (session, inherited)",
    "pid (per call)",
];

/// What a [`Prepared`] sandbox set up once for the whole session.
#[derive(Debug, Clone, Serialize)]
pub struct SessionRecord {
    /// The workspace (canonical).
    pub workdir: PathBuf,
    /// SHA-256 of the resolved policy.
    pub policy_hash: String,
    /// Layers set up once and inherited by every call.
    pub set_up_once: Vec<&'static str>,
    /// Steps every call applies itself.
    pub per_call: Vec<&'static str>,
    /// The session-wide pids cgroup (root only).
    pub cgroup: Option<PathBuf>,
    /// The seccomp program layout: `"range-tree"` or `"reference"` (fallback).
    pub seccomp_layout: &'static str,
}

/// A session's sandbox, set up once: see the module documentation.
#[derive(Debug)]
pub struct Prepared {
    control: Mutex<OwnedFd>,
    zygote_pid: libc::pid_t,
    zygote_pidfd: OwnedFd,
    resolved: ResolvedPolicy,
    workdir: PathBuf,
    home: PathBuf,
    devnull: OwnedFd,
    landlock: LandlockRecord,
    seccomp: SeccompRecord,
    writable: Vec<PathBuf>,
    protected: Vec<PathBuf>,
    private_shm: Option<PathBuf>,
    /// Protected islands and placeholders, kept for the session (dropped after the zygote).
    islands: Option<crate::placeholder::Protected>,
    cgroup: Option<PathBuf>,
    cgroup_degraded: bool,
    policy_hash: String,
    seccomp_layout: &'static str,
    reaped: bool,
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> SandboxError {
    move |source| SandboxError::Io { op, source }
}

fn stage_error(msg: [u8; 8], program: &Path) -> SandboxError {
    let stage_n = u32::from_ne_bytes([msg[0], msg[1], msg[2], msg[3]]);
    let errno = i32::from_ne_bytes([msg[4], msg[5], msg[6], msg[7]]);
    let source = io::Error::from_raw_os_error(errno);
    match Stage::from_u32(stage_n) {
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
    }
}

/// Reads the 8-byte failure report from a close-on-exec error pipe; `None` at EOF (success).
fn read_report(fd: &OwnedFd) -> Result<Option<[u8; 8]>, SandboxError> {
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

/// The fast program for a network mode, if it is equivalent to the reference (checked once
/// per process and mode).
fn fast_filter(
    network: &Network,
    reference: &[Vec<libc::sock_filter>],
) -> Option<Vec<libc::sock_filter>> {
    static OFF: OnceLock<Option<Vec<libc::sock_filter>>> = OnceLock::new();
    static TCP: OnceLock<Option<Vec<libc::sock_filter>>> = OnceLock::new();
    let cell = match network {
        Network::Off => &OFF,
        Network::Tcp { .. } => &TCP,
    };
    cell.get_or_init(|| bpf::compile(network).filter(|f| bpf::equivalent(f, reference)))
        .clone()
}

fn to_sock_filters(p: &seccompiler::BpfProgram) -> Vec<libc::sock_filter> {
    p.iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect()
}

fn program_hash(programs: &[Vec<libc::sock_filter>]) -> String {
    let mut h = Sha256::new();
    for p in programs {
        for ins in p {
            h.update(ins.code.to_le_bytes());
            h.update([ins.jt, ins.jf]);
            h.update(ins.k.to_le_bytes());
        }
        h.update(b"\n");
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Upper bound on inodes of the private `/dev/shm` (as in the one-shot path).
const SHM_INODES: u64 = 16384;

/// The session's mounts, as the one-shot path plans them for one run: writable trees cloned
/// before everything goes read-only and nosuid, re-attached; protected islands (with
/// placeholders for missing ones, kept for the session) and secret locations inside writable
/// trees bound read-only; a private `/dev/shm` (one per session).
struct MountPlan {
    writable: Vec<PathBuf>,
    islands: crate::placeholder::Protected,
    protected: Vec<PathBuf>,
    private_shm: Option<PathBuf>,
    steps: Vec<MountStep>,
}

fn mount_plan(resolved: &ResolvedPolicy, abi: u32) -> Result<MountPlan, SandboxError> {
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
    let islands = crate::placeholder::Protected::prepare(&resolved.fs.protected, &writable)?;
    let mut protected: Vec<PathBuf> = islands.paths.clone();
    for s in ollie_policy::secrets::secret_locations(&resolved.ctx.home) {
        if let Ok(real) = std::fs::canonicalize(&s)
            && writable.iter().any(|w| real.starts_with(w) && &real != w)
            && !protected.contains(&real)
        {
            protected.push(real);
        }
    }
    let c = |p: &Path| sys::cstring(p).map_err(io_err("prepare mounts"));
    let mut steps = vec![MountStep::MakePrivate];
    for (slot, w) in writable.iter().enumerate() {
        steps.push(MountStep::CloneTree { path: c(w)?, slot });
    }
    steps.push(MountStep::ReadOnlyAll);
    for (slot, w) in writable.iter().enumerate() {
        steps.push(MountStep::Attach { slot, path: c(w)? });
    }
    for p in &protected {
        steps.push(MountStep::ProtectReadOnly { path: c(p)? });
    }
    let l = resolved.policy.limits;
    let private_shm = match std::fs::canonicalize("/dev/shm") {
        Ok(real) if l.shm_bytes > 0 && real.is_dir() => {
            steps.push(MountStep::PrivateTmpfs {
                path: c(&real)?,
                options: spawn::cstr(
                    format!(
                        "size={},nr_inodes={},mode=1777",
                        l.shm_bytes,
                        SHM_INODES.min(l.shm_bytes / 1024 + 16)
                    )
                    .as_bytes(),
                    "tmpfs options",
                )?,
                rule_access: landlock::writable_rights(abi),
            });
            Some(real)
        }
        _ => None,
    };
    Ok(MountPlan {
        writable,
        islands,
        protected,
        private_shm,
        steps,
    })
}

impl Prepared {
    /// Sets up the session's sandbox for `policy` in the workspace `workdir` (absolute) with
    /// the user's `home`: resolves the policy, builds the Landlock ruleset and the seccomp
    /// program, and starts the zygote (namespaces, id maps, mounts; a pids cgroup as root).
    /// Fails closed like [`crate::run`], naming the layer.
    pub fn new(policy: &Policy, workdir: &Path, home: &Path) -> Result<Prepared, SandboxError> {
        let workdir = std::fs::canonicalize(workdir).map_err(|source| SandboxError::Workdir {
            path: workdir.to_path_buf(),
            source,
        })?;
        if !workdir.is_dir() {
            return Err(SandboxError::InvalidRequest {
                reason: format!("workdir {} is not a directory", workdir.display()),
            });
        }
        let resolved = policy
            .resolve(&ResolveContext {
                workdir: workdir.clone(),
                home: home.to_path_buf(),
            })
            .map_err(|source| SandboxError::Policy { source })?;
        let ruleset = landlock::build(&resolved, None)?;
        let reference = seccomp::filters(&resolved.network)?;
        let reference_programs: Vec<Vec<libc::sock_filter>> =
            reference.programs.iter().map(to_sock_filters).collect();
        let (programs, seccomp_layout) = match fast_filter(&resolved.network, &reference_programs) {
            Some(f) => (vec![f], "range-tree"),
            None => (reference_programs, "reference"),
        };
        let seccomp = SeccompRecord {
            profile: reference.record.profile,
            hash: program_hash(&programs),
            filters: programs.len(),
            instructions: programs.iter().map(Vec::len).sum(),
            allowed_syscalls: reference.record.allowed_syscalls,
            default_action: reference.record.default_action,
        };
        let MountPlan {
            writable,
            islands,
            protected,
            private_shm,
            steps: mounts,
        } = mount_plan(&resolved, ruleset.record.abi)?;
        let l = resolved.policy.limits;
        let rlimits = vec![
            (libc::RLIMIT_CPU, l.cpu_seconds),
            (libc::RLIMIT_AS, l.address_space_bytes),
            (libc::RLIMIT_NPROC, l.processes),
            (libc::RLIMIT_FSIZE, l.file_size_bytes),
            (libc::RLIMIT_NOFILE, l.open_files),
            (libc::RLIMIT_CORE, 0),
        ];
        let devnull: OwnedFd = std::fs::File::open("/dev/null")
            .map_err(io_err("open /dev/null"))?
            .into();
        let (err_r, err_w) = sys::pipe().map_err(io_err("create pipes"))?;
        let (control, control_child) =
            sys::seqpacket_pair().map_err(io_err("create the control link"))?;
        let (uid, gid) = sys::ids();
        let map = |id: u32, what| spawn::cstr(format!("{id} {id} 1").as_bytes(), what);
        let plan = ZygotePlan {
            base: ChildPlan {
                stdin: -1,
                stdout: -1,
                stderr: -1,
                err_w: err_w.as_raw_fd(),
                status_w: -1,
                sync_r: -1,
                ruleset: ruleset.fd.as_raw_fd(),
                setgroups_path: c"/proc/self/setgroups".to_owned(),
                uid_map_path: c"/proc/self/uid_map".to_owned(),
                gid_map_path: c"/proc/self/gid_map".to_owned(),
                oom_path: c"/proc/self/oom_score_adj".to_owned(),
                uid_map: map(uid, "uid map")?,
                gid_map: map(gid, "gid map")?,
                mounts,
                rlimits,
                cap_last: sys::cap_last_cap(),
                filters: programs,
                exe: CString::default(),
                argv: Vec::new(),
                envp: Vec::new(),
                cwd: CString::default(),
                fault: ChildFault::None,
            },
            control: control_child.as_raw_fd(),
        };
        let (zygote_pid, zygote_pidfd) =
            sys::spawn_zygote(&plan).map_err(|source| SandboxError::Namespaces { source })?;
        drop((err_w, control_child));
        let mut prepared = Prepared {
            control: Mutex::new(control),
            zygote_pid,
            zygote_pidfd,
            policy_hash: spawn::policy_hash(&resolved),
            resolved,
            workdir,
            home: home.to_path_buf(),
            devnull,
            landlock: ruleset.record,
            seccomp,
            writable,
            protected,
            private_shm,
            islands: Some(islands),
            cgroup: None,
            cgroup_degraded: false,
            seccomp_layout,
            reaped: false,
        };
        // RLIMIT_NPROC does not bind uid 0: as root the session gets a pids cgroup (all its
        // calls together stay within `limits.processes`), or nothing runs.
        if uid == 0 {
            prepared.cgroup =
                spawn::make_cgroup(l.processes).and_then(|dir| {
                    match std::fs::write(dir.join("cgroup.procs"), zygote_pid.to_string()) {
                        Ok(()) => Some(dir),
                        Err(_) => {
                            spawn::remove_cgroup(&dir);
                            None
                        }
                    }
                });
            if prepared.cgroup.is_none() {
                if !prepared.resolved.policy.best_effort {
                    return Err(SandboxError::ProcessLimit);
                }
                prepared.cgroup_degraded = true;
            }
        }
        {
            let control = prepared.lock();
            sys::send_byte(&control).map_err(io_err("start the sandbox"))?;
        }
        if let Some(msg) = read_report(&err_r)? {
            return Err(stage_error(msg, Path::new("")));
        }
        Ok(prepared)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OwnedFd> {
        // A panic while holding the lock cannot leave the link in a half-sent state (each
        // request is one message), so a poisoned lock is still usable.
        self.control
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The host pid of the zygote (pid 1 of the session's namespaces), for monitoring.
    pub fn zygote_pid(&self) -> u32 {
        self.zygote_pid as u32
    }

    /// The canonical workspace this sandbox was prepared for.
    pub fn workdir(&self) -> &Path {
        &self.workdir
    }

    /// What was set up once for the session.
    pub fn session(&self) -> SessionRecord {
        SessionRecord {
            workdir: self.workdir.clone(),
            policy_hash: self.policy_hash.clone(),
            set_up_once: vec![
                "user, pid, mount and ipc namespaces",
                "id maps",
                "mounts (read-only root, writable trees, protected islands)",
                "landlock ruleset (built once; restrict_self per call)",
                "seccomp program (compiled and checked once; attached per call)",
                "pids cgroup (root: session-wide)",
                "oom_score_adj",
            ],
            per_call: vec![
                "pid namespace",
                "fd layout",
                "setsid",
                "rlimits",
                "chdir",
                "capability drop (all sets, securebits locked)",
                "no_new_privs",
                "landlock restrict_self",
                "signal dispositions",
                "seccomp",
                "execve",
            ],
            cgroup: self.cgroup.clone(),
            seccomp_layout: self.seccomp_layout,
        }
    }

    /// Runs one command in the prepared sandbox, like [`crate::run`]. `req.workdir` must be
    /// the prepared workspace and `req.home` the prepared home.
    pub fn run(&self, req: &RunRequest) -> Result<RunOutput, SandboxError> {
        self.run_streaming(req, &mut |_, _| {})
    }

    /// Like [`Prepared::run`], and also hands every chunk of output to `sink` as it arrives.
    pub fn run_streaming(
        &self,
        req: &RunRequest,
        sink: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<RunOutput, SandboxError> {
        let started = Instant::now();
        if req.argv.is_empty() {
            return Err(SandboxError::InvalidRequest {
                reason: "no command given".into(),
            });
        }
        let workdir =
            std::fs::canonicalize(&req.workdir).map_err(|source| SandboxError::Workdir {
                path: req.workdir.clone(),
                source,
            })?;
        if workdir != self.workdir || req.home != self.home {
            return Err(SandboxError::InvalidRequest {
                reason: format!(
                    "this sandbox was prepared for workdir {} and home {}",
                    self.workdir.display(),
                    self.home.display()
                ),
            });
        }
        if req.stdin_fd.is_some() {
            return Err(SandboxError::InvalidRequest {
                reason: "stdin_fd is not supported by prepared sandboxes; use stdin".into(),
            });
        }
        let fault = match req.fault {
            None => 0u32,
            Some(Fault::SeccompInstall) => 1,
            Some(Fault::CapDrop) => 2,
            Some(Fault::LandlockRestrict) => 3,
            Some(Fault::LandlockAbi(_)) => {
                return Err(SandboxError::InvalidRequest {
                    reason: "a simulated landlock ABI applies to one-shot runs only".into(),
                });
            }
        };
        let env = spawn::tool_env(&self.resolved, req, &workdir)?;
        let path_var = env
            .iter()
            .find(|(n, _)| n == "PATH")
            .and_then(|(_, v)| std::str::from_utf8(v).ok().map(str::to_string));
        let program = spawn::find_program(Path::new(&req.argv[0]), path_var.as_deref(), &workdir)
            .ok_or_else(|| SandboxError::Exec {
            program: req.argv[0].to_string_lossy().into_owned(),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        })?;

        // The request payload: exe, cwd, argv…, env…, each NUL-terminated.
        let mut payload: Vec<u8> = Vec::new();
        let mut push = |b: &[u8], what: &str| -> Result<(), SandboxError> {
            if b.contains(&0) {
                return Err(SandboxError::InvalidRequest {
                    reason: format!("{what} contains a NUL byte"),
                });
            }
            payload.extend_from_slice(b);
            payload.push(0);
            Ok(())
        };
        push(program.as_os_str().as_bytes(), "program path")?;
        push(workdir.as_os_str().as_bytes(), "workdir")?;
        for a in &req.argv {
            push(a.as_bytes(), "argument")?;
        }
        for (k, v) in &env {
            let mut b = k.as_bytes().to_vec();
            b.push(b'=');
            b.extend_from_slice(v);
            push(&b, "environment value")?;
        }
        let strings = 2 + req.argv.len() + env.len();
        if payload.len() > sys::MAX_PAYLOAD || strings > sys::MAX_STRINGS {
            return Err(SandboxError::InvalidRequest {
                reason: format!(
                    "arguments and environment too large ({} bytes, {strings} strings; at most {} and {})",
                    payload.len(),
                    sys::MAX_PAYLOAD,
                    sys::MAX_STRINGS
                ),
            });
        }
        // The post-run diff's baseline (before anything of this call exists).
        let snapshot_before = crate::postrun::Snapshot::take(&workdir);
        let memfd = if payload.len() > sys::MAX_INLINE_PAYLOAD {
            Some(sys::memfd_with(&payload).map_err(io_err("write the call payload"))?)
        } else {
            None
        };
        let hdr = sys::CallHeader {
            magic: sys::CALL_MAGIC,
            fault,
            argc: req.argv.len() as u32,
            envc: env.len() as u32,
            payload_len: payload.len() as u32,
            in_memfd: u32::from(memfd.is_some()),
        };
        let hdr_bytes = hdr.to_bytes();

        let (stdin_child, stdin_feed): (OwnedFd, Option<OwnedFd>) = match &req.stdin {
            None => (
                self.devnull.try_clone().map_err(io_err("open /dev/null"))?,
                None,
            ),
            Some(_) => {
                let (a, b) = sys::socketpair().map_err(io_err("create the stdin socket"))?;
                sys::shutdown_read(&b).map_err(io_err("create the stdin socket"))?;
                (a, Some(b))
            }
        };
        let (out_r, out_w) = sys::pipe().map_err(io_err("create pipes"))?;
        let (errout_r, errout_w) = sys::pipe().map_err(io_err("create pipes"))?;
        let (err_r, err_w) = sys::pipe().map_err(io_err("create pipes"))?;
        let (status_r, status_w) = sys::pipe().map_err(io_err("create pipes"))?;
        let mut fds = vec![
            stdin_child.as_raw_fd(),
            out_w.as_raw_fd(),
            errout_w.as_raw_fd(),
            err_w.as_raw_fd(),
            status_w.as_raw_fd(),
        ];
        if let Some(m) = &memfd {
            fds.push(m.as_raw_fd());
        }
        let gone = |source| SandboxError::Io {
            op: "reach the prepared sandbox",
            source,
        };
        let (n, pidfd, reply) = {
            let control = self.lock();
            let inline: &[u8] = if memfd.is_some() { &[] } else { &payload };
            sys::send_with_fds(&control, &[&hdr_bytes, inline], &fds).map_err(gone)?;
            let mut reply = [0u8; 4];
            let (n, pidfd) = sys::recv_with_fd(&control, &mut reply).map_err(gone)?;
            (n, pidfd, reply)
        };
        drop((stdin_child, out_w, errout_w, err_w, status_w, memfd));
        if n != 4 {
            return Err(gone(io::Error::from_raw_os_error(libc::EPIPE)));
        }
        let errno = i32::from_ne_bytes(reply);
        let call = match (errno, pidfd) {
            (0, Some(fd)) => CallGuard {
                pidfd: fd,
                done: false,
            },
            (0, None) => return Err(gone(io::Error::from_raw_os_error(libc::EPROTO))),
            (e, _) => {
                return Err(SandboxError::ChildSetup {
                    stage: "per-call pid namespace of the prepared sandbox",
                    source: io::Error::from_raw_os_error(e),
                });
            }
        };
        // The start-up report (EOF at execve, or the failed stage) is read once the call is
        // over: a failed step is reported before the tool exits, and not waiting for execve
        // here saves a wake-up per call.
        let report = err_r;

        let l = self.resolved.policy.limits;
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
        let mut init_done = false;
        let mut feed = stdin_feed;
        let mut fed = 0usize;
        if let Some(f) = &feed {
            sys::set_nonblocking(f.as_raw_fd()).map_err(io_err("configure pipes"))?;
        }
        let input = req.stdin.as_deref().unwrap_or_default();
        let mut call = call;
        while !init_done || out.open || errc.open {
            let now = Instant::now();
            if !init_done {
                if term_sent.is_none() && now >= deadline {
                    timed_out = true;
                    term_sent = Some(now);
                    call.signal(libc::SIGTERM);
                }
                if let Some(t) = term_sent
                    && !killed
                    && now >= t + grace
                {
                    killed = true;
                    call.signal(libc::SIGKILL);
                }
            }
            let next = match (init_done, term_sent, killed) {
                (true, _, _) => None,
                (false, None, _) => Some(deadline),
                (false, Some(t), false) => Some(t + grace),
                (false, Some(_), true) => None,
            };
            let timeout_ms = next.map_or(-1, |n| {
                n.saturating_duration_since(now)
                    .as_millis()
                    .min(i32::MAX as u128) as i32
                    + 1
            });
            if feed.is_some() && (fed >= input.len() || init_done) {
                feed = None;
            }
            let cancel_fd = req
                .cancel
                .as_ref()
                .filter(|_| !cancelled && !init_done)
                .map_or(-1, |c| c.fd.as_raw_fd());
            let mut fds = [
                pollin(if out.open { out.fd.as_raw_fd() } else { -1 }),
                pollin(if errc.open { errc.fd.as_raw_fd() } else { -1 }),
                pollin(if init_done {
                    -1
                } else {
                    call.pidfd.as_raw_fd()
                }),
                libc::pollfd {
                    fd: feed.as_ref().map_or(-1, |f| f.as_raw_fd()),
                    events: libc::POLLOUT,
                    revents: 0,
                },
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
                call.done = true;
            }
            if fds[3].revents != 0
                && let Some(f) = &feed
            {
                match sys::send_nosignal(f.as_raw_fd(), &input[fed..]) {
                    Ok(n) => fed += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    // The tool closed its stdin: stop feeding.
                    Err(_) => fed = input.len(),
                }
            }
            if fds[4].revents != 0 {
                cancelled = true;
                if term_sent.is_none() {
                    term_sent = Some(Instant::now());
                    call.signal(libc::SIGTERM);
                }
            }
        }
        // Every writer of the report is gone (the per-call init has exited).
        if let Some(msg) = read_report(&report)? {
            return Err(stage_error(msg, &program));
        }
        // Status (4 bytes) and rusage (3 × u64) from the per-call init; nothing if it was
        // killed.
        let mut st = [0u8; 28];
        let got = sys::read(status_r.as_raw_fd(), &mut st).unwrap_or(0);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&st[i..i + 8]);
            u64::from_ne_bytes(b)
        };
        let (tool_status, rusage) = if got == st.len() {
            (
                Some(i32::from_ne_bytes([st[0], st[1], st[2], st[3]])),
                RusageRecord {
                    user_ms: u64_at(4) / 1000,
                    sys_ms: u64_at(12) / 1000,
                    max_rss_kb: u64_at(20),
                },
            )
        } else {
            (
                None,
                RusageRecord {
                    user_ms: 0,
                    sys_ms: 0,
                    max_rss_kb: 0,
                },
            )
        };
        let (code, signal) = match tool_status {
            Some(s) if libc::WIFEXITED(s) => (Some(libc::WEXITSTATUS(s)), None),
            Some(s) if libc::WIFSIGNALED(s) => (None, Some(libc::WTERMSIG(s))),
            // The per-call init was killed (timeout after the grace period, or cancel).
            _ => (None, Some(libc::SIGKILL)),
        };
        let status = code.unwrap_or_else(|| 128 + signal.unwrap_or(0));
        // Every process of the call is gone (its pid namespace died with its init).
        let post_run = snapshot_before.diff(&crate::postrun::Snapshot::take(&workdir));
        let record = RunRecord {
            argv: req
                .argv
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            cwd: workdir,
            program,
            policy_hash: self.policy_hash.clone(),
            layers: Layers {
                best_effort_degraded: self.cgroup_degraded
                    || self.landlock.status != EnforcementStatus::FullyEnforced,
                landlock: self.landlock.clone(),
                seccomp: self.seccomp.clone(),
                capabilities: CapabilityRecord {
                    effective: 0,
                    permitted: 0,
                    inheritable: 0,
                    bounding: 0,
                    ambient: 0,
                    securebits_locked: true,
                },
                no_new_privs: true,
                namespaces: PREPARED_NAMESPACES.to_vec(),
                mounts: MountRecord {
                    read_only_root: true,
                    writable: self.writable.clone(),
                    protected: self.protected.clone(),
                    placeholders: self
                        .islands
                        .as_ref()
                        .map(|i| i.placeholders.clone())
                        .unwrap_or_default(),
                    private_shm: self.private_shm.clone(),
                },
                cgroup: self.cgroup.clone(),
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
                shm_bytes: if self.private_shm.is_some() {
                    l.shm_bytes
                } else {
                    0
                },
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
                // The aggregate disk watchdog is not wired into prepared runs yet.
                killed_by: crate::spawn::KilledBy::from_flags(timed_out, cancelled),
                disk_limit: None,
            },
            duration_ms: started.elapsed().as_millis() as u64,
            rusage,
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
}

fn pollin(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// One call's per-call init. Dropping it before the init has exited kills the call's whole
/// pid namespace, so no early return leaves a call running.
struct CallGuard {
    pidfd: OwnedFd,
    done: bool,
}

impl CallGuard {
    fn signal(&self, sig: i32) {
        let _ = sys::pidfd_send_signal(&self.pidfd, sig);
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if !self.done {
            self.signal(libc::SIGKILL);
        }
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if !self.reaped {
            // Killing the zygote (pid 1 of the session's pid namespace) kills every process of
            // every call; the kernel reports it dead only once they are all gone.
            let _ = sys::pidfd_send_signal(&self.zygote_pidfd, libc::SIGKILL);
            let _ = sys::wait4(self.zygote_pid);
            self.reaped = true;
        }
        // The session's mount namespace is gone: placeholders can be removed.
        drop(self.islands.take());
        if let Some(dir) = self.cgroup.take() {
            spawn::remove_cgroup(&dir);
        }
    }
}
