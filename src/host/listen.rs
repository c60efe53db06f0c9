// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon's listening sockets (vhost-user, vfio-user, control): made private to the
//! daemon's user (0600), or to it and a group (0660), before anyone can connect, and never
//! stealing a socket a live process serves or destroying a file at a mistyped path.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use crate::host::files::Group;

/// Why a socket cannot be listened on.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot check {}: {source}", .path.display())]
    Check { path: PathBuf, source: io::Error },
    #[error(
        "{} exists and is not a socket; refusing to replace it (choose another socket path)",
        .0.display()
    )]
    NotSocket(PathBuf),
    #[error(
        "socket {} is in use by a running process; stop it or choose another --socket-path",
        .0.display()
    )]
    InUse(PathBuf),
    #[error("cannot remove stale socket {}: {source}", .path.display())]
    RemoveStale { path: PathBuf, source: io::Error },
    #[error(
        "cannot tell whether socket {} is in use ({source}); refusing to replace it",
        .path.display()
    )]
    Unknown { path: PathBuf, source: io::Error },
    #[error("cannot listen on {}: {source}", .path.display())]
    Listen { path: PathBuf, source: io::Error },
    #[error("cannot give the socket to group {gid}: {source}")]
    Group { gid: libc::gid_t, source: io::Error },
    /// What could not be done ("set the socket's mode"), and why.
    #[error("cannot {0}: {1}")]
    Io(&'static str, io::Error),
}

fn listen_error(path: &Path, source: io::Error) -> ListenError {
    ListenError::Listen {
        path: path.into(),
        source,
    }
}

/// Binds the socket, refusing to steal one that a live daemon serves; private to the
/// daemon's user (0600), or to it and `group` (0660).
pub fn bind(path: &Path, group: Group) -> Result<UnixListener, ListenError> {
    remove_stale(path)?;
    // Made and given its mode in a directory only we can enter, then moved into place:
    // nobody can connect before the mode is right.
    let dir = private_dir(path)?;
    let made = dir.join("s");
    let result = bind_in(&made, path, group).and_then(|listener| {
        rename_no_replace(&made, path)?;
        Ok(listener)
    });
    let _ = std::fs::remove_file(&made);
    let _ = std::fs::remove_dir(&dir);
    result
}

/// Removes a socket left by a crashed daemon. Anything else at `path` (a file, a link, a
/// socket a process serves) is an error: a mistyped path must not destroy a user's file.
fn remove_stale(path: &Path) -> Result<(), ListenError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ListenError::Check {
                path: path.into(),
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ListenError::NotSocket(path.into()));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(ListenError::InUse(path.into())),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
            log::info!("removing stale socket {}", path.display());
            std::fs::remove_file(path).map_err(|source| ListenError::RemoveStale {
                path: path.into(),
                source,
            })
        }
        Err(source) => Err(ListenError::Unknown {
            path: path.into(),
            source,
        }),
    }
}

/// A new directory next to `path` that only the daemon's user can enter.
fn private_dir(path: &Path) -> Result<PathBuf, ListenError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut last = None;
    for n in 0..100u32 {
        let dir = parent.join(format!(".cxl{}-{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(listen_error(path, e)),
        }
    }
    let last = last.unwrap_or_else(|| io::ErrorKind::AlreadyExists.into());
    Err(listen_error(path, last))
}

fn bind_in(made: &Path, path: &Path, group: Group) -> Result<UnixListener, ListenError> {
    let listener = UnixListener::bind(made).map_err(|e| listen_error(path, e))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(made, None, Some(gid))
            .map_err(|source| ListenError::Group { gid, source })?;
    }
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(made, std::fs::Permissions::from_mode(mode))
        .map_err(|e| ListenError::Io("set the socket's mode", e))?;
    Ok(listener)
}

fn rename_no_replace(from: &Path, to: &Path) -> Result<(), ListenError> {
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).ok();
    let (Some(f), Some(t)) = (c(from), c(to)) else {
        let nul = io::Error::new(io::ErrorKind::InvalidInput, "NUL in path");
        return Err(listen_error(to, nul));
    };
    // SAFETY: renameat2 with two valid C strings; no memory is kept.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc != 0 {
        return Err(listen_error(to, io::Error::last_os_error()));
    }
    Ok(())
}
