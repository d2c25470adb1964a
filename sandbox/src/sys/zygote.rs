//! The zygote protocol of prepared sandboxes: a long-lived zygote that forks one tool per
//! call. Uses `child`, `mount`, `netns`, `stage` and `raw`.

use std::io;
use std::os::fd::{OwnedFd, RawFd};

use super::child::*;
use super::mount::{mount_call_unions, protect_call_islands};
use super::netns::hand_over_proxy_listener;
use super::raw::*;
use super::stage::*;

// ---------------------------------------------------------------------------------------------
// Prepared sandboxes (`prepared.rs`): a long-lived zygote that forks one tool per call.
//
// The zygote is cloned from a possibly multithreaded process, exactly like the one-shot init
// stage, so it obeys the same rule: raw, async-signal-safe syscalls on data prepared before
// the clone, and memory it maps itself; it never allocates, locks or unwinds.

/// Everything the zygote needs, prepared by the parent before `clone`. `base` carries the
/// session-wide parts (fds, id maps, mounts, rlimits, capability count, seccomp programs);
/// its per-call fields (exe, argv, envp, cwd, stdio, status, sync) are unused.
#[derive(Debug)]
pub(crate) struct ZygotePlan {
    pub base: ChildPlan,
    /// The zygote's end of the control socket (SOCK_SEQPACKET).
    pub control: RawFd,
}

/// Header of one call request on the control socket. The payload follows it (inline, or in
/// a memfd passed as the sixth fd when `in_memfd` is 1): exe, cwd, argv…, env…, and the
/// call's protected islands (`islands` entries: a kind byte and a path, see
/// [`protect_call_islands`]), and its unions (`unions` entries of the same form, see
/// [`mount_call_unions`]), each NUL-terminated. The fds passed with it: stdin, stdout,
/// stderr, error pipe, status pipe, the payload memfd (if `in_memfd`), and a Landlock ruleset
/// of the call's own (if `own_ruleset` is 1: always for a call with unions, whose rules name
/// the call's own overlays; otherwise a simulated lower ABI, tests only) that replaces the
/// session's.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CallHeader {
    pub magic: u32,
    /// 0 none, 1 seccomp install, 2 capability drop, 3 landlock restrict (tests only).
    pub fault: u32,
    pub argc: u32,
    pub envc: u32,
    pub payload_len: u32,
    pub in_memfd: u32,
    pub own_ruleset: u32,
    /// 1: the cwd is not the workspace; the tool checks it is listable under Landlock.
    pub check_cwd: u32,
    /// Protected-island entries at the end of the payload; with any, the per-call init gets
    /// a mount namespace of its own and binds them there (so placeholders exist only while
    /// the call runs).
    pub islands: u32,
    /// Union entries after the islands; with any, the call also gets a mount namespace of
    /// its own, and a ruleset of its own.
    pub unions: u32,
    /// The rights granted beneath each union point (low and high halves).
    pub union_access_lo: u32,
    pub union_access_hi: u32,
}

impl CallHeader {
    /// The header as the zygote reads it (`#[repr(C)]`: twelve `u32` fields, no padding).
    pub(crate) fn to_bytes(self) -> [u8; CALL_HDR] {
        let mut out = [0u8; CALL_HDR];
        let fields = [
            self.magic,
            self.fault,
            self.argc,
            self.envc,
            self.payload_len,
            self.in_memfd,
            self.own_ruleset,
            self.check_cwd,
            self.islands,
            self.unions,
            self.union_access_lo,
            self.union_access_hi,
        ];
        for (chunk, v) in out.chunks_exact_mut(4).zip(fields) {
            chunk.copy_from_slice(&v.to_ne_bytes());
        }
        out
    }
}

