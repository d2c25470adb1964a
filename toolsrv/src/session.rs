//! The session toolsrv serves: its policies, one prepared sandbox per policy (and per policy
//! and set of union points), the agents' tool sets and policies, and the process table.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use ollie_policy::{Network, PathTemplate, Policy};
use ollie_sandbox::{Prepared, RunRequest, SandboxError, Stream};

use crate::auth::Identity;
use crate::boot::Bootstrap;
use crate::payload::Payload;
use crate::procs::{NewProc, Proc, Procs, finish_of, not_run};
use crate::tools::{self, Invocation, ToolEnv};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An agent's settings.
#[derive(Debug, Clone)]
struct AgentCfg {
    tools: BTreeSet<String>,
    policy: String,
    /// The escalation kinds (`net`, `read`, `write`, `unsandboxed`) the agent's profile lets
    /// it ask for; `None`: whatever its policy allows (an agent olliesrv did not configure).
    escalations: Option<BTreeSet<String>>,
    /// The agent's bead namespace as overlay mounts (olliesrv's `unions AGENT JSON`): its
    /// ordinary runs get them, in the prepared sandbox of its policy and points (each call
    /// mounts its own overlays), one at a time per agent (two overlays on one upper layer
    /// are undefined; a background run holds the agent's next runs until it ends).
    unions: Vec<ollie_sandbox::UnionMount>,
}

/// One point of `unions AGENT JSON`: the layers of an overlay at `point`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UnionSpec {
    point: PathBuf,
    lowers: Vec<PathBuf>,
    upper: PathBuf,
    work: PathBuf,
}

/// At most this many points, and lower layers per point, in `unions`.
const MAX_UNIONS: usize = 16;
const MAX_LOWERS: usize = 256;

/// Parses the JSON of `unions AGENT JSON` (`none` clears).
fn parse_unions(json: &str) -> Result<Vec<ollie_sandbox::UnionMount>, String> {
    if json.trim() == "none" {
        return Ok(Vec::new());
    }
    let specs: Vec<UnionSpec> = serde_json::from_str(json)
        .map_err(|e| format!("unions: {}", e.to_string().escape_debug()))?;
    if specs.len() > MAX_UNIONS {
        return Err(format!("unions: at most {MAX_UNIONS} points"));
    }
    // The points' shape now, so a bad one is the operator's error here, not the agent's at
    // its next run (the layers are checked at every run: they change).
    let points: Vec<PathBuf> = specs.iter().map(|u| u.point.clone()).collect();
    ollie_sandbox::check_union_points(&points)
        .map_err(|e| format!("unions: {}", crate::error_chain(&e)))?;
    specs
        .into_iter()
        .map(|u| {
            if u.lowers.len() > MAX_LOWERS {
                return Err(format!("unions: at most {MAX_LOWERS} layers per point"));
            }
            let all = u.lowers.iter().chain([&u.upper, &u.work]);
            if let Some(p) = all.into_iter().find(|p| !p.is_absolute()) {
                return Err(format!("unions: {} is not an absolute path", p.display()));
            }
            Ok(ollie_sandbox::UnionMount {
                point: u.point,
                lowers: u.lowers,
                upper: u.upper,
                work: u.work,
            })
        })
        .collect()
}

/// The longest a closing link waits for tools to end after their SIGTERM (the shipped
/// policies' grace period is 2 s; olliesrv allows toolsrv 6 s before it kills it).
pub const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(4);

/// Everything toolsrv knows about its session.
#[derive(Debug)]
pub struct Session {
    pub id: String,
    pub workdir: PathBuf,
    pub home: PathBuf,
    pub policies: BTreeMap<String, Policy>,
    pub default_policy: String,
    pub env: Vec<(OsString, OsString)>,
    pub tools: ToolEnv,
    pub procs: Procs,
    /// olliesrv's own secret locations (the boot message's `hidden`: its state directory,
    /// configuration files, sockets, other instances' state directories): hidden from every
    /// tool and secret in every other way (`ResolveContext::extra_secrets`).
    pub hidden: Vec<PathBuf>,
    /// Escalation requests waiting for the operator.
    pub broker: Arc<crate::broker::Broker>,
    agents: Mutex<HashMap<String, AgentCfg>>,
    /// Prepared sandboxes by policy name and union points (sorted; none for most).
    prepared: tokio::sync::Mutex<HashMap<PreparedKey, Arc<Prepared>>>,
    /// Per agent, held by its runs with union mounts (see [`AgentCfg::unions`]).
    union_runs: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The session held still while an escalation is decided and its approved run runs.
    quiesce: Arc<crate::quiesce::Quiesce>,
    /// olliesrv holds the other sessions in the same trees for this session's escalations
    /// (the boot message's `hold_peers`).
    hold_peers: bool,
    /// Holds this session keeps for other sessions' escalations (`ctl hold ID TREES`), by id.
    peer_holds: Mutex<HashMap<String, crate::quiesce::Ticket>>,
    /// This session's escalations waiting for olliesrv to say the other sessions are held
    /// (`ctl held ID` sends true, `ctl unheld ID` false), by hold id.
    peer_waits: Mutex<HashMap<String, tokio::sync::oneshot::Sender<bool>>>,
    /// The operator's settings for the proxy of runs under `network.mode = "proxy"`.
    egress: crate::egress::Egress,
}

/// A hold id: 32 lowercase hex digits.
fn valid_hold_id(id: &str) -> Result<(), String> {
    if id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not a hold id (32 lowercase hex digits)",
            crate::payload::clip(id)
        ))
    }
}

/// How long an escalation waits for olliesrv to hold the other sessions working in its trees
/// (each of them waits up to [`crate::quiesce::FREEZE_WAIT`] for its own calls to stop).
const PEER_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Logs `release` for a hold of the other sessions when the escalation that asked it is over.
#[derive(Debug)]
struct PeerHold {
    id: String,
    session: Arc<Session>,
}

impl Drop for PeerHold {
    fn drop(&mut self) {
        let mut f = serde_json::Map::new();
        f.insert("hold".into(), self.id.clone().into());
        self.session.broker.log("release", f);
    }
}

/// A prepared sandbox's key: the policy's name and the union points its calls mount.
type PreparedKey = (String, Vec<PathBuf>);

