// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `--supervise`: the device runs in a worker process; this small parent holds the
//! front-end's connection and restarts a worker that dies, without the front-end noticing.
//!
//! Why a parent and not the front-end's reconnect: QEMU 10.2's vhost-user-base devices (the
//! test device included) clean up their vhost state on disconnect and never initialise it
//! again, so a reconnect after a backend crash aborts QEMU. Here the connection never drops.
//!
//! The parent relays vhost-user messages both ways and keeps the ones that define the
//! session (features, memory table, ring set-up, backend channel) with their file
//! descriptors. A new worker gets them replayed, takes the rings over from the journal in
//! the state file (see `state.rs`) and answers what was in flight. Data never passes
//! through the parent: kicks, calls and guest memory go straight to the worker.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// vhost-user header: request, flags, payload size.
const HEADER: usize = 12;
/// Largest payload a vhost-user message carries (a full memory table is about 2 KiB).
const MAX_PAYLOAD: usize = 64 * 1024;
/// Most descriptors one message may carry (the vhost crate's limit).
const MAX_FDS: usize = 32;
/// Room for the control data of one receive: a few more descriptors than allowed, so that
/// a message with too many is seen (and refused) rather than cut short.
const CMSG_WORDS: usize = (2 * MAX_FDS * 4 + 64) / 8;

use crate::sandbox;
use crate::workers::{End, Launcher};
pub use crate::workers::{WorkerSpec, EXIT_REFUSED, WORKER_PID};
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;

// Front-end requests the parent needs to tell apart.
const GET_FEATURES: u32 = 1;
const GET_PROTOCOL_FEATURES: u32 = 15;
const SET_FEATURES: u32 = 2;
const SET_OWNER: u32 = 3;
const RESET_OWNER: u32 = 4;
const SET_MEM_TABLE: u32 = 5;
const SET_VRING_NUM: u32 = 8;
const SET_VRING_ADDR: u32 = 9;
const SET_VRING_BASE: u32 = 10;
const GET_VRING_BASE: u32 = 11;
const SET_VRING_KICK: u32 = 12;
const SET_VRING_CALL: u32 = 13;
const SET_VRING_ERR: u32 = 14;
const SET_PROTOCOL_FEATURES: u32 = 16;
const SET_VRING_ENABLE: u32 = 18;
const SET_BACKEND_REQ_FD: u32 = 21;
const RESET_DEVICE: u32 = 34;
const ADD_MEM_REG: u32 = 37;
const REM_MEM_REG: u32 = 38;

/// Requests that are always answered.
const ANSWERED: [u32; 10] = [1, 6, 11, 15, 17, 24, 31, 36, 40, 41];

/// A worker that fails by itself this soon after starting counts towards a crash loop.
/// (A request that crashes the device cannot cause one: the next worker answers it
/// INTERRUPTED instead of running it again. SIGKILL, from an operator or the OOM killer,
/// never counts.)
const SHORT_LIFE: Duration = Duration::from_secs(1);
/// Consecutive short-lived workers before the supervisor gives up.
const CRASH_LOOP: u32 = 5;

