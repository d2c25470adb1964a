//! The bead commands run against a namespace (`start`, `mount`, `unmount`, `ns`, `rfork`):
//! the floor above the mount table (`namespace`) and its union views (`union`), since a
//! `mount -c` settles the shadow layer into the new create target.

use crate::Error;
use crate::authority::{WriteDecision, write_authority};
use crate::command::{Command, MountFlags};
use crate::names::parse_point;
use crate::namespace::{Env, Member, NameRule, Namespace};
use crate::union::{Kept, SettleReport};

/// The result of a successful `mount`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountReport {
    /// The point.
    pub point: String,
    /// The name the member got.
    pub name: String,
    /// The bead's URI.
    pub uri: String,
    /// With `-c`: what moved from the shadow layer into the create target, and what stayed.
    pub settled: Option<SettleReport>,
}

/// The result of a successful command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `start`: the open bead's URI.
    Started {
        /// The URI.
        uri: String,
    },
    /// `mount`.
    Mounted(MountReport),
    /// `unmount`: the members removed.
    Unmounted {
        /// The point.
        point: String,
        /// The removed members' names.
        removed: Vec<String>,
    },
    /// `ns`: the table text.
    Table(String),
    /// `rfork`: the caller must now give this namespace's user a private copy
    /// ([`Namespace::rfork`]) instead of a shared one.
    Rfork,
}

impl Outcome {
    /// The reply text for a `ctl` fid: one line per fact, each ending in a newline.
    pub fn reply(&self) -> String {
        match self {
            Outcome::Started { uri } => format!("{uri}\n"),
            Outcome::Mounted(r) => {
                let mut s = format!("mounted {} {} at {}\n", r.name, r.uri, r.point);
                if let Some(settled) = &r.settled {
                    for m in &settled.moved {
                        s.push_str(&format!("moved {} to {}\n", m.rel, m.to.display()));
                    }
                    for k in &settled.kept {
                        s.push_str(&format!(
                            "kept {} in the shadow layer: {}\n",
                            k.rel, k.reason
                        ));
                    }
                }
                s
            }
            Outcome::Unmounted { point, removed } => {
                format!("unmounted {} from {point}\n", removed.join(" "))
            }
            Outcome::Table(t) => t.clone(),
            Outcome::Rfork => "forked\n".to_string(),
        }
    }
}

/// `list`: one line per registry bead, `SLUG<TAB>UUID<TAB>CREATED<TAB>URI` (`-` for what
/// its `agent.json` lacks), oldest first.
fn registry_list(env: &Env) -> Result<String, Error> {
    let mut rows: Vec<(String, String, String, String)> = env
        .registry
        .beads()?
        .into_iter()
        .map(|b| {
            let info = b.info().unwrap_or_default();
            let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
            (
                or_dash(info.created),
                or_dash(info.slug),
                or_dash(info.uuid),
                b.uri(),
            )
        })
        .collect();
    rows.sort();
    Ok(rows
        .into_iter()
        .map(|(created, slug, uuid, uri)| format!("{slug}\t{uuid}\t{created}\t{uri}\n"))
        .collect())
}

impl Namespace {
    /// Runs one command. A command that fails changes nothing.
    pub fn execute(&mut self, env: &Env, cmd: &Command) -> Result<Outcome, Error> {
        match cmd {
            Command::Start { slug } => Ok(Outcome::Started {
                uri: self.start(env, slug.as_deref())?,
            }),
            Command::Mount { flags, bead, point } => {
                Ok(Outcome::Mounted(self.mount(env, bead, point, *flags)?))
            }
            Command::Unmount { bead, point } => {
                let removed = self.unmount(env, bead.as_deref(), point)?;
                Ok(Outcome::Unmounted {
                    point: parse_point(point)?,
                    removed: removed.into_iter().map(|m| m.name).collect(),
                })
            }
            Command::Ns => Ok(Outcome::Table(self.table())),
            Command::Rfork => Ok(Outcome::Rfork),
            Command::List => Ok(Outcome::Table(registry_list(env)?)),
        }
    }

