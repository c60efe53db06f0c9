// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The function's virtio-pci (modern, virtio 1.x section 4.1) registers, in BAR0: common
//! configuration, ISR, device configuration and the doorbells; and the queues they set
//! up, which the ring layer serves ([`crate::ring::Queues`]) on a thread of the function's
//! own, so that a doorbell (a synchronous message from QEMU, its vCPU waiting) is answered
//! at once. Interrupts are the MSI-X vectors' eventfds QEMU hands over: one per queue.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{Queue, QueueT};
use vm_memory::{ByteValued, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::device::Device;
use crate::protocol::QUEUE_EVENT;
use crate::ring::journal::Journal;
use crate::ring::{resume, CmdQueue, Memory, Queues, Rings};

/// BAR0 layout: the virtio structures, then MSI-X (QEMU emulates the table and PBA over
/// this BAR; the PBA reads zeros here).
pub const COMMON: u64 = 0x0000;
pub const COMMON_LEN: u64 = 0x40;
pub const ISR: u64 = 0x0800;
pub const DEVICE_CFG: u64 = 0x0C00;
pub const DEVICE_CFG_LEN: u64 = 0x40;
pub const NOTIFY: u64 = 0x1000;
/// Bytes between two queues' doorbells.
pub const NOTIFY_MULTIPLIER: u32 = 4;
pub const MSIX_TABLE: u64 = 0x2000;
pub const MSIX_PBA: u64 = 0x3000;
pub const BAR0_SIZE: u64 = 0x4000;
/// MSI-X vectors: one per queue and the configuration vector, with room.
pub const MSIX_VECTORS: u16 = 16;

/// What `queue_msix_vector` says when a queue has no vector.
const NO_VECTOR: u16 = 0xFFFF;
/// The largest ring a driver may choose (a power of two).
const QUEUE_MAX: u16 = 1024;
/// How long a virtio reset waits for commands to come back.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Device status bits (virtio 1.x 2.1).
const STATUS_FEATURES_OK: u8 = 8;

/// Features the device offers: the same as over vhost-user.
fn device_features() -> u64 {
    (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_RING_F_INDIRECT_DESC) | (1 << VIRTIO_RING_F_EVENT_IDX)
}

/// The MSI-X vectors' eventfds, as QEMU sets them (`DEVICE_SET_IRQS`).
#[derive(Default)]
pub struct Irqs {
    fds: Mutex<Vec<Option<File>>>,
}

impl Irqs {
    /// Vectors `start..start + fds.len()` get these eventfds, or lose theirs (`None`).
    pub fn set(&self, start: usize, fds: Vec<Option<File>>) {
        let Ok(mut v) = self.fds.lock() else { return };
        for (i, fd) in fds.into_iter().enumerate() {
            let Some(slot) = start.checked_add(i).filter(|&k| k < MSIX_VECTORS as usize) else {
                continue;
            };
            if v.len() <= slot {
                v.resize_with(slot + 1, || None);
            }
            v[slot] = fd;
        }
    }

    pub fn clear(&self) {
        if let Ok(mut v) = self.fds.lock() {
            v.clear();
        }
    }

    /// Interrupts the driver on `vector` (QEMU masks and pends it as the guest says).
    pub fn signal(&self, vector: u16) {
        let Ok(mut v) = self.fds.lock() else { return };
        if let Some(Some(fd)) = v.get_mut(vector as usize) {
            let _ = fd.write_all(&1u64.to_ne_bytes());
        }
    }
}

/// The function's rings as the ring layer serves them.
#[derive(Clone)]
pub struct FunctionRings {
    queues: Arc<Vec<Mutex<Queue>>>,
    vectors: Arc<Vec<AtomicU16>>,
    irqs: Arc<Irqs>,
    device: Arc<Device>,
    /// Each ring as the journal knows it (None: not looked at since it was set up).
    adopted: Arc<resume::Adopted>,
    /// Per ring: this daemon took it over from one that died (`--supervise`), so it
    /// continues where the journal says, until the driver sets it up anew.
    resuming: Arc<Vec<AtomicBool>>,
}

impl Rings for FunctionRings {
    fn locked<T>(&self, vq: usize, f: impl FnOnce(&mut Queue) -> T) -> Option<T> {
        let mut q = self.queues.get(vq)?.lock().ok()?;
        Some(f(&mut q))
    }

    fn signal(&self, vq: usize) {
        let Some(v) = self.vectors.get(vq) else {
            return;
        };
        let v = v.load(Ordering::Acquire);
        if v != NO_VECTOR {
            self.irqs.signal(v);
        }
    }

    /// See [`resume::adopt`]: the journal learns the ring, or a successor continues it.
    fn first_use(&self, vq: usize, queue: &mut Queue, mem: &GuestMemoryMmap) -> bool {
        let journal = Journal::of(self.device.state());
        resume::adopt_once(&self.adopted, vq, queue, mem, journal, || {
            self.resuming
                .get(vq)
                .is_some_and(|r| r.swap(false, Ordering::AcqRel))
        })
    }
}

/// What the ring thread is asked to do.
enum Work {
    Kick(usize),
    Events,
    Quit,
}

/// Per-queue registers the driver sets before enabling a queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct QueueRegs {
    size: u16,
    enabled: bool,
    desc: u64,
    driver: u64,
    device: u64,
}

