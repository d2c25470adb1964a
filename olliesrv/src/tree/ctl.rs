//! The ctl files: the root's, a session's and an agent's, one function per verb.

use std::sync::Arc;

use ollie_p9::{Error, Result};
use serde_json::{Map, Value};

use crate::link::LinkState;
use crate::state::{Agent, Session};
use crate::util::clip;

use super::table::{AGENT_CTL, CTL_COMMANDS, SESSION_CTL};
use super::{LINK_WAIT, MODELS_TIMEOUT, OllieFs, err, gone, single_command};

impl OllieFs {
    pub(super) fn root_ctl(&self, cmd: &str) -> Result<String> {
        let valid = || {
            CTL_COMMANDS
                .iter()
                .map(|(c, _)| *c)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let line = single_command(cmd)?;
        let mut words = line.split_whitespace();
        let verb = words.next().unwrap_or("");
        let extra: Vec<&str> = words.collect();
        if !extra.is_empty() {
            return Err(Error::new(format!(
                "{verb}: takes no arguments, got {:?} (invalid argument)",
                extra.join(" ")
            )));
        }
        match verb {
            "help" => Ok(CTL_COMMANDS
                .iter()
                .map(|(c, h)| format!("{c}\t{h}\n"))
                .collect()),
            "invalidate" => {
                let before = self.shared.config().limits;
                let cfg = self
                    .shared
                    .reload()
                    .map_err(|e| err(format!("invalidate: {e}")))?;
                let n = cfg.backends.len();
                // Every agent makes its backend anew from the new configuration at its next
                // call (a replay script then starts over).
                for s in self.shared.reg.sessions() {
                    for a in s.agents() {
                        // Held only while a turn picks its backend: that turn reads the
                        // new configuration anyway.
                        if let Ok(mut b) = a.backend.try_lock() {
                            *b = None;
                        }
                    }
                }
                let later = if cfg.limits == before {
                    ""
                } else {
                    "; [limits] take effect at the next start"
                };
                let mut f = Map::new();
                f.insert("backends".into(), Value::from(n));
                f.insert(
                    "skills".into(),
                    Value::from(crate::skills::invalidate(&cfg)),
                );
                self.shared.events.emit("config-reloaded", f);
                Ok(format!("config reloaded: {n} backends{later}\n"))
            }
            "kill" => {
                self.shared.stop.send_replace(true);
                Ok("stopping\n".into())
            }
            other => Err(Error::new(format!(
                "unknown command {other:?} (valid: {})",
                valid()
            ))),
        }
    }

    pub(super) async fn session_ctl(&self, s: &Arc<Session>, cmd: &str) -> Result<String> {
        let line = single_command(cmd)?;
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"cost_cap") {
            return Self::cost_cap(s, &words[1..]);
        }
        if words.len() > 1 {
            return Err(err(format!(
                "{}: takes no arguments (invalid argument)",
                words[0]
            )));
        }
        match words[0] {
            "help" => Ok(SESSION_CTL
                .iter()
                .map(|(c, h)| format!("{c}\t{h}\n"))
                .collect()),
            "kill" => {
                self.reg().kill_session(s).map_err(err)?;
                Ok("killed\n".into())
            }
            "save" => {
                s.save().map_err(err)?;
                for a in s.agents() {
                    a.save().map_err(err)?;
                }
                Ok("saved\n".into())
            }
            "invalidate" => {
                let cfg = self
                    .shared
                    .reload()
                    .map_err(|e| err(format!("invalidate: {e}")))?;
                if let LinkState::Up(c) = s.link.state() {
                    c.ctl(&format!("bypass_timeout {}", cfg.bypass_timeout_s))
                        .await
                        .map_err(err)?;
                    for a in s.agents() {
                        crate::link::configure_agent(&c, &a.tools_spec(), &cfg)
                            .await
                            .map_err(err)?;
                    }
                }
                Ok("config reloaded\n".into())
            }
            "pause" => {
                let changed = self.reg().set_paused(s, true).map_err(err)?;
                Ok(if changed {
                    "paused\n"
                } else {
                    "already paused\n"
                }
                .into())
            }
            "resume" => {
                let changed = self.reg().set_paused(s, false).map_err(err)?;
                Ok(if changed { "resumed\n" } else { "not paused\n" }.into())
            }
            "status" => Ok(format!(
                "remote={}\n{}",
                s.remote.as_deref().unwrap_or(""),
                s.link.status_lines()
            )),
            "cost" => Ok(format!(
                "cost_usd={:.6}\ncost_cap_usd={}\n",
                s.cost_usd(),
                s.cost_cap()
                    .or(self.shared.config().cost_cap_usd)
                    .map_or_else(|| "none".to_owned(), |c| c.to_string())
            )),
            other => Err(err(format!(
                "unknown command {:?} (valid: {})",
                clip(other),
                SESSION_CTL
                    .iter()
                    .map(|(c, _)| *c)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// `cost_cap` (show), `cost_cap USD` (set), `cost_cap off` (back to the config's).
    pub(super) fn cost_cap(s: &Session, args: &[&str]) -> Result<String> {
        let show = |c: Option<f64>| c.map_or_else(|| "none".to_owned(), |c| c.to_string());
        match args {
            [] => Ok(format!("{}\n", show(s.cost_cap()))),
            ["off"] => {
                s.set_cost_cap(None).map_err(err)?;
                Ok("cost_cap off\n".into())
            }
            [v] => {
                let c: f64 = v
                    .parse()
                    .ok()
                    .filter(|c: &f64| c.is_finite() && *c > 0.0)
                    .ok_or_else(|| {
                        err(format!(
                            "cost_cap: {:?} is not a positive amount of dollars (or off)",
                            clip(v)
                        ))
                    })?;
                s.set_cost_cap(Some(c)).map_err(err)?;
                Ok(format!("cost_cap {c}\n"))
            }
            _ => Err(err("cost_cap: takes one amount in dollars, or off")),
        }
    }

    pub(super) async fn agent_ctl(&self, a: &Arc<Agent>, cmd: &str) -> Result<String> {
        // `inject`'s text is everything after the verb, so it may run over several lines
        // (`{ echo inject; cat notes; }`); every other command is one line.
        if let Some(text) = inject_text(cmd) {
            return self.agent_inject(a, text);
        }
        let line = single_command(cmd)?;
        let (verb, rest) = match line.split_once(char::is_whitespace) {
            Some((v, r)) => (v, r.trim()),
            None => (line, ""),
        };
        let reg = self.reg();
        let config = self.shared.config();
        let no_args = |v: &str| -> Result<()> {
            if rest.is_empty() {
                Ok(())
            } else {
                Err(err(format!("{v}: takes no arguments (invalid argument)")))
            }
        };
        match verb {
            "help" => {
                no_args(verb)?;
                Ok(AGENT_CTL
                    .iter()
                    .map(|(c, h)| format!("{c}\t{h}\n"))
                    .collect())
            }
            "stop" => {
                no_args(verb)?;
                Ok(if a.stop_turn() {
                    "stopping\n".into()
                } else {
                    "not running\n".into()
                })
            }
            "compact" => {
                no_args(verb)?;
                crate::agent::turn::compact_now(self.reg(), a)
                    .await
                    .map_err(err)
            }
            "clear" => {
                no_args(verb)?;
                self.agent_clear(a)
            }
            "kill" => {
                no_args(verb)?;
                reg.kill_agent(a).map_err(err)?;
                Ok("killed\n".into())
            }
            "agent" => self.agent_profile(a, rest).await,
            "model" => {
                if rest.is_empty() {
                    let s = a.settings();
                    return Ok(format!("{}\n", s.model.unwrap_or_default()));
                }
                let mut s = a.settings();
                crate::state::settings::apply_setting(&mut s, "model", rest, &config)
                    .map_err(err)?;
                a.update_settings(|x| x.model = s.model.clone())
                    .map_err(err)?;
                Ok(format!("model {rest}\n"))
            }
            "models" => {
                no_args(verb)?;
                self.agent_models(a).await
            }
            "backend" => self.agent_backend(a, rest).await,
            "name" => {
                if rest.is_empty() {
                    return Ok(format!("{}\n", a.name()));
                }
                reg.rename_agent(a, rest).map_err(err)?;
                Ok(format!("name {rest}\n"))
            }
            "cwd" => {
                if rest.is_empty() {
                    return Ok(format!("{}\n", a.settings().cwd.display()));
                }
                let (dir, force) = match rest.rsplit_once(char::is_whitespace) {
                    Some((d, "force")) => (d.trim_end(), true),
                    _ => (rest, false),
                };
                let d = crate::state::settings::workspace_dir(dir, force).map_err(err)?;
                a.update_settings(|x| x.cwd = d.clone()).map_err(err)?;
                Ok(format!("cwd {}\n", d.display()))
            }
            "tools" => {
                no_args(verb)?;
                self.remote_rdwr(a, &["tools"], Some(&a.id)).await
            }
            "tool_load" | "tool_unload" => self.agent_tool(a, verb, rest).await,
            "proc" => self.agent_proc(a, rest).await,
            "systemprompt" => {
                no_args(verb)?;
                Ok(format!(
                    "{}\n",
                    crate::agent::turn::system_prompt(a, &config)
                ))
            }
            other => Err(err(format!(
                "unknown command {:?} (valid: {})",
                clip(other),
                agent_verbs()
            ))),
        }
    }

    /// `clear`: forgets the conversation history (the chat keeps a note).
    fn agent_clear(&self, a: &Agent) -> Result<String> {
        a.say("info", "", "conversation history cleared")
            .map_err(err)?;
        self.reg()
            .store
            .truncate_history(&a.session_id, &a.id)
            .map_err(|e| err(crate::error_chain(&e)))?;
        Ok("cleared\n".into())
    }

    /// `inject TEXT`: a user message added to the history without starting a turn.
    fn agent_inject(&self, a: &Agent, rest: &str) -> Result<String> {
        if rest.is_empty() {
            return Err(Error::invalid("inject: give the text to add"));
        }
        a.say("user", "injected", rest).map_err(err)?;
        self.reg()
            .store
            .append_history(
                &a.session_id,
                &a.id,
                &serde_json::json!({"role": "user", "content": rest, "injected": true}),
                crate::state::store::Sync::Now,
            )
            .map_err(|e| err(crate::error_chain(&e)))?;
        Ok("injected\n".into())
    }

    /// `agent [PROFILE]`: shows or changes the profile, applied in toolsrv at once.
    async fn agent_profile(&self, a: &Arc<Agent>, rest: &str) -> Result<String> {
        let config = self.shared.config();
        if rest.is_empty() {
            return Ok(format!(
                "{}\n",
                a.settings().profile.unwrap_or_else(|| "default".into())
            ));
        }
        let mut s = a.settings();
        crate::state::settings::apply_setting(&mut s, "profile", rest, &config).map_err(err)?;
        a.update_settings(|x| x.profile = s.profile.clone())
            .map_err(err)?;
        if let Some(sess) = a.session.upgrade()
            && let LinkState::Up(c) = sess.link.state()
        {
            crate::link::configure_agent(&c, &a.tools_spec(), &config)
                .await
                .map_err(err)?;
        }
        Ok(format!("profile {rest}\n"))
    }

    /// `backend`: the backend the agent's next turn uses, `NAME<TAB>KIND`. Read-only, as
    /// in the seed (cfg's `backend=` switches it).
    async fn agent_backend(&self, a: &Agent, rest: &str) -> Result<String> {
        let config = self.shared.config();
        if !rest.is_empty() {
            return Err(err(format!(
                "backend: read-only here, {:?} not applied (switch with backend=NAME in cfg; configured: {})",
                clip(rest),
                crate::state::settings::list_or_none(config.backends.keys())
            )));
        }
        let (name, cfg) =
            crate::backend::select::resolve(crate::agent::turn::backend_name(a, &config), &config)
                .await
                .map_err(err)?;
        Ok(format!("{name}\t{}\n", cfg.kind.name()))
    }

    /// `models`: what the agent's backend serves.
    async fn agent_models(&self, a: &Agent) -> Result<String> {
        let config = self.shared.config();
        let (name, cfg) =
            crate::backend::select::resolve(crate::agent::turn::backend_name(a, &config), &config)
                .await
                .map_err(err)?;
        let b = crate::backend::select::make(&name, &cfg).map_err(err)?;
        let models = tokio::time::timeout(MODELS_TIMEOUT, b.list_models())
            .await
            .map_err(|_| {
                err(format!(
                    "{name}: no answer within {} s",
                    MODELS_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| err(e.to_string()))?;
        Ok(models.iter().map(|m| format!("{m}\n")).collect())
    }

    /// `tool_load NAME`, `tool_unload NAME`: changes the agent's own tool list.
    async fn agent_tool(&self, a: &Agent, verb: &str, rest: &str) -> Result<String> {
        let config = self.shared.config();
        let names = ollie_link::tools::names();
        if rest.is_empty() {
            return Err(err(format!(
                "{verb}: give a tool name (tools: {})",
                names.join(", ")
            )));
        }
        if !names.contains(&rest) {
            return Err(err(format!(
                "{verb}: unknown tool {:?} (tools: {})",
                clip(rest),
                names.join(", ")
            )));
        }
        let load = verb == "tool_load";
        let current = {
            let s = a.settings();
            s.tools.clone().unwrap_or_else(|| {
                let p = s.profile.as_deref().unwrap_or("default");
                config
                    .profiles
                    .get(p)
                    .map(|p| p.tools.clone())
                    .unwrap_or_default()
            })
        };
        let mut next: Vec<String> = current.into_iter().filter(|t| t != rest).collect();
        if load {
            next.push(rest.to_owned());
        }
        let verbword = if load { "load" } else { "unload" };
        let sess = a.session.upgrade().ok_or_else(gone)?;
        let c = sess.link.conn(LINK_WAIT).await.map_err(err)?;
        c.ctl(&format!("{verbword} {} {rest}", a.id))
            .await
            .map_err(err)?;
        a.update_settings(|x| x.tools = Some(next)).map_err(err)?;
        Ok(format!("{verbword}ed {rest}\n"))
    }

    /// `proc …`: the agent's processes in toolsrv.
    async fn agent_proc(&self, a: &Agent, rest: &str) -> Result<String> {
        let words: Vec<&str> = rest.split_whitespace().collect();
        if let [_, pid] = words.as_slice()
            && words[0] != "top"
        {
            self.known_proc(a, pid).await?;
        }
        match words.as_slice() {
            [] => self.remote_rdwr(a, &["proc", "list"], None).await,
            ["top"] => self.proc_top(a).await,
            [op @ ("term" | "kill"), pid] => {
                self.remote_write(a, &["proc", pid, "ctl"], op).await?;
                Ok(format!("{op} {pid}\n"))
            }
            ["dismiss", pid] => {
                self.remote_write(a, &["proc", pid, "ctl"], "dismiss")
                    .await?;
                Ok(format!("dismissed {pid}\n"))
            }
            ["out", pid] => self.remote_rdwr(a, &["proc", pid, "out"], None).await,
            _ => Err(Error::invalid(
                "proc: proc, proc top, proc term|kill|out|dismiss PID",
            )),
        }
    }

    /// Refuses a PID that is not one of the agent's processes, in those words.
    async fn known_proc(&self, a: &Agent, pid: &str) -> Result<()> {
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::invalid(format!(
                "proc: {:?} is not a process number (proc lists them)",
                clip(pid)
            )));
        }
        let list = self.remote_rdwr(a, &["proc", "list"], None).await?;
        if list.lines().any(|l| l.split('\t').next() == Some(pid)) {
            Ok(())
        } else {
            Err(Error::new(format!("no process {pid} (proc lists them)")))
        }
    }
}

/// The text of an `inject TEXT` (or `i TEXT`) write: all of it after the verb, trimmed, over
/// any number of lines; `None` when the write is another command.
fn inject_text(cmd: &str) -> Option<&str> {
    let t = cmd.trim_start();
    let (verb, rest) = t.split_once(char::is_whitespace).unwrap_or((t, ""));
    matches!(verb, "inject" | "i").then(|| rest.trim())
}

/// The agent ctl's verbs (the first word of each [`AGENT_CTL`] entry, and `i`), for errors.
fn agent_verbs() -> String {
    let mut v: Vec<&str> = Vec::new();
    for (c, _) in AGENT_CTL {
        let w = c.split_whitespace().next().unwrap_or(c);
        if !v.contains(&w) {
            v.push(w);
        }
        if w == "inject" {
            v.push("i");
        }
    }
    v.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inject_takes_the_rest_of_the_write() {
        assert_eq!(inject_text("inject a\nb\n"), Some("a\nb"));
        assert_eq!(inject_text("  i  x "), Some("x"));
        assert_eq!(inject_text("inject"), Some(""));
        assert_eq!(inject_text("inject\n"), Some(""));
        assert_eq!(inject_text("injected x"), None);
        assert_eq!(inject_text("stop"), None);
        assert_eq!(inject_text(""), None);
        assert_eq!(inject_text("\n\ninject a"), Some("a"));
    }

    #[test]
    fn agent_verbs_name_every_command_once() {
        let v = agent_verbs();
        assert_eq!(
            v,
            "stop, compact, clear, kill, inject, i, agent, model, models, backend, name, cwd, \
             tools, tool_load, tool_unload, proc, systemprompt, help"
        );
    }
}
