// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The command queue: requests taken from it (journaled first), executed when their
//! answer can be delivered, and returned as used entries (journaled around the write).

use std::sync::atomic::AtomicBool;

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::chain::{write_out, ChainRequest};
use super::journal::{Journal, Origin};
use super::{CmdQueue, Error};
use crate::device::{Device, Reply};
use crate::host::sigbus;
use crate::protocol::{Resp, Status, EVENT_ERROR};

/// A request taken from a command queue, journaled and admitted.
pub struct Taken {
    pub req: ChainRequest,
    /// Where it came from, for the state changes it makes.
    pub origin: Origin,
}

/// Takes up to `room` requests from command queue `cq`, in ring order: each is read
/// ([`ChainRequest::parse`]), admitted by the device ([`Device::admit`]: its injected
/// fault, whether it runs inline) and journaled before the caller sees it, that is before
/// it can take effect, so a successor knows it was taken.
pub fn take(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    device: &Device,
    journal: Journal,
    cq: CmdQueue,
    room: usize,
) -> Result<Vec<Taken>, Error> {
    let start = queue.next_avail();
    // The ring's own size, which the driver chose: it may exceed the queue size.
    let size = queue.size();
    let iter = queue.iter(mem).map_err(|e| match e {
        virtio_queue::Error::QueueNotReady => Error::NotReady,
        e => Error::Unusable(e),
    })?;
    let mut taken = Vec::new();
    for (k, chain) in iter.take(room).enumerate() {
        let pos = start.wrapping_add(k as u16);
        let mut req = ChainRequest::parse(&chain, mem);
        req.admission = device.admit(req.hdr, &req.bytes, req.error.is_some());
        let origin = Origin {
            queue: cq.vq as u16,
            head: req.head,
            nonce: journal.next_nonce(),
        };
        log::trace!("took head {} tag {} at {pos}", req.head, req.hdr.tag);
        journal.begin(
            cq.vq,
            req.head,
            size,
            pos,
            origin.nonce,
            req.hdr.tag,
            req.response_area(),
        );
        taken.push(Taken { req, origin });
    }
    Ok(taken)
}

/// What became of a request.
#[derive(Debug)]
pub struct Answer {
    /// Bytes written for the driver (the used entry's length).
    pub written: u32,
    /// The reply written, or None when the request had no usable response buffer and
    /// did not run.
    pub reply: Option<Reply>,
}

/// Executes a request (cut short when `cancel` is set) and writes its reply over the
/// chain's writable descriptors. Nothing runs unless its response can be delivered: a
/// command whose result the driver cannot see must not take effect (or leak a buffer).
pub fn answer(
    device: &Device,
    mem: &GuestMemoryMmap,
    req: &ChainRequest,
    origin: Origin,
    cancel: &AtomicBool,
) -> Answer {
    let room = req.room();
    let resp_len = std::mem::size_of::<Resp>() as u64;
    let answerable = room >= resp_len
        && req
            .writable
            .iter()
            .all(|&(a, l)| mem.check_range(GuestAddress(a), l as usize));
    if !answerable {
        device.reject(format_args!(
            "request (head {}) has no usable response buffer ({room} writable bytes); not executed",
            req.head
        ));
        device.post_event(EVENT_ERROR, req.hdr.opcode as u64, Status::BadChain as u64);
        return Answer {
            written: 0,
            reply: None,
        };
    }
    let faults = sigbus::faults();
    let mut reply = match req.error {
        // A panic here is a bug of ours; the request is still answered, so that the
        // ring, and the driver waiting on it, go on.
        None => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            device.execute_admitted(
                mem,
                req.hdr,
                &req.bytes,
                Some(origin),
                cancel,
                req.admission.fault,
            )
        }))
        .unwrap_or_else(|_| {
            device.reject(format_args!(
                "request (head {}): the device model panicked (a bug); answered INTERNAL",
                req.head
            ));
            req.error_reply(Status::Internal)
        }),
        Some(status) => {
            device.reject(format_args!(
                "malformed descriptor chain (head {}): {}",
                req.head,
                status.name()
            ));
            req.error_reply(status)
        }
    };
    if sigbus::faults() != faults {
        // Memory shrank under the command (see sigbus.rs): what it read or wrote there is
        // lost.
        device.reject(format_args!(
            "request (head {}): memory shrank under it (its file was truncated)",
            req.head
        ));
        reply.payload.clear();
        reply.resp.status = Status::BadGpa as u32;
    }
    if room < resp_len + reply.payload.len() as u64 {
        // Only IDENTIFY and STATS carry payloads, and they change nothing.
        reply.payload.clear();
        reply.resp.status = Status::BadChain as u32;
    }
    let mut written = write_out(mem, &req.writable, &reply.bytes());
    if reply.corrupt_length {
        // An injected fault: fewer bytes than a response.
        written = written.min(3);
    }
    Answer {
        written,
        reply: Some(reply),
    }
}

/// Returns a request to the driver, journaled so that a crash in between neither loses
/// nor duplicates it. False when the used ring cannot take it.
pub fn publish(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    journal: Journal,
    q: usize,
    head: u16,
    written: u32,
) -> bool {
    let slot = queue.next_used();
    log::trace!("returned head {head} at used {slot}");
    journal.completing(q, head, slot, written);
    let ok = queue.add_used(mem, head, written).is_ok();
    journal.release(q, head);
    ok
}
