//! Crash consistency by the hundred: a scripted workload (agents created, prompts whose turns
//! run a sandboxed tool, plan and cfg writes, a bead mounted and unmounted in an agent's
//! namespace) runs against the real olliesrv while it, its
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
//! - a turn in flight at the kill is reported as interrupted in the agent's chat;
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
use ollie_testkit::client::{rdwr_text, read_text, write_text};
use ollie_testkit::model::Model;
use ollie_testkit::server::children_named;
use serde_json::Value;

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

#[derive(Debug, Default)]
struct Ledger {
    /// (session name, agent name) → what it was told.
    agents: BTreeMap<(String, String), AgentLedger>,
    /// Prompts counted so far (they are unique).
    prompts: u64,
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

struct World {
    srv: Srv,
    work: PathBuf,
    canary: PathBuf,
    model: Model,
    ledger: Arc<Mutex<Ledger>>,
    rng: Rng,
}

impl World {
    async fn new(seed: u64) -> World {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let work = std::fs::canonicalize(&work).unwrap();
        let canary = work.join("canary");
        // The pause after the append widens the window in which a kill finds the call done
        // but its result not yet recorded: the case in which a re-run would show.
        let file = canary.clone();
        let model = Model::start(Box::new(move |token| {
            format!("echo t{token} >> {}; sleep 0.02", file.display())
        }))
        .await;
        let beads = dir.path().join("beads");
        let config = format!("beads_dir = \"{}\"\n{}", beads.display(), model.config());
        let srv = Srv::start_with(dir, &config, |_| {});
        let w = World {
            srv,
            work,
            canary,
            model,
            ledger: Arc::default(),
            rng: Rng(seed),
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
            rdwr_text(&root, &format!("session/{s}/agent/new"), "name=a0")
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
                &format!("name={name}"),
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
            let lost = ["connection", "closed", "broken pipe", "reset", "eof"]
                .iter()
                .any(|w| e.to_lowercase().contains(w));
            assert!(lost, "a workload write was refused: {e}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(gap_ms))).await;
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
                    dir,
                },
            );
        }
    }
    out
}

/// Checks the stopped server's state against the ledger and settles the ledger (what was in
/// flight and landed is acknowledged from now on). Returns the agents whose turn was in
/// flight, with its prompt, for the after-restart check.
fn check_stopped(w: &World, round: u64) -> Vec<(PathBuf, String)> {
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
    in_flight
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
    let mut w = World::new(seed ^ if both { 0x9e37_79b9_7f4a_7c15 } else { 0 }).await;
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
        tokio::time::sleep(delay).await;
        let toolsrv = w.toolsrv_pids();
        if both {
            for p in &toolsrv {
                let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
            }
        }
        w.srv.kill9();
        let _ = within("the workload to notice the kill", load).await;
        wait_ended(&toolsrv, &format!("round {round}"));
        let in_flight = check_stopped(&w, round);
        w.srv.relaunch(|_| {});
        // Restore has run once the server answers.
        let (_c, root) = attach(&w.srv, &me()).await;
        read_text(&root, "aliases").await.unwrap();
        check_interrupted(&in_flight, round);
    }
    let l = w.ledger.lock().unwrap();
    let prompts: usize = l.agents.values().map(|a| a.acked.len()).sum();
    let interrupted: usize = l.agents.values().map(|a| a.interrupted.len()).sum();
    println!(
        "crash loop ({mode}): {n} kills survived; {} agents, {prompts} prompts acknowledged, {interrupted} turns interrupted, {} tool calls issued",
        l.agents.len(),
        w.model.issued()
    );
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
    let mut w = World::new(seed ^ 0xc2b2_ae3d_27d4_eb4f).await;
    let rng = Rng(w.rng.next() | 1);
    let load = tokio::spawn(workload(
        w.srv.p9addr(),
        Arc::clone(&w.ledger),
        rng,
        Instant::now() + Duration::from_secs(3600),
        // Slower than the turns go, so that the queues stay short.
        100,
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
    }
    load.abort();
    let _ = load.await;
    // Every queue drains: each acknowledged prompt's turn ends, with or without its tool.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut busy = Vec::new();
        for s in SESSIONS {
            let idx = read_text(&root, &format!("session/{s}/agent/idx"))
                .await
                .unwrap();
            for line in idx.lines() {
                let f: Vec<&str> = line.split('\t').collect();
                if f.get(2) != Some(&"idle") {
                    busy.push(format!("{s}: {line}"));
                }
            }
        }
        for (k, d) in read_state(&w.srv.state_dir()) {
            if !d.queue.is_empty() {
                busy.push(format!("{k:?}: queued {:?}", d.queue));
            }
        }
        if busy.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "turns never ended: {busy:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.srv.kill9();
    check_stopped(&w, n);
    let issued = w.model.issued();
    let ran = std::fs::read_to_string(&w.canary)
        .unwrap_or_default()
        .lines()
        .count();
    println!("crash loop (toolsrv): {n} kills survived; {issued} tool calls issued, {ran} ran");
}
