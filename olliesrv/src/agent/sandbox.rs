//! The system prompt's account of the sandbox an agent's tools run in: what they may write,
//! what git can do there, the network they have, and which escalations the agent may ask for
//! and how. Made from the agent's profile and its policy's text, the same inputs toolsrv
//! enforces; and, for a call that failed on a refusal, lines that say which rule it met
//! ([`hint`]), so a model need not guess from `Read-only file system` what happened. toolsrv
//! keeps the last word: this only describes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use ollie_policy::{EscalationKind, Network, PathAnchor, PathTemplate, Policy};

use crate::config::Profile;

/// Devices every shipped profile makes writable; not worth a model's attention.
const QUIET_DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"];

/// The section for an agent with `profile` (its policy looked up in `policies`, the
/// configuration's policy texts) working in `cwd`. `None` when the profile names no policy
/// that parses (toolsrv refuses such an agent's tools anyway).
pub fn section(
    profile: Option<&Profile>,
    policies: &BTreeMap<String, String>,
    cwd: &Path,
) -> Option<String> {
    let (name, policy, asked) = agent_policy(profile, policies)?;
    Some(describe(name, &policy, &asked, cwd))
}

/// The agent's policy (name and rules) and the escalation kinds its profile asks for.
fn agent_policy<'p>(
    profile: Option<&'p Profile>,
    policies: &BTreeMap<String, String>,
) -> Option<(&'p str, Policy, Vec<&'p str>)> {
    let name = profile.map_or(ollie_policy::DEFAULT_PROFILE, |p| p.policy.as_str());
    let policy = Policy::from_toml(policies.get(name)?).ok()?;
    let asked = profile.map_or(Vec::new(), |p| {
        p.escalations.iter().map(String::as_str).collect()
    });
    Some((name, policy, asked))
}

/// Output that means a write was refused.
const READ_ONLY: &[&str] = &["Read-only file system", "EROFS"];
/// Output that means an access was refused (by Landlock, when the run had it).
const DENIED: &[&str] = &["Permission denied", "EACCES"];
/// Output that means a program was not found.
const NOT_FOUND: &[&str] = &["command not found", ": not found"];
/// Output that means a name did not resolve or a connection could not be made.
const NO_NETWORK: &[&str] = &[
    "Temporary failure in name resolution",
    "Could not resolve host",
    "Name or service not known",
    "EAI_AGAIN",
    "getaddrinfo",
    "Network is unreachable",
    "Failed to establish a new connection",
];

