//! Write authority over a bead: who may pin it as a create target (`-c`) and write into it.

use std::fs;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::layout::Kind;
use crate::registry::{Bead, read_meta};

/// The delegation file in a bead directory.
pub const DELEGATIONS_FILE: &str = "delegations.json";

/// A set of kind folders.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindSet {
    bits: u8,
}

impl KindSet {
    /// Every kind.
    pub const ALL: KindSet = KindSet { bits: 0b111 };

    fn bit(kind: Kind) -> u8 {
        match kind {
            Kind::Notes => 1,
            Kind::Skills => 2,
            Kind::Artifacts => 4,
        }
    }

    /// Adds a kind.
    pub fn insert(&mut self, kind: Kind) {
        self.bits |= KindSet::bit(kind);
    }

    /// Whether the set holds `kind`.
    pub fn contains(self, kind: Kind) -> bool {
        self.bits & KindSet::bit(kind) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.bits == 0
    }

    /// The kinds in the set, in [`Kind::ALL`] order.
    pub fn kinds(self) -> impl Iterator<Item = Kind> {
        Kind::ALL.into_iter().filter(move |k| self.contains(*k))
    }
}

/// Why a caller may write a bead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteGrant {
    /// The caller's uid owns the bead directory, which is owner-writable: every kind folder.
    Owner,
    /// The bead's owner delegated these kind folders to the caller's uid.
    Delegated {
        /// The kind folders the caller may create in.
        kinds: KindSet,
    },
}

/// The write-authority decision for one bead and one uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteDecision {
    /// The caller may pin the bead with `-c` and write the granted kind folders.
    Allow(WriteGrant),
    /// The caller may only mount the bead read-only; the reason is one lowercase line.
    Deny(String),
}

impl WriteDecision {
    /// Whether the decision lets the caller write the `kind` folder.
    pub fn allows(&self, kind: Kind) -> bool {
        match self {
            WriteDecision::Allow(WriteGrant::Owner) => true,
            WriteDecision::Allow(WriteGrant::Delegated { kinds }) => kinds.contains(kind),
            WriteDecision::Deny(_) => false,
        }
    }
}

/// One entry of `delegations.json`: `{"uid": 1001, "write_paths": ["notes/", "artifacts/"]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delegation {
    /// The uid the bead's owner delegates to.
    pub uid: u32,
    /// Kind folders: each exactly `notes/`, `skills/` or `artifacts/` (the `/` is optional).
    pub write_paths: Vec<String>,
}

/// The state of a bead's `delegations.json`, as gathered from the filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delegations {
    /// There is no `delegations.json`.
    Absent,
    /// It exists but cannot be trusted (why, one line): it or the bead directory could have
    /// been written by someone other than the bead's owner.
    Untrusted(String),
    /// It is trusted but does not parse (why, one line, with the key path).
    Invalid(String),
    /// It is trusted and valid.
    Listed(Vec<Delegation>),
}

/// The facts about a bead that decide write authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeadFacts {
    /// The bead directory's owner uid.
    pub owner: u32,
    /// The bead directory's mode bits.
    pub mode: u32,
    /// Its delegation file.
    pub delegations: Delegations,
}

/// Parses `delegations.json`: a JSON array of [`Delegation`]s, unknown keys and unknown
/// write paths refused. The error names the key path.
pub fn parse_delegations(text: &str) -> Result<Vec<Delegation>, String> {
    let list: Vec<Delegation> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    for (i, d) in list.iter().enumerate() {
        for (j, p) in d.write_paths.iter().enumerate() {
            if kind_of_write_path(p).is_none() {
                return Err(format!(
                    "[{i}].write_paths[{j}]: {p:?} is not a kind folder (valid: notes/, skills/, artifacts/)"
                ));
            }
        }
    }
    Ok(list)
}

fn kind_of_write_path(p: &str) -> Option<Kind> {
    Kind::from_name(p.strip_suffix('/').unwrap_or(p))
}

/// Decides whether `uid` may write the bead described by `facts`. Pure.
///
/// - Owner: `uid` owns the bead directory and its owner-write bit is set → every kind.
///   Root is not special: uid 0 must own the bead or be delegated like anyone else.
/// - Delegation: otherwise, a trusted, valid `delegations.json` whose entries for `uid` name
///   at least one kind folder → those kinds (entries for the same uid add up).
/// - Anything else is a denial naming the reason.
pub fn decide_write(facts: &BeadFacts, uid: u32) -> WriteDecision {
    if facts.owner == uid {
        if facts.mode & 0o200 != 0 {
            return WriteDecision::Allow(WriteGrant::Owner);
        }
        return WriteDecision::Deny(format!(
            "the bead directory is not writable by its owner (mode {:04o})",
            facts.mode & 0o7777
        ));
    }
    let not_owner = format!("the bead is owned by uid {}, not uid {uid}", facts.owner);
    match &facts.delegations {
        Delegations::Absent => {
            WriteDecision::Deny(format!("{not_owner}, and it has no {DELEGATIONS_FILE}"))
        }
        Delegations::Untrusted(why) => WriteDecision::Deny(format!(
            "{not_owner}, and its {DELEGATIONS_FILE} is not trusted: {why}"
        )),
        Delegations::Invalid(why) => WriteDecision::Deny(format!(
            "{not_owner}, and its {DELEGATIONS_FILE} is invalid: {why}"
        )),
        Delegations::Listed(list) => {
            let mut kinds = KindSet::default();
            for d in list.iter().filter(|d| d.uid == uid) {
                for k in d.write_paths.iter().filter_map(|p| kind_of_write_path(p)) {
                    kinds.insert(k);
                }
            }
            if kinds.is_empty() {
                WriteDecision::Deny(format!(
                    "{not_owner}, and its {DELEGATIONS_FILE} delegates nothing to uid {uid}"
                ))
            } else {
                WriteDecision::Allow(WriteGrant::Delegated { kinds })
            }
        }
    }
}

