//! `ollie-9p`: read and write files on a 9P server without mounting it, in the manner of
//! plan9port's `9p`.
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::process::ExitCode;

use bytes::Bytes;
use clap::{CommandFactory, Parser, Subcommand};
use ollie_link::error_chain;
use ollie_p9::client::{Client, ClientError, Fid, path_names};
use ollie_p9::dial::{self, Addr};
use ollie_p9::wire::{Stat, dm, om};

/// The most `write` and `create` take from standard input at a time (a pipe gives at most
/// what is in it).
const STDIN_CHUNK: usize = 64 * 1024;

/// Exit statuses.
const EXIT_SERVER: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_CONNECT: u8 = 3;

#[derive(Parser, Debug)]
#[command(
    name = "ollie-9p",
    version,
    about = "Read and write files on a 9P server (like plan9port's 9p)",
    after_help = "EXAMPLES:\n  \
        echo name=myproj | ollie-9p write session/new\n  \
        echo 'an idea' | ollie-9p create session/myproj/ns/ctx/notes/idea.md\n  \
        printf 'name=a\\n' | ollie-9p rdwr session/myproj/agent/new\n  \
        ollie-9p read session/myproj/agent/coding/chat\n  \
        ollie-9p -a tcp!127.0.0.1!5640 -k ~/.local/state/ollie/tcp.key ls -l /\n  \
        ollie-9p completions bash > ~/.local/share/bash-completion/completions/ollie-9p\n\n\
        EXIT STATUS: 0 ok, 1 the server refused (its error is printed), 2 usage, 3 cannot connect.\n\
        The default address is unix!$NAMESPACE/ollie when NAMESPACE is set; otherwise the first socket found of\n        /tmp/ns.$USER.$DISPLAY/ollie, $XDG_RUNTIME_DIR/ollie/ollie (user service) and /run/ollie/ollie (system service)."
)]
struct Args {
    /// Server address: unix!/path/to/socket or tcp!host!port.
    #[arg(short = 'a', long = "addr", value_name = "ADDR")]
    addr: Option<String>,
    /// Attach name (aname).
    #[arg(short = 'A', long = "aname", default_value = "")]
    aname: String,
    /// User name to attach as (default: the current user).
    #[arg(short = 'u', long = "user")]
    user: Option<String>,
    /// Authenticate with the key in FILE (Tauth, then write the key to the auth fid): what
    /// olliesrv's TCP listeners require (its key is STATE/tcp.key).
    #[arg(short = 'k', long = "key", value_name = "FILE")]
    key: Option<std::path::PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List a directory (or name a file).
    #[command(after_help = "EXAMPLES:\n  ollie-9p ls\n  ollie-9p ls -l session\n  \
        ollie-9p ls -ld session/proj/agent/main/chat")]
    Ls {
        /// Long listing: mode, owner, group, length, time, name.
        #[arg(short = 'l')]
        long: bool,
        /// List a directory itself, not its contents.
        #[arg(short = 'd')]
        dir: bool,
        /// Paths (default: the root).
        paths: Vec<String>,
    },
    /// Copy a file to standard output, as it arrives (streams until end of file).
    #[command(
        after_help = "EXAMPLES:\n  ollie-9p read session/proj/agent/main/stats\n  \
        ollie-9p read session/proj/agent/main/chat        (follows it, like tail -f)"
    )]
    Read { path: String },
    /// Copy standard input to a file, as it arrives (each chunk read is written at once).
    #[command(after_help = "EXAMPLES:\n  \
        echo 'fix the build' | ollie-9p write session/proj/agent/main/prompt\n  \
        while :; do git diff HEAD --; sleep 5; done | ollie-9p write session/proj/agent/obs/feed\n  \
        printf 'pause\\nresume\\n' | ollie-9p write -l session/proj/ctl")]
    Write {
        /// One write per input line.
        #[arg(short = 'l')]
        lines: bool,
        path: String,
    },
    /// Create a file (Tcreate, mode 0644; an error if it exists) and copy standard input to it.
    #[command(after_help = "EXAMPLES:\n  \
        echo 'an idea' | ollie-9p create session/proj/ns/ctx/notes/idea.md")]
    Create { path: String },
    /// Write standard input as one request, then print the reply read on the same fid.
    #[command(
        after_help = "EXAMPLES:\n  echo name=proj | ollie-9p rdwr session/new\n  \
        echo help | ollie-9p rdwr session/proj/ctl"
    )]
    Rdwr { path: String },
    /// Print a file's attributes.
    #[command(after_help = "EXAMPLES:\n  ollie-9p stat session/proj/agent/main/chat")]
    Stat { path: String },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell); needs no server.
    #[command(after_help = "EXAMPLES:\n  \
        ollie-9p completions bash > ~/.local/share/bash-completion/completions/ollie-9p\n  \
        ollie-9p completions fish > ~/.config/fish/completions/ollie-9p.fish")]
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Writes the completion script for `shell` to standard output (built in memory: the
/// generator cannot report a write error).
fn completions(shell: clap_complete::Shell) -> ExitCode {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Args::command(), "ollie-9p", &mut script);
    let mut out = std::io::stdout().lock();
    match out.write_all(&script).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::from(141),
        Err(e) => {
            eprintln!("ollie-9p: writing standard output: {e}");
            ExitCode::from(EXIT_SERVER)
        }
    }
}

