//! The session toolsrv serves: its policies, one prepared sandbox per policy, the agents'
//! tool sets and policies, and the process table.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use ollie_policy::{Network, PathTemplate, Policy};
use ollie_sandbox::{Prepared, RunRequest, SandboxError, Stream};

use crate::auth::Identity;
use crate::boot::Bootstrap;
use crate::payload::Payload;
use crate::procs::{NewProc, Proc, Procs, finish_of};
use crate::tools::{self, Invocation, ToolEnv};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An agent's settings.
#[derive(Debug, Clone)]
struct AgentCfg {
    tools: BTreeSet<String>,
    policy: String,
}

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
    agents: Mutex<HashMap<String, AgentCfg>>,
    prepared: tokio::sync::Mutex<HashMap<String, Arc<Prepared>>>,
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
            policies.insert(name.clone(), p);
        }
        if !policies.contains_key(&boot.default_policy) {
            return Err(SetupError::Invalid(format!(
                "default_policy {:?} is not among the policies ({})",
                boot.default_policy,
                policies.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        Ok(Session {
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
            tools: ToolEnv {
                languages: tools::installed_languages(),
                tools_dir: boot.tools_dir,
            },
            procs: Procs::new(boot.max_procs_per_agent, boot.max_procs, boot.max_exited),
            agents: Mutex::new(HashMap::new()),
            prepared: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Whether any policy lets tools use TCP (toolsrv's own filter must then allow inet
    /// sockets, since tools inherit it).
    pub fn needs_inet(&self) -> bool {
        self.policies
            .values()
            .any(|p| !matches!(p.network, Network::Off))
    }

    fn cfg(&self, agent: &str) -> AgentCfg {
        lock(&self.agents)
            .get(agent)
            .cloned()
            .unwrap_or_else(|| AgentCfg {
                tools: tools::names().into_iter().map(String::from).collect(),
                policy: self.default_policy.clone(),
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
        let usage = "commands: load AGENT TOOL, unload AGENT TOOL, policy AGENT NAME (operator)";
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
            other => Err(format!(
                "unknown command {:?} ({usage})",
                crate::payload::clip(other)
            )),
        }
    }

    /// The prepared sandbox of a policy, set up on first use.
    async fn prepared(&self, name: &str) -> Result<Arc<Prepared>, String> {
        let mut map = self.prepared.lock().await;
        if let Some(p) = map.get(name) {
            return Ok(Arc::clone(p));
        }
        let policy = self
            .policies
            .get(name)
            .cloned()
            .ok_or_else(|| format!("unknown policy {name:?}"))?;
        let (workdir, home) = (self.workdir.clone(), self.home.clone());
        let p = tokio::task::spawn_blocking(move || Prepared::new(&policy, &workdir, &home))
            .await
            .map_err(|e| format!("sandbox setup: {e}"))?
            .map_err(|e| crate::error_chain(&e))?;
        let p = Arc::new(p);
        map.insert(name.to_owned(), Arc::clone(&p));
        Ok(p)
    }

    /// Forgets a prepared sandbox that stopped answering (the next call sets up a new one).
    async fn forget(&self, name: &str, p: &Arc<Prepared>) {
        let mut map = self.prepared.lock().await;
        if map.get(name).is_some_and(|q| Arc::ptr_eq(p, q)) {
            map.remove(name);
        }
    }

    /// Drops every prepared sandbox (their zygotes end, and with them every tool).
    pub async fn shutdown(&self) {
        self.procs.cancel_all();
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
        if tools::escalation(&args).is_some() {
            return Err(
                "escalation refused: this toolsrv has no bypass broker yet; nothing was run".into(),
            );
        }
        let inv = tools::plan(&self.tools, &p.tool, &args, p.cmd.as_deref())?;
        let cwd = match &p.cwd {
            None => None,
            Some(c) => Some(self.cwd(c)?),
        };
        let policy = self
            .policies
            .get(&cfg.policy)
            .ok_or_else(|| format!("unknown policy {:?}", cfg.policy))?;
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
        tokio::spawn(async move { me.run(pr, cfg.policy, inv, cwd).await });
        Ok(proc)
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
        inv: Invocation,
        cwd: Option<PathBuf>,
    ) {
        let render = inv.render.clone();
        let result = match self.prepared(&policy).await {
            Err(e) => Err(SandboxError::InvalidRequest {
                reason: format!("the sandbox for policy {policy} could not be set up: {e}"),
            }),
            Ok(prepared) => {
                let mut req = RunRequest::new(inv.argv, self.workdir.clone());
                req.home = self.home.clone();
                req.base_env = self.env.clone();
                req.stdin = inv.stdin;
                req.cancel = Some(proc.cancel.clone());
                req.cwd = cwd;
                req.timeout_seconds = inv.timeout_seconds;
                let pr = Arc::clone(&proc);
                let sb = Arc::clone(&prepared);
                let r = tokio::task::spawn_blocking(move || {
                    sb.run_streaming(&req, &mut |_s: Stream, chunk: &[u8]| {
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
                });
                if let Err(SandboxError::Io { op, .. }) = &r
                    && op.starts_with("reach the prepared sandbox")
                {
                    self.forget(&policy, &prepared).await;
                }
                r
            }
        };
        let f = finish_of(&proc, &render, result);
        tracing::debug!(pid = proc.id, owner = %proc.owner, tool = %proc.tool, state = f.state(), "process ended");
        self.procs.finish(&proc, f);
    }
}
