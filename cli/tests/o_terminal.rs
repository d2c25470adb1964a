//! Terminal injection through `o` (tier 2, issue 21 item 4): a model reply, a tool call and a
//! tool's output carrying OSC 52 (clipboard write), a screen clear, a window title, an 8-bit
//! CSI, a bidi override and bytes that are not UTF-8 go through a real olliesrv (replay
//! backend) and `o prompt`, `o prompt --json`, `o attach` (piped, and on a terminal), `o logs`
//! (plain, `--raw`, `-f`) and `o ctl`. What `o` writes, on standard output and standard error,
//! holds no ESC, no other C0 control but newline and tab, no DEL, no C1 control (0xC2
//! 0x80..=0x9F), no raw bidi control and no byte that is not UTF-8, while the escaped forms
//! (`\u{1B}]52;…`) are there to read.
//!
//! Needs the workspace binaries: run `cargo build --workspace --bins` first. Every wait is
//! bounded by a failure guard (see `common`); nothing here measures time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{Srv, drain_pty, wait_child};

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};

/// The sequences of the issue, one after the other.
const NASTY: &str = "\x1b]52;c;SGVsbG8=\x07|\x1b[2J|\x1b]0;title\x07|\u{9b}31m|\u{202e}|";
/// How `o` shows them.
const SHOWN: &str =
    "\\u{1B}]52;c;SGVsbG8=\\u{7}|\\u{1B}[2J|\\u{1B}]0;title\\u{7}|\\u{9B}31m|\\u{202E}|";

/// The bytes `o` wrote, with how it ended.
#[derive(Debug)]
struct Bytes {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Runs `cmd` with `stdin`, bounded, keeping the exact bytes of its output.
fn run_bytes(cmd: &mut Command, stdin: &[u8]) -> Bytes {
    let o = common::run_bytes(cmd, stdin);
    Bytes {
        code: o.status.code(),
        stdout: o.stdout,
        stderr: o.stderr,
    }
}

/// What is wrong with `b` as terminal output, if anything: a raw control, bidi control or
/// invisible character (the broker's set, newline and tab aside), or bytes that are not UTF-8.
fn unsafe_bytes(b: &[u8]) -> Option<String> {
    if let Some(i) = b.iter().position(|&x| x == 0x1b) {
        return Some(format!("ESC at {i}"));
    }
    if let Some(i) = b
        .windows(2)
        .position(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1]))
    {
        return Some(format!("a C1 control at {i}"));
    }
    let text = match std::str::from_utf8(b) {
        Ok(t) => t,
        Err(e) => return Some(format!("not UTF-8 at {}", e.valid_up_to())),
    };
    text.chars()
        .find(|&c| c != '\n' && c != '\t' && ollie_link::bypass::needs_display_escape(c))
        .map(|c| format!("raw U+{:04X}", u32::from(c)))
}

/// Asserts that both streams of `out` are safe, and that `want` (escaped text) shows on
/// standard output.
fn assert_safe(out: &Bytes, what: &str, want: &[&str]) {
    for (name, b) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        if let Some(bad) = unsafe_bytes(b) {
            panic!(
                "{what}: {name} has {bad}: {:?} ({out:?})",
                String::from_utf8_lossy(b)
            );
        }
    }
    let text = String::from_utf8_lossy(&out.stdout);
    for w in want {
        assert!(text.contains(w), "{what}: no {w:?} in {text:?}");
    }
}

fn call(name: &str, args: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"tool_calls": [{"name": name, "arguments": args}]})
}

/// A server whose replayed model, on each of `prompts` turns, reasons and reads `evil.txt` of
/// the session's directory with `file_read` (see [`evil_file`]), then answers with the
/// sequences. Session `s` (in the server's work directory), agent `main`.
fn server(prompts: usize) -> Srv {
    let srv = Srv::start_with(|cfg| {
        // Srv::workdir: the work directory beside the config tree.
        let work = cfg.parent().unwrap().parent().unwrap().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let file = evil_file(&work);
        let mut script = String::new();
        for i in 0..prompts {
            let mut read = call(
                "file_read",
                serde_json::json!({"path": file.display().to_string()}),
            );
            read["reasoning"] = format!("THINK{i}:{NASTY}").into();
            let answer = serde_json::json!({ "text": format!("MODEL{i}:{NASTY}\nend\n") });
            script.push_str(&format!("{read}\n{answer}\n"));
        }
        let turns = cfg.join("turns.jsonl");
        std::fs::write(&turns, &script).unwrap();
        std::fs::write(
            cfg.join("config.toml"),
            format!(
                "default_backend = \"r\"\n\n[backends.r]\nkind = \"replay\"\nfile = \"{}\"\n",
                turns.display()
            ),
        )
        .unwrap();
    });
    let work = srv.workdir();
    let made = run_bytes(
        &mut srv.o(&["new", "s", "--cwd", work.to_str().unwrap()]),
        b"",
    );
    assert_eq!(made.code, Some(0), "{made:?}");
    let made = run_bytes(&mut srv.o(&["new", "s/main"]), b"");
    assert_eq!(made.code, Some(0), "{made:?}");
    srv
}

