//! `feed` as the seed uses it: the seed's two shell loops verbatim (`git diff` piped through
//! `ollie-9p write`), a value written in pieces by our client and by py9p, and the rule that
//! turns writes into values (one fid's writes without a pause are one value; a value is
//! published whole; an unchanged value wakes nobody). The rule is in olliesrv's
//! `tree/feed.rs` and its `help`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use ollie_p9::Fid;
use ollie_p9::wire::om;
use ollie_testkit::client::{open, rdwr_text};
use ollie_testkit::gitrepo::DiffRepo;
use tokio::sync::mpsc;

const FEED: &str = "session/myproj/agent/obs/feed";

/// The seed's first loop, verbatim.
const DIFF_LOOP: &str =
    "while :; do git diff HEAD --; sleep 5; done | ollie-9p write session/myproj/agent/obs/feed";

/// The seed's second loop, verbatim (the seed breaks it over two lines with a backslash).
const STATEWAIT_LOOP: &str = "while :; do ollie-9p read session/myproj/agent/coder/statewait >/dev/null; git diff HEAD --; done \\
  | ollie-9p write session/myproj/agent/obs/feed";

/// A bound for one step of a loop that sleeps 5 s per iteration, on a slow, busy machine.
const STEP_GUARD: Duration = Duration::from_secs(90);

/// Lines in the repository's file: enough for a diff of well over 64 KiB, so it reaches the
/// feed in many pipe reads and Twrites.
const LINES: usize = 2000;

/// The shared repository ([`DiffRepo`]) with `big.txt` of [`LINES`] lines, so that its
/// diff is well over 64 KiB.
struct Repo(DiffRepo);

impl Repo {
    fn new() -> Repo {
        Repo(DiffRepo::new("big.txt", |version| {
            (0..LINES)
                .map(|i| format!("line {i} of the file, version {version}\n"))
                .collect()
        }))
    }

    fn work(&self) -> PathBuf {
        self.0.work()
    }

    fn write(&self, version: usize) {
        self.0.edit(version);
    }

    /// What `git diff HEAD --` prints now (many pipe reads' worth).
    fn diff(&self) -> Vec<u8> {
        let d = self.0.diff();
        assert!(d.len() > 128 * 1024, "diff of {}", d.len());
        d
    }

    fn runs(&self) -> usize {
        self.0.runs()
    }

    /// Starts `script` with `bash -c`, `git` and `ollie-9p` on its PATH and `NAMESPACE` set
    /// to the server's directory, in its own process group.
    fn spawn(&self, srv: &Srv, script: &str) -> Loop {
        let mut c = self.0.bash(srv.sock.parent().unwrap(), &bin_dir(), script);
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .process_group(0);
        Loop(c.spawn().unwrap())
    }
}

/// A running shell loop; dropping it kills its process group.
struct Loop(Child);

impl Drop for Loop {
    fn drop(&mut self) {
        let pg = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
        let _ = nix::sys::signal::kill(pg, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

/// The session `myproj` (working in `cwd`) with agents `obs` and `coder`.
async fn myproj(root: &Fid, cwd: &Path) {
    let r = rdwr_text(
        root,
        "session/new",
        &format!("name=myproj cwd={}", cwd.display()),
    )
    .await
    .unwrap();
    assert_eq!(r.trim_end(), "myproj");
    for a in ["obs", "coder"] {
        rdwr_text(root, "session/myproj/agent/new", &format!("name={a}"))
            .await
            .unwrap();
    }
}

/// A reader holding one fid of `path`: each value it reads (a read at offset 0, then the
/// rest up to end of file) is sent on the channel.
async fn reader(root: &Fid, path: &str) -> mpsc::UnboundedReceiver<Vec<u8>> {
    let f = open(root, path, om::OREAD).await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let mut v = Vec::new();
            loop {
                match f.read(v.len() as u64, f.iounit()).await {
                    Ok(d) if d.is_empty() => break,
                    Ok(d) => v.extend_from_slice(&d),
                    Err(_) => return,
                }
            }
            if tx.send(v).is_err() {
                return;
            }
        }
    });
    rx
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Vec<u8>>, what: &str) -> Vec<u8> {
    match tokio::time::timeout(STEP_GUARD, rx.recv()).await {
        Ok(Some(v)) => v,
        Ok(None) => panic!("{what}: the reader ended"),
        Err(_) => panic!("{what}: no value within {STEP_GUARD:?}"),
    }
}