/// One vhost-user message with the descriptors that came with it.
pub struct Message {
    header: [u8; HEADER],
    payload: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Message {
    /// A message as a front-end would send it (`size` is normally the payload's length;
    /// tests lie about it).
    pub fn new(request: u32, flags: u32, size: u32, payload: Vec<u8>, fds: Vec<OwnedFd>) -> Self {
        let mut header = [0u8; HEADER];
        header[0..4].copy_from_slice(&request.to_le_bytes());
        header[4..8].copy_from_slice(&flags.to_le_bytes());
        header[8..12].copy_from_slice(&size.to_le_bytes());
        Message {
            header,
            payload,
            fds,
        }
    }

    fn field(&self, i: usize) -> u32 {
        u32::from_le_bytes(self.header[i * 4..i * 4 + 4].try_into().unwrap_or([0; 4]))
    }

    pub fn request(&self) -> u32 {
        self.field(0)
    }

    fn flags(&self) -> u32 {
        self.field(1)
    }

    fn set_flags(&mut self, flags: u32) {
        self.header[4..8].copy_from_slice(&flags.to_le_bytes());
    }

    fn expects_reply(&self) -> bool {
        self.flags() & FLAG_REPLY == 0
            && (self.flags() & FLAG_NEED_REPLY != 0 || ANSWERED.contains(&self.request()))
    }

    /// The ring a per-ring request is about.
    fn ring(&self) -> Option<u32> {
        let first = self.payload.get(..4)?;
        let v = u32::from_le_bytes(first.try_into().ok()?);
        match self.request() {
            SET_VRING_NUM | SET_VRING_ADDR | SET_VRING_BASE | GET_VRING_BASE | SET_VRING_ENABLE => {
                Some(v)
            }
            // u64 payload: ring index in bits 0-7, "no fd" in bit 8.
            SET_VRING_KICK | SET_VRING_CALL | SET_VRING_ERR => Some(v & 0xff),
            _ => None,
        }
    }

    fn try_clone(&self) -> io::Result<Message> {
        Ok(Message {
            header: self.header,
            payload: self.payload.clone(),
            fds: self
                .fds
                .iter()
                .map(|f| f.try_clone())
                .collect::<io::Result<_>>()?,
        })
    }
}

/// Reads one message; Ok(None) at end of stream.
pub fn recv_message(sock: BorrowedFd) -> io::Result<Option<Message>> {
    let mut header = [0u8; HEADER];
    let mut fds = Vec::new();
    if !recv_exact(sock, &mut header, Some(&mut fds))? {
        return Ok(None);
    }
    let size = u32::from_le_bytes(header[8..12].try_into().unwrap_or([0; 4])) as usize;
    if size > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("vhost-user message claims a {size}-byte payload"),
        ));
    }
    let mut payload = vec![0u8; size];
    if size > 0 && !recv_exact(sock, &mut payload, Some(&mut fds))? {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if fds.len() > MAX_FDS {
        // More than a vhost-user message may carry (and than a worker takes): the
        // sender is broken or hostile.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} file descriptors in one message", fds.len()),
        ));
    }
    Ok(Some(Message {
        header,
        payload,
        fds,
    }))
}

/// Fills `buf`; descriptors that arrive on the way are collected. Ok(false): the stream
/// ended before the first byte.
fn recv_exact(
    sock: BorrowedFd,
    buf: &mut [u8],
    mut fds: Option<&mut Vec<OwnedFd>>,
) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        let mut iov = libc::iovec {
            iov_base: buf[got..].as_mut_ptr().cast(),
            iov_len: buf.len() - got,
        };
        let mut cmsg = [0u64; CMSG_WORDS];
        // SAFETY: msghdr is plain data; every pointer in it refers to a live local buffer
        // of the stated length.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cmsg);
        // SAFETY: recvmsg writes at most the lengths given in msg into our buffers.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // SAFETY: the control buffer was filled by the kernel; the CMSG macros walk it
        // within msg_controllen, and SCM_RIGHTS data is an array of new descriptors we own.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c) as *const RawFd;
                    let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                        / std::mem::size_of::<RawFd>();
                    for i in 0..count {
                        let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                        if let Some(v) = fds.as_deref_mut() {
                            v.push(fd);
                        }
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "too many file descriptors in one message",
            ));
        }
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += n as usize;
    }
    Ok(true)
}

