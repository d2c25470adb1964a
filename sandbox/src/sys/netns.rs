//! The network namespace of a proxied run or session (`network.mode = "proxy"`), set up by
//! its pid 1 (the one-shot init stage or a prepared session's zygote). Uses `raw`.
//!
//! pid 1 is cloned with `CLONE_NEWNET` next to `CLONE_NEWUSER`, so the new network namespace
//! is owned by the run's own user namespace, in which pid 1 holds every capability until the
//! tool drops them. Such a namespace starts with nothing but a loopback interface that is
//! down, no route and no other interface: nothing in it reaches the host's network,
//! loopback included. pid 1 then, before any capability is dropped and before the tool
//! exists:
//! 1. brings `lo` up ([`loopback_up`]: `SIOCSIFFLAGS` with `IFF_UP` on a datagram socket,
//!    closed again), so that `127.0.0.1` and `::1` exist in the namespace;
//! 2. opens the proxy's listener ([`listen_on_loopback`]): a close-on-exec TCP socket with
//!    `SO_REUSEADDR`, bound to `127.0.0.1:PROXY_PORT`, listening with a backlog of
//!    [`PROXY_BACKLOG`];
//! 3. hands it to the runner ([`send_fd`]: one byte and the descriptor as `SCM_RIGHTS` over
//!    a unix socket the runner made before the clone — the one-shot run's start-up socket,
//!    the zygote's control link) and closes its own copy. The tool is forked only after
//!    that, so it never holds the listener; the runner's copy is the only one, and a
//!    connection the tool makes before the runner accepts waits in the backlog.
//!
//! With `/etc/resolv.conf` replaced by a file without a `nameserver` line
//! ([`replace_file`], a mount step) and the tool's filters (seccomp: TCP sockets only, no
//! bind or listen; Landlock: connect to `PROXY_PORT` only), the listener is the only thing
//! the tool can reach.
//!
//! Child only: raw, async-signal-safe system calls on data prepared before the clone (no
//! allocation, no locks); each function returns the errno of the step that failed, for the
//! caller to report as its stage.

use std::ffi::CStr;
use std::os::fd::RawFd;

use super::raw::*;

/// The listen backlog of the proxy's socket (the kernel caps it at `net.core.somaxconn`,
/// 4096 by default): connections the tool makes before the runner accepts wait there.
pub(crate) const PROXY_BACKLOG: libc::c_int = 512;

/// `r` as a result: `Err(errno)` when negative.
fn ok(r: libc::c_long) -> Result<libc::c_long, i32> {
    if r < 0 { Err(errno()) } else { Ok(r) }
}

/// Brings the loopback interface of the calling process's network namespace up. Child only.
pub(super) fn loopback_up() -> Result<(), i32> {
    // SAFETY: raw socket/ioctl/close calls on a zeroed, live `ifreq` whose name is set
    // within its bounds; the socket is closed on every path.
    unsafe {
        let s = ok(libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0).into())?
            as RawFd;
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        let mut r = libc::ioctl(s, libc::SIOCGIFFLAGS, &mut ifr as *mut libc::ifreq);
        if r >= 0 {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            r = libc::ioctl(s, libc::SIOCSIFFLAGS, &ifr as *const libc::ifreq);
        }
        let e = errno();
        libc::close(s);
        if r < 0 { Err(e) } else { Ok(()) }
    }
}

/// A close-on-exec TCP socket listening at `127.0.0.1:port` (`SO_REUSEADDR`, backlog
/// [`PROXY_BACKLOG`]). Child only.
pub(super) fn listen_on_loopback(port: u16) -> Result<RawFd, i32> {
    // SAFETY: raw socket calls on a live, fully initialised `sockaddr_in` of the size passed;
    // the socket is closed on every failure.
    unsafe {
        let s = ok(libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0).into())?
            as RawFd;
        let one: libc::c_int = 1;
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
            },
            sin_zero: [0; 8],
        };
        let r = if libc::setsockopt(
            s,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) < 0
            || libc::bind(
                s,
                (&addr as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ) < 0
            || libc::listen(s, PROXY_BACKLOG) < 0
        {
            Err(errno())
        } else {
            Ok(s)
        };
        if r.is_err() {
            libc::close(s);
        }
        r
    }
}

