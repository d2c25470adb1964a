//! The system prompt's account of the sandbox an agent's tools run in: what they may write,
//! what git can do there, the network they have, and which escalations the agent may ask for
//! and how. Made from the agent's profile and its policy's text, the same inputs toolsrv
//! enforces, so a model need not guess from `Read-only file system` what happened. toolsrv
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
    let name = profile.map_or(ollie_policy::DEFAULT_PROFILE, |p| p.policy.as_str());
    let policy = Policy::from_toml(policies.get(name)?).ok()?;
    let asked: Vec<&str> = profile.map_or(Vec::new(), |p| {
        p.escalations.iter().map(String::as_str).collect()
    });
    Some(describe(name, &policy, &asked, cwd))
}

/// The text of [`section`] for `policy` (named `name`) and the escalation kinds the profile
/// lets the agent ask for (`asked`; those the policy refuses are left out).
fn describe(name: &str, policy: &Policy, asked: &[&str], cwd: &Path) -> String {
    let mut s = format!(
        "\n\nSandbox: every command you run is confined by the {name:?} policy of ollie.\n"
    );
    if policy.unsandboxed() {
        s.push_str("- Commands run without the sandbox.\n");
        return s;
    }
    let show = |t: &PathTemplate| shown(t, cwd);
    let writable: Vec<String> = policy
        .fs
        .write
        .iter()
        .map(show)
        .filter(|p| !QUIET_DEVICES.contains(&p.as_str()))
        .collect();
    if writable.is_empty() {
        s.push_str("- Nothing is writable: every file is read-only.\n");
    } else {
        let _ = writeln!(s, "- Writable: {}.", writable.join(", "));
    }
    let protected: Vec<String> = policy.fs.protected.iter().map(show).collect();
    if !protected.is_empty() {
        let _ = writeln!(
            s,
            "- Read-only even so: {} (they steer programs that run outside the sandbox later).",
            protected.join(", ")
        );
    }
    let git = PathTemplate {
        anchor: PathAnchor::Workdir,
        rest: ".git".into(),
    };
    if policy.fs.protected.contains(&git) {
        s.push_str(
            "- git can read the repository (status, diff, log, show) but not change .git: no \
             add, commit, checkout of branches or stash. Leave commits to the user.\n",
        );
    }
    if policy.fs.read_all {
        s.push_str("- Everything else can be read, except secrets (keys, tokens, credentials).\n");
    } else {
        s.push_str(
            "- Outside the policy's paths nothing can be read (permission denied); secrets \
             (keys, tokens, credentials) never.\n",
        );
    }
    s.push_str(
        "- For temporary files use $TMPDIR: private to the sandbox and discarded with it.\n",
    );
    let _ = writeln!(s, "- Network: {}", network(&policy.network));
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

/// One sentence on what the network mode lets through.
fn network(n: &Network) -> String {
    match n {
        Network::Off => "none (connections are refused and names do not resolve).".to_owned(),
        Network::Tcp { connect, .. } if connect.is_empty() => {
            "TCP only, to no port (connections are refused).".to_owned()
        }
        Network::Tcp { connect, .. } => format!(
            "TCP connections to port {} only; no UDP.",
            join(connect.iter())
        ),
        Network::Proxy(p) => {
            let mut allowed: Vec<String> = p.allow.iter().cloned().collect();
            allowed.extend(p.presets.iter().map(|n| format!("the {n} registries")));
            let reach = if allowed.is_empty() {
                "no domain yet".to_owned()
            } else {
                allowed.join(", ")
            };
            let mut t = format!(
                "only through the session's proxy (HTTPS_PROXY and HTTP_PROXY are set): {reach}, \
                 on port {}",
                join(p.ports.iter())
            );
            if !p.deny.is_empty() {
                let _ = write!(
                    t,
                    ", never {}",
                    p.deny.iter().cloned().collect::<Vec<_>>().join(", ")
                );
            }
            t.push_str(
                ". Other hosts get 403 from the proxy. There is no DNS: a tool that ignores the \
                 proxy variables cannot connect.",
            );
            t
        }
        Network::All => "the host's network (TCP and UDP, any host).".to_owned(),
    }
}

/// The line on asking for more, for the kinds both the profile and the policy allow.
fn escalations(policy: &Policy, asked: &[&str]) -> String {
    let kinds: Vec<&str> = [
        (EscalationKind::Net, "net", "net, net:PORT or net:DOMAIN"),
        (EscalationKind::Read, "read", "read:PATH"),
        (EscalationKind::Write, "write", "write:PATH"),
        (EscalationKind::Unsandboxed, "unsandboxed", "unsandboxed"),
    ]
    .into_iter()
    .filter(|(k, n, _)| policy.escalations.contains(k) && asked.contains(n))
    .map(|(_, _, grants)| grants)
    .collect();
    if kinds.is_empty() {
        return "- You cannot ask for more than this: a refused operation stays refused, so say \
                what you would need instead of retrying.\n"
            .to_owned();
    }
    format!(
        "- When a command needs more, run it again with the escalate argument, e.g. \
         {{\"grants\": [\"write:PATH\"], \"reason\": \"why\"}}; a person approves or refuses, \
         for that call only. You may ask for: {}.\n",
        kinds.join("; ")
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
        assert!(s.contains("\"workspace\" policy"), "{s}");
        assert!(s.contains("- Writable: /src/app.\n"), "{s}");
        assert!(s.contains("/src/app/.git, /src/app/.envrc"), "{s}");
        assert!(s.contains("not change .git"), "{s}");
        assert!(s.contains("- Network: none"), "{s}");
        // The profile asks for net and write, the policy allows net, read and write.
        assert!(
            s.contains("You may ask for: net, net:PORT or net:DOMAIN; write:PATH.\n"),
            "{s}"
        );
        assert!(!s.contains("/dev/null"), "{s}");
    }

    #[test]
    fn without_escalations_the_model_is_told_not_to_retry() {
        let p = profile("readonly", &[]);
        let s = section(Some(&p), &shipped("readonly"), Path::new("/w")).unwrap();
        assert!(s.contains("cannot ask for more"), "{s}");
        assert!(!s.contains("escalate argument"), "{s}");
    }

    #[test]
    fn the_proxy_mode_names_its_domains_and_ports() {
        let p = profile("packages", &["net"]);
        let s = section(Some(&p), &shipped("packages"), Path::new("/w")).unwrap();
        assert!(s.contains("only through the session's proxy"), "{s}");
        assert!(s.contains("the pypi registries"), "{s}");
        assert!(s.contains("on port 80, 443"), "{s}");
        assert!(s.contains("There is no DNS"), "{s}");
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
