//! Thin wrappers around single system calls, and the constants and kernel structs they use.
//! Uses nothing else in `sys`.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

// x86_64 system call numbers that older libc releases may lack.
const SYS_PIDFD_SEND_SIGNAL: libc::c_long = 424;
pub(super) const SYS_OPEN_TREE: libc::c_long = 428;
pub(super) const SYS_MOVE_MOUNT: libc::c_long = 429;
pub(super) const SYS_FSOPEN: libc::c_long = 430;
pub(super) const SYS_FSCONFIG: libc::c_long = 431;
pub(super) const SYS_FSMOUNT: libc::c_long = 432;
pub(super) const SYS_CLOSE_RANGE: libc::c_long = 436;
pub(super) const SYS_OPENAT2: libc::c_long = 437;
pub(super) const SYS_MOUNT_SETATTR: libc::c_long = 442;
const SYS_LANDLOCK_CREATE_RULESET: libc::c_long = 444;
pub(super) const SYS_LANDLOCK_ADD_RULE: libc::c_long = 445;
pub(super) const SYS_LANDLOCK_RESTRICT_SELF: libc::c_long = 446;

pub(super) const OPEN_TREE_CLONE: libc::c_ulong = 1;
pub(super) const AT_RECURSIVE: libc::c_uint = 0x8000;
pub(super) const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
/// `MOUNT_ATTR_RDONLY`.
pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
/// `MOUNT_ATTR_NOSUID`.
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
/// `MOUNT_ATTR_NODEV`.
pub(super) const MOUNT_ATTR_NODEV: u64 = 0x4;
/// `MOUNT_ATTR_NOEXEC`.
pub(super) const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub(super) const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
pub(super) const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;
pub(super) const FSCONFIG_SET_FLAG: libc::c_uint = 0;
pub(super) const FSCONFIG_SET_FD: libc::c_uint = 5;
pub(super) const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
pub(super) const CLONE_PIDFD: libc::c_ulong = 0x1000;

pub(super) const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
pub(super) const RESOLVE_NO_SYMLINKS: u64 = 0x04;
pub(super) const RESOLVE_NO_XDEV: u64 = 0x01;
pub(super) const RESOLVE_BENEATH: u64 = 0x08;

pub(super) const PR_SET_PDEATHSIG: libc::c_int = 1;
pub(super) const PR_CAPBSET_DROP: libc::c_int = 24;
pub(super) const PR_SET_SECUREBITS: libc::c_int = 28;
pub(super) const PR_SET_NO_NEW_PRIVS: libc::c_int = 38;
pub(super) const PR_CAP_AMBIENT: libc::c_int = 47;
pub(super) const PR_CAP_AMBIENT_CLEAR_ALL: libc::c_ulong = 4;
/// NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE, each with its lock, plus KEEP_CAPS_LOCKED.
pub(super) const SECURE_BITS_LOCKED: libc::c_ulong = 0xEF;
pub(super) const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
pub(super) const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
pub(super) const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
const LANDLOCK_RULE_NET_PORT: libc::c_int = 2;

#[repr(C)]
struct LandlockRulesetAttr {
    pub(super) handled_access_fs: u64,
    pub(super) handled_access_net: u64,
    pub(super) scoped: u64,
}

#[repr(C, packed)]
pub(super) struct LandlockPathBeneathAttr {
    pub(super) allowed_access: u64,
    pub(super) parent_fd: i32,
}

#[repr(C)]
struct LandlockNetPortAttr {
    pub(super) allowed_access: u64,
    pub(super) port: u64,
}

#[repr(C)]
pub(super) struct MountAttr {
    pub(super) attr_set: u64,
    pub(super) attr_clr: u64,
    pub(super) propagation: u64,
    pub(super) userns_fd: u64,
}

#[repr(C)]
pub(super) struct OpenHow {
    pub(super) flags: u64,
    pub(super) mode: u64,
    pub(super) resolve: u64,
}

