//! Every raw system call of the crate, and the code that runs between `clone` and `execve`.
//!
//! The child side ([`spawn_init`]) runs in a copy of a possibly multithreaded process, so it
//! only uses data prepared by the parent (C strings, pointer arrays, BPF programs, fds) and
//! async-signal-safe system calls: it never allocates, locks, or unwinds.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::OnceLock;

// x86_64 system call numbers that older libc releases may lack.
const SYS_PIDFD_SEND_SIGNAL: libc::c_long = 424;
const SYS_OPEN_TREE: libc::c_long = 428;
const SYS_MOVE_MOUNT: libc::c_long = 429;
const SYS_FSOPEN: libc::c_long = 430;
const SYS_FSCONFIG: libc::c_long = 431;
const SYS_FSMOUNT: libc::c_long = 432;
const SYS_CLOSE_RANGE: libc::c_long = 436;
const SYS_OPENAT2: libc::c_long = 437;
const SYS_MOUNT_SETATTR: libc::c_long = 442;
const SYS_LANDLOCK_CREATE_RULESET: libc::c_long = 444;
const SYS_LANDLOCK_ADD_RULE: libc::c_long = 445;
const SYS_LANDLOCK_RESTRICT_SELF: libc::c_long = 446;

const OPEN_TREE_CLONE: libc::c_ulong = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
/// `MOUNT_ATTR_RDONLY`.
pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
/// `MOUNT_ATTR_NOSUID`.
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
/// `MOUNT_ATTR_NODEV`.
const MOUNT_ATTR_NODEV: u64 = 0x4;
const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_FD: libc::c_uint = 5;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const CLONE_PIDFD: libc::c_ulong = 0x1000;

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

const PR_SET_PDEATHSIG: libc::c_int = 1;
const PR_CAPBSET_DROP: libc::c_int = 24;
const PR_SET_SECUREBITS: libc::c_int = 28;
const PR_SET_NO_NEW_PRIVS: libc::c_int = 38;
const PR_CAP_AMBIENT: libc::c_int = 47;
const PR_CAP_AMBIENT_CLEAR_ALL: libc::c_ulong = 4;
/// NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE, each with its lock, plus KEEP_CAPS_LOCKED.
const SECURE_BITS_LOCKED: libc::c_ulong = 0xEF;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
const LANDLOCK_RULE_NET_PORT: libc::c_int = 2;

#[repr(C)]
struct LandlockRulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct LandlockPathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

#[repr(C)]
struct LandlockNetPortAttr {
    allowed_access: u64,
    port: u64,
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn cvt(r: libc::c_long) -> io::Result<libc::c_long> {
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

/// The last capability number of the running kernel.
/// The highest capability number the kernel knows. Asked of the kernel itself
/// (`PR_CAPBSET_READ` fails with EINVAL past the last one), not of
/// `/proc/sys/kernel/cap_last_cap`, which a service manager may hide (systemd's
/// `ProcSubset=pid`): guessing too high would make every bounding-set drop fail.
pub(crate) fn cap_last_cap() -> u32 {
    const PR_CAPBSET_READ: libc::c_int = 23;
    let mut last = 0;
    for cap in 0..64u32 {
        // SAFETY: raw prctl on integer arguments.
        if unsafe { libc::prctl(PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) } < 0 {
            break;
        }
        last = cap;
    }
    last
}

/// Whether user namespaces can be created here (probed once: a forked child tries
/// `unshare(CLONE_NEWUSER)`), which says more than `/proc/sys/user/max_user_namespaces`
/// (a sysctl a service manager may hide, and not the only way to forbid them).
pub fn user_namespaces() -> bool {
    static PROBED: OnceLock<bool> = OnceLock::new();
    *PROBED.get_or_init(|| can_unshare(libc::CLONE_NEWUSER))
}

/// Whether the kernel has seccomp filtering (`PR_GET_SECCOMP` answers instead of EINVAL).
pub fn seccomp_available() -> bool {
    // SAFETY: raw prctl without pointers.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

/// Whether a forked child may `unshare(flags)`. The child runs only unshare and _exit.
fn can_unshare(flags: libc::c_int) -> bool {
    // SAFETY: the child runs only unshare and _exit (async-signal-safe) and never returns;
    // the parent reaps it.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            let r = libc::unshare(flags);
            libc::_exit(if r == 0 { 0 } else { 1 });
        }
        if pid < 0 {
            return false;
        }
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 {
            if errno() != libc::EINTR {
                return false;
            }
        }
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }
}

/// Effective uid/gid of the caller.
pub(crate) fn ids() -> (u32, u32) {
    // SAFETY: trivially safe getters.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// One step of the mount-namespace set-up, executed by the init stage.
#[derive(Debug)]
pub(crate) enum MountStep {
    /// `mount --make-rprivate /`.
    MakePrivate,
    /// Clone the tree at `path` (recursively) into detached slot `slot`, before `/` goes
    /// read-only, so it stays writable.
    CloneTree { path: CString, slot: usize },
    /// Make every mount read-only and nosuid (recursively, from `/`).
    ReadOnlyAll,
    /// Attach detached slot `slot` at `path`.
    Attach { slot: usize, path: CString },
    /// Bind `path` onto itself read-only (a protected island inside a writable tree).
    ProtectReadOnly { path: CString },
    /// Mount a fresh tmpfs (`options`: size, inodes, mode) at `path`, nosuid/nodev/noexec, and
    /// grant `rule_access` beneath it in the run's Landlock ruleset (the rule must name the
    /// new tmpfs root: Landlock does not look at hidden mount points).
    PrivateTmpfs {
        path: CString,
        options: CString,
        rule_access: u64,
    },
    /// Hide `path` from the tool: an empty tmpfs of mode 0 (nothing to list, stat or watch)
    /// over a directory, `/dev/null` bound over a file; read-only, nosuid, nodev, noexec. A
    /// path gone by then is skipped (there is nothing left to hide).
    Hide { path: CString, dir: bool },
    /// Replace the root by a fresh tmpfs (`options`) that holds one entry per entry of the
    /// host's `/` (`entries`: directories and files bound recursively from the host, symlinks
    /// recreated) plus empty directories for union points; the tmpfs is mounted on `stage`
    /// (an existing host directory) after every bind source has been cloned, made read-only,
    /// and `pivot_root`ed into; the old root is detached. `root_rule_access` (the Landlock
    /// rights the policy grants on the host's `/` itself, usually none) is granted on the new
    /// root, which is another inode.
    NewRoot {
        stage: CString,
        options: CString,
        entries: Vec<RootEntry>,
        root_rule_access: u64,
    },
    /// Create an overlay (`lowerdir+` per entry of `lowers`, in search order; `upperdir`,
    /// `workdir`; `userxattr`) as a detached nosuid, nodev mount in slot `slot`. Every layer
    /// is opened without following symlinks (the paths are resolved by the parent) and passed
    /// by fd. Runs before
    /// [`MountStep::ReadOnlyAll`]: the overlay takes its own private clone of the upper
    /// directory's mount, which must be writable then.
    UnionCreate {
        lowers: Vec<CString>,
        upper: CString,
        work: CString,
        slot: usize,
    },
    /// Create a read-only overlay of `lowers` only (a merge of nested lower layers) and
    /// attach it at `at`, an empty directory of the new root, where a union's
    /// [`MountStep::UnionCreate`] then takes it as one lower layer.
    MergeCreate { lowers: Vec<CString>, at: CString },
    /// Attach the overlay in slot `slot` at `point` (after [`MountStep::ReadOnlyAll`], so it
    /// stays writable), and grant `rule_access` beneath it in the run's Landlock ruleset (the
    /// rule must name the overlay's root; 0: no rule).
    UnionAttach {
        slot: usize,
        point: CString,
        rule_access: u64,
    },
}

/// One entry of the new root ([`MountStep::NewRoot`]).
#[derive(Debug)]
pub(crate) struct RootEntry {
    /// The entry's name in the new root (one component).
    pub name: CString,
    /// The host path it comes from (`/name`).
    pub source: CString,
    pub kind: RootKind,
}

/// What a [`RootEntry`] becomes.
#[derive(Debug)]
pub(crate) enum RootKind {
    /// An empty directory with the host's tree bound onto it recursively.
    Dir,
    /// An empty file with the host's file bound onto it.
    File,
    /// A symlink with this target.
    Symlink(CString),
    /// An empty directory (a union point).
    Point,
}

/// At most this many entries in a new root (the child keeps their clones on its stack).
pub(crate) const MAX_ROOT_ENTRIES: usize = 256;

/// A failure inside the child: the stage and errno, sent over the error pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Stage {
    Sync = 1,
    UserNamespaceMap,
    Mount,
    FdLayout,
    Fork,
    Setsid,
    Rlimit,
    Capabilities,
    NoNewPrivs,
    Landlock,
    Seccomp,
    Chdir,
    Exec,
    OomScore,
    Signals,
    Dumpable,
    UnionRoot,
}

impl Stage {
    pub(crate) fn from_u32(v: u32) -> Option<Stage> {
        use Stage::*;
        [
            Sync,
            UserNamespaceMap,
            Mount,
            FdLayout,
            Fork,
            Setsid,
            Rlimit,
            Capabilities,
            NoNewPrivs,
            Landlock,
            Seccomp,
            Chdir,
            Exec,
            OomScore,
            Signals,
            Dumpable,
            UnionRoot,
        ]
        .into_iter()
        .find(|s| *s as u32 == v)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Sync => "start-up handshake",
            Stage::UserNamespaceMap => "user namespace id maps",
            Stage::Mount => "mount namespace set-up",
            Stage::FdLayout => "file descriptor layout",
            Stage::Fork => "fork of the tool under the init stage",
            Stage::Setsid => "setsid",
            Stage::Rlimit => "resource limits",
            Stage::Capabilities => "capability drop",
            Stage::NoNewPrivs => "no_new_privs",
            Stage::Landlock => "landlock restrict_self",
            Stage::Seccomp => "seccomp filter installation",
            Stage::Chdir => "chdir to the working directory",
            Stage::Exec => "execve",
            Stage::OomScore => "oom_score_adj",
            Stage::Signals => "signal set-up",
            Stage::Dumpable => "PR_SET_DUMPABLE",
            Stage::UnionRoot => {
                "pivot_root into the union root (under the shipped systemd unit, bead unions \
                 need the drop-in /usr/share/ollie/systemd/unions.conf)"
            }
        }
    }
}

