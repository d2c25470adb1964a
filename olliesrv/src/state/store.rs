//! The durable state of olliesrv: sessions, agents, plans, chat logs and histories on disk.
//!
//! Layout under the state directory ([`default_dir`]):
//!
//! ```text
//! <dir>/                                                 0700
//! <dir>/sessions/<session-id>/session.json
//! <dir>/sessions/<session-id>/ns.json                    the session's bead namespace (crate::state::ns)
//! <dir>/sessions/<session-id>/ns-shadow/                 its shadow layers, one directory a point
//! <dir>/sessions/<session-id>/agents/<agent-id>/agent.json
//! <dir>/sessions/<session-id>/agents/<agent-id>/ns.json  the agent's own bead namespace
//! <dir>/sessions/<session-id>/agents/<agent-id>/ns-shadow/
//! <dir>/sessions/<session-id>/agents/<agent-id>/plan
//! <dir>/sessions/<session-id>/agents/<agent-id>/chat.raw        append-only
//! <dir>/sessions/<session-id>/agents/<agent-id>/history.jsonl   append-only, one JSON value a line
//! ```
//!
//! Guarantees:
//! - Path components are only validated ids (lowercase UUIDs, [`is_valid_id`]), never names.
//! - A successful return means the change survives a power cut on a normal filesystem: files
//!   are fsynced, and so is every directory whose entries changed.
//! - Records and plans are replaced atomically (temp file in the same directory, fsync,
//!   rename, fsync directory). A new session or agent directory is built under a hidden name
//!   with its record inside and renamed into place, so a crash never leaves a directory
//!   without its record. Removal renames the directory to a hidden tombstone (durably) before
//!   deleting it, so a crash mid-way never leaves a half session or agent that loads.
//! - [`Store::load`] never fails as a whole: every unreadable, corrupt or misplaced file
//!   is a [`Problem`] and only the session or agent it belongs to is skipped. Leftovers of
//!   interrupted writes, creations and removals by earlier processes are deleted.
//! - Appends ([`Store::append_chat`], [`Store::append_history`]) return only once the bytes
//!   are durable (or, with [`Sync::WithNext`], are made durable by the file's next sync); a
//!   failed append is cut off again (best effort). A torn last history line
//!   (a crash mid-append) is reported by [`Store::read_history`] and cut off before the next
//!   append, so it never swallows a later line.
//! - Files are created 0600 and directories 0700 (less if the umask says so).
//!
//! Not guaranteed:
//! - The state directory's own mode: it is created 0700 if missing, but an existing one is
//!   used as it is (never chmodded). Under systemd, set `StateDirectoryMode=0700`.
//! - Exclusion of a second olliesrv on the same directory: that is the server's `<dir>/lock`
//!   (`lib.rs`), not the store's; two stores on one directory would overwrite each other.
//! - Everything is blocking std I/O; async callers run it on a blocking thread.
//!
//! Tested by the unit tests below, on real temporary directories.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::util::blocking;

/// Mode of every directory the store creates.
const DIR_MODE: u32 = 0o700;
/// Mode of every file the store creates.
const FILE_MODE: u32 = 0o600;
/// How many append handles (chat.raw, history.jsonl) stay open between appends.
pub const APPEND_HANDLES: usize = 64;

pub(super) const SESSIONS: &str = "sessions";
pub(super) const AGENTS: &str = "agents";
pub(super) const SESSION_FILE: &str = "session.json";
pub(super) const AGENT_FILE: &str = "agent.json";
pub(super) const PLAN_FILE: &str = "plan";
pub(super) const CHAT_FILE: &str = "chat.raw";
pub(super) const HISTORY_FILE: &str = "history.jsonl";

/// Prefix of a session or agent directory being created (`.new-<id>-<tag>-<n>`).
const STAGED_PREFIX: &str = ".new-";
/// Prefix of a session or agent directory being removed (`.removed-<id>-<tag>-<n>`).
const TOMB_PREFIX: &str = ".removed-";
/// Marker of a file being replaced (`.<name>.tmp-<tag>-<n>`).
const TMP_MARKER: &str = ".tmp-";

/// The state directory: `$STATE_DIRECTORY` (its first entry) under systemd, else
/// `$XDG_STATE_HOME/ollie`, else `~/.local/state/ollie`. Relative or empty values are
/// skipped, as the XDG specification asks. `None` if none of them is usable.
pub fn default_dir() -> Option<PathBuf> {
    dir_from_env(|k| std::env::var_os(k))
}

fn dir_from_env(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let absolute = |v: &[u8]| {
        let p = Path::new(std::ffi::OsStr::from_bytes(v));
        p.is_absolute().then(|| p.to_path_buf())
    };
    // systemd passes one absolute path per StateDirectory= entry, separated by colons.
    if let Some(v) = var("STATE_DIRECTORY")
        && let Some(p) = v.as_bytes().split(|b| *b == b':').find_map(absolute)
    {
        return Some(p);
    }
    if let Some(p) = var("XDG_STATE_HOME").and_then(|v| absolute(v.as_bytes())) {
        return Some(p.join("ollie"));
    }
    let home = var("HOME").and_then(|v| absolute(v.as_bytes()))?;
    Some(home.join(".local/state/ollie"))
}

/// Whether `s` is an id the store accepts: a lowercase UUID (`8-4-4-4-12` hex digits).
pub fn is_valid_id(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// When an append must be durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sync {
    /// Before the append returns.
    Now,
    /// With the next [`Sync::Now`] append to the same file (fdatasync flushes everything
    /// written before it), or with [`Store::sync_chat_and_history`]: for a record always
    /// followed at once by another one. A crash in between loses both, never only the later
    /// one. A tool call waits for one sync: its call and result blocks and its two history
    /// lines are made durable by the two files' syncs, run side by side.
    WithNext,
}

/// A session as stored in `session.json`. Unknown keys are ignored and optional ones default
/// (files written by a newer olliesrv still load); a key with the wrong type is an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// Immutable UUID; also the directory name.
    pub id: String,
    /// Mutable display name (never a path component).
    pub name: String,
    /// Working directory of the session.
    pub cwd: PathBuf,
    #[serde(default)]
    pub backend: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub profile: Option<String>,
    #[serde(default)]
    pub remote: Option<String>,
    #[serde(default)]
    pub paused: bool,
    /// Creation time, unix seconds.
    pub created: u64,
    /// Creation sequence number; sessions load in this order.
    #[serde(default)]
    pub order: u64,
    /// The most the session may spend, in US dollars (`None`: the configured default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_cap_usd: Option<f64>,
}

/// An agent as stored in `agent.json`; tolerant reading as for [`SessionRecord`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    /// Immutable UUID; also the directory name.
    pub id: String,
    /// The id of the session the agent belongs to.
    pub session: String,
    /// Mutable display name (never a path component).
    pub name: String,
    pub cwd: PathBuf,
    #[serde(default)]
    pub backend: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub profile: Option<String>,
    /// The other cfg keys.
    #[serde(default)]
    pub cfg: BTreeMap<String, String>,
    /// Creation time, unix seconds.
    pub created: u64,
    /// Creation sequence number; agents load in this order.
    #[serde(default)]
    pub order: u64,
    #[serde(default)]
    pub stats: BTreeMap<String, String>,
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Prompts queued and not yet taken by a turn (a write to `prompt` is acknowledged only
    /// once it is here).
    #[serde(default)]
    pub queue: Vec<String>,
    /// The prompt of the turn in flight, if one was running when this was written (on
    /// restore the turn is reported as interrupted).
    #[serde(default)]
    pub in_turn: Option<String>,
    /// Why the agent's `agent_spawn` hook blocked it (its turns fail with this), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<String>,
}

/// Everything [`Store::load`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loaded {
    /// Sorted by `order`, then `created`, then id.
    pub sessions: Vec<LoadedSession>,
    /// What could not be loaded or cleaned, and why.
    pub problems: Vec<Problem>,
}

/// A session and its agents as loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedSession {
    pub record: SessionRecord,
    /// Sorted by `order`, then `created`, then id.
    pub agents: Vec<LoadedAgent>,
}

/// An agent as loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedAgent {
    pub record: AgentRecord,
    /// The plan's bytes (empty if there is none).
    pub plan: Vec<u8>,
    /// The length of `chat.raw` (0 if there is none).
    pub chat_raw_len: u64,
}

/// A file or directory that could not be used, and why (one line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: PathBuf,
    pub reason: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

