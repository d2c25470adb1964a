//! Landlock: one ruleset handling every filesystem right of the ABI, TCP bind/connect (unless
//! the network is `Network::All`: then no port is restricted) and both scopes, built in the
//! parent and applied by the child with `landlock_restrict_self`.
//!
//! A run approved unsandboxed ([`ResolvedPolicy::unsandboxed`]) gets no ruleset at all: the
//! record says so ([`EnforcementStatus::NotApplied`], [`LandlockRecord::not_applied`]).

use crate::sys;
use ollie_policy::{Network, ResolvedPolicy};
use serde::Serialize;
use std::collections::BTreeSet;
use std::io;
use std::ops::Bound;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Filesystem access rights (bit positions from `<linux/landlock.h>`).
pub mod fs {
    /// Execute a file.
    pub const EXECUTE: u64 = 1 << 0;
    /// Open a file for writing.
    pub const WRITE_FILE: u64 = 1 << 1;
    /// Open a file for reading.
    pub const READ_FILE: u64 = 1 << 2;
    /// List a directory.
    pub const READ_DIR: u64 = 1 << 3;
    /// Remove a directory.
    pub const REMOVE_DIR: u64 = 1 << 4;
    /// Remove a file.
    pub const REMOVE_FILE: u64 = 1 << 5;
    /// Create a character device.
    pub const MAKE_CHAR: u64 = 1 << 6;
    /// Create a directory.
    pub const MAKE_DIR: u64 = 1 << 7;
    /// Create a regular file.
    pub const MAKE_REG: u64 = 1 << 8;
    /// Create a unix socket file.
    pub const MAKE_SOCK: u64 = 1 << 9;
    /// Create a FIFO.
    pub const MAKE_FIFO: u64 = 1 << 10;
    /// Create a block device.
    pub const MAKE_BLOCK: u64 = 1 << 11;
    /// Create a symlink.
    pub const MAKE_SYM: u64 = 1 << 12;
    /// Link or rename a file into a directory (ABI 2).
    pub const REFER: u64 = 1 << 13;
    /// Truncate a file (ABI 3).
    pub const TRUNCATE: u64 = 1 << 14;
    /// ioctl on device files (ABI 5).
    pub const IOCTL_DEV: u64 = 1 << 15;
    /// Rights that apply to files (not only directories).
    pub const FILE_RIGHTS: u64 = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV;
}

pub(crate) const NET_BIND_TCP: u64 = 1 << 0;
pub(crate) const NET_CONNECT_TCP: u64 = 1 << 1;
pub(crate) const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
pub(crate) const SCOPE_SIGNAL: u64 = 1 << 1;

const FS_NAMES: [&str; 16] = [
    "execute",
    "write_file",
    "read_file",
    "read_dir",
    "remove_dir",
    "remove_file",
    "make_char",
    "make_dir",
    "make_reg",
    "make_sock",
    "make_fifo",
    "make_block",
    "make_sym",
    "refer",
    "truncate",
    "ioctl_dev",
];

/// Every filesystem right a kernel of `abi` knows.
pub fn fs_rights_for_abi(abi: u32) -> u64 {
    match abi {
        0 => 0,
        1 => (1 << 13) - 1,
        2 => (1 << 14) - 1,
        3 | 4 => (1 << 15) - 1,
        _ => (1 << 16) - 1,
    }
}

const READ: u64 = fs::READ_FILE | fs::READ_DIR;

/// Never part of `read_all`: device nodes and kernel memory images.
const READ_ALL_EXCLUDED: &[&str] = &["/dev", "/proc/kcore", "/proc/kmsg", "/sys/firmware"];
const READ_EXEC: u64 = READ | fs::EXECUTE;
/// Read-write: everything except execute, device creation, device ioctls and socket files
/// (a tool has no socket that could be bound to a path but a socketpair one, which can never
/// listen: a socket file it made could only mislead the host).
const READ_WRITE: u64 = READ
    | fs::WRITE_FILE
    | fs::REMOVE_DIR
    | fs::REMOVE_FILE
    | fs::MAKE_DIR
    | fs::MAKE_REG
    | fs::MAKE_FIFO
    | fs::MAKE_SYM
    | fs::REFER
    | fs::TRUNCATE;

