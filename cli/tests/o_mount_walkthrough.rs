//! The README's `o mount` walk-through (tier 2), run as a script against a real `olliesrv`
//! mounted with `o mount`: the block after `<!-- walkthrough: tested by
//! cli/tests/o_mount_walkthrough.rs -->` is extracted from README.md, its `cd ~/n/ollie` line
//! becomes `cd "$MOUNT"`, and it runs under `bash -euo pipefail` with `HOME` a temporary
//! directory whose `src/proj` is the session's git work tree — so README and test cannot drift.
//!
//! The set-up the README assumes: session `proj` with agents `a`, `b` and `obs`, each replaying
//! its own script. `a` edits `a.txt` in a tool call that first reads the FIFO `.gate-a`, which
//! this test opens only once the script has printed a's state from inside its statewait wait
//! (so that wait really blocks and is ended by a state change). `b` asks for the network,
//! which the script denies through `bypass/`, then edits `b.txt`. `obs` just answers. The plans
//! are set through `ollie-9p` first; the results are checked through `ollie-9p` and `o`, not
//! only through the mount.
//!
//! Needs the workspace binaries (`cargo build --workspace --bins`) and FUSE (`/dev/fuse`, and
//! `fusermount3` when not root): without FUSE it prints `SKIP` (a failure under
//! `OLLIE_TEST_REQUIRE=all`). Every wait is an event (a line of the script's output, a process
//! exit) bounded by a failure guard; nothing here measures time.
// Scenario tests read top to bottom; splitting them would hide the story.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::mount::{Mounted, fuse_usable};
use common::{GUARD, Out, Srv, bin, ok, run, wait_child};

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

const README: &str = include_str!("../../README.md");
const MARKER: &str = "<!-- walkthrough: tested by cli/tests/o_mount_walkthrough.rs -->";
/// What the README's fan-out sends (asserted in every agent's conversation).
const PROMPT: &str = "make the tests pass";
const DENIAL: &str = "no network; use the fixtures in testdata/";

/// The fenced `sh` block right after the marker, with its first line (`cd ~/n/ollie`)
/// replaced by `cd "$MOUNT"`.
fn walkthrough() -> String {
    let mut lines = README.lines().skip_while(|l| l.trim() != MARKER);
    assert!(lines.next().is_some(), "README.md has no line {MARKER}");
    assert_eq!(
        lines.next().map(str::trim),
        Some("```sh"),
        "the walk-through must be the ```sh block right after {MARKER}"
    );
    let body: Vec<&str> = lines.take_while(|l| l.trim() != "```").collect();
    assert_eq!(
        body.first().copied(),
        Some("cd ~/n/ollie"),
        "the walk-through starts with `cd ~/n/ollie`"
    );
    let mut script = String::from("cd \"$MOUNT\"\n");
    for l in &body[1..] {
        script.push_str(l);
        script.push('\n');
    }
    script
}

/// `o -a ADDR ARGS…` through `common::bin` (reachable by an unprivileged run), bounded.
fn o(srv: &Srv, args: &[&str]) -> Out {
    let mut c = Command::new(bin("o"));
    c.arg("-a").arg(srv.addr()).args(args);
    run(&mut c, b"")
}

