//! Bead namespaces (DESIGN.md §7 and §9, seed 002): every session and every agent has its own
//! [`ollie_beads::Namespace`], kept on disk, driven through a `ctl` file and served as union
//! directories; the agent's file tools reach the same view through [`Agent::ns_read`](crate::state::Agent::ns_read),
//! [`Agent::ns_write`](crate::state::Agent::ns_write) and [`Agent::ns_points`](crate::state::Agent::ns_points).
//!
//! # Where it lives
//!
//! - The session's namespace: `<state>/sessions/<sid>/ns.json` (the seed's session namespace
//!   file, [`Namespace::save`]: atomic, 0600) and its shadow root
//!   `<state>/sessions/<sid>/ns-shadow/` (0700, one directory per point, `ctx/` for `/ctx`).
//!   Its `session` is the session id.
//! - An agent's namespace: `<state>/sessions/<sid>/agents/<aid>/ns.json` and `…/ns-shadow/`.
//!   Its `session` is the agent id (the seed's "chat-or-session-id": an agent is the chat).
//! - The file is written after every command that changes the table (`start`, `mount`,
//!   `unmount`); if it cannot be written, the command fails and the table stays as it was (a
//!   bead `start` already created stays in the registry; files a `mount -c` already moved out of
//!   the shadow layer stay moved). A missing file is an empty namespace.
//! - On start-up each file is replayed ([`Namespace::load`]) and then settled
//!   ([`Namespace::settle`] on every point with a create target). A file that cannot be read or
//!   replayed is logged, announced as a `state-skipped` event with its path and reason, left in
//!   place for inspection, and the namespace starts empty (the next change overwrites it).
//!   Nothing stops the server.
//! - Killing a session or agent removes its directory, and with it its namespace and shadow
//!   layers (the chat's emissions that never reached a create target).
//!
//! The bead registry is `beads_dir` of `config.toml` when set, else
//! [`ollie_beads::Registry::from_env`] (`$XDG_DATA_HOME/ollie/beads`, else
//! `~/.local/share/ollie/beads`), read again for every command (so `invalidate` applies a new
//! `beads_dir`). Write authority is checked for olliesrv's own (effective) uid.
//!
//! # Forking (the seed's `bead-rfork`, "fork on session open")
//!
//! - Isolation is the default. When an agent is created, it gets a copy ([`Namespace::rfork`])
//!   of its session's namespace as it is at that moment: the same points, members, order,
//!   create targets and open (`start`ed) bead. From then on the two are independent: a mount or
//!   unmount on the session does not change any existing agent's namespace, and an agent's
//!   commands never change the session's or another agent's.
//! - The agent's shadow root starts **empty**; the session's shadow files are not copied. The
//!   shadow layer is the chat's own emissions and a new agent has emitted nothing; copying
//!   would also make both sides settle the same files into a create target later. To share
//!   files, pin a create target (`mount -c`) so they land in a bead.
//! - `rfork` written to an agent's `ns/ctl` changes nothing and replies that the namespace is
//!   already private. Written to the session's `ns/ctl` it also changes nothing: the session's
//!   namespace is the template that agents created later copy, and existing agents already
//!   have their own.
//! - An agent restored from disk keeps its own saved namespace; one without a file (created by
//!   an older olliesrv) starts empty.
//!
//! # The served tree
//!
//! `session/{s}/ns/` and `session/{s}/agent/{a}/ns/` (both `d555`) hold:
//! - `ctl` (0660): one command line per write, with or without the `bead-` prefix — `start
//!   [slug]`, `mount [-b|-a] [-c] BEAD POINT`, `unmount [BEAD] POINT`, `ns`, `rfork` — processed
//!   when the Twrite arrives; the reply is read back on the same fid. A bad line is the
//!   Rwrite's error, one line, and changes nothing. Every change emits an `ns-changed` event
//!   (`session`, `agent` or null, `command`).
//! - `table` (0444): the `ns` output ([`Namespace::table`]), frozen when opened.
//! - one directory per mount point, `/ctx` as `ctx/`: the union view (`UnionNode`). Walks go
//!   through [`Namespace::lookup`], listings through [`Namespace::read_dir`], writes through
//!   [`Namespace::open_write`] (copy-up into the shadow layer), Tcreate through
//!   [`Namespace::create`], Tremove through [`Namespace::remove`], and a Twstat that changes
//!   the name through [`Namespace::rename`] (same directory only). A Twstat may also set the
//!   length (truncate or extend, through `open_write`); any other change is refused unless it
//!   is a no-op. Errors are the library's one-line messages, which carry 9pfuse's words.
//!   Stats show the real file: length, mtime, atime, and a qid whose path comes from the real
//!   file's device and inode (so it is stable while the file stays where it is; a copy-up or
//!   a settle moves it and changes the qid) and whose version is the mtime.
//!
//! Who may use them: as everywhere in olliesrv, the owner class gets the owner bits and
//! everyone else (agents, anyone attaching as `agent`) the group bits. `ns/ctl` is 0660 like the
//! session's `ctl`, so the group may change namespaces as it may control sessions and agents.
//! In a union view the owner bits of the real file or directory are shown for both the owner
//! and the group (a 0600 file is shown 0660, a 0700 directory `d770`, a 0400 file 0440): the
//! views act with olliesrv's own rights, and who may reach olliesrv at all is decided at attach
//! (its socket is the owner's). The kernel still applies olliesrv's real permissions.
//!
//! # The agent's file tools
//!
//! [`Agent::ns_points`](crate::state::Agent::ns_points) lists the agent's points; [`Agent::ns_read`](crate::state::Agent::ns_read) and [`Agent::ns_write`](crate::state::Agent::ns_write)
//! return `None` for a path outside them, so the caller sends it to toolsrv instead. They block
//! on the filesystem (call them from a blocking-capable context).
//!
//! Tested by the unit tests below and by `tests/tests/beads_ns.rs` (the real olliesrv over 9P,
//! restarts included).