/// Lines for the result of a failed call (`reply`: toolsrv's framed reply, the run record on
/// its first line), saying what the sandbox did when the output shows a refusal: which paths
/// are writable or protected, the network mode, where PATH looks, and what the agent may ask
/// for. The facts come from the run record and the agent's policy; the output only says
/// which of them to give. `None` when there is no record or nothing to say.
pub fn hint(
    reply: &str,
    profile: Option<&Profile>,
    policies: &BTreeMap<String, String>,
) -> Option<String> {
    let (head, text) = reply.split_once('\n').unwrap_or((reply, ""));
    let meta: serde_json::Value = serde_json::from_str(head).ok()?;
    let record = meta.get("record").filter(|r| r.is_object())?;
    if record["layers"]["unsandboxed"].as_bool() == Some(true) {
        return None;
    }
    let (_, policy, asked) = agent_policy(profile, policies)?;
    let kinds = askable(&policy, &asked);
    let may = |k: &str| kinds.iter().any(|(n, _)| *n == k);
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    let mounts = &record["layers"]["mounts"];
    let list = |v: &serde_json::Value| -> String {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    let mut lines = Vec::new();
    if has(READ_ONLY) {
        let mut l = format!(
            "ollie: \"Read-only file system\" is the sandbox: only {} can be written",
            or_nothing(&list(&mounts["writable"]))
        );
        if let Some(t) = mounts["private_tmp"].as_str() {
            let _ = write!(l, " (and {t}, private to the sandbox)");
        }
        let protected = list(&mounts["protected"]);
        if !protected.is_empty() {
            let _ = write!(l, "; read-only even so: {protected}");
        }
        l.push('.');
        if text.contains(".git/") && protected.split(", ").any(|p| p.ends_with("/.git")) {
            l.push_str(" git cannot change .git here: leave commits to the user.");
        }
        l.push_str(if may("write") {
            " To write elsewhere, run it again with \"escalate\": {\"grants\": [\"write:PATH\"], \"reason\": \"…\"}."
        } else {
            " This agent cannot ask for more writes."
        });
        lines.push(l);
    } else if has(DENIED) && record["layers"]["landlock"]["status"].as_str() != Some("not_applied")
    {
        let mut l = "ollie: \"Permission denied\" may be the sandbox: a path outside the policy's rules cannot be read or written, and secrets never.".to_owned();
        if may("read") {
            l.push_str(" To read one, run it again with \"escalate\": {\"grants\": [\"read:PATH\"], \"reason\": \"…\"}.");
        }
        lines.push(l);
    }
    for p in placeholders_named(record, text) {
        lines.push(format!(
            "ollie: {p} is protected (it steers programs that run outside the sandbox): an empty read-only placeholder stands there for the run, so it cannot be made or written."
        ));
    }
    if record["exit"]["code"].as_i64() == Some(127) || has(NOT_FOUND) {
        let path = policy
            .env
            .set
            .get("PATH")
            .map_or("the policy's", String::as_str);
        lines.push(format!(
            "ollie: a program was not found: PATH in the sandbox is {path}; call others by their full path (they must lie in a readable and executable path of the policy)."
        ));
    }
    if has(NO_NETWORK) {
        let mode = record["layers"]["network"]["mode"].as_str().unwrap_or("");
        // Under the proxy an unlisted domain is asked for by the proxy itself, when the tool
        // goes through it; one that does not gets nothing, and a grant would not change that.
        let (what, askable) = match mode {
            "off" => ("the network is off in this sandbox", true),
            "proxy" => (
                "there is no DNS in this sandbox: connections go through the session's proxy (HTTPS_PROXY, HTTP_PROXY), which a tool must use",
                false,
            ),
            "tcp" => (
                "this sandbox allows TCP to the policy's ports only, and no UDP",
                true,
            ),
            _ => ("", false),
        };
        if !what.is_empty() {
            let ask = if !askable {
                ""
            } else if may("net") {
                " To reach a host, run it again with \"escalate\": {\"grants\": [\"net:DOMAIN\"], \"reason\": \"…\"}."
            } else {
                " This agent cannot ask for network access."
            };
            lines.push(format!("ollie: {what}.{ask}"));
        }
    }
    if lines.is_empty() {
        return None;
    }
    Some(lines.join("\n") + "\n")
}

/// Output that means a path could not be made or written.
const REFUSED: &[&str] = &[
    "Is a directory",
    "Not a directory",
    "Read-only file system",
    "Permission denied",
];

/// The run's placeholders (protected paths that did not exist, held by an empty read-only
/// directory for the run) that the output names, by path or relative to the run's cwd, next
/// to an error that such a placeholder causes.
fn placeholders_named<'r>(record: &'r serde_json::Value, text: &str) -> Vec<&'r str> {
    if !REFUSED.iter().any(|w| text.contains(w)) {
        return Vec::new();
    }
    let cwd = record["cwd"].as_str().unwrap_or("");
    let Some(all) = record["layers"]["mounts"]["placeholders"].as_array() else {
        return Vec::new();
    };
    all.iter()
        .filter_map(|p| p.as_str())
        .filter(|p| {
            let rel = p
                .strip_prefix(cwd)
                .and_then(|r| r.strip_prefix('/'))
                .filter(|r| !r.is_empty());
            text.contains(p) || rel.is_some_and(|r| text.contains(r))
        })
        .collect()
}

fn or_nothing(s: &str) -> &str {
    if s.is_empty() { "nothing" } else { s }
}

/// The text of [`section`] for `policy` (named `name`) and the escalation kinds the profile
/// lets the agent ask for (`asked`; those the policy refuses are left out). Kept to a few
/// lines: it goes with every model call, and small local models have small windows.
fn describe(name: &str, policy: &Policy, asked: &[&str], cwd: &Path) -> String {
    if policy.unsandboxed() {
        return format!("\n\nSandbox (policy {name:?}): none, commands run unconfined.");
    }
    let writable: Vec<String> = policy
        .fs
        .write
        .iter()
        .map(|t| shown(t, cwd))
        .filter(|p| !QUIET_DEVICES.contains(&p.as_str()))
        .collect();
    let mut s = format!("\n\nSandbox (policy {name:?}): ");
    if writable.is_empty() {
        s.push_str("nothing is writable but $TMPDIR (private)");
    } else {
        let _ = write!(
            s,
            "you can write only in {} and $TMPDIR (private)",
            writable.join(", ")
        );
    }
    let protected: Vec<String> = policy
        .fs
        .protected
        .iter()
        .map(|t| match t.anchor {
            PathAnchor::Workdir => t.rest.display().to_string(),
            _ => shown(t, cwd),
        })
        .collect();
    if !protected.is_empty() {
        let _ = write!(s, "; {} stay read-only", protected.join(", "));
    }
    let git = PathTemplate {
        anchor: PathAnchor::Workdir,
        rest: ".git".into(),
    };
    if policy.fs.protected.contains(&git) {
        s.push_str(", so git cannot commit (leave that to the user)");
    }
    s.push_str(if policy.fs.read_all {
        ". Everything else is readable except secrets."
    } else {
        ". Other paths outside the policy cannot be read."
    });
    let _ = write!(s, " Network: {}.", network(&policy.network));
    s.push_str(&escalations(policy, asked));
    s
}

