//! Skills end to end through the real olliesrv (and, for the tool tests, the session's real
//! toolsrv): two skill paths with a name clash (the first wins, `skills/idx` shows the
//! shadowed one), an invalid `SKILL.md` skipped with one warning, the read-only `skills/NAME/`
//! views, the skills section of the system prompt the model is sent, a replayed model reading
//! a skill with `file_read` through its policy's read grant, and `file_write` into the skill
//! denied by the sandbox.
// Scenario tests read top to bottom; splitting them would hide the story.
#![allow(clippy::too_many_lines)]
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
    // deploy is in the first path: the owner may write it (agents never).
    assert_eq!((st.length, st.mode), (DEPLOY_A.len() as u64, 0o644));
    let f = root.walk_path("skills/lint/SKILL.md").await.unwrap();
    let st = within("stat", f.stat()).await.unwrap();
    assert_eq!((st.length, st.mode), (LINT_B.len() as u64, 0o444));
    let entries: Vec<(String, u32, u64)> = list(&root, "skills/deploy")
        .await
        .into_iter()
        .map(|s| (s.name, s.mode, s.length))
        .collect();
    assert_eq!(
        entries,
        [
            ("SKILL.md".to_owned(), 0o644, DEPLOY_A.len() as u64),
            ("scripts".to_owned(), dm::DIR | 0o755, 0)
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

    // Agents write nothing under skills/; the owner writes nothing outside the first path
    // (lint is the second path's) and never idx.
    let (_c2, agent_root) = attach(&srv, "agent").await;
    let refused: [(&Fid, &[&str], &[&str]); 2] = [
        (
            &agent_root,
            &[
                "skills/deploy/SKILL.md",
                "skills/idx",
                "skills/deploy/scripts/run.sh",
                "skills/lint/SKILL.md",
            ],
            &["skills", "skills/deploy", "skills/lint"],
        ),
        (
            &root,
            &["skills/idx", "skills/lint/SKILL.md"],
            &["skills/lint"],
        ),
    ];
    for (r, files, dirs) in refused {
        for p in files {
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
            let f = r.walk_path(p).await.unwrap();
            assert!(f.remove().await.is_err(), "{p} removed");
        }
        for d in dirs {
            let mut f = r.walk_path(d).await.unwrap();
            let e = f
                .create("new", dm::DIR | 0o755, om::OREAD)
                .await
                .expect_err("created in skills/");
            assert!(e.to_string().contains("read-only"), "{d}: {e}");
        }
    }
    assert_eq!(
        std::fs::read_to_string(a.join("deploy/SKILL.md")).unwrap(),
        DEPLOY_A
    );
    assert_eq!(
        std::fs::read_to_string(b.join("lint/SKILL.md")).unwrap(),
        LINT_B
    );
    assert!(!a.join("new").exists() && !a.join("deploy/new").exists());

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

/// Writes `data` to a fid opened for writing, in pieces of `piece` bytes (as a shell or a
/// FUSE bridge would).
async fn write_pieces(f: &Fid, data: &[u8], piece: usize) {
    let mut off = 0;
    for chunk in data.chunks(piece) {
        let n = f
            .write(off, bytes::Bytes::copy_from_slice(chunk))
            .await
            .unwrap();
        assert_eq!(n as usize, chunk.len());
        off += chunk.len() as u64;
    }
}

/// The owner creates a skill over 9P: `mkdir skills/NAME` lands in the first skill path
/// (made when missing), the directory is listed (not in idx) until its SKILL.md is valid,
/// then it is active; files in it can be created, written, truncated, renamed and removed;
/// names that exist (in any path), bad names and plain files in skills/ are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_creates_a_skill_in_the_first_path() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = skill_paths(dir.path());
    // The first path does not exist yet: creating a skill makes it.
    let first = dir.path().join("fresh/skills");
    let toml = format!(
        "skill_paths = [{:?}, {:?}, {:?}]\n",
        first.display().to_string(),
        a.display().to_string(),
        b.display().to_string()
    );
    let srv = Srv::start_with(dir, &toml, |_| {});
    let (_c, root) = attach(&srv, &me()).await;

    // Refused: a plain file, a bad name, a name an existing skill has (in a later path too).
    let mut skills = root.walk_path("skills").await.unwrap();
    let e = skills
        .create("notes.txt", 0o644, om::OWRITE)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("skill directories only"), "{e}");
    for (name, want) in [
        ("Bad_Name", "invalid argument: skill name"),
        ("deploy", "file already exists"),
        ("lint", "file already exists"),
    ] {
        let mut f = root.walk_path("skills").await.unwrap();
        let e = f
            .create(name, dm::DIR | 0o755, om::OREAD)
            .await
            .unwrap_err();
        assert!(e.to_string().contains(want), "{name}: {e}");
    }
    assert!(!first.exists(), "a refused create made the first path");

    // mkdir: the directory is in the first path, listed, walkable, but no skill yet.
    let mut d = root.walk_path("skills").await.unwrap();
    let qid = d
        .create("release-notes", dm::DIR | 0o755, om::OREAD)
        .await
        .unwrap();
    assert!(qid.is_dir());
    assert!(first.join("release-notes").is_dir());
    let names: Vec<(String, u32)> = list(&root, "skills")
        .await
        .into_iter()
        .map(|s| (s.name, s.mode))
        .collect();
    assert!(
        names.contains(&("release-notes".to_owned(), dm::DIR | 0o755)),
        "{names:?}"
    );
    assert!(
        !read_path(&root, "skills/idx")
            .await
            .unwrap()
            .contains("release-notes")
    );

    // Its SKILL.md, written in pieces: then it is active, from the first path.
    let text = "---\nname: release-notes\ndescription: Write the release notes from the log.\n---\nRead CHANGES, then write NOTES.md.\n";
    let mut f = root.walk_path("skills/release-notes").await.unwrap();
    f.create("SKILL.md", 0o644, om::OWRITE).await.unwrap();
    write_pieces(&f, text.as_bytes(), 7).await;
    drop(f);
    assert_eq!(
        std::fs::read_to_string(first.join("release-notes/SKILL.md")).unwrap(),
        text
    );
    let idx = read_path(&root, "skills/idx").await.unwrap();
    let rfirst = first.canonicalize().unwrap();
    assert!(
        idx.contains(&format!(
            "release-notes\tactive\t{}\tWrite the release notes from the log.\n",
            rfirst.join("release-notes").display()
        )),
        "{idx}"
    );
    // The agents' view: listed, readable, not writable.
    let (_c2, agent_root) = attach(&srv, "agent").await;
    assert_eq!(
        read_path(&agent_root, "skills/release-notes/SKILL.md")
            .await
            .unwrap(),
        text
    );
    let mut f = agent_root
        .walk_path("skills/release-notes/SKILL.md")
        .await
        .unwrap();
    assert!(f.open(om::OWRITE).await.is_err());

    // Files and directories inside: create, overwrite with truncation, wstat length, rename
    // in place, remove (a directory only when empty).
    let mut sub = root.walk_path("skills/release-notes").await.unwrap();
    sub.create("scripts", dm::DIR | 0o755, om::OREAD)
        .await
        .unwrap();
    let mut f = root
        .walk_path("skills/release-notes/scripts")
        .await
        .unwrap();
    f.create("gen.sh", 0o644, om::OWRITE).await.unwrap();
    write_pieces(&f, b"#!/bin/sh\necho generating\n", 64).await;
    let on_disk = first.join("release-notes/scripts/gen.sh");
    assert_eq!(
        std::fs::read_to_string(&on_disk).unwrap(),
        "#!/bin/sh\necho generating\n"
    );
    let mut f = root
        .walk_path("skills/release-notes/scripts/gen.sh")
        .await
        .unwrap();
    f.open(om::OWRITE | om::OTRUNC).await.unwrap();
    write_pieces(&f, b"echo v2\n", 64).await;
    assert_eq!(std::fs::read_to_string(&on_disk).unwrap(), "echo v2\n");
    let mut t = Stat::dont_touch();
    t.length = 4;
    f.wstat(&t).await.unwrap();
    assert_eq!(std::fs::read_to_string(&on_disk).unwrap(), "echo");
    let mut t = Stat::dont_touch();
    t.name = "make.sh".into();
    f.wstat(&t).await.unwrap();
    assert!(!on_disk.exists());
    assert_eq!(
        read_path(&root, "skills/release-notes/scripts/make.sh")
            .await
            .unwrap(),
        "echo"
    );
    // A skill keeps its directory's name.
    let d = root.walk_path("skills/release-notes").await.unwrap();
    let mut t = Stat::dont_touch();
    t.name = "other".into();
    assert!(d.wstat(&t).await.is_err());
    // Creating over an existing file, and removing a non-empty directory, are refused.
    let mut f = root
        .walk_path("skills/release-notes/scripts")
        .await
        .unwrap();
    let e = f.create("make.sh", 0o644, om::OWRITE).await.unwrap_err();
    assert!(e.to_string().contains("exists"), "{e}");
    let f = root
        .walk_path("skills/release-notes/scripts")
        .await
        .unwrap();
    let e = f.remove().await.unwrap_err();
    assert!(e.to_string().contains("not empty"), "{e}");
    let f = root
        .walk_path("skills/release-notes/scripts/make.sh")
        .await
        .unwrap();
    f.remove().await.unwrap();
    let f = root
        .walk_path("skills/release-notes/scripts")
        .await
        .unwrap();
    f.remove().await.unwrap();
    assert!(!first.join("release-notes/scripts").exists());
    // The skill itself: its SKILL.md, then the empty directory.
    let f = root
        .walk_path("skills/release-notes/SKILL.md")
        .await
        .unwrap();
    f.remove().await.unwrap();
    let f = root.walk_path("skills/release-notes").await.unwrap();
    f.remove().await.unwrap();
    assert!(!first.join("release-notes").exists());
    assert!(root.walk_path("skills/release-notes").await.is_err());
    // The later paths were never touched.
    assert_eq!(
        std::fs::read_to_string(a.join("deploy/SKILL.md")).unwrap(),
        DEPLOY_A
    );
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