/// Forced failures for tests of the fail-closed paths (the numbers travel in
/// [`CallHeader::fault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum ChildFault {
    None = 0,
    SeccompInstall = 1,
    CapDrop = 2,
    LandlockRestrict = 3,
}

impl ChildFault {
    /// The fault a call header names (unknown numbers: none). Allocation-free.
    fn from_u32(v: u32) -> ChildFault {
        match v {
            1 => ChildFault::SeccompInstall,
            2 => ChildFault::CapDrop,
            3 => ChildFault::LandlockRestrict,
            _ => ChildFault::None,
        }
    }
}

/// Everything the child needs, prepared by the parent before `clone`.
#[derive(Debug)]
pub(crate) struct ChildPlan {
    pub stdin: RawFd,
    pub stdout: RawFd,
    pub stderr: RawFd,
    /// Close-on-exec pipe: the child writes `(stage, errno)` here when a step fails.
    pub err_w: RawFd,
    /// The init stage writes the tool's raw wait status here.
    pub status_w: RawFd,
    /// The parent writes one byte here once it has placed the child in its cgroup.
    pub sync_r: RawFd,
    /// The Landlock ruleset (-1 when `landlock` is false).
    pub ruleset: RawFd,
    /// Whether the tool restricts itself with `ruleset`; false only for a run approved
    /// unsandboxed, which has no ruleset.
    pub landlock: bool,
    pub setgroups_path: CString,
    pub uid_map_path: CString,
    pub gid_map_path: CString,
    pub oom_path: CString,
    pub uid_map: CString,
    pub gid_map: CString,
    pub mounts: Vec<MountStep>,
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    pub cap_last: u32,
    /// BPF programs in installation order.
    pub filters: Vec<Vec<libc::sock_filter>>,
    pub exe: CString,
    pub argv: Vec<*const libc::c_char>,
    pub envp: Vec<*const libc::c_char>,
    pub cwd: CString,
    /// `cwd` is not the workspace (see `restrict_and_exec`).
    pub check_cwd: bool,
    pub fault: ChildFault,
    /// Descriptors the tool inherits as [`FD_PASS_BASE`], [`FD_PASS_BASE`] + 1, … (at most
    /// [`MAX_PASS_FDS`]; one-shot runs only).
    pub pass: Vec<RawFd>,
    /// The descriptor the tool executes (`execveat(fd, "", …, AT_EMPTY_PATH)`) instead of
    /// `exe`; -1: `execve(exe)`. The tool holds it as the number after the passed ones.
    pub exec_fd: RawFd,
    /// `exec_fd` stays open across the exec (a `#!` script: the kernel hands its interpreter
    /// `/dev/fd/N`); otherwise it is close-on-exec.
    pub exec_fd_inherit: bool,
}

/// Namespaces the init stage is always created in.
const BASE_NAMESPACE_FLAGS: libc::c_ulong =
    (libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS) as libc::c_ulong;

/// Namespaces the init stage is created in: user, pid and mount, plus IPC where this process
/// may create IPC namespaces ([`ipc_namespaces`]).
pub(crate) fn namespace_flags() -> libc::c_ulong {
    if ipc_namespaces() {
        BASE_NAMESPACE_FLAGS | libc::CLONE_NEWIPC as libc::c_ulong
    } else {
        BASE_NAMESPACE_FLAGS
    }
}

/// The namespaces a run's init stage gets, as recorded.
pub(crate) fn namespace_names() -> Vec<&'static str> {
    if ipc_namespaces() {
        vec!["user", "pid", "mount", "ipc"]
    } else {
        vec!["user", "pid", "mount"]
    }
}

/// Whether new IPC namespaces can be created here (probed once: a forked child tries
/// `unshare(CLONE_NEWUSER | CLONE_NEWIPC)`). A service manager may forbid them (systemd's
/// `RestrictNamespaces=` without `ipc`: each allowed kind counts against the unit's exposure).
/// Runs then share the runner's IPC namespace, which loses nothing a tool could reach: the
/// tool filter allows none of the SysV IPC or POSIX message-queue calls (`shmget`, `shmat`,
/// `semget`, `semop`, `msgget`, `msgsnd`, `mq_open`, …), and POSIX shared memory is files
/// under Landlock.
pub fn ipc_namespaces() -> bool {
    static PROBED: OnceLock<bool> = OnceLock::new();
    *PROBED.get_or_init(|| can_unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWIPC))
}

