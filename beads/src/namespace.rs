//! The per-session mount table, its text form (`ns`) and its file form. The commands that
//! change it are in `exec` (above this and `union`).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Error;
use crate::command::{MountFlags, Order};
use crate::names::{parse_file_uri, parse_point, point_dir_name, validate_name};
use crate::registry::{Bead, Registry, is_normal_absolute};
use crate::store::write_atomic;

/// The `profile` of a session namespace file.
pub const PROFILE: &str = "acequia/session-namespace";

/// One union member at a point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub(crate) bead: Bead,
    pub(crate) name: String,
    order: Order,
    create: bool,
}

impl Member {
    /// The bead.
    pub fn bead(&self) -> &Bead {
        &self.bead
    }

    /// The local alias (the `name` of the namespace file, `NAME` of the table).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The order that replays this member into place (see the crate docs: the first member of
    /// a point keeps the flag it was mounted with, every later member is `after`).
    pub fn order(&self) -> Order {
        self.order
    }

    /// Whether this member is the point's create target (`-c`).
    pub fn create(&self) -> bool {
        self.create
    }
}

/// A mount point and its members in search order. A point exists while it has members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    pub(crate) path: String,
    pub(crate) members: Vec<Member>,
}

impl Point {
    /// The point (`/ctx`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The directory it is served as (`ctx`).
    pub fn dir_name(&self) -> &str {
        point_dir_name(&self.path)
    }

    /// The members, in search order.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The create target and its index in [`Point::members`], if one is pinned.
    pub fn create_target(&self) -> Option<(usize, &Member)> {
        self.members.iter().enumerate().find(|(_, m)| m.create)
    }
}

/// What a namespace needs from its host to run commands and union operations.
#[derive(Debug, Clone)]
pub struct Env {
    /// The bead registry.
    pub registry: Registry,
    /// The uid write authority is checked for (the user the session acts for).
    pub uid: u32,
    /// The directory that holds this namespace's shadow layers, one subdirectory per point
    /// (`<shadow_root>/ctx/` for `/ctx`). Give each forked namespace its own.
    pub shadow_root: PathBuf,
}

/// How `bind` names the new member.
pub(crate) enum NameRule<'a> {
    /// Exactly this name; a clash is an error (replay).
    Exact(&'a str),
    /// This name, or `name-2`, `name-3`, … when another member of the point has it.
    Hint(String),
}

/// A session (or agent) namespace: mount points with ordered members, and the bead this
/// namespace started, if any. `Clone` is the fork: a clone shares nothing mutable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    session: String,
    pub(crate) points: Vec<Point>,
    pub(crate) started: Option<Bead>,
}

impl Namespace {
    /// An empty namespace for `session`.
    pub fn new(session: impl Into<String>) -> Namespace {
        Namespace {
            session: session.into(),
            points: Vec::new(),
            started: None,
        }
    }

    /// The session id written to the namespace file.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Changes the session id (e.g. for a fork that becomes an agent's own namespace).
    pub fn set_session(&mut self, session: impl Into<String>) {
        self.session = session.into();
    }

    /// The points, in the order they were first mounted.
    pub fn points(&self) -> &[Point] {
        &self.points
    }

    /// The point at `point` (normalised), if it has members.
    pub fn point(&self, point: &str) -> Option<&Point> {
        let p = parse_point(point).ok()?;
        self.points.iter().find(|x| x.path == p)
    }

    /// The bead this namespace started (the "open" bead), if any.
    pub fn started(&self) -> Option<&Bead> {
        self.started.as_ref()
    }

    /// A private copy: Plan 9's `rfork(RFNAMEG)`. Later changes to either side do not affect
    /// the other. (Give the copy its own [`Env::shadow_root`] if it should not share the
    /// original's shadow layers.)
    pub fn rfork(&self) -> Namespace {
        self.clone()
    }

