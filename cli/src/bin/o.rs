//! `o`: the human command line for ollie.
//!
//! `o sandbox [--profile NAME | --policy FILE] [--workdir DIR] [--record FILE] -- CMD ARGS…`
//! runs one command through the same code path toolsrv uses (`ollie_sandbox::run_streaming`),
//! streams its stdout/stderr, forwards its stdin when that is a pipe or a file (a terminal is
//! never forwarded: the tool reads `/dev/null`), and exits with its status (128 + signal when
//! it was killed). After the run it prints one `o sandbox: warning: …` line per post-run flag
//! (new git hooks, risky git config, `.envrc`, editor settings; see docs/sandbox.md, "The post-run diff").
//! When the run itself is refused, it prints one line to stderr and exits 125 (126: the
//! program cannot be executed, 127: not found).
//!
//! `o ls`, `o new`, `o attach`, `o prompt`, `o ctl`, `o kill`, `o logs`, `o bead` and
//! `o approve` talk to olliesrv over 9P (`-a ADDR`, default `unix!$NAMESPACE/ollie`), attached as the current
//! user; see the `sessions` module (and `approve` for the escalation requests, `progress` for
//! the progress line of `prompt` and `attach`).
//!
//! `o doctor [--json]` prints what this machine's sandbox offers (see the `doctor` module).
//!
//! Text `o` did not write itself (chat, tool output, server replies and errors, names,
//! states) is always printed with its control, bidi and invisible characters escaped as
//! `\u{X}`, on a terminal or not (the `render` module has the rule). The one exception is the
//! output of `o sandbox`'s own command, which is passed through as it is (it is the
//! operator's command, and its output may be data for a pipe); its warning and error lines
//! are escaped.
//!
//! `o completions SHELL` prints a completion script for bash, zsh, fish, elvish or PowerShell,
//! generated from this parser.

#[path = "o/approve.rs"]
mod approve;
#[path = "o/bead.rs"]
mod bead;
#[path = "o/conn.rs"]
mod conn;
#[path = "o/doctor.rs"]
mod doctor;
#[path = "o/doctor_system.rs"]
mod doctor_system;
#[path = "o/egress.rs"]
mod egress;
#[path = "o/fuse.rs"]
mod fuse;
#[path = "o/mount.rs"]
mod mount;
#[path = "o/progress.rs"]
mod progress;
#[path = "o/render.rs"]
mod render;
#[path = "o/sessions.rs"]
mod sessions;

use anyhow::Context as _;
use clap::{CommandFactory, Parser, Subcommand};
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "o",
    version,
    about = "ollie command line",
    after_help = "EXAMPLES:\n  \
        o new proj --cwd ~/src/proj        create a session\n  \
        o attach proj                      talk to its first agent (created as \"main\")\n  \
        o prompt proj 'fix the build'      one prompt, wait, print the reply\n  \
        o ls                               sessions and agents\n  \
        o approve                          answer escalation requests (y/N/s)\n  \
        o bead mount -ac notes /ctx        compose a bead into the chat's namespace\n  \
        o -a unix!/run/ollie/ollie ls      another server\n  \
        o mount ~/n/ollie                  the namespace as files (FUSE); o mount -u ~/n/ollie\n  \
        o sandbox -- make test             run a command in the tool sandbox\n  \
        o doctor                           what the sandbox can enforce on this machine\n  \
        o completions bash                 a completion script (see o completions --help)\n\n\
        The default address is unix!$NAMESPACE/ollie when NAMESPACE is set; otherwise the first socket found of\n        /tmp/ns.$USER.$DISPLAY/ollie, $XDG_RUNTIME_DIR/ollie/ollie (user service) and /run/ollie/ollie (system service).\n\
        EXIT STATUS (session commands): 0 ok, 1 the server refused or the turn failed, 2 usage, \
        3 cannot connect, 4 (o prompt) the session is paused and the prompt was queued."
)]
struct Cli {
    /// olliesrv's address: unix!/path/to/socket or tcp!host!port (session commands).
    #[arg(short = 'a', long = "addr", value_name = "ADDR")]
    addr: Option<String>,
    /// Authenticate with the key in FILE (olliesrv's TCP listeners require it: STATE/tcp.key).
    #[arg(short = 'k', long = "key", value_name = "FILE")]
    key: Option<std::path::PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one command in the tool sandbox.
    #[command(after_help = SANDBOX_HELP)]
    Sandbox(SandboxArgs),
    /// Check what the tool sandbox can enforce here (no server needed).
    #[command(after_help = doctor::AFTER_HELP)]
    Doctor(doctor::Args),
    /// Mount the namespace on a directory (FUSE), or unmount it with -u.
    #[command(after_help = mount::AFTER_HELP)]
    Mount(mount::Args),
    #[command(flatten)]
    Session(sessions::Command),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(after_help = COMPLETIONS_HELP)]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

