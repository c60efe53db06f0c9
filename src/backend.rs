//! vhost-user adapter: turns descriptor chains into requests for the device model and
//! delivers replies and events. Everything guest-specific is validated here or in the model.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    VhostUserMMap, VhostUserMMapFlags, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{
    ByteValued, Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend,
    GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::device::{Attach, Device, ExportSink, RateLimitedLog, Reply};
use crate::dispatch::Dispatcher;
use crate::protocol::{
    CmdHdr, Resp, Status, EVENT_ERROR, FLAG_FENCE, MAX_REQUEST, NUM_QUEUES, OP_FENCE, QUEUE_CMD,
    QUEUE_EVENT, SHM_ID_DEVMEM,
};
use crate::sigbus;
use crate::state::{interrupted, Origin, Outcome, RingId, StateFile};
use std::os::fd::AsRawFd;

type Mem = GuestMemoryAtomic<GuestMemoryMmap>;

/// Shared-memory attach: how long a map request may go without our memory showing up in
/// the memory table before it is sent again.
const MAP_RETRY: Duration = Duration::from_secs(1);

/// How long GET_VRING_BASE waits for commands in flight, once told to stop, before giving
/// up on them (they stop within microseconds: the engines look at the flag between
/// steps of at most 1 MiB or 4096 atomic operations).
const STOP_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A memory table as the session uses it: its mappings are registered for SIGBUS recovery
/// (see `sigbus.rs`) for as long as anything, such as a running command, holds it. All
/// guest-memory access, rings included, goes through one of these, never through the
/// vhost crate's current table, which it replaces before we have seen (and registered) it.
pub struct Table {
    _guards: Vec<sigbus::Guard>,
    mem: Arc<GuestMemoryMmap>,
}

impl Table {
    fn new(mem: Arc<GuestMemoryMmap>) -> io::Result<Table> {
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
        Ok(Table {
            _guards: guards,
            mem,
        })
    }
}

/// State shared by a session's vhost-user handler and the jobs it hands to the DMA engines.
struct Session {
    device: Arc<Device>,
    dispatcher: Arc<Dispatcher>,
    /// The current memory table (also when refused: the vhost crate still holds it).
    mem: Mutex<Option<Arc<Table>>>,
    /// The most requests held at once (`--queue-size`); rings may be larger.
    queue_size: u16,
    event_idx: AtomicBool,
    /// Requests taken from the command queue and not yet returned: never more than the
    /// queue size, so a guest cannot make the daemon buffer without bound.
    in_flight: AtomicUsize,
    /// Bumped when the front-end stops the command queue: completions of requests taken
    /// before that are not written to a ring that may have been reset or moved.
    generation: AtomicU64,
    /// Set while the front-end stops the command queue (and once the session ended):
    /// commands running or queued end early with INTERRUPTED, so a stop that QEMU waits
    /// for under its global lock takes milliseconds, not as long as 256 1-GiB copies.
    cancel: AtomicBool,
    /// The memory table was refused: guest memory is not touched again in this session.
    poisoned: AtomicBool,
    /// This session continues a connection whose previous daemon died: the rings carry on
    /// from the journal instead of from the front-end's set-up.
    resume: AtomicBool,
    /// Announces exports to the front-end (one per device, shared by its sessions).
    announcer: Arc<Announcer>,
    /// The rings the journal describes (None: not yet seen since the queue started).
    rings: Mutex<[Option<RingId>; NUM_QUEUES]>,
    /// A ring was enabled or kicked since the front-end last stopped the queues (the vhost
    /// crate calls handle_event for both): the device is started,
    /// the only time the front-end may be asked to map or unmap shared memory (QEMU 11.1
    /// crashes on a request for a stopped device).
    started: AtomicBool,
    /// Shared-memory attach: when the front-end was last asked to map device memory since
    /// the queues started.
    map_requested: Mutex<Option<Instant>>,
}

pub struct CxlBackend {
    s: Arc<Session>,
    /// Signalled when the device posts an event outside a command (the control channel's
    /// POISON, POISON_CLEARED): the epoll thread then delivers it (custom event EVENT_WAKE).
    wake: Option<vmm_sys_util::eventfd::EventFd>,
}

