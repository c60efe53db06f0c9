// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The vfio-user server: one listening socket for the daemon's life, one session per
//! client connection, each request decoded, handed to the [`Function`] and answered.
//!
//! Sessions run one at a time on the caller's thread. QEMU's `vfio-user-pci` connects
//! once per device and never reconnects, so a second connection made while a session
//! runs is not refused: it waits in the listen backlog and is served when the first one
//! ends (a second QEMU pointed at the same socket times out on its VERSION meanwhile).
//! The function (device state) lives across sessions; each end of session is told to it
//! with [`Function::disconnected`].
//!
//! What a client sends is not trusted: a malformed message is answered with an error
//! reply and the session goes on, since its framing told us where the next message
//! starts. When the framing itself cannot be trusted (a size below the header's, an
//! absurd size, the stream ending mid-message) the session ends.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::protocol::{
    command, Header, Reply, Request, FLAG_TYPE_COMMAND, FLAG_TYPE_REPLY, HEADER_SIZE,
    MAX_DATA_XFER, MAX_DMA_MAPS, MAX_MSG_FDS, PAGE_SIZES, VERSION_MAJOR, VERSION_MINOR,
};
use super::socket::{self, Message, Received, SocketError};
use super::{DmaMap, Errno, Function, SetIrqs};
use crate::device::RateLimitedLog;
use crate::host::files::Group;
use crate::host::poll::wait_readable;

/// Why the socket cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Bind(#[from] crate::host::listen::ListenError),
    /// What could not be done ("accept a connection"), and why.
    #[error("cannot {0}: {1}")]
    Io(&'static str, io::Error),
}

/// Binds the socket as every socket of the daemon is: refusing to steal one a live daemon
/// serves, mode 0600 (or 0660 with `group`).
pub fn bind(path: &Path, group: Group) -> Result<UnixListener, ServerError> {
    Ok(crate::host::listen::bind(path, group)?)
}

/// How a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// The client closed the connection between messages.
    Disconnected,
    /// The stream failed or could no longer be trusted (see the module's summary).
    Broken,
    /// [`Stopper::stop`] ended it.
    Stopped,
}

/// What a stopper and the serving thread share.
struct Shared {
    stopped: AtomicBool,
    /// Wakes the accept wait.
    wake: EventFd,
    /// The session's connection, so a stop can cut a session waiting for a message.
    session: Mutex<Option<UnixStream>>,
    log: RateLimitedLog,
}

/// Ends [`Server::serve`] from another thread: the wait for a client, or the session
/// being served, ends at once.
#[derive(Clone)]
pub struct Stopper(Arc<Shared>);

