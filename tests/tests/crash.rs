//! Crash consistency by the hundred: a scripted workload (agents created, prompts whose turns
//! run a sandboxed tool, about a third of them asking for an escalation that an operator
//! stand-in approves or denies on the root `bypass/` files, plan and cfg writes, a bead
//! mounted and unmounted in an agent's namespace) runs against the real olliesrv while it, its
//! toolsrv processes, or both are killed with SIGKILL at random moments. After each kill an
//! oracle checks the state directory (olliesrv not running, so it cannot repair anything
//! first) and, after the restart, what the server reports:
//!
//! - every write acknowledged to the client is there: agents exist, each acknowledged prompt
//!   is exactly once in the queue, the turn in flight, or the history (or was reported as
//!   interrupted earlier), a plan, cfg value or bead mount is the last acknowledged one or one
//!   written after it whose reply was lost to the kill;
//! - no history line is torn except an interrupted last append, none is duplicated;
//! - no tool call ran twice: every call appends a token, issued once by the model stand-in
//!   (`ollie_testkit::model`), to a canary file in the workspace;
//! - an escalated call ran only if a verdict approving it was written; every acknowledged
//!   verdict is in the audit log once as taken, one lost in flight at most once, a refused
//!   one never (once as refused), one whose toolsrv was killed under the write once as
//!   unknown (it may have been taken, and its call run); a request pending when olliesrv alone died belongs to a turn in flight;
//! - a turn in flight at the kill is reported as interrupted in the agent's chat, and a
//!   request left pending is recorded as denied (`broker-gone`) once and cannot be approved;
//! - `olliesrv --check-state` finds no problem;
//! - every toolsrv of the killed server exits.
//!
//! Seeded: the seed is printed (`OLLIE_CRASH_SEED` replays it), and the number of kills per
//! mode is `OLLIE_CRASH_KILLS` (default: 200 of olliesrv, 100 of both, 16 of toolsrv, whose
//! restarts back off to 5 s; a number scales all three). The long run by hand:
//! `OLLIE_CRASH_KILLS=2000 cargo test -p ollie-tests --test crash -- --nocapture`.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use ollie_p9::Fid;
use ollie_p9::wire::om;
use ollie_testkit::client::{rdwr_text, read_text, write_text};
use ollie_testkit::model::Model;
use ollie_testkit::server::children_named;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// The ledger: what the client was told, and what was in flight when the server died.

/// A value written to a file whose write may or may not have been acknowledged.
#[derive(Debug, Default, Clone)]
struct Written {
    /// The last acknowledged value.
    acked: Option<String>,
    /// Values written after it whose replies were lost (at most the last can have landed
    /// after the acknowledged one, but any of them may be on disk).
    pending: Vec<String>,
}

impl Written {
    /// Checks `found` (None: the file is missing or empty) and settles it as acknowledged.
    fn settle(&mut self, found: Option<&str>, what: &str) {
        let ok = match found {
            None => self.acked.is_none(),
            Some(v) => self.acked.as_deref() == Some(v) || self.pending.iter().any(|p| p == v),
        };
        assert!(
            ok,
            "{what}: found {found:?}, acknowledged {:?}, in flight {:?}",
            self.acked, self.pending
        );
        self.acked = found.map(str::to_owned);
        self.pending.clear();
    }
}

#[derive(Debug, Default)]
struct AgentLedger {
    /// Whether `agent/new` was acknowledged (else it was in flight at a kill).
    created: bool,
    /// Prompts acknowledged, and prompts whose write was in flight.
    acked: BTreeSet<String>,
    pending: BTreeSet<String>,
    /// Prompts whose turn was in flight at a kill: reported as interrupted, never run.
    interrupted: BTreeSet<String>,
    plan: Written,
    temperature: Written,
    /// Whether the session's bead is mounted at the agent's `/ctx` (`yes`, `no`).
    ns: Written,
}

/// What became of a verdict the operator stand-in wrote to the root `bypass/resolve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Written; the reply was lost to a kill (it may or may not have been taken).
    InFlight,
    /// Acknowledged.
    Acked,
    /// Refused with an error reply (its toolsrv was killed before it got there).
    Refused,
    /// Its toolsrv was killed under the write: olliesrv says it may have been taken (and
    /// audits it as `decision-unknown`).
    Unknown,
    /// Was in flight at a kill and is not in the audit log: never recorded, so it ended as
    /// a request pending when the server died.
    Unrecorded,
}

/// A verdict written for request `id`.
#[derive(Debug, Clone)]
struct VerdictRec {
    /// The canary token of the call it answers.
    token: u64,
    approved: bool,
    answer: Answer,
}

#[derive(Debug, Default)]
struct Ledger {
    /// (session name, agent name) → what it was told.
    agents: BTreeMap<(String, String), AgentLedger>,
    /// Prompts counted so far (they are unique).
    prompts: u64,
    /// Request id → the verdict written for it.
    verdicts: BTreeMap<String, VerdictRec>,
    /// Requests of the audit log that had no end when the server died: each is recorded as
    /// denied (`broker-gone`) by the restart.
    gone_at_restart: u64,
}

