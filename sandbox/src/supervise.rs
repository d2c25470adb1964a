//! Supervising a started tool, one-shot or prepared: output capture, stdin feeding, the
//! timeout, the cancellation handle, the disk watchdog, the start-up report, and the record
//! once pid 1 of the run has exited.

use crate::error::{SandboxError, io_err};
use crate::record::{
    DiskLimit, DiskLimitRecord, ExecFrom, ExitRecord, KilledBy, Layers, LimitsRecord, OutputRecord,
    RunOutput, RunRecord, RusageRecord,
};
use crate::request::{CancelWatch, Requests, RunRequest, Stream, pass_fd_path};
use crate::sys::{self, Stage};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One output stream of the tool: what was kept and how much was written.
pub(crate) struct Capture {
    kind: Stream,
    fd: OwnedFd,
    buf: Vec<u8>,
    total: u64,
    cap: u64,
    open: bool,
}

impl Capture {
    /// Captures the read end `fd` of a tool's output pipe (made non-blocking), keeping at
    /// most `cap` bytes.
    pub(crate) fn new(kind: Stream, fd: OwnedFd, cap: u64) -> Result<Capture, SandboxError> {
        sys::set_nonblocking(fd.as_raw_fd()).map_err(io_err("configure pipes"))?;
        Ok(Capture {
            kind,
            fd,
            buf: Vec::new(),
            total: 0,
            cap,
            open: true,
        })
    }

    /// The stream as recorded.
    fn record(&self) -> OutputRecord {
        OutputRecord {
            total_bytes: self.total,
            captured_bytes: self.buf.len() as u64,
            truncated: self.total > self.buf.len() as u64,
        }
    }