use std::fs::{self};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use ollie_beads::{Command, Env, Kind, Namespace, NodeKind, Registry};

use crate::config::Config;
use crate::util::lock;

/// The namespace file's name, beside `session.json` / `agent.json`.
pub const NS_FILE: &str = "ns.json";
/// The shadow root's name, beside the namespace file.
pub const SHADOW_DIR: &str = "ns-shadow";
/// The most [`Agent::ns_read`](crate::state::Agent::ns_read) returns and [`Agent::ns_write`](crate::state::Agent::ns_write) takes (16 MiB).
pub const MAX_FILE: u64 = 16 << 20;

/// `rfork` on an agent's `ns/ctl`.
pub const RFORK_AGENT: &str = concat!(
    "the namespace is already private: an agent's namespace is forked from its session's ",
    "when the agent is created\n"
);
/// `rfork` on a session's `ns/ctl`.
pub const RFORK_SESSION: &str = concat!(
    "nothing to fork: the session namespace is the template new agents copy, ",
    "and every agent already has a private namespace\n"
);

/// One namespace, where it is kept, and what its commands need.
#[derive(Debug)]
pub struct NsHome {
    pub(crate) ns: Mutex<Namespace>,
    /// `(namespace file, shadow root)`, or why there is none (an invalid id; unreachable for
    /// ids the store made).
    pub(crate) place: Result<(PathBuf, PathBuf), String>,
    pub(crate) config: Arc<RwLock<Arc<Config>>>,
    /// The agent's overlays were sent to its toolsrv (so an empty namespace must be sent
    /// once, as `none`).
    pub unions_sent: std::sync::atomic::AtomicBool,
}

/// A problem found while restoring a namespace (path, one-line reason).
pub type NsProblem = (PathBuf, String);