const SANDBOX_HELP: &str = "Runs the command as toolsrv runs a tool, without a server: \
    its output streams, standard input is forwarded when it is a pipe or a file (never a \
    terminal), and a warning line follows for each risky file the run left behind. Without \
    --profile or --policy the profile is workspace. A NAME other than the shipped \
    profiles (readonly, workspace, network, packages) is ~/.config/ollie/policy/NAME.toml, as for \
    olliesrv; a file there with a shipped name is refused, as olliesrv refuses it.\n\
    EXIT STATUS: the command's (128 + signal when it was killed); 125 the sandbox refused or \
    failed to start it, 126 it cannot be executed, 127 it was not found.\n\n\
    EXAMPLES:\n  \
    o sandbox -- make test\n  \
    o sandbox --profile readonly --workdir ~/src/app -- grep -rn TODO .\n  \
    o sandbox --policy my.toml --record run.json -- python3 script.py";

const COMPLETIONS_HELP: &str = "Prints the script to standard output; the Debian package \
    and install.sh install those for bash, zsh and fish. For yourself, put it where your shell \
    looks (zsh: a directory in fpath, e.g. ~/.zfunc with fpath+=(~/.zfunc) before compinit).\n\n\
    EXAMPLES:\n  \
    o completions bash > ~/.local/share/bash-completion/completions/o\n  \
    o completions zsh > ~/.zfunc/_o\n  \
    o completions fish > ~/.config/fish/completions/o.fish";

/// Writes the completion script for `shell` to standard output (built in memory first: the
/// generator cannot report a write error, and `| head` must not make it panic).
/// The shell's registration script: it calls `o` back for each completion (the names of
/// sessions and agents come from the server then), the script `COMPLETE=SHELL o` prints.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    let script = match std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .env("COMPLETE", shell.to_string())
            .stdin(std::process::Stdio::null())
            .output()
    }) {
        Ok(out) if out.status.success() && !out.stdout.is_empty() => out.stdout,
        Ok(out) => {
            eprintln!("o completions: no script for {shell} ({})", out.status);
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("o completions: cannot run o: {e}");
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(&script).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::from(141),
        Err(e) => {
            eprintln!("o completions: writing standard output: {e}");
            ExitCode::from(1)
        }
    }
}

#[derive(Debug, clap::Args)]
struct SandboxArgs {
    /// A shipped or configured profile (readonly, workspace, network, packages).
    #[arg(long, conflicts_with = "policy")]
    profile: Option<String>,
    /// A policy TOML file.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// The workspace (default: the current directory).
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Write the JSON run record here.
    #[arg(long)]
    record: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<OsString>,
}

/// Exit code when the sandbox refuses or fails to start the run.
const EXIT_REFUSED: u8 = 125;
const EXIT_CANNOT_EXEC: u8 = 126;
const EXIT_NOT_FOUND: u8 = 127;

fn load_policy(args: &SandboxArgs) -> anyhow::Result<ollie_policy::Policy> {
    if let Some(file) = &args.policy {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read policy {}", file.display()))?;
        return ollie_policy::Policy::from_toml(&text)
            .with_context(|| format!("policy {}", file.display()));
    }
    let name = args
        .profile
        .as_deref()
        .unwrap_or(ollie_policy::DEFAULT_PROFILE);
    // The user's policies are where olliesrv reads them for this user.
    let dir = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|d| d.join("ollie/policy"));
    ollie_policy::resolve_profile(name, dir.as_deref()).map_err(anyhow::Error::msg)
}

/// An error as one line, escaped: it may quote paths and names the run chose.
fn one_line(e: &anyhow::Error) -> String {
    render::terminal_safe(&ollie_link::text::one_line(&format!("{e:#}"))).into_owned()
}

