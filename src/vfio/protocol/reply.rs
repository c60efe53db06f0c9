// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The replies the server sends, encoded to the sizes QEMU's client accepts: a header
//! repeating the request's id and command, then the payload of the reply's kind.

use super::{
    Errno, Header, DEVICE_INFO_SIZE, DMA_UNMAP_SIZE, FLAG_ERROR, FLAG_TYPE_REPLY, HEADER_SIZE,
    IRQ_INFO_SIZE, REGION_ACCESS_SIZE, REGION_CAPS, REGION_INFO_SIZE,
};
use crate::vfio::{DeviceInfo, IrqInfo, RegionInfo};

/// A reply to one request. Encoded with the request's header, whose id and command it
/// repeats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// Our version and capabilities (`json` without its NUL).
    Version {
        major: u16,
        minor: u16,
        json: &'a str,
    },
    /// Header only: DMA_MAP, SET_IRQS, DEVICE_RESET.
    Done,
    /// The entry echoed back (the specification's form; QEMU also takes header only).
    DmaUnmap {
        flags: u32,
        iova: u64,
        size: u64,
    },
    DeviceInfo(DeviceInfo),
    /// The 32-byte struct only, never capabilities: QEMU refuses a reply longer than
    /// argsz + 16, and its capability check changed in 11.1. `REGION_CAPS` is cleared.
    RegionInfo {
        index: u32,
        info: RegionInfo,
    },
    IrqInfo {
        index: u32,
        info: IrqInfo,
    },
    RegionRead {
        offset: u64,
        region: u32,
        data: &'a [u8],
    },
    /// offset, region and count, no data.
    RegionWrite {
        offset: u64,
        region: u32,
        count: u32,
    },
    /// Header only, flags REPLY | ERROR.
    Error(Errno),
}

impl Reply<'_> {
    /// The whole message: header and payload.
    pub fn encode(&self, request: &Header) -> Vec<u8> {
        let mut p = Vec::new();
        let mut flags = FLAG_TYPE_REPLY;
        let mut error = 0;
        match self {
            Reply::Version { major, minor, json } => {
                p.extend_from_slice(&major.to_le_bytes());
                p.extend_from_slice(&minor.to_le_bytes());
                p.extend_from_slice(json.as_bytes());
                p.push(0);
            }
            Reply::Done => {}
            Reply::DmaUnmap { flags, iova, size } => {
                put32(&mut p, DMA_UNMAP_SIZE as u32);
                put32(&mut p, *flags);
                put64(&mut p, *iova);
                put64(&mut p, *size);
            }
            Reply::DeviceInfo(info) => {
                put32(&mut p, DEVICE_INFO_SIZE as u32);
                put32(&mut p, info.flags);
                put32(&mut p, info.num_regions);
                put32(&mut p, info.num_irqs);
            }
            Reply::RegionInfo { index, info } => {
                put32(&mut p, REGION_INFO_SIZE as u32);
                put32(&mut p, info.flags & !REGION_CAPS);
                put32(&mut p, *index);
                put32(&mut p, 0); // cap_offset
                put64(&mut p, info.size);
                put64(&mut p, info.offset);
            }
            Reply::IrqInfo { index, info } => {
                put32(&mut p, IRQ_INFO_SIZE as u32);
                put32(&mut p, info.flags);
                put32(&mut p, *index);
                put32(&mut p, info.count);
            }
            Reply::RegionRead {
                offset,
                region,
                data,
            } => {
                p.reserve(REGION_ACCESS_SIZE + data.len());
                put64(&mut p, *offset);
                put32(&mut p, *region);
                put32(&mut p, data.len() as u32);
                p.extend_from_slice(data);
            }
            Reply::RegionWrite {
                offset,
                region,
                count,
            } => {
                put64(&mut p, *offset);
                put32(&mut p, *region);
                put32(&mut p, *count);
            }
            Reply::Error(errno) => {
                flags |= FLAG_ERROR;
                // A non-positive errno would read as success; EINVAL stands in for it.
                error = if errno.0 > 0 {
                    errno.0 as u32
                } else {
                    EINVAL_U32
                };
            }
        }
        let header = Header {
            id: request.id,
            command: request.command,
            size: (HEADER_SIZE + p.len()) as u32,
            flags,
            error,
        };
        let mut out = Vec::with_capacity(HEADER_SIZE + p.len());
        out.extend_from_slice(&header.encode());
        out.extend_from_slice(&p);
        out
    }
}

const EINVAL_U32: u32 = libc::EINVAL as u32;

fn put32(p: &mut Vec<u8>, v: u32) {
    p.extend_from_slice(&v.to_le_bytes());
}

fn put64(p: &mut Vec<u8>, v: u64) {
    p.extend_from_slice(&v.to_le_bytes());
}
