//! The union directories of a bead namespace as 9P nodes (`ns/ctl`, the points under `ns/`),
//! served over the session's or agent's [`NsHome`].

use std::fs::{self, File, Metadata};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;

use ollie_beads::{Command, NodeKind, Resolved};
use ollie_p9::wire::{Qid, Stat, dm, om, qt};
use serde_json::{Map, Value};

use crate::state::events::Events;
use crate::state::ns::{NsHome, RFORK_AGENT, RFORK_SESSION, view_path};
use crate::state::{Agent, Session};

use super::GROUP;

/// The high bits of every union qid path (other files use lower ranges, toolsrv views `0xF`).
const QID_TAG: u64 = 0xE << 60;

// ---------------------------------------------------------------------------------------
// ctl

/// Whose namespace a file belongs to.
#[derive(Debug, Clone)]
pub enum NsOwner {
    Session(Arc<Session>),
    Agent(Arc<Agent>),
}

impl NsOwner {
    pub fn home(&self) -> &NsHome {
        match self {
            NsOwner::Session(s) => &s.ns,
            NsOwner::Agent(a) => &a.ns,
        }
    }

    pub fn is_killed(&self) -> bool {
        match self {
            NsOwner::Session(s) => s.is_killed(),
            NsOwner::Agent(a) => a.is_killed(),
        }
    }
}

/// One command written to `ns/ctl`: at most one non-blank line.
fn one_command(text: &str) -> Result<&str, String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    match lines.as_slice() {
        [] => Ok(""),
        [one] => Ok(one.trim()),
        more => Err(format!(
            "one command per write, got {} lines (invalid argument)",
            more.len()
        )),
    }
}

/// Runs one `ns/ctl` write and returns the reply. `ns`, `rfork` and `list` change nothing; `start`,
/// `mount` and `unmount` are saved before they take effect and announced as `ns-changed`.
pub fn ctl(owner: &NsOwner, text: &str, events: &Events) -> Result<String, String> {
    let line = one_command(text)?;
    let cmd = Command::parse(line)?;
    let home = owner.home();
    match cmd {
        Command::Ns => return Ok(home.table()),
        Command::Rfork => {
            return Ok(match owner {
                NsOwner::Session(_) => RFORK_SESSION,
                NsOwner::Agent(_) => RFORK_AGENT,
            }
            .to_owned());
        }
        Command::List => {
            let env = home.env(true)?;
            let mut scratch = ollie_beads::Namespace::new("list");
            return scratch
                .execute(&env, &cmd)
                .map(|o| o.reply())
                .map_err(|e| e.to_string());
        }
        _ => {}
    }
    let env = home.env(true)?;
    let reply = home.execute(&env, &cmd)?;
    let (session, agent) = match owner {
        NsOwner::Session(s) => (s.id.clone(), Value::Null),
        NsOwner::Agent(a) => (a.session_id.clone(), Value::from(a.id.clone())),
    };
    let mut f = Map::new();
    f.insert("session".into(), Value::from(session));
    f.insert("agent".into(), agent);
    f.insert("command".into(), Value::from(line));
    events.emit("ns-changed", f);
    Ok(reply)
}

// ---------------------------------------------------------------------------------------
// Union views over 9P

/// A name in a union directory: the point (`/ctx`) and the path below it (`""` for the
/// point's own directory), with the qid it had when it was walked to.
#[derive(Debug, Clone)]
pub struct UnionNode {
    pub owner: NsOwner,
    pub point: String,
    pub rel: String,
    pub qid: Qid,
}

/// An open union file.
pub type UnionFile = File;

fn clamp_time(t: i64) -> u32 {
    u32::try_from(t.max(0)).unwrap_or(u32::MAX)
}

/// The qid of a real file: path from device and inode, version from the mtime.
pub fn qid_of(md: &Metadata) -> Qid {
    qid_tagged(md, QID_TAG)
}

/// [`qid_of`] with another tag in the top four bits of the path, so that the real files of
/// two trees (bead unions, skills) never share a qid path.
pub fn qid_tagged(md: &Metadata, tag: u64) -> Qid {
    let mixed = md.ino() ^ md.dev().wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    Qid {
        ty: if md.is_dir() { qt::DIR } else { qt::FILE },
        version: clamp_time(md.mtime()),
        path: tag | (mixed & ((1 << 60) - 1)),
    }
}

