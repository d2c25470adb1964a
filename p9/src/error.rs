//! The error a file server hands back to a client as `Rerror`.
//!
//! Clients map error strings to errno by substring (plan9port's 9pfuse does), so the
//! constructors below use the words those clients look for; callers add context after them.

use std::borrow::Cow;
use std::fmt;

/// A one-line error message for an `Rerror`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(Cow<'static, str>);

/// Longest message we send; longer ones are cut.
pub const MAX_ERROR_LEN: usize = 1024;

impl Error {
    /// An error with this message. It is made one line (control characters become spaces) and cut
    /// to [`MAX_ERROR_LEN`] bytes when it is sent.
    pub fn new(msg: impl Into<Cow<'static, str>>) -> Error {
        Error(msg.into())
    }

    /// The message as it will be sent: one line, bounded.
    pub fn message(&self) -> String {
        let mut s: String = self
            .0
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if s.len() > MAX_ERROR_LEN {
            let mut cut = MAX_ERROR_LEN;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
        }
        s
    }

    /// ENOENT.
    pub fn not_found() -> Error {
        Error::new("file does not exist")
    }
    /// EACCES.
    pub fn permission_denied() -> Error {
        Error::new("permission denied")
    }
    /// EPERM.
    pub fn not_permitted() -> Error {
        Error::new("not permitted")
    }
    /// EEXIST.
    pub fn exists() -> Error {
        Error::new("file already exists")
    }
    /// EISDIR.
    pub fn is_dir() -> Error {
        Error::new("is a directory")
    }
    /// ENOTDIR.
    pub fn not_dir() -> Error {
        Error::new("not a directory")
    }
    /// EROFS.
    pub fn read_only() -> Error {
        Error::new("read-only file")
    }
    /// EBUSY.
    pub fn in_use() -> Error {
        Error::new("file in use")
    }
    /// EINVAL, with what was wrong.
    pub fn invalid(what: impl fmt::Display) -> Error {
        Error::new(format!("invalid argument: {what}"))
    }
    /// EINTR.
    pub fn interrupted() -> Error {
        Error::new("interrupted")
    }
    /// ENOSYS.
    pub fn not_implemented() -> Error {
        Error::new("not implemented")
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<String> for Error {
    fn from(s: String) -> Error {
        Error::new(s)
    }
}

impl From<&'static str> for Error {
    fn from(s: &'static str) -> Error {
        Error::new(s)
    }
}

/// Result of a file server operation.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_bounded_line() {
        let e = Error::new("a\nb\tc");
        assert_eq!(e.message(), "a b c");
        let long = Error::new("é".repeat(MAX_ERROR_LEN));
        let m = long.message();
        assert!(m.len() <= MAX_ERROR_LEN);
        assert!(m.chars().all(|c| c == 'é'));
    }
}