/// The epoll event of `CxlBackend::wake` (0..=NUM_QUEUES are the queues' and the exit's).
pub const EVENT_WAKE: u16 = NUM_QUEUES as u16 + 1;

impl CxlBackend {
    /// The fd to register for EVENT_WAKE, and the device's waker that signals it.
    pub fn event_waker(&self) -> Option<(std::os::fd::RawFd, Arc<dyn Fn() + Send + Sync>)> {
        let wake = self.wake.as_ref()?;
        let signal = wake.try_clone().ok()?;
        Some((
            wake.as_raw_fd(),
            Arc::new(move || {
                let _ = signal.write(1);
            }),
        ))
    }

    /// The session is over: commands still running or queued end early (INTERRUPTED).
    pub fn stop_commands(&self) {
        self.s.cancel.store(true, Ordering::Release);
    }

    pub fn new(
        device: Arc<Device>,
        dispatcher: Arc<Dispatcher>,
        announcer: Arc<Announcer>,
        queue_size: u16,
    ) -> Self {
        Self::with_resume(device, dispatcher, announcer, queue_size, false)
    }

    /// `resume`: the front-end's connection outlived the previous daemon (a supervisor
    /// replays the set-up): take over the rings where the journal says they stood, answer
    /// what was in flight, and do not announce shared objects the front-end already has.
    pub fn with_resume(
        device: Arc<Device>,
        dispatcher: Arc<Dispatcher>,
        announcer: Arc<Announcer>,
        queue_size: u16,
        resume: bool,
    ) -> Self {
        if !resume {
            // Whatever an earlier daemon journaled belongs to rings that are gone.
            for q in 0..NUM_QUEUES {
                device.state().clear_ring(q);
            }
        }
        CxlBackend {
            s: Arc::new(Session {
                device,
                dispatcher,
                mem: Mutex::new(None),
                queue_size,
                event_idx: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                generation: AtomicU64::new(0),
                cancel: AtomicBool::new(false),
                poisoned: AtomicBool::new(false),
                resume: AtomicBool::new(resume),
                announcer,
                rings: Mutex::new([None; NUM_QUEUES]),
                started: AtomicBool::new(false),
                map_requested: Mutex::new(None),
            }),
            wake: vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).ok(),
        }
    }
}

fn ring_id(q: &virtio_queue::Queue) -> RingId {
    RingId {
        desc: q.desc_table(),
        avail: q.avail_ring(),
        used: q.used_ring(),
        size: q.size(),
    }
}

impl Session {
    fn journal(&self) -> &StateFile {
        self.device.state()
    }

