//! The cgroups of a run (or of a prepared session): a fresh pids cgroup (`pids.max` =
//! `limits.processes`) and a fresh memory cgroup (`limits.memory_bytes`, swap included) next to
//! nothing else, placed before the sandbox's pid 1 does anything, removed after it is gone.
//!
//! Where they go: a child of the runner's own cgroup in each hierarchy, found from
//! `/proc/self/cgroup` and `/proc/self/mountinfo`, on cgroup v1 (one directory per hierarchy:
//! `memory`, `pids`) or v2 (one directory holding both). Making one is the test: as root it
//! works wherever the hierarchy is writable; an unprivileged runner needs its cgroup delegated
//! to it (systemd `Delegate=yes`, or an administrator's `chown` of the directory and its
//! `cgroup.procs`). cgroup v2's no-internal-processes rule means a cgroup that holds processes
//! (the runner's own) cannot enable controllers for its children unless it is the root: there
//! the runs go next to the runner instead, in the parent, when that parent is delegated to the
//! runner's (unprivileged) user and enables the controller.
//!
//! Everything that fails is kept as a one-line reason for the run record and `o doctor`.

use serde::Serialize;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A cgroup hierarchy's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    /// cgroup v1: one hierarchy per controller (or group of controllers).
    V1,
    /// cgroup v2: the unified hierarchy.
    V2,
}

/// What bounds a run's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryBound {
    /// The run's memory cgroup: everything its processes charge, shared memory held by file
    /// descriptors (memfd, tmpfs, `/dev/shm`) and swap included.
    Cgroup,
    /// No memory cgroup could be made ([`MemoryRecord::reason`]): only `RLIMIT_AS`
    /// (`limits.address_space_bytes`, per process) applies, which does not count shared memory
    /// held by a file descriptor.
    RlimitAsOnly,
}

/// Whether the memory cgroup is the run's own or a prepared session's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryScope {
    /// A fresh cgroup for this run.
    Run,
    /// The prepared session's cgroup, shared by all its calls (and its zygote).
    Session,
}

/// The memory bound of a run, as enforced.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct MemoryRecord {
    /// What bounds the run's memory.
    pub bound: MemoryBound,
    /// The memory cgroup, if one was made.
    pub cgroup: Option<PathBuf>,
    /// Its hierarchy's version.
    pub version: Option<CgroupVersion>,
    /// Its limit (`memory.max` / `memory.limit_in_bytes`): `limits.memory_bytes`.
    pub max_bytes: Option<u64>,
    /// Swap cannot extend the bound (`memory.swap.max = 0`, or v1 `memory.memsw.limit_in_bytes`
    /// = the limit). False without a cgroup, or when the kernel does not account swap
    /// (`swapaccount=0`), which matters only on hosts with swap.
    pub swap_bounded: bool,
    /// The run's own cgroup, or the prepared session's.
    pub scope: MemoryScope,
    /// Processes the cgroup's OOM killer killed while the run (or call) ran.
    pub oom_kills: u64,
    /// Why there is no memory cgroup.
    pub reason: Option<String>,
    /// Whether the tool may create memfds: `denied` without a memory cgroup (RLIMIT_AS does
    /// not count a memfd's pages, so `memfd_create` fails with EPERM; inherited memfds stay
    /// usable), `allowed` where the cgroup counts them.
    pub memfd: MemfdAccess,
}

/// Whether `memfd_create` is open to the tool ([`MemoryRecord::memfd`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemfdAccess {
    /// The memory cgroup counts memfd pages.
    Allowed,
    /// No memory cgroup: `memfd_create` fails with EPERM.
    Denied,
}

impl MemoryRecord {
    /// No memory cgroup, for `reason`.
    pub(crate) fn none(scope: MemoryScope, reason: &str) -> MemoryRecord {
        MemoryRecord {
            bound: MemoryBound::RlimitAsOnly,
            cgroup: None,
            version: None,
            max_bytes: None,
            swap_bounded: false,
            scope,
            oom_kills: 0,
            reason: Some(reason.to_owned()),
            memfd: MemfdAccess::Denied,
        }
    }
}

