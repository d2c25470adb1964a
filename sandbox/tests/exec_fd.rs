//! Running what the caller opened: `RunRequest::exec_fd` (the program executed from a
//! descriptor) and `RunRequest::pass_fds` (descriptors the tool inherits at 7, 8, …), with
//! sealed copies (`ollie_sandbox::sealed_copy`) as toolsrv pins an approved escalation's
//! files. The path the file was opened from is renamed away or removed before each run, so
//! only the descriptor can supply what runs.
//!
//! Skips (printing `SKIP <test>: <reason>`) without Landlock ABI 7 or user namespaces; with
//! `OLLIE_TEST_REQUIRE=all` a missing kernel feature fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ollie_policy::Policy;
use ollie_sandbox::{
    ExecFd, ExecFrom, MAX_PASS_FDS, Prepared, RunRequest, SandboxError, pass_fd_path, sealed_copy,
};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod common;
use common::features_ok;

struct Ws(PathBuf);

impl Ws {
    fn new(name: &str) -> Ws {
        let d = std::env::temp_dir().join(format!("ollie-execfd-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("w")).unwrap();
        std::fs::create_dir_all(d.join("home")).unwrap();
        Ws(d.canonicalize().unwrap())
    }
    fn w(&self) -> PathBuf {
        self.0.join("w")
    }
    fn req(&self, argv: &[&str]) -> RunRequest {
        let mut r = RunRequest::new(argv.iter().map(Into::into).collect(), self.w());
        r.home = self.0.join("home");
        r.base_env = vec![("LANG".into(), "C.UTF-8".into())];
        r
    }
}

impl Drop for Ws {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn policy() -> Policy {
    common::profile_with_limits("workspace", "")
}

/// A sealed copy of `data` named `name`.
fn sealed(data: &[u8], name: &str, mode: u32) -> Arc<OwnedFd> {
    Arc::new(sealed_copy(&mut &data[..], name, mode, 1 << 30).unwrap().fd)
}

/// Shell code printing the numbers of the shell's open descriptors among 0..=40 (`[` is a
/// builtin, so `/proc/self` is the shell; `$$` would name another process, since the run's pid
/// namespace shares the host's `/proc`).
const FDS: &str =
    "s=; for n in $(seq 0 40); do [ -e /proc/self/fd/$n ] && s=\"$s $n\"; done; echo ${s# }";

/// Shell code printing the file the shell's memory map names as a memfd (read by builtins,
/// so it is the shell's own map).
const EXE_MAP: &str = "while read -r l; do case $l in *memfd:*) echo \"${l#*/memfd:}\"; break;; esac; done < /proc/self/maps";

fn stdout(o: &ollie_sandbox::RunOutput) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn pinned_scripts_run_from_the_descriptors_passed_at_seven_and_up() {
    if !features_ok("pinned_scripts_run_from_the_descriptors_passed_at_seven_and_up") {
        return;
    }
    assert_eq!(pass_fd_path(0), "/proc/self/fd/7");
    assert_eq!(pass_fd_path(1), "/proc/self/fd/8");
    let ws = Ws::new("scripts");
    // The script on disk, copied, then replaced: the run must see the copy.
    let run_sh = ws.w().join("run.sh");
    let body = format!("echo pinned-script\nreadlink /proc/self/fd/7 /proc/self/fd/8\n{FDS}\n");
    std::fs::write(&run_sh, &body).unwrap();
    let first = sealed(&std::fs::read(&run_sh).unwrap(), "ollie-pin:run.sh", 0o755);
    std::fs::write(&run_sh, "echo evil\n").unwrap();
    let second = sealed(b"echo second\n", "ollie-pin:second.sh", 0o644);
    let mut r = ws.req(&["bash", "/proc/self/fd/7"]);
    r.pass_fds = vec![first, second];
    let o = ollie_sandbox::run(&policy(), &r).unwrap();
    let out = stdout(&o);
    assert_eq!(
        o.record.exit.status,
        0,
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "pinned-script", "{out}");
    assert!(lines[1].starts_with("/memfd:ollie-pin:run.sh"), "{out}");
    assert!(lines[2].starts_with("/memfd:ollie-pin:second.sh"), "{out}");
    // Only stdio and the two passed descriptors (bash reads its script through 255).
    assert_eq!(lines[3], "0 1 2 7 8", "{out}");
    assert_eq!(o.record.exec, ExecFrom::Path);
    assert_eq!(o.record.pass_fds, ["/proc/self/fd/7", "/proc/self/fd/8"]);
    let v: serde_json::Value = serde_json::from_str(&o.record.to_json()).unwrap();
    assert_eq!(v["exec"], "path");
    assert_eq!(v["pass_fds"][1], "/proc/self/fd/8");

    // Executed by path through the shell (`./run.sh` rewritten): the copy keeps the mode.
    let copy = sealed(body.as_bytes(), "ollie-pin:run.sh", 0o755);
    let mut r = ws.req(&["bash", "-c", "/proc/self/fd/7"]);
    r.pass_fds = vec![copy];
    let o = ollie_sandbox::run(&policy(), &r).unwrap();
    assert!(stdout(&o).starts_with("pinned-script\n"), "{o:?}");
    // Not executable: refused by the kernel, as for the file itself.
    let plain = sealed(body.as_bytes(), "ollie-pin:plain.sh", 0o644);
    let mut r = ws.req(&["bash", "-c", "/proc/self/fd/7"]);
    r.pass_fds = vec![plain];
    let o = ollie_sandbox::run(&policy(), &r).unwrap();
    assert_eq!(o.record.exit.status, 126, "{o:?}");
}

#[test]
fn an_elf_program_runs_from_its_descriptor_which_the_exec_closes() {
    if !features_ok("an_elf_program_runs_from_its_descriptor_which_the_exec_closes") {
        return;
    }
    let ws = Ws::new("elf");
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    // The original file, opened read-only, then its path gone.
    let copy = ws.w().join("mysh");
    std::fs::copy(&sh, &copy).unwrap();
    let file = Arc::new(OwnedFd::from(std::fs::File::open(&copy).unwrap()));
    std::fs::remove_file(&copy).unwrap();
    let mut r = ws.req(&["sh", "-c", &format!("echo elf-fd; {FDS}")]);
    r.exec_fd = Some(ExecFd {
        fd: file,
        path: copy.clone(),
    });
    let o = ollie_sandbox::run(&policy(), &r).unwrap();
    assert_eq!(stdout(&o), "elf-fd\n0 1 2\n", "{o:?}");
    assert_eq!(o.record.exec, ExecFrom::Fd);
    assert_eq!(o.record.program, copy);
    assert!(o.record.pass_fds.is_empty());
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&o.record.to_json()).unwrap()["exec"],
        "fd"
    );

    // A sealed copy of the ELF, with a passed descriptor before it: /proc/self/exe is the
    // memfd, the passed descriptor is at 7 and the exec fd is closed.
    let elf = sealed(&std::fs::read(&sh).unwrap(), "ollie-pin:sh", 0o755);
    let mut r = ws.req(&["sh", "-c", &format!("{EXE_MAP}; {FDS}")]);
    r.exec_fd = Some(ExecFd {
        fd: elf,
        path: sh.clone(),
    });
    r.pass_fds = vec![sealed(b"data\n", "ollie-pin:data", 0o644)];
    let o = ollie_sandbox::run(&policy(), &r).unwrap();
    let out = stdout(&o);
    assert!(out.starts_with("ollie-pin:sh"), "{o:?}");
    assert!(out.ends_with("\n0 1 2 7\n"), "{o:?}");
}

#[test]
fn a_script_program_runs_from_its_descriptor_which_its_interpreter_reads() {
    if !features_ok("a_script_program_runs_from_its_descriptor_which_its_interpreter_reads") {
        return;
    }
    let ws = Ws::new("shebang");
    let tool = ws.w().join("tool.sh");
    std::fs::write(
        &tool,
        format!("#!/bin/sh\necho script-fd \"$0\" \"$1\"\n{FDS}\n"),
    )
    .unwrap();
    let copy = sealed(&std::fs::read(&tool).unwrap(), "ollie-pin:tool.sh", 0o755);
    std::fs::write(&tool, "#!/bin/sh\necho evil\n").unwrap();
    let mut r = ws.req(&["tool.sh", "arg"]);
    r.exec_fd = Some(ExecFd {
        fd: copy,
        path: tool.clone(),
    });
    r.pass_fds = vec![sealed(b"x\n", "ollie-pin:x", 0o644)];
    let o = ollie_sandbox::run(&policy(), &r).unwrap();
    // The kernel names the script /dev/fd/N, N after the passed descriptors; it stays open
    // (and dash reads the script it names through 10).
    assert_eq!(
        stdout(&o),
        "script-fd /dev/fd/8 arg\n0 1 2 7 8 10\n",
        "{o:?}"
    );
    assert_eq!(o.record.exec, ExecFrom::Fd);
}

#[test]
fn too_many_passed_descriptors_and_prepared_runs_are_refused() {
    if !features_ok("too_many_passed_descriptors_and_prepared_runs_are_refused") {
        return;
    }
    let ws = Ws::new("refused");
    let marker = ws.w().join("ran");
    let cmd = format!("touch {}", marker.display());
    // The bound itself is fine: the 16th lands at 22.
    let mut r = ws.req(&["bash", "-c", FDS]);
    r.pass_fds = (0..MAX_PASS_FDS)
        .map(|i| sealed(b"", &format!("p{i}"), 0o644))
        .collect();
    let o = ollie_sandbox::run(&policy(), &r).unwrap();
    assert_eq!(
        stdout(&o),
        "0 1 2 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22\n",
        "{o:?}"
    );
    // One more is refused before anything runs.
    let mut r = ws.req(&["bash", "-c", &cmd]);
    r.pass_fds = (0..=MAX_PASS_FDS)
        .map(|i| sealed(b"", &format!("p{i}"), 0o644))
        .collect();
    let e = ollie_sandbox::run(&policy(), &r).unwrap_err();
    assert!(
        matches!(&e, SandboxError::InvalidRequest { reason } if reason.contains("at most 16 descriptors")),
        "{e}"
    );
    assert!(!marker.exists());
    // A prepared sandbox runs neither.
    let p = Prepared::new(&policy(), &ws.w(), &ws.0.join("home")).unwrap();
    let mut with_exec = ws.req(&["bash", "-c", &cmd]);
    with_exec.exec_fd = Some(ExecFd {
        fd: Arc::new(OwnedFd::from(std::fs::File::open("/bin/sh").unwrap())),
        path: Path::new("/bin/sh").to_path_buf(),
    });
    let mut with_pass = ws.req(&["bash", "-c", &cmd]);
    with_pass.pass_fds = vec![sealed(b"", "p", 0o644)];
    for r in [with_exec, with_pass] {
        let e = p.run(&r).unwrap_err();
        assert!(
            matches!(&e, SandboxError::InvalidRequest { reason } if reason.contains("one-shot runs only")),
            "{e}"
        );
    }
    assert!(!marker.exists());
    // Ordinary prepared calls still work and inherit nothing.
    let o = p.run(&ws.req(&["bash", "-c", FDS])).unwrap();
    assert_eq!(stdout(&o), "0 1 2\n", "{o:?}");
}