/// The mode a real file shows: its owner bits for owner and group, nothing for others.
pub fn mode_of(md: &Metadata) -> u32 {
    let bits = (md.mode() >> 6) & 7;
    (if md.is_dir() { dm::DIR } else { 0 }) | (bits << 6) | (bits << 3)
}

fn stat_of(md: &Metadata, name: String, owner: &str) -> Stat {
    real_stat(md, qid_of(md), mode_of(md), name, owner)
}

/// The stat of a real file as a tree of ours serves it: its times and length, `owner` and the
/// group `agent`, with the given qid and mode.
pub fn real_stat(md: &Metadata, qid: Qid, mode: u32, name: String, owner: &str) -> Stat {
    Stat {
        ty: 0,
        dev: 0,
        qid,
        mode,
        atime: clamp_time(md.atime()),
        mtime: clamp_time(md.mtime()),
        length: if md.is_dir() { 0 } else { md.len() },
        name,
        uid: owner.to_owned(),
        gid: GROUP.to_owned(),
        muid: owner.to_owned(),
    }
}

fn metadata(r: &Resolved, vp: &str) -> Result<Metadata, String> {
    fs::metadata(&r.path).map_err(|e| match e.kind() {
        ErrorKind::NotFound => format!("{vp}: file does not exist"),
        _ => format!("{vp}: {e}"),
    })
}

/// The stats of the point directories of `owner`'s namespace (for listing `ns/`).
pub fn point_stats(owner: &NsOwner, user: &str) -> Vec<Stat> {
    owner
        .home()
        .points()
        .into_iter()
        .filter_map(|p| UnionNode::at(owner.clone(), &p, "").ok())
        .filter_map(|u| u.stat(user).ok())
        .collect()
}

impl UnionNode {
    /// The node `rel` of `point`, which must exist.
    fn at(owner: NsOwner, point: &str, rel: &str) -> Result<UnionNode, String> {
        let home = owner.home();
        let env = home.env(false)?;
        let r = home
            .snapshot()
            .lookup(&env, point, rel)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{}: file does not exist", view_path(point, rel)))?;
        let md = metadata(&r, &view_path(point, rel))?;
        Ok(UnionNode {
            owner,
            point: point.to_owned(),
            rel: rel.to_owned(),
            qid: qid_of(&md),
        })
    }

    /// The point directory served as `name` in `owner`'s `ns/`.
    pub fn top(owner: NsOwner, name: &str) -> Result<UnionNode, String> {
        let point = owner
            .home()
            .point_named(name)
            .ok_or_else(|| format!("{name}: file does not exist"))?;
        UnionNode::at(owner, &point, "")
    }