    /// First use of ring `q` since it started: record it in the journal, or, when resuming
    /// after a crash, continue where the previous daemon stopped. Called with the ring
    /// locked.
    fn adopt_ring(
        &self,
        q: usize,
        state: &mut vhost_user_backend::VringState,
        mem: &GuestMemoryMmap,
    ) {
        let ring = ring_id(state.get_queue());
        let Ok(mut rings) = self.rings.lock() else {
            return;
        };
        if rings[q] == Some(ring) {
            return;
        }
        rings[q] = Some(ring);
        if !self.resume.load(Ordering::Acquire) {
            self.journal()
                .set_ring(q, ring, state.get_queue().next_avail());
            return;
        }
        let Ok(used) = state.get_queue().used_idx(mem, Ordering::Acquire) else {
            return;
        };
        if q == QUEUE_EVENT {
            // Event buffers are used as soon as they are taken: the used index is where
            // the previous daemon stood.
            let queue = state.get_queue_mut();
            queue.set_next_avail(used.0);
            queue.set_next_used(used.0);
            log::info!("event queue resumed at {}", used.0);
            return;
        }
        let next_avail = self
            .journal()
            .ring_position(q, ring)
            .unwrap_or(state.get_queue().next_avail());
        {
            let queue = state.get_queue_mut();
            queue.set_next_avail(next_avail);
            queue.set_next_used(used.0);
        }
        let pending = self.journal().pending(ring.size, next_avail);
        log::debug!("in flight at the restart: {pending:?}");
        let (mut answered, mut interrupted_n, mut republished) = (0, 0, 0);
        for p in &pending {
            let written = match p.outcome {
                Outcome::Completing { used_slot, written } => {
                    if published(mem, ring, used_slot, used.0, p.head) {
                        self.journal().release(p.head);
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
            publish(self, state, mem, p.head, written);
        }
        self.journal().set_ring(q, ring, next_avail);
        let _ = state.signal_used_queue();
        log::info!(
            "command queue resumed at {next_avail} (used {}): {answered} answered from the \
             journal, {interrupted_n} interrupted, {republished} republished",
            used.0
        );
    }
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

/// Returns a request to the driver, journaled so that a crash in between neither loses
/// nor duplicates it.
fn publish(
    s: &Session,
    state: &mut vhost_user_backend::VringState,
    mem: &GuestMemoryMmap,
    head: u16,
    written: u32,
) -> bool {
    let slot = state.get_queue().next_used();
    log::trace!("returned head {head} at used {slot}");
    s.journal().completing(head, slot, written);
    let ok = state.get_queue_mut().add_used(mem, head, written).is_ok();
    s.journal().release(head);
    ok
}

impl Session {
    fn memory(&self) -> Option<Arc<Table>> {
        if self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        self.mem.lock().ok()?.clone()
    }

    /// Shared-memory attach: the front-end drops its mapping of device memory at every
    /// device reset without telling us. So while the queues run and the memory table does
    /// not show our memory, ask for it; the backend-channel thread sends the request, as
    /// the front-end answers it only after this vhost-user message.
    fn ensure_mapped(&self) {
        if self.device.attach() != Attach::Shmem {
            return;
        }
        self.started.store(true, Ordering::Release);
        let size = self.device.devmem().size();
        if self.device.layout().devmem_gpa.is_some() {
            self.announcer.unmap_at_exit(size);
            return;
        }
        let Ok(mut last) = self.map_requested.lock() else {
            return;
        };
        if last.is_some_and(|t| t.elapsed() < MAP_RETRY) {
            return;
        }
        *last = Some(Instant::now());
        match self.device.devmem().file() {
            Ok(file) => self.announcer.send(Announce::Map { file, len: size }),
            Err(e) => log::error!("cannot hand device memory to the front-end: {e}"),
        }
    }
}

/// Takes requests from the command queue (up to the in-flight limit) and hands them to the
/// DMA engines. Runs on the vring thread after a kick, and on an engine after a completion
/// when requests were left waiting.
fn process_commands(s: &Arc<Session>, vrings: &[VringRwLock]) {
    let Some(table) = s.memory() else { return };
    let snapshot: &GuestMemoryMmap = &table.mem;
    let vring = &vrings[QUEUE_CMD];
    // Passes in a row that took nothing although the ring index showed more.
    let mut idle = 0;
    loop {
        let mut taken = 0;
        {
            let mut state = vring.get_mut();
            let _ = state.get_queue_mut().disable_notification(snapshot);
            s.adopt_ring(QUEUE_CMD, &mut state, snapshot);
            let room = (s.queue_size as usize).saturating_sub(s.in_flight.load(Ordering::Acquire));
            if room == 0 {
                // A completion calls us again.
                return;
            }
            let start = state.get_queue().next_avail();
            // The ring's own size, which the driver chose: it may exceed the queue size.
            let size = state.get_queue().size();
            let iter = match state.get_queue_mut().iter(snapshot) {
                Ok(it) => it,
                // Kicks may arrive before the queue is set up: nothing to do yet.
                Err(virtio_queue::Error::QueueNotReady) => return,
                Err(e) => {
                    s.device.reject(format_args!("command queue unusable: {e}"));
                    return;
                }
            };
            // Submitted under the vring lock, so that a queue stop (which takes the lock
            // first) always sees them in flight.
            for (k, chain) in iter.take(room).enumerate() {
                taken = k + 1;
                let req = ChainRequest::parse(&chain, snapshot);
                let origin = Origin {
                    head: req.head,
                    nonce: s.journal().next_nonce(),
                };
                log::trace!(
                    "took head {} tag {} at {}",
                    req.head,
                    req.tag(),
                    start.wrapping_add(k as u16)
                );
                // Before the request can take effect: a successor must know it was taken.
                s.journal().begin(
                    QUEUE_CMD,
                    req.head,
                    size,
                    start.wrapping_add(k as u16),
                    origin.nonce,
                    req.tag(),
                    req.writable.first().copied().unwrap_or((0, 0)),
                );
                submit(s, req, origin, vrings, table.clone());
            }
        }
        let enabled = vring
            .get_mut()
            .get_queue_mut()
            .enable_notification(snapshot);
        match enabled {
            Ok(true) => {
                // A driver that published while we looked is taken on the next pass. Twice
                // nothing means the index counts entries that cannot be read (a ring
                // outside guest memory) or that our own notification-flag writes move
                // (overlapping rings): looping would spin for ever.
                idle = if taken == 0 { idle + 1 } else { 0 };
                if idle < 2 {
                    continue;
                }
                s.device.reject(format_args!(
                    "command queue unusable: its index shows requests that cannot be taken"
                ));
                break;
            }
            _ => break,
        }
    }
}

fn submit(
    s: &Arc<Session>,
    req: ChainRequest,
    origin: Origin,
    vrings: &[VringRwLock],
    table: Arc<Table>,
) {
    let (opcode, flags) = Device::request_opcode_flags(&req.bytes);
    // FENCE itself waits for everything before it, as the flag does.
    let fence = flags & FLAG_FENCE != 0 || opcode == OP_FENCE;
    s.in_flight.fetch_add(1, Ordering::AcqRel);
    let generation = s.generation.load(Ordering::Acquire);
    let session = s.clone();
    let vrings: Vec<VringRwLock> = vrings.to_vec();
    let queued = s.dispatcher.submit(fence, move || {
        complete(&session, &vrings, &table.mem, req, origin, generation);
        let before = session.in_flight.fetch_sub(1, Ordering::AcqRel);
        if before >= session.queue_size as usize {
            // We were at the limit: requests may be waiting in the ring.
            process_commands(&session, &vrings);
        }
    });
    if !queued {
        s.in_flight.fetch_sub(1, Ordering::AcqRel);
        log::error!("DMA engines stopped; request dropped");
    }
}

/// A descriptor chain turned into owned data: request bytes (or why there are none) and
/// where the response goes.
/// Public, with its fields, for the fuzz target (fuzz/fuzz_targets/chain.rs).
pub struct ChainRequest {
    /// The chain's head index (public for the fuzz target).
    pub head: u16,
    /// The request: the readable descriptors' bytes in order (public for the fuzz target).
    pub bytes: Vec<u8>,
    /// Why the chain is not a request (public for the fuzz target).
    pub error: Option<Status>,
    /// Writable descriptors (address, length) for the response (public for the fuzz target).
    pub writable: Vec<(u64, u32)>,
}

impl ChainRequest {
    /// The driver's tag, echoed in the response (0 when the header is missing).
    /// Public for the fuzz target.
    pub fn tag(&self) -> u64 {
        chain_error_reply(Status::Ok, &self.bytes).resp.tag
    }

    /// Reads a chain; public for the fuzz target.
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
                writable.push((desc.addr().0, desc.len()));
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
            bytes,
            error,
            writable,
        }
    }
}

/// The reply to a malformed chain; public for the fuzz target.
pub fn chain_error_reply(status: Status, bytes: &[u8]) -> Reply {
    let mut r = Reply::default();
    r.resp.status = status as u32;
    if let Some(h) = bytes.get(..std::mem::size_of::<CmdHdr>()) {
        let mut hdr = CmdHdr::default();
        hdr.as_mut_slice().copy_from_slice(h);
        r.opcode = hdr.opcode;
        r.resp.tag = hdr.tag;
    }
    r
}

/// Runs on a DMA engine: executes the request, writes the reply, returns the chain.
fn complete(
    s: &Session,
    vrings: &[VringRwLock],
    mem: &GuestMemoryMmap,
    req: ChainRequest,
    origin: Origin,
    generation: u64,
) {
    let device = &s.device;
    let room: u64 = req.writable.iter().map(|&(_, l)| l as u64).sum();
    let resp_len = std::mem::size_of::<Resp>() as u64;
    // Nothing runs unless its response can be delivered: a command whose result the
    // driver cannot see must not take effect (or leak a buffer).
    let answerable = room >= resp_len
        && req
            .writable
            .iter()
            .all(|&(a, l)| mem.check_range(GuestAddress(a), l as usize));
    let mut written = 0u32;
    if !answerable {
        let (opcode, _) = Device::request_opcode_flags(&req.bytes);
        device.reject(format_args!(
            "request (head {}) has no usable response buffer ({room} writable bytes); not executed",
            req.head
        ));
        device.post_event(EVENT_ERROR, opcode as u64, Status::BadChain as u64);
    } else {
        let faults = sigbus::faults();
        let mut reply = match req.error {
            None => device.execute_cancellable(mem, &req.bytes, Some(origin), &s.cancel),
            Some(status) => {
                device.reject(format_args!(
                    "malformed descriptor chain (head {}): {}",
                    req.head,
                    status.name()
                ));
                chain_error_reply(status, &req.bytes)
            }
        };
        if sigbus::faults() != faults {
            // Memory shrank under the command (see sigbus.rs): what it read or wrote
            // there is lost.
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
        written = write_out(mem, &req.writable, &reply.bytes());
        if reply.corrupt_length {
            // An injected fault: fewer bytes than a response.
            written = written.min(3);
        }
    }
    if s.poisoned.load(Ordering::Acquire) {
        // A refused table ended guest-memory access; the ring is not touched either.
        return;
    }
    if s.generation.load(Ordering::Acquire) != generation {
        log::warn!(
            "request (head {}) finished after the front-end stopped the queue; not returned",
            req.head
        );
        return;
    }
    let event_idx = s.event_idx.load(Ordering::Relaxed);
    let vring = &vrings[QUEUE_CMD];
    {
        let mut state = vring.get_mut();
        if !publish(s, &mut state, mem, req.head, written) {
            return;
        }
        let notify = !event_idx
            || state
                .get_queue_mut()
                .needs_notification(mem)
                .unwrap_or(true);
        if notify {
            let _ = state.signal_used_queue();
        }
    }
    if device.has_events() {
        deliver_events(s, vrings, mem, event_idx);
    }
}

/// Writes `data` across the writable descriptors; returns the bytes written.
/// Public for the fuzz target.
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

/// Moves pending device events into buffers the driver posted on the event queue.
fn deliver_events(s: &Session, vrings: &[VringRwLock], mem: &GuestMemoryMmap, event_idx: bool) {
    let device = &s.device;
    let Some(vring) = vrings.get(QUEUE_EVENT) else {
        return;
    };
    let mut state = vring.get_mut();
    s.adopt_ring(QUEUE_EVENT, &mut state, mem);
    let mut used = false;
    while let Some(ev) = device.pop_event() {
        let chain = match state.get_queue_mut().iter(mem) {
            Ok(mut it) => it.next(),
            Err(_) => None,
        };
        let Some(chain) = chain else {
            device.unpop_event(ev);
            break;
        };
        let writable: Vec<(u64, u32)> = chain
            .clone()
            .filter(|d| d.is_write_only())
            .map(|d| (d.addr().0, d.len()))
            .collect();
        let room: u64 = writable.iter().map(|&(_, l)| l as u64).sum();
        let mut written = 0;
        if room >= std::mem::size_of_val(&ev) as u64 {
            written = write_out(mem, &writable, ev.as_slice());
        }
        if written as usize == std::mem::size_of_val(&ev) {
            device.event_delivered();
        } else {
            written = 0;
            device.event_dropped();
            device.reject(format_args!(
                "unusable event buffer ({room} bytes); event dropped"
            ));
        }
        if state
            .get_queue_mut()
            .add_used(mem, chain.head_index(), written)
            .is_err()
        {
            break;
        }
        used = true;
    }
    if used
        && (!event_idx
            || state
                .get_queue_mut()
                .needs_notification(mem)
                .unwrap_or(true))
    {
        let _ = state.signal_used_queue();
    }
    // Ask to be kicked when the driver posts more buffers (with EVENT_IDX this publishes
    // avail_event; without it, it clears the no-notify flag).
    let _ = state.get_queue_mut().enable_notification(mem);
}

/// Publishes exported buffers' UUIDs to the front-end as vhost-user shared objects.
///
/// One thread per device (for the daemon's life: [`crate::server::serve_endpoint`] makes
/// it) talks to whichever backend channel is current, so a front-end that sends
/// SET_BACKEND_REQ_FD again and again costs no thread. Announcements
/// ask for no reply: a front-end that never answers cannot hold the thread (only one that
/// stops reading its channel altogether can, until it closes it, and meanwhile at most
/// `QUEUED` announcements wait; more are dropped and counted).
///
/// It also carries shared-memory attach's requests: map device memory (once the device is
/// started) and unmap it when the daemon exits.
pub struct Announcer {
    tx: Mutex<std::sync::mpsc::SyncSender<Announce>>,
    log: RateLimitedLog,
    /// Bytes of device memory the front-end maps for a started device (0: none), which
    /// the daemon unmaps when it exits.
    mapped: AtomicU64,
}

enum Announce {
    /// A new backend channel (None: the session ended).
    Channel(Option<Backend>),
    Update {
        add: bool,
        uuid: [u8; 16],
    },
    /// Map `len` bytes of this file as device memory (shared memory region 0).
    Map {
        file: std::fs::File,
        len: u64,
    },
    /// Unmap device memory, then say so.
    Unmap {
        len: u64,
        done: std::sync::mpsc::SyncSender<()>,
    },
}

/// Every device's announcer, for the unmapping at exit.
static ANNOUNCERS: Mutex<Vec<std::sync::Weak<Announcer>>> = Mutex::new(Vec::new());

/// How long the exit waits for each device's unmap request to be sent.
const UNMAP_AT_EXIT: Duration = Duration::from_millis(500);

/// The daemon is exiting: ask the front-end to unmap every device memory it maps for a
/// started device, so that the guest no longer sees memory of a device that is gone.
pub fn unmap_before_exit() {
    let live: Vec<Arc<Announcer>> = match ANNOUNCERS.lock() {
        Ok(a) => a.iter().filter_map(|w| w.upgrade()).collect(),
        Err(_) => return,
    };
    for a in live {
        let len = a.mapped.swap(0, Ordering::AcqRel);
        if len == 0 {
            continue;
        }
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        a.send(Announce::Unmap { len, done });
        let _ = wait.recv_timeout(UNMAP_AT_EXIT);
    }
}

/// Announcements waiting for the thread at most.
const QUEUED: usize = 4096;

impl Announcer {
    /// Starts the thread; it ends when the announcer is dropped (and its current send is
    /// done).
    pub fn start() -> io::Result<Arc<Announcer>> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Announce>(QUEUED);
        std::thread::Builder::new()
            .name("backend-channel".into())
            .spawn(move || announce(rx))?;
        let a = Arc::new(Announcer {
            tx: Mutex::new(tx),
            log: RateLimitedLog::new(10),
            mapped: AtomicU64::new(0),
        });
        if let Ok(mut all) = ANNOUNCERS.lock() {
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&a));
        }
        Ok(a)
    }

