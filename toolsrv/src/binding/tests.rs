//! Tests of the binding: what is bound, pinned and re-checked.

use super::*;
use std::os::unix::fs::PermissionsExt;

fn os(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

fn env() -> BTreeMap<String, String> {
    BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())])
}

fn sha256_of(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

/// A copy of the system `sh` in `dir`, executable, by absolute path.
fn copied_sh(dir: &Path) -> PathBuf {
    let sh = resolve_program(OsStr::new("sh")).unwrap();
    let dst = dir.join("mysh");
    std::fs::copy(&sh, &dst).unwrap();
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).unwrap();
    dst
}

#[test]
fn binding_resolves_sh_in_system_dirs_and_hashes_it() {
    let d = tempfile::tempdir().unwrap();
    for name in ["sh", "bash"] {
        let b = match compute(&os(&[name, "-c", "true"]), d.path(), &env()) {
            Ok(b) => b,
            Err(e) if name == "bash" => {
                println!("SKIP bash: {e}");
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        let p = &b.executable.path;
        assert!(p.is_absolute());
        assert_eq!(*p, std::fs::canonicalize(p).unwrap());
        assert!(
            ["/usr/", "/bin/", "/sbin/"]
                .iter()
                .any(|d| p.to_string_lossy().starts_with(d)),
            "{p:?}"
        );
        let content = std::fs::read(p).unwrap();
        assert_eq!(b.executable.size, content.len() as u64);
        assert_eq!(b.executable.sha256, sha256_of(&content));
        assert!(b.scripts.is_empty(), "{:?}", b.scripts);
        assert_eq!(b.argv, vec![name, "-c", "true"]);
        b.recheck().unwrap();
    }
}

#[test]
fn binding_refuses_relative_and_missing_programs() {
    let d = tempfile::tempdir().unwrap();
    let exe = copied_sh(d.path());
    std::fs::create_dir(d.path().join("bin")).unwrap();
    std::fs::copy(&exe, d.path().join("bin/x")).unwrap();
    for rel in ["./mysh", "bin/x", "../mysh"] {
        let e = compute(&os(&[rel]), d.path(), &env()).unwrap_err();
        assert!(
            e.contains(
                "the program must be named by an absolute path or found in the system directories"
            ),
            "{e}"
        );
    }
    // A bare name is never looked up in cwd or the agent's PATH.
    let mut agent_env = env();
    agent_env.insert("PATH".into(), d.path().to_string_lossy().into_owned());
    let e = compute(&os(&["mysh"]), d.path(), &agent_env).unwrap_err();
    assert!(e.contains("not found in the system directories"), "{e}");
    let e = compute(&os(&["ollie-no-such-program-xyz"]), d.path(), &env()).unwrap_err();
    assert!(e.contains("not found in the system directories"), "{e}");
    let missing = d.path().join("nope");
    let e = compute(&[missing.into_os_string()], d.path(), &env()).unwrap_err();
    assert!(e.contains("no such file"), "{e}");
    assert_eq!(
        compute(&[], d.path(), &env()).unwrap_err(),
        "the command is empty"
    );
    // A regular file without an execute bit.
    let plain = d.path().join("plain");
    std::fs::write(&plain, "x").unwrap();
    let e = compute(&[plain.into_os_string()], d.path(), &env()).unwrap_err();
    assert!(e.contains("is not executable"), "{e}");
    assert!(!e.contains('\n'));
}

#[test]
fn binding_hashes_scripts_absolute_and_relative_to_cwd() {
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("run.sh");
    std::fs::write(&run, "echo hi\n").unwrap();
    std::fs::create_dir(d.path().join("sub")).unwrap();
    std::fs::write(d.path().join("sub/x.py"), "print(1)\n").unwrap();
    let abs = run.to_string_lossy().into_owned();
    let b = compute(
        &os(&["sh", &abs, "sub/x.py", "not-a-file", "sub"]),
        d.path(),
        &env(),
    )
    .unwrap();
    let canon = std::fs::canonicalize(d.path()).unwrap();
    assert_eq!(b.scripts.len(), 2, "{:?}", b.scripts);
    assert_eq!(b.scripts[0].path, canon.join("run.sh"));
    assert_eq!(b.scripts[0].sha256, sha256_of(b"echo hi\n"));
    assert_eq!(b.scripts[0].size, 8);
    assert_eq!(b.scripts[1].path, canon.join("sub/x.py"));
    assert_eq!(b.scripts[1].sha256, sha256_of(b"print(1)\n"));
    // `--opt=FILE` values are bound too.
    let b = compute(&os(&["sh", "--pre=run.sh"]), d.path(), &env()).unwrap();
    assert_eq!(b.scripts.len(), 1);
    assert_eq!(b.scripts[0].path, canon.join("run.sh"));
    // Inline code naming a file is bound as well (`sh -c ./run.sh` runs it).
    let b = compute(&os(&["sh", "-c", "./run.sh"]), d.path(), &env()).unwrap();
    assert_eq!(b.scripts.len(), 1);
    let b = compute(&os(&["sh", "-c", "echo hi; exit 0"]), d.path(), &env()).unwrap();
    assert!(b.scripts.is_empty());
}

#[test]
fn binding_recheck_catches_an_edited_or_deleted_script() {
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("run.sh");
    std::fs::write(&run, "echo hi\n").unwrap();
    let b = compute(&os(&["sh", "run.sh"]), d.path(), &env()).unwrap();
    b.recheck().unwrap();
    let canon = std::fs::canonicalize(&run).unwrap();
    let name = canon.to_string_lossy().into_owned();

    std::fs::write(&run, "echo evil\n").unwrap();
    let e = b.recheck().unwrap_err();
    assert!(e.starts_with(&format!("script {name} changed")), "{e}");
    assert!(e.contains("sha256"), "{e}");

    // Same content, new inode: still a replacement.
    std::fs::write(d.path().join("tmp"), "echo hi\n").unwrap();
    std::fs::rename(d.path().join("tmp"), &run).unwrap();
    let e = b.recheck().unwrap_err();
    assert!(e.starts_with(&format!("script {name} was replaced")), "{e}");

    std::fs::remove_file(&run).unwrap();
    let e = b.recheck().unwrap_err();
    assert_eq!(e, format!("script {name} is gone"));
}

#[test]
fn binding_recheck_catches_a_new_or_retargeted_file() {
    let d = tempfile::tempdir().unwrap();
    let b = compute(&os(&["sh", "later.sh"]), d.path(), &env()).unwrap();
    assert!(b.scripts.is_empty());
    std::fs::write(d.path().join("later.sh"), "echo late\n").unwrap();
    let e = b.recheck().unwrap_err();
    assert!(e.contains("now names 1 file(s) (was 0)"), "{e}");

    std::fs::write(d.path().join("a.sh"), "a\n").unwrap();
    std::fs::write(d.path().join("b.sh"), "b\n").unwrap();
    std::os::unix::fs::symlink("a.sh", d.path().join("link.sh")).unwrap();
    let b = compute(&os(&["sh", "link.sh"]), d.path(), &env()).unwrap();
    b.recheck().unwrap();
    std::fs::remove_file(d.path().join("link.sh")).unwrap();
    std::os::unix::fs::symlink("b.sh", d.path().join("link.sh")).unwrap();
    let e = b.recheck().unwrap_err();
    assert!(e.contains("now resolves to"), "{e}");
    assert!(e.contains("b.sh"), "{e}");
}

#[test]
fn binding_recheck_catches_a_replaced_executable() {
    let d = tempfile::tempdir().unwrap();
    let exe = copied_sh(d.path());
    let b = compute(
        &[exe.clone().into_os_string(), "-c".into(), "true".into()],
        d.path(),
        &env(),
    )
    .unwrap();
    b.recheck().unwrap();
    let name = std::fs::canonicalize(&exe).unwrap();
    let name = name.to_string_lossy();

    // Different contents.
    let mut content = std::fs::read(&exe).unwrap();
    content.push(0);
    std::fs::write(&exe, &content).unwrap();
    let e = b.recheck().unwrap_err();
    assert!(
        e.starts_with(&format!("the executable {name} changed (sha256 ")),
        "{e}"
    );

    // Gone.
    std::fs::remove_file(&exe).unwrap();
    let e = b.recheck().unwrap_err();
    assert_eq!(e, format!("the executable {name} is gone"));

    // Named through a symlink that is then retargeted.
    let real = copied_sh(d.path());
    let other = d.path().join("other");
    std::fs::copy(&real, &other).unwrap();
    let link = d.path().join("prog");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let b = compute(&[link.clone().into_os_string()], d.path(), &env()).unwrap();
    assert_eq!(b.executable.path, std::fs::canonicalize(&real).unwrap());
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&other, &link).unwrap();
    let e = b.recheck().unwrap_err();
    assert!(e.starts_with("the executable now resolves to "), "{e}");
}

#[test]
fn binding_digest_is_stable_and_covers_argv_and_env() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("empty"), "").unwrap();
    let a = compute(&os(&["sh", "empty"]), d.path(), &env()).unwrap();
    assert_eq!(a.scripts.len(), 1);
    assert_eq!(a.scripts[0].size, 0);
    assert_eq!(a.scripts[0].sha256, sha256_of(b""));
    a.recheck().unwrap();

    let again = compute(&os(&["sh", "empty"]), d.path(), &env()).unwrap();
    assert_eq!(a, again);
    assert_eq!(a.digest(), again.digest());
    assert_eq!(a.digest().len(), 64);

    let other_argv = compute(&os(&["sh", "empty", "x"]), d.path(), &env()).unwrap();
    assert_ne!(a.digest(), other_argv.digest());
    // Length prefixes: moving a byte between arguments changes the digest.
    let x = compute(&os(&["sh", "ab", "c"]), d.path(), &env()).unwrap();
    let y = compute(&os(&["sh", "a", "bc"]), d.path(), &env()).unwrap();
    assert_ne!(x.digest(), y.digest());

    let mut e2 = env();
    e2.insert("LANG".into(), "C".into());
    let other_env = compute(&os(&["sh", "empty"]), d.path(), &e2).unwrap();
    assert_ne!(a.digest(), other_env.digest());

    let sub = d.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let other_cwd = compute(&os(&["sh", "../empty"]), &sub, &env()).unwrap();
    assert_ne!(a.digest(), other_cwd.digest());
}

