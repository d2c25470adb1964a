//! The mount plan, shared by one-shot runs (one mount namespace per run) and prepared
//! sandboxes (one per session): what the init stage or the zygote mounts, and the record of
//! it.

use crate::error::{SandboxError, cstr, io_err};
use crate::landlock;
use crate::placeholder::Protected;
use crate::record::MountRecord;
use crate::sys::{self, MountStep};
use crate::unions::{self, UnionMount};
use ollie_policy::ResolvedPolicy;
use std::path::{Path, PathBuf};

/// Where the private shared-memory tmpfs goes.
const SHM_DIR: &str = "/dev/shm";
/// Upper bound on inodes of the private `/dev/shm`.
const SHM_INODES: u64 = 16384;
/// Where the private temporary directory goes: the first of these that holds none of the
/// policy's paths (nor the workspace) and lies in no writable tree.
const TMP_DIRS: &[&str] = &["/tmp", "/var/tmp"];
/// Upper bound on inodes of the private temporary directory.
const TMP_INODES: u64 = 65536;
/// Its size when `limits.disk_bytes` does not bound the run's writes.
const TMP_BYTES: u64 = 1 << 30;

/// The run's private temporary directory (`TMPDIR` unless the policy sets one): a fresh
/// tmpfs of the run or session over the first of [`TMP_DIRS`] that would hide none of the
/// policy's paths (read, exec, write, the workspace) and is not inside a writable tree, so
/// temporary files never land in the workspace or the host's `/tmp` and vanish with the
/// namespace. None for an unsandboxed run, or when every candidate holds such a path.
pub(crate) fn private_tmp(resolved: &ResolvedPolicy, writable: &[PathBuf]) -> Option<PathBuf> {
    if resolved.unsandboxed() {
        return None;
    }
    let fs = &resolved.fs;
    let granted = || {
        fs.read
            .iter()
            .chain(&fs.exec)
            .chain(&fs.write)
            .chain(writable)
            .chain(std::iter::once(&resolved.ctx.workdir))
    };
    TMP_DIRS
        .iter()
        .filter_map(|d| std::fs::canonicalize(d).ok())
        .find(|t| {
            t.is_dir()
                && !granted().any(|p| p.starts_with(t))
                && !writable.iter().any(|w| t.starts_with(w))
        })
}

/// The policy's writable trees that exist (canonical, directories or files, each once),
/// outermost first.
pub(crate) fn writable_trees(resolved: &ResolvedPolicy) -> Vec<PathBuf> {
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
    writable
}

