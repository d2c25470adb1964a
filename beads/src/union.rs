//! Union views over real directories: lookup, listing, create, write, remove, rename, and the
//! move of shadow-layer files into a newly pinned create target.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::libc;

use crate::Error;
use crate::authority::{WriteDecision, write_authority};
use crate::clock::utc_today;
use crate::layout::{Kind, kind_sources};
use crate::names::parse_point;
use crate::namespace::{Env, Namespace, Point};
use crate::store::{
    copy_atomic, create_dir_private, create_new_file, ensure_dir_private, sync_dir,
};

/// Which layer of a union view a name came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layer {
    /// The namespace's own shadow layer for the point (the chat's emissions).
    Shadow,
    /// A member bead.
    Member {
        /// Its index in the point's search order (0 = searched first).
        index: usize,
        /// Its name at the point.
        name: String,
        /// Its URI.
        uri: String,
        /// Whether it is the point's create target.
        create: bool,
    },
}

impl Layer {
    fn describe(&self) -> String {
        match self {
            Layer::Shadow => "the shadow layer".to_string(),
            Layer::Member { name, .. } => format!("bead {name}"),
        }
    }
}

/// A regular file or a directory (other file types are never shown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
}

/// Where a name of a union view really is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The real path (symlinks inside the layer resolved).
    pub path: PathBuf,
    /// The layer it is in.
    pub layer: Layer,
    /// File or directory.
    pub node: NodeKind,
}

impl Resolved {
    /// Opens the real file for reading (and writing), never following a symlink at the last
    /// component. Writing is only sound on a [`Resolved`] returned by
    /// [`Namespace::open_write`] or [`Namespace::create`].
    pub fn open(&self, write: bool) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&self.path)
    }
}

/// One entry of a union directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The name.
    pub name: String,
    /// File or directory.
    pub node: NodeKind,
    /// The layer whose entry won.
    pub layer: Layer,
    /// The real path of the winning entry.
    pub path: PathBuf,
}

/// A file moved from the shadow layer into the create target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// Its path in the view (`notes/x.md`).
    pub rel: String,
    /// Where it is now.
    pub to: PathBuf,
}

/// A file that stayed in the shadow layer, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Its path in the view (`notes/x.md`).
    pub rel: String,
    /// Why it stayed (one line).
    pub reason: String,
}

/// What [`Namespace::settle`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettleReport {
    /// Files moved into the create target.
    pub moved: Vec<Moved>,
    /// Files left in the shadow layer.
    pub kept: Vec<Kept>,
}

/// The layers of one point as an overlay mount ([`Namespace::overlay_layers`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlayLayers {
    /// The mount point, e.g. `/ctx`.
    pub point: String,
    /// Read-only layers, highest priority first.
    pub lowers: Vec<PathBuf>,
    /// The shadow layer.
    pub upper: PathBuf,
    /// An empty directory beside the shadow layer, for overlayfs.
    pub work: PathBuf,
}

/// Whether a hit may be changed in place.
enum Access {
    Writable,
    ReadOnly,
    NoAuthority(String),
}

/// One existing name in one layer.
#[derive(Debug, Clone)]
struct Hit {
    /// Index into `View::layers`.
    layer: usize,
    /// The name itself in its (real) parent directory: what remove and rename act on.
    name_path: PathBuf,
    /// The real object (symlink resolved).
    real: PathBuf,
    node: NodeKind,
}

struct LayerRoot {
    layer: Layer,
    /// Canonical root directory; `None` when a member's bead directory is missing.
    root: Option<PathBuf>,
}

/// A point's layers, bound to the filesystem for one operation.
struct View<'a> {
    env: &'a Env,
    point: &'a Point,
    /// `layers[0]` is the shadow layer, `layers[i + 1]` is member `i`.
    layers: Vec<LayerRoot>,
}

