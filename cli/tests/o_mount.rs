//! `o mount` against a real olliesrv: the namespace through FUSE, checked against what the same
//! files say over 9P (`ollie-9p`, an independent path), as root and (scripts/test-unprivileged.sh)
//! as a user without privileges, where the mount goes through fusermount3.
//!
//! Covered: listing and modes, whole reads of files of unknown length, `echo >` and `>>`,
//! request/response on one descriptor (`exec 3<>ctl`), separate descriptors' separate replies,
//! blocking reads interrupted by SIGINT with the Tflush seen on the wire (a recording proxy sits
//! between the bridge and the server), `tail -f chat`, errno for refused operations, create,
//! mkdir, rm and mv in a bead union, `o mount -u`, the mount ending with the server, `feed`
//! values (writes separated by a pause are separate values, through a redirect or a pipe), and
//! the read ahead of sequential reads (counted on the wire; a write through the mount voids it).
//!
//! Needs the workspace binaries (`cargo build --workspace --bins`). Every wait is an event or a
//! failure guard; nothing here measures time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::mount::{Mounted, fuse_usable, is_fuse_mount, o_mount};
use common::{GUARD, Srv, bin, run, wait_child};

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

fn replay_srv(turns: &[&str]) -> Srv {
    let turns: Vec<String> = turns.iter().map(|t| (*t).to_owned()).collect();
    Srv::start_with(move |cfg| {
        let file = cfg.join("turns.jsonl");
        std::fs::write(&file, turns.join("\n") + "\n").unwrap();
        std::fs::write(
            cfg.join("config.toml"),
            format!(
                "default_backend = \"demo\"\n[backends.demo]\nkind = \"replay\"\nfile = \"{}\"\n",
                file.display()
            ),
        )
        .unwrap();
    })
}

/// `ollie-9p -a ADDR read PATH`: the file over 9P, not through the mount.
fn nine_read(srv: &Srv, path: &str) -> String {
    let out = run(
        Command::new(bin("ollie-9p"))
            .arg("-a")
            .arg(srv.addr())
            .arg("read")
            .arg(path),
        b"",
    );
    assert_eq!(out.code, Some(0), "ollie-9p read {path}: {out:?}");
    out.stdout
}

/// Runs a bash script in `dir`, bounded; returns its output.
fn sh(dir: &Path, script: &str) -> common::Out {
    run(
        Command::new("bash")
            .arg("-c")
            .arg(format!("set -u\n{script}"))
            .current_dir(dir),
        b"",
    )
}

fn sh_ok(dir: &Path, script: &str) -> String {
    let out = sh(dir, script);
    assert_eq!(out.code, Some(0), "{script}\n{out:?}");
    out.stdout
}

/// A session `proj` with agent `coder`, made through the mount.
fn session(m: &Mounted, srv: &Srv) {
    let work = srv.workdir();
    sh_ok(
        m.path(),
        &format!(
            "echo 'name=proj cwd={}' > session/new && echo name=coder > session/proj/agent/new",
            work.display()
        ),
    );
}