    /// Every member name at every point, with its bead (the first place short names resolve).
    pub fn local_names(&self) -> Vec<(&str, &Bead)> {
        self.points
            .iter()
            .flat_map(|p| p.members.iter().map(|m| (m.name.as_str(), &m.bead)))
            .collect()
    }

    /// Adds `bead` at `point` (already normalised) following the mount rules; pure.
    pub(crate) fn bind(
        &mut self,
        point: &str,
        bead: Bead,
        rule: NameRule<'_>,
        flags: MountFlags,
    ) -> Result<String, Error> {
        let pi = self.points.iter().position(|p| p.path == point);
        let mut members = pi
            .map(|i| self.points[i].members.clone())
            .unwrap_or_default();
        members.retain(|m| m.bead != bead);
        if flags.order == Order::Replace {
            members.clear();
        }
        if flags.create
            && let Some(first) = members.iter().find(|m| m.create)
        {
            return Err(Error::SecondCreate {
                point: point.to_string(),
                name: first.name.clone(),
                uri: first.bead.uri(),
            });
        }
        let name = match rule {
            NameRule::Exact(n) => {
                validate_name(n)?;
                if members.iter().any(|m| m.name == n) {
                    return Err(Error::NamespaceFile {
                        reason: format!("name {n:?} is used twice at {point}"),
                    });
                }
                n.to_string()
            }
            NameRule::Hint(h) => unique_name(&members, &h),
        };
        let member = Member {
            bead,
            name: name.clone(),
            order: flags.order,
            create: flags.create,
        };
        if flags.order == Order::Before {
            if let Some(first) = members.first_mut() {
                first.order = Order::After;
            }
            members.insert(0, member);
        } else {
            if !members.is_empty() {
                // Every member but the first replays as `after`.
                let mut m = member;
                m.order = Order::After;
                members.push(m);
            } else {
                members.push(member);
            }
        }
        match pi {
            Some(i) => self.points[i].members = members,
            None => self.points.push(Point {
                path: point.to_string(),
                members,
            }),
        }
        Ok(name)
    }

    /// The mount table in the seed's `bead-ns` format (see the crate docs):
    ///
    /// ```text
    /// /ctx (union)
    ///   [1] A file:///…/A/ read
    ///   [2] C file:///…/C/ read,create*
    /// ```
    pub fn table(&self) -> String {
        let mut s = String::new();
        for p in &self.points {
            s.push_str(&format!("{} (union)\n", p.path));
            for (i, m) in p.members.iter().enumerate() {
                let access = if m.create { "read,create*" } else { "read" };
                s.push_str(&format!(
                    "  [{}] {} {} {access}\n",
                    i + 1,
                    m.name,
                    m.bead.uri()
                ));
            }
        }
        s
    }

    /// The session namespace file (the seed's JSON, plus `started`), one mount per line.
    pub fn to_json(&self) -> String {
        let mut s = String::from("{\n");
        s.push_str(&format!("  \"profile\": {},\n", json_str(PROFILE)));
        s.push_str(&format!("  \"session\": {},\n", json_str(&self.session)));
        let mounts: Vec<String> = self
            .points
            .iter()
            .flat_map(|p| {
                p.members.iter().map(move |m| {
                    format!(
                        "    {{ \"bead\": {}, \"point\": {}, \"order\": {}, \"create\": {}, \"name\": {} }}",
                        json_str(&m.bead.uri()),
                        json_str(&p.path),
                        json_str(m.order.as_str()),
                        m.create,
                        json_str(&m.name)
                    )
                })
            })
            .collect();
        if mounts.is_empty() {
            s.push_str("  \"mounts\": []");
        } else {
            s.push_str(&format!("  \"mounts\": [\n{}\n  ]", mounts.join(",\n")));
        }
        if let Some(b) = &self.started {
            s.push_str(&format!(",\n  \"started\": {}", json_str(&b.uri())));
        }
        s.push_str("\n}\n");
        s
    }

