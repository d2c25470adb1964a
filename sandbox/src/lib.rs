//! The ollie tool sandbox: run one command under a validated policy, fail-closed.
//!
//! What [`run`] guarantees, in the order the child applies it (STYLE.md):
//! 1. An init stage is cloned into new user, pid, mount and IPC namespaces (pid 1 of its own
//!    pid namespace: when it exits or is killed, the kernel kills every process the tool
//!    started, including setsid'd, double-forked and nohup'd ones). Before it does anything it
//!    is placed in a fresh pids cgroup (`pids.max` = `limits.processes`; required as root,
//!    where RLIMIT_NPROC does not bind) and a fresh memory cgroup (`limits.memory_bytes`, swap
//!    included: also shared memory held by file descriptors, which RLIMIT_AS does not count),
//!    children of the runner's own cgroup (v1 or v2). An unprivileged runner gets them only
//!    where its cgroup is delegated to it; without a memory cgroup the run still runs and
//!    [`Layers::memory`] says only RLIMIT_AS bounds it, and why ([`probe`] tells up front).
//!    An OOM kill at the limit is recorded as `killed_by = "memory_limit"`.
//! 2. Mounts: everything read-only and nosuid except the policy's writable trees, with
//!    protected islands (e.g. `.git`) read-only again — a missing one through a
//!    placeholder at its first missing component, and every directory between a writable root
//!    and an island pinned (cannot be renamed away). This closes Landlock's metadata gap
//!    (chmod/chown/xattr/utime outside writable trees fail with EROFS). Write rules inside
//!    an island are attached after it (the innermost rule wins). Secret locations, the
//!    caller's [`RunRequest::hidden`] paths and homes holding no grant are hidden (an empty
//!    mode-0 tmpfs, `/dev/null` over a file: [`MountRecord::hidden`]), since Landlock does
//!    not mediate `stat` or inotify. `/dev/shm` is a private, size-limited tmpfs per run.
//! 3. The tool is forked from init: fds ≥ 3 closed (stdin `/dev/null` or a socket the runner
//!    feeds with [`RunRequest::stdin`] or relays from [`RunRequest::stdin_fd`], stdout/stderr
//!    pipes; only a one-shot run's [`RunRequest::pass_fds`] stay, at 7, 8, …),
//!    `setsid`, rlimits, every capability set emptied (bounding and ambient included,
//!    securebits locked), `no_new_privs`, Landlock (every ABI-7 filesystem right handled in one
//!    ruleset, TCP bind/connect unless the network is `all`, both scopes; a working directory
//!    other than the workdir,
//!    [`RunRequest::cwd`], must then be listable, or the run fails with
//!    [`SandboxError::Cwd`]), seccomp last (allowlist; no set-id modes, datagram
//!    socketpairs, destination addresses or TCP fast open, no bind without a bind grant, no
//!    allocating `fallocate`; minus the policy's `syscalls.deny`), `execve` — or, with
//!    [`RunRequest::exec_fd`], `execveat` of the caller's descriptor, so what runs is the file
//!    it opened (sealed copies for that: [`sealed_copy`]).
//! 4. The environment is cleared and rebuilt from the policy's allowlist.
//! 5. Output is captured up to a cap per stream (the rest counted, dropped, flagged);
//!    [`run_streaming`] also hands every chunk to a callback as it arrives.
//! 6. On timeout (`limits.timeout_seconds`, narrowed per run by
//!    [`RunRequest::timeout_seconds`]), [`Cancel::cancel`], or when the free space / free
//!    inodes of a writable tree's filesystem shrink past `limits.disk_bytes` /
//!    `limits.disk_inodes` or below a reserve (sampled every 10 ms, down to every 1 ms as the
//!    budget runs out; each file is bounded by RLIMIT_FSIZE ≤ `disk_bytes` and `fallocate`
//!    cannot allocate; a disk limit kills the whole namespace at once): SIGTERM to every
//!    process (forwarded by init), SIGKILL to the whole namespace after the grace period
//!    ([`ExitRecord::killed_by`]). [`Cancel::kill`] sends that SIGKILL at once;
//!    [`Cancel::signal`] forwards one signal of a fixed set ([`Cancel::SIGNALS`]) to every
//!    process of the run and nothing else; [`Cancel::freeze`] stops every process of the run
//!    (confirmed by [`Cancel::wait_frozen`]; tools cannot send SIGCONT) until
//!    [`Cancel::thaw`], the timeout paused meanwhile.
//! 7. After the run, [`postrun`] compares the workspace with a snapshot taken before it and
//!    flags new or changed git hooks, risky git config, new repositories and host-executed
//!    settings files in [`RunRecord::post_run`]; [`workspace::Workspace`] refuses host-side
//!    git until a human acknowledges them.
//!
//! With [`RunRequest::unions`] (bead namespaces; one-shot runs only), step 2 starts by
//! `pivot_root`ing into a new read-only root that holds the host's top-level entries (bound
//! from the host with their submounts) and one directory per union point, and each union is an
//! overlay of read-only members over a writable shadow layer, attached at its point after
//! everything else went read-only, with Landlock's read-write rights (no execute) beneath it
//! (see [`UnionMount`] and SECURITY.md, "Union mounts").
//!
//! [`Prepared`] sets up what every tool of a session shares once (namespaces, mounts, the
//! Landlock ruleset, the seccomp program, the pids and memory cgroups) in a zygote, and runs each call in a pid namespace
//! of its own, with the same per-call steps, record, and controls (cwd, timeout, [`Cancel`]).
//!
//! [`harden::harden_server`] is for the long-lived server that creates those sandboxes (the
//! per-session tool server): called once on itself, single-threaded, it closes stray fds,
//! turns off dumping, sets `no_new_privs`, joins a Landlock domain that handles no
//! filesystem right (so sandboxes can still mount; it scopes signals and abstract sockets and,
//! unless allowed, TCP) and a deny-list seccomp filter, all of which every tool inherits on
//! top of its own layers. Parts the kernel's Landlock ABI cannot enforce are recorded, not
//! fatal ([`HardeningRecord`]).
//!
//! If any required layer cannot be applied, the command does not run and the error names the
//! layer. The only degradation is a Landlock ABI below the floor with `best_effort = true`,
//! which is recorded in the [`RunRecord`].
//!
//! Network modes (`ollie_policy::Network`): `off` (no inet socket at all), `tcp` (TCP only,
//! Landlock filters the connect and bind ports), `all` (TCP and UDP, any port; what an
//! approved `net` grant gives), `proxy` (a network namespace of the run's own, or of the
//! prepared session's, holding only the runner's proxy listener at `127.0.0.1:3128`; TCP
//! connect to that port only: see [`ProxyHandoff`] and [`Prepared::take_proxy_listener`]).
//! No mode allows raw, packet, netlink or AF_UNIX sockets (`socketpair(AF_UNIX)` excepted).
//! Except under `proxy` there is no network namespace: inet sockets reach the host's network,
//! loopback included.
//!
//! An approved `unsandboxed` grant (`ollie_policy::Policy::with_grants`, the only way to one)
//! makes [`run`] skip the filesystem and network confinement: no Landlock ruleset (so no
//! secret-location carve-outs), no read-only mounts, protected islands or private `/dev/shm`
//! (the mount namespace only has its propagation made private), and the `all` network. It
//! keeps steps 1 (namespaces, cgroup) and 3–6 otherwise: fds, setsid, rlimits, every
//! capability dropped, `no_new_privs`, the seccomp profile, the environment allowlist, output
//! caps, timeout, cancel and the disk watchdog on the policy's writable trees. The record says
//! so ([`Layers::unsandboxed`], `landlock.status = "not_applied"` with the reason).
//! [`Prepared`] refuses an unsandboxed policy.
//!
//! What it does not guarantee: protection against kernel bugs; confidentiality of files the
//! policy grants; UDP/DNS unless the network is `all`; anything about the filesystem for an
//! unsandboxed run; a memory bound beyond RLIMIT_AS where no memory cgroup can be made, or
//! per call within a prepared session. See SECURITY.md ("Memory").
//!
//! Tested by unit tests here, the integration tests in `tests/` (`harden.rs` and
//! `service_filter.rs` — the sandbox under a systemd unit's seccomp filter — have their own
//! harness and re-execute themselves as a single-threaded probe, since a filter is
//! irreversible), and the escape suite in the workspace's `tests/` crate; the benchmark is
//! `benches/spawn.rs`.
//!
//! All `unsafe` is in the private `sys` module.
#![deny(unsafe_code)]

