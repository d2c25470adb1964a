//! Dial strings (`unix!/path`, `tcp!host!port`) and plan9port's default namespace directory.

use std::path::PathBuf;

/// Where to reach (or listen for) a 9P server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    /// A unix-domain socket path.
    Unix(PathBuf),
    /// A TCP host and port.
    Tcp { host: String, port: u16 },
}

/// The default 9P TCP port.
pub const DEFAULT_TCP_PORT: u16 = 564;

/// Why a dial string could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("bad address {addr:?}: {why} (use unix!/path/to/socket or tcp!host!port)")]
pub struct AddrError {
    pub addr: String,
    pub why: &'static str,
}

impl Addr {
    /// Parses `unix!PATH`, `tcp!HOST!PORT`, `tcp!HOST` (port 564), or a bare path (starting
    /// with `/` or `.`) meaning a unix socket.
    pub fn parse(s: &str) -> Result<Addr, AddrError> {
        let err = |why| AddrError {
            addr: s.to_owned(),
            why,
        };
        if s.starts_with('/') || s.starts_with('.') {
            return Ok(Addr::Unix(PathBuf::from(s)));
        }
        let mut parts = s.splitn(3, '!');
        let net = parts.next().unwrap_or("");
        match net {
            "unix" => {
                let path = parts.next().ok_or_else(|| err("missing socket path"))?;
                let rest = parts.next();
                let path = match rest {
                    Some(r) => format!("{path}!{r}"),
                    None => path.to_owned(),
                };
                if path.is_empty() {
                    return Err(err("missing socket path"));
                }
                Ok(Addr::Unix(PathBuf::from(path)))
            }
            "tcp" => {
                let host = parts.next().ok_or_else(|| err("missing host"))?;
                if host.is_empty() {
                    return Err(err("missing host"));
                }
                let port = match parts.next() {
                    None => DEFAULT_TCP_PORT,
                    Some(p) => p
                        .parse()
                        .map_err(|_| err("port must be a number 1-65535"))?,
                };
                if port == 0 {
                    return Err(err("port must be a number 1-65535"));
                }
                // `tcp!*!PORT` means every address, as in plan9port.
                let host = if host == "*" { "0.0.0.0" } else { host };
                Ok(Addr::Tcp {
                    host: host.to_owned(),
                    port,
                })
            }
            _ => Err(err("unknown network")),
        }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Unix(p) => write!(f, "unix!{}", p.display()),
            Addr::Tcp { host, port } => write!(f, "tcp!{host}!{port}"),
        }
    }
}

/// The current user's login name: `$USER`, else the password database, else the uid.
pub fn current_user() -> String {
    if let Ok(u) = std::env::var("USER")
        && !u.is_empty()
    {
        return u;
    }
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(u)) => u.name,
        _ => uid.to_string(),
    }
}

/// plan9port's namespace directory: `$NAMESPACE`, else `/tmp/ns.$USER.$DISPLAY` with DISPLAY
/// defaulting to `:0` and a trailing `.0` screen number removed.
pub fn namespace_dir() -> PathBuf {
    if let Ok(ns) = std::env::var("NAMESPACE")
        && !ns.is_empty()
    {
        return PathBuf::from(ns);
    }
    let display = std::env::var("DISPLAY").unwrap_or_default();
    PathBuf::from(format!(
        "/tmp/ns.{}.{}",
        current_user(),
        canonical_display(&display)
    ))
}

/// The server a client dials when given no address: `$NAMESPACE/ollie` when `NAMESPACE` is
/// set; otherwise the first socket that exists of the plan9port default
/// (`/tmp/ns.$USER.$DISPLAY/ollie`), the user service's (`$XDG_RUNTIME_DIR/ollie/ollie`) and
/// the system service's (`/run/ollie/ollie`); with none, the plan9port default (so the
/// connection error names it).
pub fn default_server() -> Addr {
    let plan9 = namespace_dir().join("ollie");
    if std::env::var("NAMESPACE").is_ok_and(|ns| !ns.is_empty()) {
        return Addr::Unix(plan9);
    }
    let mut candidates = vec![plan9.clone()];
    if let Some(rt) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        candidates.push(PathBuf::from(rt).join("ollie").join("ollie"));
    }
    candidates.push(PathBuf::from("/run/ollie/ollie"));
    Addr::Unix(pick_socket(candidates).unwrap_or(plan9))
}

/// The first of `candidates` that is a socket.
fn pick_socket(candidates: Vec<PathBuf>) -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    candidates
        .into_iter()
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket()))
}

fn canonical_display(d: &str) -> String {
    let d = if d.is_empty() { ":0" } else { d };
    let d = d.rsplit('/').next().unwrap_or(d);
    match d.rfind(':') {
        Some(i) => {
            let after = &d[i + 1..];
            let digits = after.chars().take_while(char::is_ascii_digit).count();
            if &after[digits..] == ".0" {
                d[..i + 1 + digits].to_owned()
            } else {
                d.to_owned()
            }
        }
        None => d.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_existing_socket_is_picked() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("file");
        std::fs::write(&plain, "").unwrap();
        let sock = dir.path().join("sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let missing = dir.path().join("missing");
        // A missing path and a regular file are passed over.
        assert_eq!(
            pick_socket(vec![missing.clone(), plain.clone(), sock.clone()]),
            Some(sock.clone())
        );
        assert_eq!(pick_socket(vec![missing, plain]), None);
    }

    #[test]
    fn parses_dial_strings() {
        assert_eq!(
            Addr::parse("unix!/tmp/x").unwrap(),
            Addr::Unix("/tmp/x".into())
        );
        assert_eq!(Addr::parse("/tmp/y").unwrap(), Addr::Unix("/tmp/y".into()));
        assert_eq!(
            Addr::parse("tcp!127.0.0.1!5640").unwrap(),
            Addr::Tcp {
                host: "127.0.0.1".into(),
                port: 5640
            }
        );
        assert_eq!(
            Addr::parse("tcp!localhost").unwrap(),
            Addr::Tcp {
                host: "localhost".into(),
                port: 564
            }
        );
        for bad in [
            "",
            "udp!x!1",
            "tcp!",
            "tcp!h!99999",
            "tcp!h!0",
            "unix!",
            "tcp!h!x",
        ] {
            let e = Addr::parse(bad).unwrap_err();
            assert!(e.to_string().contains("unix!"), "{e}");
        }
        assert_eq!(
            Addr::parse("tcp!127.0.0.1!5640").unwrap().to_string(),
            "tcp!127.0.0.1!5640"
        );
    }

    #[test]
    fn display_is_canonical() {
        assert_eq!(canonical_display(""), ":0");
        assert_eq!(canonical_display(":0.0"), ":0");
        assert_eq!(canonical_display(":1"), ":1");
        assert_eq!(canonical_display("host:10.1"), "host:10.1");
        assert_eq!(canonical_display("/tmp/launch-x/org.x:0"), "org.x:0");
    }
}