impl Stopper {
    pub fn stop(&self) {
        self.0.stopped.store(true, Ordering::SeqCst);
        if let Err(e) = self.0.wake.write(1) {
            log::warn!("cannot wake the vfio-user server: {e}");
        }
        if let Ok(s) = self.0.session.lock() {
            if let Some(stream) = s.as_ref() {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// A listening socket and the sessions it serves.
pub struct Server {
    listener: UnixListener,
    shared: Arc<Shared>,
}

impl Server {
    pub fn new(listener: UnixListener) -> Result<Server, ServerError> {
        // Non-blocking so a connection that vanishes between poll and accept cannot
        // hold the server in accept, out of a stop's reach.
        listener
            .set_nonblocking(true)
            .map_err(|e| ServerError::Io("set up the listening socket", e))?;
        let wake =
            EventFd::new(EFD_NONBLOCK).map_err(|e| ServerError::Io("create the stop event", e))?;
        Ok(Server {
            listener,
            shared: Arc::new(Shared {
                stopped: AtomicBool::new(false),
                wake,
                session: Mutex::new(None),
                log: RateLimitedLog::new(10),
            }),
        })
    }

    pub fn stopper(&self) -> Stopper {
        Stopper(self.shared.clone())
    }

    /// Serves clients one after another until stopped, or after `max_sessions` sessions
    /// (None: no limit). Errors only when the listener fails.
    pub fn serve<F: Function + ?Sized>(
        &self,
        function: &mut F,
        max_sessions: Option<usize>,
    ) -> Result<(), ServerError> {
        let mut sessions = 0;
        while max_sessions.is_none_or(|m| sessions < m) {
            let Some(stream) = self.accept()? else {
                return Ok(());
            };
            self.session(stream, function);
            sessions += 1;
        }
        Ok(())
    }

    /// The next connection, or None once stopped.
    pub fn accept(&self) -> Result<Option<UnixStream>, ServerError> {
        loop {
            if self.shared.stopped.load(Ordering::SeqCst) {
                return Ok(None);
            }
            // SAFETY: the eventfd lives in `self.shared` for the whole wait.
            let wake = unsafe { BorrowedFd::borrow_raw(self.shared.wake.as_raw_fd()) };
            let [_, woken] = wait_readable([self.listener.as_fd(), wake], None)
                .map_err(|e| ServerError::Io("wait for a connection", e))?;
            if woken {
                continue; // the stop flag is checked at the top
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    stream
                        .set_nonblocking(false)
                        .map_err(|e| ServerError::Io("set up a connection", e))?;
                    return Ok(Some(stream));
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                    ) => {}
                // Out of descriptors: the next try may succeed once some are closed.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    self.shared
                        .log
                        .warn(format_args!("vfio-user: cannot accept a connection: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(ServerError::Io("accept a connection", e)),
            }
        }
    }

    /// Runs one session to its end and tells the function.
    pub fn session<F: Function + ?Sized>(
        &self,
        stream: UnixStream,
        function: &mut F,
    ) -> SessionEnd {
        match stream.try_clone() {
            Ok(clone) => {
                if let Ok(mut s) = self.shared.session.lock() {
                    *s = Some(clone);
                }
            }
            Err(e) => log::warn!("vfio-user: a stop will not end this session: {e}"),
        }
        log::info!("vfio-user client connected");
        let mut session = Session {
            stream: &stream,
            function: &mut *function,
            log: &self.shared.log,
            negotiated: false,
            requests: 0,
        };
        // A stop between accept and the registration above is seen here.
        let end = if self.shared.stopped.load(Ordering::SeqCst) {
            SessionEnd::Stopped
        } else {
            session.run()
        };
        let requests = session.requests;
        if let Ok(mut s) = self.shared.session.lock() {
            *s = None;
        }
        let end = if self.shared.stopped.load(Ordering::SeqCst) {
            SessionEnd::Stopped
        } else {
            end
        };
        function.disconnected();
        log::info!("vfio-user session ended ({end:?}) after {requests} requests");
        end
    }
}

/// Serves `listener` as [`Server::serve`] does.
pub fn serve<F: Function + ?Sized>(
    listener: UnixListener,
    function: &mut F,
    max_sessions: Option<usize>,
) -> Result<(), ServerError> {
    Server::new(listener)?.serve(function, max_sessions)
}

/// What we can do, as a client reads it from our VERSION reply.
fn capabilities() -> String {
    format!(
        "{{\"capabilities\":{{\"max_msg_fds\":{MAX_MSG_FDS},\"max_data_xfer_size\":{MAX_DATA_XFER},\
         \"pgsizes\":{PAGE_SIZES},\"max_dma_maps\":{MAX_DMA_MAPS}}}}}"
    )
}

/// What a request gets back: the reply message and the descriptor that goes with it.
struct Answer {
    message: Vec<u8>,
    fd: Option<File>,
}

impl Answer {
    fn reply(request: &Header, reply: Reply) -> Answer {
        Answer {
            message: reply.encode(request),
            fd: None,
        }
    }

    fn error(request: &Header, errno: Errno) -> Answer {
        Answer::reply(request, Reply::Error(errno))
    }
}

/// One connection: the handshake state and the function it drives.
struct Session<'a, F: Function + ?Sized> {
    stream: &'a UnixStream,
    function: &'a mut F,
    log: &'a RateLimitedLog,
    /// VERSION succeeded; nothing else is served before.
    negotiated: bool,
    requests: u64,
}

impl<F: Function + ?Sized> Session<'_, F> {
    fn run(&mut self) -> SessionEnd {
        loop {
            let received = match socket::recv(self.stream) {
                Ok(Some(r)) => r,
                Ok(None) => return SessionEnd::Disconnected,
                Err(e) => {
                    self.broken(&e);
                    return SessionEnd::Broken;
                }
            };
            self.requests += 1;
            let (header, answer) = match received {
                Received::Discarded(h) => {
                    self.refused(&h, Errno::E2BIG, "payload too large");
                    // A client's reply is never answered, however large.
                    let answer = (h.message_type() != FLAG_TYPE_REPLY)
                        .then(|| Answer::error(&h, Errno::E2BIG));
                    (h, answer)
                }
                Received::Message(m) => (m.header, self.handle(m)),
            };
            let Some(answer) = answer else { continue };
            // Answering a NO_REPLY request would desynchronise the client (QEMU takes
            // the reply for an unknown one and leaves its payload in the stream).
            if header.no_reply() {
                continue;
            }
            let fd = answer.fd.as_ref().map(|f| f.as_fd());
            if let Err(e) = socket::send(self.stream, &answer.message, fd) {
                self.broken(&e);
                return SessionEnd::Broken;
            }
        }
    }

    fn broken(&self, e: &SocketError) {
        match e {
            SocketError::Io(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) =>
            {
                log::info!("vfio-user client went away: {e}")
            }
            e => self.log.warn(format_args!("vfio-user session ends: {e}")),
        }
    }

    fn refused(&self, h: &Header, errno: Errno, why: &str) {
        self.log.warn(format_args!(
            "vfio-user: refused command {} (id {}, size {}): {why}: {errno}",
            h.command, h.id, h.size
        ));
    }

    /// The answer to one message (None: it gets none, being a reply itself).
    fn handle(&mut self, m: Message) -> Option<Answer> {
        let Message {
            header: h,
            payload,
            fds,
            too_many_fds,
        } = m;
        match h.message_type() {
            FLAG_TYPE_COMMAND => {}
            // We never ask the client anything, so no reply is awaited.
            FLAG_TYPE_REPLY => {
                self.log.warn(format_args!(
                    "vfio-user: dropped a reply to nothing (id {}, command {})",
                    h.id, h.command
                ));
                return None;
            }
            _ => {
                self.refused(&h, Errno::EINVAL, "unknown message type");
                return Some(Answer::error(&h, Errno::EINVAL));
            }
        }
        if too_many_fds {
            self.refused(&h, Errno::EINVAL, "too many file descriptors");
            return Some(Answer::error(&h, Errno::EINVAL));
        }
        let request = match Request::decode(&h, &payload, fds.len()) {
            Ok(r) => r,
            Err(errno) => {
                self.refused(&h, errno, "malformed");
                return Some(Answer::error(&h, errno));
            }
        };
        // Descriptors a request does not take are closed when `fds` drops.
        let mut fds: Vec<File> = fds.into_iter().map(File::from).collect();
        let negotiated = self.negotiated;
        let result = match request {
            Request::Version { major, minor, json } => {
                return Some(self.version(&h, major, minor, json))
            }
            _ if !negotiated => {
                self.refused(&h, Errno::EINVAL, "before VERSION");
                return Some(Answer::error(&h, Errno::EINVAL));
            }
            Request::DmaMap {
                flags,
                offset,
                iova,
                size,
            } => self
                .function
                .dma_map(DmaMap {
                    flags,
                    offset,
                    iova,
                    size,
                    fd: fds.pop(),
                })
                .map(|()| Answer::reply(&h, Reply::Done)),
            Request::DmaUnmap { flags, iova, size } => self
                .function
                .dma_unmap(iova, size, flags)
                .map(|()| Answer::reply(&h, Reply::DmaUnmap { flags, iova, size })),
            Request::GetInfo => Ok(Answer::reply(
                &h,
                Reply::DeviceInfo(self.function.device_info()),
            )),
            // argsz ≥ 32 (decode checks), so the 48-byte reply is within argsz + 16.
            Request::GetRegionInfo { index, .. } => {
                self.function.region_info(index).map(|(info, file)| Answer {
                    message: Reply::RegionInfo { index, info }.encode(&h),
                    fd: file,
                })
            }
            Request::GetIrqInfo { index } => self
                .function
                .irq_info(index)
                .map(|info| Answer::reply(&h, Reply::IrqInfo { index, info })),
            Request::SetIrqs {
                flags,
                index,
                start,
                count,
            } => self
                .function
                .set_irqs(SetIrqs {
                    flags,
                    index,
                    start,
                    count,
                    fds,
                })
                .map(|()| Answer::reply(&h, Reply::Done)),
            Request::RegionRead {
                offset,
                region,
                count,
            } => {
                let mut data = vec![0u8; count as usize];
                self.function
                    .region_read(region, offset, &mut data)
                    .map(|()| {
                        let reply = Reply::RegionRead {
                            offset,
                            region,
                            data: &data,
                        };
                        Answer::reply(&h, reply)
                    })
            }
            Request::RegionWrite {
                offset,
                region,
                data,
                ..
            } => self.function.region_write(region, offset, data).map(|()| {
                let count = data.len() as u32;
                Answer::reply(
                    &h,
                    Reply::RegionWrite {
                        offset,
                        region,
                        count,
                    },
                )
            }),
            Request::Reset => self
                .function
                .reset()
                .map(|()| Answer::reply(&h, Reply::Done)),
            Request::Unknown { command } => {
                // QEMU 11.1 may probe DEVICE_FEATURE and falls back on ENOTTY.
                let errno = if command == command::DEVICE_FEATURE {
                    Errno::ENOTTY
                } else {
                    Errno::ENOSYS
                };
                self.refused(&h, errno, "not served");
                Err(errno)
            }
        };
        Some(result.unwrap_or_else(|errno| {
            // The function's refusals are its own business (it knows its registers);
            // they are everyday answers, such as ERR interrupts we do not have.
            log::debug!(
                "vfio-user: command {} (id {}) failed: {errno}",
                h.command,
                h.id
            );
            Answer::error(&h, errno)
        }))
    }

    fn version(&mut self, h: &Header, major: u16, minor: u16, json: &str) -> Answer {
        if self.negotiated {
            self.refused(h, Errno::EINVAL, "VERSION again");
            return Answer::error(h, Errno::EINVAL);
        }
        if major != VERSION_MAJOR {
            self.refused(h, Errno::ENOTSUP, "unsupported major version");
            return Answer::error(h, Errno::ENOTSUP);
        }
        let shown: String = json.chars().take(300).collect();
        log::info!("vfio-user client speaks {major}.{minor}: {shown}");
        // QEMU takes a reply no larger than its request. Without our capabilities it
        // assumes defaults that work too (8 fds per message, 1 MiB transfers).
        let full = capabilities();
        let reply_size = HEADER_SIZE + 4 + full.len() + 1;
        let json = if reply_size <= h.size as usize {
            full.as_str()
        } else {
            "{}"
        };
        self.negotiated = true;
        Answer::reply(
            h,
            Reply::Version {
                major: VERSION_MAJOR,
                // Ours is the lowest minor there is, so it is the one both speak.
                minor: VERSION_MINOR,
                json,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_fit_in_qemus_version_request() {
        let caps: serde_json::Value = serde_json::from_str(&capabilities()).unwrap();
        let c = &caps["capabilities"];
        assert_eq!(c["max_msg_fds"], 16);
        assert_eq!(c["max_data_xfer_size"], 1048576);
        assert_eq!(c["pgsizes"], 4096);
        assert_eq!(c["max_dma_maps"], 65535);
        // QEMU's request is about 200 bytes; our whole reply must be smaller.
        assert!(16 + 4 + capabilities().len() + 1 < 180);
    }
}