/// The virtio-pci transport of the function.
pub struct Virtio {
    device: Arc<Device>,
    serving: Arc<Queues>,
    rings: FunctionRings,
    regs: Vec<QueueRegs>,
    device_feature_select: u32,
    guest_feature_select: u32,
    guest_features: u64,
    msix_config: u16,
    status: u8,
    config_generation: u8,
    queue_select: u16,
    isr: u8,
    /// Queues a predecessor had enabled, to enable once guest memory holds their rings.
    resumed: Vec<usize>,
    work: Sender<Work>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The layout of [`Virtio::to_words`], bumped when it changes.
const SAVED_FORMAT: u64 = 1;

impl Virtio {
    pub fn new(
        device: Arc<Device>,
        serving: Arc<Queues>,
        irqs: Arc<Irqs>,
    ) -> std::io::Result<Virtio> {
        let n = device.cmd_queues() + 1;
        let rings = FunctionRings {
            queues: Arc::new(
                (0..n)
                    .map(|_| Mutex::new(Queue::new(QUEUE_MAX).expect("a power of two")))
                    .collect(),
            ),
            vectors: Arc::new((0..n).map(|_| AtomicU16::new(NO_VECTOR)).collect()),
            irqs,
            device: device.clone(),
            adopted: Arc::new(Mutex::new(vec![None; n])),
            resuming: Arc::new((0..n).map(|_| AtomicBool::new(false)).collect()),
        };
        let (work, rx) = channel();
        let thread = {
            let (serving, rings) = (serving.clone(), rings.clone());
            std::thread::Builder::new()
                .name("vfio-rings".into())
                .spawn(move || ring_thread(serving, rings, rx))?
        };
        let waker = work.clone();
        let waker = Mutex::new(waker);
        device.set_event_waker(Some(Arc::new(move || {
            if let Ok(w) = waker.lock() {
                let _ = w.send(Work::Events);
            }
        })));
        Ok(Virtio {
            device,
            serving,
            rings,
            regs: vec![QueueRegs::default(); n],
            device_feature_select: 0,
            guest_feature_select: 0,
            guest_features: 0,
            msix_config: NO_VECTOR,
            status: 0,
            config_generation: 0,
            queue_select: 0,
            isr: 0,
            resumed: Vec::new(),
            work,
            thread: Some(thread),
        })
    }

    /// A new session: whatever the journal holds belongs to rings that are gone.
    pub fn forget_rings(&self) {
        for q in 0..self.regs.len() {
            Journal::of(self.device.state()).clear_ring(q);
        }
    }

    /// The registers as words, for the state file (a supervised daemon's successor).
    pub fn to_words(&self) -> Vec<u64> {
        let mut w = vec![
            SAVED_FORMAT,
            self.device_feature_select as u64,
            self.guest_feature_select as u64,
            self.guest_features,
            self.msix_config as u64,
            self.status as u64,
            self.config_generation as u64,
            self.queue_select as u64,
            self.regs.len() as u64,
        ];
        for (q, r) in self.regs.iter().enumerate() {
            let enabled = r.enabled || self.resumed.contains(&q);
            let vector = self.rings.vectors[q].load(Ordering::Acquire);
            w.extend([r.size as u64, enabled as u64, r.desc, r.driver, r.device]);
            w.push(vector as u64);
        }
        w
    }