    /// Reads what is available, at most 1 MiB per call so a flood cannot starve the
    /// deadline checks of the poll loop.
    fn drain(&mut self, sink: &mut dyn FnMut(Stream, &[u8])) -> Result<(), SandboxError> {
        let mut chunk = [0u8; 65536];
        for _ in 0..16 {
            match sys::read(self.fd.as_raw_fd(), &mut chunk) {
                Ok(0) => {
                    self.open = false;
                    return Ok(());
                }
                Ok(n) => {
                    sink(self.kind, &chunk[..n]);
                    self.total += n as u64;
                    let room = self.cap.saturating_sub(self.buf.len() as u64) as usize;
                    self.buf.extend_from_slice(&chunk[..n.min(room)]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => {
                    return Err(SandboxError::Io {
                        op: "read output",
                        source: e,
                    });
                }
            }
        }
        Ok(())
    }
}

/// The longest interval between two samples of the writable filesystems' free space (the
/// watchdog's cost far from the limit: one `fstatfs` per filesystem per interval).
const DISK_SAMPLE: Duration = Duration::from_millis(10);
/// The shortest: near the limit the interval shrinks to what is left of the budget at the
/// observed rate of use (halved), down to this. With `fallocate` refused (seccomp) and every
/// file bounded by RLIMIT_FSIZE ≤ `disk_bytes`, a tool takes space only as fast as it
/// writes, and a crossing kills the whole run at once (SIGKILL, no grace), so the overshoot
/// is at most what the machine writes in about `DISK_SAMPLE_MIN` plus the poll's 1 ms
/// rounding and the kill's latency, whatever the number of writers.
const DISK_SAMPLE_MIN: Duration = Duration::from_millis(1);
/// The free-space reserve: 1/20 (5%) of the filesystem, at most this many bytes.
const RESERVE_BYTES_MAX: u64 = 1 << 30;
/// The free-inode reserve: 1/20 (5%) of the filesystem's inodes, at most this many.
const RESERVE_INODES_MAX: u64 = 100_000;

/// One watched filesystem (by a writable tree on it).
#[derive(Debug)]
struct WatchedFs {
    path: PathBuf,
    fd: OwnedFd,
    start: sys::FsSpace,
}

/// The aggregate disk watchdog: the free space and inodes of every writable tree's
/// filesystem, sampled with `fstatfs` at the start and while the tool runs: every
/// [`DISK_SAMPLE`] far from the limit, more often as the budget runs out (down to
/// [`DISK_SAMPLE_MIN`]). Other writers on the same filesystem count as the tool's (conservative), and space
/// they free hides the tool's use (the reserve still holds).
#[derive(Debug)]
pub(crate) struct DiskWatch {
    fs: Vec<WatchedFs>,
    bytes: u64,
    inodes: u64,
    next: Instant,
    /// The last sample: when, and the most bytes any watched filesystem had lost by then.
    last: (Instant, u64),
}

impl DiskWatch {
    /// Takes the baseline of each distinct filesystem holding a writable tree.
    pub(crate) fn start(
        writable: &[PathBuf],
        l: &ollie_policy::Limits,
        now: Instant,
    ) -> Result<DiskWatch, SandboxError> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut fs: Vec<WatchedFs> = Vec::new();
        let mut devs: Vec<u64> = Vec::new();
        for w in writable {
            let fd: OwnedFd = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
                .open(w)
                .map_err(io_err("open a writable tree to watch its disk use"))?
                .into();
            let (dev, ..) = sys::fstat_ids(&fd).map_err(io_err("sample free disk space"))?;
            if devs.contains(&dev) {
                continue;
            }
            devs.push(dev);
            let start = sys::fstatfs(&fd).map_err(io_err("sample free disk space"))?;
            fs.push(WatchedFs {
                path: w.clone(),
                fd,
                start,
            });
        }
        Ok(DiskWatch {
            fs,
            bytes: l.disk_bytes,
            inodes: l.disk_inodes,
            next: now + DISK_SAMPLE_MIN,
            last: (now, 0),
        })
    }

    /// When the next sample is due (`None`: nothing to watch).
    pub(crate) fn due(&self) -> Option<Instant> {
        (!self.fs.is_empty()).then_some(self.next)
    }

    /// Samples every filesystem if due; the first limit crossed, if any.
    pub(crate) fn sample(&mut self, now: Instant) -> Option<DiskLimitRecord> {
        if self.fs.is_empty() || now < self.next {
            return None;
        }
        let mut used_max = 0u64;
        let mut hit = None;
        for w in &self.fs {
            // A failed sample (should not happen on an open fd) is skipped, not fatal: the
            // rlimits and the timeout still bound the run.
            let Ok(cur) = sys::fstatfs(&w.fd) else {
                continue;
            };
            used_max = used_max.max(w.start.free_bytes.saturating_sub(cur.free_bytes));
            if let Some((limit, allowed, observed, forced_kill)) =
                disk_verdict(&w.start, &cur, self.bytes, self.inodes)
            {
                hit = Some(DiskLimitRecord {
                    limit,
                    path: w.path.clone(),
                    allowed,
                    observed,
                    free_bytes_start: w.start.free_bytes,
                    free_bytes_stop: cur.free_bytes,
                    free_inodes_start: w.start.free_inodes,
                    free_inodes_stop: cur.free_inodes,
                    forced_kill,
                });
                break;
            }
        }
        let (then, used_then) = self.last;
        self.next = now
            + next_interval(
                now - then,
                used_max.saturating_sub(used_then),
                self.bytes.saturating_sub(used_max),
            );
        self.last = (now, used_max);
        hit
    }
}

/// The write rate the watchdog assumes at least (bytes per second): a burst from idle is
/// caught as if the tool already wrote this fast. Above it, the rate seen last counts.
const DISK_RATE_PRIOR: u64 = 8 << 30;

/// The interval until the next sample: half the time the rest of the budget (`left` bytes)
/// lasts at the rate seen over the last interval (`used` bytes in `elapsed`) or
/// [`DISK_RATE_PRIOR`], whichever is faster, within [`DISK_SAMPLE_MIN`]..=[`DISK_SAMPLE`].
fn next_interval(elapsed: Duration, used: u64, left: u64) -> Duration {
    let seen = u128::from(used) * 1_000_000_000 / elapsed.as_nanos().max(1);
    let rate = seen.max(u128::from(DISK_RATE_PRIOR));
    // left / rate / 4, in nanoseconds (u128: no overflow).
    let ns = u128::from(left) * 1_000_000_000 / (4 * rate);
    let ns = u64::try_from(ns).unwrap_or(u64::MAX);
    Duration::from_nanos(ns).clamp(DISK_SAMPLE_MIN, DISK_SAMPLE)
}

/// Whether a filesystem sampled at `cur` (baseline `start`) crossed a limit: which, its value,
/// the observed value, and whether the overshoot is gross (more than an eighth past the
/// limit, or below half the reserve).
fn disk_verdict(
    start: &sys::FsSpace,
    cur: &sys::FsSpace,
    bytes: u64,
    inodes: u64,
) -> Option<(DiskLimit, u64, u64, bool)> {
    let used = start.free_bytes.saturating_sub(cur.free_bytes);
    if used > bytes {
        return Some((DiskLimit::DiskBytes, bytes, used, used > bytes + bytes / 8));
    }
    // Filesystems without inode accounting report 0 inodes (btrfs).
    let has_inodes = start.total_inodes > 0;
    let used_inodes = start.free_inodes.saturating_sub(cur.free_inodes);
    if has_inodes && used_inodes > inodes {
        return Some((
            DiskLimit::DiskInodes,
            inodes,
            used_inodes,
            used_inodes > inodes + inodes / 8,
        ));
    }
    let reserve = (cur.total_bytes / 20).min(RESERVE_BYTES_MAX);
    if cur.avail_bytes < reserve && cur.avail_bytes < start.avail_bytes {
        return Some((
            DiskLimit::ReserveBytes,
            reserve,
            cur.avail_bytes,
            cur.avail_bytes < reserve / 2,
        ));
    }
    let reserve_inodes = (cur.total_inodes / 20).min(RESERVE_INODES_MAX);
    if has_inodes && cur.free_inodes < reserve_inodes && cur.free_inodes < start.free_inodes {
        return Some((
            DiskLimit::ReserveInodes,
            reserve_inodes,
            cur.free_inodes,
            cur.free_inodes < reserve_inodes / 2,
        ));
    }
    None
}

/// Bytes read from a relayed stdin per poll round (the relay buffer's bound).
const RELAY_CHUNK: usize = 64 * 1024;

/// Reads the 8-byte failure report from a close-on-exec error pipe; `None` at EOF (the child
/// reached `execve`, or the zygote is ready).
pub(crate) fn read_report(fd: &OwnedFd) -> Result<Option<[u8; 8]>, SandboxError> {
    let mut msg = [0u8; 8];
    let mut got = 0;
    while got < msg.len() {
        match sys::read(fd.as_raw_fd(), &mut msg[got..])
            .map_err(io_err("read the start-up report"))?
        {
            0 => break,
            n => got += n,
        }
    }
    Ok((got > 0).then_some(msg))
}

/// The error a failure report names: the failed stage (or `execve` of `program`, or the
/// working directory `cwd`) and errno.
pub(crate) fn stage_error(msg: [u8; 8], program: &Path, cwd: &Path) -> SandboxError {
    let stage_n = u32::from_ne_bytes([msg[0], msg[1], msg[2], msg[3]]);
    let errno = i32::from_ne_bytes([msg[4], msg[5], msg[6], msg[7]]);
    let source = io::Error::from_raw_os_error(errno);
    match Stage::from_u32(stage_n) {
        Some(Stage::Exec) => SandboxError::Exec {
            program: program.display().to_string(),
            source,
        },
        Some(Stage::Chdir) => SandboxError::Cwd {
            path: cwd.to_path_buf(),
            source,
        },
        Some(s) => SandboxError::ChildSetup {
            stage: s.name(),
            source,
        },
        None => SandboxError::ChildSetup {
            stage: "unknown",
            source,
        },
    }
}

/// Takes the proxy's listener pid 1 hands over on `sock` (one byte and the descriptor:
/// `network.mode = "proxy"`, see `crate::proxy`). If pid 1 failed first, the error is the
/// stage it reported on `err_r` (`program` and `cwd` name the run in it).
pub(crate) fn take_proxy_listener(
    sock: &OwnedFd,
    err_r: &OwnedFd,
    program: &Path,
    cwd: &Path,
) -> Result<std::net::TcpListener, SandboxError> {
    let mut byte = [0u8; 1];
    match sys::recv_with_fd(sock, &mut byte) {
        Ok((1, Some(fd))) => Ok(std::net::TcpListener::from(fd)),
        received => {
            if let Some(msg) = read_report(err_r)? {
                return Err(stage_error(msg, program, cwd));
            }
            let source = match received {
                Err(e) => e,
                Ok(_) => io::Error::from_raw_os_error(libc::EPROTO),
            };
            Err(io_err("take the proxy's listener from the sandbox")(source))
        }
    }
}

/// What the runner watches while a tool runs (one-shot or prepared).
pub(crate) struct Watch<'a> {
    /// Readable when pid 1 of the run (or call) has exited.
    pub(crate) pidfd: RawFd,
    /// Sends a signal to pid 1 (which forwards `sys::FORWARDED` signals to every process of
    /// the run; SIGKILL kills the run).
    pub(crate) signal: &'a dyn Fn(i32),
    /// The request: stdin bytes or relay (`stdin_fd`), the cancellation handle.
    pub(crate) req: &'a RunRequest,
    /// The timeout (already narrowed by the request:
    /// [`effective_limits`](crate::request::effective_limits)) and grace period.
    pub(crate) limits: &'a ollie_policy::Limits,
    /// When the run started (the timeout counts from here).
    pub(crate) started: Instant,
    /// The aggregate disk watchdog (baseline taken before the tool could write).
    pub(crate) disk: DiskWatch,
    /// The runner's end of the tool's stdin socket, if it is fed.
    pub(crate) feed: Option<OwnedFd>,
    /// The run's registration with its [`Cancel`](crate::request::Cancel) handle (taken when
    /// the run started, so signals sent while it was being set up are delivered too).
    pub(crate) cancel: Option<CancelWatch>,
}