impl NsHome {
    /// An empty namespace for `id` (the session's or the agent's) kept in `dir`.
    pub fn new(id: &str, dir: Result<PathBuf, String>, config: Arc<RwLock<Arc<Config>>>) -> NsHome {
        NsHome {
            ns: Mutex::new(Namespace::new(id)),
            place: dir.map(|d| (d.join(NS_FILE), d.join(SHADOW_DIR))),
            config,
            unions_sent: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(crate) fn place(&self) -> Result<(&Path, &Path), String> {
        match &self.place {
            Ok((f, s)) => Ok((f, s)),
            Err(e) => Err(format!("no namespace here: {e}")),
        }
    }

    /// A copy of the namespace as it is now.
    pub fn snapshot(&self) -> Namespace {
        lock(&self.ns).clone()
    }

    /// Replaces the namespace in memory (nothing is written).
    pub fn set(&self, ns: Namespace) {
        *lock(&self.ns) = ns;
    }

    /// The mount points (`/ctx`), in the order they were first mounted.
    pub fn points(&self) -> Vec<String> {
        lock(&self.ns)
            .points()
            .iter()
            .map(|p| p.path().to_owned())
            .collect()
    }

    /// The `ns` table.
    pub fn table(&self) -> String {
        lock(&self.ns).table()
    }

    /// A private copy for a new agent (`id`): [`Namespace::rfork`] with the agent's id as the
    /// namespace file's `session`.
    pub fn fork(&self, id: &str) -> Namespace {
        let mut n = lock(&self.ns).rfork();
        n.set_session(id);
        n
    }

    /// Writes the namespace file now.
    pub fn save(&self) -> Result<(), String> {
        let (file, _) = self.place()?;
        lock(&self.ns)
            .save(file)
            .map_err(|e| format!("cannot save the namespace: {e}"))
    }

    /// What the library needs. Commands need the registry; union operations do not, so for them
    /// a registry that cannot be found is replaced by an unused one. The shadow root must be
    /// makeable: its parent (the session's or agent's directory) must still exist, so a view
    /// used after a kill never brings a removed directory back.
    pub(crate) fn env(&self, for_commands: bool) -> Result<Env, String> {
        let (_, shadow) = self.place()?;
        match fs::DirBuilder::new().mode(0o700).create(shadow) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err("file does not exist: it was killed".into());
            }
            Err(e) => return Err(format!("cannot create {}: {e}", shadow.display())),
        }
        let config = self
            .config
            .read()
            .map_or_else(|p| Arc::clone(&p.into_inner()), |c| Arc::clone(&c));
        let registry = match &config.beads_dir {
            Some(d) => Registry::new(d),
            None => match Registry::from_env() {
                Ok(r) => r,
                Err(e) if for_commands => {
                    return Err(format!("{e} (or set beads_dir in config.toml)"));
                }
                Err(_) => Registry::new(PathBuf::new()),
            },
        };
        Ok(Env {
            registry,
            uid: ollie_beads::current_uid(),
            shadow_root: shadow.to_path_buf(),
        })
    }

    /// Runs a changing command on a copy, saves the copy, then makes it current; on any error
    /// nothing changes. Commands on one namespace are serialised.
    pub(crate) fn execute(&self, env: &Env, cmd: &Command) -> Result<String, String> {
        let (file, _) = self.place()?;
        let mut cur = lock(&self.ns);
        let mut next = cur.clone();
        let outcome = next.execute(env, cmd).map_err(|e| e.to_string())?;
        next.save(file)
            .map_err(|e| format!("cannot save the namespace: {e}"))?;
        *cur = next;
        Ok(outcome.reply())
    }

