//! Union mounts: a bead namespace's union (DESIGN.md §7) at an absolute point such as `/ctx`
//! that does not exist on the host, as an overlayfs of the members' directories (read-only
//! lower layers, in search order) over the namespace's shadow layer (the upper layer, where
//! every write and copy-up lands).
//!
//! The host's `/` has no such directory, and the sandbox's `/` is the host's, read-only; so a
//! run with unions gets a new root (`MountStep::NewRoot`): a small read-only tmpfs with one
//! entry per entry of the host's `/` (directories and files bound from the host with their
//! submounts, symlinks recreated) and one empty directory per point, `pivot_root`ed into
//! before every other step, which therefore sees the same absolute paths as without it.
//!
//! What the parent checks here (each refusal is [`SandboxError::Union`], naming the point):
//! the point is `/NAME` (one component, not an entry of the host's `/`, used once); every
//! layer is an absolute directory (resolved, symlinks followed; missing lower layers are
//! left out, but at least one must exist); `upper` and `work` are distinct, do not contain
//! each other, are on one filesystem, and overlap no lower layer and no writable tree of the
//! policy (the tool could otherwise bypass or corrupt the overlay through its own grant); no
//! layer is, lies inside or contains a secret location (the overlay's Landlock rule covers
//! everything beneath the point, so carve-outs would not apply there).

use crate::error::{SandboxError, cstr};
use crate::sys::{MAX_ROOT_ENTRIES, MountStep, RootEntry, RootKind};
use serde::Serialize;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// At most this many lower layers per union (overlayfs's limit).
pub const MAX_UNION_LOWERS: usize = 500;

/// Host directories the new root's tmpfs may be mounted on while it is filled (the first
/// that is a real directory; it is hidden only in the old root, which is detached).
const STAGES: [&str; 7] = ["/tmp", "/mnt", "/srv", "/opt", "/var", "/home", "/usr"];

/// Options of the new root's tmpfs (it only holds directories, empty files and symlinks).
const ROOT_TMPFS_OPTIONS: &str = "size=1048576,nr_inodes=1024,mode=0755";

/// One union mount of a run ([`crate::RunRequest::unions`], recorded in
/// [`crate::MountRecord::unions`] with every path resolved).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnionMount {
    /// Where the tool sees the union: `/NAME`, one component, not an entry of the host's `/`.
    pub point: PathBuf,
    /// The read-only layers in search order (the first that has a name wins). For a bead
    /// namespace: each member in order, its newest dated folder, older dated folders, then
    /// the member directory itself.
    pub lowers: Vec<PathBuf>,
    /// The writable layer (the namespace's shadow layer): new files, changed files (copied
    /// up first) and whiteouts of removed names land here, never in a lower layer.
    pub upper: PathBuf,
    /// overlayfs's work directory: empty, on `upper`'s filesystem, used by no other mount.
    pub work: PathBuf,
}

fn refuse(point: &Path, reason: impl Into<String>) -> SandboxError {
    SandboxError::Union {
        point: point.to_path_buf(),
        reason: reason.into(),
    }
}

/// Both paths are equal or one contains the other.
fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// A directory, resolved; `None` if it does not exist.
fn directory(point: &Path, what: &str, p: &Path) -> Result<Option<PathBuf>, SandboxError> {
    if !p.is_absolute() {
        return Err(refuse(
            point,
            format!("{what} {} is not an absolute path", p.display()),
        ));
    }
    let real = match std::fs::canonicalize(p) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(refuse(
                point,
                format!("{what} {} cannot be resolved: {e}", p.display()),
            ));
        }
    };
    if !real.is_dir() {
        return Err(refuse(
            point,
            format!("{what} {} is not a directory", p.display()),
        ));
    }
    Ok(Some(real))
}

/// Refuses a set of union points unless each is `/NAME` (one component), given once, and not
/// an entry of the host's `/` (as [`crate::run`] and [`crate::Prepared::new_with_points`]
/// would), naming the first bad one.
pub fn check_points(points: &[PathBuf]) -> Result<(), SandboxError> {
    for (i, p) in points.iter().enumerate() {
        check_point(p, points[..i].iter().map(PathBuf::as_path))?;
    }
    Ok(())
}