    /// Takes over the registers a predecessor saved ([`Virtio::to_words`]): false (and
    /// nothing taken) when `words` are not such registers for as many queues. Its enabled
    /// queues start once the replay of QEMU's set-up is over ([`Virtio::enable_resumed`]),
    /// continuing where the journal says.
    pub fn resume(&mut self, words: &[u64]) -> bool {
        let n = self.regs.len();
        let Some((head, queues)) = words.split_at_checked(9) else {
            return false;
        };
        if head[0] != SAVED_FORMAT || head[8] != n as u64 || queues.len() != 6 * n {
            return false;
        }
        self.device_feature_select = head[1] as u32;
        self.guest_feature_select = head[2] as u32;
        self.guest_features = head[3] & device_features();
        self.msix_config = head[4] as u16;
        self.status = head[5] as u8;
        self.config_generation = head[6] as u8;
        self.queue_select = head[7] as u16;
        self.resumed.clear();
        for (q, w) in queues.chunks_exact(6).enumerate() {
            self.regs[q] = QueueRegs {
                size: w[0] as u16,
                enabled: false,
                desc: w[2],
                driver: w[3],
                device: w[4],
            };
            let vector = w[5] as u16;
            let vector = if vector < MSIX_VECTORS {
                vector
            } else {
                NO_VECTOR
            };
            self.rings.vectors[q].store(vector, Ordering::Release);
            let enabled = w[1] != 0;
            self.rings.resuming[q].store(enabled, Ordering::Release);
            if enabled {
                self.resumed.push(q);
            }
        }
        true
    }

    /// Enables the queues a predecessor had enabled whose rings guest memory now holds,
    /// and serves them at once (what was in flight is answered from the journal).
    pub fn enable_resumed(&mut self) {
        for q in std::mem::take(&mut self.resumed) {
            if self.enable_queue(q, true) {
                let _ = self.work.send(Work::Kick(q));
            } else {
                self.resumed.push(q);
            }
        }
    }

    pub fn num_queues(&self) -> usize {
        self.regs.len()
    }

    /// New guest memory: the queues read their rings through it from now on.
    pub fn set_memory(&self, mem: Arc<GuestMemoryMmap>) -> std::io::Result<()> {
        self.serving.set_memory(Arc::new(Memory::new(mem)?));
        Ok(())
    }

    /// A read of BAR0 at `off` (the virtio structures; `MSIX_*` reads zeros).
    pub fn read(&mut self, off: u64, data: &mut [u8]) {
        data.fill(0);
        if (COMMON..COMMON + COMMON_LEN).contains(&off) {
            let v = self.common_read(off - COMMON);
            let bytes = v.to_le_bytes();
            let n = data.len().min(8);
            data[..n].copy_from_slice(&bytes[..n]);
        } else if (ISR..ISR + 4).contains(&off) {
            // Reading the ISR clears it (it matters only without MSI-X).
            data[0] = std::mem::take(&mut self.isr);
        } else if (DEVICE_CFG..DEVICE_CFG + DEVICE_CFG_LEN).contains(&off) {
            let cfg = self.device.config();
            let bytes = cfg.as_slice();
            let start = (off - DEVICE_CFG) as usize;
            for (i, b) in data.iter_mut().enumerate() {
                *b = bytes.get(start + i).copied().unwrap_or(0);
            }
        }
    }

    /// A write of BAR0 at `off`.
    pub fn write(&mut self, off: u64, data: &[u8]) {
        let mut b = [0u8; 8];
        let n = data.len().min(8);
        b[..n].copy_from_slice(&data[..n]);
        let value = u64::from_le_bytes(b);
        if (COMMON..COMMON + COMMON_LEN).contains(&off) {
            self.common_write(off - COMMON, value);
        } else if off >= NOTIFY && off < NOTIFY + NOTIFY_MULTIPLIER as u64 * self.regs.len() as u64
        {
            // The doorbell of queue (off - NOTIFY) / multiplier; the value names it too.
            let q = ((off - NOTIFY) / NOTIFY_MULTIPLIER as u64) as usize;
            if self.regs.get(q).is_some_and(|r| r.enabled) {
                let _ = self.work.send(Work::Kick(q));
            }
        }
    }

    fn selected(&mut self) -> Option<&mut QueueRegs> {
        self.regs.get_mut(self.queue_select as usize)
    }

