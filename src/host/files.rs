// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon's own files (device memory, state): created private, never reached through
//! a symbolic link, refused when they are not regular files of the daemon's user, fully
//! allocated up front, and locked while a daemon runs.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Why one of the daemon's files cannot be used. `what` names the file ("memory file").
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{what} {} is a symbolic link; refusing to follow it (name the file itself)", .path.display())]
    Link { what: &'static str, path: PathBuf },
    #[error("cannot open {what} {}: {source}", .path.display())]
    Open {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot stat {what} {}: {source}", .path.display())]
    Stat {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {} is not a regular file; refusing to use it", .path.display())]
    NotRegular { what: &'static str, path: PathBuf },
    #[error(
        "{what} {} belongs to uid {uid}, not to this daemon's user (uid {me}); refusing to use it",
        .path.display()
    )]
    Stranger {
        what: &'static str,
        path: PathBuf,
        uid: u32,
        me: u32,
    },
    #[error("cannot give {what} {} to group {gid}: {source}", .path.display())]
    Group {
        what: &'static str,
        path: PathBuf,
        gid: libc::gid_t,
        source: std::io::Error,
    },
    #[error("cannot set the mode of {what} {}: {source}", .path.display())]
    Mode {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} size {len} too large")]
    TooLarge { what: &'static str, len: u64 },
    #[error("cannot allocate {len} bytes for {what} {}: {source}", .path.display())]
    Allocate {
        what: &'static str,
        path: PathBuf,
        len: u64,
        source: std::io::Error,
    },
    #[error(
        "{what} {} is locked by another running cxl-accel: two daemons must not share one device",
        .path.display()
    )]
    Locked { what: &'static str, path: PathBuf },
    #[error("cannot lock {what} {}: {source}", .path.display())]
    Lock {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Who besides the daemon's user may open a file: nobody (mode 0600), or the members of
/// one group (0660; `--socket-group`, for a QEMU running as another user).
pub type Group = Option<libc::gid_t>;

fn mode(group: Group) -> u32 {
    if group.is_some() {
        0o660
    } else {
        0o600
    }
}

/// Opens `path` read-write, creating it when missing. `what` names it in errors ("memory
/// file"). A symbolic link, anything but a regular file, or a file of another user is
/// refused; an existing file gets the mode (and group) it would have been created with.
pub fn open_private(path: &Path, what: &'static str, group: Group) -> Result<File, FileError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(mode(group))
        // O_NONBLOCK: a FIFO put in our way must not block the open; it is refused below.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP) => FileError::Link {
                what,
                path: path.into(),
            },
            _ => FileError::Open {
                what,
                path: path.into(),
                source,
            },
        })?;
    let meta = file.metadata().map_err(|source| FileError::Stat {
        what,
        path: path.into(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(FileError::NotRegular {
            what,
            path: path.into(),
        });
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(FileError::Stranger {
            what,
            path: path.into(),
            uid: meta.uid(),
            me,
        });
    }
    if let Some(gid) = group.filter(|&g| g != meta.gid()) {
        // SAFETY: fchown on a descriptor we own; -1 leaves the owner as it is.
        if unsafe { libc::fchown(file.as_raw_fd(), u32::MAX, gid) } != 0 {
            return Err(FileError::Group {
                what,
                path: path.into(),
                gid,
                source: std::io::Error::last_os_error(),
            });
        }
    }
    if meta.mode() & 0o7777 != mode(group) {
        // SAFETY: fchmod on a descriptor we own.
        if unsafe { libc::fchmod(file.as_raw_fd(), mode(group)) } != 0 {
            return Err(FileError::Mode {
                what,
                path: path.into(),
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(file)
}

/// Gives the first `len` bytes of `file` real storage, so that a full file system (tmpfs)
/// is an error here and not a SIGBUS at the first write to a page.
pub fn allocate(file: &File, len: u64, path: &Path, what: &'static str) -> Result<(), FileError> {
    let off = libc::off_t::try_from(len).map_err(|_| FileError::TooLarge { what, len })?;
    // SAFETY: posix_fallocate on a descriptor we own; no memory is involved.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, off) };
    if rc != 0 {
        return Err(FileError::Allocate {
            what,
            path: path.into(),
            len,
            source: std::io::Error::from_raw_os_error(rc),
        });
    }
    Ok(())
}

/// Takes the "a daemon owns this" lock on `file`; it lasts while the open file lives.
/// Only the daemon's user (and the group it names) can open the file, so nobody else can
/// hold the lock.
pub fn lock_exclusive(file: &File, path: &Path, what: &'static str) -> Result<(), FileError> {
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(());
    }
    let source = std::io::Error::last_os_error();
    let path = path.into();
    if source.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(FileError::Locked { what, path });
    }
    Err(FileError::Lock { what, path, source })
}

/// Duplicates of `fds` (a message kept with its descriptors, to send again).
pub fn dup_all(fds: &[std::os::fd::OwnedFd]) -> std::io::Result<Vec<std::os::fd::OwnedFd>> {
    fds.iter().map(|f| f.try_clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_files_refuse_links_and_strangers() {
        let dir = std::env::temp_dir().join(format!("cxl-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("f");
        let file = open_private(&f, "test file", None).unwrap();
        assert_eq!(file.metadata().unwrap().mode() & 0o7777, 0o600);
        // An existing file of ours is tightened.
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        open_private(&f, "test file", None).unwrap();
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o7777, 0o600);
        let link = dir.join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let e = open_private(&link, "test file", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let e = open_private(&dir, "test file", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot open") || e.contains("not a regular"),
            "{e}"
        );
        // One lock per open file: a second open of the same file cannot take it.
        lock_exclusive(&file, &f, "test file").unwrap();
        let again = open_private(&f, "test file", None).unwrap();
        let e = lock_exclusive(&again, &f, "test file")
            .unwrap_err()
            .to_string();
        assert!(e.contains("locked by another running cxl-accel"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
