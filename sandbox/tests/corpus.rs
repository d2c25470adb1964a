//! The seccomp allowlist corpus: real programs must work inside the default profile, and
//! every layer must still be active while they do.
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_policy::Policy;
use ollie_sandbox::{RunOutput, RunRequest};
use std::path::{Path, PathBuf};

mod common;
use common::{features_ok, skip};

struct Ws(PathBuf);

impl Ws {
    fn new(name: &str) -> Ws {
        let d = std::env::temp_dir().join(format!("ollie-corpus-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Ws(d)
    }
}

impl Drop for Ws {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn default_policy() -> Policy {
    ollie_policy::shipped_profile("workspace").unwrap()
}

fn run_in(policy: &Policy, ws: &Path, script: &str) -> RunOutput {
    let req = RunRequest::new(
        vec![
            "bash".into(),
            "-c".into(),
            format!("set -e; {script}").into(),
        ],
        ws.to_path_buf(),
    );
    let out = ollie_sandbox::run(policy, &req).unwrap();
    assert_eq!(
        out.record.exit.status,
        0,
        "{script}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.record.layers.landlock.abi >= 7);
    // The shipped profile as one program: the range tree that bpf.rs proves equivalent to
    // the reference chain (three programs), installed by one-shot runs since it is proven.
    assert_eq!(out.record.layers.seccomp.filters, 1);
    assert!(out.record.layers.seccomp.instructions < 400);
    out
}

#[test]
fn corpus_bash_coreutils() {
    if !features_ok("corpus_bash_coreutils") {
        return;
    }
    let ws = Ws::new("core");
    let out = run_in(
        &default_policy(),
        &ws.0,
        "for i in 3 1 2; do echo $i; done | sort -n | tail -1; x=$(seq 1 100 | paste -sd+ | bc 2>/dev/null || echo 5050); \
         mkdir -p a/b && touch a/b/c && cp a/b/c d && mv d e && ln -s e f && readlink f && rm f e; \
         find . -name c | grep -c c; sha256sum /bin/ls >/dev/null; date >/dev/null; \
         tar czf x.tgz a && tar tzf x.tgz | wc -l; du -s . >/dev/null; stat -c %F . ; \
         ls -la /usr/bin >/dev/null; id -u >/dev/null; uname -a >/dev/null; sed -n 1p /etc/passwd >/dev/null; \
         awk 'BEGIN{print 6*7}'; printf 'b\\na\\n' | sort | head -1; test -w \"$TMPDIR\"; echo ok > \"$TMPDIR/t\"; \
         yes | head -n 3 | wc -l; timeout 5 true; nproc >/dev/null; echo $x",
    );
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.starts_with("3\n"), "{s}");
    assert!(s.contains("42\n"));
    assert!(s.contains("directory\n"));
}

#[test]
fn corpus_python3() {
    if !features_ok("corpus_python3") {
        return;
    }
    let ws = Ws::new("py");
    let out = run_in(
        &default_policy(),
        &ws.0,
        "python3 - <<'E'\n\
import json, subprocess, tempfile, threading, hashlib, sqlite3, os, concurrent.futures, multiprocessing\n\
r = subprocess.run(['echo', 'sub'], capture_output=True, text=True); assert r.stdout == 'sub\\n'\n\
with tempfile.NamedTemporaryFile(dir=os.environ['TMPDIR']) as f: f.write(b'x')\n\
t = threading.Thread(target=lambda: None); t.start(); t.join()\n\
with concurrent.futures.ThreadPoolExecutor(4) as ex: assert sum(ex.map(lambda x: x, range(10))) == 45\n\
p = multiprocessing.get_context('fork').Process(target=print, args=('child',)); p.start(); p.join(); assert p.exitcode == 0\n\
db = sqlite3.connect('t.db'); db.execute('create table t(x)'); db.execute('insert into t values (1)'); db.commit()\n\
print(json.dumps({'sha': hashlib.sha256(b'x').hexdigest()[:8], 'rows': db.execute('select count(*) from t').fetchone()[0]}))\n\
E",
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"rows\": 1"));
}

#[test]
fn corpus_git() {
    if !features_ok("corpus_git") {
        return;
    }
    let ws = Ws::new("git");
    let out = run_in(
        &default_policy(),
        &ws.0,
        "git init -q r && cd r && echo hi > f && git add f && \
         git -c user.name=t -c user.email=t@e commit -qm one && git checkout -qb feat && echo more >> f && \
         git -c user.name=t -c user.email=t@e commit -qam two && git log --oneline | wc -l && git diff HEAD~1 --stat | tail -1 && \
         git status --short | wc -l && git gc -q && git fsck 2>/dev/null && git clone -q . ../c && git -C ../c log --oneline | wc -l",
    );
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.starts_with("2\n"), "{s}");
}

#[test]
fn corpus_make_gcc() {
    if !features_ok("corpus_make_gcc") {
        return;
    }
    let ws = Ws::new("gcc");
    std::fs::write(
        ws.0.join("hello.c"),
        "#include <stdio.h>\n#include <pthread.h>\nstatic void *f(void *a){return a;}\nint main(void){pthread_t t;pthread_create(&t,0,f,0);pthread_join(t,0);puts(\"hello\");return 0;}\n",
    )
    .unwrap();
    std::fs::write(
        ws.0.join("Makefile"),
        "hello: hello.c\n\tgcc -O2 -pthread -o $@ $<\n",
    )
    .unwrap();
    let out = run_in(&default_policy(), &ws.0, "make -s -j2 && ./hello");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
}

#[test]
fn corpus_cargo_build() {
    if !features_ok("corpus_cargo_build") {
        return;
    }
    let Ok(o) = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
    else {
        skip("SKIP corpus_cargo_build: rustc not found on the host");
        return;
    };
    let sysroot = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if !Path::new(&sysroot).join("bin/cargo").exists() {
        skip(&format!("SKIP corpus_cargo_build: no cargo in {sysroot}"));
        return;
    }
    let ws = Ws::new("cargo");
    let text = ollie_policy::SHIPPED_PROFILES
        .iter()
        .find(|(n, _)| *n == "workspace")
        .unwrap()
        .1
        .replace(
            "exec = [\"/usr\"",
            &format!("exec = [\"{sysroot}\", \"/usr\""),
        )
        .replace(
            "PATH = \"/usr/local/bin:/usr/bin:/bin\"",
            &format!("PATH = \"{sysroot}/bin:/usr/local/bin:/usr/bin:/bin\", CARGO_HOME = \"{{workdir}}/.cargo\""),
        );
    let policy = Policy::from_toml(&text).unwrap();
    let out = run_in(
        &policy,
        &ws.0,
        "cargo new -q --vcs none hello && cd hello && cargo build -q --offline && ./target/debug/hello",
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Hello, world!\n");
}