/// An escalated call, decided as needing the operator; bound (hashing files, so off the
/// 9P task) when its run starts.
struct Escalation {
    owner: String,
    tool: String,
    /// The grants, spelled as the agent asked.
    grants: Vec<String>,
    reason: String,
    argv: Vec<OsString>,
    cwd: PathBuf,
    env: BTreeMap<String, String>,
    /// The agent's policy widened by exactly the grants asked for.
    widened: Policy,
}

/// Runs `run` (a sandbox run) on a blocking thread, its output streaming into `proc`'s.
async fn on_runner(
    proc: &Arc<Proc>,
    run: impl FnOnce(&mut dyn FnMut(Stream, &[u8])) -> Result<ollie_sandbox::RunOutput, SandboxError>
    + Send
    + 'static,
) -> Result<ollie_sandbox::RunOutput, SandboxError> {
    let pr = Arc::clone(proc);
    tokio::task::spawn_blocking(move || {
        run(&mut |_s: Stream, chunk: &[u8]| {
            pr.out
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(chunk);
        })
    })
    .await
    .unwrap_or_else(|e| {
        Err(SandboxError::InvalidRequest {
            reason: format!("the runner thread failed: {e}"),
        })
    })
}

/// A binding part as JSON for the request (plain data; a path that is not UTF-8 shows as
/// null).
fn to_json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Arguments as (lossy) UTF-8, for logs.
fn lossy(argv: &[OsString]) -> Vec<String> {
    argv.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// The `escalate` argument: exactly `{"grants": [..], "reason": ".."}`.
fn parse_escalate(v: &serde_json::Value) -> Result<ollie_policy::EscalationRequest, String> {
    const USAGE: &str = "escalate must be {\"grants\": [\"net:PORT\" | \"net:DOMAIN\" | \"read:PATH\" | \"write:PATH\" | \"unsandboxed\", …], \"reason\": \"why\"}";
    let o = v.as_object().ok_or_else(|| USAGE.to_owned())?;
    if let Some(k) = o.keys().find(|k| *k != "grants" && *k != "reason") {
        return Err(format!(
            "escalate: unknown key {:?} ({USAGE})",
            crate::payload::clip(k)
        ));
    }
    let grants = o
        .get("grants")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| format!("escalate: grants missing ({USAGE})"))?;
    if grants.is_empty() || grants.len() > 8 {
        return Err("escalate: give 1 to 8 grants".into());
    }
    let mut out = Vec::new();
    for g in grants {
        let s = g
            .as_str()
            .ok_or_else(|| format!("escalate: every grant is a string ({USAGE})"))?;
        let g = ollie_policy::Grant::parse(s).map_err(|e| format!("escalate: {e}"))?;
        if out.contains(&g) {
            return Err(format!("escalate: grant {g} is given twice"));
        }
        out.push(g);
    }
    let reason = o
        .get("reason")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| format!("escalate: reason missing ({USAGE})"))?;
    if reason.trim().is_empty() || reason.chars().count() > 500 || reason.contains(char::is_control)
    {
        return Err("escalate: the reason is 1 to 500 characters on one line".into());
    }
    Ok(ollie_policy::EscalationRequest {
        grants: out,
        reason: reason.to_owned(),
    })
}

/// Errors setting a session up from its boot configuration.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("policy {name:?}: {source}")]
    Policy {
        name: String,
        source: ollie_policy::PolicyError,
    },
    #[error("{0}")]
    Invalid(String),
}