/// Gathers the [`BeadFacts`] of `bead`. `delegations.json` is trusted only when it is a
/// regular file (not a symlink) owned by the bead directory's owner, and neither it nor the
/// bead directory is writable by group or others.
pub fn bead_facts(bead: &Bead) -> Result<BeadFacts, Error> {
    let dir = bead.dir();
    let md = fs::metadata(dir).map_err(|e| Error::io("stat", dir, e))?;
    let (owner, mode) = (md.uid(), md.mode());
    let path = dir.join(DELEGATIONS_FILE);
    let delegations = match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Delegations::Absent,
        Err(e) => Delegations::Untrusted(format!("cannot stat it: {e}")),
        Ok(dm) if !dm.is_file() => Delegations::Untrusted("it is not a regular file".into()),
        Ok(dm) if dm.uid() != owner => Delegations::Untrusted(format!(
            "it is owned by uid {}, not by the bead's owner",
            dm.uid()
        )),
        Ok(dm) if dm.mode() & 0o022 != 0 => Delegations::Untrusted(format!(
            "it is writable by group or others (mode {:04o})",
            dm.mode() & 0o7777
        )),
        Ok(_) if mode & 0o022 != 0 => Delegations::Untrusted(format!(
            "the bead directory is writable by group or others (mode {:04o})",
            mode & 0o7777
        )),
        Ok(_) => match read_meta(&path) {
            Err(e) => Delegations::Untrusted(e.to_string()),
            Ok(text) => match parse_delegations(&text) {
                Ok(list) => Delegations::Listed(list),
                Err(why) => Delegations::Invalid(why),
            },
        },
    };
    Ok(BeadFacts {
        owner,
        mode,
        delegations,
    })
}

/// Whether `uid` may write `bead`: [`bead_facts`] then [`decide_write`].
pub fn write_authority(bead: &Bead, uid: u32) -> Result<WriteDecision, Error> {
    Ok(decide_write(&bead_facts(bead)?, uid))
}

/// The effective uid of this process (the usual caller uid for a server acting for its user).
pub fn current_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(owner: u32, mode: u32, delegations: Delegations) -> BeadFacts {
        BeadFacts {
            owner,
            mode,
            delegations,
        }
    }

    #[test]
    fn owner_with_writable_dir_may_write_everything() {
        let d = decide_write(&facts(1000, 0o40700, Delegations::Absent), 1000);
        assert_eq!(d, WriteDecision::Allow(WriteGrant::Owner));
        assert!(Kind::ALL.iter().all(|k| d.allows(*k)));
    }

    #[test]
    fn owner_of_read_only_dir_is_denied() {
        let d = decide_write(&facts(1000, 0o40500, Delegations::Absent), 1000);
        let WriteDecision::Deny(why) = d else {
            panic!("{d:?}")
        };
        assert!(
            why.contains("not writable by its owner (mode 0500)"),
            "{why}"
        );
    }

    #[test]
    fn root_is_not_special() {
        let d = decide_write(&facts(1000, 0o40700, Delegations::Absent), 0);
        let WriteDecision::Deny(why) = d else {
            panic!("{d:?}")
        };
        assert_eq!(
            why,
            "the bead is owned by uid 1000, not uid 0, and it has no delegations.json"
        );
    }

    #[test]
    fn delegation_grants_only_listed_kinds_to_listed_uid() {
        let list = parse_delegations(
            r#"[{"uid": 1001, "write_paths": ["notes/", "artifacts"]}, {"uid": 1002, "write_paths": []}]"#,
        )
        .unwrap();
        let f = facts(1000, 0o40700, Delegations::Listed(list));
        let d = decide_write(&f, 1001);
        assert!(d.allows(Kind::Notes) && d.allows(Kind::Artifacts) && !d.allows(Kind::Skills));
        assert!(
            matches!(decide_write(&f, 1002), WriteDecision::Deny(w) if w.contains("delegates nothing to uid 1002"))
        );
        assert!(matches!(decide_write(&f, 1003), WriteDecision::Deny(_)));
    }

    #[test]
    fn untrusted_or_invalid_delegations_deny() {
        let f = facts(
            1000,
            0o40700,
            Delegations::Untrusted("it is writable by group or others (mode 0666)".into()),
        );
        assert!(
            matches!(decide_write(&f, 1001), WriteDecision::Deny(w) if w.contains("not trusted"))
        );
        let err = parse_delegations(r#"[{"uid": 1, "write_paths": ["../etc"]}]"#).unwrap_err();
        assert_eq!(
            err,
            r#"[0].write_paths[0]: "../etc" is not a kind folder (valid: notes/, skills/, artifacts/)"#
        );
        assert!(parse_delegations(r#"[{"uid": 1, "write_paths": [], "extra": 1}]"#).is_err());
        assert!(parse_delegations(r#"{"uid": 1}"#).is_err());
    }
}
