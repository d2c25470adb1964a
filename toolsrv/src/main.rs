//! `toolsrv`: see the crate documentation. Normally started by olliesrv, never by hand:
//!
//! ```text
//! toolsrv [--link-fd 3] [--boot-fd 4]   9P on the inherited link; boot message on the fd
//! toolsrv --stdio                       boot message, then 9P, on stdin/stdout (remote)
//! ```
//!
//! Exit status: 0 when the link closed, 2 for a bad boot message or configuration, 1 when
//! hardening or serving failed.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::process::ExitCode;
use std::sync::Arc;

use ollie_p9::Server;
use ollie_p9::server::{DEFAULT_MAX_MSIZE, Limits};
use ollie_sandbox::harden::{ServerHardening, harden_server};
use ollie_toolsrv::fs::ToolFs;
use ollie_toolsrv::session::Session;
use ollie_toolsrv::{boot, error_chain};
use std::os::fd::AsRawFd;

const USAGE: &str = "\
usage: toolsrv [--link-fd N] [--boot-fd N]
       toolsrv --stdio

ollie's per-session tool server, started by olliesrv. Serves one session's tools over
9P2000 with Tauth: the link is an inherited fd (default 3), the master key and the
session's configuration arrive on a second fd (default 4) — or, with --stdio, the boot
message and then 9P on stdin/stdout (remote sessions over ssh). Every tool runs in the
sandbox under its agent's policy.

exit status: 0 when the link closed, 2 for bad arguments, boot message or
configuration, 1 when hardening or serving failed.
";

/// Command-line arguments (three flags: a parser crate would cost more resident memory than
/// everything else toolsrv keeps).
#[derive(Debug, PartialEq, Eq)]
struct Args {
    link_fd: i32,
    boot_fd: i32,
    stdio: bool,
}

enum Parsed {
    Run(Args),
    Help,
    Version,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Parsed, String> {
    let mut a = Args {
        link_fd: 3,
        boot_fd: 4,
        stdio: false,
    };
    let mut fd_given = false;
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "-V" | "--version" => return Ok(Parsed::Version),
            "--stdio" if inline.is_none() => a.stdio = true,
            "--link-fd" | "--boot-fd" => {
                let v = inline
                    .or_else(|| it.next())
                    .ok_or_else(|| format!("{flag} needs a number"))?;
                let n: i32 = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= 0)
                    .ok_or_else(|| format!("{flag}: {v:?} is not an fd number"))?;
                if flag == "--link-fd" {
                    a.link_fd = n;
                } else {
                    a.boot_fd = n;
                }
                fd_given = true;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.stdio && fd_given {
        return Err("--stdio takes no fd arguments".into());
    }
    Ok(Parsed::Run(a))
}

/// The log level from `RUST_LOG` (a level name; default `warn`).
fn log_level() -> tracing::Level {
    match std::env::var("RUST_LOG").ok().as_deref().map(str::trim) {
        Some("error") => tracing::Level::ERROR,
        Some("info") => tracing::Level::INFO,
        Some("debug") => tracing::Level::DEBUG,
        Some("trace") => tracing::Level::TRACE,
        _ => tracing::Level::WARN,
    }
}

/// `$HOME` if absolute, else the passwd entry's home of the user we run as.
fn own_home() -> Option<std::path::PathBuf> {
    if let Some(h) = std::env::var_os("HOME").map(std::path::PathBuf::from)
        && h.is_absolute()
    {
        return Some(h);
    }
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.dir)
        .filter(|d| d.is_absolute())
}

fn fail(code: u8, what: &str, e: &dyn std::error::Error) -> ExitCode {
    eprintln!("toolsrv: {what}: {}", error_chain(e));
    ExitCode::from(code)
}

