//! `o sandbox` as a real process: stdin forwarding and post-run warnings.
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn features_ok(test: &str) -> bool {
    let p = ollie_sandbox::probe();
    let missing = if p.landlock_abi < 7 {
        Some(format!("landlock ABI {} < 7", p.landlock_abi))
    } else if !p.user_namespaces {
        Some("user namespaces are disabled".to_string())
    } else {
        None
    };
    match missing {
        None => true,
        Some(r) if std::env::var("OLLIE_TEST_REQUIRE").as_deref() == Ok("all") => {
            panic!("{test}: required kernel feature missing: {r}")
        }
        Some(r) => {
            let _ = writeln!(std::io::stderr(), "SKIP {test}: {r}");
            false
        }
    }
}

fn workspace(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ollie-o-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn o(ws: &PathBuf, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_o"));
    c.args(["sandbox", "--workdir"])
        .arg(ws)
        .arg("--")
        .args(args);
    c
}

#[test]
fn stdin_pipe_is_forwarded() {
    if !features_ok("stdin_pipe_is_forwarded") {
        return;
    }
    let ws = workspace("stdin");
    let mut child = o(&ws, &["sh", "-c", "tr a-z A-Z; echo \"eof $?\""])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        input.write_all(&b"hello pipe\n".repeat(20_000)).unwrap();
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.matches("HELLO PIPE\n").count(), 20_000);
    assert!(text.ends_with("eof 0\n"), "{}", &text[text.len() - 40..]);
    // No stdin (null): the tool reads EOF at once.
    let out = o(&ws, &["wc", "-c"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
    let _ = std::fs::remove_dir_all(&ws);
}

#[test]
fn post_run_flags_are_printed_as_warnings() {
    if !features_ok("post_run_flags_are_printed_as_warnings") {
        return;
    }
    let ws = workspace("flags");
    let out = o(
        &ws,
        &[
            "sh",
            "-c",
            "mkdir -p vendor/x && git -C vendor/x init -q && echo 'touch /tmp/x' > vendor/x/.git/hooks/post-checkout",
        ],
    )
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("o sandbox: warning: "))
        .collect();
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("git hook vendor/x/.git/hooks/post-checkout")),
        "{err}"
    );
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("new git repository vendor/x/.git")),
        "{err}"
    );
    // A quiet run prints no warning.
    let out = o(&ws, &["true"]).stdin(Stdio::null()).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&ws);
}
