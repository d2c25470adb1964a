//! Writing the tree's files: the parts of `Twrite` that are more than a store — the TCP
//! key check, the files whose write is a command (ctl files, `generate`, `session/new`,
//! `bypass/full`) and an agent's `cfg`.

use std::sync::Arc;

use bytes::Bytes;
use ollie_p9::{Error, Result};

use crate::link::LinkState;
use crate::state::session::parse_spec;
use crate::state::{Agent, Session};
use crate::util::clip;

use super::node::{Node, OllieFid, TcpAuth};
use super::table::{AFile, RootFile, SFile};
use super::union::{self, NsOwner};
use super::{OllieFs, err, prompt, text};

/// Compares without an early exit on the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `generate`'s input: a prompt (without the line end `echo` adds), or, when the write
/// begins with `{`, `{"prompt": …, "backend": …}`. Errors are one line, whatever the input.
fn generate_request(t: &str) -> Result<(String, Option<String>)> {
    const EMPTY: &str = "generate: empty prompt (write a prompt, or {\"prompt\":…})";
    if t.trim().is_empty() {
        return Err(Error::invalid(EMPTY));
    }
    if !t.trim_start().starts_with('{') {
        return Ok((t.trim_end_matches(['\n', '\r']).to_owned(), None));
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Gen {
        prompt: String,
        #[serde(default)]
        backend: Option<String>,
    }
    let g: Gen = serde_json::from_str(t).map_err(|e| {
        Error::invalid(format!(
            "generate: a write beginning with {{ is the JSON form {{\"prompt\":…, \"backend\":…}}: {}",
            clip_long(&e.to_string())
        ))
    })?;
    if g.prompt.trim().is_empty() {
        return Err(Error::invalid(EMPTY));
    }
    Ok((g.prompt, g.backend))
}

/// At most 200 characters of `s` on one line: control characters (a newline in a JSON key
/// the decoder quotes back) escaped.
fn clip_long(s: &str) -> String {
    let mut out = String::new();
    for c in ollie_link::text::clip(s, 200).chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

impl OllieFs {
    /// The Tauth exchange of a TCP connection: the key, written once to a fresh afid.
    pub(super) fn write_key(&self, fid: &mut OllieFid, data: &[u8]) -> Result<()> {
        if fid.auth != Some(TcpAuth::Fresh) {
            return Err(Error::new(
                "permission denied: this afid is spent; start a new Tauth",
            ));
        }
        let given = data.strip_suffix(b"\n").unwrap_or(data);
        let ok = self
            .shared
            .tcp_key
            .as_deref()
            .is_some_and(|k| constant_time_eq(k, given));
        if !ok {
            fid.auth = Some(TcpAuth::Failed);
            return Err(Error::new("permission denied: wrong key"));
        }
        fid.auth = Some(TcpAuth::Verified);
        Ok(())
    }

    /// A write that is a command, and its reply.
    pub(super) async fn command(&self, node: &Node, data: &[u8]) -> Result<Bytes> {
        let reg = self.reg();
        let reply = match node {
            Node::R(RootFile::Ctl) => self.root_ctl(text(data)?)?,
            Node::R(RootFile::BypassFull) => {
                return reg.bypass.full(&reg.sessions(), data).await.map_err(err);
            }
            Node::R(RootFile::Generate) => {
                let (prompt, backend) = generate_request(text(data)?)?;
                let config = self.shared.config();
                let mut r = crate::agent::turn::generate(&config, &prompt, backend.as_deref())
                    .await
                    .map_err(err)?;
                if !r.ends_with('\n') {
                    r.push('\n');
                }
                r
            }
            Node::R(RootFile::SessionNew) => {
                let spec = parse_spec(
                    text(data)?,
                    &[
                        "name", "cwd", "backend", "model", "profile", "remote", "force",
                    ],
                )
                .map_err(err)?;
                let s = reg.create_session(spec).map_err(err)?;
                format!("{}\n", s.name())
            }
            Node::S(s, SFile::Ctl) => self.session_ctl(s, text(data)?).await?,
            Node::A(a, AFile::Ctl) => self.agent_ctl(a, text(data)?).await?,
            Node::S(s, SFile::NsCtl) => {
                let owner = NsOwner::Session(Arc::clone(s));
                union::ctl(&owner, text(data)?, &self.shared.events).map_err(err)?
            }
            Node::A(a, AFile::NsCtl) => {
                let owner = NsOwner::Agent(Arc::clone(a));
                union::ctl(&owner, text(data)?, &self.shared.events).map_err(err)?
            }
            _ => return Err(Error::permission_denied()),
        };
        Ok(Bytes::from(reply))
    }

    /// A Twrite of `agent/new`: a request (`key=value` pairs) creates the agent at once; a
    /// `prompt=` (the last key) runs to the end of what the fid writes, and is queued when
    /// the fid is read or clunked ([`super::prompt`] has the rule).
    pub(super) fn write_agent_new(
        &self,
        fid: &mut OllieFid,
        s: &Arc<Session>,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        if let Some(w) = &mut fid.prompt
            && w.draft.continues(offset)
        {
            return w.draft.write(offset, data).map_err(err);
        }
        // A new request: the one before is complete.
        self.finish_prompt(fid, false)?;
        fid.reply = None;
        fid.waiting = None;
        // The keys must be UTF-8; the prompt may end inside a character (a split write).
        let valid = match std::str::from_utf8(data) {
            Ok(t) => t,
            Err(e) => std::str::from_utf8(data.get(..e.valid_up_to()).unwrap_or_default())
                .unwrap_or_default(),
        };
        let (keys, at) = prompt::split_prompt_key(valid);
        if at.is_none() && valid.len() != data.len() {
            return Err(Error::invalid("not utf-8"));
        }
        let spec = parse_spec(
            keys,
            &[
                "name", "cwd", "backend", "model", "profile", "prompt", "force",
            ],
        )
        .map_err(err)?;
        let first = at.and_then(|i| data.get(i..)).unwrap_or_default();
        if at.is_some() && first.iter().all(u8::is_ascii_whitespace) {
            return Err(err("empty prompt"));
        }
        let a = self.reg().create_agent(s, &spec).map_err(err)?;
        match at {
            Some(i) => {
                let draft = prompt::PromptDraft::new(offset + i as u64, first).map_err(|e| {
                    err(format!(
                        "agent {} was created without its prompt: {e}",
                        a.name()
                    ))
                })?;
                fid.prompt = Some(prompt::PromptWriter { agent: a, draft });
            }
            None => fid.reply = Some(Bytes::from(format!("{}\n", a.id))),
        }
        Ok(())
    }

    /// Completes the prompt a fid was writing (at its clunk, a read, or the next request):
    /// queues it. For `agent/new` the read then waits for that prompt's turn. A blank prompt
    /// is not queued, and is an error when `blank_is_error` (its fid is let go or read; at
    /// the start of the next prompt it is dropped without one).
    pub(super) fn finish_prompt(&self, fid: &mut OllieFid, blank_is_error: bool) -> Result<()> {
        let Some(w) = fid.prompt.take() else {
            return Ok(());
        };
        let t = match w.draft.finish().map_err(err)? {
            prompt::Finished::Prompt(t) => t,
            prompt::Finished::Refused => return Ok(()),
            prompt::Finished::Blank if blank_is_error => {
                return Err(err("empty prompt: nothing was queued"));
            }
            prompt::Finished::Blank => return Ok(()),
        };
        if !matches!(fid.node, Node::S(_, SFile::AgentNew)) {
            return w.agent.enqueue(t).map_err(err);
        }
        let after = w.agent.turn_seq();
        w.agent
            .enqueue(prompt::spawn_prompt_text(&t))
            .map_err(err)?;
        fid.waiting = Some((w.agent, after));
        Ok(())
    }

    /// An agent's `cfg`: `key=value` lines. `name=` and `id=` are shown too, so `cat cfg >
    /// f; cat f > cfg` works: the id must be the agent's own, the name renames. A new
    /// profile is applied in toolsrv at once.
    pub(super) async fn write_agent_cfg(&self, a: &Arc<Agent>, t: &str) -> Result<()> {
        let config = self.shared.config();
        let mut rest = String::new();
        let mut rename = None;
        let mut named = false;
        for line in t.lines() {
            match line.trim().split_once('=') {
                Some(("id", v)) if v.trim() != a.id => {
                    return Err(err(format!(
                        "id is immutable ({} is not {})",
                        clip(v.trim()),
                        a.id
                    )));
                }
                Some(("id", _)) => named = true,
                Some(("name", v)) if v.trim() != a.name() => {
                    crate::state::validate_name(v.trim()).map_err(err)?;
                    rename = Some(v.trim().to_owned());
                    named = true;
                }
                Some(("name", _)) => named = true,
                _ => {
                    rest.push_str(line);
                    rest.push('\n');
                }
            }
        }
        let changed = if rest.trim().is_empty() && named {
            Vec::new()
        } else {
            a.set_cfg(&rest, &config).map_err(err)?
        };
        if let Some(to) = rename {
            self.reg().rename_agent(a, &to).map_err(err)?;
        }
        if changed.iter().any(|(k, _)| k == "profile")
            && let Some(s) = a.session.upgrade()
            && let LinkState::Up(c) = s.link.state()
        {
            crate::link::configure_agent(&c, &a.tools_spec(), &config)
                .await
                .map_err(err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(t: &str) -> String {
        generate_request(t)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn generate_takes_a_plain_prompt_or_json() {
        let plain = generate_request("summarize this repo\n").ok();
        assert_eq!(plain, Some(("summarize this repo".to_owned(), None)));
        let two = generate_request("line one\nline two\r\n").ok();
        assert_eq!(two, Some(("line one\nline two".to_owned(), None)));
        let j = generate_request("{\"prompt\":\"explain recursion\"}\n").ok();
        assert_eq!(j, Some(("explain recursion".to_owned(), None)));
        let j = generate_request(r#" {"prompt": "x", "backend": "b"}"#).ok();
        assert_eq!(j, Some(("x".to_owned(), Some("b".to_owned()))));
        let j = generate_request(r#"{"prompt": "x", "backend": null}"#).ok();
        assert_eq!(j, Some(("x".to_owned(), None)));
    }

    #[test]
    fn bad_generate_input_is_one_line() {
        for (t, want) in [
            ("", "empty prompt"),
            ("  \n\n", "empty prompt"),
            (r#"{"prompt":""}"#, "empty prompt"),
            (r#"{"prompt":" \n"}"#, "empty prompt"),
            ("{}", "missing field `prompt`"),
            (r#"{"prompt":"x","colour":1}"#, "unknown field `colour`"),
            (r#"{"prompt":1}"#, "invalid type"),
            (r#"{"prompt":"x"} and more"#, "trailing characters"),
            (r#"{"prompt":"x","prompt":"y"}"#, "duplicate field"),
            ("{oops", "JSON form"),
            ("{\"a\\nb\":1}", "unknown field `a\\nb`"),
        ] {
            let m = e(t);
            assert!(m.contains(want), "{t:?}: {m:?}");
            assert!(
                m.starts_with("invalid argument: generate: "),
                "{t:?}: {m:?}"
            );
            assert!(!m.contains('\n'), "{t:?}: {m:?}");
        }
        let long = format!("{{\"{}\":1}}", "k".repeat(5000));
        let m = e(&long);
        assert!(m.len() < 400 && m.ends_with('…'), "{m}");
    }
}
