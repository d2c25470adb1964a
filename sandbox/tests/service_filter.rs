//! The sandbox under a service manager's seccomp filter: systemd installs one for the whole
//! unit (`SystemCallFilter=~@privileged`, `RestrictNamespaces=user mnt pid net`), which every
//! child inherits and which refuses `capset` and `pivot_root` (EPERM), `clone`/`unshare` with
//! `CLONE_NEWIPC` (EPERM) and `clone3` (ENOSYS, so that callers fall back to `clone`, whose
//! flags a filter can see). Installing a filter is irreversible, so this suite re-executes its
//! own binary as the probe (`service-probe VARIANT BASE` as the first arguments), which
//! installs an imitation of that filter first thing, while single-threaded (with
//! `no_new_privs` only where an unprivileged process needs it), then runs sandboxes under the
//! shipped `workspace` profile and prints one JSON object. Hence `harness = false` and the
//! small harness in `main`, which accepts (and mostly ignores) libtest's arguments: names
//! filter tests, `--skip NAME` skips them.
//!
//! Variants (what the filter refuses):
//! - `capset`: `capset`. The tool must still end up with no capability in any set, one-shot
//!   and prepared, and Landlock must still confine its writes.
//! - `capget-too`: `capset` and `capget`. The sandbox cannot verify that `execve` drops every
//!   capability, so the run must fail at the capabilities stage without running the command.
//! - `noipc`: IPC namespaces (and `clone3`). Runs share the probe's IPC namespace (the record
//!   says so), and the tool filter still denies SysV IPC.
//! - `unit`: all of the above plus `pivot_root` (EPERM) and `openat2` (ENOSYS, as
//!   `RestrictSUIDSGID=yes` answers it). Union runs must fail with a clear one-line error;
//!   plain runs (whose Landlock rule paths are then resolved without openat2) still work.
//!
//! Each test compares with the same step outside the filter (in the harness process), so the
//! difference is the filter's. Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7
//! or user namespaces, or if this process cannot create IPC namespaces; with
//! `OLLIE_TEST_REQUIRE=all` that fails instead. Run as root and as an unprivileged user
//! (`scripts/test-unprivileged.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_sandbox::{Prepared, RunRequest, UnionMount};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

mod common;
use common::features_ok;

/// The first argument that makes this binary the probe.
const PROBE: &str = "service-probe";

/// The union point of the union runs (absent on the host).
const POINT: &str = "/ctx";

/// The capability lines of `/proc/self/status`.
const CAP_LINES: [&str; 5] = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(PROBE) {
        return probe_main(&args[1..]);
    }
    let tests: [(&str, fn()); 4] = [
        (
            "capset_refused_still_leaves_the_tool_no_capability",
            capset_refused_still_leaves_the_tool_no_capability,
        ),
        (
            "capset_and_capget_refused_fails_closed",
            capset_and_capget_refused_fails_closed,
        ),
        (
            "ipc_namespaces_forbidden_runs_without_one_and_the_filter_still_denies_sysv",
            ipc_namespaces_forbidden_runs_without_one_and_the_filter_still_denies_sysv,
        ),
        (
            "pivot_root_refused_makes_union_runs_fail_clearly",
            pivot_root_refused_makes_union_runs_fail_clearly,
        ),
    ];
    common::run_harness(&tests, &args)
}

// ---------------------------------------------------------------------------------------------
// Raw system calls (the filter, and direct checks of what it refuses).