/// Refuses a point that is not `/NAME` (one component), is one of `earlier`, or exists in
/// the host's `/`.
pub(crate) fn check_point<'a>(
    point: &Path,
    mut earlier: impl Iterator<Item = &'a Path>,
) -> Result<(), SandboxError> {
    let comps: Vec<Component<'_>> = point.components().collect();
    let name = match comps.as_slice() {
        [Component::RootDir, Component::Normal(n)] => *n,
        _ => return Err(refuse(point, "a point must be /NAME (one component)")),
    };
    if point.as_os_str().as_bytes() != [b"/", name.as_bytes()].concat().as_slice() {
        return Err(refuse(point, "a point must be /NAME (one component)"));
    }
    if earlier.any(|o| o == point) {
        return Err(refuse(point, "the point is given twice"));
    }
    if std::fs::symlink_metadata(point).is_ok() {
        return Err(refuse(
            point,
            "the point exists in the host's /; unions go at new top-level names",
        ));
    }
    Ok(())
}

/// Checks `unions` against the policy's `secrets` and `writable` trees (both resolved) and
/// returns them resolved, missing lower layers left out.
pub(crate) fn validate(
    unions: &[UnionMount],
    secrets: &[PathBuf],
    writable: &[PathBuf],
) -> Result<Vec<UnionMount>, SandboxError> {
    let mut out: Vec<UnionMount> = Vec::new();
    for u in unions {
        let point = &u.point;
        check_point(point, out.iter().map(|o| o.point.as_path()))?;
        if u.lowers.len() > MAX_UNION_LOWERS {
            return Err(refuse(
                point,
                format!("more than {MAX_UNION_LOWERS} lower layers"),
            ));
        }
        let missing =
            |what: &str, p: &Path| refuse(point, format!("{what} {} does not exist", p.display()));
        let upper =
            directory(point, "upper", &u.upper)?.ok_or_else(|| missing("upper", &u.upper))?;
        let work = directory(point, "work", &u.work)?.ok_or_else(|| missing("work", &u.work))?;
        let mut lowers: Vec<PathBuf> = Vec::new();
        for l in &u.lowers {
            if let Some(real) = directory(point, "lower", l)?
                && !lowers.contains(&real)
            {
                lowers.push(real);
            }
        }
        if lowers.is_empty() {
            return Err(refuse(point, "no lower layer exists"));
        }
        if overlaps(&upper, &work) {
            return Err(refuse(
                point,
                "upper and work must be distinct and not inside each other",
            ));
        }
        let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
        if dev(&upper).is_none() || dev(&upper) != dev(&work) {
            return Err(refuse(point, "upper and work must be on one filesystem"));
        }
        for l in &lowers {
            if overlaps(l, &upper) || overlaps(l, &work) {
                return Err(refuse(
                    point,
                    format!("lower {} overlaps upper or work", l.display()),
                ));
            }
        }
        for p in [&upper, &work] {
            if let Some(w) = writable.iter().find(|w| overlaps(p, w)) {
                return Err(refuse(
                    point,
                    format!(
                        "{} overlaps the writable tree {}: the shadow layer must be reachable only through the union",
                        p.display(),
                        w.display()
                    ),
                ));
            }
        }
        for p in lowers.iter().chain([&upper, &work]) {
            if let Some(s) = secrets.iter().find(|s| overlaps(p, s)) {
                return Err(refuse(
                    point,
                    format!(
                        "{} overlaps the secret location {}",
                        p.display(),
                        s.display()
                    ),
                ));
            }
        }
        // Union layers of different points must not share upper or work directories.
        for o in &out {
            if overlaps(&o.upper, &upper)
                || overlaps(&o.work, &work)
                || overlaps(&o.upper, &work)
                || overlaps(&o.work, &upper)
            {
                return Err(refuse(
                    point,
                    format!("upper or work overlaps those of {}", o.point.display()),
                ));
            }
        }
        out.push(UnionMount {
            point: point.clone(),
            lowers,
            upper,
            work,
        });
    }
    Ok(out)
}

fn c(p: &Path) -> Result<CString, SandboxError> {
    cstr(p.as_os_str().as_bytes(), "union path")
}

/// Name of the empty directory the new root holds for padding merges.
const EMPTY_NAME: &str = ".ollie-empty";

/// The top-level name a merge of union `u`'s lowers is attached at in the new root.
fn merge_name(u: usize, m: usize) -> String {
    format!(".ollie-merge-{u}-{m}")
}