/// Target fd numbers in the child.
const FD_ERR: RawFd = 3;
const FD_STATUS: RawFd = 4;
const FD_SYNC: RawFd = 5;
const FD_RULESET: RawFd = 6;
/// The first of the descriptors a one-shot tool inherits ([`ChildPlan::pass`]): 7, 8, ….
pub(crate) const FD_PASS_BASE: RawFd = 7;
/// At most this many passed descriptors.
pub(crate) const MAX_PASS_FDS: usize = 16;
/// The longest fd list the child arranges: its own 0–6, the passed ones and the exec fd.
const FD_LIST_MAX: usize = FD_PASS_BASE as usize + MAX_PASS_FDS + 1;
/// Slots of an fd list that stay open across `execve`: stdin, stdout and stderr.
const KEEP_STDIO: u32 = 0b111;

const MAX_SLOTS: usize = 64;

/// Starts the init stage (pid 1 of new user, pid, mount and IPC namespaces), which sets up the
/// mounts and forks the tool. Returns `(pid, pidfd)` in the parent.
pub(crate) fn spawn_init(plan: &ChildPlan) -> io::Result<(libc::pid_t, OwnedFd)> {
    if plan.pass.len() > MAX_PASS_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors to pass",
        ));
    }
    clone_namespaced(&plan.mounts, init_main, plan)
}

/// Clones `child_main(arg)` as pid 1 of new user, pid, mount and IPC namespaces (the one-shot
/// init stage, or a prepared sandbox's zygote), with every signal blocked across the clone (as
/// posix_spawn does): no handler of the runner can run in the child. Returns `(pid, pidfd)`.
fn clone_namespaced<T>(
    mounts: &[MountStep],
    child_main: fn(&T) -> !,
    arg: &T,
) -> io::Result<(libc::pid_t, OwnedFd)> {
    if mounts.iter().any(|m| match m {
        MountStep::CloneTree { slot, .. }
        | MountStep::Attach { slot, .. }
        | MountStep::UnionCreate { slot, .. }
        | MountStep::UnionAttach { slot, .. } => *slot >= MAX_SLOTS,
        MountStep::NewRoot { entries, .. } => entries.len() > MAX_ROOT_ENTRIES,
        _ => false,
    }) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many writable paths",
        ));
    }
    // (Probed before the signal mask changes: the first call forks a probe child.)
    let flags = namespace_flags() | CLONE_PIDFD | libc::SIGCHLD as libc::c_ulong;
    let mut pidfd: RawFd = -1;
    // SAFETY: plain sigset manipulation on stack values; pthread_sigmask only affects this
    // thread and is restored right after the clone.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut saved: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to stack sigsets.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut saved);
    }
    // SAFETY: a fork-style clone (no new stack, no CLONE_VM): the child gets a copy of the
    // address space and only runs `child_main`, which uses async-signal-safe syscalls on data
    // prepared before this call and never returns.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            0usize,
            &mut pidfd as *mut RawFd,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        child_main(arg);
    }
    let err = io::Error::last_os_error();
    // SAFETY: restores this thread's mask saved above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut());
    }
    if pid < 0 {
        return Err(err);
    }
    // SAFETY: the kernel stored a new pidfd for the child (CLONE_PIDFD).
    Ok((pid as libc::pid_t, unsafe { OwnedFd::from_raw_fd(pidfd) }))
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Reports a failed stage on the error pipe and exits. Child only.
fn fail(stage: Stage, err: i32) -> ! {
    let mut msg = [0u8; 8];
    msg[..4].copy_from_slice(&(stage as u32).to_ne_bytes());
    msg[4..].copy_from_slice(&err.to_ne_bytes());
    // SAFETY: raw write of a stack buffer, then _exit; both async-signal-safe.
    unsafe {
        libc::write(FD_ERR, msg.as_ptr().cast(), msg.len());
        libc::_exit(126)
    }
}

fn check(stage: Stage, r: libc::c_long) {
    if r < 0 {
        fail(stage, errno());
    }
}

fn write_file(stage: Stage, path: &CStr, data: &CStr) {
    // SAFETY: C strings are valid; raw open/write/close.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            fail(stage, errno());
        }
        let bytes = data.to_bytes();
        let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        if n < 0 || n as usize != bytes.len() {
            fail(stage, errno());
        }
        libc::close(fd);
    }
}

/// The namespaces' one-time set-up, in pid 1 (the init stage or the zygote): id maps
/// (setgroups denied), `oom_score_adj`, then the mount plan. Child only.
///
/// pid 1 holds a copy of the runner's memory, so it is not dumpable except while it writes
/// its own `/proc/self` files: a runner hardened with `PR_SET_DUMPABLE 0`
/// ([`crate::harden::harden_server`]) passes that on to the clone, and the `/proc/self` files
/// of a non-dumpable process belong to the host's root, which an unprivileged pid 1 cannot
/// open for writing. Dumpable again only for those writes (as every pid 1 was before), and
/// never again afterwards.
fn map_ids_and_mount(plan: &ChildPlan) {
    // SAFETY: raw prctl on integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    write_file(Stage::UserNamespaceMap, &plan.setgroups_path, c"deny");
    write_file(Stage::UserNamespaceMap, &plan.uid_map_path, &plan.uid_map);
    write_file(Stage::UserNamespaceMap, &plan.gid_map_path, &plan.gid_map);
    write_file(Stage::OomScore, &plan.oom_path, c"1000");
    // SAFETY: as above.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } < 0 {
        fail(Stage::Dumpable, errno());
    }
    run_mounts(plan);
}