#[allow(unsafe_code)]
mod raw {
    /// The errno of the last failed call.
    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// Installs `programs` (seccompiler's output, in order) on this thread, as a service
    /// manager does: without `no_new_privs` where the process may (CAP_SYS_ADMIN), setting it
    /// first where the kernel requires it (EACCES). Returns whether it set `no_new_privs`.
    pub fn install(programs: &[seccompiler::BpfProgram]) -> Result<bool, String> {
        let mut nnp = false;
        for p in programs {
            let insns: Vec<libc::sock_filter> = p
                .iter()
                .map(|i| libc::sock_filter {
                    code: i.code,
                    jt: i.jt,
                    jf: i.jf,
                    k: i.k,
                })
                .collect();
            let prog = libc::sock_fprog {
                len: insns.len() as u16,
                filter: insns.as_ptr() as *mut libc::sock_filter,
            };
            for attempt in 0..2 {
                // SAFETY: `prog` points at `insns`, which outlives the call; the kernel
                // copies the program.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_seccomp,
                        libc::SECCOMP_SET_MODE_FILTER,
                        0u32,
                        &prog as *const libc::sock_fprog,
                    )
                };
                if r == 0 {
                    break;
                }
                let e = errno();
                if e != libc::EACCES || attempt == 1 {
                    return Err(format!("seccomp(SET_MODE_FILTER): errno {e}"));
                }
                // SAFETY: prctl on integer arguments.
                if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                    return Err(format!("PR_SET_NO_NEW_PRIVS: errno {}", errno()));
                }
                nnp = true;
            }
        }
        Ok(nnp)
    }

    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }

    const VERSION_3: u32 = 0x2008_0522;

    /// `capget` of this process: 0 or the errno.
    pub fn capget() -> i32 {
        let mut hdr = Header {
            version: VERSION_3,
            pid: 0,
        };
        let mut data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        // SAFETY: a valid header and a two-element data array, as the v3 ABI requires.
        let r =
            unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut Header, data.as_mut_ptr()) };
        if r == 0 { 0 } else { errno() }
    }

    /// `capset` to the sets this process already has (read from `/proc/self/status`, so not
    /// through `capget`): a no-op the kernel always allows. 0 or the errno.
    pub fn capset_unchanged() -> i32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let set = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(":"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or(0)
        };
        let (eff, prm, inh) = (set("CapEff"), set("CapPrm"), set("CapInh"));
        let hdr = Header {
            version: VERSION_3,
            pid: 0,
        };
        let data = [0, 32].map(|shift| Data {
            effective: (eff >> shift) as u32,
            permitted: (prm >> shift) as u32,
            inheritable: (inh >> shift) as u32,
        });
        // SAFETY: a valid header and a two-element data array, as the v3 ABI requires.
        let r = unsafe { libc::syscall(libc::SYS_capset, &hdr as *const Header, data.as_ptr()) };
        if r == 0 { 0 } else { errno() }
    }

    /// `clone3(NULL, 0)`: the kernel refuses the size with EINVAL before creating anything;
    /// a filter that answers clone3 with ENOSYS answers first. 0 or the errno.
    pub fn clone3_errno() -> i32 {
        // SAFETY: clone3 with a zero size fails validation; no process is created.
        let r = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
        if r == 0 { 0 } else { errno() }
    }
}

/// The imitation of systemd's filter for `variant` (x86_64, default allow): one program whose
/// matches return EPERM, and for `noipc`/`unit` one that answers `clone3` with ENOSYS.
fn service_filter(variant: &str) -> Result<Vec<seccompiler::BpfProgram>, String> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };
    let (capset, capget, noipc, pivot_root) = match variant {
        "capset" => (true, false, false, false),
        "capget-too" => (true, true, false, false),
        "noipc" => (false, false, true, false),
        "unit" => (true, false, true, true),
        other => return Err(format!("unknown variant {other}")),
    };
    let err = |e: seccompiler::BackendError| e.to_string();
    let newipc = libc::CLONE_NEWIPC as u64;
    let ipc_rule = || -> Result<Vec<SeccompRule>, String> {
        let c = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(newipc),
            newipc,
        )
        .map_err(err)?;
        Ok(vec![SeccompRule::new(vec![c]).map_err(err)?])
    };
    let mut eperm: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    if capset {
        eperm.insert(libc::SYS_capset, vec![]);
    }
    if capget {
        eperm.insert(libc::SYS_capget, vec![]);
    }
    if noipc {
        eperm.insert(libc::SYS_clone, ipc_rule()?);
        eperm.insert(libc::SYS_unshare, ipc_rule()?);
    }
    if pivot_root {
        eperm.insert(libc::SYS_pivot_root, vec![]);
    }
    let compile = |rules, errno: i32| -> Result<seccompiler::BpfProgram, String> {
        SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            TargetArch::x86_64,
        )
        .map_err(err)?
        .try_into()
        .map_err(err)
    };
    let mut programs = vec![compile(eperm, libc::EPERM)?];
    if noipc {
        // `unit` also answers openat2 with ENOSYS, as RestrictSUIDSGID=yes does (its filter
        // cannot see inside openat2's struct): the sandbox must then resolve paths itself.
        let mut enosys = BTreeMap::from([(libc::SYS_clone3, vec![])]);
        if pivot_root {
            enosys.insert(libc::SYS_openat2, vec![]);
        }
        programs.push(compile(enosys, libc::ENOSYS)?);
    }
    Ok(programs)
}