/// Compares a value with what was expected without printing 150 KiB.
fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).take_while(|(a, b)| a == b).count();
        panic!(
            "{what}: got {} bytes, want {} (first difference at {at}; got starts {:?})",
            got.len(),
            want.len(),
            String::from_utf8_lossy(&got[..got.len().min(120)])
        );
    }
}

/// `ollie-9p read PATH` as a fresh process, started now: it prints the first value newer than
/// the one current at its open.
struct FreshRead(Child);

impl FreshRead {
    fn start(srv: &Srv, path: &str) -> FreshRead {
        let c = Command::new(bin("ollie-9p"))
            .arg("-a")
            .arg(srv.addr())
            .args(["read", path])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        FreshRead(c)
    }

    /// Still waiting after `d` (the value current at its open did not end it).
    fn still_waiting(&mut self, d: Duration) -> bool {
        std::thread::sleep(d);
        self.0.try_wait().unwrap().is_none()
    }

    /// What it printed once it exited (read as it goes: a value fills a pipe).
    fn value(self) -> Vec<u8> {
        let c = self.0;
        let pid = c.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(c.wait_with_output());
        });
        let Ok(o) = rx.recv_timeout(STEP_GUARD) else {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("ollie-9p read did not return within {STEP_GUARD:?}");
        };
        let o = o.unwrap();
        assert!(o.status.success(), "ollie-9p read: {}", text(&o.stderr));
        o.stdout
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_diff_loop_gives_one_value_per_changed_iteration() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let repo = Repo::new();
    myproj(&root, &repo.work()).await;
    repo.write(1);
    let d1 = repo.diff();
    let mut values = reader(&root, FEED).await;
    let _lp = repo.spawn(&srv, DIFF_LOOP);

    // The first iteration's diff, whole (it came in many writes).
    same(
        &next(&mut values, "first diff").await,
        &d1,
        "first iteration",
    );
    // Two more runs of git: the one between was unchanged, and is over.
    let seen = repo.runs();
    let deadline = tokio::time::Instant::now() + STEP_GUARD;
    while repo.runs() < seen + 2 {
        assert!(tokio::time::Instant::now() < deadline, "the loop stopped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A fresh `ollie-9p read` starts from the current value: the unchanged iterations (one
    // every 5 s) do not end it.
    let mut fresh = FreshRead::start(&srv, FEED);
    assert!(
        fresh.still_waiting(Duration::from_secs(7)),
        "a fresh read returned the value current at its open"
    );

    // A change: the next value this reader gets is the new diff (the unchanged iterations
    // woke nobody), and the fresh read gets it too, whole.
    repo.write(2);
    let d2 = repo.diff();
    same(
        &next(&mut values, "second diff").await,
        &d2,
        "changed iteration",
    );
    same(&fresh.value(), &d2, "ollie-9p read after the change");
    assert!(values.try_recv().is_err(), "an extra value");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_statewait_loop_gives_one_value_per_state_change() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    let repo = Repo::new();
    myproj(&root, &repo.work()).await;
    let mut values = reader(&root, FEED).await;
    let _lp = repo.spawn(&srv, STATEWAIT_LOOP);
    // Pausing and resuming the session changes coder's state (idle ⇄ paused) once each.
    let mut paused = false;
    for version in 1..=3 {
        repo.write(version);
        let want = repo.diff();
        let mut tries = 0;
        let got = loop {
            // The loop's statewait may not be open yet (a change before its open is not one
            // for it): change the state again until a value comes. Each change's diff is the
            // same, so an extra one wakes nobody.
            tries += 1;
            assert!(
                tries <= 30,
                "version {version}: no value after {tries} state changes"
            );
            paused = !paused;
            let cmd = if paused { "pause" } else { "resume" };
            ollie_testkit::client::write_ok(&root, "session/myproj/ctl", cmd).await;
            if let Ok(v) = tokio::time::timeout(Duration::from_secs(3), values.recv()).await {
                break v.expect("the reader ended");
            }
        };
        same(&got, &want, &format!("value after state change {version}"));
    }
}

/// Writes `chunks` on `w` from `offset`, one Twrite each; returns the offset after them.
async fn chunks(w: &Fid, mut offset: u64, chunks: &[&str]) -> u64 {
    for c in chunks {
        within("write", w.write(offset, Bytes::from(c.to_string())))
            .await
            .unwrap();
        offset += c.len() as u64;
    }
    offset
}

/// Longer than olliesrv's quiet interval (1 s): the writer's value is complete.
const PAUSE: Duration = Duration::from_millis(2500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_writes_in_pieces_and_pauses_between_values() {
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    myproj(&root, Path::new("/tmp")).await;
    // The reader is already blocked when the pieces arrive: it must get them whole.
    let mut values = reader(&root, FEED).await;
    let w = open(&root, FEED, om::OWRITE).await.unwrap();
    let off = chunks(&w, 0, &["alpha-", "beta-", "gamma\n"]).await;
    assert_eq!(next(&mut values, "first").await, b"alpha-beta-gamma\n");
    // After a pause, writing on at the same offsets starts the next value.
    tokio::time::sleep(PAUSE).await;
    let off = chunks(&w, off, &["second ", "value\n"]).await;
    assert_eq!(next(&mut values, "second").await, b"second value\n");
    // The same value again, then a new one: the reader sees only the new one.
    tokio::time::sleep(PAUSE).await;
    let off = chunks(&w, off, &["second ", "value\n"]).await;
    tokio::time::sleep(PAUSE).await;
    chunks(&w, off, &["third\n"]).await;
    assert_eq!(next(&mut values, "third").await, b"third\n");
    within("clunk", w.clunk()).await.unwrap();

    // A fresh open's value is complete at its clunk.
    let w = open(&root, FEED, om::OWRITE).await.unwrap();
    chunks(&w, 0, &["clunked ", "at once\n"]).await;
    within("clunk", w.clunk()).await.unwrap();
    assert_eq!(next(&mut values, "clunked").await, b"clunked at once\n");

    // Over the limit: the write that crosses it fails, with the limit; nothing is published.
    let w = open(&root, FEED, om::OWRITE).await.unwrap();
    let big = vec![b'x'; (1 << 20) + 1];
    let e = within("big", w.write_all(0, &big)).await.unwrap_err();
    assert!(e.to_string().contains("at most 1048576"), "{e}");
    within("clunk", w.clunk()).await.unwrap();
    let w = open(&root, FEED, om::OWRITE).await.unwrap();
    chunks(&w, 0, &["after\n"]).await;
    within("clunk", w.clunk()).await.unwrap();
    assert_eq!(
        next(&mut values, "after the refused value").await,
        b"after\n"
    );
    // The rule is in help, once.
    let help = ollie_testkit::client::read_ok(&root, "help").await;
    assert_eq!(help.matches("feed values:").count(), 1, "{help}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn py9p_writes_a_value_in_pieces() {
    if !have_py9p("py9p_writes_a_value_in_pieces") {
        return;
    }
    let srv = Srv::start(CONFIG);
    let (_c, root) = attach(&srv, &me()).await;
    myproj(&root, Path::new("/tmp")).await;
    let mut values = reader(&root, FEED).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("py9p/feed.py");
    let sock = srv.sock.clone();
    let py = tokio::task::spawn_blocking(move || {
        run(
            Command::new("python3")
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .arg(script)
                .arg(sock)
                .arg(FEED),
            b"",
        )
    });
    assert_eq!(next(&mut values, "py9p first").await, b"py9p wrote this\n");
    assert_eq!(next(&mut values, "py9p second").await, b"and then this\n");
    let o = py.await.unwrap();
    assert!(
        o.status.success() && text(&o.stdout).contains("ok"),
        "py9p feed: {}\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
}

/// Whether python3 with py9p is here; otherwise SKIP (or fail under OLLIE_TEST_REQUIRE=all).
fn have_py9p(test: &str) -> bool {
    let o = Command::new("python3")
        .args(["-c", "from py9p import py9p; py9p.Client"])
        .output();
    if matches!(&o, Ok(o) if o.status.success()) {
        return true;
    }
    let why = "python3 with py9p is not here (pip install p9fs==0.0.4)";
    if ollie_testkit::require_all() {
        panic!("{test}: {why} (OLLIE_TEST_REQUIRE=all)");
    }
    println!("SKIP {test}: {why}");
    false
}