/// Sends one byte and `fd` (`SCM_RIGHTS`) on the unix socket `sock`. Child only.
pub(super) fn send_fd(sock: RawFd, fd: RawFd) -> Result<(), i32> {
    // SAFETY: raw sendmsg of a one-byte stack buffer with a control buffer of 32 bytes
    // (CMSG_SPACE of one descriptor is 24), aligned as `u64`; the CMSG_* helpers only do
    // pointer arithmetic within it.
    unsafe {
        let byte = [b'l'];
        let mut iov = libc::iovec {
            iov_base: byte.as_ptr() as *mut libc::c_void,
            iov_len: 1,
        };
        let mut cbuf = [0u64; 4];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() {
            return Err(libc::EINVAL);
        }
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, fd);
        ok(libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) as libc::c_long).map(|_| ())
    }
}

/// The one-time network set-up of pid 1 ([`loopback_up`], [`listen_on_loopback`],
/// [`send_fd`] on `sock`, then its own copy of the listener closed). Child only.
pub(super) fn hand_over_proxy_listener(sock: RawFd, port: u16) -> Result<(), i32> {
    loopback_up()?;
    let l = listen_on_loopback(port)?;
    let r = send_fd(sock, l);
    // SAFETY: closing the descriptor opened above; the runner holds its own copy now.
    unsafe { libc::close(l) };
    r
}

/// Mounts a file holding `content` over the file at `path` (resolved by the parent; a final
/// symlink is not followed), read-only, nosuid, nodev and noexec: a fresh detached tmpfs gets
/// the file, a detached bind of just that file replaces `path`, and the tmpfs itself is never
/// attached anywhere. Child only (raw new-mount-API calls in the child's own mount
/// namespace; every descriptor opened here is closed before returning).
pub(super) fn replace_file(path: &CStr, content: &[u8]) -> Result<(), i32> {
    const NAME: &CStr = c"file";
    let null = std::ptr::null::<libc::c_char>();
    let locked = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
    // SAFETY: raw syscalls on valid C strings, a live `MountAttr` of the size passed and a
    // byte slice that outlives the write.
    unsafe {
        let fs = ok(libc::syscall(SYS_FSOPEN, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC))? as RawFd;
        let mnt = ok(libc::syscall(
            SYS_FSCONFIG,
            fs,
            FSCONFIG_CMD_CREATE,
            null,
            null,
            0,
        ))
        .and_then(|_| {
            ok(libc::syscall(
                SYS_FSMOUNT,
                fs,
                FSMOUNT_CLOEXEC,
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            ))
        });
        libc::close(fs);
        let mnt = mnt? as RawFd;
        let file = write_new_file(mnt, NAME, content).and_then(|()| {
            ok(libc::syscall(
                SYS_OPEN_TREE,
                mnt,
                NAME.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_ulong,
            ))
        });
        libc::close(mnt);
        let file = file? as RawFd;
        let attr = MountAttr {
            attr_set: locked,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        let r = ok(libc::syscall(
            SYS_MOUNT_SETATTR,
            file,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        ))
        .and_then(|_| {
            ok(libc::syscall(
                SYS_MOVE_MOUNT,
                file,
                c"".as_ptr(),
                libc::AT_FDCWD,
                path.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            ))
        });
        libc::close(file);
        r.map(|_| ())
    }
}

/// Creates `name` (mode 0644) in the directory `dir` and writes `content` to it. Child only.
fn write_new_file(dir: RawFd, name: &CStr, content: &[u8]) -> Result<(), i32> {
    // SAFETY: raw openat/write/close on a valid C string and a live byte slice; the file is
    // closed on every path.
    unsafe {
        let f = libc::openat(
            dir,
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        );
        if f < 0 {
            return Err(errno());
        }
        let mut done = 0;
        while done < content.len() {
            let n = libc::write(f, content[done..].as_ptr().cast(), content.len() - done);
            if n <= 0 {
                let e = if n < 0 { errno() } else { libc::EIO };
                libc::close(f);
                return Err(e);
            }
            done += n as usize;
        }
        libc::close(f);
        Ok(())
    }
}
