//! The one error type of this crate, with the errno a 9P or FUSE front end should report.

use std::io;
use std::path::PathBuf;

use nix::libc;

/// Everything that can go wrong in the registry, a namespace command or a union operation.
///
/// Messages are one lowercase line that says what was wrong and what is valid. Errors of the
/// union operations carry the words plan9port's 9pfuse maps to errno (`file does not exist`,
/// `permission denied`, `file already exists`, `is a directory`, `not a directory`,
/// `invalid argument`), so a 9P server can use the message itself as the Rerror string;
/// [`Error::errno`] gives the number for front ends that speak errno.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A slug broke the slug rules (1–64 of `[a-z0-9._-]`, not starting with `.` or `-`).
    #[error(
        "invalid slug {slug:?}: {reason} (valid: 1-64 of a-z 0-9 . _ -, not starting with . or -)"
    )]
    InvalidSlug {
        /// The slug as given.
        slug: String,
        /// What was wrong.
        reason: &'static str,
    },
    /// A short name broke the name rules (like a slug, upper case allowed).
    #[error(
        "invalid bead name {name:?}: {reason} (valid: 1-64 of A-Z a-z 0-9 . _ -, not starting with . or -)"
    )]
    InvalidName {
        /// The name as given.
        name: String,
        /// What was wrong.
        reason: &'static str,
    },
    /// A mount point is not of the form `/NAME`.
    #[error("invalid mount point {point:?}: {reason} (valid: /NAME, e.g. /ctx)")]
    InvalidPoint {
        /// The point as given.
        point: String,
        /// What was wrong.
        reason: &'static str,
    },
    /// A path inside a union view was refused before touching the filesystem.
    #[error("invalid path {path:?}: {reason} (invalid argument)")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// What was wrong.
        reason: &'static str,
    },
    /// An `http://` or `https://` bead: only local beads are served.
    #[error(
        "remote beads are not supported: {uri} (name a local bead by file:// uri, absolute path, uuid or short name)"
    )]
    RemoteBead {
        /// The URI as given.
        uri: String,
    },
    /// A URI that is not a usable `file://` URI.
    #[error("invalid bead uri {uri:?}: {reason}")]
    InvalidUri {
        /// The URI as given.
        uri: String,
        /// What was wrong.
        reason: String,
    },
    /// A path or URI that does not name a bead directory.
    #[error("{}: not a bead: {reason}", path.display())]
    NotABead {
        /// The path as given (or as decoded from the URI).
        path: PathBuf,
        /// What was wrong.
        reason: &'static str,
    },
    /// A short name or uuid that names no bead.
    #[error("no bead named {name:?} in this namespace or the registry: file does not exist")]
    UnknownBead {
        /// The name as given.
        name: String,
    },
    /// A short name that names more than one bead.
    #[error("bead name {name:?} is ambiguous: {} (name it by uuid or file:// uri)", candidates.join(", "))]
    AmbiguousName {
        /// The name as given.
        name: String,
        /// The URIs of every bead it could mean.
        candidates: Vec<String>,
    },
    /// `start SLUG` with a slug another registry bead already has.
    #[error("slug {slug:?} is already used by bead {uri}: file already exists")]
    SlugTaken {
        /// The slug.
        slug: String,
        /// The bead that has it.
        uri: String,
    },
    /// `start SLUG` where a bead with another slug is already open: it is not renamed.
    #[error(
        "a bead is already open here: {uri} (slug {current:?}); start {slug} would rename it, so nothing changed (start alone prints the open bead)"
    )]
    AlreadyStarted {
        /// The slug asked for.
        slug: String,
        /// The open bead.
        uri: String,
        /// Its slug.
        current: String,
    },
    /// A command named a point that has no members.
    #[error("nothing is mounted at {point}: file does not exist")]
    UnknownPoint {
        /// The point.
        point: String,
    },
    /// `unmount BEAD POINT` for a bead that is not a member of the point.
    #[error("{bead:?} is not mounted at {point} (members: {}): file does not exist", members.join(", "))]
    NotMember {
        /// The bead as given.
        bead: String,
        /// The point.
        point: String,
        /// The names of the point's members.
        members: Vec<String>,
    },
    /// A second `-c` at one point.
    #[error(
        "{point} already has a create target: {name} ({uri}); mount without -c, or unmount {name} first"
    )]
    SecondCreate {
        /// The point.
        point: String,
        /// The name of the member that already carries `-c`.
        name: String,
        /// Its URI.
        uri: String,
    },
    /// `-c` (or a write into the create target) without write authority over the bead.
    #[error("permission denied: no write authority over bead {uri}: {reason}")]
    NoWriteAuthority {
        /// The bead.
        uri: String,
        /// Why (owner, mode, delegation).
        reason: String,
    },
    /// A remove or rename of a name that only a read-only member has.
    #[error("permission denied: {path} is in read-only bead {bead} ({uri})")]
    ReadOnly {
        /// The path in the view (`/ctx/notes/x.md`).
        path: String,
        /// The member's name.
        bead: String,
        /// The member's URI.
        uri: String,
    },
    /// Any other refusal of a union operation (kind folders, escaping symlinks, …).
    #[error("permission denied: {path}: {reason}")]
    Denied {
        /// The path in the view.
        path: String,
        /// Why.
        reason: String,
    },
    /// A name that no layer of the view has.
    #[error("{path}: file does not exist")]
    NotFound {
        /// The path in the view.
        path: String,
    },
    /// Create or rename onto a name the view already has.
    #[error("{path}: file already exists")]
    Exists {
        /// The path in the view.
        path: String,
    },
    /// A path that walks through, or lists, something that is not a directory.
    #[error("{path}: not a directory")]
    NotDir {
        /// The path in the view.
        path: String,
    },
    /// A file operation on a directory.
    #[error("{path}: is a directory")]
    IsDir {
        /// The path in the view.
        path: String,
    },
    /// Removing a directory that still has entries.
    #[error("{path}: directory not empty")]
    NotEmpty {
        /// The path in the view.
        path: String,
    },
    /// A rename whose source and destination are routed to different layers.
    #[error(
        "cannot rename {from} to {to}: source is in {from_layer} but {to} would be created in {to_layer} (cross-device link; copy and remove instead)"
    )]
    CrossLayer {
        /// The source path in the view.
        from: String,
        /// The destination path in the view.
        to: String,
        /// The layer that holds the source.
        from_layer: String,
        /// The layer a new `to` would be created in.
        to_layer: String,
    },
    /// A session namespace file that does not parse or does not replay.
    #[error("namespace file: {reason}")]
    NamespaceFile {
        /// What was wrong, with the key path.
        reason: String,
    },
    /// A filesystem call failed.
    #[error("cannot {op} {}: {}", path.display(), io_phrase(source))]
    Io {
        /// What was being done (`create`, `read`, `rename`, …).
        op: &'static str,
        /// The real path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The system random number generator failed.
    #[error("cannot generate a uuid: no randomness")]
    Random {
        /// The cause.
        #[source]
        source: getrandom::Error,
    },
    /// Neither `XDG_DATA_HOME` nor `HOME` is set to an absolute path.
    #[error(
        "no data directory for the bead registry: set XDG_DATA_HOME or HOME to an absolute path"
    )]
    NoDataDir,
}

