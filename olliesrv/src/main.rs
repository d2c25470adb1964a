//! `olliesrv [--config FILE] [-a ADDR]…`
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ollie_olliesrv::{Options, RunError, error_chain, run};
use ollie_p9::dial::Addr;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser, Debug)]
#[command(
    name = "olliesrv",
    version,
    about = "The ollie 9P server: sessions, agents and everything else as files",
    after_help = "The default address is unix!$NAMESPACE/ollie (NAMESPACE defaults to /tmp/ns.$USER.$DISPLAY).\n\
        Under systemd: serves the sockets passed by socket activation (LISTEN_FDS; unix or TCP, instead of\n\
        the default address unless -a is given), reports readiness (Type=notify) and logs in the journal's format.\n\
        Logging: OLLIE_LOG=debug (tracing filter syntax).\n\
        EXIT STATUS: 0 stopped cleanly, 1 failed while serving, 2 bad configuration or usage, 3 cannot listen;\n\
        with --check-config or --check-state: the check's own status (above)."
)]
struct Args {
    /// The main configuration file (default: $XDG_CONFIG_HOME/ollie/config.toml if it exists).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Listen address: unix!/path or tcp!host!port (repeatable). TCP addresses are served
    /// besides the default unix socket; a unix address replaces it. TCP clients must
    /// authenticate with Tauth and the key in STATE/tcp.key (created 0600 on first start).
    #[arg(short = 'a', long = "addr", value_name = "ADDR")]
    addr: Vec<String>,
    /// The state directory (default: $STATE_DIRECTORY, else $XDG_STATE_HOME/ollie, else
    /// ~/.local/state/ollie).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// The toolsrv binary (default: $OLLIE_TOOLSRV, else next to olliesrv, else PATH).
    #[arg(long, value_name = "FILE")]
    toolsrv: Option<PathBuf>,
    /// Check the configuration as the server would read it, print the result and exit
    /// (0 valid, 2 refused; with --probe, 1 when a backend did not answer). Serves nothing.
    #[arg(long)]
    check_config: bool,
    /// With --check-config: also ask each backend for its models (one request each, at the
    /// configured URL, 3 s at most).
    #[arg(long, requires = "check_config")]
    probe: bool,
    /// With --check-config: print one JSON object (path, error, backends) instead of lines.
    #[arg(long, requires = "check_config")]
    json: bool,
    /// Check every file of the state directory DIR against the store's layout without
    /// changing anything, print one line per finding, and exit (0 no problems, 1 problems).
    /// Leftovers of a crash that the server repairs by itself are listed, not problems.
    #[arg(long, value_name = "DIR", conflicts_with = "check_config")]
    check_state: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // Socket activation and the notify socket, before any thread exists.
    let env = match ollie_olliesrv::systemd::Environment::take() {
        Ok(env) => env,
        Err(e) => {
            eprintln!("olliesrv: socket activation: {e}");
            return ExitCode::from(3);
        }
    };
    ollie_link::logging::init(
        tracing_subscriber::EnvFilter::try_from_env("OLLIE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        true,
    );
    let mut addrs = Vec::new();
    for a in &args.addr {
        match Addr::parse(a) {
            Ok(a) => addrs.push(a),
            Err(e) => {
                eprintln!("olliesrv: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if args.check_config {
        return check_config(&args);
    }
    if let Some(dir) = &args.check_state {
        let report = ollie_olliesrv::check_state(dir);
        print!("{}", report.text());
        return ExitCode::from(u8::from(report.problems() > 0));
    }
    raise_open_files();
    // Two arenas for two worker threads: the threads tokio's blocking pool adds (each fsync
    // hands its worker's tasks to another thread) would otherwise get arenas of their own and
    // keep the peak of every one resident (the soak: −22 % RSS).
    if let Err(e) = ollie_malloc::limit_arenas(2) {
        tracing::debug!(error = %e, "malloc arenas not limited");
    }
    // At most 16 blocking threads. Each fsync (`util::blocking`) hands its worker's tasks to a
    // blocking thread, so every such thread ends up running the workers' tasks, and glibc
    // keeps a cache of freed chunks per thread (tcache, up to ~230 KB each). With tokio's
    // default of 512 the soak grew to ~100 threads and its RSS climbed by 15 % in 10 min;
    // with 16 it stays flat. Past the cap an fsync simply blocks its worker for its duration.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(16)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("olliesrv: cannot start runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let opts = Options {
        config: args.config,
        addrs,
        state_dir: args.state_dir,
        toolsrv: args.toolsrv,
        activated: env.sockets,
        notify: env.notify,
    };
    let result = rt.block_on(async move {
        let (stop, _) = tokio::sync::watch::channel(false);
        let sig_stop = stop.clone();
        // The handlers are in place before anything is bound, so a SIGTERM that arrives as
        // soon as the socket accepts (a service manager stopping a just-started unit) is
        // caught rather than fatal.
        let signals = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        );
        tokio::spawn(async move {
            let (Ok(mut term), Ok(mut int)) = signals else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            // send_replace: until run() subscribes, the channel has no receiver, and send()
            // would drop the value (a SIGTERM right after the socket accepts was lost so).
            sig_stop.send_replace(true);
        });
        run(opts, stop).await
    });
    // Every toolsrv has exited by now; a blocking task still running (a file operation of
    // an agent's tool call) must not hold the exit up.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("olliesrv: {}", error_chain(&e));
            ExitCode::from(match e {
                RunError::Config(_)
                | RunError::NoStateDir
                | RunError::Key { .. }
                | RunError::NoToolsrv { .. } => 2,
                RunError::State { .. } => 1,
                RunError::Listen(_) | RunError::StateInUse { .. } => 3,
                RunError::Serve { .. } => 1,
            })
        }
    }
}

/// `--check-config [--probe] [--json]`.
fn check_config(args: &Args) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("olliesrv: cannot start runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let report = rt.block_on(ollie_olliesrv::check_config(
        args.config.as_deref(),
        args.probe,
    ));
    let text = if args.json {
        match serde_json::to_string(&report) {
            Ok(j) => format!("{j}\n"),
            Err(e) => {
                eprintln!("olliesrv: cannot encode the report: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        report.text()
    };
    print!("{text}");
    ExitCode::from(report.exit_code())
}

/// Raises the soft limit on open descriptors to the hard one (at most 65 536): the connection
/// caps of `[limits]` (512 by default, each a descriptor, besides each session's toolsrv link)
/// assume more than the usual default of 1024. Tools get their own limit from their policy.
fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let want = hard.min(1 << 16);
        if soft < want
            && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, want, hard)
        {
            eprintln!("olliesrv: cannot raise the open-file limit from {soft} to {want}: {e}");
        }
    }
}
