//! Prepared sandboxes: what every tool of a session shares is set up once, and only the
//! per-call narrowing stays on the spawn path.
//!
//! [`Prepared::new`] starts a *zygote*: a small single-purpose process cloned (like the
//! one-shot init stage) into new user, pid, mount and IPC namespaces. It writes the id maps,
//! sets up the session's mounts (the one-shot plan, `mounts.rs`: everything read-only and
//! nosuid except the writable trees, a private `/dev/shm` and temporary directory; the
//! protected islands are bound per call, in the per-call init's own copy of this mount
//! namespace, so their placeholders exist only while a call runs), empties the capability bounding
//! set, resets every signal disposition, keeps the Landlock ruleset (built once by the
//! parent) and the compiled seccomp program, and then waits on a `SOCK_SEQPACKET` control
//! link.
//!
//! [`Prepared::run`] sends one request (program, cwd, argv, environment; the tool's stdin,
//! stdout/stderr pipes, error pipe and status pipe as `SCM_RIGHTS`; stdin as in one-shot
//! runs: `/dev/null`, or a socket the runner feeds or relays `stdin_fd` through; with a
//! simulated Landlock ABI, tests only, a ruleset of the call's own). The zygote clones a
//! per-call init into a **new pid namespace nested in the session's** and passes its pidfd
//! back. The per-call init forks the tool, which applies the per-call steps in the documented
//! order (fds, setsid, rlimits, chdir to the request's `cwd`, capability drop with
//! securebits locked, no_new_privs, Landlock `restrict_self` with the prepared ruleset — then,
//! for a cwd other than the workspace, a check that Landlock lets the tool list it —, signals
//! unblocked, seccomp last) and execs. When the tool
//! exits, the per-call init reports its status and rusage and exits, and the kernel kills
//! every other process of that call (setsid'd, double-forked, nohup'd) and nothing of any
//! other call. Timeouts (the policy's, narrowed by the request's `timeout_seconds`),
//! cancellation and the disk watchdog (`limits.disk_bytes` / `disk_inodes`, as in one-shot
//! runs; a disk limit sends SIGKILL at once) signal the per-call init through its pidfd:
//! SIGTERM (forwarded to the call's processes), SIGKILL after the grace period; [`crate::Cancel::kill`] sends SIGKILL at once,
//! and [`crate::Cancel::signal`] one forwarded signal.
//!
//! [`Prepared::new_with_points`] prepares for calls with bead unions: the zygote's root is
//! the new root a one-shot run with unions gets (`unions.rs`), and each call mounts its own
//! overlays there in a mount namespace of its own (`sys::mount_call_unions`), with a Landlock
//! ruleset of its own that also grants them (docs/prepared.md says why and how).
//!
//! The tool's per-call sequence, the monitoring loop and the run record are the one-shot
//! path's (`sys::restrict_and_exec`, `supervise::supervise`, `supervise::run_output`).
//!
//! Dropping the [`Prepared`] (or the runner dying: the control link closes) ends the zygote,
//! and with it every process of every call.
//!
//! The zygote runs in a copy of a possibly multithreaded process: everything between the
//! clone and the tool's execve is raw syscalls on prepared data (see `sys/zygote.rs`).
//!
//! seccomp: the same profile as [`crate::seccomp`], compiled as a binary search over
//! syscall-number ranges (`bpf.rs`), proven equivalent to the reference programs by the test
//! suite for the shipped profiles and checked once per process for any other; if the check
//! ever fails, the reference programs are attached instead.

use crate::bpf;
use crate::cgroup::{MemoryRecord, MemoryScope, RunCgroups};
use crate::error::{SandboxError, io_err};
use crate::landlock::{self, LandlockRecord};
use crate::mounts::{self, MountPlan};
use crate::record::{Layers, LimitsRecord, MountRecord, RunOutput, RusageRecord};
use crate::request::{self, RunRequest, Stream};
use crate::seccomp::SeccompRecord;
use crate::spawn;
use crate::supervise::{self, Capture, DiskWatch, Finished, Watch, read_report, stage_error};
use crate::sys::{self, ZygotePlan};
use ollie_policy::{Policy, ResolveContext, ResolvedPolicy};
use serde::Serialize;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