impl Problem {
    fn new(path: &Path, reason: impl Into<String>) -> Problem {
        Problem {
            path: path.to_path_buf(),
            reason: reason.into().replace('\n', " "),
        }
    }
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "invalid {what} id {id:?} (expected a lowercase uuid such as 123e4567-e89b-42d3-a456-426614174000)"
    )]
    InvalidId { what: &'static str, id: String },
    #[error("{what} does not exist: {path}")]
    Missing { what: &'static str, path: PathBuf },
    #[error("cannot {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot encode {path}")]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl StoreError {
    /// Whether the session or agent the operation was about does not exist.
    pub fn is_missing(&self) -> bool {
        matches!(self, StoreError::Missing { .. })
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Like [`io_err`], but "not found" means that the session or agent at `dir` is missing.
fn io_or_missing<'a>(
    op: &'static str,
    path: &'a Path,
    what: &'static str,
    dir: &'a Path,
) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| {
        if source.kind() == ErrorKind::NotFound {
            StoreError::Missing {
                what,
                path: dir.to_path_buf(),
            }
        } else {
            StoreError::Io {
                op,
                path: path.to_path_buf(),
                source,
            }
        }
    }
}

fn check_id(what: &'static str, id: &str) -> Result<(), StoreError> {
    if is_valid_id(id) {
        Ok(())
    } else {
        Err(StoreError::InvalidId {
            what,
            id: id.to_string(),
        })
    }
}

/// What tells this process's hidden names from those of earlier processes: the pid and the
/// start time, so a reused pid (pid 1 in a container) still differs.
fn instance_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}x{nanos:x}", std::process::id())
    })
}

/// `<tag>-<n>`, unique within this process and (with high probability) across processes.
fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        instance_tag(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The kinds of hidden entry the store leaves behind while it works.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Hidden<'a> {
    /// A staged or tombstoned directory, with the tag of the process that made it.
    Dir(&'a str),
    /// A temp file of an atomic replace, with the tag of the process that made it.
    TempFile(&'a str),
}

pub(super) fn hidden_kind(name: &str) -> Option<Hidden<'_>> {
    for prefix in [STAGED_PREFIX, TOMB_PREFIX] {
        if let Some(rest) = name.strip_prefix(prefix) {
            let (id, rest) = rest.split_at_checked(36)?;
            let rest = rest.strip_prefix('-')?;
            let (tag, _) = rest.rsplit_once('-')?;
            return is_valid_id(id).then_some(Hidden::Dir(tag));
        }
    }
    if name.starts_with('.') {
        let (_, rest) = name.rsplit_once(TMP_MARKER)?;
        let (tag, _) = rest.rsplit_once('-')?;
        return Some(Hidden::TempFile(tag));
    }
    None
}

/// Creates one directory (0700) and makes its entry durable; an existing one is fine.
fn mkdir_one(path: &Path, parent: &Path) -> Result<(), io::Error> {
    match DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => fsync_dir_io(parent),
        Err(e) if e.kind() == ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates `path` and any missing parents (each 0700), durably.
fn mkdir_all(path: &Path) -> Result<(), StoreError> {
    if path.is_dir() {
        return Ok(());
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    mkdir_all(parent)?;
    mkdir_one(path, parent).map_err(io_err("create directory", path))
}

fn fsync_dir_io(path: &Path) -> Result<(), io::Error> {
    File::open(path)?.sync_all()
}

fn fsync_dir(path: &Path) -> Result<(), StoreError> {
    fsync_dir_io(path).map_err(io_err("sync directory", path))
}

/// Writes a new file (0600) and fsyncs it.
fn write_new_file(path: &Path, data: &[u8]) -> Result<(), io::Error> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)?;
    f.write_all(data)?;
    f.sync_all()
}

fn remove_quietly(path: &Path) {
    if let Err(e) = fs::remove_file(path)
        && e.kind() != ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove temp file");
    }
}

/// Replaces `dir/name` atomically and durably. `what` names the thing `dir` is, for the
/// error when it does not exist.
fn write_atomic(dir: &Path, name: &str, data: &[u8], what: &'static str) -> Result<(), StoreError> {
    blocking(|| write_atomic_now(dir, name, data, what))
}

fn write_atomic_now(
    dir: &Path,
    name: &str,
    data: &[u8],
    what: &'static str,
) -> Result<(), StoreError> {
    let tmp = dir.join(format!(".{name}{TMP_MARKER}{}", unique_suffix()));
    let path = dir.join(name);
    if let Err(e) = write_new_file(&tmp, data) {
        remove_quietly(&tmp);
        return Err(io_or_missing("write", &path, what, dir)(e));
    }
    if let Err(e) = fs::rename(&tmp, &path) {
        remove_quietly(&tmp);
        return Err(io_or_missing("replace", &path, what, dir)(e));
    }
    fsync_dir(dir)
}

fn encode<T: Serialize>(value: &T, path: &Path) -> Result<Vec<u8>, StoreError> {
    let mut data = serde_json::to_vec_pretty(value).map_err(|source| StoreError::Encode {
        path: path.to_path_buf(),
        source,
    })?;
    data.push(b'\n');
    Ok(data)
}

/// Creates `parent/id/` holding `file` (and empty `subdirs`) in one durable step: it is built
/// under a hidden name and renamed into place. If `parent/id` appeared meanwhile, `file` is
/// replaced in it instead.
fn create_entry(
    parent: &Path,
    id: &str,
    file: &str,
    data: &[u8],
    subdirs: &[&str],
    what: &'static str,
) -> Result<(), StoreError> {
    let dir = parent.join(id);
    let staged = parent.join(format!("{STAGED_PREFIX}{id}-{}", unique_suffix()));
    let build = || -> Result<(), StoreError> {
        DirBuilder::new()
            .mode(DIR_MODE)
            .create(&staged)
            .map_err(io_err("create directory", &staged))?;
        for s in subdirs {
            let p = staged.join(s);
            DirBuilder::new()
                .mode(DIR_MODE)
                .create(&p)
                .map_err(io_err("create directory", &p))?;
        }
        let f = staged.join(file);
        write_new_file(&f, data).map_err(io_err("write", &f))?;
        fsync_dir(&staged)
    };
    if let Err(e) = build() {
        remove_tree_quietly(&staged);
        return Err(e);
    }
    match fs::rename(&staged, &dir) {
        Ok(()) => fsync_dir(parent),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::DirectoryNotEmpty | ErrorKind::AlreadyExists
            ) =>
        {
            remove_tree_quietly(&staged);
            write_atomic(&dir, file, data, what)
        }
        Err(e) => {
            remove_tree_quietly(&staged);
            Err(io_err("create", &dir)(e))
        }
    }
}

fn remove_tree_quietly(path: &Path) {
    if let Err(e) = fs::remove_dir_all(path)
        && e.kind() != ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove directory");
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An open append handle and when it was last used.
#[derive(Debug)]
struct Appender {
    file: Arc<Mutex<File>>,
    used: u64,
}

/// The open append handles, at most one per file (so appends to one file are serialized by
/// its mutex), bounded by [`APPEND_HANDLES`] unless more than that are in use at once.
#[derive(Debug, Default)]
struct Appenders {
    files: HashMap<PathBuf, Appender>,
    tick: u64,
}

/// The state directory and its open append handles. Safe to share between threads.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    sessions: PathBuf,
    appenders: Mutex<Appenders>,
}

impl Store {
    /// Opens the store at `dir`, creating it (and missing parents) 0700 and `sessions/` if
    /// they are missing. An existing `dir` is used with the mode it has.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let sessions = dir.join(SESSIONS);
        mkdir_all(&sessions)?;
        Ok(Store {
            dir: dir.to_path_buf(),
            sessions,
            appenders: Mutex::new(Appenders::default()),
        })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn session_dir(&self, session: &str) -> Result<PathBuf, StoreError> {
        check_id("session", session)?;
        Ok(self.sessions.join(session))
    }

    fn agent_dir(&self, session: &str, agent: &str) -> Result<PathBuf, StoreError> {
        let s = self.session_dir(session)?;
        check_id("agent", agent)?;
        Ok(s.join(AGENTS).join(agent))
    }

    /// The directory of a session (`<dir>/sessions/<id>/`, not created), for state other
    /// modules keep beside its record (the bead namespace, [`crate::state::ns`]). It goes with the
    /// session when the session is removed.
    pub fn session_path(&self, session: &str) -> Result<PathBuf, StoreError> {
        self.session_dir(session)
    }

    /// The directory of an agent (`<dir>/sessions/<sid>/agents/<aid>/`, not created), as
    /// [`Store::session_path`] is for a session.
    pub fn agent_path(&self, session: &str, agent: &str) -> Result<PathBuf, StoreError> {
        self.agent_dir(session, agent)
    }

