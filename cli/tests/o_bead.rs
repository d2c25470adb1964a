//! `o bead` against a real olliesrv (tier 2): the five commands through `ns/ctl`, their
//! usage errors, and an agent (replay backend) whose `file_write` and `file_read` of
//! `/ctx/notes/…` go through its namespace: the note lands in the create target's dated
//! `notes/` folder on disk and is read back through the union.
//!
//! Needs the workspace binaries (`cargo build --workspace --bins`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{Srv, fails, ok};

use std::path::{Path, PathBuf};

/// The bead directory a `file://` URI names.
fn dir_of(uri: &str) -> PathBuf {
    let p = uri
        .trim()
        .strip_prefix("file://")
        .unwrap_or_else(|| panic!("not a file URI: {uri:?}"));
    PathBuf::from(p.trim_end_matches('/'))
}

fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (y, m, d, ..) = ollie_p9::util::civil(secs);
    format!("{y:04}-{m:02}-{d:02}")
}

fn replay(config: &Path, turns: &str) {
    std::fs::write(config.join("turns.jsonl"), turns).unwrap();
    std::fs::write(
        config.join("config.toml"),
        format!(
            "default_backend = \"r\"\n[backends.r]\nkind = \"replay\"\nfile = \"{}\"\n",
            config.join("turns.jsonl").display()
        ),
    )
    .unwrap();
}

#[test]
fn the_five_commands_and_their_errors() {
    let srv = Srv::start();
    let work = srv.workdir();
    // No session yet.
    fails(&srv.run(&["bead", "ns"], b""), 1, "no session");
    ok(&srv.run(&["new", "proj", "--cwd", work.to_str().unwrap()], b""));
    // start: a new bead, by URI; start again with another name says a bead is open and
    // does not rename it.
    let uri = ok(&srv.run(&["bead", "start", "notes"], b""))
        .trim()
        .to_owned();
    let bead = dir_of(&uri);
    assert!(bead.join("agent.json").is_file(), "{uri}");
    assert!(bead.join(today()).join("notes").is_dir(), "{uri}");
    let again = srv.run(&["bead", "start", "notes2"], b"");
    fails(&again, 1, "a bead is already open here");
    assert!(
        again.stderr.contains(&format!("{uri} (slug \"notes\")")),
        "{again:?}"
    );
    let again = ok(&srv.run(&["bead", "start", "notes"], b""))
        .trim()
        .to_owned();
    assert_eq!(dir_of(&again), bead, "a second start made another bead");
    // ls: the registry's beads, with slug, uuid and date.
    let listed = ok(&srv.run(&["bead", "ls"], b"")).to_owned();
    let row: Vec<&str> = listed.trim_end().split('\t').collect();
    assert_eq!(listed.lines().count(), 1, "{listed}");
    assert_eq!(row[0], "notes", "{listed}");
    assert_eq!(
        row[1],
        bead.file_name().unwrap().to_str().unwrap(),
        "the uuid: {listed}"
    );
    assert!(row[2].starts_with(&today()), "the date: {listed}");
    assert_eq!(row[3], uri, "{listed}");
    // mount -ac by short name, then the table.
    ok(&srv.run(&["bead", "mount", "-ac", "notes", "/ctx"], b""));
    let table = ok(&srv.run(&["bead", "ns"], b"")).to_owned();
    assert!(table.starts_with("/ctx (union)\n"), "{table}");
    assert!(
        table.contains(&uri) && table.contains("read,create*"),
        "{table}"
    );
    // A second create target at the point is refused, naming the first.
    let other = ok(&srv.run(&["bead", "start"], b"")).trim().to_owned();
    assert_eq!(
        dir_of(&other),
        bead,
        "start made a second bead for the chat"
    );
    // Usage errors are refused before anything is sent (exit 2).
    let clash = srv.run(&["bead", "mount", "-a", "-b", "x", "/ctx"], b"");
    assert_eq!(clash.code, Some(2), "{clash:?}");
    assert!(clash.stderr.contains("cannot be used with"), "{clash:?}");
    fails(
        &srv.run(&["bead", "mount", "x y", "/ctx"], b""),
        2,
        "single words",
    );
    // Server-side errors: one line, exit 1, nothing changed.
    fails(
        &srv.run(&["bead", "mount", "https://example.org/b/", "/ctx"], b""),
        1,
        "remote beads are not supported",
    );
    assert_eq!(ok(&srv.run(&["bead", "ns"], b"")), table);
    // rfork replies; unmount of the whole point empties the table.
    assert!(!ok(&srv.run(&["bead", "rfork"], b"")).is_empty());
    ok(&srv.run(&["bead", "unmount", "/ctx"], b""));
    assert!(!ok(&srv.run(&["bead", "ns"], b"")).contains("/ctx"));
    // With two sessions, --session is needed.
    ok(&srv.run(&["new", "other", "--cwd", work.to_str().unwrap()], b""));
    fails(&srv.run(&["bead", "ns"], b""), 2, "--session");
    ok(&srv.run(&["bead", "--session", "other", "ns"], b""));
}