#[test]
fn files_read_write_and_reply_like_over_9p() {
    if !fuse_usable("files_read_write_and_reply_like_over_9p") {
        return;
    }
    let srv = replay_srv(&[r#"{"text": "hello from the model"}"#]);
    let m = Mounted::new(&srv);
    assert!(m.is_mounted());

    // The root as ls -l shows it: modes from the server's permission bits.
    let ls = sh_ok(m.path(), "ls -l");
    for name in [
        "agents",
        "bypass",
        "ctl",
        "eventwait",
        "help",
        "session",
        "tools",
    ] {
        assert!(
            ls.lines().any(|l| l.ends_with(&format!(" {name}"))),
            "{name}: {ls}"
        );
    }
    let line = |name: &str| {
        ls.lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .unwrap()
            .to_owned()
    };
    assert!(line("session").starts_with("dr-xr-xr-x"), "{ls}");
    assert!(line("help").starts_with("-r--r--r--"), "{ls}");
    assert!(line("ctl").starts_with("-rw-------"), "{ls}");

    // Whole files, the same bytes as over 9P: one with a length, one of unknown length.
    let help = std::fs::read_to_string(m.join("help")).unwrap();
    assert!(help.len() > 4096, "help is {} bytes", help.len());
    assert_eq!(help, nine_read(&srv, "help"));
    assert_eq!(std::fs::metadata(m.join("tools")).unwrap().len(), 0);
    let tools = std::fs::read_to_string(m.join("tools")).unwrap();
    assert!(!tools.is_empty());
    assert_eq!(tools, nine_read(&srv, "tools"));

    // echo > new: a session; another agent; both seen over 9P.
    session(&m, &srv);
    assert!(nine_read(&srv, "session/idx").contains("proj"));
    assert!(nine_read(&srv, "session/proj/agent/idx").contains("coder"));
    let mut names = std::fs::read_dir(m.join("session"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect::<Vec<_>>();
    names.sort();
    assert_eq!(names, ["idx", "new", "proj"]);

    // Request and reply on one descriptor, as a shell does it: the reply from its start.
    let reply = sh_ok(
        m.path(),
        "exec 3<>session/new; printf 'name=two cwd=/tmp\\n' >&3; cat <&3",
    );
    assert_eq!(reply, "two\n");
    let reply = sh_ok(m.path(), "exec 3<>ctl; printf 'help\\n' >&3; cat <&3");
    assert!(reply.starts_with("help\t"), "{reply}");
    // Write, seek back to 0, read: the same reply.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.join("ctl"))
        .unwrap();
    f.write_all(b"help\n").unwrap();
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(0)).unwrap();
    let mut again = String::new();
    f.read_to_string(&mut again).unwrap();
    assert_eq!(again, reply);
    // A descriptor that wrote nothing has no reply: replies are per open file.
    let other = std::fs::read_to_string(m.join("session/proj/ctl")).unwrap();
    assert!(!other.contains("list these commands"), "{other}");

    // > replaces, >> appends: the plan over 9P says so.
    let plan = "session/proj/agent/coder/plan";
    sh_ok(m.path(), &format!("echo 'step one' > {plan}"));
    sh_ok(m.path(), &format!("echo 'step two' >> {plan}"));
    assert_eq!(nine_read(&srv, plan), "step one\nstep two\n");
    sh_ok(m.path(), &format!("echo 'only' > {plan}"));
    assert_eq!(nine_read(&srv, plan), "only\n");

    // A value written in many pieces arrives whole: bash's printf writes each line itself.
    // A reader waits for a value newer than the one at its open, so fd 3 is opened first.
    // With feed=off the value is not a turn for coder (whose one scripted reply is for the
    // prompt below), and readers still get it.
    let feed = "session/proj/agent/coder/feed";
    sh_ok(m.path(), "echo feed=off > session/proj/agent/coder/cfg");
    let got = sh_ok(
        m.path(),
        &format!(
            "exec 3<{feed}; for i in $(seq 1 200); do printf 'line %s\\n' $i; done > {feed}; cat <&3"
        ),
    );
    let want: String = (1..=200).map(|i| format!("line {i}\n")).collect();
    assert_eq!(got, want);

    // A prompt written through the mount runs a turn; statewait (one state per read) follows
    // it; chat holds the reply; stats of unknown length read in full.
    // statewait gives one state per read at offset 0 (then end of file), so the descriptor
    // is read again at 0 for each change.
    let agent = m.join("session/proj/agent/coder");
    let seen = prompt_and_wait(&agent, "say hello\n");
    assert!(seen.contains(&"thinking".to_owned()), "{seen:?}");
    let log = std::fs::read_to_string(agent.join("log")).unwrap();
    assert!(
        log.contains("say hello") && log.contains("hello from the model"),
        "{log}"
    );
    let stats = std::fs::read_to_string(agent.join("stats")).unwrap();
    assert!(stats.lines().any(|l| l == "requests=1"), "{stats}");
    assert_eq!(
        stats,
        nine_read(&srv, "session/proj/agent/coder/stats"),
        "stats differ"
    );
}

#[test]
fn feed_values_through_the_mount_are_the_pauses_between_writes() {
    if !fuse_usable("feed_values_through_the_mount_are_the_pauses_between_writes") {
        return;
    }
    let srv = replay_srv(&[]);
    let m = Mounted::new(&srv);
    session(&m, &srv);
    let feed = "session/proj/agent/coder/feed";
    // A reader holding one descriptor: one value per read at offset 0 (values here are small).
    let reader = std::fs::File::open(m.join(feed)).unwrap();
    let values = std::thread::spawn(move || {
        use std::os::unix::fs::FileExt;
        (0..4)
            .map(|_| {
                let mut buf = [0u8; 256];
                let n = reader.read_at(&mut buf, 0).unwrap();
                String::from_utf8_lossy(&buf[..n]).into_owned()
            })
            .collect::<Vec<_>>()
    });
    // One open, written in pieces with a pause between: a redirect and a pipe alike.
    sh_ok(
        m.path(),
        &format!(
            "{{ printf 'one '; printf 'value\\n'; sleep 2.5; printf 'two\\n'; }} > {feed}; \
             {{ printf 'three '; sleep 2.5; printf 'three \\n'; }} | cat > {feed}"
        ),
    );
    // The last value is published at the close (or a second after its last write).
    let values = values.join().unwrap();
    assert_eq!(
        values,
        ["one value\n", "two\n", "three ", "three \n"],
        "{values:?}"
    );
}

#[test]
fn errors_are_the_right_errno_and_change_nothing() {
    if !fuse_usable("errors_are_the_right_errno_and_change_nothing") {
        return;
    }
    let srv = Srv::start();
    let m = Mounted::new(&srv);
    session(&m, &srv);
    let errno = |r: std::io::Result<()>| r.unwrap_err().raw_os_error().unwrap();

    assert_eq!(
        errno(std::fs::read(m.join("no-such-file")).map(drop)),
        libc::ENOENT
    );
    assert_eq!(
        errno(std::fs::read(m.join("session/nope/name")).map(drop)),
        libc::ENOENT
    );
    // help is read-only (0444).
    assert_eq!(errno(std::fs::write(m.join("help"), "x")), libc::EACCES);
    // An unknown ctl command: refused as an invalid argument, nothing else happens.
    assert_eq!(
        errno(std::fs::write(m.join("session/proj/ctl"), "frobnicate\n")),
        libc::EINVAL
    );
    assert_eq!(nine_read(&srv, "session/proj/paused").trim(), "false");
    // The server's words for it, which the errno lost, are one cat away.
    let last = std::fs::read_to_string(m.join("lasterror")).unwrap();
    assert!(
        last.contains(" session/proj/ctl: unknown command \"frobnicate\""),
        "{last}"
    );
    // The session tree is the server's: no mkdir, rmdir or rename there.
    assert_eq!(
        errno(std::fs::create_dir(m.join("session/mine"))),
        libc::EACCES
    );
    assert_eq!(
        errno(std::fs::remove_dir(m.join("session/proj"))),
        libc::EACCES
    );
    assert_eq!(
        errno(std::fs::rename(
            m.join("session/proj"),
            m.join("session/other")
        )),
        libc::EACCES
    );
    assert!(nine_read(&srv, "session/idx").contains("proj"));
    // Reading a directory as a file, and a file as a directory.
    assert_eq!(
        errno(std::fs::read(m.join("session")).map(drop)),
        libc::EISDIR
    );
    assert_eq!(
        errno(std::fs::read_dir(m.join("help")).map(drop)),
        libc::ENOTDIR
    );
}

/// The session of [`session`] with a new bead `notes` mounted as the create target at `/ctx`
/// of its namespace: that directory in the mount.
fn union_ctx(m: &Mounted, srv: &Srv) -> std::path::PathBuf {
    session(m, srv);
    let ns = m.join("session/proj/ns");
    let reply = sh_ok(
        &ns,
        "exec 3<>ctl; printf 'start notes\\n' >&3; cat <&3; exec 3>&-; \
         exec 3<>ctl; printf 'mount -ac notes /ctx\\n' >&3; cat <&3",
    );
    assert!(reply.contains("mounted notes"), "{reply}");
    ns.join("ctx")
}

#[test]
fn create_mkdir_rm_and_mv_in_a_bead_union() {
    if !fuse_usable("create_mkdir_rm_and_mv_in_a_bead_union") {
        return;
    }
    let srv = Srv::start();
    let m = Mounted::new(&srv);
    let ctx = union_ctx(&m, &srv);
    // Create, append, read back; the same over 9P.
    sh_ok(&ctx, "echo hello > a.txt && echo more >> a.txt");
    assert_eq!(
        nine_read(&srv, "session/proj/ns/ctx/a.txt"),
        "hello\nmore\n"
    );
    // mkdir, rename in place, rename over an existing file (replaced, as rename(2) does).
    std::fs::create_dir(ctx.join("sub")).unwrap();
    assert!(std::fs::metadata(ctx.join("sub")).unwrap().is_dir());
    std::fs::rename(ctx.join("a.txt"), ctx.join("b.txt")).unwrap();
    std::fs::write(ctx.join("c.txt"), "c\n").unwrap();
    std::fs::rename(ctx.join("c.txt"), ctx.join("b.txt")).unwrap();
    assert_eq!(std::fs::read_to_string(ctx.join("b.txt")).unwrap(), "c\n");
    assert!(!ctx.join("a.txt").exists() && !ctx.join("c.txt").exists());
    // Across directories 9P cannot rename: EXDEV, and mv copies instead.
    let e = std::fs::rename(ctx.join("b.txt"), ctx.join("sub/b.txt")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EXDEV));
    sh_ok(&ctx, "mv b.txt sub/");
    assert_eq!(nine_read(&srv, "session/proj/ns/ctx/sub/b.txt"), "c\n");
    assert!(!ctx.join("b.txt").exists());
    // truncate, rm, rmdir of a non-empty then an empty directory.
    sh_ok(&ctx, "printf abcdef > t && truncate -s 3 t");
    assert_eq!(std::fs::read_to_string(ctx.join("t")).unwrap(), "abc");
    let e = std::fs::remove_dir(ctx.join("sub")).unwrap_err();
    assert!(
        matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EEXIST)),
        "{e}"
    );
    std::fs::remove_file(ctx.join("sub/b.txt")).unwrap();
    std::fs::remove_dir(ctx.join("sub")).unwrap();
    assert!(!ctx.join("sub").exists());
    let listing = nine_read(&srv, "session/proj/ns/ctx");
    assert!(!listing.contains("sub"), "{listing}");
}