/// The file the tool reads, in `dir`: the sequences, a raw 0x9B byte (a CSI on some
/// terminals), and a truncated UTF-8 sequence.
fn evil_file(dir: &Path) -> std::path::PathBuf {
    let f = dir.join("evil.txt");
    let mut content = format!("TOOL:{NASTY}\n").into_bytes();
    content.extend_from_slice(b"raw:\x9b2J|cut:\xe2\x82|\n");
    std::fs::write(&f, content).unwrap();
    f
}

#[test]
fn prompt_and_logs_show_sequences_escaped() {
    let srv = server(2);

    let out = run_bytes(&mut srv.o(&["prompt", "s", "read it"]), b"");
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_safe(&out, "o prompt", &[&format!("MODEL0:{SHOWN}\nend\n")]);

    let json = run_bytes(&mut srv.o(&["prompt", "--json", "s", "again"]), b"");
    assert_eq!(json.code, Some(0), "{json:?}");
    assert_safe(&json, "o prompt --json", &["\\u001b]52;c;SGVsbG8=\\u0007"]);
    // The JSON means the same: the reply is the model's text, byte for byte.
    let j: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(
        j["reply"]
            .as_str()
            .unwrap()
            .contains(&format!("MODEL1:{NASTY}\nend\n")),
        "{j}"
    );

    let raw = run_bytes(&mut srv.o(&["logs", "--raw", "s/main"]), b"");
    assert_eq!(raw.code, Some(0), "{raw:?}");
    // Markers and newlines stay: the block structure is still there to grep.
    assert_safe(
        &raw,
        "o logs --raw",
        &["[[[assistant\n", &format!("MODEL1:{SHOWN}\nend\n")],
    );
    let log = run_bytes(&mut srv.o(&["logs", "s/main"]), b"");
    assert_eq!(log.code, Some(0), "{log:?}");
    assert_safe(&log, "o logs", &[&format!("MODEL0:{SHOWN}\n")]);

    // The tool's output (through the sandbox, like o_bead's file tools) and the reasoning.
    let tool = format!("TOOL:{SHOWN}");
    assert_safe(
        &out,
        "o prompt (tool output)",
        &[&tool, &format!("THINK0:{SHOWN}")],
    );
    assert_safe(&log, "o logs (tool output)", &[&tool]);

    // logs -f: streams the whole chat, then blocks until the agent is killed.
    let mut child = srv
        .o(&["logs", "-f", "s/main"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut stdout = child.stdout.take().unwrap();
    let sink = std::sync::Arc::clone(&seen);
    let reader = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    // Until the last answer has been shown (bounded by the guard).
    let deadline = std::time::Instant::now() + common::GUARD;
    while !String::from_utf8_lossy(&seen.lock().unwrap()).contains("MODEL1:") {
        assert!(
            std::time::Instant::now() < deadline,
            "o logs -f showed nothing"
        );
        std::thread::sleep(common::STEP);
    }
    let k = run_bytes(&mut srv.o(&["kill", "s/main"]), b"");
    assert_eq!(k.code, Some(0), "{k:?}");
    let st = wait_child(&mut child, "o logs -f");
    reader.join().unwrap();
    let mut stderr = Vec::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    let f = Bytes {
        code: st.code(),
        stdout: seen.lock().unwrap().clone(),
        stderr,
    };
    assert_eq!(f.code, Some(0), "{f:?}");
    assert_safe(
        &f,
        "o logs -f",
        &[&format!("MODEL0:{SHOWN}\n"), &format!("MODEL1:{SHOWN}\n")],
    );
}

#[test]
fn attach_piped_and_on_a_terminal_shows_sequences_escaped() {
    let srv = server(3);

    // Piped: the plain chat, escaped.
    let out = run_bytes(&mut srv.o(&["attach", "s"]), b"read it\n");
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_safe(
        &out,
        "o attach (piped)",
        &[&format!("MODEL0:{SHOWN}\nend\n")],
    );

    // On a terminal, with colour and without: blocks rendered, the text escaped inside our
    // own styles. Only the styles `o` writes itself may carry ESC.
    for (i, colour) in [(1, true), (2, false)] {
        let shown = attach_on_a_terminal(&srv, colour, &format!("prompt {i}\n"));
        let ours = ["\x1b[0m", "\x1b[1m", "\x1b[2m", "\x1b[31m", "\x1b[36m"]
            .iter()
            .fold(String::from_utf8_lossy(&shown).into_owned(), |s, st| {
                s.replace(st, "")
            });
        // The pty turns each \n into \r\n on the way out: that \r is the terminal's own.
        let ours = ours.replace("\r\n", "\n");
        assert!(std::str::from_utf8(&shown).is_ok(), "not UTF-8: {shown:?}");
        if let Some(bad) = unsafe_bytes(ours.as_bytes()) {
            panic!("o attach on a terminal (colour {colour}) has {bad}: {ours:?}");
        }
        assert!(ours.contains("[assistant]\n"), "{ours:?}");
        assert!(ours.contains(&format!("MODEL{i}:{SHOWN}\n")), "{ours:?}");
        if colour {
            assert!(
                String::from_utf8_lossy(&shown).contains("\x1b[1mprompt"),
                "our styles stay: {shown:?}"
            );
        }
    }
}

/// `o attach s` with standard output on a new terminal (`NO_COLOR` set unless `colour`),
/// `input` on standard input; what reached the terminal.
fn attach_on_a_terminal(srv: &Srv, colour: bool, input: &str) -> Vec<u8> {
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave: OwnedFd = pty.slave;
    let mut cmd = srv.o(&["attach", "s"]);
    if colour {
        cmd.env_remove("NO_COLOR");
    } else {
        cmd.env("NO_COLOR", "1");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::from(slave.as_fd().try_clone_to_owned().unwrap()))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(cmd);
    drop(slave);
    let reader = drain_pty(pty.master);
    {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
    }
    let st = wait_child(&mut child, "o attach on a pty");
    assert!(st.success(), "{st}");
    reader.join().unwrap()
}

/// A model server on loopback that answers every request with HTTP 400 and an OpenAI-style
/// error whose message carries the sequences; its address.
fn hostile_model_server() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            // The request: headers, then Content-Length bytes of body.
            let mut req = Vec::new();
            let mut chunk = [0u8; 4096];
            let body_at = loop {
                match conn.read(&mut chunk) {
                    Ok(0) | Err(_) => break None,
                    Ok(n) => req.extend_from_slice(&chunk[..n]),
                }
                if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                    break Some(i + 4);
                }
            };
            let Some(body_at) = body_at else { continue };
            let head = String::from_utf8_lossy(&req[..body_at]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while req.len() < body_at + len {
                match conn.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&chunk[..n]),
                }
            }
            let body = serde_json::json!({"error": {"message": format!("PEER:{NASTY}"),
                "type": "invalid_request_error"}})
            .to_string();
            let reply = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(reply.as_bytes());
        }
    });
    format!("http://{addr}/v1")
}

