//! The smallest end-to-end check of the crate's own binary: spawn it over a socketpair,
//! authenticate as an agent and as the operator, run one tool, read the result. The full
//! cross-process suite is `tests/tests/toolsrv.rs` in the workspace's `tests` crate.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use ollie_link::auth::Identity;
use ollie_link::boot::Bootstrap;
use ollie_link::spawn::{Toolsrv, attach};
use ollie_p9::wire::om;

/// A workspace and a home (separate temporary directories) and a boot configuration with
/// one shipped policy.
fn session(policy: &str) -> (tempfile::TempDir, tempfile::TempDir, Bootstrap) {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut policies = BTreeMap::new();
    policies.insert(
        policy.to_owned(),
        std::fs::read_to_string(root.join(format!("packaging/policy/{policy}.toml"))).unwrap(),
    );
    let boot = Bootstrap::new(
        "smoke",
        dir.path().to_path_buf(),
        home.path().to_path_buf(),
        policies,
        policy,
    );
    (dir, home, boot)
}

/// Whether the sandbox's kernel features are here: the kit's gate (a SKIP line, or a failure
/// under `OLLIE_TEST_REQUIRE=all`).
fn require(name: &str) -> bool {
    ollie_testkit::features_ok(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_runs_a_tool_and_the_operator_sees_it() {
    if !require("an_agent_runs_a_tool_and_the_operator_sees_it") {
        return;
    }
    let (_dir, _home, boot) = session("workspace");
    let mut t = Toolsrv::spawn(Path::new(env!("CARGO_BIN_EXE_toolsrv")), &boot).unwrap();
    let c = t.connect(8192).await.unwrap();
    let key = t.key().clone();
    let agent = attach(&c, &key, &Identity::Agent("a1".into()))
        .await
        .unwrap();
    let mut f = agent.walk_path("proc/new").await.unwrap();
    f.open(om::ORDWR).await.unwrap();
    f.write(
        0,
        Bytes::from("tool=execute_code\ncmd=echo hello; exit 3\n"),
    )
    .await
    .unwrap();
    let out = String::from_utf8(f.read_to_end().await.unwrap()).unwrap();
    let (header, body) = out.split_once('\n').unwrap();
    assert!(header.starts_with("pid=1 exit=3 "), "{out}");
    assert_eq!(body, "hello\n");

    let op = attach(&c, &key, &Identity::Operator).await.unwrap();
    let mut l = op.walk_path("proc/list").await.unwrap();
    l.open(om::OREAD).await.unwrap();
    let list = String::from_utf8(l.read_to_end().await.unwrap()).unwrap();
    assert_eq!(list, "1\texited\texecute_code\n");

    // Closing the link ends toolsrv cleanly.
    drop((f, l, agent, op, c));
    let st = tokio::task::spawn_blocking(move || t.child().wait())
        .await
        .unwrap()
        .unwrap();
    assert!(st.success(), "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_mode_takes_the_boot_message_then_serves_9p() {
    if !require("stdio_mode_takes_the_boot_message_then_serves_9p") {
        return;
    }
    use tokio::io::AsyncWriteExt;
    let (dir, _home, boot) = session("readonly");
    let key = ollie_link::auth::MasterKey::generate().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolsrv"))
        .arg("--stdio")
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut w = child.stdin.take().unwrap();
    let r = child.stdout.take().unwrap();
    w.write_all(&ollie_link::boot::encode(&key, &boot).unwrap())
        .await
        .unwrap();
    let c = ollie_p9::Client::handshake(r, w, 8192).await.unwrap();
    // The wrong identity's secret is refused here too.
    let afid = c.auth("u", "a1").await.unwrap();
    let wrong = key.secret(&Identity::Agent("a2".into()));
    assert!(afid.write(0, Bytes::copy_from_slice(&wrong)).await.is_err());
    let a = attach(&c, &key, &Identity::Agent("a1".into()))
        .await
        .unwrap();
    let mut f = a.walk_path("proc/new").await.unwrap();
    f.open(om::ORDWR).await.unwrap();
    f.write(0, Bytes::from("tool=execute_code\ncmd=pwd\n"))
        .await
        .unwrap();
    let out = String::from_utf8(f.read_to_end().await.unwrap()).unwrap();
    let canon = std::fs::canonicalize(dir.path()).unwrap();
    assert!(out.ends_with(&format!("\n{}\n", canon.display())), "{out}");
    drop((f, a, afid, c));
    let st = child.wait().await.unwrap();
    assert!(st.success(), "{st:?}");
}
