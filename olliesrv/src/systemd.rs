//! The service manager's side of running under systemd: sockets passed by socket activation
//! (`LISTEN_FDS`), and readiness and stop notifications (`NOTIFY_SOCKET`). Logging in the
//! journal's format is `ollie_link::logging`.
//!
//! [`Environment::take`] runs first thing in `main`. It marks every passed descriptor
//! close-on-exec, so no child inherits a listening socket; the variables themselves reach no
//! child either, since toolsrv starts with a cleared environment.
//!
//! Protocol facts (sd_listen_fds(3), sd_notify(3)): passed descriptors start at 3 and are
//! `LISTEN_FDS` in number, meant for the process whose pid is `LISTEN_PID`; a variable meant
//! for another pid is ignored (it was inherited). `NOTIFY_SOCKET` is a datagram socket path,
//! or an abstract name when it starts with `@`.
//!
//! [`Environment::take`]: crate::systemd::Environment::take

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;

use nix::sys::socket::{AddressFamily, SockaddrLike, SockaddrStorage, getsockname, sockopt};

/// The first descriptor systemd passes.
const LISTEN_FDS_START: RawFd = 3;
/// More than any unit would pass; a larger count is a broken environment, not a request.
const LISTEN_FDS_MAX: usize = 64;

/// What was wrong with the passed sockets (a unit configuration error; the server does not
/// start).
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error("LISTEN_FDS={0:?} is not a count of descriptors (1..={LISTEN_FDS_MAX})")]
    BadCount(String),
    #[error(
        "passed descriptor {fd} is not a listening stream socket (use ListenStream= in the socket unit): {why}"
    )]
    NotListening { fd: RawFd, why: String },
    #[error(
        "passed descriptor {fd} is a {family} socket; olliesrv serves unix and TCP stream sockets"
    )]
    Family { fd: RawFd, family: String },
}

/// A socket the service manager passed.
#[derive(Debug)]
pub enum Activated {
    Unix(std::os::unix::net::UnixListener),
    Tcp(std::net::TcpListener),
}

impl Activated {
    /// The address in dial syntax (`unix!/run/ollie/ollie`, `tcp!0.0.0.0!5640`).
    pub fn describe(&self) -> String {
        match self {
            Activated::Unix(l) => match l.local_addr() {
                Ok(a) => match a.as_pathname() {
                    Some(p) => format!("unix!{}", p.display()),
                    None => "unix!(unnamed)".to_owned(),
                },
                Err(_) => "unix!(unknown)".to_owned(),
            },
            Activated::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("tcp!{}!{}", a.ip(), a.port()),
                Err(_) => "tcp!(unknown)".to_owned(),
            },
        }
    }
}

/// What the service manager handed this process.
#[derive(Debug, Default)]
pub struct Environment {
    /// Sockets passed by socket activation, in order.
    pub sockets: Vec<Activated>,
    /// Where readiness and stop notifications go.
    pub notify: Option<Notifier>,
}

impl Environment {
    /// Reads `LISTEN_PID`, `LISTEN_FDS` and `NOTIFY_SOCKET`, and takes
    /// ownership of the passed descriptors (marking them close-on-exec). Call it once, first
    /// thing in `main`. The variables stay set but reach no child: toolsrv starts with a
    /// cleared environment.
    pub fn take() -> Result<Environment, ActivationError> {
        let pid = std::env::var("LISTEN_PID").ok();
        let count = std::env::var("LISTEN_FDS").ok();
        let mut env = Environment {
            notify: std::env::var_os("NOTIFY_SOCKET").and_then(|s| Notifier::new(&s)),
            ..Environment::default()
        };
        // Descriptors meant for another process (the variables were inherited) are not ours.
        let ours = pid
            .as_deref()
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|p| p == std::process::id());
        let Some(count) = count.filter(|_| ours) else {
            return Ok(env);
        };
        let n = count
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=LISTEN_FDS_MAX).contains(n))
            .ok_or_else(|| ActivationError::BadCount(count.clone()))?;
        let mut fds = listenfd::ListenFd::from_env();
        for i in 0..n {
            env.sockets
                .push(take_one(&mut fds, i, LISTEN_FDS_START + i as RawFd)?);
        }
        Ok(env)
    }
}

