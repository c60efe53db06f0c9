// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The PCI function served over vfio-user: its config space (a virtio-pci device with the
//! CXL DVSECs of a Type-2 endpoint), its BARs and interrupts, and the guest memory QEMU
//! maps for it. BAR0 holds the virtio structures and MSI-X (`virtio.rs`), BAR2 the CXL
//! component registers, BAR4 device memory, which QEMU maps into the guest from our file.
//! The component registers get a BAR of their own because virtio-pci claims every BAR its
//! capabilities point to, and the CXL core must claim this one.
//!
//! Config space layout (offsets in hex): 00 header; 40 PCI Express capability (v2,
//! endpoint); 80 MSI-X; 90 virtio common, A0 notify, B4 ISR, C4 device, D4 shared memory
//! capabilities; 100 CXL Device DVSEC, 140 Flex Bus Port DVSEC, 160 Register Locator DVSEC.
//! `config.rs` builds it and serves its reads and writes (BAR registers included); this
//! file the regions, interrupts and DMA maps of the vfio-user function.

mod config;

use std::fs::File;
use std::sync::Arc;

use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap, MmapRegion,
};

use super::peers::{Found, Peers};
use super::protocol::*;
use super::virtio::{self, Irqs, Virtio};
use super::{DeviceInfo, DmaMap, Errno, Function, IrqInfo, RegionInfo, SetIrqs};
use crate::device::cxl::COMPONENT_BLOCK_SIZE;
use crate::device::dispatch::Dispatcher;
use crate::device::state::Saved;
use crate::device::Device;
use crate::ring::Queues;

const CONFIG_SIZE: usize = 4096;

// Regions (vfio's PCI region indices) of ours.
const BAR0: u32 = REGION_BAR0;
const BAR2: u32 = 2;
const BAR4: u32 = 4;
/// The BAR of device memory, which a patched QEMU routes the CXL region to (x-cxl-mem-bar).
pub const DEVMEM_BAR: u32 = BAR4;
const CONFIG: u32 = REGION_CONFIG;

/// A guest memory region QEMU mapped for the device.
struct Mapped {
    iova: u64,
    size: u64,
    /// Our mapping of it (None: given without a file and no peer's memory we know, such
    /// as a ROM, another device's BAR or our own).
    region: Option<Arc<GuestRegionMmap>>,
    /// The peer whose memory it is, when we mapped a peer's file here.
    peer: Option<usize>,
    /// Said once that several peers could be it.
    ambiguous: bool,
}

/// The function, for the daemon's life; each vfio-user session (QEMU connects once) gets
/// fresh virtio state and queue serving.
pub struct CxlFunction {
    device: Arc<Device>,
    dispatcher: Arc<Dispatcher>,
    queue_size: u16,
    config: Box<[u8; CONFIG_SIZE]>,
    /// BAR registers as the guest last wrote them (base addresses with the type bits).
    bars: [u32; 6],
    virtio: Virtio,
    irqs: Arc<Irqs>,
    maps: Vec<Mapped>,
    peers: Peers,
    /// Taken over from a dead daemon, and QEMU's set-up still being replayed: it holds no
    /// region access, so the first one ends it (the supervisor reads config space last).
    /// The rings run from then on, with all of guest memory there; and interrupts the
    /// predecessor raised may have been lost with it, so each vector fires once it is
    /// back.
    replaying: bool,
}

/// The layout of [`CxlFunction::save`]'s words before the virtio registers.
const SAVED_FORMAT: u64 = 1 | (CONFIG_SIZE as u64) << 8;

impl CxlFunction {
    /// A function at power-on.
    pub fn new(
        device: Arc<Device>,
        dispatcher: Arc<Dispatcher>,
        queue_size: u16,
    ) -> std::io::Result<CxlFunction> {
        CxlFunction::with_resume(device, dispatcher, queue_size, false)
    }

