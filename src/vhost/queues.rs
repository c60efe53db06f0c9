// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! What the vring thread (and an engine that finished) does with the queues: takes
//! commands from the command queues and runs small ones inline or hands them to the DMA
//! engines, busy-polls when asked to, returns answers, and fills the event queue.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::QueueT;
use vm_memory::GuestMemoryMmap;

use crate::device::command;
use crate::device::stages::Stage;
use crate::protocol::{
    cmd_queue_index, cmd_queue_of, OP_ALLOC, OP_EXPORT, OP_FREE, OP_RESET, OP_UNEXPORT, QUEUE_EVENT,
};
use crate::ring::{self, ChainRequest, Origin};

use super::{Session, Table};

/// Whether a request runs on the ring's thread as it arrives: small, unfenced, no state
/// change (ALLOC, FREE, EXPORT, UNEXPORT, RESET write the state file and queue behind the
/// engines' work as before), and nothing (an injected fault, a stalled engine, the latency
/// model) would make it wait there.
fn runs_inline(s: &Session, req: &ChainRequest) -> bool {
    let max = s.device.settings().inline_max;
    if max == 0 || req.hdr.fenced() || req.fault.is_some() {
        return false;
    }
    if matches!(
        req.hdr.opcode,
        OP_ALLOC | OP_FREE | OP_EXPORT | OP_UNEXPORT | OP_RESET
    ) {
        return false;
    }
    let faults = s.device.faults();
    if faults.stalled() || faults.model().enforce {
        return false;
    }
    command::bytes_moved(req.hdr, &req.bytes) <= max
}

/// Takes requests from command queue `q` (a virtqueue index; up to the in-flight limit):
/// small ones are executed and returned on the spot, the others handed to the DMA engines.
/// Runs on the vring thread after a kick or a poll that saw requests, and on an engine
/// after a completion when requests were left waiting.
pub(super) fn process_commands(
    s: &Arc<Session>,
    vrings: &[VringRwLock],
    q: usize,
    kicked: Option<Instant>,
) {
    let Some(k) = cmd_queue_of(q).filter(|&k| k < s.in_flight.len()) else {
        return;
    };
    let Some(vring) = vrings.get(q) else { return };
    let Some(table) = s.memory() else { return };
    let snapshot: &GuestMemoryMmap = &table.mem;
    let event_idx = s.event_idx.load(Ordering::Relaxed);
    let mut rearm = ring::Rearm::default();
    let mut kicked = kicked;
    loop {
        let taken = {
            let mut state = vring.get_mut();
            // Nothing is written to a ring that is not set up (its addresses are not the
            // driver's) or to any ring once the session has ended.
            if s.ended.load(Ordering::Acquire) || !state.get_queue().ready() {
                return;
            }
            let _ = state.get_queue_mut().disable_notification(snapshot);
            s.adopt_ring(q, &mut state, snapshot);
            if state.get_queue().size() as usize > ring::journal::capacity(q) {
                s.device.reject(format_args!(
                    "command queue {q}: a ring of {} entries is larger than the journal \
                     holds for it ({}); not served",
                    state.get_queue().size(),
                    ring::journal::capacity(q)
                ));
                return;
            }
            let room =
                (s.queue_size as usize).saturating_sub(s.in_flight[k].load(Ordering::Acquire));
            if room == 0 {
                // A completion calls us again.
                return;
            }
            let mut inline = Vec::new();
            // Submitted under the vring lock, so that a queue stop (which takes the lock
            // first) always sees them in flight.
            let queue = state.get_queue_mut();
            let n = match ring::take(queue, snapshot, s.journal(), q, room, |mut req, origin| {
                if let Some(t) = kicked.take() {
                    s.device.stages().record(Stage::Pickup, req.taken - t);
                }
                // Faults are counted in ring order, whatever order the engines run in.
                if req.error.is_none() {
                    req.fault = s.device.faults().decide(req.hdr.opcode);
                }
                if runs_inline(s, &req) {
                    // Counted with the engines' work: a fence taken after it waits for it.
                    inline.push((req, origin, s.dispatcher.ticket()));
                } else {
                    submit(s, req, origin, vrings, table.clone(), q);
                }
            }) {
                Ok(n) => n,
                Err(ring::Error::NotReady) => return,
                Err(e) => {
                    s.device.reject(format_args!("{e}"));
                    return;
                }
            };
            if !inline.is_empty() {
                let stages = s.device.stages();
                for (req, origin, ticket) in inline {
                    let start = Instant::now();
                    stages.record(Stage::Queue, start - req.taken);
                    let written =
                        ring::answer(&s.device, snapshot, &req, origin, &s.cancel).written;
                    drop(ticket);
                    let done = Instant::now();
                    stages.record(Stage::Execute, done - start);
                    ring::publish(queue, snapshot, s.journal(), q, req.head, written);
                    stages.record(Stage::Publish, done.elapsed());
                }
                // One interrupt for the whole pass.
                if ring::needs_signal(queue, snapshot, event_idx) {
                    let _ = state.signal_used_queue();
                }
            }
            n
        };
        if s.device.has_events() {
            deliver_events(s, vrings, snapshot, event_idx);
        }
        let again = {
            let mut state = vring.get_mut();
            if s.ended.load(Ordering::Acquire) {
                // A successor may serve this ring already: not even its event index.
                break;
            }
            rearm.after_pass(state.get_queue_mut(), snapshot, taken)
        };
        match again {
            Ok(true) => continue,
            Ok(false) => break,
            Err(e) => {
                s.device.reject(format_args!("{e}"));
                break;
            }
        }
    }
}

