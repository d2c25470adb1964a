//! Cross-process suite for `toolsrv`: the real binary started with `Toolsrv::spawn` over a
//! socketpair (the way olliesrv starts it), a temporary workspace, the shipped policies, and
//! our 9P client speaking Tauth on the link (the harness is `common::toolsrv`).
//!
//! Covers every Tauth refusal, aname isolation (processes, tools, `ctl`, `bypass/`), every
//! tool through `proc/new`, background processes (`wait`, `out`, `stat`, `complete`, `ctl`),
//! run records (`proc/N/record`, `record=1`), flushing a blocking `proc/new` read,
//! `ctl load/unload/policy`, an agent's union mounts (`ctl unions`: what its runs see at
//! `/ctx`, where their writes land, refused input), the lifetime of tools (toolsrv killed,
//! link closed), what toolsrv's `/proc` entries reveal, and bad boot input.
//!
//! Without Landlock ABI 7 or user namespaces a case prints `SKIP <case>: <reason>`; with
//! `OLLIE_TEST_REQUIRE=all` it fails instead. No assertion is about time: every wait is a
//! bounded poll or a bounded 9P call that fails the test when it runs out.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use bytes::Bytes;
use command_fds::{CommandFdExt, FdMapping};
use common::toolsrv::*;
use common::{IO_TIMEOUT, STEP, UP_TIMEOUT, bin, text, wait_child, within};
use ollie_link::auth::{Identity, MasterKey, hex};
use ollie_link::boot;
use ollie_p9::Fid;
use ollie_p9::wire::om;
use ollie_testkit::fstree::tree;