#[derive(Debug)]
enum Failure {
    Usage(String),
    Connect(String),
    Server(String),
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(EXIT_USAGE),
            };
        }
    };
    if let Cmd::Completions { shell } = args.cmd {
        return completions(shell);
    }
    // One thread, and only the I/O driver: a client that waits on nothing but its socket.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ollie-9p: cannot start runtime: {e}");
            return ExitCode::from(EXIT_CONNECT);
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            eprintln!("ollie-9p: {m}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(Failure::Connect(m)) => {
            eprintln!("ollie-9p: {m}");
            ExitCode::from(EXIT_CONNECT)
        }
        Err(Failure::Server(m)) => {
            eprintln!("ollie-9p: {m}");
            ExitCode::from(EXIT_SERVER)
        }
    }
}

fn server(path: &str) -> impl Fn(ClientError) -> Failure + '_ {
    move |e| match e {
        ClientError::Server(m) => Failure::Server(format!("{path}: {m}")),
        other => Failure::Connect(format!("{path}: {}", error_chain(&other))),
    }
}

fn stdout_failure(e: std::io::Error) -> Failure {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        // The reader went away (`| head`): stop quietly, as a SIGPIPE would.
        std::process::exit(141);
    }
    Failure::Server(format!("writing standard output: {e}"))
}

