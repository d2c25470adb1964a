//! A git work tree whose diff changes on demand, for the seed's feed loops (`while :; do git
//! diff HEAD --; …; done | ollie-9p write …/feed`): one file committed at version 0 and
//! replaced by other versions, and a `git` wrapper, first on the loops' `PATH`, that counts
//! how often they ran it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository (removed when dropped).
#[derive(Debug)]
pub struct DiffRepo {
    dir: tempfile::TempDir,
    file: &'static str,
    body: fn(usize) -> String,
}

impl DiffRepo {
    /// A repository holding `file` with `body(0)`, committed: its diff starts empty.
    pub fn new(file: &'static str, body: fn(usize) -> String) -> DiffRepo {
        let r = DiffRepo {
            dir: tempfile::tempdir().expect("a temporary directory"),
            file,
            body,
        };
        for d in [r.home(), r.work(), r.shim_dir()] {
            std::fs::create_dir_all(d).expect("the repository's directories");
        }
        let shim = r.shim_dir().join("git");
        std::fs::write(
            &shim,
            format!(
                "#!/bin/sh\necho run >> '{}'\nexec '{}' \"$@\"\n",
                r.runs_file().display(),
                real_git().display()
            ),
        )
        .expect("the git wrapper");
        std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("the git wrapper's mode");
        r.edit(0);
        for args in [
            &["init", "-q"][..],
            &["add", file],
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-qm",
                "v0",
            ],
        ] {
            let o = r.git().args(args).output().expect("git runs");
            assert!(
                o.status.success(),
                "git {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        r
    }

    /// The `HOME` of every git run here.
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// The work tree.
    pub fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// Where the counting `git` is (put it first on a loop's `PATH`).
    pub fn shim_dir(&self) -> PathBuf {
        self.dir.path().join("shim")
    }

    fn runs_file(&self) -> PathBuf {
        self.dir.path().join("git-runs")
    }

    /// Runs `c` in the work tree with this repository's git environment.
    pub fn env(&self, c: &mut Command) {
        c.current_dir(self.work())
            .env("HOME", self.home())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_PAGER", "cat");
    }

    /// The real git, in the work tree (not counted).
    pub fn git(&self) -> Command {
        let mut c = Command::new(real_git());
        self.env(&mut c);
        c
    }

    /// Replaces the file with `body(version)` (by rename: a `git diff` running now sees the
    /// old or the new one).
    pub fn edit(&self, version: usize) {
        let tmp = self.dir.path().join("edit.tmp");
        std::fs::write(&tmp, (self.body)(version)).expect("the new version");
        std::fs::rename(&tmp, self.work().join(self.file)).expect("the new version in place");
    }

    /// What `git diff HEAD --` prints now.
    pub fn diff(&self) -> Vec<u8> {
        let o = self
            .git()
            .args(["diff", "HEAD", "--"])
            .output()
            .expect("git diff runs");
        assert!(
            o.status.success(),
            "git diff: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o.stdout
    }

    /// How many times the counting `git` has run.
    pub fn runs(&self) -> usize {
        std::fs::read_to_string(self.runs_file())
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// `bash -c script` in the work tree: the counting `git`, then `bins`, then the test's
    /// own `PATH`; `NAMESPACE=ns` (where `ollie-9p` finds the server).
    pub fn bash(&self, ns: &Path, bins: &Path, script: &str) -> Command {
        let path = format!(
            "{}:{}:{}",
            self.shim_dir().display(),
            bins.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut c = Command::new("bash");
        self.env(&mut c);
        c.arg("-c")
            .arg(script)
            .env("PATH", path)
            .env("NAMESPACE", ns);
        c
    }
}

/// Where `git` is on the test's `PATH`.
fn real_git() -> PathBuf {
    let o = Command::new("sh")
        .args(["-c", "command -v git"])
        .output()
        .expect("sh runs");
    let p = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    assert!(o.status.success() && !p.is_empty(), "git not found");
    PathBuf::from(p)
}