    /// Every session and agent on disk. Never fails as a whole: an unreadable, corrupt or
    /// misplaced file is a [`Problem`], and only its session (bad `session.json`) or agent
    /// (bad `agent.json`) is skipped. Deletes what interrupted writes, creations and
    /// removals of earlier processes left behind (this process's own are left alone, so
    /// loading while saving is safe).
    pub fn load(&self) -> Loaded {
        let mut problems = Vec::new();
        let mut sessions = Vec::new();
        for (name, path) in entries(&self.sessions, &mut problems) {
            match name.as_deref() {
                Some(id) if is_valid_id(id) => {
                    if let Some(s) = self.load_session(id, &path, &mut problems) {
                        sessions.push(s);
                    }
                }
                other => unexpected_entry(other, &path, "a session id", &mut problems),
            }
        }
        sessions.sort_by(|a: &LoadedSession, b| {
            (a.record.order, a.record.created, &a.record.id).cmp(&(
                b.record.order,
                b.record.created,
                &b.record.id,
            ))
        });
        Loaded { sessions, problems }
    }

    fn load_session(
        &self,
        id: &str,
        dir: &Path,
        problems: &mut Vec<Problem>,
    ) -> Option<LoadedSession> {
        if !dir.is_dir() {
            problems.push(Problem::new(dir, "not a directory; ignored"));
            return None;
        }
        let path = dir.join(SESSION_FILE);
        let record: SessionRecord = match read_record(&path, "session") {
            Ok(r) => r,
            Err(p) => {
                problems.push(p);
                return None;
            }
        };
        if record.id != id {
            problems.push(Problem::new(
                &path,
                format!(
                    "id {:?} does not match its directory; session skipped",
                    record.id
                ),
            ));
            return None;
        }
        clean_temp_files(dir, problems);
        let mut agents = Vec::new();
        let agents_dir = dir.join(AGENTS);
        if agents_dir.exists() {
            for (name, path) in entries(&agents_dir, problems) {
                match name.as_deref() {
                    Some(aid) if is_valid_id(aid) => {
                        if let Some(a) = load_agent(id, aid, &path, problems) {
                            agents.push(a);
                        }
                    }
                    other => unexpected_entry(other, &path, "an agent id", problems),
                }
            }
        }
        agents.sort_by(|a: &LoadedAgent, b| {
            (a.record.order, a.record.created, &a.record.id).cmp(&(
                b.record.order,
                b.record.created,
                &b.record.id,
            ))
        });
        Some(LoadedSession { record, agents })
    }

    /// Writes `session.json` atomically; creates the session directory if it is new.
    pub fn save_session(&self, r: &SessionRecord) -> Result<(), StoreError> {
        let dir = self.session_dir(&r.id)?;
        let data = encode(r, &dir.join(SESSION_FILE))?;
        blocking(|| {
            if dir.is_dir() {
                write_atomic(&dir, SESSION_FILE, &data, "session")
            } else {
                create_entry(
                    &self.sessions,
                    &r.id,
                    SESSION_FILE,
                    &data,
                    &[AGENTS],
                    "session",
                )
            }
        })
    }

    /// Writes `agent.json` atomically; creates the agent directory if it is new. The session
    /// must exist.
    pub fn save_agent(&self, r: &AgentRecord) -> Result<(), StoreError> {
        let dir = self.agent_dir(&r.session, &r.id)?;
        let data = encode(r, &dir.join(AGENT_FILE))?;
        blocking(|| {
            if dir.is_dir() {
                return write_atomic(&dir, AGENT_FILE, &data, "agent");
            }
            let session_dir = self.sessions.join(&r.session);
            let parent = session_dir.join(AGENTS);
            // Never create the session directory itself: a save racing with the session's
            // removal must not bring it back.
            mkdir_one(&parent, &session_dir).map_err(io_or_missing(
                "create directory",
                &parent,
                "session",
                &session_dir,
            ))?;
            create_entry(&parent, &r.id, AGENT_FILE, &data, &[], "agent")
        })
    }

    /// Replaces the agent's plan atomically. The agent must exist.
    pub fn save_plan(&self, session: &str, agent: &str, plan: &[u8]) -> Result<(), StoreError> {
        let dir = self.agent_dir(session, agent)?;
        write_atomic(&dir, PLAN_FILE, plan, "agent")
    }

    /// Removes a session and its agents. The directory is first renamed to a hidden
    /// tombstone (durably), then deleted; a tombstone left by a crash is deleted by the next
    /// [`Store::load`] and never loads.
    pub fn remove_session(&self, id: &str) -> Result<(), StoreError> {
        let dir = self.session_dir(id)?;
        self.bury(&self.sessions, id, &dir, "session")
    }

    /// Removes an agent, as [`Store::remove_session`] does a session.
    pub fn remove_agent(&self, session: &str, agent: &str) -> Result<(), StoreError> {
        let dir = self.agent_dir(session, agent)?;
        let parent = self.sessions.join(session).join(AGENTS);
        self.bury(&parent, agent, &dir, "agent")
    }

    fn bury(
        &self,
        parent: &Path,
        id: &str,
        dir: &Path,
        what: &'static str,
    ) -> Result<(), StoreError> {
        blocking(|| self.bury_now(parent, id, dir, what))
    }

    fn bury_now(
        &self,
        parent: &Path,
        id: &str,
        dir: &Path,
        what: &'static str,
    ) -> Result<(), StoreError> {
        let tomb = parent.join(format!("{TOMB_PREFIX}{id}-{}", unique_suffix()));
        {
            // Under the lock, so no append handle into `dir` is opened between the two.
            let mut a = lock(&self.appenders);
            a.files.retain(|p, _| !p.starts_with(dir));
            fs::rename(dir, &tomb).map_err(io_or_missing("remove", dir, what, dir))?;
        }
        fsync_dir(parent)?;
        // The removal is durable now; what remains is cleaning up.
        remove_tree_quietly(&tomb);
        Ok(())
    }

    /// Appends to `chat.raw`; with [`Sync::Now`] returns once the bytes are durable, with
    /// [`Sync::WithNext`] they become durable with the next synced append (for a block that
    /// is always followed by another at once). The agent must exist.
    pub fn append_chat(
        &self,
        session: &str,
        agent: &str,
        bytes: &[u8],
        sync: Sync,
    ) -> Result<(), StoreError> {
        let dir = self.agent_dir(session, agent)?;
        self.append(&dir, CHAT_FILE, bytes, sync)
    }