#[test]
fn binding_keeps_non_utf8_argv_exact() {
    let d = tempfile::tempdir().unwrap();
    let a = OsString::from_vec(vec![0xff, b'a']);
    let b = OsString::from_vec(vec![0xfe, b'a']);
    let x = compute(&["sh".into(), a], d.path(), &env()).unwrap();
    let y = compute(&["sh".into(), b], d.path(), &env()).unwrap();
    // Lossy display is identical; the binding is not.
    assert_eq!(x.argv, y.argv);
    assert_ne!(x, y);
    assert_ne!(x.digest(), y.digest());
    x.recheck().unwrap();
    let json = serde_json::to_value(&x).unwrap();
    assert!(json.get("argv_raw").is_none());
    assert_eq!(json["argv"][0], "sh");
}

#[test]
fn binding_refuses_a_relative_or_missing_cwd() {
    let e = compute(&os(&["sh"]), Path::new("rel"), &env()).unwrap_err();
    assert!(e.contains("not an absolute path"), "{e}");
    let d = tempfile::tempdir().unwrap();
    let e = compute(&os(&["sh"]), &d.path().join("nope"), &env()).unwrap_err();
    assert!(e.contains("is not a directory"), "{e}");
}

#[test]
fn binding_inline_code_binds_commands_and_interpreted_files_not_data() {
    let words = |code: &str| -> Vec<String> {
        candidates(OsStr::new(code))
            .iter()
            .skip(1)
            .map(|w| w.to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(words("bash /w/run.sh"), ["bash", "/w/run.sh"]);
    assert_eq!(
        words("cd /w && X=1 ./build.sh --fast; python3 -u tool.py in.txt"),
        ["cd", "./build.sh", "python3", "tool.py"]
    );
    assert_eq!(words("echo ran >> /w/out"), ["echo"]);
    assert_eq!(words("cat a | sh 'b.sh'"), ["cat", "sh", "b.sh"]);
    assert_eq!(words(". ./env.sh"), [".", "./env.sh"]);
    assert!(words("single").is_empty());
}

/// A directory with the files the rewriting cases name.
fn scripts_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (name, body) in [
        ("run.sh", "echo run\n"),
        ("b.sh", "echo b\n"),
        ("x.py", "print(1)\n"),
        ("env.sh", "X=1\n"),
        ("data.txt", "data\n"),
    ] {
        std::fs::write(d.path().join(name), body).unwrap();
    }
    std::fs::set_permissions(
        d.path().join("run.sh"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    std::fs::create_dir(d.path().join("sub")).unwrap();
    d
}

/// argv as `pin` rewrites it (nothing opened: the sites and the edits only).
fn rewritten(dir: &Path, argv: &[&str]) -> Vec<String> {
    let argv = os(argv);
    let mut files: Vec<PathBuf> = Vec::new();
    let edits: Vec<(Site, String)> = script_sites(&argv, dir, Some("/usr/bin:/bin"))
        .into_iter()
        .map(|(site, p)| {
            let n = files.iter().position(|f| *f == p).unwrap_or_else(|| {
                files.push(p);
                files.len() - 1
            });
            (site, ollie_sandbox::pass_fd_path(n))
        })
        .collect();
    rewrite(&argv, &edits)
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect()
}

#[test]
fn pinning_rewrites_exactly_the_script_words_of_inline_code() {
    let d = scripts_dir();
    let w = d.path();
    let code = |c: &str| rewritten(w, &["bash", "-c", c])[2].clone();
    // After an interpreter, in command position with a `/`, after `.`: the word only.
    assert_eq!(code("bash run.sh"), "bash /proc/self/fd/7");
    assert_eq!(code("bash -x run.sh arg"), "bash -x /proc/self/fd/7 arg");
    assert_eq!(code("./run.sh"), "/proc/self/fd/7");
    assert_eq!(code("X=1 ./run.sh --fast"), "X=1 /proc/self/fd/7 --fast");
    assert_eq!(
        code(". ./env.sh; source env.sh"),
        ". /proc/self/fd/7; source /proc/self/fd/7"
    );
    // Quotes stay where they are; several commands; one descriptor per file.
    assert_eq!(
        code("sh 'b.sh' && python3 -u \"x.py\" data.txt; cd sub; ./run.sh | bash run.sh"),
        "sh '/proc/self/fd/7' && python3 -u \"/proc/self/fd/8\" data.txt; cd sub; /proc/self/fd/9 | bash /proc/self/fd/9"
    );
    // Nested code: a shell in the shell, Python's os.system.
    assert_eq!(
        code("bash -c \"bash run.sh\""),
        "bash -c \"bash /proc/self/fd/7\""
    );
    assert_eq!(
        rewritten(w, &["python3", "-c", "import os; os.system('bash run.sh')"])[2],
        "import os; os.system('bash /proc/self/fd/7')"
    );
    // Data words, bare command names (looked up in PATH), arguments of scripts and
    // names that are no file stay as they are.
    for c in [
        "cp run.sh data.txt; cat run.sh > b.sh",
        "run.sh",
        "env run.sh",
        "grep -e 'bash x' data.txt",
        "bash missing.sh",
        "bash run.sh ./b.sh",
        "echo ./run.sh",
    ] {
        let want = if c == "bash run.sh ./b.sh" {
            "bash /proc/self/fd/7 ./b.sh"
        } else {
            c
        };
        assert_eq!(code(c), want, "{c}");
    }
    // `source` of a name PATH holds reads that file, not the one in cwd.
    std::fs::write(w.join("ls"), "x\n").unwrap();
    assert_eq!(code(". ls"), ". ls");
}

#[test]
fn pinning_rewrites_a_whole_script_argument_of_an_interpreter_only() {
    let d = scripts_dir();
    let w = d.path();
    assert_eq!(
        rewritten(w, &["sh", "run.sh", "data.txt"]),
        ["sh", "/proc/self/fd/7", "data.txt"]
    );
    assert_eq!(
        rewritten(
            w,
            &["/usr/bin/bash", "-o", "pipefail", "--", "run.sh", "b.sh"]
        ),
        [
            "/usr/bin/bash",
            "-o",
            "pipefail",
            "--",
            "/proc/self/fd/7",
            "b.sh"
        ]
    );
    assert_eq!(
        rewritten(w, &["python3", "-W", "ignore", "x.py", "run.sh"]),
        ["python3", "-W", "ignore", "/proc/self/fd/7", "run.sh"]
    );
    // Inline code: the script is inside it; later arguments are positional data.
    assert_eq!(
        rewritten(w, &["bash", "-lc", "sh b.sh", "run.sh", "x.py"]),
        ["bash", "-lc", "sh /proc/self/fd/7", "run.sh", "x.py"]
    );
    // execute_pipe hands code on as positional parameters after a `-c`.
    assert_eq!(
        rewritten(
            w,
            &[
                "bash",
                "-c",
                "\"${1}\" \"${2}\" \"${3}\"",
                "execute_pipe",
                "bash",
                "-c",
                "bash run.sh"
            ]
        )[6],
        "bash /proc/self/fd/7"
    );
    // Other programs' arguments are bound, never rewritten; so is python's -m.
    for argv in [
        vec!["cat", "run.sh"],
        vec!["cp", "run.sh", "b.sh"],
        vec!["python3", "-m", "x.py"],
    ] {
        assert_eq!(rewritten(w, &argv), argv, "{argv:?}");
    }
}

#[test]
fn pin_runs_sealed_copies_checked_on_the_descriptor() {
    use std::io::Write;
    let d = scripts_dir();
    let w = d.path();
    let argv = os(&["bash", "-c", "bash run.sh; sh ./run.sh; cat data.txt"]);
    let b = compute(&argv, w, &env()).unwrap();
    let p = b.pin(&[]).unwrap();
    assert_eq!(
        p.argv,
        os(&[
            "bash",
            "-c",
            "bash /proc/self/fd/7; sh /proc/self/fd/7; cat data.txt"
        ])
    );
    assert_eq!(p.pass_fds.len(), 1);
    let run = std::fs::canonicalize(w.join("run.sh")).unwrap();
    assert_eq!(
        p.scripts,
        [PinnedScript {
            path: run.clone(),
            as_path: "/proc/self/fd/7".into()
        }]
    );
    // The copy: the approved bytes, mode & 0o555, sealed; a rename over the file or a
    // write to it changes nothing in it.
    std::fs::write(w.join("evil"), "echo evil\n").unwrap();
    std::fs::rename(w.join("evil"), w.join("run.sh")).unwrap();
    let mut f = File::from(p.pass_fds[0].try_clone().unwrap());
    let mut got = String::new();
    f.read_to_string(&mut got).unwrap();
    assert_eq!(got, "echo run\n");
    assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o550);
    assert!(f.write_all(b"x").is_err());
    assert!(f.set_len(0).is_err());
    let link = std::fs::read_link(format!("/proc/self/fd/{}", {
        use std::os::fd::AsRawFd;
        p.pass_fds[0].as_raw_fd()
    }))
    .unwrap();
    assert!(
        link.to_string_lossy()
            .starts_with("/memfd:ollie-pin:run.sh"),
        "{link:?}"
    );
    // The program lies outside `writable`: the file itself, read-only.
    assert!(!p.exec_copied);
    assert_eq!(p.exec.path, b.executable.path);

    // Pinning again now finds the replacement on the descriptor it opens.
    let e = b.pin(&[]).unwrap_err();
    let name = show(&run);
    assert!(
        e.starts_with(&format!(
            "script {name} opened to run was replaced (device:inode "
        )),
        "{e}"
    );
    // Same inode, new bytes of the same length.
    let b = compute(&argv, w, &env()).unwrap();
    std::fs::write(w.join("run.sh"), "echo EVIL\n").unwrap();
    let e = b.pin(&[]).unwrap_err();
    assert!(
        e.starts_with(&format!("script {name} opened to run changed (sha256 ")),
        "{e}"
    );
    // Another length.
    std::fs::write(w.join("run.sh"), "echo longer evil\n").unwrap();
    let e = b.pin(&[]).unwrap_err();
    assert!(
        e.starts_with(&format!("script {name} opened to run changed (size ")),
        "{e}"
    );
    // Gone.
    std::fs::remove_file(w.join("run.sh")).unwrap();
    let e = b.pin(&[]).unwrap_err();
    assert_eq!(
        e,
        format!("script {name} cannot be opened to run: no such file")
    );
    // Replaced by a symlink to the same bytes.
    std::fs::write(w.join("real.sh"), "echo evil\n").unwrap();
    std::os::unix::fs::symlink("real.sh", w.join("run.sh")).unwrap();
    assert!(b.pin(&[]).is_err());
}

#[test]
fn pin_copies_a_program_in_a_writable_tree_and_opens_others_as_they_are() {
    use std::os::fd::AsRawFd;
    let d = tempfile::tempdir().unwrap();
    let exe = copied_sh(d.path());
    let argv = [exe.clone().into_os_string(), "-c".into(), "true".into()];
    let b = compute(&argv, d.path(), &env()).unwrap();
    let canon = std::fs::canonicalize(d.path()).unwrap();
    let link = |p: &Pinned| {
        std::fs::read_link(format!("/proc/self/fd/{}", p.exec.fd.as_raw_fd())).unwrap()
    };
    let outside = b.pin(&[PathBuf::from("/nonexistent")]).unwrap();
    assert!(!outside.exec_copied);
    assert_eq!(link(&outside), std::fs::canonicalize(&exe).unwrap());
    let inside = b.pin(&[canon]).unwrap();
    assert!(inside.exec_copied);
    assert!(
        link(&inside)
            .to_string_lossy()
            .starts_with("/memfd:ollie-pin:mysh")
    );
    let mut copy = Vec::new();
    File::from(inside.exec.fd.try_clone().unwrap())
        .read_to_end(&mut copy)
        .unwrap();
    assert!(copy == std::fs::read(&exe).unwrap(), "the copy differs");
    assert_eq!(inside.argv, argv);
    // The program changed in place since the binding: refused on the descriptor.
    let mut content = std::fs::read(&exe).unwrap();
    content[100] ^= 1;
    std::fs::write(&exe, &content).unwrap();
    for w in [vec![], vec![std::fs::canonicalize(d.path()).unwrap()]] {
        let e = b.pin(&w).unwrap_err();
        assert!(
            e.contains("the executable ") && e.contains(" opened to run changed (sha256 "),
            "{e}"
        );
    }
}

#[test]
fn a_command_running_more_scripts_than_can_be_pinned_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut code = String::new();
    for i in 0..=ollie_sandbox::MAX_PASS_FDS {
        std::fs::write(d.path().join(format!("s{i}.sh")), format!("echo {i}\n")).unwrap();
        code.push_str(&format!("sh s{i}.sh; "));
    }
    let e = compute(&os(&["bash", "-c", &code]), d.path(), &env()).unwrap_err();
    assert_eq!(
        e,
        "the command runs 17 scripts; at most 16 can be pinned for one run"
    );
    // Sixteen are fine, and so is naming one file many times.
    let code16 = code.replacen("sh s16.sh; ", "sh s0.sh; ", 1);
    let b = compute(&os(&["bash", "-c", &code16]), d.path(), &env()).unwrap();
    assert_eq!(b.pin(&[]).unwrap().pass_fds.len(), 16);
}

#[test]
fn kernel_files_named_in_code_are_not_bound() {
    let dir = tempfile::tempdir().unwrap();
    let argv = [
        OsString::from("bash"),
        OsString::from("-c"),
        OsString::from("grep CapEff /proc/self/status; cat /sys/kernel/osrelease /dev/null"),
    ];
    let b = compute(&argv, dir.path(), &BTreeMap::new()).unwrap();
    assert!(b.scripts.is_empty(), "{:?}", b.scripts);
    assert!(b.recheck().is_ok());
}