/// Why and how the runner stopped a run, if it did.
pub(crate) struct Stopped {
    timed_out: bool,
    cancelled: bool,
    killed_by: Option<KilledBy>,
    disk_limit: Option<DiskLimitRecord>,
}

/// Captures output, feeds stdin and enforces the timeout, the cancellation handle's requests
/// (cancel, kill, signals: watched until pid 1 has exited) and the disk limits until pid 1 of
/// the run has exited and both output streams are at EOF.
pub(crate) fn supervise(
    w: Watch<'_>,
    out: &mut Capture,
    errc: &mut Capture,
    sink: &mut dyn FnMut(Stream, &[u8]),
) -> Result<Stopped, SandboxError> {
    let Watch {
        pidfd,
        signal,
        req,
        limits,
        started,
        mut disk,
        feed,
        // Watched until pid 1 has exited: signals and kills keep working after a cancel.
        cancel: mut watch,
    } = w;
    let mut deadline = started + Duration::from_secs(limits.timeout_seconds);
    let grace = Duration::from_millis(limits.kill_grace_ms);
    let mut stop = Stopping::default();
    let mut freeze = Freezing::new(pidfd);
    let mut feed = Feed::new(feed, req)?;
    let mut init_done = false;
    while !init_done || out.open || errc.open {
        let now = Instant::now();
        if !init_done {
            // The timeout does not count while the run is frozen.
            let until = if freeze.asked() { None } else { Some(deadline) };
            stop.enforce_limits(now, &mut disk, until, grace, signal);
            if std::mem::take(&mut stop.kill_all_now) {
                freeze.kill_descendants();
            }
            freeze.check(now, signal, watch.as_ref());
        }
        // While frozen the deadline waits (it moves on by the frozen time at the thaw).
        let wake_for = if freeze.asked() {
            deadline.max(now + Duration::from_secs(3600))
        } else {
            deadline
        };
        let mut timeout_ms = stop.poll_timeout(now, init_done, wake_for, grace, &disk);
        if !init_done && freeze.confirming() {
            let look = freeze.next_look_ms();
            timeout_ms = if timeout_ms < 0 {
                look
            } else {
                timeout_ms.min(look)
            };
        }
        let pending = feed.pending(init_done);
        if init_done {
            // The run has ended: later requests are no-ops for it.
            watch = None;
        }
        let cancel_fd = watch.as_ref().map_or(-1, CancelWatch::fd);
        let mut fds = [
            pollin(if out.open { out.fd.as_raw_fd() } else { -1 }),
            pollin(if errc.open { errc.fd.as_raw_fd() } else { -1 }),
            pollin(if init_done { -1 } else { pidfd }),
            libc::pollfd {
                fd: feed.write_fd(pending),
                events: libc::POLLOUT,
                revents: 0,
            },
            pollin(feed.read_fd(pending)),
            pollin(cancel_fd),
        ];
        sys::poll(&mut fds, timeout_ms).map_err(io_err("poll"))?;
        if fds[0].revents != 0 {
            out.drain(sink)?;
        }
        if fds[1].revents != 0 {
            errc.drain(sink)?;
        }
        if fds[2].revents != 0 {
            init_done = true;
        }
        if fds[3].revents != 0 {
            feed.write();
        }
        if fds[4].revents != 0 {
            feed.read();
        }
        if fds[5].revents != 0
            && let Some(w) = &watch
        {
            let mut asked = w.take();
            if !init_done && let Some(frozen_for) = freeze.on_request(asked.freeze, signal, w) {
                deadline += frozen_for;
            }
            // Only the thaw continues a frozen run: a SIGCONT asked meanwhile is dropped.
            if freeze.asked() {
                asked.signals.retain(|s| *s != libc::SIGCONT);
            }
            stop.on_requests(asked, signal);
        }
    }
    Ok(stop.into_stopped())
}