/// The single-threaded runtime, with malloc held to one arena first: the runtime is one
/// thread and the few threads beside it (blocking work) allocate little, so every session's
/// process keeps one arena resident instead of one per thread that ever allocated.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    if let Err(e) = ollie_malloc::limit_arenas(1) {
        tracing::debug!(error = %e, "malloc arenas not limited");
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Parsed::Run(a)) => a,
        Ok(Parsed::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Version) => {
            println!("toolsrv {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("toolsrv: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // Everything up to the runtime happens on this one thread.
    let inherited = if args.stdio {
        [0, 1]
    } else {
        [args.link_fd, args.boot_fd]
    };
    let [first, second] =
        match ollie_sandbox::dup_inherited_fds(&inherited).map(<[OwnedFd; 2]>::try_from) {
            Ok(Ok(fds)) => fds,
            Ok(Err(_)) => return fail(2, "inherited fds", &std::io::Error::other("wrong count")),
            Err(e) => return fail(2, "inherited fds", &e),
        };
    let (link_in, link_out, boot_res) = if args.stdio {
        // The boot message comes first on stdin (read exactly, nothing more), then 9P.
        let mut f = std::fs::File::from(first);
        let b = boot::decode(&mut f);
        (OwnedFd::from(f), Some(second), b)
    } else {
        let mut f = std::fs::File::from(second);
        let mut buf = Vec::new();
        let b = match (&mut f)
            .take((boot::MAX_CONFIG + 1024) as u64)
            .read_to_end(&mut buf)
        {
            Ok(_) => boot::decode(&mut buf.as_slice()),
            Err(e) => Err(boot::BootError::Io(e)),
        };
        (first, None, b)
    };
    let (key, mut bootstrap) = match boot_res {
        Ok(x) => x,
        Err(e) => return fail(2, "boot", &e),
    };
    if bootstrap.home.as_os_str().is_empty() {
        // A remote session: the home of the user we run as, on this host.
        match own_home() {
            Some(h) => bootstrap.home = h,
            None => {
                return fail(
                    2,
                    "configuration",
                    &std::io::Error::other(
                        "home: none given, $HOME is unset and the user has no passwd entry",
                    ),
                );
            }
        }
    }
    let session = match Session::new(bootstrap) {
        Ok(s) => Arc::new(s),
        Err(e) => return fail(2, "configuration", &e),
    };
    let mut keep = vec![link_in.as_raw_fd()];
    if let Some(w) = &link_out {
        keep.push(w.as_raw_fd());
    }
    let record = match harden_server(&ServerHardening {
        keep_fds: keep,
        allow_inet: session.needs_inet(),
    }) {
        Ok(r) => r,
        Err(e) => return fail(1, "hardening", &e),
    };
    ollie_link::logging::init(
        tracing_subscriber::filter::LevelFilter::from(log_level()),
        false,
    );
    tracing::debug!(hardening = ?record, session = %session.id, "hardened");
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return fail(1, "runtime", &e),
    };
    let fs = Arc::new(ToolFs::new(Arc::clone(&session), key));
    // The link carries every olliesrv client's fids and blocked reads for this session: the
    // link limits, not an interactive server's.
    let srv = Server::with_limits(fs, DEFAULT_MAX_MSIZE, Limits::link());
    let served = rt.block_on(async {
        let r = match link_out {
            None => {
                srv.serve_unix_stream(std::os::unix::net::UnixStream::from(link_in))
                    .await
            }
            Some(w) => {
                let r = tokio::fs::File::from_std(std::fs::File::from(link_in));
                let w = tokio::fs::File::from_std(std::fs::File::from(w));
                let info = ollie_p9::ConnInfo {
                    id: srv.next_conn_id(),
                    peer: None,
                    transport: "stream",
                    remote: "stdio".into(),
                };
                srv.serve_conn(r, w, info).await;
                Ok(())
            }
        };
        // The link is gone: stop every tool (dropping the prepared sandboxes ends them).
        session.shutdown().await;
        r
    });
    // Runner threads may still be unwinding their calls; their sandboxes are gone, so exit
    // without waiting for them.
    match served {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("toolsrv: serving: {e}");
            std::process::exit(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> Result<Parsed, String> {
        parse_args(v.iter().map(|s| s.to_string()))
    }

    #[test]
    fn arguments() {
        let run = |v: &[&str]| match p(v) {
            Ok(Parsed::Run(a)) => a,
            _ => panic!("{v:?}"),
        };
        assert_eq!(
            run(&[]),
            Args {
                link_fd: 3,
                boot_fd: 4,
                stdio: false
            }
        );
        assert_eq!(run(&["--link-fd", "7", "--boot-fd=9"]).boot_fd, 9);
        assert_eq!(run(&["--link-fd", "7"]).link_fd, 7);
        assert!(run(&["--stdio"]).stdio);
        assert!(matches!(p(&["--help"]), Ok(Parsed::Help)));
        for bad in [
            &["--bogus"][..],
            &["--link-fd"],
            &["--link-fd", "-1"],
            &["--boot-fd", "x"],
            &["--stdio", "--link-fd", "3"],
            &["--stdio=1"],
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }
}