/// Splits a path inside a view into components, refusing absolute paths, `.`, `..`, empty
/// components and NUL. `""` (and `"/"`-free trailing slashes) are allowed.
fn parse_rel(rel: &str) -> Result<Vec<&str>, Error> {
    let bad = |reason| Error::InvalidPath {
        path: rel.to_string(),
        reason,
    };
    if rel.contains('\0') {
        return Err(bad("contains NUL"));
    }
    if rel.starts_with('/') {
        return Err(bad(
            "absolute paths are not allowed (paths are relative to the point)",
        ));
    }
    let trimmed = rel.strip_suffix('/').unwrap_or(rel);
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let comps: Vec<&str> = trimmed.split('/').collect();
    for c in &comps {
        match *c {
            "" => return Err(bad("empty path component")),
            "." | ".." => return Err(bad("`.` and `..` are not allowed")),
            _ => {}
        }
    }
    Ok(comps)
}

fn is_not_found(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

impl<'a> View<'a> {
    fn new(ns: &'a Namespace, env: &'a Env, point: &str) -> Result<View<'a>, Error> {
        let path = parse_point(point)?;
        let point = ns
            .points()
            .iter()
            .find(|p| p.path() == path)
            .ok_or(Error::UnknownPoint { point: path })?;
        let shadow = env.shadow_root.join(point.dir_name());
        ensure_dir_private(&shadow)?;
        for kind in Kind::ALL {
            ensure_dir_private(&shadow.join(kind.as_str()))?;
        }
        let shadow = fs::canonicalize(&shadow).map_err(|e| Error::io("resolve", &shadow, e))?;
        let mut layers = vec![LayerRoot {
            layer: Layer::Shadow,
            root: Some(shadow),
        }];
        for (index, m) in point.members().iter().enumerate() {
            let root = fs::canonicalize(m.bead().dir()).ok().filter(|p| p.is_dir());
            layers.push(LayerRoot {
                layer: Layer::Member {
                    index,
                    name: m.name().to_string(),
                    uri: m.bead().uri(),
                    create: m.create(),
                },
                root,
            });
        }
        Ok(View { env, point, layers })
    }

    fn view_path(&self, comps: &[&str]) -> String {
        if comps.is_empty() {
            self.point.path().to_string()
        } else {
            format!("{}/{}", self.point.path(), comps.join("/"))
        }
    }

    fn is_member(&self, layer: usize) -> bool {
        layer > 0
    }

    fn root(&self, layer: usize) -> Option<&Path> {
        self.layers.get(layer).and_then(|l| l.root.as_deref())
    }

    fn resolved(&self, hit: &Hit) -> Resolved {
        Resolved {
            path: hit.real.clone(),
            layer: self.layers[hit.layer].layer.clone(),
            node: hit.node,
        }
    }

    /// Looks at one candidate path of one layer. Missing names, dangling symlinks and
    /// non-regular files are `None`; a symlink that resolves outside the layer is refused.
    fn probe(&self, layer: usize, cand: PathBuf, view: &str) -> Result<Option<Hit>, Error> {
        let Some(root) = self.root(layer) else {
            return Ok(None);
        };
        let md = match fs::symlink_metadata(&cand) {
            Ok(md) => md,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(Error::io("stat", &cand, e)),
        };
        let (real, md) = if md.file_type().is_symlink() {
            let real = match fs::canonicalize(&cand) {
                Ok(r) => r,
                Err(e) if is_not_found(&e) => return Ok(None),
                Err(e) => return Err(Error::io("resolve", &cand, e)),
            };
            if !real.starts_with(root) {
                return Err(Error::Denied {
                    path: view.to_string(),
                    reason: format!(
                        "it is a symlink that leaves {}",
                        self.layers[layer].layer.describe()
                    ),
                });
            }
            let md = fs::metadata(&real).map_err(|e| Error::io("stat", &real, e))?;
            (real, md)
        } else {
            (cand.clone(), md)
        };
        let node = if md.is_dir() {
            NodeKind::Dir
        } else if md.is_file() {
            NodeKind::File
        } else {
            return Ok(None);
        };
        Ok(Some(Hit {
            layer,
            name_path: cand,
            real,
            node,
        }))
    }

    /// The layer roots as directory hits (the point itself).
    fn roots(&self, include: &dyn Fn(usize) -> bool) -> Vec<Hit> {
        (0..self.layers.len())
            .filter(|i| include(*i))
            .filter_map(|i| {
                self.root(i).map(|r| Hit {
                    layer: i,
                    name_path: r.to_path_buf(),
                    real: r.to_path_buf(),
                    node: NodeKind::Dir,
                })
            })
            .collect()
    }

    /// Every existing object named `comps`, in search order (the first is the winner). At each
    /// step only layers whose object is a directory continue, and only if the winner of that
    /// step is a directory. Members show `notes/`, `skills/`, `artifacts/` at their top level
    /// as the merge of `<date>/<kind>/` (newest first) and `<kind>/`.
    fn walk(&self, comps: &[&str], include: &dyn Fn(usize) -> bool) -> Result<Vec<Hit>, Error> {
        let mut branches = self.roots(include);
        for (i, c) in comps.iter().enumerate() {
            let view = self.view_path(&comps[..=i]);
            let mut next = Vec::new();
            for b in &branches {
                let kind = (i == 0 && self.is_member(b.layer))
                    .then(|| Kind::from_name(c))
                    .flatten();
                let cands = match kind {
                    Some(k) => kind_sources(&b.real, k),
                    None => vec![b.real.join(c)],
                };
                for cand in cands {
                    if let Some(h) = self.probe(b.layer, cand, &view)? {
                        next.push(h);
                    }
                }
            }
            let Some(winner) = next.first() else {
                return Err(Error::NotFound { path: view });
            };
            if i + 1 == comps.len() {
                return Ok(next);
            }
            if winner.node != NodeKind::Dir {
                return Err(Error::NotDir { path: view });
            }
            next.retain(|h| h.node == NodeKind::Dir);
            branches = next;
        }
        Ok(branches)
    }

    fn walk_all(&self, comps: &[&str]) -> Result<Vec<Hit>, Error> {
        self.walk(comps, &|_| true)
    }

    /// Fails unless the parent of `comps` is a directory of the view.
    fn check_parent(&self, comps: &[&str]) -> Result<(), Error> {
        if comps.len() > 1 {
            let parent = &comps[..comps.len() - 1];
            let hits = self.walk_all(parent)?;
            if hits.first().map(|h| h.node) != Some(NodeKind::Dir) {
                return Err(Error::NotDir {
                    path: self.view_path(parent),
                });
            }
        }
        Ok(())
    }

    /// Fails with `Exists` if the view has `comps`.
    fn check_absent(&self, comps: &[&str]) -> Result<(), Error> {
        match self.walk_all(comps) {
            Ok(_) => Err(Error::Exists {
                path: self.view_path(comps),
            }),
            Err(Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn authority(&self, member: usize) -> Result<WriteDecision, Error> {
        let bead = self.point.members()[member].bead();
        write_authority(bead, self.env.uid)
    }

    /// Whether `hit` (for the view path `comps`) may be changed in place: anything in the shadow
    /// layer; in the create target only under a kind folder the caller has authority over.
    fn access(&self, hit: &Hit, comps: &[&str]) -> Result<Access, Error> {
        let Layer::Member { index, create, .. } = &self.layers[hit.layer].layer else {
            return Ok(Access::Writable);
        };
        let kind = comps.first().and_then(|c| Kind::from_name(c));
        let (true, Some(kind)) = (*create, kind) else {
            return Ok(Access::ReadOnly);
        };
        match self.authority(*index)? {
            d if d.allows(kind) => Ok(Access::Writable),
            WriteDecision::Deny(reason) => Ok(Access::NoAuthority(reason)),
            WriteDecision::Allow(_) => Ok(Access::NoAuthority(format!(
                "{kind}/ is not delegated to uid {}",
                self.env.uid
            ))),
        }
    }

    fn refuse(&self, hit: &Hit, comps: &[&str], access: Access) -> Error {
        let path = self.view_path(comps);
        match (access, &self.layers[hit.layer].layer) {
            (Access::NoAuthority(reason), Layer::Member { uri, .. }) => Error::NoWriteAuthority {
                uri: uri.clone(),
                reason,
            },
            (_, Layer::Member { name, uri, .. }) => Error::ReadOnly {
                path,
                bead: name.clone(),
                uri: uri.clone(),
            },
            (_, Layer::Shadow) => Error::Denied {
                path,
                reason: "not writable".into(),
            },
        }
    }

    /// Where a new `comps` goes: the create target's `<today>/<kind>/…` for a path under a
    /// kind folder when a target is pinned (authority checked), else the shadow layer.
    /// Returns the layer and the components below its root.
    fn route(&self, comps: &[&str]) -> Result<(usize, Vec<String>), Error> {
        let kind = comps.first().and_then(|c| Kind::from_name(c));
        if let (Some(kind), Some((index, member))) = (kind, self.point.create_target()) {
            let layer = index + 1;
            if self.root(layer).is_none() {
                return Err(Error::NotABead {
                    path: member.bead().dir().to_path_buf(),
                    reason: "the create target's directory is missing",
                });
            }
            match self.authority(index)? {
                d if d.allows(kind) => {}
                WriteDecision::Deny(reason) => {
                    return Err(Error::NoWriteAuthority {
                        uri: member.bead().uri(),
                        reason,
                    });
                }
                WriteDecision::Allow(_) => {
                    return Err(Error::NoWriteAuthority {
                        uri: member.bead().uri(),
                        reason: format!("{kind}/ is not delegated to uid {}", self.env.uid),
                    });
                }
            }
            let mut sub = vec![utc_today(), kind.as_str().to_string()];
            sub.extend(comps[1..].iter().map(|s| s.to_string()));
            return Ok((layer, sub));
        }
        Ok((0, comps.iter().map(|s| s.to_string()).collect()))
    }

    /// Creates the directories `sub` below a layer's root, one component at a time, refusing
    /// symlinks and non-directories on the way. Returns the (real) directory.
    fn make_dirs(&self, layer: usize, sub: &[String], view: &str) -> Result<PathBuf, Error> {
        let Some(root) = self.root(layer) else {
            return Err(Error::NotFound {
                path: view.to_string(),
            });
        };
        let mut dir = root.to_path_buf();
        for c in sub {
            dir.push(c);
            match fs::symlink_metadata(&dir) {
                Ok(md) if md.is_dir() => {}
                Ok(md) if md.file_type().is_symlink() => {
                    return Err(Error::Denied {
                        path: view.to_string(),
                        reason: format!(
                            "{} has a symlink where a directory should be",
                            self.layers[layer].layer.describe()
                        ),
                    });
                }
                Ok(_) => {
                    return Err(Error::NotDir {
                        path: view.to_string(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => match create_dir_private(&dir) {
                    Ok(()) => {}
                    Err(Error::Io { source, .. })
                        if source.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(Error::io("stat", &dir, e)),
            }
        }
        Ok(dir)
    }

    fn place(&self, layer: usize, sub: &[String], view: &str) -> Result<(PathBuf, PathBuf), Error> {
        let (last, parents) = sub.split_last().ok_or_else(|| Error::InvalidPath {
            path: view.to_string(),
            reason: "empty path",
        })?;
        let dir = self.make_dirs(layer, parents, view)?;
        let target = dir.join(last);
        Ok((dir, target))
    }
}

fn refuse_kind_root(comps: &[&str], view: &str, what: &str) -> Result<(), Error> {
    if comps.is_empty() {
        return Err(Error::Denied {
            path: view.to_string(),
            reason: format!("the mount point itself cannot be {what}; use unmount"),
        });
    }
    if comps.len() == 1 && Kind::from_name(comps[0]).is_some() {
        return Err(Error::Denied {
            path: view.to_string(),
            reason: format!("kind folders cannot be {what}"),
        });
    }
    Ok(())
}

impl Namespace {
    /// The layers of `point` for an overlay mount (what sandboxed commands see at the point):
    /// the read-only `lowers` in search order — for each member, its dated folders newest
    /// first, then the member directory (so `notes/` merges like [`Namespace::lookup`]) —
    /// and the shadow layer as the writable `upper`, with an empty overlay work directory
    /// beside it (`<shadow_root>/.work-<name>`, created 0700). Members whose directory is
    /// missing are left out. Unlike this crate's view, the overlay also shows symlinks and
    /// special files, and a removal leaves a whiteout in the upper layer; files it creates
    /// under the kind folders reach the create target with [`Namespace::settle`].
    pub fn overlay_layers(&self, env: &Env, point: &str) -> Result<OverlayLayers, Error> {
        let view = View::new(self, env, point)?;
        let mut lowers = Vec::new();
        for layer in 1..view.layers.len() {
            if let Some(root) = view.root(layer) {
                for d in crate::layout::dated_dirs(root) {
                    lowers.push(root.join(d));
                }
                lowers.push(root.to_path_buf());
            }
        }
        let upper = view
            .root(0)
            .map(Path::to_path_buf)
            .ok_or(Error::UnknownPoint {
                point: point.to_string(),
            })?;
        let work = env
            .shadow_root
            .join(format!(".work-{}", view.point.dir_name()));
        crate::store::ensure_dir_private(&work)?;
        let work = fs::canonicalize(&work).map_err(|e| Error::io("resolve", &work, e))?;
        Ok(OverlayLayers {
            point: view.point.path().to_string(),
            lowers,
            upper,
            work,
        })
    }

    /// The first object named `rel` in the view of `point`: the shadow layer first, then the
    /// members in search order. `Ok(None)` when no layer has it. `""` is the point itself (the
    /// shadow layer's directory).
    pub fn lookup(&self, env: &Env, point: &str, rel: &str) -> Result<Option<Resolved>, Error> {
        let comps = parse_rel(rel)?;
        let view = View::new(self, env, point)?;
        match view.walk_all(&comps) {
            Ok(hits) => Ok(hits.first().map(|h| view.resolved(h))),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The union listing of the directory `rel`: every layer's entries, the first layer to
    /// have a name wins, sorted by name. Only layers whose `rel` is a directory contribute, and
    /// only when the winner is a directory (else `NotDir`). Names that are not UTF-8, symlinks
    /// leaving their layer and non-regular files are left out.
    pub fn read_dir(&self, env: &Env, point: &str, rel: &str) -> Result<Vec<Entry>, Error> {
        let comps = parse_rel(rel)?;
        let view = View::new(self, env, point)?;
        let hits = view.walk_all(&comps)?;
        if hits.first().map(|h| h.node) != Some(NodeKind::Dir) {
            return Err(Error::NotDir {
                path: view.view_path(&comps),
            });
        }
        let mut seen: BTreeMap<String, Entry> = BTreeMap::new();
        let add = |name: &str, hit: Hit, seen: &mut BTreeMap<String, Entry>| {
            seen.entry(name.to_string()).or_insert_with(|| Entry {
                name: name.to_string(),
                node: hit.node,
                layer: view.layers[hit.layer].layer.clone(),
                path: hit.real,
            });
        };
        for dir in hits.iter().filter(|h| h.node == NodeKind::Dir) {
            let member_top = comps.is_empty() && view.is_member(dir.layer);
            if member_top {
                for kind in Kind::ALL {
                    let view_path = view.view_path(&[kind.as_str()]);
                    let first = kind_sources(&dir.real, kind)
                        .into_iter()
                        .filter_map(|c| view.probe(dir.layer, c, &view_path).ok().flatten())
                        .find(|h| h.node == NodeKind::Dir);
                    if let Some(h) = first {
                        add(kind.as_str(), h, &mut seen);
                    }
                }
            }
            let rd = match fs::read_dir(&dir.real) {
                Ok(rd) => rd,
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(Error::io("list", &dir.real, e)),
            };
            for entry in rd.filter_map(Result::ok) {
                let Ok(name) = entry.file_name().into_string() else {
                    continue;
                };
                if seen.contains_key(&name) || (member_top && Kind::from_name(&name).is_some()) {
                    continue;
                }
                let mut sub = comps.clone();
                sub.push(&name);
                let view_path = view.view_path(&sub);
                if let Ok(Some(h)) = view.probe(dir.layer, entry.path(), &view_path) {
                    add(&name, h, &mut seen);
                }
            }
        }
        Ok(seen.into_values().collect())
    }

    /// Creates the file or directory `rel` (mode 0600 / 0700), which the view must not have
    /// yet and whose parent must be a directory of the view. A path under `notes/`, `skills/`
    /// or `artifacts/` lands in the create target's `<today>/<kind>/…` when one is pinned
    /// (write authority checked now), otherwise in the shadow layer; every other path lands in
    /// the shadow layer. Missing parent directories are made in the target layer.
    pub fn create(
        &self,
        env: &Env,
        point: &str,
        rel: &str,
        node: NodeKind,
    ) -> Result<Resolved, Error> {
        let comps = parse_rel(rel)?;
        let view = View::new(self, env, point)?;
        let vp = view.view_path(&comps);
        if comps.is_empty() {
            return Err(Error::Exists { path: vp });
        }
        view.check_parent(&comps)?;
        view.check_absent(&comps)?;
        let (layer, sub) = view.route(&comps)?;
        let (dir, target) = view.place(layer, &sub, &vp)?;
        let made = match node {
            NodeKind::File => create_new_file(&target).map(drop),
            NodeKind::Dir => create_dir_private(&target),
        };
        made.map_err(|e| match e {
            Error::Io { source, .. } if source.kind() == io::ErrorKind::AlreadyExists => {
                Error::Exists { path: vp.clone() }
            }
            e => e,
        })?;
        sync_dir(&dir)?;
        Ok(Resolved {
            path: target,
            layer: view.layers[layer].layer.clone(),
            node,
        })
    }

    /// The real file to write for `rel`, which must exist and be a file. A file in the shadow
    /// layer, or in the create target under a kind folder the caller may write, is written in
    /// place; any other file is first copied up into the shadow layer (which shadows every
    /// member), and the copy is returned. The read-only original is never touched.
    pub fn open_write(&self, env: &Env, point: &str, rel: &str) -> Result<Resolved, Error> {
        let comps = parse_rel(rel)?;
        let view = View::new(self, env, point)?;
        let vp = view.view_path(&comps);
        let hits = view.walk_all(&comps)?;
        let Some(w) = hits.first() else {
            return Err(Error::NotFound { path: vp });
        };
        if w.node == NodeKind::Dir {
            return Err(Error::IsDir { path: vp });
        }
        if let Access::Writable = view.access(w, &comps)? {
            return Ok(view.resolved(w));
        }
        let sub: Vec<String> = comps.iter().map(|s| s.to_string()).collect();
        let (_, target) = view.place(0, &sub, &vp)?;
        copy_atomic(&w.real, &target)?;
        Ok(Resolved {
            path: target,
            layer: Layer::Shadow,
            node: NodeKind::File,
        })
    }

    /// Removes `rel` from the layer that wins it, which must be the shadow layer or the create
    /// target (under a kind folder, with authority); a name that a read-only member wins is
    /// refused and never touched. Directories must be empty in that layer. Removing a name can
    /// uncover the same name in a later layer (there are no whiteouts). The point itself and
    /// the kind folders cannot be removed.
    pub fn remove(&self, env: &Env, point: &str, rel: &str) -> Result<Resolved, Error> {
        let comps = parse_rel(rel)?;
        let view = View::new(self, env, point)?;
        let vp = view.view_path(&comps);
        refuse_kind_root(&comps, &vp, "removed")?;
        let hits = view.walk_all(&comps)?;
        let Some(w) = hits.first() else {
            return Err(Error::NotFound { path: vp });
        };
        match view.access(w, &comps)? {
            Access::Writable => {}
            other => return Err(view.refuse(w, &comps, other)),
        }
        let done = match w.node {
            NodeKind::Dir => fs::remove_dir(&w.name_path),
            NodeKind::File => fs::remove_file(&w.name_path),
        };
        done.map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => Error::NotEmpty { path: vp.clone() },
            _ => Error::io("remove", &w.name_path, e),
        })?;
        if let Some(parent) = w.name_path.parent() {
            sync_dir(parent)?;
        }
        Ok(view.resolved(w))
    }

    /// Renames `from` to `to` inside one view. The source must be changeable in place (as for
    /// [`Namespace::remove`]); `to` must not exist and its parent must be a directory of the
    /// view. The destination is routed like a create, and must fall in the source's layer,
    /// else the rename is refused with `EXDEV` (a new `notes/…` name in the create target
    /// goes to today's dated folder).
    pub fn rename(&self, env: &Env, point: &str, from: &str, to: &str) -> Result<Resolved, Error> {
        let fc = parse_rel(from)?;
        let tc = parse_rel(to)?;
        let view = View::new(self, env, point)?;
        let (fv, tv) = (view.view_path(&fc), view.view_path(&tc));
        refuse_kind_root(&fc, &fv, "renamed")?;
        refuse_kind_root(&tc, &tv, "replaced")?;
        if tc.len() > fc.len() && tc.starts_with(&fc) {
            return Err(Error::InvalidPath {
                path: to.to_string(),
                reason: "cannot move a directory into itself",
            });
        }
        let hits = view.walk_all(&fc)?;
        let Some(w) = hits.first() else {
            return Err(Error::NotFound { path: fv });
        };
        match view.access(w, &fc)? {
            Access::Writable => {}
            other => return Err(view.refuse(w, &fc, other)),
        }
        view.check_parent(&tc)?;
        view.check_absent(&tc)?;
        let (layer, sub) = view.route(&tc)?;
        if layer != w.layer {
            return Err(Error::CrossLayer {
                from: fv,
                to: tv,
                from_layer: view.layers[w.layer].layer.describe(),
                to_layer: view.layers[layer].layer.describe(),
            });
        }
        let (dir, target) = view.place(layer, &sub, &tv)?;
        fs::rename(&w.name_path, &target).map_err(|e| Error::io("rename", &w.name_path, e))?;
        sync_dir(&dir)?;
        if let Some(parent) = w.name_path.parent() {
            sync_dir(parent)?;
        }
        Ok(Resolved {
            path: target,
            layer: view.layers[layer].layer.clone(),
            node: w.node,
        })
    }

    /// Moves the regular files of the shadow layer's kind folders into the point's create
    /// target (`<target>/<today>/<kind>/…`), as the seed says: files shadow locally until a
    /// create target is pinned. A file stays in the shadow layer (reported in
    /// [`SettleReport::kept`]) when the caller may not write its kind, when a member searched
    /// before the target has the same name (moving it would hide it), when the target already
    /// has it in today's folder, or when the move fails. Emptied subdirectories are removed.
    /// No create target: nothing happens.
    pub fn settle(&self, env: &Env, point: &str) -> Result<SettleReport, Error> {
        let view = View::new(self, env, point)?;
        let mut report = SettleReport::default();
        let Some((index, member)) = self.point(point).and_then(|p| p.create_target()) else {
            return Ok(report);
        };
        let target_layer = index + 1;
        let Some(shadow) = view.root(0).map(Path::to_path_buf) else {
            return Ok(report);
        };
        let decision = view.authority(index)?;
        let today = utc_today();
        for kind in Kind::ALL {
            let base = shadow.join(kind.as_str());
            let mut files = Vec::new();
            collect_files(&base, &mut Vec::new(), &mut files, &mut report.kept, kind);
            for sub in files {
                let mut comps: Vec<&str> = vec![kind.as_str()];
                comps.extend(sub.iter().map(String::as_str));
                let rel = comps.join("/");
                let keep = |reason: String, report: &mut SettleReport| {
                    report.kept.push(Kept {
                        rel: rel.clone(),
                        reason,
                    })
                };
                if !decision.allows(kind) {
                    let why = match &decision {
                        WriteDecision::Deny(r) => r.clone(),
                        WriteDecision::Allow(_) => {
                            format!("{kind}/ is not delegated to uid {}", env.uid)
                        }
                    };
                    keep(
                        format!("no write authority over {}: {why}", member.name()),
                        &mut report,
                    );
                    continue;
                }
                match view.walk(&comps, &|l| l > 0 && l < target_layer) {
                    Ok(hits) => {
                        let by = hits
                            .first()
                            .map(|h| view.layers[h.layer].layer.describe())
                            .unwrap_or_default();
                        keep(format!("moving it would hide it behind {by}"), &mut report);
                        continue;
                    }
                    Err(Error::NotFound { .. }) => {}
                    Err(e) => {
                        keep(e.to_string(), &mut report);
                        continue;
                    }
                }
                // A set-id file (a copy-up keeps the mode of a member's file) never leaves
                // the shadow layer: moved into a bead it would run with its owner's rights
                // for anyone who can reach the bead.
                let src = base.join(sub.join("/"));
                if let Ok(md) = fs::symlink_metadata(&src) {
                    use std::os::unix::fs::PermissionsExt;
                    let mode = md.permissions().mode();
                    if mode & 0o6000 != 0 {
                        keep(
                            format!(
                                "it is set-id (mode {:o}); set-id files are never moved",
                                mode & 0o7777
                            ),
                            &mut report,
                        );
                        continue;
                    }
                }
                let mut dest_sub = vec![today.clone(), kind.as_str().to_string()];
                dest_sub.extend(sub.iter().cloned());
                let vp = view.view_path(&comps);
                let moved = view
                    .place(target_layer, &dest_sub, &vp)
                    .and_then(|(dir, dest)| {
                        if fs::symlink_metadata(&dest).is_ok() {
                            return Err(Error::Exists {
                                path: format!("{} in {}", vp, member.name()),
                            });
                        }
                        move_file(&src, &dest)?;
                        sync_dir(&dir)?;
                        Ok(dest)
                    });
                match moved {
                    Ok(to) => report.moved.push(Moved { rel, to }),
                    Err(e) => keep(e.to_string(), &mut report),
                }
            }
            prune_empty_dirs(&base);
        }
        Ok(report)
    }
}

/// Collects the regular files below `dir` (paths relative to the kind folder); symlinks and
/// other non-regular files are reported as kept.
fn collect_files(
    dir: &Path,
    prefix: &mut Vec<String>,
    out: &mut Vec<Vec<String>>,
    kept: &mut Vec<Kept>,
    kind: Kind,
) {
    let Ok(rd) = fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let Ok(ft) = e.file_type() else {
            continue;
        };
        prefix.push(name);
        if ft.is_dir() {
            collect_files(&e.path(), prefix, out, kept, kind);
        } else if ft.is_file() {
            out.push(prefix.clone());
        } else {
            kept.push(Kept {
                rel: format!("{kind}/{}", prefix.join("/")),
                reason: "not a regular file".into(),
            });
        }
        prefix.pop();
    }
}

/// Removes empty directories below `base` (not `base` itself).
fn prune_empty_dirs(base: &Path) {
    let Ok(rd) = fs::read_dir(base) else {
        return;
    };
    for e in rd.filter_map(Result::ok) {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            let p = e.path();
            prune_empty_dirs(&p);
            let _ = fs::remove_dir(&p);
        }
    }
}

/// Renames `src` to `dest`, or copies and removes it when they are on different filesystems.
fn move_file(src: &Path, dest: &Path) -> Result<(), Error> {
    match fs::rename(src, dest) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            copy_atomic(src, dest)?;
            fs::remove_file(src).map_err(|e| Error::io("remove", src, e))
        }
        Err(e) => Err(Error::io("move", src, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_checked() {
        assert_eq!(parse_rel("").unwrap(), Vec::<&str>::new());
        assert_eq!(parse_rel("notes/x.md").unwrap(), vec!["notes", "x.md"]);
        assert_eq!(parse_rel("notes/").unwrap(), vec!["notes"]);
        for bad in [
            "/etc/passwd",
            "../x",
            "notes/../../x",
            "a//b",
            "./x",
            "a\0b",
            "//",
        ] {
            assert!(
                matches!(parse_rel(bad), Err(Error::InvalidPath { .. })),
                "{bad:?}"
            );
        }
    }
}