    /// Reads up to `len` bytes of `chat.raw` from `offset`; shorter at the end of the file,
    /// empty past it (or if nothing was appended yet).
    pub fn read_chat(
        &self,
        session: &str,
        agent: &str,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, StoreError> {
        let dir = self.agent_dir(session, agent)?;
        let path = dir.join(CHAT_FILE);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound && dir.is_dir() => return Ok(Vec::new()),
            Err(e) => return Err(io_or_missing("open", &path, "agent", &dir)(e)),
        };
        let size = file.metadata().map_err(io_err("inspect", &path))?.len();
        let avail = size.saturating_sub(offset);
        let n = usize::try_from(avail).map_or(len, |a| a.min(len));
        let mut buf = vec![0; n];
        let mut got = 0;
        while got < n {
            // `got` is at most `n`, which fits between `offset` and `size`.
            let at = offset.saturating_add(got as u64);
            match file.read_at(&mut buf[got..], at) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err("read", &path)(e)),
            }
        }
        buf.truncate(got);
        Ok(buf)
    }

    /// Appends `line` (compact JSON and a newline) to `history.jsonl`; durable as
    /// [`Store::append_chat`] says for `sync`. The agent must exist.
    pub fn append_history(
        &self,
        session: &str,
        agent: &str,
        line: &serde_json::Value,
        sync: Sync,
    ) -> Result<(), StoreError> {
        let dir = self.agent_dir(session, agent)?;
        // Stored without API keys ([`crate::redact`]). Compact JSON escapes newlines inside
        // strings, so this is exactly one line.
        let line = crate::redact::redact_json(line);
        let mut data = serde_json::to_vec(&*line).map_err(|source| StoreError::Encode {
            path: dir.join(HISTORY_FILE),
            source,
        })?;
        data.push(b'\n');
        self.append(&dir, HISTORY_FILE, &data, sync)
    }

    /// The agent's history, one value a line, each turned into a `T` by `each` as it is
    /// decoded (so that the whole history is never held as JSON values; `None` leaves a line
    /// out). A line that is not JSON is a [`Problem`] and skipped; so is an unterminated last
    /// line (an append cut short by a crash, never acknowledged). A missing file is an empty
    /// history.
    pub fn read_history<T>(
        &self,
        session: &str,
        agent: &str,
        each: impl FnMut(serde_json::Value) -> Option<T>,
    ) -> (Vec<T>, Vec<Problem>) {
        let dir = match self.agent_dir(session, agent) {
            Ok(d) => d,
            Err(e) => {
                return (
                    Vec::new(),
                    vec![Problem::new(&self.sessions, e.to_string())],
                );
            }
        };
        let path = dir.join(HISTORY_FILE);
        let data = match blocking(|| fs::read(&path)) {
            Ok(d) => d,
            Err(e) if e.kind() == ErrorKind::NotFound => return (Vec::new(), Vec::new()),
            Err(e) => {
                return (
                    Vec::new(),
                    vec![Problem::new(&path, format!("cannot read: {e}"))],
                );
            }
        };
        parse_history_as(&path, &data, each)
    }

    /// Empties `history.jsonl` durably (for `clear`). The agent must exist.
    pub fn truncate_history(&self, session: &str, agent: &str) -> Result<(), StoreError> {
        let dir = self.agent_dir(session, agent)?;
        let path = dir.join(HISTORY_FILE);
        let handle = self.appender(&dir, HISTORY_FILE)?;
        blocking(|| {
            let file = lock(&handle);
            file.set_len(0).map_err(io_err("truncate", &path))?;
            file.sync_all().map_err(io_err("sync", &path))
        })
    }

    /// Replaces the whole history (compaction), atomically: a crash leaves the old or the new
    /// one, never a mix. Appends wait meanwhile and then go to the new file.
    pub fn replace_history(
        &self,
        session: &str,
        agent: &str,
        lines: &[serde_json::Value],
    ) -> Result<(), StoreError> {
        let dir = self.agent_dir(session, agent)?;
        let path = dir.join(HISTORY_FILE);
        let mut data = Vec::new();
        for line in lines {
            let line = crate::redact::redact_json(line);
            serde_json::to_writer(&mut data, &*line).map_err(|source| StoreError::Encode {
                path: path.clone(),
                source,
            })?;
            data.push(b'\n');
        }
        let handle = self.appender(&dir, HISTORY_FILE)?;
        blocking(|| {
            let mut file = lock(&handle);
            write_atomic(&dir, HISTORY_FILE, &data, "history")?;
            *file = open_append(&dir, &path)?;
            Ok(())
        })
    }

    /// Appends `bytes` to `dir/name` and syncs; on failure cuts the file back (best effort),
    /// so an append that was not acknowledged does not stay.
    fn append(&self, dir: &Path, name: &str, bytes: &[u8], sync: Sync) -> Result<(), StoreError> {
        blocking(|| self.append_now(dir, name, bytes, sync))
    }

    fn append_now(
        &self,
        dir: &Path,
        name: &str,
        bytes: &[u8],
        sync: Sync,
    ) -> Result<(), StoreError> {
        let path = dir.join(name);
        let handle = self.appender(dir, name)?;
        let mut file = lock(&handle);
        let before = file.metadata().map_err(io_err("inspect", &path))?.len();
        let result = file
            .write_all(bytes)
            .map_err(io_err("append to", &path))
            .and_then(|()| match sync {
                Sync::Now => file.sync_data().map_err(io_err("sync", &path)),
                Sync::WithNext => Ok(()),
            });
        if result.is_err()
            && let Err(e) = file.set_len(before).and_then(|()| file.sync_data())
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot cut off a failed append");
        }
        result
    }

    /// Makes the agent's chat and history durable at once, after appends with
    /// [`Sync::WithNext`]: the two fdatasyncs run side by side (one on a thread of its own), so
    /// the caller waits for one disk round trip instead of two.
    pub fn sync_chat_and_history(&self, session: &str, agent: &str) -> Result<(), StoreError> {
        let dir = self.agent_dir(session, agent)?;
        let chat = self.appender(&dir, CHAT_FILE)?;
        let history = self.appender(&dir, HISTORY_FILE)?;
        let sync = |handle: &Mutex<File>, name: &str| {
            lock(handle)
                .sync_data()
                .map_err(io_err("sync", &dir.join(name)))
        };
        blocking(|| {
            std::thread::scope(|s| {
                // Without a thread of its own (the task limit reached), the history is synced
                // after the chat, as before.
                let h = std::thread::Builder::new()
                    .name("ollie-sync".into())
                    .spawn_scoped(s, || sync(&history, HISTORY_FILE));
                let c = sync(&chat, CHAT_FILE);
                let h = h
                    .ok()
                    .and_then(|h| h.join().ok())
                    .unwrap_or_else(|| sync(&history, HISTORY_FILE));
                c.and(h)
            })
        })
    }

    /// The append handle of `dir/name`, opened (and created) if needed.
    fn appender(&self, dir: &Path, name: &str) -> Result<Arc<Mutex<File>>, StoreError> {
        let path = dir.join(name);
        // Opening happens under the lock: there is never more than one handle per file, so
        // the torn-tail repair below cannot race with an append through another handle.
        let mut a = lock(&self.appenders);
        a.tick += 1;
        let tick = a.tick;
        if let Some(e) = a.files.get_mut(&path) {
            e.used = tick;
            return Ok(Arc::clone(&e.file));
        }
        let file = open_append(dir, &path)?;
        if name == HISTORY_FILE {
            cut_torn_tail(&file, &path)?;
        }
        if a.files.len() >= APPEND_HANDLES {
            // The least recently used handle nobody is appending through right now.
            let idle = a
                .files
                .iter()
                .filter(|(_, e)| Arc::strong_count(&e.file) == 1)
                .min_by_key(|(_, e)| e.used)
                .map(|(p, _)| p.clone());
            if let Some(p) = idle {
                a.files.remove(&p);
            }
        }
        let file = Arc::new(Mutex::new(file));
        a.files.insert(
            path,
            Appender {
                file: Arc::clone(&file),
                used: tick,
            },
        );
        Ok(file)
    }

    #[cfg(test)]
    fn open_appenders(&self) -> usize {
        lock(&self.appenders).files.len()
    }
}

/// Opens `path` for appending, creating it (0600, durably) in the existing directory `dir`.
fn open_append(dir: &Path, path: &Path) -> Result<File, StoreError> {
    let mut opts = OpenOptions::new();
    opts.append(true).mode(FILE_MODE);
    match opts.clone().create_new(true).open(path) {
        Ok(f) => {
            fsync_dir(dir)?;
            Ok(f)
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => opts
            .open(path)
            .map_err(io_or_missing("open", path, "agent", dir)),
        Err(e) => Err(io_or_missing("create", path, "agent", dir)(e)),
    }
}

/// Cuts an unterminated last line off a JSON-lines file (left by a crash mid-append), so
/// the next append starts on a line of its own.
fn cut_torn_tail(file: &File, path: &Path) -> Result<(), StoreError> {
    let reader = File::open(path).map_err(io_err("open", path))?;
    let len = reader.metadata().map_err(io_err("inspect", path))?.len();
    let mut end = len;
    let mut last = [0u8; 1];
    if len == 0 {
        return Ok(());
    }
    reader
        .read_exact_at(&mut last, len - 1)
        .map_err(io_err("read", path))?;
    if last[0] == b'\n' {
        return Ok(());
    }
    let mut keep = 0;
    let mut buf = vec![0u8; 8192];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        // `end - start` is at most `buf.len()`.
        let chunk = &mut buf[..usize::try_from(end - start).unwrap_or(0)];
        reader
            .read_exact_at(chunk, start)
            .map_err(io_err("read", path))?;
        if let Some(i) = chunk.iter().rposition(|b| *b == b'\n') {
            keep = start + i as u64 + 1;
            break;
        }
        end = start;
    }
    tracing::warn!(
        path = %path.display(),
        bytes = len - keep,
        "cutting off a torn last line (an interrupted append)"
    );
    file.set_len(keep).map_err(io_err("truncate", path))?;
    file.sync_all().map_err(io_err("sync", path))
}

pub(super) fn parse_history(path: &Path, data: &[u8]) -> (Vec<serde_json::Value>, Vec<Problem>) {
    parse_history_as(path, data, Some)
}