pub fn send_message(sock: BorrowedFd, m: &Message) -> io::Result<()> {
    let mut data = Vec::with_capacity(HEADER + m.payload.len());
    data.extend_from_slice(&m.header);
    data.extend_from_slice(&m.payload);
    let raw: Vec<RawFd> = m.fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut sent = 0;
    while sent < data.len() {
        let mut iov = libc::iovec {
            iov_base: data[sent..].as_mut_ptr().cast(),
            iov_len: data.len() - sent,
        };
        let mut cmsg = [0u64; CMSG_WORDS];
        // SAFETY: as in recv_exact; the control message is built inside `cmsg`, which is
        // large enough for MAX_FDS descriptors.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if sent == 0 && !raw.is_empty() {
            let bytes = std::mem::size_of_val(raw.as_slice());
            // SAFETY: CMSG_SPACE/LEN only compute sizes.
            let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
            // More than a receiver takes is still sent (tests send that many): only what
            // does not fit the buffer is an error.
            if space > std::mem::size_of_val(&cmsg) {
                return Err(io::Error::other("too many file descriptors"));
            }
            msg.msg_control = cmsg.as_mut_ptr().cast();
            msg.msg_controllen = space;
            // SAFETY: the header and data fit in `cmsg` (`space` checked above).
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
                std::ptr::copy_nonoverlapping(raw.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), bytes);
            }
        }
        // SAFETY: sendmsg only reads the buffers described by msg.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += n as usize;
    }
    Ok(())
}

/// The messages that define the session, compacted to what a new worker needs.
#[derive(Default)]
pub struct Recording {
    kept: Vec<Message>,
}

impl Recording {
    /// Takes note of a message on its way from the front-end to the worker.
    pub fn note(&mut self, m: &Message) -> io::Result<()> {
        let req = m.request();
        match req {
            RESET_OWNER => {
                self.kept.clear();
                return Ok(());
            }
            RESET_DEVICE => {
                self.kept.retain(|k| k.ring().is_none());
                return Ok(());
            }
            SET_OWNER | SET_FEATURES | SET_PROTOCOL_FEATURES | SET_BACKEND_REQ_FD => {
                self.kept.retain(|k| k.request() != req);
            }
            SET_MEM_TABLE => self
                .kept
                .retain(|k| ![SET_MEM_TABLE, ADD_MEM_REG, REM_MEM_REG].contains(&k.request())),
            ADD_MEM_REG | REM_MEM_REG => {}
            SET_VRING_NUM | SET_VRING_ADDR | SET_VRING_BASE | SET_VRING_KICK | SET_VRING_CALL
            | SET_VRING_ERR | SET_VRING_ENABLE => {
                let ring = m.ring();
                self.kept
                    .retain(|k| !(k.request() == req && k.ring() == ring));
            }
            _ => return Ok(()),
        }
        self.kept.push(m.try_clone()?);
        Ok(())
    }

    /// The front-end got a ring's base back: the ring is stopped, its set-up is void.
    pub fn ring_stopped(&mut self, ring: Option<u32>) {
        self.kept.retain(|k| k.ring().is_none() || k.ring() != ring);
    }