/// What [`crate::probe`] found about one controller: can a run's cgroup be made for it?
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ControllerProbe {
    /// Where runs' cgroups go (a trial cgroup was made, its limit written and removed).
    pub parent: Option<PathBuf>,
    /// The hierarchy's version.
    pub version: Option<CgroupVersion>,
    /// An unprivileged user could make it: the cgroup is delegated to it.
    pub delegated: bool,
    /// Memory only: swap cannot extend the bound (see [`MemoryRecord::swap_bounded`]).
    pub swap_bounded: bool,
    /// Why not.
    pub reason: Option<String>,
}

impl ControllerProbe {
    /// A run's cgroup can be made for this controller.
    pub fn available(&self) -> bool {
        self.parent.is_some()
    }
}

/// The cgroup facts of [`crate::probe`].
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CgroupProbe {
    /// The pids controller (`limits.processes`; required as root).
    pub pids: ControllerProbe,
    /// The memory controller (`limits.memory_bytes`).
    pub memory: ControllerProbe,
}

/// One line of `/proc/self/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Membership {
    /// The hierarchy id (0: cgroup v2).
    pub(crate) id: u32,
    /// The controllers of a v1 hierarchy (and `name=…`); empty for v2.
    pub(crate) controllers: Vec<String>,
    /// The cgroup, relative to the cgroup namespace's root.
    pub(crate) path: String,
}

/// A mounted cgroup filesystem, from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMount {
    /// Where it is mounted.
    pub(crate) point: PathBuf,
    /// The cgroup shown at the mount point (`/` unless a subtree is bound).
    pub(crate) root: String,
    pub(crate) version: CgroupVersion,
    /// The controllers of a v1 mount (its super options); empty for v2.
    pub(crate) controllers: Vec<String>,
}

/// Parses `/proc/self/cgroup`; malformed lines are skipped.
pub(crate) fn parse_proc_cgroup(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let id = parts.next()?.parse().ok()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            if !path.starts_with('/') {
                return None;
            }
            Some(Membership {
                id,
                controllers: controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect(),
                path: path.to_owned(),
            })
        })
        .collect()
}

/// `\040`-style escapes of `/proc/self/mountinfo` fields.
fn unescape_mount_field(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses the cgroup mounts of `/proc/self/mountinfo`; other lines are skipped.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            let (root, point) = (l.get(3)?, l.get(4)?);
            let (fstype, options) = (r.first()?, r.get(2).copied().unwrap_or(""));
            let version = match *fstype {
                "cgroup" => CgroupVersion::V1,
                "cgroup2" => CgroupVersion::V2,
                _ => return None,
            };
            let controllers = match version {
                CgroupVersion::V1 => options
                    .split(',')
                    .filter(|o| {
                        !matches!(*o, "rw" | "ro" | "noprefix" | "clone_children" | "xattr")
                            && !o.starts_with("release_agent=")
                    })
                    .map(str::to_owned)
                    .collect(),
                CgroupVersion::V2 => Vec::new(),
            };
            Some(CgroupMount {
                point: PathBuf::from(unescape_mount_field(point)),
                root: unescape_mount_field(root),
                version,
                controllers,
            })
        })
        .collect()
}

/// `path` (a cgroup) below a mount showing cgroup `root`, as a relative path; `None` when it
/// is not below it (or climbs out of the cgroup namespace: `/..`).
fn below(root: &str, path: &str) -> Option<PathBuf> {
    if path.split('/').any(|c| c == "..") {
        return None;
    }
    let root = root.trim_end_matches('/');
    let rest = path.strip_prefix(root)?;
    if !rest.is_empty() && !rest.starts_with('/') {
        return None;
    }
    Some(PathBuf::from(rest.trim_start_matches('/')))
}

