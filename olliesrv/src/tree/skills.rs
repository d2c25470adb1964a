//! The `skills/` tree as 9P nodes: each skill directory of the catalogue
//! ([`crate::skills`]) served read-only, or writable by the owner in the first skill path.

use std::fs::{File, Metadata};
use std::io::ErrorKind;
use std::path::PathBuf;

use ollie_p9::wire::{Qid, Stat, dm};

use crate::config::Config;
use crate::skills::{
    Catalog, MAX_ENTRIES, MAX_NAME, SKILL_FILE, base, lookup, paths, pending, resolve_in,
    valid_name,
};

/// Qid paths of skill files: this tag, mixed with device and inode.
const QID_TAG: u64 = 0xD << 60;

/// A file or directory in `skills/NAME/` (`rel` "" is `skills/NAME` itself), with the qid it
/// had when it was walked to and whether it is in the first skill path (the owner may change
/// it). Resolved again on every request.
#[derive(Debug, Clone)]
pub struct SkillNode {
    pub skill: String,
    pub rel: String,
    pub qid: Qid,
    pub writable: bool,
}

/// The qid of a real file of a skill (its own tag: never a bead file's qid).
fn qid_of(md: &Metadata) -> Qid {
    crate::tree::union::qid_tagged(md, QID_TAG)
}

/// Directories 0555 and files 0444, with the owner's write bit in the first skill path.
fn mode_of(is_dir: bool, writable: bool) -> u32 {
    let w = if writable { 0o200 } else { 0 };
    if is_dir {
        dm::DIR | 0o555 | w
    } else {
        0o444 | w
    }
}

fn stat_of(md: &Metadata, name: String, owner: &str, writable: bool) -> Stat {
    crate::tree::union::real_stat(md, qid_of(md), mode_of(md.is_dir(), writable), name, owner)
}

/// Why a change is refused in a skill outside the first path.
fn read_only(skill: &str) -> String {
    format!(
        "permission denied: skill {skill} is not in the first skill path, so it is read-only here"
    )
}

/// A name for a new entry: one plain path element.
fn check_entry(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\0')
        || name.len() > 255
    {
        return Err(format!(
            "invalid argument: name {:?}: one path element, not . or .., at most 255 bytes",
            crate::util::clip(name)
        ));
    }
    Ok(())
}

/// An I/O error as the server says it (the DESIGN §3.1 words where they apply).
fn io_words(what: &str, e: &std::io::Error) -> String {
    match e.kind() {
        ErrorKind::AlreadyExists => format!("{what}: file already exists"),
        ErrorKind::NotFound => format!("{what}: file does not exist"),
        ErrorKind::DirectoryNotEmpty => format!("{what}: directory not empty"),
        ErrorKind::PermissionDenied => format!("{what}: permission denied"),
        _ => format!("{what}: {e}"),
    }
}

/// `create` in `skills/`: a new skill directory `NAME` in the first skill path (made if it is
/// missing). Only directories with a skill name; not over a skill that exists.
pub fn create_skill(config: &Config, name: &str, is_dir: bool) -> Result<SkillNode, String> {
    if !is_dir {
        return Err(format!(
            "invalid argument: skills/ holds skill directories only: create skills/{}/ first, then its {SKILL_FILE}",
            crate::util::clip(name)
        ));
    }
    if !valid_name(name) {
        return Err(format!(
            "invalid argument: skill name {:?}: lowercase letters and digits in words joined by '-', at most {MAX_NAME}",
            crate::util::clip(name)
        ));
    }
    let first = paths(config)
        .first()
        .ok_or("no skill_paths are configured: nowhere to create a skill")?;
    if let Some(s) = lookup(config, name) {
        return Err(format!(
            "skills/{name}: file already exists (in {})",
            s.dir.display()
        ));
    }
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(first)
        .map_err(|e| io_words(&first.display().to_string(), &e))?;
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(first.join(name))
        .map_err(|e| io_words(&format!("skills/{name}"), &e))?;
    SkillNode::top(config, name)
}

impl SkillNode {
    fn at(config: &Config, skill: &str, rel: String) -> Result<SkillNode, String> {
        let (_, md, writable) = Self::locate(config, skill, &rel)?;
        Ok(SkillNode {
            skill: skill.to_owned(),
            rel,
            qid: qid_of(&md),
            writable,
        })
    }

    fn locate(
        config: &Config,
        skill: &str,
        rel: &str,
    ) -> Result<(PathBuf, Metadata, bool), String> {
        let (dir, writable) =
            base(config, skill).ok_or_else(|| format!("{skill}: file does not exist"))?;
        let (p, md) = resolve_in(&dir, rel)?;
        Ok((p, md, writable))
    }

    /// `skills/NAME`.
    pub fn top(config: &Config, name: &str) -> Result<SkillNode, String> {
        SkillNode::at(config, name, String::new())
    }