fn run_mounts(plan: &ChildPlan) {
    let mut slots = [-1 as RawFd; MAX_SLOTS];
    let root = c"/";
    let empty = c"";
    for step in &plan.mounts {
        // SAFETY: every pointer below is a valid C string or a live struct; these are raw
        // mount-API syscalls in the child's own (new) mount namespace.
        unsafe {
            match step {
                MountStep::MakePrivate => check(
                    Stage::Mount,
                    libc::mount(
                        std::ptr::null(),
                        root.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) as libc::c_long,
                ),
                MountStep::CloneTree { path, slot } => {
                    let fd = libc::syscall(
                        SYS_OPEN_TREE,
                        libc::AT_FDCWD,
                        path.as_ptr(),
                        OPEN_TREE_CLONE
                            | libc::O_CLOEXEC as libc::c_ulong
                            | AT_RECURSIVE as libc::c_ulong
                            | libc::AT_SYMLINK_NOFOLLOW as libc::c_ulong,
                    );
                    check(Stage::Mount, fd);
                    slots[*slot] = fd as RawFd;
                }
                MountStep::ReadOnlyAll => {
                    mount_setattr(
                        libc::AT_FDCWD,
                        root.as_ptr(),
                        AT_RECURSIVE as libc::c_uint,
                        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
                    );
                }
                MountStep::Attach { slot, path } => {
                    check(
                        Stage::Mount,
                        libc::syscall(
                            SYS_MOVE_MOUNT,
                            slots[*slot],
                            empty.as_ptr(),
                            libc::AT_FDCWD,
                            path.as_ptr(),
                            MOVE_MOUNT_F_EMPTY_PATH,
                        ),
                    );
                    libc::close(slots[*slot]);
                }
                MountStep::ProtectReadOnly { path } => {
                    let fd = libc::syscall(
                        SYS_OPEN_TREE,
                        libc::AT_FDCWD,
                        path.as_ptr(),
                        OPEN_TREE_CLONE
                            | libc::O_CLOEXEC as libc::c_ulong
                            | libc::AT_SYMLINK_NOFOLLOW as libc::c_ulong,
                    );
                    check(Stage::Mount, fd);
                    mount_setattr(
                        fd as libc::c_int,
                        empty.as_ptr(),
                        libc::AT_EMPTY_PATH as libc::c_uint,
                        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
                    );
                    check(
                        Stage::Mount,
                        libc::syscall(
                            SYS_MOVE_MOUNT,
                            fd,
                            empty.as_ptr(),
                            libc::AT_FDCWD,
                            path.as_ptr(),
                            MOVE_MOUNT_F_EMPTY_PATH,
                        ),
                    );
                    libc::close(fd as RawFd);
                }
                MountStep::PrivateTmpfs {
                    path,
                    options,
                    rule_access,
                } => mount_private_tmpfs(path, options, *rule_access),
                MountStep::Hide { path, dir } => hide(path, *dir),
                MountStep::NewRoot {
                    stage,
                    options,
                    entries,
                    root_rule_access,
                } => {
                    pivot_to_new_root(stage, options, entries);
                    if *root_rule_access != 0 {
                        add_rule_beneath(root, *root_rule_access);
                    }
                }
                MountStep::UnionCreate {
                    lowers,
                    upper,
                    work,
                    slot,
                } => slots[*slot] = create_overlay(lowers, Some((upper, work))),
                MountStep::MergeCreate { lowers, at } => {
                    let fd = create_overlay(lowers, None);
                    check(
                        Stage::Mount,
                        libc::syscall(
                            SYS_MOVE_MOUNT,
                            fd,
                            empty.as_ptr(),
                            libc::AT_FDCWD,
                            at.as_ptr(),
                            MOVE_MOUNT_F_EMPTY_PATH,
                        ),
                    );
                    libc::close(fd);
                }
                MountStep::UnionAttach {
                    slot,
                    point,
                    rule_access,
                } => {
                    check(
                        Stage::Mount,
                        libc::syscall(
                            SYS_MOVE_MOUNT,
                            slots[*slot],
                            empty.as_ptr(),
                            libc::AT_FDCWD,
                            point.as_ptr(),
                            MOVE_MOUNT_F_EMPTY_PATH,
                        ),
                    );
                    libc::close(slots[*slot]);
                    if *rule_access != 0 {
                        add_rule_beneath(point, *rule_access);
                    }
                }
            }
        }
    }
}

/// The init stage's [`MountStep::NewRoot`]. Child only (raw syscalls on prepared data; the
/// clones live in a fixed array on the stack).
///
/// Every bind source is cloned first (detached copies of the host's trees, submounts
/// included, taken before the tmpfs hides `stage`); then the tmpfs is mounted on `stage`,
/// populated, made read-only, and becomes the root: `pivot_root(".", ".")` stacks the old
/// root on the new one, and `umount2(".", MNT_DETACH)` takes it out of the namespace. The
/// clones keep the host's mount locks (an unprivileged namespace cannot unmount what the
/// host stacked inside a tree), and `pivot_root` moves the root's lock to the new root.
fn pivot_to_new_root(stage: &CStr, options: &CStr, entries: &[RootEntry]) {
    let mut fds = [-1 as RawFd; MAX_ROOT_ENTRIES];
    let empty = c"";
    // SAFETY (whole function): valid C strings, stack arrays and structs; raw syscalls in the
    // child's own mount namespace; every fd opened here is closed before returning.
    unsafe {
        for (i, e) in entries.iter().enumerate().take(MAX_ROOT_ENTRIES) {
            let recursive = match e.kind {
                RootKind::Dir => AT_RECURSIVE as libc::c_ulong,
                RootKind::File => 0,
                RootKind::Symlink(_) | RootKind::Point => continue,
            };
            let fd = libc::syscall(
                SYS_OPEN_TREE,
                libc::AT_FDCWD,
                e.source.as_ptr(),
                OPEN_TREE_CLONE
                    | libc::O_CLOEXEC as libc::c_ulong
                    | recursive
                    | libc::AT_SYMLINK_NOFOLLOW as libc::c_ulong,
            );
            if fd < 0 {
                // Gone since the parent listed `/`: the new root simply lacks it.
                if errno() == libc::ENOENT {
                    continue;
                }
                fail(Stage::Mount, errno());
            }
            fds[i] = fd as RawFd;
        }
        check(
            Stage::Mount,
            libc::mount(
                c"tmpfs".as_ptr(),
                stage.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                options.as_ptr().cast(),
            ) as libc::c_long,
        );
        let dir = libc::open(
            stage.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        );
        if dir < 0 {
            fail(Stage::Mount, errno());
        }
        for (i, e) in entries.iter().enumerate().take(MAX_ROOT_ENTRIES) {
            let name = e.name.as_ptr();
            let r = match &e.kind {
                RootKind::Dir | RootKind::File if fds[i] < 0 => continue,
                RootKind::Dir | RootKind::Point => libc::mkdirat(dir, name, 0o755),
                RootKind::File => {
                    let f = libc::openat(
                        dir,
                        name,
                        libc::O_WRONLY
                            | libc::O_CREAT
                            | libc::O_EXCL
                            | libc::O_NOFOLLOW
                            | libc::O_CLOEXEC,
                        0o644 as libc::c_uint,
                    );
                    if f >= 0 {
                        libc::close(f);
                    }
                    f
                }
                RootKind::Symlink(target) => libc::symlinkat(target.as_ptr(), dir, name),
            };
            check(Stage::Mount, r as libc::c_long);
            if fds[i] >= 0 {
                check(
                    Stage::Mount,
                    libc::syscall(
                        SYS_MOVE_MOUNT,
                        fds[i],
                        empty.as_ptr(),
                        dir,
                        name,
                        MOVE_MOUNT_F_EMPTY_PATH,
                    ),
                );
                libc::close(fds[i]);
            }
        }
        // The new root's own entries never change (whatever ReadOnlyAll does later).
        mount_setattr(
            dir,
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        );
        check(Stage::Mount, libc::fchdir(dir) as libc::c_long);
        libc::close(dir);
        let dot = c".";
        check(
            Stage::UnionRoot,
            libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()),
        );
        check(
            Stage::Mount,
            libc::umount2(dot.as_ptr(), libc::MNT_DETACH) as libc::c_long,
        );
        check(Stage::Mount, libc::chdir(c"/".as_ptr()) as libc::c_long);
    }
}

