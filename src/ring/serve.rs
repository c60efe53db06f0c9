// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Serving a device's queues, whatever the transport: a kick (or a poll, or an engine
//! that finished while requests waited) makes a pass over a command queue, which takes
//! requests up to the in-flight limit, hands those that do not run inline to the DMA
//! engines, runs the inline ones and returns them; the event queue is filled with the
//! device's events. A transport (vhost-user, vfio-user) gives its rings through [`Rings`]
//! and its session's memory through [`Memory`], and calls [`Queues::serve`] when a
//! command queue is kicked.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::journal::Journal;
use super::{CmdQueue, Rearm, Taken};
use crate::device::dispatch::Dispatcher;
use crate::device::stages::Stage;
use crate::device::Device;
use crate::host::sigbus;
use crate::protocol::QUEUE_EVENT;

/// A transport's rings: locked one at a time, and an interrupt for each.
pub trait Rings: Clone + Send + Sync + 'static {
    /// Runs `f` on ring `vq` with it locked (None when there is no such ring).
    fn locked<T>(&self, vq: usize, f: impl FnOnce(&mut Queue) -> T) -> Option<T>;
    /// Interrupts the driver for ring `vq` (never called with the ring locked).
    fn signal(&self, vq: usize);
    /// First look at ring `vq` since it started (its lock held): a transport that
    /// resumes rings from the journal does it here. Whether to interrupt the driver.
    fn first_use(&self, _vq: usize, _queue: &mut Queue, _mem: &GuestMemoryMmap) -> bool {
        false
    }
}

/// Guest memory as a session uses it: its mappings are registered for SIGBUS recovery
/// (see `host/sigbus.rs`) for as long as anything, such as a running command, holds it.
/// All guest-memory access, rings included, goes through one of these.
pub struct Memory {
    _guards: Vec<sigbus::Guard>,
    pub mem: Arc<GuestMemoryMmap>,
}

impl Memory {
    pub fn new(mem: Arc<GuestMemoryMmap>) -> io::Result<Memory> {
        let mut guards = Vec::new();
        for region in mem.iter() {
            let Some(fo) = region.file_offset() else {
                continue;
            };
            let g = sigbus::register(
                region.as_ptr(),
                region.len() as usize,
                fo.file().as_raw_fd(),
            )
            .map_err(io::Error::other)?;
            guards.push(g);
        }
        Ok(Memory {
            _guards: guards,
            mem,
        })
    }
}

/// The serving state of one session (one front-end connection) of a device.
pub struct Queues {
    pub device: Arc<Device>,
    pub dispatcher: Arc<Dispatcher>,
    /// The current guest memory (None until the front-end gave it).
    mem: Mutex<Option<Arc<Memory>>>,
    /// The most requests held at once per command queue; rings may be larger.
    pub queue_size: u16,
    pub event_idx: AtomicBool,
    /// Per command queue: requests taken and not yet returned, never more than the queue
    /// size, so a guest cannot make the daemon buffer without bound.
    in_flight: Vec<AtomicUsize>,
    /// Per command queue: bumped when the front-end stops it, so completions of requests
    /// taken before that are not written to a ring that may have been reset or moved.
    generation: Vec<AtomicU64>,
    /// Busy-poll: how long the next poll of the command queues may last (microseconds);
    /// a kick sets it to the configured time, a poll that finds nothing halves it.
    poll_window: AtomicU64,
    /// Set while the front-end stops a command queue (and once the session ended):
    /// commands running or queued end early with INTERRUPTED, so a stop takes
    /// milliseconds, not as long as 256 1-GiB copies.
    pub cancel: AtomicBool,
    /// The memory was refused: guest memory is not touched again in this session.
    poisoned: AtomicBool,
    /// The session is over: no ring is served or written any more (a successor may be
    /// serving the same rings already).
    ended: AtomicBool,
}

impl Queues {
    pub fn new(device: Arc<Device>, dispatcher: Arc<Dispatcher>, queue_size: u16) -> Queues {
        let n = device.cmd_queues();
        Queues {
            device,
            dispatcher,
            mem: Mutex::new(None),
            queue_size,
            event_idx: AtomicBool::new(false),
            in_flight: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            generation: (0..n).map(|_| AtomicU64::new(0)).collect(),
            poll_window: AtomicU64::new(0),
            cancel: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        }
    }

    /// The command queue virtqueue `vq` is, if it is one of the device's.
    pub fn cmd_queue(&self, vq: usize) -> Option<CmdQueue> {
        CmdQueue::of(vq, self.in_flight.len())
    }