/// `ollie-9p -a ADDR ARGS…`, bounded.
fn p9(srv: &Srv, args: &[&str], stdin: &[u8]) -> Out {
    let mut c = Command::new(bin("ollie-9p"));
    c.arg("-a").arg(srv.addr()).args(args);
    run(&mut c, stdin)
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn tool_call(code: &str, escalate: Option<serde_json::Value>) -> serde_json::Value {
    let mut args = serde_json::json!({"language": "bash", "code": code});
    if let Some(e) = escalate {
        args["escalate"] = e;
    }
    serde_json::json!({"tool_calls": [{"name": "execute_code", "arguments": args}]})
}

fn lines(turns: &[serde_json::Value]) -> String {
    turns.iter().map(|t| format!("{t}\n")).collect()
}

/// The server: backends `ra`, `rb`, `ro` replaying each agent's turns, and a profile `asker`
/// that may ask for the network.
fn server() -> Srv {
    Srv::start_with(|cfg| {
        let scripts = [
            (
                "ra",
                lines(&[
                    tool_call("cat .gate-a >/dev/null; echo 'fixed by a' >> a.txt", None),
                    serde_json::json!({"text": "a.txt is fixed."}),
                ]),
            ),
            (
                "rb",
                lines(&[
                    tool_call(
                        "curl -sS http://127.0.0.1:9/fixtures.tar",
                        Some(serde_json::json!({"grants": ["net"],
                            "reason": "download the test fixtures"})),
                    ),
                    tool_call("echo 'fixed by b' >> b.txt", None),
                    serde_json::json!({"text": "b.txt is fixed, with the vendored fixtures."}),
                ]),
            ),
            (
                "ro",
                lines(&[
                    serde_json::json!({"text": "Watching the feed."}),
                    // The feed's diff is obs's next turn.
                    serde_json::json!({"text": "The diff fixes a.txt and b.txt."}),
                ]),
            ),
        ];
        let mut toml = String::from("default_backend = \"ro\"\n");
        for (name, turns) in scripts {
            let file = cfg.join(format!("{name}.jsonl"));
            std::fs::write(&file, turns).unwrap();
            toml.push_str(&format!(
                "\n[backends.{name}]\nkind = \"replay\"\nfile = \"{}\"\n",
                file.display()
            ));
        }
        std::fs::write(cfg.join("config.toml"), toml).unwrap();
        std::fs::create_dir_all(cfg.join("agents")).unwrap();
        std::fs::write(
            cfg.join("agents").join("asker.toml"),
            "escalations = [\"net\"]\n",
        )
        .unwrap();
    })
}

/// The script's run: its whole output, its exit status, its stderr.
struct Ran {
    stdout: String,
    stderr: String,
    success: bool,
}

/// A process group, killed when dropped (whatever of the script is left, on any failure, so
/// that nothing keeps files of the mount open).
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0)])
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs `script` under `bash -euo pipefail` in `home` with `MOUNT` set; when a line `a: STATE`
/// (a's state, printed inside the wait loop) with STATE other than `idle` appears, opens
/// `gate` for writing (which lets a's tool go on). Bounded by the guard: the script's process
/// group is killed if it does not end.
fn run_script(script: &str, home: &Path, mount: &Path, gate: PathBuf) -> Ran {
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(home)
            .env("HOME", home)
            .env("MOUNT", mount)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let group = Group(child.id());
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut err = child.stderr.take().unwrap();
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + GUARD * 2;
    let mut out = String::new();
    let mut gate = Some(gate);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(state) = line.strip_prefix("a: ")
                    && let Some(g) = gate.take()
                {
                    assert_ne!(state, "idle", "a was idle before its gate opened:\n{out}");
                    // Blocks until a's tool opens the FIFO to read: a thread of its own.
                    std::thread::spawn(move || {
                        std::fs::OpenOptions::new()
                            .write(true)
                            .open(&g)
                            .and_then(|mut f| f.write_all(b"go\n"))
                            .unwrap();
                    });
                }
                out.push_str(&line);
                out.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                drop(group);
                let _ = child.wait();
                panic!(
                    "the walk-through did not end within {:?}; output so far:\n{out}",
                    GUARD * 2
                );
            }
        }
    }
    let st = wait_child(&mut child, "the walk-through script");
    drop(group);
    Ran {
        stdout: out,
        stderr: err_t.join().unwrap(),
        success: st.success(),
    }
}

