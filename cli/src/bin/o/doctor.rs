//! `o doctor`: what this machine's sandbox offers, from `ollie_sandbox::probe()`, and whether
//! the rest of a working system is in place: the toolsrv binary, the configuration and its
//! backends (`olliesrv --check-config --probe`), the server's socket.
//!
//! One line per item, `✓` or `✗`, with the facts or the reason and the fix. Exit 0 when
//! everything required is present, 1 otherwise; `--json` prints one object (`ok`, `items`
//! with `status` "ok" or "missing", `probe`) for scripts.

use crate::doctor_system::Item;
use ollie_sandbox::{CgroupVersion, ControllerProbe, Probe};
use std::io::Write;
use std::process::ExitCode;

pub const AFTER_HELP: &str = "Checks what the tool sandbox can enforce for this user here: \
    Landlock, seccomp, user and IPC namespaces, the pids and memory cgroups (made and removed \
    as a run would), and /dev/fuse for o mount; then the toolsrv binary (as olliesrv finds it: \
    $OLLIE_TOOLSRV, next to it, PATH), the configuration as olliesrv reads it and each \
    backend's model list (olliesrv --check-config --probe: one request each, to the configured \
    URL only), and the server's socket (-a, or the default: its directory and socket private, \
    a server answering). One line per item: ✓ or ✗, with the reason and the fix.\n\
    EXIT STATUS: 0 everything required is present (IPC namespaces, fuse, the server and the \
    backends' answers are optional), 1 something is missing.\n\n\
    EXAMPLES:\n  \
    o doctor\n  \
    o doctor --json | jq '.items[] | select(.status == \"missing\")'";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object (ok, items, probe) instead of lines.
    #[arg(long)]
    json: bool,
    /// The configuration file to check (default: the one olliesrv reads).
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
}

fn version(v: Option<CgroupVersion>) -> &'static str {
    match v {
        Some(CgroupVersion::V1) => "v1",
        Some(CgroupVersion::V2) => "v2",
        None => "",
    }
}

/// Where a controller's cgroups go, in words.
fn cgroup_facts(c: &ControllerProbe, uid: u32) -> String {
    let parent = c
        .parent
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let who = if c.delegated {
        format!(", delegated to uid {uid}")
    } else {
        String::new()
    };
    format!(
        "cgroup {}, runs' cgroups go in {parent}{who}",
        version(c.version)
    )
}

/// The host has swap configured (`/proc/swaps` lists a device or file).
fn host_has_swap() -> bool {
    std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1)
}

/// A program found in `PATH`.
fn in_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// The proxy mode's requirement: network namespaces.
fn egress_item(p: &Probe) -> Item {
    Item::new(
        "egress proxy",
        false,
        p.network_namespaces,
        if p.network_namespaces {
            "network namespaces can be created: runs under network.mode = \"proxy\" reach only their session's proxy (127.0.0.1:3128 in a namespace of their own), which allows requests by domain".to_owned()
        } else {
            "network namespaces cannot be created: runs under network.mode = \"proxy\" (the packages profile) fail; other modes are unaffected".to_owned()
        },
        "optional, for the proxy mode: allow net in the service manager's RestrictNamespaces= (the unit's network.conf drop-in does), or unprivileged user namespaces with network namespaces",
    )
}

