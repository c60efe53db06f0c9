// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! vhost-user adapter: the vhost-user messages (features, memory table, queue start and
//! stop, backend channel, shared memory) around the ring layer's queue serving
//! ([`crate::ring::Queues`]), which runs on the vring thread and the DMA engines.
//! Everything guest-specific is validated in the ring layer or in the device model.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    VhostUserProtocolFeatures, VhostUserShMemConfig, VhostUserSharedMsg, VhostUserVirtioFeatures,
};
use vhost::vhost_user::Backend;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::QueueT;
use vm_memory::{ByteValued, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::device::dispatch::Dispatcher;
use crate::device::{Attach, Device};
use crate::protocol::{QUEUE_EVENT, SHM_ID_DEVMEM};
use crate::ring::journal::RingId;
use crate::ring::resume;
use crate::ring::{self, Journal, Memory, Queues, Rings};
use crate::vhost::announcer::Announcer;

pub mod announcer;
pub mod server;

type Mem = GuestMemoryAtomic<GuestMemoryMmap>;

/// Shared-memory attach: how long a map request may go without our memory showing up in
/// the memory table before it is sent again.
const MAP_RETRY: Duration = Duration::from_secs(1);

/// How long GET_VRING_BASE waits for commands in flight, once told to stop, before giving
/// up on them (they stop within microseconds: the engines look at the flag between
/// steps of at most 1 MiB or 4096 atomic operations).
const STOP_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A session's vhost-user state, beside the serving state of its queues.
struct Session {
    q: Arc<Queues>,
    /// This session continues a connection whose previous daemon died: the rings carry on
    /// from the journal instead of from the front-end's set-up.
    resume: AtomicBool,
    /// Announces exports to the front-end (one per device, shared by its sessions).
    announcer: Arc<Announcer>,
    /// The rings the journal describes (None: not yet seen since the queue started).
    rings: Mutex<Vec<Option<RingId>>>,
    /// A ring was enabled or kicked since the front-end last stopped the queues (the vhost
    /// crate calls handle_event for both): the device is started,
    /// the only time the front-end may be asked to map or unmap shared memory (QEMU 11.1
    /// crashes on a request for a stopped device).
    started: AtomicBool,
    /// Shared-memory attach: when the front-end was last asked to map device memory since
    /// the queues started.
    map_requested: Mutex<Option<Instant>>,
}

/// The vrings of a session, as the ring layer serves them.
#[derive(Clone)]
struct VhostRings {
    vrings: Vec<VringRwLock>,
    s: Arc<Session>,
}

impl Rings for VhostRings {
    fn locked<T>(&self, vq: usize, f: impl FnOnce(&mut virtio_queue::Queue) -> T) -> Option<T> {
        let vring = self.vrings.get(vq)?;
        let mut state = vring.get_mut();
        Some(f(state.get_queue_mut()))
    }

    fn signal(&self, vq: usize) {
        if let Some(vring) = self.vrings.get(vq) {
            let _ = vring.signal_used_queue();
        }
    }

    fn first_use(&self, vq: usize, queue: &mut virtio_queue::Queue, mem: &GuestMemoryMmap) -> bool {
        self.s.adopt_ring(vq, queue, mem)
    }
}

pub struct CxlBackend {
    s: Arc<Session>,
    /// Signalled when the device posts an event outside a command (the control channel's
    /// POISON, POISON_CLEARED): the epoll thread then delivers it (custom event EVENT_WAKE).
    wake: Option<vmm_sys_util::eventfd::EventFd>,
}

/// The epoll event of `CxlBackend::wake`: above every queue index and the exit event
/// (`0..=num_queues()`), whatever the number of command queues.
pub const EVENT_WAKE: u16 = u16::MAX;

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

    /// The session is over: commands still running or queued end early (INTERRUPTED),
    /// nothing more is taken from the rings and no answer is written to them.
    pub fn stop_commands(&self) {
        self.s.q.end();
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
        let queues = device.cmd_queues() + 1;
        if !resume {
            // Whatever an earlier daemon journaled belongs to rings that are gone.
            for q in 0..queues {
                Journal::of(device.state()).clear_ring(q);
            }
        }
        CxlBackend {
            s: Arc::new(Session {
                q: Arc::new(Queues::new(device, dispatcher, queue_size)),
                resume: AtomicBool::new(resume),
                announcer,
                rings: Mutex::new(vec![None; queues]),
                started: AtomicBool::new(false),
                map_requested: Mutex::new(None),
            }),
            wake: vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).ok(),
        }
    }
}