    pub fn len(&self) -> usize {
        self.kept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// Sends the recorded set-up to a new worker (whose pidfd is `alive`), asking for no
    /// replies.
    pub fn replay(&self, sock: BorrowedFd, alive: BorrowedFd) -> io::Result<()> {
        // The backend learns that acks are on (REPLY_ACK) only from a GET_FEATURES it
        // answered; without one, a later NEED_REPLY from the front-end would go
        // unanswered and the front-end would wait for ever.
        query(sock, alive, GET_FEATURES)?;
        query(sock, alive, GET_PROTOCOL_FEATURES)?;
        // Rings are enabled last, once fully set up: an enabled ring may be served at once
        // (a kick is waiting), and a completion signalled before its call fd is known is
        // lost; with EVENT_IDX the driver would then wait for ever.
        let (enables, setup): (Vec<&Message>, Vec<&Message>) = self
            .kept
            .iter()
            .partition(|m| m.request() == SET_VRING_ENABLE);
        for m in setup.into_iter().chain(enables) {
            let mut m = m.try_clone()?;
            m.set_flags(m.flags() & !FLAG_NEED_REPLY);
            send_message(sock, &m)?;
        }
        // The worker handles messages in order: once this is answered, its rings are set
        // up and enabled, so a kick sent now is not dropped by a ring not yet ready (with
        // EVENT_IDX the driver would not kick again until the device has looked).
        query(sock, alive, GET_FEATURES)
    }

    /// Wakes every recorded ring, so a new worker looks at what arrived meanwhile.
    pub fn kick_all(&self) {
        for m in self.kept.iter().filter(|m| m.request() == SET_VRING_KICK) {
            if let Some(fd) = m.fds.first() {
                let one = 1u64.to_ne_bytes();
                // SAFETY: writes 8 bytes from a live buffer to an eventfd we hold.
                unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
            }
        }
    }
}

/// How long a new worker may take to answer the replay's queries.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends a request that is always answered and waits for (and drops) the answer; fails
/// when `alive` (the worker's pidfd) says the worker died, or after [`REPLAY_TIMEOUT`].
fn query(sock: BorrowedFd, alive: BorrowedFd, request: u32) -> io::Result<()> {
    send_message(sock, &Message::new(request, 0x1, 0, Vec::new(), Vec::new()))?;
    let mut fds = [
        libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: alive.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let deadline = std::time::Instant::now() + REPLAY_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // SAFETY: polls two descriptors we hold, described by a live array.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, left.as_millis() as i32) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the worker did not answer in time",
            ));
        }
        if fds[0].revents != 0 {
            break;
        }
        return Err(io::Error::other("the worker died before it answered"));
    }
    match recv_message(sock)? {
        Some(r) if r.request() == request && r.flags() & FLAG_REPLY != 0 => Ok(()),
        _ => Err(io::Error::other("the worker did not answer a query")),
    }
}

/// How the supervisor reaches the front-end.
pub enum FrontEnd {
    Listen(UnixListener),
    Connect(PathBuf),
}

/// Serves front-end connections forever: a relay thread, under the seccomp filter
/// `seccomp` (the relay's own list), relays the front-end's messages; this thread starts
/// the workers, outside the filter.
pub fn run(front: FrontEnd, spec: WorkerSpec, seccomp: sandbox::Mode) -> Result<(), String> {
    // Private (0600) from the start: only our own workers connect to it.
    let workers = crate::server::bind_std(&spec.worker_socket, None)
        .map_err(|e| format!("worker socket: {e}"))?;
    let (launcher, requests) = crate::workers::launcher();
    let relay = std::thread::Builder::new()
        .name("relay".into())
        .spawn(move || {
            let profile = sandbox::Profile {
                connects: matches!(front, FrontEnd::Connect(_)),
                relay: true,
            };
            sandbox::apply(seccomp, profile, sandbox::Scope::ThisThread)?;
            if seccomp != sandbox::Mode::Off {
                log::info!("supervisor: seccomp filter installed on the relay ({seccomp:?})");
            }
            serve(front, &launcher)
        })
        .map_err(|e| format!("cannot start the relay thread: {e}"))?;
    requests.serve(&spec, &workers);
    let _ = std::fs::remove_file(&spec.worker_socket);
    relay
        .join()
        .unwrap_or_else(|_| Err("the relay thread panicked".into()))
}

fn serve(front: FrontEnd, launcher: &Launcher) -> Result<(), String> {
    loop {
        let qemu = match &front {
            FrontEnd::Listen(l) => l
                .accept()
                .map(|(s, _)| s)
                .map_err(|e| format!("cannot accept a connection: {e}"))?,
            FrontEnd::Connect(path) => connect_retrying(path),
        };
        log::info!("supervisor: front-end connected");
        let end = session(&qemu, launcher)?;
        log::info!("supervisor: {end}");
    }
}

