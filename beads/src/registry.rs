//! The bead registry (`$XDG_DATA_HOME/ollie/beads/`), bead identity and bead naming.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::clock::{utc_now_rfc3339, utc_today};
use crate::ids::{is_uuid, new_uuid_v4};
use crate::layout::Kind;
use crate::names::{file_uri, parse_file_uri, sanitize_name, validate_name, validate_slug};
use crate::store::{create_dir_private, ensure_dir_private, sync_dir, write_atomic};

/// Largest `agent.json` / `names.json` / `delegations.json` this crate reads (1 MiB).
pub const MAX_META_BYTES: u64 = 1 << 20;

/// A bead: a directory that holds `agent.json`. Its identity is its canonical absolute path;
/// two `Bead`s are the same bead exactly when their directories are equal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bead {
    dir: PathBuf,
}

/// What `agent.json` says. Read leniently (unknown keys are ignored, every key is optional) so
/// beads written by other tools still mount; written by [`Registry::start`] with every key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// The bead's UUID (also its directory name in the registry).
    #[serde(default)]
    pub uuid: Option<String>,
    /// The human name given to `start`.
    #[serde(default)]
    pub slug: Option<String>,
    /// RFC 3339 UTC creation time.
    #[serde(default)]
    pub created: Option<String>,
    /// The uid that created the bead.
    #[serde(default)]
    pub owner: Option<u32>,
}

impl Bead {
    /// Opens the bead at `path`: it must exist, be a directory and hold a regular (not
    /// symlinked) `agent.json`. Symlinks in `path` are resolved; the result is canonical.
    pub fn open(path: &Path) -> Result<Bead, Error> {
        let not = |reason| Error::NotABead {
            path: path.to_path_buf(),
            reason,
        };
        if !path.is_absolute() {
            return Err(not("not an absolute path"));
        }
        let dir = fs::canonicalize(path).map_err(|_| not("no such directory"))?;
        let md = fs::metadata(&dir).map_err(|e| Error::io("stat", &dir, e))?;
        if !md.is_dir() {
            return Err(not("not a directory"));
        }
        match fs::symlink_metadata(dir.join("agent.json")) {
            Ok(m) if m.is_file() => Ok(Bead { dir }),
            _ => Err(not(
                "no agent.json (a bead is a directory holding agent.json)",
            )),
        }
    }

    /// A bead from a path taken on trust (a replayed namespace file); nothing is checked.
    pub(crate) fn unchecked(dir: PathBuf) -> Bead {
        Bead { dir }
    }

    /// The bead directory (canonical and absolute).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bead's URI: `file://` + percent-encoded directory + `/`.
    pub fn uri(&self) -> String {
        file_uri(&self.dir)
    }

    /// Reads `agent.json`.
    pub fn info(&self) -> Result<AgentInfo, Error> {
        parse_meta(&self.dir.join("agent.json"))
    }

    /// Reads `names.json` (short name → bead URI). A missing file is an empty map.
    pub fn names(&self) -> Result<BTreeMap<String, String>, Error> {
        let path = self.dir.join("names.json");
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            _ => {}
        }
        parse_meta(&path)
    }

    /// The name a mount gets when the bead was not named by a short name: its slug if
    /// `agent.json` has a valid one, else its directory name made into a valid name.
    pub fn default_name(&self) -> String {
        if let Ok(AgentInfo {
            slug: Some(slug), ..
        }) = self.info()
            && validate_name(&slug).is_ok()
        {
            return slug;
        }
        let base = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        sanitize_name(&base)
    }
}

/// Reads a small metadata file, refusing symlinks and anything over [`MAX_META_BYTES`].
pub(crate) fn read_meta(path: &Path) -> Result<String, Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io("open", path, e))?;
    let mut text = String::new();
    f.take(MAX_META_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| Error::io("read", path, e))?;
    if text.len() as u64 > MAX_META_BYTES {
        return Err(Error::io(
            "read",
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, "larger than 1 MiB"),
        ));
    }
    Ok(text)
}

/// A metadata file ([`read_meta`]) parsed as JSON.
fn parse_meta<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, Error> {
    let text = read_meta(path)?;
    serde_json::from_str(&text).map_err(|e| {
        Error::io(
            "parse",
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
        )
    })
}

/// How a bead was named, for the mount alias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The bead.
    pub bead: Bead,
    /// The short name it was named by, if it was named by one.
    pub short_name: Option<String>,
}

/// The registry: one directory per bead, `<root>/<uuid>/` (the Plan 9 `/srv` analogue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    root: PathBuf,
}

impl Registry {
    /// A registry rooted at `root` (created on the first [`Registry::start`]).
    pub fn new(root: impl Into<PathBuf>) -> Registry {
        Registry { root: root.into() }
    }