    /// Device memory is mapped for a started device (`len` bytes), or not (0).
    fn unmap_at_exit(&self, len: u64) {
        self.mapped.store(len, Ordering::Release);
    }

    fn send(&self, a: Announce) {
        let Ok(tx) = self.tx.lock() else { return };
        if tx.try_send(a).is_err() {
            self.log.warn(format_args!(
                "shared-object announcement dropped: the front-end does not read its channel"
            ));
        }
    }
}

fn announce(rx: std::sync::mpsc::Receiver<Announce>) {
    let log = RateLimitedLog::new(10);
    let mut channel: Option<Backend> = None;
    for a in rx {
        match a {
            Announce::Channel(b) => channel = b,
            Announce::Update { add, uuid } => {
                let Some(backend) = &channel else { continue };
                let mut m = VhostUserSharedMsg::default();
                m.as_mut_slice().copy_from_slice(&uuid);
                let r = if add {
                    backend.shared_object_add(&m)
                } else {
                    backend.shared_object_remove(&m)
                };
                if let Err(e) = r {
                    log.warn(format_args!("cannot update a shared object: {e}"));
                }
            }
            Announce::Map { file, len } => {
                let Some(backend) = &channel else {
                    log::error!(
                        "device memory cannot reach the guest: the front-end gave no backend \
                         channel (vhost-user BACKEND_REQ) to map it with"
                    );
                    continue;
                };
                let m = VhostUserMMap {
                    shmid: SHM_ID_DEVMEM,
                    len,
                    flags: VhostUserMMapFlags::WRITABLE.bits(),
                    ..Default::default()
                };
                // No acknowledgement is asked for (see set_backend_req_fd): the mapping
                // shows in the memory table the front-end sends next.
                match backend.shmem_map(&m, &file) {
                    Ok(_) => log::info!("asked the front-end to map device memory ({len} bytes)"),
                    Err(e) => log::error!(
                        "cannot map device memory into the guest: {e}. The front-end did not \
                         take a VIRTIO shared memory region: QEMU 11.1 or later with \
                         vhost-user-test-device-pci is needed, or start the daemon with \
                         --attach bar (and an ivshmem-plain function)"
                    ),
                }
            }
            Announce::Unmap { len, done } => {
                if let Some(backend) = &channel {
                    let m = VhostUserMMap {
                        shmid: SHM_ID_DEVMEM,
                        len,
                        ..Default::default()
                    };
                    match backend.shmem_unmap(&m) {
                        Ok(_) => log::info!("asked the front-end to unmap device memory"),
                        Err(e) => log::warn!("cannot unmap device memory: {e}"),
                    }
                }
                let _ = done.try_send(());
            }
        }
    }
}