/// overlayfs refuses a lower layer inside another lower layer of the same mount (ELOOP):
/// a bead's dated folders lie inside the bead. Runs of consecutive lowers that lie inside
/// another lower of the union are therefore merged first, each into a read-only overlay of
/// their own (padded with an empty directory: a lower-only overlay needs two layers), which
/// then stands for them in the union; the search order is unchanged. Returns, per lower
/// position of the union, the merge it belongs to (`Some(m)`) or `None` (used directly).
fn merge_runs(lowers: &[PathBuf]) -> Vec<Option<usize>> {
    let nested = |i: usize| {
        lowers
            .iter()
            .enumerate()
            .any(|(j, o)| j != i && lowers[i].starts_with(o) && lowers[i] != *o)
    };
    let mut out = Vec::with_capacity(lowers.len());
    let mut next = 0usize;
    let mut open = false;
    for i in 0..lowers.len() {
        if nested(i) {
            if !open {
                open = true;
                next += 1;
            }
            out.push(Some(next - 1));
        } else {
            open = false;
            out.push(None);
        }
    }
    out
}

/// The merges of `lowers` ([`merge_runs`]): each one's layers in order.
fn merges(lowers: &[PathBuf]) -> Vec<Vec<PathBuf>> {
    let mut out: Vec<Vec<PathBuf>> = Vec::new();
    for (l, m) in lowers.iter().zip(merge_runs(lowers)) {
        if let Some(m) = m {
            if out.len() <= m {
                out.push(Vec::new());
            }
            out[m].push(l.clone());
        }
    }
    out
}

/// The step that builds the new root for `unions` (validated): the host's `/` as listed now,
/// plus one empty directory per point and per merge. `root_access`: see
/// [`MountStep::NewRoot`].
pub(crate) fn new_root_step(
    unions: &[UnionMount],
    root_access: u64,
) -> Result<MountStep, SandboxError> {
    let mut points: Vec<PathBuf> = Vec::new();
    for (ui, u) in unions.iter().enumerate() {
        points.push(u.point.clone());
        for m in 0..merges(&u.lowers).len() {
            points.push(Path::new("/").join(merge_name(ui, m)));
        }
    }
    if unions.iter().any(|u| !merges(&u.lowers).is_empty()) {
        points.push(Path::new("/").join(EMPTY_NAME));
    }
    root_step(&points, unions.len(), root_access)
}

/// The new root of a prepared session whose calls mount unions at `points` (checked with
/// [`check_point`]): the host's `/` as listed now, one empty directory per point, and the
/// empty directory that pads merges. Each call mounts its own overlays there
/// ([`call_entries`]).
pub(crate) fn session_root_step(
    points: &[PathBuf],
    root_access: u64,
) -> Result<MountStep, SandboxError> {
    let mut all = points.to_vec();
    all.push(Path::new("/").join(EMPTY_NAME));
    root_step(&all, points.len(), root_access)
}