    /// Parses and replays a session namespace file. Strict: unknown or missing keys, another
    /// profile, an empty session, a bad point, order, name or URI (remote beads included),
    /// two members with one name at a point, and a second `-c` at a point are errors that name
    /// the key path. Replaying applies each mount in file order with the `mount` rules, so
    /// `from_json(&ns.to_json())` rebuilds `ns` exactly. Nothing on disk is read: beads are
    /// taken on trust, and write authority is checked again on every write.
    pub fn from_json(text: &str) -> Result<Namespace, Error> {
        // serde_json quotes parts of the input in its messages; keep them on one line.
        let bad = |reason: String| Error::NamespaceFile {
            reason: reason
                .chars()
                .flat_map(|c| {
                    let e: Vec<char> = if c.is_control() {
                        c.escape_default().collect()
                    } else {
                        vec![c]
                    };
                    e
                })
                .collect(),
        };
        let raw: RawFile = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if raw.profile != PROFILE {
            return Err(bad(format!(
                "profile: expected {PROFILE:?}, got {:?}",
                raw.profile
            )));
        }
        if raw.session.is_empty() || raw.session.chars().any(char::is_control) {
            return Err(bad(
                "session: must be a non-empty string without control characters".into(),
            ));
        }
        let mut ns = Namespace::new(raw.session);
        for (i, m) in raw.mounts.iter().enumerate() {
            let point =
                parse_point(&m.point).map_err(|e| bad(format!("mounts[{i}].point: {e}")))?;
            let bead = bead_from_uri(&m.bead).map_err(|e| bad(format!("mounts[{i}].bead: {e}")))?;
            validate_name(&m.name).map_err(|e| bad(format!("mounts[{i}].name: {e}")))?;
            let flags = MountFlags {
                order: m.order,
                create: m.create,
            };
            ns.bind(&point, bead, NameRule::Exact(&m.name), flags)
                .map_err(|e| match e {
                    Error::NamespaceFile { reason } => bad(format!("mounts[{i}]: {reason}")),
                    other => bad(format!("mounts[{i}]: {other}")),
                })?;
        }
        if let Some(uri) = &raw.started {
            ns.started = Some(bead_from_uri(uri).map_err(|e| bad(format!("started: {e}")))?);
        }
        Ok(ns)
    }

    /// Writes [`Namespace::to_json`] to `path` atomically (0600, fsynced).
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        write_atomic(path, self.to_json().as_bytes())
    }

    /// Reads and replays the namespace file at `path`.
    pub fn load(path: &Path) -> Result<Namespace, Error> {
        let text = crate::registry::read_meta(path)?;
        Namespace::from_json(&text)
    }
}

fn unique_name(members: &[Member], hint: &str) -> String {
    let taken = |n: &str| members.iter().any(|m| m.name == n);
    if !taken(hint) {
        return hint.to_string();
    }
    for i in 2..=members.len() + 2 {
        let suffix = format!("-{i}");
        let stem: String = hint.chars().take(64 - suffix.len()).collect();
        let cand = format!("{stem}{suffix}");
        if !taken(&cand) {
            return cand;
        }
    }
    // Unreachable: members.len() + 1 candidates cannot all be taken by members.len() names.
    format!("{hint}-x")
}

fn bead_from_uri(uri: &str) -> Result<Bead, Error> {
    let path = parse_file_uri(uri)?;
    let normal: PathBuf = path.components().collect();
    if !is_normal_absolute(&path) || normal.as_os_str().is_empty() {
        return Err(Error::InvalidUri {
            uri: uri.to_string(),
            reason: "the path must be absolute and normal (no . or ..)".into(),
        });
    }
    Ok(Bead::unchecked(normal))
}

/// A JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    profile: String,
    session: String,
    mounts: Vec<RawMount>,
    #[serde(default)]
    started: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMount {
    bead: String,
    point: String,
    order: Order,
    create: bool,
    name: String,
}
