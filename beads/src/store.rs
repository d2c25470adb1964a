//! Private directories and atomic, durable file writes.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::libc;

use crate::Error;
use crate::ids::random_suffix;

/// Mode of every directory this crate creates.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file this crate creates.
pub const FILE_MODE: u32 = 0o600;

/// Creates one directory with mode 0700; fails if it exists.
pub(crate) fn create_dir_private(path: &Path) -> Result<(), Error> {
    DirBuilder::new()
        .mode(DIR_MODE)
        .create(path)
        .map_err(|e| Error::io("create directory", path, e))
}

/// Creates a directory and its missing parents with mode 0700; an existing directory is fine.
pub(crate) fn ensure_dir_private(path: &Path) -> Result<(), Error> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
        .map_err(|e| Error::io("create directory", path, e))
}

/// Creates a new empty file with mode 0600; fails if the name exists (even as a dangling
/// symlink: `O_EXCL` never follows one).
pub(crate) fn create_new_file(path: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io("create", path, e))
}

/// Writes `bytes` to `path` atomically and durably: a 0600 temporary file next to it is
/// written, fsynced and renamed over `path`, then the directory is fsynced. Readers see the
/// old or the new content, never a mix; a crash leaves at most a `.NAME.tmp-…` file behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    replace_atomic(path, |f| f.write_all(bytes))
}

/// Copies the regular file `src` to `dst` atomically (as [`write_atomic`]); `dst` gets mode 0600.
pub(crate) fn copy_atomic(src: &Path, dst: &Path) -> Result<(), Error> {
    let mut from = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(src)
        .map_err(|e| Error::io("open", src, e))?;
    replace_atomic(dst, |f| io::copy(&mut from, f).map(|_| ()))
}

fn replace_atomic(
    path: &Path,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), Error> {
    let (dir, tmp) = temp_sibling(path)?;
    let mut f = create_new_file(&tmp)?;
    let written = fill(&mut f).and_then(|()| f.sync_all());
    drop(f);
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io("write", tmp, e));
    }
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io("rename into place", path, e));
    }
    sync_dir(&dir)
}

fn temp_sibling(path: &Path) -> Result<(PathBuf, PathBuf), Error> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Error::io(
            "write",
            path,
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "no parent directory or file name",
            ),
        ));
    };
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        random_suffix()?
    ));
    Ok((dir.to_path_buf(), tmp))
}

/// fsyncs a directory so a rename or create in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("sync directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn atomic_write_replaces_and_is_private() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // No temporary file is left behind.
        assert_eq!(fs::read_dir(t.path()).unwrap().count(), 1);
        let d = t.path().join("a/b");
        ensure_dir_private(&d).unwrap();
        ensure_dir_private(&d).unwrap();
        assert_eq!(
            fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert!(create_dir_private(&d).is_err());
    }
}