/// A run's freeze ([`crate::Cancel::freeze`]): asked, signalled to pid 1, confirmed.
struct Freezing {
    /// pid 1 of the run's pidfd.
    pidfd: RawFd,
    /// pid 1 of the run, looked up at the first freeze, where `/proc` can tell (else a freeze
    /// is never confirmed).
    init: Option<i32>,
    /// Since when a freeze is asked (and was sent).
    since: Option<Instant>,
    /// When the freeze signal last went to pid 1.
    sent: Option<Instant>,
    confirm: crate::freeze::Confirm,
    confirmed: bool,
    /// Looks at `/proc` since the freeze was asked (the wait between two grows).
    looks: u32,
}

/// How often the freeze signal is sent again while some process of the run still runs (one
/// that was forked while pid 1 sent SIGSTOP to the others).
const FREEZE_AGAIN: Duration = Duration::from_millis(5);
/// The longest wait between two looks at a run that is not yet seen stopped (they start at
/// 1 ms and double: a process stuck in the kernel does not keep the runner busy).
const LOOK_AT_MOST_MS: i32 = 64;

impl Freezing {
    fn new(pidfd: RawFd) -> Freezing {
        Freezing {
            pidfd,
            looks: 0,
            init: None,
            since: None,
            sent: None,
            confirm: crate::freeze::Confirm::default(),
            confirmed: false,
        }
    }