    /// Loads the namespace file (if there is one), settles it, and removes temp files an
    /// interrupted save left. Problems are returned, never fatal: the namespace stays empty.
    pub fn restore(&self) -> Vec<NsProblem> {
        let mut problems = Vec::new();
        let Ok((file, _)) = self.place() else {
            return problems;
        };
        if let Some(dir) = file.parent() {
            clean_temp_files(dir);
        }
        match fs::symlink_metadata(file) {
            Err(e) if e.kind() == ErrorKind::NotFound => return problems,
            _ => {}
        }
        let ns = match Namespace::load(file) {
            Ok(ns) => ns,
            Err(e) => {
                problems.push((
                    file.to_path_buf(),
                    format!("{e}; the namespace starts empty"),
                ));
                return problems;
            }
        };
        self.set(ns.clone());
        let Ok(env) = self.env(false) else {
            return problems;
        };
        for p in ns.points() {
            if p.create_target().is_none() {
                continue;
            }
            match ns.settle(&env, p.path()) {
                Ok(r) => {
                    for m in &r.moved {
                        tracing::info!(point = p.path(), file = %m.rel, to = %m.to.display(), "moved a shadow file into the create target");
                    }
                }
                Err(e) => problems.push((
                    file.to_path_buf(),
                    format!("{}: cannot settle the shadow layer: {e}", p.path()),
                )),
            }
        }
        problems
    }

    /// The point served as the directory `name`, if there is one.
    pub(crate) fn point_named(&self, name: &str) -> Option<String> {
        lock(&self.ns)
            .points()
            .iter()
            .find(|p| p.dir_name() == name)
            .map(|p| p.path().to_owned())
    }

    /// Reads the whole file `rel` of `point` (at most [`MAX_FILE`]).
    pub(crate) fn read_file(&self, point: &str, rel: &str) -> Result<Vec<u8>, String> {
        let env = self.env(false)?;
        let ns = self.snapshot();
        let vp = view_path(point, rel);
        let r = ns
            .lookup(&env, point, rel)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{vp}: file does not exist"))?;
        if r.node == NodeKind::Dir {
            return Err(format!("{vp}: is a directory"));
        }
        let f = r.open(false).map_err(|e| format!("{vp}: {e}"))?;
        let mut data = Vec::new();
        f.take(MAX_FILE + 1)
            .read_to_end(&mut data)
            .map_err(|e| format!("{vp}: {e}"))?;
        if data.len() as u64 > MAX_FILE {
            return Err(format!(
                "{vp}: larger than {} MiB (read it over 9P instead)",
                MAX_FILE >> 20
            ));
        }
        Ok(data)
    }

