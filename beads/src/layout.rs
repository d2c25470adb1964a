//! The on-disk layout of a bead: kind folders and dated kind-folder sets.

use std::fs;
use std::path::{Path, PathBuf};

use crate::clock::is_date_name;

/// A kind folder. Creates under `notes/`, `skills/` or `artifacts/` of a union view land in the
/// create target's dated folder of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `notes/`
    Notes,
    /// `skills/`
    Skills,
    /// `artifacts/`
    Artifacts,
}

impl Kind {
    /// Every kind, in the order listings and reports use.
    pub const ALL: [Kind; 3] = [Kind::Notes, Kind::Skills, Kind::Artifacts];

    /// The folder name (`notes`, `skills`, `artifacts`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Notes => "notes",
            Kind::Skills => "skills",
            Kind::Artifacts => "artifacts",
        }
    }

    /// The kind whose folder is called `name`, if any.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The dated folders (`YYYY-MM-DD`, real directories, not symlinks) of a bead, newest first.
/// An unreadable bead has none.
pub(crate) fn dated_dirs(bead_dir: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(bead_dir) else {
        return Vec::new();
    };
    let mut dates: Vec<String> = rd
        .filter_map(Result::ok)
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| is_date_name(n))
        .collect();
    dates.sort_unstable_by(|a, b| b.cmp(a));
    dates
}

/// Where a member's view of `kind/` comes from, highest priority first: every
/// `<date>/<kind>/` newest date first, then a plain `<kind>/`. The paths may not exist.
pub(crate) fn kind_sources(bead_dir: &Path, kind: Kind) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = dated_dirs(bead_dir)
        .into_iter()
        .map(|d| bead_dir.join(d).join(kind.as_str()))
        .collect();
    v.push(bead_dir.join(kind.as_str()));
    v
}
