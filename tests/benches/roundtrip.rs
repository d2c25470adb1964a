//! Tool round trip benchmark: what one tool call costs through the whole stack, against the
//! sandboxed spawn alone (not a timed assertion; it prints figures).
//!
//! The measured path: the fake model (the `replay` backend) → olliesrv's agent loop → the
//! session's real `toolsrv`, `proc/new` as the agent → the prepared sandbox runs the command
//! → the result goes into the history → back to the model for its next turn.
//!
//! Method:
//!
//! - One real `olliesrv` (which starts the session's real `toolsrv`), configured in a
//!   temporary directory with two replay backends, and one session with two agents:
//!   - agent `tools` replays, per prompt, K turns that each call `execute_code` with
//!     `{"language": "sh", "code": "true"}` (toolsrv runs `sh -c true`), then a text answer;
//!   - agent `answer` replays, per prompt, the text answer only.
//! - A prompt is timed from the write to `prompt` until `statewait` (opened before) reports
//!   `idle`. A round is one prompt to each agent (their order alternates) and K
//!   `Prepared::run`s; the histories are cleared (`ctl clear`, untimed) before each round, so
//!   every prompt starts from the same history.
//! - Per round, `(T_tools − T_answer) / K` is the cost of one tool round trip: what the
//!   prompt, the tool schemas, the final answer and the waiter cost is in both prompts and
//!   cancels; what remains per call is the agent loop's step (model request built from the
//!   history, the replayed reply, chat and history writes), the `proc/new` round trip over
//!   the link, toolsrv's sandboxed run and the result's way back, plus the waiter's reads of
//!   the two state changes each call makes (`calling: execute_code`, `thinking`).
//! - The baseline, in this process, interleaved with the prompts: `ollie_sandbox::Prepared`
//!   under the policy toolsrv gives an agent by default (`ollie_policy::DEFAULT_PROFILE`),
//!   the same workspace, home, cwd, environment and argv (`sh -c true`), `run` K times per
//!   round.
//! - For orientation, the layer in between, also K per round: a `proc/new` round trip to a
//!   second real `toolsrv` (started here the way olliesrv starts one, same session id,
//!   workspace, home, environment and shipped policies) as an agent, with the payload the
//!   agent loop sends (`tool=execute_code`, `args=`, `cwd=`). The three layers give where the
//!   overhead is: toolsrv and its link, or the agent loop above it.
//! - For orientation, also interleaved: a 200-byte append + `fdatasync` to a file beside
//!   olliesrv's state directory (same filesystem), K per round. olliesrv makes its history
//!   and chat appends durable: a tool call appends 4 records (the assistant message and the
//!   tool result in the history, the `tool_call` and `tool_result` blocks in the chat) and
//!   then waits for the two files' syncs, run side by side.
//!
//! A round's `(T_tools − T_answer) / K` is a mean over K calls, and on a loaded machine the
//! spawn's distribution has a long tail (a mean well above the median), so the round trip is
//! compared with the same kind of figure: the mean of the round's K spawns (and K toolsrv
//! calls). The table gives medians and 90th percentiles over the rounds of those per-round
//! means, then the per-call median and p90 of the spawn and the toolsrv call; the last line
//! is `median(round trip) / median(spawn, round means)` (target: ≤ 2). Warm-up rounds come
//! first and are not counted (the first one sets up toolsrv's prepared sandbox).
//!
//! Build the binaries first (the bench looks for them next to itself, in
//! `$CARGO_TARGET_DIR/release`, or in `OLLIE_BIN_DIR`):
//!
//! ```text
//! cargo build --release --bins && cargo bench -p ollie-tests --bench roundtrip
//! ```
//!
//! `OLLIE_BENCH_RUNS` sets the rounds (default 40), `OLLIE_BENCH_TOOL_CALLS` sets K (default
//! 10, at most 49: a turn has at most 50 model steps). `OLLIE_BENCH_STATE_DIR` puts olliesrv's
//! state directory (and the fdatasync probe) in a temporary directory under that path instead
//! of beside the workspace — e.g. `/dev/shm` to see the stack without the cost of durable
//! writes (the workspace must stay on a disk the sandbox can bind). Without Landlock ABI 7 or
//! user namespaces it prints `SKIP roundtrip: <reason>` (with `OLLIE_TEST_REQUIRE=all` it
//! fails).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ollie_link::auth::Identity;
use ollie_link::boot::Bootstrap;
use ollie_link::spawn::Toolsrv;
use ollie_p9::dial::Addr;
use ollie_p9::wire::om;
use ollie_p9::{Client, Fid};