/// `mount_setattr(dirfd, path, flags)` setting `attr_set` (nothing cleared, propagation
/// unchanged); a failure fails the mount stage. Child only.
fn mount_setattr(
    dirfd: libc::c_int,
    path: *const libc::c_char,
    flags: libc::c_uint,
    attr_set: u64,
) {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: raw syscall on a live struct of the size passed; `path` is a C string.
    check(Stage::Mount, unsafe {
        libc::syscall(
            SYS_MOUNT_SETATTR,
            dirfd,
            path,
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    });
}

/// The init stage's [`MountStep::UnionCreate`]: a detached overlay mount, nosuid and nodev.
/// Returns its fd. Child only (raw syscalls on prepared data).
fn create_overlay(lowers: &[CString], upper_work: Option<(&CString, &CString)>) -> RawFd {
    let null = std::ptr::null::<libc::c_char>();
    // SAFETY: valid C strings; raw new-mount-API syscalls; the fs context fd is closed before
    // returning, the mount fd is the caller's.
    unsafe {
        let fs = libc::syscall(SYS_FSOPEN, c"overlay".as_ptr(), FSOPEN_CLOEXEC);
        check(Stage::Mount, fs);
        // Each layer is opened here without following any symlink (the parent resolved the
        // paths; a component swapped for a symlink since then fails the run instead of
        // pointing the overlay elsewhere) and handed to overlayfs by fd (Linux 6.13+).
        let layer = |key: &CStr, path: &CStr| {
            let how = OpenHow {
                flags: (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
                mode: 0,
                resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
            };
            let fd = libc::syscall(
                SYS_OPENAT2,
                libc::AT_FDCWD,
                path.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            );
            check(Stage::Mount, fd);
            check(
                Stage::Mount,
                libc::syscall(SYS_FSCONFIG, fs, FSCONFIG_SET_FD, key.as_ptr(), null, fd),
            );
            libc::close(fd as RawFd);
        };
        for l in lowers {
            layer(c"lowerdir+", l);
        }
        if let Some((upper, work)) = upper_work {
            layer(c"upperdir", upper);
            layer(c"workdir", work);
        }
        // Overlay metadata in `user.overlay.*` xattrs: `trusted.*` needs privileges over the
        // whole host, which a user namespace never has.
        check(
            Stage::Mount,
            libc::syscall(
                SYS_FSCONFIG,
                fs,
                FSCONFIG_SET_FLAG,
                c"userxattr".as_ptr(),
                null,
                0,
            ),
        );
        check(
            Stage::Mount,
            libc::syscall(SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, null, null, 0),
        );
        let mnt = libc::syscall(
            SYS_FSMOUNT,
            fs,
            FSMOUNT_CLOEXEC,
            if upper_work.is_some() {
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
            } else {
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
            },
        );
        check(Stage::Mount, mnt);
        libc::close(fs as RawFd);
        mnt as RawFd
    }
}

/// Grants `access` beneath the object at `path` (as the child's mounts have it now) in the
/// run's Landlock ruleset (`FD_RULESET`). Child only.
fn add_rule_beneath(path: &CStr, access: u64) {
    // SAFETY: a valid C string and a live, packed rule struct; the O_PATH fd is closed before
    // returning.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_PATH | libc::O_CLOEXEC | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        );
        if fd < 0 {
            fail(Stage::Mount, errno());
        }
        let attr = LandlockPathBeneathAttr {
            allowed_access: access,
            parent_fd: fd,
        };
        check(
            Stage::Landlock,
            libc::syscall(
                SYS_LANDLOCK_ADD_RULE,
                FD_RULESET,
                LANDLOCK_RULE_PATH_BENEATH,
                &attr as *const LandlockPathBeneathAttr,
                0u32,
            ),
        );
        libc::close(fd);
    }
}

/// Signals pid 1 of a run (the one-shot init stage or a prepared call's init) forwards to every
/// process of its pid namespace. They stay blocked in pid 1 from the clone on (every signal
/// is blocked across `clone_namespaced`, and the zygote never unblocks any), so they are
/// queued for its `sigwaitinfo` instead of acting on it. `Cancel::signal` accepts exactly
/// these, plus SIGKILL (which kills pid 1 and with it the namespace).
pub(crate) const FORWARDED: [libc::c_int; 9] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGTERM,
    libc::SIGCONT,
    libc::SIGWINCH,
];

/// pid 1 of the sandbox. Never returns.
fn init_main(plan: &ChildPlan) -> ! {
    // SAFETY (whole function): only raw, async-signal-safe syscalls on prepared data.
    unsafe {
        // Die with the runner; the kernel then kills the whole pid namespace.
        libc::prctl(PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
        // 0–6, then the passed descriptors and the exec fd (spawn_init bounded their count).
        let mut fds = [-1 as RawFd; FD_LIST_MAX];
        fds[..FD_PASS_BASE as usize].copy_from_slice(&[
            plan.stdin,
            plan.stdout,
            plan.stderr,
            plan.err_w,
            plan.status_w,
            plan.sync_r,
            plan.ruleset,
        ]);
        let mut n = FD_PASS_BASE as usize;
        let mut keep = KEEP_STDIO;
        for fd in plan.pass.iter().take(MAX_PASS_FDS) {
            fds[n] = *fd;
            keep |= 1 << n;
            n += 1;
        }
        if plan.exec_fd >= 0 {
            fds[n] = plan.exec_fd;
            if plan.exec_fd_inherit {
                keep |= 1 << n;
            }
            n += 1;
        }
        arrange_fd_list_keeping(&fds[..n], keep, plan.err_w);
        let mut b = [0u8; 1];
        // Wait until the parent has placed us in a cgroup (EOF = parent gone).
        if libc::read(FD_SYNC, b.as_mut_ptr().cast(), 1) != 1 {
            fail(Stage::Sync, libc::ECANCELED);
        }
        libc::close(FD_SYNC);
        map_ids_and_mount(plan);

        // The tool shares init's memory until it execs (CLONE_VM | CLONE_VFORK, like
        // posix_spawn), on its own freshly mapped stack: no second copy of the runner's
        // address space.
        let stack = libc::mmap(
            std::ptr::null_mut(),
            TOOL_STACK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        );
        if stack == libc::MAP_FAILED {
            fail(Stage::Fork, errno());
        }
        let top = (stack as usize + TOOL_STACK_BYTES) & !0xf;
        let child = libc::clone(
            tool_entry,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            plan as *const ChildPlan as *mut libc::c_void,
        );
        if child < 0 {
            fail(Stage::Fork, errno());
        }
        let child = child as libc::pid_t;
        // The tool holds the error pipe until execve; drop ours so the parent sees EOF then.
        libc::close(FD_ERR);
        libc::close(FD_RULESET);
        libc::close(0);
        libc::close(1);
        libc::close(2);
        // The tool's copies of the passed descriptors and the exec fd are its own.
        if n > FD_PASS_BASE as usize {
            libc::syscall(
                SYS_CLOSE_RANGE,
                FD_PASS_BASE as libc::c_uint,
                libc::c_uint::MAX,
                0u32,
            );
        }
        wait_for_tool(child, StatusReport::Status)
    }
}

/// What pid 1 reports on `FD_STATUS` when the tool exits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StatusReport {
    /// The tool's raw wait status (4 bytes; the runner reaps pid 1 for the rusage).
    Status,
    /// The wait status, then user and system CPU time (µs) and peak RSS (KiB) of everything
    /// reaped (28 bytes; the runner cannot reap a prepared call's pid 1).
    StatusAndRusage,
}

