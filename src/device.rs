//! The device model: configuration, device memory, allocator, counters, events and command
//! execution. It knows nothing of vhost-user: a transport hands it request bytes and a
//! snapshot of guest memory, and gets back the response to deliver.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use vm_memory::{ByteValued, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::allocator::{AllocError, Allocator};
use crate::command::{decode, Command, Request};
use crate::devmem::{DeviceMemory, FileId};
use crate::engine::{Ctx, Moved};
use crate::faults::{Action, Faults};
use crate::metrics::Metrics;
use crate::protocol::*;
use crate::state::{Mutation, Origin, Restored, StateFile};

/// How the guest sees device memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Attach {
    /// BAR2 of an ivshmem-plain function: the driver manages it (MEMORY_DEVICE_COHERENT).
    #[default]
    Bar,
    /// VIRTIO shared memory region of the virtio function itself (one PCI function), which
    /// the front-end maps on the daemon's request; otherwise as `Bar`.
    Shmem,
    /// A CPU-less NUMA node: the guest kernel owns the memory, so the device neither
    /// allocates it nor addresses it by offset.
    Numa,
}

/// Static attributes of a device instance.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    pub index: u32,
    pub attach: Attach,
    pub dma_engines: u32,
    pub read_latency_ns: u32,
    pub write_latency_ns: u32,
    pub read_bandwidth_mbs: u32,
    pub write_bandwidth_mbs: u32,
    /// Memory files of other devices, recognised in the memory table as peer BARs.
    /// Resolved when the memory table arrives, so peers may start after us.
    pub peers: Vec<std::path::PathBuf>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            index: 0,
            attach: Attach::Bar,
            dma_engines: 2,
            read_latency_ns: 250,
            write_latency_ns: 250,
            read_bandwidth_mbs: 16000,
            write_bandwidth_mbs: 16000,
            peers: Vec::new(),
        }
    }
}

/// What the device learned from the memory table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Guest-physical base of our own device memory, once the guest maps the BAR.
    pub devmem_gpa: Option<u64>,
    /// Guest-physical ranges (start, length) backed by peers' device memory.
    pub peers: Vec<(u64, u64)>,
}

/// The response to deliver for one request.
#[derive(Clone, Debug, Default)]
pub struct Reply {
    pub opcode: u16,
    pub resp: Resp,
    pub payload: Vec<u8>,
    /// An injected fault: the transport reports a used length shorter than a response.
    pub corrupt_length: bool,
}

impl Reply {
    pub fn bytes(&self) -> Vec<u8> {
        let mut v = self.resp.as_slice().to_vec();
        v.extend_from_slice(&self.payload);
        v
    }
}

/// Sleeps for `d` unless `cancelled` says so first (looked at every 10 ms); returns whether
/// it was cancelled.
fn sleep_unless(d: Duration, cancelled: &dyn Fn() -> bool) -> bool {
    let end = Instant::now() + d;
    loop {
        if cancelled() {
            return true;
        }
        let now = Instant::now();
        if now >= end {
            return false;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(10)));
    }
}

/// Bytes a completed command read and wrote, for the latency and bandwidth model.
fn traffic(opcode: u16, r: &Resp) -> (u64, u64) {
    if r.status != Status::Ok as u32 {
        return (0, 0);
    }
    match opcode {
        OP_COPY | OP_COPY_PAGES => (r.result0, r.result0),
        OP_FILL => (0, r.result0),
        OP_CHECKSUM => (r.result1, 0),
        OP_ATOMIC => (8, 8),
        _ => (0, 0),
    }
}

/// Logs at most `burst` warnings per second and says how many it held back.
pub struct RateLimitedLog {
    state: Mutex<(Instant, u32, u64)>,
    burst: u32,
}

impl RateLimitedLog {
    pub fn new(burst: u32) -> Self {
        RateLimitedLog {
            state: Mutex::new((Instant::now(), 0, 0)),
            burst,
        }
    }

    pub fn warn(&self, msg: std::fmt::Arguments) {
        self.log(log::Level::Warn, msg);
    }