    fn rel_of(&self, name: &str) -> String {
        if self.rel.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.rel)
        }
    }

    /// The entry `name` of this directory.
    pub fn child(&self, config: &Config, name: &str) -> Result<SkillNode, String> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(format!("{name:?}: file does not exist"));
        }
        SkillNode::at(config, &self.skill, self.rel_of(name))
    }

    /// The directory this is in; `None` for `skills/NAME` itself.
    pub fn parent(&self, config: &Config) -> Option<Result<SkillNode, String>> {
        if self.rel.is_empty() {
            return None;
        }
        let up = self.rel.rsplit_once('/').map_or("", |(p, _)| p);
        Some(SkillNode::at(config, &self.skill, up.to_owned()))
    }

    /// The last path element.
    pub fn name(&self) -> String {
        match self.rel.rsplit_once('/') {
            Some((_, n)) => n.to_owned(),
            None if self.rel.is_empty() => self.skill.clone(),
            None => self.rel.clone(),
        }
    }

    /// Its mode: directories 0555, files 0444, plus the owner's write bit in the first path.
    pub fn mode(&self) -> u32 {
        mode_of(self.qid.is_dir(), self.writable)
    }

    pub fn stat(&self, config: &Config, owner: &str) -> Result<Stat, String> {
        let (_, md, writable) = Self::locate(config, &self.skill, &self.rel)?;
        Ok(stat_of(&md, self.name(), owner, writable))
    }

    /// Opens it (`mode` as in Topen): a regular file gives its file, a directory none.
    /// Writing needs the skill to be in the first path.
    pub fn open(&self, config: &Config, mode: u8) -> Result<(Qid, Option<File>), String> {
        use ollie_p9::wire::om;
        use std::os::unix::fs::OpenOptionsExt;
        let (p, md, writable) = Self::locate(config, &self.skill, &self.rel)?;
        let write = matches!(mode & 3, om::OWRITE | om::ORDWR) || mode & om::OTRUNC != 0;
        if md.is_dir() {
            if write {
                return Err(format!("{}: is a directory", self.name()));
            }
            return Ok((qid_of(&md), None));
        }
        if !md.is_file() {
            return Err(format!("{}: not a regular file", self.name()));
        }
        if write && !writable {
            return Err(read_only(&self.skill));
        }
        let f = std::fs::OpenOptions::new()
            .read(mode & 3 != om::OWRITE)
            .write(write)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&p)
            .map_err(|e| io_words(&self.name(), &e))?;
        if mode & om::OTRUNC != 0 {
            f.set_len(0).map_err(|e| io_words(&self.name(), &e))?;
        }
        let md = f.metadata().map_err(|e| io_words(&self.name(), &e))?;
        Ok((qid_of(&md), Some(f)))
    }

    /// Creates `name` in this directory (a file opened for reading and writing, or a
    /// directory); the skill must be in the first path.
    pub fn create(
        &self,
        config: &Config,
        name: &str,
        is_dir: bool,
    ) -> Result<(SkillNode, Option<File>), String> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let (dir, md, writable) = Self::locate(config, &self.skill, &self.rel)?;
        if !writable {
            return Err(read_only(&self.skill));
        }
        if !md.is_dir() {
            return Err(format!("{}: not a directory", self.name()));
        }
        check_entry(name)?;
        let p = dir.join(name);
        let file = if is_dir {
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(&p)
                .map_err(|e| io_words(name, &e))?;
            None
        } else {
            Some(
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(&p)
                    .map_err(|e| io_words(name, &e))?,
            )
        };
        Ok((self.child(config, name)?, file))
    }

    /// Removes it (a directory must be empty); the skill must be in the first path.
    pub fn remove(&self, config: &Config) -> Result<(), String> {
        let (p, md, writable) = Self::locate(config, &self.skill, &self.rel)?;
        if !writable {
            return Err(read_only(&self.skill));
        }
        if md.is_dir() {
            std::fs::remove_dir(&p)
        } else {
            std::fs::remove_file(&p)
        }
        .map_err(|e| io_words(&self.name(), &e))
    }

    /// Twstat: a new length (files) and a new name in the same directory (not over an
    /// existing one; not for `skills/NAME` itself, whose name is the skill's). The skill must
    /// be in the first path.
    pub fn wstat(
        &mut self,
        config: &Config,
        length: Option<u64>,
        name: &str,
    ) -> Result<(), String> {
        use std::os::unix::fs::OpenOptionsExt;
        let (p, md, writable) = Self::locate(config, &self.skill, &self.rel)?;
        if !writable {
            return Err(read_only(&self.skill));
        }
        if let Some(len) = length {
            if md.is_dir() {
                return Err(format!("{}: is a directory", self.name()));
            }
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&p)
                .and_then(|f| f.set_len(len))
                .map_err(|e| io_words(&self.name(), &e))?;
        }
        if !name.is_empty() && name != self.name() {
            if self.rel.is_empty() {
                return Err(
                    "permission denied: a skill's directory keeps its name (create a new skill and copy)"
                        .to_owned(),
                );
            }
            check_entry(name)?;
            let to = p.with_file_name(name);
            if std::fs::symlink_metadata(&to).is_ok() {
                return Err(format!("{name}: file already exists"));
            }
            std::fs::rename(&p, &to).map_err(|e| io_words(name, &e))?;
            let up = self.rel.rsplit_once('/').map_or("", |(d, _)| d);
            self.rel = if up.is_empty() {
                name.to_owned()
            } else {
                format!("{up}/{name}")
            };
        }
        Ok(())
    }

    /// The directory's entries (symbolic links and other special files left out).
    pub fn list(&self, config: &Config, owner: &str) -> Result<Vec<Stat>, String> {
        let (p, md, writable) = Self::locate(config, &self.skill, &self.rel)?;
        if !md.is_dir() {
            return Err(format!("{}: not a directory", self.name()));
        }
        let rd = std::fs::read_dir(&p).map_err(|e| format!("{}: {e}", self.name()))?;
        let mut out: Vec<Stat> = rd
            .take(MAX_ENTRIES)
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let md = std::fs::symlink_metadata(e.path()).ok()?;
                (md.is_dir() || md.is_file()).then(|| stat_of(&md, name, owner, writable))
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// The stats of `skills/NAME` for every winning skill, and for the directories in the first
/// path that are not valid skills yet (for listing `skills/`).
pub fn dir_stats(config: &Config, cat: &Catalog, owner: &str) -> Vec<Stat> {
    let first = paths(config).first().and_then(|p| p.canonicalize().ok());
    let mut out: Vec<Stat> = cat
        .skills
        .iter()
        .filter_map(|s| {
            let md = std::fs::symlink_metadata(&s.dir).ok()?;
            let writable = first.as_deref().is_some_and(|f| s.dir.parent() == Some(f));
            Some(stat_of(&md, s.name.clone(), owner, writable))
        })
        .collect();
    out.extend(pending(config, cat).into_iter().filter_map(|(name, dir)| {
        let md = std::fs::symlink_metadata(dir).ok()?;
        Some(stat_of(&md, name, owner, true))
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skills::tests::skill;

    #[test]
    fn resolution_stays_inside_the_skill() {
        let t = tempfile::tempdir().unwrap();
        let d = skill(t.path(), "deploy", "x");
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/run.sh"), "echo hi\n").unwrap();
        std::fs::write(t.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(t.path().join("secret"), d.join("link")).unwrap();
        assert!(resolve_in(&d, "sub/run.sh").unwrap().1.is_file());
        for bad in ["../secret", "sub/../../secret", "link", "sub/./run.sh"] {
            assert!(resolve_in(&d, bad).is_err(), "{bad}");
        }
        let cfg = Config {
            skill_paths: Some(vec![t.path().to_path_buf()]),
            ..Config::builtin()
        };
        let top = SkillNode::top(&cfg, "deploy").unwrap();
        let names: Vec<String> = top
            .list(&cfg, "me")
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["SKILL.md", "sub"]);
        let f = top
            .child(&cfg, "sub")
            .unwrap()
            .child(&cfg, "run.sh")
            .unwrap();
        let st = f.stat(&cfg, "me").unwrap();
        // In the first path: the owner's write bit.
        assert_eq!((st.mode, st.length), (0o644, 8));
        assert!(top.child(&cfg, "..").is_err());
        assert!(top.child(&cfg, "link").is_err());
        // Behind another first path: read-only, and changes are refused.
        let other = t.path().join("first");
        let cfg = Config {
            skill_paths: Some(vec![other.clone(), t.path().to_path_buf()]),
            ..Config::builtin()
        };
        let top = SkillNode::top(&cfg, "deploy").unwrap();
        assert_eq!(top.mode(), dm::DIR | 0o555);
        let e = top.create(&cfg, "x", false).unwrap_err();
        assert!(e.contains("not in the first skill path"), "{e}");
        assert!(!d.join("x").exists());
        // A new skill goes into the first path (made on demand), not beside deploy.
        let n = create_skill(&cfg, "notes", true).unwrap();
        assert!(other.join("notes").is_dir() && n.writable);
        assert!(
            create_skill(&cfg, "deploy", true)
                .unwrap_err()
                .contains("already exists")
        );
        assert!(
            create_skill(&cfg, "x.y", true)
                .unwrap_err()
                .contains("invalid argument")
        );
        assert!(
            create_skill(&cfg, "f", false)
                .unwrap_err()
                .contains("directories only")
        );
    }
}