/// `CallHeader::magic`.
pub(crate) const CALL_MAGIC: u32 = 0x6f6c_6c31;
/// Fds passed with every call (plus the payload memfd when used).
pub(crate) const CALL_FDS: usize = 5;
/// Largest payload sent inline in the request message.
pub(crate) const MAX_INLINE_PAYLOAD: usize = 32 * 1024;
/// Largest payload (argv + environment), like the kernel's default `ARG_MAX` bound.
pub(crate) const MAX_PAYLOAD: usize = 4 << 20;
/// Most strings (exe, cwd, argv, env, islands) in one call.
pub(crate) const MAX_STRINGS: usize = 1 << 16;
/// Most protected-island entries in one call.
pub(crate) const MAX_ISLANDS: usize = 256;
/// Most union entries in one call.
pub(crate) const MAX_UNION_ENTRIES: usize = 4096;
const CALL_HDR: usize = std::mem::size_of::<CallHeader>();

/// The zygote's fixed fds.
const FD_CONTROL: RawFd = 4;
const FD_ZSIGNAL: RawFd = 5;

/// A per-call request as the zygote parsed it (lives on the zygote's stack; the per-call init
/// and the tool see their own copies or share it until `execve`).
struct Call<'a> {
    z: &'a ZygotePlan,
    fds: [RawFd; CALL_FDS],
    exe: *const libc::c_char,
    cwd: *const libc::c_char,
    check_cwd: bool,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// The protected-island entries (`islands` of them).
    islands: *const *const libc::c_char,
    nislands: usize,
    /// The union entries (`unions` of them), and the rights granted beneath each point.
    unions: *const *const libc::c_char,
    nunions: usize,
    union_access: u64,
    fault: u32,
    /// The Landlock ruleset the tool restricts itself with: the session's (`FD_RULESET`) or
    /// the call's own.
    ruleset: RawFd,
    /// Top of the tool's stack (inside the call's region).
    tool_stack_top: usize,
}

/// Stack of a per-call init (raw syscalls only, small frames).
const CALL_INIT_STACK_BYTES: usize = 64 * 1024;
/// Most calls in flight at once in one prepared sandbox.
const MAX_CALLS: usize = 256;

/// A call in flight: its per-call init and the region (stacks, request copy) it runs on,
/// unmapped once the init is reaped.
#[derive(Clone, Copy)]
struct Slot {
    pid: libc::pid_t,
    base: *mut libc::c_void,
    len: usize,
}

const FREE_SLOT: Slot = Slot {
    pid: 0,
    base: std::ptr::null_mut(),
    len: 0,
};

/// Size of a standard per-call region (stacks, the Call, and up to 64 KiB of pointers and
/// payload); standard regions are kept for reuse instead of being unmapped (no mmap, page
/// faults or TLB shoot-downs per call). Larger requests get a region of their own.
const STD_REGION: usize = CALL_INIT_STACK_BYTES + TOOL_STACK_BYTES + 4096 + 64 * 1024;
/// Standard regions kept for reuse.
const REGION_CACHE: usize = 8;

/// Regions of finished calls, ready for reuse (zygote only).
struct RegionCache {
    free: [*mut libc::c_void; REGION_CACHE],
    n: usize,
}

impl RegionCache {
    /// A region of at least `len` bytes, or null. Zygote only.
    fn take(&mut self, len: usize) -> *mut libc::c_void {
        if len <= STD_REGION && self.n > 0 {
            self.n -= 1;
            return self.free[self.n];
        }
        let want = if len <= STD_REGION { STD_REGION } else { len };
        // SAFETY: a fresh anonymous mapping owned by the zygote.
        let r = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                want,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if r == libc::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            r
        }
    }

    /// Returns a region no process uses any more. Zygote only.
    fn give(&mut self, base: *mut libc::c_void, len: usize) {
        if len == STD_REGION && self.n < REGION_CACHE {
            self.free[self.n] = base;
            self.n += 1;
        } else {
            // SAFETY: the region was mapped by `take` and nothing uses it any more.
            unsafe { libc::munmap(base, len) };
        }
    }
}

/// Starts the zygote: pid 1 of new user, pid, mount and IPC namespaces (and of a network
/// namespace of the session's own with `base.proxy_port`), which sets up the session's
/// mounts (and network) once and then serves call requests. Every signal stays blocked in
/// the zygote (it waits for SIGCHLD with a signalfd). Returns `(pid, pidfd)`.
pub(crate) fn spawn_zygote(z: &ZygotePlan) -> io::Result<(libc::pid_t, OwnedFd)> {
    clone_namespaced(&z.base.mounts, z.base.proxy_port != 0, zygote_main, z)
}

