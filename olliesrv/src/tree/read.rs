//! Reading the tree's files: the parts of `Tread` that are more than a lookup — real files
//! of unions and skills, directory listings, and the blocking files that hand out one value
//! per read (`eventwait`, `bypass/pending`, `statewait`, `feed`).

use bytes::Bytes;
use ollie_p9::Result;
use ollie_p9::util::{DirSnapshot, read_at};
use ollie_p9::wire::{Qid, Stat, dm, qt};

use super::node::{Node, OllieFid};
use super::table::{AFile, RootFile, SFile};
use super::union;
use super::{GROUP, OllieFs, err};

/// The frozen contents of a fid (made at open) from `offset`.
pub(super) fn content_at(fid: &OllieFid, offset: u64, count: u32) -> Bytes {
    fid.content
        .as_ref()
        .map_or(Bytes::new(), |c| read_at(c, offset, count))
}

/// The reply of a fid's last write from `offset`.
pub(super) fn reply_at(fid: &OllieFid, offset: u64, count: u32) -> Bytes {
    fid.reply
        .as_ref()
        .map_or(Bytes::new(), |r| read_at(r, offset, count))
}

/// A fid's directory snapshot from `offset` (whole entries only).
pub(super) fn dir_at(fid: &OllieFid, offset: u64, count: u32) -> Result<Bytes> {
    fid.dir
        .as_ref()
        .map_or(Ok(Bytes::new()), |d| d.read(offset, count))
}

impl OllieFs {
    /// A file or directory of a union view or a skill: its open file, else its listing.
    pub(super) fn read_real(
        &self,
        fid: &mut OllieFid,
        node: &Node,
        offset: u64,
        count: u32,
    ) -> Result<Bytes> {
        if let Some(f) = &fid.ufile {
            return union::read_file_at(f, offset, count)
                .map(Bytes::from)
                .map_err(err);
        }
        if offset == 0 || fid.dir.is_none() {
            let entries = match node {
                Node::K(k) => k.list(&self.shared.config(), &self.shared.owner),
                Node::U(u) => u.list(&self.shared.owner),
                _ => Ok(Vec::new()),
            }
            .map_err(err)?;
            fid.dir = Some(DirSnapshot::new(&entries));
        }
        dir_at(fid, offset, count)
    }

    /// The entries of a directory of the tree; an agent's `proc/` adds the process
    /// directories its toolsrv lists.
    pub(super) async fn dir_entries(&self, node: &Node) -> Vec<Stat> {
        let mut entries = self.entries(node);
        if let Node::A(a, AFile::ProcDir) = node
            && let Ok(list) = self.remote_rdwr(a, &["proc", "list"], None).await
            && let Some(s) = a.session.upgrade()
        {
            for line in list.lines() {
                let Some(pid) = line.split('\t').next() else {
                    continue;
                };
                let Ok(n) = pid.parse::<u64>() else {
                    continue;
                };
                entries.push(Stat {
                    ty: 0,
                    dev: 0,
                    qid: Self::proxy_qid(
                        &s,
                        true,
                        Qid {
                            ty: qt::DIR,
                            version: 0,
                            path: (n << 4) & ((1 << 40) - 1),
                        },
                    ),
                    mode: dm::DIR | 0o555,
                    atime: self.shared.started,
                    mtime: self.shared.started,
                    length: 0,
                    name: pid.to_owned(),
                    uid: self.shared.owner.clone(),
                    gid: GROUP.to_owned(),
                    muid: self.shared.owner.clone(),
                });
            }
        }
        entries
    }

    /// Waits for the next value of a blocking file and puts it in `fid.pending`; `false`
    /// when there will be none (end of file).
    pub(super) async fn next_value(&self, fid: &mut OllieFid, node: &Node) -> Result<bool> {
        match node {
            Node::R(RootFile::BypassPending) => {
                let shown = self.reg().bypass.next(&mut fid.seen).await;
                fid.pending = Bytes::from(shown.as_bytes().to_vec());
            }
            Node::R(RootFile::Eventwait) => match self.shared.events.next_after(fid.cursor).await {
                Some((seq, line)) => {
                    fid.cursor = seq;
                    fid.pending = Bytes::from(line);
                }
                None => return Ok(false),
            },
            Node::S(s, SFile::Net) => match s.net.next_after(fid.cursor).await {
                Some((seq, line)) => {
                    fid.cursor = seq;
                    fid.pending = Bytes::from(line);
                }
                None => return Ok(false),
            },
            Node::A(a, AFile::Statewait) => {
                if a.is_killed() && fid.cursor >= a.state().0 {
                    return Ok(false);
                }
                let (seq, _) = a.next_state(fid.cursor).await;
                fid.cursor = seq;
                fid.pending = Bytes::from(format!("{}\n", a.state_text()));
            }
            Node::A(a, AFile::Feed) => match a.next_feed(fid.last_feed.as_ref()).await {
                Some(v) => {
                    fid.last_feed = Some(v.clone());
                    fid.pending = v;
                }
                None => return Ok(false),
            },
            _ => return Ok(false),
        }
        Ok(true)
    }
}
