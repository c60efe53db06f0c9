// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! vfio-user framing on a unix stream socket: one message is a 16-byte header, the file
//! descriptors that came with it, and exactly `size - 16` payload bytes; a reply goes out
//! in one `sendmsg`, with its descriptor (if any) on the header's bytes.
//!
//! Receiving uses `recvmsg` directly rather than vmm-sys-util's `ScmSocket`: when a client
//! sends more descriptors than fit, `ScmSocket` reports an error without saying how many
//! bytes it consumed, so the stream could not be kept in sync and refused politely.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::protocol::{Header, HEADER_SIZE, MAX_DATA_XFER, MAX_MSG_FDS};

/// The largest payload we read: a REGION_WRITE of `MAX_DATA_XFER` bytes and room to spare.
pub const MAX_PAYLOAD: usize = MAX_DATA_XFER as usize + (64 << 10);
/// A payload up to this size that is too large to take is read through and refused with
/// an error reply; beyond it (QEMU never goes past 64 MiB) the client is not worth the
/// wait and the session ends.
pub const MAX_DISCARD: usize = 64 << 20;
/// How much of a refused payload is read at a time.
const DISCARD_CHUNK: usize = 64 << 10;

/// Room for `MAX_MSG_FDS` descriptors in one control message.
// SAFETY: CMSG_SPACE only computes a size.
const CMSG_ROOM: usize =
    unsafe { libc::CMSG_SPACE((MAX_MSG_FDS * size_of::<RawFd>()) as u32) } as usize;

/// A control-message buffer aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_ROOM]);

/// Why a connection can no longer carry messages.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    #[error("the client closed the connection in the middle of a message")]
    Eof,
    #[error("message size {0} is smaller than its 16-byte header")]
    TooSmall(u32),
    #[error("message size {0} is beyond anything a client sends")]
    Absurd(u32),
}

/// One message from the client.
#[derive(Debug)]
pub struct Message {
    pub header: Header,
    pub payload: Vec<u8>,
    /// Descriptors that came with it (close-on-exec); dropping the message closes them.
    pub fds: Vec<OwnedFd>,
    /// More than `MAX_MSG_FDS` descriptors came: all of them were closed.
    pub too_many_fds: bool,
}

impl Message {
    /// The whole message as it came: header, payload and descriptors (duplicated).
    pub fn try_clone(&self) -> io::Result<Message> {
        Ok(Message {
            header: self.header,
            payload: self.payload.clone(),
            fds: crate::host::files::dup_all(&self.fds)?,
            too_many_fds: self.too_many_fds,
        })
    }

    /// Sends it on as it came (a relay's forwarding).
    pub fn forward(&self, stream: &UnixStream) -> Result<(), SocketError> {
        use std::os::fd::AsFd;
        let mut bytes = self.header.encode().to_vec();
        bytes.extend_from_slice(&self.payload);
        let fds: Vec<BorrowedFd> = self.fds.iter().map(|f| f.as_fd()).collect();
        send_fds(stream, &bytes, &fds)
    }
}

/// What [`recv`] got.
#[derive(Debug)]
pub enum Received {
    Message(Message),
    /// A payload above `MAX_PAYLOAD`, read and thrown away (descriptors closed): the
    /// stream is in sync and the client is owed an error reply.
    Discarded(Header),
}

/// Reads one message; Ok(None) when the client closed the connection between messages.
pub fn recv(stream: &UnixStream) -> Result<Option<Received>, SocketError> {
    let fd = stream.as_raw_fd();
    let mut fds = Vec::new();
    let mut too_many_fds = false;
    let mut raw = [0u8; HEADER_SIZE];
    if !recv_exact(fd, &mut raw, &mut fds, &mut too_many_fds)? {
        return Ok(None);
    }
    let header = Header::parse(&raw);
    let len = header
        .payload_len()
        .ok_or(SocketError::TooSmall(header.size))?;
    if len > MAX_DISCARD {
        return Err(SocketError::Absurd(header.size));
    }
    if len > MAX_PAYLOAD {
        let mut chunk = vec![0u8; DISCARD_CHUNK];
        let mut left = len;
        while left > 0 {
            let n = left.min(DISCARD_CHUNK);
            if !recv_exact(fd, &mut chunk[..n], &mut fds, &mut too_many_fds)? {
                return Err(SocketError::Eof);
            }
            // Descriptors are closed as they come, not hoarded for the whole payload.
            fds.clear();
            left -= n;
        }
        return Ok(Some(Received::Discarded(header)));
    }
    let mut payload = vec![0u8; len];
    if len > 0 && !recv_exact(fd, &mut payload, &mut fds, &mut too_many_fds)? {
        return Err(SocketError::Eof);
    }
    if too_many_fds {
        fds.clear();
    }
    Ok(Some(Received::Message(Message {
        header,
        payload,
        fds,
        too_many_fds,
    })))
}

/// Fills `buf`, which a stream may deliver in pieces, collecting descriptors on the way.
/// Ok(false): the stream ended before the first byte. An end after it is `Eof`.
fn recv_exact(
    fd: RawFd,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    too_many: &mut bool,
) -> Result<bool, SocketError> {
    let mut got = 0;
    while got < buf.len() {
        let n = recv_some(fd, &mut buf[got..], fds, too_many)?;
        if n == 0 {
            return if got == 0 {
                Ok(false)
            } else {
                Err(SocketError::Eof)
            };
        }
        got += n;
    }
    Ok(true)
}