    /// `start [slug]`: with no open bead, births one in the registry and opens it; with an
    /// open bead, records `slug` as its human name if it has none yet, and refuses another
    /// name than the one it has ([`Error::AlreadyStarted`]: a bead is not renamed by a
    /// second `start`). Returns the open bead's URI.
    pub fn start(&mut self, env: &Env, slug: Option<&str>) -> Result<String, Error> {
        match &self.started {
            None => {
                let bead = env.registry.start(slug)?;
                let uri = bead.uri();
                self.started = Some(bead);
                Ok(uri)
            }
            Some(bead) => {
                if let Some(s) = slug {
                    match bead.info()?.slug {
                        Some(current) if current == s => {}
                        Some(current) => {
                            return Err(Error::AlreadyStarted {
                                slug: s.to_owned(),
                                uri: bead.uri(),
                                current,
                            });
                        }
                        None => env.registry.set_slug(bead, s)?,
                    }
                }
                Ok(bead.uri())
            }
        }
    }

    /// `mount [-b|-a] [-c] BEAD POINT`. `-b` puts the bead first, `-a` last, neither replaces
    /// the point's members. A bead already at the point is moved (its old flags are dropped).
    /// `-c` needs write authority and fails if another member is the create target; when it
    /// succeeds, the shadow layer's kind files move into the target ([`Namespace::settle`]).
    pub fn mount(
        &mut self,
        env: &Env,
        bead: &str,
        point: &str,
        flags: MountFlags,
    ) -> Result<MountReport, Error> {
        let point = parse_point(point)?;
        let named = env.registry.resolve(bead, &self.local_names())?;
        let mut next = self.clone();
        let hint = named
            .short_name
            .clone()
            .unwrap_or_else(|| named.bead.default_name());
        let name = next.bind(&point, named.bead.clone(), NameRule::Hint(hint), flags)?;
        if flags.create
            && let WriteDecision::Deny(reason) = write_authority(&named.bead, env.uid)?
        {
            return Err(Error::NoWriteAuthority {
                uri: named.bead.uri(),
                reason,
            });
        }
        *self = next;
        let settled = flags.create.then(|| {
            self.settle(env, &point).unwrap_or_else(|e| SettleReport {
                moved: Vec::new(),
                kept: vec![Kept {
                    rel: String::new(),
                    reason: e.to_string(),
                }],
            })
        });
        Ok(MountReport {
            point,
            name,
            uri: named.bead.uri(),
            settled,
        })
    }

    /// `unmount [BEAD] POINT`: removes one member (matched by its name at the point first,
    /// then by resolving `bead` like `mount` does), or with `None` every member. A point with
    /// no members left disappears. Returns the removed members.
    pub fn unmount(
        &mut self,
        env: &Env,
        bead: Option<&str>,
        point: &str,
    ) -> Result<Vec<Member>, Error> {
        let point = parse_point(point)?;
        let Some(pi) = self.points.iter().position(|p| p.path == point) else {
            return Err(Error::UnknownPoint { point });
        };
        let Some(spec) = bead else {
            return Ok(self.points.remove(pi).members);
        };
        let members = &self.points[pi].members;
        let mi = members.iter().position(|m| m.name == spec).or_else(|| {
            let named = env.registry.resolve(spec, &self.local_names()).ok()?;
            members.iter().position(|m| m.bead == named.bead)
        });
        let Some(mi) = mi else {
            return Err(Error::NotMember {
                bead: spec.to_string(),
                point,
                members: members.iter().map(|m| m.name.clone()).collect(),
            });
        };
        let removed = self.points[pi].members.remove(mi);
        if self.points[pi].members.is_empty() {
            self.points.remove(pi);
        }
        Ok(vec![removed])
    }
}
