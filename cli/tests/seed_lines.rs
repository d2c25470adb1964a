//! The seed's command lines, run verbatim (tier 2): its "Raw session operations" through
//! `ollie-9p` and its "Shell composability" lines, each line given to `bash -c` exactly as the
//! seed writes it, against a real `olliesrv` (and the toolsrv it starts per session). `NAMESPACE`
//! names the server's socket directory, so `ollie-9p` without `-a` finds it, as it finds a
//! user's server. Also the prompt sizes of issue item 2 (300 KB is one turn, 20 MB is refused
//! once and queues nothing, `cat big > prompt` through `o mount` is one turn) and the read count
//! of issue item 3 (a loop of `ollie-9p read …/feed` prints once per new value), with the
//! figures printed to the test log.
//!
//! The model is a stand-in on 127.0.0.1 speaking Ollama's chat API ([`Model`]): it answers each
//! request with `reply N from MODEL: <first line of the prompt>`, and holds the requests of a
//! model the test has closed until it opens it, so an agent is "still running" for exactly as
//! long as the test needs (no slow script, no clock). Each agent the test creates has its own
//! model name, so each can be held and let go on its own. No tool ever runs, so the sandbox's
//! kernel features are not needed; the lines run through `o mount` need FUSE and print
//! `SKIP <test>: <reason>` without it (a failure under `OLLIE_TEST_REQUIRE=all`).
//!
//! Blocking reads are followed on the wire: where a test must know that a reader has opened its
//! file and is blocked before it causes a change, `NAMESPACE` points at a relay ([`Recorder`])
//! that notes every 9P message of each connection, or the test looks for the open file in
//! `/proc/PID/fd` of the loop's `cat`. Every wait is an event bounded by a failure guard; the
//! only fixed waits are the ones that let something that must not happen have its chance
//! ([`QUIET`]) or let the server's feed quiet interval pass ([`FEED_PAUSE`]). Nothing measures
//! time.
//!
//! Where the lines run: the raw operations anywhere (with `NAMESPACE`); the shell lines with
//! the current directory at an `o mount` of the tree, except the two feed loops, which run in
//! the project's git work tree as a user would run them: they reach the server only through
//! `ollie-9p` (paths from the server's root), and `git diff` needs the work tree. The chat
//! filter runs on a terminal (script(1)), as a user sees it: through a pipe, grep buffers its
//! output and shows nothing while the chat streams (grep's doing, not the server's).
//!
//! The statewait loop with a coder whose turns are quick writes the same diff several times
//! within the feed's quiet interval; they join into one value, which the feed takes as that
//! diff once ("same data written repeatedly never wakes the reader"):
//! `statewait_loop_with_quick_turns_gives_one_turn_per_distinct_diff`.
//!
//! Needs the workspace binaries (`cargo build --workspace --bins`), bash, git and script(1).
// Scenario tests read top to bottom; splitting them would hide the story.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::mount::{Mounted, fuse_usable};
use common::{GUARD, Out, Srv, bin, bin_dir, run};

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ollie_testkit::gitrepo::DiffRepo;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// The seed's lines, verbatim.

/// Raw session operations: create a session.
const SESSION_NEW: &str = r#"echo "name=myproj" | ollie-9p write session/new"#;
/// Create an agent. The one change the tests make to the seed's lines: `/home/user/project`
/// (here and in [`SPAWN`]) becomes the test's project directory, since a test may not create
/// /home/user.
const AGENT_NEW: &str =
    r#"echo "name=coding cwd=/home/user/project" | ollie-9p write session/myproj/agent/new"#;
/// Submit a prompt.
const PROMPT: &str =
    r#"echo "fix the bug in main.go" | ollie-9p write session/myproj/agent/coding/prompt"#;
/// Stream the response.
const STREAM: &str = "ollie-9p read session/myproj/agent/coding/chat";
/// Check state (blocks until change).
const STATEWAIT: &str = "ollie-9p read session/myproj/agent/coding/statewait";
/// Spawn a sub-agent (blocks until done, returns reply); the seed breaks it over two lines.
const SPAWN: &str = r"printf 'cwd=/home/user/project\nprompt=fix the failing tests\n' \
  | ollie-9p rdwr session/myproj/agent/new";
/// The seed's project directory, replaced by the test's.
const SEED_PROJECT: &str = "/home/user/project";

/// Shell composability: fan out a prompt to all agents.
const FAN_OUT: &str = r#"for s in session/*/agent/*/prompt; do echo "run tests" > "$s"; done"#;
/// Wait for all agents to finish.
const WAIT_ALL: &str = r#"for s in session/*/agent/*/statewait; do cat "$s" > /dev/null; done"#;
/// Pipe git diffs into an observer's feed (dedup is automatic).
const DIFF_LOOP: &str =
    "while :; do git diff HEAD --; sleep 5; done | ollie-9p write session/myproj/agent/obs/feed";
/// Wire an agent's state changes to an observer; the seed breaks it over two lines.
const STATEWAIT_LOOP: &str = r"while :; do ollie-9p read session/myproj/agent/coder/statewait >/dev/null; git diff HEAD --; done \
  | ollie-9p write session/myproj/agent/obs/feed";
/// Grep all agent plans.
const GREP_PLANS: &str = r#"grep -r "TODO" session/*/agent/*/plan"#;
/// Monitor costs.
const STATS: &str = "cat session/*/agent/*/stats";
/// Strip block markup from chat output.
const CHAT_STRIP: &str = r"cat session/myproj/agent/coding/chat | grep -vE '^\[\[\[.*'";

/// Issue item 3: the plain loop of fresh feed reads.
const FEED_READ_LOOP: &str = "while :; do ollie-9p read session/myproj/agent/obs/feed; done";

/// What the server takes as one prompt at most (`help`: prompts), as ollie-9p reports it.
const PROMPT_LIMIT: &str = "1048576";

/// How long something that must not happen (a blocked loop going on, an unchanged value being
/// printed) is given to happen anyway. Only ever used where it happening would be the bug:
/// passing never depends on the machine being fast.
const QUIET: Duration = Duration::from_secs(2);

/// Longer than olliesrv's feed quiet interval (1 s, `help`: feed values): writes of one
/// writer this far apart are separate values.
const FEED_PAUSE: Duration = Duration::from_millis(2500);

/// A bound for a step of a loop that sleeps 5 s per iteration, on a slow, busy machine.
const LOOP_GUARD: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------------------------
// The model stand-in.