/// The read-write rights (no execute, no device creation or ioctls) a kernel of `abi`
/// handles: what a writable tree, or the private `/dev/shm`, is granted.
pub fn writable_rights(abi: u32) -> u64 {
    READ_WRITE & fs_rights_for_abi(abi)
}

/// The kernel's Landlock ABI, probed once.
pub fn kernel_abi() -> u32 {
    static ABI: OnceLock<u32> = OnceLock::new();
    *ABI.get_or_init(sys::landlock_abi)
}

/// How completely the ruleset is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EnforcementStatus {
    /// Every right of ABI 7 (or the policy's floor) is handled.
    FullyEnforced,
    /// The kernel is older than the floor and `best_effort` allowed running anyway.
    PartiallyEnforced,
    /// Landlock was not applied: a human approved this run unsandboxed
    /// ([`LandlockRecord::not_applied`] says so).
    NotApplied,
}

/// [`LandlockRecord::not_applied`] for a run approved unsandboxed.
pub const NOT_APPLIED_UNSANDBOXED: &str = "unsandboxed grant: a human approved running this command without filesystem and network confinement";

/// What the ruleset actually does, for the run record.
#[derive(Debug, Clone, Serialize)]
pub struct LandlockRecord {
    /// The ABI used (the kernel's, or the simulated one in tests).
    pub abi: u32,
    /// The policy's floor.
    pub required_abi: u32,
    /// Enforcement status.
    pub status: EnforcementStatus,
    /// Handled filesystem rights.
    pub handled_fs: Vec<&'static str>,
    /// Handled network rights.
    pub handled_net: Vec<&'static str>,
    /// Scopes.
    pub scopes: Vec<&'static str>,
    /// Number of path rules added.
    pub path_rules: usize,
    /// Number of port rules added.
    pub port_rules: usize,
    /// Secret locations carved out of broader grants.
    pub carved_out: Vec<PathBuf>,
    /// Why Landlock was not applied at all ([`EnforcementStatus::NotApplied`]:
    /// [`NOT_APPLIED_UNSANDBOXED`]); `None` when it was.
    pub not_applied: Option<&'static str>,
}