    /// The guest memory in use, unless it was refused.
    pub fn memory(&self) -> Option<Arc<Memory>> {
        if self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        self.mem.lock().ok()?.clone()
    }

    /// New guest memory from the front-end (kept also when refused: the front-end may
    /// still reach it).
    pub fn set_memory(&self, mem: Arc<Memory>) {
        if let Ok(mut m) = self.mem.lock() {
            *m = Some(mem);
        }
    }

    /// The front-end's memory was refused: guest memory is not touched again.
    pub fn refuse_memory(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// The session is over: commands still running or queued end early (INTERRUPTED),
    /// nothing more is taken from the rings and no answer is written to them.
    pub fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.cancel.store(true, Ordering::Release);
        for g in &self.generation {
            g.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The front-end stops command queue `cq`: what runs is cut short and returned
    /// INTERRUPTED (on every queue: the engines are shared; the other rings still take
    /// their answers), up to `timeout`; whatever finishes later is not written to the
    /// stopped (maybe reused) ring. False when requests were still running.
    pub fn stop(&self, cq: CmdQueue, timeout: Duration) -> bool {
        self.cancel.store(true, Ordering::Release);
        let idle = self.wait_idle(cq, timeout);
        if !idle {
            log::warn!(
                "{} commands of queue {} still running when the front-end stopped it; their \
                 answers are dropped",
                self.in_flight[cq.k].load(Ordering::Acquire),
                cq.vq
            );
        }
        self.generation[cq.k].fetch_add(1, Ordering::AcqRel);
        self.cancel.store(false, Ordering::Release);
        idle
    }

    /// Waits until `cq` has no request taken and unanswered (the other queues may stay
    /// busy), up to `timeout`; true when it is idle.
    fn wait_idle(&self, cq: CmdQueue, timeout: Duration) -> bool {
        let n = &self.in_flight[cq.k];
        let end = Instant::now() + timeout;
        while n.load(Ordering::Acquire) > 0 {
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        true
    }

    /// A kick: serve `cq`, then busy-poll all command queues for up to `poll_us`.
    pub fn kicked<R: Rings>(self: &Arc<Self>, rings: &R, cq: CmdQueue, poll_us: u64) {
        self.serve(rings, cq, Some(Instant::now()));
        if poll_us > 0 {
            self.poll_window.store(poll_us, Ordering::Relaxed);
            self.busy_poll(rings);
        }
    }

    /// Serves command queue `cq`: takes requests up to the in-flight limit, hands those
    /// that do not run inline to the DMA engines at once, then runs the inline ones and
    /// returns them, with one interrupt for the pass; again until the ring stays empty.
    pub fn serve<R: Rings>(self: &Arc<Self>, rings: &R, cq: CmdQueue, kicked: Option<Instant>) {
        let Some(table) = self.memory() else { return };
        let mem: &GuestMemoryMmap = &table.mem;
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        let mut rearm = Rearm::default();
        let mut kicked = kicked;
        loop {
            let pass = rings.locked(cq.vq, |queue| {
                self.pass(rings, &table, queue, cq, &mut kicked, event_idx)
            });
            let Some(Some((taken, signal))) = pass else {
                return;
            };
            if signal {
                rings.signal(cq.vq);
            }
            if self.device.has_events() {
                self.deliver_events(rings, mem);
            }
            let again = rings.locked(cq.vq, |queue| {
                if self.ended() {
                    // A successor may serve this ring already: not even its event index.
                    return Ok(false);
                }
                rearm.after_pass(queue, mem, taken)
            });
            match again {
                Some(Ok(true)) => continue,
                Some(Ok(false)) | None => break,
                Some(Err(e)) => {
                    self.device.reject(format_args!("{e}"));
                    break;
                }
            }
        }
    }

    /// One pass over a locked command queue: how many requests were taken, and whether
    /// the driver wants an interrupt for those answered inline. None: not served.
    fn pass<R: Rings>(
        self: &Arc<Self>,
        rings: &R,
        table: &Arc<Memory>,
        queue: &mut Queue,
        cq: CmdQueue,
        kicked: &mut Option<Instant>,
        event_idx: bool,
    ) -> Option<(usize, bool)> {
        let mem: &GuestMemoryMmap = &table.mem;
        // Nothing is written to a ring that is not set up (its addresses are not the
        // driver's) or to any ring once the session has ended.
        if self.ended() || !queue.ready() {
            return None;
        }
        let _ = queue.disable_notification(mem);
        let mut signal = rings.first_use(cq.vq, queue, mem);
        let size = queue.size() as usize;
        if size > super::journal::capacity(cq.vq) {
            self.device.reject(format_args!(
                "command queue {}: a ring of {size} entries is larger than the journal \
                 holds for it ({}); not served",
                cq.vq,
                super::journal::capacity(cq.vq)
            ));
            return None;
        }
        let room =
            (self.queue_size as usize).saturating_sub(self.in_flight[cq.k].load(Ordering::Acquire));
        if room == 0 {
            // A completion serves the queue again.
            return None;
        }
        let journal = Journal::of(self.device.state());
        let requests = match super::take(queue, mem, &self.device, journal, cq, room) {
            Ok(r) => r,
            Err(super::Error::NotReady) => return None,
            Err(e) => {
                self.device.reject(format_args!("{e}"));
                return None;
            }
        };
        let n = requests.len();
        if let (Some(t), Some(first)) = (kicked.take(), requests.first()) {
            self.device
                .stages()
                .record(Stage::Pickup, first.req.taken - t);
        }
        let mut inline = Vec::new();
        for t in requests {
            if t.req.admission.inline {
                // Counted with the engines' work: a fence taken after it waits for it.
                inline.push((t, self.dispatcher.ticket()));
            } else {
                // With the ring locked, so that a queue stop (which takes the lock first)
                // always sees it in flight.
                self.submit(rings, table.clone(), cq, t);
            }
        }
        if !inline.is_empty() {
            for (t, ticket) in inline {
                let answered = self.execute(mem, &t);
                drop(ticket);
                self.return_answer(queue, mem, cq, t.req.head, answered);
            }
            signal |= super::needs_signal(queue, mem, event_idx);
        }
        Some((n, signal))
    }

    /// Hands a request to the DMA engines; the engine executes it and returns it to its
    /// ring ([`Queues::complete`]), and serves the queue again if requests were left
    /// waiting for room.
    fn submit<R: Rings>(self: &Arc<Self>, rings: &R, table: Arc<Memory>, cq: CmdQueue, t: Taken) {
        let fence = t.req.hdr.fenced();
        self.in_flight[cq.k].fetch_add(1, Ordering::AcqRel);
        let generation = self.generation[cq.k].load(Ordering::Acquire);
        let me = self.clone();
        let rings = rings.clone();
        let queued = self.dispatcher.submit(fence, move || {
            let counted = InFlight(&me.in_flight[cq.k]);
            me.complete(&rings, &table.mem, cq, generation, t);
            if counted.done() >= me.queue_size as usize {
                // We were at the limit: requests may be waiting in the ring.
                me.serve(&rings, cq, None);
            }
        });
        if !queued {
            self.in_flight[cq.k].fetch_sub(1, Ordering::AcqRel);
            log::error!("DMA engines stopped; request dropped");
        }
    }

    /// On a DMA engine: executes the request and returns it to its ring, unless the ring
    /// was stopped meanwhile; signals the driver outside the ring's lock.
    fn complete<R: Rings>(
        &self,
        rings: &R,
        mem: &GuestMemoryMmap,
        cq: CmdQueue,
        generation: u64,
        t: Taken,
    ) {
        let answered = self.execute(mem, &t);
        if self.poisoned.load(Ordering::Acquire) {
            // Refused memory ended guest-memory access; the ring is not touched either.
            return;
        }
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        let signal = rings.locked(cq.vq, |queue| {
            // Under the ring's lock: a stop that gave up waiting for us bumps the
            // generation before the ring is set up anew, so a late answer is never
            // written to a new ring. (A ring being stopped is no longer ready but still
            // takes the answers of what it had handed out: the stop waits for them.)
            if self.generation[cq.k].load(Ordering::Acquire) != generation || self.ended() {
                log::warn!(
                    "request (head {}) finished after the front-end stopped queue {} or the \
                     session ended; not returned",
                    t.req.head,
                    cq.vq
                );
                return false;
            }
            self.return_answer(queue, mem, cq, t.req.head, answered)
                && super::needs_signal(queue, mem, event_idx)
        });
        // Outside the ring's lock: the wake-up may put this thread aside for a while, and
        // the ring thread must not wait for it meanwhile.
        if signal == Some(true) {
            rings.signal(cq.vq);
        }
        if self.device.has_events() {
            self.deliver_events(rings, mem);
        }
    }

    /// Executes a request and writes its answer (inline or on an engine alike), timing
    /// the wait before it and the execution.
    fn execute(&self, mem: &GuestMemoryMmap, t: &Taken) -> Answered {
        let stages = self.device.stages();
        let start = Instant::now();
        stages.record(Stage::Queue, start - t.req.taken);
        let written = super::answer(&self.device, mem, &t.req, t.origin, &self.cancel).written;
        let at = Instant::now();
        stages.record(Stage::Execute, at - start);
        Answered { written, at }
    }

    /// Returns an answered request to its ring (the ring's lock held); false when the
    /// used ring cannot take it.
    fn return_answer(
        &self,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        cq: CmdQueue,
        head: u16,
        answered: Answered,
    ) -> bool {
        let journal = Journal::of(self.device.state());
        let ok = super::publish(queue, mem, journal, cq.vq, head, answered.written);
        self.device
            .stages()
            .record(Stage::Publish, answered.at.elapsed());
        ok
    }

    /// Busy-polls the command queues after a pass (`--poll-us`): the driver is told it
    /// need not kick (a kick is an exit to the hypervisor, costly under emulation), and
    /// requests it posts meanwhile are taken as soon as they are seen. The window halves
    /// after each poll that finds nothing, so an idle device stops polling soon after the
    /// last kick.
    pub fn busy_poll<R: Rings>(self: &Arc<Self>, rings: &R) {
        let Some(table) = self.memory() else { return };
        let mem: &GuestMemoryMmap = &table.mem;
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        let queues: Vec<CmdQueue> = CmdQueue::all(self.in_flight.len()).collect();
        loop {
            let window = self.poll_window.load(Ordering::Relaxed);
            if window == 0 || self.ended() {
                return;
            }
            for cq in &queues {
                rings.locked(cq.vq, |queue| suppress_kicks(queue, mem, event_idx));
            }
            let end = Instant::now() + Duration::from_micros(window);
            let mut found = false;
            while !found && Instant::now() < end {
                found = queues.iter().any(|&cq| self.has_requests(rings, cq, mem));
                // Yields rather than spins: on a host with fewer cores than busy threads
                // (the guest's vCPUs among them) a poll that kept its core would delay the
                // very requests it waits for.
                std::thread::yield_now();
            }
            // Kicks are wanted again (a pass re-arms the queue it serves).
            for cq in &queues {
                rings.locked(cq.vq, |queue| {
                    if queue.ready() {
                        let _ = queue.enable_notification(mem);
                    }
                });
            }
            if !found {
                self.poll_window.store(window / 2, Ordering::Relaxed);
            }
            // What was found, or came as the window closed, is served now.
            for &cq in &queues {
                if self.has_requests(rings, cq, mem) {
                    self.serve(rings, cq, None);
                }
            }
        }
    }

    /// Whether the driver made requests available that can be taken now: not while the
    /// queue holds as many as it may (a completion takes the next ones), else a backlog
    /// would keep the poll spinning at full window.
    fn has_requests<R: Rings>(&self, rings: &R, cq: CmdQueue, mem: &GuestMemoryMmap) -> bool {
        if self.in_flight[cq.k].load(Ordering::Acquire) >= self.queue_size as usize {
            return false;
        }
        rings
            .locked(cq.vq, |queue| {
                queue.ready()
                    && queue
                        .avail_idx(mem, Ordering::Acquire)
                        .is_ok_and(|i| i.0 != queue.next_avail())
            })
            .unwrap_or(false)
    }

    /// Moves pending device events into buffers the driver posted on the event queue.
    pub fn deliver_events<R: Rings>(&self, rings: &R, mem: &GuestMemoryMmap) {
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        let signal = rings.locked(QUEUE_EVENT, |queue| {
            if self.ended() || !queue.ready() {
                // Events wait in the device until the event queue runs.
                return false;
            }
            let mut signal = rings.first_use(QUEUE_EVENT, queue, mem);
            if super::deliver_events(queue, mem, &self.device) {
                signal |= super::needs_signal(queue, mem, event_idx);
            }
            // Ask to be kicked when the driver posts more buffers (with EVENT_IDX this
            // publishes avail_event; without it, it clears the no-notify flag).
            let _ = queue.enable_notification(mem);
            signal
        });
        if signal == Some(true) {
            rings.signal(QUEUE_EVENT);
        }
    }
}

/// Tells the driver of a ring that it need not notify: with EVENT_IDX the avail event is
/// put just behind the ring position (the driver kicks only when it crosses it), else
/// the used ring's no-notify flag.
fn suppress_kicks(queue: &mut Queue, mem: &GuestMemoryMmap, event_idx: bool) {
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

/// A request executed and answered in guest memory, not yet returned to its ring.
struct Answered {
    written: u32,
    at: Instant,
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
