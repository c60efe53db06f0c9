// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Socket handling: one listener for the daemon's life, a fresh vhost-user session per
//! front-end connection (so QEMU can reconnect), device state shared across sessions.

use std::io;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::device::dispatch::Dispatcher;
use crate::device::Device;
use crate::host::files::Group;
use crate::host::listen::{self, ListenError};
use crate::vhost::CxlBackend;

/// Why the socket cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// What could not be done, and why.
    #[error("cannot {0}: {1}")]
    Io(&'static str, io::Error),
    #[error("cannot {0}: {1}")]
    Session(&'static str, vhost_user_backend::Error),
    #[error("socket path is not UTF-8")]
    NotUtf8,
}

/// Binds the socket (see [`crate::host::listen::bind`]) for vhost-user.
pub fn bind(path: &Path, group: Group) -> Result<Listener, ServerError> {
    Ok(listen::bind(path, group).map(Listener::from)?)
}

/// [`bind`], as a plain listener.
pub fn bind_std(path: &Path, group: Group) -> Result<UnixListener, ServerError> {
    Ok(listen::bind(path, group)?)
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