    fn asked(&self) -> bool {
        self.since.is_some()
    }

    /// SIGKILL to every process of the run besides pid 1 (see
    /// [`crate::freeze::kill_descendants`]).
    fn kill_descendants(&mut self) {
        if self.init.is_none() {
            self.init = crate::freeze::pid_of_pidfd(self.pidfd);
        }
        if let Some(init) = self.init {
            crate::freeze::kill_descendants(init);
        }
    }

    /// Looking for every process to stop.
    fn confirming(&self) -> bool {
        self.since.is_some() && !self.confirmed
    }

    /// How long the poll loop may wait before the next look, in ms: 1, 2, 4, … up to
    /// [`LOOK_AT_MOST_MS`].
    fn next_look_ms(&self) -> i32 {
        1i32.checked_shl(self.looks.min(6))
            .unwrap_or(LOOK_AT_MOST_MS)
            .min(LOOK_AT_MOST_MS)
    }

    /// A change of what the handle asks; on a thaw, how long the run was frozen.
    fn on_request(
        &mut self,
        freeze: bool,
        signal: &dyn Fn(i32),
        w: &CancelWatch,
    ) -> Option<Duration> {
        match (freeze, self.since) {
            (true, None) => {
                if self.init.is_none() {
                    self.init = crate::freeze::pid_of_pidfd(self.pidfd);
                }
                let now = Instant::now();
                self.since = Some(now);
                self.sent = Some(now);
                self.confirmed = false;
                self.looks = 0;
                self.confirm = crate::freeze::Confirm::default();
                signal(sys::FREEZE_SIGNAL);
                None
            }
            (false, Some(t)) => {
                self.since = None;
                self.sent = None;
                self.confirmed = false;
                signal(libc::SIGCONT);
                w.frozen(false);
                Some(t.elapsed())
            }
            _ => None,
        }
    }

    /// While a freeze is being confirmed: one look at the run's processes; the signal again
    /// if some still run.
    fn check(&mut self, now: Instant, signal: &dyn Fn(i32), w: Option<&CancelWatch>) {
        if !self.confirming() {
            return;
        }
        let Some(init) = self.init else { return };
        self.looks = self.looks.saturating_add(1);
        if self.confirm.step(init) {
            self.confirmed = true;
            if let Some(w) = w {
                w.frozen(true);
            }
            return;
        }
        if self.sent.is_none_or(|t| now >= t + FREEZE_AGAIN) {
            self.sent = Some(now);
            signal(sys::FREEZE_SIGNAL);
        }
    }
}

/// What the runner has done so far to stop a run, and why.
#[derive(Default)]
struct Stopping {
    /// When SIGTERM went to the run (the grace period counts from here).
    term_sent: Option<Instant>,
    /// SIGKILL went to the run.
    killed: bool,
    timed_out: bool,
    cancelled: bool,
    /// The first cause.
    killed_by: Option<KilledBy>,
    /// The first disk limit crossed (a later gross overshoot marks it forced).
    disk_hit: Option<DiskLimitRecord>,
    /// SIGKILL just went to pid 1 for a disk limit: every other process of the run gets it
    /// too, at once ([`crate::freeze::kill_descendants`]).
    kill_all_now: bool,
}

