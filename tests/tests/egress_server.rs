//! The egress proxy through olliesrv (issue 50): the operator's `[proxy]` in config.toml
//! reaches each session's toolsrv, a proxied run's requests are decided by the policy's
//! domains, and every decision is a `net` event in the audit log and in `session/NAME/net`
//! (owner only). Traffic goes only to an origin this test starts on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use ollie_testkit::client::{rdwr_text as rdwr, wait_for_text};

/// A plain HTTP origin on 127.0.0.1: answers every request with `hello-origin` and counts
/// the connections it accepted.
fn origin() -> (u16, Arc<AtomicUsize>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&seen);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\nhello-origin",
            );
        }
    });
    (port, seen)
}

/// The first `n` lines of the streaming file at `path`, read one record at a time (the
/// file never ends: a read waits for the next decision).
async fn read_net(root: &ollie_p9::Fid, path: &str, n: usize) -> String {
    let f = ollie_testkit::client::open(root, path, ollie_p9::wire::om::OREAD)
        .await
        .unwrap();
    let mut text = String::new();
    let mut offset = 0u64;
    while text.lines().count() < n {
        let chunk = tokio::time::timeout(Duration::from_secs(20), f.read(offset, 65536))
            .await
            .unwrap_or_else(|_| panic!("{path}: only {text:?} within 20 s"))
            .unwrap();
        offset += chunk.len() as u64;
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let _ = f.clunk().await;
    text
}

/// The workspace profile with the proxy mode reaching `origin.test` on `port`.
fn egress_policy(port: u16) -> String {
    let base = ollie_policy::SHIPPED_PROFILES
        .iter()
        .find(|(n, _)| *n == "workspace")
        .unwrap()
        .1;
    let start = base.find("[network]").unwrap();
    let end = start + base[start..].find("\n[syscalls]").unwrap();
    format!(
        "{}[network]\nmode = \"proxy\"\nallow_domains = [\"origin.test\"]\ndeny_domains = [\"bad.origin.test\"]\nports = [{port}]\n{}",
        &base[..start],
        &base[end..]
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_runs_are_decided_by_domain_and_every_decision_is_audited() {
    if !ollie_sandbox::probe().network_namespaces {
        ollie_testkit::skip(
            "SKIP proxied_runs_are_decided_by_domain_and_every_decision_is_audited: network namespaces cannot be created here",
        );
        return;
    }
    let (port, seen) = origin();
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(dir.path().join("policy")).unwrap();
    std::fs::create_dir_all(dir.path().join("agents")).unwrap();
    std::fs::write(dir.path().join("policy/egress.toml"), egress_policy(port)).unwrap();
    std::fs::write(
        dir.path().join("agents/egress.toml"),
        "policy = \"egress\"\n",
    )
    .unwrap();
    let cmd = format!(
        "for h in origin.test bad.origin.test other.test; do curl -s -o /dev/null -w \"$h %{{http_code}}\\n\" http://$h:{port}/x; done; curl -s http://origin.test:{port}/x"
    );
    let turns = dir.path().join("turns.jsonl");
    std::fs::write(
        &turns,
        format!(
            "{}\n{{\"text\":\"done\"}}\n",
            serde_json::json!({"tool_calls": [{"name": "execute_code",
                "arguments": {"language": "bash", "code": cmd}}]})
        ),
    )
    .unwrap();
    let config = format!(
        "default_backend = \"demo\"\n[backends.demo]\nkind = \"replay\"\nfile = \"{}\"\n[proxy]\nallow_addresses = [\"127.0.0.1/32\"]\nresolve = {{ \"origin.test\" = [\"127.0.0.1\"], \"bad.origin.test\" = [\"127.0.0.1\"], \"other.test\" = [\"127.0.0.1\"] }}\n",
        turns.display()
    );
    let srv = Srv::start_with(dir, &config, |_| {});
    let (_c, root) = attach(&srv, &me()).await;
    rdwr(
        &root,
        "session/new",
        &format!("name=px cwd={} profile=egress", work.display()),
    )
    .await
    .unwrap();
    rdwr(&root, "session/px/agent/new", "name=a prompt=go\n")
        .await
        .unwrap();
    let out = wait_for_text(
        &root,
        "session/px/agent/a/log",
        "hello-origin",
        Duration::from_secs(60),
    )
    .await;
    assert!(out.contains("origin.test 200"), "{out}");
    assert!(out.contains("bad.origin.test 403"), "{out}");
    assert!(out.contains("other.test 403"), "{out}");
    assert!(out.contains("hello-origin"), "{out}");
    // Only the two allowed requests reached the origin.
    assert_eq!(seen.load(Ordering::SeqCst), 2, "{out}");
    // session/px/net: one line per request, with the verdicts.
    let net = read_net(&root, "session/px/net", 4).await;
    let lines: Vec<serde_json::Value> = net
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let verdict = |d: &str| -> Vec<String> {
        lines
            .iter()
            .filter(|v| v["domain"] == d)
            .map(|v| v["verdict"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    assert_eq!(verdict("origin.test"), ["allowed", "allowed"], "{net}");
    assert_eq!(verdict("bad.origin.test"), ["refused"], "{net}");
    assert_eq!(verdict("other.test"), ["refused"], "{net}");
    let ok = lines.iter().find(|v| v["domain"] == "origin.test").unwrap();
    assert_eq!(ok["port"], port);
    assert_eq!(ok["address"], format!("127.0.0.1:{port}"));
    assert!(ok["bytes_down"].as_u64().unwrap() > 0, "{net}");
    assert_eq!(ok["agent_name"], "a", "{net}");
    assert_eq!(ok["session_name"], "px", "{net}");
    assert_eq!(ok["call"], "1", "{net}");
    // The audit log has them too.
    let audit = std::fs::read_to_string(srv.state_dir().join("audit.jsonl")).unwrap();
    assert!(
        audit
            .lines()
            .filter(|l| l.contains("\"event\":\"net\""))
            .count()
            >= 4,
        "{audit}"
    );
    // An agent identity cannot read the session's decisions.
    let (_ca, agent_root) = attach(&srv, "agent").await;
    assert!(
        ollie_testkit::client::read(&agent_root, "session/px/net")
            .await
            .is_err(),
        "an agent read session/px/net"
    );
}