/// The runner's own cgroup for `controller`: its version and directory. A controller bound
/// to a v1 hierarchy is there; otherwise it can only be v2's (whether v2 offers it is for
/// the directory's `cgroup.controllers` to say).
pub(crate) fn own_cgroup(
    controller: &str,
    memberships: &[Membership],
    mounts: &[CgroupMount],
) -> Option<(CgroupVersion, PathBuf)> {
    let has = |list: &[String]| list.iter().any(|c| c == controller);
    if let Some(m) = memberships
        .iter()
        .find(|m| m.id != 0 && has(&m.controllers))
    {
        return mounts
            .iter()
            .filter(|mt| mt.version == CgroupVersion::V1 && has(&mt.controllers))
            .find_map(|mt| below(&mt.root, &m.path).map(|rel| mt.point.join(rel)))
            .map(|dir| (CgroupVersion::V1, dir));
    }
    if mounts
        .iter()
        .any(|mt| mt.version == CgroupVersion::V1 && has(&mt.controllers))
    {
        // Bound to a v1 hierarchy the runner is not a member of (cannot happen on Linux).
        return None;
    }
    let m = memberships
        .iter()
        .find(|m| m.id == 0 && m.controllers.is_empty())?;
    mounts
        .iter()
        .filter(|mt| mt.version == CgroupVersion::V2)
        .find_map(|mt| below(&mt.root, &m.path).map(|rel| mt.point.join(rel)))
        .map(|dir| (CgroupVersion::V2, dir))
}

/// The controllers a v2 cgroup file lists (`cgroup.controllers`, `cgroup.subtree_control`).
fn lists(file: &Path, controller: &str) -> bool {
    std::fs::read_to_string(file)
        .map(|s| s.split_whitespace().any(|c| c == controller))
        .unwrap_or(false)
}

/// The `oom_kill` count of a v1 `memory.oom_control` or a v2 `memory.events`.
pub(crate) fn parse_oom_kills(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// What a run's cgroups bound.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Want {
    /// `pids.max`.
    pub(crate) processes: u64,
    /// `memory.max` / `memory.limit_in_bytes`.
    pub(crate) memory_bytes: u64,
}

/// The memory cgroup of a run.
#[derive(Debug, Clone)]
pub(crate) struct MemoryCgroup {
    pub(crate) dir: PathBuf,
    pub(crate) version: CgroupVersion,
    pub(crate) max_bytes: u64,
    pub(crate) swap_bounded: bool,
}

/// The cgroups of a run (or session), made by [`RunCgroups::make`] and removed on drop.
#[derive(Debug)]
pub(crate) struct RunCgroups {
    /// Every directory made (one per hierarchy), removed on drop.
    dirs: Vec<PathBuf>,
    /// The directory holding `pids.max`, or why there is none.
    pids: Result<PathBuf, String>,
    /// The memory cgroup, or why there is none.
    memory: Result<MemoryCgroup, String>,
    /// The runner's euid when it was made (root needs no delegation).
    euid: u32,
}

/// Where the cgroups of one controller go: the parent directory and its version.
type Parent = Result<(CgroupVersion, PathBuf), String>;

