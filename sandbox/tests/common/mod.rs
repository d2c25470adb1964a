//! What every sandbox test file needs: the kernel-feature gate and visible skips.
#![allow(dead_code, clippy::panic)]

/// Prints a SKIP line past libtest's output capture, so skips are always visible. With
/// `OLLIE_TEST_REQUIRE=all` nothing may be skipped: the test fails instead.
pub fn skip(line: &str) {
    use std::io::Write;
    if std::env::var("OLLIE_TEST_REQUIRE").as_deref() == Ok("all") {
        panic!("{line} (OLLIE_TEST_REQUIRE=all)");
    }
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Whether the kernel offers what the sandbox needs (Landlock ABI 7, user namespaces). When
/// it does not, prints `SKIP <test>: <reason>` and returns false — or, under
/// `OLLIE_TEST_REQUIRE=all`, fails the test.
pub fn features_ok(test: &str) -> bool {
    let p = ollie_sandbox::probe();
    let missing = if p.landlock_abi < 7 {
        Some(format!("landlock ABI {} < 7", p.landlock_abi))
    } else if !p.user_namespaces {
        Some("user namespaces are disabled".to_string())
    } else {
        None
    };
    match missing {
        None => true,
        Some(r) if std::env::var("OLLIE_TEST_REQUIRE").as_deref() == Ok("all") => {
            panic!("{test}: required kernel feature missing: {r}")
        }
        Some(r) => {
            skip(&format!("SKIP {test}: {r}"));
            false
        }
    }
}

/// The shipped profile `profile` with its `[limits]` table replaced by `limits` (TOML lines).
#[allow(clippy::unwrap_used)]
pub fn profile_with_limits(profile: &str, limits: &str) -> ollie_policy::Policy {
    let base = ollie_policy::SHIPPED_PROFILES
        .iter()
        .find(|(n, _)| *n == profile)
        .unwrap()
        .1;
    let start = base.find("[limits]").unwrap();
    let end = base[start..].find("\n[env]").unwrap() + start;
    ollie_policy::Policy::from_toml(&format!(
        "{}[limits]\n{limits}\n{}",
        &base[..start],
        &base[end..]
    ))
    .unwrap()
}
