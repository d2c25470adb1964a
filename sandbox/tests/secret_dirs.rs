//! A runner's hidden paths (olliesrv's own state directory wherever it is, its configuration
//! files, other instances' state directories) are secret locations in every way, by their
//! real paths: a workspace that is one or lies inside one (also through a symlink) is refused
//! before anything runs, one-shot and prepared; a broad approved `write:` grant on a parent
//! neither reads nor changes them; a grant naming one is refused at once.
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead. Run as root and as an
//! unprivileged user (`scripts/test-unprivileged.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_policy::{Decision, DenyReason, EscalationRequest, Grant, Policy, ResolveContext};
use ollie_sandbox::{Prepared, RunOutput, RunRequest, SandboxError};
use std::path::{Path, PathBuf};

mod common;
use common::features_ok;

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("ollie-sdirs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for sub in ["w", "home", "state/sessions"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::fs::write(d.join("state/audit.jsonl"), "{}\n").unwrap();
        std::fs::write(d.join("state/tcp.key"), "KEY-0123456789\n").unwrap();
        std::os::unix::fs::symlink(d.join("state"), d.join("link")).unwrap();
        Scratch(d.canonicalize().unwrap())
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
    /// The runner's hidden paths: the state directory as the runner names it.
    fn hidden(&self) -> Vec<PathBuf> {
        vec![self.p("state")]
    }
    fn req(&self, workdir: &Path, script: &str) -> RunRequest {
        let mut r = RunRequest::new(
            vec!["sh".into(), "-c".into(), script.into()],
            workdir.to_path_buf(),
        );
        r.home = self.p("home");
        r.hidden = self.hidden();
        r
    }
    fn untouched(&self) {
        assert_eq!(
            std::fs::read_to_string(self.p("state/audit.jsonl")).unwrap(),
            "{}\n",
            "audit.jsonl was appended"
        );
        assert!(self.p("state/tcp.key").is_file(), "tcp.key moved");
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn policy() -> Policy {
    common::profile_with_limits("workspace", "timeout_seconds = 30")
}

/// Runs `req` one-shot or in a prepared sandbox made for it.
fn exec(prepared: bool, p: &Policy, req: &RunRequest) -> Result<RunOutput, SandboxError> {
    if prepared {
        Prepared::new_hiding(p, &req.workdir, &req.home, &req.hidden)?.run(req)
    } else {
        ollie_sandbox::run(p, req)
    }
}

const ATTACK: &str = "cat tcp.key; echo forged >> audit.jsonl; mv tcp.key k2";

#[test]
fn a_workspace_in_a_hidden_state_directory_is_refused() {
    if !features_ok("a_workspace_in_a_hidden_state_directory_is_refused") {
        return;
    }
    let sc = Scratch::new("inside");
    for prepared in [false, true] {
        for wd in [sc.p("state"), sc.p("state/sessions"), sc.p("link")] {
            let r = sc.req(
                &wd,
                &format!("{ATTACK}; cd {}; {ATTACK}", sc.p("state").display()),
            );
            match exec(prepared, &policy(), &r) {
                Err(e) => {
                    let text = common::error_chain(&e);
                    assert!(text.contains("secret location"), "{}: {text}", wd.display());
                }
                Ok(o) => panic!(
                    "{} (prepared {prepared}): ran: {}",
                    wd.display(),
                    String::from_utf8_lossy(&o.stdout)
                ),
            }
            sc.untouched();
        }
    }
}

#[test]
fn a_broad_write_grant_around_a_hidden_state_directory_leaves_it_alone() {
    if !features_ok("a_broad_write_grant_around_a_hidden_state_directory_leaves_it_alone") {
        return;
    }
    let sc = Scratch::new("around");
    let ctx = ResolveContext {
        workdir: sc.p("w"),
        home: sc.p("home"),
        extra_secrets: ollie_sandbox::secret_forms(&sc.hidden()),
    };
    // An approved `write:` on the directory holding the state directory (as in a run
    // escalated by the operator).
    let wide = policy()
        .with_grants(&[Grant::Write(sc.0.clone())], &ctx)
        .unwrap();
    let script = format!(
        "cd {}; echo ok > w/mine; {ATTACK}; cd {}; {ATTACK}; ls -A; echo end",
        sc.0.display(),
        sc.p("state").display()
    );
    for prepared in [false, true] {
        let o = exec(prepared, &wide, &sc.req(&sc.p("w"), &script)).unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.ends_with("end\n"), "{out}");
        assert!(!out.contains("KEY-"), "tcp.key read: {out}");
        assert!(
            !out.contains("audit.jsonl"),
            "the state directory was listed: {out}"
        );
        assert_eq!(std::fs::read_to_string(sc.p("w/mine")).unwrap(), "ok\n");
        sc.untouched();
    }
    // A grant naming the state directory (as given or through the link) is refused at once,
    // never asked of the operator.
    let resolved = policy().resolve(&ctx).unwrap();
    for p in [sc.p("state"), sc.p("state/tcp.key")] {
        let req = EscalationRequest {
            grants: vec![Grant::Read(p.clone())],
            reason: "x".into(),
        };
        assert!(
            matches!(
                ollie_policy::decide(&resolved, &req),
                Decision::Deny(DenyReason::SecretLocation(_))
            ),
            "{}",
            p.display()
        );
        assert!(policy().with_grants(&[Grant::Read(p)], &ctx).is_err());
    }
}