    /// A register of the common configuration (the driver reads each at its own offset
    /// and width).
    fn common_read(&mut self, off: u64) -> u64 {
        let sel = self.queue_select as usize;
        let q = self.regs.get(sel).copied();
        let vector = self
            .rings
            .vectors
            .get(sel)
            .map_or(NO_VECTOR, |v| v.load(Ordering::Acquire));
        let v: u64 = match off {
            0x00 => self.device_feature_select as u64,
            0x04 => match self.device_feature_select {
                0 => device_features() & 0xFFFF_FFFF,
                1 => device_features() >> 32,
                _ => 0,
            },
            0x08 => self.guest_feature_select as u64,
            0x0C => match self.guest_feature_select {
                0 => self.guest_features & 0xFFFF_FFFF,
                1 => self.guest_features >> 32,
                _ => 0,
            },
            0x10 => self.msix_config as u64,
            0x12 => self.regs.len() as u64,
            0x14 => self.status as u64,
            0x15 => self.config_generation as u64,
            0x16 => self.queue_select as u64,
            0x18 => q.map_or(0, |q| if q.size == 0 { QUEUE_MAX } else { q.size }) as u64,
            0x1A => vector as u64,
            0x1C => q.is_some_and(|q| q.enabled) as u64,
            // Doorbell offsets: queue q's at q * multiplier.
            0x1E => sel as u64,
            0x20 => q.map_or(0, |q| q.desc & 0xFFFF_FFFF),
            0x24 => q.map_or(0, |q| q.desc >> 32),
            0x28 => q.map_or(0, |q| q.driver & 0xFFFF_FFFF),
            0x2C => q.map_or(0, |q| q.driver >> 32),
            0x30 => q.map_or(0, |q| q.device & 0xFFFF_FFFF),
            0x34 => q.map_or(0, |q| q.device >> 32),
            _ => 0,
        };
        v
    }

    fn common_write(&mut self, off: u64, value: u64) {
        let lo = |v: u64, w: u64| (v & !0xFFFF_FFFF) | (w & 0xFFFF_FFFF);
        let hi = |v: u64, w: u64| (v & 0xFFFF_FFFF) | (w & 0xFFFF_FFFF) << 32;
        match off {
            0x00 => self.device_feature_select = value as u32,
            0x08 => self.guest_feature_select = value as u32,
            // Only before FEATURES_OK, and only what is offered.
            0x0C if self.status & STATUS_FEATURES_OK == 0 => {
                let v = value & 0xFFFF_FFFF;
                self.guest_features = match self.guest_feature_select {
                    0 => lo(self.guest_features, v),
                    1 => hi(self.guest_features, v),
                    _ => self.guest_features,
                } & device_features();
            }
            0x10 => self.msix_config = value as u16,
            0x14 => self.set_status(value as u8),
            0x16 => self.queue_select = value as u16,
            0x18 => {
                let size = value as u16;
                if let Some(q) = self.selected() {
                    if !q.enabled && size.is_power_of_two() && size <= QUEUE_MAX {
                        q.size = size;
                    }
                }
            }
            0x1A => {
                let sel = self.queue_select as usize;
                if let Some(v) = self.rings.vectors.get(sel) {
                    let vector = value as u16;
                    let ok = vector == NO_VECTOR || vector < MSIX_VECTORS;
                    v.store(if ok { vector } else { NO_VECTOR }, Ordering::Release);
                }
            }
            0x1C if value & 1 == 1 => {
                let sel = self.queue_select as usize;
                // The driver's own ring: new to the journal, whatever a predecessor had.
                if let Some(r) = self.rings.resuming.get(sel) {
                    r.store(false, Ordering::Release);
                }
                self.resumed.retain(|&q| q != sel);
                self.enable_queue(sel, false);
            }
            0x20 | 0x24 | 0x28 | 0x2C | 0x30 | 0x34 => {
                if let Some(q) = self.selected() {
                    if q.enabled {
                        return;
                    }
                    let field = match off & !7 {
                        0x20 => &mut q.desc,
                        0x28 => &mut q.driver,
                        _ => &mut q.device,
                    };
                    *field = if off & 4 == 0 {
                        lo(*field, value)
                    } else {
                        hi(*field, value)
                    };
                }
            }
            _ => {}
        }
    }

    /// The driver enables queue `sel` (or a predecessor had, `resumed`): its ring is set
    /// up from the registers and served from now on; a ring outside guest memory stays
    /// disabled (said unless `resumed`: the memory may be on its way). Whether it runs.
    fn enable_queue(&mut self, sel: usize, resumed: bool) -> bool {
        let Some(regs) = self.regs.get(sel).copied() else {
            return false;
        };
        if regs.enabled {
            return true;
        }
        let event_idx = self.guest_features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        let size = if regs.size == 0 { QUEUE_MAX } else { regs.size };
        if resumed && !self.ring_mapped(&regs, size) {
            // The rest of guest memory is still being replayed (checked here because the
            // queue's own check logs an error).
            return false;
        }
        let ok = self.rings.locked(sel, |q| {
            q.reset();
            q.set_size(size);
            q.set_desc_table_address(Some(regs.desc as u32), Some((regs.desc >> 32) as u32));
            q.set_avail_ring_address(Some(regs.driver as u32), Some((regs.driver >> 32) as u32));
            q.set_used_ring_address(Some(regs.device as u32), Some((regs.device >> 32) as u32));
            q.set_event_idx(event_idx);
            q.set_ready(true);
            let mem = self.serving.memory();
            mem.is_some_and(|m| q.is_valid(&*m.mem))
        });
        if ok != Some(true) {
            if !resumed {
                self.device.reject(format_args!(
                    "virtqueue {sel}: its ring is not in guest memory; not enabled"
                ));
            }
            self.rings.locked(sel, |q| q.set_ready(false));
            return false;
        }
        self.serving.event_idx.store(event_idx, Ordering::Relaxed);
        if let Some(r) = self.regs.get_mut(sel) {
            r.enabled = true;
        }
        if sel == QUEUE_EVENT {
            let _ = self.work.send(Work::Events);
        }
        true
    }

