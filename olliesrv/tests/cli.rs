//! The `olliesrv` binary's command line: bad input fails fast with one clear line and a
//! distinct exit status, before anything is created.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn olliesrv() -> Command {
    Command::new(env!("CARGO_BIN_EXE_olliesrv"))
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("olliesrv-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn help_exits_zero() {
    let out = olliesrv().arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--config"));
}

#[test]
fn bad_config_is_one_line_naming_the_key() {
    let d = tempdir("badcfg");
    let cfg = d.join("config.toml");
    std::fs::write(&cfg, "[backends.x]\nkind = \"gpt\"\n").unwrap();
    let sock = d.join("ns/ollie");
    let out = olliesrv()
        .arg("--config")
        .arg(&cfg)
        .arg("-a")
        .arg(format!("unix!{}", sock.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("backends.x.kind"), "{err}");
    assert!(
        err.contains("valid: openai, anthropic, ollama, replay"),
        "{err}"
    );
    // Nothing was created.
    assert!(!sock.exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn missing_config_file_and_bad_addresses() {
    let d = tempdir("addr");
    let out = olliesrv()
        .arg("--config")
        .arg(d.join("nope.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read config"));
    let out = olliesrv().args(["-a", "udp!x!1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown network"));
    // TCP always authenticates with the state directory's key: a key file others can read
    // is refused at start (and nothing is served).
    let state = d.join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("tcp.key"), format!("{}\n", "ab".repeat(32))).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        state.join("tcp.key"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tcp = format!("tcp!127.0.0.1!{port}");
    let out = olliesrv()
        .args(["-a", &tcp])
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tcp.key") && err.contains("chmod 600"),
        "{err}"
    );
    // A key that is not 64 hex digits is refused too.
    std::fs::write(state.join("tcp.key"), "short\n").unwrap();
    std::fs::set_permissions(
        state.join("tcp.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let out = olliesrv()
        .args(["-a", &tcp])
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not 64 hex digits"));
    // A socket directory that others can enter is refused.
    let open_dir = d.join("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = olliesrv()
        .arg("-a")
        .arg(format!("unix!{}", open_dir.join("ollie").display()))
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 700"));
    let _ = std::fs::remove_dir_all(&d);
}