#[repr(C)]
pub(super) struct CapHeader {
    pub(super) version: u32,
    pub(super) pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CapData {
    pub(super) effective: u32,
    pub(super) permitted: u32,
    pub(super) inheritable: u32,
}

pub(super) fn cvt(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The Landlock ABI version of the running kernel (0 when Landlock is unavailable).
pub(crate) fn landlock_abi() -> u32 {
    // SAFETY: the version query takes no pointer (NULL, size 0) and only returns an integer.
    let r = unsafe {
        libc::syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            std::ptr::null::<LandlockRulesetAttr>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 { 0 } else { r as u32 }
}

/// Creates a Landlock ruleset; the caller adds rules and hands the fd to the child.
pub(crate) fn landlock_create_ruleset(fs: u64, net: u64, scoped: u64) -> io::Result<OwnedFd> {
    let attr = LandlockRulesetAttr {
        handled_access_fs: fs,
        handled_access_net: net,
        scoped,
    };
    // Older kernels reject unknown trailing fields only when they are non-zero; pass the size
    // that covers the fields in use so ABI < 4 kernels accept it.
    let size = if scoped != 0 {
        std::mem::size_of::<LandlockRulesetAttr>()
    } else if net != 0 {
        16
    } else {
        8
    };
    // SAFETY: `attr` is a live, correctly laid out struct of at least `size` bytes.
    let fd = cvt(unsafe {
        libc::syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            &attr as *const LandlockRulesetAttr,
            size,
            0u32,
        )
    })?;
    // SAFETY: the kernel returned a new fd that nothing else owns (created O_CLOEXEC).
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Adds a path-beneath rule for an `O_PATH` fd.
pub(crate) fn landlock_add_path_rule(
    ruleset: &OwnedFd,
    dir: &OwnedFd,
    access: u64,
) -> io::Result<()> {
    let attr = LandlockPathBeneathAttr {
        allowed_access: access,
        parent_fd: dir.as_raw_fd(),
    };
    // SAFETY: both fds are open for the duration of the call; `attr` is a packed struct the
    // kernel reads by pointer.
    cvt(unsafe {
        libc::syscall(
            SYS_LANDLOCK_ADD_RULE,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const LandlockPathBeneathAttr,
            0u32,
        )
    })
    .map(drop)
}

/// Adds a TCP port rule.
pub(crate) fn landlock_add_port_rule(ruleset: &OwnedFd, port: u16, access: u64) -> io::Result<()> {
    let attr = LandlockNetPortAttr {
        allowed_access: access,
        port: u64::from(port),
    };
    // SAFETY: the fd is open and `attr` is a live struct read by pointer.
    cvt(unsafe {
        libc::syscall(
            SYS_LANDLOCK_ADD_RULE,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_NET_PORT,
            &attr as *const LandlockNetPortAttr,
            0u32,
        )
    })
    .map(drop)
}

/// Opens a path with `O_PATH | O_CLOEXEC` (following symlinks, like Landlock rule paths).
pub(crate) fn open_path(path: &Path) -> io::Result<(OwnedFd, bool)> {
    let c = cstring(path)?;
    // SAFETY: `c` is a valid NUL-terminated string.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: new fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `st` is zero-initialised plain data and the fd is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fd, (st.st_mode & libc::S_IFMT) == libc::S_IFDIR))
}

/// Opens a Landlock rule path with `O_PATH`, returning the fd, whether it is a directory, and
/// the path of the object actually opened (symlinks resolved from the fd itself, so the
/// caller judges exactly the object it will grant).
pub(crate) fn open_rule_path(path: &Path) -> io::Result<(OwnedFd, bool, std::path::PathBuf)> {
    // Fast path: no symlink anywhere, so the opened object's path is `path` itself.
    let no_links = openat2(
        libc::AT_FDCWD,
        path,
        libc::O_PATH,
        0,
        RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    );
    let (fd, real) = match no_links {
        Ok(fd) => (fd, path.to_path_buf()),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            let (fd, _) = open_path(path)?;
            let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
            (fd, real)
        }
        Err(e) => return Err(e),
    };
    // SAFETY: zeroed plain data; valid fd and out pointer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fd, (st.st_mode & libc::S_IFMT) == libc::S_IFDIR, real))
}

/// Converts a path to a C string.
pub(crate) fn cstring(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// Opens `rel` beneath the directory `dir` with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
/// RESOLVE_NO_MAGICLINKS)`: no component may be a symlink and the walk cannot leave `dir`.
pub(crate) fn openat2_beneath(
    dir: RawFd,
    rel: &Path,
    flags: i32,
    mode: u32,
) -> io::Result<OwnedFd> {
    openat2(
        dir,
        rel,
        flags,
        mode,
        RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    )
}

/// `openat2` with explicit resolve flags; always close-on-exec. Where `openat2` is answered
/// ENOSYS (a seccomp filter that cannot inspect its arguments refuses it that way: systemd's
/// `RestrictSUIDSGID=yes` does), the same resolution is done one component at a time
/// ([`openat2_by_components`]).
fn openat2(dir: RawFd, p: &Path, flags: i32, mode: u32, resolve: u64) -> io::Result<OwnedFd> {
    match openat2_syscall(dir, p, flags, mode, resolve) {
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            openat2_by_components(dir, p, flags, mode, resolve)
        }
        r => r,
    }
}

/// `openat2` itself.
fn openat2_syscall(
    dir: RawFd,
    p: &Path,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let c = cstring(p)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: u64::from(mode),
        resolve,
    };
    // SAFETY: valid C string, live `how` of the size passed.
    let fd = cvt(unsafe {
        libc::syscall(
            SYS_OPENAT2,
            dir,
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    })?;
    // SAFETY: new fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The resolution `openat2` does for the flags used here, with plain `openat` one component
/// at a time, each opened relative to the previous one's fd: `RESOLVE_NO_SYMLINKS` (and so
/// `RESOLVE_NO_MAGICLINKS`) fails with ELOOP on any symlink component, checked with fstat on
/// an `O_PATH | O_NOFOLLOW` fd (which opens a symlink itself instead of following it);
/// `RESOLVE_BENEATH` refuses an absolute path and a `..` that would leave `dir` with EXDEV.
/// The last component is opened with the caller's flags plus `O_NOFOLLOW`.
fn openat2_by_components(
    dir: RawFd,
    p: &Path,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    use std::path::Component;
    let supported = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    if resolve & !supported != 0 || resolve & RESOLVE_NO_SYMLINKS == 0 {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    let beneath = resolve & RESOLVE_BENEATH != 0;
    let open_at = |at: RawFd, name: &std::ffi::OsStr, fl: i32| -> io::Result<OwnedFd> {
        let c = cstring(Path::new(name))?;
        // SAFETY: valid C string; the kernel checks the fd.
        let fd = unsafe { libc::openat(at, c.as_ptr(), fl | libc::O_CLOEXEC, mode) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: new fd owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let refuse_link = |fd: &OwnedFd| -> io::Result<()> {
        // SAFETY: zeroed plain data; valid fd and out pointer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
            return Err(io::Error::last_os_error());
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        Ok(())
    };
    let names: Vec<Component<'_>> = p.components().collect();
    if names.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    // The directories walked so far (for `..`), starting at `dir` or at `/`.
    let mut stack: Vec<OwnedFd> = Vec::new();
    let base = if p.is_absolute() {
        if beneath {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        open_at(libc::AT_FDCWD, std::ffi::OsStr::new("/"), libc::O_PATH)?
    } else {
        open_at(dir, std::ffi::OsStr::new("."), libc::O_PATH)?
    };
    stack.push(base);
    let last = names.len() - 1;
    for (i, c) in names.iter().enumerate() {
        let name = match c {
            Component::RootDir | Component::CurDir => {
                if i == last {
                    std::ffi::OsStr::new(".")
                } else {
                    continue;
                }
            }
            Component::ParentDir => {
                if stack.len() == 1 {
                    if beneath {
                        return Err(io::Error::from_raw_os_error(libc::EXDEV));
                    }
                    // Above the root of an absolute path (or `dir`): `..` opens its parent.
                    let up = open_at(
                        stack[0].as_raw_fd(),
                        std::ffi::OsStr::new(".."),
                        libc::O_PATH,
                    )?;
                    stack[0] = up;
                } else {
                    stack.pop();
                }
                if i == last {
                    let cur = stack.last().map(AsRawFd::as_raw_fd).unwrap_or(dir);
                    return open_at(cur, std::ffi::OsStr::new("."), flags);
                }
                continue;
            }
            Component::Normal(n) => *n,
            Component::Prefix(_) => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        };
        let cur = stack.last().map(AsRawFd::as_raw_fd).unwrap_or(dir);
        if i == last {
            return match open_at(cur, name, flags | libc::O_NOFOLLOW) {
                Ok(fd) => {
                    if flags & libc::O_PATH != 0 {
                        refuse_link(&fd)?;
                    }
                    Ok(fd)
                }
                // A symlink with O_DIRECTORY gives ENOTDIR here; openat2 says ELOOP.
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                    let itself = open_at(cur, name, libc::O_PATH | libc::O_NOFOLLOW)?;
                    refuse_link(&itself)?;
                    Err(e)
                }
                Err(e) => Err(e),
            };
        }
        let next = open_at(cur, name, libc::O_PATH | libc::O_NOFOLLOW)?;
        refuse_link(&next)?;
        stack.push(next);
    }
    Err(io::Error::from_raw_os_error(libc::ENOENT))
}

/// `mkdirat(dir, name)` for a single component (no slashes; the caller checks).
pub(crate) fn mkdirat(dir: RawFd, name: &Path, mode: u32) -> io::Result<()> {
    let c = cstring(name)?;
    // SAFETY: valid fd number (checked by the kernel) and C string.
    if unsafe { libc::mkdirat(dir, c.as_ptr(), mode) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `unlinkat(dir, name, flags)` for a single component.
pub(crate) fn unlinkat(dir: RawFd, name: &Path, flags: i32) -> io::Result<()> {
    let c = cstring(name)?;
    // SAFETY: valid C string.
    if unsafe { libc::unlinkat(dir, c.as_ptr(), flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A pipe whose both ends are close-on-exec.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A close-on-exec AF_UNIX stream socketpair.
pub(crate) fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    unix_socketpair(libc::SOCK_STREAM)
}

/// A close-on-exec AF_UNIX SOCK_SEQPACKET socketpair (the zygote's control link).
pub(crate) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    unix_socketpair(libc::SOCK_SEQPACKET)
}

fn unix_socketpair(ty: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for two fds.
    if unsafe { libc::socketpair(libc::AF_UNIX, ty | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub(crate) fn shutdown_read(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: valid socket fd.
    if unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `send(MSG_NOSIGNAL | MSG_DONTWAIT)`: EPIPE instead of SIGPIPE.
pub(crate) fn send_nosignal(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for reads of its length.
    let n = unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// An eventfd (used as a cancellation flag).
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: new fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Writes all of `buf` (retrying on EINTR); used by the parent.
pub(crate) fn write_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for reads of its length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// `read` once, retrying EINTR. Returns 0 at EOF.
pub(crate) fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Sets `O_NONBLOCK` on an fd.
pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd number; the kernel validates it.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `poll` with a millisecond timeout (-1 = forever); EINTR counts as "nothing ready".
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `fds` is a valid array of the given length.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(r as usize)
}

/// `pidfd_open(pid, 0)`: a descriptor for process `pid` (in this process's pid namespace).
pub(crate) fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments; on success the return value is a new
    // descriptor that nothing else owns.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) })?;
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends a signal through a pidfd (race-free: the pid cannot have been reused).
pub(crate) fn pidfd_send_signal(pidfd: &OwnedFd, sig: i32) -> io::Result<()> {
    // SAFETY: valid pidfd, NULL siginfo, no flags.
    cvt(unsafe {
        libc::syscall(
            SYS_PIDFD_SEND_SIGNAL,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    })
    .map(drop)
}

/// Resource usage of a reaped child.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rusage {
    pub user_us: u64,
    pub sys_us: u64,
    pub max_rss_kb: u64,
}

/// Reaps `pid` (blocking), returning its raw wait status and rusage.
pub(crate) fn wait4(pid: libc::pid_t) -> io::Result<(i32, Rusage)> {
    let mut status = 0;
    // SAFETY: zeroed plain data.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid out pointers.
        let r = unsafe { libc::wait4(pid, &mut status, libc::__WALL, &mut ru) };
        if r == pid {
            break;
        }
        let e = io::Error::last_os_error();
        if r < 0 && e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return Err(e);
    }
    let us = |t: libc::timeval| (t.tv_sec as u64) * 1_000_000 + t.tv_usec as u64;
    Ok((
        status,
        Rusage {
            user_us: us(ru.ru_utime),
            sys_us: us(ru.ru_stime),
            max_rss_kb: ru.ru_maxrss as u64,
        },
    ))
}

/// Effective uid/gid of the caller.
pub(crate) fn ids() -> (u32, u32) {
    // SAFETY: trivially safe getters.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

pub(super) fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `flock(fd, op)`, retrying EINTR (host side: placeholder locks).
pub(crate) fn flock(fd: &OwnedFd, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on an open fd.
        if unsafe { libc::flock(fd.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `fstat` of an open fd: `(dev, ino, nlink, is_dir)`.
pub(crate) fn fstat_ids(fd: &OwnedFd) -> io::Result<(u64, u64, u64, bool)> {
    // SAFETY: zeroed plain data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((
        st.st_dev,
        st.st_ino,
        st.st_nlink,
        (st.st_mode & libc::S_IFMT) == libc::S_IFDIR,
    ))
}

/// `fstatat(dir, name, flags)`, whole.
pub(crate) fn stat_at(dir: RawFd, name: &Path, flags: i32) -> io::Result<libc::stat> {
    let c = cstring(name)?;
    // SAFETY: zeroed plain data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer; the kernel validates the fd.
    if unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `fstat` of what a descriptor stands for (an `O_PATH | O_NOFOLLOW` one: a symlink itself),
/// whole.
pub(crate) fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    let flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH;
    stat_at(fd.as_raw_fd(), Path::new(""), flags)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: `(dev, ino, is_dir, is_symlink)`, for one
/// component.
pub(crate) fn lstat_at(dir: RawFd, name: &Path) -> io::Result<(u64, u64, bool, bool)> {
    let st = stat_at(dir, name, libc::AT_SYMLINK_NOFOLLOW)?;
    let fmt = st.st_mode & libc::S_IFMT;
    Ok((
        st.st_dev,
        st.st_ino,
        fmt == libc::S_IFDIR,
        fmt == libc::S_IFLNK,
    ))
}

/// The full `st_mode` (type and permission bits) of `name` in `dir`, without following a
/// final symlink.
pub(crate) fn mode_at(dir: RawFd, name: &Path) -> io::Result<u32> {
    Ok(stat_at(dir, name, libc::AT_SYMLINK_NOFOLLOW)?.st_mode)
}

/// The target of the symlink an `O_PATH | O_NOFOLLOW` descriptor stands for.
pub(crate) fn readlink_fd(fd: &OwnedFd) -> io::Result<std::path::PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: the empty C string and the live buffer of the length passed.
    let n = unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(std::ffi::OsString::from_vec(buf).into())
}

/// Whether this process may search (enter) the directory `fd` stands for, by its effective
/// ids and capabilities (`faccessat2(AT_EACCESS | AT_EMPTY_PATH)`). Where the kernel or a
/// filter refuses to answer, it may: the callers treat a searchable directory as the riskier
/// case.
pub(crate) fn can_search(fd: &OwnedFd) -> bool {
    // SAFETY: the empty C string; the kernel validates the fd.
    let r = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::X_OK,
            libc::AT_EACCESS | libc::AT_EMPTY_PATH,
        )
    };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EACCES)
}

/// Visits the entries of an open directory (`.` and `..` left out), read with `getdents64`
/// from the fd's current offset (a freshly opened directory: from the start; no `/proc` round
/// trip), one 4 KiB buffer at a time: `visit(name, is_dir, is_symlink)`, until the end or
/// until it returns `Break`. Nothing is collected, so memory does not grow with the
/// directory (the post-run scans read the workspace around every call, and a workspace
/// directory may hold tens of thousands of files). Entries whose type the file system does
/// not report are looked up with [`lstat_at`]; ones that vanish in between are left out.
pub(crate) fn visit_dir_entries(
    dir: &OwnedFd,
    visit: &mut dyn FnMut(&std::ffi::OsStr, bool, bool) -> std::ops::ControlFlow<()>,
) -> io::Result<()> {
    visit_dir_typed(dir, &mut |name, d_type| {
        visit(name, d_type == libc::DT_DIR, d_type == libc::DT_LNK)
    })
}

/// [`visit_dir_entries`] with each entry's file type (`DT_*`: `DT_FIFO`, `DT_SOCK`,
/// `DT_CHR`, … told apart, so a search for special files costs no `stat` per entry).
pub(crate) fn visit_dir_typed(
    dir: &OwnedFd,
    visit: &mut dyn FnMut(&std::ffi::OsStr, u8) -> std::ops::ControlFlow<()>,
) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    // Small on purpose: most directories read here hold a handful of entries.
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: getdents64 writes at most `buf.len()` bytes into the live buffer.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(());
        }
        let n = n as usize;
        let mut off = 0usize;
        // Each record: d_ino (8), d_off (8), d_reclen (2), d_type (1), NUL-terminated name.
        while off + 19 <= n {
            let reclen = usize::from(u16::from_ne_bytes([buf[off + 16], buf[off + 17]]));
            if reclen < 19 || off + reclen > n {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            let d_type = buf[off + 18];
            let raw = &buf[off + 19..off + reclen];
            let name = &raw[..raw.iter().position(|b| *b == 0).unwrap_or(raw.len())];
            off += reclen;
            if name == b"." || name == b".." || name.is_empty() {
                continue;
            }
            let name = std::ffi::OsStr::from_bytes(name);
            let d_type = match d_type {
                libc::DT_UNKNOWN => match mode_at(dir.as_raw_fd(), Path::new(name)) {
                    Ok(mode) => match mode & libc::S_IFMT {
                        libc::S_IFDIR => libc::DT_DIR,
                        libc::S_IFLNK => libc::DT_LNK,
                        libc::S_IFIFO => libc::DT_FIFO,
                        libc::S_IFSOCK => libc::DT_SOCK,
                        libc::S_IFCHR => libc::DT_CHR,
                        libc::S_IFBLK => libc::DT_BLK,
                        _ => libc::DT_REG,
                    },
                    Err(_) => continue,
                },
                t => t,
            };
            if visit(name, d_type).is_break() {
                return Ok(());
            }
        }
    }
}

/// The entries of an open directory that `keep(name, is_dir, is_symlink)` accepts, as
/// `(name, is_dir, is_symlink)` (see [`visit_dir_entries`]; only the kept ones are copied).
pub(crate) fn dir_entries_where(
    dir: &OwnedFd,
    keep: &mut dyn FnMut(&std::ffi::OsStr, bool, bool) -> bool,
) -> io::Result<Vec<(std::ffi::OsString, bool, bool)>> {
    let mut out = Vec::new();
    visit_dir_entries(dir, &mut |name, is_dir, is_link| {
        if keep(name, is_dir, is_link) {
            out.push((name.to_os_string(), is_dir, is_link));
        }
        std::ops::ControlFlow::Continue(())
    })?;
    Ok(out)
}

/// Reopens an fd's file through `/proc/self/fd` as a new, non-blocking, read-only open file
/// description (so `O_NONBLOCK` does not leak to other holders of the original).
pub(crate) fn reopen_nonblocking(fd: RawFd) -> io::Result<OwnedFd> {
    let p = CString::new(format!("/proc/self/fd/{fd}"))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: valid C string.
    let n = unsafe {
        libc::open(
            p.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: new fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// Sends one message made of `parts` with `fds` attached (SCM_RIGHTS), without SIGPIPE.
pub(crate) fn send_with_fds(sock: &OwnedFd, parts: &[&[u8]], fds: &[RawFd]) -> io::Result<()> {
    let mut iov: Vec<libc::iovec> = parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    let space = if fds.is_empty() {
        0
    } else {
        // SAFETY: pure size computation.
        unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as usize }
    };
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: zeroed plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len();
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer holds CMSG_SPACE(fds) bytes, 8-byte aligned; the header
        // and data pointers come from the CMSG macros over that buffer.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(c),
                std::mem::size_of_val(fds),
            );
        }
    }
    loop {
        // SAFETY: `msg` points at live iovecs and control data for the duration of the call.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message into `buf` and at most one attached fd (extra fds are closed).
/// Returns 0 bytes at EOF.
pub(crate) fn recv_with_fd(sock: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: zeroed plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: `msg` points at live buffers for the duration of the call.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut got: Option<OwnedFd> = None;
    // SAFETY: walking the control data the kernel filled in, with the CMSG macros; every fd
    // found is new and owned by nobody else.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if got.is_none() {
                        got = Some(fd);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n, got))
}

/// A close-on-exec memfd holding `data` (large call payloads).
pub(crate) fn memfd_with(data: &[u8]) -> io::Result<OwnedFd> {
    // SAFETY: valid C string name.
    let fd = unsafe { libc::memfd_create(c"ollie-call".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: new fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    write_all(fd.as_raw_fd(), data)?;
    Ok(fd)
}

/// `memfd_create`'s `MFD_EXEC` (Linux 6.3): executable even under `vm.memfd_noexec = 1`.
const MFD_EXEC: libc::c_uint = 0x10;

/// A new, empty, close-on-exec memfd that can be sealed, asked to be executable
/// (`MFD_EXEC`). Kernels before 6.3 reject the flag and make every memfd executable; where
/// `vm.memfd_noexec = 2` refuses it, the memfd is made without it and may not be executable
/// (executing it then fails, as for a file without an execute bit).
pub(crate) fn memfd_sealable(name: &CStr) -> io::Result<OwnedFd> {
    let base = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: valid C string name; returns a new fd or -1.
    let mut fd = unsafe { libc::memfd_create(name.as_ptr(), base | MFD_EXEC) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EACCES)) {
            return Err(e);
        }
        // SAFETY: as above.
        fd = unsafe { libc::memfd_create(name.as_ptr(), base) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: a new fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fchmod(fd, mode)`.
pub(crate) fn fchmod(fd: &OwnedFd, mode: u32) -> io::Result<()> {
    // SAFETY: fchmod on an open fd.
    if unsafe { libc::fchmod(fd.as_raw_fd(), mode) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Adds `seals` (`F_SEAL_*`) to a memfd, then reads the seals back: `Ok` only if all of them
/// are in place.
pub(crate) fn add_seals(fd: &OwnedFd, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: fcntl on an open fd with integer arguments.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    let now = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if now < 0 {
        return Err(io::Error::last_os_error());
    }
    if now & seals != seals {
        return Err(io::Error::other("the seals did not hold"));
    }
    Ok(())
}

/// `lseek(fd, 0, SEEK_SET)`.
pub(crate) fn rewind(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: lseek on an open fd.
    if unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_SET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `pread(fd, buf, offset)`, retrying EINTR (does not move the file offset).
pub(crate) fn pread(fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let off =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    loop {
        // SAFETY: reads into a valid buffer of the given length.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Sends one byte on a socket (the zygote's start signal).
pub(crate) fn send_byte(sock: &OwnedFd) -> io::Result<()> {
    send_with_fds(sock, &[b"g"], &[])
}

/// Free space of a filesystem, from `fstatfs` (units already multiplied out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FsSpace {
    /// Size of the filesystem in bytes.
    pub(crate) total_bytes: u64,
    /// Free bytes (including blocks reserved for root).
    pub(crate) free_bytes: u64,
    /// Bytes available to unprivileged users.
    pub(crate) avail_bytes: u64,
    /// Total inodes (0: the filesystem does not report inodes, e.g. btrfs).
    pub(crate) total_inodes: u64,
    /// Free inodes.
    pub(crate) free_inodes: u64,
}

/// `fstatfs` of an open fd (an `O_PATH` fd is enough).
pub(crate) fn fstatfs(fd: &OwnedFd) -> io::Result<FsSpace> {
    // SAFETY: zeroed plain data.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer to a properly sized struct.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // Block counts are in units of the fragment size (f_frsize; older kernels leave it 0 and
    // f_bsize is the unit).
    let unit = if st.f_frsize > 0 {
        st.f_frsize as u64
    } else {
        st.f_bsize as u64
    };
    Ok(FsSpace {
        total_bytes: (st.f_blocks as u64).saturating_mul(unit),
        free_bytes: (st.f_bfree as u64).saturating_mul(unit),
        avail_bytes: (st.f_bavail as u64).saturating_mul(unit),
        total_inodes: st.f_files as u64,
        free_inodes: st.f_ffree as u64,
    })
}

/// Whether `path` is on a cgroup filesystem (v1 or v2), not a directory that merely sits
/// where one is usually mounted (`/sys/fs/cgroup` is a tmpfs on cgroup-v1 hosts).
pub(crate) fn is_cgroup_fs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: zeroed plain data.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and an out pointer to a properly sized struct.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } < 0 {
        return false;
    }
    matches!(st.f_type as i64, CGROUP_SUPER_MAGIC | CGROUP2_SUPER_MAGIC)
}

/// A close-on-exec duplicate of `fd`, owned by the caller. Used for descriptors a process
/// inherited by number (a server's link, a boot memfd): duplicating instead of adopting
/// means no other owner of `fd` can be invalidated. Fails with EBADF if `fd` is not open.
pub(crate) fn dup_cloexec(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC only reads `fd` (any int is allowed; bad ones give EBADF).
    let r = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `r` is a new descriptor that nothing else in this process refers to.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// [`dup_cloexec`] of several inherited descriptors, after checking that every one of them
/// is open and that none is given twice: a duplicate takes the lowest free number, so
/// duplicating one before checking the next could make a missing descriptor's number refer
/// to the first one's copy.
pub(crate) fn dup_all_cloexec(fds: &[RawFd]) -> io::Result<Vec<OwnedFd>> {
    for (i, &fd) in fds.iter().enumerate() {
        if fds[..i].contains(&fd) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("fd {fd} is given twice"),
            ));
        }
        // SAFETY: F_GETFD only reads the descriptor table (bad numbers give EBADF).
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("fd {fd} is not open: {e}"),
            ));
        }
    }
    fds.iter().map(|&fd| dup_cloexec(fd)).collect()
}

// ---------------------------------------------------------------------------------------------
// Server hardening (`harden.rs`): irreversible changes to the calling process itself, and the
// side-effect-free probes that check them.

/// `close_range(first, last, 0)`.
pub(crate) fn close_range(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: closes fds of this process; the caller (harden_server) documents that no live
    // owner of those fds may remain.
    cvt(unsafe { libc::syscall(SYS_CLOSE_RANGE, first, last, 0u32) }).map(drop)
}

/// `close(fd)` of a raw fd number nothing in this process owns any more (the fallback of
/// [`close_range`]).
pub(crate) fn close_raw(fd: RawFd) -> io::Result<()> {
    // SAFETY: as for close_range: the caller guarantees no live owner of `fd` remains.
    if unsafe { libc::close(fd) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is an open fd of this process (`fcntl(F_GETFD)`).
pub(crate) fn fd_is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only reads the fd's flags; the kernel validates the number.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// Makes `fd` this process's stdin (`dup3` onto 0, not close-on-exec).
pub(crate) fn replace_stdin(fd: &OwnedFd) -> io::Result<()> {
    if fd.as_raw_fd() == 0 {
        return Ok(());
    }
    // SAFETY: dup3 onto fd 0 atomically replaces whatever stdin was; `fd` stays owned.
    if unsafe { libc::dup3(fd.as_raw_fd(), 0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `prctl(PR_SET_DUMPABLE, 0)` on the calling process.
pub(crate) fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: raw prctl on integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `prctl(PR_GET_DUMPABLE)`: whether the calling process is dumpable.
pub(crate) fn is_dumpable() -> io::Result<bool> {
    // SAFETY: raw prctl on integer arguments.
    let r = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r != 0)
}

/// Sets a resource limit of the calling process (soft = hard = `value`).
pub(crate) fn set_rlimit(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    let rl = libc::rlimit64 {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: valid pointer to a live struct.
    if unsafe { libc::setrlimit64(resource, &rl) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `prctl(PR_SET_NO_NEW_PRIVS, 1)` on the calling process (irreversible).
pub(crate) fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: raw prctl on integer arguments.
    if unsafe { libc::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `landlock_restrict_self(ruleset)` on the calling thread (irreversible; the caller is
/// single-threaded).
pub(crate) fn landlock_restrict_self(ruleset: &OwnedFd) -> io::Result<()> {
    // SAFETY: the fd is open for the duration of the call; no pointers.
    cvt(unsafe { libc::syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset.as_raw_fd(), 0u32) }).map(drop)
}

const SECCOMP_FILTER_FLAG_TSYNC: libc::c_ulong = 1;

/// Attaches a seccomp filter to the calling process (every thread: `TSYNC`), irreversibly.
/// Needs `no_new_privs` first.
pub(crate) fn seccomp_attach(program: &[libc::sock_filter]) -> io::Result<()> {
    let len =
        u16::try_from(program.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `len` live instructions the kernel copies during the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            SECCOMP_FILTER_FLAG_TSYNC,
            &prog as *const libc::sock_fprog,
        )
    };
    match r {
        0 => Ok(()),
        // TSYNC: the id of a thread that could not be synchronised.
        r if r > 0 => Err(io::Error::from_raw_os_error(libc::EBUSY)),
        _ => Err(io::Error::last_os_error()),
    }
}

/// A close-on-exec socket (`socket(domain, ty | SOCK_CLOEXEC, protocol)`).
pub(crate) fn socket(domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: new fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The id of the mount `path` is on (`statx`, the final symlink not followed), if it can be
/// read.
pub(crate) fn mount_id(path: &CStr) -> Option<u64> {
    // SAFETY: zeroed plain-data struct, filled by the kernel.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a live struct.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
            &mut stx,
        )
    };
    (r == 0 && stx.stx_mask & libc::STATX_MNT_ID != 0).then_some(stx.stx_mnt_id)
}

/// Forks a child that closes every descriptor it inherited but `last` (ascending), then
/// exits, which closes those; the parent goes on. Used to leave slow last closes to a child
/// ([`crate::close_in_a_child`]): the others go first, in their own calls, so no reader of
/// this process's output or pipes waits for the slow ones. The child only makes raw system
/// calls (this process may have other threads).
pub(crate) fn fork_to_close(last: &[u32]) {
    // SAFETY: fork, then in the child only async-signal-safe raw syscalls and _exit.
    unsafe {
        if libc::fork() == 0 {
            let mut from = 0u32;
            for &fd in last {
                if fd > from {
                    libc::syscall(SYS_CLOSE_RANGE, from, fd - 1, 0u32);
                }
                from = fd.saturating_add(1);
            }
            libc::syscall(SYS_CLOSE_RANGE, from, u32::MAX, 0u32);
            libc::_exit(0);
        }
    }
}

/// The calling thread's capability sets (`capget`, version 3: the low and high 32 bits).
/// Makes no allocation (the child side calls it).
pub(super) fn capget() -> io::Result<[CapData; 2]> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: a header and two data structs of the version-3 layout, live for the call.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut hdr as *mut CapHeader,
            data.as_mut_ptr(),
        )
    })?;
    Ok(data)
}

/// Sets the calling thread's capability sets (`capset`, version 3). Makes no allocation.
pub(super) fn capset(data: &[CapData; 2]) -> io::Result<()> {
    let hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: a header and two data structs of the version-3 layout, live for the call.
    cvt(unsafe { libc::syscall(libc::SYS_capset, &hdr as *const CapHeader, data.as_ptr()) })?;
    Ok(())
}

/// Takes `CAP_DAC_OVERRIDE` and `CAP_DAC_READ_SEARCH` out of the calling thread's effective
/// set (capabilities belong to threads), so that a test running as root sees files as a
/// runner without them does: by their mode bits.
#[cfg(test)]
pub(crate) fn drop_dac_caps_of_this_thread() -> io::Result<()> {
    let mut data = capget()?;
    // CAP_DAC_OVERRIDE is 1, CAP_DAC_READ_SEARCH 2.
    data[0].effective &= !((1 << 1) | (1 << 2));
    capset(&data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// The component walk must decide exactly as `openat2` does, for every path shape the
    /// sandbox opens: plain, nested, `.`/`..`, symlinks at the end and in the middle, magic
    /// links, escapes, absolute paths, missing and non-directory components.
    #[test]
    fn component_walk_decides_as_openat2_does() {
        let t = std::env::temp_dir().join(format!("ollie-walk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        let root = t.as_path();
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::write(root.join("a/b/f"), "x").unwrap();
        symlink("b", root.join("a/lb")).unwrap();
        symlink("/etc", root.join("a/abs")).unwrap();
        symlink("f", root.join("a/b/lf")).unwrap();
        let dir = open_path(root).unwrap().0;
        let rels = [
            "a",
            "a/b",
            "a/b/c",
            "a/b/f",
            "a/./b",
            "a/b/..",
            "a/b/../b/c",
            "a/lb",
            "a/lb/c",
            "a/abs",
            "a/b/lf",
            "..",
            "a/../..",
            "a/b/../../..",
            "nope",
            "a/nope/c",
            "a/b/f/x",
            ".",
            "a/b/c/",
            "/etc",
            "/proc/self/fd/0",
        ];
        let resolves = [
            RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
            RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        ];
        let flags = [
            libc::O_PATH,
            libc::O_RDONLY,
            libc::O_PATH | libc::O_DIRECTORY,
        ];
        let mut compared = 0;
        for rel in rels {
            for resolve in resolves {
                for fl in flags {
                    let p = Path::new(rel);
                    let want = openat2_syscall(dir.as_raw_fd(), p, fl, 0, resolve);
                    let got = openat2_by_components(dir.as_raw_fd(), p, fl, 0, resolve);
                    match (&want, &got) {
                        (Ok(a), Ok(b)) => {
                            let ia = std::fs::read_link(format!("/proc/self/fd/{}", a.as_raw_fd()));
                            let ib = std::fs::read_link(format!("/proc/self/fd/{}", b.as_raw_fd()));
                            assert_eq!(ia.unwrap(), ib.unwrap(), "{rel} {resolve:#x} {fl:#x}");
                        }
                        (Err(a), Err(b)) => {
                            assert_eq!(
                                a.raw_os_error(),
                                b.raw_os_error(),
                                "{rel} {resolve:#x} {fl:#x}"
                            );
                        }
                        _ => panic!("{rel} {resolve:#x} {fl:#x}: openat2 {want:?}, walk {got:?}"),
                    }
                    compared += 1;
                }
            }
        }
        assert_eq!(compared, rels.len() * resolves.len() * flags.len());
        // Resolve flags the walk does not implement are not silently ignored.
        assert_eq!(
            openat2_by_components(
                dir.as_raw_fd(),
                Path::new("a"),
                libc::O_PATH,
                0,
                RESOLVE_BENEATH
            )
            .unwrap_err()
            .raw_os_error(),
            Some(libc::ENOSYS)
        );
        std::fs::remove_dir_all(&t).unwrap();
    }
}