const WARMUP_ROUNDS: usize = 3;
const RATIO_TARGET: f64 = 2.0;
/// Failure guard for one prompt (never a timing assertion).
const TURN_TIMEOUT: Duration = Duration::from_secs(60);
const TOOL_TURN: &str = r#"{"tool_calls": [{"name": "execute_code", "arguments": {"language": "sh", "code": "true"}}]}"#;
const ANSWER_TURN: &str = r#"{"text": "done"}"#;
/// The variables olliesrv passes from its environment to toolsrv (`link::bootstrap`).
const PASSED_ENV: &[&str] = &[
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TERM",
    "TZ",
    "COLUMNS",
    "LINES",
    "NO_COLOR",
];

fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("OLLIE_BIN_DIR")
        && !d.is_empty()
    {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Prints `SKIP roundtrip: <reason>` and exits 0, or fails under `OLLIE_TEST_REQUIRE=all`.
fn skip(reason: &str) -> ! {
    ollie_testkit::skip_bench("roundtrip", reason)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The `p` quantile (nearest rank) of `v`.
fn quantile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    s[((s.len() - 1) as f64 * p).round() as usize]
}

fn row(name: &str, v: &[f64]) {
    println!(
        "{name:<52} median {:>9.1} µs   p90 {:>9.1} µs",
        quantile(v, 0.5),
        quantile(v, 0.9)
    );
}

async fn rdwr(root: &Fid, path: &str, data: &str) -> String {
    let mut f = root.walk_path(path).await.unwrap();
    f.open(om::ORDWR).await.unwrap();
    f.write(0, Bytes::from(data.to_owned())).await.unwrap();
    let r = String::from_utf8(f.read_to_end().await.unwrap()).unwrap();
    f.clunk().await.unwrap();
    r
}

async fn read_all(root: &Fid, path: &str) -> String {
    let mut f = root.walk_path(path).await.unwrap();
    f.open(om::OREAD).await.unwrap();
    let r = String::from_utf8(f.read_to_end().await.unwrap()).unwrap();
    f.clunk().await.unwrap();
    r
}

fn kv(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or("")
        .to_owned()
}

/// An agent with its `prompt`, `statewait` and `ctl` fids open.
struct Agent {
    name: &'static str,
    prompt: Fid,
    statewait: Fid,
    ctl: Fid,
}

impl Agent {
    async fn open(root: &Fid, name: &'static str) -> Agent {
        let base = format!("session/s/agent/{name}");
        let mut prompt = root.walk_path(&format!("{base}/prompt")).await.unwrap();
        prompt.open(om::OWRITE).await.unwrap();
        let mut statewait = root.walk_path(&format!("{base}/statewait")).await.unwrap();
        statewait.open(om::OREAD).await.unwrap();
        let mut ctl = root.walk_path(&format!("{base}/ctl")).await.unwrap();
        ctl.open(om::ORDWR).await.unwrap();
        Agent {
            name,
            prompt,
            statewait,
            ctl,
        }
    }

    /// Clears the history the model sees (untimed, between rounds).
    async fn clear(&self) {
        self.ctl
            .write(0, Bytes::from_static(b"clear"))
            .await
            .unwrap();
        let r = self.ctl.read(0, 256).await.unwrap();
        assert_eq!(&r[..], b"cleared\n", "{}: ctl clear", self.name);
    }

    /// One prompt, from the write until `statewait` says `idle`.
    async fn prompt(&self) -> Duration {
        let t = Instant::now();
        self.prompt
            .write(0, Bytes::from_static(b"go"))
            .await
            .unwrap();
        let wait = async {
            loop {
                let s = self.statewait.read(0, 4096).await.unwrap();
                if s.trim_ascii() == b"idle" {
                    break;
                }
            }
        };
        if tokio::time::timeout(TURN_TIMEOUT, wait).await.is_err() {
            panic!(
                "{}: the turn did not end within {TURN_TIMEOUT:?}",
                self.name
            );
        }
        t.elapsed()
    }
}

/// The olliesrv process: stopped (SIGTERM, then SIGKILL after 10 s) when dropped, also when
/// the bench fails half-way.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Exits 2 without the binaries; skips without Landlock ABI 7, user namespaces or an `sh`.
fn preflight(dir: &Path) {
    for b in ["olliesrv", "toolsrv"] {
        if !dir.join(b).is_file() {
            eprintln!(
                "roundtrip: {} not found; run `cargo build --release --bins` first (or set OLLIE_BIN_DIR)",
                dir.join(b).display()
            );
            std::process::exit(2);
        }
    }
    let probe = ollie_sandbox::probe();
    if probe.landlock_abi < 7 {
        skip(&format!("landlock ABI {} < 7", probe.landlock_abi));
    }
    if !probe.user_namespaces {
        skip("user namespaces are disabled");
    }
    if !["/usr/local/bin/sh", "/usr/bin/sh", "/bin/sh"]
        .iter()
        .any(|p| Path::new(p).is_file())
    {
        skip("no sh for execute_code");
    }
}

/// The directories of a run, all made and the workspace and home canonical.
struct Dirs {
    /// The bench's temporary directory: scripts, configuration, socket, olliesrv's stderr.
    tmp: PathBuf,
    work: PathBuf,
    home: PathBuf,
    /// An empty `XDG_CONFIG_HOME` for olliesrv.
    xdg: PathBuf,
    /// Where olliesrv's state directory and the fdatasync probe go (same filesystem).
    state_parent: PathBuf,
}

impl Dirs {
    fn new(tmp: &Path, state_parent: &Path) -> Dirs {
        let work = tmp.join("work");
        let home = tmp.join("home");
        let xdg = tmp.join("xdg-empty");
        for d in [&work, &home, &xdg] {
            std::fs::create_dir_all(d).unwrap();
        }
        Dirs {
            tmp: tmp.to_path_buf(),
            work: work.canonicalize().unwrap(),
            home: home.canonicalize().unwrap(),
            xdg,
            state_parent: state_parent.to_path_buf(),
        }
    }
}

/// Writes the replay scripts, `k` tool turns and an answer (or the answer alone) for each of
/// `prompts` prompts, and the configuration naming them; its path.
fn write_config(tmp: &Path, prompts: usize, k: usize) -> PathBuf {
    let mut tools_script = String::new();
    let mut answer_script = String::new();
    for _ in 0..prompts {
        for _ in 0..k {
            tools_script.push_str(TOOL_TURN);
            tools_script.push('\n');
        }
        tools_script.push_str(ANSWER_TURN);
        tools_script.push('\n');
        answer_script.push_str(ANSWER_TURN);
        answer_script.push('\n');
    }
    let tools_file = tmp.join("tools.jsonl");
    let answer_file = tmp.join("answer.jsonl");
    std::fs::write(&tools_file, tools_script).unwrap();
    std::fs::write(&answer_file, answer_script).unwrap();
    let config = tmp.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "default_backend = \"answer\"\n\n[backends.tools]\nkind = \"replay\"\nfile = \"{}\"\n\n[backends.answer]\nkind = \"replay\"\nfile = \"{}\"\n",
            tools_file.display(),
            answer_file.display()
        ),
    )
    .unwrap();
    config
}