    /// Logs `msg` at `level`, within the same limit.
    pub fn log(&self, level: log::Level, msg: std::fmt::Arguments) {
        let Ok(mut s) = self.state.lock() else { return };
        if s.0.elapsed() >= Duration::from_secs(1) {
            if s.2 > 0 {
                log::warn!("{} similar messages suppressed", s.2);
            }
            *s = (Instant::now(), 0, 0);
        }
        if s.1 < self.burst {
            s.1 += 1;
            log::log!(level, "{msg}");
        } else {
            s.2 += 1;
        }
    }
}

const MAX_PENDING_EVENTS: usize = 256;

/// Told when a buffer gains or loses its UUID, so a transport can publish it to the host
/// (vhost-user shared objects). Called outside the device's locks.
pub trait ExportSink: Send + Sync {
    fn added(&self, uuid: [u8; 16]);
    fn removed(&self, uuid: [u8; 16]);
}

pub struct Device {
    cfg: DeviceConfig,
    devmem: DeviceMemory,
    alloc: Mutex<Allocator>,
    /// Counters, allocations and the command journal; in the state file when there is one.
    state: Arc<StateFile>,
    layout: RwLock<Layout>,
    events: Mutex<VecDeque<Event>>,
    /// Tells the transport that an event waits (set while a session runs).
    event_waker: Mutex<Option<std::sync::Arc<dyn Fn() + Send + Sync>>>,
    event_seq: AtomicU64,
    errlog: RateLimitedLog,
    /// What a guest can make the device say again and again (resets).
    notes: RateLimitedLog,
    export_sink: RwLock<Option<std::sync::Arc<dyn ExportSink>>>,
    /// Injected faults, the engines' model and poisoned memory (the control channel's).
    faults: Arc<Faults>,
    metrics: Metrics,
    /// One log line per command (the control channel's "trace").
    tracing: std::sync::atomic::AtomicBool,
}

impl Device {
    /// A device whose state lives in memory only.
    pub fn new(cfg: DeviceConfig, devmem: DeviceMemory) -> Device {
        let state = StateFile::anonymous(devmem.size()).expect("anonymous state mapping");
        let restored = Restored {
            buffers: Vec::new(),
            next_id: 1,
            note: String::new(),
        };
        Device::with_state(cfg, devmem, Arc::new(state), restored)
    }

