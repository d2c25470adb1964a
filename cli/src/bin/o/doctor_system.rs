//! `o doctor`'s checks beyond the kernel: the toolsrv binary, the configuration and its
//! backends (asked through `olliesrv --check-config --probe --json`, so the file is read by
//! the server's own code), and the server's socket; and [`Item`], one checked item of them all.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ollie_p9::dial::{self, Addr};

use serde::Serialize;

/// One checked item.
#[derive(Debug, Serialize)]
pub(crate) struct Item {
    pub(crate) name: String,
    /// "ok" or "missing".
    pub(crate) status: &'static str,
    /// A default policy needs it (a missing one makes the exit status 1).
    pub(crate) required: bool,
    /// The facts, or why it is missing.
    pub(crate) detail: String,
    /// What to do about a missing item.
    pub(crate) fix: Option<String>,
}

impl Item {
    pub(crate) fn new(
        name: impl Into<String>,
        required: bool,
        ok: bool,
        detail: String,
        fix: &str,
    ) -> Item {
        Item {
            name: name.into(),
            status: if ok { "ok" } else { "missing" },
            required,
            detail,
            fix: (!ok).then(|| fix.to_owned()),
        }
    }

    pub(crate) fn ok(&self) -> bool {
        self.status == "ok"
    }
}

/// The checks, in order: toolsrv, olliesrv and the configuration, each backend, the server.
pub(crate) fn items(config: Option<&Path>, addr: Option<&str>, key: Option<&Path>) -> Vec<Item> {
    let mut v = vec![toolsrv()];
    v.extend(configuration(config));
    v.push(server(addr, key));
    v
}

/// A binary next to this `o` (as the package and `cargo build` install them), else in PATH.
fn sibling(name: &str) -> Option<PathBuf> {
    let here = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(name)))
        .filter(|p| p.is_file());
    here.or_else(|| {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|c| c.is_file())
        })
    })
}

/// What `PROGRAM --version` printed, or why it did not run.
fn version_of(program: &Path) -> Result<String, String> {
    let out = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("--version failed ({})", out.status))
    }
}

fn toolsrv() -> Item {
    // olliesrv's own rule: $OLLIE_TOOLSRV, else next to the binary (olliesrv and o are
    // installed side by side), else PATH.
    let program = std::env::var_os("OLLIE_TOOLSRV")
        .map(PathBuf::from)
        .or_else(|| sibling("toolsrv"));
    let fix = "build it (cargo build --release --workspace) and keep it next to olliesrv, or set OLLIE_TOOLSRV";
    match program {
        None => Item::new(
            "toolsrv",
            true,
            false,
            "not found next to o or in PATH".into(),
            fix,
        ),
        Some(p) => match version_of(&p) {
            Ok(v) if v.starts_with("toolsrv ") => {
                Item::new("toolsrv", true, true, format!("{} ({v})", p.display()), fix)
            }
            Ok(v) => Item::new(
                "toolsrv",
                true,
                false,
                format!("{} is not toolsrv (it says {v:?})", p.display()),
                fix,
            ),
            Err(e) => Item::new(
                "toolsrv",
                true,
                false,
                format!("{} does not run: {e}", p.display()),
                fix,
            ),
        },
    }
}

