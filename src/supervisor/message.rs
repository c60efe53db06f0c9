// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! vhost-user messages as the supervisor relays them: header, payload and the file
//! descriptors that came with them, read and written with vmm-sys-util's `ScmSocket`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use vhost::vhost_user::message::{FrontendReq, VhostUserHeaderFlag, MAX_ATTACHED_FD_ENTRIES};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// vhost-user header: request, flags, payload size.
const HEADER: usize = 12;
/// Largest payload a vhost-user message carries (a full memory table is about 2 KiB).
const MAX_PAYLOAD: usize = 64 * 1024;
/// Most descriptors one message may carry (the vhost crate's limit). A receive has room
/// for this many: one with more is refused whole, not cut short.
const MAX_FDS: usize = MAX_ATTACHED_FD_ENTRIES;

/// Requests that are always answered.
const ANSWERED: [FrontendReq; 11] = [
    FrontendReq::GET_FEATURES,
    FrontendReq::SET_LOG_BASE,
    FrontendReq::GET_VRING_BASE,
    FrontendReq::GET_PROTOCOL_FEATURES,
    FrontendReq::GET_QUEUE_NUM,
    FrontendReq::GET_CONFIG,
    FrontendReq::GET_INFLIGHT_FD,
    FrontendReq::GET_MAX_MEM_SLOTS,
    FrontendReq::GET_STATUS,
    FrontendReq::GET_SHARED_OBJECT,
    FrontendReq::GET_SHMEM_CONFIG,
];

pub(super) const FLAG_REPLY: u32 = VhostUserHeaderFlag::REPLY.bits();
pub(super) const FLAG_NEED_REPLY: u32 = VhostUserHeaderFlag::NEED_REPLY.bits();

/// One vhost-user message with the descriptors that came with it.
pub struct Message {
    pub(super) header: [u8; HEADER],
    pub(super) payload: Vec<u8>,
    pub(super) fds: Vec<OwnedFd>,
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

    /// A request with no payload, as the supervisor sends its own queries.
    pub(super) fn query(request: FrontendReq) -> Self {
        Message::new(request.into(), 0x1, 0, Vec::new(), Vec::new())
    }

    fn field(&self, i: usize) -> u32 {
        u32::from_le_bytes(self.header[i * 4..i * 4 + 4].try_into().unwrap_or([0; 4]))
    }

    pub fn request(&self) -> u32 {
        self.field(0)
    }

    /// The request, when it is one the vhost crate knows.
    pub(super) fn kind(&self) -> Option<FrontendReq> {
        FrontendReq::try_from(self.request()).ok()
    }

    pub(super) fn flags(&self) -> u32 {
        self.field(1)
    }

    pub(super) fn set_flags(&mut self, flags: u32) {
        self.header[4..8].copy_from_slice(&flags.to_le_bytes());
    }

    pub(super) fn is_reply(&self) -> bool {
        self.flags() & FLAG_REPLY != 0
    }

    pub(super) fn expects_reply(&self) -> bool {
        !self.is_reply()
            && (self.flags() & FLAG_NEED_REPLY != 0
                || self.kind().is_some_and(|k| ANSWERED.contains(&k)))
    }

    /// The ring a per-ring request is about.
    pub(super) fn ring(&self) -> Option<u32> {
        use FrontendReq::*;
        let first = self.payload.get(..4)?;
        let v = u32::from_le_bytes(first.try_into().ok()?);
        match self.kind()? {
            SET_VRING_NUM | SET_VRING_ADDR | SET_VRING_BASE | GET_VRING_BASE | SET_VRING_ENABLE => {
                Some(v)
            }
            // u64 payload: ring index in bits 0-7, "no fd" in bit 8.
            SET_VRING_KICK | SET_VRING_CALL | SET_VRING_ERR => Some(v & 0xff),
            _ => None,
        }
    }

    /// The same request (header and payload), whatever descriptors came with it.
    pub(super) fn same_request(&self, other: &Message) -> bool {
        self.header == other.header && self.payload == other.payload
    }

    pub(super) fn try_clone(&self) -> io::Result<Message> {
        Ok(Message {
            header: self.header,
            payload: self.payload.clone(),
            fds: crate::host::files::dup_all(&self.fds)?,
        })
    }
}

/// A connected unix stream socket we borrow, for `ScmSocket`.
struct Sock<'a>(BorrowedFd<'a>);

impl ScmSocket for Sock<'_> {
    fn socket_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Reads one message; Ok(None) at end of stream.