// ---------------------------------------------------------------------------------------------
// A seeded generator (xorshift64*): the same seed gives the same workload decisions.

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Whether the tool call carrying `token` asks for an escalation (about one in three, chosen
/// by the seed), so that it waits in `bypass/pending` for the operator stand-in.
fn escalates(seed: u64, token: u64) -> bool {
    Rng((seed ^ token.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1).below(3) == 0
}

/// The reason an escalated call gives: it names the call's token.
fn reason(token: u64) -> String {
    format!("crash t{token}")
}

fn seed() -> u64 {
    std::env::var("OLLIE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        })
}

/// Kills for this mode: `OLLIE_CRASH_KILLS` scales the defaults (200 for olliesrv alone).
fn kills(default: u64) -> u64 {
    match std::env::var("OLLIE_CRASH_KILLS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        Some(n) => (n * default / 200).max(1),
        None => default,
    }
}

// ---------------------------------------------------------------------------------------------
// The world: a server, its model, its workspace.

const SESSIONS: [&str; 2] = ["s0", "s1"];
/// The most agents per session.
const MAX_AGENTS: u64 = 3;
/// The agent profile of every agent: the default one, allowed to ask for `net`.
const PROFILE: &str = "asker";

/// Which processes the loop kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Olliesrv,
    Both,
    Toolsrv,
}

struct World {
    srv: Srv,
    work: PathBuf,
    canary: PathBuf,
    model: Model,
    ledger: Arc<Mutex<Ledger>>,
    rng: Rng,
    /// The seed of [`escalates`].
    seed: u64,
    mode: Mode,
}

impl World {
    async fn new(seed: u64, mode: Mode) -> World {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let work = std::fs::canonicalize(&work).unwrap();
        let canary = work.join("canary");
        // The pause after the append widens the window in which a kill finds the call done
        // but its result not yet recorded: the case in which a re-run would show.
        let file = canary.clone();
        // Some calls ask for a grant the policy does not give (a TCP port they never use):
        // they wait for the operator stand-in's verdict, and run only if it approves.
        let model = Model::start_with_args(Box::new(move |token| {
            let code = format!("echo t{token} >> {}; sleep 0.02", file.display());
            let mut args = json!({"language": "bash", "code": code});
            if escalates(seed, token) {
                args["escalate"] = json!({"grants": ["net:9"], "reason": reason(token)});
            }
            args
        }))
        .await;
        let beads = dir.path().join("beads");
        let config = format!("beads_dir = \"{}\"\n{}", beads.display(), model.config());
        std::fs::create_dir(dir.path().join("agents")).unwrap();
        std::fs::write(
            dir.path().join("agents").join(format!("{PROFILE}.toml")),
            "escalations = [\"net\"]\n",
        )
        .unwrap();
        let srv = Srv::start_with(dir, &config, |_| {});
        let w = World {
            srv,
            work,
            canary,
            model,
            ledger: Arc::default(),
            rng: Rng(seed),
            seed,
            mode,
        };
        let (_c, root) = attach(&w.srv, &me()).await;
        for s in SESSIONS {
            rdwr_text(
                &root,
                "session/new",
                &format!("name={s} cwd={}", w.work.display()),
            )
            .await
            .unwrap();
            rdwr_text(
                &root,
                &format!("session/{s}/ns/ctl"),
                &format!("start crash-{s}"),
            )
            .await
            .unwrap();
            rdwr_text(
                &root,
                &format!("session/{s}/agent/new"),
                &format!("name=a0 profile={PROFILE}"),
            )
            .await
            .unwrap();
            w.ledger
                .lock()
                .unwrap()
                .agents
                .entry((s.to_owned(), "a0".to_owned()))
                .or_default()
                .created = true;
        }
        w
    }

    /// The pids of the server's toolsrv children.
    fn toolsrv_pids(&self) -> Vec<i32> {
        let pid = u32::try_from(self.srv.pid().as_raw()).unwrap();
        children_named(pid, "toolsrv")
            .into_iter()
            .map(|p| i32::try_from(p).unwrap())
            .collect()
    }
}

/// Whether `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

fn wait_ended(pids: &[i32], what: &str) {
    let deadline = Instant::now() + UP_TIMEOUT;
    while !pids.iter().all(|p| ended(*p)) {
        assert!(
            Instant::now() < deadline,
            "{what}: toolsrv {pids:?} still running {UP_TIMEOUT:?} after the kill"
        );
        std::thread::sleep(STEP);
    }
}

// ---------------------------------------------------------------------------------------------
// The workload: random writes until the connection dies (or `until`).

/// One step of the workload against `root`, recorded in the ledger before and after.
async fn step(root: &Fid, ledger: &Mutex<Ledger>, pick: u64, which: u64) -> Result<(), String> {
    let s = SESSIONS[(which % 2) as usize].to_owned();
    let (agents, n) = {
        let l = ledger.lock().unwrap();
        // Only agents known to exist (one whose creation was in flight at a kill is settled
        // by the next check).
        let names: Vec<String> = l
            .agents
            .iter()
            .filter(|((ss, _), e)| *ss == s && e.created)
            .map(|((_, a), _)| a.clone())
            .collect();
        (names, l.prompts)
    };
    let total = ledger
        .lock()
        .unwrap()
        .agents
        .keys()
        .filter(|(ss, _)| *ss == s)
        .count();
    let a = agents[(which / 2) as usize % agents.len()].clone();
    let key = (s.clone(), a.clone());
    let base = format!("session/{s}/agent/{a}");
    match pick % 10 {
        0 if (total as u64) < MAX_AGENTS => {
            let name = format!("a{total}");
            let k = (s.clone(), name.clone());
            ledger.lock().unwrap().agents.entry(k.clone()).or_default();
            rdwr_text(
                root,
                &format!("session/{s}/agent/new"),
                &format!("name={name} profile={PROFILE}"),
            )
            .await?;
            ledger.lock().unwrap().agents.get_mut(&k).unwrap().created = true;
        }
        0..=3 => {
            let p = format!("prompt {n}");
            {
                let mut l = ledger.lock().unwrap();
                l.prompts += 1;
                l.agents.get_mut(&key).unwrap().pending.insert(p.clone());
            }
            write_text(root, &format!("{base}/prompt"), &p).await?;
            let mut l = ledger.lock().unwrap();
            let e = l.agents.get_mut(&key).unwrap();
            e.pending.remove(&p);
            e.acked.insert(p);
        }
        4..=5 => {
            let v = format!("1. step {n}\n");
            let w: fn(&mut AgentLedger) -> &mut Written = |e| &mut e.plan;
            write_value(
                root,
                ledger,
                &key,
                w,
                &format!("{base}/plan"),
                &v,
                v.clone(),
            )
            .await?;
        }
        6..=7 => {
            let v = format!("0.{}", n % 9 + 1);
            let data = format!("temperature={v}");
            let w: fn(&mut AgentLedger) -> &mut Written = |e| &mut e.temperature;
            write_value(root, ledger, &key, w, &format!("{base}/cfg"), &data, v).await?;
        }
        _ => {
            // The session's bead at the agent's /ctx, or not: its next tool call then runs
            // with the union overlay (the one-shot sandbox).
            let mounted = ledger.lock().unwrap().agents[&key].ns.acked.as_deref() == Some("yes");
            let (cmd, v) = if mounted {
                (format!("unmount crash-{s} /ctx"), "no")
            } else {
                (format!("mount -a crash-{s} /ctx"), "yes")
            };
            let w: fn(&mut AgentLedger) -> &mut Written = |e| &mut e.ns;
            write_value(
                root,
                ledger,
                &key,
                w,
                &format!("{base}/ns/ctl"),
                &cmd,
                v.into(),
            )
            .await?;
        }
    }
    Ok(())
}

/// Writes `data` to `path`, with `value` recorded as in flight in the [`Written`] that `field`
/// picks of agent `key` before, and as acknowledged after the reply.
async fn write_value(
    root: &Fid,
    ledger: &Mutex<Ledger>,
    key: &(String, String),
    field: fn(&mut AgentLedger) -> &mut Written,
    path: &str,
    data: &str,
    value: String,
) -> Result<(), String> {
    {
        let mut l = ledger.lock().unwrap();
        l.prompts += 1;
        field(l.agents.get_mut(key).unwrap())
            .pending
            .push(value.clone());
    }
    write_text(root, path, data).await?;
    let mut l = ledger.lock().unwrap();
    let w = field(l.agents.get_mut(key).unwrap());
    w.pending.clear();
    w.acked = Some(value);
    Ok(())
}

/// Runs the workload on a fresh connection until a write fails (the server died) or `until`,
/// pausing up to `gap_ms` between steps.
async fn workload(
    srv_addr: ollie_p9::dial::Addr,
    ledger: Arc<Mutex<Ledger>>,
    mut rng: Rng,
    until: Instant,
    gap_ms: u64,
) {
    let Ok(client) = ollie_p9::Client::dial(&srv_addr).await else {
        return;
    };
    let Ok(root) = client.attach(None, &me(), "").await else {
        return;
    };
    while Instant::now() < until {
        let (pick, which) = (rng.below(10), rng.below(64));
        if let Err(e) = step(&root, &ledger, pick, which).await {
            // The server died under it; any other refusal is a bug of the server or the test.
            assert!(lost(&e), "a workload write was refused: {e}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(gap_ms))).await;
    }
}

/// Whether error `e` says the connection to the server is gone (it was killed).
fn lost(e: &str) -> bool {
    ["connection", "closed", "broken pipe", "reset", "eof"]
        .iter()
        .any(|w| e.to_lowercase().contains(w))
}

/// The operator stand-in, on its own connection until it dies: reads every request on the
/// root `bypass/pending` and answers each on the root `bypass/resolve`, approving two in
/// three (by `rng`) and denying the rest, with the verdict recorded in the ledger before the
/// write and its outcome after. A refusal is a failure unless toolsrv processes are killed
/// (`mode`: a request of a killed toolsrv is gone). When only toolsrv is killed, olliesrv
/// lives on, so every error is a refusal, even one that names a closed connection (the link
/// to the killed toolsrv).
async fn operator(
    srv_addr: ollie_p9::dial::Addr,
    ledger: Arc<Mutex<Ledger>>,
    mut rng: Rng,
    mode: Mode,
) {
    let Ok(client) = ollie_p9::Client::dial(&srv_addr).await else {
        return;
    };
    let Ok(root) = client.attach(None, &me(), "").await else {
        return;
    };
    let Ok(mut pending) = root.walk_path("bypass/pending").await else {
        return;
    };
    if pending.open(om::OREAD).await.is_err() {
        return;
    }
    loop {
        // Blocks until a request is shown, or the server dies.
        let Ok(b) = pending.read(0, 64 * 1024).await else {
            return;
        };
        assert!(!b.is_empty(), "bypass/pending returned end of file");
        let req: Value = serde_json::from_slice(&b)
            .unwrap_or_else(|e| panic!("bypass/pending: {e}: {}", String::from_utf8_lossy(&b)));
        let id = req["id"].as_str().unwrap().to_owned();
        let token: u64 = req["reason"]
            .as_str()
            .and_then(|r| r.strip_prefix("crash t"))
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("a request the workload never made: {req}"));
        // What waits for the verdict is exactly the call the model asked for.
        assert!(
            req["argv"][2]
                .as_str()
                .is_some_and(|c| c.starts_with(&format!("echo t{token} >> "))),
            "request {id} is not bound to the call of t{token}: {req}"
        );
        assert_eq!(req["grants"], json!(["net:9"]), "{req}");
        let approved = rng.below(3) != 0;
        let verdict = if approved {
            json!({"id": id, "approved": true})
        } else {
            json!({"id": id, "error": format!("not t{token}")})
        };
        let fresh = ledger
            .lock()
            .unwrap()
            .verdicts
            .insert(
                id.clone(),
                VerdictRec {
                    token,
                    approved,
                    answer: Answer::InFlight,
                },
            )
            .is_none();
        assert!(fresh, "request {id} was shown twice");
        let answer = match write_text(&root, "bypass/resolve", &verdict.to_string()).await {
            Ok(()) => Answer::Acked,
            Err(e) if mode != Mode::Toolsrv && lost(&e) => return,
            Err(e) => {
                assert!(mode != Mode::Olliesrv, "a verdict was refused: {e}");
                if e.contains("the verdict may have been taken") {
                    Answer::Unknown
                } else {
                    Answer::Refused
                }
            }
        };
        ledger.lock().unwrap().verdicts.get_mut(&id).unwrap().answer = answer;
    }
}

// ---------------------------------------------------------------------------------------------
// The oracle.

/// What one agent's directory holds.
#[derive(Debug)]
struct OnDisk {
    queue: Vec<String>,
    in_turn: Option<String>,
    temperature: Option<String>,
    plan: Option<String>,
    /// `yes` if the agent's namespace has a mount at `/ctx`, else `no`.
    ctx: String,
    /// The user messages of the history, in order.
    user: Vec<String>,
    dir: PathBuf,
    /// The agent's id (its directory's name).
    id: String,
}

/// What the audit log (`<state>/audit.jsonl`) holds.
#[derive(Debug, Default)]
struct Audit {
    /// Request id → (its session's id, its agent's id, its call's token), once per request.
    requests: BTreeMap<String, (String, String, u64)>,
    /// Request id → the verdicts recorded as taken (`decision`: `approved` or `denied`).
    decisions: BTreeMap<String, Vec<String>>,
    /// Every `decision-refused` line.
    refused: Vec<Value>,
    /// Every `decision-unknown` line.
    unknown: Vec<Value>,
    /// Request id → the events that ended it (`decision`, `expired`, `withdrawn`,
    /// `denied`, `broker-gone`), in order.
    ended: BTreeMap<String, Vec<String>>,
}

impl Audit {
    /// Requests with no end.
    fn open(&self) -> BTreeSet<String> {
        self.requests
            .keys()
            .filter(|id| !self.ended.contains_key(*id))
            .cloned()
            .collect()
    }

    /// How many `broker-gone` lines request `id` has.
    fn gone(&self, id: &str) -> usize {
        self.ended
            .get(id)
            .map_or(0, |e| e.iter().filter(|k| *k == "broker-gone").count())
    }
}

/// Reads the audit log: every line whole (one JSON object with an `event`) but a torn last
/// one, which only a kill in the middle of its append can leave.
fn read_audit(state: &Path, round: u64, seed: u64) -> Audit {
    let data = std::fs::read(state.join("audit.jsonl")).unwrap_or_default();
    let whole = data.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let mut a = Audit::default();
    for (n, line) in data[..whole].split_inclusive(|b| *b == b'\n').enumerate() {
        let line = &line[..line.len() - 1];
        let v: Value = serde_json::from_slice(line).unwrap_or_else(|e| {
            panic!(
                "round {round}: audit line {} is torn or not JSON ({e}): {}",
                n + 1,
                String::from_utf8_lossy(line)
            )
        });
        let event = v["event"]
            .as_str()
            .unwrap_or_else(|| panic!("round {round}: audit line {} has no event: {v}", n + 1));
        let id = v["id"].as_str().unwrap_or("").to_owned();
        match event {
            "request" => {
                let token = v["reason"]
                    .as_str()
                    .and_then(|r| r.strip_prefix("crash t"))
                    .and_then(|t| t.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("round {round}: a request nobody made: {v}"));
                assert!(
                    escalates(seed, token),
                    "round {round}: t{token} asked for no escalation, yet: {v}"
                );
                let was = a.requests.insert(
                    id.clone(),
                    (
                        v["session"].as_str().unwrap_or("").to_owned(),
                        v["agent"].as_str().unwrap_or("").to_owned(),
                        token,
                    ),
                );
                assert!(was.is_none(), "round {round}: request {id} audited twice");
            }
            "decision-refused" => a.refused.push(v.clone()),
            "decision-unknown" => a.unknown.push(v.clone()),
            _ => {}
        }
        if event == "decision" {
            a.decisions
                .entry(id.clone())
                .or_default()
                .push(v["verdict"].as_str().unwrap_or("").to_owned());
        }
        if ["decision", "expired", "withdrawn", "denied", "broker-gone"].contains(&event) {
            a.ended.entry(id).or_default().push(event.to_owned());
        }
    }
    a
}

/// (session name, agent name) → what is on disk.
fn read_state(state: &Path) -> BTreeMap<(String, String), OnDisk> {
    let mut out = BTreeMap::new();
    let Ok(sessions) = std::fs::read_dir(state.join("sessions")) else {
        return out;
    };
    // Hidden entries are leftovers of interrupted creations and removals (check-state has
    // judged them): they are not sessions or agents.
    let visible = |e: &std::fs::DirEntry| !e.file_name().to_string_lossy().starts_with('.');
    for s in sessions.flatten().filter(visible) {
        let sdir = s.path();
        let Ok(rec) = std::fs::read(sdir.join("session.json")) else {
            continue;
        };
        let srec: Value = serde_json::from_slice(&rec).unwrap();
        let sname = srec["name"].as_str().unwrap().to_owned();
        let Ok(agents) = std::fs::read_dir(sdir.join("agents")) else {
            continue;
        };
        for a in agents.flatten().filter(visible) {
            let dir = a.path();
            let Ok(rec) = std::fs::read(dir.join("agent.json")) else {
                continue;
            };
            let arec: Value = serde_json::from_slice(&rec).unwrap();
            let strings = |v: &Value| -> Vec<String> {
                v.as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let history = std::fs::read(dir.join("history.jsonl")).unwrap_or_default();
            let whole = history
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1);
            let user = history[..whole]
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice::<Value>(l).unwrap())
                .filter(|v| v["role"] == "user")
                .map(|v| v["content"].as_str().unwrap_or("").to_owned())
                .collect();
            let plan = std::fs::read_to_string(dir.join("plan"))
                .ok()
                .filter(|p| !p.is_empty());
            let ns: Value = std::fs::read(dir.join("ns.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or(Value::Null);
            let mounted = ns["mounts"]
                .as_array()
                .is_some_and(|m| m.iter().any(|x| x["point"] == "/ctx"));
            out.insert(
                (sname.clone(), arec["name"].as_str().unwrap().to_owned()),
                OnDisk {
                    queue: strings(&arec["queue"]),
                    in_turn: arec["in_turn"].as_str().map(str::to_owned),
                    temperature: arec["cfg"]["temperature"].as_str().map(str::to_owned),
                    plan,
                    ctx: if mounted { "yes" } else { "no" }.to_owned(),
                    user,
                    id: dir.file_name().unwrap().to_string_lossy().into_owned(),
                    dir,
                },
            );
        }
    }
    out
}

/// What the after-restart checks need from [`check_stopped`].
struct Stopped {
    /// The agents whose turn was in flight, with its prompt.
    in_flight: Vec<(PathBuf, String)>,
    /// The requests with no end in the audit log (pending when the server died).
    open: BTreeSet<String>,
}

/// Checks the stopped server's state against the ledger and settles the ledger (what was in
/// flight and landed is acknowledged from now on). Returns what the after-restart checks
/// need.
fn check_stopped(w: &World, round: u64) -> Stopped {
    let state = w.srv.state_dir();
    let out = run(
        std::process::Command::new(bin("olliesrv"))
            .arg("--check-state")
            .arg(&state),
        b"",
    );
    assert!(
        out.status.success(),
        "round {round}: check-state failed:\n{}",
        text(&out.stdout)
    );
    let disk = read_state(&state);
    let mut l = w.ledger.lock().unwrap();
    let mut in_flight = Vec::new();
    // An agent whose creation was in flight and did not land was never made.
    l.agents
        .retain(|key, e| e.created || disk.contains_key(key));
    for (key, e) in &mut l.agents {
        let Some(d) = disk.get(key) else {
            panic!(
                "round {round}: acknowledged agent {key:?} is missing; on disk: {:?}",
                disk.keys().collect::<Vec<_>>()
            );
        };
        e.created = true;
        // A prompt is queued or in the history (where the turn in flight has put it, or is
        // about to), once.
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for p in d.user.iter().chain(&d.queue) {
            *seen.entry(p.as_str()).or_default() += 1;
        }
        if let Some(p) = &d.in_turn {
            assert!(
                !d.queue.contains(p),
                "round {round}: {key:?}: prompt {p:?} is both queued and in flight"
            );
            seen.entry(p.as_str()).or_insert(1);
        }
        for (p, n) in &seen {
            assert!(
                *n == 1,
                "round {round}: {key:?}: prompt {p:?} is there {n} times; history {:?}, queue {:?}, in flight {:?}",
                d.user,
                d.queue,
                d.in_turn
            );
            assert!(
                e.acked.contains(*p) || e.pending.contains(*p),
                "round {round}: {key:?}: prompt {p:?} was never written"
            );
        }
        // A turn reported as interrupted never runs again.
        for p in &e.interrupted {
            assert!(
                !d.queue.contains(p) && d.in_turn.as_ref() != Some(p),
                "round {round}: {key:?}: interrupted prompt {p:?} is back; queue {:?}, in flight {:?}",
                d.queue,
                d.in_turn
            );
        }
        for p in &e.acked {
            assert!(
                seen.contains_key(p.as_str()) || e.interrupted.contains(p),
                "round {round}: {key:?}: acknowledged prompt {p:?} is lost; history {:?}, queue {:?}",
                d.user,
                d.queue
            );
        }
        let landed: Vec<String> = e
            .pending
            .iter()
            .filter(|p| seen.contains_key(p.as_str()))
            .cloned()
            .collect();
        e.acked.extend(landed);
        e.pending.clear();
        e.plan
            .settle(d.plan.as_deref(), &format!("round {round}: {key:?} plan"));
        e.temperature.settle(
            d.temperature.as_deref(),
            &format!("round {round}: {key:?} temperature"),
        );
        e.ns.acked.get_or_insert_with(|| "no".to_owned());
        e.ns.settle(
            Some(&d.ctx),
            &format!("round {round}: {key:?} /ctx mounted"),
        );
        if let Some(p) = &d.in_turn {
            e.interrupted.insert(p.clone());
            in_flight.push((d.dir.clone(), p.clone()));
        }
    }
    // Every tool call ran at most once.
    let canary = std::fs::read_to_string(&w.canary).unwrap_or_default();
    let issued = w.model.issued();
    let mut tokens = BTreeSet::new();
    for line in canary.lines() {
        let n: u64 = line
            .strip_prefix('t')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("round {round}: canary line {line:?}"));
        assert!(
            n >= 1 && n <= issued,
            "round {round}: token {n} never issued"
        );
        assert!(tokens.insert(n), "round {round}: tool call t{n} ran twice");
    }
    // The approvals. Every decision in the audit log is a verdict the operator wrote, on a
    // request audited before it, taken once (ids are single use).
    let audit = read_audit(&state, round, w.seed);
    for (id, taken) in &audit.decisions {
        let v = l
            .verdicts
            .get(id)
            .unwrap_or_else(|| panic!("round {round}: a decision on {id} nobody wrote: {taken:?}"));
        let want = if v.approved { "approved" } else { "denied" };
        assert!(
            taken == &[want],
            "round {round}: request {id} (t{}): decisions {taken:?}, written {want}",
            v.token
        );
        assert!(
            audit.requests.contains_key(id),
            "round {round}: a decision on {id} without its request"
        );
    }
    // Every acknowledged verdict is in the audit log (fdatasync'd before the reply), one in
    // flight at the kill at most once, a refused one never as taken but as refused, once.
    let mut answered = BTreeSet::new();
    for (id, v) in &mut l.verdicts {
        assert!(
            answered.insert(v.token),
            "round {round}: the call of t{} was asked about twice",
            v.token
        );
        let taken = audit.decisions.get(id).map_or(0, Vec::len);
        match v.answer {
            Answer::Acked => assert!(
                taken == 1,
                "round {round}: the acknowledged verdict on {id} (t{}, approved: {}) is not in the audit log",
                v.token,
                v.approved
            ),
            Answer::InFlight if taken == 1 => v.answer = Answer::Acked,
            Answer::InFlight => v.answer = Answer::Unrecorded,
            Answer::Refused | Answer::Unrecorded | Answer::Unknown => {
                assert!(
                    taken == 0,
                    "round {round}: the verdict on {id} was {:?}, yet audited as taken",
                    v.answer
                );
            }
        }
        let (lines, kind) = match v.answer {
            Answer::Refused => (&audit.refused, "refused"),
            Answer::Unknown => (&audit.unknown, "unknown"),
            _ => continue,
        };
        let n = lines.iter().filter(|r| r["id"] == id.as_str()).count();
        assert!(
            n == 1,
            "round {round}: the {kind} verdict on {id} is audited {n} times as {kind}"
        );
    }
    // An escalated call runs only if approved: never when denied, or asked and unanswered.
    for n in &tokens {
        if escalates(w.seed, *n) {
            let approved = l
                .verdicts
                .values()
                .any(|v| v.token == *n && v.approved && v.answer != Answer::Refused);
            assert!(
                approved,
                "round {round}: t{n} asked for an escalation and ran without an approval; verdicts: {:?}",
                l.verdicts
                    .values()
                    .filter(|v| v.token == *n)
                    .collect::<Vec<_>>()
            );
        }
    }
    // A request nobody answered, pending when olliesrv alone was killed, is the call of a
    // turn in flight (reported as interrupted after the restart: `check_interrupted`).
    let open = audit.open();
    if w.mode == Mode::Olliesrv {
        let by_id: BTreeMap<&str, &OnDisk> = disk.values().map(|d| (d.id.as_str(), d)).collect();
        for id in &open {
            if l.verdicts.contains_key(id) {
                continue;
            }
            let (_, agent, token) = &audit.requests[id];
            let d = by_id.get(agent.as_str()).unwrap_or_else(|| {
                panic!("round {round}: request {id} (t{token}) of an agent {agent} not on disk")
            });
            assert!(
                d.in_turn.is_some(),
                "round {round}: request {id} (t{token}) was pending, but {} had no turn in flight",
                d.dir.display()
            );
        }
    }
    Stopped { in_flight, open }
}

/// After a restart: a request pending when the server died is recorded as denied
/// (`broker-gone`, once) and nothing can approve it any more.
async fn check_gone(w: &World, root: &Fid, open: &BTreeSet<String>, round: u64) {
    let audit = read_audit(&w.srv.state_dir(), round, w.seed);
    for id in open {
        assert!(
            audit.gone(id) == 1 && !audit.decisions.contains_key(id),
            "round {round}: request {id} was pending when olliesrv died; after the restart it ended with {:?} (want one broker-gone)",
            audit.ended.get(id)
        );
        let e = write_text(
            root,
            "bypass/resolve",
            &json!({"id": id, "approved": true}).to_string(),
        )
        .await
        .expect_err("a request pending when olliesrv died was approved after the restart");
        assert!(
            e.contains("no request"),
            "round {round}: approving {id} after the restart: {e}"
        );
    }
    w.ledger.lock().unwrap().gone_at_restart += open.len() as u64;
}

/// After a restart: each turn that was in flight is reported as interrupted in its chat.
fn check_interrupted(in_flight: &[(PathBuf, String)], round: u64) {
    for (dir, p) in in_flight {
        let chat = std::fs::read_to_string(dir.join("chat.raw")).unwrap_or_default();
        let want = format!("interrupted: olliesrv stopped during the turn for {p:?}");
        assert!(
            chat.contains(&want),
            "round {round}: {}: no {want:?} in the chat",
            dir.display()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The loops.

/// Kills olliesrv (and, with `both`, its toolsrv processes first) `n` times at random moments.
async fn server_kills(n: u64, both: bool, seed: u64) {
    let mode = if both { "olliesrv+toolsrv" } else { "olliesrv" };
    println!("crash loop ({mode}): seed={seed} kills={n} (OLLIE_CRASH_SEED, OLLIE_CRASH_KILLS)");
    // Each loop its own decisions from the one printed seed.
    let mut w = World::new(
        seed ^ if both { 0x9e37_79b9_7f4a_7c15 } else { 0 },
        if both { Mode::Both } else { Mode::Olliesrv },
    )
    .await;
    for round in 1..=n {
        let delay = Duration::from_millis(w.rng.below(500));
        let rng = Rng(w.rng.next() | 1);
        let load = tokio::spawn(workload(
            w.srv.p9addr(),
            Arc::clone(&w.ledger),
            rng,
            Instant::now() + UP_TIMEOUT,
            20,
        ));
        let op = tokio::spawn(operator(
            w.srv.p9addr(),
            Arc::clone(&w.ledger),
            Rng(w.rng.next() | 1),
            w.mode,
        ));
        tokio::time::sleep(delay).await;
        let toolsrv = w.toolsrv_pids();
        if both {
            for p in &toolsrv {
                let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
            }
        }
        w.srv.kill9();
        // A failed assertion in either task fails the test here.
        within("the workload to notice the kill", load)
            .await
            .unwrap();
        within("the operator to notice the kill", op).await.unwrap();
        wait_ended(&toolsrv, &format!("round {round}"));
        let stopped = check_stopped(&w, round);
        w.srv.relaunch(|_| {});
        // Restore has run once the server answers.
        let (_c, root) = attach(&w.srv, &me()).await;
        read_text(&root, "aliases").await.unwrap();
        check_interrupted(&stopped.in_flight, round);
        check_gone(&w, &root, &stopped.open, round).await;
    }
    let l = w.ledger.lock().unwrap();
    let prompts: usize = l.agents.values().map(|a| a.acked.len()).sum();
    let interrupted: usize = l.agents.values().map(|a| a.interrupted.len()).sum();
    println!(
        "crash loop ({mode}): {n} kills survived; {} agents, {prompts} prompts acknowledged, {interrupted} turns interrupted, {} tool calls issued; {}",
        l.agents.len(),
        w.model.issued(),
        verdicts(&l)
    );
}

/// The verdicts' figures for the summary line.
fn verdicts(l: &Ledger) -> String {
    let count = |approved: bool, answer: Answer| {
        l.verdicts
            .values()
            .filter(|v| v.approved == approved && v.answer == answer)
            .count()
    };
    format!(
        "{} approvals and {} denials acknowledged, {} verdicts lost in flight, {} refused, {} unknown, {} requests pending at a kill recorded as broker-gone at the restart",
        count(true, Answer::Acked),
        count(false, Answer::Acked),
        count(true, Answer::Unrecorded) + count(false, Answer::Unrecorded),
        count(true, Answer::Refused) + count(false, Answer::Refused),
        count(true, Answer::Unknown) + count(false, Answer::Unknown),
        l.gone_at_restart
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn olliesrv_killed_at_random_moments_loses_nothing_acknowledged() {
    server_kills(kills(200), false, seed()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn olliesrv_and_toolsrv_killed_together_lose_nothing_acknowledged() {
    server_kills(kills(100), true, seed()).await;
}

/// Kills a random session's toolsrv `n` times while the workload runs; the server stays up.
/// Every kill is followed by a restarted toolsrv, no tool call runs twice, and at the end
/// every acknowledged prompt's turn has ended (its queue drains).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolsrv_killed_at_random_moments_runs_no_call_twice() {
    let seed = seed();
    // The supervisor's restart backoff doubles to 5 s while toolsrv keeps dying, so each
    // kill past the sixth of a session costs 5 s: 16 by default.
    let n = kills(16);
    println!("crash loop (toolsrv): seed={seed} kills={n} (OLLIE_CRASH_SEED, OLLIE_CRASH_KILLS)");
    let mut w = World::new(seed ^ 0xc2b2_ae3d_27d4_eb4f, Mode::Toolsrv).await;
    let rng = Rng(w.rng.next() | 1);
    let load = tokio::spawn(workload(
        w.srv.p9addr(),
        Arc::clone(&w.ledger),
        rng,
        Instant::now() + Duration::from_secs(3600),
        // Slower than the turns go, so that the queues stay short.
        100,
    ));
    let op = tokio::spawn(operator(
        w.srv.p9addr(),
        Arc::clone(&w.ledger),
        Rng(w.rng.next() | 1),
        Mode::Toolsrv,
    ));
    let (_c, root) = attach(&w.srv, &me()).await;
    for round in 1..=n {
        tokio::time::sleep(Duration::from_millis(w.rng.below(150))).await;
        // Wait for both toolsrv processes (one may still be restarting from the last kill).
        let deadline = Instant::now() + UP_TIMEOUT;
        let pids = loop {
            let p = w.toolsrv_pids();
            if p.len() == SESSIONS.len() {
                break p;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: toolsrv not restarted: {p:?}"
            );
            tokio::time::sleep(STEP).await;
        };
        let victim = pids[w.rng.below(pids.len() as u64) as usize];
        kill(Pid::from_raw(victim), Signal::SIGKILL).unwrap();
        wait_ended(&[victim], &format!("round {round}"));
        assert!(!load.is_finished(), "round {round}: the workload stopped");
        assert!(!op.is_finished(), "round {round}: the operator stopped");
    }
    load.abort();
    let _ = load.await;
    // Every queue drains: each acknowledged prompt's turn ends, with or without its tool
    // (the operator answering what asks), and every request has an end in the audit log.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut busy = Vec::new();
        let mut errored = Vec::new();
        for s in SESSIONS {
            let idx = read_text(&root, &format!("session/{s}/agent/idx"))
                .await
                .unwrap();
            for line in idx.lines() {
                let f: Vec<&str> = line.split('\t').collect();
                if f.get(2) != Some(&"idle") {
                    busy.push(format!("{s}: {line}"));
                }
                if f.get(2) == Some(&"error") {
                    errored.push(format!("session/{s}/agent/{}/chat", f[0]));
                }
            }
        }
        for (k, d) in read_state(&w.srv.state_dir()) {
            if !d.queue.is_empty() {
                busy.push(format!("{k:?}: queued {:?}", d.queue));
            }
        }
        let open = read_audit(&w.srv.state_dir(), n, w.seed).open();
        if !open.is_empty() {
            busy.push(format!("requests with no end in the audit log: {open:?}"));
        }
        if busy.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            // An agent at rest in error: its chat says why.
            for chat in errored {
                let text = read_text(&root, &chat).await.unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(6).collect();
                busy.push(format!("{chat}, last lines first: {}", tail.join(" | ")));
            }
            panic!("turns never ended: {busy:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!op.is_finished(), "the operator stopped");
    op.abort();
    let _ = op.await;
    w.srv.kill9();
    check_stopped(&w, n);
    let issued = w.model.issued();
    let ran = std::fs::read_to_string(&w.canary)
        .unwrap_or_default()
        .lines()
        .count();
    println!(
        "crash loop (toolsrv): {n} kills survived; {issued} tool calls issued, {ran} ran; {}",
        verdicts(&w.ledger.lock().unwrap())
    );
}