impl Stopping {
    /// While pid 1 runs: the aggregate disk use (a crossing is killed at once), the timeout, and SIGKILL once the grace period after SIGTERM is over.
    fn enforce_limits(
        &mut self,
        now: Instant,
        disk: &mut DiskWatch,
        deadline: Option<Instant>,
        grace: Duration,
        signal: &dyn Fn(i32),
    ) {
        if !self.killed
            && let Some(hit) = disk.sample(now)
        {
            // No grace: every writer would keep writing through it. SIGKILL stops a large
            // write() between two pages.
            if self.killed_by.is_none() {
                self.killed_by = Some(KilledBy::DiskLimit);
            }
            self.killed = true;
            self.kill_all_now = true;
            signal(libc::SIGKILL);
            self.disk_hit = Some(hit);
        }
        if self.term_sent.is_none() && deadline.is_some_and(|d| now >= d) {
            self.timed_out = true;
            self.killed_by = Some(KilledBy::Timeout);
            self.term_sent = Some(now);
            signal(libc::SIGTERM);
        }
        if let Some(t) = self.term_sent
            && !self.killed
            && now >= t + grace
        {
            self.killed = true;
            signal(libc::SIGKILL);
        }
    }

    /// How long the next poll may wait, in ms (-1: until an event): until the deadline, the
    /// end of the grace period or the next disk sample (every `DISK_SAMPLE_MIN` to
    /// `DISK_SAMPLE`, never a busy loop), whichever is first, while pid 1 runs.
    fn poll_timeout(
        &self,
        now: Instant,
        init_done: bool,
        deadline: Instant,
        grace: Duration,
        disk: &DiskWatch,
    ) -> i32 {
        let next = match (init_done, self.term_sent, self.killed) {
            (true, _, _) => None,
            (false, None, _) => Some(deadline),
            (false, Some(t), false) => Some(t + grace),
            (false, Some(_), true) => None,
        };
        let next = match (next, disk.due().filter(|_| !init_done && !self.killed)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        next.map_or(-1, |n| {
            n.saturating_duration_since(now)
                .as_millis()
                .min(i32::MAX as u128) as i32
                + 1
        })
    }

    /// Acts on what the cancellation handle asked: plain signals are forwarded as they are
    /// (not a cancel, no escalation); a cancel sends SIGTERM (SIGKILL follows after the grace
    /// period), a kill SIGKILL at once.
    fn on_requests(&mut self, asked: Requests, signal: &dyn Fn(i32)) {
        for sig in asked.signals {
            signal(sig);
        }
        if asked.cancel || asked.kill {
            self.cancelled = true;
        }
        if asked.cancel && self.term_sent.is_none() {
            self.killed_by = Some(KilledBy::Cancel);
            self.term_sent = Some(Instant::now());
            signal(libc::SIGTERM);
        }
        if asked.kill && !self.killed {
            self.killed_by.get_or_insert(KilledBy::Cancel);
            self.term_sent.get_or_insert_with(Instant::now);
            self.killed = true;
            signal(libc::SIGKILL);
        }
    }

    fn into_stopped(self) -> Stopped {
        Stopped {
            timed_out: self.timed_out,
            cancelled: self.cancelled,
            killed_by: self.killed_by,
            disk_limit: self.disk_hit,
        }
    }
}

/// The runner's end of the tool's stdin while the tool runs: the request's fixed bytes, or a
/// relay of its `stdin_fd` through a bounded buffer; closed (EOF for the tool) once everything
/// is written or the source ends.
struct Feed<'a> {
    /// The runner's end of the stdin socket, while it is fed.
    sock: Option<OwnedFd>,
    /// The fixed bytes ([`RunRequest::stdin`]).
    input: &'a [u8],
    /// Bytes of `input`, or of `relay_buf`, already written.
    fed: usize,
    /// The relayed descriptor ([`RunRequest::stdin_fd`]), while it is relayed.
    relay_src: Option<Arc<OwnedFd>>,
    /// What was read from `relay_src` and is being written.
    relay_buf: Vec<u8>,
    /// `relay_src` ended (or there is none), or the tool closed its stdin.
    relay_eof: bool,
}