    /// Whether guest memory holds all three parts of a ring of `size` entries.
    fn ring_mapped(&self, regs: &QueueRegs, size: u16) -> bool {
        let Some(m) = self.serving.memory() else {
            return false;
        };
        let n = size as usize;
        [
            (regs.desc, 16 * n),
            (regs.driver, 6 + 2 * n),
            (regs.device, 6 + 8 * n),
        ]
        .iter()
        .all(|&(addr, len)| m.mem.check_range(GuestAddress(addr), len))
    }

    fn set_status(&mut self, status: u8) {
        if status == 0 {
            self.reset();
            return;
        }
        self.status = status;
    }

    /// A virtio reset (status 0, or the function's reset): every queue stops (commands
    /// running are cut short, answers not written), and the registers start over.
    pub fn reset(&mut self) {
        for cq in CmdQueue::all(self.regs.len() - 1) {
            if self.regs[cq.vq].enabled {
                self.serving.stop(cq, STOP_TIMEOUT);
            }
        }
        for vq in 0..self.regs.len() {
            self.rings.locked(vq, |q| q.reset());
            if let Some(v) = self.rings.vectors.get(vq) {
                v.store(NO_VECTOR, Ordering::Release);
            }
        }
        self.regs.iter_mut().for_each(|r| *r = QueueRegs::default());
        self.resumed.clear();
        // Rings set up after this are new to the journal, whatever their addresses: what
        // it holds of these would be taken for theirs by a successor.
        self.rings
            .resuming
            .iter()
            .for_each(|r| r.store(false, Ordering::Release));
        if let Ok(mut a) = self.rings.adopted.lock() {
            a.iter_mut().for_each(|r| *r = None);
        }
        self.forget_rings();
        self.guest_features = 0;
        self.msix_config = NO_VECTOR;
        self.status = 0;
        self.queue_select = 0;
        self.isr = 0;
        self.config_generation = self.config_generation.wrapping_add(1);
    }
}

impl Drop for Virtio {
    fn drop(&mut self) {
        self.device.set_event_waker(None);
        self.serving.end();
        let _ = self.work.send(Work::Quit);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread that serves the queues the doorbells name, and delivers device events.
fn ring_thread(serving: Arc<Queues>, rings: FunctionRings, rx: Receiver<Work>) {
    let poll_us = serving.device.settings().poll_us as u64;
    while let Ok(w) = rx.recv() {
        match w {
            Work::Quit => break,
            Work::Events => {
                if let Some(m) = serving.memory() {
                    serving.deliver_events(&rings, &m.mem);
                }
            }
            Work::Kick(vq) if vq == QUEUE_EVENT => {
                if let Some(m) = serving.memory() {
                    serving.deliver_events(&rings, &m.mem);
                }
            }
            Work::Kick(vq) => {
                if let Some(cq) = serving.cmd_queue(vq) {
                    serving.kicked(&rings, cq, poll_us);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn irqs_take_vectors_and_lose_them() {
        let irqs = Irqs::default();
        let (r, w) = {
            let mut fds = [0; 2];
            // SAFETY: pipe(2) fills two descriptors we then own.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            use std::os::fd::FromRawFd;
            // SAFETY: both descriptors are ours from the pipe above.
            unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
        };
        irqs.set(2, vec![Some(w)]);
        irqs.signal(2);
        irqs.signal(3); // no vector: nothing
        let mut buf = [0u8; 16];
        use std::io::Read;
        let n = (&r).read(&mut buf).unwrap();
        assert_eq!(n, 8);
        assert_eq!(u64::from_ne_bytes(buf[..8].try_into().unwrap()), 1);
        irqs.set(2, vec![None]);
        irqs.signal(2);
        irqs.set(MSIX_VECTORS as usize, vec![None]); // out of range: ignored
    }
}