#[test]
fn sequential_reads_are_read_ahead_and_a_change_through_the_mount_voids_them() {
    if !fuse_usable("sequential_reads_are_read_ahead_and_a_change_through_the_mount_voids_them") {
        return;
    }
    use std::os::unix::fs::FileExt;
    let srv = Srv::start();
    let rec = Recorder::start(&srv.sock);
    let m = Mounted::with_addr(&rec.addr);
    const PIECE: usize = 64 * 1024;
    let file = union_ctx(&m, &srv).join("big.bin");
    let old: Vec<u8> = (0..5 * PIECE).map(|i| (i % 251) as u8).collect();
    std::fs::write(&file, &old).unwrap();
    // Read in pieces (each read ahead of the next), the whole file comes back exactly.
    let mut whole = Vec::new();
    let mut f = std::fs::File::open(&file).unwrap();
    let mut buf = vec![0u8; PIECE];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        whole.extend_from_slice(&buf[..n]);
    }
    assert!(
        whole == old,
        "read back {} bytes, not what was written",
        whole.len()
    );
    drop(f);

    let reads = |t: bool| rec.count(t, if t { TREAD } else { RREAD });
    let mut a = std::fs::File::open(&file).unwrap();
    let (t0, r0) = (reads(true), reads(false));
    // Piece 0: its Tread and, at once, the one for piece 1.
    a.read_exact(&mut buf).unwrap();
    assert!(buf == old[..PIECE], "piece 0");
    rec.wait_until("piece 1 read ahead", |s| count(s, false, RREAD) >= r0 + 2);
    assert_eq!(reads(true), t0 + 2, "piece 0 and the read ahead of piece 1");
    // Piece 1 is what was read ahead: its only Tread is the read ahead of piece 2.
    a.read_exact(&mut buf).unwrap();
    assert!(buf == old[PIECE..2 * PIECE], "piece 1");
    rec.wait_until("piece 2 read ahead", |s| count(s, false, RREAD) >= r0 + 3);
    assert_eq!(reads(true), t0 + 3, "piece 1 came from the read ahead");
    // Piece 2 changes through another descriptor after it was read ahead: the read gets the
    // new bytes, not the old ones the read ahead holds.
    let new = vec![0xA5u8; PIECE];
    let b = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    b.write_all_at(&new, 2 * PIECE as u64).unwrap();
    drop(b);
    a.read_exact(&mut buf).unwrap();
    assert!(buf == new, "piece 2 after the change is the new bytes");
    // A shorter read takes the front of what was read ahead, the next one the rest.
    rec.wait_until("piece 3 read ahead", |s| count(s, false, RREAD) >= r0 + 5);
    let (t1, r1) = (reads(true), reads(false));
    let mut small = vec![0u8; 1000];
    a.read_exact(&mut small).unwrap();
    assert!(
        small == old[3 * PIECE..3 * PIECE + 1000],
        "front of piece 3"
    );
    let mut rest = vec![0u8; PIECE - 1000];
    a.read_exact(&mut rest).unwrap();
    assert!(rest == old[3 * PIECE + 1000..4 * PIECE], "rest of piece 3");
    // The rest was all that read asked for, so the next piece is read ahead.
    rec.wait_until("piece 4 read ahead", |s| count(s, false, RREAD) > r1);
    assert_eq!(
        reads(true),
        t1 + 1,
        "piece 3 came whole from the read ahead"
    );
    drop(a);
    // Closed with piece 4 read ahead: a new open reads the file as it now is.
    let mut now = old.clone();
    now[2 * PIECE..3 * PIECE].copy_from_slice(&new);
    assert!(
        std::fs::read(&file).unwrap() == now,
        "the file after the change"
    );
}