/// The configuration item and one item per backend.
fn configuration(config: Option<&Path>) -> Vec<Item> {
    let Some(olliesrv) = sibling("olliesrv") else {
        return vec![Item::new(
            "config",
            true,
            false,
            "olliesrv, which reads it, is not next to o or in PATH".into(),
            "build it (cargo build --release --workspace) or install the package",
        )];
    };
    let mut c = Command::new(&olliesrv);
    c.args(["--check-config", "--probe", "--json"]);
    if let Some(f) = config {
        c.arg("--config").arg(f);
    }
    let out = match c.stdin(Stdio::null()).stderr(Stdio::null()).output() {
        Ok(o) => o,
        Err(e) => {
            return vec![Item::new(
                "config",
                true,
                false,
                format!("{} --check-config: {e}", olliesrv.display()),
                "reinstall olliesrv",
            )];
        }
    };
    let report: serde_json::Value = match serde_json::from_slice(&out.stdout) {
        Ok(v) => v,
        Err(_) => {
            return vec![Item::new(
                "config",
                true,
                false,
                format!(
                    "{} does not know --check-config (another version than o?)",
                    olliesrv.display()
                ),
                "install olliesrv and o from the same build",
            )];
        }
    };
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    let file = report["path"].as_str().map_or_else(
        || "no file: the built-in defaults".to_owned(),
        str::to_owned,
    );
    let mut v = vec![match report["error"].as_str() {
        None => Item::new("config", true, true, format!("{file}: valid"), ""),
        Some(e) => Item::new(
            "config",
            true,
            false,
            e.to_owned(),
            "correct the file (olliesrv refuses to start with it); olliesrv --check-config rechecks it",
        ),
    }];
    for b in report["backends"].as_array().into_iter().flatten() {
        let ok = b["ok"].as_bool().unwrap_or(false);
        v.push(Item::new(
            format!("backend {}", text(&b["name"])),
            false,
            ok,
            format!(
                "{} at {}: {}",
                text(&b["kind"]),
                text(&b["url"]),
                text(&b["detail"])
            ),
            "start the server it names, or correct base_url / the key variable in config.toml",
        ));
    }
    v
}

/// The socket: its directory and mode, and a server answering an attach.
fn server(addr: Option<&str>, key: Option<&Path>) -> Item {
    let fix = "start olliesrv (scripts/run.sh, or systemctl --user start olliesrv.socket), or give o -a ADDR";
    let addr = match addr.map(Addr::parse) {
        None => dial::default_server(),
        Some(Ok(a)) => a,
        Some(Err(e)) => return Item::new("server", false, false, e.to_string(), fix),
    };
    let mut facts = Vec::new();
    if let Addr::Unix(sock) = &addr {
        if std::fs::symlink_metadata(sock).is_err() {
            return Item::new(
                "server",
                false,
                false,
                format!("{addr}: no socket (no server runs there)"),
                fix,
            );
        }
        match private(sock) {
            Ok(f) => facts.push(f),
            Err(e) => {
                return Item::new(
                    "server",
                    false,
                    false,
                    format!("{addr}: {e}"),
                    "chmod 700 the socket's directory (or remove it and let olliesrv make it)",
                );
            }
        }
    }
    let attached = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(async {
            let a = addr.to_string();
            tokio::time::timeout(
                std::time::Duration::from_secs(5),
                crate::conn::Conn::connect(Some(&a), key),
            )
            .await
        }),
        Err(e) => return Item::new("server", false, false, e.to_string(), fix),
    };
    match attached {
        Ok(Ok(_)) => {
            facts.push(format!("answers, attached as {}", dial::current_user()));
            Item::new(
                "server",
                false,
                true,
                format!("{addr}: {}", facts.join(", ")),
                fix,
            )
        }
        Ok(Err(e)) => Item::new(
            "server",
            false,
            false,
            format!("{addr}: {}", e.message()),
            fix,
        ),
        Err(_) => Item::new(
            "server",
            false,
            false,
            format!("{addr}: no answer within 5 s"),
            fix,
        ),
    }
}

/// The socket's directory and the socket, when neither is open to everyone; the reason
/// otherwise (or when there is no socket).
fn private(sock: &Path) -> Result<String, String> {
    let dir = sock.parent().unwrap_or(Path::new("/"));
    let d = std::fs::metadata(dir).map_err(|e| format!("directory {}: {e}", dir.display()))?;
    let dmode = d.permissions().mode() & 0o777;
    if dmode & 0o007 != 0 {
        return Err(format!(
            "directory {} has mode {dmode:o}: others can reach the socket",
            dir.display()
        ));
    }
    let s = std::fs::symlink_metadata(sock).map_err(|e| format!("no socket: {e}"))?;
    let smode = s.permissions().mode() & 0o777;
    if smode & 0o007 != 0 {
        return Err(format!("the socket has mode {smode:o}: others may connect"));
    }
    let me = nix::unistd::geteuid().as_raw();
    let owner = if d.uid() == me {
        "yours".to_owned()
    } else {
        format!("uid {}'s (a shared service)", d.uid())
    };
    Ok(format!("directory {dmode:o} {owner}, socket {smode:o}"))
}