fn parse_history_as<T>(
    path: &Path,
    data: &[u8],
    mut each: impl FnMut(serde_json::Value) -> Option<T>,
) -> (Vec<T>, Vec<Problem>) {
    let mut values = Vec::new();
    let mut problems = Vec::new();
    let mut lines = data.split(|b| *b == b'\n').peekable();
    let mut n = 0;
    while let Some(line) = lines.next() {
        n += 1;
        if lines.peek().is_none() {
            // What follows the last newline: empty, or an append cut short.
            if !line.is_empty() {
                problems.push(Problem::new(
                    path,
                    format!(
                        "line {n}: torn last line ({} bytes without a newline, an interrupted append); ignored",
                        line.len()
                    ),
                ));
            }
            break;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice(line) {
            Ok(v) => values.extend(each(v)),
            Err(e) => problems.push(Problem::new(path, format!("line {n}: {e}; skipped"))),
        }
    }
    (values, problems)
}

/// Reads and decodes a record; the [`Problem`] says why `what` is skipped.
pub(super) fn read_record<T: DeserializeOwned>(path: &Path, what: &str) -> Result<T, Problem> {
    let data = fs::read(path).map_err(|e| {
        if e.kind() == ErrorKind::NotFound {
            Problem::new(path, format!("missing; {what} skipped"))
        } else {
            Problem::new(path, format!("cannot read: {e}; {what} skipped"))
        }
    })?;
    serde_json::from_slice(&data).map_err(|e| {
        let kind = match e.classify() {
            serde_json::error::Category::Data => "invalid record",
            _ => "invalid json",
        };
        Problem::new(path, format!("{kind}: {e}; {what} skipped"))
    })
}

fn load_agent(
    session: &str,
    id: &str,
    dir: &Path,
    problems: &mut Vec<Problem>,
) -> Option<LoadedAgent> {
    if !dir.is_dir() {
        problems.push(Problem::new(dir, "not a directory; ignored"));
        return None;
    }
    let path = dir.join(AGENT_FILE);
    let record: AgentRecord = match read_record(&path, "agent") {
        Ok(r) => r,
        Err(p) => {
            problems.push(p);
            return None;
        }
    };
    if record.id != id || record.session != session {
        problems.push(Problem::new(
            &path,
            format!(
                "id {:?} in session {:?} does not match its directory; agent skipped",
                record.id, record.session
            ),
        ));
        return None;
    }
    clean_temp_files(dir, problems);
    let plan_path = dir.join(PLAN_FILE);
    let plan = match fs::read(&plan_path) {
        Ok(p) => p,
        Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            problems.push(Problem::new(
                &plan_path,
                format!("cannot read: {e}; the plan is empty"),
            ));
            Vec::new()
        }
    };
    let chat_path = dir.join(CHAT_FILE);
    let chat_raw_len = match fs::metadata(&chat_path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == ErrorKind::NotFound => 0,
        Err(e) => {
            problems.push(Problem::new(&chat_path, format!("cannot inspect: {e}")));
            0
        }
    };
    Some(LoadedAgent {
        record,
        plan,
        chat_raw_len,
    })
}