/// One `recvmsg` with room for `MAX_MSG_FDS` descriptors; retried on EINTR.
fn recv_some(
    fd: RawFd,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    too_many: &mut bool,
) -> io::Result<usize> {
    let mut control = CmsgBuf([0; CMSG_ROOM]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header (null pointers,
    // zero lengths), and the fields we use are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = CMSG_ROOM as _;
    let n = loop {
        // SAFETY: `msg` points at `iov` (describing `buf`, which we hold mutably) and at
        // `control`, both alive for the call and of the lengths given. Received
        // descriptors are made close-on-exec atomically, so none leaks into a child.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // SAFETY: `msg` is the header recvmsg just filled; its control pointer and length
    // describe `control`, so the macros stay inside it.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR return a header that lies whole inside the
        // control data; `control` is aligned for it.
        let (level, kind, len) =
            unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type, (*cmsg).cmsg_len) };
        if level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN only computes a size.
            let head = unsafe { libc::CMSG_LEN(0) } as usize;
            // cmsg_len is usize with glibc, u32 with musl.
            #[allow(clippy::unnecessary_cast)]
            let len = len as usize;
            // Never past our buffer, whatever the header says.
            let count = len.min(CMSG_ROOM).saturating_sub(head) / size_of::<RawFd>();
            // SAFETY: the data of a control message lies inside it, right after its header.
            let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<RawFd>();
            for i in 0..count {
                // SAFETY: `count` descriptors follow `data` inside `control`; the data of a
                // control message need not be aligned for RawFd, hence the unaligned read.
                let raw = unsafe { data.add(i).read_unaligned() };
                // SAFETY: the kernel just installed this descriptor for us; nothing else
                // owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: as for CMSG_FIRSTHDR; `cmsg` is a header of this message.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    // The kernel drops what did not fit; whatever came is refused with the message.
    if msg.msg_flags & libc::MSG_CTRUNC != 0 || fds.len() > MAX_MSG_FDS {
        *too_many = true;
        fds.clear();
    }
    Ok(n)
}

/// Sends one whole message (header and payload); `fd` rides on the first byte, as QEMU
/// collects descriptors only with the header.
pub fn send(
    stream: &UnixStream,
    message: &[u8],
    fd: Option<BorrowedFd>,
) -> Result<(), SocketError> {
    send_fds(stream, message, fd.as_slice())
}

/// [`send`] with any number of descriptors (up to `MAX_MSG_FDS`), as a client sends
/// `SET_IRQS` (the supervisor relays requests to its worker so).
pub fn send_fds(
    stream: &UnixStream,
    message: &[u8],
    fds: &[BorrowedFd],
) -> Result<(), SocketError> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut sent = 0;
    while sent < message.len() {
        let fds: &[RawFd] = if sent == 0 { &raw } else { &[] };
        // MSG_NOSIGNAL inside: a vanished client gives EPIPE, not SIGPIPE.
        match stream.send_with_fds(&[&message[sent..]], fds) {
            Ok(0) => return Err(SocketError::Io(io::ErrorKind::WriteZero.into())),
            Ok(n) => sent += n,
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(e) => return Err(SocketError::Io(io::Error::from_raw_os_error(e.errno()))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn header(size: u32) -> [u8; HEADER_SIZE] {
        Header {
            id: 1,
            command: 9,
            size,
            flags: 0,
            error: 0,
        }
        .encode()
    }

    #[test]
    fn a_message_split_in_pieces_is_one_message() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let h = header(20);
        a.write_all(&h[..5]).unwrap();
        let t = std::thread::spawn(move || {
            a.write_all(&h[5..]).unwrap();
            a.write_all(&[1, 2, 3, 4]).unwrap();
            a
        });
        let Some(Received::Message(m)) = recv(&b).unwrap() else {
            panic!("no message");
        };
        assert_eq!(m.payload, [1, 2, 3, 4]);
        assert_eq!(m.header.size, 20);
        drop(t.join().unwrap());
        assert!(recv(&b).unwrap().is_none());
    }

    #[test]
    fn descriptors_arrive_with_the_header() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = std::fs::File::open("/dev/null").unwrap();
        send(&a, &header(16), Some(f.as_fd())).unwrap();
        let Some(Received::Message(m)) = recv(&b).unwrap() else {
            panic!("no message");
        };
        assert_eq!(m.fds.len(), 1);
        assert!(!m.too_many_fds);
    }

    #[test]
    fn sizes_out_of_bounds() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&header(15)).unwrap();
        assert!(matches!(recv(&b), Err(SocketError::TooSmall(15))));
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&header(u32::MAX)).unwrap();
        assert!(matches!(recv(&b), Err(SocketError::Absurd(_))));
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&header(24)).unwrap();
        a.write_all(&[0; 3]).unwrap();
        drop(a);
        assert!(matches!(recv(&b), Err(SocketError::Eof)));
    }
}