/// The zygote. Never returns; exits when the control socket reaches EOF (the runner dropped
/// the `Prepared` or died), which makes the kernel kill every process of its namespace.
fn zygote_main(z: &ZygotePlan) -> ! {
    // SAFETY: (whole function) only raw, async-signal-safe syscalls on prepared data and on
    // memory this process maps itself.
    unsafe {
        arrange_fd_list(
            &[-1, -1, -1, z.base.err_w, z.control, -1, z.base.ruleset],
            z.base.err_w,
        );
        libc::close(0);
        libc::close(1);
        libc::close(2);
        // Wait until the parent has placed us in a cgroup (EOF = parent gone).
        let mut b = [0u8; 1];
        if libc::recv(FD_CONTROL, b.as_mut_ptr().cast(), 1, 0) != 1 {
            fail(Stage::Sync, libc::ECANCELED);
        }
        // The zygote holds a copy of the runner's memory for the whole session: no core
        // dumps, and its /proc entries closed to the session's uid (extra hardening on top
        // of Landlock's ptrace scoping): not dumpable once its id maps are written.
        map_ids_and_mount(&z.base);
        // A proxied session's network, once for every call (each call's init is cloned into
        // it): loopback up, the proxy's listener handed to the runner over the control link.
        if z.base.proxy_port != 0
            && let Err(e) = hand_over_proxy_listener(FD_CONTROL, z.base.proxy_port)
        {
            fail(Stage::Network, e);
        }
        // Set up once and inherited by every call: default dispositions for every signal
        // (all stay blocked until the tool unblocks them right before seccomp and execve),
        // and an empty capability bounding set (it can only shrink).
        reset_signal_dispositions();
        drop_bounding_set(z.base.cap_last);

        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        let sfd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if sfd < 0 {
            fail(Stage::Signals, errno());
        }
        if sfd != FD_ZSIGNAL {
            if libc::dup3(sfd, FD_ZSIGNAL, libc::O_CLOEXEC) < 0 {
                fail(Stage::Signals, errno());
            }
            libc::close(sfd);
        }
        let buf = libc::mmap(
            std::ptr::null_mut(),
            CALL_HDR + MAX_PAYLOAD,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if buf == libc::MAP_FAILED {
            fail(Stage::Fork, errno());
        }
        let mut slots = [FREE_SLOT; MAX_CALLS];
        let mut regions = RegionCache {
            free: [std::ptr::null_mut(); REGION_CACHE],
            n: 0,
        };
        // Ready: the parent sees EOF on the start-up error pipe.
        libc::close(FD_ERR);
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: FD_CONTROL,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: FD_ZSIGNAL,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            if libc::poll(fds.as_mut_ptr(), 2, -1) < 0 {
                continue;
            }
            if fds[1].revents != 0 {
                let mut info = [0u8; 128];
                while libc::read(FD_ZSIGNAL, info.as_mut_ptr().cast(), info.len()) > 0 {}
                // Reap finished per-call inits and unmap the regions they ran on.
                loop {
                    let pid = libc::wait4(
                        -1,
                        std::ptr::null_mut(),
                        libc::WNOHANG | libc::__WALL,
                        std::ptr::null_mut(),
                    );
                    if pid <= 0 {
                        break;
                    }
                    for slot in slots.iter_mut() {
                        if slot.pid == pid {
                            regions.give(slot.base, slot.len);
                            *slot = FREE_SLOT;
                        }
                    }
                }
            }
            if fds[0].revents != 0 && !zygote_serve(z, buf.cast(), &mut slots, &mut regions) {
                libc::_exit(0);
            }
        }
    }
}

