//! `o` for people and for scripts (tier 2): shell completions of `o` and `ollie-9p`, the
//! `--json` output of `o prompt` and `o new` against a real olliesrv whose backend replays a
//! script, the progress line (only on a terminal standard error, never with `--quiet` or
//! `OLLIE_NO_PROGRESS`, never on standard output), and examples in every subcommand's help.
//!
//! Needs the workspace binaries: run `cargo build --workspace --bins` first. Every wait is
//! bounded by a failure guard (see `common`); nothing here measures time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{Out, Srv, fails, ok, run, wait_child};

use nix::fcntl::OFlag;
use nix::pty::PtyMaster;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The spinner's frames and the erase sequence: none of them may reach a pipe.
const SPINNER: &[char] = &['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
const ERASE: &str = "\r\x1b[2K";

fn o(args: &[&str]) -> Out {
    run(Command::new(env!("CARGO_BIN_EXE_o")).args(args), b"")
}

fn ollie_9p(args: &[&str]) -> Out {
    run(Command::new(env!("CARGO_BIN_EXE_ollie-9p")).args(args), b"")
}

/// The subcommands `PROGRAM --help` lists (clap's "Commands:" block), without `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// `bash -n` of a script: it parses.
fn bash_parses(script: &str, dir: &Path, name: &str) {
    let file = dir.join(name);
    std::fs::write(&file, script).unwrap();
    let out = run(Command::new("bash").arg("-n").arg(&file), b"");
    assert_eq!(out.code, Some(0), "bash -n {name}: {out:?}");
}

/// Whether a bash completion script registers a function for the command `name`.
fn registers(script: &str, name: &str) -> bool {
    script.lines().any(|l| {
        let l = l.trim();
        l.starts_with("complete ") && l.contains(" -F ") && l.ends_with(&format!(" {name}"))
    })
}

fn no_progress_bytes(stderr: &str, what: &str) {
    assert!(!stderr.contains('\r'), "{what}: {stderr:?}");
    assert!(!stderr.contains("\x1b["), "{what}: {stderr:?}");
    assert!(!stderr.contains(SPINNER), "{what}: {stderr:?}");
}

#[test]
fn completions_for_every_shell() {
    let tmp = tempfile::tempdir().unwrap();
    let top = o(&["--help"]);
    let commands = subcommands(ok(&top));
    for want in ["ls", "new", "attach", "prompt", "approve", "completions"] {
        assert!(commands.iter().any(|c| c == want), "{want}: {commands:?}");
    }

    // o's scripts call o back (COMPLETE=SHELL o -- WORDS…), so session and agent names are
    // completed from the server (o_first_hour.rs); here: the scripts, and the answers for
    // subcommands and options.
    let bash = o(&["completions", "bash"]);
    let script = ok(&bash);
    assert_eq!(bash.stderr, "");
    assert!(script.contains("COMPLETE=\"bash\""), "{script}");
    assert!(registers(script, "o"), "not registered for o");
    bash_parses(script, tmp.path(), "o.bash");
    let offered = common::complete(&["o", ""], None);
    for c in &commands {
        assert!(offered.contains(c), "{c} is not completed: {offered:?}");
    }
    // Options of a subcommand are completed too.
    assert!(common::complete(&["o", "prompt", "--j"], None).contains(&"--json".to_owned()));

    let zsh = o(&["completions", "zsh"]);
    assert!(ok(&zsh).starts_with("#compdef o\n"), "{zsh:?}");
    assert!(zsh.stdout.contains("COMPLETE=\"zsh\""), "{zsh:?}");
    let fish = o(&["completions", "fish"]);
    assert!(
        ok(&fish).contains("complete --keep-order --exclusive --command o "),
        "{fish:?}"
    );
    for shell in ["elvish", "powershell"] {
        let out = o(&["completions", shell]);
        assert!(ok(&out).contains("COMPLETE"), "{shell}: {out:?}");
    }
    // An unknown shell is a usage error naming the valid ones.
    let bad = o(&["completions", "tcsh"]);
    assert_eq!(bad.code, Some(2), "{bad:?}");
    assert!(bad.stderr.contains("possible values: bash"), "{bad:?}");
    assert_eq!(bad.stdout, "");

    // ollie-9p: the same, without a server.
    let nine_help = ollie_9p(&["--help"]);
    let nine_commands = subcommands(ok(&nine_help));
    let nine = ollie_9p(&["-a", "unix!/nonexistent/ollie", "completions", "bash"]);
    let script = ok(&nine);
    for c in &nine_commands {
        assert!(
            script.contains(&format!("ollie__9p__subcmd__{c}")),
            "ollie-9p {c} is not completed"
        );
    }
    assert!(registers(script, "ollie-9p"), "not registered for ollie-9p");
    bash_parses(script, tmp.path(), "ollie-9p.bash");
    assert!(ok(&ollie_9p(&["completions", "zsh"])).starts_with("#compdef ollie-9p\n"));
    assert!(ok(&ollie_9p(&["completions", "fish"])).contains("complete -c ollie-9p "));
}

#[test]
fn every_subcommand_has_examples() {
    for (prog, help) in [
        (env!("CARGO_BIN_EXE_o"), o(&["--help"])),
        (env!("CARGO_BIN_EXE_ollie-9p"), ollie_9p(&["--help"])),
    ] {
        assert!(ok(&help).contains("EXAMPLES:"), "{prog}: {help:?}");
        let commands = subcommands(&help.stdout);
        assert!(commands.len() >= 5, "{prog}: {commands:?}");
        for c in commands {
            let out = run(Command::new(prog).args([c.as_str(), "--help"]), b"");
            let text = ok(&out);
            let examples = text
                .split_once("EXAMPLES:\n")
                .unwrap_or_else(|| panic!("{prog} {c} --help has no EXAMPLES: {text}"))
                .1;
            // At least one example, and it runs this very subcommand.
            assert!(
                examples.lines().any(|l| l.contains(&format!(" {c}"))),
                "{prog} {c}: {examples}"
            );
        }
    }
}

/// A server whose default backend replays `turns` (JSON lines), with session `s`.
fn replay_server(turns: &[serde_json::Value]) -> Srv {
    let script: String = turns.iter().map(|t| format!("{t}\n")).collect();
    let srv = Srv::start_with(|cfg| {
        let file = cfg.join("turns.jsonl");
        std::fs::write(&file, script).unwrap();
        std::fs::write(
            cfg.join("config.toml"),
            format!(
                "default_backend = \"r\"\n\n[backends.r]\nkind = \"replay\"\nfile = \"{}\"\n",
                file.display()
            ),
        )
        .unwrap();
    });
    let work = srv.workdir();
    ok(&srv.run(&["new", "s", "--cwd", work.to_str().unwrap()], b""));
    srv
}

fn one_json_object(out: &Out) -> serde_json::Value {
    assert_eq!(out.stdout.lines().count(), 1, "one line: {out:?}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
}

#[test]
fn prompt_json_reports_the_reply_the_outcome_and_the_stats() {
    // One turn's answer; the script has no second turn, so the next prompt fails.
    let answer = "The answer is forty-two.";
    let srv = replay_server(&[serde_json::json!({ "text": answer })]);

    let out = srv.run(&["prompt", "--json", "s", "what", "is", "it"], b"");
    assert_eq!(out.code, Some(0), "{out:?}");
    // Standard error is a pipe: no progress line, and nothing else either.
    assert_eq!(out.stderr, "", "{out:?}");
    let j = one_json_object(&out);
    assert_eq!(j["session"], "s", "{j}");
    assert_eq!(j["agent"], "main", "{j}");
    assert_eq!(j["ok"], true, "{j}");
    assert_eq!(j["state"], "idle", "{j}");
    assert!(j["error"].is_null(), "{j}");
    let reply = j["reply"].as_str().unwrap();
    assert!(reply.contains(answer), "{j}");
    // The prompt itself is not part of the reply.
    assert!(!reply.contains("what is it"), "{j}");
    // The replay backend counts a quarter of the text's bytes as output tokens.
    assert_eq!(j["tokens_in"], 0, "{j}");
    assert_eq!(j["tokens_out"], (answer.len() / 4) as u64, "{j}");
    assert_eq!(j["cost_usd"].as_f64(), Some(0.0), "{j}");
    // The same numbers as o ls reports.
    let ls: serde_json::Value = serde_json::from_str(ok(&srv.run(&["ls", "--json"], b""))).unwrap();
    assert_eq!(ls[0]["agents"][0]["tokens_out"], j["tokens_out"], "{ls}");

    // A failing turn: ok false, its error, exit status 1; still one object, nothing on
    // standard error.
    let out = srv.run(&["prompt", "--json", "s/main", "again"], b"");
    assert_eq!(out.code, Some(1), "{out:?}");
    assert_eq!(out.stderr, "", "{out:?}");
    let j = one_json_object(&out);
    assert_eq!(j["ok"], false, "{j}");
    assert_eq!(j["state"], "error", "{j}");
    assert!(
        j["error"].as_str().unwrap().contains("has no turn 2"),
        "{j}"
    );
    assert!(
        !j["reply"].as_str().unwrap().contains("has no turn 2"),
        "{j}"
    );
    assert_eq!(j["tokens_out"], (answer.len() / 4) as u64, "{j}");

    // Without --json the error goes to standard error as one line; no progress bytes. (The
    // script's position moves only with the turns it played.)
    let out = srv.run(&["prompt", "s", "once more"], b"");
    fails(&out, 1, "has no turn 2");
    no_progress_bytes(&out.stderr, "o prompt");
    // Failures before a turn stay one message line, with nothing on standard output.
    let out = srv.run(&["prompt", "--json", "nope", "hi"], b"");
    fails(&out, 1, "no session named \"nope\"");
    assert_eq!(out.stdout, "");
}

#[test]
fn new_json() {
    let srv = Srv::start();
    let work = srv.workdir();
    let out = srv.run(
        &["new", "--json", "p", "--cwd", work.to_str().unwrap()],
        b"",
    );
    assert_eq!(one_json_object(&out), serde_json::json!({ "session": "p" }));
    let out = srv.run(&["new", "p/b", "--json"], b"");
    let j = one_json_object(&out);
    let id = j["id"].as_str().unwrap();
    assert_eq!(
        j,
        serde_json::json!({ "session": "p", "agent": "b", "id": id }),
        "{j}"
    );
    // The id is the agent's own.
    let ls: serde_json::Value = serde_json::from_str(ok(&srv.run(&["ls", "--json"], b""))).unwrap();
    assert_eq!(ls[0]["agents"][0]["id"], id, "{ls}");
    assert_eq!(ls[0]["agents"][0]["name"], "b", "{ls}");
    // Errors are not JSON.
    let out = srv.run(&["new", "--json", "p/b"], b"");
    fails(&out, 1, "already exists");
    assert_eq!(out.stdout, "");
}

#[test]
fn attach_on_pipes_shows_no_progress() {
    let srv = replay_server(&[serde_json::json!({ "text": "done." })]);
    let out = srv.run(&["attach", "s"], b"go\n");
    assert!(ok(&out).contains("done."), "{out:?}");
    no_progress_bytes(&out.stderr, "o attach");
    no_progress_bytes(&out.stdout, "o attach");
}

/// A new terminal: its master side and its slave side, both close-on-exec from the start
/// (the tests of this file run in parallel threads and start servers: a slave inherited by
/// one of those would keep the terminal open after `o` has exited).
fn terminal() -> (PtyMaster, OwnedFd) {
    let flags = OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let master = nix::pty::posix_openpt(flags).unwrap();
    nix::pty::grantpt(&master).unwrap();
    nix::pty::unlockpt(&master).unwrap();
    let path = nix::pty::ptsname_r(&master).unwrap();
    // std opens with O_CLOEXEC.
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_NOCTTY)
        .open(path)
        .unwrap();
    (master, OwnedFd::from(slave))
}

/// Reads the terminal's master side until every writer has closed the slave side (EIO on
/// Linux).
fn drain(mut master: PtyMaster) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match master.read(&mut chunk) {
                Ok(0) | Err(_) => return out,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
    })
}