/// What olliesrv has written to its stderr file so far.
fn olliesrv_stderr(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Starts olliesrv from `dir` with `config`, and waits until it accepts connections on
/// `sock`; its stderr goes to `stderr_path`.
fn start_olliesrv(dir: &Path, d: &Dirs, config: &Path, sock: &Path, stderr_path: &Path) -> Server {
    let srv = Server(
        Command::new(dir.join("olliesrv"))
            .arg("--config")
            .arg(config)
            .arg("-a")
            .arg(format!("unix!{}", sock.display()))
            .arg("--state-dir")
            .arg(d.state_parent.join("state"))
            .env("XDG_CONFIG_HOME", &d.xdg)
            .env("HOME", &d.home)
            .env("OLLIE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(stderr_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        assert!(
            Instant::now() < deadline,
            "olliesrv did not come up; stderr:\n{}",
            olliesrv_stderr(stderr_path)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    srv
}

/// The session `s` in `work` with its agents `tools` and `answer`, on a connection to `sock`.
struct Session {
    client: Client,
    root: Fid,
    tools: Agent,
    answer: Agent,
    id: String,
}

async fn open_session(sock: &Path, work: &Path) -> Session {
    let c = Client::dial(&Addr::Unix(sock.to_path_buf())).await.unwrap();
    let root = c
        .attach(None, &ollie_p9::dial::current_user(), "")
        .await
        .unwrap();
    rdwr(
        &root,
        "session/new",
        &format!("name=s cwd={}", work.display()),
    )
    .await;
    rdwr(&root, "session/s/agent/new", "name=tools backend=tools").await;
    rdwr(&root, "session/s/agent/new", "name=answer backend=answer").await;
    let id = read_all(&root, "session/s/id").await.trim().to_owned();
    let tools = Agent::open(&root, "tools").await;
    let answer = Agent::open(&root, "answer").await;
    Session {
        client: c,
        root,
        tools,
        answer,
        id,
    }
}

/// `sh -c true` as toolsrv runs it for this session's agents: same workspace, home, cwd and
/// environment.
fn sandbox_request(d: &Dirs, session_id: &str) -> ollie_sandbox::RunRequest {
    let mut req = ollie_sandbox::RunRequest::new(
        vec!["sh".into(), "-c".into(), "true".into()],
        d.work.clone(),
    );
    req.home = d.home.clone();
    req.cwd = Some(d.work.clone());
    req.base_env = PASSED_ENV
        .iter()
        .filter_map(|k| Some((OsString::from(k), std::env::var_os(k)?)))
        .chain([("OLLIE_SESSION_ID".into(), session_id.to_owned().into())])
        .collect();
    req
}

/// The toolsrv layer alone: a second toolsrv for the same session, started from `dir` as
/// olliesrv starts it, with the environment of `req`, and its `proc/new` opened as an agent.
fn second_toolsrv(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    d: &Dirs,
    session_id: &str,
    req: &ollie_sandbox::RunRequest,
) -> (Toolsrv, Client, Fid) {
    let mut boot = Bootstrap::new(
        session_id.to_owned(),
        d.work.clone(),
        d.home.clone(),
        ollie_policy::SHIPPED_PROFILES
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        ollie_policy::DEFAULT_PROFILE,
    );
    boot.env = req
        .base_env
        .iter()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let mut ts = Toolsrv::spawn(&dir.join("toolsrv"), &boot).expect("spawn toolsrv");
    let (ts_client, ts_new) = rt.block_on(async {
        let c = ts.connect(64 * 1024).await.expect("toolsrv connect");
        let r = ollie_link::spawn::attach(&c, ts.key(), &Identity::Agent("bench".into()))
            .await
            .expect("toolsrv attach");
        let mut f = r.walk_path("proc/new").await.expect("walk proc/new");
        f.open(om::ORDWR).await.expect("open proc/new");
        (c, f)
    });
    (ts, ts_client, ts_new)
}

/// The layers below the agent loop, each call timed: the second toolsrv's `proc/new` and the
/// sandbox alone.
struct Layers<'a> {
    rt: &'a tokio::runtime::Runtime,
    /// The second toolsrv's open `proc/new`.
    ts_new: &'a Fid,
    /// What the agent loop writes to `proc/new` for the call.
    payload: Bytes,
    prepared: &'a ollie_sandbox::Prepared,
    req: &'a ollie_sandbox::RunRequest,
}

impl Layers<'_> {
    /// One `proc/new` round trip: the write and the blocking read of the result.
    fn proc_new(&self) -> Duration {
        self.rt.block_on(async {
            let t = Instant::now();
            self.ts_new
                .write(0, self.payload.clone())
                .await
                .expect("proc/new write");
            let r = self.ts_new.read(0, 8192).await.expect("proc/new read");
            let d = t.elapsed();
            let head = String::from_utf8_lossy(&r);
            assert!(
                head.starts_with("pid=") && head.contains(" exit=0 "),
                "proc/new: unexpected result {head:?}"
            );
            d
        })
    }

    /// One `Prepared::run` of the request.
    fn spawn(&self) -> Duration {
        let t = Instant::now();
        let o = self.prepared.run(self.req).expect("Prepared::run");
        let d = t.elapsed();
        assert_eq!(o.record.exit.status, 0, "Prepared::run: sh -c true failed");
        d
    }
}

/// The warm-up rounds (the first tool call sets up toolsrv's prepared sandbox, and is
/// printed), then a few calls of each layer.
fn warm_up(s: &Session, layers: &Layers<'_>, k: usize) {
    let rt = layers.rt;
    let t = Instant::now();
    rt.block_on(s.tools.prompt());
    println!(
        "{:<52} {:>9.1} µs (sets up toolsrv's prepared sandbox)",
        format!("first prompt with {k} tool calls"),
        us(t.elapsed())
    );
    rt.block_on(s.answer.prompt());
    for _ in 0..WARMUP_ROUNDS - 1 {
        rt.block_on(async {
            s.tools.clear().await;
            s.answer.clear().await;
            s.tools.prompt().await;
            s.answer.prompt().await;
        });
    }
    for _ in 0..5 {
        layers.spawn();
        layers.proc_new();
    }
}

/// A durable append like olliesrv's history and chat appends: 200 bytes and `fdatasync`.
struct DurableAppend(std::fs::File);

impl DurableAppend {
    /// Appends to `path` (created if need be).
    fn open(path: &Path) -> DurableAppend {
        DurableAppend(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap(),
        )
    }

    fn time(&mut self) -> Duration {
        let line = [b'x'; 200];
        let t = Instant::now();
        self.0.write_all(&line).unwrap();
        self.0.sync_data().unwrap();
        t.elapsed()
    }
}

/// The figures of the measured rounds, in µs.
#[derive(Default)]
struct Samples {
    /// Each round's prompt to `tools` (K calls and the answer) and to `answer`.
    t_tools: Vec<f64>,
    t_answer: Vec<f64>,
    /// Each round's `(T_tools − T_answer) / K`.
    per_call: Vec<f64>,
    /// Every call of each layer, and every durable append.
    spawns: Vec<f64>,
    tsrv: Vec<f64>,
    syncs: Vec<f64>,
    /// Each round's mean of its K calls of each layer.
    spawn_means: Vec<f64>,
    tsrv_means: Vec<f64>,
}

/// `rounds` rounds, each a prompt to both agents (from cleared histories, their order
/// alternating) and K calls of each layer and durable appends, interleaved.
fn measure(
    rounds: usize,
    k: usize,
    s: &Session,
    layers: &Layers<'_>,
    append: &mut DurableAppend,
) -> Samples {
    let mut m = Samples::default();
    for i in 0..rounds {
        let (a, b) = layers.rt.block_on(async {
            s.tools.clear().await;
            s.answer.clear().await;
            if i % 2 == 0 {
                let a = s.tools.prompt().await;
                (a, s.answer.prompt().await)
            } else {
                let b = s.answer.prompt().await;
                (s.tools.prompt().await, b)
            }
        });
        m.t_tools.push(us(a));
        m.t_answer.push(us(b));
        m.per_call.push((us(a) - us(b)) / k as f64);
        let (mut sp, mut t) = (0.0, 0.0);
        for _ in 0..k {
            let d = us(layers.spawn());
            m.spawns.push(d);
            sp += d;
            let d = us(layers.proc_new());
            m.tsrv.push(d);
            t += d;
            m.syncs.push(us(append.time()));
        }
        m.spawn_means.push(sp / k as f64);
        m.tsrv_means.push(t / k as f64);
    }
    m
}

/// The tool calls of the warm-up really ran, sandboxed, and succeeded.
async fn check_tool_calls(root: &Fid, stderr_path: &Path) {
    let log = read_all(root, "session/s/agent/tools/log").await;
    assert!(
        log.contains("[[[tool_result name=execute_code") && log.contains(" exit=0"),
        "the tool calls did not succeed:\n{log}\nolliesrv stderr:\n{}",
        olliesrv_stderr(stderr_path)
    );
    assert!(!log.contains("[[[error"), "the turn failed:\n{log}");
}

/// Every one of the `calls` tool calls was made, and no turn failed.
async fn check_stats(root: &Fid, calls: usize) {
    let stats = read_all(root, "session/s/agent/tools/stats").await;
    let want = calls.to_string();
    assert_eq!(kv(&stats, "tool_calls"), want, "{stats}");
    assert_eq!(kv(&stats, "errors"), "0", "{stats}");
    let stats = read_all(root, "session/s/agent/answer/stats").await;
    assert_eq!(kv(&stats, "errors"), "0", "{stats}");
}

fn report(k: usize, s: &Samples) {
    let m = |v: &[f64]| quantile(v, 0.5);
    println!("per prompt:");
    row(&format!("  {k} tool calls + answer"), &s.t_tools);
    row("  answer only", &s.t_answer);
    println!("per call, as the mean of the round's K calls (one value per round):");
    row(
        "  tool round trip through the stack ((a - b) / K)",
        &s.per_call,
    );
    row("  toolsrv proc/new as an agent", &s.tsrv_means);
    row("  Prepared::run in process", &s.spawn_means);
    println!("per call (every call):");
    row("  toolsrv proc/new as an agent", &s.tsrv);
    row("  Prepared::run in process", &s.spawns);
    println!(
        "{:<52} median {:>9.1} µs   p90 {:>9.1} µs   mean {:.1} µs",
        "  orientation: 200-byte append + fdatasync",
        m(&s.syncs),
        quantile(&s.syncs, 0.9),
        s.syncs.iter().sum::<f64>() / s.syncs.len() as f64
    );
    println!(
        "stack overhead per tool call: {:.1} µs over the spawn; layers: toolsrv/spawn {:.2}x, \
         roundtrip/toolsrv {:.2}x (medians of the round means)",
        m(&s.per_call) - m(&s.spawn_means),
        m(&s.tsrv_means) / m(&s.spawn_means),
        m(&s.per_call) / m(&s.tsrv_means)
    );
    println!(
        "(against the per-call spawn median instead: {:.2}x)",
        m(&s.per_call) / m(&s.spawns)
    );
    let ratio = m(&s.per_call) / m(&s.spawn_means);
    println!("roundtrip/spawn ratio: {ratio:.2} (target <= {RATIO_TARGET:.1})");
}

fn main() {
    let rounds = env_usize("OLLIE_BENCH_RUNS", 40).max(1);
    let k = env_usize("OLLIE_BENCH_TOOL_CALLS", 10).clamp(1, 49);
    let dir = bin_dir();
    preflight(&dir);

    let tmp = tempfile::tempdir().unwrap();
    // olliesrv's state directory, and the fdatasync probe beside it (same filesystem).
    let state_tmp = std::env::var_os("OLLIE_BENCH_STATE_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| tempfile::tempdir_in(d).expect("OLLIE_BENCH_STATE_DIR"));
    let d = Dirs::new(
        tmp.path(),
        state_tmp.as_ref().map_or(tmp.path(), |t| t.path()),
    );

    // The scripts: every prompt consumes one block, for the warm-up and the measured rounds.
    let prompts = WARMUP_ROUNDS + rounds;
    let config = write_config(&d.tmp, prompts, k);
    let sock = d.tmp.join("ns").join("ollie");
    let stderr_path = d.tmp.join("olliesrv.stderr");
    let srv = start_olliesrv(&dir, &d, &config, &sock, &stderr_path);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let session = rt.block_on(open_session(&sock, &d.work));

    // The sandbox alone, as toolsrv sets it up for this session's agents.
    let policy = ollie_policy::shipped_profile(ollie_policy::DEFAULT_PROFILE).unwrap();
    let prepared = match ollie_sandbox::Prepared::new(&policy, &d.work, &d.home) {
        Ok(p) => p,
        Err(e) => {
            drop(srv);
            skip(&format!("the sandbox cannot be set up here: {e}"));
        }
    };
    let req = sandbox_request(&d, &session.id);
    let (mut ts, ts_client, ts_new) = second_toolsrv(&rt, &dir, &d, &session.id, &req);
    let layers = Layers {
        rt: &rt,
        ts_new: &ts_new,
        payload: Bytes::from(format!(
            "tool=execute_code\nargs={}\ncwd={}\n",
            serde_json::json!({"language": "sh", "code": "true"}),
            ollie_link::escape_value(&d.work.display().to_string())
        )),
        prepared: &prepared,
        req: &req,
    };

    println!(
        "tool round trip benchmark: {rounds} rounds of K={k} execute_code calls (sh -c true), \
         {} policy, replay backend",
        ollie_policy::DEFAULT_PROFILE
    );
    warm_up(&session, &layers, k);
    rt.block_on(check_tool_calls(&session.root, &stderr_path));

    let mut append = DurableAppend::open(&d.state_parent.join("fdatasync.probe"));
    let samples = measure(rounds, k, &session, &layers, &mut append);
    rt.block_on(check_stats(&session.root, k * prompts));
    report(k, &samples);

    let Session {
        client,
        root,
        tools,
        answer,
        ..
    } = session;
    drop(tools);
    drop(answer);
    drop(root);
    drop(client);
    drop(layers);
    drop(prepared);
    drop(ts_new);
    drop(ts_client);
    drop(rt);
    let _ = ts.child().wait();
    drop(srv);
}