mod bpf;
mod cgroup;
mod error;
mod freeze;
pub mod harden;
pub mod landlock;
mod mounts;
mod placeholder;
pub mod postrun;
mod prepared;
mod proxy;
mod record;
mod request;
mod sealed;
pub mod seccomp;
mod spawn;
mod supervise;
mod sys;
mod treescan;
mod unions;
pub mod workspace;

pub use cgroup::{
    CgroupProbe, CgroupVersion, ControllerProbe, MemfdAccess, MemoryBound, MemoryRecord,
    MemoryScope,
};
pub use error::SandboxError;
pub use harden::{HardeningRecord, ServerHardening, harden_server};
pub use placeholder::{ProtectError, close_at_exit, close_in_a_child};
pub use postrun::{FlagKind, PostRunFlag, PostRunRecord};
// The bounds of the search for `.git` in writable trees.
pub use prepared::{Prepared, SessionRecord, prepared_namespaces};
pub use proxy::{NO_PROXY, PROXY_URL, ProxyHandoff, RESOLV_CONF, proxy_env};
pub use record::{
    CapabilityRecord, DiskLimit, DiskLimitRecord, ExecFrom, ExitRecord, KilledBy, Layers,
    LimitsRecord, MountRecord, NetNamespace, NetworkRecord, OutputRecord, RunOutput, RunRecord,
    RusageRecord,
};
pub use request::{
    Cancel, ExecFd, Fault, MAX_PASS_FDS, RunRequest, Stream, forwardable_stdin, pass_fd_path,
    secret_forms, tool_environment,
};
pub use sealed::{SealError, SealedCopy, sealed_copy};
pub use spawn::{Probe, probe, run, run_streaming};
pub use sys::{ipc_namespaces, seccomp_available, user_namespaces};
pub use treescan::{MAX_PROTECTED_REPOS, MAX_TREE_ENTRIES};
pub use unions::{MAX_UNION_LOWERS, UnionMount, check_points as check_union_points};
pub use workspace::{GitDecision, GitRefused};

/// Receives one message into `buf` on a unix socket, with at most one descriptor passed along
/// (SCM_RIGHTS; any more are closed), made close-on-exec and owned by the caller. 0 bytes
/// means the end of the stream. `o mount` takes its `/dev/fuse` from fusermount3 this way.
pub fn recv_fd(
    sock: &std::os::fd::OwnedFd,
    buf: &mut [u8],
) -> std::io::Result<(usize, Option<std::os::fd::OwnedFd>)> {
    sys::recv_with_fd(sock, buf)
}

/// Close-on-exec duplicates of descriptors this process inherited by number (a server's
/// link and boot fd), owned by the caller, in the order given; the originals are left alone
/// (close them, or let [`harden::harden_server`] close them). Every descriptor is checked to
/// be open before any is duplicated; the error names the first that is not.
pub fn dup_inherited_fds(fds: &[std::os::fd::RawFd]) -> std::io::Result<Vec<std::os::fd::OwnedFd>> {
    sys::dup_all_cloexec(fds)
}