/// Where a run or session gets union mounts.
#[derive(Clone, Copy)]
pub(crate) enum Unions<'a> {
    /// The run's own overlays (a one-shot run; none for most).
    Mounted(&'a [UnionMount]),
    /// A prepared session's points: its new root holds them, and each call mounts its own
    /// overlays there (`unions::call_entries`).
    PerCall(&'a [PathBuf]),
}

/// The mounts of a run or session, the record of them, and the protected islands'
/// placeholders (removed when `islands` is dropped, after the namespace is gone).
pub(crate) struct MountPlan {
    /// The steps, in order, for `sys::run_mounts`.
    pub(crate) steps: Vec<MountStep>,
    /// What the steps do, as recorded.
    pub(crate) record: MountRecord,
    /// Protected islands and their placeholders.
    pub(crate) islands: Protected,
}

impl MountPlan {
    /// Plans the mounts for `writable` (from [`writable_trees`]): writable trees cloned before
    /// everything goes read-only and nosuid, re-attached; every directory between a writable
    /// root and a protected island pinned; protected islands (placeholders created for missing
    /// ones) and secret locations inside writable trees bound read-only; a private
    /// `/dev/shm` mounted last. `abi` is the Landlock ABI of the ruleset the tmpfs rule joins.
    ///
    /// With unions (mounted ones validated, [`unions::validate`]; points checked,
    /// [`unions::check_point`]) the root is first replaced by a new one holding the points
    /// ([`MountStep::NewRoot`]; `root_access` is the ruleset's
    /// [`landlock::Ruleset::root_access`]); each mounted overlay is created before everything
    /// goes read-only and attached after, with the read-write rights beneath its point.
    ///
    /// A run approved unsandboxed ([`ResolvedPolicy::unsandboxed`]) mounts nothing: its
    /// mount namespace only has its propagation made private, so the tool sees (and may
    /// write, as far as file permissions allow) the host's filesystem as it is, with no
    /// read-only root, islands or private `/dev/shm`; the record says so.
    ///
    /// Last, before `/dev/shm`, everything the tool has no business seeing is hidden
    /// ([`hidden_paths`]): the secret locations, the runner's `hidden` paths (olliesrv's state
    /// and configuration directories) and every home directory (the user's, `/root`,
    /// `/home/*`) and `/run/user` that holds none of the policy's paths.
    ///
    /// With `per_call_islands` (a prepared session) the protected islands are left out: each
    /// call binds them in a mount namespace of its own ([`Islands`]), so their placeholders
    /// exist only while a call runs.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        resolved: &ResolvedPolicy,
        writable: Vec<PathBuf>,
        abi: u32,
        unions: Unions<'_>,
        root_access: u64,
        hidden: &[PathBuf],
        per_call_islands: bool,
        repos: &mut crate::treescan::TreeScan,
    ) -> Result<MountPlan, SandboxError> {
        let mut steps = vec![MountStep::MakePrivate];
        let (points, unions): (Vec<PathBuf>, &[UnionMount]) = match unions {
            Unions::Mounted(u) => {
                if !u.is_empty() {
                    steps.push(unions::new_root_step(u, root_access)?);
                }
                (u.iter().map(|u| u.point.clone()).collect(), u)
            }
            Unions::PerCall(p) => {
                if !p.is_empty() {
                    steps.push(unions::session_root_step(p, root_access)?);
                }
                (p.to_vec(), &[])
            }
        };
        if resolved.unsandboxed() {
            // The unions still appear (no Landlock rule: there is no ruleset).
            let (create, attach) = unions::overlay_steps(unions, 0, 0)?;
            steps.extend(create);
            steps.extend(attach);
            return Ok(MountPlan {
                steps,
                record: MountRecord {
                    read_only_root: false,
                    writable: Vec::new(),
                    protected: Vec::new(),
                    placeholders: Vec::new(),
                    private_shm: None,
                    private_tmp: None,
                    unions: unions.to_vec(),
                    hidden: Vec::new(),
                    resolv_conf: None,
                },
                islands: Protected::default(),
            });
        }
        // Protected islands: existing ones are bound read-only; for missing ones the first
        // missing component is created as an empty placeholder and bound read-only.
        let Islands {
            protect: islands,
            protected,
            pinned,
            secrets,
        } = if per_call_islands {
            Islands {
                secrets: existing_secrets(&resolved.ctx),
                ..Islands::default()
            }
        } else {
            Islands::plan(resolved, &writable, repos)?
        };
        let c = |p: &Path| sys::cstring(p).map_err(io_err("prepare mounts"));
        let (create, attach) = unions::overlay_steps(
            unions,
            writable.len() + pinned.len(),
            landlock::writable_rights(abi),
        )?;
        for (slot, w) in writable.iter().enumerate() {
            steps.push(MountStep::CloneTree { path: c(w)?, slot });
        }
        steps.extend(create);
        steps.push(MountStep::ReadOnlyAll);
        // A writable tree inside a protected island (the policy's explicit exception, e.g.
        // `.git/objects`) is attached after the island's read-only bind, which would hide it.
        let in_island = |w: &PathBuf| protected.iter().any(|p| w.starts_with(p));
        for (slot, w) in writable.iter().enumerate() {
            if !in_island(w) {
                steps.push(MountStep::Attach { slot, path: c(w)? });
            }
        }
        steps.extend(attach);
        // Pin every directory between a writable root and a protected island with a
        // read-write bind onto itself: a mount point cannot be renamed or removed (EBUSY), so
        // the tool cannot move `.git` (and the read-only `.git/hooks` inside it) aside and
        // create a fresh one.
        for (i, a) in pinned.iter().enumerate() {
            let slot = writable.len() + i;
            let path = c(a)?;
            steps.push(MountStep::CloneTree {
                path: path.clone(),
                slot,
            });
            steps.push(MountStep::Attach { slot, path });
        }
        for p in &protected {
            steps.push(MountStep::ProtectReadOnly { path: c(p)? });
        }
        for (slot, w) in writable.iter().enumerate() {
            if in_island(w) {
                steps.push(MountStep::Attach { slot, path: c(w)? });
            }
        }
        let hide = hidden_paths(resolved, &secrets, hidden, &writable, &points);
        for (path, dir) in &hide {
            steps.push(MountStep::Hide {
                path: c(path)?,
                dir: *dir,
            });
        }
        // A proxied run has no resolver: its resolver configuration says so (readable, since
        // it holds nothing of the host's), unless it is hidden or writable anyway.
        let resolv_conf = crate::proxy::own_namespace(&resolved.network)
            .then(crate::proxy::resolv_conf_target)
            .flatten()
            .filter(|r| {
                !hide.iter().any(|(h, _)| r.starts_with(h))
                    && !writable.iter().any(|w| r.starts_with(w))
            });
        if let Some(r) = &resolv_conf {
            steps.push(MountStep::ReplaceFile {
                path: c(r)?,
                content: crate::proxy::RESOLV_CONF.as_bytes().to_vec(),
                rule_access: landlock::fs::READ_FILE,
            });
        }
        // A private /dev/shm (POSIX shared memory, semaphores): never the host's, never
        // another run's or session's. Mounted last, so it is writable while everything around
        // it is read-only.
        // Its size is also capped at `limits.memory_bytes`: without a memory cgroup nothing
        // else bounds what it holds.
        let l = resolved.policy.limits;
        let shm_bytes = l.shm_bytes.min(l.memory_bytes);
        let private_shm = match std::fs::canonicalize(SHM_DIR) {
            Ok(real) if shm_bytes > 0 && real.is_dir() => {
                steps.push(MountStep::PrivateTmpfs {
                    path: c(&real)?,
                    options: cstr(
                        format!(
                            "size={},nr_inodes={},mode=1777",
                            shm_bytes,
                            SHM_INODES.min(shm_bytes / 1024 + 16)
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
        let private_tmp = private_tmp(resolved, &writable);
        if let Some(t) = &private_tmp {
            let bytes = if l.disk_bytes > 0 {
                l.disk_bytes
            } else {
                TMP_BYTES
            };
            steps.push(MountStep::PrivateTmpfs {
                path: c(t)?,
                options: cstr(
                    format!("size={bytes},nr_inodes={TMP_INODES},mode=1777").as_bytes(),
                    "tmpfs options",
                )?,
                rule_access: landlock::writable_rights(abi),
            });
        }
        Ok(MountPlan {
            steps,
            record: MountRecord {
                read_only_root: true,
                writable,
                protected,
                placeholders: islands.placeholders.clone(),
                private_shm,
                private_tmp,
                unions: unions.to_vec(),
                hidden: hide.into_iter().map(|(p, _)| p).collect(),
                resolv_conf,
            },
            islands,
        })
    }
}

/// The protected islands of one run or prepared call: their placeholders and locks (held
/// until dropped), the paths bound read-only, and the directories pinned above them.
#[derive(Debug, Default)]
pub(crate) struct Islands {
    pub(crate) protect: Protected,
    pub(crate) protected: Vec<PathBuf>,
    pub(crate) pinned: Vec<PathBuf>,
    /// The [`existing_secrets`] as the placeholders left them, for the run's hidden paths.
    pub(crate) secrets: Vec<PathBuf>,
}

impl Islands {
    /// Prepares the policy's protected paths against `writable` (placeholders created for
    /// missing ones, under the shared locks of `placeholder`).
    ///
    /// `repos` (the before-run [`crate::treescan::TreeScan`] of the writable trees) adds,
    /// when the policy protects a `.git`, every `.git` found there
    /// ([`crate::treescan::TreeScan::protect_list`]), bound read-only
    /// like the policy's, without pinned ancestors: moving a directory aside moves the bind
    /// with it (a `.git` is a mount point: it cannot be renamed or removed), and a fresh
    /// `.git` where the old one stood is flagged after the run.
    pub(crate) fn plan(
        resolved: &ResolvedPolicy,
        writable: &[PathBuf],
        repos: &mut crate::treescan::TreeScan,
    ) -> Result<Islands, SandboxError> {
        let protect = Protected::prepare(&resolved.fs.protected, writable)?;
        let secrets = existing_secrets(&resolved.ctx);
        let mut protected = protected_paths(&protect, &secrets, writable, &[]);
        let pinned = pinned_ancestors(&protected, writable);
        // Only where the policy protects a `.git` itself (a policy without one, e.g.
        // "Landlock only", lets the tool write repositories; they are flagged afterwards).
        let guards_git = resolved
            .fs
            .protected
            .iter()
            .any(|p| p.file_name().is_some_and(|n| n == ".git"));
        let nested = if guards_git {
            repos.protect_list(&protected, writable)
        } else {
            Vec::new()
        };
        if !nested.is_empty() {
            protected = protected_paths(&protect, &secrets, writable, &nested);
        }
        Ok(Islands {
            protect,
            protected,
            pinned,
            secrets,
        })
    }

    /// The entries a prepared call binds (`sys::protect_call_islands`): `w` for each writable
    /// tree inside an island, `p` for each pinned directory, `r` for each protected path; each
    /// a kind byte and the path.
    pub(crate) fn call_entries(&self, writable: &[PathBuf]) -> Result<Vec<Vec<u8>>, SandboxError> {
        use std::os::unix::ffi::OsStrExt;
        let in_island = |w: &PathBuf| self.protected.iter().any(|p| w.starts_with(p));
        let reattach: Vec<&PathBuf> = writable.iter().filter(|w| in_island(w)).collect();
        if reattach.len() > sys::MAX_CALL_REATTACH
            || reattach.len() + self.pinned.len() + self.protected.len() > sys::MAX_ISLANDS
        {
            return Err(SandboxError::InvalidRequest {
                reason: format!(
                    "the policy protects too many paths for a prepared call (at most {} entries, {} writable trees inside them)",
                    sys::MAX_ISLANDS,
                    sys::MAX_CALL_REATTACH
                ),
            });
        }
        let entry = |kind: u8, p: &Path| -> Result<Vec<u8>, SandboxError> {
            let b = p.as_os_str().as_bytes();
            let mut v = Vec::with_capacity(b.len() + 1);
            v.push(kind);
            v.extend_from_slice(b);
            Ok(v)
        };
        let mut out = Vec::new();
        for w in reattach {
            out.push(entry(b'w', w)?);
        }
        for p in &self.pinned {
            out.push(entry(b'p', p)?);
        }
        for p in &self.protected {
            out.push(entry(b'r', p)?);
        }
        Ok(out)
    }
}

/// The secret locations of `ctx` ([`ollie_policy::ResolveContext::secret_locations`]: the
/// defaults and the runner's extra ones) that exist, canonical. Each canonicalisation costs a
/// readlink per path component, so a run makes this list once for its islands and its hidden
/// paths.
pub(crate) fn existing_secrets(ctx: &ollie_policy::ResolveContext) -> Vec<PathBuf> {
    ctx.secret_locations()
        .iter()
        .filter_map(|s| std::fs::canonicalize(s).ok())
        .collect()
}

/// The paths bound read-only over the writable trees: the islands, the secret locations inside
/// a writable tree, and the directories that protected `.git` pointer files point at.
fn protected_paths(
    islands: &Protected,
    secrets: &[PathBuf],
    writable: &[PathBuf],
    repos: &[PathBuf],
) -> Vec<PathBuf> {
    let mut protected: Vec<PathBuf> = islands.paths.clone();
    protected.extend(repos.iter().cloned());
    // Secret locations inside a writable tree (e.g. a workspace that is $HOME) are carved
    // out of the Landlock grant; bind them read-only too, so their metadata (chmod ~/.ssh)
    // is safe.
    for real in secrets {
        if writable.iter().any(|w| real.starts_with(w) && real != w) && !protected.contains(real) {
            protected.push(real.clone());
        }
    }
    // A protected `.git` that is a gitdir pointer file (a linked worktree, a separate git
    // dir) protects the directory it points at too, where that lies in a writable tree.
    for target in protected
        .iter()
        .filter_map(|p| gitfile_target(p))
        .collect::<Vec<_>>()
    {
        if writable
            .iter()
            .any(|w| target.starts_with(w) && &target != w)
            && !protected.iter().any(|p| target.starts_with(p))
        {
            protected.push(target);
        }
    }
    protected
}

/// What a run hides, canonical, each once, with whether it is a directory: every existing
/// secret location (`secrets`, the [`existing_secrets`] of the home), the runner's
/// `extra` paths, and every home directory (the user's, `/root`, each entry of `/home`) and
/// `/run/user` that holds none of the policy's paths, the writable trees or the unions'
/// points (all homes stay under `read_all`). Nothing
/// that contains a policy path is hidden (so a workspace inside the home keeps the home
/// visible; only its secrets are hidden). Stat, `access` and inotify are not mediated by
/// Landlock: without this a tool could see the names and sizes in these trees.
pub(crate) fn hidden_paths(
    resolved: &ResolvedPolicy,
    secrets: &[PathBuf],
    extra: &[PathBuf],
    writable: &[PathBuf],
    points: &[PathBuf],
) -> Vec<(PathBuf, bool)> {
    let fs = &resolved.fs;
    let mut granted: Vec<PathBuf> = fs
        .read
        .iter()
        .chain(&fs.exec)
        .chain(&fs.write)
        .chain(&fs.protected)
        .chain(writable)
        .chain(std::iter::once(&resolved.ctx.workdir))
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .collect();
    granted.extend(points.iter().cloned());
    let holds_grant = |p: &Path| granted.iter().any(|g| g.starts_with(p));
    let mut homes: Vec<PathBuf> = vec![
        resolved.ctx.home.clone(),
        "/root".into(),
        "/run/user".into(),
    ];
    if let Ok(rd) = std::fs::read_dir("/home") {
        homes.extend(rd.flatten().map(|e| e.path()).take(4096));
    }
    // `read_all` grants the whole filesystem but the secrets: homes included.
    if fs.read_all {
        homes.clear();
    }
    let mut out: Vec<(PathBuf, bool)> = Vec::new();
    let others = extra
        .iter()
        .chain(&homes)
        .filter_map(|p| std::fs::canonicalize(p).ok());
    for real in secrets.iter().cloned().chain(others) {
        let Ok(md) = std::fs::metadata(&real) else {
            continue;
        };
        // Nothing that holds a grant (the policy crate refuses grants inside secret
        // locations, so for those only the workspace or a runner's extra can).
        if holds_grant(&real) || real == Path::new("/") || !(md.is_dir() || md.is_file()) {
            continue;
        }
        if out.iter().any(|(o, _)| real.starts_with(o)) {
            continue;
        }
        out.retain(|(o, _)| !o.starts_with(&real));
        out.push((real, md.is_dir()));
    }
    out
}

/// The directory a `.git` file (`gitdir: PATH`, relative to the file's directory or
/// absolute) points at, canonical; `None` for anything else.
fn gitfile_target(dotgit: &Path) -> Option<PathBuf> {
    if dotgit.file_name()? != ".git" || !std::fs::symlink_metadata(dotgit).ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    use std::io::Read;
    std::fs::File::open(dotgit)
        .ok()?
        .take(4096)
        .read_to_string(&mut text)
        .ok()?;
    let target = text.lines().next()?.strip_prefix("gitdir:")?.trim();
    let real = std::fs::canonicalize(dotgit.parent()?.join(target)).ok()?;
    real.is_dir().then_some(real)
}

/// Directories strictly between the innermost writable tree containing a protected path and
/// that path, outermost first, each once.
fn pinned_ancestors(protected: &[PathBuf], writable: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in protected {
        let Some(w) = writable
            .iter()
            .filter(|w| p.starts_with(w) && p != *w)
            .max_by_key(|w| w.components().count())
        else {
            continue;
        };
        let mut a = p.parent();
        while let Some(anc) = a {
            if anc == w.as_path() || !anc.starts_with(w) {
                break;
            }
            if !out.iter().any(|o| o == anc) {
                out.push(anc.to_path_buf());
            }
            a = anc.parent();
        }
    }
    out.sort_by_key(|p| p.components().count());
    out
}
