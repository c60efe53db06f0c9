// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The vfio-user wire format as QEMU's `vfio-user-pci` speaks it: the 16-byte header,
//! the commands a client sends, decoded with every length checked (a hostile client gets
//! an errno, never a panic), and the replies, encoded to the sizes the client accepts
//! (`reply.rs`).
//!
//! All numbers are little-endian. Commands and sizes follow the vfio-user specification
//! (`docs/interop/vfio-user.rst` in QEMU); where QEMU's client is stricter than the
//! specification (reply sizes, reply flags) the encoders follow QEMU.

mod reply;
#[cfg(test)]
mod tests;

pub use reply::Reply;

/// Every message starts with this many header bytes; `size` counts them.
pub const HEADER_SIZE: usize = 16;
/// The protocol version we speak (`major.minor`).
pub const VERSION_MAJOR: u16 = 0;
pub const VERSION_MINOR: u16 = 0;
/// Most file descriptors one message may carry (what we announce as `max_msg_fds`).
pub const MAX_MSG_FDS: usize = 16;
/// Most data bytes one REGION_READ or REGION_WRITE may move (`max_data_xfer_size`).
/// QEMU reads the whole 4 KiB config space at once, so this must stay ≥ 4096.
pub const MAX_DATA_XFER: u32 = 1 << 20;
/// Page sizes we accept for DMA maps (`pgsizes`).
pub const PAGE_SIZES: u64 = 4096;
/// Most DMA maps a client may hold (`max_dma_maps`).
pub const MAX_DMA_MAPS: u32 = 65535;

/// Command numbers (the header's `command`; a reply repeats its request's).
pub mod command {
    pub const VERSION: u16 = 1;
    pub const DMA_MAP: u16 = 2;
    pub const DMA_UNMAP: u16 = 3;
    pub const DEVICE_GET_INFO: u16 = 4;
    pub const DEVICE_GET_REGION_INFO: u16 = 5;
    pub const DEVICE_GET_REGION_IO_FDS: u16 = 6;
    pub const DEVICE_GET_IRQ_INFO: u16 = 7;
    pub const DEVICE_SET_IRQS: u16 = 8;
    pub const REGION_READ: u16 = 9;
    pub const REGION_WRITE: u16 = 10;
    /// Server to client only.
    pub const DMA_READ: u16 = 11;
    /// Server to client only.
    pub const DMA_WRITE: u16 = 12;
    pub const DEVICE_RESET: u16 = 13;
    pub const DIRTY_PAGES: u16 = 14;
    pub const REGION_WRITE_MULTI: u16 = 15;
    pub const DEVICE_FEATURE: u16 = 16;
    pub const MIG_DATA_READ: u16 = 17;
    pub const MIG_DATA_WRITE: u16 = 18;
}

/// Header `flags`: bits 3:0 are the message type.
pub const FLAG_TYPE_MASK: u32 = 0xf;
pub const FLAG_TYPE_COMMAND: u32 = 0;
pub const FLAG_TYPE_REPLY: u32 = 1;
/// The sender wants no reply (QEMU's posted writes). Answering one desynchronises QEMU.
pub const FLAG_NO_REPLY: u32 = 0x10;
/// With `FLAG_TYPE_REPLY`: `error` holds an errno. Without the reply type QEMU takes the
/// message for a request from the server.
pub const FLAG_ERROR: u32 = 0x20;

/// `DeviceInfo::flags`.
pub const DEVICE_RESET: u32 = 1 << 0;
pub const DEVICE_PCI: u32 = 1 << 1;

/// `RegionInfo::flags`.
pub const REGION_READ: u32 = 1 << 0;
pub const REGION_WRITE: u32 = 1 << 1;
pub const REGION_MMAP: u32 = 1 << 2;
/// Capabilities follow the region info. We never send any (see [`Reply::RegionInfo`]).
pub const REGION_CAPS: u32 = 1 << 3;

/// PCI region indexes (`VFIO_PCI_*_REGION_INDEX`).
pub const REGION_BAR0: u32 = 0;
pub const REGION_ROM: u32 = 6;
pub const REGION_CONFIG: u32 = 7;
pub const REGION_VGA: u32 = 8;
pub const NUM_REGIONS: u32 = 9;

/// `IrqInfo::flags`.
pub const IRQ_INFO_EVENTFD: u32 = 1 << 0;
pub const IRQ_INFO_MASKABLE: u32 = 1 << 1;
pub const IRQ_INFO_AUTOMASKED: u32 = 1 << 2;
pub const IRQ_INFO_NORESIZE: u32 = 1 << 3;