/// A model stand-in speaking Ollama's chat API (`POST /api/chat`, `GET /api/tags`) on a free
/// loopback port, each request on a thread of its own. A request for a model the test has
/// [`Model::close`]d waits until it is [`Model::open`]ed; every request is noted (model and last
/// user message) and answered with one NDJSON line whose text is
/// `reply N from MODEL: FIRST LINE` (N counts that model's replies from 1; the prompt's first
/// line is cut to 60 characters). Only loopback, only this test's server.
struct Model {
    url: String,
    state: Arc<(Mutex<Gate>, Condvar)>,
}

#[derive(Default)]
struct Gate {
    /// Models whose requests are held.
    closed: BTreeSet<String>,
    /// Every request in arrival order: its model and its last user message.
    asked: Vec<(String, String)>,
    /// The replies sent, per model, in order.
    replies: BTreeMap<String, Vec<String>>,
    /// Set when the stand-in is dropped: nothing is held any more.
    done: bool,
}

impl Model {
    fn start() -> Model {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let state = Arc::new((Mutex::new(Gate::default()), Condvar::new()));
        let st = Arc::clone(&state);
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let st = Arc::clone(&st);
                std::thread::spawn(move || answer(c, &st));
            }
        });
        Model { url, state }
    }

    /// The `config.toml` that makes this the default backend, default model `m`.
    fn config(&self) -> String {
        format!(
            "default_backend = \"fake\"\n\n[backends.fake]\nkind = \"ollama\"\nbase_url = \"{}\"\nmodel = \"m\"\n",
            self.url
        )
    }

    /// Holds `model`'s requests from now on.
    fn close(&self, model: &str) {
        self.state.0.lock().unwrap().closed.insert(model.to_owned());
    }

    /// Lets `model`'s requests (held ones and later ones) be answered.
    fn open(&self, model: &str) {
        self.state.0.lock().unwrap().closed.remove(model);
        self.state.1.notify_all();
    }

    /// Waits until `n` requests for `model` have arrived.
    fn wait_asked(&self, model: &str, n: usize) {
        let deadline = Instant::now() + GUARD;
        let (m, cv) = &*self.state;
        let mut g = m.lock().unwrap();
        while g.asked.iter().filter(|(x, _)| x == model).count() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "the model never got request {n} for {model}: {:?}",
                g.asked.iter().map(|(m, _)| m).collect::<Vec<_>>()
            );
            g = cv.wait_timeout(g, left).unwrap().0;
        }
    }

    /// The replies sent for `model` so far.
    fn replies(&self, model: &str) -> Vec<String> {
        let g = self.state.0.lock().unwrap();
        g.replies.get(model).cloned().unwrap_or_default()
    }

    /// The last user message of each request for `model` (line ends trimmed at the end).
    fn prompts(&self, model: &str) -> Vec<String> {
        let g = self.state.0.lock().unwrap();
        g.asked
            .iter()
            .filter(|(m, _)| m == model)
            .map(|(_, p)| p.trim_end().to_owned())
            .collect()
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        self.state.0.lock().unwrap().done = true;
        self.state.1.notify_all();
    }
}

/// Answers one connection's request.
fn answer(mut s: TcpStream, st: &(Mutex<Gate>, Condvar)) {
    let Some((head, body)) = ollie_testkit::model::read_request_blocking(&mut s) else {
        return;
    };
    let reply = |ct: &str, b: String| {
        format!("HTTP/1.1 200 OK\r\nContent-Type: {ct}\r\nConnection: close\r\n\r\n{b}")
    };
    let out = if head.starts_with("GET /api/tags ") {
        reply(
            "application/json",
            json!({"models": [{"name": "m"}]}).to_string(),
        )
    } else if head.starts_with("POST /api/chat ") {
        let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let model = req["model"].as_str().unwrap_or("").to_owned();
        let user = req["messages"]
            .as_array()
            .and_then(|ms| ms.iter().rev().find(|m| m["role"] == "user"))
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_owned();
        let text = held_reply(st, &model, &user);
        let line = json!({"model": model, "done": true, "done_reason": "stop",
                          "prompt_eval_count": body.len().div_ceil(4),
                          "eval_count": text.len().div_ceil(4),
                          "message": {"role": "assistant", "content": text}});
        reply("application/x-ndjson", format!("{line}\n"))
    } else {
        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
    };
    let _ = s.write_all(out.as_bytes());
    let _ = s.shutdown(std::net::Shutdown::Both);
}

/// Notes the request, waits while its model is closed, and makes its reply.
fn held_reply(st: &(Mutex<Gate>, Condvar), model: &str, user: &str) -> String {
    let (m, cv) = st;
    let mut g = m.lock().unwrap();
    g.asked.push((model.to_owned(), user.to_owned()));
    cv.notify_all();
    while g.closed.contains(model) && !g.done {
        g = cv.wait(g).unwrap();
    }
    let n = g.replies.get(model).map_or(0, Vec::len) + 1;
    let first: String = user.lines().next().unwrap_or("").chars().take(60).collect();
    let text = format!("reply {n} from {model}: {first}");
    g.replies
        .entry(model.to_owned())
        .or_default()
        .push(text.clone());
    cv.notify_all();
    text
}

// ---------------------------------------------------------------------------------------------
// A relay that notes every 9P message.

/// A unix-socket relay in front of the server, at `DIR/ollie` (so `NAMESPACE=DIR` finds it),
/// that notes the type of every 9P message of each connection.
struct Recorder {
    dir: tempfile::TempDir,
    seen: Arc<Seen>,
}

#[derive(Default)]
struct Seen {
    list: Mutex<Vec<Msg>>,
    grew: Condvar,
}

/// One message: its connection (numbered from 0 in the order they came), whether it is a
/// T-message, its type.
#[derive(Debug, Clone, Copy)]
struct Msg {
    conn: usize,
    t: bool,
    ty: u8,
}

const RERROR: u8 = 107;
const TFLUSH: u8 = 108;
const TREAD: u8 = 116;
const RREAD: u8 = 117;

impl Recorder {
    fn start(upstream: &Path) -> Recorder {
        let dir = tempfile::Builder::new()
            .prefix("ns-relay")
            .tempdir()
            .unwrap();
        let l = UnixListener::bind(dir.path().join("ollie")).unwrap();
        let seen = Arc::new(Seen::default());
        let up = upstream.to_path_buf();
        let s2 = Arc::clone(&seen);
        std::thread::spawn(move || {
            for (conn, c) in l.incoming().enumerate() {
                let Ok(c) = c else { return };
                let Ok(u) = UnixStream::connect(&up) else {
                    return;
                };
                for (from, to, t) in [
                    (c.try_clone().unwrap(), u.try_clone().unwrap(), true),
                    (u, c, false),
                ] {
                    let seen = Arc::clone(&s2);
                    std::thread::spawn(move || relay(from, to, conn, t, &seen));
                }
            }
        });
        Recorder { dir, seen }
    }