fn connect_retrying(path: &Path) -> UnixStream {
    let mut said = false;
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return s,
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

/// Relays one front-end connection; returns why it ended.
fn session(qemu: &UnixStream, launcher: &Launcher) -> Result<String, String> {
    let mut rec = Recording::default();
    let mut worker = launcher.start_worker(false)?;
    // A request the worker has not answered yet: resent to a replacement.
    let mut pending: Option<Message> = None;
    let mut restarts = 0u32;
    let mut short_lived = 0u32;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: qemu.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: worker.conn.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: polls two descriptors we own, described by a live array.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("poll: {e}"));
        }
        let mut worker_died = false;
        if fds[1].revents != 0 {
            match recv_message(worker.conn.as_fd()) {
                Ok(Some(reply)) => {
                    log::debug!(
                        "supervisor: worker -> front-end: request {} flags {:#x}",
                        reply.request(),
                        reply.flags()
                    );
                    if reply.flags() & FLAG_REPLY != 0 {
                        if let Some(p) = pending.take() {
                            if p.request() == GET_VRING_BASE {
                                rec.ring_stopped(p.ring());
                            }
                        }
                    }
                    if let Err(e) = send_message(qemu.as_fd(), &reply) {
                        worker.stop();
                        return Ok(format!("front-end gone ({e})"));
                    }
                }
                Ok(None) | Err(_) => worker_died = true,
            }
        }
        if !worker_died && fds[0].revents != 0 {
            match recv_message(qemu.as_fd()) {
                Ok(Some(m)) => {
                    log::debug!(
                        "supervisor: front-end -> worker: request {} flags {:#x}, {} fds",
                        m.request(),
                        m.flags(),
                        m.fds.len()
                    );
                    rec.note(&m)
                        .map_err(|e| format!("cannot keep a descriptor: {e}"))?;
                    if m.expects_reply() {
                        pending = Some(
                            m.try_clone()
                                .map_err(|e| format!("cannot keep a descriptor: {e}"))?,
                        );
                    }
                    if send_message(worker.conn.as_fd(), &m).is_err() {
                        worker_died = true;
                    }
                }
                Ok(None) => {
                    worker.stop();
                    return Ok("front-end disconnected".into());
                }
                Err(e) => {
                    worker.stop();
                    return Ok(format!("front-end connection failed: {e}"));
                }
            }
        }
        if !worker_died {
            continue;
        }
        // A worker whose connection failed may still be alive (it will not be used again).
        let mut ended_by_us = false;
        loop {
            let lived = worker.started.elapsed();
            let (status, mut end) = worker.reap();
            if ended_by_us {
                // Killed for failing its replay: a failure of its own, not an operator's.
                end = End::Died;
            }
            if end == End::Refused {
                return Ok(
                    "the worker refused a front-end message; session ended (not replayed)".into(),
                );
            }
            short_lived = if lived < SHORT_LIFE && end != End::Killed {
                short_lived + 1
            } else {
                0
            };
            if short_lived >= CRASH_LOOP {
                // Whatever keeps killing workers came with this session: end it, and serve
                // the next front-end afresh.
                return Ok(format!(
                    "worker died {CRASH_LOOP} times in a row within {SHORT_LIFE:?} of starting \
                     (last: {status}); session ended"
                ));
            }
            restarts += 1;
            log::warn!(
                "supervisor: worker {status} after {:.1} s; restart {restarts}, replaying {} \
                 set-up messages",
                lived.as_secs_f64(),
                rec.len()
            );
            if short_lived > 1 {
                std::thread::sleep(Duration::from_millis(100 << short_lived.min(5)));
            }
            worker = launcher.start_worker(true)?;
            // The request the dead worker owed an answer: replay the rest, then ask again.
            if let Some(p) = &pending {
                rec.kept
                    .retain(|k| !(k.header == p.header && k.payload == p.payload));
            }
            let replayed = rec
                .replay(worker.conn.as_fd(), worker.pidfd())
                .and_then(|_| {
                    rec.kick_all();
                    match &pending {
                        Some(p) => {
                            rec.note(p)?;
                            send_message(worker.conn.as_fd(), p)
                        }
                        None => Ok(()),
                    }
                });
            match replayed {
                Ok(()) => break,
                Err(e) => {
                    // A worker that died or hangs before it took the set-up is replaced at
                    // once: its connection may never report anything.
                    log::warn!("supervisor: replay to the new worker failed: {e}");
                    worker.kill();
                    ended_by_us = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(req: u32, flags: u32, payload: &[u8]) -> Message {
        let size = payload.len() as u32;
        Message::new(req, flags | 1, size, payload.to_vec(), Vec::new())
    }

    fn ring_msg(req: u32, ring: u32, v: u32) -> Message {
        let mut p = ring.to_le_bytes().to_vec();
        p.extend_from_slice(&v.to_le_bytes());
        msg(req, 0, &p)
    }

    fn requests(r: &Recording) -> Vec<(u32, Option<u32>)> {
        r.kept.iter().map(|m| (m.request(), m.ring())).collect()
    }

    #[test]
    fn recording_keeps_the_latest_set_up_per_ring() {
        let mut r = Recording::default();
        r.note(&msg(SET_OWNER, 0, &[])).unwrap();
        r.note(&msg(SET_FEATURES, 0, &[0; 8])).unwrap();
        r.note(&msg(SET_MEM_TABLE, FLAG_NEED_REPLY, &[0; 40]))
            .unwrap();
        for ring in 0..2 {
            r.note(&ring_msg(SET_VRING_NUM, ring, 256)).unwrap();
            r.note(&ring_msg(SET_VRING_BASE, ring, 0)).unwrap();
        }
        // Queries are not set-up.
        r.note(&msg(1, 0, &[])).unwrap();
        assert_eq!(r.len(), 7);
        // Ring 0 stops and starts again: only its new set-up remains, after ring 1's.
        r.ring_stopped(Some(0));
        r.note(&msg(SET_FEATURES, 0, &[1; 8])).unwrap();
        r.note(&ring_msg(SET_VRING_NUM, 0, 128)).unwrap();
        assert_eq!(
            requests(&r),
            vec![
                (SET_OWNER, None),
                (SET_MEM_TABLE, None),
                (SET_VRING_NUM, Some(1)),
                (SET_VRING_BASE, Some(1)),
                (SET_FEATURES, None),
                (SET_VRING_NUM, Some(0)),
            ]
        );
        // A new memory table replaces the old one; RESET_OWNER forgets everything.
        r.note(&msg(SET_MEM_TABLE, 0, &[1; 40])).unwrap();
        assert_eq!(
            r.kept
                .iter()
                .filter(|m| m.request() == SET_MEM_TABLE)
                .count(),
            1
        );
        r.note(&msg(RESET_OWNER, 0, &[])).unwrap();
        assert!(r.is_empty());
    }

    #[test]
    fn replies_are_expected_for_queries_and_need_reply() {
        assert!(msg(1, 0, &[]).expects_reply());
        assert!(ring_msg(GET_VRING_BASE, 0, 0).expects_reply());
        assert!(msg(SET_MEM_TABLE, FLAG_NEED_REPLY, &[]).expects_reply());
        assert!(!msg(SET_MEM_TABLE, 0, &[]).expects_reply());
        // Kick/call payloads carry the ring in their low byte.
        let kick = msg(SET_VRING_KICK, 0, &(0x101u64).to_le_bytes());
        assert_eq!(kick.ring(), Some(1));
    }

    #[test]
    fn messages_and_descriptors_cross_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let mut m = msg(SET_VRING_KICK, 0, &0u64.to_le_bytes());
        m.fds.push(OwnedFd::from(file));
        send_message(a.as_fd(), &m).unwrap();
        let got = recv_message(b.as_fd()).unwrap().unwrap();
        assert_eq!(got.header, m.header);
        assert_eq!(got.payload, m.payload);
        assert_eq!(got.fds.len(), 1);
        drop(a);
        assert!(recv_message(b.as_fd()).unwrap().is_none());
    }
}