impl Session {
    fn journal(&self) -> Journal<'_> {
        Journal::of(self.q.device.state())
    }

    /// First use of ring `q` since it started: see [`resume::adopt`]. Called with the ring
    /// locked; whether to interrupt the driver.
    fn adopt_ring(&self, q: usize, queue: &mut virtio_queue::Queue, mem: &GuestMemoryMmap) -> bool {
        resume::adopt_once(&self.rings, q, queue, mem, self.journal(), || {
            self.resume.load(Ordering::Acquire)
        })
    }

    /// Shared-memory attach: the front-end drops its mapping of device memory at every
    /// device reset without telling us. So while the queues run and the memory table does
    /// not show our memory, ask for it; the backend-channel thread sends the request, as
    /// the front-end answers it only after this vhost-user message.
    fn ensure_mapped(&self) {
        if self.q.device.attach() != Attach::Shmem {
            return;
        }
        self.started.store(true, Ordering::Release);
        let size = self.q.device.devmem().size();
        if self.q.device.layout().devmem_gpa.is_some() {
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
        match self.q.device.devmem().file() {
            Ok(file) => self.announcer.map(file, size),
            Err(e) => log::error!("cannot hand device memory to the front-end: {e}"),
        }
    }
}

impl VhostUserBackend for CxlBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    /// The command queues and the event queue (virtqueue 1).
    fn num_queues(&self) -> usize {
        self.s.q.device.cmd_queues() + 1
    }

    /// Any ring size the virtio specification allows (QEMU lets a guest choose up to 1024
    /// whatever the device's vq_size): refusing one would end the session, and with it
    /// the guest's device. The queue size (`--queue-size`, what QEMU is told) limits
    /// only how many requests are held at once.
    fn max_queue_size(&self) -> usize {
        ring::MAX_QUEUE
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
        match self.s.q.device.attach() {
            Attach::Shmem => common | VhostUserProtocolFeatures::SHMEM,
            _ => common,
        }
    }

    /// One region, device memory, as shared memory region 0 (shmem mode only).
    fn get_shmem_config(&self) -> io::Result<VhostUserShMemConfig> {
        if self.s.q.device.attach() != Attach::Shmem {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no shared memory regions: the daemon runs with --attach bar or numa",
            ));
        }
        let mut sizes = [0u64; SHM_ID_DEVMEM as usize + 1];
        sizes[SHM_ID_DEVMEM as usize] = self.s.q.device.devmem().size();
        Ok(VhostUserShMemConfig::new(1, &sizes))
    }

    fn set_backend_req_fd(&self, backend: Backend) {
        // A resumed session's front-end already knows every exported object.
        let announce = !self.s.resume.load(Ordering::Acquire);
        let announcer = &self.s.announcer;
        // Never wait for the front-end's answer (see Announcer).
        backend.set_reply_ack_flag(false);
        // The old sink goes (and with it the old channel) before the new one comes.
        self.s.q.device.set_export_sink(None, false);
        let sink = announcer.channel(backend);
        self.s.q.device.set_export_sink(Some(sink), announce);
    }

    fn get_shared_object(&self, msg: VhostUserSharedMsg) -> io::Result<std::fs::File> {
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(msg.as_slice());
        let Some((buf, _)) = self
            .s
            .q
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
        self.s.q.device.reject(format_args!(
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
        self.s.q.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let cfg = self.s.q.device.config();
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
        self.s
            .q
            .set_memory(Arc::new(Memory::new(mem.memory().into_inner())?));
        // A refused table (a region past the end of its file would raise SIGBUS) ends
        // guest-memory access for this session.
        if let Err(e) = self.s.q.device.update_memory(&mem.memory()) {
            self.s.q.refuse_memory();
            self.s
                .q
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
        if let Some(cq) = self.s.q.cmd_queue(queue_index as usize) {
            // What runs is cut short and returned INTERRUPTED before the stop is answered;
            // whatever still finishes is not written to the stopped (maybe reused) ring.
            self.s.q.stop(cq, STOP_DRAIN_TIMEOUT);
            // A stop may be a reset, which drops shared memory: map again once started.
            self.s.started.store(false, Ordering::Release);
            self.s.announcer.unmap_at_exit(0);
            if let Ok(mut m) = self.s.map_requested.lock() {
                *m = None;
            }
        }
        let q = queue_index as usize;
        if q < self.num_queues() {
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
        let rings = VhostRings {
            vrings: vrings.to_vec(),
            s: self.s.clone(),
        };
        match device_event as usize {
            QUEUE_EVENT => {
                if let Some(table) = self.s.q.memory() {
                    rings.locked(QUEUE_EVENT, |queue| {
                        let _ = queue.disable_notification(&*table.mem);
                    });
                    self.s.q.deliver_events(&rings, &table.mem);
                }
            }
            // Events posted outside a command: delivered once the event queue runs.
            e if e == EVENT_WAKE as usize => {
                if let Some(w) = &self.wake {
                    let _ = w.read();
                }
                if let Some(table) = self.s.q.memory() {
                    self.s.q.deliver_events(&rings, &table.mem);
                }
            }
            q => {
                if let Some(cq) = self.s.q.cmd_queue(q) {
                    let poll_us = self.s.q.device.settings().poll_us as u64;
                    self.s.q.kicked(&rings, cq, poll_us);
                }
            }
        }
        Ok(())
    }
}
