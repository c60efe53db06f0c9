// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The function's config space: the header and capabilities built once (PCI Express,
//! MSI-X, the virtio structures, the CXL DVSECs), reads as the guest sees them, writes
//! merged through each register's writable bits, and the BAR registers (sizing, placing
//! device memory).

use super::{CxlFunction, CONFIG_SIZE};
use crate::device::cxl::CxlReset;
use crate::protocol::{SHM_ID_DEVMEM, VIRTIO_ID};
use crate::vfio::virtio;
use crate::vfio::Errno;

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
/// PCIe Device Capabilities: Function Level Reset capable.
const DEVCAP_FLR: u32 = 1 << 28;
/// PCIe Device Control: Initiate Function Level Reset (reads as 0).
const DEVCTL_INITIATE_FLR: u32 = 1 << 15;

impl CxlFunction {
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

    pub(super) fn build_config(&mut self) {
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

        // PCI Express capability v2, an endpoint (role-based error reporting, FLR);
        // link 2.5 GT/s x16.
        let p = PCIE_CAP;
        self.put(p, &[0x10, MSIX_CAP as u8]);
        self.put16(p + 0x02, 0x0002);
        self.put32(p + 0x04, 1 << 15 | DEVCAP_FLR);
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

    pub(super) fn config_read(&self, off: u64, data: &mut [u8]) -> Result<(), Errno> {
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

    pub(super) fn config_write(&mut self, off: u64, data: &[u8]) -> Result<(), Errno> {
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
            // PCIe: device control (status RW1C: nothing to clear; Initiate FLR starts a
            // reset and is not kept), link control, device control 2, link control 2.
            _ if dw == PCIE_CAP + 0x08 => {
                self.merge(dw, value, mask, 0x0000_FFFF & !DEVCTL_INITIATE_FLR);
                if value & mask & DEVCTL_INITIATE_FLR != 0 {
                    self.function_level_reset();
                }
            }
            _ if dw == PCIE_CAP + 0x10 => self.merge(dw, value, mask, 0x0000_FFFF),
            _ if dw == PCIE_CAP + 0x28 => self.merge(dw, value, mask, 0x0000_FFFF),
            _ if dw == PCIE_CAP + 0x30 => self.merge(dw, value, mask, 0x0000_FFFF),
            // MSI-X message control: QEMU emulates it; kept so reads agree.
            _ if dw == MSIX_CAP => self.merge(dw, value, mask, 0xC000_0000),
            _ if (DVSEC_DEVICE + 8..DVSEC_DEVICE + 0x3C).contains(&dw) => {
                let cxl = self.device.cxl();
                if let Some(reset) = cxl.dvsec_device_write((dw - DVSEC_DEVICE) as u64, value, mask)
                {
                    self.cxl_reset(reset);
                }
            }
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

    /// A reset of config space: the command register cleared (memory decoding off) and
    /// device control back to its default. BAR registers keep their values: QEMU owns the
    /// guest's view of them, and the kernel restores config space after a reset anyway.
    pub(super) fn reset_config(&mut self) {
        self.put16(0x04, 0);
        self.put16(PCIE_CAP + 0x08, 0);
        self.update_devmem_gpa();
    }

    /// Function Level Reset: the virtio state (queues stop, status 0) and config space
    /// reset. CXL.cache and CXL.mem state is not the function's (CXL r3.1 9.5): decoders,
    /// DVSEC ranges and locks, RAS and device memory stay, so a region survives. Interrupt
    /// eventfds and DMA maps are QEMU's, which keeps them.
    fn function_level_reset(&mut self) {
        log::info!("function level reset");
        self.virtio.reset();
        self.reset_config();
    }

    /// CXL Reset: the register side happened in the model; the function resets as for FLR
    /// and device memory is zeroed when Mem Clr was enabled, all before the config write
    /// that started it completes, so the guest reads Reset Complete with the work done.
    fn cxl_reset(&mut self, reset: CxlReset) {
        log::info!(
            "CXL reset{}",
            if reset.clear_memory {
                " with memory clear"
            } else {
                ""
            }
        );
        self.function_level_reset();
        if reset.clear_memory {
            self.device.devmem().clear();
        }
    }

    /// Tells the device where the guest put its memory.
    fn update_devmem_gpa(&self) {
        self.device.set_devmem_gpa(self.devmem_gpa());
    }

    /// Where the guest sees device memory: BAR4's address while memory decoding is on
    /// and the BAR holds an address (not a sizing pattern).
    pub(super) fn devmem_gpa(&self) -> Option<u64> {
        let command = u16::from_le_bytes([self.config[0x04], self.config[0x05]]);
        let addr = self.bar_address(4);
        let size = self.bar_size(4);
        let sizing = addr == (!(size - 1)) & 0xFFFF_FFFF_FFFF_FFF0 || addr == 0;
        (command & CMD_MEMORY != 0 && !sizing).then_some(addr)
    }
}
