//! Socket handling: one listener for the daemon's life, a fresh vhost-user session per
//! front-end connection (so QEMU can reconnect), device state shared across sessions.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::backend::CxlBackend;
use crate::device::Device;
use crate::dispatch::Dispatcher;

/// Binds the socket, refusing to steal one that a live daemon serves.
pub fn bind(path: &Path) -> Result<Listener, String> {
    bind_std(path).map(Listener::from)
}

/// [`bind`], as a plain listener.
pub fn bind_std(path: &Path) -> Result<std::os::unix::net::UnixListener, String> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(format!(
                "socket {} is in use by a running process; stop it or choose another --socket-path",
                path.display()
            ));
        }
        log::info!("removing stale socket {}", path.display());
    }
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    // Only the owner (QEMU runs as the same user) may connect.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot set permissions of {}: {e}", path.display()))?;
    Ok(listener)
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
) -> io::Result<()> {
    serve_endpoint(
        Endpoint::Listen(listener),
        device,
        dispatcher,
        queue_size,
        max_sessions,
        false,
    )
}

pub fn serve_endpoint(
    mut endpoint: Endpoint,
    device: Arc<Device>,
    dispatcher: Arc<Dispatcher>,
    queue_size: u16,
    max_sessions: Option<usize>,
    resume: bool,
) -> io::Result<()> {
    let mut sessions = 0;
    while max_sessions.is_none_or(|m| sessions < m) {
        // Only the first session can continue a connection a previous daemon served.
        let backend = Arc::new(CxlBackend::with_resume(
            device.clone(),
            dispatcher.clone(),
            queue_size,
            resume && sessions == 0,
        ));
        let mut daemon = VhostUserDaemon::new(
            "cxl-accel".to_string(),
            backend,
            GuestMemoryAtomic::new(GuestMemoryMmap::new()),
        )
        .map_err(|e| io::Error::other(format!("cannot create vhost-user daemon: {e}")))?;
        match &mut endpoint {
            Endpoint::Listen(listener) => daemon
                .start(listener)
                .map_err(|e| io::Error::other(format!("cannot accept a connection: {e}")))?,
            Endpoint::Connect(path) => connect(&mut daemon, path)?,
        }
        log::info!("front-end connected");
        match daemon.wait() {
            Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(
                VhostUserError::Disconnected | VhostUserError::PartialMessage,
            )) => log::info!("front-end disconnected"),
            Err(e) => log::warn!("session ended: {e}"),
        }
        for handler in daemon.get_epoll_handlers() {
            handler.send_exit_event();
        }
        // The backend channel died with the session.
        device.set_export_sink(None, false);
        if !dispatcher.drain(Duration::from_secs(30)) {
            log::warn!("commands still running after the session ended");
        }
        sessions += 1;
    }
    Ok(())
}

/// Connects to the front-end's socket, waiting for it to appear (QEMU restarting, or not
/// started yet).
fn connect<T>(daemon: &mut VhostUserDaemon<T>, path: &Path) -> io::Result<()>
where
    T: vhost_user_backend::VhostUserBackend + Clone + 'static,
    T::Bitmap: vhost_user_backend::bitmap::BitmapReplace
        + vm_memory::bitmap::NewBitmap
        + Clone
        + Send
        + Sync,
    T::Vring: Clone + Send + Sync,
{
    let p = path
        .to_str()
        .ok_or_else(|| io::Error::other("socket path is not UTF-8"))?;
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