async fn run(args: Args) -> Result<(), Failure> {
    let addr = match &args.addr {
        Some(a) => Addr::parse(a).map_err(|e| Failure::Usage(e.to_string()))?,
        None => dial::default_server(),
    };
    let client = Client::dial(&addr)
        .await
        .map_err(|e| Failure::Connect(error_chain(&e)))?;
    let user = args.user.clone().unwrap_or_else(dial::current_user);
    let afid = match &args.key {
        None => None,
        Some(path) => {
            let key = std::fs::read(path).map_err(|e| {
                Failure::Usage(format!("cannot read key file {}: {e}", path.display()))
            })?;
            let afid = client
                .auth(&user, &args.aname)
                .await
                .map_err(|e| Failure::Server(format!("auth: {}", error_chain(&e))))?;
            let key = key.strip_suffix(b"\n").unwrap_or(&key).to_vec();
            afid.write(0, Bytes::from(key))
                .await
                .map_err(|e| Failure::Server(format!("auth: {}", error_chain(&e))))?;
            Some(afid)
        }
    };
    let root = client
        .attach(afid.as_ref(), &user, &args.aname)
        .await
        .map_err(|e| match e {
            ClientError::Server(m) => Failure::Server(format!("attach: {m}")),
            other => Failure::Connect(format!("attach: {}", error_chain(&other))),
        })?;
    match args.cmd {
        Cmd::Ls { long, dir, paths } => {
            let paths = if paths.is_empty() {
                vec!["/".to_owned()]
            } else {
                paths
            };
            let mut failed = None;
            for p in &paths {
                if let Err(e) = ls(&root, p, long, dir).await {
                    eprintln!("ollie-9p: {}", describe(&e));
                    failed = Some(e);
                }
            }
            match failed {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
        Cmd::Read { path } => read(&root, &path).await,
        Cmd::Write { lines, path } => write(&root, &path, lines).await,
        Cmd::Create { path } => create(&root, &path).await,
        Cmd::Rdwr { path } => rdwr(&root, &path).await,
        Cmd::Completions { .. } => Err(Failure::Usage(
            "completions needs no server: it is handled before connecting".into(),
        )),
        Cmd::Stat { path } => {
            let f = walk(&root, &path).await?;
            let st = f.stat().await.map_err(server(&path))?;
            println!("{}", plan9_stat(&st));
            Ok(())
        }
    }
}

fn describe(f: &Failure) -> &str {
    match f {
        Failure::Usage(m) | Failure::Connect(m) | Failure::Server(m) => m,
    }
}

async fn walk(root: &Fid, path: &str) -> Result<Fid, Failure> {
    root.walk(&path_names(path)).await.map_err(server(path))
}

async fn open(root: &Fid, path: &str, mode: u8) -> Result<Fid, Failure> {
    let mut f = walk(root, path).await?;
    f.open(mode).await.map_err(server(path))?;
    Ok(f)
}

async fn read(root: &Fid, path: &str) -> Result<(), Failure> {
    let f = open(root, path, om::OREAD).await?;
    // Only a hint for reading ahead: a server that cannot stat an open file is read one
    // piece at a time.
    let length = f.stat().await.map_or(0, |st| st.length);
    copy_out(&f, path, length).await
}

/// Copies the file from offset 0 to standard output as each read returns, until a read
/// returns nothing. While the next two reads both lie within `length` (the file's stat
/// length; 0 for synthetic files, whose reads may block or answer a request), two Treads are
/// in flight, so the server sends the next piece while this one is received; a short answer
/// drops (flushes) the one ahead and reading goes on from where it ended. Past `length`,
/// one read at a time.
async fn copy_out(f: &Fid, path: &str, length: u64) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    let n = f.iounit();
    let step = u64::from(n);
    let mut off = 0u64;
    let mut call = f.read_call(0, n).map_err(server(path))?;
    loop {
        let ahead = match off.checked_add(2 * step) {
            Some(end) if end <= length => Some(f.read_call(off + step, n).map_err(server(path))?),
            _ => None,
        };
        let d = call.read_data().await.map_err(server(path))?;
        if d.is_empty() {
            return Ok(());
        }
        off += d.len() as u64;
        out.write_all(&d).map_err(stdout_failure)?;
        out.flush().map_err(stdout_failure)?;
        call = match ahead {
            Some(next) if d.len() == n as usize => next,
            _ => f.read_call(off, n).map_err(server(path))?,
        };
    }
}

fn read_stdin() -> Result<Vec<u8>, Failure> {
    let mut buf = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut buf)
        .map_err(|e| Failure::Usage(format!("reading standard input: {e}")))?;
    Ok(buf)
}

async fn write(root: &Fid, path: &str, lines: bool) -> Result<(), Failure> {
    let f = open(root, path, om::OWRITE | om::OTRUNC).await?;
    if lines {
        // One Twrite per line, as each line is read.
        let stdin = std::io::stdin();
        let mut off = 0u64;
        let mut line = String::new();
        loop {
            line.clear();
            let n = stdin
                .read_line(&mut line)
                .map_err(|e| Failure::Usage(format!("reading standard input: {e}")))?;
            if n == 0 {
                break;
            }
            off += f
                .write_all(off, line.as_bytes())
                .await
                .map_err(server(path))?;
        }
    } else {
        copy_in(&f, path).await?;
    }
    // What the open wrote is complete at the clunk (a prompt is queued then): its error is
    // the command's.
    f.clunk().await.map_err(server(path))
}