/// PCI interrupt indexes (`VFIO_PCI_*_IRQ_INDEX`).
pub const IRQ_INTX: u32 = 0;
pub const IRQ_MSI: u32 = 1;
pub const IRQ_MSIX: u32 = 2;
pub const IRQ_ERR: u32 = 3;
pub const IRQ_REQ: u32 = 4;
pub const NUM_IRQS: u32 = 5;

/// `SetIrqs::flags`: one data type and one action.
pub const IRQ_SET_DATA_NONE: u32 = 1 << 0;
pub const IRQ_SET_DATA_BOOL: u32 = 1 << 1;
pub const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
pub const IRQ_SET_ACTION_MASK: u32 = 1 << 3;
pub const IRQ_SET_ACTION_UNMASK: u32 = 1 << 4;
pub const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
const IRQ_SET_DATA: u32 = IRQ_SET_DATA_NONE | IRQ_SET_DATA_BOOL | IRQ_SET_DATA_EVENTFD;
const IRQ_SET_ACTION: u32 = IRQ_SET_ACTION_MASK | IRQ_SET_ACTION_UNMASK | IRQ_SET_ACTION_TRIGGER;

/// `DMA_MAP` flags: what the device may do with the memory.
pub const DMA_MAP_READ: u32 = 1 << 0;
pub const DMA_MAP_WRITE: u32 = 1 << 1;
/// `DMA_UNMAP` flags (Linux's numbering, which QEMU uses).
pub const DMA_UNMAP_GET_DIRTY_BITMAP: u32 = 1 << 0;
pub const DMA_UNMAP_ALL: u32 = 1 << 1;

/// Payload sizes of the fixed-size structures.
const DMA_MAP_SIZE: usize = 32;
const DMA_UNMAP_SIZE: usize = 24;
const DEVICE_INFO_SIZE: usize = 16;
const REGION_INFO_SIZE: usize = 32;
const IRQ_INFO_SIZE: usize = 16;
const IRQ_SET_SIZE: usize = 20;
const REGION_ACCESS_SIZE: usize = 16;
const VERSION_FIXED: usize = 4;

/// An error answered to the client: a positive errno in an error reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const E2BIG: Errno = Errno(libc::E2BIG);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EFAULT: Errno = Errno(libc::EFAULT);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const ENOTTY: Errno = Errno(libc::ENOTTY);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const EOVERFLOW: Errno = Errno(libc::EOVERFLOW);
    pub const ENOTSUP: Errno = Errno(libc::ENOTSUP);
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

impl From<std::io::Error> for Errno {
    /// The error's errno, or EIO when it has none.
    fn from(e: std::io::Error) -> Errno {
        Errno(e.raw_os_error().filter(|&n| n > 0).unwrap_or(libc::EIO))
    }
}

/// The 16-byte message header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub id: u16,
    pub command: u16,
    /// The whole message, header included.
    pub size: u32,
    pub flags: u32,
    pub error: u32,
}

impl Header {
    pub fn parse(b: &[u8; HEADER_SIZE]) -> Header {
        Header {
            id: u16::from_le_bytes([b[0], b[1]]),
            command: u16::from_le_bytes([b[2], b[3]]),
            size: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            flags: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            error: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        }
    }

    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[0..2].copy_from_slice(&self.id.to_le_bytes());
        b[2..4].copy_from_slice(&self.command.to_le_bytes());
        b[4..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..16].copy_from_slice(&self.error.to_le_bytes());
        b
    }

    /// Bytes after the header (None when `size` is smaller than a header).
    pub fn payload_len(&self) -> Option<usize> {
        (self.size as usize).checked_sub(HEADER_SIZE)
    }

    pub fn message_type(&self) -> u32 {
        self.flags & FLAG_TYPE_MASK
    }

    pub fn no_reply(&self) -> bool {
        self.flags & FLAG_NO_REPLY != 0
    }
}

/// A client's command, decoded. Borrowed data points into the message's payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// `json` without its NUL; a valid JSON object (or empty when the client sent none).
    Version {
        major: u16,
        minor: u16,
        json: &'a str,
    },
    DmaMap {
        flags: u32,
        offset: u64,
        iova: u64,
        size: u64,
    },
    DmaUnmap {
        flags: u32,
        iova: u64,
        size: u64,
    },
    GetInfo,
    /// `argsz`: the largest reply payload the client takes (at least the 32-byte struct).
    GetRegionInfo {
        argsz: u32,
        index: u32,
    },
    GetIrqInfo {
        index: u32,
    },
    /// `count` file descriptors come with the message for `DATA_EVENTFD` (or none: tear
    /// the vectors down); none for `DATA_NONE`.
    SetIrqs {
        flags: u32,
        index: u32,
        start: u32,
        count: u32,
    },
    /// `count` is 1..=`MAX_DATA_XFER` and `offset + count` does not wrap.
    RegionRead {
        offset: u64,
        region: u32,
        count: u32,
    },
    /// `data` is 1..=`MAX_DATA_XFER` bytes and `offset + len` does not wrap.
    RegionWrite {
        offset: u64,
        region: u32,
        data: &'a [u8],
        no_reply: bool,
    },
    Reset,
    /// A command we do not serve (its payload was read; it is answered with an error).
    Unknown {
        command: u16,
    },
}