impl Session {
    /// Validates the boot configuration: every policy parses, the default exists, paths
    /// are absolute, the workspace exists.
    pub fn new(boot: Bootstrap) -> Result<Session, SetupError> {
        for (what, p) in [("workdir", &boot.workdir), ("home", &boot.home)] {
            if !p.is_absolute() {
                return Err(SetupError::Invalid(format!(
                    "{what} {} is not absolute",
                    p.display()
                )));
            }
        }
        let workdir = std::fs::canonicalize(&boot.workdir)
            .map_err(|e| SetupError::Invalid(format!("workdir {}: {e}", boot.workdir.display())))?;
        if let Some(d) = &boot.tools_dir
            && !d.is_absolute()
        {
            return Err(SetupError::Invalid(format!(
                "tools_dir {} is not absolute",
                d.display()
            )));
        }
        let mut policies = BTreeMap::new();
        for (name, text) in &boot.policies {
            let mut p = Policy::from_toml(text).map_err(|source| SetupError::Policy {
                name: name.clone(),
                source,
            })?;
            if let Some(d) = &boot.tools_dir {
                let t =
                    PathTemplate::parse("tools_dir", &d.to_string_lossy()).map_err(|source| {
                        SetupError::Policy {
                            name: name.clone(),
                            source,
                        }
                    })?;
                p.fs.exec.push(t);
            }
            // The skill paths: read grants, through the one way to widen a policy.
            if !boot.read_grants.is_empty() {
                let grants: Vec<ollie_policy::Grant> = boot
                    .read_grants
                    .iter()
                    .map(|r| ollie_policy::Grant::Read(r.clone()))
                    .collect();
                let ctx = ollie_policy::ResolveContext {
                    workdir: workdir.clone(),
                    home: boot.home.clone(),
                    extra_secrets: ollie_sandbox::secret_forms(&boot.hidden),
                };
                p = p.with_grants(&grants, &ctx).map_err(|e| {
                    SetupError::Invalid(format!("policy {name:?}: read grants: {e}"))
                })?;
            }
            policies.insert(name.clone(), p);
        }
        if !policies.contains_key(&boot.default_policy) {
            return Err(SetupError::Invalid(format!(
                "default_policy {:?} is not among the policies ({})",
                boot.default_policy,
                policies.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        let egress = crate::egress::Egress::new(&boot.proxy).map_err(SetupError::Invalid)?;
        Ok(Session {
            egress,
            id: boot.session,
            workdir,
            home: boot.home,
            policies,
            default_policy: boot.default_policy,
            env: boot
                .env
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            broker: Arc::new(crate::broker::Broker::default()),
            tools: ToolEnv {
                languages: tools::installed_languages(),
                tools_dir: boot.tools_dir,
            },
            procs: Procs::new(boot.max_procs_per_agent, boot.max_procs, boot.max_exited),
            hidden: boot.hidden,
            agents: Mutex::new(HashMap::new()),
            prepared: tokio::sync::Mutex::new(HashMap::new()),
            union_runs: Mutex::new(HashMap::new()),
            quiesce: Arc::new(crate::quiesce::Quiesce::default()),
            hold_peers: boot.hold_peers,
            peer_holds: Mutex::new(HashMap::new()),
            peer_waits: Mutex::new(HashMap::new()),
        })
    }

    /// Whether any policy lets tools use the network, now or after an approved `net` or
    /// `unsandboxed` escalation (toolsrv's own filter must then allow inet sockets, since
    /// tools inherit it).
    pub fn needs_inet(&self) -> bool {
        use ollie_policy::EscalationKind;
        self.policies.values().any(|p| {
            !matches!(p.network, Network::Off)
                || p.escalations.contains(&EscalationKind::Net)
                || p.escalations.contains(&EscalationKind::Unsandboxed)
        })
    }

    fn cfg(&self, agent: &str) -> AgentCfg {
        lock(&self.agents)
            .get(agent)
            .cloned()
            .unwrap_or_else(|| AgentCfg {
                tools: tools::names().into_iter().map(String::from).collect(),
                policy: self.default_policy.clone(),
                escalations: None,
                unions: Vec::new(),
            })
    }

    fn update(&self, agent: &str, f: impl FnOnce(&mut AgentCfg)) {
        let mut cfg = self.cfg(agent);
        f(&mut cfg);
        lock(&self.agents).insert(agent.to_owned(), cfg);
    }

    /// The tools loaded for `agent` (every tool until some are unloaded).
    pub fn tools_of(&self, agent: &str) -> BTreeSet<String> {
        self.cfg(agent).tools
    }

    /// The policy name `agent` runs under.
    pub fn policy_of(&self, agent: &str) -> String {
        self.cfg(agent).policy
    }

    /// `ctl`: one command from `who`.
    pub fn ctl(&self, who: &Identity, line: &str) -> Result<(), String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let usage = "commands: load AGENT TOOL, unload AGENT TOOL, policy AGENT NAME, escalations AGENT KINDS|none, unions AGENT JSON|none, bypass_timeout SECONDS, hold ID TREES, release ID, held ID, unheld ID (operator)";
        if let Some(rest) = line.trim_start().strip_prefix("unions ") {
            if *who != Identity::Operator {
                return Err("permission denied: only the operator sets unions".into());
            }
            let rest = rest.trim_start();
            let (agent, json) = rest
                .split_once(char::is_whitespace)
                .ok_or_else(|| format!("unions: give AGENT and JSON or none ({usage})"))?;
            crate::auth::validate_agent_id(agent)?;
            let unions = parse_unions(json)?;
            self.update(agent, |c| c.unions = unions);
            return Ok(());
        }
        if let [verb @ ("release" | "held" | "unheld"), id] = words.as_slice() {
            return self.peer_ctl(who, verb, id);
        }
        if let ["bypass_timeout", secs] = words.as_slice() {
            if *who != Identity::Operator {
                return Err("permission denied: only the operator sets bypass_timeout".into());
            }
            let n: u64 = secs
                .parse()
                .ok()
                .filter(|n| (1..=86_400).contains(n))
                .ok_or_else(|| {
                    format!(
                        "bypass_timeout: {:?} is not a number of seconds from 1 to 86400",
                        crate::payload::clip(secs)
                    )
                })?;
            self.broker.set_deadline(std::time::Duration::from_secs(n));
            return Ok(());
        }
        let (verb, agent, arg) = match words.as_slice() {
            [v, a, t] => (*v, *a, *t),
            [] => return Err(format!("empty command ({usage})")),
            _ => return Err(format!("{:?}: wrong arguments ({usage})", words[0])),
        };
        crate::auth::validate_agent_id(agent)?;
        if !who.may_act_for(agent) {
            return Err(format!(
                "permission denied: {} cannot change agent {agent}",
                who.aname()
            ));
        }
        match verb {
            "load" | "unload" => {
                if !tools::names().contains(&arg) {
                    return Err(format!(
                        "unknown tool {:?} (tools: {})",
                        crate::payload::clip(arg),
                        tools::names().join(", ")
                    ));
                }
                self.update(agent, |c| {
                    if verb == "load" {
                        c.tools.insert(arg.to_owned());
                    } else {
                        c.tools.remove(arg);
                    }
                });
                Ok(())
            }
            "policy" => {
                if *who != Identity::Operator {
                    return Err("permission denied: only the operator sets policies".into());
                }
                if !self.policies.contains_key(arg) {
                    return Err(format!(
                        "unknown policy {:?} (policies: {})",
                        crate::payload::clip(arg),
                        self.policies.keys().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
                self.update(agent, |c| c.policy = arg.to_owned());
                Ok(())
            }
            "escalations" => {
                if *who != Identity::Operator {
                    return Err("permission denied: only the operator sets escalations".into());
                }
                let kinds: BTreeSet<String> = if arg == "none" {
                    BTreeSet::new()
                } else {
                    arg.split(',').map(str::to_owned).collect()
                };
                if let Some(k) = kinds
                    .iter()
                    .find(|k| !["net", "read", "write", "unsandboxed"].contains(&k.as_str()))
                {
                    return Err(format!(
                        "escalations: unknown kind {:?} (valid: net, read, write, unsandboxed, or none)",
                        crate::payload::clip(k)
                    ));
                }
                self.update(agent, |c| c.escalations = Some(kinds));
                Ok(())
            }
            other => Err(format!(
                "unknown command {:?} ({usage})",
                crate::payload::clip(other)
            )),
        }
    }

    /// The prepared sandbox of a policy whose calls mount unions at `points` (sorted; none
    /// for most), set up on first use, and again when its zygote has died (the session's
    /// memory cgroup's OOM killer may pick it: the per-call inits share its memory).
    async fn prepared(&self, name: &str, points: &[PathBuf]) -> Result<Arc<Prepared>, String> {
        let key: PreparedKey = (name.to_owned(), points.to_vec());
        let mut map = self.prepared.lock().await;
        if let Some(p) = map.get(&key) {
            if p.is_alive() {
                return Ok(Arc::clone(p));
            }
            tracing::warn!(policy = %name, "the prepared sandbox ended (out of memory?); setting up a new one");
            map.remove(&key);
        }
        let policy = self
            .policies
            .get(name)
            .cloned()
            .ok_or_else(|| format!("unknown policy {name:?}"))?;
        let (workdir, home) = (self.workdir.clone(), self.home.clone());
        let hidden = self.hidden.clone();
        let pts = points.to_vec();
        let p = tokio::task::spawn_blocking(move || {
            Prepared::new_with_points(&policy, &workdir, &home, &hidden, &pts)
        })
        .await
        .map_err(|e| format!("sandbox setup: {e}"))?
        .map_err(|e| crate::error_chain(&e))?;
        let p = Arc::new(p);
        map.insert(key, Arc::clone(&p));
        Ok(p)
    }

    /// Forgets a prepared sandbox that stopped answering (the next call sets up a new one).
    async fn forget(&self, key: &PreparedKey, p: &Arc<Prepared>) {
        let mut map = self.prepared.lock().await;
        if map.get(key).is_some_and(|q| Arc::ptr_eq(p, q)) {
            map.remove(key);
        }
    }

    /// Stops every tool, then drops every prepared sandbox (their zygotes end, and with them
    /// anything left). Tools first get their SIGTERM and grace period (`kill_grace_ms`), up
    /// to [`SHUTDOWN_WAIT`] in all: dropping a zygote at once would SIGKILL them without a
    /// chance to clean up.
    pub async fn shutdown(&self) {
        let running = self.procs.still_running();
        self.procs.cancel_all();
        let _ = tokio::time::timeout(SHUTDOWN_WAIT, async {
            for p in &running {
                p.finished().await;
            }
        })
        .await;
        self.prepared.lock().await.clear();
    }

    /// Validates a `proc/new` payload from `who` and starts the process. Returns it at once;
    /// it runs in the background.
    pub fn start(
        self: &Arc<Self>,
        who: &Identity,
        p: Payload,
        bg: bool,
    ) -> Result<Arc<Proc>, String> {
        let owner = match (who, &p.agent) {
            (Identity::Agent(a), None) => a.clone(),
            (Identity::Agent(a), Some(x)) if x == a => a.clone(),
            (Identity::Agent(a), Some(x)) => {
                return Err(format!(
                    "permission denied: {a} cannot run tools as agent {:?}",
                    crate::payload::clip(x)
                ));
            }
            (Identity::Operator, Some(x)) => {
                crate::auth::validate_agent_id(x)?;
                x.clone()
            }
            (Identity::Operator, None) => crate::auth::OPERATOR.to_owned(),
        };
        let cfg = if owner == crate::auth::OPERATOR {
            AgentCfg {
                tools: tools::names().into_iter().map(String::from).collect(),
                policy: self.default_policy.clone(),
                escalations: None,
                unions: Vec::new(),
            }
        } else {
            self.cfg(&owner)
        };
        if !tools::names().contains(&p.tool.as_str()) {
            return Err(format!(
                "unknown tool {:?} (tools: {})",
                crate::payload::clip(&p.tool),
                tools::names().join(", ")
            ));
        }
        if !cfg.tools.contains(&p.tool) {
            return Err(format!("tool {} is not loaded for {owner}", p.tool));
        }
        let args = p.args.clone().unwrap_or_default();
        let asked = tools::escalation(&args).map(parse_escalate).transpose()?;
        let mut inv = tools::plan(&self.tools, &p.tool, &args, p.cmd.as_deref())?;
        tools::take_payload_io(&mut inv, &p)?;
        let cwd = match &p.cwd {
            None => None,
            Some(c) => Some(self.cwd(c)?),
        };
        let policy = self
            .policies
            .get(&cfg.policy)
            .ok_or_else(|| format!("unknown policy {:?}", cfg.policy))?;
        let escalation = match asked {
            None => None,
            Some(req) => {
                let (grants, reason) = (req.grants.clone(), req.reason.clone());
                match self.escalation(
                    (&owner, &p.tool),
                    policy,
                    cfg.escalations.as_ref(),
                    req,
                    &inv,
                    cwd.as_deref(),
                ) {
                    Ok(e) => e,
                    Err(why) => {
                        let mut f = serde_json::Map::new();
                        f.insert("agent".into(), owner.clone().into());
                        f.insert("tool".into(), p.tool.clone().into());
                        f.insert("argv".into(), to_json(&lossy(&inv.argv)));
                        f.insert(
                            "grants".into(),
                            to_json(&grants.iter().map(ToString::to_string).collect::<Vec<_>>()),
                        );
                        f.insert("reason".into(), reason.into());
                        f.insert("verdict".into(), "denied".into());
                        f.insert("why".into(), why.clone().into());
                        self.broker.log_noisy(&owner, "refused", f);
                        return Err(why);
                    }
                }
            }
        };
        let out_cap = usize::try_from(policy.limits.output_bytes).unwrap_or(usize::MAX);
        let proc = self.procs.create(NewProc {
            owner,
            tool: p.tool.clone(),
            summary: inv.summary.clone(),
            policy: cfg.policy.clone(),
            bg,
            out_cap,
        })?;
        let me = Arc::clone(self);
        let pr = Arc::clone(&proc);
        tokio::spawn(async move {
            match escalation {
                None => me.run(pr, cfg.policy, cfg.unions, inv, cwd).await,
                Some(e) => me.run_escalated(pr, e, inv, cwd).await,
            }
        });
        Ok(proc)
    }

    /// Decides an escalation before anything runs: refused at once (not askable, secret
    /// paths, `net` without a port, `unsandboxed`), already covered (`None`: an ordinary
    /// run), or bound to the exact execution and handed to the operator.
    fn escalation(
        &self,
        (owner, tool): (&str, &str),
        policy: &Policy,
        profile_kinds: Option<&BTreeSet<String>>,
        req: ollie_policy::EscalationRequest,
        inv: &Invocation,
        cwd: Option<&Path>,
    ) -> Result<Option<Escalation>, String> {
        use ollie_policy::{Decision, DenyReason, ResolveContext};
        let ctx = ResolveContext {
            workdir: self.workdir.clone(),
            home: self.home.clone(),
            extra_secrets: ollie_sandbox::secret_forms(&self.hidden),
        };
        let resolved = policy
            .resolve(&ctx)
            .map_err(|e| format!("escalation refused: {e}"))?;
        let req = match ollie_policy::decide(&resolved, &req) {
            Decision::Allow => return Ok(None),
            Decision::Deny(r) => {
                let why = match r {
                    DenyReason::Empty => "it asks for nothing".to_owned(),
                    DenyReason::InvalidPath(p) => {
                        format!("{} is not an absolute, normal path", p.display())
                    }
                    DenyReason::SecretLocation(p) => {
                        format!("{} is a secret location and is never granted", p.display())
                    }
                    DenyReason::KindNotAllowed(k) => {
                        format!("this agent's policy does not let it ask for {k}")
                    }
                    DenyReason::DomainRefused(why) => why,
                };
                return Err(format!(
                    "escalation refused without asking: {why}; nothing was run"
                ));
            }
            Decision::NeedsApproval(req) => req,
        };
        if let Some(allowed) = profile_kinds
            && let Some(g) = req.grants.iter().find(|g| {
                let kind = match g.kind() {
                    ollie_policy::EscalationKind::Net => "net",
                    ollie_policy::EscalationKind::Read => "read",
                    ollie_policy::EscalationKind::Write => "write",
                    ollie_policy::EscalationKind::Unsandboxed => "unsandboxed",
                };
                !allowed.contains(kind)
            })
        {
            let list = if allowed.is_empty() {
                "none".to_owned()
            } else {
                allowed.iter().cloned().collect::<Vec<_>>().join(", ")
            };
            return Err(format!(
                "escalation refused without asking: this agent's profile does not let it ask for {g} (its escalations: {list}); nothing was run"
            ));
        }
        let widened = policy
            .with_grants(&req.grants, &ctx)
            .map_err(|e| format!("escalation refused: {e}; nothing was run"))?;
        let run_cwd = cwd.map_or_else(|| self.workdir.clone(), Path::to_path_buf);
        // The environment the command will get: the widened policy's allowlist and fixed
        // values over toolsrv's environment (what the operator approves).
        let final_policy = widened
            .resolve(&ctx)
            .map_err(|e| format!("escalation refused: {e}; nothing was run"))?;
        let env: BTreeMap<String, String> =
            ollie_sandbox::tool_environment(&final_policy, &self.env)
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect();
        Ok(Some(Escalation {
            owner: owner.to_owned(),
            tool: tool.to_owned(),
            grants: req.grants.iter().map(ToString::to_string).collect(),
            reason: req.reason,
            argv: inv.argv.clone(),
            cwd: run_cwd,
            env,
            widened,
        }))
    }

    /// The request the operator sees for `e`, bound to `binding`.
    /// `held`: how many running calls of the session the request froze.
    fn ask_of(
        &self,
        e: &Escalation,
        binding: &crate::binding::Binding,
        held: usize,
    ) -> crate::broker::Ask {
        let digest = {
            use sha2::{Digest, Sha256};
            let mut h = Sha256::new();
            for part in [&e.owner, &e.tool, &binding.digest(), &e.grants.join("\n")] {
                h.update(part.as_bytes());
                h.update([0]);
            }
            hex(&h.finalize())
        };
        let mut fields = serde_json::Map::new();
        fields.insert("session".into(), self.id.clone().into());
        fields.insert("agent".into(), e.owner.clone().into());
        fields.insert("tool".into(), e.tool.clone().into());
        fields.insert("argv".into(), binding.argv.clone().into());
        fields.insert("cwd".into(), binding.cwd.display().to_string().into());
        fields.insert("env".into(), to_json(&binding.env));
        fields.insert("executable".into(), to_json(&binding.executable));
        fields.insert("scripts".into(), to_json(&binding.scripts));
        fields.insert("unpinned".into(), to_json(&binding.unpinned()));
        fields.insert("held".into(), held.into());
        fields.insert("grants".into(), e.grants.clone().into());
        fields.insert("reason".into(), e.reason.clone().into());
        crate::broker::Ask {
            agent: e.owner.clone(),
            digest,
            fields,
        }
    }

    /// Asks the operator, then runs exactly the bound execution once under the widened
    /// policy (a one-shot sandbox), from the descriptors [`crate::binding::Binding::pin`]
    /// checked, or fails the call with why it did not run. Everything
    /// the operator does not see on `pending` goes to `bypass/log`.
    async fn run_escalated(
        self: Arc<Self>,
        proc: Arc<Proc>,
        e: Escalation,
        inv: Invocation,
        cwd: Option<PathBuf>,
    ) {
        use crate::broker::Asked;
        let render = inv.render.clone();
        let (argv, cwd_b, env) = (e.argv.clone(), e.cwd.clone(), e.env.clone());
        // From here until the approved run has ended the session holds still: its running
        // calls are frozen (seen stopped before anything is bound), new ones wait; and so,
        // through olliesrv, do the other sessions that can write the same trees.
        // A request the flood bounds refuse holds nothing.
        if let Some(why) = self.broker.full(&e.owner) {
            self.log_refused(&e, &why);
            let f = not_run(&proc, why);
            self.procs.finish(&proc, f);
            return;
        }
        let ticket = Arc::new(self.quiesce.hold());
        let mut peers = None;
        let bound = match self.hold_still(&ticket, &e).await {
            Err(why) => Err(why),
            Ok(p) => {
                peers = p;
                tokio::task::spawn_blocking(move || {
                    crate::binding::compute(&argv, &cwd_b, &env)
                        .map_err(|why| format!("escalation refused: {why}; nothing was run"))
                })
                .await
                .unwrap_or_else(|e| {
                    Err(format!(
                        "escalation refused: the binding thread failed: {e}; nothing was run"
                    ))
                })
            }
        };
        let binding = match bound {
            Ok(b) => b,
            Err(why) => {
                self.log_refused(&e, &why);
                let f = not_run(&proc, why);
                self.procs.finish(&proc, f);
                return;
            }
        };
        let ask = self.ask_of(&e, &binding, ticket.frozen_count());
        let digest = ask.digest.clone();
        // Where each log line about this call says it came from.
        let mut about = crate::broker::Broker::summary(&ask.fields);
        about.insert("digest".into(), digest.clone().into());
        about.insert("pid".into(), proc.id.into());
        let (verdict, via) = match self.broker.ask(ask) {
            Err(why) => (Err(why), None),
            Ok(Asked::PreApproved) => (Ok(()), Some("session-scope".to_owned())),
            Ok(Asked::Waiting(id, rx)) => {
                about.insert("id".into(), id.clone().into());
                (
                    self.operator_verdict(&proc, &id, rx).await,
                    Some("approval".to_owned()),
                )
            }
        };
        let writable = self.writable_trees(Some(&e.widened));
        let mut pinned_log = None;
        let result = match verdict {
            Err(e) => Err(e),
            // Open what will run once and check it against the binding (the check that
            // counts: the run executes these descriptors), then re-check the rest by path (a
            // file named since, data files); any difference voids the approval.
            Ok(()) => match tokio::task::spawn_blocking(move || pin_checked(&binding, writable))
                .await
                .unwrap_or_else(|e| {
                    Err((
                        format!("the binding thread failed: {e}"),
                        String::new(),
                        None,
                    ))
                }) {
                Err((why, was, now)) => Err(self.log_voided(&about, &why, was, now)),
                Ok(_) if *proc.stop.borrow() => {
                    Err("the call was stopped; nothing was run".to_owned())
                }
                Ok(pinned) => {
                    // A request made while this runs freezes it too.
                    let _entered = self.quiesce.enter_now(proc.id, &proc.cancel, &proc.held);
                    let mut req = self.request(&proc, inv, cwd);
                    req.argv = pinned.argv;
                    req.exec_fd = Some(pinned.exec);
                    req.pass_fds = pinned.pass_fds;
                    pinned_log = Some((pinned.exec_copied, pinned.scripts));
                    self.run_approved(&proc, e.widened, req).await
                }
            },
        };
        // The run is over: the session's frozen calls go on (unless another request holds
        // them), waiting ones start; so do the other sessions' (olliesrv reads `release`).
        drop(ticket);
        drop(peers);
        let ran = result.is_ok();
        let exec = match &result {
            Ok(Ok(run)) => Some(to_json(&run.record.exec)),
            _ => None,
        };
        let f = match result {
            Ok(run) => finish_of(&proc, &render, run),
            Err(why) => not_run(&proc, why),
        };
        if ran {
            let mut l = about;
            if let Some(v) = via {
                l.insert("approved_by".into(), v.into());
            }
            if let Some(x) = exec {
                l.insert("exec".into(), x);
            }
            if let Some((copied, scripts)) = pinned_log {
                l.insert("exec_copied".into(), copied.into());
                l.insert("pinned".into(), to_json(&scripts));
            }
            l.insert("status".into(), f.status().into());
            if let Some(s) = &f.stopped_by {
                l.insert("stopped_by".into(), s.clone().into());
            }
            if let Some(e) = &f.error {
                l.insert("error".into(), e.clone().into());
            }
            self.broker.log("ran", l);
        }
        tracing::debug!(pid = proc.id, owner = %proc.owner, tool = %proc.tool, state = f.state(), "escalated process ended");
        self.procs.finish(&proc, f);
    }

    /// Waits until this session's running calls are seen stopped, then (when olliesrv holds
    /// peers) until olliesrv says the other sessions working in the request's trees are held.
    async fn hold_still(
        self: &Arc<Self>,
        ticket: &Arc<crate::quiesce::Ticket>,
        e: &Escalation,
    ) -> Result<Option<PeerHold>, String> {
        let t = Arc::clone(ticket);
        tokio::task::spawn_blocking(move || t.wait_frozen(crate::quiesce::FREEZE_WAIT))
            .await
            .map_err(|e| format!("escalation refused: the freeze thread failed: {e}; nothing was run"))?
            .map_err(|pid| {
                format!(
                    "escalation refused: tool process {pid} of this session did not stop within {} s, so the workspace could change while the operator looks; nothing was run",
                    crate::quiesce::FREEZE_WAIT.as_secs()
                )
            })?;
        if !self.hold_peers {
            return Ok(None);
        }
        let id = crate::auth::random_hex16()?;
        let trees: Vec<String> = self
            .held_trees(Some(&e.widened))
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let (tx, rx) = tokio::sync::oneshot::channel();
        lock(&self.peer_waits).insert(id.clone(), tx);
        let mut f = serde_json::Map::new();
        f.insert("hold".into(), id.clone().into());
        f.insert("agent".into(), e.owner.clone().into());
        f.insert("trees".into(), trees.into());
        self.broker.log("hold", f);
        // From here a `release` is owed, whatever olliesrv answers.
        let guard = PeerHold {
            id: id.clone(),
            session: Arc::clone(self),
        };
        let answer = tokio::time::timeout(PEER_WAIT, rx).await;
        lock(&self.peer_waits).remove(&id);
        match answer {
            Ok(Ok(true)) => Ok(Some(guard)),
            Ok(Ok(false)) => Err("escalation refused: another session working in these trees could not be held still; nothing was run".into()),
            _ => Err(format!(
                "escalation refused: the other sessions working in these trees were not held within {} s; nothing was run",
                PEER_WAIT.as_secs()
            )),
        }
    }

    /// `ctl hold ID TREES` (operator): hold this session still for another session's
    /// escalation if it can write any of `TREES` (a JSON array of absolute paths); returns
    /// once its running calls are seen stopped. Idempotent per id.
    pub async fn hold_for_peer(&self, who: &Identity, rest: &str) -> Result<(), String> {
        if *who != Identity::Operator {
            return Err("permission denied: only the operator holds sessions".into());
        }
        let (id, json) = rest
            .trim()
            .split_once(char::is_whitespace)
            .ok_or("hold: give ID and TREES (a JSON array of absolute paths)")?;
        valid_hold_id(id)?;
        let trees: Vec<PathBuf> = serde_json::from_str::<Vec<String>>(json.trim())
            .map_err(|e| format!("hold: TREES is not a JSON array of strings: {e}"))?
            .into_iter()
            .map(PathBuf::from)
            .collect();
        if trees.is_empty() || trees.len() > 256 || trees.iter().any(|t| !t.is_absolute()) {
            return Err("hold: TREES must hold 1 to 256 absolute paths".into());
        }
        if lock(&self.peer_holds).contains_key(id) {
            return Ok(());
        }
        let mine = self.held_trees(None);
        let overlaps = mine
            .iter()
            .any(|m| trees.iter().any(|t| m.starts_with(t) || t.starts_with(m)));
        if !overlaps {
            return Ok(());
        }
        let ticket = Arc::new(self.quiesce.hold());
        let t = Arc::clone(&ticket);
        let frozen =
            tokio::task::spawn_blocking(move || t.wait_frozen(crate::quiesce::FREEZE_WAIT))
                .await
                .map_err(|e| format!("hold: the freeze thread failed: {e}"))?;
        if let Err(pid) = frozen {
            return Err(format!(
                "hold: tool process {pid} did not stop within {} s",
                crate::quiesce::FREEZE_WAIT.as_secs()
            ));
        }
        let Ok(ticket) = Arc::try_unwrap(ticket) else {
            return Err("hold: the freeze is still shared".into());
        };
        lock(&self.peer_holds).insert(id.to_owned(), ticket);
        Ok(())
    }

    /// `ctl release ID`, `ctl held ID`, `ctl unheld ID` (operator): end a hold kept for
    /// another session; tell one of this session's escalations whether the other sessions
    /// are held.
    fn peer_ctl(&self, who: &Identity, verb: &str, id: &str) -> Result<(), String> {
        if *who != Identity::Operator {
            return Err(format!("permission denied: only the operator says {verb}"));
        }
        valid_hold_id(id)?;
        match verb {
            "release" => {
                lock(&self.peer_holds).remove(id);
            }
            _ => {
                if let Some(tx) = lock(&self.peer_waits).remove(id) {
                    let _ = tx.send(verb == "held");
                }
            }
        }
        Ok(())
    }

    /// Waits for the operator's answer to request `id` (the call's stop withdraws it).
    async fn operator_verdict(
        &self,
        proc: &Proc,
        id: &str,
        rx: tokio::sync::oneshot::Receiver<crate::broker::Outcome>,
    ) -> Result<(), String> {
        use crate::broker::Outcome;
        let mut stop = proc.stop.subscribe();
        let outcome = tokio::select! {
            o = self.broker.wait(id, rx) => o,
            _ = stop.wait_for(|s| *s) => {
                self.broker.withdraw(id, "the call was stopped");
                Outcome::Denied("the call was stopped before the operator answered".into())
            }
        };
        match outcome {
            Outcome::Approved => Ok(()),
            // The operator's message goes to the agent (and the model, the chat)
            // display-escaped: bidi controls, blank-looking and invisible characters
            // show as \u{…} (parse_resolve already refused control characters).
            Outcome::Denied(m) => Err(format!(
                "escalation denied by the operator: {}; nothing was run",
                ollie_link::bypass::display_escape(&m)
            )),
            Outcome::Expired => Err(format!(
                "escalation denied: no answer from the operator within {} s; nothing was run",
                self.broker.deadline().as_secs()
            )),
        }
    }

    /// Logs an approval voided by a changed binding; returns the call's error.
    fn log_voided(
        &self,
        about: &serde_json::Map<String, serde_json::Value>,
        why: &str,
        was: String,
        now: Option<String>,
    ) -> String {
        let why = format!("approval voided: {why}; nothing was run");
        let mut f = about.clone();
        f.insert("verdict".into(), "denied".into());
        f.insert("why".into(), why.clone().into());
        f.insert("binding_approved".into(), was.into());
        f.insert("binding_now".into(), now.into());
        self.broker.log("voided", f);
        why
    }

    /// Logs an escalation refused before the operator was asked.
    fn log_refused(&self, e: &Escalation, why: &str) {
        let mut f = serde_json::Map::new();
        f.insert("agent".into(), e.owner.clone().into());
        f.insert("tool".into(), e.tool.clone().into());
        f.insert("argv".into(), to_json(&lossy(&e.argv)));
        f.insert("grants".into(), e.grants.clone().into());
        f.insert("reason".into(), e.reason.clone().into());
        f.insert("verdict".into(), "denied".into());
        f.insert("why".into(), why.into());
        self.broker.log_noisy(&e.owner, "refused", f);
    }

    /// [`Session::writable_trees`] canonicalised, without device nodes (`/dev/null` is
    /// writable everywhere and holds nothing another run reads), deduplicated: what holds
    /// across sessions compare.
    fn held_trees(&self, widened: Option<&Policy>) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self
            .writable_trees(widened)
            .into_iter()
            .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
            .filter(|p| std::fs::metadata(p).map_or(true, |m| m.is_dir() || m.is_file()))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The trees sandboxed tools of this session can write while an escalated run starts:
    /// the workspace, every policy's writable paths (and the widened policy's), and the
    /// agents' union upper layers. A program in one of them runs from a sealed copy.
    fn writable_trees(&self, widened: Option<&Policy>) -> Vec<PathBuf> {
        let ctx = ollie_policy::ResolveContext {
            workdir: self.workdir.clone(),
            home: self.home.clone(),
            extra_secrets: ollie_sandbox::secret_forms(&self.hidden),
        };
        let mut out = vec![self.workdir.clone()];
        for p in self.policies.values().chain(widened) {
            if let Ok(r) = p.resolve(&ctx) {
                out.extend(r.fs.write);
            }
        }
        for cfg in lock(&self.agents).values() {
            out.extend(cfg.unions.iter().map(|u| u.upper.clone()));
        }
        out
    }

    /// The sandbox request of `inv` for `proc` (the session's workspace, home and
    /// environment; the call's stdin, cwd, timeout and cancel handle).
    fn request(&self, proc: &Proc, inv: Invocation, cwd: Option<PathBuf>) -> RunRequest {
        let mut req = RunRequest::new(inv.argv, self.workdir.clone());
        req.home = self.home.clone();
        req.hidden = self.hidden.clone();
        req.base_env = self.env.clone();
        req.stdin = inv.stdin;
        req.cancel = Some(proc.cancel.clone());
        req.cwd = cwd;
        req.timeout_seconds = inv.timeout_seconds;
        req
    }

    /// A `cwd=` value: absolute, or relative to the workspace; `..` may not climb above it.
    fn cwd(&self, c: &str) -> Result<PathBuf, String> {
        if c.contains('\0') {
            return Err("cwd contains a NUL byte".into());
        }
        let p = Path::new(c);
        let joined = if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.workdir.join(p)
        };
        let mut out = PathBuf::new();
        for comp in joined.components() {
            match comp {
                Component::RootDir => out.push("/"),
                Component::Normal(n) => out.push(n),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !out.pop() || out.as_os_str().is_empty() {
                        return Err(format!("cwd {c:?} climbs above /"));
                    }
                }
                Component::Prefix(_) => return Err(format!("cwd {c:?} is not a path")),
            }
        }
        Ok(out)
    }

    async fn run(
        self: Arc<Self>,
        proc: Arc<Proc>,
        policy: String,
        unions: Vec<ollie_sandbox::UnionMount>,
        inv: Invocation,
        cwd: Option<PathBuf>,
    ) {
        let render = inv.render.clone();
        // Nothing starts while an escalation is being decided or its approved run runs; once
        // running, such a request freezes this run until it is over.
        let Some(_entered) = self
            .quiesce
            .enter(proc.id, &proc.cancel, &proc.held, &proc.stop)
            .await
        else {
            let f = not_run(
                &proc,
                "the call was stopped while it waited for an escalation to be decided; nothing was run".to_owned(),
            );
            self.procs.finish(&proc, f);
            return;
        };
        let mut points: Vec<PathBuf> = unions.iter().map(|u| u.point.clone()).collect();
        points.sort();
        // One run with unions at a time per agent: its overlays share one upper layer.
        let _one = if unions.is_empty() {
            None
        } else {
            let one = Arc::clone(
                lock(&self.union_runs)
                    .entry(proc.owner.clone())
                    .or_default(),
            );
            Some(one.lock_owned().await)
        };
        // A proxied run has a listener of its own, so each request through it is known by
        // its call: it runs one-shot (a prepared sandbox's calls would share one).
        if let Some(p) = self.policies.get(&policy)
            && matches!(p.network, Network::Proxy(_))
        {
            let p = p.clone();
            let result = match self.proxy_handoff(&proc, &p) {
                Err(why) => Err(SandboxError::InvalidRequest { reason: why }),
                Ok(served) => {
                    let mut req = self.request(&proc, inv, cwd);
                    req.unions = unions;
                    req.proxy = Some(served.handoff.clone());
                    let r = on_runner(&proc, move |sink| {
                        ollie_sandbox::run_streaming(&p, &req, sink)
                    })
                    .await;
                    drop(served);
                    r
                }
            };
            let f = finish_of(&proc, &render, result);
            self.procs.finish(&proc, f);
            return;
        }
        let result = match self.prepared(&policy, &points).await {
            Err(e) => Err(SandboxError::InvalidRequest {
                reason: format!("the sandbox for policy {policy} could not be set up: {e}"),
            }),
            Ok(prepared) => {
                let mut req = self.request(&proc, inv, cwd);
                req.unions = unions;
                let sb = Arc::clone(&prepared);
                let r = on_runner(&proc, move |sink| sb.run_streaming(&req, sink)).await;
                if let Err(SandboxError::Io { op, .. }) = &r
                    && op.starts_with("reach the prepared sandbox")
                {
                    self.forget(&(policy, points), &prepared).await;
                }
                r
            }
        };
        let f = finish_of(&proc, &render, result);
        tracing::debug!(pid = proc.id, owner = %proc.owner, tool = %proc.tool, state = f.state(), "process ended");
        self.procs.finish(&proc, f);
    }
}

/// A proxied run's handoff ([`ollie_sandbox::ProxyHandoff`]): it starts serving the run's
/// listener with the run's proxy; dropping this stops serving (the run is over).
struct ProxyServed {
    handoff: ollie_sandbox::ProxyHandoff,
    served: Arc<Mutex<Option<crate::egress::Served>>>,
}

impl Drop for ProxyServed {
    fn drop(&mut self) {
        lock(&self.served).take();
    }
}

impl Session {
    /// Runs an approved escalation's pinned request under its widened `policy` on a
    /// blocking thread; a proxied one (the policy's own mode, or an approved `net:DOMAIN` on
    /// a closed one) has its listener served for as long as it runs.
    async fn run_approved(
        self: &Arc<Self>,
        proc: &Arc<Proc>,
        policy: Policy,
        mut req: RunRequest,
    ) -> Result<Result<ollie_sandbox::RunOutput, SandboxError>, String> {
        let served = match &policy.network {
            Network::Proxy(_) => Some(self.proxy_handoff(proc, &policy)?),
            _ => None,
        };
        req.proxy = served.as_ref().map(|s| s.handoff.clone());
        let pr = Arc::clone(proc);
        let r = tokio::task::spawn_blocking(move || run_pinned(&policy, &req, &pr))
            .await
            .map_err(|e| format!("the runner thread failed: {e}"));
        drop(served);
        r
    }

    /// The proxy of `proc`'s run under `policy` (a proxy mode one) and the handoff that
    /// serves the run's listener with it. The broker is the proxy's asker when the agent may
    /// ask for `net` (its policy, and its profile when it names kinds).
    fn proxy_handoff(
        self: &Arc<Self>,
        proc: &Proc,
        policy: &Policy,
    ) -> Result<ProxyServed, String> {
        let Network::Proxy(network) = &policy.network else {
            return Err("the run's policy has no proxy".into());
        };
        let may_ask = policy
            .escalations
            .contains(&ollie_policy::EscalationKind::Net)
            && self
                .cfg(&proc.owner)
                .escalations
                .is_none_or(|kinds| kinds.contains("net"));
        let proxy = self
            .egress
            .proxy_for(&self.id, &self.broker, network, may_ask)?;
        let caller = ollie_proxy::Caller {
            agent: proc.owner.clone(),
            call: proc.id.to_string(),
            command: proc.summary.clone(),
        };
        let rt = tokio::runtime::Handle::current();
        let served: Arc<Mutex<Option<crate::egress::Served>>> = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&served);
        let handoff = ollie_sandbox::ProxyHandoff::new(move |listener| {
            match crate::egress::serve(&rt, Arc::clone(&proxy), listener, caller.clone()) {
                Ok(s) => *lock(&slot) = Some(s),
                // The listener is dropped: the tool's connections are refused.
                Err(e) => tracing::warn!(error = %e, "a run's proxy could not be served"),
            }
        });
        Ok(ProxyServed { handoff, served })
    }
}

/// Opens what an approved escalation will run and checks it against `binding`, then
/// re-checks the rest by path; on a difference, why, the approved digest and the current one.
fn pin_checked(
    binding: &crate::binding::Binding,
    writable: Vec<PathBuf>,
) -> Result<crate::binding::Pinned, (String, String, Option<String>)> {
    let writable: Vec<PathBuf> = writable
        .into_iter()
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .collect();
    binding
        .pin(&writable)
        .and_then(|p| binding.recheck().map(|()| p))
        .map_err(|why| {
            let now = crate::binding::compute(
                &binding
                    .argv_raw
                    .iter()
                    .map(|b| std::os::unix::ffi::OsStringExt::from_vec(b.clone()))
                    .collect::<Vec<OsString>>(),
                &binding.cwd,
                &binding.env,
            )
            .map(|b| b.digest())
            .ok();
            (why, binding.digest(), now)
        })
}

/// Runs an approved escalation under `policy`, its output going to `pr`.
fn run_pinned(
    policy: &Policy,
    req: &RunRequest,
    pr: &Proc,
) -> Result<ollie_sandbox::RunOutput, SandboxError> {
    ollie_sandbox::run_streaming(policy, req, &mut |_s: Stream, chunk: &[u8]| {
        pr.out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(chunk);
    })
}