fn items(p: &Probe, uid: u32) -> Vec<Item> {
    let floor = ollie_policy::DEFAULT_LANDLOCK_MIN_ABI;
    let mut v = vec![
        Item::new(
            "landlock",
            true,
            p.landlock_abi >= floor,
            if p.landlock_abi == 0 {
                format!("not available (policies need ABI {floor})")
            } else {
                format!("ABI {} (policies need {floor})", p.landlock_abi)
            },
            "Linux 6.15 or later with landlock in the LSM list (lsm=…,landlock on the kernel command line)",
        ),
        Item::new(
            "seccomp",
            true,
            p.seccomp,
            if p.seccomp {
                "filter mode".to_owned()
            } else {
                "filter mode is not available".to_owned()
            },
            "a kernel built with CONFIG_SECCOMP_FILTER, and no service manager's filter refusing seccomp()",
        ),
        Item::new(
            "user namespaces",
            true,
            p.user_namespaces,
            if p.user_namespaces {
                "can be created (each run's user, pid and mount namespaces)".to_owned()
            } else {
                "cannot be created".to_owned()
            },
            "sysctl user.max_user_namespaces > 0 (Debian: kernel.unprivileged_userns_clone=1; Ubuntu 23.10+: kernel.apparmor_restrict_unprivileged_userns=0)",
        ),
        Item::new(
            "ipc namespaces",
            false,
            p.ipc_namespaces,
            if p.ipc_namespaces {
                "can be created (a private SysV IPC namespace per run)".to_owned()
            } else {
                "cannot be created: runs share the runner's (tools cannot use SysV IPC anyway)"
                    .to_owned()
            },
            "optional; allow ipc in the service manager's RestrictNamespaces=",
        ),
        egress_item(p),
    ];
    let pids = &p.cgroups.pids;
    v.push(if uid != 0 && !pids.available() {
        Item::new(
            "pids cgroup",
            false,
            true,
            "not needed: RLIMIT_NPROC bounds the processes of an unprivileged user's runs (the new user namespace makes it per run)".to_owned(),
            "",
        )
    } else {
        Item::new(
            "pids cgroup",
            uid == 0,
            pids.available(),
            if pids.available() {
                format!("{} (pids.max = limits.processes)", cgroup_facts(pids, uid))
            } else {
                format!(
                    "{} (as root RLIMIT_NPROC does not bound processes: root runs are refused)",
                    pids.reason.clone().unwrap_or_default()
                )
            },
            "mount a writable pids cgroup hierarchy (v1 pids, or v2 with pids enabled for the runner's cgroup), or run unprivileged",
        )
    });
    let mem = &p.cgroups.memory;
    let swap_note = if mem.available() && !mem.swap_bounded && host_has_swap() {
        "; swap is not accounted (swapaccount=0), so swap can extend the bound"
    } else {
        ""
    };
    v.push(Item::new(
        "memory cgroup",
        true,
        mem.available(),
        if mem.available() {
            format!(
                "{} (limits.memory_bytes bounds all of a run's memory, memfd and tmpfs included){swap_note}",
                cgroup_facts(mem, uid)
            )
        } else {
            format!(
                "{}: runs are bounded by RLIMIT_AS only; the tool may not create memfds (memfd_create fails with EPERM) and its private /dev/shm is capped at limits.memory_bytes, but files in writable tmpfs trees are bounded only by the disk limits",
                mem.reason.clone().unwrap_or_default()
            )
        },
        if uid == 0 {
            "mount the memory controller (cgroup v1 memory hierarchy, or v2 with memory enabled in the runner's cgroup.subtree_control)"
        } else {
            "delegate a cgroup to this user: a systemd unit with Delegate=yes (e.g. systemd-run --user -p Delegate=yes …), or have an administrator create one, chown it with its cgroup.procs to this user and start the runner in it (see SECURITY.md)"
        },
    ));
    let fusermount = uid == 0 || in_path("fusermount3");
    v.push(Item::new(
        "fuse",
        false,
        p.fuse && fusermount,
        match (p.fuse, fusermount) {
            (true, true) => "/dev/fuse can be opened (o mount)".to_owned(),
            (false, _) => {
                "/dev/fuse cannot be opened (o mount needs it; the sandbox does not)".to_owned()
            }
            (true, false) => "fusermount3 is not in PATH (o mount needs it as non-root)".to_owned(),
        },
        "optional, for o mount: load the fuse module and install fuse3",
    ));
    v
}

pub fn main(args: Args, addr: Option<String>, key: Option<std::path::PathBuf>) -> ExitCode {
    let probe = ollie_sandbox::probe();
    let uid = nix::unistd::geteuid().as_raw();
    let mut items = items(&probe, uid);
    items.extend(crate::doctor_system::items(
        args.config.as_deref(),
        addr.as_deref(),
        key.as_deref(),
    ));
    let ok = items.iter().all(|i| i.ok() || !i.required);
    let mut out = std::io::stdout().lock();
    // The details quote the system (error messages, cgroup paths, mount options), so they
    // are escaped like any text `o` did not write itself (see the `render` module).
    let written = if args.json {
        let v = serde_json::json!({ "ok": ok, "items": items, "probe": probe });
        writeln!(out, "{}", crate::render::json_safe(&v.to_string()))
    } else {
        items.iter().try_for_each(|i| {
            let optional = if i.required || i.ok() {
                ""
            } else {
                " (optional)"
            };
            let detail = crate::render::line_safe(&i.detail);
            let mark = if i.ok() { "✓" } else { "✗" };
            let name = crate::render::line_safe(&i.name);
            match &i.fix {
                Some(fix) => writeln!(out, "{mark} {name}{optional}: {detail}; fix: {fix}"),
                None => writeln!(out, "{mark} {name}: {detail}"),
            }
        })
    };
    match written.and_then(|()| out.flush()) {
        Ok(()) => ExitCode::from(u8::from(!ok)),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::from(141),
        Err(e) => {
            eprintln!("o doctor: writing standard output: {e}");
            ExitCode::from(1)
        }
    }
}