    /// The entry `name` of this directory.
    pub fn child(&self, name: &str) -> Result<UnionNode, String> {
        let rel = if self.rel.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.rel)
        };
        UnionNode::at(self.owner.clone(), &self.point, &rel)
    }

    /// The directory this is in; `None` for the point's own directory.
    pub fn parent(&self) -> Option<Result<UnionNode, String>> {
        if self.rel.is_empty() {
            return None;
        }
        let up = self.rel.rsplit_once('/').map_or("", |(p, _)| p);
        Some(UnionNode::at(self.owner.clone(), &self.point, up))
    }

    /// The last path element (the point's directory name for the point itself).
    pub fn name(&self) -> String {
        match self.rel.rsplit_once('/') {
            Some((_, n)) => n.to_owned(),
            None if self.rel.is_empty() => ollie_beads::point_dir_name(&self.point).to_owned(),
            None => self.rel.clone(),
        }
    }

    fn view_path(&self) -> String {
        view_path(&self.point, &self.rel)
    }

    fn resolve(&self) -> Result<(Resolved, Metadata), String> {
        let home = self.owner.home();
        let env = home.env(false)?;
        let vp = self.view_path();
        let r = home
            .snapshot()
            .lookup(&env, &self.point, &self.rel)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{vp}: file does not exist"))?;
        let md = metadata(&r, &vp)?;
        Ok((r, md))
    }

    /// The mode the name shows now ([`mode_of`]); 0 when it no longer resolves.
    pub fn mode(&self) -> u32 {
        self.resolve().map_or(0, |(_, md)| mode_of(&md))
    }

    /// The stat of what the name resolves to now.
    pub fn stat(&self, user: &str) -> Result<Stat, String> {
        let (_, md) = self.resolve()?;
        Ok(stat_of(&md, self.name(), user))
    }

    /// Opens the name: for reading, the winning file as it is; for writing, the file
    /// [`Namespace::open_write`](ollie_beads::Namespace::open_write) gives (copied up unless it is writable in place), truncated
    /// with `OTRUNC`. A directory is opened for reading only and has no file.
    pub fn open(&self, mode: u8) -> Result<(Qid, Option<UnionFile>), String> {
        let (r, md) = self.resolve()?;
        let vp = self.view_path();
        if r.node == NodeKind::Dir {
            return Ok((qid_of(&md), None));
        }
        let write = matches!(mode & 3, om::OWRITE | om::ORDWR) || mode & om::OTRUNC != 0;
        if !write {
            let f = r.open(false).map_err(|e| format!("{vp}: {e}"))?;
            return Ok((qid_of(&md), Some(f)));
        }
        let home = self.owner.home();
        let env = home.env(false)?;
        let w = home
            .snapshot()
            .open_write(&env, &self.point, &self.rel)
            .map_err(|e| e.to_string())?;
        let f = w.open(true).map_err(|e| format!("{vp}: {e}"))?;
        if mode & om::OTRUNC != 0 {
            f.set_len(0).map_err(|e| format!("{vp}: {e}"))?;
        }
        let md = f.metadata().map_err(|e| format!("{vp}: {e}"))?;
        Ok((qid_of(&md), Some(f)))
    }

    /// The directory's entries (the union listing, first layer wins) as stats.
    pub fn list(&self, user: &str) -> Result<Vec<Stat>, String> {
        let home = self.owner.home();
        let env = home.env(false)?;
        let entries = home
            .snapshot()
            .read_dir(&env, &self.point, &self.rel)
            .map_err(|e| e.to_string())?;
        Ok(entries
            .into_iter()
            .filter_map(|e| {
                let md = fs::metadata(&e.path).ok()?;
                Some(stat_of(&md, e.name, user))
            })
            .collect())
    }

    /// Creates `name` (a file, or with `dir` a directory) in this directory, routed as
    /// [`Namespace::create`](ollie_beads::Namespace::create) says; returns the new node and, for a file, the file opened for
    /// writing when `mode` asks for it (else for reading).
    pub fn create(
        &self,
        name: &str,
        dir: bool,
        mode: u8,
    ) -> Result<(UnionNode, Option<UnionFile>), String> {
        let rel = if self.rel.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.rel)
        };
        let home = self.owner.home();
        let env = home.env(false)?;
        let node = if dir { NodeKind::Dir } else { NodeKind::File };
        let r = home
            .snapshot()
            .create(&env, &self.point, &rel, node)
            .map_err(|e| e.to_string())?;
        let vp = view_path(&self.point, &rel);
        let md = metadata(&r, &vp)?;
        let file = if dir {
            None
        } else {
            let write = matches!(mode & 3, om::OWRITE | om::ORDWR);
            Some(r.open(write).map_err(|e| format!("{vp}: {e}"))?)
        };
        Ok((
            UnionNode {
                owner: self.owner.clone(),
                point: self.point.clone(),
                rel,
                qid: qid_of(&md),
            },
            file,
        ))
    }

    /// Removes the name ([`Namespace::remove`](ollie_beads::Namespace::remove): never from a read-only member).
    pub fn remove(&self) -> Result<(), String> {
        let home = self.owner.home();
        let env = home.env(false)?;
        home.snapshot()
            .remove(&env, &self.point, &self.rel)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// Applies a Twstat: a new name (a rename in the same directory, [`Namespace::rename`](ollie_beads::Namespace::rename))
    /// and/or a new length (through [`Namespace::open_write`](ollie_beads::Namespace::open_write)). Every other field must be
    /// "don't touch" or equal to the current value. Everything is checked before anything
    /// changes; the length is set before the rename.
    pub fn wstat(&mut self, st: &Stat, user: &str) -> Result<(), String> {
        let cur = self.stat(user)?;
        let vp = self.view_path();
        let refuse = |what: &str| {
            Err(format!(
                "permission denied: {vp}: cannot change the {what} of a file in a namespace view (only its name and length)"
            ))
        };
        if st.mode != u32::MAX && st.mode != cur.mode {
            return refuse("mode");
        }
        if st.mtime != u32::MAX && st.mtime != cur.mtime {
            return refuse("modification time");
        }
        if st.atime != u32::MAX && st.atime != cur.atime {
            return refuse("access time");
        }
        if (!st.uid.is_empty() && st.uid != cur.uid) || (!st.gid.is_empty() && st.gid != cur.gid) {
            return refuse("owner or group");
        }
        let rename = (!st.name.is_empty() && st.name != cur.name).then_some(st.name.as_str());
        if let Some(n) = rename {
            if self.rel.is_empty() {
                return Err(format!(
                    "permission denied: {vp}: the mount point itself cannot be renamed; use unmount and mount"
                ));
            }
            if n.contains('/') || n == "." || n == ".." {
                return Err(format!(
                    "invalid name {n:?}: a rename stays in the same directory (invalid argument)"
                ));
            }
        }
        let length = (st.length != u64::MAX && st.length != cur.length).then_some(st.length);
        if length.is_some() && cur.mode & dm::DIR != 0 {
            return Err(format!("{vp}: is a directory"));
        }
        let home = self.owner.home();
        let env = home.env(false)?;
        let ns = home.snapshot();
        if let Some(len) = length {
            let w = ns
                .open_write(&env, &self.point, &self.rel)
                .map_err(|e| e.to_string())?;
            let f = w.open(true).map_err(|e| format!("{vp}: {e}"))?;
            crate::util::blocking(|| f.set_len(len).and_then(|()| f.sync_all()))
                .map_err(|e| format!("{vp}: {e}"))?;
        }
        if let Some(n) = rename {
            let to = match self.rel.rsplit_once('/') {
                Some((dir, _)) => format!("{dir}/{n}"),
                None => n.to_owned(),
            };
            let r = ns
                .rename(&env, &self.point, &self.rel, &to)
                .map_err(|e| e.to_string())?;
            self.rel = to;
            if let Ok(md) = fs::metadata(&r.path) {
                self.qid = qid_of(&md);
            }
        }
        Ok(())
    }
}