/// Runs `cmd` with standard error on a new terminal (`TERM=xterm`, `OLLIE_NO_PROGRESS`
/// unset, then `env`) and standard output on a pipe; returns the exit status, standard
/// output and what reached the terminal.
fn with_terminal_stderr(mut cmd: Command, env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let (master, slave) = terminal();
    cmd.env("TERM", "xterm").env_remove("OLLIE_NO_PROGRESS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(slave.as_fd().try_clone_to_owned().unwrap()))
        .spawn()
        .unwrap();
    // The command holds its copy of the slave side: only the child may keep it open.
    drop(cmd);
    drop(slave);
    let terminal = drain(master);
    let mut stdout = child.stdout.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).unwrap();
        s
    });
    let st = wait_child(&mut child, &what);
    let out = out.join().unwrap();
    let shown = String::from_utf8_lossy(&terminal.join().unwrap()).into_owned();
    (st.code(), out, shown)
}

#[test]
fn the_progress_line_is_on_the_terminal_only_and_erased() {
    // Three answers; the fourth prompt finds no turn in the script and fails.
    let turns: Vec<_> = (1..=3)
        .map(|i| serde_json::json!({ "text": format!("answer {i}") }))
        .collect();
    let srv = replay_server(&turns);

    let (code, out, shown) = with_terminal_stderr(srv.o(&["prompt", "--json", "s", "go"]), &[]);
    assert_eq!(code, Some(0), "{out:?} {shown:?}");
    // The line is drawn as soon as the prompt is sent: spinner, state, seconds.
    assert!(
        shown.starts_with(&format!("{ERASE}⠋ waiting · 0s")),
        "{shown:?}"
    );
    // It is gone when the turn has ended, before the reply is printed.
    assert!(shown.ends_with(ERASE), "{shown:?}");
    assert!(
        !shown.contains('\n'),
        "one self-overwriting line: {shown:?}"
    );
    // Standard output has the reply and nothing of the line.
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["reply"], "answer 1\n", "{j}");
    no_progress_bytes(&out, "standard output");

    // --quiet and OLLIE_NO_PROGRESS: nothing on the terminal at all.
    let (code, out, shown) = with_terminal_stderr(srv.o(&["prompt", "--quiet", "s", "go"]), &[]);
    assert_eq!((code, shown.as_str()), (Some(0), ""), "{out:?}");
    assert!(out.contains("answer 2"), "{out:?}");
    let (code, out, shown) =
        with_terminal_stderr(srv.o(&["prompt", "s", "go"]), &[("OLLIE_NO_PROGRESS", "1")]);
    assert_eq!((code, shown.as_str()), (Some(0), ""), "{out:?}");
    assert!(out.contains("answer 3"), "{out:?}");

    // A failed turn: the line is erased before the error line is written.
    let (code, out, shown) = with_terminal_stderr(srv.o(&["prompt", "s", "go"]), &[]);
    assert_eq!(code, Some(1), "{out:?} {shown:?}");
    assert!(shown.starts_with(ERASE), "{shown:?}");
    let (line, message) = shown.rsplit_once(ERASE).unwrap();
    assert!(line.contains(" · "), "{shown:?}");
    assert!(message.starts_with("o: "), "{shown:?}");
    assert!(message.contains("has no turn 4"), "{shown:?}");
    assert!(!message.contains(SPINNER), "{shown:?}");
}