/// A unix-socket relay between the bridge and the server that records the type of every
/// 9P message in each direction.
struct Recorder {
    addr: String,
    seen: Arc<Seen>,
    _dir: tempfile::TempDir,
}

/// The message types seen so far (T-message?, type), and a wakeup for each new one.
#[derive(Default)]
struct Seen {
    list: Mutex<Vec<(bool, u8)>>,
    grew: Condvar,
}

impl Recorder {
    fn start(upstream: &Path) -> Recorder {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("proxy");
        let l = UnixListener::bind(&sock).unwrap();
        let seen = Arc::new(Seen::default());
        let up = upstream.to_path_buf();
        let s2 = Arc::clone(&seen);
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let Ok(u) = UnixStream::connect(&up) else {
                    return;
                };
                for (from, to, t) in [
                    (c.try_clone().unwrap(), u.try_clone().unwrap(), true),
                    (u, c, false),
                ] {
                    let seen = Arc::clone(&s2);
                    std::thread::spawn(move || relay(from, to, t, &seen));
                }
            }
        });
        Recorder {
            addr: format!("unix!{}", sock.display()),
            seen,
            _dir: dir,
        }
    }

    fn count(&self, t_msg: bool, ty: u8) -> usize {
        count(&self.seen.list.lock().unwrap(), t_msg, ty)
    }

    /// Waits until what has crossed the relay satisfies `done` (failing after GUARD); woken by
    /// each message, never by a clock.
    fn wait_until(&self, what: &str, done: impl Fn(&[(bool, u8)]) -> bool) {
        let deadline = Instant::now() + GUARD;
        let mut list = self.seen.list.lock().unwrap();
        while !done(&list) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "timed out waiting for {what}");
            list = self.seen.grew.wait_timeout(list, left).unwrap().0;
        }
    }
}

