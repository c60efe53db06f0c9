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

use crate::device::stages::Stage;
use crate::protocol::QUEUE_EVENT;
use crate::ring::{self, CmdQueue, Taken};

use super::{Session, Table};

/// Serves command queue `cq` after a kick (or a poll that saw requests, or an engine
/// that finished while requests waited): takes requests up to the in-flight limit, hands
/// those that do not run inline to the DMA engines at once, then runs the inline ones
/// and returns them, with one interrupt for the pass; again until the ring stays empty.
pub(super) fn process_commands(
    s: &Arc<Session>,
    vrings: &[VringRwLock],
    cq: CmdQueue,
    kicked: Option<Instant>,
) {
    let Some(vring) = vrings.get(cq.vq) else {
        return;
    };
    let Some(table) = s.memory() else { return };
    let mem: &GuestMemoryMmap = &table.mem;
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
            let _ = state.get_queue_mut().disable_notification(mem);
            s.adopt_ring(cq.vq, &mut state, mem);
            let size = state.get_queue().size() as usize;
            if size > ring::journal::capacity(cq.vq) {
                s.device.reject(format_args!(
                    "command queue {}: a ring of {size} entries is larger than the \
                     journal holds for it ({}); not served",
                    cq.vq,
                    ring::journal::capacity(cq.vq)
                ));
                return;
            }
            let room =
                (s.queue_size as usize).saturating_sub(s.in_flight[cq.k].load(Ordering::Acquire));
            if room == 0 {
                // A completion calls us again.
                return;
            }
            let queue = state.get_queue_mut();
            let requests = match ring::take(queue, mem, &s.device, s.journal(), cq, room) {
                Ok(r) => r,
                Err(ring::Error::NotReady) => return,
                Err(e) => {
                    s.device.reject(format_args!("{e}"));
                    return;
                }
            };
            let n = requests.len();
            if let (Some(t), Some(first)) = (kicked.take(), requests.first()) {
                s.device.stages().record(Stage::Pickup, first.req.taken - t);
            }
            let mut inline = Vec::new();
            for t in requests {
                if t.req.admission.inline {
                    // Counted with the engines' work: a fence taken after it waits for it.
                    inline.push((t, s.dispatcher.ticket()));
                } else {
                    // Under the vring lock, so that a queue stop (which takes the lock
                    // first) always sees it in flight.
                    submit(s, vrings, table.clone(), cq, t);
                }
            }
            if !inline.is_empty() {
                for (t, ticket) in inline {
                    let answered = execute(s, mem, &t);
                    drop(ticket);
                    return_answer(s, queue, mem, cq, t.req.head, answered);
                }
                if ring::needs_signal(queue, mem, event_idx) {
                    let _ = state.signal_used_queue();
                }
            }
            n
        };
        if s.device.has_events() {
            deliver_events(s, vrings, mem, event_idx);
        }
        let again = {
            let mut state = vring.get_mut();
            if s.ended.load(Ordering::Acquire) {
                // A successor may serve this ring already: not even its event index.
                break;
            }
            rearm.after_pass(state.get_queue_mut(), mem, taken)
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

/// Hands a request to the DMA engines; the engine executes it and returns it to its ring
/// ([`complete`]), and serves the queue again if requests were left waiting for room.
fn submit(s: &Arc<Session>, vrings: &[VringRwLock], table: Arc<Table>, cq: CmdQueue, t: Taken) {
    let fence = t.req.hdr.fenced();
    s.in_flight[cq.k].fetch_add(1, Ordering::AcqRel);
    let generation = s.generation[cq.k].load(Ordering::Acquire);
    let session = s.clone();
    let vrings: Vec<VringRwLock> = vrings.to_vec();
    let queued = s.dispatcher.submit(fence, move || {
        let counted = InFlight(&session.in_flight[cq.k]);
        complete(&session, &vrings, &table.mem, cq, generation, t);
        if counted.done() >= session.queue_size as usize {
            // We were at the limit: requests may be waiting in the ring.
            process_commands(&session, &vrings, cq, None);
        }
    });
    if !queued {
        s.in_flight[cq.k].fetch_sub(1, Ordering::AcqRel);
        log::error!("DMA engines stopped; request dropped");
    }
}

/// A request counted in its queue's `in_flight` until it is done, or dropped when its
/// execution panicked (a bug the engine survives): a stop must not wait for it in vain.
struct InFlight<'a>(&'a AtomicUsize);

