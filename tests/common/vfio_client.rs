// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A vfio-user client written from the protocol's byte layout (not from the crate's
//! encoders), as QEMU's `vfio-user-pci` speaks it: for the server's tests against a mock
//! function and for the supervised daemon's.

use std::fs::File;
use std::io::Read;
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

// Commands and flags as the vfio-user specification numbers them.
pub const VERSION: u16 = 1;
pub const DMA_MAP: u16 = 2;
pub const DMA_UNMAP: u16 = 3;
pub const GET_INFO: u16 = 4;
pub const GET_REGION_INFO: u16 = 5;
pub const GET_REGION_IO_FDS: u16 = 6;
pub const GET_IRQ_INFO: u16 = 7;
pub const SET_IRQS: u16 = 8;
pub const REGION_READ_CMD: u16 = 9;
pub const REGION_WRITE_CMD: u16 = 10;
pub const RESET: u16 = 13;
pub const DEVICE_FEATURE: u16 = 16;
pub const REPLY: u32 = 0x1;
pub const NO_REPLY: u32 = 0x10;
pub const ERROR: u32 = 0x20;
pub const EVENTFD_TRIGGER: u32 = 0x24;
pub const NONE_TRIGGER: u32 = 0x21;

/// QEMU's VERSION JSON, to size requests as QEMU does.
pub const QEMU_CAPS: &str = "{\"capabilities\":{\"migration\":{\"pgsize\":4096,\"max_bitmap_size\":268435456},\"max_msg_fds\":16,\"max_data_xfer_size\":1048576,\"pgsizes\":4096,\"max_dma_maps\":65535,\"write_multiple\":true}}";
/// Config space's region index.
pub const CONFIG: u32 = 7;

// ---------------------------------------------------------------------------------------
// The client.

#[derive(Debug)]
pub struct Reply {
    pub id: u16,
    pub command: u16,
    pub size: u32,
    pub flags: u32,
    pub error: u32,
    pub payload: Vec<u8>,
    pub fd: Option<File>,
}

impl Reply {
    pub fn ok(&self) -> &Self {
        assert_eq!(self.flags, REPLY, "error reply: {self:?}");
        self
    }

    pub fn errno(&self) -> i32 {
        assert_eq!(self.flags, REPLY | ERROR, "not an error reply: {self:?}");
        assert!(self.payload.is_empty() && self.size == 16);
        assert!(self.fd.is_none());
        self.error as i32
    }

    pub fn u32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.payload[at..at + 4].try_into().unwrap())
    }

    pub fn u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.payload[at..at + 8].try_into().unwrap())
    }
}

pub struct Client {
    pub s: UnixStream,
    pub next_id: u16,
}

