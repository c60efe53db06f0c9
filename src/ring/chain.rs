// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A descriptor chain turned into a request: its bytes, the header read from them once,
//! and where the response goes.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::device::command::Header;
use crate::device::{Admission, Reply};
use crate::protocol::{Status, MAX_REQUEST, MAX_RESPONSE_SEGMENTS};

/// A descriptor chain turned into owned data: request bytes (or why there are none) and
/// where the response goes.
#[derive(Clone, Debug)]
pub struct ChainRequest {
    /// The chain's head index.
    pub head: u16,
    /// Read once from `bytes`, passed on to ordering, journal and execution.
    pub hdr: Header,
    /// The request: the readable descriptors' bytes in order.
    pub bytes: Vec<u8>,
    /// Why the chain is not a request.
    pub error: Option<Status>,
    /// Writable descriptors (address, length) for the response.
    pub writable: Vec<(u64, u32)>,
    /// What the device decided when the request was taken, in ring order: its injected
    /// fault, whether it runs inline.
    pub admission: Admission,
    /// When it was taken off the ring (stage timing).
    pub taken: std::time::Instant,
}

impl ChainRequest {
    /// Reads a chain. Readable descriptors after a writable one, more than
    /// [`MAX_RESPONSE_SEGMENTS`] writable ones, a request larger than `MAX_REQUEST` or one
    /// that cannot be read make it malformed (`error`).
    pub fn parse<M>(chain: &virtio_queue::DescriptorChain<M>, mem: &GuestMemoryMmap) -> Self
    where
        M: std::ops::Deref + Clone,
        M::Target: vm_memory::GuestMemory,
    {
        let mut bytes = Vec::new();
        let mut writable = Vec::new();
        let mut error = None;
        for desc in chain.clone() {
            if desc.is_write_only() {
                if writable.len() == MAX_RESPONSE_SEGMENTS as usize {
                    // Answered BAD_CHAIN in the segments kept: a chain of thousands
                    // would make the request hold their list.
                    error.get_or_insert(Status::BadChain);
                } else {
                    writable.push((desc.addr().0, desc.len()));
                }
                continue;
            }
            if !writable.is_empty() {
                // Readable after writable breaks the virtio layout of a request.
                error.get_or_insert(Status::BadChain);
                continue;
            }
            let len = desc.len() as usize;
            if bytes.len() + len > MAX_REQUEST as usize {
                error.get_or_insert(Status::TooLarge);
                continue;
            }
            let start = bytes.len();
            bytes.resize(start + len, 0);
            if mem.read_slice(&mut bytes[start..], desc.addr()).is_err() {
                error.get_or_insert(Status::BadChain);
            }
        }
        ChainRequest {
            head: chain.head_index(),
            hdr: Header::read(&bytes),
            bytes,
            error,
            writable,
            admission: Admission::default(),
            taken: std::time::Instant::now(),
        }
    }

    /// The first writable descriptor, where the journal expects the response.
    pub fn response_area(&self) -> (u64, u32) {
        self.writable.first().copied().unwrap_or((0, 0))
    }

    /// Bytes the writable descriptors hold.
    pub fn room(&self) -> u64 {
        self.writable.iter().map(|&(_, l)| l as u64).sum()
    }

    /// The reply to a malformed chain: `status`, with the opcode and tag when the header
    /// is whole.
    pub fn error_reply(&self, status: Status) -> Reply {
        let mut r = Reply {
            opcode: self.hdr.answered_opcode(),
            ..Default::default()
        };
        r.resp.status = status as u32;
        r.resp.tag = self.hdr.tag;
        r
    }
}

/// Writes `data` across the writable descriptors; returns the bytes written.
pub fn write_out(mem: &GuestMemoryMmap, writable: &[(u64, u32)], data: &[u8]) -> u32 {
    let mut pos = 0usize;
    for &(addr, len) in writable {
        if pos == data.len() {
            break;
        }
        let n = (len as usize).min(data.len() - pos);
        if mem
            .write_slice(&data[pos..pos + n], GuestAddress(addr))
            .is_err()
        {
            break;
        }
        pos += n;
    }
    pos as u32
}
