//! Sealed copies: a file's bytes in a memfd nobody can change any more, for running exactly
//! what was checked ([`crate::RunRequest::exec_fd`], [`crate::RunRequest::pass_fds`]).
//!
//! [`sealed_copy`] streams a reader into a new memfd, hashing exactly the bytes it copies,
//! then seals it against writes, growing, shrinking and further seal changes
//! (`F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL`, read back), its offset back
//! at 0. Whoever holds the
//! descriptor afterwards (the tool included) can read and execute it, never change it.
//!
//! Tested by the unit tests below.

use std::ffi::CString;
use std::io::{self, ErrorKind, Read};
use std::os::fd::{AsRawFd, OwnedFd};

use sha2::{Digest, Sha256};

use crate::sys;

/// A sealed copy ([`sealed_copy`]).
#[derive(Debug)]
pub struct SealedCopy {
    /// The memfd (close-on-exec in this process).
    pub fd: OwnedFd,
    /// The number of bytes copied.
    pub len: u64,
    /// SHA-256 of exactly the bytes copied.
    pub sha256: [u8; 32],
}

/// Why a sealed copy could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The source holds more than the limit.
    #[error("it is larger than {max} bytes")]
    TooLarge {
        /// The limit.
        max: u64,
    },
    /// Reading the source failed.
    #[error("it cannot be read")]
    Read {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Creating, filling or sealing the memfd failed.
    #[error("the sealed copy cannot be made ({op})")]
    Memfd {
        /// The step.
        op: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

fn memfd_err(op: &'static str) -> impl FnOnce(io::Error) -> SealError {
    move |source| SealError::Memfd { op, source }
}

/// Copies everything `src` yields (at most `max` bytes) into a new memfd named `name`
/// (shown as `/memfd:NAME` in `/proc/*/fd`; NUL bytes dropped, at most 200 bytes), with mode
/// `mode & 0o555`, sealed.
pub fn sealed_copy(
    src: &mut dyn Read,
    name: &str,
    mode: u32,
    max: u64,
) -> Result<SealedCopy, SealError> {
    let mut label: Vec<u8> = name.bytes().filter(|b| *b != 0).take(200).collect();
    if label.is_empty() {
        label.extend_from_slice(b"ollie");
    }
    let label = CString::new(label).map_err(|e| memfd_err("name")(io::Error::other(e)))?;
    let fd = sys::memfd_sealable(&label).map_err(memfd_err("create"))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut len: u64 = 0;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(source) => return Err(SealError::Read { source }),
        };
        len += n as u64;
        if len > max {
            return Err(SealError::TooLarge { max });
        }
        h.update(&buf[..n]);
        sys::write_all(fd.as_raw_fd(), &buf[..n]).map_err(memfd_err("write"))?;
    }
    sys::rewind(&fd).map_err(memfd_err("rewind"))?;
    sys::fchmod(&fd, mode & 0o555).map_err(memfd_err("chmod"))?;
    sys::add_seals(
        &fd,
        libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
    )
    .map_err(memfd_err("seal"))?;
    Ok(SealedCopy {
        fd,
        len,
        sha256: h.finalize().into(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::io::{Seek, Write};
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_sealed_copy_holds_the_bytes_and_cannot_change() {
        let data = b"#!/bin/sh\necho sealed\n".repeat(5000);
        let c = sealed_copy(&mut &data[..], "run.sh", 0o775, 1 << 20).unwrap();
        assert_eq!(c.len, data.len() as u64);
        assert_eq!(c.sha256, <[u8; 32]>::from(Sha256::digest(&data)));
        let mut f = std::fs::File::from(c.fd);
        let mut back = Vec::new();
        f.read_to_end(&mut back).unwrap();
        assert!(back == data, "read back {} bytes", back.len());
        let meta = f.metadata().unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o555);
        // No write, truncate, growth or reopening for writing.
        f.rewind().unwrap();
        assert!(f.write_all(b"x").is_err());
        assert!(f.set_len(1).is_err());
        assert!(f.set_len(data.len() as u64 + 1).is_err());
        let path = format!("/proc/self/fd/{}", f.as_raw_fd());
        if let Ok(mut w) = std::fs::OpenOptions::new().write(true).open(&path) {
            assert!(w.write_all(b"x").is_err());
        }
        // The seals themselves are sealed.
        assert!(sys::add_seals(&OwnedFd::from(f), libc::F_SEAL_EXEC).is_err());
    }

    #[test]
    fn a_sealed_copy_refuses_more_than_the_limit() {
        let e = sealed_copy(&mut &[0u8; 10][..], "big", 0o644, 9).unwrap_err();
        assert!(matches!(e, SealError::TooLarge { max: 9 }), "{e}");
        let c = sealed_copy(&mut &[0u8; 0][..], "", 0o644, 0).unwrap();
        assert_eq!(c.len, 0);
        assert_eq!(
            std::fs::File::from(c.fd)
                .metadata()
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o444
        );
    }
}