/// The new root: the host's `/` as listed now, plus an empty directory at each of `points`
/// (`/NAME`, `unions` of which are union points).
fn root_step(
    points: &[PathBuf],
    unions: usize,
    root_access: u64,
) -> Result<MountStep, SandboxError> {
    let root = Path::new("/");
    let io = |e: std::io::Error| SandboxError::Io {
        op: "list the host's root directory",
        source: e,
    };
    let mut names: Vec<std::ffi::OsString> = std::fs::read_dir(root)
        .map_err(io)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(io)?;
    names.sort();
    let mut entries = Vec::new();
    for name in names {
        let source = root.join(&name);
        let Ok(md) = std::fs::symlink_metadata(&source) else {
            continue;
        };
        let kind = if md.file_type().is_symlink() {
            match std::fs::read_link(&source) {
                Ok(t) => RootKind::Symlink(c(&t)?),
                Err(_) => continue,
            }
        } else if md.is_dir() {
            RootKind::Dir
        } else {
            RootKind::File
        };
        entries.push(RootEntry {
            name: c(Path::new(&name))?,
            source: c(&source)?,
            kind,
        });
    }
    for p in points {
        let name = p.strip_prefix(root).unwrap_or(p);
        entries.push(RootEntry {
            name: c(name)?,
            source: c(p)?,
            kind: RootKind::Point,
        });
    }
    if entries.len() > MAX_ROOT_ENTRIES {
        return Err(SandboxError::InvalidRequest {
            reason: format!(
                "the host's / has more than {} entries: no new root for unions",
                MAX_ROOT_ENTRIES.saturating_sub(unions)
            ),
        });
    }
    let stage = STAGES
        .iter()
        .map(Path::new)
        .find(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .ok_or_else(|| SandboxError::InvalidRequest {
            reason: format!(
                "no directory to build the new root on (one of {})",
                STAGES.join(", ")
            ),
        })?;
    Ok(MountStep::NewRoot {
        stage: c(stage)?,
        options: cstr(ROOT_TMPFS_OPTIONS.as_bytes(), "tmpfs options")?,
        entries,
        root_rule_access: root_access,
    })
}

/// The steps that create (before `ReadOnlyAll`) and attach (after it) the overlays of
/// `unions`, in slots from `first_slot`; `rule_access` is granted beneath each point.
pub(crate) fn overlay_steps(
    unions: &[UnionMount],
    first_slot: usize,
    rule_access: u64,
) -> Result<(Vec<MountStep>, Vec<MountStep>), SandboxError> {
    let mut create = Vec::new();
    let mut attach = Vec::new();
    for (i, u) in unions.iter().enumerate() {
        let slot = first_slot + i;
        // Nested lowers go through their merges (attached in the new root first).
        for (m, layers) in merges(&u.lowers).iter().enumerate() {
            let mut lowers = layers.iter().map(|l| c(l)).collect::<Result<Vec<_>, _>>()?;
            lowers.push(c(&Path::new("/").join(EMPTY_NAME))?);
            create.push(MountStep::MergeCreate {
                lowers,
                at: c(&Path::new("/").join(merge_name(i, m)))?,
            });
        }
        let runs = merge_runs(&u.lowers);
        let mut lowers = Vec::new();
        for (k, l) in u.lowers.iter().enumerate() {
            match runs[k] {
                None => lowers.push(c(l)?),
                // The merge stands for its whole run, once, where the run starts.
                Some(m) if k == 0 || runs[k - 1] != Some(m) => {
                    lowers.push(c(&Path::new("/").join(merge_name(i, m)))?);
                }
                Some(_) => {}
            }
        }
        create.push(MountStep::UnionCreate {
            lowers,
            upper: c(&u.upper)?,
            work: c(&u.work)?,
            slot,
        });
        attach.push(MountStep::UnionAttach {
            slot,
            point: c(&u.point)?,
            rule_access,
        });
    }
    Ok((create, attach))
}

/// The entries of a prepared call that mounts `unions` (validated) in its own mount namespace
/// (`sys::mount_call_unions` says what each kind does): first every directory of `hidden`
/// (the session's hidden paths) that holds a layer, then per union its base, upper and work,
/// its lowers (`m` for those of a merge, see [`merge_runs`]), and its point. The upper and
/// work layers must lie on the mount of the directory that holds them both.
pub(crate) fn call_entries(
    unions: &[UnionMount],
    hidden: &[PathBuf],
) -> Result<Vec<Vec<u8>>, SandboxError> {
    let entry = |kind: u8, p: &Path| {
        let b = p.as_os_str().as_bytes();
        let mut v = Vec::with_capacity(b.len() + 1);
        v.push(kind);
        v.extend_from_slice(b);
        v
    };
    let layers = || {
        unions
            .iter()
            .flat_map(|u| u.lowers.iter().chain([&u.upper, &u.work]))
    };
    let mut out: Vec<Vec<u8>> = hidden
        .iter()
        .filter(|h| layers().any(|l| l.starts_with(h)))
        .map(|h| entry(b'h', h))
        .collect();
    if out.len() > crate::sys::MAX_CALL_UNCOVER {
        return Err(SandboxError::InvalidRequest {
            reason: format!(
                "union layers lie in more than {} hidden directories",
                crate::sys::MAX_CALL_UNCOVER
            ),
        });
    }
    for u in unions {
        let base = u
            .upper
            .ancestors()
            .find(|a| u.work.starts_with(a))
            .unwrap_or(Path::new("/"));
        let mount = mount_id(base);
        if mount.is_none() || mount != mount_id(&u.upper) || mount != mount_id(&u.work) {
            return Err(refuse(
                &u.point,
                format!(
                    "upper and work must lie on the mount of {}, which holds them both",
                    base.display()
                ),
            ));
        }
        out.push(entry(b'b', base));
        for (kind, p) in [(b'u', &u.upper), (b'k', &u.work)] {
            out.push(entry(kind, p.strip_prefix(base).unwrap_or(p)));
        }
        for (l, m) in u.lowers.iter().zip(merge_runs(&u.lowers)) {
            out.push(entry(if m.is_some() { b'm' } else { b'l' }, l));
        }
        out.push(entry(b'U', &u.point));
    }
    if out.len() > crate::sys::MAX_UNION_ENTRIES {
        return Err(SandboxError::InvalidRequest {
            reason: format!(
                "the unions have too many layers for a prepared call ({} entries, at most {})",
                out.len(),
                crate::sys::MAX_UNION_ENTRIES
            ),
        });
    }
    Ok(out)
}

/// The id of the mount `p` is on, if it can be read.
fn mount_id(p: &Path) -> Option<u64> {
    crate::sys::mount_id(&c(p).ok()?)
}

/// The default secret locations of `ctx`'s home, resolved where they exist. Not the
/// runner's extra ones: those are its `hidden` paths, where its union layers live (olliesrv's
/// beads are in its state directory); [`call_entries`] hides them again around the layers.
pub(crate) fn resolved_secrets(ctx: &ollie_policy::ResolveContext) -> Vec<PathBuf> {
    ollie_policy::secrets::secret_locations(&ctx.home)
        .into_iter()
        .map(|s| std::fs::canonicalize(&s).unwrap_or(s))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn nested_lowers_are_merged_in_runs_keeping_the_order() {
        let p = |s: &str| PathBuf::from(s);
        let lowers = vec![
            p("/b/m1/2026-11-30"),
            p("/b/m1/2026-11-29"),
            p("/b/m1"),
            p("/b/m2/2026-01-01"),
            p("/b/m2"),
            p("/b/m3"),
        ];
        assert_eq!(
            merge_runs(&lowers),
            vec![Some(0), Some(0), None, Some(1), None, None]
        );
        assert_eq!(
            merges(&lowers),
            vec![
                vec![p("/b/m1/2026-11-30"), p("/b/m1/2026-11-29")],
                vec![p("/b/m2/2026-01-01")]
            ]
        );
        assert!(merges(&[p("/a"), p("/b")]).is_empty());
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ollie-unions-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for s in ["A", "B", "U", "W"] {
            std::fs::create_dir_all(d.join(s)).unwrap();
        }
        d
    }

    fn union(d: &Path, point: &str) -> UnionMount {
        UnionMount {
            point: PathBuf::from(point),
            lowers: vec![d.join("A"), d.join("missing"), d.join("B"), d.join("A")],
            upper: d.join("U"),
            work: d.join("W"),
        }
    }

    fn reason(r: Result<Vec<UnionMount>, SandboxError>) -> String {
        match r {
            Err(SandboxError::Union { reason, .. }) => reason,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn validation_resolves_and_refuses() {
        let d = tmp("validate");
        let ok = validate(&[union(&d, "/ollie-ctx-test")], &[], &[]).unwrap();
        let real = std::fs::canonicalize(&d).unwrap();
        assert_eq!(ok[0].lowers, vec![real.join("A"), real.join("B")]);
        for bad in ["/", "/a/b", "ctx", "/ctx/", "/ctx/.", "/tmp", "/.."] {
            assert!(
                reason(validate(&[union(&d, bad)], &[], &[])).contains("point"),
                "{bad}"
            );
        }
        let twice = [union(&d, "/ollie-x"), union(&d, "/ollie-x")];
        assert!(reason(validate(&twice, &[], &[])).contains("twice"));
        let mut u = union(&d, "/ollie-x");
        u.work = d.join("U");
        assert!(reason(validate(&[u], &[], &[])).contains("distinct"));
        let mut u = union(&d, "/ollie-x");
        u.lowers = vec![d.clone()];
        assert!(reason(validate(&[u], &[], &[])).contains("overlaps upper"));
        let mut u = union(&d, "/ollie-x");
        u.lowers = vec![d.join("none")];
        assert!(reason(validate(&[u], &[], &[])).contains("no lower"));
        let mut u = union(&d, "/ollie-x");
        u.lowers = vec![PathBuf::from("A")];
        assert!(reason(validate(&[u], &[], &[])).contains("absolute"));
        assert!(
            reason(validate(
                &[union(&d, "/ollie-x")],
                &[],
                std::slice::from_ref(&real)
            ))
            .contains("writable tree")
        );
        assert!(
            reason(validate(
                &[union(&d, "/ollie-x")],
                &[real.join("B/.ssh")],
                &[]
            ))
            .contains("secret")
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn new_root_lists_the_host_root_and_the_points() {
        let d = tmp("root");
        let u = validate(&[union(&d, "/ollie-ctx-test")], &[], &[]).unwrap();
        let MountStep::NewRoot { entries, .. } = new_root_step(&u, 0).unwrap() else {
            panic!("not a new root");
        };
        let names: Vec<&[u8]> = entries.iter().map(|e| e.name.as_bytes()).collect();
        for n in [&b"usr"[..], b"proc", b"dev", b"tmp", b"ollie-ctx-test"] {
            assert!(names.contains(&n), "{:?}", String::from_utf8_lossy(n));
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