/// Namespaces of a prepared call, as recorded: the session's (set up once, inherited; IPC only
/// where IPC namespaces may be created, see [`crate::ipc_namespaces`]), the call's own pid
/// namespace, and, for a call with protected islands, its own copy of the session's mount
/// namespace that holds them.
pub fn prepared_namespaces() -> Vec<&'static str> {
    call_namespaces(false, false)
}

/// A call's namespaces (`islands`: a mount namespace of its own; `net`: the session's own
/// network namespace, under `network.mode = "proxy"`).
fn call_namespaces(islands: bool, net: bool) -> Vec<&'static str> {
    let mut v = vec![
        "user (session, inherited)",
        "pid (session, inherited)",
        if islands {
            "mount (per call: the session's, with the call's protected paths)"
        } else {
            "mount (session, inherited)"
        },
    ];
    if sys::ipc_namespaces() {
        v.push("ipc (session, inherited)");
    }
    if net {
        v.push("net (session, inherited)");
    }
    v.push("pid (per call)");
    v
}

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
    /// The session-wide pids cgroup (required as root).
    pub cgroup: Option<PathBuf>,
    /// The session-wide memory cgroup (`limits.memory_bytes` for the zygote and all calls
    /// together), or why there is none (`oom_kills`: so far, the whole session).
    pub memory: MemoryRecord,
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
    /// The session's mounts, as recorded for every call.
    mounts: MountRecord,
    /// The union points the session's new root holds (none: the host's root).
    points: Vec<PathBuf>,
    /// Protected islands and placeholders, kept for the session (dropped after the zygote).
    islands: Option<crate::placeholder::Protected>,
    /// The session's pids and memory cgroups (removed after the zygote is gone).
    cgroups: Option<RunCgroups>,
    cgroup_degraded: bool,
    policy_hash: String,
    seccomp_layout: &'static str,
    /// The session's proxy listener (`network.mode = "proxy"`) until its owner takes it.
    proxy_listener: Mutex<Option<std::net::TcpListener>>,
    reaped: bool,
}

impl Prepared {
    /// Sets up the session's sandbox for `policy` in the workspace `workdir` (absolute) with
    /// the user's `home`: resolves the policy, builds the Landlock ruleset and the seccomp
    /// program, and starts the zygote (namespaces, id maps, mounts; a pids cgroup as root).
    /// Fails closed like [`crate::run`], naming the layer. An unsandboxed policy (an approved
    /// `unsandboxed` grant, [`Policy::unsandboxed`]) is refused: it is for the one run the
    /// approval covers, through [`crate::run`], never a session.
    pub fn new(policy: &Policy, workdir: &Path, home: &Path) -> Result<Prepared, SandboxError> {
        Prepared::new_hiding(policy, workdir, home, &[])
    }

    /// [`Prepared::new`], also hiding `hidden` from every call (the runner's own state and
    /// configuration directories; see [`crate::MountRecord::hidden`]).
    pub fn new_hiding(
        policy: &Policy,
        workdir: &Path,
        home: &Path,
        hidden: &[PathBuf],
    ) -> Result<Prepared, SandboxError> {
        Prepared::new_with_points(policy, workdir, home, hidden, &[])
    }