fn count(seen: &[(bool, u8)], t_msg: bool, ty: u8) -> usize {
    seen.iter().filter(|(t, y)| *t == t_msg && *y == ty).count()
}

/// Treads the server has not answered and nobody flushed: readers blocked in the server.
fn blocked_reads(seen: &[(bool, u8)]) -> usize {
    count(seen, true, TREAD)
        .saturating_sub(count(seen, false, RREAD) + count(seen, false, RERROR))
        .saturating_sub(count(seen, true, TFLUSH))
}

/// Copies whole 9P frames (size[4] type[1] …) from `from` to `to`, noting each type.
fn relay(mut from: UnixStream, mut to: UnixStream, t: bool, seen: &Seen) {
    loop {
        let mut size = [0u8; 4];
        if from.read_exact(&mut size).is_err() {
            break;
        }
        let n = u32::from_le_bytes(size) as usize;
        let mut rest = vec![0u8; n.saturating_sub(4)];
        if from.read_exact(&mut rest).is_err() {
            break;
        }
        if let Some(&ty) = rest.first() {
            seen.list.lock().unwrap().push((t, ty));
            seen.grew.notify_all();
        }
        if to
            .write_all(&size)
            .and_then(|()| to.write_all(&rest))
            .is_err()
        {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

const RERROR: u8 = 107;
const TFLUSH: u8 = 108;
const RFLUSH: u8 = 109;
const TREAD: u8 = 116;
const RREAD: u8 = 117;

/// `cmd FILE` with SIGINT at its default action, whatever this process inherited: a test run
/// started in the background of a shell without job control (`cmd &`) ignores SIGINT, and
/// ignored signals are inherited across exec, so Ctrl-C would not end the reader.
fn with_default_sigint(cmd: &str) -> Command {
    let mut c = Command::new("env");
    c.args(["--default-signal=INT", cmd]);
    c
}

fn spawn_reader(cmd: &str, file: &Path) -> Child {
    with_default_sigint(cmd)
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the mount at `m` is gone (failing after GUARD): woken by the kernel's mount
/// table changes (POLLPRI on /proc/self/mountinfo), never by a clock.
fn wait_unmounted(m: &Mounted) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    // Opened before the first look, so a change in between still wakes the poll.
    let table = std::fs::File::open("/proc/self/mountinfo").unwrap();
    let deadline = Instant::now() + GUARD;
    while m.is_mounted() {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "the mount did not go away");
        let mut fds = [PollFd::new(table.as_fd(), PollFlags::POLLPRI)];
        poll(
            &mut fds,
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
        )
        .unwrap();
    }
}

/// Writes a prompt and follows the turn through statewait (opened first: its baseline is the
/// state at open) until the agent is idle again; returns the states seen.
fn prompt_and_wait(agent: &Path, text: &str) -> Vec<String> {
    use std::os::unix::fs::FileExt;
    let states = std::fs::File::open(agent.join("statewait")).unwrap();
    std::fs::write(agent.join("prompt"), text).unwrap();
    let mut seen: Vec<String> = Vec::new();
    while seen.last().map(String::as_str) != Some("idle") {
        // One state per read at offset 0, then end of file.
        let mut buf = [0u8; 256];
        let n = states.read_at(&mut buf, 0).unwrap();
        assert!(n > 0, "statewait ended: {seen:?}");
        seen.push(String::from_utf8_lossy(&buf[..n]).trim().to_owned());
    }
    seen
}

fn interrupt(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
}

#[test]
fn blocked_reads_end_on_ctrl_c_with_a_flush() {
    if !fuse_usable("blocked_reads_end_on_ctrl_c_with_a_flush") {
        return;
    }
    let srv = replay_srv(&[
        r#"{"text": "first reply"}"#,
        r#"{"text": "streamed reply"}"#,
    ]);
    let rec = Recorder::start(&srv.sock);
    let m = Mounted::with_addr(&rec.addr);
    session(&m, &srv);
    let agent = m.join("session/proj/agent/coder");

    // cat statewait: nothing changes, so it blocks (in a Tread the server holds). Ctrl-C
    // ends it, and a Tflush (answered) goes out.
    for file in ["statewait", "feed"] {
        let flushes = rec.count(true, TFLUSH);
        let mut cat = spawn_reader("cat", &agent.join(file));
        rec.wait_until(&format!("cat {file} to block in a Tread"), |s| {
            blocked_reads(s) > 0
        });
        assert!(
            cat.try_wait().unwrap().is_none(),
            "cat {file} ended by itself"
        );
        interrupt(&cat);
        let t = Instant::now();
        // Failing, it also says where the mount's bridge was.
        let st = ollie_testkit::server::wait_child_or_report(
            &mut cat,
            GUARD,
            &format!("cat {file} after SIGINT"),
            &m.path().to_string_lossy(),
        );
        eprintln!("cat {file}: ended {:?} after SIGINT", t.elapsed());
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(libc::SIGINT), "{st:?}");
        rec.wait_until("the Tflush and its Rflush", |s| {
            count(s, true, TFLUSH) > flushes && count(s, false, RFLUSH) > flushes
        });
    }

    // tail -f chat on a terminal (script(1) gives it one): the last lines, then each new
    // turn as it streams; Ctrl-C typed on the terminal ends it. (GNU tail reads a file of
    // length 0 to its end before it prints anything, so the chat must not be empty.)
    prompt_and_wait(&agent, "first\n");
    let log = std::fs::read_to_string(agent.join("log")).unwrap();
    assert!(log.contains("first reply"), "{log}");
    let mut tail = with_default_sigint("script")
        .args(["-q", "-e", "-c", "tail -f chat", "/dev/null"])
        .current_dir(&agent)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut term_in = tail.stdin.take().unwrap();
    let mut term_out = BufReader::new(tail.stdout.take().unwrap());
    let mut got = String::new();
    let mut line = |want: &str, got: &mut String| {
        while !got.contains(want) {
            let mut l = String::new();
            assert!(term_out.read_line(&mut l).unwrap() > 0, "tail ended: {got}");
            got.push_str(&l);
        }
    };
    line("first reply", &mut got);
    std::fs::write(agent.join("prompt"), "stream it\n").unwrap();
    line("streamed reply", &mut got);
    assert!(got.contains("stream it"), "{got}");
    term_in.write_all(b"\x03").unwrap();
    let st = wait_child(&mut tail, "tail -f after Ctrl-C");
    assert_eq!(st.code(), Some(130), "{st:?}: {got}");

    // The mount still serves after all that.
    let stats = std::fs::read_to_string(agent.join("stats")).unwrap();
    assert!(stats.lines().any(|l| l == "requests=2"), "{stats}");
}

#[test]
fn unmount_and_the_end_of_the_server() {
    if !fuse_usable("unmount_and_the_end_of_the_server") {
        return;
    }
    let srv = Srv::start();
    // o mount -u unmounts, and the bridge goes away.
    let m = Mounted::new(&srv);
    assert!(std::fs::metadata(m.join("help")).is_ok());
    // Mounted like fusermount3 mounts a user's filesystem, root or not.
    let canon = m.path().canonicalize().unwrap();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == canon.to_str())
        .unwrap_or_else(|| panic!("{} not in mountinfo", canon.display()));
    let opts: Vec<&str> = line.split(' ').nth(5).unwrap().split(',').collect();
    assert!(
        opts.contains(&"nosuid") && opts.contains(&"nodev"),
        "{line}"
    );
    assert!(line.contains(" - fuse.ollie ollie "), "{line}");
    let out = m.unmount();
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(!m.is_mounted());
    assert!(std::fs::read_dir(m.path()).unwrap().next().is_none());
    // Not a mount (any more): one line, exit 1.
    let out = m.unmount();
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("is not an o mount"), "{out:?}");

    // Mount refusals: one line each.
    let full = tempfile::tempdir().unwrap();
    std::fs::write(full.path().join("x"), "").unwrap();
    let out = o_mount(&srv.addr(), &[full.path().to_str().unwrap()]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("not empty"), "{out:?}");
    assert_eq!(out.stderr.trim_end().lines().count(), 1, "{out:?}");
    let empty = tempfile::tempdir().unwrap();
    let gone = format!("unix!{}", empty.path().join("nothing-here").display());
    let out = o_mount(&gone, &[empty.path().to_str().unwrap()]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(out.stderr.contains("cannot connect"), "{out:?}");
    assert!(!is_fuse_mount(empty.path()));

    // The server goes away: the mount ends by itself, even with a reader blocked inside.
    let mut srv = srv;
    let rec = Recorder::start(&srv.sock);
    let m = Mounted::with_addr(&rec.addr);
    let mut cat = spawn_reader("cat", &m.join("eventwait"));
    rec.wait_until("cat eventwait to block", |s| blocked_reads(s) > 0);
    srv.stop();
    wait_child(&mut cat, "cat eventwait after the server stopped");
    wait_unmounted(&m);
}