    /// The default registry: `$XDG_DATA_HOME/ollie/beads`, else `$HOME/.local/share/ollie/beads`.
    pub fn from_env() -> Result<Registry, Error> {
        let abs = |v: Option<std::ffi::OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
        let data = abs(std::env::var_os("XDG_DATA_HOME"))
            .or_else(|| abs(std::env::var_os("HOME")).map(|h| h.join(".local/share")))
            .ok_or(Error::NoDataDir)?;
        Ok(Registry::new(data.join("ollie").join("beads")))
    }

    /// The registry directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Births a bead: `<root>/<uuid>/` (0700) with `about.md`, `agent.json`, `names.json`
    /// (files 0600) and today's kind-folder set `<YYYY-MM-DD>/{notes,skills,artifacts}/`.
    /// The bead is built under a temporary name and renamed into place, so it appears whole or
    /// not at all. A slug must be valid and not already another registry bead's slug.
    pub fn start(&self, slug: Option<&str>) -> Result<Bead, Error> {
        if let Some(s) = slug {
            validate_slug(s)?;
            self.check_slug_free(s, None)?;
        }
        ensure_dir_private(&self.root)?;
        let root = fs::canonicalize(&self.root).map_err(|e| Error::io("resolve", &self.root, e))?;
        let uuid = new_uuid_v4()?;
        let dir = root.join(&uuid);
        let tmp = root.join(format!(".tmp-{uuid}"));
        create_dir_private(&tmp)?;
        let built = build_bead(&tmp, &dir, &uuid, slug).and_then(|()| {
            fs::rename(&tmp, &dir).map_err(|e| Error::io("rename into place", &dir, e))?;
            sync_dir(&root)
        });
        if let Err(e) = built {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        Bead::open(&dir)
    }

    /// Records `slug` as the human name of `bead` (an open bead): `agent.json`'s `slug`
    /// (other keys kept), a `names.json` entry slug → the bead, and `about.md`'s title line.
    pub fn set_slug(&self, bead: &Bead, slug: &str) -> Result<(), Error> {
        validate_slug(slug)?;
        self.check_slug_free(slug, Some(bead))?;
        let agent_path = bead.dir.join("agent.json");
        let mut agent: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&read_meta(&agent_path)?).map_err(|e| {
                Error::io(
                    "parse",
                    &agent_path,
                    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
                )
            })?;
        let mut names = bead.names()?;
        let about_path = bead.dir.join("about.md");
        let about = read_meta(&about_path).unwrap_or_default();
        // Everything is read and checked; now write.
        agent.insert("slug".into(), serde_json::Value::String(slug.into()));
        write_atomic(&agent_path, json_pretty(&agent).as_bytes())?;
        names.insert(slug.to_string(), bead.uri());
        write_atomic(&bead.dir.join("names.json"), json_pretty(&names).as_bytes())?;
        let body = match about.split_once('\n') {
            Some((first, rest)) if first.starts_with("# ") => rest.to_string(),
            _ if about.starts_with("# ") => String::new(),
            _ => format!("\n{about}"),
        };
        write_atomic(&about_path, format!("# {slug}\n{body}").as_bytes())
    }

    fn check_slug_free(&self, slug: &str, except: Option<&Bead>) -> Result<(), Error> {
        for b in self.beads()? {
            if Some(&b) == except {
                continue;
            }
            if let Ok(AgentInfo {
                slug: Some(other), ..
            }) = b.info()
                && other == slug
            {
                return Err(Error::SlugTaken {
                    slug: slug.to_string(),
                    uri: b.uri(),
                });
            }
        }
        Ok(())
    }

