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
use crate::device::Device;
use crate::protocol::{SHM_ID_DEVMEM, VIRTIO_ID};
use crate::ring::Queues;

const CONFIG_SIZE: usize = 4096;

// Regions (vfio's PCI region indices) of ours.
const BAR0: u32 = REGION_BAR0;
const BAR2: u32 = 2;
const BAR4: u32 = 4;
/// The BAR of device memory, which a patched QEMU routes the CXL region to (x-cxl-mem-bar).
pub const DEVMEM_BAR: u32 = BAR4;
const CONFIG: u32 = REGION_CONFIG;

// Capabilities.
const PCIE_CAP: usize = 0x40;
const MSIX_CAP: usize = 0x80;
const VIRTIO_CAPS: usize = 0x90;
const DVSEC_DEVICE: usize = 0x100;
const DVSEC_FLEXBUS: usize = 0x140;
const DVSEC_REGLOC: usize = 0x160;
/// The CXL consortium's vendor ID, in every CXL DVSEC.
const CXL_VENDOR: u32 = 0x1E98;

/// Command register: memory space decoding.
const CMD_MEMORY: u16 = 1 << 1;

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
}

impl CxlFunction {
    pub fn new(
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

    fn put(&mut self, off: usize, bytes: &[u8]) {
        self.config[off..off + bytes.len()].copy_from_slice(bytes);
    }

    fn put16(&mut self, off: usize, v: u16) {
        self.put(off, &v.to_le_bytes());
    }

    fn put32(&mut self, off: usize, v: u32) {
        self.put(off, &v.to_le_bytes());
    }

    fn get32(&self, off: usize) -> u32 {
        u32::from_le_bytes(self.config[off..off + 4].try_into().unwrap_or([0; 4]))
    }

    fn build_config(&mut self) {
        // Header: virtio (modern device ID), class "processing accelerator" (not CXL
        // memory device, which the cxl_pci driver would claim), status: capability list.
        self.put16(0x00, 0x1AF4);
        self.put16(0x02, 0x1040 + VIRTIO_ID as u16);
        self.put16(0x06, 0x0010);
        self.put32(0x08, 0x1200_0001);
        for bar in 0..6 {
            self.bars[bar] = Self::bar_type(bar);
        }
        self.put16(0x2C, 0x1AF4);
        self.put16(0x2E, 0x1100);
        self.config[0x34] = PCIE_CAP as u8;

        // PCI Express capability v2, an endpoint; link 2.5 GT/s x16.
        let p = PCIE_CAP;
        self.put(p, &[0x10, MSIX_CAP as u8]);
        self.put16(p + 0x02, 0x0002);
        self.put32(p + 0x04, 1 << 15);
        self.put32(p + 0x0C, 0x0000_0101);
        self.put16(p + 0x12, 0x0101);
        self.put32(p + 0x2C, 0x2);

        // MSI-X: table and PBA in BAR0 (QEMU emulates both and the capability).
        let m = MSIX_CAP;
        self.put(m, &[0x11, VIRTIO_CAPS as u8]);
        self.put16(m + 2, virtio::MSIX_VECTORS - 1);
        self.put32(m + 4, virtio::MSIX_TABLE as u32);
        self.put32(m + 8, virtio::MSIX_PBA as u32);

        // virtio capabilities: common, notify, ISR, device, shared memory (device memory).
        let nq = self.virtio.num_queues() as u32;
        let caps: [(u8, u8, u32, u32, u8); 4] = [
            (1, 0, virtio::COMMON as u32, virtio::COMMON_LEN as u32, 16),
            (
                2,
                0,
                virtio::NOTIFY as u32,
                virtio::NOTIFY_MULTIPLIER * nq,
                20,
            ),
            (3, 0, virtio::ISR as u32, 4, 16),
            (
                4,
                0,
                virtio::DEVICE_CFG as u32,
                virtio::DEVICE_CFG_LEN as u32,
                16,
            ),
        ];
        let mut at = VIRTIO_CAPS;
        for (kind, bar, offset, len, cap_len) in caps {
            let next = at + cap_len as usize;
            self.put(at, &[0x09, next as u8, cap_len, kind, bar, 0, 0, 0]);
            self.put32(at + 8, offset);
            self.put32(at + 12, len);
            if kind == 2 {
                self.put32(at + 16, virtio::NOTIFY_MULTIPLIER);
            }
            at = next;
        }
        let size = self.devmem_size();
        self.put(at, &[0x09, 0, 24, 8, 4, SHM_ID_DEVMEM, 0, 0]);
        self.put32(at + 8, 0);
        self.put32(at + 12, size as u32);
        self.put32(at + 16, 0);
        self.put32(at + 20, (size >> 32) as u32);

        // Extended capabilities: the CXL DVSECs (ID 0x23, version 1).
        let dvsec = |next: usize| 0x23 | (1 << 16) | ((next as u32) << 20);
        self.put32(DVSEC_DEVICE, dvsec(DVSEC_FLEXBUS));
        self.put32(DVSEC_DEVICE + 4, CXL_VENDOR | (3 << 16) | (0x3C << 20));
        self.put32(DVSEC_FLEXBUS, dvsec(DVSEC_REGLOC));
        self.put32(DVSEC_FLEXBUS + 4, CXL_VENDOR | (2 << 16) | (0x20 << 20));
        // Flex Bus: cache, IO and mem capable and enabled (read at PCI enumeration).
        self.put32(DVSEC_FLEXBUS + 8, 7 | (0x27 << 16));
        self.put32(DVSEC_FLEXBUS + 0xC, 0x7 | (0x27 << 16));
        self.put32(DVSEC_REGLOC, dvsec(0));
        self.put32(DVSEC_REGLOC + 4, CXL_VENDOR | (0x14 << 20));
        self.put32(DVSEC_REGLOC + 8, 8);
        // Register block 1: component registers (block ID 1) in BAR2 at offset 0.
        self.put32(DVSEC_REGLOC + 0xC, 2 | (1 << 8));
        self.put32(DVSEC_REGLOC + 0x10, 0);
    }

    /// A dword of config space as the guest reads it.
    fn config_dword(&self, off: usize) -> u32 {
        match off {
            0x10..=0x27 => {
                let bar = (off - 0x10) / 4;
                self.bars[bar]
            }
            // No expansion ROM.
            0x30 => 0,
            _ if (DVSEC_DEVICE + 8..DVSEC_DEVICE + 0x3C).contains(&off) => self
                .device
                .cxl()
                .dvsec_device_read((off - DVSEC_DEVICE) as u64),
            _ => self.get32(off),
        }
    }

    fn config_read(&self, off: u64, data: &mut [u8]) -> Result<(), Errno> {
        let end = off.checked_add(data.len() as u64).ok_or(Errno::EINVAL)?;
        if end > CONFIG_SIZE as u64 {
            return Err(Errno::EINVAL);
        }
        for (i, b) in data.iter_mut().enumerate() {
            let at = off as usize + i;
            *b = self.config_dword(at & !3).to_le_bytes()[at & 3];
        }
        Ok(())
    }

    fn config_write(&mut self, off: u64, data: &[u8]) -> Result<(), Errno> {
        let end = off.checked_add(data.len() as u64).ok_or(Errno::EINVAL)?;
        if end > CONFIG_SIZE as u64 || data.is_empty() {
            return Err(Errno::EINVAL);
        }
        // By dword: the value and which of its bytes the write covers.
        let mut at = off as usize;
        let mut rest = data;
        while !rest.is_empty() {
            let dw = at & !3;
            let n = (4 - (at & 3)).min(rest.len());
            let mut value = 0u32;
            let mut mask = 0u32;
            for (k, &byte) in rest[..n].iter().enumerate() {
                let shift = 8 * ((at & 3) + k);
                value |= (byte as u32) << shift;
                mask |= 0xFF << shift;
            }
            self.config_write_dword(dw, value, mask);
            at += n;
            rest = &rest[n..];
        }
        // A BAR of ours placed or enabled may be what tells a peer's mapping from ours.
        if self.resolve_peers() {
            self.publish_memory()?;
        }
        Ok(())
    }

    fn merge(&mut self, dw: usize, value: u32, mask: u32, writable: u32) {
        let m = mask & writable;
        let v = (self.get32(dw) & !m) | (value & m);
        self.put32(dw, v);
    }

    fn config_write_dword(&mut self, dw: usize, value: u32, mask: u32) {
        match dw {
            // Command (IO, memory, bus master, parity, SERR, INTx disable); status RW1C bits
            // stay clear.
            0x04 => {
                self.merge(dw, value, mask, 0x0000_0547);
                self.update_devmem_gpa();
            }
            0x0C => self.merge(dw, value, mask, 0x0000_00FF),
            0x10..=0x24 => {
                let bar = (dw - 0x10) / 4;
                self.write_bar(bar, value, mask);
            }
            0x3C => self.merge(dw, value, mask, 0x0000_00FF),
            // PCIe: device control (status RW1C: nothing to clear), link control, device
            // control 2, link control 2.
            _ if dw == PCIE_CAP + 0x08 => self.merge(dw, value, mask, 0x0000_FFFF),
            _ if dw == PCIE_CAP + 0x10 => self.merge(dw, value, mask, 0x0000_FFFF),
            _ if dw == PCIE_CAP + 0x28 => self.merge(dw, value, mask, 0x0000_FFFF),
            _ if dw == PCIE_CAP + 0x30 => self.merge(dw, value, mask, 0x0000_FFFF),
            // MSI-X message control: QEMU emulates it; kept so reads agree.
            _ if dw == MSIX_CAP => self.merge(dw, value, mask, 0xC000_0000),
            _ if (DVSEC_DEVICE + 8..DVSEC_DEVICE + 0x3C).contains(&dw) => self
                .device
                .cxl()
                .dvsec_device_write((dw - DVSEC_DEVICE) as u64, value, mask),
            _ => {}
        }
    }

    /// A BAR register write: base address bits as the size allows (sizing writes read
    /// back the size mask), type bits fixed; an upper half of a 64-bit BAR all writable.
    fn write_bar(&mut self, bar: usize, value: u32, mask: u32) {
        let upper = matches!(bar, 3 | 5);
        let writable = if upper {
            let size = self.bar_size(bar - 1);
            if size > 1 << 32 {
                !((size >> 32) as u32 - 1)
            } else {
                0xFFFF_FFFF
            }
        } else {
            let size = self.bar_size(bar);
            if size == 0 {
                0
            } else {
                !(size as u32).wrapping_sub(1) & !0xF
            }
        };
        let m = mask & writable;
        self.bars[bar] = (self.bars[bar] & !m) | (value & m);
        if !upper {
            self.bars[bar] = (self.bars[bar] & !0xF) | Self::bar_type(bar);
        }
        self.update_devmem_gpa();
    }

    fn bar_address(&self, bar: usize) -> u64 {
        let lo = (self.bars[bar] & !0xF) as u64;
        let hi = if Self::bar_type(bar) & 0x4 != 0 {
            self.bars[bar + 1] as u64
        } else {
            0
        };
        lo | hi << 32
    }

    /// Tells the device where the guest put its memory: BAR4, while memory decoding is on
    /// and the BAR holds an address (not a sizing pattern).
    fn update_devmem_gpa(&self) {
        let command = u16::from_le_bytes([self.config[0x04], self.config[0x05]]);
        let addr = self.bar_address(4);
        let size = self.bar_size(4);
        let sizing = addr == (!(size - 1)) & 0xFFFF_FFFF_FFFF_FFF0 || addr == 0;
        let gpa = (command & CMD_MEMORY != 0 && !sizing).then_some(addr);
        self.device.set_devmem_gpa(gpa);
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

    fn publish_memory(&self) -> Result<(), Errno> {
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
            .map_err(|_| Errno::ENOMEM)
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
        match region {
            CONFIG => self.config_write(offset, data),
            BAR0 => {
                check_range(offset, data.len(), virtio::BAR0_SIZE)?;
                self.virtio.write(offset, data);
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
        self.irqs.set(irqs.start as usize, fds);
        Ok(())
    }

    fn reset(&mut self) -> Result<(), Errno> {
        self.virtio.reset();
        self.device.cxl().reset();
        self.put16(0x04, 0);
        self.update_devmem_gpa();
        Ok(())
    }

    fn disconnected(&mut self) {
        self.virtio.reset();
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
    }
}
