//! Feature probes: what the sandbox needs and this kernel lacks, and whether FUSE mounts work.
//!
//! Each probe answers with the reason it is missing; `features_ok` turns that into a SKIP line
//! or, under `OLLIE_TEST_REQUIRE=all`, a failure.

use std::path::Path;

use crate::skip_or_fail;

/// What the sandbox needs and this kernel lacks (Landlock ABI 7, user namespaces), if anything.
pub fn missing_sandbox_features() -> Option<String> {
    let p = ollie_sandbox::probe();
    if p.landlock_abi < 7 {
        Some(format!("landlock ABI {} < 7", p.landlock_abi))
    } else if !p.user_namespaces {
        Some("user namespaces are disabled".to_string())
    } else {
        None
    }
}

/// Whether the kernel offers what the sandbox needs. When it does not, prints
/// `SKIP <name>: <reason>` and returns false, or under the rule fails with
/// `<name>: required kernel feature missing: <reason>`.
pub fn features_ok(name: &str) -> bool {
    match missing_sandbox_features() {
        None => true,
        Some(r) => skip_or_fail(
            name,
            &r,
            &format!("{name}: required kernel feature missing: {r}"),
        ),
    }
}

/// Why this process may not mount FUSE filesystems, if it may not: it needs `/dev/fuse`, and
/// as a non-root user the setuid `fusermount3` and `/dev/fuse` open to the caller.
pub fn missing_fuse() -> Option<&'static str> {
    let root = nix::unistd::geteuid().is_root();
    if !Path::new("/dev/fuse").exists() {
        Some("no /dev/fuse")
    } else if !root
        && ![
            "/usr/bin/fusermount3",
            "/bin/fusermount3",
            "/usr/local/bin/fusermount3",
        ]
        .iter()
        .any(|p| Path::new(p).exists())
    {
        Some("not root and no fusermount3 (apt install fuse3)")
    } else if !root
        && std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .is_err()
    {
        // fusermount3 opens it as the caller (Debian's udev makes it 0666; scripts/deps.sh
        // does so where there is no udev).
        Some("/dev/fuse is not open to this user (chmod 0666 /dev/fuse)")
    } else {
        None
    }
}