/// Errors building the ruleset.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// The kernel's ABI is below the policy's floor.
    #[error(
        "landlock ABI {found} < required {required}: the kernel cannot enforce the policy (ABI 7 needs Linux 6.15+; set best_effort = true to run with weaker, recorded enforcement)"
    )]
    AbiTooOld {
        /// Found ABI.
        found: u32,
        /// Required ABI.
        required: u32,
    },
    /// `landlock_create_ruleset` failed.
    #[error("landlock ruleset could not be created")]
    Create {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A rule could not be added.
    #[error("landlock rule for {path} could not be added")]
    Rule {
        /// Path of the rule.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// A built ruleset ready for `restrict_self` in the child.
#[derive(Debug)]
pub struct Ruleset {
    /// The ruleset fd; `None` when Landlock is not applied (an unsandboxed run: the child
    /// then skips `restrict_self`).
    pub fd: Option<OwnedFd>,
    /// What it enforces.
    pub record: LandlockRecord,
    /// The rights granted by a rule on the host's `/` itself (0: none, the usual case, since
    /// secret locations split a grant of `/` into its children). A run with a new root
    /// (union mounts) grants them again on that root, which is another inode.
    pub root_access: u64,
}

fn names(bits: u64, table: &[&'static str]) -> Vec<&'static str> {
    table
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// Where [`consider`] adds rules.
struct RuleSink<'a> {
    ruleset: &'a OwnedFd,
    /// Every right the ruleset handles.
    handled: u64,
    /// Rules added so far.
    added: usize,
    /// Locations excluded from broader grants.
    carved: Vec<PathBuf>,
    /// Rights granted on `/` itself.
    root_access: u64,
}

impl RuleSink<'_> {
    fn add(
        &mut self,
        path: &Path,
        fd: &OwnedFd,
        is_dir: bool,
        access: u64,
    ) -> Result<(), LandlockError> {
        let mut a = access & self.handled;
        if !is_dir {
            a &= fs::FILE_RIGHTS;
        }
        if a == 0 {
            return Ok(());
        }
        sys::landlock_add_path_rule(self.ruleset, fd, a).map_err(|source| LandlockError::Rule {
            path: path.to_path_buf(),
            source,
        })?;
        self.added += 1;
        Ok(())
    }
}

/// Locations excluded from broader grants, in component order: every location inside one
/// follows it directly, so both questions [`consider`] asks of each path it opens are a
/// lookup rather than a pass over the list (it opens every entry of /, /etc and the home on
/// the way to the excluded ones).
struct Excluded(BTreeSet<PathBuf>);

impl Excluded {
    fn new(paths: impl IntoIterator<Item = PathBuf>) -> Excluded {
        Excluded(paths.into_iter().collect())
    }

    /// Whether `p` is an excluded location or lies inside one.
    fn covers(&self, p: &Path) -> bool {
        p.ancestors().any(|a| self.0.contains(a))
    }

    /// Whether an excluded location is `p` or lies inside it.
    fn within(&self, p: &Path) -> bool {
        self.0
            .range::<Path, _>((Bound::Included(p), Bound::Unbounded))
            .next()
            .is_some_and(|s| s.starts_with(p))
    }
}

/// Opens the grant `path` and queues it, excluding every location in `excluded` by
/// construction: the object actually opened is judged (symlinks resolved from the fd); if it
/// lies inside an excluded location it grants nothing; if an excluded location lies inside it,
/// the grant is replaced by grants on its children, recursing only on the way to the excluded
/// location. A directory that cannot be listed is not granted at all (fail closed). Missing
/// paths grant nothing.
fn consider(
    path: &Path,
    access: u64,
    excluded: &Excluded,
    sink: &mut RuleSink<'_>,
) -> Result<(), LandlockError> {
    let (fd, is_dir, real) = match sys::open_rule_path(path) {
        Ok(v) => v,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => return Ok(()),
        Err(source) => {
            return Err(LandlockError::Rule {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if excluded.covers(&real) {
        sink.carved.push(path.to_path_buf());
        return Ok(());
    }
    if !excluded.within(&real) {
        if real == Path::new("/") {
            sink.root_access |= access & sink.handled;
        }
        return sink.add(path, &fd, is_dir, access);
    }
    drop(fd);
    let Ok(rd) = std::fs::read_dir(&real) else {
        sink.carved.push(real);
        return Ok(());
    };
    for entry in rd.flatten() {
        consider(&real.join(entry.file_name()), access, excluded, sink)?;
    }
    Ok(())
}

/// Builds the ruleset for a resolved policy; for an unsandboxed one, no ruleset and a
/// record saying Landlock is not applied (the ABI floor does not matter then).
///
/// `simulated_abi` (tests only) pretends the kernel offers a lower ABI.
pub fn build(
    policy: &ResolvedPolicy,
    simulated_abi: Option<u32>,
) -> Result<Ruleset, LandlockError> {
    let kernel = kernel_abi();
    let abi = simulated_abi.map_or(kernel, |s| s.min(kernel));
    let required = policy.policy.landlock_min_abi;
    if policy.unsandboxed() {
        return Ok(Ruleset {
            fd: None,
            record: LandlockRecord {
                abi,
                required_abi: required,
                status: EnforcementStatus::NotApplied,
                handled_fs: Vec::new(),
                handled_net: Vec::new(),
                scopes: Vec::new(),
                path_rules: 0,
                port_rules: 0,
                carved_out: Vec::new(),
                not_applied: Some(NOT_APPLIED_UNSANDBOXED),
            },
            root_access: 0,
        });
    }
    let status = if abi >= required && abi >= 7 {
        EnforcementStatus::FullyEnforced
    } else if policy.policy.best_effort && abi >= 1 {
        EnforcementStatus::PartiallyEnforced
    } else {
        return Err(LandlockError::AbiTooOld {
            found: abi,
            required: required.max(7),
        });
    };
    let all_fs = fs_rights_for_abi(abi);
    // The whole network: TCP ports are not handled at all (UDP never is by Landlock).
    let handled_net = if abi >= 4 && policy.network != Network::All {
        NET_BIND_TCP | NET_CONNECT_TCP
    } else {
        0
    };
    let scoped = if abi >= 6 {
        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    } else {
        0
    };
    let fd = sys::landlock_create_ruleset(all_fs, handled_net, scoped)
        .map_err(|source| LandlockError::Create { source })?;

    // Lexical and real forms: `consider` judges the object it opened by its real path.
    let listed = policy.ctx.secret_locations();
    let real: Vec<PathBuf> = listed
        .iter()
        .filter_map(|s| std::fs::canonicalize(s).ok())
        .collect();
    let secrets = Excluded::new(listed.into_iter().chain(real));
    let mut sink = RuleSink {
        ruleset: &fd,
        handled: all_fs,
        added: 0,
        carved: Vec::new(),
        root_access: 0,
    };
    if policy.fs.read_all {
        // "Everything readable" never includes device nodes (a raw disk would bypass every
        // file-level rule) or the kernel's memory images; devices the policy needs are
        // granted by name.
        let excluded = Excluded::new(
            secrets
                .0
                .iter()
                .cloned()
                .chain(READ_ALL_EXCLUDED.iter().map(PathBuf::from)),
        );
        consider(Path::new("/"), READ, &excluded, &mut sink)?;
    }
    for (list, access) in [
        (&policy.fs.read, READ),
        (&policy.fs.exec, READ_EXEC),
        (&policy.fs.write, READ_WRITE),
    ] {
        for p in list {
            consider(p, access, &secrets, &mut sink)?;
        }
    }
    let (path_rules, carved, root_access) = (sink.added, sink.carved, sink.root_access);
    let mut port_rules = 0;
    // Under the proxy: connect to the proxy's port only (in the run's own network namespace,
    // where only the proxy listens there), bind nothing.
    let proxy_port = BTreeSet::from([ollie_policy::PROXY_PORT]);
    let no_port = BTreeSet::new();
    let ports = match &policy.network {
        Network::Tcp { connect, bind } => Some((connect, bind)),
        Network::Proxy(_) => Some((&proxy_port, &no_port)),
        Network::Off | Network::All => None,
    };
    if let (Some((connect, bind)), true) = (ports, handled_net != 0) {
        for (ports, right) in [(connect, NET_CONNECT_TCP), (bind, NET_BIND_TCP)] {
            for port in ports {
                sys::landlock_add_port_rule(&fd, *port, right).map_err(|source| {
                    LandlockError::Rule {
                        path: PathBuf::from(format!("tcp:{port}")),
                        source,
                    }
                })?;
                port_rules += 1;
            }
        }
    }
    Ok(Ruleset {
        fd: Some(fd),
        record: LandlockRecord {
            abi,
            required_abi: required,
            status,
            handled_fs: names(all_fs, &FS_NAMES),
            handled_net: names(handled_net, &["bind_tcp", "connect_tcp"]),
            scopes: names(scoped, &["abstract_unix_socket", "signal"]),
            path_rules,
            port_rules,
            carved_out: carved,
            not_applied: None,
        },
        root_access,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excluded_answers_like_a_pass_over_the_list() {
        let list: Vec<PathBuf> = ["/root/.ssh", "/etc/shadow", "/home/u/.aws", "/proc/kcore"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let ex = Excluded::new(list.iter().cloned());
        for p in [
            "/",
            "/root",
            "/root/.ssh",
            "/root/.ssh/id_ed25519",
            "/root/.ssh2",
            "/root/.ss",
            "/etc",
            "/etc/shadow",
            "/etc/shadow-",
            "/etc2",
            "/home",
            "/home/u",
            "/home/u/.aws/credentials",
            "/home/uu",
            "/proc",
            "/proc/kcore/x",
            "/usr/bin",
        ] {
            let p = Path::new(p);
            assert_eq!(
                ex.covers(p),
                list.iter().any(|s| p.starts_with(s)),
                "covers {p:?}"
            );
            assert_eq!(
                ex.within(p),
                list.iter().any(|s| s.starts_with(p)),
                "within {p:?}"
            );
        }
    }
}