    /// [`Prepared::new_hiding`] for calls with union mounts ([`RunRequest::unions`]) at
    /// exactly `points` (each `/NAME`, not an entry of the host's `/`): the session's root is
    /// a new one that holds them (as a one-shot run with unions has), and each call mounts
    /// its own overlays there, in a mount namespace of its own, with a Landlock ruleset of its
    /// own that grants them. Its calls must give a union for every point and no other.
    pub fn new_with_points(
        policy: &Policy,
        workdir: &Path,
        home: &Path,
        hidden: &[PathBuf],
        points: &[PathBuf],
    ) -> Result<Prepared, SandboxError> {
        crate::unions::check_points(points)?;
        if policy.unsandboxed() {
            return Err(SandboxError::InvalidRequest {
                reason: "an unsandboxed policy is for the one approved run (ollie_sandbox::run), never a prepared session".into(),
            });
        }
        let workdir = request::canonical_workdir(workdir)?;
        let resolved = policy
            .resolve(&ResolveContext {
                workdir: workdir.clone(),
                home: home.to_path_buf(),
                extra_secrets: request::secret_forms(hidden),
            })
            .map_err(|source| SandboxError::Policy { source })?;
        let ruleset = landlock::build(&resolved, None)?;
        // The session's cgroups first: without a memory cgroup every call's filter also
        // denies `memfd_create`.
        let cgroups = spawn::make_cgroups(&resolved.policy.limits);
        let (programs, seccomp, seccomp_layout) = bpf::programs(
            &resolved.network,
            &spawn::tool_deny(&resolved.policy.syscalls.deny, &cgroups),
            bpf::Unproven::Check,
        )?;
        let MountPlan {
            steps,
            record: mounts,
            islands,
        } = MountPlan::new(
            &resolved,
            mounts::writable_trees(&resolved),
            ruleset.record.abi,
            mounts::Unions::PerCall(points),
            ruleset.root_access,
            hidden,
            true,
            &mut crate::treescan::TreeScan::default(),
        )?;
        let l = resolved.policy.limits;
        let devnull = request::open_devnull()?;
        let (err_r, err_w) = sys::pipe().map_err(io_err("create pipes"))?;
        let (control, control_child) =
            sys::seqpacket_pair().map_err(io_err("create the control link"))?;
        let (uid, _) = sys::ids();
        let mut base = spawn::child_plan(
            ruleset.fd.as_ref().map(AsRawFd::as_raw_fd),
            steps,
            request::rlimits(&l),
            programs,
        )?;
        base.err_w = err_w.as_raw_fd();
        base.proxy_port = crate::proxy::listen_port(&resolved.network);
        let proxied = base.proxy_port != 0;
        let plan = ZygotePlan {
            base,
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
            mounts,
            points: points.to_vec(),
            islands: Some(islands),
            cgroups: None,
            cgroup_degraded: false,
            seccomp_layout,
            proxy_listener: Mutex::new(None),
            reaped: false,
        };
        // The session's pids and memory cgroups, before the zygote does anything: all calls
        // together stay within `limits.processes` and `limits.memory_bytes`. RLIMIT_NPROC
        // does not bind uid 0: as root without a pids cgroup nothing runs.
        prepared.cgroup_degraded = spawn::place_in_cgroup(
            uid,
            zygote_pid,
            cgroups,
            prepared.resolved.policy.best_effort,
            &mut prepared.cgroups,
        )?;
        {
            let control = prepared.lock();
            sys::send_byte(&control).map_err(io_err("start the sandbox"))?;
            // A proxied session's listener, handed over before the zygote is ready.
            if proxied {
                let l = crate::supervise::take_proxy_listener(
                    &control,
                    &err_r,
                    Path::new(""),
                    Path::new(""),
                )?;
                *prepared
                    .proxy_listener
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(l);
            }
        }
        if let Some(msg) = read_report(&err_r)? {
            return Err(stage_error(msg, Path::new(""), Path::new("")));
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

    /// The listener of the session's proxy under `network.mode = "proxy"`: the zygote's
    /// network namespace (every call's) holds nothing else, and the tools reach it at
    /// `127.0.0.1:3128`. Available from [`Prepared::new`] on, once (`None` afterwards, and
    /// for other modes); connections wait in its backlog until the owner accepts them.
    /// Dropping it leaves the calls' connects refused.
    pub fn take_proxy_listener(&self) -> Option<std::net::TcpListener> {
        self.proxy_listener
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
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
        let unions = !self.points.is_empty();
        let mut set_up_once = vec![
            if sys::ipc_namespaces() {
                "user, pid, mount and ipc namespaces"
            } else {
                "user, pid and mount namespaces (ipc namespaces are not permitted here)"
            },
            "id maps",
            "mounts (read-only root, writable trees, private /dev/shm and temporary directory, hidden paths)",
            "landlock ruleset (built once; restrict_self per call)",
            "seccomp program (compiled and checked once; attached per call)",
            "pids cgroup (session-wide; required as root)",
            "memory cgroup (session-wide, where one can be made)",
            "oom_score_adj",
        ];
        if unions {
            set_up_once.insert(2, "a new root holding the union points");
        }
        if crate::proxy::own_namespace(&self.resolved.network) {
            set_up_once.insert(
                1,
                "network namespace of the session's own (loopback and the proxy's listener only)",
            );
        }
        let mut per_call = vec![
            "mount namespace of its own with the protected paths (when the policy has any)",
            "pid namespace",
        ];
        if unions {
            per_call.push(
                "union overlays at the points, and a landlock ruleset of its own that grants them",
            );
        }
        per_call.extend([
            "fd layout",
            "setsid",
            "rlimits",
            "chdir",
            "capability drop (all sets, securebits locked)",
            "no_new_privs",
            "landlock restrict_self",
            "cwd listable under landlock (cwd other than the workspace)",
            "signal dispositions",
            "seccomp",
            "execve",
        ]);
        SessionRecord {
            workdir: self.workdir.clone(),
            policy_hash: self.policy_hash.clone(),
            set_up_once,
            per_call,
            cgroup: self.pids_cgroup(),
            memory: self.memory_record(self.oom_kills()),
            seccomp_layout: self.seccomp_layout,
        }
    }

    /// The session's pids cgroup.
    fn pids_cgroup(&self) -> Option<PathBuf> {
        self.cgroups
            .as_ref()
            .and_then(RunCgroups::pids)
            .map(Path::to_path_buf)
    }

    /// OOM kills in the session's memory cgroup so far.
    fn oom_kills(&self) -> u64 {
        self.cgroups.as_ref().map_or(0, RunCgroups::oom_kills)
    }

    /// The session's memory record, with `oom_kills`.
    fn memory_record(&self, oom_kills: u64) -> MemoryRecord {
        match &self.cgroups {
            Some(c) => c.memory_record(MemoryScope::Session, oom_kills),
            None => MemoryRecord::none(MemoryScope::Session, "no memory cgroup was made"),
        }
    }

    /// Whether the zygote is still running. It ends only when it is killed: by dropping the
    /// [`Prepared`], or by the session's memory cgroup's OOM killer (the per-call inits
    /// share its memory, so the kernel may pick them). A caller that keeps sandboxes per
    /// session prepares a new one when this is false.
    pub fn is_alive(&self) -> bool {
        !self.wait_gone(std::time::Duration::ZERO)
    }

    /// Waits up to `timeout` for the zygote to die (its pidfd becomes readable); whether it
    /// is gone.
    pub fn wait_gone(&self, timeout: std::time::Duration) -> bool {
        let mut fds = [libc::pollfd {
            fd: self.zygote_pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        matches!(sys::poll(&mut fds, ms), Ok(n) if n > 0)
    }

    /// The request's workdir, canonical; it and the request's home must be the prepared ones.
    fn call_workdir(&self, req: &RunRequest) -> Result<PathBuf, SandboxError> {
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
        Ok(workdir)
    }

    /// Sends one call (its header, the inline payload, the descriptors) to the zygote and
    /// takes its reply: the per-call init, or why it could not be made.
    fn send_call(
        &self,
        hdr: &[u8],
        inline: &[u8],
        fds: &[RawFd],
    ) -> Result<CallGuard, SandboxError> {
        let (n, pidfd, reply) = {
            let control = self.lock();
            sys::send_with_fds(&control, &[hdr, inline], fds).map_err(gone)?;
            let mut reply = [0u8; 4];
            let (n, pidfd) = sys::recv_with_fd(&control, &mut reply).map_err(gone)?;
            (n, pidfd, reply)
        };
        CallGuard::from_reply(n, pidfd, reply)
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
        check_call(req, &self.points)?;
        // From here on the call is started: signals sent to its handle are queued for it.
        let cancel = request::watch_cancel(req)?;
        let workdir = self.call_workdir(req)?;
        // A simulated lower Landlock ABI (tests only): the call gets a ruleset of its own,
        // built by the one-shot path's code (fails closed below the policy's floor unless
        // `best_effort`, and then records the degradation). It lacks the session's
        // `/dev/shm` rule (added inside the session's mount namespace), so it is stricter
        // there than a one-shot run at that ABI.
        //
        // A call with unions always gets a ruleset of its own: its rules name the call's own
        // overlays. The per-call init adds what the session's mounts added to the session's
        // (the new root's rule, the private tmpfs mounts'), so it grants exactly what the
        // session's does, plus the unions.
        let own_ruleset = match request::simulated_abi(req.fault) {
            Some(abi) => Some(landlock::build(&self.resolved, Some(abi))?),
            None if !req.unions.is_empty() => Some(landlock::build(&self.resolved, None)?),
            None => None,
        };
        // (Always a ruleset: a prepared session is never unsandboxed.)
        let own_fd = own_ruleset
            .as_ref()
            .and_then(|r| r.fd.as_ref())
            .map(AsRawFd::as_raw_fd);
        if !req.unions.is_empty() && own_fd.is_none() {
            return Err(SandboxError::InvalidRequest {
                reason:
                    "union mounts in a prepared sandbox need Landlock (a ruleset of the call's own)"
                        .into(),
            });
        }
        // The rights beneath each union point, as a one-shot run grants them.
        let union_access = own_ruleset
            .as_ref()
            .map_or(0, |r| landlock::writable_rights(r.record.abi));
        let fault = request::child_fault(req.fault) as u32;
        let cwd = request::tool_cwd(&workdir, req.cwd.as_deref())?;
        let l = request::effective_limits(&self.resolved.policy.limits, req)?;
        let (env, program) = request::tool_command(
            &self.resolved,
            req,
            &workdir,
            &cwd,
            self.mounts.private_tmp.as_deref(),
        )?;

        // The post-run diff's baseline (before anything of this call exists).
        let snapshot_before = crate::postrun::Snapshot::take(&workdir);
        // The call's protected islands, as the workspace is now: placeholders for missing
        // ones exist from here until the call is over (bound read-only in the call's own
        // mount namespace), and are gone before the post-run snapshot.
        // The call's unions, checked as a one-shot run checks them.
        let unions = if req.unions.is_empty() {
            Vec::new()
        } else {
            crate::unions::validate(
                &req.unions,
                &crate::unions::resolved_secrets(&self.resolved.ctx),
                &self.mounts.writable,
            )?
        };
        let mut watched = self.mounts.writable.clone();
        watched.extend(unions.iter().map(|u| u.upper.clone()));
        // Every `.git` in the writable trees (protected below) and what else host-side
        // programs trip on.
        let mut trees_before = crate::treescan::scan(&watched);
        let islands =
            mounts::Islands::plan(&self.resolved, &self.mounts.writable, &mut trees_before)?;
        let mut entries = islands.call_entries(&self.mounts.writable)?;
        let nislands = entries.len();
        entries.extend(crate::unions::call_entries(&unions, &self.mounts.hidden)?);
        let payload = call_payload(&program, &cwd, &req.argv, &env, &entries)?;
        // The disk watchdog's baseline, taken before the call's tool can write anything; it
        // watches the writable trees' filesystems and the unions' upper layers'.
        let disk = DiskWatch::start(&watched, &l, Instant::now())?;
        // OOM kills in the session's memory cgroup during this call are this call's (or a
        // concurrent call's: the cgroup is shared).
        let oom_before = self.oom_kills();
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
            own_ruleset: u32::from(own_fd.is_some()),
            check_cwd: u32::from(cwd != workdir),
            islands: nislands as u32,
            unions: (entries.len() - nislands) as u32,
            union_access_lo: union_access as u32,
            union_access_hi: (union_access >> 32) as u32,
        };
        let hdr_bytes = hdr.to_bytes();

        let (stdin_child, stdin_feed) = request::tool_stdin(req, || {
            self.devnull.try_clone().map_err(io_err("open /dev/null"))
        })?;
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
        if let Some(fd) = own_fd {
            fds.push(fd);
        }
        let inline: &[u8] = if memfd.is_some() { &[] } else { &payload };
        let mut call = self.send_call(&hdr_bytes, inline, &fds)?;
        // The call's own ruleset (if any) stays open until here: the per-call init holds
        // its copy now.
        let landlock_record = match own_ruleset {
            Some(r) => r.record,
            None => self.landlock.clone(),
        };
        drop((stdin_child, out_w, errout_w, err_w, status_w, memfd));
        // The start-up report (EOF at execve, or the failed stage) is read once the call is
        // over: a failed step is reported before the tool exits, and not waiting for execve
        // here saves a wake-up per call.
        let report = err_r;

        let mut out = Capture::new(Stream::Stdout, out_r, l.output_bytes)?;
        let mut errc = Capture::new(Stream::Stderr, errout_r, l.output_bytes)?;
        let stopped = supervise::supervise(
            Watch {
                pidfd: call.pidfd.as_raw_fd(),
                signal: &|sig| call.signal(sig),
                req,
                limits: &l,
                started,
                disk,
                feed: stdin_feed,
                cancel,
            },
            &mut out,
            &mut errc,
            sink,
        )?;
        call.done = true;
        let oom_kills = self.oom_kills().saturating_sub(oom_before);
        // Every writer of the report is gone (the per-call init has exited).
        if let Some(msg) = read_report(&report)? {
            return Err(stage_error(msg, &program, &cwd));
        }
        let (tool_status, rusage) = read_call_status(&status_r);
        // Every process of the call is gone (its pid namespace died with its init), and its
        // mount namespace with them: its placeholders can go (unless another call holds them).
        let mut mount_record = self.mounts.clone();
        mount_record.protected = islands.protected.clone();
        mount_record.placeholders = islands.protect.placeholders.clone();
        mount_record.unions = unions;
        drop(islands);
        let mut post_run = snapshot_before.diff(&crate::postrun::Snapshot::take(&workdir));
        post_run.add(crate::postrun::setid_flags(&watched, &workdir));
        post_run.add(trees_before.diff(&crate::treescan::scan(&watched), &workdir));
        let shm_bytes = self.mounts.private_shm.as_ref().map_or(0, |_| {
            l.shm_bytes.min(self.resolved.policy.limits.memory_bytes)
        });
        Ok(supervise::run_output(
            req,
            &env,
            started,
            Finished {
                cwd,
                program,
                policy_hash: self.policy_hash.clone(),
                layers: Layers::enforced(
                    landlock_record,
                    self.seccomp.clone(),
                    call_namespaces(
                        !mount_record.protected.is_empty() || !mount_record.unions.is_empty(),
                        crate::proxy::own_namespace(&self.resolved.network),
                    ),
                    crate::record::NetworkRecord::of(&self.resolved.network, true),
                    mount_record,
                    self.pids_cgroup(),
                    self.cgroup_degraded,
                    self.memory_record(oom_kills),
                ),
                limits: LimitsRecord::new(&l, shm_bytes),
                stopped,
                // The per-call init was killed (timeout after the grace period, or cancel).
                exit: supervise::exit_of(tool_status, None),
                rusage,
                post_run,
            },
            out,
            errc,
        ))
    }
}

/// Refuses what only one-shot runs support (`exec_fd`, `pass_fds`), unions at other points
/// than the session's `points` (exactly one per point, or none in a session without points),
/// and an empty command.
fn check_call(req: &RunRequest, points: &[PathBuf]) -> Result<(), SandboxError> {
    if req.argv.is_empty() {
        return Err(SandboxError::InvalidRequest {
            reason: "no command given".into(),
        });
    }
    let mut given: Vec<&Path> = req.unions.iter().map(|u| u.point.as_path()).collect();
    given.sort();
    let mut want: Vec<&Path> = points.iter().map(PathBuf::as_path).collect();
    want.sort();
    if given != want {
        let list = |v: &[&Path]| {
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        return Err(SandboxError::InvalidRequest {
            reason: format!(
                "this sandbox was prepared for unions at {}; the call gives {}",
                list(&want),
                list(&given)
            ),
        });
    }
    if !req.unions.is_empty() && request::simulated_abi(req.fault).is_some() {
        return Err(SandboxError::InvalidRequest {
            reason: "a simulated Landlock ABI is not supported with unions in a prepared sandbox"
                .into(),
        });
    }
    if req.exec_fd.is_some() || !req.pass_fds.is_empty() {
        return Err(SandboxError::InvalidRequest {
            reason: "exec_fd and pass_fds are supported by one-shot runs only".into(),
        });
    }
    if req.proxy.is_some() {
        return Err(SandboxError::InvalidRequest {
            reason: "a prepared sandbox has one proxy listener per session (Prepared::take_proxy_listener); RunRequest::proxy is for one-shot runs".into(),
        });
    }
    Ok(())
}

/// The request payload of a call: exe, cwd, argv…, env…, each NUL-terminated; refused when
/// a string holds a NUL byte or the whole exceeds what the zygote reads.
fn call_payload(
    program: &Path,
    cwd: &Path,
    argv: &[std::ffi::OsString],
    env: &request::ToolEnv,
    islands: &[Vec<u8>],
) -> Result<Vec<u8>, SandboxError> {
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
    push(cwd.as_os_str().as_bytes(), "cwd")?;
    for a in argv {
        push(a.as_bytes(), "argument")?;
    }
    for (k, v) in env {
        let mut b = k.as_bytes().to_vec();
        b.push(b'=');
        b.extend_from_slice(v);
        push(&b, "environment value")?;
    }
    for i in islands {
        push(i, "protected path")?;
    }
    let strings = 2 + argv.len() + env.len() + islands.len();
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
    Ok(payload)
}

/// The tool's wait status (4 bytes) and rusage (3 × u64) as the per-call init reported them
/// on `status_r`; no status and zero usage if it was killed first.
fn read_call_status(status_r: &OwnedFd) -> (Option<i32>, RusageRecord) {
    let mut st = [0u8; 28];
    let got = sys::read(status_r.as_raw_fd(), &mut st).unwrap_or(0);
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&st[i..i + 8]);
        u64::from_ne_bytes(b)
    };
    if got == st.len() {
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
    }
}

/// The zygote could not be reached over the control link.
fn gone(source: io::Error) -> SandboxError {
    SandboxError::Io {
        op: "reach the prepared sandbox",
        source,
    }
}

/// One call's per-call init. Dropping it before the init has exited kills the call's whole
/// pid namespace, so no early return leaves a call running.
struct CallGuard {
    pidfd: OwnedFd,
    done: bool,
}

impl CallGuard {
    /// The zygote's reply to a call (`n` bytes of `reply`: 0, or the errno of the failed
    /// clone) and the per-call init's pidfd.
    fn from_reply(
        n: usize,
        pidfd: Option<OwnedFd>,
        reply: [u8; 4],
    ) -> Result<CallGuard, SandboxError> {
        if n != 4 {
            return Err(gone(io::Error::from_raw_os_error(libc::EPIPE)));
        }
        match (i32::from_ne_bytes(reply), pidfd) {
            (0, Some(fd)) => Ok(CallGuard {
                pidfd: fd,
                done: false,
            }),
            (0, None) => Err(gone(io::Error::from_raw_os_error(libc::EPROTO))),
            (e, _) => Err(SandboxError::ChildSetup {
                stage: "per-call pid namespace of the prepared sandbox",
                source: io::Error::from_raw_os_error(e),
            }),
        }
    }

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
        drop(self.cgroups.take());
    }
}