    /// Every bead in the registry (`<root>/<uuid>/` directories holding `agent.json`), sorted.
    /// A missing registry has none; entries that are not beads are skipped.
    pub fn beads(&self) -> Result<Vec<Bead>, Error> {
        let rd = match fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("list", &self.root, e)),
        };
        let mut v: Vec<Bead> = rd
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(is_uuid))
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .filter_map(|e| Bead::open(&e.path()).ok())
            .collect();
        v.sort();
        Ok(v)
    }

    /// The registry bead with this UUID.
    pub fn by_uuid(&self, uuid: &str) -> Result<Bead, Error> {
        let uuid = uuid.to_ascii_lowercase();
        if !is_uuid(&uuid) {
            return Err(Error::InvalidName {
                name: uuid,
                reason: "not a uuid",
            });
        }
        let path = self.root.join(&uuid);
        if fs::symlink_metadata(&path).is_err() {
            return Err(Error::UnknownBead { name: uuid });
        }
        Bead::open(&path)
    }

    /// Resolves a bead name:
    /// - `file:///abs/dir/` (or `file://localhost/…`) and absolute paths name a bead
    ///   directory directly ([`Bead::open`]);
    /// - `http://…` / `https://…` are refused ([`Error::RemoteBead`]);
    /// - a UUID (trailing `/` allowed) is looked up as `<root>/<uuid>/`;
    /// - anything else is a short name (trailing `/` allowed), resolved first through
    ///   `local` (the namespace's own member names), then through every registry bead's slug
    ///   and `names.json`. More than one distinct bead is [`Error::AmbiguousName`], listing
    ///   them; unreadable `names.json` files and entries that do not name a local bead are
    ///   skipped (a name that only names remote beads is [`Error::RemoteBead`]).
    pub fn resolve(&self, spec: &str, local: &[(&str, &Bead)]) -> Result<Named, Error> {
        let direct = |bead| {
            Ok(Named {
                bead,
                short_name: None,
            })
        };
        if spec.contains("://") {
            let path = parse_file_uri(spec)?;
            return direct(Bead::open(&path)?);
        }
        if spec.starts_with('/') {
            return direct(Bead::open(Path::new(spec))?);
        }
        let name = spec.strip_suffix('/').unwrap_or(spec);
        if is_uuid(name) {
            return direct(self.by_uuid(name)?);
        }
        validate_name(name)?;
        let named = |bead| {
            Ok(Named {
                bead,
                short_name: Some(name.to_string()),
            })
        };
        let locals: BTreeSet<&Bead> = local
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, b)| *b)
            .collect();
        if let Some(bead) = pick(name, locals.into_iter().cloned().collect())? {
            return named(bead);
        }
        let mut found: BTreeSet<Bead> = BTreeSet::new();
        let mut remote: Vec<String> = Vec::new();
        for b in self.beads()? {
            if let Ok(AgentInfo {
                slug: Some(slug), ..
            }) = b.info()
                && slug == name
            {
                found.insert(b.clone());
            }
            if let Ok(names) = b.names()
                && let Some(target) = names.get(name)
            {
                match parse_file_uri(target) {
                    Ok(path) => {
                        if let Ok(t) = Bead::open(&path) {
                            found.insert(t);
                        }
                    }
                    Err(Error::RemoteBead { uri }) => remote.push(uri),
                    Err(_) => {}
                }
            }
        }
        match pick(name, found)? {
            Some(bead) => named(bead),
            None => match remote.into_iter().next() {
                Some(uri) => Err(Error::RemoteBead { uri }),
                None => Err(Error::UnknownBead {
                    name: name.to_string(),
                }),
            },
        }
    }
}

/// The one bead of `found`, `None` for none, or [`Error::AmbiguousName`] listing them all.
fn pick(name: &str, found: BTreeSet<Bead>) -> Result<Option<Bead>, Error> {
    if found.len() > 1 {
        return Err(Error::AmbiguousName {
            name: name.to_string(),
            candidates: found.iter().map(Bead::uri).collect(),
        });
    }
    Ok(found.into_iter().next())
}

fn build_bead(tmp: &Path, final_dir: &Path, uuid: &str, slug: Option<&str>) -> Result<(), Error> {
    let owner = fs::metadata(tmp)
        .map_err(|e| Error::io("stat", tmp, e))?
        .uid();
    let created = utc_now_rfc3339();
    let today = utc_today();
    let title = slug.unwrap_or("untitled");
    let about = format!("# {title}\n\ncreated: {today}\nuuid: {uuid}\n");
    write_atomic(&tmp.join("about.md"), about.as_bytes())?;
    let info = AgentInfo {
        uuid: Some(uuid.to_string()),
        slug: slug.map(str::to_string),
        created: Some(created),
        owner: Some(owner),
    };
    let agent = serde_json::json!({
        "uuid": info.uuid,
        "slug": info.slug,
        "created": info.created,
        "owner": info.owner,
    });
    write_atomic(&tmp.join("agent.json"), format!("{agent:#}\n").as_bytes())?;
    let mut names = BTreeMap::new();
    if let Some(s) = slug {
        names.insert(s.to_string(), file_uri(final_dir));
    }
    write_atomic(&tmp.join("names.json"), json_pretty(&names).as_bytes())?;
    let dated = tmp.join(&today);
    create_dir_private(&dated)?;
    for kind in Kind::ALL {
        create_dir_private(&dated.join(kind.as_str()))?;
    }
    Ok(())
}

fn json_pretty<T: Serialize>(v: &T) -> String {
    // Maps of strings and JSON values always serialize; an empty object is the fallback.
    match serde_json::to_value(v) {
        Ok(value) => format!("{value:#}\n"),
        Err(_) => "{}\n".to_string(),
    }
}

/// Whether `path` is absolute and lexically normal (no `.`/`..`, no empty components).
pub(crate) fn is_normal_absolute(path: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}