/// Busy-polls the command queues after a pass (`--poll-us`): the driver is told it need not
/// kick (a kick is an exit to the hypervisor, costly under emulation), and requests it
/// posts meanwhile are taken as soon as they are seen. The window halves after each poll
/// that finds nothing, so an idle device stops polling soon after the last kick.
pub(super) fn busy_poll(s: &Arc<Session>, vrings: &[VringRwLock]) {
    let Some(table) = s.memory() else { return };
    let mem: &GuestMemoryMmap = &table.mem;
    let event_idx = s.event_idx.load(Ordering::Relaxed);
    let queues: Vec<usize> = (0..s.in_flight.len())
        .map(cmd_queue_index)
        .filter(|&q| q < vrings.len())
        .collect();
    loop {
        let window = s.poll_window.load(Ordering::Relaxed);
        if window == 0 || s.ended.load(Ordering::Acquire) {
            return;
        }
        for &q in &queues {
            suppress_kicks(&vrings[q], mem, event_idx);
        }
        let end = Instant::now() + Duration::from_micros(window);
        let mut found = false;
        while !found && Instant::now() < end {
            found = queues.iter().any(|&q| has_requests(s, vrings, q, mem));
            // Yields rather than spins: on a host with fewer cores than busy threads (the
            // guest's vCPUs among them) a poll that kept its core would delay the very
            // requests it waits for.
            std::thread::yield_now();
        }
        // Kicks are wanted again (process_commands re-arms the queue it serves).
        for &q in &queues {
            let mut state = vrings[q].get_mut();
            let queue = state.get_queue_mut();
            if queue.ready() {
                let _ = queue.enable_notification(mem);
            }
        }
        if !found {
            s.poll_window.store(window / 2, Ordering::Relaxed);
        }
        // What was found, or came as the window closed, is served now.
        for &q in &queues {
            if has_requests(s, vrings, q, mem) {
                process_commands(s, vrings, q, None);
            }
        }
    }
}

/// Tells the driver of ring `vring` that it need not notify: with EVENT_IDX the avail
/// event is put just behind the ring position (the driver kicks only when it crosses it),
/// else the used ring's no-notify flag.
fn suppress_kicks(vring: &VringRwLock, mem: &GuestMemoryMmap, event_idx: bool) {
    let mut state = vring.get_mut();
    let queue = state.get_queue_mut();
    if !queue.ready() {
        return;
    }
    if !event_idx {
        let _ = queue.disable_notification(mem);
        return;
    }
    let at = queue.used_ring() + 4 + 8 * queue.size() as u64;
    let _ = vm_memory::Bytes::write_obj(
        mem,
        queue.next_avail().wrapping_sub(1),
        vm_memory::GuestAddress(at),
    );
}

/// Whether the driver made requests available that can be taken now: not while the
/// queue holds as many as it may (a completion takes the next ones), else a backlog would
/// keep the poll spinning at full window.
fn has_requests(s: &Session, vrings: &[VringRwLock], q: usize, mem: &GuestMemoryMmap) -> bool {
    let full = cmd_queue_of(q)
        .and_then(|k| s.in_flight.get(k))
        .is_none_or(|n| n.load(Ordering::Acquire) >= s.queue_size as usize);
    if full {
        return false;
    }
    let state = vrings[q].get_ref();
    let queue = state.get_queue();
    queue.ready()
        && queue
            .avail_idx(mem, Ordering::Acquire)
            .is_ok_and(|i| i.0 != queue.next_avail())
}

