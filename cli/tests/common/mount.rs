//! `o mount` for the tests: a mounted namespace that is unmounted when dropped, and the check
//! that FUSE is usable here (a SKIP line otherwise, a failure under `OLLIE_TEST_REQUIRE=all`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Out, Srv, bin, run};

/// Whether this process may mount FUSE filesystems: `/dev/fuse`, and as a non-root user the
/// setuid `fusermount3`. Prints `SKIP <test>: <reason>` when not (and panics under
/// `OLLIE_TEST_REQUIRE=all`).
pub fn fuse_usable(test: &str) -> bool {
    match ollie_testkit::probe::missing_fuse() {
        None => true,
        Some(r) => {
            ollie_testkit::skip(&format!("SKIP {test}: {r}"));
            false
        }
    }
}

/// The namespace of a server mounted with `o mount` on a temporary directory.
pub struct Mounted {
    dir: tempfile::TempDir,
    addr: String,
}

impl Mounted {
    /// Runs `o -a ADDR mount DIR`, which returns once the mount serves.
    pub fn new(srv: &Srv) -> Mounted {
        Mounted::with_addr(&srv.addr())
    }

    pub fn with_addr(addr: &str) -> Mounted {
        let dir = tempfile::Builder::new()
            .prefix("o-mount")
            .tempdir()
            .unwrap();
        let out = o_mount(addr, &[dir.path().to_str().unwrap()]);
        assert_eq!(out.code, Some(0), "o mount failed: {out:?}");
        Mounted {
            dir,
            addr: addr.to_owned(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `DIR/rel`.
    pub fn join(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Whether DIR is still a mount point (a FUSE one).
    pub fn is_mounted(&self) -> bool {
        is_fuse_mount(self.dir.path())
    }

    /// `o mount -u DIR`.
    pub fn unmount(&self) -> Out {
        o_mount(&self.addr, &["-u", self.dir.path().to_str().unwrap()])
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.is_mounted() {
            let _ = self.unmount();
        }
    }
}

/// `o -a ADDR mount ARGS…`, bounded.
pub fn o_mount(addr: &str, args: &[&str]) -> Out {
    let mut c = Command::new(bin("o"));
    c.arg("-a").arg(addr).arg("mount").args(args);
    run(&mut c, b"")
}

/// Whether `dir` is listed in /proc/self/mountinfo as a FUSE mount.
pub fn is_fuse_mount(dir: &Path) -> bool {
    let Ok(canon) = dir.canonicalize() else {
        return false;
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let fstype = l.split(" - ").nth(1).and_then(|r| r.split(' ').next());
        f.get(4).is_some_and(|m| Path::new(m) == canon)
            && fstype.is_some_and(|t| t.starts_with("fuse"))
    })
}
