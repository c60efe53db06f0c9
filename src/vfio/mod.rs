// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! vfio-user transport (`--attach cxl`): the daemon as a vfio-user server, serving QEMU's
//! `vfio-user-pci` one PCIe function that is both our device (modern virtio-pci, so the
//! guest driver binds as with vhost-user) and a CXL Type-2 endpoint (DVSECs, component
//! registers), with device memory as a BAR mapped straight into the guest.
//!
//! Layers inside: `protocol` (the wire format, validated) and `socket` (framing with file
//! descriptors) carry messages; `server` runs one session per connection and hands each
//! request to a [`Function`]; `function` is the PCI function (config space, BARs, MSI-X),
//! `virtio` its virtio-pci registers and queues (served by the ring layer), `peers` other
//! devices' memory QEMU maps into ours, and the CXL registers come from the device model
//! (`crate::device::cxl`).

pub mod function;
pub mod peers;
pub mod protocol;
pub mod server;
pub mod socket;
pub mod virtio;

use std::fs::File;

pub use protocol::Errno;

/// `DEVICE_GET_INFO`: what the function offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `VFIO_DEVICE_FLAGS_*` (PCI, RESET).
    pub flags: u32,
    pub num_regions: u32,
    pub num_irqs: u32,
}

/// `DEVICE_GET_REGION_INFO` for one region: flags (`REGION_*`), size and the offset in
/// the file handed with it (for a region the client maps).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionInfo {
    pub flags: u32,
    pub size: u64,
    pub offset: u64,
}

/// `DEVICE_GET_IRQ_INFO` for one interrupt index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrqInfo {
    pub flags: u32,
    pub count: u32,
}

/// A `DMA_MAP`: guest-physical range `[iova, iova + size)` of the client's memory, at
/// `offset` in `fd` when the client gave one (ROMs and other devices' BARs come without).
#[derive(Debug)]
pub struct DmaMap {
    pub flags: u32,
    pub offset: u64,
    pub iova: u64,
    pub size: u64,
    pub fd: Option<File>,
}

/// A `DEVICE_SET_IRQS`: `count` vectors of `index` from `start`, with `fds` (one per
/// vector, or none to tear them down) for `DATA_EVENTFD`.
#[derive(Debug)]
pub struct SetIrqs {
    pub flags: u32,
    pub index: u32,
    pub start: u32,
    pub count: u32,
    pub fds: Vec<File>,
}

/// The PCI function a session serves. The server validates message framing and sizes;
/// everything about regions, offsets and values is the function's to check. An error is
/// answered to the client (an error reply with that errno) and the session goes on.
pub trait Function: Send {
    fn device_info(&self) -> DeviceInfo;
    /// A region's info, and the file the client maps it from when it is mappable.
    fn region_info(&self, index: u32) -> Result<(RegionInfo, Option<File>), Errno>;
    fn irq_info(&self, index: u32) -> Result<IrqInfo, Errno>;
    /// Fills `data` from `region` at `offset`.
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno>;
    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<(), Errno>;
    fn dma_map(&mut self, map: DmaMap) -> Result<(), Errno>;
    fn dma_unmap(&mut self, iova: u64, size: u64, flags: u32) -> Result<(), Errno>;
    fn set_irqs(&mut self, irqs: SetIrqs) -> Result<(), Errno>;
    fn reset(&mut self) -> Result<(), Errno>;
    /// The connection ended: drop the client's memory and interrupts, keep device state.
    fn disconnected(&mut self);
}