#[test]
fn readme_walkthrough_runs_through_o_mount() {
    if !fuse_usable("readme_walkthrough_runs_through_o_mount") {
        return;
    }
    let script = walkthrough();
    let srv = server();

    // ~/src/proj: a git work tree with two tracked files, and a's gate.
    let home = srv.dir.path().join("home");
    let proj = home.join("src").join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::write(proj.join("a.txt"), "a\n").unwrap();
    std::fs::write(proj.join("b.txt"), "b\n").unwrap();
    git(&proj, &["init", "-q"]);
    git(&proj, &["add", "a.txt", "b.txt"]);
    git(&proj, &["commit", "-q", "-m", "start"]);
    let gate = proj.join(".gate-a");
    nix::unistd::mkfifo(&gate, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();

    ok(&o(&srv, &["new", "proj", "--cwd", proj.to_str().unwrap()]));
    ok(&o(&srv, &["new", "proj/a", "--backend", "ra"]));
    ok(&o(
        &srv,
        &["new", "proj/b", "--backend", "rb", "--profile", "asker"],
    ));
    ok(&o(&srv, &["new", "proj/obs", "--backend", "ro"]));
    let plans = [
        ("a", "TODO: run the whole suite\n"),
        (
            "b",
            "done: vendor the fixtures\nTODO: drop the network test\n",
        ),
        ("obs", "watch the diff\n"),
    ];
    for (agent, plan) in plans {
        ok(&p9(
            &srv,
            &["write", &format!("session/proj/agent/{agent}/plan")],
            plan.as_bytes(),
        ));
    }

    let mnt = Mounted::new(&srv);
    let ran = run_script(&script, &home, mnt.path(), gate);
    let out = ran.stdout.as_str();
    eprintln!(
        "--- the walk-through's output\n{out}--- its stderr\n{}",
        ran.stderr
    );
    assert!(
        ran.success,
        "the walk-through failed\n--- script\n{script}--- stdout\n{out}--- stderr\n{}\n--- olliesrv\n{}",
        ran.stderr,
        srv.stderr()
    );
    let fail = |what: &str| format!("{what}\n--- stdout\n{out}--- stderr\n{}", ran.stderr);

    // The fan-out: each read returned once the turn had started, with the state current then.
    // a's and b's turns cannot end before the script goes on (a's tool waits for its gate,
    // b's for the verdict the script gives later), so theirs shows the turn; obs only answers,
    // and its whole turn may be over by the time the read runs (then it shows idle again).
    for agent in ["a", "b", "obs"] {
        let line = format!("session/proj/agent/{agent}/: ");
        let started = out
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .unwrap_or_else(|| panic!("{}", fail(&format!("no start line for {agent}"))));
        if agent != "obs" {
            assert_ne!(
                started,
                "idle",
                "{}",
                fail("a gated turn's start read idle")
            );
        }
    }
    // Every agent got the prompt (its conversation, through `o logs`).
    for agent in ["a", "b", "obs"] {
        let log = o(&srv, &["logs", &format!("proj/{agent}")]);
        assert!(ok(&log).contains(PROMPT), "{agent}: {log:?}");
    }

    // The operator's queue showed b's request; the denial reached b as a tool error.
    let req = out
        .lines()
        .find(|l| l.starts_with('{') && l.contains("\"grants\":[\"net\"]"))
        .unwrap_or_else(|| panic!("{}", fail("no pending request shown")));
    let req: serde_json::Value = serde_json::from_str(req).unwrap();
    assert_eq!(req["agent_name"], "b", "{req}");
    assert_eq!(req["reason"], "download the test fixtures", "{req}");
    let b_log = o(&srv, &["logs", "proj/b"]);
    assert!(ok(&b_log).contains(DENIAL), "{b_log:?}");
    let audit = p9(&srv, &["read", "bypass/audit"], b"");
    assert!(ok(&audit).contains(DENIAL), "{audit:?}");

    // The wait: a was seen busy (the blocking read ended it), every wait ended with idle, in
    // order; the server agrees.
    let waits: Vec<&str> = out
        .lines()
        .filter(|l| ["a: ", "b: ", "obs: "].iter().any(|p| l.starts_with(p)))
        .collect();
    assert!(waits.len() >= 4, "{}", fail("too few wait lines"));
    assert_ne!(waits[0], "a: idle", "{}", fail("a's wait did not block"));
    let ends: Vec<&&str> = waits.iter().filter(|l| l.ends_with(": idle")).collect();
    assert_eq!(
        ends,
        [&"a: idle", &"b: idle", &"obs: idle"],
        "{}",
        fail("waits")
    );
    // The diff written to obs's feed is obs's second turn (its input); once it is over,
    // every agent is idle.
    let deadline = Instant::now() + GUARD;
    while !ok(&p9(&srv, &["read", "session/proj/agent/obs/stats"], b"")).contains("\nturns=2\n") {
        assert!(Instant::now() < deadline, "{}", fail("obs's feed turn"));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let j: serde_json::Value = serde_json::from_str(ok(&o(&srv, &["ls", "--json"]))).unwrap();
    let agents = j[0]["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 3, "{j}");
    assert!(agents.iter().all(|a| a["state"] == "idle"), "{j}");

    // The feed holds the work tree's diff (read back through ollie-9p), and the script
    // printed it from the mount.
    let diff = git(&proj, &["diff"]);
    assert!(
        diff.contains("+fixed by a") && diff.contains("+fixed by b"),
        "{diff}"
    );
    let obs = p9(&srv, &["read", "session/proj/agent/obs/log"], b"");
    assert!(
        ok(&obs).contains(&format!("[[[user\n{diff}")),
        "the feed's value as obs's prompt: {obs:?}"
    );
    assert!(
        ok(&obs).contains("The diff fixes a.txt and b.txt."),
        "{obs:?}"
    );
    assert!(
        out.contains(&diff),
        "{}",
        fail("the feed as read through the mount")
    );

    // The plans' TODO lines, named by file.
    assert!(
        out.contains("session/proj/agent/a/plan:TODO: run the whole suite\n")
            && out.contains("session/proj/agent/b/plan:TODO: drop the network test\n"),
        "{}",
        fail("grep of the plans")
    );
    assert!(
        !out.contains("agent/obs/plan:"),
        "{}",
        fail("obs has no TODO")
    );

    // Stats: one block per agent (requests as the replay scripts made them).
    assert_eq!(out.matches("\ntokens_in=").count(), 3, "{}", fail("stats"));
    for (agent, requests) in [("a", 2), ("b", 3)] {
        let stats = p9(
            &srv,
            &["read", &format!("session/proj/agent/{agent}/stats")],
            b"",
        );
        let stats = ok(&stats);
        assert!(
            stats.contains(&format!("requests={requests}\n")),
            "{agent}: {stats:?}"
        );
        assert!(out.contains(stats), "{}", fail(&format!("{agent}'s stats")));
        assert!(
            out.contains(&format!("session/proj/agent/{agent}/stats:cost_usd=")),
            "{}",
            fail("cost lines")
        );
    }

    let un = mnt.unmount();
    assert_eq!(un.code, Some(0), "o mount -u: {un:?}");
    assert!(!mnt.is_mounted());
}
