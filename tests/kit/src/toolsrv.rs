//! The toolsrv harness: the real binary started over a socketpair, as olliesrv starts it.
//!
//! Each [`Ts`] runs on a fresh temporary workspace and home with the shipped policies, speaks
//! 9P to it with the link's version handshake, attaches agents and the operator with Tauth, and
//! kills and reaps toolsrv when dropped.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use ollie_link::auth::{Identity, MasterKey};
use ollie_link::boot::Bootstrap;
use ollie_link::spawn::{Toolsrv, attach};
use ollie_p9::{Client, Fid};

use crate::client::within;
use crate::server::bin;

pub const WORKSPACE_TOML: &str = include_str!("../../../packaging/policy/workspace.toml");
pub const READONLY_TOML: &str = include_str!("../../../packaging/policy/readonly.toml");
pub const NETWORK_TOML: &str = include_str!("../../../packaging/policy/network.toml");

/// The msize [`Ts::start`] negotiates.
pub const MSIZE: u32 = 1 << 16;

/// The shipped policies, by name.
pub fn shipped_policies() -> BTreeMap<String, String> {
    let mut p = BTreeMap::new();
    p.insert("workspace".to_owned(), WORKSPACE_TOML.to_owned());
    p.insert("readonly".to_owned(), READONLY_TOML.to_owned());
    p.insert("network".to_owned(), NETWORK_TOML.to_owned());
    p
}

/// A number unique in this test process (for `sleep` markers and file names).
pub fn unique() -> u32 {
    static N: AtomicU32 = AtomicU32::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A session's directories: the workspace `w/` and the home `home/` under one tempdir.
#[derive(Debug)]
pub struct Dirs {
    pub dir: tempfile::TempDir,
    pub ws: PathBuf,
    pub home: PathBuf,
}

impl Dirs {
    pub fn new() -> Dirs {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = dir.path().join("w");
        let home = dir.path().join("home");
        std::fs::create_dir(&ws).expect("mkdir w");
        std::fs::create_dir(&home).expect("mkdir home");
        // The sandbox user (root or not) must be able to enter the tree.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod the tempdir");
        Dirs { dir, ws, home }
    }

    /// A boot configuration with the shipped policies and "workspace" as the default.
    pub fn boot(&self) -> Bootstrap {
        Bootstrap::new(
            format!("test-{}", unique()),
            self.ws.clone(),
            self.home.clone(),
            shipped_policies(),
            "workspace",
        )
    }
}

impl Default for Dirs {
    fn default() -> Dirs {
        Dirs::new()
    }
}

/// A running toolsrv and our connection to it; the child is killed (if still running) and
/// reaped when dropped.
#[derive(Debug)]
pub struct Ts {
    pub ts: Toolsrv,
    /// Our end of the link (`None` once closed).
    pub c: Option<Client>,
    pub dirs: Dirs,
}

impl Drop for Ts {
    fn drop(&mut self) {
        let _ = self.ts.child().kill();
        let _ = self.ts.child().wait();
    }
}

impl Ts {
    /// Starts toolsrv with the default boot configuration.
    pub async fn start() -> Ts {
        let dirs = Dirs::new();
        let boot = dirs.boot();
        Ts::start_with(dirs, &boot).await
    }

    /// Starts toolsrv on `dirs` with `boot`, negotiating [`MSIZE`].
    pub async fn start_with(dirs: Dirs, boot: &Bootstrap) -> Ts {
        Ts::start_msize(dirs, boot, MSIZE).await
    }

    /// Starts toolsrv on `dirs` with `boot`, negotiating `msize`.
    pub async fn start_msize(dirs: Dirs, boot: &Bootstrap, msize: u32) -> Ts {
        let mut ts = Toolsrv::spawn(&bin("toolsrv"), boot).expect("spawn toolsrv");
        let c = within("version handshake", ts.connect(msize))
            .await
            .expect("version handshake with toolsrv");
        Ts {
            ts,
            c: Some(c),
            dirs,
        }
    }

    pub fn c(&self) -> &Client {
        self.c.as_ref().expect("the link was closed")
    }

    pub fn key(&self) -> &MasterKey {
        self.ts.key()
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.ts.pid()).expect("pid")
    }

    /// Attaches as agent `a` (or the operator for "operator").
    pub async fn attach(&self, aname: &str) -> Fid {
        let id = Identity::from_aname(aname).unwrap_or_else(|e| panic!("aname {aname}: {e}"));
        within("attach", attach(self.c(), self.key(), &id))
            .await
            .unwrap_or_else(|e| panic!("attach as {aname}: {e}"))
    }

    pub fn ws(&self) -> &Path {
        &self.dirs.ws
    }
}