    /// A device continuing from a state file (allocations restored from it).
    pub fn with_state(
        cfg: DeviceConfig,
        devmem: DeviceMemory,
        state: Arc<StateFile>,
        restored: Restored,
    ) -> Device {
        let size = devmem.size();
        // The state file validated these against the same size.
        let alloc = Allocator::restore(size, restored.next_id, restored.buffers)
            .unwrap_or_else(|_| Allocator::new(size));
        Device {
            cfg,
            devmem,
            alloc: Mutex::new(alloc),
            state,
            layout: RwLock::new(Layout::default()),
            events: Mutex::new(VecDeque::new()),
            event_waker: Mutex::new(None),
            event_seq: AtomicU64::new(0),
            errlog: RateLimitedLog::new(10),
            notes: RateLimitedLog::new(10),
            export_sink: RwLock::new(None),
            faults: Arc::new(Faults::new()),
            metrics: Metrics::new(),
            tracing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// An allocation that overlaps no poisoned memory: such candidates are held while the
    /// allocator looks further, then given back.
    fn alloc_unpoisoned(
        &self,
        a: &mut Allocator,
        size: u64,
        align: u64,
    ) -> Result<crate::allocator::Buffer, AllocError> {
        let mut held = Vec::new();
        let result = loop {
            match a.alloc(size, align) {
                Ok(b) if self.faults.first_poisoned(b.offset, b.size).is_some() => {
                    if held.len() >= 64 {
                        held.push(b.id);
                        break Err(AllocError::NoSpace);
                    }
                    held.push(b.id);
                }
                other => break other,
            }
        };
        for id in held {
            let _ = a.free(id);
        }
        result
    }

    pub fn faults(&self) -> &Arc<Faults> {
        &self.faults
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn tracing(&self) -> bool {
        self.tracing.load(Ordering::Relaxed)
    }

    pub fn set_tracing(&self, on: bool) {
        self.tracing.store(on, Ordering::Relaxed);
        log::info!("command trace {}", if on { "on" } else { "off" });
    }

    /// Every buffer with its UUID when exported.
    pub fn buffers(&self) -> Vec<(crate::allocator::Buffer, Option<[u8; 16]>)> {
        self.alloc
            .lock()
            .map(|a| a.buffers().map(|b| (b.clone(), b.uuid)).collect())
            .unwrap_or_default()
    }

    /// Poisons [offset, offset + len) of device memory and tells the driver.
    pub fn poison(&self, offset: u64, len: u64) -> Result<(), crate::faults::FaultError> {
        self.faults.poison(offset, len, self.devmem.size())?;
        log::warn!("device memory {offset:#x} + {len:#x} poisoned");
        self.post_event(EVENT_POISON, offset, len);
        Ok(())
    }

    /// Clears poison in [offset, offset + len); the driver hears of it when there was any.
    pub fn unpoison(&self, offset: u64, len: u64) -> bool {
        let hit = self.faults.unpoison(offset, len);
        if hit {
            log::info!("device memory {offset:#x} + {len:#x} no longer poisoned");
            self.post_event(EVENT_POISON_CLEARED, offset, len);
        }
        hit
    }

    /// Installs (or removes) the receiver of export changes; the current exports are
    /// announced to a new sink.
    pub fn set_export_sink(&self, sink: Option<std::sync::Arc<dyn ExportSink>>, announce: bool) {
        // Under the allocator lock: no export can slip between the snapshot and the switch.
        let Ok(alloc) = self.alloc.lock() else { return };
        if let Some(s) = sink.as_ref().filter(|_| announce) {
            for b in alloc.buffers() {
                if let Some(uuid) = b.uuid {
                    s.added(uuid);
                }
            }
        }
        if let Ok(mut cur) = self.export_sink.write() {
            *cur = sink;
        }
    }

    fn notify_export(&self, uuid: [u8; 16], added: bool) {
        let sink = self.export_sink.read().ok().and_then(|s| s.clone());
        if let Some(s) = sink {
            if added {
                s.added(uuid);
            } else {
                s.removed(uuid);
            }
        }
    }

    /// Exported buffers: (buffer, uuid).
    pub fn exports(&self) -> Vec<(crate::allocator::Buffer, [u8; 16])> {
        self.alloc
            .lock()
            .map(|a| {
                a.buffers()
                    .filter_map(|b| b.uuid.map(|u| (b.clone(), u)))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn devmem(&self) -> &DeviceMemory {
        &self.devmem
    }

    pub fn attach(&self) -> Attach {
        self.cfg.attach
    }

    pub fn features(&self) -> u64 {
        let managed =
            F_ATOMIC_DEVMEM | F_ATOMIC_GUEST | F_P2P | F_ALLOC | F_COPY_PAGES | F_EVENTS | F_EXPORT;
        match self.cfg.attach {
            Attach::Bar => managed,
            Attach::Shmem => managed | F_SHMEM,
            Attach::Numa => F_ATOMIC_GUEST | F_P2P | F_COPY_PAGES | F_EVENTS | F_NUMA,
        }
    }

    /// In NUMA mode the guest kernel allocates the memory: buffers and device offsets
    /// would alias pages it hands out.
    fn refuses(&self, cmd: &Command) -> bool {
        if self.cfg.attach != Attach::Numa {
            return false;
        }
        let devmem = |l: &[Sge]| l.iter().any(|s| s.space == SPACE_DEVMEM);
        match cmd {
            Command::Alloc { .. } | Command::Export { .. } => true,
            Command::Copy { src, dst } => devmem(src) || devmem(dst),
            Command::Fill { dst, .. } => devmem(dst),
            Command::Checksum { src, .. } => devmem(src),
            Command::Atomic(a) => a.space == SPACE_DEVMEM,
            Command::CopyPages {
                src_space,
                dst_space,
                ..
            } => *src_space == SPACE_DEVMEM || *dst_space == SPACE_DEVMEM,
            _ => false,
        }
    }

    pub fn config(&self) -> Config {
        Config {
            magic: MAGIC,
            version_major: VERSION_MAJOR,
            version_minor: VERSION_MINOR,
            features: self.features(),
            devmem_size: self.devmem.size(),
            num_dma_engines: self.cfg.dma_engines,
            max_segments: MAX_SEGMENTS,
            read_latency_ns: self.cfg.read_latency_ns,
            write_latency_ns: self.cfg.write_latency_ns,
            read_bandwidth_mbs: self.cfg.read_bandwidth_mbs,
            write_bandwidth_mbs: self.cfg.write_bandwidth_mbs,
            device_index: self.cfg.index,
            page_size: 4096,
            max_request: MAX_REQUEST,
            reserved: 0,
        }
    }

    pub fn stat(&self, i: usize) -> u64 {
        self.state.counter(i).load(Ordering::Relaxed)
    }

    fn add_stat(&self, i: usize, v: u64) {
        self.state.counter(i).fetch_add(v, Ordering::Relaxed);
    }

    /// The crash-safe state (counters, allocations, command journal).
    pub fn state(&self) -> &Arc<StateFile> {
        &self.state
    }

    pub fn layout(&self) -> Layout {
        self.layout.read().map(|l| l.clone()).unwrap_or_default()
    }

    /// Learns where our own and our peers' device memory sit in guest-physical space, by
    /// the identity of the files behind the memory table's regions (sizes can coincide).
    /// A region that runs past the end of its file is refused, table and all: touching it
    /// would raise SIGBUS. A refused table leaves the layout as it was.
    pub fn update_memory(&self, guest: &GuestMemoryMmap) -> Result<(), String> {
        let mut layout = Layout::default();
        let peer_ids: Vec<FileId> = self
            .cfg
            .peers
            .iter()
            .filter_map(|p| FileId::of_path(p).ok())
            .collect();
        for region in guest.iter() {
            let Some(fo) = region.file_offset() else {
                continue;
            };
            let start = region.start_addr().0;
            let meta = fo
                .file()
                .metadata()
                .map_err(|e| format!("cannot stat the file of the region at {start:#x}: {e}"))?;
            if fo
                .start()
                .checked_add(region.len())
                .is_none_or(|end| end > meta.len())
            {
                return Err(format!(
                    "region at {start:#x} ({} bytes at file offset {:#x}) runs past the end of its {}-byte file",
                    region.len(),
                    fo.start(),
                    meta.len()
                ));
            }
            let id = FileId::from_metadata(&meta);
            if id == self.devmem.id() {
                match start.checked_sub(fo.start()) {
                    Some(base) => layout.devmem_gpa = Some(base),
                    None => log::warn!("device memory region at {start:#x} has an odd file offset"),
                }
            } else if peer_ids.contains(&id) {
                layout.peers.push((start, region.len()));
            }
        }
        let Ok(mut cur) = self.layout.write() else {
            return Err("device layout lock poisoned".into());
        };
        if layout.devmem_gpa != cur.devmem_gpa {
            match layout.devmem_gpa {
                Some(gpa) => {
                    log::info!("device memory mapped by the guest at {gpa:#x}");
                    self.post_event(EVENT_DEVMEM_MAPPED, gpa, self.devmem.size());
                }
                None => log::info!("device memory no longer mapped by the guest"),
            }
        }
        for p in &layout.peers {
            if !cur.peers.contains(p) {
                log::info!("peer device memory at {:#x} ({} bytes)", p.0, p.1);
            }
        }
        *cur = layout;
        Ok(())
    }

    /// Queues an event for the driver; the transport delivers it.
    pub fn post_event(&self, kind: u32, value0: u64, value1: u64) {
        if let Ok(mut q) = self.events.lock() {
            // Numbered under the lock, so the queue is in sequence order.
            let ev = Event {
                kind,
                reserved: 0,
                seq: self.event_seq.fetch_add(1, Ordering::Relaxed),
                value0,
                value1,
            };
            if q.len() >= MAX_PENDING_EVENTS {
                q.pop_front();
                self.add_stat(STAT_EVENTS_DROPPED, 1);
            }
            q.push_back(ev);
        }
        // Events come from commands (delivered when they complete) and from the control
        // channel, which has no command to ride on: wake the transport.
        let waker = self.event_waker.lock().ok().and_then(|w| w.clone());
        if let Some(wake) = waker {
            wake();
        }
    }

    /// Installs (or removes) what `post_event` wakes the transport with.
    pub fn set_event_waker(&self, waker: Option<std::sync::Arc<dyn Fn() + Send + Sync>>) {
        if let Ok(mut w) = self.event_waker.lock() {
            *w = waker;
        }
    }

    pub fn has_events(&self) -> bool {
        self.events.lock().map(|q| !q.is_empty()).unwrap_or(false)
    }

    pub fn pop_event(&self) -> Option<Event> {
        self.events.lock().ok()?.pop_front()
    }

    /// Puts back an event the transport could not deliver yet.
    pub fn unpop_event(&self, ev: Event) {
        if let Ok(mut q) = self.events.lock() {
            q.push_front(ev);
        }
    }

    pub fn event_delivered(&self) {
        self.add_stat(STAT_EVENTS_SENT, 1);
    }

    pub fn event_dropped(&self) {
        self.add_stat(STAT_EVENTS_DROPPED, 1);
    }

    /// Counts and logs a request that failed before it could be executed.
    pub fn reject(&self, what: std::fmt::Arguments) {
        self.add_stat(STAT_ERRORS, 1);
        self.errlog.warn(what);
    }

    /// Peeks at the opcode and flags of raw request bytes, for ordering decisions.
    pub fn request_opcode_flags(bytes: &[u8]) -> (u16, u16) {
        let word = |i: usize| {
            bytes
                .get(i..i + 2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .unwrap_or(0)
        };
        (word(0), word(2))
    }

    /// Decodes and executes one request against a snapshot of guest memory.
    pub fn execute(&self, guest: &GuestMemoryMmap, bytes: &[u8]) -> Reply {
        self.execute_from(guest, bytes, None)
    }

    /// Executes a request taken from a queue: `origin` ties a state change to the request
    /// in the journal, so a restarted daemon can still give its answer.
    pub fn execute_from(
        &self,
        guest: &GuestMemoryMmap,
        bytes: &[u8],
        origin: Option<Origin>,
    ) -> Reply {
        self.execute_cancellable(guest, bytes, origin, &crate::engine::NEVER)
    }

    /// [`Device::execute_from`], cut short with `INTERRUPTED` when `cancel` is set (the
    /// front-end stops the queue). Only data commands (COPY, FILL, CHECKSUM, COPY_PAGES,
    /// repeated ATOMIC) stop part-way, which leaves their destination undefined as the
    /// status says; state changes are not interruptible and complete or do not start.
    pub fn execute_cancellable(
        &self,
        guest: &GuestMemoryMmap,
        bytes: &[u8],
        origin: Option<Origin>,
        cancel: &std::sync::atomic::AtomicBool,
    ) -> Reply {
        self.add_stat(STAT_COMMANDS, 1);
        self.metrics.started();
        let start = Instant::now();
        let cancelled = || cancel.load(Ordering::Relaxed);
        let mut reply = match decode(bytes) {
            Ok(req) => {
                let mut reply = Reply {
                    opcode: req.opcode,
                    ..Default::default()
                };
                reply.resp.tag = req.tag;
                match self.faults.decide(req.opcode) {
                    _ if !self.faults.wait_unstalled(&cancelled) => {
                        reply.resp.status = Status::Interrupted as u32;
                    }
                    Some(Action::Fail(status)) => reply.resp.status = status as u32,
                    Some(Action::Hang) => {
                        // Never answered while the queue runs; a queue stop ends it.
                        while !sleep_unless(Duration::from_secs(3600), &cancelled) {}
                        reply.resp.status = Status::Interrupted as u32;
                    }
                    fault => {
                        self.run(guest, &req, &mut reply, origin, cancel);
                        let wait = match fault {
                            Some(Action::Delay { min, .. }) => min,
                            Some(Action::Late { after }) => after,
                            _ => Duration::ZERO,
                        };
                        let (read, written) = traffic(req.opcode, &reply.resp);
                        let cost = self.faults.model().cost(read, written);
                        sleep_unless(wait + cost.saturating_sub(start.elapsed()), &cancelled);
                        match fault {
                            Some(Action::CorruptStatus) => {
                                reply.resp.status = crate::faults::UNDEFINED_STATUS
                            }
                            Some(Action::CorruptLength) => reply.corrupt_length = true,
                            _ => {}
                        }
                    }
                }
                reply
            }
            Err(e) => {
                let mut reply = Reply {
                    opcode: e.opcode,
                    ..Default::default()
                };
                reply.resp.tag = e.tag;
                reply.resp.status = e.status as u32;
                reply.resp.detail = e.detail;
                reply
            }
        };
        let took = start.elapsed();
        self.metrics.record(reply.opcode, reply.resp.status, took);
        let name = Status::from_u32(reply.resp.status).map_or("?", |s| s.name());
        if self.tracing() {
            log::info!(
                "trace: {} tag {} request {} bytes: {} (detail {}, result {} {}) in {} us",
                crate::protocol::opcode_name(reply.opcode).unwrap_or("?"),
                reply.resp.tag,
                bytes.len(),
                name,
                reply.resp.detail,
                reply.resp.result0,
                reply.resp.result1,
                took.as_micros()
            );
        }
        if reply.resp.status != Status::Ok as u32 {
            self.add_stat(STAT_ERRORS, 1);
            self.errlog.warn(format_args!(
                "command {:#x} tag {} failed: {} (detail {})",
                reply.opcode, reply.resp.tag, name, reply.resp.detail
            ));
            reply.payload.clear();
        }
        reply
    }

    fn run(
        &self,
        guest: &GuestMemoryMmap,
        req: &Request,
        reply: &mut Reply,
        origin: Option<Origin>,
        cancel: &std::sync::atomic::AtomicBool,
    ) {
        let layout = self.layout();
        let ctx = Ctx {
            guest,
            devmem: &self.devmem,
            peers: &layout.peers,
            devmem_gpa: layout.devmem_gpa,
            cancel,
            faults: &self.faults,
            poisoned_at: std::cell::Cell::new(None),
        };
        self.run_in(&ctx, req, reply, origin);
        if reply.resp.status == Status::MediaError as u32 {
            // The detail names the first poisoned page the command met.
            let at = ctx.poisoned_at.get().unwrap_or(0);
            reply.resp.detail = u32::try_from(at / 4096).unwrap_or(u32::MAX);
            self.add_stat(STAT_MEDIA_ERRORS, 1);
        }
    }

    fn run_in(&self, ctx: &Ctx, req: &Request, reply: &mut Reply, origin: Option<Origin>) {
        let layout = self.layout();
        let r = &mut reply.resp;
        let mut fail = |status: Status, detail: u32| {
            r.status = status as u32;
            r.detail = detail;
        };
        if self.refuses(&req.cmd) {
            fail(Status::Unsupported, 0);
            return;
        }
        match &req.cmd {
            Command::Nop | Command::Fence => {}
            Command::Identify => {
                let alloc = self.alloc.lock();
                let (free, buffers) = alloc
                    .map(|a| (a.free_bytes(), a.len() as u32))
                    .unwrap_or((0, 0));
                let id = Identify {
                    magic: MAGIC,
                    version_major: VERSION_MAJOR,
                    version_minor: VERSION_MINOR,
                    features: self.features(),
                    devmem_size: self.devmem.size(),
                    devmem_gpa: layout.devmem_gpa.unwrap_or(0),
                    devmem_free: free,
                    num_dma_engines: self.cfg.dma_engines,
                    max_segments: MAX_SEGMENTS,
                    buffers,
                    device_index: self.cfg.index,
                    reserved: 0,
                };
                reply.payload = id.as_slice().to_vec();
            }
            Command::Stats => {
                let mut s = Stats::default();
                for (i, c) in s.counter.iter_mut().enumerate() {
                    *c = self.stat(i);
                }
                reply.payload = s.as_slice().to_vec();
            }
            Command::Reset => {
                // A driver starting afresh: whatever an earlier driver (or a crashed guest)
                // left allocated or undelivered is gone.
                if let Ok(mut a) = self.alloc.lock() {
                    r.result0 = a.len() as u64;
                    // Announced under the lock, so announcements keep the device's order.
                    for b in a.buffers() {
                        if let Some(uuid) = b.uuid {
                            self.notify_export(uuid, false);
                        }
                    }
                    *a = Allocator::new(self.devmem.size());
                    self.state.record(&a, Mutation::Reset, origin, r);
                }
                if let Ok(mut q) = self.events.lock() {
                    q.clear();
                }
                self.notes.log(
                    log::Level::Info,
                    format_args!("device reset by the driver: {} buffers released", r.result0),
                );
            }
            Command::SetDevmemBase { gpa } => match layout.devmem_gpa {
                None => fail(Status::NotReady, 0),
                Some(g) if g != *gpa => fail(Status::Invalid, 0),
                Some(_) => {}
            },
            Command::Copy { src, dst } => match ctx.copy(src, dst) {
                Ok(m) => {
                    self.account(STAT_BYTES_COPIED, m);
                    r.result0 = m.bytes;
                }
                Err((s, i)) => fail(s, i),
            },
            Command::Fill { pattern, dst } => match ctx.fill(*pattern, dst) {
                Ok(m) => {
                    self.account(STAT_BYTES_FILLED, m);
                    r.result0 = m.bytes;
                }
                Err((s, i)) => fail(s, i),
            },
            Command::Checksum { seed, src } => match ctx.checksum(*seed, src) {
                Ok((crc, m)) => {
                    self.account(STAT_BYTES_CHECKSUMMED, m);
                    r.result0 = crc as u64;
                    r.result1 = m.bytes;
                }
                Err((s, i)) => fail(s, i),
            },
            Command::Atomic(a) => match ctx.atomic(a) {
                Ok((old, n)) => {
                    self.add_stat(STAT_ATOMIC_OPS, n.max(1));
                    r.result0 = old;
                    r.result1 = n;
                }
                Err(s) => fail(s, 0),
            },
            Command::CopyPages {
                page_size,
                src_space,
                dst_space,
                src,
                dst,
            } => match ctx.copy_pages(*page_size, *src_space, *dst_space, src, dst) {
                Ok(m) => {
                    self.account(STAT_BYTES_COPIED, m);
                    self.add_stat(STAT_PAGES_COPIED, src.len() as u64);
                    r.result0 = src.len() as u64;
                }
                Err((s, i)) => fail(s, i),
            },
            Command::Signal { value } => {
                self.post_event(EVENT_SIGNAL, *value, req.tag);
            }
            Command::Alloc { size, align } => match self.alloc.lock() {
                Ok(mut a) => match self.alloc_unpoisoned(&mut a, *size, *align) {
                    Ok(b) => {
                        r.result0 = b.id;
                        r.result1 = b.offset;
                        let m = Mutation::Alloc {
                            id: b.id,
                            offset: b.offset,
                            size: b.size,
                        };
                        self.state.record(&a, m, origin, r);
                    }
                    Err(e) => fail(alloc_status(e), 0),
                },
                Err(_) => fail(Status::Internal, 0),
            },
            // Export announcements are made under the allocator lock (they only queue a
            // message), so the front-end hears them in the order the device applied them.
            Command::Free { id } => match self.alloc.lock() {
                Ok(mut a) => match a.free(*id) {
                    Ok(b) => {
                        r.result0 = b.size;
                        self.state
                            .record(&a, Mutation::Free { id: b.id }, origin, r);
                        if let Some(uuid) = b.uuid {
                            self.notify_export(uuid, false);
                        }
                    }
                    Err(e) => fail(alloc_status(e), 0),
                },
                Err(_) => fail(Status::Internal, 0),
            },
            Command::Export { id, uuid } => match self.alloc.lock() {
                Ok(mut a) => match a.set_uuid(*id, *uuid) {
                    Ok(()) => {
                        let m = Mutation::Export {
                            id: *id,
                            uuid: *uuid,
                        };
                        self.state.record(&a, m, origin, r);
                        self.notify_export(*uuid, true);
                    }
                    Err(e) => fail(alloc_status(e), 0),
                },
                Err(_) => fail(Status::Internal, 0),
            },
            Command::Unexport { uuid } => match self.alloc.lock() {
                Ok(mut a) => match a.clear_uuid(*uuid) {
                    Ok(id) => {
                        r.result0 = id;
                        self.state.record(&a, Mutation::Unexport { id }, origin, r);
                        self.notify_export(*uuid, false);
                    }
                    Err(e) => fail(alloc_status(e), 0),
                },
                Err(_) => fail(Status::Internal, 0),
            },
        }
    }

    fn account(&self, counter: usize, m: Moved) {
        self.add_stat(counter, m.bytes);
        self.add_stat(STAT_BYTES_P2P, m.peer_bytes);
    }
}

fn alloc_status(e: AllocError) -> Status {
    match e {
        AllocError::Invalid => Status::Invalid,
        AllocError::NoSpace => Status::NoSpace,
        AllocError::NotFound => Status::NotFound,
        AllocError::Exists => Status::Exists,
    }
}