fn sandbox(args: SandboxArgs) -> ExitCode {
    let policy = match load_policy(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("o sandbox: {}", one_line(&e));
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    let workdir = match &args.workdir {
        Some(w) => w.clone(),
        None => match std::env::current_dir() {
            Ok(d) => d,
            Err(e) => {
                eprintln!("o sandbox: cannot determine the current directory: {e}");
                return ExitCode::from(EXIT_REFUSED);
            }
        },
    };
    let mut req = ollie_sandbox::RunRequest::new(args.command.clone(), workdir);
    // ollie's own secret directories wherever the environment puts them, every state
    // directory olliesrv listed, and one the workspace lies in (found by its marker): secret
    // for this run as the default locations are (a workspace inside one is refused).
    req.hidden = ollie_link::instances::env_secrets();
    if let Some(d) = std::fs::canonicalize(&req.workdir)
        .ok()
        .and_then(|w| ollie_link::instances::marked_ancestor(&w))
    {
        req.hidden.push(d);
    }
    // stdin: forwarded (through the runner, never as the fd itself) when it is a pipe or a
    // file; a terminal is never handed to a tool, which then reads /dev/null.
    req.stdin_fd = ollie_sandbox::forwardable_stdin().map(std::sync::Arc::new);
    // Proxied: the proxy a server would run, here, for as long as the run runs.
    let _served = match egress::for_run(&policy) {
        Ok(Some((handoff, served))) => {
            req.proxy = Some(handoff);
            Some(served)
        }
        Ok(None) => None,
        Err(e) => {
            eprintln!("o sandbox: {}", one_line(&e));
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    // Output is streamed live; the run's own capture (capped) only feeds the record.
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let mut sink = |stream: ollie_sandbox::Stream, bytes: &[u8]| {
        let _ = match stream {
            ollie_sandbox::Stream::Stdout => stdout.write_all(bytes).and_then(|()| stdout.flush()),
            ollie_sandbox::Stream::Stderr => stderr.write_all(bytes),
        };
    };
    let out = match ollie_sandbox::run_streaming(&policy, &req, &mut sink) {
        Ok(o) => o,
        Err(e) => {
            let code = match &e {
                ollie_sandbox::SandboxError::Exec { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    EXIT_NOT_FOUND
                }
                ollie_sandbox::SandboxError::Exec { .. } => EXIT_CANNOT_EXEC,
                _ => EXIT_REFUSED,
            };
            eprintln!("o sandbox: {}", one_line(&anyhow::Error::new(e)));
            return ExitCode::from(code);
        }
    };
    // What the run left behind for host-side tools: one line each, after the tool's output.
    for flag in &out.record.post_run.flags {
        // A flag names files the command created: escaped like all text `o` did not write.
        let flag = render::line_safe(&flag.to_string()).into_owned();
        eprintln!("o sandbox: warning: {flag} (review before running git or tools here)");
    }
    if out.record.post_run.truncated {
        eprintln!(
            "o sandbox: warning: the post-run scan was cut short (a bound was hit, or a directory could not be searched); parts of the workspace (nested repositories, set-id files) were not checked"
        );
    }
    if out.record.exit.timed_out {
        eprintln!(
            "o sandbox: timed out after {} s",
            out.record.limits.timeout_seconds
        );
    }
    if out.record.exit.killed_by == Some(ollie_sandbox::KilledBy::MemoryLimit) {
        eprintln!(
            "o sandbox: stopped: out of memory at limits.memory_bytes = {} MiB (the run's memory cgroup)",
            out.record.limits.memory_bytes >> 20
        );
    }
    if let Some(d) = &out.record.exit.disk_limit {
        let what = match d.limit {
            ollie_sandbox::DiskLimit::DiskBytes => format!(
                "used {} MiB of disk, more than limits.disk_bytes = {} MiB",
                d.observed >> 20,
                d.allowed >> 20
            ),
            ollie_sandbox::DiskLimit::DiskInodes => format!(
                "used {} inodes, more than limits.disk_inodes = {}",
                d.observed, d.allowed
            ),
            ollie_sandbox::DiskLimit::ReserveBytes => format!(
                "left {} MiB free, below the reserve of {} MiB",
                d.observed >> 20,
                d.allowed >> 20
            ),
            ollie_sandbox::DiskLimit::ReserveInodes => format!(
                "left {} inodes free, below the reserve of {}",
                d.observed, d.allowed
            ),
        };
        eprintln!(
            "o sandbox: stopped: {what} on {}",
            render::line_safe(&d.path.display().to_string())
        );
    }
    if let Some(path) = &args.record
        && let Err(e) = std::fs::write(path, out.record.to_json() + "\n")
    {
        eprintln!(
            "o sandbox: cannot write the run record to {}: {e}",
            render::line_safe(&path.display().to_string())
        );
        return ExitCode::from(EXIT_REFUSED);
    }
    ExitCode::from(u8::try_from(out.record.exit.status & 0xff).unwrap_or(EXIT_REFUSED))
}

fn main() -> ExitCode {
    // Shell completion calls back into o (COMPLETE=SHELL o -- WORDS…): answered here, before
    // anything else runs; session and agent names come from the server.
    clap_complete::CompleteEnv::with_factory(Cli::command)
        .completer("o")
        .complete();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Sandbox(_) if cli.addr.is_some() || cli.key.is_some() => {
            eprintln!("o sandbox: -a and -k apply to the session commands, not to o sandbox");
            ExitCode::from(2)
        }
        Cmd::Sandbox(args) => {
            // One run, then the process ends: the last closes of removed placeholders (which
            // can wait for the disk's discards) happen in a child, not in this exit.
            ollie_sandbox::close_at_exit();
            let code = sandbox(args);
            ollie_sandbox::close_in_a_child();
            code
        }
        Cmd::Doctor(args) => doctor::main(args, cli.addr, cli.key),
        Cmd::Completions { shell } => completions(shell),
        Cmd::Mount(args) => mount::main(cli.addr, cli.key, args),
        Cmd::Session(cmd) => sessions::main(cli.addr, cli.key, cmd),
    }
}