// ---------------------------------------------------------------------------------------------
// Tauth

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_attach_without_afid_is_refused() {
    if !features_ok("auth_attach_without_afid_is_refused") {
        return;
    }
    let t = Ts::start().await;
    for aname in ["a", "operator"] {
        let e = within("attach", t.c().attach(None, UNAME, aname))
            .await
            .expect_err("attach without auth");
        let m = msg(&e);
        assert!(m.contains("authentication required"), "{m}");
    }
    // A root fid is not an auth fid either.
    let root = t.attach("a").await;
    let e = within("attach", t.c().attach(Some(&root), UNAME, "a"))
        .await
        .expect_err("attach with a non-auth afid");
    assert!(msg(&e).contains("not an authentication fid"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_wrong_secret_kills_the_afid() {
    if !features_ok("auth_wrong_secret_kills_the_afid") {
        return;
    }
    let t = Ts::start().await;
    let a = Identity::Agent("a".into());
    let afid = within("auth", t.c().auth(UNAME, "a")).await.expect("auth");
    let wrong = hex(&[0x5a; 32]);
    let e = within("write", afid.write(0, Bytes::from(wrong)))
        .await
        .expect_err("wrong secret accepted");
    assert!(msg(&e).contains("authentication failed"), "{e}");
    let e = within("attach", t.c().attach(Some(&afid), UNAME, "a"))
        .await
        .expect_err("attach after a wrong secret");
    assert!(msg(&e).contains("permission denied"), "{e}");
    // No second guess on the same afid, even with the right secret.
    let right = hex(&t.key().secret(&a));
    let e = within("write", afid.write(0, Bytes::from(right)))
        .await
        .expect_err("right secret accepted after a wrong one");
    assert!(msg(&e).contains("failed authentication"), "{e}");
    assert!(within("read", afid.read(0, 64)).await.is_err());
    assert!(
        within("attach", t.c().attach(Some(&afid), UNAME, "a"))
            .await
            .is_err()
    );
    // A new afid with the right secret still works.
    t.attach("a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_another_identitys_secret_is_refused() {
    if !features_ok("auth_another_identitys_secret_is_refused") {
        return;
    }
    let t = Ts::start().await;
    let b = Identity::Agent("b".into());
    for (aname, wrong) in [
        ("a", t.key().secret(&b)),
        ("a", t.key().secret(&Identity::Operator)),
        ("operator", t.key().secret(&b)),
    ] {
        let afid = within("auth", t.c().auth(UNAME, aname))
            .await
            .expect("auth");
        let e = within("write", afid.write(0, Bytes::from(hex(&wrong))))
            .await
            .expect_err("another identity's secret accepted");
        assert!(msg(&e).contains("authentication failed"), "{e}");
        let e = within("attach", t.c().attach(Some(&afid), UNAME, aname))
            .await
            .expect_err("attach after another identity's secret");
        assert!(msg(&e).contains("permission denied"), "{e}");
    }
    // And with that secret on its own aname, b gets in.
    let afid = within("auth", t.c().auth(UNAME, "b")).await.expect("auth");
    within(
        "write",
        afid.write(0, Bytes::from(hex(&t.key().secret(&b)))),
    )
    .await
    .expect("b's own secret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_afid_attaches_once() {
    if !features_ok("auth_afid_attaches_once") {
        return;
    }
    let t = Ts::start().await;
    let a = Identity::Agent("a".into());
    let afid = within("auth", t.c().auth(UNAME, "a")).await.expect("auth");
    within(
        "write",
        afid.write(0, Bytes::from(hex(&t.key().secret(&a)))),
    )
    .await
    .expect("secret");
    let root = within("attach", t.c().attach(Some(&afid), UNAME, "a"))
        .await
        .expect("first attach");
    assert!(
        read(&root, "info")
            .await
            .unwrap()
            .contains("platform=linux")
    );
    let e = within("attach", t.c().attach(Some(&afid), UNAME, "a"))
        .await
        .expect_err("second attach with the same afid");
    assert!(msg(&e).contains("already used"), "{e}");
    // The token cannot be read again either.
    assert!(within("read", afid.read(0, 64)).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_attach_aname_must_match() {
    if !features_ok("auth_attach_aname_must_match") {
        return;
    }
    let t = Ts::start().await;
    let a = Identity::Agent("a".into());
    let afid = within("auth", t.c().auth(UNAME, "a")).await.expect("auth");
    within(
        "write",
        afid.write(0, Bytes::from(hex(&t.key().secret(&a)))),
    )
    .await
    .expect("secret");
    for (uname, aname) in [
        (UNAME, "b"),
        (UNAME, "operator"),
        (UNAME, ""),
        ("other", "a"),
    ] {
        let e = within("attach", t.c().attach(Some(&afid), uname, aname))
            .await
            .expect_err("attach with another aname or uname");
        let m = msg(&e);
        assert!(m.contains("differs"), "{uname}/{aname}: {m}");
    }
    // The refusals did not use the afid up: the matching attach works.
    within("attach", t.c().attach(Some(&afid), UNAME, "a"))
        .await
        .expect("matching attach");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_write_after_success_is_refused() {
    if !features_ok("auth_write_after_success_is_refused") {
        return;
    }
    let t = Ts::start().await;
    let a = Identity::Agent("a".into());
    let secret = hex(&t.key().secret(&a));
    let afid = within("auth", t.c().auth(UNAME, "a")).await.expect("auth");
    within("write", afid.write(0, Bytes::from(secret.clone())))
        .await
        .expect("secret");
    let e = within("write", afid.write(0, Bytes::from(secret.clone())))
        .await
        .expect_err("second write after success");
    assert!(msg(&e).contains("already authenticated"), "{e}");
    within("attach", t.c().attach(Some(&afid), UNAME, "a"))
        .await
        .expect("attach after the refused write");
    let e = within("write", afid.write(0, Bytes::from(secret)))
        .await
        .expect_err("write after attach");
    assert!(msg(&e).contains("permission denied"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_read_before_write_is_refused() {
    if !features_ok("auth_read_before_write_is_refused") {
        return;
    }
    let t = Ts::start().await;
    let afid = within("auth", t.c().auth(UNAME, "a")).await.expect("auth");
    let e = within("read", afid.read(0, 64))
        .await
        .expect_err("token before the secret");
    assert!(msg(&e).contains("write the secret first"), "{e}");
    let e = within("attach", t.c().attach(Some(&afid), UNAME, "a"))
        .await
        .expect_err("attach before the secret");
    assert!(msg(&e).contains("not authenticated"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_invalid_anames_are_refused() {
    if !features_ok("auth_invalid_anames_are_refused") {
        return;
    }
    let t = Ts::start().await;
    let long = "x".repeat(200);
    for aname in ["a/b", "", ".hidden", "a b", "../a", "é", long.as_str()] {
        let e = within("auth", t.c().auth(UNAME, aname))
            .await
            .expect_err("invalid aname accepted");
        let m = msg(&e);
        assert!(m.contains("permission denied"), "{aname:?}: {m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_secret_as_hex_or_raw_and_the_token() {
    if !features_ok("auth_secret_as_hex_or_raw_and_the_token") {
        return;
    }
    let t = Ts::start().await;
    let a = Identity::Agent("a".into());
    let s = t.key().secret(&a);
    for (what, data) in [
        ("hex", Bytes::from(hex(&s))),
        ("hex + newline", Bytes::from(format!("{}\n", hex(&s)))),
        ("raw", Bytes::copy_from_slice(&s)),
    ] {
        let afid = within("auth", t.c().auth(UNAME, "a")).await.expect("auth");
        within("write", afid.write(0, data))
            .await
            .unwrap_or_else(|e| panic!("{what} secret: {e}"));
        let tok = within("read", afid.read(0, 64)).await.expect("token");
        let tok = std::str::from_utf8(&tok).expect("utf-8 token");
        assert_eq!(tok.len(), 33, "{what}: token {tok:?}");
        assert!(tok.ends_with('\n'), "{what}: token {tok:?}");
        assert!(
            tok[..32]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{what}: token {tok:?}"
        );
        let root = within("attach", t.c().attach(Some(&afid), UNAME, "a"))
            .await
            .unwrap_or_else(|e| panic!("{what}: attach: {e}"));
        assert!(
            read(&root, "info")
                .await
                .unwrap()
                .contains("platform=linux")
        );
    }
    // The operator too.
    let op = t.attach("operator").await;
    let info = kv(&read(&op, "info").await.unwrap());
    assert_eq!(info["default_policy"], "workspace");
    assert_eq!(info["policies"], "network,readonly,workspace");
}

// ---------------------------------------------------------------------------------------------
// aname isolation

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_cannot_see_or_control_each_others_processes() {
    if !features_ok("agents_cannot_see_or_control_each_others_processes") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let b = t.attach("b").await;
    let op = t.attach("operator").await;
    let marker = sleep_marker();
    let pid = run_bg(&a, &format!("tool=execute_code\ncmd=sleep {marker}\n"))
        .await
        .expect("a starts a background process");
    let p = pid.to_string();

    // a sees it.
    assert!(list(&a).await.contains_key(&pid));
    assert!(ls(&a, "proc").await.contains(&p));

    // b does not: not in the list, not in the directory, no walk to it or into it.
    assert!(!list(&b).await.contains_key(&pid));
    assert!(!ls(&b, "proc").await.contains(&p));
    for f in ["", "/out", "/stat", "/wait", "/record", "/ctl"] {
        let path = format!("proc/{pid}{f}");
        let e = within("walk", b.walk_path(&path))
            .await
            .expect_err("b walked to a's process");
        msg(&e);
    }
    // b cannot change a's tool set or read it, nor run as a.
    for cmd in ["unload a execute_code", "load a file_read"] {
        let e = write(&b, "ctl", cmd)
            .await
            .expect_err("b changed a's tools");
        assert!(e.contains("permission denied"), "{cmd}: {e}");
    }
    for req in ["a", "a json"] {
        let e = rdwr(&b, "tools", req).await.expect_err("b read a's tools");
        assert!(e.contains("permission denied"), "{req}: {e}");
    }
    let e = run(&b, "tool=execute_code\nagent=a\ncmd=true\n")
        .await
        .expect_err("b ran as a");
    assert!(e.contains("permission denied"), "{e}");
    // a's process is untouched by all that.
    assert_eq!(list(&a).await[&pid].0, "running");

    // The operator sees it and can kill it.
    assert_eq!(
        list(&op).await[&pid],
        ("running".into(), "execute_code".into())
    );
    assert!(ls(&op, "proc").await.contains(&p));
    let st = kv(&read(&op, &format!("proc/{pid}/stat")).await.unwrap());
    assert_eq!(st["agent"], "a");
    write(&op, &format!("proc/{pid}/ctl"), "kill")
        .await
        .expect("operator kills a's process");
    let w = read(&op, &format!("proc/{pid}/wait")).await.unwrap();
    assert_eq!(w, "137\n");
    assert_eq!(list(&a).await[&pid].0, "killed");
    wait_marker_gone(&marker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bypass_is_for_the_operator_only() {
    if !features_ok("bypass_is_for_the_operator_only") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let op = t.attach("operator").await;
    assert!(ls(&a, "bypass").await.is_empty());
    for (path, mode) in [
        ("bypass/pending", om::OREAD),
        ("bypass/resolve", om::OWRITE),
    ] {
        let e = open(&a, path, mode)
            .await
            .expect_err("agent opened bypass/");
        assert!(!e.is_empty());
    }
    let e = write(&a, "bypass/resolve", r#"{"id":"x","approved":true}"#)
        .await
        .expect_err("agent resolved");
    assert!(!e.is_empty());

    assert_eq!(
        ls(&op, "bypass").await,
        BTreeSet::from([
            "full".to_owned(),
            "log".to_owned(),
            "pending".to_owned(),
            "resolve".to_owned()
        ])
    );
    let pending = open(&op, "bypass/pending", om::OREAD)
        .await
        .expect("operator opens bypass/pending");
    let _ = within("clunk", pending.clunk()).await;
    let resolve = open(&op, "bypass/resolve", om::OWRITE)
        .await
        .expect("operator opens bypass/resolve");
    for bad in [
        "not json",
        r#"{"id":"x"}"#,
        r#"{"id":"x","approved":true,"error":"no"}"#,
        r#"{"id":"x","approved":false}"#,
        r#"{"id":"x","approved":true,"bogus":1}"#,
        r#"{"id":"x","approved":true,"scope":"forever"}"#,
    ] {
        let e = within("write", resolve.write(0, Bytes::from(bad)))
            .await
            .expect_err("malformed verdict accepted");
        let m = msg(&e);
        assert!(m.contains("resolve: "), "{bad}: {m}");
        assert!(!m.contains("no request"), "{bad}: {m}");
    }
    for good in [
        r#"{"id":"0123456789abcdef0123456789abcdef","approved":true}"#,
        r#"{"id":"0123456789abcdef0123456789abcdef","error":"no, thanks"}"#,
        r#"{"id":"0123456789abcdef0123456789abcdef","approved":true,"scope":"session"}"#,
    ] {
        let e = within("write", resolve.write(0, Bytes::from(good)))
            .await
            .expect_err("a verdict for an unknown id accepted");
        assert!(
            msg(&e).contains("no request 0123456789abcdef0123456789abcdef"),
            "{good}: {e}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// proc/new, every tool

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execute_code_in_bash_sh_and_python3() {
    if !features_ok("execute_code_in_bash_sh_and_python3") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let ws = std::fs::canonicalize(t.ws()).unwrap();
    let cases = [
        case(
            "bash",
            code(
                "bash",
                "echo \"hi from $BASH_VERSINFO\"; echo err >&2; exit 0",
            ),
            // stderr is in the result.
            ran(&[Check::Exit(0), has("hi from "), has("err\n")]),
        ),
        case(
            "sh",
            code("sh", "printf 'sh says %s\\n' ok; echo oops >&2; exit 3"),
            ran(&[Check::Exit(3), has("sh says ok\n"), has("oops\n")]),
        ),
        case(
            "python3",
            code(
                "python3",
                "import sys\nprint(sum(range(10)))\nprint('to stderr', file=sys.stderr)\nsys.exit(5)",
            ),
            ran(&[Check::Exit(5), has("45\n"), has("to stderr\n")]),
        ),
        // The runner's working directory is the workspace.
        case(
            "python3 cwd",
            code("python3", "import os; print(os.getcwd())"),
            ran(&[
                Check::BodyTrim(ws.to_str().unwrap().to_owned()),
                Check::Exit(0),
                Check::Pid,
            ]),
        ),
        // An unknown language is refused before anything runs.
        case(
            "cobol",
            code("cobol", "DISPLAY 'x'"),
            refused(&["not available"]),
        ),
    ];
    run_cases(&a, &cases).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_leave_no_set_id_file_and_cannot_see_hidden_paths() {
    if !features_ok("tools_leave_no_set_id_file_and_cannot_see_hidden_paths") {
        return;
    }
    // Through toolsrv (its prepared sandbox, the path every ordinary call and every hook
    // takes): no set-id file can be made, and the boot message's hidden paths (olliesrv's
    // state and configuration) cannot even be stat'ed.
    let dirs = Dirs::new();
    let state = dirs.dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::write(state.join("tcp.key"), "key").unwrap();
    let mut boot = dirs.boot();
    boot.hidden = vec![state.clone()];
    let t = Ts::start_with(dirs, &boot).await;
    let a = t.attach("a").await;
    let key = state.join("tcp.key");
    let r = run(
        &a,
        &code(
            "bash",
            &format!(
                "cp /bin/true x; chmod 4755 x 2>/dev/null; echo \"suid $?\"; chmod 2755 x 2>/dev/null; echo \"sgid $?\"; \
                 mkdir d; chmod 2777 d 2>/dev/null; echo \"dir $?\"; \
                 python3 -c \"import os; os.open('y', os.O_CREAT | os.O_WRONLY, 0o4755)\" 2>/dev/null; echo \"open $?\"; \
                 stat {k} >/dev/null 2>&1; echo \"stat $?\"; ls {s} >/dev/null 2>&1; echo \"ls $?\"",
                k = key.display(),
                s = state.display()
            ),
        ),
    )
    .await
    .expect("bash");
    for l in ["suid", "sgid", "dir", "open", "stat", "ls"] {
        assert!(
            r.body
                .lines()
                .any(|x| x.starts_with(l) && !x.ends_with(" 0")),
            "{l} succeeded: {r:?}"
        );
    }
    for e in std::fs::read_dir(t.ws()).unwrap().flatten() {
        let mode = e.metadata().unwrap().permissions().mode();
        assert_eq!(mode & 0o6000, 0, "{} is set-id", e.path().display());
    }
    assert!(!t.ws().join("y").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_repositories_are_protected_and_new_ones_shown_in_the_result() {
    if !features_ok("nested_repositories_are_protected_and_new_ones_shown_in_the_result") {
        return;
    }
    // Through toolsrv (a prepared call): a repository that exists in a skipped tree is
    // read-only for the call, and what the call planted is listed in the tool result the
    // model (and `o attach`/`o logs`) sees, escaped.
    let t = Ts::start().await;
    let x = t.ws().join("dist/x");
    std::fs::create_dir_all(&x).unwrap();
    assert!(
        std::process::Command::new("git")
            .args(["init", "-q"])
            .current_dir(&x)
            .status()
            .unwrap()
            .success()
    );
    let clean = std::fs::read(x.join(".git/config")).unwrap();
    let a = t.attach("a").await;
    let r = run(
        &a,
        &code(
            "bash",
            "echo '[core] fsmonitor = touch MARK' >> dist/x/.git/config; echo \"fsm $?\"; \
             mkdir -p node_modules/pkg && git -C node_modules/pkg init -q; \
             mkfifo pipe; touch \"$(printf 'esc\\033[2Jname')\"; echo done",
        ),
    )
    .await
    .expect("bash");
    assert!(
        r.body
            .lines()
            .any(|l| l.starts_with("fsm ") && !l.ends_with(" 0")),
        "{r:?}"
    );
    assert_eq!(std::fs::read(x.join(".git/config")).unwrap(), clean);
    for want in [
        "[post-run: new git repository node_modules/pkg/.git: created during the run",
        "[post-run: special file pipe: FIFO",
        "[post-run: name with control characters esc\\u{1B}[2Jname:",
    ] {
        assert!(r.body.contains(want), "no {want:?} in {r:?}");
    }
    assert!(!r.body.contains('\x1b'), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmd_shorthand_runs_bash() {
    if !features_ok("cmd_shorthand_runs_bash") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let cases = [
        case(
            "cmd=",
            "tool=execute_code\ncmd=echo one\\necho \"$0\" two; [[ 1 == 1 ]] && exit 4\n",
            ran(&[Check::Exit(4), body("one\nbash two\n")]),
        ),
        // cmd= is for execute_code only, and not together with args=.
        case(
            "cmd= for file_read",
            "tool=file_read\ncmd=x\n",
            refused(&["cmd="]),
        ),
        case(
            "cmd= and args=",
            "tool=execute_code\ncmd=true\nargs={\"language\":\"bash\",\"code\":\"true\"}\n",
            refused(&["not both"]),
        ),
    ];
    run_cases(&a, &cases).await;
}

/// A toolsrv whose tools directory holds one executable script `name` with `text`.
async fn with_tool_script(name: &str, text: &str) -> Ts {
    let dirs = Dirs::new();
    let tools = dirs.dir.path().join("tools");
    std::fs::create_dir(&tools).unwrap();
    let script = tools.join(name);
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&tools, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut boot = dirs.boot();
    boot.tools_dir = Some(tools);
    Ts::start_with(dirs, &boot).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execute_tool_runs_scripts_from_the_tools_dir() {
    if !features_ok("execute_tool_runs_scripts_from_the_tools_dir") {
        return;
    }
    let t = with_tool_script(
        "greet.sh",
        "#!/bin/sh\necho \"greet: $# args: $1|$2\"\necho \"to stderr\" >&2\nexit 6\n",
    )
    .await;
    let a = t.attach("a").await;

    let et = |args: serde_json::Value| tool("execute_tool", args);
    run_cases(
        &a,
        &[case(
            "greet.sh",
            et(serde_json::json!({"name": "greet.sh", "args": ["hello world", "$(x)"]})),
            ran(&[
                Check::Exit(6),
                has("greet: 2 args: hello world|$(x)\n"),
                has("to stderr\n"),
            ]),
        )],
    )
    .await;

    // The schema lists the script.
    let schema = rdwr(&a, "tools", "a json").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&schema).unwrap();
    let schema_of = v
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "execute_tool")
        .expect("execute_tool schema");
    assert_eq!(
        schema_of["parameters"]["properties"]["name"]["enum"],
        serde_json::json!(["greet.sh"])
    );

    let mut cases: Vec<Case> = [
        "../greet.sh",
        "sub/greet.sh",
        "..",
        "/bin/sh",
        ".hidden",
        "",
    ]
    .into_iter()
    .map(|bad| {
        case(
            format!("bad script name {bad:?}"),
            et(serde_json::json!({ "name": bad })),
            refused(&["not a tool name"]),
        )
    })
    .collect();
    cases.push(case(
        "missing script",
        et(serde_json::json!({"name": "nope.sh"})),
        refused(&["no tool named"]),
    ));
    cases.push(case(
        "args as a string",
        et(serde_json::json!({"name": "greet.sh", "args": "x"})),
        refused(&["array of strings"]),
    ));
    run_cases(&a, &cases).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execute_pipe_feeds_each_step_into_the_next() {
    if !features_ok("execute_pipe_feeds_each_step_into_the_next") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let cases = [
        case(
            "two steps",
            tool(
                "execute_pipe",
                serde_json::json!({"steps": [
                    {"language": "bash", "code": "printf 'a\\nb\\nc\\n'; printf 'd\\n'"},
                    {"language": "python3", "code": "import sys; print('lines=%d' % len(sys.stdin.readlines()))"},
                ]}),
            ),
            ran(&[Check::Exit(0), body("lines=4\n")]),
        ),
        // pipefail: a failing first step fails the pipe.
        case(
            "pipefail",
            tool(
                "execute_pipe",
                serde_json::json!({"steps": [
                    {"language": "sh", "code": "echo x; exit 9"},
                    {"language": "bash", "code": "cat"},
                ]}),
            ),
            ran(&[Check::Exit(9), body("x\n")]),
        ),
        case(
            "empty pipe",
            tool("execute_pipe", serde_json::json!({"steps": []})),
            refused(&["steps"]),
        ),
    ];
    run_cases(&a, &cases).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_read_numbers_lines_and_pages() {
    if !features_ok("file_read_numbers_lines_and_pages") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let lines: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    std::fs::write(t.ws().join("ten.txt"), &lines).unwrap();
    let abs = t.ws().join("ten.txt");
    let read = |args: serde_json::Value| tool("file_read", args);
    let mut cases = vec![
        case(
            "a page",
            read(serde_json::json!({"path": "ten.txt", "offset": 3, "limit": 2})),
            ran(&[
                Check::Exit(0),
                body(
                    "     3\tline 3\n     4\tline 4\n[more lines follow; continue with offset=5]\n",
                ),
            ]),
        ),
        // The last page: no notice.
        case(
            "the last page",
            read(serde_json::json!({"path": abs.to_str().unwrap(), "offset": 9, "limit": 5})),
            ran(&[body("     9\tline 9\n    10\tline 10\n")]),
        ),
        // Everything by default.
        case(
            "everything",
            read(serde_json::json!({"path": "ten.txt"})),
            ran(&[
                Check::Lines(10),
                Check::StartsWith("     1\tline 1\n".into()),
            ]),
        ),
        // Past the end, and a missing file.
        case(
            "past the end",
            read(serde_json::json!({"path": "ten.txt", "offset": 50})),
            ran(&[has("shorter")]),
        ),
        case(
            "a missing file",
            read(serde_json::json!({"path": "nope.txt"})),
            ran(&[Check::ExitNot(0), has("nope.txt")]),
        ),
    ];
    // Bad arguments are Twrite errors.
    for bad in [
        serde_json::json!({"path": "ten.txt", "offset": 0}),
        serde_json::json!({"path": "ten.txt", "limit": "2"}),
        serde_json::json!({"offset": 1}),
    ] {
        cases.push(case(
            format!("bad args {bad}"),
            read(bad),
            Want::RefusedPrefix("file_read: ".into()),
        ));
    }
    run_cases(&a, &cases).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_write_writes_replaces_and_inserts() {
    if !features_ok("file_write_writes_replaces_and_inserts") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let f = t.ws().join("sub/dir/new.txt");
    let write = |args: serde_json::Value| tool("file_write", args);
    let holds = |s: &str| Check::File(f.clone(), s.to_owned());
    let cases = [
        case(
            "write",
            write(serde_json::json!({"path": "sub/dir/new.txt", "content": "a\nb\nc\n"})),
            ran(&[
                Check::Exit(0),
                body("wrote 6 bytes to sub/dir/new.txt\n"),
                holds("a\nb\nc\n"),
            ]),
        ),
        case(
            "replace",
            write(
                serde_json::json!({"path": "sub/dir/new.txt", "content": "B1\nB2", "start_line": 2, "end_line": 2}),
            ),
            ran(&[
                Check::Exit(0),
                has("replaced lines 2-2"),
                holds("a\nB1\nB2\nc\n"),
            ]),
        ),
        case(
            "insert",
            write(
                serde_json::json!({"path": "sub/dir/new.txt", "content": "top\n", "start_line": 1, "end_line": 0}),
            ),
            ran(&[
                Check::Exit(0),
                has("inserted 1 lines before line 1"),
                holds("top\na\nB1\nB2\nc\n"),
            ]),
        ),
        // Append after the last line.
        case(
            "append",
            write(
                serde_json::json!({"path": "sub/dir/new.txt", "content": "end\n", "start_line": 6, "end_line": 5}),
            ),
            ran(&[Check::Exit(0), holds("top\na\nB1\nB2\nc\nend\n")]),
        ),
    ];
    run_cases(&a, &cases).await;
    // No temporary files left beside it.
    let names: Vec<String> = std::fs::read_dir(f.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["new.txt"]);

    let cases = [
        // A start past the end fails and leaves the file alone.
        case(
            "replace past the end",
            write(
                serde_json::json!({"path": "sub/dir/new.txt", "content": "x", "start_line": 40, "end_line": 40}),
            ),
            ran(&[
                Check::ExitNot(0),
                has("past the end"),
                holds("top\na\nB1\nB2\nc\nend\n"),
            ]),
        ),
        // Inconsistent ranges are Twrite errors.
        case(
            "start_line alone",
            write(serde_json::json!({"path": "x", "content": "x", "start_line": 3})),
            refused(&["both start_line and end_line"]),
        ),
    ];
    run_cases(&a, &cases).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_write_outside_the_workspace_is_denied() {
    if !features_ok("file_write_outside_the_workspace_is_denied") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let etc = PathBuf::from(format!(
        "/etc/ollie-test-{}-{}",
        std::process::id(),
        unique()
    ));
    let beside = t.dirs.dir.path().join("x");
    let home_file = t.dirs.home.join("y");
    let mut cases = Vec::new();
    for (path, shown) in [
        (etc.clone(), etc.to_str().unwrap().to_owned()),
        (beside.clone(), beside.to_str().unwrap().to_owned()),
        (beside.clone(), "../x".to_owned()),
        (home_file.clone(), home_file.to_str().unwrap().to_owned()),
    ] {
        // The tool runs and is denied: nothing escaped, no success reported.
        cases.push(case(
            format!("file_write {shown}"),
            tool(
                "file_write",
                serde_json::json!({"path": shown, "content": "pwned\n"}),
            ),
            ran(&[
                Check::Absent(path),
                Check::ExitNot(0),
                Check::NotStartsWith("wrote ".into()),
            ]),
        ));
    }
    // Same for execute_code.
    cases.push(case(
        "execute_code",
        code("sh", &format!("echo pwned > {}", beside.to_str().unwrap())),
        ran(&[Check::ExitNot(0), Check::Absent(beside.clone())]),
    ));
    run_cases(&a, &cases).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_read_of_shadow_is_denied() {
    if !features_ok("file_read_of_shadow_is_denied") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let secret = t.dirs.home.join(".ssh");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("id_ed25519"), "SECRET-KEY-CANARY\n").unwrap();
    let shadow_line = std::fs::read_to_string("/etc/shadow")
        .ok()
        .and_then(|s| s.lines().next().map(str::to_owned));
    let mut checks = vec![
        Check::ExitNot(0),
        Check::Lacks("SECRET-KEY-CANARY".into()),
        Check::Lacks("root:".into()),
        Check::HasAny(vec!["ermission denied".into(), "No such file".into()]),
    ];
    if let Some(l) = shadow_line {
        checks.push(Check::RawLacks(l));
    }
    // The tool runs and is denied.
    let cases: Vec<Case> = [
        "/etc/shadow".to_owned(),
        secret.join("id_ed25519").to_str().unwrap().to_owned(),
    ]
    .into_iter()
    .map(|path| {
        case(
            path.clone(),
            tool("file_read", serde_json::json!({ "path": path })),
            ran(&checks),
        )
    })
    .collect();
    run_cases(&a, &cases).await;
}

/// A toolsrv whose default policy is `workspace` with `output_bytes = 1000`.
async fn small_output_toolsrv() -> Ts {
    let dirs = Dirs::new();
    let mut boot = dirs.boot();
    let small = WORKSPACE_TOML.replace("output_bytes = 1048576", "output_bytes = 1000");
    assert_ne!(
        small, WORKSPACE_TOML,
        "workspace.toml no longer sets output_bytes"
    );
    boot.policies.insert("small".into(), small);
    boot.default_policy = "small".into();
    Ts::start_with(dirs, &boot).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_beyond_the_policy_limit_is_truncated_with_a_notice() {
    if !features_ok("output_beyond_the_policy_limit_is_truncated_with_a_notice") {
        return;
    }
    let t = small_output_toolsrv().await;
    let a = t.attach("a").await;
    let r = run(&a, &code("python3", "print('x' * 4999)"))
        .await
        .expect("big output");
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert!(
        r.header
            .get("truncated")
            .is_some_and(|v| v.starts_with("1000/")),
        "{r:?}"
    );
    let (kept, notice) = r
        .body
        .split_once("[output truncated: first 1000 of ")
        .unwrap_or_else(|| panic!("no truncation notice: {r:?}"));
    assert_eq!(kept.trim_end_matches('\n'), "x".repeat(1000));
    assert!(notice.ends_with(" bytes shown]\n"), "{notice:?}");
    // The whole size is reported (what the tool printed: 4999 x + newline).
    assert_eq!(r.header["truncated"], "1000/5000", "{r:?}");
    assert!(notice.starts_with("5000 bytes"), "{notice:?}");
    // Under the limit: no notice.
    let r = run(&a, &code("python3", "print('y' * 10)")).await.unwrap();
    assert!(!r.raw.contains("truncated"), "{r:?}");
}

/// A toolsrv whose default policy is `workspace` with `memory_bytes = bound`.
async fn small_memory_toolsrv(bound: u64) -> Ts {
    let dirs = Dirs::new();
    let mut boot = dirs.boot();
    let small = WORKSPACE_TOML.replace(
        "memory_bytes = 4294967296",
        &format!("memory_bytes = {bound}"),
    );
    assert_ne!(
        small, WORKSPACE_TOML,
        "workspace.toml no longer sets memory_bytes"
    );
    boot.policies.insert("small".into(), small);
    boot.default_policy = "small".into();
    Ts::start_with(dirs, &boot).await
}

/// Held by the tests that measure the host's shared memory (one figure for the machine: two
/// filling at once would each count the other's fill).
static SHMEM_QUIET: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_held_by_fds_stops_at_the_sessions_memory_cgroup() {
    // ESCAPES case 42 through toolsrv (a prepared sandbox): memfd_create + posix_fallocate
    // hold shared memory RLIMIT_AS does not count; the session's memory cgroup bounds it.
    use common::memory::{FILL_PY, MIB, SLACK, ShmemSampler, fill_call, parse_fill};
    let case = "memory_held_by_fds_stops_at_the_sessions_memory_cgroup";
    if !features_ok(case) {
        return;
    }
    let _quiet = SHMEM_QUIET.lock().await;
    let m = ollie_sandbox::probe().cgroups.memory;
    if !m.available() {
        let line = format!(
            "SKIP {case}: no memory cgroup: {}",
            m.reason.unwrap_or_default()
        );
        if ollie_testkit::require_all() {
            panic!("{line} (OLLIE_TEST_REQUIRE=all)");
        }
        skip(&line);
        return;
    }
    let bound = 256 * MIB;
    let t = small_memory_toolsrv(bound).await;
    let a = t.attach("a").await;
    let src = format!("{FILL_PY}\n{}\n", fill_call("memfd", 64 * MIB, 3 * bound));
    let sampler = ShmemSampler::start();
    let (line, v, rest) = run_with_record(&a, &format!("record=1\n{}", code("python3", &src)))
        .await
        .expect("the fill");
    let sampled = sampler.stop();
    let r = Run::parse(&rest);
    let fill = parse_fill(&r.body);
    let growth = sampled.max(fill.growth);
    assert!(!fill.all, "the fill completed: {fill:?} {rest}");
    let rec = &v["record"];
    let killed =
        rec["exit"]["signal"] == libc::SIGKILL && rec["exit"]["killed_by"] == "memory_limit";
    let failed = matches!(fill.stopped.as_deref(), Some("ENOMEM" | "EFBIG" | "ENOSPC"));
    assert!(
        killed || failed,
        "not stopped at the memory bound: {fill:?} {line}"
    );
    assert!(
        growth <= bound + SLACK,
        "host Shmem grew by {} MiB under a {} MiB bound ({fill:?})",
        growth >> 20,
        bound >> 20
    );
    // The record names the session's memory cgroup and its bound.
    let mem = &rec["layers"]["memory"];
    assert!(mem["cgroup"].is_string(), "{line}");
    assert_eq!(mem["max_bytes"], bound, "{line}");
    assert_eq!(mem["bound"], "cgroup", "{line}");
    assert_eq!(mem["scope"], "session", "{line}");
    assert_eq!(rec["limits"]["memory_bytes"], bound, "{line}");
    eprintln!(
        "{case}: memfd fill held {} MiB, host Shmem grew by at most {} MiB (bound {} MiB), exit {}",
        fill.held >> 20,
        growth >> 20,
        bound >> 20,
        rec["exit"]
    );
    // toolsrv is healthy: the next call runs, and the memory of the stopped one was given
    // back (half the bound fits again).
    let r = run(&a, &code("python3", "print('after')"))
        .await
        .expect("after");
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert_eq!(r.body, "after\n", "{r:?}");
    let src = format!("{FILL_PY}\n{}\n", fill_call("memfd", 32 * MIB, bound / 2));
    let r = run(&a, &code("python3", &src)).await.expect("half");
    assert!(parse_fill(&r.body).all, "{r:?}");
    assert_eq!(r.exit(), Some(0), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_memory_cgroup_toolsrv_calls_cannot_hold_memory_in_fds() {
    // The same attack where no memory cgroup can be made (an unprivileged user without
    // delegation): every call's filter denies memfd_create and the private /dev/shm is no
    // larger than memory_bytes, so 2 GiB asked for under a 256 MiB budget is not held.
    use common::memory::{FILL_PY, MIB, SLACK, ShmemSampler, fill_call, parse_fill};
    let case = "without_a_memory_cgroup_toolsrv_calls_cannot_hold_memory_in_fds";
    if !features_ok(case) {
        return;
    }
    let _quiet = SHMEM_QUIET.lock().await;
    if ollie_sandbox::probe().cgroups.memory.available() {
        // memory_held_by_fds_stops_at_the_sessions_memory_cgroup covers this user.
        skip(&format!("SKIP {case}: a memory cgroup is available here"));
        return;
    }
    let bound = 256 * MIB;
    let t = small_memory_toolsrv(bound).await;
    let a = t.attach("a").await;
    for kind in ["memfd", "shm"] {
        let src = format!("{FILL_PY}\n{}\n", fill_call(kind, 64 * MIB, 2048 * MIB));
        let sampler = ShmemSampler::start();
        let (line, v, rest) = run_with_record(&a, &format!("record=1\n{}", code("python3", &src)))
            .await
            .expect("the fill");
        let growth = sampler.stop();
        let r = Run::parse(&rest);
        let fill = parse_fill(&r.body);
        assert!(!fill.all, "{kind}: the fill completed: {fill:?} {rest}");
        let want = if kind == "memfd" { "EPERM" } else { "ENOSPC" };
        assert_eq!(
            fill.stopped.as_deref(),
            Some(want),
            "{kind}: {fill:?} {line}"
        );
        assert!(fill.held <= bound, "{kind}: {fill:?}");
        assert!(
            growth <= bound + SLACK,
            "{kind}: host Shmem grew by {} MiB under a {} MiB budget",
            growth >> 20,
            bound >> 20
        );
        let mem = &v["record"]["layers"]["memory"];
        assert_eq!(mem["bound"], "rlimit_as_only", "{line}");
        assert_eq!(mem["memfd"], "denied", "{line}");
        assert_eq!(mem["scope"], "session", "{line}");
        eprintln!(
            "{case}: {kind} fill held {} MiB ({want}), host Shmem grew by at most {} MiB (budget {} MiB)",
            fill.held >> 20,
            growth >> 20,
            bound >> 20
        );
    }
}

/// Pids whose parent is `ppid`.
fn children_of(ppid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // "pid (comm) state ppid …": comm may hold spaces, so split after the last ')'.
        let ppid_of = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid_of == Some(ppid) {
            out.push(pid);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_sandbox_whose_zygote_died_is_set_up_again() {
    // The session's memory cgroup's OOM killer may pick the zygote (the per-call inits share
    // its memory): the next call must get a new sandbox, not an error.
    if !features_ok("a_session_sandbox_whose_zygote_died_is_set_up_again") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let r = run(&a, &code("bash", "echo one")).await.expect("one");
    assert_eq!((r.exit(), r.body.as_str()), (Some(0), "one\n"), "{r:?}");
    // Between calls the zygote is toolsrv's only child.
    let zygotes = children_of(t.pid());
    assert!(!zygotes.is_empty(), "no zygote under toolsrv {}", t.pid());
    for z in &zygotes {
        let killed = Command::new("kill")
            .args(["-KILL", &z.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
    }
    // Dead (a zombie until toolsrv drops the sandbox) before the next call arrives, as after
    // an OOM kill, which ends the call that caused it first.
    let dead = |z: &i32| {
        std::fs::read_to_string(format!("/proc/{z}/stat"))
            .map(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    };
    assert!(
        poll(IO_TIMEOUT, || zygotes.iter().all(dead)).await,
        "zygote did not die"
    );
    let r = run(&a, &code("bash", "echo two")).await.expect("two");
    assert_eq!((r.exit(), r.body.as_str()), (Some(0), "two\n"), "{r:?}");
    let r = run(&a, &code("bash", "echo three")).await.expect("three");
    assert_eq!((r.exit(), r.body.as_str()), (Some(0), "three\n"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_is_refused_and_nothing_runs() {
    if !features_ok("escalation_is_refused_and_nothing_runs") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let op = t.attach("operator").await;
    let marker = t.ws().join("ran");
    let args = serde_json::json!({
        "language": "bash",
        "code": format!("touch {}", marker.to_str().unwrap()),
        "escalate": {"grants": ["unsandboxed"], "reason": "need the network"},
    });
    let e = run(&a, &tool("execute_code", args))
        .await
        .expect_err("escalation accepted");
    // The workspace policy does not let agents ask for unsandboxed runs.
    assert!(e.contains("escalation refused"), "{e}");
    assert!(e.contains("does not let it ask"), "{e}");
    assert!(e.contains("nothing was run"), "{e}");
    // In a person's words, not the type's name.
    assert!(e.contains("ask for running without the sandbox"), "{e}");
    assert!(!e.contains("Unsandboxed"), "{e}");
    let e = run_bg(
        &a,
        &tool(
            "file_write",
            serde_json::json!({"path": "ran", "content": "", "escalate": {"grants": ["write:/etc"], "reason": "r"}}),
        ),
    )
    .await
    .expect_err("escalation accepted (bg)");
    // The file tools take no escalation at all.
    assert!(e.contains("unknown argument \"escalate\""), "{e}");
    assert!(!marker.exists(), "the escalated call ran");
    assert!(list(&op).await.is_empty(), "a process was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_errors_are_one_line_twrite_errors() {
    if !features_ok("payload_errors_are_one_line_twrite_errors") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let op = t.attach("operator").await;
    let cases: Vec<Case> = [
        ("tool=no_such_tool\ncmd=true\n", "unknown tool"),
        (
            "tool=execute_code\nargs={\"language\":\"bash\",\"code\":\"true\",\"bogus\":1}\n",
            "unknown argument \"bogus\"",
        ),
        ("tool=execute_code\nargs={\"language\":", "not valid JSON"),
        ("tool=execute_code\nargs=[1]\n", "JSON object"),
        (
            "tool=execute_code\ncmd=true\nbogus=1\n",
            "unknown payload key \"bogus\"",
        ),
        ("tool=execute_code\ntool=file_read\n", "twice"),
        ("tool=execute_code\njust words\n", "key=value"),
        ("cmd=true\n", "no tool="),
        ("", "no tool="),
        (
            "tool=execute_code\nagent=../x\ncmd=true\n",
            "permission denied",
        ),
    ]
    .into_iter()
    .map(|(payload, want)| case(format!("{payload:?}"), payload, refused_both(&[want])))
    .collect();
    run_cases(&a, &cases).await;
    // Reading proc/new before any write is an error too.
    let f = open(&a, "proc/new", om::ORDWR).await.unwrap();
    let e = within("read", f.read(0, 100))
        .await
        .expect_err("read first");
    assert!(msg(&e).contains("write a payload first"), "{e}");
    // Nothing was started by any of it.
    assert!(list(&op).await.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Background processes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_process_wait_out_stat_complete_dismiss() {
    if !features_ok("background_process_wait_out_stat_complete_dismiss") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let b = t.attach("b").await;
    // b starts waiting for completions before a's process even exists.
    let bc = open(&b, "proc/complete", om::OREAD).await.unwrap();
    let b_first = bc.read_call(0, 8192).unwrap();

    let ac = open(&a, "proc/complete", om::OREAD).await.unwrap();
    let pid = run_bg(
        &a,
        "tool=execute_code\ncmd=echo out-line; echo err-line >&2; exit 3\n",
    )
    .await
    .expect("bg");
    let w = read(&a, &format!("proc/{pid}/wait")).await.expect("wait");
    assert_eq!(w, "3\n");
    // wait again on a fresh fid: the same answer at once.
    assert_eq!(read(&a, &format!("proc/{pid}/wait")).await.unwrap(), "3\n");
    let out = read(&a, &format!("proc/{pid}/out")).await.unwrap();
    assert!(
        out.contains("out-line\n") && out.contains("err-line\n"),
        "{out:?}"
    );
    let st = kv(&read(&a, &format!("proc/{pid}/stat")).await.unwrap());
    assert_eq!(st["state"], "exited", "{st:?}");
    assert_eq!(st["exit"], "3", "{st:?}");
    assert_eq!(st["pid"], pid.to_string());
    assert_eq!(st["agent"], "a");
    assert_eq!(st["tool"], "execute_code");
    assert_eq!(st["policy"], "workspace");
    assert_eq!(st["truncated"], "false");
    assert_eq!(list(&a).await[&pid].0, "exited");

    let m = within("complete", ac.read(0, 8192))
        .await
        .expect("complete");
    let m = String::from_utf8(m.to_vec()).unwrap();
    assert!(
        m.starts_with(&format!(
            "<system-proc-complete id=\"{pid}\" cmd=\"echo out-line; echo err-line &gt;&amp;2; exit 3\" exit=\"3\">\n"
        )),
        "{m}"
    );
    assert!(m.contains("out-line\n"), "{m}");
    assert!(m.ends_with("</system-proc-complete>\n"), "{m}");

    // b's first completion is b's own process, never a's (a's ended first).
    let bpid = run_bg(&b, "tool=execute_code\ncmd=exit 0\n").await.unwrap();
    let got = within("b complete", b_first).await.expect("b's completion");
    let got = match got {
        ollie_p9::wire::Rmsg::Read { data } => String::from_utf8(data.to_vec()).unwrap(),
        other => panic!("{other:?}"),
    };
    assert!(
        got.starts_with(&format!("<system-proc-complete id=\"{bpid}\" ")),
        "b got {got}"
    );
    assert!(!got.contains("out-line"), "b got a's completion: {got}");

    // dismiss removes it.
    write(&a, &format!("proc/{pid}/ctl"), "dismiss")
        .await
        .expect("dismiss");
    let e = within("walk", a.walk_path(&format!("proc/{pid}")))
        .await
        .expect_err("dismissed process still there");
    msg(&e);
    assert!(!list(&a).await.contains_key(&pid));
    let _ = within("clunk", ac.clunk()).await;
    let _ = within("clunk", bc.clunk()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dismissing_a_running_process_is_an_error() {
    if !features_ok("dismissing_a_running_process_is_an_error") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let marker = sleep_marker();
    let pid = run_bg(&a, &format!("tool=execute_code\ncmd=sleep {marker}\n"))
        .await
        .unwrap();
    let ctl = format!("proc/{pid}/ctl");
    let e = write(&a, &ctl, "dismiss")
        .await
        .expect_err("dismissed a running process");
    assert!(e.contains("still running"), "{e}");
    for bad in ["bogus", "signal x", "signal", "term now"] {
        let e = write(&a, &ctl, bad).await.expect_err("bad ctl accepted");
        assert!(!e.is_empty(), "{bad}");
    }
    // A signal outside the allowed set is refused and the process goes on.
    let e = write(&a, &ctl, "signal 11")
        .await
        .expect_err("SIGSEGV sent");
    assert!(e.starts_with("signal: "), "{e}");
    assert_eq!(list(&a).await[&pid].0, "running");
    write(&a, &ctl, "kill").await.unwrap();
    assert_eq!(
        read(&a, &format!("proc/{pid}/wait")).await.unwrap(),
        "137\n"
    );
    write(&a, &ctl, "dismiss")
        .await
        .expect("dismiss after the end");
    wait_marker_gone(&marker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_reaches_a_trapping_script() {
    if !features_ok("signal_reaches_a_trapping_script") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let pid = run_bg(
        &a,
        &code(
            "bash",
            "trap 'echo got-usr1; exit 42' USR1\necho ready\nwhile :; do sleep 0.05; done",
        ),
    )
    .await
    .unwrap();
    wait_out(&a, pid, "ready\n").await;
    write(&a, &format!("proc/{pid}/ctl"), "signal 10")
        .await
        .expect("signal 10");
    assert_eq!(read(&a, &format!("proc/{pid}/wait")).await.unwrap(), "42\n");
    let out = read(&a, &format!("proc/{pid}/out")).await.unwrap();
    assert!(out.contains("got-usr1"), "{out:?}");
    let st = kv(&read(&a, &format!("proc/{pid}/stat")).await.unwrap());
    assert_eq!(st["state"], "exited");
    assert!(
        !st.contains_key("stopped_by"),
        "a signal is not a cancel: {st:?}"
    );
    // After the end, signalling is an error.
    let e = write(&a, &format!("proc/{pid}/ctl"), "signal 10")
        .await
        .expect_err("signal after the end");
    assert!(e.contains("already ended"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_ends_a_sleep_with_137() {
    if !features_ok("kill_ends_a_sleep_with_137") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let marker = sleep_marker();
    let pid = run_bg(&a, &format!("tool=execute_code\ncmd=sleep {marker}\n"))
        .await
        .unwrap();
    wait_marker_up(&marker).await;
    // A blocked wait is answered when the kill lands.
    let wf = open(&a, &format!("proc/{pid}/wait"), om::OREAD)
        .await
        .unwrap();
    let pending = wf.read_call(0, 64).unwrap();
    write(&a, &format!("proc/{pid}/ctl"), "kill").await.unwrap();
    match within("wait", pending).await.expect("wait") {
        ollie_p9::wire::Rmsg::Read { data } => assert_eq!(&data[..], b"137\n"),
        other => panic!("{other:?}"),
    }
    let st = kv(&read(&a, &format!("proc/{pid}/stat")).await.unwrap());
    assert_eq!(st["state"], "killed", "{st:?}");
    assert_eq!(st["signal"], "9", "{st:?}");
    wait_marker_gone(&marker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term_ends_a_sleep_with_143_or_the_traps_code() {
    if !features_ok("term_ends_a_sleep_with_143_or_the_traps_code") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let marker = sleep_marker();
    let pid = run_bg(&a, &format!("tool=execute_code\ncmd=sleep {marker}\n"))
        .await
        .unwrap();
    wait_marker_up(&marker).await;
    write(&a, &format!("proc/{pid}/ctl"), "term").await.unwrap();
    assert_eq!(
        read(&a, &format!("proc/{pid}/wait")).await.unwrap(),
        "143\n"
    );
    let st = kv(&read(&a, &format!("proc/{pid}/stat")).await.unwrap());
    assert_eq!(st["state"], "killed", "{st:?}");
    assert_eq!(st["signal"], "15", "{st:?}");
    wait_marker_gone(&marker).await;

    let pid = run_bg(
        &a,
        &code(
            "bash",
            "trap 'echo got-term; exit 7' TERM\necho ready\nwhile :; do sleep 0.05; done",
        ),
    )
    .await
    .unwrap();
    wait_out(&a, pid, "ready\n").await;
    write(&a, &format!("proc/{pid}/ctl"), "term").await.unwrap();
    assert_eq!(read(&a, &format!("proc/{pid}/wait")).await.unwrap(), "7\n");
    assert!(
        read(&a, &format!("proc/{pid}/out"))
            .await
            .unwrap()
            .contains("got-term")
    );
}

// ---------------------------------------------------------------------------------------------
// Run records (proc/N/record, record=1)

/// `proc/{pid}/record` as its raw text (checked to be one line ending in "\n") and as JSON.
async fn record(root: &Fid, pid: u32) -> Result<(String, serde_json::Value), String> {
    let s = read(root, &format!("proc/{pid}/record")).await?;
    assert!(
        s.ends_with('\n'),
        "record of {pid} does not end in a newline: {s:?}"
    );
    assert_eq!(
        s.matches('\n').count(),
        1,
        "record of {pid} is not one line: {s:?}"
    );
    let v: serde_json::Value = serde_json::from_str(&s)
        .unwrap_or_else(|e| panic!("record of {pid} is not JSON ({e}): {s:?}"));
    assert!(v.is_object(), "record of {pid} is not an object: {s:?}");
    Ok((s, v))
}

/// The stat length of a file.
async fn stat_len(root: &Fid, path: &str) -> u64 {
    let f = within("walk", root.walk_path(path)).await.expect("walk");
    let st = within("stat", f.stat()).await.expect("stat");
    let _ = within("clunk", f.clunk()).await;
    st.length
}

/// A blocking `proc/new` with `record=1`: the first line as text and JSON, and the rest.
async fn run_with_record(
    root: &Fid,
    payload: &str,
) -> Result<(String, serde_json::Value, String), String> {
    let s = rdwr(root, "proc/new", payload).await?;
    let (first, rest) = s
        .split_once('\n')
        .unwrap_or_else(|| panic!("no record line in {s:?}"));
    let v: serde_json::Value = serde_json::from_str(first)
        .unwrap_or_else(|e| panic!("record line is not JSON ({e}): {first:?}"));
    Ok((format!("{first}\n"), v, rest.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_of_a_finished_run_shows_argv_exit_and_enforced_layers() {
    if !features_ok("record_of_a_finished_run_shows_argv_exit_and_enforced_layers") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let src = "echo rec; exit 4";
    let r = run(&a, &code("bash", src)).await.expect("execute_code");
    assert_eq!(r.exit(), Some(4), "{r:?}");
    let pid = r.pid();
    assert!(
        ls(&a, &format!("proc/{pid}")).await.contains("record"),
        "record is not listed in proc/{pid}"
    );
    let (raw, v) = record(&a, pid).await.expect("record");
    assert_eq!(v["argv"], serde_json::json!(["bash", "-c", src]), "{raw}");
    assert_eq!(v["exit"]["code"], 4, "{raw}");
    assert_eq!(v["exit"]["status"], 4, "{raw}");
    assert!(v["exit"]["signal"].is_null(), "{raw}");
    assert_eq!(v["exit"]["timed_out"], false, "{raw}");
    let ws = std::fs::canonicalize(t.ws()).unwrap();
    assert_eq!(v["cwd"], ws.to_str().unwrap(), "{raw}");
    assert!(
        v["program"].as_str().is_some_and(|p| p.ends_with("/bash")),
        "{raw}"
    );
    // What was enforced: Landlock at the kernel's ABI, fully; seccomp; no capabilities.
    let l = &v["layers"]["landlock"];
    assert!(l["abi"].as_u64().is_some_and(|abi| abi >= 7), "{raw}");
    assert_eq!(l["status"], "fully_enforced", "{raw}");
    assert!(
        l["handled_fs"].as_array().is_some_and(|h| !h.is_empty()),
        "{raw}"
    );
    assert!(l["path_rules"].as_u64().is_some_and(|n| n > 0), "{raw}");
    let sc = &v["layers"]["seccomp"];
    assert!(sc["filters"].as_u64().is_some_and(|n| n > 0), "{raw}");
    assert!(sc["instructions"].as_u64().is_some_and(|n| n > 0), "{raw}");
    assert_eq!(v["layers"]["no_new_privs"], true, "{raw}");
    let caps = &v["layers"]["capabilities"];
    for set in ["effective", "permitted", "inheritable", "ambient"] {
        assert_eq!(caps[set], 0, "{set}: {raw}");
    }
    assert_eq!(v["layers"]["best_effort_degraded"], false, "{raw}");
    assert!(
        v["layers"]["namespaces"]
            .as_array()
            .is_some_and(|n| !n.is_empty()),
        "{raw}"
    );
    assert_eq!(v["stdout"]["total_bytes"], 4, "{raw}");
    // The stat length is the true length.
    assert_eq!(
        stat_len(&a, &format!("proc/{pid}/record")).await,
        raw.len() as u64
    );
    // A second read (fresh fid) gives the same bytes.
    assert_eq!(record(&a, pid).await.unwrap().0, raw);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_of_a_running_process_is_an_error_until_it_ends() {
    if !features_ok("record_of_a_running_process_is_an_error_until_it_ends") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let marker = sleep_marker();
    let pid = run_bg(&a, &format!("tool=execute_code\ncmd=sleep {marker}\n"))
        .await
        .expect("bg sleep");
    wait_marker_up(&marker).await;
    let path = format!("proc/{pid}/record");
    let e = read(&a, &path)
        .await
        .expect_err("record of a running process");
    assert_eq!(
        e,
        format!("process {pid} is still running (read wait first)"),
        "{e}"
    );
    assert_eq!(stat_len(&a, &path).await, 0);
    // A fid opened while it runs fails too, and reads the record once it has ended.
    let early = open(&a, &path, om::OREAD).await.expect("open record");
    let e = within("read", early.read(0, 8192))
        .await
        .expect_err("read of a running process's record");
    assert!(msg(&e).contains("still running"), "{e}");
    assert_eq!(list(&a).await[&pid].0, "running");

    write(&a, &format!("proc/{pid}/ctl"), "kill").await.unwrap();
    assert_eq!(
        read(&a, &format!("proc/{pid}/wait")).await.unwrap(),
        "137\n"
    );
    let (raw, v) = record(&a, pid).await.expect("record after the kill");
    assert_eq!(v["exit"]["signal"], 9, "{raw}");
    assert_eq!(v["exit"]["status"], 137, "{raw}");
    assert!(v["exit"]["code"].is_null(), "{raw}");
    assert_eq!(v["exit"]["cancelled"], true, "{raw}");
    assert_eq!(v["argv"][2], format!("sleep {marker}"), "{raw}");
    let d = within("read", early.read_to_end())
        .await
        .expect("early fid");
    assert_eq!(String::from_utf8(d).unwrap(), raw);
    assert_eq!(stat_len(&a, &path).await, raw.len() as u64);
    wait_marker_gone(&marker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_1_puts_the_run_record_first_in_the_proc_new_reply() {
    if !features_ok("record_1_puts_the_run_record_first_in_the_proc_new_reply") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let payload = "tool=execute_code\ncmd=echo hi; exit 2\n";
    let (line, v, rest) = run_with_record(&a, &format!("record=1\n{payload}"))
        .await
        .expect("record=1");
    let pid = u32::try_from(v["pid"].as_u64().expect("pid")).unwrap();
    assert_eq!(v.as_object().unwrap().len(), 2, "{line}");
    assert_eq!(v["record"]["exit"]["code"], 2, "{line}");
    assert_eq!(v["record"]["argv"][0], "bash", "{line}");
    // The rest is the result exactly as without the key.
    let r = Run::parse(&rest);
    assert_eq!(r.pid(), pid, "{rest:?}");
    assert_eq!(r.exit(), Some(2), "{rest:?}");
    assert_eq!(r.body, "hi\n", "{rest:?}");
    // The line carries exactly the object proc/{pid}/record holds.
    let (file, fv) = record(&a, pid).await.expect("record file");
    assert_eq!(
        line,
        format!("{{\"pid\":{pid},\"record\":{}}}\n", file.trim_end())
    );
    assert_eq!(fv, v["record"]);

    // Without the key (and with record=0) the reply has no record line.
    for p in [payload.to_owned(), format!("{payload}record=0\n")] {
        let plain = run(&a, &p).await.expect("plain");
        assert_eq!(
            plain.header.keys().collect::<Vec<_>>(),
            r.header.keys().collect::<Vec<_>>(),
            "{plain:?}"
        );
        assert_eq!(plain.body, r.body, "{plain:?}");
        assert!(!plain.raw.contains("\"record\""), "{plain:?}");
        assert_eq!(plain.raw.lines().count(), 2, "{plain:?}");
    }
    // The same fid can run again with and without the key.
    let f = open(&a, "proc/new", om::ORDWR).await.unwrap();
    for (p, with) in [
        ("tool=execute_code\nrecord=1\ncmd=echo one\n", true),
        ("tool=execute_code\ncmd=echo two\n", false),
    ] {
        within("write", f.write(0, Bytes::from(p)))
            .await
            .expect("write");
        let d = String::from_utf8(
            within("read", f.read_to_end())
                .await
                .expect("read")
                .to_vec(),
        )
        .unwrap();
        assert_eq!(d.starts_with("{\"pid\":"), with, "{d:?}");
        assert_eq!(d.lines().count(), if with { 3 } else { 2 }, "{d:?}");
    }
    let _ = within("clunk", f.clunk()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_of_a_tool_the_sandbox_refused_is_its_error() {
    if !features_ok("record_of_a_tool_the_sandbox_refused_is_its_error") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let op = t.attach("operator").await;
    // A working directory that does not exist: the sandbox cannot start the tool there.
    let payload = "tool=execute_code\ncwd=no-such-dir\ncmd=echo ran\n";
    let e = run(&a, payload).await.expect_err("ran in a missing cwd");
    assert!(e.starts_with("tool did not run: "), "{e}");
    assert!(e.contains("working directory"), "{e}");

    let reply = rdwr(&a, "proc/new", &format!("{payload}record=1\n"))
        .await
        .expect("record=1 of a refused tool");
    assert!(reply.ends_with('\n'), "{reply:?}");
    assert_eq!(reply.matches('\n').count(), 1, "not one line: {reply:?}");
    let v: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let pid = u32::try_from(v["pid"].as_u64().expect("pid")).unwrap();
    assert!(v["record"].is_null(), "{reply}");
    let err = v["error"].as_str().expect("error").to_owned();
    assert!(err.contains("working directory"), "{reply}");
    assert!(
        reply.starts_with(&format!("{{\"pid\":{pid},\"record\":null,\"error\":")),
        "{reply}"
    );
    let (file, fv) = record(&a, pid).await.expect("record of the refused tool");
    assert_eq!(fv, serde_json::json!({ "error": err }), "{file}");
    assert_eq!(
        stat_len(&a, &format!("proc/{pid}/record")).await,
        file.len() as u64
    );
    let st = kv(&read(&a, &format!("proc/{pid}/stat")).await.unwrap());
    assert_eq!(st["state"], "failed", "{st:?}");
    // The operator reads the same.
    assert_eq!(record(&op, pid).await.unwrap().0, file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_agent_cannot_see_or_read_a_record() {
    if !features_ok("another_agent_cannot_see_or_read_a_record") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let b = t.attach("b").await;
    let op = t.attach("operator").await;
    let r = run(&a, "tool=execute_code\ncmd=echo mine\n").await.unwrap();
    let pid = r.pid();
    let path = format!("proc/{pid}/record");
    let (raw, _) = record(&a, pid).await.expect("a reads its record");
    // b: no walk to it (the pid does not exist for b), so no open and no read.
    let e = within("walk", b.walk_path(&path))
        .await
        .expect_err("b walked to a's record");
    let m = msg(&e);
    assert!(m.starts_with("file does not exist"), "{m}");
    let e = read(&b, &path).await.expect_err("b read a's record");
    assert!(e.starts_with("file does not exist"), "{e}");
    assert!(!ls(&b, "proc").await.contains(&pid.to_string()));
    // b's own process gets another pid; its record is b's, not a's.
    let rb = run(&b, "tool=execute_code\ncmd=echo theirs\n")
        .await
        .unwrap();
    assert_ne!(rb.pid(), pid);
    assert!(
        read(&a, &format!("proc/{}/record", rb.pid()))
            .await
            .is_err()
    );
    // The operator sees it, byte for byte.
    assert_eq!(record(&op, pid).await.unwrap().0, raw);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_key_is_strict_and_for_proc_new_only() {
    if !features_ok("record_key_is_strict_and_for_proc_new_only") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let op = t.attach("operator").await;
    let marker = t.ws().join("ran");
    let cmd = format!("cmd=touch {}\n", marker.to_str().unwrap());
    for (payload, want) in [
        (
            format!("tool=execute_code\nrecord=2\n{cmd}"),
            "record= must be 0 or 1, not \"2\"",
        ),
        (
            format!("tool=execute_code\nrecord=yes\n{cmd}"),
            "record= must be 0 or 1",
        ),
        (
            format!("tool=execute_code\nrecord=\n{cmd}"),
            "record= must be 0 or 1",
        ),
        (
            format!("tool=execute_code\nrecord=1\nrecord=1\n{cmd}"),
            "payload key \"record\" given twice",
        ),
    ] {
        let e = run(&a, &payload).await.expect_err("bad record= accepted");
        assert!(e.contains(want), "{payload:?}: {e}");
        let e = run_bg(&a, &payload)
            .await
            .expect_err("bad record= accepted (bg)");
        assert!(e.contains(want), "{payload:?}: {e}");
    }
    // proc/new.bg refuses the key: its record is in proc/N/record.
    for v in ["1", "0"] {
        let e = run_bg(&a, &format!("tool=execute_code\nrecord={v}\n{cmd}"))
            .await
            .expect_err("record= on proc/new.bg");
        assert!(e.contains("record= is for proc/new only"), "{e}");
        assert!(e.contains("proc/N/record"), "{e}");
    }
    // None of it started anything.
    assert!(!marker.exists(), "a refused payload ran");
    assert!(list(&op).await.is_empty(), "a process was created");
}

// ---------------------------------------------------------------------------------------------
// Flush

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushing_a_blocking_proc_new_read_stops_the_process() {
    if !features_ok("flushing_a_blocking_proc_new_read_stops_the_process") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let op = t.attach("operator").await;
    let marker = sleep_marker();
    let f = open(&a, "proc/new", om::ORDWR).await.unwrap();
    within(
        "write",
        f.write(
            0,
            Bytes::from(format!("tool=execute_code\ncmd=sleep {marker}\n")),
        ),
    )
    .await
    .expect("payload");
    let call = f.read_call(0, 8192).unwrap();
    wait_marker_up(&marker).await;
    let l = list(&op).await;
    assert_eq!(l.len(), 1, "{l:?}");
    let (&pid, (state, _)) = l.iter().next().unwrap();
    assert_eq!(state, "running");
    // The client gives up: dropping the call sends Tflush.
    drop(call);
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let st = list(&op).await[&pid].0.clone();
        if st != "running" {
            assert_eq!(st, "killed", "state after the flush");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "process still running after the flush"
        );
        tokio::time::sleep(STEP).await;
    }
    wait_marker_gone(&marker).await;
    let st = kv(&read(&op, &format!("proc/{pid}/stat")).await.unwrap());
    assert_eq!(st["stopped_by"], "cancel", "{st:?}");
    // The connection and the fid still work.
    let r = run(&a, "tool=execute_code\ncmd=echo after\n")
        .await
        .unwrap();
    assert_eq!(r.body, "after\n");
}

// ---------------------------------------------------------------------------------------------
// ctl

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_load_and_unload_change_an_agents_tools() {
    if !features_ok("ctl_load_and_unload_change_an_agents_tools") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let op = t.attach("operator").await;
    let all = [
        "execute_code",
        "execute_tool",
        "execute_pipe",
        "file_read",
        "file_write",
    ];
    let names = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| l.split_whitespace().next().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&read(&a, "tools").await.unwrap()), all);
    std::fs::write(t.ws().join("f.txt"), "hello\n").unwrap();

    write(&a, "ctl", "unload a file_read\n")
        .await
        .expect("unload");
    let now = names(&read(&a, "tools").await.unwrap());
    assert!(!now.contains(&"file_read".to_owned()), "{now:?}");
    assert_eq!(now.len(), 4);
    // The operator sees the change too, in text and JSON.
    assert_eq!(names(&rdwr(&op, "tools", "a").await.unwrap()), now);
    let js: serde_json::Value =
        serde_json::from_str(&rdwr(&op, "tools", "a json").await.unwrap()).unwrap();
    assert_eq!(js.as_array().unwrap().len(), 4);
    // Another agent is unaffected.
    assert_eq!(names(&rdwr(&op, "tools", "b").await.unwrap()), all);
    let e = run(&a, &tool("file_read", serde_json::json!({"path": "f.txt"})))
        .await
        .expect_err("unloaded tool ran");
    assert!(e.contains("not loaded"), "{e}");

    // The operator loads it back for a; a unloads two at once.
    write(&op, "ctl", "load a file_read").await.expect("load");
    let r = run(&a, &tool("file_read", serde_json::json!({"path": "f.txt"})))
        .await
        .expect("loaded again");
    assert_eq!(r.body, "     1\thello\n");
    write(&a, "ctl", "unload a execute_code\nunload a execute_pipe\n")
        .await
        .unwrap();
    let e = run(&a, "tool=execute_code\ncmd=true\n")
        .await
        .expect_err("unloaded execute_code ran");
    assert!(e.contains("not loaded"), "{e}");
    assert_eq!(
        names(&read(&a, "tools").await.unwrap()),
        ["execute_tool", "file_read", "file_write"]
    );
    // Bad commands.
    for (cmd, want) in [
        ("load a no_such_tool", "unknown tool"),
        ("frob a execute_code", "unknown command"),
        ("load a", "wrong arguments"),
        ("load operator execute_code", "reserved"),
    ] {
        let e = write(&a, "ctl", cmd).await.expect_err("bad ctl accepted");
        assert!(e.contains(want), "{cmd}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_policy_is_the_operators_and_readonly_denies_writes() {
    if !features_ok("ctl_policy_is_the_operators_and_readonly_denies_writes") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let b = t.attach("b").await;
    let op = t.attach("operator").await;
    let write_args = |name: &str| {
        tool(
            "file_write",
            serde_json::json!({"path": name, "content": "data\n"}),
        )
    };
    // Under the default policy the write works.
    let r = run(&a, &write_args("one.txt")).await.unwrap();
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert!(t.ws().join("one.txt").exists());

    // Agents cannot change policies, not even their own.
    for who in [&a, &b] {
        let e = write(who, "ctl", "policy a readonly")
            .await
            .expect_err("agent set a policy");
        assert!(e.contains("permission denied"), "{e}");
    }
    let e = write(&a, "ctl", "policy a workspace")
        .await
        .expect_err("agent set a policy");
    assert!(e.contains("only the operator"), "{e}");
    let e = write(&op, "ctl", "policy a nonesuch")
        .await
        .expect_err("unknown policy");
    assert!(e.contains("unknown policy"), "{e}");

    write(&op, "ctl", "policy a readonly")
        .await
        .expect("operator sets the policy");
    let r = run(&a, &write_args("two.txt")).await.unwrap();
    assert_ne!(r.exit(), Some(0), "{r:?}");
    assert!(
        !t.ws().join("two.txt").exists(),
        "readonly agent wrote into the workspace"
    );
    let r = run(&a, &code("sh", "echo x > three.txt")).await.unwrap();
    assert_ne!(r.exit(), Some(0), "{r:?}");
    assert!(!t.ws().join("three.txt").exists());
    // Reading still works.
    let r = run(
        &a,
        &tool("file_read", serde_json::json!({"path": "one.txt"})),
    )
    .await
    .unwrap();
    assert_eq!(r.body, "     1\tdata\n");
    // A bg process records the policy.
    let pid = run_bg(&a, "tool=execute_code\ncmd=true\n").await.unwrap();
    read(&a, &format!("proc/{pid}/wait")).await.unwrap();
    let st = kv(&read(&a, &format!("proc/{pid}/stat")).await.unwrap());
    assert_eq!(st["policy"], "readonly");
    // b is unaffected.
    let r = run(&b, &write_args("four.txt")).await.unwrap();
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert!(t.ws().join("four.txt").exists());
    // And back.
    write(&op, "ctl", "policy a workspace").await.unwrap();
    let r = run(&a, &write_args("five.txt")).await.unwrap();
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert!(t.ws().join("five.txt").exists());
}

// ---------------------------------------------------------------------------------------------
// Unions (`ctl unions AGENT JSON|none`)

/// Where every union here is mounted; it must not exist in the host's `/`.
const POINT: &str = "/ctx";

/// One agent's layers in the session's tempdir, beside (not in) the workspace: a lower layer
/// (a bead member) holding `x`, the shadow layer (overlay upper) and overlay's work directory.
struct Layers {
    lower: PathBuf,
    upper: PathBuf,
    work: PathBuf,
}

impl Layers {
    fn new(t: &Ts, name: &str, x: &str) -> Layers {
        let base = std::fs::canonicalize(t.dirs.dir.path()).unwrap().join(name);
        let l = Layers {
            lower: base.join("lower"),
            upper: base.join("upper"),
            work: base.join("work"),
        };
        for d in [&l.lower, &l.upper, &l.work] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(l.lower.join("x"), x).unwrap();
        l
    }

    /// The `unions` JSON of one union of these layers at [`POINT`].
    fn json(&self) -> String {
        serde_json::json!([{
            "point": POINT,
            "lowers": [self.lower],
            "upper": self.upper,
            "work": self.work,
        }])
        .to_string()
    }
}

/// `(name, contents)` pairs as [`tree`] gives them.
fn files(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, c)| ((*n).to_owned(), (*c).to_owned()))
        .collect()
}

/// The union point exists only inside sandboxes that mount it, never on the host.
fn assert_no_host_point() {
    assert!(
        std::fs::symlink_metadata(POINT).is_err(),
        "{POINT} exists on the host"
    );
}

/// The operator sets `agent`'s unions (a JSON array or `none`).
async fn set_unions(op: &Fid, agent: &str, json: &str) {
    write(op, "ctl", &format!("unions {agent} {json}"))
        .await
        .unwrap_or_else(|e| panic!("unions {agent}: {e}"));
}

/// A bash run through `proc/new` that must exit 0; its output.
async fn bash_ok(root: &Fid, script: &str) -> Run {
    let r = run(root, &code("bash", script)).await.expect("proc/new");
    assert_eq!(r.exit(), Some(0), "{script}: {r:?}");
    r
}

/// A bash run through `proc/new` in which `/ctx` does not exist: `ls` fails with ENOENT and a
/// write there fails too (the sandbox's `/` is read-only).
async fn assert_no_point_for(root: &Fid, who: &str) -> Run {
    let r = run(root, &code("bash", "ls /ctx; echo no > /ctx/no"))
        .await
        .expect("proc/new");
    assert_ne!(r.exit(), Some(0), "{who}: {r:?}");
    assert!(
        r.body
            .contains("cannot access '/ctx': No such file or directory"),
        "{who} sees /ctx: {r:?}"
    );
    assert_no_host_point();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_runs_see_its_unions_and_write_only_its_shadow_layer() {
    if !features_ok("an_agents_runs_see_its_unions_and_write_only_its_shadow_layer") {
        return;
    }
    assert_no_host_point();
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let b = t.attach("b").await;
    let op = t.attach("operator").await;
    let l = Layers::new(&t, "layers-a", "from the bead\n");
    let lower = tree(&l.lower);
    set_unions(&op, "a", &l.json()).await;

    // a sees the bead's file at /ctx; its write lands in the shadow layer only.
    let r = bash_ok(&a, "cat /ctx/x; echo new > /ctx/new; ls /ctx").await;
    assert_eq!(r.body, "from the bead\nnew\nx\n", "{r:?}");
    let (raw, v) = record(&a, r.pid()).await.expect("record");
    let u = &v["layers"]["mounts"]["unions"];
    assert_eq!(u.as_array().map(Vec::len), Some(1), "{raw}");
    assert_eq!(u[0]["point"], POINT, "{raw}");
    assert_eq!(u[0]["lowers"], serde_json::json!([l.lower]), "{raw}");
    assert_eq!(u[0]["upper"], l.upper.to_str().unwrap(), "{raw}");
    assert_eq!(tree(&l.upper), files(&[("new", "new\n")]));
    assert_eq!(tree(&l.lower), lower);
    assert!(!t.ws().join("new").exists());
    assert_no_host_point();

    // a's next run reuses the layers: the shadow layer's file is there.
    let r = bash_ok(&a, "cat /ctx/new; ls /ctx").await;
    assert_eq!(r.body, "new\nnew\nx\n", "{r:?}");

    // b, in the same session without unions, has no /ctx at all.
    let r = assert_no_point_for(&b, "b").await;
    let (raw, v) = record(&b, r.pid()).await.expect("record");
    assert_eq!(
        v["layers"]["mounts"]["unions"],
        serde_json::json!([]),
        "{raw}"
    );

    // Cleared: a's next run has no /ctx either, and nothing more reaches the layers.
    set_unions(&op, "a", "none").await;
    assert_no_point_for(&a, "a after none").await;
    assert_eq!(tree(&l.upper), files(&[("new", "new\n")]));
    assert_eq!(tree(&l.lower), lower);
    assert!(!t.ws().join("no").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_with_unions_at_one_point_keep_them_apart() {
    if !features_ok("two_agents_with_unions_at_one_point_keep_them_apart") {
        return;
    }
    assert_no_host_point();
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let b = t.attach("b").await;
    let op = t.attach("operator").await;
    let la = Layers::new(&t, "layers-a", "a\n");
    let lb = Layers::new(&t, "layers-b", "b\n");
    let lowers = (tree(&la.lower), tree(&lb.lower));
    set_unions(&op, "a", &la.json()).await;
    set_unions(&op, "b", &lb.json()).await;

    // One after the other: each sees its own x; b cannot see a's shadow layer's file, nor
    // reach a's layers by their host paths.
    let r = bash_ok(&a, "cat /ctx/x && echo 1 > /ctx/f").await;
    assert_eq!(r.body, "a\n", "{r:?}");
    let script = format!(
        r#"
try() {{ if ( eval "$1" ) >/dev/null 2>&1; then echo "ok $1"; else echo "denied $1"; fi; }}
cat /ctx/x
ls /ctx
try 'cat /ctx/f'
try 'cat {ua}/f'
try 'echo no > {ua}/g'
try 'echo no > {ua}/f'
try 'echo no > {la}/x'
try 'echo no > {la}/g'
try 'ls {la}'
try 'echo 2 > /ctx/g'
"#,
        ua = la.upper.display(),
        la = la.lower.display(),
    );
    let r = bash_ok(&b, &script).await;
    let verdicts: Vec<&str> = r
        .body
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        verdicts,
        [
            "b", "x", "denied", "denied", "denied", "denied", "denied", "denied", "denied", "ok"
        ],
        "{}",
        r.body
    );
    // On the host: a's shadow layer holds only a's write, b's only b's; the members as they
    // were.
    assert_eq!(tree(&la.upper), files(&[("f", "1\n")]));
    assert_eq!(tree(&lb.upper), files(&[("g", "2\n")]));
    assert!(!la.upper.join("g").exists());
    assert!(!la.lower.join("g").exists());
    assert_eq!((tree(&la.lower), tree(&lb.lower)), lowers);
    // a does not see b's write either.
    let r = bash_ok(&a, "ls /ctx; cat /ctx/x").await;
    assert_eq!(r.body, "f\nx\na\n", "{r:?}");

    // At the same time: a's run mounts its union and waits for b's, which mounts its own while
    // a's is still there. Each wait gives up after about 30 s (a failure, not a hang).
    let ws = std::fs::canonicalize(t.ws()).unwrap();
    let (first, second) = ollie_testkit::fstree::meeting_scripts(
        &ws,
        "cat /ctx/x && echo c1 > /ctx/c",
        "cat /ctx/x && echo c2 > /ctx/c",
    );
    let pid = run_bg(&a, &code("bash", &first))
        .await
        .expect("a starts in the background");
    let r = bash_ok(&b, &second).await;
    assert_eq!(r.body, "b\n", "{r:?}");
    assert_eq!(read(&a, &format!("proc/{pid}/wait")).await.unwrap(), "0\n");
    assert_eq!(read(&a, &format!("proc/{pid}/out")).await.unwrap(), "a\n");
    assert_eq!(tree(&la.upper), files(&[("c", "c1\n"), ("f", "1\n")]));
    assert_eq!(tree(&lb.upper), files(&[("c", "c2\n"), ("g", "2\n")]));
    assert_eq!((tree(&la.lower), tree(&lb.lower)), lowers);
    assert_no_host_point();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_unions_refuses_bad_input_in_one_line_and_changes_nothing() {
    if !features_ok("ctl_unions_refuses_bad_input_in_one_line_and_changes_nothing") {
        return;
    }
    assert_no_host_point();
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let b = t.attach("b").await;
    let op = t.attach("operator").await;
    let l = Layers::new(&t, "layers-a", "from the bead\n");
    let other = Layers::new(&t, "layers-other", "other\n");
    let lowers = (tree(&l.lower), tree(&other.lower));
    set_unions(&op, "a", &l.json()).await;

    let spec = |extra: serde_json::Value| {
        let mut s = serde_json::json!({
            "point": POINT,
            "lowers": [other.lower],
            "upper": other.upper,
            "work": other.work,
        });
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                s.as_object_mut().unwrap().remove(k);
            } else {
                s[k] = v.clone();
            }
        }
        s
    };
    let one = |extra: serde_json::Value| serde_json::json!([spec(extra)]).to_string();
    let many = serde_json::Value::Array((0..17).map(|_| spec(serde_json::json!({}))).collect())
        .to_string();
    let lower_count = serde_json::json!({"lowers": vec![other.lower.clone(); 257]});
    let other_json = other.json();
    let point = |p: &str| format!("a {}", one(serde_json::json!({ "point": p })));
    let s = spec(serde_json::json!({}));
    let cases = [
        (&op, "a not json".to_owned(), "unions: "),
        (
            &op,
            format!("a {}", spec(serde_json::json!({}))),
            "unions: ",
        ),
        (
            &op,
            format!("a {}", one(serde_json::json!({"mode": "rw"}))),
            "unknown field `mode`",
        ),
        (
            &op,
            format!("a {}", one(serde_json::json!({"upper": null}))),
            "missing field `upper`",
        ),
        (
            &op,
            format!("a {}", one(serde_json::json!({"lowers": ["rel/lower"]}))),
            "rel/lower is not an absolute path",
        ),
        (
            &op,
            format!("a {}", one(serde_json::json!({"work": "work"}))),
            "work is not an absolute path",
        ),
        (&op, format!("a {many}"), "at most 16 points"),
        // Points are checked when set: `/NAME`, once, and not an entry of the host's `/`.
        (&op, point("ctx"), "a point must be /NAME"),
        (&op, point("/ctx/../etc"), "a point must be /NAME"),
        (&op, point("/tmp"), "exists in the host's /"),
        (&op, format!("a [{s},{s}]"), "the point is given twice"),
        (
            &op,
            format!("a {}", one(lower_count)),
            "at most 256 layers per point",
        ),
        (
            &op,
            "b [{\"point\":\"/ctx\"}]".to_owned(),
            "missing field `lowers`",
        ),
        (&op, "a".to_owned(), "give AGENT and JSON or none"),
        (
            &op,
            format!("operator {other_json}"),
            "reserved for the operator",
        ),
        (&op, format!(".a {other_json}"), "may only contain"),
        // Only the operator sets unions: not the agent itself, not another agent.
        (&a, format!("a {other_json}"), "permission denied"),
        (&a, "a none".to_owned(), "permission denied"),
        (&b, format!("b {other_json}"), "permission denied"),
        (&b, format!("a {other_json}"), "permission denied"),
    ];
    let mut failures = Vec::new();
    for (who, args, want) in &cases {
        let cmd = format!("unions {args}");
        match write(who, "ctl", &cmd).await {
            Ok(()) => failures.push(format!("accepted: {cmd}")),
            Err(e) if !e.contains(want) => failures.push(format!("{cmd}: {want:?} not in {e}")),
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");

    // Nothing changed: a still has its own union, b none, and no layer was touched.
    let r = bash_ok(&a, "cat /ctx/x; ls /ctx").await;
    assert_eq!(r.body, "from the bead\nx\n", "{r:?}");
    assert_no_point_for(&b, "b").await;
    assert_eq!(tree(&l.upper), Vec::new());
    assert_eq!(tree(&other.upper), Vec::new());
    assert_eq!((tree(&l.lower), tree(&other.lower)), lowers);
}

// ---------------------------------------------------------------------------------------------
// Lifetime

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_toolsrv_kills_its_tools() {
    if !features_ok("killing_toolsrv_kills_its_tools") {
        return;
    }
    let mut t = Ts::start().await;
    let a = t.attach("a").await;
    let marker = sleep_marker();
    run_bg(&a, &format!("tool=execute_code\ncmd=sleep {marker}\n"))
        .await
        .unwrap();
    let marker2 = sleep_marker();
    // A setsid'd, double-forked one as well.
    run_bg(
        &a,
        &format!("tool=execute_code\ncmd=(setsid sleep {marker2} &) ; sleep {marker2}\n"),
    )
    .await
    .unwrap();
    wait_marker_up(&marker).await;
    assert!(
        poll(IO_TIMEOUT, || procs_with(&marker2).len() >= 2).await,
        "the double-forked sleep did not start"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(t.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let st = wait_child(t.ts.child(), UP_TIMEOUT, "toolsrv");
    assert!(!st.success());
    wait_marker_gone(&marker).await;
    wait_marker_gone(&marker2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_link_ends_toolsrv_and_its_tools() {
    if !features_ok("closing_the_link_ends_toolsrv_and_its_tools") {
        return;
    }
    let mut t = Ts::start().await;
    let marker = sleep_marker();
    {
        let a = t.attach("a").await;
        let op = t.attach("operator").await;
        run_bg(&a, &format!("tool=execute_code\ncmd=sleep {marker}\n"))
            .await
            .unwrap();
        // One for the operator under another policy (a second prepared sandbox).
        write(&op, "ctl", "policy c readonly").await.unwrap();
        run_bg(
            &op,
            &format!("tool=execute_code\nagent=c\ncmd=sleep {marker}\n"),
        )
        .await
        .unwrap();
        assert!(
            poll(IO_TIMEOUT, || procs_with(&marker).len() >= 2).await,
            "the sleeps did not start"
        );
        let _ = within("clunk", a.clunk()).await;
        let _ = within("clunk", op.clunk()).await;
    }
    // Closing our end of the link (the only client) ends toolsrv with status 0.
    drop(t.c.take());
    let st = wait_child(t.ts.child(), UP_TIMEOUT, "toolsrv");
    assert_eq!(st.code(), Some(0), "toolsrv exit status {st}");
    wait_marker_gone(&marker).await;
}

// ---------------------------------------------------------------------------------------------
// What toolsrv reveals

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secrets_in_proc_and_no_stray_fds() {
    if !features_ok("no_secrets_in_proc_and_no_stray_fds") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let _op = t.attach("operator").await;
    // A tool has run, so a prepared sandbox exists too.
    let r = run(&a, "tool=execute_code\ncmd=echo hi\n").await.unwrap();
    assert_eq!(r.body, "hi\n");
    let pid = t.pid();
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let key = *t.key().as_bytes();
    let mut needles: Vec<(String, Vec<u8>)> = vec![
        ("master key (raw)".into(), key.to_vec()),
        ("master key (hex)".into(), hex(&key).into_bytes()),
        (
            "master key (HEX)".into(),
            hex(&key).to_uppercase().into_bytes(),
        ),
    ];
    for id in ["a", "b", "operator"] {
        let s = t.key().secret(&Identity::from_aname(id).unwrap());
        needles.push((format!("{id}'s secret (hex)"), hex(&s).into_bytes()));
        needles.push((format!("{id}'s secret (raw)"), s.to_vec()));
    }
    let check = |what: &str, data: &[u8]| {
        for (name, n) in &needles {
            assert!(
                !data.windows(n.len()).any(|w| w == n.as_slice()),
                "{what} contains the {name}"
            );
        }
    };
    let cmdline = std::fs::read(proc_dir.join("cmdline")).unwrap();
    check("cmdline", &cmdline);
    let cmd = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(cmd.trim_end().ends_with("toolsrv"), "cmdline {cmd:?}");

    if is_root() {
        let env = std::fs::read(proc_dir.join("environ")).unwrap();
        check("environ", &env);
        for var in env.split(|b| *b == 0).filter(|v| !v.is_empty()) {
            assert!(
                var.starts_with(b"RUST_LOG="),
                "unexpected variable in toolsrv's environment: {}",
                String::from_utf8_lossy(var)
            );
        }
        let mut fds = BTreeMap::new();
        for e in std::fs::read_dir(proc_dir.join("fd")).unwrap().flatten() {
            let n: i32 = e.file_name().to_str().unwrap().parse().unwrap();
            let target = std::fs::read_link(e.path())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            fds.insert(n, target);
        }
        assert_eq!(
            fds.get(&0).map(String::as_str),
            Some("/dev/null"),
            "{fds:?}"
        );
        assert_eq!(
            fds.get(&1).map(String::as_str),
            Some("/dev/null"),
            "{fds:?}"
        );
        // What the prepared sandbox holds: the workspace and its protected islands (pinned).
        let ws = std::fs::canonicalize(t.ws()).unwrap();
        for (n, target) in &fds {
            assert!(
                !target.contains("ollie-toolsrv-boot") && !target.starts_with("/memfd:"),
                "fd {n} is the boot memfd ({target}): {fds:?}"
            );
            if *n == 2 {
                continue; // our stderr, inherited
            }
            let ok = target.starts_with("socket:[")
                || target.starts_with("anon_inode:")
                || target == "/dev/null"
                || Path::new(target).starts_with(&ws);
            assert!(ok, "unexpected fd {n} -> {target}: {fds:?}");
        }
        // The link is there: at least one socket.
        assert!(fds.values().any(|t| t.starts_with("socket:[")), "{fds:?}");
    } else {
        // Not root: toolsrv is non-dumpable, so even its own user cannot read these.
        for f in ["environ", "fd", "mem"] {
            let r = if f == "fd" {
                std::fs::read_dir(proc_dir.join(f)).map(|_| ())
            } else {
                std::fs::read(proc_dir.join(f)).map(|_| ())
            };
            let e = r.expect_err("toolsrv is dumpable");
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::PermissionDenied,
                "/proc/{pid}/{f}: {e}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bad boot input

/// Runs toolsrv with `boot` on fd 4 (if given) and a socketpair end on fd 3; returns its
/// status and stderr.
fn run_boot(boot: Option<&[u8]>) -> (std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().unwrap();
    let (_ours, theirs) = UnixStream::pair().unwrap();
    let mut maps = vec![FdMapping {
        parent_fd: OwnedFd::from(theirs),
        child_fd: 3,
    }];
    if let Some(b) = boot {
        let p = dir.path().join("boot");
        std::fs::write(&p, b).unwrap();
        maps.push(FdMapping {
            parent_fd: OwnedFd::from(std::fs::File::open(&p).unwrap()),
            child_fd: 4,
        });
    }
    let mut cmd = Command::new(bin("toolsrv"));
    cmd.env_clear();
    cmd.fd_mappings(maps).unwrap();
    let out = common::run(&mut cmd, b"");
    (out.status, text(&out.stderr))
}

/// A boot message with `json` as its configuration.
fn boot_with_json(json: &[u8]) -> Vec<u8> {
    let mut m = boot::MAGIC.to_vec();
    m.extend_from_slice(&[7; 32]);
    m.extend_from_slice(&(json.len() as u32).to_le_bytes());
    m.extend_from_slice(json);
    m
}

/// What is wrong with how toolsrv fails on `boot` (exit 2, one `toolsrv: ` line containing
/// each of `wants`), if anything: every problem, not only the first.
fn boot_failures(boot: Option<&[u8]>, wants: &[&str]) -> Vec<String> {
    let (st, err) = run_boot(boot);
    let mut out = Vec::new();
    if st.code() != Some(2) {
        out.push(format!("status {st}, stderr {err:?}"));
    }
    if err.lines().count() != 1 {
        out.push(format!("stderr is not one line: {err:?}"));
    }
    if !err.starts_with("toolsrv: ") {
        out.push(format!("stderr does not start with \"toolsrv: \": {err:?}"));
    }
    for w in wants {
        if !err.contains(w) {
            out.push(format!("{w:?} not in {err:?}"));
        }
    }
    out
}

/// A bad boot input: its name, the boot message (`None`: no fd 4) and what the error names.
type BootCase = (&'static str, Option<Vec<u8>>, &'static [&'static str]);

#[test]
fn bad_boot_input_exits_2_with_one_line() {
    let dirs = Dirs::new();
    let good = dirs.boot();
    let key = MasterKey::from_bytes([9; 32]);
    let encode = |b: &boot::Bootstrap| Some(boot::encode(&key, b).unwrap());

    let mut truncated = boot::encode(&key, &good).unwrap();
    truncated.truncate(truncated.len() - 3);
    let mut v = serde_json::to_value(&good).unwrap();
    v["bogus_key"] = serde_json::json!(1);
    let mut unknown_key = good.clone();
    unknown_key.policies.insert(
        "broken".into(),
        WORKSPACE_TOML.replace("[network]", "[network]\nbogus_setting = 1"),
    );
    let mut invalid = good.clone();
    invalid.policies.insert(
        "broken".into(),
        WORKSPACE_TOML.replace("output_bytes = 1048576", "output_bytes = -5"),
    );
    let mut no_default = good.clone();
    no_default.default_policy = "nonesuch".into();
    let mut no_workdir = good.clone();
    no_workdir.workdir = dirs.dir.path().join("does-not-exist");
    let mut relative_home = good;
    relative_home.home = "relative/home".into();

    let cases: [BootCase; 11] = [
        (
            "garbage",
            Some(vec![b'x'; 200]),
            &["not a toolsrv boot message"],
        ),
        ("empty", Some(Vec::new()), &["boot"]),
        ("truncated", Some(truncated), &["boot"]),
        ("no boot fd", None, &["fd 4 is not open"]),
        (
            "unknown key",
            Some(boot_with_json(v.to_string().as_bytes())),
            &["bogus_key"],
        ),
        ("not json", Some(boot_with_json(b"{nope")), &["boot"]),
        (
            "policy with an unknown key",
            encode(&unknown_key),
            &["\"broken\"", "bogus_setting"],
        ),
        (
            "policy failing validation",
            encode(&invalid),
            &["\"broken\"", "limits.output_bytes"],
        ),
        (
            "missing default policy",
            encode(&no_default),
            &["default_policy", "nonesuch"],
        ),
        ("missing workspace", encode(&no_workdir), &["workdir"]),
        (
            "relative home",
            encode(&relative_home),
            &["home", "not absolute"],
        ),
    ];
    let mut table = ollie_testkit::cases::Cases::new();
    for (name, boot, wants) in &cases {
        table.check(name, "", boot_failures(boot.as_deref(), wants));
    }
    table.finish();
}

// ---------------------------------------------------------------------------------------------
// stdin= and output= (the payload keys olliesrv's lifecycle hooks run with)

/// A payload for bash `code` with extra `key=value` lines (values escaped here).
fn code_with(code_text: &str, extra: &[(&str, &str)]) -> String {
    let mut p = code("bash", code_text);
    for (k, v) in extra {
        p.push_str(&format!("{k}={}\n", ollie_link::escape_value(v)));
    }
    p
}

/// The `{"stdout","stderr"}` line of an `output=split` result (checked to be one line of JSON
/// ending in a newline, optionally followed by the truncation notice); returns (stdout,
/// stderr, what follows the line).
fn split_body(r: &Run) -> (String, String, String) {
    let (line, rest) = r
        .body
        .split_once('\n')
        .unwrap_or_else(|| panic!("split result has no newline: {r:?}"));
    let v: serde_json::Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("split result is not one line of JSON ({e}): {r:?}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {r:?}"));
    let keys: BTreeSet<&str> = o.keys().map(String::as_str).collect();
    assert_eq!(keys, BTreeSet::from(["stderr", "stdout"]), "{r:?}");
    (
        o["stdout"].as_str().unwrap().to_owned(),
        o["stderr"].as_str().unwrap().to_owned(),
        rest.to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_reaches_execute_code_tool_and_pipe() {
    if !features_ok("stdin_reaches_execute_code_tool_and_pipe") {
        return;
    }
    let t = with_tool_script("upper.sh", "#!/bin/sh\necho \"args: $*\"\ntr a-z A-Z\n").await;
    let a = t.attach("a").await;

    // Several lines, a backslash before n and before another backslash, a tab, UTF-8: byte
    // for byte (escaped in the payload, unescaped by toolsrv).
    let input = "line one\nline two\n\tback\\slash and \\n literally, ü\n\nlast";
    let big = "z".repeat(60_000);
    let cases = [
        case(
            "cat with stdin",
            code_with("cat", &[("stdin", input)]),
            ran(&[Check::Exit(0), body(input)]),
        ),
        case(
            "wc -l with stdin",
            code_with("wc -l; echo done", &[("stdin", input)]),
            ran(&[body("4\ndone\n")]),
        ),
        // python3 reads it too.
        case(
            "python3 with stdin",
            format!(
                "{}stdin={}\n",
                code(
                    "python3",
                    "import sys; d = sys.stdin.read(); print(len(d), d.split())"
                ),
                ollie_link::escape_value("alpha beta\ngamma\n")
            ),
            ran(&[body("17 ['alpha', 'beta', 'gamma']\n")]),
        ),
        // execute_tool: the script reads it.
        case(
            "execute_tool with stdin",
            format!(
                "{}stdin=shout this\\n\n",
                tool(
                    "execute_tool",
                    serde_json::json!({"name": "upper.sh", "args": ["x"]})
                )
            ),
            ran(&[Check::Exit(0), body("args: x\nSHOUT THIS\n")]),
        ),
        // execute_pipe: the first step reads it.
        case(
            "execute_pipe with stdin",
            format!(
                "{}stdin=b\\na\\nc\\n\n",
                tool(
                    "execute_pipe",
                    serde_json::json!({"steps": [
                        {"language": "bash", "code": "sort"},
                        {"language": "bash", "code": "tr '\\n' ,"},
                    ]})
                )
            ),
            ran(&[Check::Exit(0), body("a,b,c,")]),
        ),
        // With cmd= as well.
        case(
            "cmd= with stdin",
            "tool=execute_code\ncmd=cat -n\nstdin=x\\ny\\n\n",
            ran(&[body("     1\tx\n     2\ty\n")]),
        ),
        // Without stdin= the program reads end-of-file at once (it does not wait for input).
        case(
            "no stdin",
            code("bash", "cat; n=$(wc -c); echo \"eof after $n bytes\""),
            ran(&[body("eof after 0 bytes\n")]),
        ),
        // An empty stdin= is an empty stdin.
        case(
            "empty stdin",
            code_with("wc -c", &[("stdin", "")]),
            ran(&[Check::BodyTrim("0".into())]),
        ),
        // A program that never reads a large stdin still ends with its own status.
        case(
            "a program that ignores its stdin",
            code_with("echo ignored; exit 7", &[("stdin", &big)]),
            ran(&[Check::Exit(7), body("ignored\n")]),
        ),
        // And one that reads it gets every byte.
        case(
            "a program that reads a large stdin",
            code_with("wc -c", &[("stdin", &big)]),
            ran(&[Check::BodyTrim("60000".into())]),
        ),
    ];
    run_cases(&a, &cases).await;

    // Background runs take stdin= too.
    let pid = run_bg(&a, &code_with("tr a-z A-Z", &[("stdin", "bg input\n")]))
        .await
        .expect("proc/new.bg with stdin");
    assert_eq!(read(&a, &format!("proc/{pid}/wait")).await.unwrap(), "0\n");
    assert_eq!(
        read(&a, &format!("proc/{pid}/out")).await.unwrap(),
        "BG INPUT\n"
    );
}

/// The largest `stdin=` one Twrite can carry (msize is at most 1 MiB, so the payload is
/// smaller than `MAX_STDIN`) arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_as_large_as_a_twrite_allows_arrives_whole() {
    if !features_ok("stdin_as_large_as_a_twrite_allows_arrives_whole") {
        return;
    }
    let dirs = Dirs::new();
    let boot = dirs.boot();
    let t = Ts::start_msize(dirs, &boot, 1 << 20).await;
    let a = t.attach("a").await;
    let f = open(&a, "proc/new", om::ORDWR).await.unwrap();
    let unit = f.iounit() as usize;
    assert!(unit > 1_000_000, "iounit {unit} with msize 1 MiB");
    let head = "tool=execute_code\ncmd=wc -c\nstdin=";
    let n = unit - head.len() - 1;
    let payload = format!("{head}{}\n", "s".repeat(n));
    assert_eq!(payload.len(), unit);
    within("write", f.write(0, Bytes::from(payload)))
        .await
        .map_err(|e| msg(&e))
        .expect("a payload of one iounit");
    let d = within("read", f.read_to_end()).await.expect("result");
    let r = Run::parse(&String::from_utf8_lossy(&d));
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert_eq!(r.body.trim(), n.to_string(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_split_separates_stdout_and_stderr() {
    if !features_ok("output_split_separates_stdout_and_stderr") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let src =
        "echo out; echo err >&2; printf 'more \"quoted\" out\\n'; echo 'more err' >&2; exit 3";
    let r = run(&a, &code_with(src, &[("output", "split")]))
        .await
        .expect("output=split");
    assert_eq!(r.exit(), Some(3), "{r:?}");
    let (out, err, rest) = split_body(&r);
    assert_eq!(out, "out\nmore \"quoted\" out\n", "{r:?}");
    assert_eq!(err, "err\nmore err\n", "{r:?}");
    assert_eq!(rest, "", "{r:?}");

    // combined (the default, also when named) interleaves them as before.
    for extra in [&[][..], &[("output", "combined")][..]] {
        let r = run(&a, &code_with("echo out; echo err >&2; exit 3", extra))
            .await
            .unwrap();
        assert_eq!(r.exit(), Some(3), "{r:?}");
        assert!(
            r.body.contains("out\n") && r.body.contains("err\n"),
            "{r:?}"
        );
        assert!(!r.body.contains("\"stdout\""), "{r:?}");
    }

    // Nothing on either stream: both empty. Invalid UTF-8: replaced, still one JSON line.
    let r = run(&a, &code_with("true", &[("output", "split")]))
        .await
        .unwrap();
    assert_eq!(
        split_body(&r),
        (String::new(), String::new(), String::new())
    );
    let r = run(
        &a,
        &code_with(
            "printf 'a\\377b'; printf '\\376' >&2",
            &[("output", "split")],
        ),
    )
    .await
    .unwrap();
    let (out, err, _) = split_body(&r);
    assert_eq!(out, "a\u{fffd}b", "{r:?}");
    assert_eq!(err, "\u{fffd}", "{r:?}");

    // With stdin= and for the other two program tools.
    let r = run(
        &a,
        &code_with(
            "tr a-z A-Z; echo warned >&2",
            &[("stdin", "in\n"), ("output", "split")],
        ),
    )
    .await
    .unwrap();
    let (out, err, _) = split_body(&r);
    assert_eq!((out.as_str(), err.as_str()), ("IN\n", "warned\n"), "{r:?}");
    let r = run(
        &a,
        &format!(
            "{}output=split\n",
            tool(
                "execute_pipe",
                serde_json::json!({"steps": [
                    {"language": "bash", "code": "echo piped; echo step1-err >&2"},
                    {"language": "bash", "code": "cat; echo step2-err >&2"},
                ]})
            )
        ),
    )
    .await
    .unwrap();
    let (out, err, _) = split_body(&r);
    assert_eq!(out, "piped\n", "{r:?}");
    assert!(
        err.contains("step1-err\n") && err.contains("step2-err\n"),
        "{r:?}"
    );
    // With record=1 the record line comes first, then the split line.
    let (first, v, rest) = run_with_record(
        &a,
        &code_with(
            "echo o; echo e >&2",
            &[("output", "split"), ("record", "1")],
        ),
    )
    .await
    .unwrap();
    assert!(
        first.ends_with('\n') && v["record"]["exit"]["code"] == 0,
        "{first}"
    );
    let r = Run::parse(&rest);
    assert_eq!(
        split_body(&r),
        ("o\n".to_owned(), "e\n".to_owned(), String::new()),
        "{rest:?}"
    );
}

/// Beyond the policy's output limit the split line is still one line of JSON, and the
/// truncation notice follows it on its own line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_split_beyond_the_limit_is_one_json_line_and_the_notice() {
    if !features_ok("output_split_beyond_the_limit_is_one_json_line_and_the_notice") {
        return;
    }
    let t = small_output_toolsrv().await;
    let a = t.attach("a").await;
    let r = run(
        &a,
        &code_with(
            "python3 -c \"import sys; print('o' * 3000); print('e' * 3000, file=sys.stderr)\"",
            &[("output", "split")],
        ),
    )
    .await
    .unwrap();
    assert_eq!(r.exit(), Some(0), "{r:?}");
    assert!(r.header.contains_key("truncated"), "{r:?}");
    let (out, err, rest) = split_body(&r);
    assert!(
        out.len() <= 1000 && err.len() <= 1000,
        "{} and {}",
        out.len(),
        err.len()
    );
    assert!(!out.is_empty(), "{r:?}");
    assert!(out.chars().all(|c| c == 'o' || c == '\n'), "{out:?}");
    assert!(err.chars().all(|c| c == 'e' || c == '\n'), "{err:?}");
    assert!(rest.starts_with("[output truncated"), "{rest:?}");
    assert_eq!(rest.lines().count(), 1, "{rest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_and_output_are_refused_where_they_do_not_apply() {
    if !features_ok("stdin_and_output_are_refused_where_they_do_not_apply") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let op = t.attach("operator").await;
    std::fs::write(t.ws().join("exists.txt"), "old\n").unwrap();
    let marker = t.ws().join("ran");
    let touch = format!("touch {}", marker.to_str().unwrap());
    let read_args = serde_json::json!({"path": "exists.txt"});
    let write_args = serde_json::json!({"path": "written.txt", "content": "new\n"});
    let replace_args = serde_json::json!({"path": "exists.txt", "content": "new\n"});
    let cases: Vec<Case> = [
        (
            format!("{}stdin=hello\n", tool("file_read", read_args.clone())),
            &["stdin="][..],
        ),
        (
            format!("{}stdin=hello\n", tool("file_write", write_args.clone())),
            &["stdin="][..],
        ),
        (
            format!("{}stdin=hello\n", tool("file_write", replace_args.clone())),
            &["stdin="][..],
        ),
        (
            format!("{}output=split\n", tool("file_read", read_args.clone())),
            &["output="][..],
        ),
        (
            format!("{}output=split\n", tool("file_write", write_args.clone())),
            &["output="][..],
        ),
        (
            code_with(&touch, &[("output", "both")]),
            &["output=", "combined", "split", "both"][..],
        ),
        (
            code_with(&touch, &[("output", "")]),
            &["output=", "combined", "split"][..],
        ),
        (
            code_with(&touch, &[("output", "SPLIT")]),
            &["output=", "combined", "split"][..],
        ),
        (
            code_with(&touch, &[("stdin", "a"), ("stdin", "b")]),
            &["\"stdin\" given twice"][..],
        ),
        (
            code_with(&touch, &[("output", "split"), ("output", "split")]),
            &["\"output\" given twice"][..],
        ),
    ]
    .into_iter()
    .map(|(payload, wants)| case(format!("{payload:?}"), payload, refused_both(wants)))
    .collect();
    run_cases(&a, &cases).await;
    // Nothing ran: no process, no marker, the file tools touched nothing.
    assert!(list(&op).await.is_empty(), "a process was created");
    assert!(list(&a).await.is_empty(), "a process was created");
    assert!(!marker.exists(), "a refused payload ran");
    assert!(!t.ws().join("written.txt").exists(), "file_write ran");
    assert_eq!(
        std::fs::read_to_string(t.ws().join("exists.txt")).unwrap(),
        "old\n"
    );
}

/// The seed's own payload, `tool=shell` with `cmd=` and `args={"cmd":…}`, runs as
/// `execute_code` in bash, sandboxed like it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_shell_payload_runs_as_execute_code() {
    if !features_ok("the_seeds_shell_payload_runs_as_execute_code") {
        return;
    }
    let t = Ts::start().await;
    let a = t.attach("a").await;
    let out = rdwr(
        &a,
        "proc/new",
        "tool=shell\ncmd=echo seed > seed.txt && cat seed.txt\nargs={\"cmd\":\"echo seed > seed.txt && cat seed.txt\"}\n",
    )
    .await
    .expect("tool=shell");
    assert!(out.starts_with("pid="), "{out}");
    assert!(out.contains("exit=0"), "{out}");
    assert!(out.ends_with("seed\n"), "{out}");
    assert_eq!(
        std::fs::read_to_string(t.ws().join("seed.txt")).unwrap(),
        "seed\n"
    );
    // Still the sandbox: the shadow file stays closed to it.
    let out = rdwr(&a, "proc/new", "tool=shell\ncmd=cat /etc/shadow\n")
        .await
        .expect("tool=shell");
    assert!(!out.contains("exit=0"), "{out}");
    assert!(!out.contains("root:"), "{out}");
}
