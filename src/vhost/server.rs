// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Socket handling: one listener for the daemon's life, a fresh vhost-user session per
//! front-end connection (so QEMU can reconnect), device state shared across sessions.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::device::dispatch::Dispatcher;
use crate::device::Device;
use crate::host::files::Group;
use crate::vhost::CxlBackend;

/// Why the socket cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
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
    #[error("cannot {0}: {1}")]
    Session(&'static str, vhost_user_backend::Error),
    #[error("socket path is not UTF-8")]
    NotUtf8,
}

fn listen_error(path: &Path, source: io::Error) -> ServerError {
    ServerError::Listen {
        path: path.into(),
        source,
    }
}

/// Binds the socket, refusing to steal one that a live daemon serves; private to the
/// daemon's user (0600), or to it and `group` (0660).
pub fn bind(path: &Path, group: Group) -> Result<Listener, ServerError> {
    bind_std(path, group).map(Listener::from)
}

/// [`bind`], as a plain listener.
pub fn bind_std(path: &Path, group: Group) -> Result<UnixListener, ServerError> {
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
fn remove_stale(path: &Path) -> Result<(), ServerError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ServerError::Check {
                path: path.into(),
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ServerError::NotSocket(path.into()));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(ServerError::InUse(path.into())),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
            log::info!("removing stale socket {}", path.display());
            std::fs::remove_file(path).map_err(|source| ServerError::RemoveStale {
                path: path.into(),
                source,
            })
        }
        Err(source) => Err(ServerError::Unknown {
            path: path.into(),
            source,
        }),
    }
}

/// A new directory next to `path` that only the daemon's user can enter.
fn private_dir(path: &Path) -> Result<PathBuf, ServerError> {
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

fn bind_in(made: &Path, path: &Path, group: Group) -> Result<UnixListener, ServerError> {
    let listener = UnixListener::bind(made).map_err(|e| listen_error(path, e))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(made, None, Some(gid))
            .map_err(|source| ServerError::Group { gid, source })?;
    }
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(made, std::fs::Permissions::from_mode(mode))
        .map_err(|e| ServerError::Io("set the socket's mode", e))?;
    Ok(listener)
}

fn rename_no_replace(from: &Path, to: &Path) -> Result<(), ServerError> {
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

/// Where sessions come from: our listening socket, or QEMU's (QEMU as the server, so a
/// restarted daemon finds it again: `-chardev socket,server=on`).
pub enum Endpoint<'a> {
    Listen(&'a mut Listener),
    Connect(std::path::PathBuf),
}

/// Serves front-end connections one after another; returns after `max_sessions` sessions
/// (None: forever) or on a listener error.
pub fn serve(
    listener: &mut Listener,
    device: Arc<Device>,
    dispatcher: Arc<Dispatcher>,
    queue_size: u16,
    max_sessions: Option<usize>,
) -> Result<(), ServerError> {
    serve_endpoint(
        Endpoint::Listen(listener),
        device,
        dispatcher,
        queue_size,
        max_sessions,
        false,
    )
    .map(|_| ())
}

/// How the last session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// The front-end went away.
    Disconnected,
    /// The daemon refused a message and ended the session.
    Refused,
}

pub fn serve_endpoint(
    mut endpoint: Endpoint,
    device: Arc<Device>,
    dispatcher: Arc<Dispatcher>,
    queue_size: u16,
    max_sessions: Option<usize>,
    resume: bool,
) -> Result<SessionEnd, ServerError> {
    let mut sessions = 0;
    let mut end = SessionEnd::Disconnected;
    let announcer = crate::vhost::announcer::Announcer::start()
        .map_err(|e| ServerError::Io("start the backend-channel thread", e))?;
    while max_sessions.is_none_or(|m| sessions < m) {
        // Only the first session can continue a connection a previous daemon served.
        let backend = Arc::new(CxlBackend::with_resume(
            device.clone(),
            dispatcher.clone(),
            announcer.clone(),
            queue_size,
            resume && sessions == 0,
        ));
        let mut daemon = VhostUserDaemon::new(
            "cxl-accel".to_string(),
            backend.clone(),
            GuestMemoryAtomic::new(GuestMemoryMmap::new()),
        )
        .map_err(|e| ServerError::Session("create vhost-user daemon", e))?;
        // Events the control channel posts are delivered without waiting for a command.
        if let (Some((fd, waker)), Some(h)) =
            (backend.event_waker(), daemon.get_epoll_handlers().first())
        {
            match h.register_listener(
                fd,
                vmm_sys_util::epoll::EventSet::IN,
                crate::vhost::EVENT_WAKE as u64,
            ) {
                Ok(()) => device.set_event_waker(Some(waker)),
                Err(e) => log::warn!("events will wait for the next command: {e}"),
            }
        }
        match &mut endpoint {
            Endpoint::Listen(listener) => daemon
                .start(listener)
                .map_err(|e| ServerError::Session("accept a connection", e))?,
            Endpoint::Connect(path) => connect(&mut daemon, path)?,
        }
        log::info!("front-end connected");
        end = match daemon.wait() {
            Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(
                VhostUserError::Disconnected | VhostUserError::PartialMessage,
            )) => {
                log::info!("front-end disconnected");
                SessionEnd::Disconnected
            }
            Err(e) => {
                log::warn!("session ended: {e}");
                SessionEnd::Refused
            }
        };
        for handler in daemon.get_epoll_handlers() {
            handler.send_exit_event();
        }
        // The backend channel died with the session, and so did its epoll thread.
        device.set_export_sink(None, false);
        device.set_event_waker(None);
        let stages = device.stages().line();
        if !stages.is_empty() {
            log::info!(
                "request stages: {stages}; daemon CPU time so far {:.2} s",
                process_cpu_seconds()
            );
        }
        backend.stop_commands();
        if !dispatcher.drain(Duration::from_secs(5)) {
            log::warn!("commands still running after the session ended");
        }
        sessions += 1;
    }
    Ok(end)
}

/// Connects to the front-end's socket, waiting for it to appear (QEMU restarting, or not
/// started yet).
fn connect<T>(daemon: &mut VhostUserDaemon<T>, path: &Path) -> Result<(), ServerError>
where
    T: vhost_user_backend::VhostUserBackend + Clone + 'static,
    T::Bitmap: vhost_user_backend::bitmap::BitmapReplace
        + vm_memory::bitmap::NewBitmap
        + Clone
        + Send
        + Sync,
    T::Vring: Clone + Send + Sync,
{
    let p = path.to_str().ok_or(ServerError::NotUtf8)?;
    let mut said = false;
    loop {
        match daemon.start_client(p) {
            Ok(()) => return Ok(()),
            Err(e) => {
                if !said {
                    log::info!("waiting for the front-end at {} ({e})", path.display());
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// CPU time this process has used (what busy-polling costs shows here).
fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}