/// pid 1's loop once the tool is forked (the one-shot init stage or a per-call init): every
/// signal is blocked since the clone; forwards [`FORWARDED`] ones to every process of the pid
/// namespace (pid 1 itself is exempt), reaps children, and when `tool` exits reports as
/// `report` says and exits, which kills every remaining process of the namespace. Child only.
fn wait_for_tool(tool: libc::pid_t, report: StatusReport) -> ! {
    // SAFETY (whole function): only raw, async-signal-safe syscalls on stack values.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
        loop {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let sig = libc::sigwaitinfo(&set, &mut info);
            if sig < 0 {
                continue;
            }
            if sig != libc::SIGCHLD {
                libc::kill(-1, sig);
                continue;
            }
            loop {
                let mut status = 0;
                let r = libc::wait4(
                    -1,
                    &mut status,
                    libc::WNOHANG | libc::__WALL,
                    std::ptr::null_mut(),
                );
                if r <= 0 {
                    break;
                }
                if r != tool {
                    continue;
                }
                let mut out = [0u8; 28];
                out[..4].copy_from_slice(&status.to_ne_bytes());
                let len = match report {
                    StatusReport::Status => 4,
                    StatusReport::StatusAndRusage => {
                        let mut ru: libc::rusage = std::mem::zeroed();
                        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
                        let us =
                            |t: libc::timeval| (t.tv_sec as u64) * 1_000_000 + t.tv_usec as u64;
                        out[4..12].copy_from_slice(&us(ru.ru_utime).to_ne_bytes());
                        out[12..20].copy_from_slice(&us(ru.ru_stime).to_ne_bytes());
                        out[20..].copy_from_slice(&(ru.ru_maxrss as u64).to_ne_bytes());
                        28
                    }
                };
                libc::write(FD_STATUS, out.as_ptr().cast(), len);
                libc::_exit(0);
            }
        }
    }
}

/// Stack size of the tool between clone and execve (raw syscalls only, small frames).
const TOOL_STACK_BYTES: usize = 256 * 1024;

/// Entry point of the tool on its own stack.
extern "C" fn tool_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `&ChildPlan` init passed to clone; init is suspended (CLONE_VFORK)
    // and the plan stays alive and unmodified until the tool execs or exits.
    let plan = unsafe { &*(arg as *const ChildPlan) };
    tool_main(plan)
}

/// Empties the capability bounding set (`0..=cap_last`; it can only shrink). Child only.
fn drop_bounding_set(cap_last: u32) {
    for cap in 0..=cap_last {
        // SAFETY: raw prctl on integer arguments.
        if unsafe { libc::prctl(PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } < 0 {
            fail(Stage::Capabilities, errno());
        }
    }
}

/// Whether `execve` will leave this process no capability although it still holds some: by
/// capabilities(7) the new permitted set is (inheritable & file inheritable) | (file permitted
/// & bounding) | ambient, and root's implicit full file sets do not apply under SECBIT_NOROOT.
/// So it suffices that the bounding set (`0..=cap_last`), the ambient set and the inheritable
/// set are empty and SECBIT_NOROOT is set and locked. Each is read back from the kernel.
/// Child only.
fn execve_drops_every_capability(cap_last: u32) -> bool {
    const SECBIT_NOROOT: libc::c_int = 1 << 0;
    const SECBIT_NOROOT_LOCKED: libc::c_int = 1 << 1;
    const PR_CAPBSET_READ: libc::c_int = 23;
    const PR_GET_SECUREBITS: libc::c_int = 27;
    const PR_CAP_AMBIENT_IS_SET: libc::c_ulong = 1;
    // SAFETY (whole function): raw prctl/capget on integer arguments and a stack buffer.
    unsafe {
        for cap in 0..=cap_last {
            if libc::prctl(PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) != 0 {
                return false;
            }
            if libc::prctl(
                PR_CAP_AMBIENT,
                PR_CAP_AMBIENT_IS_SET,
                cap as libc::c_ulong,
                0,
                0,
            ) != 0
            {
                return false;
            }
        }
        let bits = libc::prctl(PR_GET_SECUREBITS, 0, 0, 0, 0);
        if bits < 0
            || bits & (SECBIT_NOROOT | SECBIT_NOROOT_LOCKED) != SECBIT_NOROOT | SECBIT_NOROOT_LOCKED
        {
            return false;
        }
        let mut hdr = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let mut data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(
            libc::SYS_capget,
            &mut hdr as *mut CapHeader,
            data.as_mut_ptr(),
        ) < 0
        {
            return false;
        }
        data.iter().all(|d| d.inheritable == 0)
    }
}

/// Resets every signal disposition to the default (signals stay blocked). Child only.
fn reset_signal_dispositions() {
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: raw signal(2) with SIG_DFL; no handler is installed.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// The one-shot tool: the per-call sequence, including the once-per-session steps.
fn tool_main(plan: &ChildPlan) -> ! {
    restrict_and_exec(&ToolExec {
        rlimits: &plan.rlimits,
        cap_last: plan.cap_last,
        cwd: plan.cwd.as_ptr(),
        check_cwd: plan.check_cwd,
        landlock: plan.landlock,
        session: SessionSteps::InTool {
            cap_last: plan.cap_last,
        },
        filters: &plan.filters,
        fault: plan.fault,
        exe: plan.exe.as_ptr(),
        exec_fd: if plan.exec_fd >= 0 {
            FD_PASS_BASE + plan.pass.len() as RawFd
        } else {
            -1
        },
        argv: plan.argv.as_ptr(),
        envp: plan.envp.as_ptr(),
    })
}

/// Where the steps a prepared sandbox takes once per session happen.
#[derive(Clone, Copy)]
enum SessionSteps {
    /// In the tool (one-shot runs): empty the capability bounding set (`0..=cap_last`) and
    /// reset every signal disposition to the default.
    InTool { cap_last: u32 },
    /// Once in the zygote, inherited by every call.
    InZygote,
}

/// What the tool applies between its fork and `execve`: pointers into data prepared before the
/// clone (the one-shot plan, or a call's region in the zygote).
struct ToolExec<'a> {
    rlimits: &'a [(libc::__rlimit_resource_t, u64)],
    /// The highest capability number (`/proc/sys/kernel/cap_last_cap`).
    cap_last: u32,
    cwd: *const libc::c_char,
    /// `cwd` is not the workspace: check under Landlock that the tool may list it.
    check_cwd: bool,
    /// Restrict the tool with the ruleset at `FD_RULESET` (false: an unsandboxed run, no
    /// ruleset).
    landlock: bool,
    session: SessionSteps,
    /// BPF programs in installation order.
    filters: &'a [Vec<libc::sock_filter>],
    fault: ChildFault,
    exe: *const libc::c_char,
    /// Execute this fd (`execveat` with `AT_EMPTY_PATH`) instead of `exe`; -1: none.
    exec_fd: RawFd,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
}

/// The tool's fixed sequence, shared by both spawn paths (STYLE.md): fds ≥ 3 are already
/// closed except the close-on-exec error pipe and ruleset; then setsid, rlimits, chdir,
/// capabilities (bounding set, ambient set, locked securebits, then the three sets),
/// no_new_privs, Landlock `restrict_self` (skipped only for a run approved unsandboxed; then,
/// for a working directory other than the workspace, a check that the tool may list it),
/// signals (dispositions, then an empty mask), seccomp last, execve. Reports the failed stage
/// on the error pipe instead. Never returns.
fn restrict_and_exec(t: &ToolExec<'_>) -> ! {
    // SAFETY (whole function): only raw, async-signal-safe syscalls on prepared data.
    unsafe {
        libc::close(FD_STATUS);
        if libc::setsid() < 0 {
            fail(Stage::Setsid, errno());
        }
        for (res, v) in t.rlimits {
            let rl = libc::rlimit64 {
                rlim_cur: *v,
                rlim_max: *v,
            };
            if libc::setrlimit64(*res, &rl) < 0 {
                fail(Stage::Rlimit, errno());
            }
        }
        if libc::chdir(t.cwd) < 0 {
            fail(Stage::Chdir, errno());
        }
        if t.fault == ChildFault::CapDrop {
            fail(Stage::Capabilities, libc::EPERM);
        }
        if let SessionSteps::InTool { cap_last } = t.session {
            drop_bounding_set(cap_last);
        }
        if libc::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 {
            fail(Stage::Capabilities, errno());
        }
        if libc::prctl(PR_SET_SECUREBITS, SECURE_BITS_LOCKED, 0, 0, 0) < 0 {
            fail(Stage::Capabilities, errno());
        }
        let hdr = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capset, &hdr as *const CapHeader, data.as_ptr()) < 0 {
            // A service manager's filter may refuse capset (systemd counts it as
            // @privileged). execve then leaves the tool no capability, provided what makes
            // that so is verified here; otherwise the run fails as before.
            let e = errno();
            if e != libc::EPERM || !execve_drops_every_capability(t.cap_last) {
                fail(Stage::Capabilities, e);
            }
        }
        if libc::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 {
            fail(Stage::NoNewPrivs, errno());
        }
        if t.landlock {
            if t.fault == ChildFault::LandlockRestrict {
                fail(Stage::Landlock, libc::EINVAL);
            }
            check(
                Stage::Landlock,
                libc::syscall(SYS_LANDLOCK_RESTRICT_SELF, FD_RULESET, 0u32),
            );
        }
        // Closed either way: without a ruleset the number may hold anything inherited.
        libc::close(FD_RULESET);
        // A working directory other than the workspace must be listable under Landlock
        // (which has no chdir hook, but decides this open): the tool starts only where the
        // policy lets it look. The workspace itself is exempt: it may be a carved-out
        // directory without a rule of its own (a home holding secrets).
        if t.check_cwd {
            let dir = libc::open(
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            );
            if dir < 0 {
                fail(Stage::Chdir, errno());
            }
            libc::close(dir);
        }
        // Default dispositions first (signals are still blocked), then an empty mask.
        if let SessionSteps::InTool { .. } = t.session {
            reset_signal_dispositions();
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        if libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) < 0 {
            fail(Stage::Signals, errno());
        }
        // seccomp last.
        for f in t.filters {
            let (ptr, len) = if t.fault == ChildFault::SeccompInstall {
                (std::ptr::null_mut(), 0u16)
            } else {
                (f.as_ptr() as *mut libc::sock_filter, f.len() as u16)
            };
            let prog = libc::sock_fprog { len, filter: ptr };
            check(
                Stage::Seccomp,
                libc::syscall(
                    libc::SYS_seccomp,
                    SECCOMP_SET_MODE_FILTER,
                    0u32,
                    &prog as *const libc::sock_fprog,
                ),
            );
        }
        if t.exec_fd >= 0 {
            libc::syscall(
                libc::SYS_execveat,
                t.exec_fd,
                c"".as_ptr(),
                t.argv,
                t.envp,
                libc::AT_EMPTY_PATH,
            );
        } else {
            libc::execve(t.exe, t.argv, t.envp);
        }
        fail(Stage::Exec, errno());
    }
}

