//! A workspace holds exactly what the tools wrote: an agent (replay backend) runs tools in
//! the session's real toolsrv, and after its turns, after the session is killed and after
//! olliesrv stops, the workspace has no protected-path placeholder (`.git`, `.envrc`,
//! `.claude`, `.idea`, `.vscode`), no `.tmp` and nothing else; meanwhile the tools could not
//! create those protected paths, and their TMPDIR was writable and elsewhere.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use ollie_testkit::client::{rdwr_text as rdwr, wait_for_text, write_ok as write};
use ollie_testkit::features_ok;

/// Every path under `dir`, relative, sorted (directories with a trailing `/`).
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if e.file_type().unwrap().is_dir() {
                out.push(format!("{rel}/"));
                walk(root, &p, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workspace_holds_exactly_what_the_tools_wrote() {
    if !features_ok("the_workspace_holds_exactly_what_the_tools_wrote") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let code = "echo made > made.txt; \
        for p in .envrc .git/hooks/pre-commit .claude/settings.json .idea/x .vscode/x; do \
          mkdir -p \"$(dirname $p)\" 2>/dev/null; echo x > $p 2>/dev/null && echo \"WROTE $p\"; done; \
        echo t > \"$TMPDIR/t\" && echo \"tmp=$(cat \"$TMPDIR/t\") in $TMPDIR\"";
    let turns = format!(
        "{}\n{}\n{}\n{}\n",
        serde_json::json!({"tool_calls": [{"name": "execute_code", "arguments": {"language": "bash", "code": code}}]}),
        serde_json::json!({"tool_calls": [{"name": "file_write", "arguments": {"path": "src/lib.rs", "content": "fn main() {}\n"}}]}),
        serde_json::json!({"tool_calls": [{"name": "file_read", "arguments": {"path": ".envrc"}}]}),
        serde_json::json!({"text": "done"}),
    );
    std::fs::write(dir.path().join("turns.jsonl"), turns).unwrap();
    let config = format!(
        "default_backend = \"demo\"\n[backends.demo]\nkind = \"replay\"\nfile = \"{}\"\n",
        dir.path().join("turns.jsonl").display()
    );
    let mut srv = Srv::start_with(dir, &config, |_| {});
    let (_c, root) = attach(&srv, &me()).await;
    new_session(&root, &work, "name=a").await;
    write(&root, "session/s/agent/a/prompt", "make things").await;
    let log = wait_for_text(
        &root,
        "session/s/agent/a/log",
        "[[[assistant",
        Duration::from_secs(60),
    )
    .await;
    // The tools ran, could not make the protected paths, and had a TMPDIR elsewhere.
    assert!(
        log.contains("made.txt") || work.join("made.txt").is_file(),
        "{log}"
    );
    assert!(
        !log.lines().any(|l| l.starts_with("WROTE ")),
        "a protected path was written: {log}"
    );
    assert!(
        log.contains(".claude/settings.json: Read-only file system"),
        "{log}"
    );
    let tmp_line = log
        .lines()
        .find(|l| l.starts_with("tmp=t in "))
        .unwrap_or_else(|| panic!("TMPDIR was not writable: {log}"));
    let tmp = tmp_line.trim_start_matches("tmp=t in ");
    assert!(
        !Path::new(tmp).starts_with(&work),
        "TMPDIR {tmp} is in the workspace"
    );
    let want = ["made.txt", "src/", "src/lib.rs"];
    assert_eq!(tree(&work), want, "after the turn");
    // Killed session: still exactly that.
    rdwr(&root, "session/s/ctl", "kill").await.unwrap();
    assert_eq!(tree(&work), want, "after the session was killed");
    // Stopped server.
    rdwr(&root, "ctl", "kill").await.ok();
    let st = srv.wait_exit();
    assert!(st.success(), "{st:?}");
    assert_eq!(tree(&work), want, "after olliesrv stopped");
}