fn u16_at(p: &[u8], at: usize) -> u16 {
    let mut b = [0u8; 2];
    b.copy_from_slice(&p[at..at + 2]);
    u16::from_le_bytes(b)
}

fn u32_at(p: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&p[at..at + 4]);
    u32::from_le_bytes(b)
}

fn u64_at(p: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&p[at..at + 8]);
    u64::from_le_bytes(b)
}

/// A payload that must be exactly `len` bytes (callers read fields only after this).
fn exact(payload: &[u8], len: usize) -> Result<(), Errno> {
    if payload.len() == len {
        Ok(())
    } else {
        Err(Errno::EINVAL)
    }
}

/// No file descriptor may come with this command.
fn no_fds(fds: usize) -> Result<(), Errno> {
    if fds == 0 {
        Ok(())
    } else {
        Err(Errno::EINVAL)
    }
}

/// `[start, start + len)` must not wrap around.
fn no_wrap(start: u64, len: u64) -> Result<(), Errno> {
    start.checked_add(len).map(|_| ()).ok_or(Errno::EINVAL)
}

impl<'a> Request<'a> {
    /// Decodes a command from its header, its whole payload (`header.size - 16` bytes, as
    /// the socket layer read it) and the number of file descriptors that came with it.
    /// Replies and other message types are the caller's to sort out first.
    pub fn decode(header: &Header, payload: &'a [u8], fds: usize) -> Result<Request<'a>, Errno> {
        if header.payload_len() != Some(payload.len()) {
            return Err(Errno::EINVAL);
        }
        match header.command {
            command::VERSION => decode_version(payload, fds),
            command::DMA_MAP => decode_dma_map(payload, fds),
            command::DMA_UNMAP => decode_dma_unmap(payload, fds),
            command::DEVICE_GET_INFO => {
                exact(payload, DEVICE_INFO_SIZE)?;
                no_fds(fds)?;
                // argsz: room the client has for the reply's struct.
                if (u32_at(payload, 0) as usize) < DEVICE_INFO_SIZE {
                    return Err(Errno::EINVAL);
                }
                Ok(Request::GetInfo)
            }
            command::DEVICE_GET_REGION_INFO => {
                exact(payload, REGION_INFO_SIZE)?;
                no_fds(fds)?;
                let argsz = u32_at(payload, 0);
                if (argsz as usize) < REGION_INFO_SIZE {
                    return Err(Errno::EINVAL);
                }
                Ok(Request::GetRegionInfo {
                    argsz,
                    index: u32_at(payload, 8),
                })
            }
            command::DEVICE_GET_IRQ_INFO => {
                exact(payload, IRQ_INFO_SIZE)?;
                no_fds(fds)?;
                if (u32_at(payload, 0) as usize) < IRQ_INFO_SIZE {
                    return Err(Errno::EINVAL);
                }
                Ok(Request::GetIrqInfo {
                    index: u32_at(payload, 8),
                })
            }
            command::DEVICE_SET_IRQS => decode_set_irqs(payload, fds),
            command::REGION_READ => {
                exact(payload, REGION_ACCESS_SIZE)?;
                no_fds(fds)?;
                let (offset, region, count) = region_access(payload)?;
                Ok(Request::RegionRead {
                    offset,
                    region,
                    count,
                })
            }
            command::REGION_WRITE => {
                if payload.len() < REGION_ACCESS_SIZE {
                    return Err(Errno::EINVAL);
                }
                no_fds(fds)?;
                let (offset, region, count) = region_access(payload)?;
                let data = &payload[REGION_ACCESS_SIZE..];
                if data.len() != count as usize {
                    return Err(Errno::EINVAL);
                }
                Ok(Request::RegionWrite {
                    offset,
                    region,
                    data,
                    no_reply: header.no_reply(),
                })
            }
            command::DEVICE_RESET => {
                exact(payload, 0)?;
                no_fds(fds)?;
                Ok(Request::Reset)
            }
            command => Ok(Request::Unknown { command }),
        }
    }
}

fn decode_version(payload: &[u8], fds: usize) -> Result<Request<'_>, Errno> {
    if payload.len() < VERSION_FIXED {
        return Err(Errno::EINVAL);
    }
    no_fds(fds)?;
    let major = u16_at(payload, 0);
    let minor = u16_at(payload, 2);
    let json = match &payload[VERSION_FIXED..] {
        [] => "",
        // One NUL, at the end: nothing hides behind an early one.
        [text @ .., 0] if !text.contains(&0) => {
            let text = std::str::from_utf8(text).map_err(|_| Errno::EINVAL)?;
            let value: serde_json::Value = serde_json::from_str(text).map_err(|_| Errno::EINVAL)?;
            if !value.is_object() {
                return Err(Errno::EINVAL);
            }
            text
        }
        _ => return Err(Errno::EINVAL),
    };
    Ok(Request::Version { major, minor, json })
}