/// The session's view of the announcer, as the device's export sink.
struct SharedObjects(Arc<Announcer>);

impl ExportSink for SharedObjects {
    fn added(&self, uuid: [u8; 16]) {
        self.0.send(Announce::Update { add: true, uuid });
    }

    fn removed(&self, uuid: [u8; 16]) {
        self.0.send(Announce::Update { add: false, uuid });
    }
}

impl Drop for SharedObjects {
    fn drop(&mut self) {
        // The channel belonged to the session that gave it.
        self.0.send(Announce::Channel(None));
    }
}

impl VhostUserBackend for CxlBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    /// Any ring size the virtio specification allows (QEMU lets a guest choose up to 1024
    /// whatever the device's vq_size): refusing one would end the session, and with it
    /// the guest's device. The queue size (`--queue-size`, what QEMU is told) limits
    /// only how many requests are held at once.
    fn max_queue_size(&self) -> usize {
        crate::state::MAX_QUEUE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let common = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::SHARED_OBJECT;
        // Offered only in shmem mode: a front-end that takes it gives the device a BAR.
        match self.s.device.attach() {
            Attach::Shmem => common | VhostUserProtocolFeatures::SHMEM,
            _ => common,
        }
    }

    /// One region, device memory, as shared memory region 0 (shmem mode only).
    fn get_shmem_config(&self) -> io::Result<VhostUserShMemConfig> {
        if self.s.device.attach() != Attach::Shmem {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no shared memory regions: the daemon runs with --attach bar or numa",
            ));
        }
        let mut sizes = [0u64; SHM_ID_DEVMEM as usize + 1];
        sizes[SHM_ID_DEVMEM as usize] = self.s.device.devmem().size();
        Ok(VhostUserShMemConfig::new(1, &sizes))
    }

    fn set_backend_req_fd(&self, backend: Backend) {
        // A resumed session's front-end already knows every exported object.
        let announce = !self.s.resume.load(Ordering::Acquire);
        let announcer = &self.s.announcer;
        // Never wait for the front-end's answer (see Announcer).
        backend.set_reply_ack_flag(false);
        // The old sink goes (and with it the old channel) before the new one comes.
        self.s.device.set_export_sink(None, false);
        announcer.send(Announce::Channel(Some(backend)));
        self.s
            .device
            .set_export_sink(Some(Arc::new(SharedObjects(announcer.clone()))), announce);
    }

    fn get_shared_object(&self, msg: VhostUserSharedMsg) -> io::Result<std::fs::File> {
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(msg.as_slice());
        let Some((buf, _)) = self
            .s
            .device
            .exports()
            .into_iter()
            .find(|(_, u)| *u == uuid)
        else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no buffer exported under this UUID",
            ));
        };
        // An fd covering exactly the buffer needs a host udmabuf over a sealed memfd; the
        // device memory is one named file, so there is none to give.
        self.s.device.reject(format_args!(
            "GET_SHARED_OBJECT for buffer {} ({} bytes at {:#x}): not supported, device \
             memory is a named file and cannot be sliced into a host dma-buf",
            buf.id, buf.size, buf.offset
        ));
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "device memory cannot be exported as a host dma-buf",
        ))
    }

    fn set_event_idx(&self, enabled: bool) {
        self.s.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let cfg = self.s.device.config();
        let bytes = cfg.as_slice();
        let start = (offset as usize).min(bytes.len());
        let end = start.saturating_add(size as usize).min(bytes.len());
        let mut v = bytes[start..end].to_vec();
        // Reads past the end see zeros rather than an error: QEMU may ask for its config_size.
        v.resize(size as usize, 0);
        v
    }

    fn set_config(&self, _offset: u32, _buf: &[u8]) -> io::Result<()> {
        // The config space is read-only; writes are ignored as on real hardware.
        Ok(())
    }

    fn update_memory(&self, mem: Mem) -> io::Result<()> {
        // Registered first: the vhost crate may touch a table even after we refused it.
        let table = Arc::new(Table::new(mem.memory().into_inner())?);
        if let Ok(mut m) = self.s.mem.lock() {
            *m = Some(table);
        }
        // A refused table (a region past the end of its file would raise SIGBUS) ends
        // guest-memory access for this session.
        if let Err(e) = self.s.device.update_memory(&mem.memory()) {
            self.s.poisoned.store(true, Ordering::Release);
            self.s
                .device
                .reject(format_args!("memory table refused: {e}"));
            return Err(io::Error::new(io::ErrorKind::InvalidInput, e));
        }
        if self.s.started.load(Ordering::Acquire) {
            // Now mapped (or no longer): what to unmap at exit.
            self.s.ensure_mapped();
        }
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC).ok()
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        if queue_index as usize == QUEUE_CMD {
            // What runs is cut short and returned INTERRUPTED before the stop is answered.
            self.s.cancel.store(true, Ordering::Release);
            if !self.s.dispatcher.drain(STOP_DRAIN_TIMEOUT) {
                log::warn!(
                    "{} commands still running when the front-end stopped the queue",
                    self.s.dispatcher.in_flight()
                );
            }
            // Whatever still finishes must not write to the stopped (maybe reused) ring.
            self.s.generation.fetch_add(1, Ordering::AcqRel);
            self.s.cancel.store(false, Ordering::Release);
            // A stop may be a reset, which drops shared memory: map again once started.
            self.s.started.store(false, Ordering::Release);
            self.s.announcer.unmap_at_exit(0);
            if let Ok(mut m) = self.s.map_requested.lock() {
                *m = None;
            }
        }
        let q = queue_index as usize;
        if q < NUM_QUEUES {
            // The front-end owns the ring position from here; a later start sets it anew.
            self.s.journal().clear_ring(q);
            if let Ok(mut rings) = self.s.rings.lock() {
                rings[q] = None;
            }
            self.s.resume.store(false, Ordering::Release);
        }
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Ok(());
        }
        self.s.ensure_mapped();
        match device_event as usize {
            QUEUE_CMD => process_commands(&self.s, vrings),
            QUEUE_EVENT => {
                if let Some(table) = self.s.memory() {
                    let snapshot: &GuestMemoryMmap = &table.mem;
                    {
                        let _ = vrings[QUEUE_EVENT]
                            .get_mut()
                            .get_queue_mut()
                            .disable_notification(snapshot);
                    }
                    deliver_events(
                        &self.s,
                        vrings,
                        snapshot,
                        self.s.event_idx.load(Ordering::Relaxed),
                    );
                }
            }
            // Events posted outside a command: delivered once the event queue runs.
            e if e == EVENT_WAKE as usize => {
                if let Some(w) = &self.wake {
                    let _ = w.read();
                }
                let ready = vrings
                    .get(QUEUE_EVENT)
                    .is_some_and(|v| v.get_ref().get_queue().ready());
                if let (true, Some(table)) = (ready, self.s.memory()) {
                    deliver_events(
                        &self.s,
                        vrings,
                        &table.mem,
                        self.s.event_idx.load(Ordering::Relaxed),
                    );
                }
            }
            // Spurious or unknown events are harmless.
            _ => {}
        }
        Ok(())
    }
}