pub fn recv_message(sock: BorrowedFd) -> io::Result<Option<Message>> {
    let sock = Sock(sock);
    let mut header = [0u8; HEADER];
    let mut fds = Vec::new();
    if !recv_exact(&sock, &mut header, &mut fds)? {
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
    if size > 0 && !recv_exact(&sock, &mut payload, &mut fds)? {
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

/// Fills `buf` (a stream may deliver it in pieces); descriptors that arrive on the way are
/// collected. Ok(false): the stream ended before the first byte.
fn recv_exact(sock: &Sock, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        let rest = &mut buf[got..];
        let mut iov = [libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        }];
        let mut raw: [RawFd; MAX_FDS] = [-1; MAX_FDS];
        // SAFETY: the iovec describes `rest`, a live buffer we hold mutably, which may
        // take any bytes.
        let (n, count) = match unsafe { sock.recv_with_fds(&mut iov, &mut raw) } {
            Ok(r) => r,
            Err(e) if e.errno() == libc::EINTR => continue,
            // The descriptors did not fit (vmm-sys-util closed them): refused whole.
            Err(e) if e.errno() == libc::ENOBUFS => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "too many file descriptors in one message",
                ))
            }
            Err(e) => return Err(e.into()),
        };
        for &fd in &raw[..count] {
            // SAFETY: recv_with_fds gave us these new descriptors; nothing else owns them.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            close_on_exec(&fd)?;
            fds.push(fd);
        }
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    Ok(true)
}

/// Received descriptors arrive without close-on-exec (vmm-sys-util asks for none) and must
/// not leak into workers. No worker starts before this: the relay thread, the only one
/// that receives, waits for each start.
fn close_on_exec(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; no memory is involved.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes one message; its descriptors go with the first byte.
pub fn send_message(sock: BorrowedFd, m: &Message) -> io::Result<()> {
    let sock = Sock(sock);
    let mut data = Vec::with_capacity(HEADER + m.payload.len());
    data.extend_from_slice(&m.header);
    data.extend_from_slice(&m.payload);
    let raw: Vec<RawFd> = m.fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut sent = 0;
    while sent < data.len() {
        let fds: &[RawFd] = if sent == 0 { &raw } else { &[] };
        match sock.send_with_fds(&[&data[sent..]], fds) {
            Ok(n) => sent += n,
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    fn null_fd() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    #[test]
    fn messages_and_descriptors_cross_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let kick: u32 = FrontendReq::SET_VRING_KICK.into();
        let m = Message::new(kick, 1, 8, 0u64.to_le_bytes().to_vec(), vec![null_fd()]);
        send_message(a.as_fd(), &m).unwrap();
        let got = recv_message(b.as_fd()).unwrap().unwrap();
        assert_eq!(got.header, m.header);
        assert_eq!(got.payload, m.payload);
        assert_eq!(got.fds.len(), 1);
        // SAFETY: fcntl F_GETFD on a descriptor we own.
        let flags = unsafe { libc::fcntl(got.fds[0].as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        drop(a);
        assert!(recv_message(b.as_fd()).unwrap().is_none());
    }

    #[test]
    fn a_message_in_pieces_is_put_together() {
        let (a, b) = UnixStream::pair().unwrap();
        let m = Message::new(1, 1, 16, vec![7; 16], Vec::new());
        let mut bytes = m.header.to_vec();
        bytes.extend_from_slice(&m.payload);
        let reader = std::thread::spawn(move || recv_message(b.as_fd()).unwrap().unwrap());
        for piece in bytes.chunks(5) {
            use std::io::Write;
            (&a).write_all(piece).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let got = reader.join().unwrap();
        assert_eq!((got.header, got.payload), (m.header, m.payload));
    }

    #[test]
    fn too_many_descriptors_are_refused_not_cut_short() {
        let (a, b) = UnixStream::pair().unwrap();
        let fds: Vec<OwnedFd> = (0..MAX_FDS + 1).map(|_| null_fd()).collect();
        send_message(a.as_fd(), &Message::new(5, 1, 0, Vec::new(), fds)).unwrap();
        let e = recv_message(b.as_fd()).err().expect("refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("too many file descriptors"), "{e}");
        // Exactly the limit passes.
        let fds: Vec<OwnedFd> = (0..MAX_FDS).map(|_| null_fd()).collect();
        send_message(a.as_fd(), &Message::new(5, 1, 0, Vec::new(), fds)).unwrap();
        assert_eq!(recv_message(b.as_fd()).unwrap().unwrap().fds.len(), MAX_FDS);
    }
}