#[test]
fn an_agents_file_tools_write_and_read_through_its_namespace() {
    let call = |name: &str, args: serde_json::Value| {
        serde_json::json!({"tool_calls": [{"name": name, "arguments": args}]}).to_string()
    };
    let turns = [
        call(
            "file_write",
            serde_json::json!({"path": "/ctx/notes/idea.md", "content": "fuse the sensors\n"}),
        ),
        call(
            "file_read",
            serde_json::json!({"path": "/ctx/notes/idea.md"}),
        ),
        call("file_read", serde_json::json!({"path": "/ctx/about.md"})),
        r#"{"text": "noted"}"#.to_owned(),
    ]
    .join("\n");
    let srv = Srv::start_with(|config| replay(config, &format!("{turns}\n")));
    let work = srv.workdir();
    ok(&srv.run(&["new", "proj", "--cwd", work.to_str().unwrap()], b""));
    let uri = ok(&srv.run(&["bead", "start", "fusion"], b""))
        .trim()
        .to_owned();
    ok(&srv.run(&["bead", "mount", "-c", "fusion", "/ctx"], b""));
    // The agent is created after the mount: it starts with a copy of the session's table.
    ok(&srv.run(&["new", "proj/main"], b""));
    let out = srv.run(&["prompt", "proj/main", "write the idea down"], b"");
    let text = ok(&out);
    assert!(
        text.contains("wrote 17 bytes to /ctx/notes/idea.md"),
        "{text}"
    );
    assert!(text.contains("     1\tfuse the sensors"), "{text}");
    assert!(
        text.contains("# fusion"),
        "about.md read through the union: {text}"
    );
    let note = dir_of(&uri).join(today()).join("notes").join("idea.md");
    assert_eq!(
        std::fs::read_to_string(&note).unwrap_or_default(),
        "fuse the sensors\n",
        "the note is not in the bead's dated notes/ folder"
    );
    // Nothing was written in the workspace.
    assert!(!work.join("ctx").exists());
}

/// `ollie-9p` against the test server.
fn nine(srv: &Srv, args: &[&str], stdin: &[u8]) -> common::Out {
    let mut cmd = std::process::Command::new(common::bin("ollie-9p"));
    cmd.arg("-a").arg(srv.addr()).args(args);
    common::run(&mut cmd, stdin)
}

