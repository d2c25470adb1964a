//! The unix socket olliesrv listens on: the plan9port namespace convention, a private
//! directory, and safe replacement of a stale socket.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot create directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "directory {path} is owned by uid {owner}, not by us (uid {us}); refusing to put a socket there"
    )]
    DirOwner { path: PathBuf, owner: u32, us: u32 },
    #[error(
        "directory {path} has mode {mode:o}; it must not be group- or world-accessible (chmod 700 it)"
    )]
    DirMode { path: PathBuf, mode: u32 },
    #[error("{path} exists and is not a socket; remove it or choose another address")]
    NotSocket { path: PathBuf },
    #[error("another server is already listening on {path}")]
    InUse { path: PathBuf },
    #[error("cannot listen on {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A bound listener that removes its socket file when dropped (if the file is still ours).
#[derive(Debug)]
pub struct UnixSocket {
    pub path: PathBuf,
    pub listener: Option<tokio::net::UnixListener>,
    ino: u64,
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.path)
            && m.ino() == self.ino
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Makes sure `dir` exists, is ours and is private (0700 when we create it).
fn private_dir(dir: &Path) -> Result<(), ListenError> {
    let us = nix::unistd::getuid().as_raw();
    match std::fs::symlink_metadata(dir) {
        Ok(m) => {
            if m.uid() != us {
                return Err(ListenError::DirOwner {
                    path: dir.to_owned(),
                    owner: m.uid(),
                    us,
                });
            }
            let mode = m.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(ListenError::DirMode {
                    path: dir.to_owned(),
                    mode,
                });
            }
            Ok(())
        }
        Err(_) => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| ListenError::CreateDir {
                path: dir.to_owned(),
                source,
            }),
    }
}

/// Binds `path` with mode 0600 inside a private directory. A socket left by a dead server is
/// replaced; a live one is not.
pub fn bind_unix(path: &Path) -> Result<UnixSocket, ListenError> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        private_dir(dir)?;
    }
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(ListenError::NotSocket {
                path: path.to_owned(),
            });
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(ListenError::InUse {
                    path: path.to_owned(),
                });
            }
            Err(_) => {
                tracing::info!(path = %path.display(), "replacing stale socket");
                let _ = std::fs::remove_file(path);
            }
        }
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|source| ListenError::Bind {
        path: path.to_owned(),
        source,
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        ListenError::Bind {
            path: path.to_owned(),
            source,
        }
    })?;
    let ino = std::fs::symlink_metadata(path).map_or(0, |m| m.ino());
    Ok(UnixSocket {
        path: path.to_owned(),
        listener: Some(listener),
        ino,
    })
}