async fn create(root: &Fid, path: &str) -> Result<(), Failure> {
    let mut names = path_names(path);
    let Some(name) = names.pop() else {
        return Err(Failure::Usage(format!("{path}: name a file to create")));
    };
    let mut f = root.walk(&names).await.map_err(server(path))?;
    f.create(&name, 0o644, om::OWRITE)
        .await
        .map_err(server(path))?;
    copy_in(&f, path).await?;
    f.clunk().await.map_err(server(path))
}

/// Copies standard input to the file as it arrives: each read of standard input (a pipe's
/// chunk, at most [`STDIN_CHUNK`]) becomes Twrites at the next offset, so an endless producer
/// (`while :; do git diff; sleep 5; done | ollie-9p write …/feed`) is written as it goes.
async fn copy_in(f: &Fid, path: &str) -> Result<(), Failure> {
    let mut stdin = std::io::stdin().lock();
    let mut buf = vec![0u8; STDIN_CHUNK];
    let mut off = 0u64;
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failure::Usage(format!("reading standard input: {e}"))),
        };
        off += f
            .write_all(off, buf.get(..n).unwrap_or_default())
            .await
            .map_err(server(path))?;
    }
}

async fn rdwr(root: &Fid, path: &str) -> Result<(), Failure> {
    let f = open(root, path, om::ORDWR).await?;
    let data = read_stdin()?;
    // A request larger than one message goes in pieces at increasing offsets (agent/new's
    // prompt= is the rest of what the open writes; a ctl refuses it).
    f.write_all(0, &data).await.map_err(server(path))?;
    copy_out(&f, path, 0).await?;
    f.clunk().await.map_err(server(path))
}

async fn ls(root: &Fid, path: &str, long: bool, dir_itself: bool) -> Result<(), Failure> {
    let mut f = walk(root, path).await?;
    let st = f.stat().await.map_err(server(path))?;
    let mut out = std::io::stdout().lock();
    if st.mode & dm::DIR == 0 || dir_itself {
        let shown = if path.is_empty() { "/" } else { path };
        writeln!(out, "{}", entry_line(&st, shown, long)).map_err(stdout_failure)?;
        return Ok(());
    }
    f.open(om::OREAD).await.map_err(server(path))?;
    let mut entries = f.read_dir().await.map_err(server(path))?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in &entries {
        writeln!(out, "{}", entry_line(e, &e.name, long)).map_err(stdout_failure)?;
    }
    Ok(())
}

fn entry_line(st: &Stat, name: &str, long: bool) -> String {
    if !long {
        return if st.mode & dm::DIR != 0 {
            format!("{name}/")
        } else {
            name.to_owned()
        };
    }
    format!(
        "{} M {} {} {} {} {} {}",
        mode_string(st.mode),
        st.dev,
        st.uid,
        st.gid,
        st.length,
        ls_time(st.mtime),
        name
    )
}

/// `Nov 30 10:33`, as Plan 9's `ls -l` shows a time.
fn ls_time(t: u32) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (_, m, d, hh, mm, _) = ollie_p9::util::civil(u64::from(t));
    let month = MONTHS
        .get(m.saturating_sub(1) as usize)
        .copied()
        .unwrap_or("???");
    format!("{month} {d:>2} {hh:02}:{mm:02}")
}

/// Plan 9's `ls -l` mode column: `d`/`a`/`l`/`-`, then rwx for owner, group, other.
fn mode_string(mode: u32) -> String {
    let mut s = String::with_capacity(11);
    s.push(if mode & dm::DIR != 0 {
        'd'
    } else if mode & dm::APPEND != 0 {
        'a'
    } else if mode & dm::EXCL != 0 {
        'l'
    } else {
        '-'
    });
    s.push('-');
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// The stat format of plan9port's `9p stat`.
fn plan9_stat(st: &Stat) -> String {
    format!(
        "'{}' '{}' '{}' '{}' q ({:016x} {} {:02x}) m 0{:o} at {} mt {} l {} t {} d {}",
        st.name,
        st.uid,
        st.gid,
        st.muid,
        st.qid.path,
        st.qid.version,
        st.qid.ty,
        st.mode,
        st.atime,
        st.mtime,
        st.length,
        st.ty,
        st.dev
    )
}