/// Where a run's cgroup for `controller` can be made (see the module documentation).
fn parent_for(controller: &str, own: Option<(CgroupVersion, PathBuf)>, euid: u32) -> Parent {
    let Some((version, dir)) = own else {
        return Err(format!(
            "no {controller} controller: neither a cgroup v1 {controller} hierarchy nor a cgroup v2 hierarchy is mounted"
        ));
    };
    if !crate::sys::is_cgroup_fs(&dir) {
        return Err(format!(
            "{} (this runner's {controller} cgroup) is not a mounted cgroup filesystem",
            dir.display()
        ));
    }
    if version == CgroupVersion::V1 {
        return Ok((version, dir));
    }
    if !lists(&dir.join("cgroup.controllers"), controller) {
        return Err(format!(
            "cgroup v2: the {controller} controller is not available in {} (enable it in the parent's cgroup.subtree_control)",
            dir.display()
        ));
    }
    if lists(&dir.join("cgroup.subtree_control"), controller) {
        return Ok((version, dir));
    }
    // The runner's own cgroup holds processes (the runner), so it cannot enable the controller
    // for children (EBUSY) unless it is the root; a parent delegated to this user may (the
    // runner's cgroup is then one of its leaves).
    if euid != 0
        && let Some(parent) = dir.parent()
        && delegated_to(parent, euid)
    {
        let file = parent.join("cgroup.subtree_control");
        if lists(&file, controller)
            || (std::fs::write(&file, format!("+{controller}")).is_ok() && lists(&file, controller))
        {
            return Ok((version, parent.to_path_buf()));
        }
    }
    Err(format!(
        "cgroup v2: {controller} is not enabled in {}/cgroup.subtree_control, and a cgroup holding processes (this runner's) cannot enable it (run the runner in a leaf of a cgroup delegated to uid {euid})",
        dir.display()
    ))
}

/// `dir` is a v2 cgroup delegated to `euid`: it and its `cgroup.procs` belong to that user.
fn delegated_to(dir: &Path, euid: u32) -> bool {
    let owned = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.uid() == euid);
    crate::sys::is_cgroup_fs(dir) && owned(dir) && owned(&dir.join("cgroup.procs"))
}

/// The hint for a cgroup that could not be created or written: the usual causes.
fn hint(e: &io::Error, euid: u32) -> &'static str {
    match (e.raw_os_error(), euid) {
        (Some(libc::EROFS), _) => " (read-only here, e.g. under systemd's ProtectControlGroups=)",
        (Some(libc::EACCES | libc::EPERM), 0) => "",
        (Some(libc::EACCES | libc::EPERM), _) => " (not delegated to this user)",
        _ => "",
    }
}

/// Removes, once per process and parent, the empty cgroups (`ollie-PID-N`) that runners which
/// died without cleaning up left in `parent` (a killed toolsrv cannot remove its sessions'):
/// the PID no longer exists and the directory is older than a minute (a live runner, even in
/// another pid namespace, places its sandbox within milliseconds of making it). `rmdir` only
/// succeeds on a cgroup without processes or children.
fn sweep_stale(parent: &Path) {
    static SWEPT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    {
        let mut swept = SWEPT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if swept.iter().any(|p| p == parent) {
            return;
        }
        swept.push(parent.to_path_buf());
    }
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("ollie-"))
            .and_then(|r| r.split_once('-'))
            .and_then(|(pid, n)| n.parse::<u64>().ok().and(pid.parse::<u32>().ok()))
        else {
            continue;
        };
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(60));
        if old && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// Creates a fresh child of `parent` (`ollie-PID-N`). A name left by a dead process with the
/// same pid (killed before it could remove its cgroup) is removed when it is empty, or
/// skipped for the next name.
fn make_child(parent: &Path, euid: u32) -> Result<PathBuf, String> {
    static N: AtomicU64 = AtomicU64::new(0);
    sweep_stale(parent);
    let mut last = None;
    for _ in 0..8 {
        let name = format!(
            "ollie-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let dir = parent.join(&name);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if std::fs::remove_dir(&dir).is_ok() && std::fs::create_dir(&dir).is_ok() {
                    return Ok(dir);
                }
                last = Some(e);
            }
            Err(e) => {
                let why = hint(&e, euid);
                return Err(format!(
                    "cannot create a cgroup in {}: {e}{why}",
                    parent.display()
                ));
            }
        }
    }
    Err(format!(
        "cannot create a cgroup in {}: {}",
        parent.display(),
        last.map_or_else(|| "no free name".to_owned(), |e| e.to_string())
    ))
}