impl<'a> Feed<'a> {
    fn new(sock: Option<OwnedFd>, req: &'a RunRequest) -> Result<Feed<'a>, SandboxError> {
        if let Some(f) = &sock {
            sys::set_nonblocking(f.as_raw_fd()).map_err(io_err("configure pipes"))?;
        }
        let relay_src = req.stdin_fd.clone();
        Ok(Feed {
            sock,
            input: req.stdin.as_deref().unwrap_or_default(),
            fed: 0,
            relay_eof: relay_src.is_none(),
            relay_src,
            relay_buf: Vec::new(),
        })
    }

    /// Bytes waiting to be written; first closes the socket once there is nothing more to
    /// feed, or pid 1 has exited (`init_done`).
    fn pending(&mut self, init_done: bool) -> usize {
        if self.relay_src.is_some() && self.fed >= self.relay_buf.len() {
            self.relay_buf.clear();
            self.fed = 0;
        }
        let pending = if self.relay_src.is_some() {
            self.relay_buf.len() - self.fed
        } else {
            self.input.len().saturating_sub(self.fed)
        };
        if self.sock.is_some() && (init_done || (pending == 0 && self.relay_eof)) {
            self.sock = None;
            self.relay_src = None;
        }
        pending
    }

    /// The socket to poll for writing (-1: nothing to write).
    fn write_fd(&self, pending: usize) -> RawFd {
        self.sock
            .as_ref()
            .filter(|_| pending > 0)
            .map_or(-1, |f| f.as_raw_fd())
    }

    /// The relayed descriptor to poll for reading (-1: the buffer is not empty yet, or there
    /// is nothing to relay).
    fn read_fd(&self, pending: usize) -> RawFd {
        self.relay_src
            .as_ref()
            .filter(|_| self.sock.is_some() && pending == 0 && !self.relay_eof)
            .map_or(-1, |f| f.as_raw_fd())
    }

    /// Writes what it can; a tool that closed its stdin ends the feeding.
    fn write(&mut self) {
        let Some(f) = &self.sock else {
            return;
        };
        let buf: &[u8] = if self.relay_src.is_some() {
            &self.relay_buf
        } else {
            self.input
        };
        match sys::send_nosignal(f.as_raw_fd(), &buf[self.fed..]) {
            Ok(n) => self.fed += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // The tool closed its stdin: stop feeding.
            Err(_) => {
                self.fed = buf.len();
                self.relay_eof = true;
            }
        }
    }

    /// Reads the next chunk (at most `RELAY_CHUNK`) of the relayed descriptor.
    fn read(&mut self) {
        let Some(src) = &self.relay_src else {
            return;
        };
        self.relay_buf.resize(RELAY_CHUNK, 0);
        self.fed = 0;
        match sys::read(src.as_raw_fd(), &mut self.relay_buf) {
            Ok(0) => {
                self.relay_buf.clear();
                self.relay_eof = true;
            }
            Ok(n) => self.relay_buf.truncate(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.relay_buf.clear(),
            Err(_) => {
                self.relay_buf.clear();
                self.relay_eof = true;
            }
        }
    }
}

fn pollin(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// `(code, signal)` of a run: from the tool's wait status if pid 1 reported it, else the signal
/// that killed pid 1 (timeout after the grace period, or cancel), else SIGKILL.
pub(crate) fn exit_of(
    tool_status: Option<i32>,
    init_signal: Option<i32>,
) -> (Option<i32>, Option<i32>) {
    match tool_status {
        Some(s) if libc::WIFEXITED(s) => (Some(libc::WEXITSTATUS(s)), None),
        Some(s) if libc::WIFSIGNALED(s) => (None, Some(libc::WTERMSIG(s))),
        _ => (None, Some(init_signal.unwrap_or(libc::SIGKILL))),
    }
}

/// What differs between the records of the two spawn paths; [`run_output`] adds the rest.
pub(crate) struct Finished {
    pub(crate) cwd: PathBuf,
    pub(crate) program: PathBuf,
    pub(crate) policy_hash: String,
    pub(crate) layers: Layers,
    pub(crate) limits: LimitsRecord,
    pub(crate) stopped: Stopped,
    /// From [`exit_of`].
    pub(crate) exit: (Option<i32>, Option<i32>),
    pub(crate) rusage: RusageRecord,
    pub(crate) post_run: crate::postrun::PostRunRecord,
}

/// The record and captured output of a finished run.
pub(crate) fn run_output(
    req: &RunRequest,
    env: &[(String, Vec<u8>)],
    started: Instant,
    f: Finished,
    out: Capture,
    errc: Capture,
) -> RunOutput {
    let (code, signal) = f.exit;
    // Nothing else stopped it, it died of SIGKILL, and the memory cgroup's OOM killer killed
    // during the run: the memory limit.
    let killed_by = f.stopped.killed_by.or_else(|| {
        (signal == Some(libc::SIGKILL) && f.layers.memory.oom_kills > 0)
            .then_some(KilledBy::MemoryLimit)
    });
    let record = RunRecord {
        argv: req
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: f.cwd,
        program: f.program,
        policy_hash: f.policy_hash,
        layers: f.layers,
        limits: f.limits,
        env_names: env.iter().map(|(k, _)| k.clone()).collect(),
        exit: ExitRecord {
            code,
            signal,
            status: code.unwrap_or_else(|| 128 + signal.unwrap_or(0)),
            timed_out: f.stopped.timed_out,
            cancelled: f.stopped.cancelled,
            killed_by,
            disk_limit: f.stopped.disk_limit,
        },
        duration_ms: started.elapsed().as_millis() as u64,
        rusage: f.rusage,
        stdout: out.record(),
        stderr: errc.record(),
        exec: if req.exec_fd.is_some() {
            ExecFrom::Fd
        } else {
            ExecFrom::Path
        },
        pass_fds: (0..req.pass_fds.len()).map(pass_fd_path).collect(),
        post_run: f.post_run,
    };
    RunOutput {
        record,
        stdout: out.buf,
        stderr: errc.buf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(free: u64, avail: u64, free_inodes: u64) -> sys::FsSpace {
        sys::FsSpace {
            total_bytes: 100 << 30,
            free_bytes: free,
            avail_bytes: avail,
            total_inodes: 1_000_000,
            free_inodes,
        }
    }

    #[test]
    fn the_sample_interval_shrinks_as_the_budget_runs_out() {
        let ms = Duration::from_millis;
        let mib = 1u64 << 20;
        // Idle, far from the limit: the longest interval.
        assert_eq!(next_interval(ms(10), 0, 4 << 30), DISK_SAMPLE);
        // Idle under a small budget: the prior rate (8 GiB/s) makes it the shortest.
        assert_eq!(next_interval(ms(10), 0, 32 * mib), DISK_SAMPLE_MIN);
        // 1 GiB left at 100 MiB/s: the prior rate counts (a quarter of 1/8 s), capped.
        assert_eq!(next_interval(ms(10), mib, 1 << 30), DISK_SAMPLE);
        // 256 MiB left at 8 GiB/s: 256/8192/4 s, about 7.8 ms.
        let i = next_interval(ms(1), 8 * mib, 256 * mib);
        assert!(i > ms(7) && i < ms(8), "{i:?}");
        // Faster than the prior (64 MiB in 1 ms): the rate seen counts.
        assert_eq!(next_interval(ms(1), 64 * mib, 256 * mib), DISK_SAMPLE_MIN);
        // Nothing left, or a zero interval: the shortest, no division by zero.
        assert_eq!(next_interval(ms(1), mib, 0), DISK_SAMPLE_MIN);
        assert_eq!(next_interval(Duration::ZERO, mib, 1 << 30), DISK_SAMPLE_MIN);
    }

    #[test]
    fn disk_verdict_names_the_limit_and_escalates_gross_overshoots() {
        let start = space(50 << 30, 45 << 30, 900_000);
        let mib = 1u64 << 20;
        // Within both limits.
        assert_eq!(
            disk_verdict(
                &start,
                &space((50 << 30) - 64 * mib, 45 << 30, 899_000),
                64 * mib,
                1000
            ),
            None
        );
        // Bytes: just over → stop; far over → kill.
        let v = disk_verdict(
            &start,
            &space((50 << 30) - 65 * mib, 45 << 30, 900_000),
            64 * mib,
            1000,
        );
        assert_eq!(v, Some((DiskLimit::DiskBytes, 64 * mib, 65 * mib, false)));
        let v = disk_verdict(
            &start,
            &space((50 << 30) - 80 * mib, 45 << 30, 900_000),
            64 * mib,
            1000,
        );
        assert!(matches!(v, Some((DiskLimit::DiskBytes, _, _, true))));
        // Inodes.
        let v = disk_verdict(&start, &space(50 << 30, 45 << 30, 898_999), 64 * mib, 1000);
        assert_eq!(v, Some((DiskLimit::DiskInodes, 1000, 1001, false)));
        // No inode accounting: never an inode verdict.
        let mut no_inodes = start;
        no_inodes.total_inodes = 0;
        let mut cur = space(50 << 30, 45 << 30, 0);
        cur.total_inodes = 0;
        assert_eq!(disk_verdict(&no_inodes, &cur, 64 * mib, 1000), None);
        // Reserve (1 GiB here): crossing it while consuming stops the run even within the
        // limit; being below it without consuming does not.
        let low = space(2 << 30, 1 << 30, 900_000);
        let v = disk_verdict(
            &low,
            &space((2 << 30) - mib, (1 << 30) - mib, 900_000),
            4 << 30,
            1000,
        );
        assert!(matches!(v, Some((DiskLimit::ReserveBytes, r, _, false)) if r == 1 << 30));
        let under = space(1 << 29, 1 << 29, 900_000);
        assert_eq!(disk_verdict(&under, &under, 4 << 30, 1000), None);
        // Inode reserve: 5% of 1,000,000 = 50,000.
        let few = space(50 << 30, 45 << 30, 50_100);
        let v = disk_verdict(
            &few,
            &space(50 << 30, 45 << 30, 49_000),
            64 * mib,
            1_000_000,
        );
        assert_eq!(v, Some((DiskLimit::ReserveInodes, 50_000, 49_000, false)));
    }
}
