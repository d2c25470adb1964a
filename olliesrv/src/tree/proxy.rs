//! The toolsrv views: a session's `toolsrv/` (the operator's identity, read-only but for
//! `bypass/`) and an agent's `proc/` (its own identity), proxied fid by fid to the session's
//! toolsrv.

use std::sync::Arc;

use bytes::Bytes;
use ollie_p9::server::Walked;
use ollie_p9::util::DirSnapshot;
use ollie_p9::wire::{Qid, dm, om};
use ollie_p9::{Error, Fid as RemoteFid, Result};

use crate::state::bypass::Undelivered;
use crate::state::{Agent, Session};

use super::node::{Class, Node, OllieFid, Proxy};
use super::table::{AFile, SFile};
use super::{GROUP, LINK_WAIT, OllieFs, err, gone};

impl OllieFs {
    pub(super) async fn tools_fid(&self, a: &Agent) -> Result<Arc<RemoteFid>> {
        let s = a.session.upgrade().ok_or_else(gone)?;
        let c = s.link.conn(LINK_WAIT).await.map_err(err)?;
        c.agent_root(&a.tools_spec(), &self.shared.config())
            .await
            .map_err(err)
    }

    pub(super) async fn remote_rdwr(
        &self,
        a: &Agent,
        path: &[&str],
        data: Option<&str>,
    ) -> Result<String> {
        let root = self.tools_fid(a).await?;
        let mut f = root.walk(path).await.map_err(|e| err(e.to_string()))?;
        let mode = if data.is_some() { om::ORDWR } else { om::OREAD };
        f.open(mode).await.map_err(|e| err(e.to_string()))?;
        if let Some(d) = data {
            f.write(0, Bytes::from(d.to_owned()))
                .await
                .map_err(|e| err(e.to_string()))?;
        }
        let b = f.read_to_end().await.map_err(|e| err(e.to_string()))?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    pub(super) async fn remote_write(&self, a: &Agent, path: &[&str], data: &str) -> Result<()> {
        let root = self.tools_fid(a).await?;
        let mut f = root.walk(path).await.map_err(|e| err(e.to_string()))?;
        f.open(om::OWRITE).await.map_err(|e| err(e.to_string()))?;
        f.write(0, Bytes::from(data.to_owned()))
            .await
            .map_err(|e| err(e.to_string()))?;
        Ok(())
    }

    pub(super) async fn proc_top(&self, a: &Agent) -> Result<String> {
        let list = self.remote_rdwr(a, &["proc", "list"], None).await?;
        let mut out = format!("{:<6} {:<8} {:<14} {}\n", "PID", "STATE", "TOOL", "CMD");
        for line in list.lines() {
            let mut it = line.split('\t');
            let (Some(pid), Some(state), Some(tool)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let stat = self
                .remote_rdwr(a, &["proc", pid, "stat"], None)
                .await
                .unwrap_or_default();
            let cmd = stat
                .lines()
                .find_map(|l| l.strip_prefix("cmd="))
                .unwrap_or("");
            out.push_str(&format!("{pid:<6} {state:<8} {tool:<14} {cmd}\n"));
        }
        Ok(out)
    }

    pub(super) async fn proxy_root(
        &self,
        s: &Arc<Session>,
        agent: Option<&Arc<Agent>>,
    ) -> Result<Arc<RemoteFid>> {
        let c = s.link.conn(LINK_WAIT).await.map_err(err)?;
        match agent {
            Some(a) => c
                .agent_root(&a.tools_spec(), &self.shared.config())
                .await
                .map_err(err),
            None => {
                let f = c
                    .operator
                    .clone_fid()
                    .await
                    .map_err(|e| err(e.to_string()))?;
                Ok(Arc::new(f))
            }
        }
    }

    pub(super) fn proxy_qid(s: &Session, agent: bool, q: Qid) -> Qid {
        Qid {
            ty: q.ty,
            version: q.version,
            path: (0xF << 60)
                | (u64::from(agent) << 59)
                | ((u64::from(s.handle) & 0x7_FFFF) << 40)
                | (q.path & ((1 << 40) - 1)),
        }
    }

    /// The mode a proxied file shows: read-only, except `bypass/` (owner only) in the
    /// session view and `ctl` of a process in an agent's view.
    pub(super) fn proxy_mode(p: &Proxy, remote_mode: u32) -> u32 {
        let dir = remote_mode & dm::DIR;
        let bits = if dir != 0 {
            if p.agent.is_none() { 0o500 } else { 0o555 }
        } else {
            match (p.agent.is_some(), p.path.as_slice()) {
                (false, [b, f]) if b == "bypass" && f == "resolve" => 0o200,
                (false, [b, f]) if b == "bypass" && f == "pending" => 0o400,
                (false, [b, f]) if b == "bypass" && f == "full" => 0o600,
                (false, _) => 0o400,
                (true, [_, _, f]) if f == "ctl" => 0o222,
                (true, _) => 0o444,
            }
        };
        dir | bits
    }

    pub(super) fn may_write_proxy(p: &Proxy) -> bool {
        match (p.agent.is_some(), p.path.as_slice()) {
            (false, [b, f]) => b == "bypass" && (f == "resolve" || f == "full"),
            (true, [_, _, f]) => f == "ctl",
            _ => false,
        }
    }

    /// Walks a proxy: `names` from `p` (which may be the view's root, path empty).
    pub(super) async fn proxy_walk(&self, p: &Proxy, names: &[String]) -> Result<Walked<OllieFid>> {
        let mut qids = Vec::new();
        let mut path = p.path.clone();
        for (i, n) in names.iter().enumerate() {
            if n == ".." {
                // Leaving the view is handled by the caller; inside it, go up.
                if path.pop().is_none() {
                    return if i == 0 {
                        Err(Error::not_found())
                    } else {
                        Ok(Walked { qids, fid: None })
                    };
                }
                qids.push(p.qid);
                continue;
            }
            // An agent's view shows process directories only.
            if p.agent.is_some() && path.is_empty() && n.parse::<u32>().is_err() {
                return if i == 0 {
                    Err(Error::not_found())
                } else {
                    Ok(Walked { qids, fid: None })
                };
            }
            path.push(n.clone());
            qids.push(p.qid);
        }
        let root = self.proxy_root(&p.session, p.agent.as_ref()).await?;
        let mut remote_path: Vec<String> = Vec::new();
        if p.agent.is_some() {
            remote_path.push("proc".into());
        }
        remote_path.extend(path.iter().cloned());
        let rf = root
            .walk(&remote_path)
            .await
            .map_err(|e| err(e.to_string()))?;
        let q = Self::proxy_qid(&p.session, p.agent.is_some(), rf.qid());
        let n = qids.len();
        if n > 0 {
            qids[n - 1] = q;
        }
        let mut fid = OllieFid::new(
            match &p.agent {
                Some(a) => Node::A(Arc::clone(a), AFile::ProcDir),
                None => Node::S(Arc::clone(&p.session), SFile::Toolsrv),
            },
            Class::Owner,
        );
        fid.proxy = Some(Proxy {
            session: Arc::clone(&p.session),
            agent: p.agent.clone(),
            path,
            remote: Some(rf),
            qid: q,
        });
        Ok(Walked {
            qids,
            fid: Some(fid),
        })
    }

    /// `Tread` on a toolsrv view: a directory is listed through the remote fid (with our
    /// owner, group, modes and qids), a file is read through.
    pub(super) async fn proxy_read(
        &self,
        fid: &mut OllieFid,
        offset: u64,
        count: u32,
    ) -> Result<Bytes> {
        let p = fid.proxy.as_ref().ok_or_else(Error::not_found)?;
        let r = p.remote.as_ref().ok_or_else(Error::not_found)?;
        if !r.qid().is_dir() {
            return r.read(offset, count).await.map_err(|e| err(e.to_string()));
        }
        if offset == 0 || fid.dir.is_none() {
            let mut rc = r.clone_fid().await.map_err(|e| err(e.to_string()))?;
            rc.open(om::OREAD).await.map_err(|e| err(e.to_string()))?;
            let mut entries = rc.read_dir().await.map_err(|e| err(e.to_string()))?;
            let (session, agent) = (Arc::clone(&p.session), p.agent.is_some());
            for e in &mut entries {
                let mut child = Proxy {
                    session: Arc::clone(&session),
                    agent: p.agent.clone(),
                    path: p.path.clone(),
                    remote: None,
                    qid: e.qid,
                };
                child.path.push(e.name.clone());
                e.mode = Self::proxy_mode(&child, e.mode);
                e.qid = Self::proxy_qid(&session, agent, e.qid);
                e.uid = self.shared.owner.clone();
                e.gid = GROUP.to_owned();
                e.muid = self.shared.owner.clone();
            }
            fid.dir = Some(DirSnapshot::new(&entries));
        }
        fid.dir
            .as_ref()
            .map_or(Ok(Bytes::new()), |d| d.read(offset, count))
    }

    /// `Twrite` on a toolsrv view, written through; a verdict written to the session's own
    /// `bypass/resolve` is audited too.
    pub(super) async fn proxy_write(
        &self,
        fid: &OllieFid,
        offset: u64,
        data: Bytes,
    ) -> Result<u32> {
        let p = fid.proxy.as_ref().ok_or_else(Error::not_found)?;
        let r = p.remote.as_ref().ok_or_else(Error::not_found)?;
        let sent = r.write(offset, data.clone()).await;
        if p.agent.is_none() && p.path == ["bypass", "resolve"] {
            let outcome = sent.as_ref().map(|_| ()).map_err(Undelivered::of_write);
            self.reg()
                .bypass
                .decided(&p.session.id, &data, &fid.user, &outcome);
            if let Err(e) = outcome {
                return Err(err(e.to_string()));
            }
        }
        sent.map_err(|e| err(e.to_string()))
    }
}