// ---------------------------------------------------------------------------------------------
// The probe (a child process, single-threaded; the filter comes first).

fn probe_main(args: &[String]) -> ExitCode {
    let [variant, base] = args else {
        eprintln!("usage: {PROBE} capset|capget-too|noipc|unit BASE");
        return ExitCode::from(2);
    };
    let installed = service_filter(variant).and_then(|p| raw::install(&p));
    let v = match installed {
        Err(e) => json!({ "filter_error": e }),
        Ok(nnp) => {
            // Not dropped (that would remove it): the harness owns the directory.
            let d = std::mem::ManuallyDrop::new(Dirs(PathBuf::from(base)));
            // Under `noipc`, a one-shot run before anything asks about IPC namespaces: its
            // clone is the probe (refused with CLONE_NEWIPC, done without).
            let first = (variant == "noipc").then(|| {
                outcome(ollie_sandbox::run(
                    &workspace_policy(),
                    &d.req(&["readlink", "/proc/self/ns/ipc"]),
                ))
            });
            let mut v = json!({
                "variant": variant,
                "no_new_privs_set": nnp,
                "self": self_checks(),
            });
            match variant.as_str() {
                "capset" => capset_probe(&d, &mut v),
                "capget-too" => capget_probe(&d, &mut v),
                "noipc" => {
                    v["first_oneshot_ns"] = first.unwrap_or_default();
                    noipc_probe(&d, &mut v);
                }
                _ => unit_probe(&d, &mut v),
            }
            v
        }
    };
    println!("{v}");
    ExitCode::SUCCESS
}

/// What this process itself can do (the probe under its filter, or the harness without).
fn self_checks() -> Value {
    json!({
        "capset_errno": raw::capset_unchanged(),
        "capget_errno": raw::capget(),
        "clone3_errno": raw::clone3_errno(),
        "ipc_namespaces": ollie_sandbox::ipc_namespaces(),
        "prepared_namespaces": ollie_sandbox::prepared_namespaces(),
        "ipc_ns": ipc_ns(),
        "seccomp_filters": status_field("Seccomp_filters"),
    })
}

fn status_field(name: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| Some(l.strip_prefix(name)?.strip_prefix(':')?.trim().to_string()))
        .unwrap_or_default()
}