/// The seed's worked example, as written there: a chat fuses the doorbell work with the
/// storm-event viewer and writes new shared notes into a fresh design bead.
///
/// ```text
/// bead-start sensor-fusion-notes
/// bead-mount -b 883c513f-…/ /ctx
/// bead-mount -a 1c0f5851-…/ /ctx
/// bead-mount -ac sensor-fusion-notes /ctx
/// bead-ns
/// ```
#[test]
fn the_seeds_worked_example_sensor_fusion_notes() {
    let srv = Srv::start();
    let work = srv.workdir();
    let cwd = work.to_str().unwrap();
    // The two earlier beads, each started by its own chat, with notes of their own.
    let mut earlier = Vec::new();
    for (chat, slug, files) in [
        (
            "doorbell",
            "doorbell",
            &[("chirp.md", "doorbell: 4 kHz chirp\n")][..],
        ),
        (
            "storm",
            "storm-event",
            &[
                ("chirp.md", "storm: lightning crackle\n"),
                ("front.md", "storm: gust front at 14:02\n"),
            ][..],
        ),
    ] {
        ok(&srv.run(&["new", chat, "--cwd", cwd], b""));
        let uri = ok(&srv.run(&["bead", "--session", chat, "start", slug], b""))
            .trim()
            .to_owned();
        let notes = dir_of(&uri).join(today()).join("notes");
        for (name, text) in files {
            std::fs::write(notes.join(name), text).unwrap();
        }
        earlier.push(uri);
    }
    let uuid = |uri: &str| {
        dir_of(uri)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    // The chat.
    ok(&srv.run(&["new", "fusion", "--cwd", cwd], b""));
    let bead = |args: &[&str]| {
        let mut a = vec!["bead", "--session", "fusion"];
        a.extend_from_slice(args);
        ok(&srv.run(&a, b"")).to_owned()
    };
    let fusion = bead(&["start", "sensor-fusion-notes"]).trim().to_owned();
    bead(&["mount", "-b", &format!("{}/", uuid(&earlier[0])), "/ctx"]);
    bead(&["mount", "-a", &format!("{}/", uuid(&earlier[1])), "/ctx"]);
    bead(&["mount", "-ac", "sensor-fusion-notes", "/ctx"]);
    assert_eq!(
        bead(&["ns"]),
        format!(
            "/ctx (union)\n  [1] doorbell {} read\n  [2] storm-event {} read\n  [3] sensor-fusion-notes {fusion} read,create*\n",
            earlier[0], earlier[1]
        )
    );
    // Reads union across doorbell and storm-event: first hit wins.
    let read = |p: &str| ok(&nine(&srv, &["read", p], b"")).to_owned();
    assert_eq!(
        read("session/fusion/ns/ctx/notes/chirp.md"),
        "doorbell: 4 kHz chirp\n"
    );
    assert_eq!(
        read("session/fusion/ns/ctx/notes/front.md"),
        "storm: gust front at 14:02\n"
    );
    // Every emitted note persists into sensor-fusion-notes/notes/.
    ok(&nine(
        &srv,
        &["create", "session/fusion/ns/ctx/notes/fused.md"],
        b"chirp + crackle: same event\n",
    ));
    assert_eq!(
        std::fs::read_to_string(dir_of(&fusion).join(today()).join("notes/fused.md")).unwrap(),
        "chirp + crackle: same event\n"
    );
    let listing = ok(&nine(&srv, &["ls", "session/fusion/ns/ctx/notes"], b"")).to_owned();
    for n in ["chirp.md", "front.md", "fused.md"] {
        assert!(listing.contains(n), "{listing}");
    }
    // Creating it again is refused (it exists); the earlier beads are unchanged.
    let again = nine(
        &srv,
        &["create", "session/fusion/ns/ctx/notes/fused.md"],
        b"x",
    );
    assert_eq!(again.code, Some(1), "{again:?}");
    for uri in &earlier {
        assert!(!dir_of(uri).join(today()).join("notes/fused.md").exists());
    }
}

/// Commands an agent runs see its namespace at `/ctx` too (an overlay in the tool's mount
/// namespace): they read the members in search order, and what they create under
/// `/ctx/notes/` reaches the create target's dated `notes/` folder after the run; read-only
/// members never change.
#[test]
fn commands_the_agent_runs_see_the_same_union() {
    let script = "cat /ctx/notes/chirp.md; echo sandboxed > /ctx/notes/from-tool.md; \
        echo changed > /ctx/notes/chirp.md; ls /ctx/notes; \
        (echo x > /ctx-escape) 2>/dev/null || echo no-new-top-level";
    let turns = [
        serde_json::json!({"tool_calls": [{"name": "execute_code",
            "arguments": {"language": "bash", "code": script}}]})
        .to_string(),
        r#"{"text": "ran"}"#.to_owned(),
    ]
    .join("\n");
    let srv = Srv::start_with(|config| replay(config, &format!("{turns}\n")));
    let work = srv.workdir();
    let cwd = work.to_str().unwrap();
    ok(&srv.run(&["new", "doorbell", "--cwd", cwd], b""));
    let door = ok(&srv.run(&["bead", "--session", "doorbell", "start", "doorbell"], b""))
        .trim()
        .to_owned();
    let door_notes = dir_of(&door).join(today()).join("notes");
    std::fs::write(door_notes.join("chirp.md"), "doorbell: 4 kHz chirp\n").unwrap();
    ok(&srv.run(&["new", "proj", "--cwd", cwd], b""));
    let fusion = ok(&srv.run(&["bead", "--session", "proj", "start", "fusion"], b""))
        .trim()
        .to_owned();
    ok(&srv.run(
        &[
            "bead",
            "--session",
            "proj",
            "mount",
            "-b",
            "doorbell",
            "/ctx",
        ],
        b"",
    ));
    ok(&srv.run(
        &[
            "bead",
            "--session",
            "proj",
            "mount",
            "-ac",
            "fusion",
            "/ctx",
        ],
        b"",
    ));
    ok(&srv.run(&["new", "proj/main"], b""));
    let out = srv.run(&["prompt", "proj/main", "run it"], b"");
    let text = ok(&out);
    assert!(text.contains("doorbell: 4 kHz chirp"), "{text}");
    assert!(text.contains("from-tool.md"), "{text}");
    assert!(text.contains("no-new-top-level"), "{text}");
    // The new note is in the create target; the member's file is unchanged (the change was
    // copied up into the agent's shadow layer).
    assert_eq!(
        std::fs::read_to_string(dir_of(&fusion).join(today()).join("notes/from-tool.md"))
            .unwrap_or_default(),
        "sandboxed\n"
    );
    assert_eq!(
        std::fs::read_to_string(door_notes.join("chirp.md")).unwrap(),
        "doorbell: 4 kHz chirp\n"
    );
    assert!(!door_notes.join("from-tool.md").exists());
    assert!(
        !std::path::Path::new("/ctx").exists(),
        "/ctx appeared on the host"
    );
    assert!(!std::path::Path::new("/ctx-escape").exists());
}