/// Writes one cgroup file; the error names it.
fn write(dir: &Path, file: &str, value: &str, euid: u32) -> Result<(), String> {
    std::fs::write(dir.join(file), value).map_err(|e| {
        let why = hint(&e, euid);
        format!("cannot write {}: {e}{why}", dir.join(file).display())
    })
}

/// Sets the memory limit (and swap, after it: v1 requires memsw ≥ the limit). Returns whether
/// swap is bounded too.
fn limit_memory(dir: &Path, version: CgroupVersion, bytes: u64, euid: u32) -> Result<bool, String> {
    let (limit, swap, swap_value) = match version {
        CgroupVersion::V1 => (
            "memory.limit_in_bytes",
            "memory.memsw.limit_in_bytes",
            bytes.to_string(),
        ),
        CgroupVersion::V2 => ("memory.max", "memory.swap.max", "0".to_owned()),
    };
    write(dir, limit, &bytes.to_string(), euid)?;
    // Without swap accounting the file does not exist: swap is not bounded (matters only on
    // hosts with swap; recorded).
    Ok(dir.join(swap).exists() && write(dir, swap, &swap_value, euid).is_ok())
}

/// Removes a cgroup directory once its processes are gone (the kernel tears the run's
/// namespace down asynchronously).
pub(crate) fn remove(dir: &Path) {
    for _ in 0..200 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return,
        }
    }
}

impl RunCgroups {
    /// Makes the cgroups for `want` under the runner's own (see the module documentation),
    /// one directory per hierarchy. Never fails: what could not be made is kept as a reason.
    pub(crate) fn make(want: Want) -> RunCgroups {
        let memberships =
            parse_proc_cgroup(&std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default());
        let mounts =
            parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
        let euid = crate::sys::ids().0;
        let pids_parent = parent_for("pids", own_cgroup("pids", &memberships, &mounts), euid);
        let memory_parent = parent_for("memory", own_cgroup("memory", &memberships, &mounts), euid);
        // One directory per parent: v2 (or co-mounted v1 controllers) share it.
        let mut dirs: Vec<PathBuf> = Vec::new();
        let mut made: Vec<(PathBuf, Result<PathBuf, String>)> = Vec::new();
        let mut child_of = |parent: &Path| -> Result<PathBuf, String> {
            if let Some((_, r)) = made.iter().find(|(p, _)| p == parent) {
                return r.clone();
            }
            let r = make_child(parent, euid);
            if let Ok(d) = &r {
                dirs.push(d.clone());
            }
            made.push((parent.to_path_buf(), r.clone()));
            r
        };
        let pids = pids_parent.and_then(|(_, parent)| {
            let dir = child_of(&parent)?;
            write(&dir, "pids.max", &want.processes.to_string(), euid)?;
            Ok(dir)
        });
        let memory = memory_parent.and_then(|(version, parent)| {
            let dir = child_of(&parent)?;
            let swap_bounded = limit_memory(&dir, version, want.memory_bytes, euid)?;
            Ok(MemoryCgroup {
                dir,
                version,
                max_bytes: want.memory_bytes,
                swap_bounded,
            })
        });
        let mut cg = RunCgroups {
            dirs,
            pids,
            memory,
            euid,
        };
        cg.remove_unused();
        cg
    }

    /// Removes the directories no controller uses (a limit could not be written).
    fn remove_unused(&mut self) {
        for d in std::mem::take(&mut self.dirs) {
            let used = self.pids.as_ref().is_ok_and(|p| *p == d)
                || self.memory.as_ref().is_ok_and(|m| m.dir == d);
            if used {
                self.dirs.push(d);
            } else {
                remove(&d);
            }
        }
    }