fn ipc_ns() -> String {
    std::fs::read_link("/proc/self/ns/ipc")
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

fn workspace_policy() -> ollie_policy::Policy {
    common::profile_with_limits("workspace", "")
}

/// `{"status", "stdout", "stderr", "namespaces"}` of a run, or `{"error"}`.
fn outcome(r: Result<ollie_sandbox::RunOutput, ollie_sandbox::SandboxError>) -> Value {
    match r {
        Ok(o) => json!({
            "status": o.record.exit.status,
            "stdout": String::from_utf8_lossy(&o.stdout),
            "stderr": String::from_utf8_lossy(&o.stderr),
            "namespaces": o.record.layers.namespaces,
        }),
        Err(e) => json!({ "error": error_chain(&e) }),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

const CAPS: &str = "grep ^Cap /proc/self/status";

fn capset_probe(d: &Dirs, v: &mut Value) {
    let p = workspace_policy();
    v["oneshot_caps"] = outcome(ollie_sandbox::run(&p, &d.req(&["sh", "-c", CAPS])));
    v["oneshot_write_inside"] = outcome(ollie_sandbox::run(
        &p,
        &d.req(&["sh", "-c", "echo ok > inside && cat inside"]),
    ));
    v["oneshot_write_outside"] = outcome(ollie_sandbox::run(
        &p,
        &d.req(&["sh", "-c", &d.write_outside("oneshot")]),
    ));
    match Prepared::new(&p, &d.p("w"), &d.p("home")) {
        Err(e) => v["prepared_new"] = json!({ "error": error_chain(&e) }),
        Ok(sb) => {
            v["prepared_new"] = json!("ok");
            v["prepared_caps_1"] = outcome(sb.run(&d.req(&["sh", "-c", CAPS])));
            v["prepared_caps_2"] = outcome(sb.run(&d.req(&["sh", "-c", CAPS])));
            v["prepared_write_inside"] = outcome(sb.run(&d.req(&[
                "sh",
                "-c",
                "echo ok > inside-prepared && cat inside-prepared",
            ])));
            v["prepared_write_outside"] =
                outcome(sb.run(&d.req(&["sh", "-c", &d.write_outside("prepared")])));
        }
    }
}

fn capget_probe(d: &Dirs, v: &mut Value) {
    let p = workspace_policy();
    v["oneshot"] = outcome(ollie_sandbox::run(
        &p,
        &d.req(&["sh", "-c", "touch marker-oneshot"]),
    ));
    match Prepared::new(&p, &d.p("w"), &d.p("home")) {
        Err(e) => v["prepared_new"] = json!({ "error": error_chain(&e) }),
        Ok(sb) => {
            v["prepared_new"] = json!("ok");
            v["prepared"] = outcome(sb.run(&d.req(&["sh", "-c", "touch marker-prepared"])));
        }
    }
}

/// `ipcmk -M 4096` in this process (outside any sandbox), removing the segment it made.
fn ipcmk_here() -> Value {
    let out = match std::process::Command::new("ipcmk")
        .args(["-M", "4096"])
        .output()
    {
        Ok(o) => o,
        Err(e) => return json!({ "error": e.to_string() }),
    };
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    json!({
        "status": out.status.code(),
        "stdout": stdout,
        "stderr": String::from_utf8_lossy(&out.stderr),
        "removed": remove_segment(&stdout),
    })
}

/// Removes the shared-memory segment `ipcmk` reported in `stdout` ("Shared memory id: N"), if
/// any; whether one was removed.
fn remove_segment(stdout: &str) -> bool {
    let Some(id) = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Shared memory id:"))
        .map(str::trim)
    else {
        return false;
    };
    std::process::Command::new("ipcrm")
        .args(["-m", id])
        .status()
        .is_ok_and(|s| s.success())
}

fn noipc_probe(d: &Dirs, v: &mut Value) {
    let p = workspace_policy();
    v["ipcmk_here"] = ipcmk_here();
    let tool = outcome(ollie_sandbox::run(
        &p,
        &d.req(&["sh", "-c", "ipcmk -M 4096"]),
    ));
    // Should the tool have made one, it is in this (the host's) namespace: remove it.
    v["ipcmk_tool_segment_removed"] =
        json!(remove_segment(tool["stdout"].as_str().unwrap_or_default()));
    v["ipcmk_tool"] = tool;
    v["oneshot_ns"] = outcome(ollie_sandbox::run(
        &p,
        &d.req(&["readlink", "/proc/self/ns/ipc"]),
    ));
    match Prepared::new(&p, &d.p("w"), &d.p("home")) {
        Err(e) => v["prepared_new"] = json!({ "error": error_chain(&e) }),
        Ok(sb) => {
            v["prepared_new"] = json!("ok");
            v["prepared_ns"] = outcome(sb.run(&d.req(&["readlink", "/proc/self/ns/ipc"])));
        }
    }
}

fn unit_probe(d: &Dirs, v: &mut Value) {
    let p = workspace_policy();
    v["union"] = outcome(ollie_sandbox::run(&p, &d.union_req()));
    v["oneshot_caps"] = outcome(ollie_sandbox::run(&p, &d.req(&["sh", "-c", CAPS])));
    v["oneshot_ns"] = outcome(ollie_sandbox::run(
        &p,
        &d.req(&["readlink", "/proc/self/ns/ipc"]),
    ));
    match Prepared::new(&p, &d.p("w"), &d.p("home")) {
        Err(e) => v["prepared_new"] = json!({ "error": error_chain(&e) }),
        Ok(sb) => {
            v["prepared_new"] = json!("ok");
            v["prepared_caps"] = outcome(sb.run(&d.req(&["sh", "-c", CAPS])));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared by both sides: the scratch directory `BASE` with the workspace `w`, a home, a
// directory `outside` the policy does not grant, and a union's member `A`, shadow `U`, work
// dir `W`.

struct Dirs(PathBuf);

impl Dirs {
    fn new(name: &str) -> Dirs {
        let d = std::env::temp_dir().join(format!(
            "ollie-service-filter-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        for sub in ["w", "home", "outside", "A", "U", "W"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::fs::write(d.join("A/x"), "a\n").unwrap();
        Dirs(d.canonicalize().unwrap())
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }

    fn req(&self, argv: &[&str]) -> RunRequest {
        let mut r = RunRequest::new(argv.iter().map(OsString::from).collect(), self.p("w"));
        r.home = self.p("home");
        r.base_env = vec![("LANG".into(), "C.UTF-8".into())];
        r
    }

    /// A union run that would leave a marker in the workspace and print a member's file.
    fn union_req(&self) -> RunRequest {
        let mut r = self.req(&["sh", "-c", &format!("touch marker-union; cat {POINT}/x")]);
        r.unions = vec![UnionMount {
            point: PathBuf::from(POINT),
            lowers: vec![self.p("A")],
            upper: self.p("U"),
            work: self.p("W"),
        }];
        r
    }

    /// A script that tries to create `outside/NAME` and prints `write <status>`.
    fn write_outside(&self, name: &str) -> String {
        format!(
            "echo x > {}; echo \"write $?\"",
            self.p("outside").join(name).display()
        )
    }

    fn probe(&self, variant: &str) -> Value {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(&exe)
            .args([PROBE, variant])
            .arg(&self.0)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "probe failed: {}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(v.get("filter_error").is_none(), "{v:#}");
        // The filter is on the probe, and it is the filter that refuses (checked directly).
        assert_ne!(v["self"]["seccomp_filters"], "0", "{v:#}");
        v
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------------
// The tests (in the harness process).

/// The five capability sets from `grep ^Cap /proc/self/status` output, as hex strings.
fn caps(out: &Value) -> BTreeMap<String, String> {
    let text = out["stdout"].as_str().unwrap_or_else(|| panic!("{out:#}"));
    let m: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    for k in CAP_LINES {
        assert!(m.contains_key(k), "{k} missing: {out:#}");
    }
    m
}

/// A run that succeeded and left the tool no capability in any of the five sets.
fn assert_no_capability(out: &Value) {
    assert_eq!(out["status"], 0, "{out:#}");
    for (k, v) in caps(out) {
        assert_eq!(
            u64::from_str_radix(&v, 16).unwrap(),
            0,
            "{k} = {v}: {out:#}"
        );
    }
}

fn namespaces(out: &Value) -> Vec<String> {
    out["namespaces"]
        .as_array()
        .unwrap_or_else(|| panic!("no record: {out:#}"))
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect()
}

fn has_ipc(out: &Value) -> bool {
    namespaces(out).iter().any(|n| n.starts_with("ipc"))
}

/// Whether this (unfiltered) process can create IPC namespaces, which the comparisons need;
/// prints a SKIP line if not (or fails under `OLLIE_TEST_REQUIRE=all`).
fn ipc_namespaces_here(test: &str) -> bool {
    if ollie_sandbox::ipc_namespaces() {
        return true;
    }
    common::skip(&format!(
        "SKIP {test}: this process cannot create IPC namespaces (already under such a filter?)"
    ));
    false
}

fn capset_refused_still_leaves_the_tool_no_capability() {
    if !features_ok("capset_refused_still_leaves_the_tool_no_capability") {
        return;
    }
    let d = Dirs::new("capset");
    let v = d.probe("capset");
    // capset is refused in the probe and allowed here; nothing else is.
    assert_eq!(v["self"]["capset_errno"], libc::EPERM, "{v:#}");
    assert_eq!(raw::capset_unchanged(), 0);
    assert_eq!(v["self"]["capget_errno"], 0, "{v:#}");
    assert_eq!(v["self"]["ipc_namespaces"], true, "{v:#}");
    // One-shot and two prepared calls: every set of the tool is empty.
    assert_no_capability(&v["oneshot_caps"]);
    assert!(has_ipc(&v["oneshot_caps"]), "{v:#}");
    assert_eq!(v["prepared_new"], "ok", "{v:#}");
    assert_no_capability(&v["prepared_caps_1"]);
    assert_no_capability(&v["prepared_caps_2"]);
    // Landlock still confines writes: the workspace yes, outside no.
    for k in ["oneshot_write_inside", "prepared_write_inside"] {
        assert_eq!(v[k]["status"], 0, "{k}: {v:#}");
        assert_eq!(v[k]["stdout"], "ok\n", "{k}: {v:#}");
    }
    assert_eq!(std::fs::read_to_string(d.p("w/inside")).unwrap(), "ok\n");
    assert_eq!(
        std::fs::read_to_string(d.p("w/inside-prepared")).unwrap(),
        "ok\n"
    );
    for (k, name) in [
        ("oneshot_write_outside", "oneshot"),
        ("prepared_write_outside", "prepared"),
    ] {
        let out = v[k]["stdout"].as_str().unwrap_or_else(|| panic!("{v:#}"));
        assert!(
            out.starts_with("write ") && out != "write 0\n",
            "{k}: {v:#}"
        );
        assert!(!d.p("outside").join(name).exists(), "{k}: {v:#}");
    }
}

fn capset_and_capget_refused_fails_closed() {
    if !features_ok("capset_and_capget_refused_fails_closed") {
        return;
    }
    let d = Dirs::new("capget");
    let v = d.probe("capget-too");
    assert_eq!(v["self"]["capset_errno"], libc::EPERM, "{v:#}");
    assert_eq!(v["self"]["capget_errno"], libc::EPERM, "{v:#}");
    assert_eq!(raw::capget(), 0);
    // The drop cannot be verified: the run fails at the capabilities stage, nothing ran.
    let e = v["oneshot"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("the run was not refused: {v:#}"));
    eprintln!("capget-too one-shot error: {e}");
    assert!(e.contains("capability drop"), "{v:#}");
    assert!(e.contains("did not run"), "{v:#}");
    assert!(!d.p("w/marker-oneshot").exists(), "{v:#}");
    // The same through a prepared sandbox (refused when created, or per call).
    let pe = match v["prepared_new"].as_str() {
        Some("ok") => v["prepared"]["error"].as_str(),
        _ => v["prepared_new"]["error"].as_str(),
    }
    .unwrap_or_else(|| panic!("the prepared call was not refused: {v:#}"));
    eprintln!("capget-too prepared error: {pe}");
    assert!(pe.contains("capability drop"), "{v:#}");
    assert!(!d.p("w/marker-prepared").exists(), "{v:#}");
}

fn ipc_namespaces_forbidden_runs_without_one_and_the_filter_still_denies_sysv() {
    let test = "ipc_namespaces_forbidden_runs_without_one_and_the_filter_still_denies_sysv";
    if !features_ok(test) || !ipc_namespaces_here(test) {
        return;
    }
    let d = Dirs::new("noipc");
    let v = d.probe("noipc");
    let me = self_checks();
    // The filter is what forbids IPC namespaces (and clone3); capset is not refused.
    assert_eq!(v["self"]["ipc_namespaces"], false, "{v:#}");
    assert_eq!(me["ipc_namespaces"], true, "{me:#}");
    assert_eq!(v["self"]["clone3_errno"], libc::ENOSYS, "{v:#}");
    assert_ne!(me["clone3_errno"], libc::ENOSYS, "{me:#}");
    assert_eq!(v["self"]["capset_errno"], 0, "{v:#}");
    // The probe shares this process's (the host's) IPC namespace.
    assert_eq!(v["self"]["ipc_ns"], me["ipc_ns"], "{v:#}");
    // Runs succeed without an IPC namespace, and the record says so: also the first, whose
    // clone found out that IPC namespaces are refused.
    let first = &v["first_oneshot_ns"];
    assert_eq!(first["status"], 0, "{v:#}");
    assert!(!has_ipc(first), "{v:#}");
    assert_eq!(
        first["stdout"].as_str().unwrap().trim(),
        v["self"]["ipc_ns"]
    );
    let ns = &v["oneshot_ns"];
    assert_eq!(ns["status"], 0, "{v:#}");
    assert!(!has_ipc(ns), "{v:#}");
    assert_eq!(ns["stdout"].as_str().unwrap().trim(), v["self"]["ipc_ns"]);
    assert_eq!(v["prepared_new"], "ok", "{v:#}");
    let pns = &v["prepared_ns"];
    assert_eq!(pns["status"], 0, "{v:#}");
    assert!(!has_ipc(pns), "{v:#}");
    assert!(
        !v["self"]["prepared_namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().starts_with("ipc")),
        "{v:#}"
    );
    assert_eq!(pns["stdout"].as_str().unwrap().trim(), v["self"]["ipc_ns"]);
    // Without the filter, the same run gets an IPC namespace of its own.
    let p = workspace_policy();
    let here = outcome(ollie_sandbox::run(
        &p,
        &d.req(&["readlink", "/proc/self/ns/ipc"]),
    ));
    assert_eq!(here["status"], 0, "{here:#}");
    assert!(has_ipc(&here), "{here:#}");
    let tool_ns = here["stdout"].as_str().unwrap().trim();
    assert!(tool_ns.starts_with("ipc:["), "{here:#}");
    assert_ne!(tool_ns, me["ipc_ns"], "{here:#}");
    // SysV IPC: the probe itself can make a segment (removed at once), the tool in the shared
    // namespace cannot (the tool filter denies shmget).
    let hm = &v["ipcmk_here"];
    assert_eq!(hm["status"], 0, "{v:#}");
    assert_eq!(hm["removed"], true, "{v:#}");
    let tm = &v["ipcmk_tool"];
    assert_ne!(tm["status"], 0, "{v:#}");
    assert!(
        !tm["stdout"].as_str().unwrap().contains("Shared memory id"),
        "{v:#}"
    );
    assert_eq!(v["ipcmk_tool_segment_removed"], false, "{v:#}");
    eprintln!(
        "noipc: ipcmk in the sandbox: status {}, stderr {}",
        tm["status"],
        tm["stderr"].as_str().unwrap().trim()
    );
}

fn pivot_root_refused_makes_union_runs_fail_clearly() {
    let test = "pivot_root_refused_makes_union_runs_fail_clearly";
    if !features_ok(test) || !ipc_namespaces_here(test) {
        return;
    }
    let d = Dirs::new("unit");
    let v = d.probe("unit");
    assert_eq!(v["self"]["capset_errno"], libc::EPERM, "{v:#}");
    assert_eq!(v["self"]["ipc_namespaces"], false, "{v:#}");
    // The union run fails, clearly, and ran nothing.
    let e = v["union"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("the union run did not fail: {v:#}"));
    eprintln!("unit: union run error: {e}");
    assert!(!e.contains('\n'), "not one line: {e}");
    assert!(e.contains("pivot_root"), "{e}");
    assert!(!d.p("w/marker-union").exists(), "{v:#}");
    // Without the filter, the same union run works (so the filter is what stops it).
    let p = workspace_policy();
    let here = outcome(ollie_sandbox::run(&p, &d.union_req()));
    assert_eq!(here["status"], 0, "{here:#}");
    assert_eq!(here["stdout"], "a\n", "{here:#}");
    assert!(d.p("w/marker-union").exists());
    // A plain run under the whole filter works: no capability, no IPC namespace, one-shot and
    // prepared.
    assert_no_capability(&v["oneshot_caps"]);
    assert!(!has_ipc(&v["oneshot_caps"]), "{v:#}");
    assert_eq!(v["oneshot_ns"]["status"], 0, "{v:#}");
    assert_eq!(
        v["oneshot_ns"]["stdout"].as_str().unwrap().trim(),
        v["self"]["ipc_ns"]
    );
    assert_eq!(v["prepared_new"], "ok", "{v:#}");
    assert_no_capability(&v["prepared_caps"]);
    assert!(!has_ipc(&v["prepared_caps"]), "{v:#}");
}
