//! The mount plan, shared by one-shot runs (one mount namespace per run) and prepared
//! sandboxes (one per session): what the init stage or the zygote mounts, and the record of
//! it.

use crate::landlock;
use crate::placeholder::Protected;
use crate::spawn::{cstr, io_err};
use crate::sys::{self, MountStep};
use crate::unions::{self, UnionMount};
use crate::{MountRecord, SandboxError};
use ollie_policy::ResolvedPolicy;
use std::path::{Path, PathBuf};

/// Where the private shared-memory tmpfs goes.
const SHM_DIR: &str = "/dev/shm";
/// Upper bound on inodes of the private `/dev/shm`.
const SHM_INODES: u64 = 16384;

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
    /// With `unions` (validated, [`unions::validate`]) the root is first replaced by a new one
    /// holding the points ([`MountStep::NewRoot`]; `root_access` is the ruleset's
    /// [`landlock::Ruleset::root_access`]); each overlay is created before everything goes
    /// read-only and attached after, with the read-write rights beneath its point.
    ///
    /// A run approved unsandboxed ([`ResolvedPolicy::unsandboxed`]) mounts nothing: its
    /// mount namespace only has its propagation made private, so the tool sees (and may
    /// write, as far as file permissions allow) the host's filesystem as it is, with no
    /// read-only root, islands or private `/dev/shm`; the record says so.
    pub(crate) fn new(
        resolved: &ResolvedPolicy,
        writable: Vec<PathBuf>,
        abi: u32,
        unions: &[UnionMount],
        root_access: u64,
    ) -> Result<MountPlan, SandboxError> {
        let mut steps = vec![MountStep::MakePrivate];
        if !unions.is_empty() {
            steps.push(unions::new_root_step(unions, root_access)?);
        }
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
                    unions: unions.to_vec(),
                },
                islands: Protected::default(),
            });
        }
        // Protected islands: existing ones are bound read-only; for missing ones the first
        // missing component is created as an empty placeholder and bound read-only.
        let islands = Protected::prepare(&resolved.fs.protected, &writable)?;
        let mut protected: Vec<PathBuf> = islands.paths.clone();
        // Secret locations inside a writable tree (e.g. a workspace that is $HOME) are carved
        // out of the Landlock grant; bind them read-only too, so their metadata (chmod ~/.ssh)
        // is safe.
        for s in ollie_policy::secrets::secret_locations(&resolved.ctx.home) {
            if let Ok(real) = std::fs::canonicalize(&s)
                && writable.iter().any(|w| real.starts_with(w) && &real != w)
                && !protected.contains(&real)
            {
                protected.push(real);
            }
        }
        let c = |p: &Path| sys::cstring(p).map_err(io_err("prepare mounts"));
        let pinned = pinned_ancestors(&protected, &writable);
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
        for (slot, w) in writable.iter().enumerate() {
            steps.push(MountStep::Attach { slot, path: c(w)? });
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
        // A private /dev/shm (POSIX shared memory, semaphores): never the host's, never
        // another run's or session's. Mounted last, so it is writable while everything around
        // it is read-only.
        let l = resolved.policy.limits;
        let private_shm = match std::fs::canonicalize(SHM_DIR) {
            Ok(real) if l.shm_bytes > 0 && real.is_dir() => {
                steps.push(MountStep::PrivateTmpfs {
                    path: c(&real)?,
                    options: cstr(
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
            steps,
            record: MountRecord {
                read_only_root: true,
                writable,
                protected,
                placeholders: islands.placeholders.clone(),
                private_shm,
                unions: unions.to_vec(),
            },
            islands,
        })
    }
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