impl InFlight<'_> {
    /// Counts the request out; returns the count before.
    fn done(self) -> usize {
        let before = self.0.fetch_sub(1, Ordering::AcqRel);
        std::mem::forget(self);
        before
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// On a DMA engine: executes the request and returns it to its ring, unless the ring was
/// stopped meanwhile; signals the driver outside the ring's lock.
fn complete(
    s: &Session,
    vrings: &[VringRwLock],
    mem: &GuestMemoryMmap,
    cq: CmdQueue,
    generation: u64,
    t: Taken,
) {
    let answered = execute(s, mem, &t);
    if s.poisoned.load(Ordering::Acquire) {
        // A refused table ended guest-memory access; the ring is not touched either.
        return;
    }
    let event_idx = s.event_idx.load(Ordering::Relaxed);
    let signal = {
        let mut state = vrings[cq.vq].get_mut();
        // Under the ring's lock: a stop that gave up waiting for us bumps the generation
        // before the ring is set up anew, so a late answer is never written to a new ring.
        // (A ring being stopped is no longer ready but still takes the answers of what
        // it had handed out: the stop waits for them.)
        if s.generation[cq.k].load(Ordering::Acquire) != generation
            || s.ended.load(Ordering::Acquire)
        {
            log::warn!(
                "request (head {}) finished after the front-end stopped queue {} or the \
                 session ended; not returned",
                t.req.head,
                cq.vq
            );
            return;
        }
        let queue = state.get_queue_mut();
        return_answer(s, queue, mem, cq, t.req.head, answered)
            && ring::needs_signal(queue, mem, event_idx)
    };
    // Outside the ring's lock: the wake-up may put this thread aside for a while, and the
    // ring thread must not wait for it meanwhile.
    if signal {
        let _ = vrings[cq.vq].signal_used_queue();
    }
    if s.device.has_events() {
        deliver_events(s, vrings, mem, event_idx);
    }
}

/// A request executed and answered in guest memory, not yet returned to its ring.
struct Answered {
    written: u32,
    at: Instant,
}

/// Executes a request and writes its answer (inline or on an engine alike), timing the
/// wait before it and the execution.
fn execute(s: &Session, mem: &GuestMemoryMmap, t: &Taken) -> Answered {
    let stages = s.device.stages();
    let start = Instant::now();
    stages.record(Stage::Queue, start - t.req.taken);
    let written = ring::answer(&s.device, mem, &t.req, t.origin, &s.cancel).written;
    let at = Instant::now();
    stages.record(Stage::Execute, at - start);
    Answered { written, at }
}

/// Returns an answered request to its ring (the ring's lock held); false when the used
/// ring cannot take it.
fn return_answer(
    s: &Session,
    queue: &mut virtio_queue::Queue,
    mem: &GuestMemoryMmap,
    cq: CmdQueue,
    head: u16,
    answered: Answered,
) -> bool {
    let ok = ring::publish(queue, mem, s.journal(), cq.vq, head, answered.written);
    s.device
        .stages()
        .record(Stage::Publish, answered.at.elapsed());
    ok
}

/// Busy-polls the command queues after a pass (`--poll-us`): the driver is told it need not
/// kick (a kick is an exit to the hypervisor, costly under emulation), and requests it
/// posts meanwhile are taken as soon as they are seen. The window halves after each poll
/// that finds nothing, so an idle device stops polling soon after the last kick.
pub(super) fn busy_poll(s: &Arc<Session>, vrings: &[VringRwLock]) {
    let Some(table) = s.memory() else { return };
    let mem: &GuestMemoryMmap = &table.mem;
    let event_idx = s.event_idx.load(Ordering::Relaxed);
    let queues: Vec<CmdQueue> = CmdQueue::all(s.in_flight.len())
        .filter(|cq| cq.vq < vrings.len())
        .collect();
    loop {
        let window = s.poll_window.load(Ordering::Relaxed);
        if window == 0 || s.ended.load(Ordering::Acquire) {
            return;
        }
        for cq in &queues {
            suppress_kicks(&vrings[cq.vq], mem, event_idx);
        }
        let end = Instant::now() + Duration::from_micros(window);
        let mut found = false;
        while !found && Instant::now() < end {
            found = queues.iter().any(|&cq| has_requests(s, vrings, cq, mem));
            // Yields rather than spins: on a host with fewer cores than busy threads (the
            // guest's vCPUs among them) a poll that kept its core would delay the very
            // requests it waits for.
            std::thread::yield_now();
        }
        // Kicks are wanted again (process_commands re-arms the queue it serves).
        for cq in &queues {
            let mut state = vrings[cq.vq].get_mut();
            let queue = state.get_queue_mut();
            if queue.ready() {
                let _ = queue.enable_notification(mem);
            }
        }
        if !found {
            s.poll_window.store(window / 2, Ordering::Relaxed);
        }
        // What was found, or came as the window closed, is served now.
        for &cq in &queues {
            if has_requests(s, vrings, cq, mem) {
                process_commands(s, vrings, cq, None);
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
fn has_requests(s: &Session, vrings: &[VringRwLock], cq: CmdQueue, mem: &GuestMemoryMmap) -> bool {
    if s.in_flight[cq.k].load(Ordering::Acquire) >= s.queue_size as usize {
        return false;
    }
    let state = vrings[cq.vq].get_ref();
    let queue = state.get_queue();
    queue.ready()
        && queue
            .avail_idx(mem, Ordering::Acquire)
            .is_ok_and(|i| i.0 != queue.next_avail())
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
        assert_eq!(InFlight(&n).done(), 2);
        assert_eq!(n.load(Ordering::Acquire), 1);
        let panicked = std::panic::catch_unwind(|| {
            let _counted = InFlight(&n);
            panic!("a bug in a command");
        });
        assert!(panicked.is_err());
        assert_eq!(n.load(Ordering::Acquire), 0);
    }
}