/// A path as the model should read it: the workspace's own, `~/…` for the home, else as is.
fn shown(t: &PathTemplate, cwd: &Path) -> String {
    match t.anchor {
        PathAnchor::Workdir if t.rest.as_os_str().is_empty() => cwd.display().to_string(),
        PathAnchor::Workdir => cwd.join(&t.rest).display().to_string(),
        PathAnchor::Home if t.rest.as_os_str().is_empty() => "~".to_owned(),
        PathAnchor::Home => format!("~/{}", t.rest.display()),
        PathAnchor::Root => format!("/{}", t.rest.display()),
    }
}

/// What the network mode lets through, in a few words.
fn network(n: &Network) -> String {
    match n {
        Network::Off => "none".to_owned(),
        Network::Tcp { connect, .. } if connect.is_empty() => "none".to_owned(),
        Network::Tcp { connect, .. } => {
            format!("TCP to port {} only, no UDP", join(connect.iter()))
        }
        Network::Proxy(p) => {
            let mut reach: Vec<String> = p
                .presets
                .iter()
                .map(|n| format!("{n} registries"))
                .collect();
            reach.extend(p.allow.iter().cloned());
            let mut t = format!(
                "only through the proxy in HTTPS_PROXY/HTTP_PROXY, to {} on port {}",
                if reach.is_empty() {
                    "no domain yet".to_owned()
                } else {
                    reach.join(", ")
                },
                join(p.ports.iter())
            );
            if !p.deny.is_empty() {
                let _ = write!(t, ", never {}", join(p.deny.iter()));
            }
            t.push_str("; no DNS");
            t
        }
        Network::All => "the host's".to_owned(),
    }
}

/// The escalation kinds (`net`, `read`, `write`, `unsandboxed`) both the profile (`asked`)
/// and the policy allow, each with the grants it may ask for.
fn askable<'a>(policy: &Policy, asked: &[&str]) -> Vec<(&'a str, &'a str)> {
    [
        (EscalationKind::Net, "net", "net, net:PORT, net:DOMAIN"),
        (EscalationKind::Read, "read", "read:PATH"),
        (EscalationKind::Write, "write", "write:PATH"),
        (EscalationKind::Unsandboxed, "unsandboxed", "unsandboxed"),
    ]
    .into_iter()
    .filter(|(k, n, _)| policy.escalations.contains(k) && asked.contains(n))
    .map(|(_, n, grants)| (n, grants))
    .collect()
}

/// The sentence on asking for more, for the kinds both the profile and the policy allow.
fn escalations(policy: &Policy, asked: &[&str]) -> String {
    let kinds: Vec<&str> = askable(policy, asked).into_iter().map(|(_, g)| g).collect();
    if kinds.is_empty() {
        return " You cannot ask for more: do not retry what was refused.".to_owned();
    }
    format!(
        " To ask a person for more, add \"escalate\": {{\"grants\": [...], \"reason\": \"...\"}} to the call (grants: {}).",
        kinds.join(", ")
    )
}

