//! `o doctor`'s checks of the system around the sandbox, each shown both ways: the toolsrv
//! binary, the configuration (read by olliesrv's own code), each backend's answer (a test
//! HTTP server on loopback, and a closed loopback port), and the server's socket.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;

use common::Srv;

/// `o doctor --json [ARGS…]` with `env`, as (items by name, exit status).
fn doctor(args: &[&str], env: &[(&str, &str)], home: &Path) -> (serde_json::Value, i32) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_o"));
    c.args(args).arg("doctor").arg("--json");
    c.env("HOME", home).env("XDG_CONFIG_HOME", home.join("xdg"));
    c.env("OLLAMA_HOST", "127.0.0.1:9")
        .env_remove("OLLIE_TOOLSRV");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    (v, out.status.code().unwrap())
}

fn item<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == name)
        .unwrap_or_else(|| panic!("no item {name}: {v}"))
}

fn ok(i: &serde_json::Value) -> bool {
    i["status"] == "ok"
}

/// A one-connection-at-a-time HTTP server on loopback answering `/v1/models` with two models.
fn models_server() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]);
            let body = if req.starts_with("GET /v1/models ") {
                r#"{"object":"list","data":[{"id":"a"},{"id":"b"}]}"#
            } else {
                "{}"
            };
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn the_configuration_and_each_backend_are_checked() {
    let home = tempfile::tempdir().unwrap();
    let live = models_server();
    let dead = ollie_testkit::server::free_port();
    let cfg = home.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "default_backend = \"live\"\n[backends.live]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{live}/v1\"\nmodel = \"a\"\n\n[backends.dead]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{dead}/v1\"\nmodel = \"a\"\n"
        ),
    )
    .unwrap();
    // No file: the built-in defaults are valid.
    let (v, _) = doctor(&[], &[], home.path());
    let c = item(&v, "config");
    assert!(ok(c), "{c}");
    assert!(
        c["detail"].as_str().unwrap().contains("built-in defaults"),
        "{c}"
    );
    // The file given: each backend asked.
    let out = Command::new(env!("CARGO_BIN_EXE_o"))
        .args(["doctor", "--json", "--config", cfg.to_str().unwrap()])
        .env("HOME", home.path())
        .env("OLLAMA_HOST", "127.0.0.1:9")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = item(&v, "config");
    assert!(ok(c), "{c}");
    assert!(
        c["detail"].as_str().unwrap().contains("config.toml: valid"),
        "{c}"
    );
    let b = item(&v, "backend live");
    assert!(ok(b), "{b}");
    assert!(b["detail"].as_str().unwrap().ends_with(": 2 models"), "{b}");
    let b = item(&v, "backend dead");
    assert!(!ok(b), "{b}");
    assert!(
        b["detail"].as_str().unwrap().contains("Connection refused"),
        "{b}"
    );
    assert!(b["fix"].is_string(), "{b}");
    // A backend that does not answer is not required.
    assert_eq!(b["required"], false, "{b}");

    // An invalid file: ✗ with the server's own error, and exit 1.
    std::fs::write(&cfg, "colour = \"red\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_o"))
        .args(["doctor", "--config", cfg.to_str().unwrap()])
        .env("HOME", home.path())
        .env("OLLAMA_HOST", "127.0.0.1:9")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(" config"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.starts_with("✗ config: "), "{line}");
    assert!(line.contains("unknown field `colour`"), "{line}");
    assert!(line.contains("; fix: "), "{line}");
}

#[test]
fn a_missing_toolsrv_is_a_required_failure_with_the_fix() {
    let home = tempfile::tempdir().unwrap();
    let (v, code) = doctor(
        &[],
        &[("OLLIE_TOOLSRV", "/nonexistent/toolsrv")],
        home.path(),
    );
    let t = item(&v, "toolsrv");
    assert!(!ok(t), "{t}");
    assert_eq!(t["required"], true);
    assert!(
        t["detail"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/toolsrv"),
        "{t}"
    );
    assert!(t["fix"].as_str().unwrap().contains("OLLIE_TOOLSRV"), "{t}");
    assert_eq!(code, 1, "{v}");
    // The one next to o is found and runs.
    let (v, _) = doctor(&[], &[], home.path());
    let t = item(&v, "toolsrv");
    assert!(ok(t), "{t}");
    assert!(t["detail"].as_str().unwrap().contains("(toolsrv "), "{t}");
}

#[test]
fn the_servers_socket_is_checked_for_privacy_and_an_answer() {
    let home = tempfile::tempdir().unwrap();
    let srv = Srv::start();
    let addr = srv.addr();
    let (v, _) = doctor(&["-a", &addr], &[], home.path());
    let s = item(&v, "server");
    assert!(ok(s), "{s}");
    assert!(s["detail"].as_str().unwrap().contains("answers"), "{s}");
    // Its directory opened to everyone: refused, with the fix.
    let dir = srv.sock.parent().unwrap();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (v, _) = doctor(&["-a", &addr], &[], home.path());
    let s = item(&v, "server");
    assert!(!ok(s), "{s}");
    assert!(
        s["detail"].as_str().unwrap().contains("has mode 755"),
        "{s}"
    );
    assert!(s["fix"].as_str().unwrap().contains("chmod 700"), "{s}");
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    // Nothing there: not required, and the fix says how to start one.
    let gone = home.path().join("ns");
    std::fs::create_dir(&gone).unwrap();
    let (v, code) = doctor(
        &["-a", &format!("unix!{}/ollie", gone.display())],
        &[],
        home.path(),
    );
    let s = item(&v, "server");
    assert!(!ok(s), "{s}");
    assert_eq!(s["required"], false);
    assert!(s["fix"].as_str().unwrap().contains("start olliesrv"), "{s}");
    assert_eq!(code == 1, v["ok"] == false, "{v}");
}