    /// Creates or replaces the file `rel` of `point` with `content`, making missing parent
    /// directories below a kind folder. Returns the bytes written.
    pub(crate) fn write_file(
        &self,
        point: &str,
        rel: &str,
        content: &[u8],
    ) -> Result<usize, String> {
        let vp = view_path(point, rel);
        if content.len() as u64 > MAX_FILE {
            return Err(format!(
                "{vp}: {} bytes is more than {} MiB",
                content.len(),
                MAX_FILE >> 20
            ));
        }
        let env = self.env(false)?;
        let ns = self.snapshot();
        let s = |e: ollie_beads::Error| e.to_string();
        let target = match ns.lookup(&env, point, rel).map_err(s)? {
            Some(r) if r.node == NodeKind::Dir => return Err(format!("{vp}: is a directory")),
            Some(_) => ns.open_write(&env, point, rel).map_err(s)?,
            None => {
                make_kind_parents(&ns, &env, point, rel)?;
                match ns.create(&env, point, rel, NodeKind::File) {
                    Ok(r) => r,
                    Err(ollie_beads::Error::Exists { .. }) => {
                        ns.open_write(&env, point, rel).map_err(s)?
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
        };
        let mut f = target.open(true).map_err(|e| format!("{vp}: {e}"))?;
        crate::util::blocking(|| {
            f.set_len(0)
                .and_then(|()| f.write_all(content))
                .and_then(|()| f.sync_all())
        })
        .map_err(|e| format!("{vp}: {e}"))?;
        Ok(content.len())
    }
}

/// `/ctx` + `/` + `rel`, for messages.
pub(crate) fn view_path(point: &str, rel: &str) -> String {
    if rel.is_empty() {
        point.to_owned()
    } else {
        format!("{point}/{rel}")
    }
}

/// Makes the missing directories between a kind folder and `rel`'s last component (each
/// routed like a create). Outside the kind folders nothing is made.
pub(crate) fn make_kind_parents(
    ns: &Namespace,
    env: &Env,
    point: &str,
    rel: &str,
) -> Result<(), String> {
    let comps: Vec<&str> = rel.split('/').collect();
    if comps.len() < 3 || Kind::from_name(comps[0]).is_none() {
        return Ok(());
    }
    for i in 2..comps.len() {
        let dir = comps[..i].join("/");
        match ns.lookup(env, point, &dir).map_err(|e| e.to_string())? {
            Some(r) if r.node == NodeKind::Dir => {}
            Some(_) => return Err(format!("{}: not a directory", view_path(point, &dir))),
            None => match ns.create(env, point, &dir, NodeKind::Dir) {
                Ok(_) | Err(ollie_beads::Error::Exists { .. }) => {}
                Err(e) => return Err(e.to_string()),
            },
        }
    }
    Ok(())
}

/// Removes `.ns.json.tmp-…` files an interrupted save left in `dir`.
pub(crate) fn clean_temp_files(dir: &Path) {
    let Ok(rd) = fs::read_dir(dir) else {
        return;
    };
    let prefix = format!(".{NS_FILE}.tmp-");
    for e in rd.flatten() {
        if e.file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix))
        {
            let p = e.path();
            tracing::info!(path = %p.display(), "deleting a leftover of an interrupted namespace save");
            let _ = fs::remove_file(&p);
        }
    }
}

/// `path` split into a point of `points` and the path below it: `None` when `path` is not
/// absolute or its first component is not a point; an error for `..` below a point.
pub(crate) fn split_path(
    points: &[String],
    path: &str,
) -> Option<Result<(String, String), String>> {
    let mut comps = Path::new(path).components();
    if comps.next() != Some(Component::RootDir) {
        return None;
    }
    let Some(Component::Normal(first)) = comps.next() else {
        return None;
    };
    let point = format!("/{}", first.to_str()?);
    if !points.contains(&point) {
        return None;
    }
    let mut rel = Vec::new();
    for c in comps {
        match c {
            Component::Normal(n) => rel.push(n.to_str()?.to_owned()),
            Component::ParentDir => {
                return Some(Err(format!(
                    "invalid path {path:?}: `..` is not allowed below a mount point (invalid argument)"
                )));
            }
            _ => {}
        }
    }
    Some(Ok((point, rel.join("/"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pts(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn paths_split_at_a_point() {
        let p = pts(&["/ctx", "/lib"]);
        assert_eq!(
            split_path(&p, "/ctx/notes/a.md"),
            Some(Ok(("/ctx".into(), "notes/a.md".into())))
        );
        assert_eq!(split_path(&p, "/ctx"), Some(Ok(("/ctx".into(), "".into()))));
        assert_eq!(
            split_path(&p, "/ctx/"),
            Some(Ok(("/ctx".into(), "".into())))
        );
        assert_eq!(
            split_path(&p, "/lib//x/./y"),
            Some(Ok(("/lib".into(), "x/y".into())))
        );
        assert_eq!(split_path(&p, "/ctxx/a"), None);
        assert_eq!(split_path(&p, "ctx/a"), None);
        assert_eq!(split_path(&p, "/"), None);
        assert_eq!(split_path(&p, "/other/ctx"), None);
        let e = split_path(&p, "/ctx/../etc/passwd").unwrap().unwrap_err();
        assert!(e.contains("invalid argument"), "{e}");
        assert!(!e.contains('\n'));
    }

    fn home(dir: &Path, beads: &Path) -> NsHome {
        let mut c = Config::builtin();
        c.beads_dir = Some(beads.to_path_buf());
        NsHome::new(
            "11111111-1111-4111-8111-111111111111",
            Ok(dir.to_path_buf()),
            Arc::new(RwLock::new(Arc::new(c))),
        )
    }

    fn run(h: &NsHome, line: &str) -> Result<String, String> {
        let env = h.env(true)?;
        let cmd = Command::parse(line)?;
        h.execute(&env, &cmd)
    }

    #[test]
    fn commands_save_and_restore_and_a_failed_one_changes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let (dir, beads) = (t.path().join("s"), t.path().join("beads"));
        std::fs::create_dir(&dir).unwrap();
        let h = home(&dir, &beads);
        let uri = run(&h, "start notes-x").unwrap();
        assert!(uri.starts_with("file:///") && uri.ends_with("/\n"), "{uri}");
        run(&h, "mount -c notes-x /ctx").unwrap();
        let table = h.table();
        assert!(
            table.starts_with("/ctx (union)\n  [1] notes-x file:///"),
            "{table}"
        );
        assert!(dir.join(NS_FILE).is_file());
        // A failing command: nothing changes, in memory or on disk.
        let before = std::fs::read(dir.join(NS_FILE)).unwrap();
        assert!(run(&h, "unmount nope /ctx").is_err());
        assert!(run(&h, "mount -c notes-x /lib").is_ok());
        let e = run(&h, "mount -ac /nowhere/at/all /ctx").unwrap_err();
        assert!(!e.contains('\n'), "{e}");
        assert_ne!(std::fs::read(dir.join(NS_FILE)).unwrap(), before);
        let saved = std::fs::read(dir.join(NS_FILE)).unwrap();
        assert!(run(&h, "mount B").is_err());
        assert_eq!(std::fs::read(dir.join(NS_FILE)).unwrap(), saved);

        // The agent-style file API through the same view.
        let a = home(&dir.join("a"), &beads);
        std::fs::create_dir(dir.join("a")).unwrap();
        a.set(h.fork("22222222-2222-4222-8222-222222222222"));
        assert_eq!(a.points(), ["/ctx", "/lib"]);
        assert_eq!(
            a.write_file("/ctx", "notes/deep/er/n.md", b"hi").unwrap(),
            2
        );
        assert_eq!(a.read_file("/ctx", "notes/deep/er/n.md").unwrap(), b"hi");
        let bead = uri.trim_end().strip_prefix("file://").unwrap().to_owned();
        let today = ollie_beads::utc_today();
        assert_eq!(
            std::fs::read(Path::new(&bead).join(&today).join("notes/deep/er/n.md")).unwrap(),
            b"hi"
        );
        let e = a.write_file("/ctx", "nodir/x", b"x").unwrap_err();
        assert!(e.contains("file does not exist"), "{e}");
        assert!(
            a.read_file("/ctx", "notes")
                .unwrap_err()
                .contains("is a directory")
        );

        // Restore into a fresh home: the same table.
        let h2 = home(&dir, &beads);
        assert_eq!(h2.restore(), vec![]);
        assert_eq!(h2.table(), h.table());

        // A corrupt file: a problem, and an empty namespace.
        std::fs::write(dir.join(NS_FILE), b"{not json").unwrap();
        let h3 = home(&dir, &beads);
        let p = h3.restore();
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].1.contains("the namespace starts empty"), "{p:?}");
        assert_eq!(h3.table(), "");
    }

    #[test]
    fn views_refuse_to_resurrect_a_removed_directory() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("gone");
        let h = home(&dir, &t.path().join("beads"));
        let e = h.env(false).unwrap_err();
        assert!(e.contains("file does not exist"), "{e}");
        assert!(!dir.exists());
    }
}