/// The init stage's [`MountStep::Hide`]. Child only (raw syscalls on prepared data).
fn hide(path: &CStr, dir: bool) {
    const LOCKED: libc::c_ulong =
        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: valid C strings; raw mount(2) calls in the child's own mount namespace.
    let r = unsafe {
        if dir {
            libc::mount(
                c"tmpfs".as_ptr(),
                path.as_ptr(),
                c"tmpfs".as_ptr(),
                LOCKED,
                c"size=4096,nr_inodes=2,mode=0".as_ptr().cast(),
            )
        } else {
            libc::mount(
                c"/dev/null".as_ptr(),
                path.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        }
    };
    if r < 0 {
        let e = errno();
        if e == libc::ENOENT {
            return;
        }
        fail(Stage::Mount, e);
    }
    if !dir {
        mount_setattr(
            libc::AT_FDCWD,
            path.as_ptr(),
            0,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        );
    }
}

/// The init stage's [`MountStep::PrivateTmpfs`]: mount, then add the Landlock rule for the new
/// root through the inherited ruleset fd. Child only (raw syscalls, no allocation).
fn mount_private_tmpfs(path: &CStr, options: &CStr, rule_access: u64) {
    // SAFETY: valid C strings; a raw mount(2) in the child's own mount namespace.
    unsafe {
        check(
            Stage::Mount,
            libc::mount(
                c"tmpfs".as_ptr(),
                path.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                options.as_ptr().cast(),
            ) as libc::c_long,
        );
    }
    if rule_access != 0 {
        add_rule_beneath(path, rule_access);
    }
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

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: `(dev, ino, is_dir, is_symlink)`, for one
/// component.
pub(crate) fn lstat_at(dir: RawFd, name: &Path) -> io::Result<(u64, u64, bool, bool)> {
    let c = cstring(name)?;
    // SAFETY: zeroed plain data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer; the kernel validates the fd.
    if unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } < 0 {
        return Err(io::Error::last_os_error());
    }
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
    let c = cstring(name)?;
    // SAFETY: zeroed plain data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer; the kernel validates the fd.
    if unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_mode)
}

/// The entries of an open directory (`.` and `..` left out), read with `getdents64` from the
/// fd's current offset (a freshly opened directory: from the start; no `/proc` round trip):
/// `(name, is_dir, is_symlink)`. Entries whose type the file system does not report are
/// looked up with [`lstat_at`]; ones that vanish in between are left out.
pub(crate) fn dir_entries(dir: &OwnedFd) -> io::Result<Vec<(std::ffi::OsString, bool, bool)>> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
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
            return Ok(out);
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
            let (is_dir, is_link) = match d_type {
                libc::DT_DIR => (true, false),
                libc::DT_LNK => (false, true),
                libc::DT_UNKNOWN => match lstat_at(dir.as_raw_fd(), Path::new(name)) {
                    Ok((_, _, d, l)) => (d, l),
                    Err(_) => continue,
                },
                _ => (false, false),
            };
            out.push((name.to_os_string(), is_dir, is_link));
        }
    }
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
/// a memfd passed as the sixth fd when `in_memfd` is 1): exe, cwd, argv…, env…, each
/// NUL-terminated. The fds passed with it: stdin, stdout, stderr, error pipe, status pipe,
/// the payload memfd (if `in_memfd`), and a Landlock ruleset of the call's own (if
/// `own_ruleset` is 1: a simulated lower ABI, tests only) that replaces the session's.
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
}