fn join<T: std::fmt::Display>(it: impl Iterator<Item = T>) -> String {
    it.map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped(name: &str) -> BTreeMap<String, String> {
        ollie_policy::SHIPPED_PROFILES
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect()
    }

    fn profile(policy: &str, escalations: &[&str]) -> Profile {
        let mut p = Profile::builtin_default();
        p.policy = policy.to_owned();
        p.escalations = escalations.iter().map(|s| (*s).to_owned()).collect();
        p
    }

    #[test]
    fn the_workspace_profile_says_what_is_writable_and_that_git_is_read_only() {
        let p = profile("workspace", &["net", "write"]);
        let s = section(Some(&p), &shipped("workspace"), Path::new("/src/app")).unwrap();
        assert_eq!(
            s,
            "\n\nSandbox (policy \"workspace\"): you can write only in /src/app and $TMPDIR \
             (private); .git, .envrc, .claude, .vscode, .idea stay read-only, so git cannot \
             commit (leave that to the user). Other paths outside the policy cannot be read. \
             Network: none. To ask a person for more, add \"escalate\": {\"grants\": [...], \
             \"reason\": \"...\"} to the call (grants: net, net:PORT, net:DOMAIN, write:PATH)."
        );
    }

    #[test]
    fn without_escalations_the_model_is_told_not_to_retry() {
        let p = profile("readonly", &[]);
        let s = section(Some(&p), &shipped("readonly"), Path::new("/w")).unwrap();
        assert!(s.contains("You cannot ask for more"), "{s}");
        assert!(!s.contains("escalate"), "{s}");
    }

    #[test]
    fn the_proxy_mode_names_its_domains_and_ports() {
        let p = profile("packages", &["net"]);
        let s = section(Some(&p), &shipped("packages"), Path::new("/w")).unwrap();
        assert!(s.contains("only through the proxy"), "{s}");
        assert!(s.contains("pypi registries"), "{s}");
        assert!(s.contains("on port 80, 443; no DNS"), "{s}");
    }

    /// A framed reply as toolsrv sends it for a failed run of `cwd` under the workspace
    /// profile, with `text` as its output.
    fn reply(network: &str, code: i64, text: &str) -> String {
        let record = serde_json::json!({
            "exit": {"code": code},
            "layers": {
                "unsandboxed": false,
                "landlock": {"status": "fully_enforced"},
                "network": {"mode": network},
                "mounts": {
                    "writable": ["/w"],
                    "protected": ["/w/.git", "/w/.envrc"],
                    "private_tmp": "/tmp"
                }
            }
        });
        format!(
            "{}\n{text}",
            serde_json::json!({"pid": 7, "record": record})
        )
    }

    #[test]
    fn a_refused_write_names_the_writable_and_protected_paths_and_how_to_ask() {
        let pol = shipped("workspace");
        let text = "fatal: Unable to create '/w/.git/index.lock': Read-only file system\n";
        let with = profile("workspace", &["write"]);
        let h = hint(&reply("off", 128, text), Some(&with), &pol).unwrap();
        assert!(h.starts_with("ollie: \"Read-only file system\" is the sandbox: only /w can be written (and /tmp, private to the sandbox); read-only even so: /w/.git, /w/.envrc."), "{h}");
        assert!(h.contains("leave commits to the user"), "{h}");
        assert!(h.contains("write:PATH"), "{h}");
        let without = profile("workspace", &[]);
        let h = hint(&reply("off", 1, text), Some(&without), &pol).unwrap();
        assert!(h.contains("cannot ask for more writes"), "{h}");
        assert!(!h.contains("escalate"), "{h}");
    }

    #[test]
    fn not_found_and_network_refusals_say_where_path_looks_and_the_mode() {
        let pol = shipped("workspace");
        let p = profile("workspace", &["net"]);
        let h = hint(&reply("off", 127, "sh: 1: rg: not found\n"), Some(&p), &pol).unwrap();
        assert!(
            h.contains("PATH in the sandbox is /usr/local/bin:/usr/bin:/bin"),
            "{h}"
        );
        let h = hint(
            &reply("off", 6, "curl: (6) Could not resolve host: pypi.org\n"),
            Some(&p),
            &pol,
        )
        .unwrap();
        assert!(h.contains("the network is off"), "{h}");
        assert!(h.contains("net:DOMAIN"), "{h}");
        // Under the proxy a grant would not help a tool that ignores it: no ask.
        let h = hint(
            &reply(
                "proxy",
                1,
                "socket.gaierror: [Errno -3] Temporary failure in name resolution\n",
            ),
            Some(&p),
            &pol,
        )
        .unwrap();
        assert!(h.contains("no DNS"), "{h}");
        assert!(!h.contains("escalate"), "{h}");
    }

    #[test]
    fn no_hint_without_a_record_a_refusal_or_a_sandbox() {
        let pol = shipped("workspace");
        let p = profile("workspace", &["write"]);
        assert_eq!(
            hint(&reply("off", 1, "assertion failed\n"), Some(&p), &pol),
            None
        );
        assert_eq!(
            hint("plain text, Read-only file system\n", Some(&p), &pol),
            None
        );
        let unboxed = reply("off", 1, "Read-only file system\n")
            .replace("\"unsandboxed\":false", "\"unsandboxed\":true");
        assert_eq!(hint(&unboxed, Some(&p), &pol), None);
    }

    #[test]
    fn an_unknown_or_invalid_policy_gives_no_section() {
        let p = profile("nosuch", &[]);
        assert_eq!(
            section(Some(&p), &shipped("workspace"), Path::new("/w")),
            None
        );
        let bad = BTreeMap::from([("workspace".to_owned(), "[fs]\nbogus = 1\n".to_owned())]);
        assert_eq!(section(None, &bad, Path::new("/w")), None);
    }
}