/// Reads up to `count` bytes at `offset` of an open union file.
pub fn read_file_at(f: &UnionFile, offset: u64, count: u32) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; count as usize];
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], offset.saturating_add(got as u64)) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("cannot read: {e}")),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// Writes `data` at `offset` of an open union file.
pub fn write_file_at(f: &UnionFile, offset: u64, data: &[u8]) -> Result<(), String> {
    f.write_all_at(data, offset)
        .map_err(|e| format!("cannot write: {e}"))
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_command_per_write() {
        assert_eq!(one_command("mount A /ctx\n").unwrap(), "mount A /ctx");
        assert_eq!(one_command("\n  ns  \n\n").unwrap(), "ns");
        assert_eq!(one_command("").unwrap(), "");
        let e = one_command("ns\nrfork\n").unwrap_err();
        assert!(e.contains("one command per write"), "{e}");
    }

    #[test]
    fn modes_show_the_owner_bits_to_the_group() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o604)).unwrap();
        let md = std::fs::metadata(&f).unwrap();
        assert_eq!(mode_of(&md), 0o660);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert_eq!(mode_of(&std::fs::metadata(&f).unwrap()), 0o440);
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let d = std::fs::metadata(t.path()).unwrap();
        assert_eq!(mode_of(&d), dm::DIR | 0o770);
        let q = qid_of(&d);
        assert_eq!(q.ty, qt::DIR);
        assert_eq!(q.path >> 60, 0xE);
        assert_eq!(
            qid_of(&md).path,
            qid_of(&std::fs::metadata(&f).unwrap()).path
        );
        assert_ne!(qid_of(&md).path, q.path);
    }
}