fn decode_dma_map(payload: &[u8], fds: usize) -> Result<Request<'_>, Errno> {
    exact(payload, DMA_MAP_SIZE)?;
    if u32_at(payload, 0) as usize != DMA_MAP_SIZE || fds > 1 {
        return Err(Errno::EINVAL);
    }
    let flags = u32_at(payload, 4);
    let offset = u64_at(payload, 8);
    let iova = u64_at(payload, 16);
    let size = u64_at(payload, 24);
    if flags & !(DMA_MAP_READ | DMA_MAP_WRITE) != 0 || size == 0 {
        return Err(Errno::EINVAL);
    }
    no_wrap(iova, size)?;
    no_wrap(offset, size)?;
    Ok(Request::DmaMap {
        flags,
        offset,
        iova,
        size,
    })
}

fn decode_dma_unmap(payload: &[u8], fds: usize) -> Result<Request<'_>, Errno> {
    exact(payload, DMA_UNMAP_SIZE)?;
    no_fds(fds)?;
    // A larger argsz would announce a dirty bitmap, which we never offered (no migration).
    if u32_at(payload, 0) as usize != DMA_UNMAP_SIZE {
        return Err(Errno::EINVAL);
    }
    let flags = u32_at(payload, 4);
    let iova = u64_at(payload, 8);
    let size = u64_at(payload, 16);
    if flags & !DMA_UNMAP_ALL != 0 {
        return Err(Errno::EINVAL);
    }
    if flags & DMA_UNMAP_ALL == 0 {
        no_wrap(iova, size)?;
    }
    Ok(Request::DmaUnmap { flags, iova, size })
}

fn decode_set_irqs(payload: &[u8], fds: usize) -> Result<Request<'_>, Errno> {
    if payload.len() < IRQ_SET_SIZE || u32_at(payload, 0) as usize != payload.len() {
        return Err(Errno::EINVAL);
    }
    let flags = u32_at(payload, 4);
    let index = u32_at(payload, 8);
    let start = u32_at(payload, 12);
    let count = u32_at(payload, 16);
    let data = flags & IRQ_SET_DATA;
    let action = flags & IRQ_SET_ACTION;
    if flags & !(IRQ_SET_DATA | IRQ_SET_ACTION) != 0
        || data.count_ones() != 1
        || action.count_ones() != 1
        || start.checked_add(count).is_none()
    {
        return Err(Errno::EINVAL);
    }
    match data {
        IRQ_SET_DATA_NONE => {
            exact(payload, IRQ_SET_SIZE)?;
            no_fds(fds)?;
        }
        IRQ_SET_DATA_EVENTFD => {
            exact(payload, IRQ_SET_SIZE)?;
            // One descriptor per vector, or none to tear the vectors down.
            if fds != 0 && fds != count as usize {
                return Err(Errno::EINVAL);
            }
        }
        // An inline array of booleans: QEMU never sends one, and `SetIrqs` has no room
        // for it. Refused, but only once its size is consistent.
        _ => {
            exact(payload, IRQ_SET_SIZE + count as usize)?;
            no_fds(fds)?;
            return Err(Errno::ENOTSUP);
        }
    }
    Ok(Request::SetIrqs {
        flags,
        index,
        start,
        count,
    })
}

/// The `{u64 offset, u32 region, u32 count}` that opens REGION_READ and REGION_WRITE.
fn region_access(payload: &[u8]) -> Result<(u64, u32, u32), Errno> {
    let offset = u64_at(payload, 0);
    let region = u32_at(payload, 8);
    let count = u32_at(payload, 12);
    if count > MAX_DATA_XFER {
        return Err(Errno::E2BIG);
    }
    if count == 0 {
        return Err(Errno::EINVAL);
    }
    no_wrap(offset, count.into())?;
    Ok((offset, region, count))
}