/// The entries of `dir` sorted by name: the name if it is UTF-8, and the path.
fn entries(dir: &Path, problems: &mut Vec<Problem>) -> Vec<(Option<String>, PathBuf)> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            problems.push(Problem::new(dir, format!("cannot list: {e}")));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for entry in rd {
        match entry {
            Ok(e) => out.push((e.file_name().into_string().ok(), e.path())),
            Err(e) => problems.push(Problem::new(dir, format!("cannot list: {e}"))),
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

/// An entry of `sessions/` or `agents/` that is not an id: a leftover of an earlier
/// process's creation or removal (deleted), this process's own (left alone), or a
/// [`Problem`].
fn unexpected_entry(name: Option<&str>, path: &Path, what: &str, problems: &mut Vec<Problem>) {
    match name.and_then(hidden_kind) {
        Some(Hidden::Dir(tag)) => {
            if tag != instance_tag() {
                tracing::info!(path = %path.display(), "deleting a leftover of an interrupted create or remove");
                if let Err(e) = fs::remove_dir_all(path) {
                    problems.push(Problem::new(
                        path,
                        format!("cannot delete this leftover: {e}"),
                    ));
                }
            }
        }
        _ => problems.push(Problem::new(
            path,
            format!("not {what} (a lowercase uuid); ignored"),
        )),
    }
}

/// Deletes temp files of interrupted replaces by earlier processes in `dir`.
fn clean_temp_files(dir: &Path, problems: &mut Vec<Problem>) {
    let Ok(rd) = fs::read_dir(dir) else {
        return;
    };
    for entry in rd.flatten() {
        let name = entry.file_name();
        let Some(Hidden::TempFile(tag)) = name.to_str().and_then(hidden_kind) else {
            continue;
        };
        if tag == instance_tag() {
            continue;
        }
        let path = entry.path();
        tracing::info!(path = %path.display(), "deleting a leftover of an interrupted write");
        if let Err(e) = fs::remove_file(&path) {
            problems.push(Problem::new(
                &path,
                format!("cannot delete this leftover: {e}"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use serde_json::json;

    use super::*;

    const S1: &str = "11111111-1111-4111-8111-111111111111";
    const S2: &str = "22222222-2222-4222-8222-222222222222";
    const S3: &str = "33333333-3333-4333-8333-333333333333";
    const S4: &str = "44444444-4444-4444-8444-444444444444";
    const A1: &str = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
    const A2: &str = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb";
    const A3: &str = "cccccccc-cccc-4ccc-8ccc-cccccccccccc";
    /// A tag no live process has.
    const OLD_TAG: &str = "1x0";

    fn session(id: &str, order: u64) -> SessionRecord {
        SessionRecord {
            id: id.into(),
            name: format!("s{order}"),
            cwd: "/work".into(),
            backend: Some("openai".into()),
            model: None,
            profile: Some("default".into()),
            remote: None,
            paused: order % 2 == 1,
            created: 1_700_000_000 + order,
            order,
            cost_cap_usd: (order == 2).then_some(1.5),
        }
    }

    fn agent(session: &str, id: &str, order: u64) -> AgentRecord {
        AgentRecord {
            id: id.into(),
            session: session.into(),
            name: format!("a{order}"),
            cwd: "/work/sub".into(),
            backend: None,
            model: Some("m".into()),
            profile: None,
            cfg: BTreeMap::from([("temperature".into(), "0.2".into())]),
            created: 1_700_000_100 + order,
            order,
            stats: BTreeMap::from([("tokens_in".into(), "12".into())]),
            tools: Some(vec!["shell".into()]),
            queue: vec!["queued prompt".into()],
            in_turn: None,
            blocked: None,
        }
    }

    fn store() -> (tempfile::TempDir, Store) {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(&t.path().join("state")).unwrap();
        (t, s)
    }

    fn sdir(s: &Store, id: &str) -> PathBuf {
        s.dir().join(SESSIONS).join(id)
    }

    fn adir(s: &Store, sid: &str, aid: &str) -> PathBuf {
        sdir(s, sid).join(AGENTS).join(aid)
    }

    /// Every path under `dir`, relative, sorted.
    fn tree(dir: &Path) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                out.push(p.strip_prefix(base).unwrap().display().to_string());
                if p.is_dir() {
                    walk(base, &p, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(dir, dir, &mut out);
        out.sort();
        out
    }

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn has_problem(l: &[Problem], path: &Path, word: &str) -> bool {
        l.iter().any(|p| p.path == path && p.reason.contains(word))
    }

    #[test]
    fn ids_are_lowercase_uuids() {
        assert!(is_valid_id(S1));
        assert!(is_valid_id("0f8c1e2a-9b3d-4c5e-8f60-123456789abc"));
        for bad in [
            "",
            "..",
            "../../etc/passwd",
            "0F8C1E2A-9B3D-4C5E-8F60-123456789ABC",
            "0f8c1e2a09b3d-4c5e-8f60-123456789abc",
            "0f8c1e2a-9b3d-4c5e-8f60-123456789abcd",
            "0f8c1e2a-9b3d-4c5e-8f60-123456789ab",
            "0f8c1e2a-9b3d-4c5e-8f60-123456789abg",
            "0f8c1e2a-9b3d-4c5e-8f60/123456789abc",
            "0f8c1e2a-9b3d-4c5é-8f60-123456789ab",
        ] {
            assert!(!is_valid_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn default_dir_prefers_systemd_then_xdg_then_home() {
        fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
            move |k| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(v))
            }
        }
        let all = [
            ("STATE_DIRECTORY", "/var/lib/ollie:/var/lib/other"),
            ("XDG_STATE_HOME", "/x/state"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(dir_from_env(env(&all)), Some("/var/lib/ollie".into()));
        assert_eq!(dir_from_env(env(&all[1..])), Some("/x/state/ollie".into()));
        assert_eq!(
            dir_from_env(env(&all[2..])),
            Some("/home/u/.local/state/ollie".into())
        );
        // Empty and relative values are skipped.
        let odd = [
            ("STATE_DIRECTORY", ""),
            ("XDG_STATE_HOME", "rel/state"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(
            dir_from_env(env(&odd)),
            Some("/home/u/.local/state/ollie".into())
        );
        assert_eq!(dir_from_env(env(&[("HOME", "")])), None);
        assert_eq!(dir_from_env(env(&[])), None);
    }

    #[test]
    fn empty_new_dir_loads_nothing() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("a/b/state");
        let s = Store::open(&dir).unwrap();
        assert_eq!(s.dir(), dir);
        assert_eq!(s.load(), Loaded::default());
        assert!(dir.join(SESSIONS).is_dir());
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&t.path().join("a")), 0o700);
        assert_eq!(mode(&dir.join(SESSIONS)), 0o700);
        // Opening again is fine and keeps nothing else.
        let s = Store::open(&dir).unwrap();
        assert_eq!(s.load(), Loaded::default());
    }

    #[test]
    fn existing_dir_mode_is_left_alone() {
        let t = tempfile::tempdir().unwrap();
        fs::set_permissions(t.path(), fs::Permissions::from_mode(0o750)).unwrap();
        let _s = Store::open(t.path()).unwrap();
        assert_eq!(mode(t.path()), 0o750);
        assert_eq!(mode(&t.path().join(SESSIONS)), 0o700);
    }

    #[test]
    fn chat_and_history_are_synced_together() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        s.append_chat(S1, A1, b"result\n", Sync::WithNext).unwrap();
        let line = serde_json::json!({"role": "tool", "content": "ok"});
        s.append_history(S1, A1, &line, Sync::WithNext).unwrap();
        s.sync_chat_and_history(S1, A1).unwrap();
        assert_eq!(s.read_chat(S1, A1, 0, 100).unwrap(), b"result\n");
        assert_eq!(s.read_history(S1, A1, Some), (vec![line], vec![]));
        // An agent that is not there: an error naming it, and nothing made on disk.
        let e = s.sync_chat_and_history(S1, A2).unwrap_err();
        assert!(e.to_string().contains(A2), "{e}");
        assert!(!adir(&s, S1, A2).exists());
        assert!(s.sync_chat_and_history(S1, "../x").is_err());
    }

    #[test]
    fn sessions_agents_and_plans_round_trip_in_order() {
        let (_t, s) = store();
        // Saved out of order; loads by `order`.
        s.save_session(&session(S2, 2)).unwrap();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A2, 2)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        s.save_agent(&agent(S2, A3, 0)).unwrap();
        s.save_plan(S1, A1, b"1. read\n2. write\n").unwrap();
        s.append_chat(S1, A1, b"hello", Sync::Now).unwrap();

        let l = s.load();
        assert_eq!(l.problems, vec![]);
        let ids: Vec<_> = l.sessions.iter().map(|x| x.record.id.as_str()).collect();
        assert_eq!(ids, [S1, S2]);
        assert_eq!(l.sessions[0].record, session(S1, 1));
        assert_eq!(l.sessions[1].record, session(S2, 2));
        let a = &l.sessions[0].agents;
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].record, agent(S1, A1, 1));
        assert_eq!(a[0].plan, b"1. read\n2. write\n");
        assert_eq!(a[0].chat_raw_len, 5);
        assert_eq!(a[1].record, agent(S1, A2, 2));
        assert_eq!(a[1].plan, b"");
        assert_eq!(a[1].chat_raw_len, 0);
        assert_eq!(l.sessions[1].agents[0].record, agent(S2, A3, 0));

        // Updates replace.
        let mut r = session(S1, 1);
        r.name = "renamed".into();
        r.paused = false;
        s.save_session(&r).unwrap();
        let mut ar = agent(S1, A1, 1);
        ar.cfg.insert("k".into(), "v".into());
        ar.tools = None;
        s.save_agent(&ar).unwrap();
        s.save_plan(S1, A1, b"").unwrap();
        let l = s.load();
        assert_eq!(l.sessions[0].record, r);
        assert_eq!(l.sessions[0].agents[0].record, ar);
        assert_eq!(l.sessions[0].agents[0].plan, b"");
    }

    #[test]
    fn ties_in_order_sort_by_created_then_id() {
        let (_t, s) = store();
        let mut a = session(S2, 0);
        a.created = 5;
        let mut b = session(S1, 0);
        b.created = 5;
        let mut c = session(S3, 0);
        c.created = 4;
        for r in [&a, &b, &c] {
            s.save_session(r).unwrap();
        }
        let ids: Vec<_> = s.load().sessions.into_iter().map(|x| x.record.id).collect();
        assert_eq!(ids, [S3, S1, S2]);
    }

    #[test]
    fn saves_leave_no_temp_files() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        s.save_plan(S1, A1, b"p").unwrap();
        s.save_plan(S1, A1, b"q").unwrap();
        s.append_chat(S1, A1, b"x", Sync::Now).unwrap();
        s.append_history(S1, A1, &json!(1), Sync::Now).unwrap();
        let a = format!("sessions/{S1}/agents/{A1}");
        assert_eq!(
            tree(s.dir()),
            [
                "sessions".to_string(),
                format!("sessions/{S1}"),
                format!("sessions/{S1}/agents"),
                a.clone(),
                format!("{a}/agent.json"),
                format!("{a}/chat.raw"),
                format!("{a}/history.jsonl"),
                format!("{a}/plan"),
                format!("sessions/{S1}/session.json"),
            ]
        );
    }

    #[test]
    fn files_are_0600_and_dirs_0700() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        s.save_plan(S1, A1, b"p").unwrap();
        s.append_chat(S1, A1, b"x", Sync::Now).unwrap();
        s.append_history(S1, A1, &json!({"a": 1}), Sync::Now)
            .unwrap();
        assert_eq!(mode(s.dir()), 0o700);
        for rel in tree(s.dir()) {
            let p = s.dir().join(&rel);
            let want = if p.is_dir() { 0o700 } else { 0o600 };
            assert_eq!(mode(&p), want, "{rel}");
        }
    }

    #[test]
    fn corrupt_session_json_skips_only_that_session() {
        let (_t, s) = store();
        for (id, n) in [(S1, 1), (S2, 2), (S3, 3), (S4, 4)] {
            s.save_session(&session(id, n)).unwrap();
            s.save_agent(&agent(id, A1, 1)).unwrap();
        }
        let f = |id| sdir(&s, id).join(SESSION_FILE);
        fs::write(f(S1), b"\x00\xffgarbage").unwrap();
        let full = fs::read(f(S2)).unwrap();
        fs::write(f(S2), &full[..full.len() / 2]).unwrap();
        let wrong = fs::read_to_string(f(S3))
            .unwrap()
            .replace("\"paused\": true", "\"paused\": \"yes\"");
        assert!(wrong.contains("\"yes\""));
        fs::write(f(S3), wrong).unwrap();

        let l = s.load();
        let ids: Vec<_> = l.sessions.iter().map(|x| x.record.id.as_str()).collect();
        assert_eq!(ids, [S4]);
        assert_eq!(l.sessions[0].agents.len(), 1);
        assert_eq!(l.problems.len(), 3, "{:?}", l.problems);
        assert!(has_problem(&l.problems, &f(S1), "invalid json"));
        assert!(has_problem(&l.problems, &f(S2), "invalid json"));
        assert!(has_problem(&l.problems, &f(S3), "invalid record"));
        for p in &l.problems {
            assert!(p.reason.ends_with("session skipped"), "{p}");
            assert!(!p.to_string().contains('\n'));
        }
    }

    #[test]
    fn session_records_read_tolerantly_but_not_wrongly() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        // Unknown keys ignored, optional keys defaulted.
        fs::write(
            sdir(&s, S1).join(SESSION_FILE),
            format!(r#"{{"id":"{S1}","name":"n","cwd":"/c","created":7,"future":{{"x":1}}}}"#),
        )
        .unwrap();
        let l = s.load();
        assert_eq!(l.problems, vec![]);
        let r = &l.sessions[0].record;
        assert_eq!(
            (r.backend.clone(), r.paused, r.order, r.created),
            (None, false, 0, 7)
        );
        // A required key missing, or an id that is not the directory's.
        fs::write(
            sdir(&s, S1).join(SESSION_FILE),
            format!(r#"{{"id":"{S1}","name":"n","cwd":"/c"}}"#),
        )
        .unwrap();
        assert!(has_problem(
            &s.load().problems,
            &sdir(&s, S1).join(SESSION_FILE),
            "missing field `created`"
        ));
        fs::write(
            sdir(&s, S1).join(SESSION_FILE),
            format!(r#"{{"id":"{S2}","name":"n","cwd":"/c","created":1}}"#),
        )
        .unwrap();
        let l = s.load();
        assert!(l.sessions.is_empty());
        assert!(has_problem(
            &l.problems,
            &sdir(&s, S1).join(SESSION_FILE),
            "does not match"
        ));
    }

    #[test]
    fn missing_session_json_skips_the_session() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        fs::remove_file(sdir(&s, S1).join(SESSION_FILE)).unwrap();
        let l = s.load();
        assert!(l.sessions.is_empty());
        assert!(has_problem(
            &l.problems,
            &sdir(&s, S1).join(SESSION_FILE),
            "missing"
        ));
    }

    #[test]
    fn corrupt_agent_json_skips_only_that_agent() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        s.save_agent(&agent(S1, A2, 2)).unwrap();
        s.save_agent(&agent(S1, A3, 3)).unwrap();
        let f = |a| adir(&s, S1, a).join(AGENT_FILE);
        fs::write(f(A1), "{\"id\":").unwrap();
        // An agent whose record names another session is skipped too.
        let mut other = agent(S2, A3, 3);
        other.session = S2.into();
        fs::write(f(A3), serde_json::to_vec(&other).unwrap()).unwrap();
        let l = s.load();
        assert_eq!(l.sessions.len(), 1);
        let ids: Vec<_> = l.sessions[0]
            .agents
            .iter()
            .map(|a| a.record.id.as_str())
            .collect();
        assert_eq!(ids, [A2]);
        assert_eq!(l.problems.len(), 2, "{:?}", l.problems);
        assert!(has_problem(&l.problems, &f(A1), "agent skipped"));
        assert!(has_problem(&l.problems, &f(A3), "does not match"));
    }

    #[test]
    fn invalid_names_are_ignored_with_a_problem() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        let sessions = s.dir().join(SESSIONS);
        let upper = "ABCDEF12-2222-4222-8222-222222222222";
        fs::create_dir(sessions.join("my-session")).unwrap();
        fs::create_dir(sessions.join(upper)).unwrap();
        fs::write(sessions.join(".hidden"), b"").unwrap();
        fs::write(sessions.join(S3), b"a file, not a directory").unwrap();
        fs::create_dir(sdir(&s, S1).join(AGENTS).join("bob")).unwrap();
        let l = s.load();
        assert_eq!(l.sessions.len(), 1);
        assert_eq!(l.sessions[0].agents.len(), 1);
        assert!(has_problem(
            &l.problems,
            &sessions.join("my-session"),
            "not a session id"
        ));
        assert!(has_problem(
            &l.problems,
            &sessions.join(upper),
            "not a session id"
        ));
        assert!(has_problem(
            &l.problems,
            &sessions.join(".hidden"),
            "not a session id"
        ));
        assert!(has_problem(
            &l.problems,
            &sessions.join(S3),
            "not a directory"
        ));
        assert!(has_problem(
            &l.problems,
            &sdir(&s, S1).join(AGENTS).join("bob"),
            "not an agent id"
        ));
        assert_eq!(l.problems.len(), 5, "{:?}", l.problems);
        // Nothing was deleted.
        assert!(sessions.join("my-session").is_dir());
    }

    #[test]
    fn api_rejects_invalid_ids() {
        let (_t, s) = store();
        let mut r = session("../escape", 1);
        assert!(matches!(
            s.save_session(&r),
            Err(StoreError::InvalidId {
                what: "session",
                ..
            })
        ));
        r.id = S1.into();
        s.save_session(&r).unwrap();
        assert!(matches!(
            s.save_agent(&agent(S1, "..", 1)),
            Err(StoreError::InvalidId { what: "agent", .. })
        ));
        let e = s.append_chat(S1, "x", b"", Sync::Now).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid agent id \"x\" (expected a lowercase uuid such as 123e4567-e89b-42d3-a456-426614174000)"
        );
        assert!(s.remove_session("/").is_err());
        assert!(s.read_chat("..", A1, 0, 1).is_err());
        let (v, p) = s.read_history(S1, "../../x", Some);
        assert!(v.is_empty());
        assert_eq!(p.len(), 1);
        assert!(p[0].reason.contains("invalid agent id"));
        assert_eq!(tree(s.dir()).len(), 4);
    }

    #[test]
    fn agents_and_plans_need_their_parents() {
        let (_t, s) = store();
        let e = s.save_agent(&agent(S1, A1, 1)).unwrap_err();
        assert!(e.is_missing(), "{e}");
        assert_eq!(
            e.to_string(),
            format!("session does not exist: {}", sdir(&s, S1).display())
        );
        s.save_session(&session(S1, 1)).unwrap();
        let e = s.save_plan(S1, A1, b"p").unwrap_err();
        assert!(e.is_missing(), "{e}");
        assert!(
            s.append_chat(S1, A1, b"x", Sync::Now)
                .unwrap_err()
                .is_missing()
        );
        assert!(
            s.append_history(S1, A1, &json!(1), Sync::Now)
                .unwrap_err()
                .is_missing()
        );
        assert!(s.read_chat(S1, A1, 0, 10).unwrap_err().is_missing());
        assert!(s.truncate_history(S1, A1).unwrap_err().is_missing());
        assert!(s.remove_agent(S1, A1).unwrap_err().is_missing());
        assert!(s.remove_session(S2).unwrap_err().is_missing());
        // Nothing was created on the way.
        assert_eq!(
            tree(s.dir()),
            [
                "sessions".to_string(),
                format!("sessions/{S1}"),
                format!("sessions/{S1}/agents"),
                format!("sessions/{S1}/session.json"),
            ]
        );
    }

    #[test]
    fn a_session_without_agents_dir_still_takes_agents() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        fs::remove_dir(sdir(&s, S1).join(AGENTS)).unwrap();
        assert_eq!(s.load().sessions[0].agents, vec![]);
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        assert_eq!(s.load().sessions[0].agents.len(), 1);
    }

    #[test]
    fn removed_session_never_loads_again() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        s.append_chat(S1, A1, b"x", Sync::Now).unwrap();
        s.save_session(&session(S2, 2)).unwrap();
        s.remove_session(S1).unwrap();
        let l = s.load();
        assert_eq!(l.problems, vec![]);
        assert_eq!(l.sessions.len(), 1);
        assert_eq!(l.sessions[0].record.id, S2);
        assert_eq!(
            tree(&s.dir().join(SESSIONS)),
            [
                S2.to_string(),
                format!("{S2}/agents"),
                format!("{S2}/session.json")
            ]
        );
        // The append handle went with it: appending now fails instead of writing into the
        // removed files.
        assert!(
            s.append_chat(S1, A1, b"y", Sync::Now)
                .unwrap_err()
                .is_missing()
        );
        // The same id can be used again, from scratch.
        s.save_session(&session(S1, 1)).unwrap();
        assert_eq!(s.load().sessions[0].agents, vec![]);
    }

    #[test]
    fn tombstone_left_by_a_crash_never_loads_and_is_cleaned() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        s.save_agent(&agent(S1, A2, 2)).unwrap();
        s.save_session(&session(S2, 2)).unwrap();
        // A crash right after the tombstone renames, by an earlier process.
        let sessions = s.dir().join(SESSIONS);
        let tomb = sessions.join(format!("{TOMB_PREFIX}{S1}-{OLD_TAG}-0"));
        let atomb = sdir(&s, S1)
            .join(AGENTS)
            .join(format!("{TOMB_PREFIX}{A2}-{OLD_TAG}-3"));
        fs::rename(adir(&s, S1, A2), &atomb).unwrap();
        let l = s.load();
        assert_eq!(l.problems, vec![]);
        assert_eq!(l.sessions[0].agents.len(), 1);
        assert!(!atomb.exists());
        fs::rename(sdir(&s, S1), &tomb).unwrap();
        let l = s.load();
        assert_eq!(l.problems, vec![]);
        let ids: Vec<_> = l.sessions.iter().map(|x| x.record.id.as_str()).collect();
        assert_eq!(ids, [S2]);
        assert!(!tomb.exists());
        // This process's own tombstones (a removal in progress) are left alone.
        let mine = sessions.join(format!("{TOMB_PREFIX}{S1}-{}", unique_suffix()));
        fs::create_dir(&mine).unwrap();
        assert_eq!(s.load().problems, vec![]);
        assert!(mine.exists());
    }

    #[test]
    fn removed_agent_never_loads_again() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        s.save_agent(&agent(S1, A2, 2)).unwrap();
        s.append_history(S1, A1, &json!("h"), Sync::Now).unwrap();
        s.remove_agent(S1, A1).unwrap();
        let l = s.load();
        assert_eq!(l.problems, vec![]);
        let ids: Vec<_> = l.sessions[0]
            .agents
            .iter()
            .map(|a| a.record.id.as_str())
            .collect();
        assert_eq!(ids, [A2]);
        assert_eq!(
            tree(&sdir(&s, S1).join(AGENTS)),
            [A2.to_string(), format!("{A2}/agent.json")]
        );
        assert!(
            s.append_history(S1, A1, &json!("h"), Sync::Now)
                .unwrap_err()
                .is_missing()
        );
    }

    #[test]
    fn leftovers_of_interrupted_writes_are_ignored_and_cleaned() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        let sessions = s.dir().join(SESSIONS);
        let stale = [
            sdir(&s, S1).join(format!(".session.json{TMP_MARKER}{OLD_TAG}-1")),
            adir(&s, S1, A1).join(format!(".agent.json{TMP_MARKER}{OLD_TAG}-2")),
            adir(&s, S1, A1).join(format!(".plan{TMP_MARKER}{OLD_TAG}-3")),
        ];
        for p in &stale {
            fs::write(p, b"{half").unwrap();
        }
        // A session being created when the process died: its record is inside.
        let staged = sessions.join(format!("{STAGED_PREFIX}{S2}-{OLD_TAG}-4"));
        fs::create_dir(&staged).unwrap();
        fs::write(
            staged.join(SESSION_FILE),
            serde_json::to_vec(&session(S2, 2)).unwrap(),
        )
        .unwrap();
        let staged_agent = sdir(&s, S1)
            .join(AGENTS)
            .join(format!("{STAGED_PREFIX}{A2}-{OLD_TAG}-5"));
        fs::create_dir(&staged_agent).unwrap();
        // This process's own temp file (a save in progress) is left alone.
        let mine = sdir(&s, S1).join(format!(".session.json{TMP_MARKER}{}", unique_suffix()));
        fs::write(&mine, b"").unwrap();

        let l = s.load();
        assert_eq!(l.problems, vec![]);
        assert_eq!(l.sessions.len(), 1);
        assert_eq!(l.sessions[0].record, session(S1, 1));
        assert_eq!(l.sessions[0].agents.len(), 1);
        for p in stale.iter().chain([&staged, &staged_agent]) {
            assert!(!p.exists(), "{}", p.display());
        }
        assert!(mine.exists());
    }

    #[test]
    fn append_chat_then_read_at_offsets() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        assert_eq!(s.read_chat(S1, A1, 0, 100).unwrap(), b"");
        s.append_chat(S1, A1, b"hello ", Sync::Now).unwrap();
        s.append_chat(S1, A1, b"", Sync::Now).unwrap();
        s.append_chat(S1, A1, b"world\n", Sync::Now).unwrap();
        assert_eq!(s.read_chat(S1, A1, 0, 100).unwrap(), b"hello world\n");
        assert_eq!(s.read_chat(S1, A1, 6, 5).unwrap(), b"world");
        assert_eq!(s.read_chat(S1, A1, 10, 100).unwrap(), b"d\n");
        assert_eq!(s.read_chat(S1, A1, 12, 100).unwrap(), b"");
        assert_eq!(s.read_chat(S1, A1, u64::MAX, usize::MAX).unwrap(), b"");
        assert_eq!(s.read_chat(S1, A1, 0, 0).unwrap(), b"");
        assert_eq!(s.load().sessions[0].agents[0].chat_raw_len, 12);
        // A second store (a restarted server) appends after what is there.
        let s2 = Store::open(s.dir()).unwrap();
        s2.append_chat(S1, A1, b"!", Sync::Now).unwrap();
        assert_eq!(s.read_chat(S1, A1, 0, 100).unwrap(), b"hello world\n!");
    }

    #[test]
    fn append_handles_are_bounded() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        let n = APPEND_HANDLES + 6;
        let ids: Vec<String> = (0..n)
            .map(|i| format!("{i:08x}-0000-4000-8000-000000000000"))
            .collect();
        for (i, id) in ids.iter().enumerate() {
            s.save_agent(&agent(S1, id, i as u64)).unwrap();
        }
        for round in 0..2 {
            for id in &ids {
                s.append_chat(S1, id, format!("{round}").as_bytes(), Sync::Now)
                    .unwrap();
                assert!(s.open_appenders() <= APPEND_HANDLES);
            }
        }
        for id in &ids {
            assert_eq!(s.read_chat(S1, id, 0, 10).unwrap(), b"01");
        }
    }

    #[test]
    fn concurrent_appends_do_not_interleave() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        let s = Arc::new(s);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || {
                    for i in 0..25 {
                        s.append_history(
                            S1,
                            A1,
                            &json!({"t": t, "i": i, "pad": "x".repeat(3000)}),
                            Sync::Now,
                        )
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (v, p) = s.read_history(S1, A1, Some);
        assert_eq!(p, vec![]);
        assert_eq!(v.len(), 100);
    }

    #[test]
    fn history_round_trip_with_a_torn_last_line() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        assert_eq!(s.read_history(S1, A1, Some), (vec![], vec![]));
        let v1 = json!({"role": "user", "content": "line\nbreak"});
        let v2 = json!([1, 2, 3]);
        s.append_history(S1, A1, &v1, Sync::Now).unwrap();
        s.append_history(S1, A1, &v2, Sync::Now).unwrap();
        assert_eq!(
            s.read_history(S1, A1, Some),
            (vec![v1.clone(), v2.clone()], vec![])
        );

        // A crash mid-append, by an earlier process: the line has no newline.
        let path = adir(&s, S1, A1).join(HISTORY_FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"role\": \"assis").unwrap();
        drop(f);
        let (v, p) = s.read_history(S1, A1, Some);
        assert_eq!(v, [v1.clone(), v2.clone()]);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].path, path);
        assert!(p[0].reason.contains("torn last line"), "{}", p[0]);

        // A restarted server's next append starts on a fresh line.
        let s2 = Store::open(s.dir()).unwrap();
        let v3 = json!("after");
        s2.append_history(S1, A1, &v3, Sync::Now).unwrap();
        assert_eq!(s2.read_history(S1, A1, Some), (vec![v1, v2, v3], vec![]));
    }

    #[test]
    fn torn_tail_without_any_newline_is_cut_whole() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        let path = adir(&s, S1, A1).join(HISTORY_FILE);
        fs::write(&path, "x".repeat(20_000)).unwrap();
        s.append_history(S1, A1, &json!(7), Sync::Now).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"7\n");
        // And a long torn line after good ones (longer than one read chunk).
        fs::write(&path, format!("1\n2\n{}", "y".repeat(20_000))).unwrap();
        let s2 = Store::open(s.dir()).unwrap();
        s2.append_history(S1, A1, &json!(3), Sync::Now).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"1\n2\n3\n");
    }

    #[test]
    fn bad_middle_history_lines_are_skipped() {
        let path = Path::new("/h");
        let (v, p) = parse_history(path, b"1\nnot json\n\n\"ok\"\n\xff\xfe\n");
        assert_eq!(v, [json!(1), json!("ok")]);
        assert_eq!(p.len(), 2);
        assert!(p[0].reason.starts_with("line 2: "), "{}", p[0]);
        assert!(p[1].reason.starts_with("line 5: "), "{}", p[1]);
        assert_eq!(parse_history(path, b""), (vec![], vec![]));
    }

    #[test]
    fn truncate_history_empties_it() {
        let (_t, s) = store();
        s.save_session(&session(S1, 1)).unwrap();
        s.save_agent(&agent(S1, A1, 1)).unwrap();
        s.append_history(S1, A1, &json!(1), Sync::Now).unwrap();
        s.append_history(S1, A1, &json!(2), Sync::Now).unwrap();
        s.truncate_history(S1, A1).unwrap();
        assert_eq!(s.read_history(S1, A1, Some), (vec![], vec![]));
        s.append_history(S1, A1, &json!(3), Sync::Now).unwrap();
        assert_eq!(s.read_history(S1, A1, Some), (vec![json!(3)], vec![]));
        let path = adir(&s, S1, A1).join(HISTORY_FILE);
        assert_eq!(fs::read(&path).unwrap(), b"3\n");
    }

    #[test]
    fn hidden_names_are_recognised() {
        assert_eq!(
            hidden_kind(&format!(".removed-{S1}-12x34-5")),
            Some(Hidden::Dir("12x34"))
        );
        assert_eq!(
            hidden_kind(&format!(".new-{S1}-12x34-5")),
            Some(Hidden::Dir("12x34"))
        );
        assert_eq!(
            hidden_kind(".session.json.tmp-12x34-5"),
            Some(Hidden::TempFile("12x34"))
        );
        for other in [
            ".removed-",
            ".removed-x",
            ".new-not-an-id-at-all-but-36-chars-long-1-2",
            ".hidden",
            "session.json.tmp-1-2",
            ".removed-é",
        ] {
            assert_eq!(hidden_kind(other), None, "{other}");
        }
    }
}