/// Receives one call request and answers it (errno, and the per-call init's pidfd on
/// success). Returns false when the control socket is closed. Zygote only.
fn zygote_serve(
    z: &ZygotePlan,
    buf: *mut u8,
    slots: &mut [Slot; MAX_CALLS],
    regions: &mut RegionCache,
) -> bool {
    // SAFETY: (whole function) raw socket calls on stack buffers and the zygote's own
    // mapping (`buf` holds CALL_HDR + MAX_PAYLOAD bytes).
    unsafe {
        let mut iov = libc::iovec {
            iov_base: buf.cast(),
            iov_len: CALL_HDR + MAX_INLINE_PAYLOAD,
        };
        let mut cbuf = [0u64; 16];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        let n = libc::recvmsg(FD_CONTROL, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n == 0 {
            return false;
        }
        if n < 0 {
            let e = errno();
            return e == libc::EINTR || e == libc::EAGAIN;
        }
        let mut fds = [-1 as RawFd; 8];
        let mut nfds = 0usize;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    if nfds < fds.len() {
                        fds[nfds] = fd;
                        nfds += 1;
                    } else {
                        libc::close(fd);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        let mut pidfd: RawFd = -1;
        let err = zygote_spawn(
            z,
            buf,
            n as usize,
            msg.msg_flags,
            &fds[..nfds],
            slots,
            regions,
            &mut pidfd,
        );
        let reply = err.to_ne_bytes();
        let mut iov = libc::iovec {
            iov_base: reply.as_ptr() as *mut libc::c_void,
            iov_len: reply.len(),
        };
        let mut cbuf = [0u64; 4];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if pidfd >= 0 {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, pidfd);
        }
        let sent = libc::sendmsg(FD_CONTROL, &msg, libc::MSG_NOSIGNAL);
        // The call's fds are closed after the reply, off the runner's wait (the per-call
        // init holds its own copies; nothing else runs in the zygote in between).
        for fd in &fds[..nfds] {
            libc::close(*fd);
        }
        if pidfd >= 0 {
            libc::close(pidfd);
        }
        sent >= 0 || errno() == libc::EINTR
    }
}

/// Whether a call's header is well-formed for the `n` bytes (`n ≥ CALL_HDR`) and `nfds`
/// descriptors received with it: the magic, the descriptor count its flags imply, a command,
/// a payload and string count within bounds, and an inline payload of the size announced.
fn header_ok(hdr: &CallHeader, n: usize, nfds: usize) -> bool {
    let memfd = hdr.in_memfd == 1;
    let len = hdr.payload_len as usize;
    let strings =
        2 + hdr.argc as usize + hdr.envc as usize + hdr.islands as usize + hdr.unions as usize;
    hdr.magic == CALL_MAGIC
        && hdr.islands as usize <= MAX_ISLANDS
        && hdr.unions as usize <= MAX_UNION_ENTRIES
        && (hdr.unions == 0 || hdr.own_ruleset == 1)
        && nfds == CALL_FDS + usize::from(memfd) + usize::from(hdr.own_ruleset == 1)
        && hdr.argc != 0
        && len <= MAX_PAYLOAD
        && strings <= MAX_STRINGS
        && (memfd || n - CALL_HDR == len)
}

/// Validates a request and clones its per-call init (pid 1 of a new pid namespace nested in
/// the session's) on a region of its own. Returns 0 or an errno. Zygote only.
///
/// The per-call init shares the zygote's memory (`CLONE_VM`: no copy of the runner's page
/// tables per call, nothing to tear down at exit) but touches only its region: its stack, the
/// tool's stack, and its own copy of the request. The zygote unmaps the region once the
/// per-call init is reaped (the tool has exec'd or exited long before: `CLONE_VFORK`).
#[allow(clippy::too_many_arguments)]
fn zygote_spawn(
    z: &ZygotePlan,
    buf: *mut u8,
    n: usize,
    flags: libc::c_int,
    fds: &[RawFd],
    slots: &mut [Slot; MAX_CALLS],
    regions: &mut RegionCache,
    pidfd: &mut RawFd,
) -> i32 {
    *pidfd = -1;
    if flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 || n < CALL_HDR {
        return libc::EINVAL;
    }
    let Some(slot) = slots.iter().position(|s| s.pid == 0) else {
        return libc::EAGAIN;
    };
    // SAFETY: (whole function) `buf` holds CALL_HDR + MAX_PAYLOAD bytes of which `n` were
    // received; the region is mapped here with room
    // for both stacks, the Call, the pointer array and the payload; every index below is
    // bounds-checked against those sizes first.
    unsafe {
        let hdr = std::ptr::read_unaligned(buf as *const CallHeader);
        let memfd = hdr.in_memfd == 1;
        let own_ruleset = hdr.own_ruleset == 1;
        let len = hdr.payload_len as usize;
        let nislands = hdr.islands as usize;
        let nunions = hdr.unions as usize;
        let strings = 2 + hdr.argc as usize + hdr.envc as usize + nislands + nunions;
        if !header_ok(&hdr, n, fds.len()) {
            return libc::EINVAL;
        }
        let call_off = CALL_INIT_STACK_BYTES + TOOL_STACK_BYTES;
        let ptrs_off = call_off + std::mem::size_of::<Call<'_>>().next_multiple_of(16);
        // argv, NULL, env, NULL, islands: one pointer more than strings minus exe and cwd.
        let data_off = ptrs_off + (strings + 1) * std::mem::size_of::<usize>();
        let needed = (data_off + len).next_multiple_of(4096);
        let region_len = needed.max(STD_REGION);
        let region = regions.take(needed);
        if region.is_null() {
            return libc::ENOMEM;
        }
        let base = region as *mut u8;
        let mut unmap = |e: i32| {
            regions.give(region, region_len);
            e
        };
        let data = base.add(data_off);
        if memfd {
            let mut got = 0usize;
            while got < len {
                let r = libc::pread(
                    fds[CALL_FDS],
                    data.add(got).cast(),
                    len - got,
                    got as libc::off_t,
                );
                if r <= 0 {
                    return unmap(libc::EIO);
                }
                got += r as usize;
            }
        } else {
            std::ptr::copy_nonoverlapping(buf.add(CALL_HDR), data, len);
        }
        let ptrs = base.add(ptrs_off) as *mut *const libc::c_char;
        // Split the payload into NUL-terminated strings: exe, cwd, argv…, env…, islands…,
        // unions….
        let mut pos = 0usize;
        let mut exe = std::ptr::null();
        let mut cwd = std::ptr::null();
        let argc = hdr.argc as usize;
        let envc = hdr.envc as usize;
        for s in 0..strings {
            if pos >= len {
                return unmap(libc::EINVAL);
            }
            let start = data.add(pos) as *const libc::c_char;
            while pos < len && *data.add(pos) != 0 {
                pos += 1;
            }
            if pos >= len {
                return unmap(libc::EINVAL);
            }
            pos += 1;
            match s {
                0 => exe = start,
                1 => cwd = start,
                // argv at ptrs[0..argc], NULL, env at ptrs[argc+1..], NULL, islands and
                // unions after.
                _ if s - 2 < argc => *ptrs.add(s - 2) = start,
                _ if s - 2 < argc + envc => *ptrs.add(s - 1) = start,
                _ => {
                    // An island or union entry is a kind byte and a non-empty path.
                    if data.add(pos - 1) as *const libc::c_char <= start.add(1) {
                        return unmap(libc::EINVAL);
                    }
                    *ptrs.add(s) = start;
                }
            }
        }
        if pos != len {
            return unmap(libc::EINVAL);
        }
        *ptrs.add(argc) = std::ptr::null();
        *ptrs.add(argc + 1 + envc) = std::ptr::null();
        let call = base.add(call_off) as *mut Call<'_>;
        call.write(Call {
            z,
            fds: [fds[0], fds[1], fds[2], fds[3], fds[4]],
            exe,
            cwd,
            check_cwd: hdr.check_cwd == 1,
            argv: ptrs,
            envp: ptrs.add(argc + 1),
            islands: ptrs.add(argc + envc + 2),
            nislands,
            unions: ptrs.add(argc + envc + 2 + nislands),
            nunions,
            union_access: u64::from(hdr.union_access_lo) | (u64::from(hdr.union_access_hi) << 32),
            fault: hdr.fault,
            ruleset: if own_ruleset {
                fds[CALL_FDS + usize::from(memfd)]
            } else {
                FD_RULESET
            },
            tool_stack_top: (base.add(call_off) as usize) & !0xf,
        });
        let init_top = (base.add(CALL_INIT_STACK_BYTES) as usize) & !0xf;
        // A call with protected islands or unions gets a mount namespace of its own for them.
        let newns = if nislands + nunions > 0 {
            libc::CLONE_NEWNS
        } else {
            0
        };
        let pid = libc::clone(
            call_init_entry,
            init_top as *mut libc::c_void,
            libc::CLONE_VM
                | libc::CLONE_NEWPID
                | newns
                | CLONE_PIDFD as libc::c_int
                | libc::SIGCHLD,
            call.cast(),
            pidfd as *mut RawFd,
        );
        if pid < 0 {
            *pidfd = -1;
            return unmap(errno());
        }
        slots[slot] = Slot {
            pid,
            base: region,
            len: region_len,
        };
        0
    }
}

/// Entry point of a per-call init on its own stack.
extern "C" fn call_init_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Call` the zygote wrote into this call's region, which stays mapped
    // and unmodified until this process has been reaped.
    let call = unsafe { &*(arg as *const Call<'_>) };
    call_init_main(call)
}

/// pid 1 of one call's pid namespace: forks the tool, forwards termination signals to every
/// process of the call, reports the tool's status and rusage, and exits when the tool does
/// (which kills everything else the call started). Never returns.
fn call_init_main(call: &Call<'_>) -> ! {
    // SAFETY: (whole function) only raw, async-signal-safe syscalls on prepared data.
    unsafe {
        arrange_fd_list(
            &[
                call.fds[0],
                call.fds[1],
                call.fds[2],
                call.fds[3],
                call.fds[4],
                -1,
                call.ruleset,
            ],
            call.fds[3],
        );
        // The zygote's signalfd (close-on-exec anyway): not needed here.
        libc::close(FD_ZSIGNAL);
        // The call's protected islands, in its own mount namespace (gone with the call).
        protect_call_islands(std::slice::from_raw_parts(call.islands, call.nislands));
        // Its unions, there too, and their rules in its own ruleset (now `FD_RULESET`).
        mount_call_unions(
            std::slice::from_raw_parts(call.unions, call.nunions),
            call.union_access,
            &call.z.base.mounts,
        );
        let child = libc::clone(
            prepared_tool_entry,
            call.tool_stack_top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            call as *const Call<'_> as *mut libc::c_void,
        );
        if child < 0 {
            fail(Stage::Fork, errno());
        }
        libc::close(FD_ERR);
        libc::close(FD_RULESET);
        libc::close(0);
        // stdout and stderr stay open here until this init exits: the runner sees EOF on
        // them only once every process of the call is gone (one wake-up, not two).
        wait_for_tool(child, StatusReport::StatusAndRusage)
    }
}

/// Entry point of a prepared tool on its own stack.
extern "C" fn prepared_tool_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `&Call` the per-call init passed to clone; the init is suspended
    // (CLONE_VFORK) and the call stays alive and unmodified until the tool execs or exits.
    let call = unsafe { &*(arg as *const Call<'_>) };
    prepared_tool_main(call)
}

/// The prepared tool: the shared sequence, minus the bounding-set drop and the disposition
/// reset the zygote did once. Never returns.
fn prepared_tool_main(call: &Call<'_>) -> ! {
    let plan = &call.z.base;
    restrict_and_exec(&ToolExec {
        rlimits: &plan.rlimits,
        cap_last: plan.cap_last,
        cwd: call.cwd,
        check_cwd: call.check_cwd,
        landlock: plan.landlock,
        session: SessionSteps::InZygote,
        filters: &plan.filters,
        fault: ChildFault::from_u32(call.fault),
        exe: call.exe,
        exec_fd: -1,
        argv: call.argv,
        envp: call.envp,
    })
}
