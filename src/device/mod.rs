// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The device model: configuration, device memory, allocator, counters, events and command
//! execution. It knows nothing of vhost-user: a transport hands it request bytes and a
//! snapshot of guest memory, and gets back the response to deliver. Where the guest sees
//! device memory, ours and peers', is `layout.rs`.

pub mod allocator;
pub mod command;
pub mod cxl;
pub mod devmem;
pub mod dispatch;
pub mod engine;
mod execute;
pub use execute::Admission;
pub mod faults;
mod layout;
pub use layout::{Layout, TableError};
pub mod metrics;
pub mod stages;
pub mod state;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use vm_memory::ByteValued;

use crate::device::allocator::{AllocError, Allocator};
use crate::device::devmem::DeviceMemory;
use crate::device::faults::Faults;
use crate::device::metrics::Metrics;
use crate::device::state::{Restored, StateFile};
use crate::protocol::*;

/// How the guest sees device memory. The default is the command line's (`--attach`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Attach {
    /// BAR2 of an ivshmem-plain function: the driver manages it (MEMORY_DEVICE_COHERENT).
    Bar,
    /// VIRTIO shared memory region of the virtio function itself (one PCI function), which
    /// the front-end maps on the daemon's request; otherwise as `Bar`.
    #[default]
    Shmem,
    /// A CPU-less NUMA node: the guest kernel owns the memory, so the device neither
    /// allocates it nor addresses it by offset.
    Numa,
    /// A PCIe function of its own served over vfio-user, a CXL Type-2 endpoint whose
    /// device memory is a BAR (otherwise as `Shmem`).
    Cxl,
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
    /// Command queues offered (config `num_cmd_queues`, 1 ..= MAX_CMD_QUEUES).
    pub cmd_queues: u32,
    /// Requests that move at most this many bytes run on the ring's thread as they
    /// arrive instead of on a DMA engine (0: every request goes to an engine).
    pub inline_max: u64,
    /// Busy-poll the command queues for up to this long after the last request before
    /// waiting for a kick again (0: never; costs a host CPU while it polls).
    pub poll_us: u32,
}

/// What runs inline by default: small enough that an engine hop costs more than the work.
pub const DEFAULT_INLINE_MAX: u64 = 64 << 10;

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            index: 0,
            attach: Attach::default(),
            dma_engines: 2,
            read_latency_ns: 250,
            write_latency_ns: 250,
            read_bandwidth_mbs: 16000,
            write_bandwidth_mbs: 16000,
            peers: Vec::new(),
            cmd_queues: 1,
            inline_max: DEFAULT_INLINE_MAX,
            poll_us: 0,
        }
    }
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
fn traffic(opcode: u16, r: &Resp, page_size: u32) -> (u64, u64) {
    if r.status != Status::Ok as u32 {
        return (0, 0);
    }
    match opcode {
        OP_COPY => (r.result0, r.result0),
        // result0 counts pages there
        OP_COPY_PAGES => {
            let b = r.result0.saturating_mul(page_size as u64);
            (b, b)
        }
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
    /// Where requests spend their time in the daemon (latency work).
    stages: crate::device::stages::Stages,
    /// One log line per command (the control channel's "trace").
    tracing: std::sync::atomic::AtomicBool,
    /// The CXL registers (used with `Attach::Cxl`).
    cxl: cxl::Cxl,
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
        // Only a CXL endpoint has registers worth saving.
        let cxl = cxl::Cxl::with_store(size, (cfg.attach == Attach::Cxl).then(|| state.clone()));
        Device {
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
            stages: Default::default(),
            tracing: std::sync::atomic::AtomicBool::new(false),
            cxl,
            cfg,
        }
    }

    /// The device's CXL registers (a CXL endpoint's, with `Attach::Cxl`).
    pub fn cxl(&self) -> &cxl::Cxl {
        &self.cxl
    }

    /// An allocation that overlaps no poisoned memory: first fit past every poisoned range.
    fn alloc_unpoisoned(
        &self,
        a: &mut Allocator,
        size: u64,
        align: u64,
    ) -> Result<crate::device::allocator::Buffer, AllocError> {
        a.alloc_avoiding(size, align, |offset, len| {
            self.faults.poisoned_end(offset, len)
        })
    }

    pub fn faults(&self) -> &Arc<Faults> {
        &self.faults
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn stages(&self) -> &crate::device::stages::Stages {
        &self.stages
    }

    pub fn tracing(&self) -> bool {
        self.tracing.load(Ordering::Relaxed)
    }

    pub fn set_tracing(&self, on: bool) {
        self.tracing.store(on, Ordering::Relaxed);
        log::info!("command trace {}", if on { "on" } else { "off" });
    }

    /// Every buffer with its UUID when exported.
    pub fn buffers(&self) -> Vec<(crate::device::allocator::Buffer, Option<[u8; 16]>)> {
        self.alloc
            .lock()
            .map(|a| a.buffers().map(|b| (b.clone(), b.uuid)).collect())
            .unwrap_or_default()
    }

    /// Poisons [offset, offset + len) of device memory and tells the driver.
    pub fn poison(&self, offset: u64, len: u64) -> Result<(), crate::device::faults::FaultError> {
        self.faults.poison(offset, len, self.devmem.size())?;
        log::warn!("device memory {offset:#x} + {len:#x} poisoned");
        self.post_event(EVENT_POISON, offset, len);
        Ok(())
    }

    /// Raises a CXL RAS error in the RAS capability (--attach cxl) and, when it is unmasked,
    /// signals it to the driver with an event, as the device's error detection would.
    pub fn raise_ras(&self, e: cxl::RasError) -> Result<cxl::Raised, cxl::CxlError> {
        if self.cfg.attach != Attach::Cxl {
            return Err(cxl::CxlError::NotCxl);
        }
        let raised = self.cxl.raise(e)?;
        let (class, bit) = match e {
            cxl::RasError::Correctable { bit } => (0, bit),
            cxl::RasError::Uncorrectable { bit, .. } => (1, bit),
        };
        log::warn!(
            "CXL RAS: {} error, status bit {bit}{}",
            if class == 0 {
                "correctable"
            } else {
                "uncorrectable"
            },
            if raised.unmasked {
                ""
            } else {
                " (masked: not signalled)"
            }
        );
        if raised.unmasked {
            self.post_event(EVENT_CXL_RAS, class, 1 << bit);
        }
        Ok(raised)
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
    pub fn exports(&self) -> Vec<(crate::device::allocator::Buffer, [u8; 16])> {
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

    /// The configuration the device was made with.
    pub fn settings(&self) -> &DeviceConfig {
        &self.cfg
    }

    /// Command queues offered, within what the wire format allows.
    pub fn cmd_queues(&self) -> usize {
        (self.cfg.cmd_queues as usize).clamp(1, MAX_CMD_QUEUES)
    }

    pub fn features(&self) -> u64 {
        let managed =
            F_ATOMIC_DEVMEM | F_ATOMIC_GUEST | F_P2P | F_ALLOC | F_COPY_PAGES | F_EVENTS | F_EXPORT;
        match self.cfg.attach {
            Attach::Bar => managed,
            Attach::Shmem => managed | F_SHMEM,
            Attach::Cxl => managed | F_SHMEM | F_CXL,
            Attach::Numa => F_ATOMIC_GUEST | F_P2P | F_COPY_PAGES | F_EVENTS | F_NUMA,
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
            num_cmd_queues: self.cmd_queues() as u32,
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
}