fn submit(
    s: &Arc<Session>,
    req: ChainRequest,
    origin: Origin,
    vrings: &[VringRwLock],
    table: Arc<Table>,
    q: usize,
) {
    let Some(k) = cmd_queue_of(q) else { return };
    let fence = req.hdr.fenced();
    s.in_flight[k].fetch_add(1, Ordering::AcqRel);
    let generation = s.generation[k].load(Ordering::Acquire);
    let session = s.clone();
    let vrings: Vec<VringRwLock> = vrings.to_vec();
    let queued = s.dispatcher.submit(fence, move || {
        let taken = Taken(&session.in_flight[k]);
        complete(&session, &vrings, &table.mem, req, origin, q, generation);
        let before = taken.done();
        if before >= session.queue_size as usize {
            // We were at the limit: requests may be waiting in the ring.
            process_commands(&session, &vrings, q, None);
        }
    });
    if !queued {
        s.in_flight[k].fetch_sub(1, Ordering::AcqRel);
        log::error!("DMA engines stopped; request dropped");
    }
}

/// A request counted in its queue's `in_flight` until it is done, or dropped when its
/// execution panicked (a bug the engine survives): a stop must not wait for it in vain.
struct Taken<'a>(&'a AtomicUsize);

impl Taken<'_> {
    /// Counts the request out; returns the count before.
    fn done(self) -> usize {
        let before = self.0.fetch_sub(1, Ordering::AcqRel);
        std::mem::forget(self);
        before
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs on a DMA engine: executes the request, writes the reply, returns the chain.
fn complete(
    s: &Session,
    vrings: &[VringRwLock],
    mem: &GuestMemoryMmap,
    req: ChainRequest,
    origin: Origin,
    q: usize,
    generation: u64,
) {
    let stages = s.device.stages();
    let start = Instant::now();
    stages.record(Stage::Queue, start - req.taken);
    let written = ring::answer(&s.device, mem, &req, origin, &s.cancel).written;
    let done = Instant::now();
    stages.record(Stage::Execute, done - start);
    if s.poisoned.load(Ordering::Acquire) {
        // A refused table ended guest-memory access; the ring is not touched either.
        return;
    }
    let event_idx = s.event_idx.load(Ordering::Relaxed);
    let signal = {
        let mut state = vrings[q].get_mut();
        // Under the ring's lock: a stop that gave up waiting for us bumps the generation
        // before the ring is set up anew, so a late answer is never written to a new ring.
        // (A ring being stopped is no longer ready but still takes the answers of what
        // it had handed out: the stop waits for them.)
        let current = cmd_queue_of(q).and_then(|k| s.generation.get(k));
        if current.map(|g| g.load(Ordering::Acquire)) != Some(generation)
            || s.ended.load(Ordering::Acquire)
        {
            log::warn!(
                "request (head {}) finished after the front-end stopped queue {q} or the \
                 session ended; not returned",
                req.head
            );
            return;
        }
        let queue = state.get_queue_mut();
        if !ring::publish(queue, mem, s.journal(), q, req.head, written) {
            return;
        }
        ring::needs_signal(queue, mem, event_idx)
    };
    stages.record(Stage::Publish, done.elapsed());
    // Outside the ring's lock: the wake-up may put this thread aside for a while, and the
    // ring thread must not wait for it meanwhile.
    if signal {
        let _ = vrings[q].signal_used_queue();
    }
    if s.device.has_events() {
        deliver_events(s, vrings, mem, event_idx);
    }
}

/// Moves pending device events into buffers the driver posted on the event queue.
pub(super) fn deliver_events(
    s: &Session,
    vrings: &[VringRwLock],
    mem: &GuestMemoryMmap,
    event_idx: bool,
) {
    let Some(vring) = vrings.get(QUEUE_EVENT) else {
        return;
    };
    let mut state = vring.get_mut();
    if s.ended.load(Ordering::Acquire) || !state.get_queue().ready() {
        // Events wait in the device until the event queue runs.
        return;
    }
    s.adopt_ring(QUEUE_EVENT, &mut state, mem);
    let queue = state.get_queue_mut();
    if ring::deliver_events(queue, mem, &s.device) && ring::needs_signal(queue, mem, event_idx) {
        let _ = state.signal_used_queue();
    }
    // Ask to be kicked when the driver posts more buffers (with EVENT_IDX this publishes
    // avail_event; without it, it clears the no-notify flag).
    let _ = state.get_queue_mut().enable_notification(mem);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_counted_out_once_whether_done_or_panicking() {
        let n = AtomicUsize::new(2);
        assert_eq!(Taken(&n).done(), 2);
        assert_eq!(n.load(Ordering::Acquire), 1);
        let panicked = std::panic::catch_unwind(|| {
            let _taken = Taken(&n);
            panic!("a bug in a command");
        });
        assert!(panicked.is_err());
        assert_eq!(n.load(Ordering::Acquire), 0);
    }
}
