//! Feeds arbitrary UTF-8 to olliesrv's configuration parsers (`config.toml`, a user policy
//! `policy/NAME.toml` and an agent profile `agents/NAME.toml`, as `Config::load_file` runs
//! them, through `ollie_olliesrv::fuzzing`; no file is read) and checks:
//!
//! - parsing never panics, and every error is one non-empty line, free of control characters
//!   (it reaches a terminal), that names the file it is about;
//! - parsing the same text twice gives the same configuration or the same error;
//! - an accepted `config.toml` has only well-named backends, each with every timeout in
//!   1 s..=`Timeouts::MAX_S`, its `default_backend` (if set) among them, a program for every
//!   remote, and the `default` profile;
//! - an accepted profile names only a backend of the configuration and policies it has,
//!   known tools once each, and 1..=1000 steps.
//!
//! The input is split at NUL bytes: the part before the first is `config.toml`, the next (if
//! any) an agent profile, the one after (if any) a user policy `user`, added before the
//! profile is read. The committed corpus (`corpus/config/`) started from
//! `packaging/config/config.toml`, the examples in README.md and docs/, and the unit tests'
//! snippets.
//!
//! Run with `scripts/fuzz.sh`, or `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run config`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ollie_olliesrv::fuzzing::{Config, Profile, Timeouts, add_policy, parse_config, parse_profile};
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = text.splitn(3, '\0');
    let main = parts.next().unwrap_or_default();
    let (profile_text, policy_text) = (parts.next(), parts.next());

    let config = parse_config(main);
    assert_eq!(
        format!("{config:?}"),
        format!("{:?}", parse_config(main)),
        "config.toml parsed twice differs"
    );
    let config = match config {
        Ok(c) => c,
        Err(e) => return check_error(&e, "config.toml"),
    };
    check_config(&config);

    let config = match policy_text {
        None => config,
        Some(t) => {
            let with = add_policy(config.clone(), t);
            assert_eq!(
                format!("{with:?}"),
                format!("{:?}", add_policy(config, t)),
                "the policy parsed twice differs"
            );
            match with {
                Ok(c) => c,
                Err(e) => return check_error(&e, "policy/user.toml"),
            }
        }
    };

    let Some(profile_text) = profile_text else {
        return;
    };
    let profile = parse_profile(&config, profile_text);
    assert_eq!(
        format!("{profile:?}"),
        format!("{:?}", parse_profile(&config, profile_text)),
        "the profile parsed twice differs"
    );
    match profile {
        Ok(p) => check_profile(&config, &p),
        Err(e) => check_error(&e, "agents/p.toml"),
    }
});

fn check_error(e: &str, file: &str) {
    assert!(!e.contains('\n'), "multi-line error: {e:?}");
    assert!(
        !e.chars().any(char::is_control),
        "a control character in the error: {e:?}"
    );
    assert!(
        e.starts_with(&format!("config {file}: ")) && e.len() > file.len() + 9,
        "the error does not name {file}: {e:?}"
    );
}

fn check_config(c: &Config) {
    let max = Duration::from_secs(Timeouts::MAX_S);
    for (name, b) in &c.backends {
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')),
            "backend name {name:?} accepted"
        );
        let t = &b.timeouts;
        for d in [t.connect, t.first_byte, t.idle] {
            assert!(
                Duration::ZERO < d && d <= max,
                "backend {name:?}: timeout {d:?} accepted"
            );
        }
    }
    if let Some(d) = &c.default_backend {
        assert!(
            c.backends.contains_key(d),
            "default_backend {d:?} undefined"
        );
    }
    for (name, r) in &c.remotes {
        assert!(
            r.command.first().is_some_and(|p| !p.is_empty()),
            "remote {name:?} runs no program"
        );
    }
    assert!(c.profiles.contains_key("default"), "no default profile");
}

fn check_profile(c: &Config, p: &Profile) {
    if let Some(b) = &p.backend {
        assert!(
            c.backends.contains_key(b),
            "profile backend {b:?} undefined"
        );
    }
    for policy in [&p.policy, &p.hooks.policy] {
        assert!(
            c.policies.contains_key(policy),
            "policy {policy:?} undefined"
        );
    }
    let known = Profile::builtin_default().tools;
    for (i, t) in p.tools.iter().enumerate() {
        assert!(known.contains(t), "unknown tool {t:?} accepted");
        assert!(!p.tools[..i].contains(t), "tool {t:?} listed twice");
    }
    assert!(
        (1..=1000).contains(&p.max_steps),
        "max_steps {} accepted",
        p.max_steps
    );
}