pub fn header(id: u16, command: u16, size: u32, flags: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(16);
    h.extend_from_slice(&id.to_le_bytes());
    h.extend_from_slice(&command.to_le_bytes());
    h.extend_from_slice(&size.to_le_bytes());
    h.extend_from_slice(&flags.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h
}

/// Little-endian fields, in order.
#[derive(Default)]
pub struct P(pub Vec<u8>);

impl P {
    pub fn u16(mut self, v: u16) -> P {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> P {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> P {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(mut self, v: &[u8]) -> P {
        self.0.extend_from_slice(v);
        self
    }
}

pub fn version_payload(major: u16, json: &str) -> Vec<u8> {
    P::default().u16(major).u16(0).bytes(json.as_bytes()).0
}

pub fn dma_map(argsz: u32, flags: u32, offset: u64, iova: u64, size: u64) -> Vec<u8> {
    P::default()
        .u32(argsz)
        .u32(flags)
        .u64(offset)
        .u64(iova)
        .u64(size)
        .0
}

pub fn region_info(argsz: u32, index: u32) -> Vec<u8> {
    P::default()
        .u32(argsz)
        .u32(0)
        .u32(index)
        .u32(0)
        .u64(0)
        .u64(0)
        .0
}

pub fn access(offset: u64, region: u32, count: u32) -> P {
    P::default().u64(offset).u32(region).u32(count)
}

pub fn set_irqs(flags: u32, index: u32, start: u32, count: u32) -> Vec<u8> {
    P::default()
        .u32(20)
        .u32(flags)
        .u32(index)
        .u32(start)
        .u32(count)
        .0
}

impl Client {
    /// Sends bytes as they are, with `fds` on the first one.
    pub fn raw(&mut self, bytes: &[u8], fds: &[RawFd]) {
        let mut sent = 0;
        while sent < bytes.len() {
            let f: &[RawFd] = if sent == 0 { fds } else { &[] };
            sent += self.s.send_with_fds(&[&bytes[sent..]], f).unwrap();
        }
    }

    /// Sends a message whose header claims `size`; returns its id.
    pub fn send_sized(
        &mut self,
        command: u16,
        flags: u32,
        size: u32,
        payload: &[u8],
        fds: &[RawFd],
    ) -> u16 {
        self.next_id = self.next_id.wrapping_add(1);
        let mut m = header(self.next_id, command, size, flags);
        m.extend_from_slice(payload);
        self.raw(&m, fds);
        self.next_id
    }

    pub fn send(&mut self, command: u16, flags: u32, payload: &[u8], fds: &[RawFd]) -> u16 {
        let size = 16 + payload.len() as u32;
        self.send_sized(command, flags, size, payload, fds)
    }

    /// The next reply; None at end of stream.
    pub fn try_reply(&mut self) -> Option<Reply> {
        let mut h = [0u8; 16];
        let (n, fd) = self.s.recv_with_fd(&mut h).unwrap();
        if n == 0 {
            return None;
        }
        self.s.read_exact(&mut h[n..]).unwrap();
        let f = |a: usize| u32::from_le_bytes(h[a..a + 4].try_into().unwrap());
        let size = f(4);
        let mut payload = vec![0u8; size as usize - 16];
        self.s.read_exact(&mut payload).unwrap();
        Some(Reply {
            id: u16::from_le_bytes([h[0], h[1]]),
            command: u16::from_le_bytes([h[2], h[3]]),
            size,
            flags: f(8),
            error: f(12),
            payload,
            fd,
        })
    }

    /// Sends a request and returns its reply, which must answer it.
    pub fn call_fds(&mut self, command: u16, payload: &[u8], fds: &[RawFd]) -> Reply {
        let id = self.send(command, 0, payload, fds);
        let r = self.try_reply().expect("connection closed");
        assert_eq!((r.id, r.command), (id, command), "reply to another request");
        r
    }

    pub fn call(&mut self, command: u16, payload: &[u8]) -> Reply {
        self.call_fds(command, payload, &[])
    }

    pub fn version(&mut self) {
        let payload = version_payload(0, &format!("{QEMU_CAPS}\0"));
        let r = self.call(VERSION, &payload);
        r.ok();
        // QEMU's receive buffer for it is its own request's size.
        assert!(
            r.size as usize <= 16 + payload.len(),
            "VERSION reply too long"
        );
        assert_eq!(
            (r.payload[0], r.payload[1], r.payload[2], r.payload[3]),
            (0, 0, 0, 0)
        );
        assert_eq!(r.payload.last(), Some(&0));
        let json = std::str::from_utf8(&r.payload[4..r.payload.len() - 1]).unwrap();
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v["capabilities"]["max_msg_fds"], 16);
        assert_eq!(v["capabilities"]["max_data_xfer_size"], 1 << 20);
        assert!(v["capabilities"].get("write_multiple").is_none());
    }

    /// A config-space read that must succeed: the stream is in sync.
    pub fn read_config(&mut self, offset: u64, count: u32) -> Vec<u8> {
        let r = self.call(REGION_READ_CMD, &access(offset, CONFIG, count).0);
        r.ok();
        assert_eq!(r.u64(0), offset);
        assert_eq!((r.u32(8), r.u32(12)), (CONFIG, count));
        assert_eq!(r.size, 32 + count);
        r.payload[16..].to_vec()
    }

    /// The server closes the connection: EOF, not a reply.
    pub fn expect_closed(&mut self) {
        assert!(self.try_reply().is_none(), "connection still open");
    }
}