impl Error {
    /// The errno a FUSE layer should return (a 9P server can send the message as is).
    pub fn errno(&self) -> i32 {
        match self {
            Error::InvalidSlug { .. }
            | Error::InvalidName { .. }
            | Error::InvalidPoint { .. }
            | Error::InvalidPath { .. }
            | Error::RemoteBead { .. }
            | Error::InvalidUri { .. }
            | Error::AmbiguousName { .. }
            | Error::NamespaceFile { .. } => libc::EINVAL,
            Error::NotABead { .. } => libc::ENOTDIR,
            Error::UnknownBead { .. }
            | Error::UnknownPoint { .. }
            | Error::NotMember { .. }
            | Error::NotFound { .. }
            | Error::NoDataDir => libc::ENOENT,
            Error::SlugTaken { .. } | Error::Exists { .. } | Error::AlreadyStarted { .. } => {
                libc::EEXIST
            }
            Error::SecondCreate { .. } => libc::EBUSY,
            Error::NoWriteAuthority { .. } | Error::ReadOnly { .. } | Error::Denied { .. } => {
                libc::EACCES
            }
            Error::NotDir { .. } => libc::ENOTDIR,
            Error::IsDir { .. } => libc::EISDIR,
            Error::NotEmpty { .. } => libc::ENOTEMPTY,
            Error::CrossLayer { .. } => libc::EXDEV,
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Random { .. } => libc::EIO,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// The 9pfuse word for an I/O error, so the message maps to the right errno by substring.
fn io_phrase(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOENT) => "file does not exist",
        Some(libc::EACCES) => "permission denied",
        Some(libc::EPERM) => "not permitted",
        Some(libc::EEXIST) => "file already exists",
        Some(libc::EISDIR) => "is a directory",
        Some(libc::ENOTDIR) => "not a directory",
        Some(libc::EROFS) => "read-only file system",
        Some(libc::EBUSY) => "in use",
        Some(libc::EINVAL) => "invalid argument",
        Some(libc::ENOTEMPTY) => "directory not empty",
        Some(libc::ENOSPC) => "no space left on device",
        Some(libc::ELOOP) => "too many levels of symbolic links",
        Some(libc::EXDEV) => "cross-device link",
        _ => match e.kind() {
            io::ErrorKind::NotFound => "file does not exist",
            io::ErrorKind::PermissionDenied => "permission denied",
            io::ErrorKind::AlreadyExists => "file already exists",
            io::ErrorKind::InvalidData => "invalid data",
            _ => "i/o error",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping_and_messages_are_one_line() {
        let cases: Vec<(Error, i32)> = vec![
            (
                Error::NotFound {
                    path: "/ctx/x".into(),
                },
                libc::ENOENT,
            ),
            (
                Error::ReadOnly {
                    path: "/ctx/x".into(),
                    bead: "A".into(),
                    uri: "file:///a/".into(),
                },
                libc::EACCES,
            ),
            (
                Error::Exists {
                    path: "/ctx/x".into(),
                },
                libc::EEXIST,
            ),
            (
                Error::NotDir {
                    path: "/ctx/x".into(),
                },
                libc::ENOTDIR,
            ),
            (
                Error::IsDir {
                    path: "/ctx/x".into(),
                },
                libc::EISDIR,
            ),
            (
                Error::InvalidPath {
                    path: "../x".into(),
                    reason: "`..` is not allowed",
                },
                libc::EINVAL,
            ),
            (
                Error::CrossLayer {
                    from: "/ctx/a".into(),
                    to: "/ctx/notes/a".into(),
                    from_layer: "the shadow layer".into(),
                    to_layer: "bead C".into(),
                },
                libc::EXDEV,
            ),
            (
                Error::io("read", "/x", io::Error::from_raw_os_error(libc::EACCES)),
                libc::EACCES,
            ),
        ];
        for (e, errno) in cases {
            assert_eq!(e.errno(), errno, "{e}");
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "{msg}");
        }
        let e = Error::ReadOnly {
            path: "/ctx/x".into(),
            bead: "A".into(),
            uri: "file:///a/".into(),
        };
        assert!(e.to_string().contains("permission denied"));
        assert!(
            Error::NotFound {
                path: "/ctx/x".into()
            }
            .to_string()
            .contains("file does not exist")
        );
        assert!(
            Error::io("open", "/x", io::Error::from_raw_os_error(libc::ENOENT))
                .to_string()
                .ends_with("file does not exist")
        );
    }
}