    /// Moves `pid` (the sandbox's pid 1, before it does anything) into every cgroup made; a
    /// controller whose cgroup cannot take it is dropped with the reason.
    pub(crate) fn place(&mut self, pid: libc::pid_t) {
        for dir in self.dirs.clone() {
            if let Err(why) = write(&dir, "cgroup.procs", &pid.to_string(), self.euid) {
                let why = format!("cannot move the sandbox into its cgroup: {why}");
                if self.pids.as_ref().is_ok_and(|p| *p == dir) {
                    self.pids = Err(why.clone());
                }
                if self.memory.as_ref().is_ok_and(|m| m.dir == dir) {
                    self.memory = Err(why);
                }
            }
        }
        self.remove_unused();
    }

    /// The pids cgroup, if there is one.
    pub(crate) fn pids(&self) -> Option<&Path> {
        self.pids.as_deref().ok()
    }

    /// Why there is no pids cgroup.
    #[cfg(test)]
    pub(crate) fn pids_reason(&self) -> Option<&str> {
        self.pids.as_ref().err().map(String::as_str)
    }

    /// Whether there is a memory cgroup (without one the tool may not create memfds).
    pub(crate) fn has_memory(&self) -> bool {
        self.memory.is_ok()
    }

    /// The memory cgroup, if there is one.
    #[cfg(test)]
    pub(crate) fn memory(&self) -> Option<&MemoryCgroup> {
        self.memory.as_ref().ok()
    }

    /// Processes the memory cgroup's OOM killer has killed so far (0 without one).
    pub(crate) fn oom_kills(&self) -> u64 {
        let Ok(m) = &self.memory else {
            return 0;
        };
        let file = match m.version {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        };
        std::fs::read_to_string(m.dir.join(file))
            .map(|t| parse_oom_kills(&t))
            .unwrap_or(0)
    }

    /// The memory record for a run (`oom_kills` during it).
    pub(crate) fn memory_record(&self, scope: MemoryScope, oom_kills: u64) -> MemoryRecord {
        match &self.memory {
            Ok(m) => MemoryRecord {
                bound: MemoryBound::Cgroup,
                cgroup: Some(m.dir.clone()),
                version: Some(m.version),
                max_bytes: Some(m.max_bytes),
                swap_bounded: m.swap_bounded,
                scope,
                oom_kills,
                reason: None,
                memfd: MemfdAccess::Allowed,
            },
            Err(why) => MemoryRecord::none(scope, why),
        }
    }

    /// What a trial tells [`crate::probe`] (the parents of the cgroups made).
    pub(crate) fn probe(&self) -> CgroupProbe {
        let delegated = self.euid != 0;
        let parent = |d: &Path| d.parent().map(Path::to_path_buf);
        let version_of = |d: &Path| {
            let v2 = std::fs::metadata(d.join("cgroup.controllers")).is_ok();
            if v2 {
                CgroupVersion::V2
            } else {
                CgroupVersion::V1
            }
        };
        let missing = |why: &String| ControllerProbe {
            parent: None,
            version: None,
            delegated: false,
            swap_bounded: false,
            reason: Some(why.clone()),
        };
        let found = |d: &Path, version, swap_bounded| ControllerProbe {
            parent: parent(d),
            version: Some(version),
            delegated,
            swap_bounded,
            reason: None,
        };
        CgroupProbe {
            pids: match &self.pids {
                Ok(d) => found(d, version_of(d), false),
                Err(why) => missing(why),
            },
            memory: match &self.memory {
                Ok(m) => found(&m.dir, m.version, m.swap_bounded),
                Err(why) => missing(why),
            },
        }
    }
}

impl Drop for RunCgroups {
    fn drop(&mut self) {
        for d in self.dirs.drain(..) {
            remove(&d);
        }
    }
}