#[test]
fn errors_relayed_from_the_server_are_escaped() {
    let url = hostile_model_server();
    let srv = Srv::start_with(|cfg| {
        std::fs::write(
            cfg.join("config.toml"),
            format!(
                "default_backend = \"far\"\n\n[backends.far]\nkind = \"openai\"\n\
                 base_url = \"{url}\"\nmodel = \"m\"\n"
            ),
        )
        .unwrap();
    });
    let work = srv.workdir();
    let made = run_bytes(
        &mut srv.o(&["new", "s", "--cwd", work.to_str().unwrap()]),
        b"",
    );
    assert_eq!(made.code, Some(0), "{made:?}");
    // The turn fails: the server relays the peer's message in its error.
    let out = run_bytes(&mut srv.o(&["prompt", "s", "hi"]), b"");
    assert_eq!(out.code, Some(1), "{out:?}");
    assert_safe(&out, "o prompt (failed turn)", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("o: "), "{err:?}");
    assert!(err.contains(&format!("PEER:{SHOWN}")), "{err:?}");
    // The same error in the chat, and in --json (where it keeps its meaning).
    let log = run_bytes(&mut srv.o(&["logs", "s"]), b"");
    assert_safe(&log, "o logs (error block)", &[&format!("PEER:{SHOWN}")]);
    let json = run_bytes(&mut srv.o(&["prompt", "--json", "s", "again"]), b"");
    assert_eq!(json.code, Some(1), "{json:?}");
    assert_safe(
        &json,
        "o prompt --json (failed turn)",
        &["PEER:\\u001b]52;c;SGVsbG8=\\u0007"],
    );
    let j: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(
        j["error"]
            .as_str()
            .unwrap()
            .contains(&format!("PEER:{NASTY}")),
        "{j}"
    );
    // o ls and its JSON: names, states and numbers, safe too.
    for args in [&["ls"][..], &["ls", "--json"]] {
        let out = run_bytes(&mut srv.o(args), b"");
        assert_eq!(out.code, Some(0), "{out:?}");
        assert_safe(&out, "o ls", &[]);
    }
}