    /// The directory to give as `NAMESPACE`.
    fn ns(&self) -> &Path {
        self.dir.path()
    }

    fn snapshot(&self) -> Vec<Msg> {
        self.seen.list.lock().unwrap().clone()
    }

    /// Waits until what has crossed the relay satisfies `done` (failing after `guard`); woken
    /// by each message, never by a clock.
    fn wait_until(&self, what: &str, guard: Duration, done: impl Fn(&[Msg]) -> bool) {
        let deadline = Instant::now() + guard;
        let mut list = self.seen.list.lock().unwrap();
        while !done(&list) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "timed out waiting for {what}");
            list = self.seen.grew.wait_timeout(list, left).unwrap().0;
        }
    }
}

/// A connection that has read: how many Treads it sent and how many are still waiting for
/// their answer (not answered, not flushed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reader {
    conn: usize,
    reads: usize,
    blocked: usize,
}

/// The connections that sent a Tread, in the order they came.
fn readers(seen: &[Msg]) -> Vec<Reader> {
    let mut by: BTreeMap<usize, (usize, usize, usize)> = BTreeMap::new();
    for m in seen {
        let e = by.entry(m.conn).or_default();
        match (m.t, m.ty) {
            (true, TREAD) => e.0 += 1,
            (false, RREAD | RERROR) => e.1 += 1,
            (true, TFLUSH) => e.2 += 1,
            _ => {}
        }
    }
    by.into_iter()
        .filter(|(_, (reads, _, _))| *reads > 0)
        .map(|(conn, (reads, answered, flushed))| Reader {
            conn,
            reads,
            blocked: reads.saturating_sub(answered + flushed),
        })
        .collect()
}

/// Whether the newest reading connection is `n`th (from 1) and blocked in a read.
fn nth_reader_blocked(seen: &[Msg], n: usize) -> bool {
    let r = readers(seen);
    r.len() == n && r.last().is_some_and(|r| r.blocked > 0)
}