/// Tries to make a run's cgroups as a run would, and removes them: the facts for
/// [`crate::probe`].
pub(crate) fn probe() -> CgroupProbe {
    RunCgroups::make(Want {
        processes: 64,
        memory_bytes: 64 << 20,
    })
    .probe()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's kind: cgroup v1 hybrid (memory and pids v1, an empty v2 at
    /// /sys/fs/cgroup/unified).
    const HYBRID_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n7:blkio:/\n4:memory:/process_api/0885\n2:cpuacct:/\n1:cpu,cpuacct:/\n0::/\n";
    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,release_agent=/x,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";
    /// A systemd host: cgroup v2 only.
    const V2_CGROUP: &str =
        "0::/user.slice/user-1000.slice/user@1000.service/app.slice/ollie.service/main\n";
    const V2_MOUNTINFO: &str = "\
24 1 253:1 / / rw,relatime shared:1 - ext4 /dev/root rw
30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    #[test]
    fn proc_self_cgroup_is_parsed_for_v1_and_v2() {
        let m = parse_proc_cgroup(HYBRID_CGROUP);
        assert_eq!(m.len(), 7);
        assert_eq!(
            m[3],
            Membership {
                id: 4,
                controllers: vec!["memory".into()],
                path: "/process_api/0885".into()
            }
        );
        assert_eq!(m[5].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(
            m[6],
            Membership {
                id: 0,
                controllers: vec![],
                path: "/".into()
            }
        );
        // Garbage and relative paths are skipped, never a panic.
        assert!(parse_proc_cgroup("x\n1:pids\n2:pids:rel\n::\n\n").is_empty());
    }

    #[test]
    fn cgroup_mounts_are_found_in_mountinfo() {
        let m = parse_mountinfo(HYBRID_MOUNTINFO);
        assert_eq!(m.len(), 5, "{m:?}");
        assert_eq!(m[0].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(m[3].controllers, vec!["name=systemd"]);
        assert_eq!(m[4].version, CgroupVersion::V2);
        assert_eq!(m[4].point, Path::new("/sys/fs/cgroup/unified"));
        let esc = parse_mountinfo("1 2 0:1 /a\\040b /mnt/c\\040g rw - cgroup2 none rw\n");
        assert_eq!(esc[0].point, Path::new("/mnt/c g"));
        assert_eq!(esc[0].root, "/a b");
        assert!(parse_mountinfo("nonsense\n1 2 - cgroup\n").is_empty());
    }

    #[test]
    fn the_runners_own_cgroup_is_v1_on_hybrid_hosts_and_v2_on_unified_ones() {
        let (m, mt) = (
            parse_proc_cgroup(HYBRID_CGROUP),
            parse_mountinfo(HYBRID_MOUNTINFO),
        );
        assert_eq!(
            own_cgroup("memory", &m, &mt),
            Some((
                CgroupVersion::V1,
                PathBuf::from("/sys/fs/cgroup/memory/process_api/0885")
            ))
        );
        assert_eq!(
            own_cgroup("pids", &m, &mt),
            Some((CgroupVersion::V1, PathBuf::from("/sys/fs/cgroup/pids")))
        );
        // Not bound to v1: the unified hierarchy's (its cgroup.controllers decides).
        assert_eq!(
            own_cgroup("io", &m, &mt),
            Some((CgroupVersion::V2, PathBuf::from("/sys/fs/cgroup/unified")))
        );
        let (m, mt) = (parse_proc_cgroup(V2_CGROUP), parse_mountinfo(V2_MOUNTINFO));
        for c in ["memory", "pids"] {
            assert_eq!(
                own_cgroup(c, &m, &mt),
                Some((
                    CgroupVersion::V2,
                    PathBuf::from(
                        "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/ollie.service/main"
                    )
                ))
            );
        }
        // A mount of a subtree: paths below it map under the mount point, others do not.
        let sub = parse_mountinfo("1 2 0:1 /ollie.service /cg rw - cgroup2 none rw\n");
        let inside = parse_proc_cgroup("0::/ollie.service/main\n");
        assert_eq!(
            own_cgroup("memory", &inside, &sub),
            Some((CgroupVersion::V2, PathBuf::from("/cg/main")))
        );
        let outside = parse_proc_cgroup("0::/ollie.servicex\n");
        assert_eq!(own_cgroup("memory", &outside, &sub), None);
        // Outside the cgroup namespace, or nothing mounted: none.
        assert_eq!(
            own_cgroup("memory", &parse_proc_cgroup("0::/../x\n"), &mt),
            None
        );
        assert_eq!(own_cgroup("memory", &m, &[]), None);
    }

    #[test]
    fn oom_kills_are_read_from_v1_oom_control_and_v2_events() {
        assert_eq!(
            parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"),
            3
        );
        assert_eq!(
            parse_oom_kills("low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n"),
            1
        );
        assert_eq!(parse_oom_kills(""), 0);
    }

    #[test]
    fn only_old_empty_cgroups_of_dead_runners_are_swept() {
        let parent = std::env::temp_dir().join(format!("ollie-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        std::fs::create_dir_all(&parent).unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        let make = |name: &str, aged: bool| {
            let d = parent.join(name);
            std::fs::create_dir(&d).unwrap();
            if aged {
                std::fs::File::open(&d).unwrap().set_modified(old).unwrap();
            }
            d
        };
        // pid 999999999 cannot exist (pid_max is at most 2^22).
        let stale = make("ollie-999999999-0", true);
        let young = make("ollie-999999999-1", false);
        let alive = make(&format!("ollie-{}-7", std::process::id()), true);
        let busy = make("ollie-999999999-2", true);
        std::fs::write(busy.join("x"), "").unwrap();
        let other = make("ollie-x-0", true);
        sweep_stale(&parent);
        assert!(!stale.exists());
        for kept in [&young, &alive, &busy, &other] {
            assert!(kept.exists(), "{}", kept.display());
        }
        // Once per process and parent.
        let again = make("ollie-999999999-3", true);
        sweep_stale(&parent);
        assert!(again.exists());
        std::fs::remove_dir_all(&parent).unwrap();
    }

    #[test]
    fn run_cgroups_bound_memory_where_they_can_be_made() {
        // A plain directory never counts as a cgroup (it would bound nothing).
        assert!(!crate::sys::is_cgroup_fs(&std::env::temp_dir()));
        // As root on a host with writable hierarchies they are real cgroups with the limits
        // written; elsewhere every missing one has a reason. Nothing is left behind.
        let cg = RunCgroups::make(Want {
            processes: 8,
            memory_bytes: 32 << 20,
        });
        let dirs = cg.dirs.clone();
        match cg.memory() {
            Some(m) => {
                assert!(crate::sys::is_cgroup_fs(&m.dir), "{}", m.dir.display());
                let file = match m.version {
                    CgroupVersion::V1 => "memory.limit_in_bytes",
                    CgroupVersion::V2 => "memory.max",
                };
                let v = std::fs::read_to_string(m.dir.join(file)).unwrap();
                assert_eq!(v.trim(), (32u64 << 20).to_string());
                let r = cg.memory_record(MemoryScope::Run, 0);
                assert_eq!(r.bound, MemoryBound::Cgroup);
                assert_eq!(r.max_bytes, Some(32 << 20));
            }
            None => {
                let r = cg.memory_record(MemoryScope::Run, 0);
                assert_eq!(r.bound, MemoryBound::RlimitAsOnly);
                let why = r.reason.unwrap();
                assert!(!why.is_empty() && !why.contains('\n'), "{why}");
            }
        }
        if let Some(p) = cg.pids() {
            assert_eq!(
                std::fs::read_to_string(p.join("pids.max")).unwrap().trim(),
                "8"
            );
        } else {
            assert!(cg.pids_reason().is_some_and(|r| !r.is_empty()));
        }
        let probe = cg.probe();
        assert_eq!(probe.memory.available(), cg.memory().is_some());
        drop(cg);
        for d in dirs {
            assert!(!d.exists(), "{} left behind", d.display());
        }
    }
}
