//! Skills end to end through the real olliesrv (and, for the tool tests, the session's real
//! toolsrv): two skill paths with a name clash (the first wins, `skills/idx` shows the
//! shadowed one), an invalid `SKILL.md` skipped with one warning, the read-only `skills/NAME/`
//! views, the skills section of the system prompt the model is sent, a replayed model reading
//! a skill with `file_read` through its policy's read grant, and `file_write` into the skill
//! denied by the sandbox.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod fake_llm;

use std::path::{Path, PathBuf};

use common::toolsrv::features_ok;
use common::{Srv, attach, me, within};
use fake_llm::*;
use ollie_p9::Fid;
use ollie_p9::wire::{Stat, dm, om};
use serde_json::{Value, json};

const DEPLOY_A: &str = "---\nname: deploy\ndescription: Deploy the app with the first path's script.\n---\n# Deploy\n\nRun scripts/run.sh, then check the logs.\n";
const DEPLOY_B: &str =
    "---\nname: deploy\ndescription: The second path's deploy (shadowed).\n---\nold\n";
const LINT_B: &str = "---\nname: lint\ndescription: Lint the code.\n---\nRun the linter.\n";
const RUN_SH: &str = "#!/bin/sh\necho deploying\n";

/// Two skill paths under `dir`: `a/` (deploy, with scripts/run.sh and a symlink that
/// escapes) and `b/` (deploy again, lint, and an invalid `broken`). Returns (a, b).
fn skill_paths(dir: &Path) -> (PathBuf, PathBuf) {
    let (a, b) = (dir.join("skills-a"), dir.join("skills-b"));
    let put = |p: PathBuf, text: &str| {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    put(a.join("deploy/SKILL.md"), DEPLOY_A);
    put(a.join("deploy/scripts/run.sh"), RUN_SH);
    put(dir.join("outside.txt"), "not a skill\n");
    std::os::unix::fs::symlink(dir.join("outside.txt"), a.join("deploy/escape")).unwrap();
    put(b.join("deploy/SKILL.md"), DEPLOY_B);
    put(b.join("lint/SKILL.md"), LINT_B);
    put(
        b.join("broken/SKILL.md"),
        "---\nname: broken\n---\nno description\n",
    );
    (a, b)
}

fn skill_paths_toml(a: &Path, b: &Path) -> String {
    format!(
        "skill_paths = [{:?}, {:?}]\n",
        a.display().to_string(),
        b.display().to_string()
    )
}

async fn read_path(root: &Fid, path: &str) -> Result<String, String> {
    let mut f = root.walk_path(path).await.map_err(|e| e.to_string())?;
    f.open(om::OREAD).await.map_err(|e| e.to_string())?;
    let b = f.read_to_end().await.map_err(|e| e.to_string())?;
    Ok(String::from_utf8(b).unwrap())
}

async fn list(root: &Fid, path: &str) -> Vec<Stat> {
    let mut d = root.walk_path(path).await.unwrap();
    d.open(om::OREAD).await.unwrap();
    d.read_dir().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn union_clash_idx_and_read_only_views() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = skill_paths(dir.path());
    let srv = Srv::start_with(dir, &skill_paths_toml(&a, &b), |_| {});
    let (_c, root) = attach(&srv, &me()).await;
    let (ra, rb) = (a.canonicalize().unwrap(), b.canonicalize().unwrap());

    // The index: the first path wins deploy, the second's is shadowed; broken is skipped.
    let idx = read_path(&root, "skills/idx").await.unwrap();
    assert_eq!(
        idx,
        format!(
            "deploy\tactive\t{}\tDeploy the app with the first path's script.\n\
             deploy\tshadowed\t{}\tThe second path's deploy (shadowed).\n\
             lint\tactive\t{}\tLint the code.\n",
            ra.join("deploy").display(),
            rb.join("deploy").display(),
            rb.join("lint").display()
        )
    );
    // One warning line for the invalid skill, however often the skills are scanned.
    let names: Vec<String> = list(&root, "skills")
        .await
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["idx", "deploy", "lint"]);
    let _ = read_path(&root, "skills/idx").await.unwrap();
    let log = srv.stderr();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("skipped invalid skill") && l.contains("broken"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("description is missing"), "{log}");

    // skills/NAME/: the winner's files with their exact contents and real lengths.
    assert_eq!(
        read_path(&root, "skills/deploy/SKILL.md").await.unwrap(),
        DEPLOY_A
    );
    assert_eq!(
        read_path(&root, "skills/deploy/scripts/run.sh")
            .await
            .unwrap(),
        RUN_SH
    );
    assert_eq!(
        read_path(&root, "skills/lint/SKILL.md").await.unwrap(),
        LINT_B
    );
    let f = root.walk_path("skills/deploy/SKILL.md").await.unwrap();
    let st = within("stat", f.stat()).await.unwrap();
    assert_eq!((st.length, st.mode), (DEPLOY_A.len() as u64, 0o444));
    let entries: Vec<(String, u32, u64)> = list(&root, "skills/deploy")
        .await
        .into_iter()
        .map(|s| (s.name, s.mode, s.length))
        .collect();
    assert_eq!(
        entries,
        [
            ("SKILL.md".to_owned(), 0o444, DEPLOY_A.len() as u64),
            ("scripts".to_owned(), dm::DIR | 0o555, 0)
        ]
    );
    // The symlink out of the skill is neither listed nor served; neither is a shadowed or
    // invalid skill, nor anything through "..".
    for p in [
        "skills/deploy/escape",
        "skills/broken/SKILL.md",
        "skills/deploy/../lint/../../help/x",
    ] {
        assert!(read_path(&root, p).await.is_err(), "{p} was served");
    }
    assert_eq!(
        read_path(&root, "skills/deploy/scripts/../SKILL.md")
            .await
            .unwrap(),
        DEPLOY_A
    );

    // Nothing under skills/ is writable, by the owner or by an agent.
    let (_c2, agent_root) = attach(&srv, "agent").await;
    for r in [&root, &agent_root] {
        for p in [
            "skills/deploy/SKILL.md",
            "skills/idx",
            "skills/deploy/scripts/run.sh",
        ] {
            let mut f = r.walk_path(p).await.unwrap();
            assert!(f.open(om::OWRITE).await.is_err(), "{p} opened for writing");
            let mut f = r.walk_path(p).await.unwrap();
            assert!(
                f.open(om::OREAD | om::OTRUNC).await.is_err(),
                "{p} truncated"
            );
            let mut t = Stat::dont_touch();
            t.length = 0;
            assert!(f.wstat(&t).await.is_err(), "{p} truncated by wstat");
        }
        for d in ["skills", "skills/deploy"] {
            let mut f = r.walk_path(d).await.unwrap();
            let e = f
                .create("new", 0o644, om::OWRITE)
                .await
                .expect_err("created a file in skills/");
            assert!(e.to_string().contains("read-only"), "{e}");
        }
        let f = r.walk_path("skills/deploy/SKILL.md").await.unwrap();
        assert!(f.remove().await.is_err());
    }
    assert_eq!(
        std::fs::read_to_string(a.join("deploy/SKILL.md")).unwrap(),
        DEPLOY_A
    );

    // A skill created on disk in the first path shows at once; invalidate re-reads the paths.
    let new = a.join("release-notes");
    std::fs::create_dir(&new).unwrap();
    std::fs::write(
        new.join("SKILL.md"),
        "---\nname: release-notes\ndescription: Write release notes.\n---\n",
    )
    .unwrap();
    let idx = read_path(&root, "skills/idx").await.unwrap();
    assert!(
        idx.contains(&format!(
            "release-notes\tactive\t{}\tWrite release notes.\n",
            ra.join("release-notes").display()
        )),
        "{idx}"
    );
    let r = rdwr(&root, "ctl", "invalidate").await.unwrap();
    assert!(r.starts_with("config reloaded"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_skill_paths_means_no_skills_and_no_prompt_section() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    // The default path ($XDG_DATA_HOME/ollie/skills) does not exist.
    let data = dir.path().join("data");
    let srv = Srv::start_with(dir, "", |c| {
        c.env("XDG_DATA_HOME", &data);
    });
    let (_c, root) = attach(&srv, &me()).await;
    assert_eq!(read_path(&root, "skills/idx").await.unwrap(), "");
    let names: Vec<String> = list(&root, "skills")
        .await
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["idx"]);
    session_with_agent(&root, &work).await;
    let sp = rdwr(&root, "session/s/agent/a/ctl", "systemprompt")
        .await
        .unwrap();
    assert!(!sp.contains("Skills"), "{sp}");
}

/// One OpenAI `chat.completion.chunk` event.
fn chunk(delta: Value, finish: Option<&str>) -> String {
    let c = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_is_sent_the_active_skills() {
    let fake = FakeLlm::start(vec![Reply::sse(&[
        chunk(json!({"role": "assistant", "content": "ok"}), None),
        chunk(json!({}), Some("stop")),
        "data: [DONE]".to_owned(),
    ])])
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = skill_paths(tmp.path());
    let (srv, work) = olliesrv(
        "openai",
        &format!("{}/v1", fake.url()),
        &skill_paths_toml(&a, &b),
    );
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    let ev = events(&root).await;
    write(&root, "session/s/agent/a/prompt", "deploy it")
        .await
        .unwrap();
    let states = states_until(&ev, &["idle", "error"]).await;
    assert_eq!(states.last().unwrap(), "idle", "{states:?}");
    let posts = fake.posts();
    assert_eq!(posts.len(), 1);
    let body = posts[0].json();
    assert_eq!(body["messages"][0]["role"], "system");
    let system = body["messages"][0]["content"].as_str().unwrap();
    let ra = a.canonicalize().unwrap();
    let rb = b.canonicalize().unwrap();
    for want in [
        format!(
            "- deploy: Deploy the app with the first path's script. ({})",
            ra.join("deploy/SKILL.md").display()
        ),
        format!(
            "- lint: Lint the code. ({})",
            rb.join("lint/SKILL.md").display()
        ),
    ] {
        assert!(system.contains(&want), "{want:?} not in:\n{system}");
    }
    assert!(system.contains("file_read"), "{system}");
    // Neither the shadowed skill nor the invalid one.
    assert!(
        !system.contains("shadowed") && !system.contains("broken"),
        "{system}"
    );
    // ctl systemprompt shows the same section.
    let sp = rdwr(&root, "session/s/agent/a/ctl", "systemprompt")
        .await
        .unwrap();
    let section = &system[system.find("\n\nSkills: ").unwrap()..];
    assert!(sp.contains(section.trim_end()), "{sp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_reads_a_skill_with_file_read_and_cannot_write_it() {
    if !features_ok("a_model_reads_a_skill_with_file_read_and_cannot_write_it") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = skill_paths(dir.path());
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let skill_md = a.canonicalize().unwrap().join("deploy/SKILL.md");
    let outside = dir.path().canonicalize().unwrap().join("outside.txt");
    let call = |name: &str, args: Value| json!({"tool_calls": [{"name": name, "arguments": args}]});
    let turns = [
        call("file_read", json!({"path": skill_md})),
        call(
            "file_write",
            json!({"path": skill_md, "content": "---\nname: deploy\ndescription: pwned\n---\n"}),
        ),
        call("file_read", json!({"path": outside})),
        json!({"text": "done"}),
    ]
    .iter()
    .map(|t| format!("{t}\n"))
    .collect::<String>();
    std::fs::write(dir.path().join("turns.jsonl"), turns).unwrap();
    let config = format!(
        "default_backend = \"demo\"\n{}\n[backends.demo]\nkind = \"replay\"\nfile = {:?}\n",
        skill_paths_toml(&a, &b),
        dir.path().join("turns.jsonl").display().to_string()
    );
    let srv = Srv::start_with(dir, &config, |_| {});
    let (_c, root) = attach(&srv, &me()).await;
    session_with_agent(&root, &work).await;
    let ev = events(&root).await;
    write(&root, "session/s/agent/a/prompt", "deploy")
        .await
        .unwrap();
    let states = states_until(&ev, &["idle", "error"]).await;
    assert_eq!(states.last().unwrap(), "idle", "{states:?}");
    let raw = read(&root, "session/s/agent/a/log").await;
    let results: Vec<Block> = blocks(&raw)
        .into_iter()
        .filter(|b| b.kind == "tool_result")
        .collect();
    assert_eq!(results.len(), 3, "{raw}");
    // file_read through the read grant: the skill's lines, numbered, from the sandbox.
    assert!(results[0].attrs.contains("exit=0"), "{raw}");
    assert!(
        !results[0].attrs.contains("skill=1"),
        "served outside toolsrv: {raw}"
    );
    assert!(
        results[0].body.contains("     1\t---\n")
            && results[0]
                .body
                .contains("\tRun scripts/run.sh, then check the logs.\n"),
        "{raw}"
    );
    // file_write into the skill: denied by the sandbox, the file unchanged.
    assert!(!results[1].attrs.contains("exit=0"), "{raw}");
    assert!(
        results[1].body.contains("Read-only file system")
            || results[1].body.contains("Permission denied"),
        "{raw}"
    );
    assert_eq!(
        std::fs::read_to_string(a.join("deploy/SKILL.md")).unwrap(),
        DEPLOY_A
    );
    // The grant is the skill path only: a file beside it stays closed.
    assert!(!results[2].attrs.contains("exit=0"), "{raw}");
    assert!(!results[2].body.contains("not a skill"), "{raw}");
}