/// Takes passed descriptor `idx` (`fd`): it must be a listening stream socket, unix or TCP.
/// It is marked close-on-exec so that no child inherits it.
fn take_one(
    fds: &mut listenfd::ListenFd,
    idx: usize,
    fd: RawFd,
) -> Result<Activated, ActivationError> {
    let not = |why: String| ActivationError::NotListening { fd, why };
    let addr: SockaddrStorage =
        getsockname(fd).map_err(|e| not(format!("not a socket ({})", e.desc())))?;
    let taken = match addr.family() {
        Some(AddressFamily::Unix) => fds.take_unix_listener(idx).map(|l| l.map(Activated::Unix)),
        Some(AddressFamily::Inet | AddressFamily::Inet6) => {
            fds.take_tcp_listener(idx).map(|l| l.map(Activated::Tcp))
        }
        other => {
            return Err(ActivationError::Family {
                fd,
                family: other.map_or_else(|| "unknown".to_owned(), |f| format!("{f:?}")),
            });
        }
    };
    let a = taken
        .map_err(|e| not(e.to_string()))?
        .ok_or_else(|| not("not passed to this process".to_owned()))?;
    check(a)
}

/// Checks that a socket listens and marks it close-on-exec.
fn check(a: Activated) -> Result<Activated, ActivationError> {
    let fd = match &a {
        Activated::Unix(l) => l.as_fd(),
        Activated::Tcp(l) => l.as_fd(),
    };
    let raw = fd.as_raw_fd();
    let not = |why: String| ActivationError::NotListening { fd: raw, why };
    let listening = nix::sys::socket::getsockopt(&fd, sockopt::AcceptConn)
        .map_err(|e| not(e.desc().to_owned()))?;
    if !listening {
        return Err(not("not listening".to_owned()));
    }
    nix::fcntl::fcntl(
        raw,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|e| not(format!("cannot set close-on-exec: {}", e.desc())))?;
    Ok(a)
}

/// Sends sd_notify(3) messages to the service manager.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    addr: std::os::unix::net::SocketAddr,
}

impl Notifier {
    fn new(path: &std::ffi::OsStr) -> Option<Notifier> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_bytes();
        let addr = match bytes.split_first() {
            Some((b'@', name)) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(name).ok()?
            }
            Some((b'/', _)) => std::os::unix::net::SocketAddr::from_pathname(path).ok()?,
            _ => return None,
        };
        let socket = UnixDatagram::unbound().ok()?;
        Some(Notifier { socket, addr })
    }

    /// Sends one notification (`READY=1`, `STOPPING=1`, `STATUS=…`, newline-separated).
    /// Failures are logged, never fatal: the manager may have gone away.
    pub fn send(&self, state: &str) {
        if let Err(e) = self.socket.send_to_addr(state.as_bytes(), &self.addr) {
            tracing::warn!(error = %e, "cannot notify the service manager");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listening_unix_socket_is_taken_and_made_close_on_exec() {
        let dir = tempfile::tempdir().unwrap();
        let l = std::os::unix::net::UnixListener::bind(dir.path().join("s")).unwrap();
        let raw = l.as_raw_fd();
        // Clear CLOEXEC the way an activated descriptor arrives.
        nix::fcntl::fcntl(
            raw,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .unwrap();
        let a = check(Activated::Unix(l)).unwrap();
        let flags = nix::fcntl::fcntl(raw, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert!(
            nix::fcntl::FdFlag::from_bits_truncate(flags).contains(nix::fcntl::FdFlag::FD_CLOEXEC)
        );
        assert!(matches!(a, Activated::Unix(_)));
        assert_eq!(
            a.describe(),
            format!("unix!{}", dir.path().join("s").display())
        );
    }

    #[test]
    fn a_tcp_listener_is_taken_as_tcp() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let a = check(Activated::Tcp(l)).unwrap();
        assert!(matches!(a, Activated::Tcp(_)));
        assert_eq!(a.describe(), format!("tcp!127.0.0.1!{port}"));
    }

    #[test]
    fn a_bound_socket_that_does_not_listen_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        // A unix socket bound but never listening (what a wrong unit could pass).
        let s = nix::sys::socket::socket(
            AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::empty(),
            None,
        )
        .unwrap();
        let addr = nix::sys::socket::UnixAddr::new(&dir.path().join("s")).unwrap();
        nix::sys::socket::bind(s.as_raw_fd(), &addr).unwrap();
        let l = std::os::unix::net::UnixListener::from(s);
        let e = check(Activated::Unix(l)).unwrap_err().to_string();
        assert!(e.contains("not listening"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn notifications_reach_a_path_and_an_abstract_socket() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("notify");
        let rx = UnixDatagram::bind(&p).unwrap();
        let n = Notifier::new(p.as_os_str()).unwrap();
        n.send("READY=1\nSTATUS=serving");
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("ollie-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier::new(std::ffi::OsStr::new(&format!("@{name}"))).unwrap();
        n.send("STOPPING=1");
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1");
        // Neither a path nor an abstract name: no notifier.
        assert!(Notifier::new(std::ffi::OsStr::new("relative")).is_none());
        assert!(Notifier::new(std::ffi::OsStr::new("")).is_none());
    }
}