    /// `resume`: the function a daemon that died left in the state file (`--supervise`
    /// replays QEMU's session to this one): its registers, CXL registers and rings carry
    /// on, and QEMU's guest sees nothing but the pause. Otherwise (or when nothing usable
    /// was saved) a function at power-on.
    pub fn with_resume(
        device: Arc<Device>,
        dispatcher: Arc<Dispatcher>,
        queue_size: u16,
        resume: bool,
    ) -> std::io::Result<CxlFunction> {
        let mut f = CxlFunction::build(device, dispatcher, queue_size)?;
        if resume && f.resume_saved() {
            log::info!(
                "function registers, CXL registers and rings taken over from the state file"
            );
        } else {
            if resume {
                log::warn!("no function state saved to take over; the device starts at power-on");
            }
            f.virtio.forget_rings();
            f.device.cxl().power_on();
            f.save();
        }
        Ok(f)
    }

    /// Saves the registers (config space, BARs, virtio) for a successor; the CXL model
    /// saves its own. Called after every change a guest or QEMU makes to them.
    fn save(&self) {
        let mut w = vec![SAVED_FORMAT];
        w.extend(self.bars.map(u64::from));
        w.extend(
            self.config
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))),
        );
        w.extend(self.virtio.to_words());
        if !self.device.state().save(Saved::Function, &w) {
            log::warn!("function state larger than its slot; a restart would lose it");
        }
    }

    /// Takes over what [`CxlFunction::save`] and the CXL model saved.
    fn resume_saved(&mut self) -> bool {
        let Some(w) = self.device.state().saved(Saved::Function) else {
            return false;
        };
        let bars_end = 1 + 6;
        let config_end = bars_end + CONFIG_SIZE / 8;
        if w.len() < config_end || w[0] != SAVED_FORMAT {
            return false;
        }
        if !self.virtio.resume(&w[config_end..]) {
            return false;
        }
        for (b, &v) in self.bars.iter_mut().zip(&w[1..bars_end]) {
            *b = v as u32;
        }
        for (c, &v) in self
            .config
            .chunks_exact_mut(8)
            .zip(&w[bars_end..config_end])
        {
            c.copy_from_slice(&v.to_le_bytes());
        }
        if !self.device.cxl().resume_saved() {
            log::warn!("no CXL registers saved; they start at power-on");
        }
        self.device.take_over_devmem_gpa(self.devmem_gpa());
        self.replaying = true;
        true
    }

    /// A region access: a replay is over, and the rings a predecessor ran run again.
    fn end_replay(&mut self) {
        if std::mem::take(&mut self.replaying) {
            self.virtio.enable_resumed();
        }
    }

    fn build(
        device: Arc<Device>,
        dispatcher: Arc<Dispatcher>,
        queue_size: u16,
    ) -> std::io::Result<CxlFunction> {
        let irqs = Arc::new(Irqs::default());
        let serving = Arc::new(Queues::new(device.clone(), dispatcher.clone(), queue_size));
        let virtio = Virtio::new(device.clone(), serving, irqs.clone())?;
        let mut f = CxlFunction {
            dispatcher,
            queue_size,
            config: Box::new([0; CONFIG_SIZE]),
            bars: [0; 6],
            virtio,
            irqs,
            maps: Vec::new(),
            peers: Peers::default(),
            replaying: false,
            device,
        };
        f.build_config();
        Ok(f)
    }

    fn devmem_size(&self) -> u64 {
        self.device.devmem().size()
    }

    /// BAR sizes: BAR0 the virtio structures and MSI-X, BAR2 (64-bit) the component
    /// registers, BAR4 (64-bit, prefetchable) device memory.
    fn bar_size(&self, bar: usize) -> u64 {
        match bar {
            0 => virtio::BAR0_SIZE,
            2 => COMPONENT_BLOCK_SIZE,
            4 => self.devmem_size(),
            _ => 0,
        }
    }

    /// The type bits of a BAR register.
    fn bar_type(bar: usize) -> u32 {
        match bar {
            2 => 0x4,
            4 => 0xC,
            _ => 0,
        }
    }

    /// Component registers: 32-bit registers; wider and narrower accesses are split and
    /// merged (Linux uses readl/writel here).
    fn component_read(&self, off: u64, data: &mut [u8]) -> Result<(), Errno> {
        check_range(off, data.len(), COMPONENT_BLOCK_SIZE)?;
        let cxl = self.device.cxl();
        for (i, b) in data.iter_mut().enumerate() {
            let at = off + i as u64;
            *b = cxl.component_read(at & !3).to_le_bytes()[(at & 3) as usize];
        }
        Ok(())
    }

    fn component_write(&self, off: u64, data: &[u8]) -> Result<(), Errno> {
        check_range(off, data.len(), COMPONENT_BLOCK_SIZE)?;
        let cxl = self.device.cxl();
        let mut at = off;
        let mut rest = data;
        while !rest.is_empty() {
            let dw = at & !3;
            let n = ((4 - (at & 3)) as usize).min(rest.len());
            let mut bytes = cxl.component_read(dw).to_le_bytes();
            bytes[(at & 3) as usize..(at & 3) as usize + n].copy_from_slice(&rest[..n]);
            // A partial write of a status register clears only the bytes written.
            let mut value = u32::from_le_bytes(bytes);
            if n < 4 {
                let mut keep = [0u8; 4];
                keep[(at & 3) as usize..(at & 3) as usize + n].copy_from_slice(&rest[..n]);
                value = (value & !mask_of(at & 3, n)) | u32::from_le_bytes(keep);
            }
            cxl.component_write(dw, value);
            at += n as u64;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// Device memory through messages (QEMU maps the BAR; this serves the rare access it
    /// does not, such as a debugger's).
    fn devmem_access(
        &self,
        off: u64,
        read: Option<&mut [u8]>,
        write: Option<&[u8]>,
    ) -> Result<(), Errno> {
        let len = read.as_ref().map_or(0, |d| d.len()) + write.map_or(0, |d| d.len());
        check_range(off, len, self.devmem_size())?;
        let slice = self
            .device
            .devmem()
            .slice(off, len as u64)
            .ok_or(Errno::EINVAL)?;
        if let Some(d) = read {
            slice.copy_to(d);
        }
        if let Some(d) = write {
            slice.copy_from(d);
        }
        Ok(())
    }

    /// The guest memory the queues see: every region QEMU gave with a file.
    /// Peers' memory for the device: the files opened before the sandbox.
    pub fn set_peers(&mut self, peers: Peers) {
        self.peers = peers;
    }

    /// Backs each mapping QEMU gave without a file with the peer memory it is, where a
    /// peer is known to be there. Returns whether it mapped any (to publish).
    fn resolve_peers(&mut self) -> bool {
        let own = self.device.layout().devmem_gpa;
        let mut changed = false;
        for i in 0..self.maps.len() {
            let m = &self.maps[i];
            if m.region.is_some() || self.peers.is_empty() || Some(m.iova) == own {
                continue;
            }
            let taken: Vec<usize> = self.maps.iter().filter_map(|m| m.peer).collect();
            let (iova, size) = (m.iova, m.size);
            match self.peers.find(iova, size, &taken) {
                Found::Peer(p) => match self.peers.map(p, iova, size) {
                    Ok(region) => {
                        self.maps[i].region = Some(region);
                        self.maps[i].peer = Some(p);
                        changed = true;
                    }
                    Err(e) => log::warn!("cannot map peer memory at {iova:#x}: {e}"),
                },
                Found::Ambiguous if !m.ambiguous => {
                    log::warn!(
                        "memory at {iova:#x} ({size} bytes) could be any of several peers of \
                         that size and none's state file says which; copies there fail"
                    );
                    self.maps[i].ambiguous = true;
                }
                Found::Ambiguous | Found::None => {}
            }
        }
        changed
    }

    fn publish_memory(&mut self) -> Result<(), Errno> {
        // In address order, as guest memory wants them (QEMU maps in any order).
        let mut regions: Vec<Arc<GuestRegionMmap>> =
            self.maps.iter().filter_map(|m| m.region.clone()).collect();
        regions.sort_by_key(|r| r.start_addr());
        let mem = if regions.is_empty() {
            GuestMemoryMmap::new()
        } else {
            GuestMemoryMmap::from_arc_regions(regions).map_err(|_| Errno::EINVAL)?
        };
        if let Err(e) = self.device.update_peers(&mem) {
            log::warn!("guest memory: {e}");
        }
        self.virtio
            .set_memory(Arc::new(mem))
            .map_err(|_| Errno::ENOMEM)?;
        if !self.replaying {
            self.virtio.enable_resumed();
        }
        Ok(())
    }
}

fn mask_of(at: u64, n: usize) -> u32 {
    let bits = if n >= 4 {
        u32::MAX
    } else {
        (1u32 << (8 * n)) - 1
    };
    bits << (8 * at)
}

fn check_range(off: u64, len: usize, size: u64) -> Result<(), Errno> {
    match off.checked_add(len as u64) {
        Some(end) if end <= size && len > 0 => Ok(()),
        _ => Err(Errno::EINVAL),
    }
}

impl Function for CxlFunction {
    fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            flags: DEVICE_RESET | DEVICE_PCI,
            num_regions: NUM_REGIONS,
            num_irqs: NUM_IRQS,
        }
    }

    fn region_info(&self, index: u32) -> Result<(RegionInfo, Option<File>), Errno> {
        let rw = REGION_READ | REGION_WRITE;
        Ok(match index {
            BAR0 | BAR2 => (
                RegionInfo {
                    flags: rw,
                    size: self.bar_size(index as usize),
                    offset: 0,
                },
                None,
            ),
            BAR4 => {
                let file = self.device.devmem().file().map_err(|_| Errno::EIO)?;
                (
                    RegionInfo {
                        flags: rw | REGION_MMAP,
                        size: self.devmem_size(),
                        offset: 0,
                    },
                    Some(file),
                )
            }
            CONFIG => (
                RegionInfo {
                    flags: rw,
                    size: CONFIG_SIZE as u64,
                    offset: 0,
                },
                None,
            ),
            i if i < NUM_REGIONS => (RegionInfo::default(), None),
            _ => return Err(Errno::EINVAL),
        })
    }

    fn irq_info(&self, index: u32) -> Result<IrqInfo, Errno> {
        match index {
            IRQ_MSIX => Ok(IrqInfo {
                flags: IRQ_INFO_EVENTFD,
                count: virtio::MSIX_VECTORS as u32,
            }),
            i if i < NUM_IRQS => Ok(IrqInfo::default()),
            _ => Err(Errno::EINVAL),
        }
    }

    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno> {
        self.end_replay();
        match region {
            CONFIG => self.config_read(offset, data),
            BAR0 => {
                check_range(offset, data.len(), virtio::BAR0_SIZE)?;
                self.virtio.read(offset, data);
                Ok(())
            }
            BAR2 => self.component_read(offset, data),
            BAR4 => self.devmem_access(offset, Some(data), None),
            _ => Err(Errno::EINVAL),
        }
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        self.end_replay();
        match region {
            CONFIG => {
                let done = self.config_write(offset, data);
                self.save();
                done
            }
            BAR0 => {
                check_range(offset, data.len(), virtio::BAR0_SIZE)?;
                self.virtio.write(offset, data);
                // Doorbells change nothing a successor needs: only the set-up is saved.
                if offset < virtio::COMMON + virtio::COMMON_LEN {
                    self.save();
                }
                Ok(())
            }
            BAR2 => self.component_write(offset, data),
            BAR4 => self.devmem_access(offset, None, Some(data)),
            _ => Err(Errno::EINVAL),
        }
    }

    fn dma_map(&mut self, map: DmaMap) -> Result<(), Errno> {
        let end = map.iova.checked_add(map.size).ok_or(Errno::EINVAL)?;
        if map.size == 0
            || self
                .maps
                .iter()
                .any(|m| m.iova < end && map.iova < m.iova + m.size)
        {
            return Err(Errno::EEXIST);
        }
        let region = match map.fd {
            Some(file) => {
                let len = usize::try_from(map.size).map_err(|_| Errno::EINVAL)?;
                let prot = if map.flags & DMA_MAP_WRITE != 0 {
                    libc::PROT_READ | libc::PROT_WRITE
                } else {
                    libc::PROT_READ
                };
                let mmap = MmapRegion::build(
                    Some(FileOffset::new(file, map.offset)),
                    len,
                    prot,
                    libc::MAP_SHARED,
                )
                .map_err(|e| {
                    log::warn!(
                        "DMA_MAP of {:#x} ({} bytes at offset {:#x} of its file) refused: {e}",
                        map.iova,
                        map.size,
                        map.offset
                    );
                    Errno::EINVAL
                })?;
                let r = GuestRegionMmap::new(mmap, GuestAddress(map.iova)).ok_or(Errno::EINVAL)?;
                Some(Arc::new(r))
            }
            None => None,
        };
        self.maps.push(Mapped {
            iova: map.iova,
            size: map.size,
            region,
            peer: None,
            ambiguous: false,
        });
        self.resolve_peers();
        self.publish_memory()
    }

    fn dma_unmap(&mut self, iova: u64, size: u64, flags: u32) -> Result<(), Errno> {
        if flags & DMA_UNMAP_ALL != 0 {
            self.maps.clear();
        } else {
            let before = self.maps.len();
            self.maps.retain(|m| !(m.iova == iova && m.size == size));
            if self.maps.len() == before {
                return Err(Errno::ENOENT);
            }
        }
        self.resolve_peers();
        self.publish_memory()
    }

    fn set_irqs(&mut self, irqs: SetIrqs) -> Result<(), Errno> {
        if irqs.index != IRQ_MSIX {
            // No INTx, MSI, error or request interrupts: only a disable is accepted.
            return if irqs.count == 0 {
                Ok(())
            } else {
                Err(Errno::EINVAL)
            };
        }
        let end = irqs
            .start
            .checked_add(irqs.count)
            .filter(|&e| e <= virtio::MSIX_VECTORS as u32)
            .ok_or(Errno::EINVAL)?;
        if irqs.flags & IRQ_SET_DATA_NONE != 0 && irqs.count == 0 {
            self.irqs.clear();
            return Ok(());
        }
        if irqs.flags & IRQ_SET_DATA_EVENTFD == 0 {
            return Err(Errno::EINVAL);
        }
        let n = (end - irqs.start) as usize;
        let fds: Vec<Option<File>> = if irqs.fds.is_empty() {
            (0..n).map(|_| None).collect()
        } else if irqs.fds.len() == n {
            irqs.fds.into_iter().map(Some).collect()
        } else {
            return Err(Errno::EINVAL);
        };
        let given = !fds.is_empty() && fds[0].is_some();
        self.irqs.set(irqs.start as usize, fds);
        if self.replaying && given {
            // A spurious interrupt costs the driver a look at its ring; a lost one, a
            // command that never completes.
            (irqs.start..end).for_each(|v| self.irqs.signal(v as u16));
        }
        Ok(())
    }

    /// VFIO_USER_DEVICE_RESET: QEMU's system reset or a secondary bus reset above us, a
    /// conventional reset (sticky RAS registers and device memory stay).
    fn reset(&mut self) -> Result<(), Errno> {
        log::info!("device reset (conventional: CXL.mem registers to their defaults)");
        self.virtio.reset();
        self.device.cxl().conventional_reset();
        self.reset_config();
        self.save();
        Ok(())
    }

    fn disconnected(&mut self) {
        self.virtio.reset();
        // The next client is a new machine: its platform powers the device on.
        self.device.cxl().power_on();
        self.irqs.clear();
        self.maps.clear();
        self.device.set_devmem_gpa(None);
        // The next client starts from a device without queues or memory.
        let serving = Arc::new(Queues::new(
            self.device.clone(),
            self.dispatcher.clone(),
            self.queue_size,
        ));
        match Virtio::new(self.device.clone(), serving, self.irqs.clone()) {
            Ok(v) => self.virtio = v,
            Err(e) => log::error!("cannot set up the function again: {e}"),
        }
        // The reset above cleared the rings from the journal.
        self.save();
    }
}