impl CallHeader {
    /// The header as the zygote reads it (`#[repr(C)]`: eight `u32` fields, no padding).
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
/// Most strings (exe, cwd, argv, env) in one call.
pub(crate) const MAX_STRINGS: usize = 1 << 16;
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

/// Starts the zygote: pid 1 of new user, pid, mount and IPC namespaces, which sets up the
/// session's mounts once and then serves call requests. Every signal stays blocked in the
/// zygote (it waits for SIGCHLD with a signalfd). Returns `(pid, pidfd)`.
pub(crate) fn spawn_zygote(z: &ZygotePlan) -> io::Result<(libc::pid_t, OwnedFd)> {
    clone_namespaced(&z.base.mounts, zygote_main, z)
}

/// Moves `src[i]` to fd `i` (skipping negative entries; stdio without close-on-exec, the rest
/// with it) and closes every fd from `src.len()` up. An fd already in place only gets its
/// close-on-exec flag set (one syscall instead of two: call fds often arrive in place).
/// Child only.
fn arrange_fd_list(src: &[RawFd], report: RawFd) {
    arrange_fd_list_keeping(src, KEEP_STDIO, report);
}

/// [`arrange_fd_list`], with the slots whose bit is set in `keep` (at most [`FD_LIST_MAX`]
/// slots) left open across `execve` instead of stdio. Child only.
fn arrange_fd_list_keeping(src: &[RawFd], keep: u32, report: RawFd) {
    // Before the layout is in place, failures go to `report` (FD_ERR may be anything yet).
    let bail = |err: i32| -> ! {
        let mut msg = [0u8; 8];
        msg[..4].copy_from_slice(&(Stage::FdLayout as u32).to_ne_bytes());
        msg[4..].copy_from_slice(&err.to_ne_bytes());
        // SAFETY: raw write/_exit.
        unsafe {
            libc::write(report, msg.as_ptr().cast(), msg.len());
            libc::_exit(126)
        }
    };
    let kept = |i: usize| keep & (1 << i) != 0;
    let mut tmp = [-1 as RawFd; FD_LIST_MAX];
    if src.len() > tmp.len() {
        bail(libc::EINVAL);
    }
    for (i, fd) in src.iter().enumerate().take(tmp.len()) {
        if *fd < 0 {
            continue;
        }
        if *fd == i as RawFd {
            // In place: the second loop only writes to indices of sources that are not in
            // place, so this fd is never clobbered.
            let flags = if kept(i) { 0 } else { libc::FD_CLOEXEC };
            // SAFETY: F_SETFD on an fd this process holds.
            if unsafe { libc::fcntl(*fd, libc::F_SETFD, flags) } < 0 {
                bail(errno());
            }
            continue;
        }
        // SAFETY: F_DUPFD_CLOEXEC picks the lowest free fd >= 100, never clobbering one.
        let n = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 100) };
        if n < 0 {
            bail(errno());
        }
        tmp[i] = n;
    }
    for (i, fd) in tmp.iter().enumerate().take(src.len()) {
        if *fd < 0 {
            continue;
        }
        let flags = if kept(i) { 0 } else { libc::O_CLOEXEC };
        // SAFETY: dup3 onto a fixed number; the old target (if any) is closed atomically.
        if unsafe { libc::dup3(*fd, i as RawFd, flags) } < 0 {
            fail(Stage::FdLayout, errno());
        }
    }
    // SAFETY: closes every fd from src.len() upwards, including the temporaries.
    check(Stage::FdLayout, unsafe {
        libc::syscall(
            SYS_CLOSE_RANGE,
            src.len() as libc::c_uint,
            libc::c_uint::MAX,
            0u32,
        )
    });
}

/// The zygote. Never returns; exits when the control socket reaches EOF (the runner dropped
/// the `Prepared` or died), which makes the kernel kill every process of its namespace.
fn zygote_main(z: &ZygotePlan) -> ! {
    // SAFETY (whole function): only raw, async-signal-safe syscalls on prepared data and on
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
    // SAFETY (whole function): raw socket calls on stack buffers and the zygote's own
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
    // SAFETY (whole function): `buf` holds CALL_HDR + MAX_PAYLOAD bytes of which `n` were
    // received; the region is mapped here with room
    // for both stacks, the Call, the pointer array and the payload; every index below is
    // bounds-checked against those sizes first.
    unsafe {
        let hdr = std::ptr::read_unaligned(buf as *const CallHeader);
        let memfd = hdr.in_memfd == 1;
        let own_ruleset = hdr.own_ruleset == 1;
        let len = hdr.payload_len as usize;
        let strings = 2 + hdr.argc as usize + hdr.envc as usize;
        if hdr.magic != CALL_MAGIC
            || fds.len() != CALL_FDS + usize::from(memfd) + usize::from(own_ruleset)
            || hdr.argc == 0
            || len > MAX_PAYLOAD
            || strings > MAX_STRINGS
        {
            return libc::EINVAL;
        }
        if !memfd && n - CALL_HDR != len {
            return libc::EINVAL;
        }
        let call_off = CALL_INIT_STACK_BYTES + TOOL_STACK_BYTES;
        let ptrs_off = call_off + std::mem::size_of::<Call<'_>>().next_multiple_of(16);
        let data_off = ptrs_off + strings * std::mem::size_of::<usize>();
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
        // Split the payload into NUL-terminated strings: exe, cwd, argv…, env….
        let mut pos = 0usize;
        let mut exe = std::ptr::null();
        let mut cwd = std::ptr::null();
        let argc = hdr.argc as usize;
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
                // argv at ptrs[0..argc], NULL, env at ptrs[argc+1..], NULL.
                _ if s - 2 < argc => *ptrs.add(s - 2) = start,
                _ => *ptrs.add(s - 1) = start,
            }
        }
        if pos != len {
            return unmap(libc::EINVAL);
        }
        *ptrs.add(argc) = std::ptr::null();
        *ptrs.add(strings - 1) = std::ptr::null();
        let call = base.add(call_off) as *mut Call<'_>;
        call.write(Call {
            z,
            fds: [fds[0], fds[1], fds[2], fds[3], fds[4]],
            exe,
            cwd,
            check_cwd: hdr.check_cwd == 1,
            argv: ptrs,
            envp: ptrs.add(argc + 1),
            fault: hdr.fault,
            ruleset: if own_ruleset {
                fds[CALL_FDS + usize::from(memfd)]
            } else {
                FD_RULESET
            },
            tool_stack_top: (base.add(call_off) as usize) & !0xf,
        });
        let init_top = (base.add(CALL_INIT_STACK_BYTES) as usize) & !0xf;
        let pid = libc::clone(
            call_init_entry,
            init_top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_NEWPID | CLONE_PIDFD as libc::c_int | libc::SIGCHLD,
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
    // SAFETY (whole function): only raw, async-signal-safe syscalls on prepared data.
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

/// Probes whether `ptrace` reaches the kernel, without side effects: an unknown request for
/// pid -1 (no such process), so ESRCH means the call reached the kernel.
pub(crate) fn probe_ptrace() -> io::Result<()> {
    // SAFETY: no pointers are dereferenced (addr and data are 0); pid -1 names no process.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_ptrace,
            -1 as libc::c_long,
            -1 as libc::c_long,
            0,
            0,
        )
    })
    .map(drop)
}

/// Probes whether `io_uring_setup` reaches the kernel, without side effects: 0 entries and a
/// NULL parameter block (EINVAL or EFAULT when it does; nothing is created).
pub(crate) fn probe_io_uring_setup() -> io::Result<()> {
    // SAFETY: the kernel rejects the NULL pointer / zero size before creating anything.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_io_uring_setup,
            0u32,
            std::ptr::null_mut::<libc::c_void>(),
        )
    })?;
    // Cannot happen with these arguments; never leak an fd if it does.
    // SAFETY: a new fd owned by nobody else.
    drop(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
    Ok(())
}

/// Probes whether `bpf` reaches the kernel, without side effects: an unknown command with a
/// NULL, zero-sized attribute (EINVAL when it does).
pub(crate) fn probe_bpf() -> io::Result<()> {
    // SAFETY: no attribute is read (size 0); the command number is invalid.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_bpf,
            -1 as libc::c_int,
            std::ptr::null_mut::<libc::c_void>(),
            0u32,
        )
    })
    .map(drop)
}

/// Probes whether `socketpair(AF_UNIX, SOCK_STREAM)` works (both ends closed at once).
pub(crate) fn probe_socketpair() -> io::Result<()> {
    socketpair().map(drop)
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