/// Copies whole 9P frames (size[4] type[1] …) from `from` to `to`, noting each type.
fn relay(mut from: UnixStream, mut to: UnixStream, conn: usize, t: bool, seen: &Seen) {
    loop {
        let mut size = [0u8; 4];
        if from.read_exact(&mut size).is_err() {
            break;
        }
        let n = u32::from_le_bytes(size) as usize;
        let mut rest = vec![0u8; n.saturating_sub(4)];
        if from.read_exact(&mut rest).is_err() {
            break;
        }
        if let Some(&ty) = rest.first() {
            seen.list.lock().unwrap().push(Msg { conn, t, ty });
            seen.grew.notify_all();
        }
        if to
            .write_all(&size)
            .and_then(|()| to.write_all(&rest))
            .is_err()
        {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

// ---------------------------------------------------------------------------------------------
// Shell lines and background processes.

/// `bash -c LINE` in `cwd`, with `NAMESPACE=ns`, the workspace binaries first on `PATH` and
/// `env` added.
fn shell(ns: &Path, cwd: &Path, line: &str, env: &[(&str, &Path)]) -> Command {
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(line)
        .current_dir(cwd)
        .env("NAMESPACE", ns)
        .env("PATH", path_with_bins(None))
        .env("LC_ALL", "C");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// `PATH` with `first` (if any) and the workspace binaries before the caller's.
fn path_with_bins(first: Option<&Path>) -> String {
    let mut p = String::new();
    if let Some(f) = first {
        p.push_str(&format!("{}:", f.display()));
    }
    format!(
        "{p}{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Runs `line` to its end (bounded).
fn sh(ns: &Path, cwd: &Path, line: &str, env: &[(&str, &Path)]) -> Out {
    run(&mut shell(ns, cwd, line, env), b"")
}

/// `ollie-9p -a ADDR ARGS…` with `stdin`, straight to the server (not through a relay).
fn p9(srv: &Srv, args: &[&str], stdin: &[u8]) -> Out {
    let mut c = Command::new(bin("ollie-9p"));
    c.arg("-a").arg(srv.addr()).args(args);
    run(&mut c, stdin)
}

/// [`p9`] that must succeed; its output.
fn p9_ok(srv: &Srv, args: &[&str], stdin: &[u8]) -> String {
    let o = p9(srv, args, stdin);
    assert_eq!(o.code, Some(0), "ollie-9p {args:?}: {o:?}");
    o.stdout
}

/// What a background process printed so far, and a wakeup for each new piece.
#[derive(Default)]
struct Printed {
    bytes: Mutex<Vec<u8>>,
    grew: Condvar,
}

/// A process started in the background in its own process group, its output collected as it
/// comes; dropping it kills the group.
struct Bg {
    child: Child,
    out: Arc<Printed>,
    err: Arc<Printed>,
    readers: Vec<std::thread::JoinHandle<()>>,
    /// Kept open: a reader of standard input sees no end of it.
    _stdin: ChildStdin,
}

impl Bg {
    fn spawn(mut cmd: Command) -> Bg {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let out = Arc::new(Printed::default());
        let err = Arc::new(Printed::default());
        let mut readers = Vec::new();
        let pipes: [(Box<dyn Read + Send>, &Arc<Printed>); 2] = [
            (Box::new(child.stdout.take().unwrap()), &out),
            (Box::new(child.stderr.take().unwrap()), &err),
        ];
        for (mut pipe, to) in pipes {
            let to = Arc::clone(to);
            readers.push(std::thread::spawn(move || {
                let mut chunk = [0u8; 65536];
                loop {
                    match pipe.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            to.bytes.lock().unwrap().extend_from_slice(&chunk[..n]);
                            to.grew.notify_all();
                        }
                    }
                }
                to.grew.notify_all();
            }));
        }
        let stdin = child.stdin.take().unwrap();
        Bg {
            child,
            out,
            err,
            readers,
            _stdin: stdin,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Standard output so far (terminal line ends made plain).
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.bytes.lock().unwrap()).replace("\r\n", "\n")
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.err.bytes.lock().unwrap()).into_owned()
    }

    /// Waits until standard output contains `want`; returns it.
    fn wait_stdout(&self, want: &str, guard: Duration) -> String {
        let deadline = Instant::now() + guard;
        let mut b = self.out.bytes.lock().unwrap();
        loop {
            let s = String::from_utf8_lossy(&b).replace("\r\n", "\n");
            if s.contains(want) {
                return s;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(b);
                panic!(
                    "{want:?} was not printed within {guard:?}; stdout:\n{s}\nstderr:\n{}",
                    self.stderr()
                );
            }
            b = self.out.grew.wait_timeout(b, left).unwrap().0;
        }
    }

    /// Whether it is still running.
    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits (bounded) for it to exit: its status, standard output and standard error.
    fn finish(mut self, what: &str, guard: Duration) -> (ExitStatus, String, String) {
        let st = ollie_testkit::server::wait_child(&mut self.child, guard, what);
        for r in std::mem::take(&mut self.readers) {
            let _ = r.join();
        }
        (st, self.stdout(), self.stderr())
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        // Its descendants first: script(1) puts its shell in a session of its own, out of
        // the group, and a SIGHUP ignored by whoever started the tests (nohup) would not
        // end that shell's blocked reader.
        let pid = self.child.id();
        for d in descendants(pid) {
            let _ = kill(Pid::from_raw(d as i32), Signal::SIGKILL);
        }
        let _ = kill(Pid::from_raw(-(pid as i32)), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// Every process below `pid` (by their parent links in /proc), deepest last.
fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let p: u32 = e.file_name().to_str()?.parse().ok()?;
                    let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
                    // pid (comm) state ppid …: the comm may hold spaces and parentheses.
                    let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
                    Some((p, ppid.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out = vec![];
    let mut next = vec![pid];
    while let Some(p) = next.pop() {
        for (c, _) in parents.iter().filter(|(_, pp)| *pp == p) {
            out.push(*c);
            next.push(*c);
        }
    }
    out
}

/// Polls `cond` (every 20 ms) until it holds, failing with `what` after `guard`.
fn wait_for(what: &str, guard: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + guard;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// The server and what it says.

/// A server whose default backend is `model`.
fn server(model: &Model) -> Srv {
    let cfg = model.config();
    Srv::start_with(move |dir| std::fs::write(dir.join("config.toml"), cfg).unwrap())
}

/// Creates session `name` working in `cwd` and its agents, each with the model of its name.
fn session(srv: &Srv, name: &str, cwd: &Path, agents: &[&str]) {
    let r = p9_ok(
        srv,
        &["rdwr", "session/new"],
        format!("name={name} cwd={}", cwd.display()).as_bytes(),
    );
    assert_eq!(r.trim_end(), name);
    for a in agents {
        p9_ok(
            srv,
            &["rdwr", &format!("session/{name}/agent/new")],
            format!("name={a} model={a}").as_bytes(),
        );
    }
}

/// The directory of agent `agent` (`SESSION/NAME`): `session/SESSION/agent/NAME`.
fn agent_dir(agent: &str) -> String {
    let (s, n) = agent.split_once('/').unwrap();
    format!("session/{s}/agent/{n}")
}

/// A `key=value` line's value in `text`.
fn kv(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_owned))
}

/// Agent `agent`'s (`SESSION/NAME`) ended turns.
fn turns(srv: &Srv, agent: &str) -> u64 {
    let stats = p9_ok(srv, &["read", &format!("{}/stats", agent_dir(agent))], b"");
    kv(&stats, "turns")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{agent}: no turns= in {stats:?}"))
}

/// The `agent/idx` lines of session `s`: name and state.
fn agents(srv: &Srv, s: &str) -> Vec<(String, String)> {
    p9_ok(srv, &["read", &format!("session/{s}/agent/idx")], b"")
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f[0].to_owned(), f.get(2).copied().unwrap_or("").to_owned())
        })
        .collect()
}

/// Waits until `agent` (`SESSION/NAME`) has ended `n` turns and is idle.
fn wait_turns(srv: &Srv, agent: &str, n: u64) {
    let (s, name) = agent.split_once('/').unwrap();
    wait_for(&format!("{agent} to end turn {n}"), GUARD, || {
        turns(srv, agent) >= n
            && agents(srv, s)
                .iter()
                .any(|(a, st)| a == name && st == "idle")
    });
}

/// `chat.raw` of `agent` (`SESSION/NAME`), read (it streams) until the assistant block
/// with `reply` has closed.
fn chat_raw(srv: &Srv, agent: &str, reply: &str) -> String {
    let mut c = Command::new(bin("ollie-9p"));
    c.arg("-a")
        .arg(srv.addr())
        .args(["read", &format!("{}/chat.raw", agent_dir(agent))]);
    let bg = Bg::spawn(c);
    bg.wait_stdout(&format!("{reply}\n]]]\n"), GUARD)
}

/// The bodies of the `kind` blocks of a `chat.raw` text, in order.
fn blocks(raw: &str, kind: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Option<(String, Vec<&str>)> = None;
    for l in raw.lines() {
        match &mut cur {
            None => {
                if let Some(rest) = l.strip_prefix("[[[") {
                    let k = rest.split(' ').next().unwrap_or("");
                    cur = Some((k.to_owned(), Vec::new()));
                }
            }
            Some((k, body)) => {
                if l == "]]]" {
                    if k == kind {
                        out.push(body.join("\n"));
                    }
                    cur = None;
                } else {
                    body.push(l);
                }
            }
        }
    }
    out
}

/// The prompts `agent` (`SESSION/NAME`) has had, from its `chat.raw`, read until `model`'s
/// latest reply shows (each line end trimmed at the end).
fn user_blocks(srv: &Srv, model: &Model, agent: &str, model_name: &str) -> Vec<String> {
    let last = model.replies(model_name).pop().expect("no reply yet");
    let raw = chat_raw(srv, agent, &last);
    blocks(&raw, "user")
        .into_iter()
        .map(|b| b.trim_end_matches('\n').to_owned())
        .collect()
}

/// Lines of text, `len` bytes in all (ending with a newline).
fn text_of(len: usize, what: &str) -> String {
    let mut s = String::with_capacity(len + 64);
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!("line {i:07} of the {what}\n"));
        i += 1;
    }
    s.truncate(len - 1);
    s.push('\n');
    s
}

// ---------------------------------------------------------------------------------------------
// Raw session operations, through ollie-9p.

#[test]
fn seed_raw_session_operations_through_ollie_9p() {
    let model = Model::start();
    let srv = server(&model);
    let rec = Recorder::start(&srv.sock);
    let ns = rec.ns();
    let proj = srv.workdir();
    let here = srv.dir.path();
    let project = |line: &str| line.replace(SEED_PROJECT, proj.to_str().unwrap());

    // Create a session: name= alone. It has no working directory until its first agent.
    let o = sh(ns, here, SESSION_NEW, &[]);
    assert_eq!(o.code, Some(0), "{SESSION_NEW}: {o:?}");
    let idx = p9_ok(&srv, &["read", "session/idx"], b"");
    assert!(idx.starts_with("myproj\t"), "{idx}");
    let cfg = p9_ok(&srv, &["read", "session/myproj/cfg"], b"");
    assert_eq!(kv(&cfg, "cwd").as_deref(), Some(""), "{cfg}");

    // Create an agent: its cwd= becomes the session's workspace.
    let line = project(AGENT_NEW);
    let o = sh(ns, here, &line, &[]);
    assert_eq!(o.code, Some(0), "{line}: {o:?}");
    assert_eq!(agents(&srv, "myproj"), [("coding".into(), "idle".into())]);
    let cfg = p9_ok(&srv, &["read", "session/myproj/cfg"], b"");
    assert_eq!(kv(&cfg, "cwd"), Some(proj.display().to_string()), "{cfg}");

    // Submit a prompt: one turn with exactly that prompt.
    let o = sh(ns, here, PROMPT, &[]);
    assert_eq!(o.code, Some(0), "{PROMPT}: {o:?}");
    wait_turns(&srv, "myproj/coding", 1);
    assert_eq!(turns(&srv, "myproj/coding"), 1);
    let reply = model.replies("m").pop().unwrap();
    assert_eq!(reply, "reply 1 from m: fix the bug in main.go");
    assert_eq!(
        user_blocks(&srv, &model, "myproj/coding", "m"),
        ["fix the bug in main.go"]
    );
    assert_eq!(model.prompts("m"), ["fix the bug in main.go"]);

    // Stream the response: the conversation without markers, then it blocks at the end
    // (its read is held by the server) until killed.
    let before = rec.snapshot().len();
    let mut stream = Bg::spawn(shell(ns, here, STREAM, &[]));
    let shown = stream.wait_stdout(&reply, GUARD);
    rec.wait_until("the chat reader to block at the end", GUARD, |s| {
        readers(&s[before..]).iter().any(|r| r.blocked > 0)
    });
    assert!(shown.contains("fix the bug in main.go\n"), "{shown}");
    assert!(!shown.lines().any(|l| l.starts_with("[[[")), "{shown}");
    assert!(stream.running(), "the chat read ended: {shown}");
    drop(stream);

    // Check state: blocks until a change (its read is held), then prints the new state.
    let before = rec.snapshot().len();
    let mut wait = Bg::spawn(shell(ns, here, STATEWAIT, &[]));
    rec.wait_until("statewait to block", GUARD, |s| {
        readers(&s[before..]).iter().any(|r| r.blocked > 0)
    });
    assert!(wait.running(), "statewait returned without a change");
    p9_ok(&srv, &["write", "session/myproj/ctl"], b"pause\n");
    let (st, out, err) = wait.finish(STATEWAIT, GUARD);
    assert!(st.success(), "{STATEWAIT}: {st} {err}");
    assert_eq!(out, "paused\n");
    p9_ok(&srv, &["write", "session/myproj/ctl"], b"resume\n");

    // Spawn a sub-agent: rdwr blocks while the sub-agent's turn runs (its model holds the
    // request), then prints its reply; the new agent is there, with that one turn.
    model.close("m");
    let line = project(SPAWN);
    let mut spawn = Bg::spawn(shell(ns, here, &line, &[]));
    model.wait_asked("m", 2);
    let now = agents(&srv, "myproj");
    assert_eq!(now.len(), 2, "{now:?}");
    let (sub, state) = now.iter().find(|(a, _)| a != "coding").unwrap().clone();
    assert_ne!(state, "idle", "{now:?}");
    assert!(
        spawn.running(),
        "rdwr returned before the sub-agent's turn ended"
    );
    model.open("m");
    let (st, out, err) = spawn.finish(&line, GUARD);
    assert!(st.success(), "{line}: {st} {err}");
    let reply = model.replies("m").pop().unwrap();
    assert_eq!(reply, "reply 2 from m: fix the failing tests");
    assert_eq!(out.trim_end(), reply);
    let sub = format!("myproj/{sub}");
    wait_turns(&srv, &sub, 1);
    assert_eq!(turns(&srv, &sub), 1);
    assert_eq!(
        user_blocks(&srv, &model, &sub, "m"),
        ["fix the failing tests"]
    );
    // coding's conversation is its own.
    assert_eq!(turns(&srv, "myproj/coding"), 1);
}

// ---------------------------------------------------------------------------------------------
// Shell composability, with the current directory at an `o mount` of the tree.

/// Whether a `cat` child of `pid` has the file ending in `rel` open.
fn cat_holds(pid: u32, rel: &str) -> bool {
    ollie_testkit::server::children_named(pid, "cat")
        .into_iter()
        .any(|c| {
            std::fs::read_dir(format!("/proc/{c}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|p| p.ends_with(rel)))
        })
}

#[test]
fn seed_shell_lines_through_o_mount() {
    if !fuse_usable("seed_shell_lines_through_o_mount") {
        return;
    }
    let model = Model::start();
    let srv = server(&model);
    let proj = srv.workdir();
    let other = srv.dir.path().join("other-work");
    std::fs::create_dir_all(&other).unwrap();
    session(&srv, "myproj", &proj, &["coder", "coding", "obs"]);
    session(&srv, "other", &other, &["helper"]);
    // In the order of the globs (session/*/agent/*/…): SESSION/NAME, its model is NAME.
    let all = [
        "myproj/coder",
        "myproj/coding",
        "myproj/obs",
        "other/helper",
    ];
    let name = |a: &str| a.split_once('/').unwrap().1.to_owned();
    let ns = srv.sock.parent().unwrap().to_path_buf();
    let mnt = Mounted::new(&srv);
    let at = mnt.path();

    // Fan out a prompt to all agents: each gets the turn, and stays in it (its model holds
    // the request) for the wait below.
    for a in all {
        model.close(&name(a));
    }
    let o = sh(&ns, at, FAN_OUT, &[]);
    assert_eq!(o.code, Some(0), "{FAN_OUT}: {o:?}");
    for a in all {
        model.wait_asked(&name(a), 1);
    }

    // Wait for all agents to finish: the loop holds at each agent's statewait until that
    // agent's state changes after the open. Each agent is let go only once the loop's cat has
    // its statewait open, so each wait is ended by that agent's own change and the loop
    // returns after the last one.
    let mut wait = Bg::spawn(shell(&ns, at, WAIT_ALL, &[]));
    for a in all {
        let (s, n) = a.split_once('/').unwrap();
        let rel = format!("session/{s}/agent/{n}/statewait");
        wait_for(&format!("the loop's cat of {rel}"), GUARD, || {
            cat_holds(wait.pid(), &rel)
        });
        assert!(wait.running(), "the wait loop ended before {a} changed");
        model.open(&name(a));
    }
    let (st, _, err) = wait.finish(WAIT_ALL, GUARD);
    assert!(st.success(), "{WAIT_ALL}: {st} {err}");
    for a in all {
        wait_turns(&srv, a, 1);
        assert_eq!(
            model.prompts(&name(a)),
            ["run tests"],
            "{a}: what its model got"
        );
    }

    // The same loop when the agents are already idle: statewait returns at a change after
    // its open, and an idle agent has none until its next turn starts, so the loop holds at
    // the first idle agent (for ever, if no turn comes). A turn for coder lets it go on, to
    // coding, idle too, where it holds again. (To wait until agents are idle, read their
    // state in agent/idx first, as `help` says.)
    let mut again = Bg::spawn(shell(&ns, at, WAIT_ALL, &[]));
    wait_for("the loop's cat of coder's statewait", GUARD, || {
        cat_holds(again.pid(), "session/myproj/agent/coder/statewait")
    });
    std::thread::sleep(QUIET);
    assert!(
        cat_holds(again.pid(), "session/myproj/agent/coder/statewait"),
        "the loop went past idle coder without a change"
    );
    p9_ok(
        &srv,
        &["write", "session/myproj/agent/coder/prompt"],
        b"again\n",
    );
    wait_for("the loop's cat of coding's statewait", GUARD, || {
        cat_holds(again.pid(), "session/myproj/agent/coding/statewait")
    });
    assert!(again.running(), "the loop ended at idle agents");
    drop(again);
    wait_turns(&srv, "myproj/coder", 2);

    // Grep all agent plans: the one TODO, named by its file.
    p9_ok(
        &srv,
        &["write", "session/myproj/agent/coding/plan"],
        b"done: read main.go\nTODO: add a test for the fix\n",
    );
    let o = sh(&ns, at, GREP_PLANS, &[]);
    assert_eq!(o.code, Some(0), "{GREP_PLANS}: {o:?}");
    assert_eq!(
        o.stdout,
        "session/myproj/agent/coding/plan:TODO: add a test for the fix\n"
    );

    // Monitor costs: one stats block per agent, in the glob's order, each what the agent's
    // stats say over 9P; turns= as the agents ran them.
    let o = sh(&ns, at, STATS, &[]);
    assert_eq!(o.code, Some(0), "{STATS}: {o:?}");
    let each: String = all
        .iter()
        .map(|a| p9_ok(&srv, &["read", &format!("{}/stats", agent_dir(a))], b""))
        .collect();
    assert_eq!(o.stdout, each, "{STATS}");
    let counts: Vec<String> = o
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("turns="))
        .map(str::to_owned)
        .collect();
    assert_eq!(counts, ["2", "1", "1", "1"], "{}", o.stdout);
    eprintln!("{STATS}:\n{}", o.stdout);

    // Strip block markup from chat output: on a terminal (grep's output is line-buffered
    // there, as for a user), it streams coding's conversation, no marker line in it, and
    // blocks at the end until killed.
    let coding_reply = model.replies("coding").pop().unwrap();
    let mut c = Command::new("script");
    c.args(["-q", "-e", "-c", CHAT_STRIP, "/dev/null"])
        .current_dir(at)
        .env("SHELL", "/bin/bash")
        .env("NAMESPACE", &ns)
        .env("PATH", path_with_bins(None));
    let mut strip = Bg::spawn(c);
    let shown = strip.wait_stdout(&coding_reply, GUARD);
    assert!(shown.contains("run tests\n"), "{shown}");
    assert!(!shown.lines().any(|l| l.starts_with("[[[")), "{shown}");
    assert!(strip.running(), "the chat stream ended: {shown}");
    drop(strip);

    // Each agent had exactly those turns: a last prompt, and the prompts before it.
    for a in all {
        let before = turns(&srv, a);
        p9_ok(
            &srv,
            &["write", &format!("{}/prompt", agent_dir(a))],
            b"last\n",
        );
        wait_turns(&srv, a, before + 1);
        let want: &[&str] = if a == "myproj/coder" {
            &["run tests", "again", "last"]
        } else {
            &["run tests", "last"]
        };
        assert_eq!(user_blocks(&srv, &model, a, &name(a)), want, "{a}");
    }

    // The killed processes end asynchronously (a reader blocked in the mount is
    // interrupted first): wait for every process to let go of the mount.
    let deadline = Instant::now() + GUARD;
    loop {
        let users = users_of(mnt.path());
        if users.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            let who: Vec<String> = users
                .iter()
                .map(|p| {
                    let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                    let status =
                        std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
                    let sig = status
                        .lines()
                        .filter(|l| l.starts_with("Sig") || l.starts_with("State"))
                        .collect::<Vec<_>>()
                        .join(" ");
                    format!("{p} {:?} {sig}", String::from_utf8_lossy(&cmd))
                })
                .collect();
            panic!("processes still use the mount after {GUARD:?}: {who:#?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let un = mnt.unmount();
    assert_eq!(un.code, Some(0), "o mount -u: {un:?}");
}

/// The processes whose working directory or an open file is under `dir`.
fn users_of(dir: &Path) -> Vec<u32> {
    let under = |l: PathBuf| l.starts_with(dir);
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let p = PathBuf::from(format!("/proc/{pid}"));
            std::fs::read_link(p.join("cwd")).is_ok_and(under)
                || std::fs::read_dir(p.join("fd")).is_ok_and(|fds| {
                    fds.flatten()
                        .any(|f| std::fs::read_link(f.path()).is_ok_and(under))
                })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The feed loops, run in the project (they name the server's files through ollie-9p, and
// git diff needs the work tree).

/// The shared repository ([`DiffRepo`]) with a small `main.go`.
struct Repo(DiffRepo);

impl Repo {
    fn new() -> Repo {
        Repo(DiffRepo::new("main.go", |v| {
            format!(
                "package main\n\nimport \"fmt\"\n\nfunc main() {{\n\tfmt.Println(\"version {v}\")\n}}\n"
            )
        }))
    }

    fn work(&self) -> PathBuf {
        self.0.work()
    }

    fn edit(&self, v: usize) {
        self.0.edit(v);
    }

    /// What `git diff HEAD --` prints now.
    fn diff(&self) -> String {
        String::from_utf8(self.0.diff()).unwrap()
    }

    /// How many times the loop has run git.
    fn runs(&self) -> usize {
        self.0.runs()
    }

    /// Starts `line` with `bash -c` in the work tree, the counting `git` first on `PATH`,
    /// `NAMESPACE=ns`.
    fn spawn(&self, ns: &Path, line: &str) -> Bg {
        let mut c = self.0.bash(ns, &bin_dir(), line);
        c.env("LC_ALL", "C");
        Bg::spawn(c)
    }
}

#[test]
fn seed_diff_loop_gives_the_observer_one_turn_per_distinct_diff() {
    let model = Model::start();
    let srv = server(&model);
    let repo = Repo::new();
    session(&srv, "myproj", &repo.work(), &["obs", "coder"]);
    let ns = srv.sock.parent().unwrap().to_path_buf();
    // The work tree is clean: the loop's first diff is empty (nothing to write, no turn).
    let _lp = repo.spawn(&ns, DIFF_LOOP);
    wait_for("the loop's first git diff", LOOP_GUARD, || repo.runs() >= 1);

    // The diff changes twice (clean, then version 1, then version 2); obs has one turn for
    // each new diff, the diff whole, and none for the iterations in between.
    let step = |n: u64| {
        let deadline = Instant::now() + LOOP_GUARD;
        while turns(&srv, "myproj/obs") < n {
            assert!(Instant::now() < deadline, "obs never ended turn {n}");
            std::thread::sleep(Duration::from_millis(200));
        }
        wait_turns(&srv, "myproj/obs", n);
    };
    // An unchanged iteration (and the start of the next, 5 s after it) adds no turn.
    let unchanged = |n: u64| {
        let seen = repo.runs();
        wait_for("two more iterations", LOOP_GUARD, || {
            repo.runs() >= seen + 2
        });
        assert_eq!(turns(&srv, "myproj/obs"), n, "an unchanged diff was a turn");
    };
    repo.edit(1);
    let d1 = repo.diff();
    step(1);
    unchanged(1);
    repo.edit(2);
    let d2 = repo.diff();
    step(2);
    unchanged(2);
    let got = user_blocks(&srv, &model, "myproj/obs", "obs");
    let want = [d1.trim_end().to_owned(), d2.trim_end().to_owned()];
    assert_eq!(got, want, "obs's turns");
    eprintln!(
        "{DIFF_LOOP}: {} iterations, {} user blocks in obs's chat.raw (2 distinct diffs)",
        repo.runs(),
        got.len()
    );
}

#[test]
fn seed_statewait_loop_gives_the_observer_one_turn_per_distinct_diff() {
    let model = Model::start();
    let srv = server(&model);
    let repo = Repo::new();
    session(&srv, "myproj", &repo.work(), &["obs", "coder"]);
    let rec = Recorder::start(&srv.sock);
    repo.edit(1);
    let d1 = repo.diff();
    model.close("coder");
    let _lp = repo.spawn(rec.ns(), STATEWAIT_LOOP);
    // The loop's statewait is open and blocked (its first reader).
    rec.wait_until("the loop's first statewait", GUARD, |s| {
        nth_reader_blocked(s, 1)
    });

    // coder starts a turn (and stays in it): one change, one diff, obs's first turn.
    p9_ok(
        &srv,
        &["write", "session/myproj/agent/coder/prompt"],
        b"work\n",
    );
    wait_turns(&srv, "myproj/obs", 1);
    rec.wait_until("the loop's second statewait", GUARD, |s| {
        nth_reader_blocked(s, 2)
    });
    assert_eq!(repo.runs(), 1);

    // coder's turn ends: a change, but the same diff: no turn for obs. (Let the server's quiet
    // interval pass, so that the next diff is a value of its own.)
    model.open("coder");
    wait_turns(&srv, "myproj/coder", 1);
    rec.wait_until("the loop's third statewait", GUARD, |s| {
        nth_reader_blocked(s, 3)
    });
    assert_eq!(repo.runs(), 2);
    std::thread::sleep(FEED_PAUSE);

    // A change of the work tree, then of coder's state: obs's second turn, that diff.
    // coder is held in its turn again, so that its turn's end (the next change) comes more
    // than the feed's quiet interval after this diff: two changes closer together make two
    // diffs that join into one value (statewait_loop_with_quick_turns_gives_one_turn_per_distinct_diff).
    repo.edit(2);
    let d2 = repo.diff();
    model.close("coder");
    p9_ok(
        &srv,
        &["write", "session/myproj/agent/coder/prompt"],
        b"more\n",
    );
    wait_turns(&srv, "myproj/obs", 2);
    model.open("coder");
    wait_turns(&srv, "myproj/coder", 2);
    let got = user_blocks(&srv, &model, "myproj/obs", "obs");
    let want = [d1.trim_end().to_owned(), d2.trim_end().to_owned()];
    assert_eq!(got, want, "obs's turns");
    eprintln!(
        "{STATEWAIT_LOOP}: {} state changes seen, {} turns of obs",
        repo.runs(),
        got.len()
    );
}

/// The seed's statewait loop with a coder whose turns are quick, as a turn that only answers
/// is. A turn changes coder's state twice (idle → thinking → idle), often less than the
/// feed's quiet interval (1 s) apart, so the loop writes the same diff again within that
/// interval and the feed rule joins the writes into one value: the diff repeated (before the
/// fix, obs got a turn with the diff 6 to 8 times over). The feed takes a block of whole lines
/// written repeatedly as that block, so obs gets one turn per distinct diff, as the seed says
/// ("dedup is automatic").
#[test]
fn statewait_loop_with_quick_turns_gives_one_turn_per_distinct_diff() {
    let model = Model::start();
    let srv = server(&model);
    let repo = Repo::new();
    session(&srv, "myproj", &repo.work(), &["obs", "coder"]);
    let rec = Recorder::start(&srv.sock);
    repo.edit(1);
    let d1 = repo.diff();
    let _lp = repo.spawn(rec.ns(), STATEWAIT_LOOP);
    rec.wait_until("the loop's first statewait", GUARD, |s| {
        nth_reader_blocked(s, 1)
    });
    // Quick turns of coder (its model answers at once); the diff never changes.
    for n in 1..=5 {
        p9_ok(
            &srv,
            &["write", "session/myproj/agent/coder/prompt"],
            format!("quick turn {n}\n").as_bytes(),
        );
        wait_turns(&srv, "myproj/coder", n);
    }
    // The loop has run git once per statewait that returned, and its newest one is blocked:
    // nothing more comes from it. Its last value is published a quiet interval later.
    wait_for("the loop to settle", GUARD, || {
        let r = readers(&rec.snapshot());
        r.last().is_some_and(|l| l.blocked > 0) && repo.runs() + 1 == r.len()
    });
    std::thread::sleep(FEED_PAUSE);
    let obs_turns = turns(&srv, "myproj/obs");
    wait_turns(&srv, "myproj/obs", obs_turns);
    let got = user_blocks(&srv, &model, "myproj/obs", "obs");
    let sizes: Vec<usize> = got.iter().map(String::len).collect();
    eprintln!(
        "{STATEWAIT_LOOP}: {} diffs written for 5 quick turns; obs had {} turns, prompts of {sizes:?} bytes (the diff is {})",
        repo.runs(),
        got.len(),
        d1.trim_end().len()
    );
    assert_eq!(
        got,
        [d1.trim_end().to_owned()],
        "one distinct diff, but obs had {} turns (prompt sizes {sizes:?}, the diff is {} bytes)",
        got.len(),
        d1.trim_end().len()
    );
}

// ---------------------------------------------------------------------------------------------
// Issue items 2 and 3: prompt sizes, and the feed read loop.

/// After `big` was written to coding's prompt: a small prompt `after` through ollie-9p, then
/// coding has had two turns, the first `big` whole (one turn) and the second `after`; the
/// size of the first, with its line end.
fn big_prompt_was_one_turn(srv: &Srv, model: &Model, big: &str, after: &str) -> usize {
    p9_ok(
        srv,
        &["write", "session/myproj/agent/coding/prompt"],
        format!("{after}\n").as_bytes(),
    );
    wait_turns(srv, "myproj/coding", 2);
    let got = user_blocks(srv, model, "myproj/coding", "coding");
    assert_eq!(
        got.len(),
        2,
        "turns: {:?}",
        got.iter().map(String::len).collect::<Vec<_>>()
    );
    assert!(
        got[0] == big.trim_end(),
        "the 300 KB prompt was not one turn, whole"
    );
    assert_eq!(got[1], after);
    got[0].len() + 1
}

#[test]
fn prompt_sizes_through_ollie_9p() {
    let model = Model::start();
    let srv = server(&model);
    let proj = srv.workdir();
    session(&srv, "myproj", &proj, &["coding"]);
    let ns = srv.sock.parent().unwrap().to_path_buf();
    let here = srv.dir.path();
    let line = "ollie-9p write session/myproj/agent/coding/prompt < \"$BIG\"";

    // 300 KB: one turn, that prompt whole (a prompt after it shows nothing else was queued).
    let big = text_of(300_000, "300 KB prompt");
    let file = here.join("big300k");
    std::fs::write(&file, &big).unwrap();
    let o = sh(&ns, here, line, &[("BIG", &file)]);
    assert_eq!(o.code, Some(0), "{line} (300 KB): {o:?}");
    let n = big_prompt_was_one_turn(&srv, &model, &big, "after 300 KB");
    eprintln!("300 KB prompt through ollie-9p write: 1 turn added of {n} bytes");

    // 20 MB: refused once, one line with the size and the limit; nothing queued.
    let file = here.join("big20m");
    std::fs::write(&file, text_of(20_000_000, "20 MB prompt")).unwrap();
    let o = sh(&ns, here, line, &[("BIG", &file)]);
    // Exit status 1: the server refused (ollie-9p's status for a server error).
    assert_eq!(o.code, Some(1), "{line} (20 MB): {o:?}");
    let err = o.stderr.trim_end();
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.contains("prompt refused"), "{err}");
    assert!(err.contains(&format!("limit of {PROMPT_LIMIT}")), "{err}");
    let size: u64 = err
        .split("makes it ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in {err:?}"));
    assert!(size > 1_048_576, "{err}");
    p9_ok(
        &srv,
        &["write", "session/myproj/agent/coding/prompt"],
        b"after 20 MB\n",
    );
    wait_turns(&srv, "myproj/coding", 3);
    let got = user_blocks(&srv, &model, "myproj/coding", "coding");
    assert_eq!(got.len(), 3, "turns after the 20 MB prompt");
    assert_eq!(got[2], "after 20 MB");
    eprintln!(
        "20 MB prompt through ollie-9p write: exit {:?}, 0 turns added, error: {err}",
        o.code
    );
}

#[test]
fn prompt_of_300_kb_through_o_mount_is_one_turn() {
    if !fuse_usable("prompt_of_300_kb_through_o_mount_is_one_turn") {
        return;
    }
    let model = Model::start();
    let srv = server(&model);
    let proj = srv.workdir();
    session(&srv, "myproj", &proj, &["coding"]);
    let ns = srv.sock.parent().unwrap().to_path_buf();
    let mnt = Mounted::new(&srv);
    let big = text_of(300_000, "300 KB prompt");
    let file = srv.dir.path().join("big300k");
    std::fs::write(&file, &big).unwrap();
    let line = "cat \"$BIG\" > session/myproj/agent/coding/prompt";
    let o = sh(&ns, mnt.path(), line, &[("BIG", &file)]);
    assert_eq!(o.code, Some(0), "{line}: {o:?}");
    let n = big_prompt_was_one_turn(&srv, &model, &big, "after the mount");
    eprintln!("300 KB prompt by cat > prompt through o mount: 1 turn added of {n} bytes");
    let un = mnt.unmount();
    assert_eq!(un.code, Some(0), "o mount -u: {un:?}");
}

#[test]
fn feed_read_loop_prints_once_per_new_value() {
    let model = Model::start();
    let srv = server(&model);
    let proj = srv.workdir();
    session(&srv, "myproj", &proj, &["obs"]);
    let rec = Recorder::start(&srv.sock);
    let feed = ["write", "session/myproj/agent/obs/feed"];
    let mut reading = Bg::spawn(shell(rec.ns(), &proj, FEED_READ_LOOP, &[]));

    // Each value is written once the loop's fresh read is blocked (a value before a read's
    // open is not new to it).
    rec.wait_until("the first read", GUARD, |s| nth_reader_blocked(s, 1));
    p9_ok(&srv, &feed, b"first value\n");
    reading.wait_stdout("first value\n", GUARD);
    rec.wait_until("the second read", GUARD, |s| nth_reader_blocked(s, 2));
    p9_ok(&srv, &feed, b"second value\n");
    reading.wait_stdout("second value\n", GUARD);
    rec.wait_until("the third read", GUARD, |s| nth_reader_blocked(s, 3));
    // The same value again wakes nobody: the third read stays blocked.
    p9_ok(&srv, &feed, b"second value\n");
    std::thread::sleep(QUIET);
    let seen = rec.snapshot();
    assert!(nth_reader_blocked(&seen, 3), "{:?}", readers(&seen));
    assert!(reading.running(), "the loop ended: {}", reading.stderr());
    let out = reading.stdout();
    drop(reading);
    let values = out.lines().count();
    eprintln!(
        "{FEED_READ_LOOP}: {values} values printed, {} reads started, for 2 distinct values (one written twice)",
        readers(&seen).len()
    );
    assert_eq!(out, "first value\nsecond value\n");
    assert_eq!(values, 2);
    // Each new value was obs's turn too; the repeated one was not.
    wait_turns(&srv, "myproj/obs", 2);
    assert_eq!(model.prompts("obs"), ["first value", "second value"]);
}
