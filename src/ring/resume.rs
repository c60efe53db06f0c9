// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Crash-resume: a daemon that replaces a dead one (its supervisor replays the front-end's
//! set-up) takes each ring over where the journal says it stood and answers what was in
//! flight, so the driver neither loses a request nor sees one twice.

use std::sync::atomic::Ordering;

use virtio_queue::{Queue, QueueT};
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryMmap};

use crate::protocol::{Resp, QUEUE_EVENT};
use crate::ring::journal::{interrupted, Journal, Outcome, RingId};
use crate::ring::publish;

/// The addresses and size that identify a ring in the journal.
pub fn ring_id(q: &Queue) -> RingId {
    RingId {
        desc: q.desc_table(),
        avail: q.avail_ring(),
        used: q.used_ring(),
        size: q.size(),
    }
}

/// The rings a session has looked at, as the journal knows them, so that each is adopted
/// once (on its first use) until it is set up anew.
pub type Adopted = std::sync::Mutex<Vec<Option<RingId>>>;

/// [`adopt`] on the first use of ring `q` as it is now set up (`resuming()` asked only
/// then); false (no interrupt owed) on every later use.
pub fn adopt_once(
    adopted: &Adopted,
    q: usize,
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    journal: Journal,
    resuming: impl FnOnce() -> bool,
) -> bool {
    let ring = ring_id(queue);
    let Ok(mut adopted) = adopted.lock() else {
        return false;
    };
    match adopted.get_mut(q) {
        Some(slot) if *slot != Some(ring) => *slot = Some(ring),
        _ => return false,
    }
    adopt(q, queue, mem, journal, resuming())
}

/// First use of ring `q` since it started: record it in the journal or, when `resuming`
/// after a crash, continue where the previous daemon stopped. Returns whether the driver
/// must be signalled (requests were returned).
pub fn adopt(
    q: usize,
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    journal: Journal,
    resuming: bool,
) -> bool {
    let ring = ring_id(queue);
    if !resuming {
        journal.set_ring(q, ring, queue.next_avail());
        return false;
    }
    let Ok(used) = queue.used_idx(mem, Ordering::Acquire) else {
        return false;
    };
    if q == QUEUE_EVENT {
        // Event buffers are used as soon as they are taken: the used index is where the
        // previous daemon stood.
        queue.set_next_avail(used.0);
        queue.set_next_used(used.0);
        log::info!("event queue resumed at {}", used.0);
        return false;
    }
    let Some(next_avail) = journal.ring_position(q, ring) else {
        // Not the ring the journal describes (set up anew: moved or resized): what it
        // recorded belongs to a ring that is gone, and its response buffers may be reused.
        journal.clear_ring(q);
        journal.set_ring(q, ring, queue.next_avail());
        queue.set_next_used(used.0);
        log::info!("queue {q}: a new ring, nothing of the previous daemon's to answer");
        return false;
    };
    queue.set_next_avail(next_avail);
    queue.set_next_used(used.0);
    let pending = journal.pending(q, ring.size, next_avail);
    log::debug!("in flight at the restart: {pending:?}");
    let (mut answered, mut interrupted_n, mut republished) = (0, 0, 0);
    for p in &pending {
        let written = match p.outcome {
            Outcome::Completing { used_slot, written } => {
                if published(mem, ring, used_slot, used.0, p.head) {
                    journal.release(q, p.head);
                    continue;
                }
                republished += 1;
                written
            }
            Outcome::Answered(resp) => {
                answered += 1;
                write_response(mem, p.resp_gpa, p.resp_len, &resp)
            }
            Outcome::Unknown => {
                interrupted_n += 1;
                write_response(mem, p.resp_gpa, p.resp_len, &interrupted(p.tag))
            }
        };
        publish(queue, mem, journal, q, p.head, written);
    }
    journal.set_ring(q, ring, next_avail);
    log::info!(
        "command queue {q} resumed at {next_avail} (used {}): {answered} answered from the \
         journal, {interrupted_n} interrupted, {republished} republished",
        used.0
    );
    true
}

/// Whether the used entry for `head` at `slot` is already visible to the driver.
fn published(mem: &GuestMemoryMmap, ring: RingId, slot: u16, used_idx: u16, head: u16) -> bool {
    let behind = used_idx.wrapping_sub(slot);
    if behind == 0 || behind > ring.size {
        return false;
    }
    let elem = ring.used + 4 + 8 * (slot % ring.size.max(1)) as u64;
    mem.read_obj::<u32>(GuestAddress(elem))
        .map(|id| id == head as u32)
        .unwrap_or(false)
}

/// Writes a response where the journal says the request wanted it; returns bytes written.
fn write_response(mem: &GuestMemoryMmap, gpa: u64, len: u32, resp: &Resp) -> u32 {
    if (len as usize) < std::mem::size_of::<Resp>() {
        return 0;
    }
    match mem.write_slice(resp.as_slice(), GuestAddress(gpa)) {
        Ok(()) => std::mem::size_of::<Resp>() as u32,
        Err(_) => 0,
    }
}
