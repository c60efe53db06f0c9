// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The vfio-user PCI function (`--attach cxl`) driven as QEMU and a guest driver drive it,
//! in process: config space and BARs, guest memory QEMU maps (with and without files),
//! virtio set-up through BAR0 and commands on its ring, down to device and peer memory.

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{memfd, pattern, DriverQueue, TempDir};
use cxl_accel::cli::Args;
use cxl_accel::device::command::encode;
use cxl_accel::device::cxl::{CxlError, RasError};
use cxl_accel::device::devmem::{Access, DeviceMemory, FileId};
use cxl_accel::device::dispatch::Dispatcher;
use cxl_accel::device::state::{self, StateFile};
use cxl_accel::device::{Attach, Device, DeviceConfig};
use cxl_accel::protocol::*;
use cxl_accel::vfio::function::CxlFunction;
use cxl_accel::vfio::peers::Peers;
use cxl_accel::vfio::protocol::{DMA_MAP_READ, DMA_MAP_WRITE, REGION_BAR0, REGION_CONFIG};
use cxl_accel::vfio::virtio::{COMMON, NOTIFY};
use cxl_accel::vfio::{DmaMap, Function};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

const RAM: u64 = 16 << 20;
const DEVMEM: u64 = 4 << 20;
/// Where the guest puts our BAR4 (device memory) and a peer's.
const OUR_BAR4: u64 = 0x1_0000_0000;
const PEER_BAR4: u64 = 0x1_0040_0000;
/// RAM QEMU maps again after the BARs, below them (as the PAM regions at boot).
const LATE_RAM: u64 = 0x8000_0000;
const RING: u64 = 0x10000;
const REQ: u64 = 0x20000;
const RESP: u64 = 0x21000;
const DATA: u64 = 0x100000;
/// Config space: the PCI Express capability and the CXL Device DVSEC.
const PCIE: u64 = 0x40;
const DVSEC: u64 = 0x100;
/// The RAS capability in the component registers.
const RAS: u64 = 0x1000 + 0x80;

/// A function with guest RAM mapped (with its file, as QEMU maps RAM) and, when asked,
/// a peer whose daemon published where the guest sees its memory.
struct Rig {
    f: CxlFunction,
    device: Arc<Device>,
    ram: GuestMemoryMmap,
    q: DriverQueue,
    dir: TempDir,
    /// Guest RAM's file, as QEMU maps it again for a successor.
    ram_file: File,
    our_state: PathBuf,
    peer: PathBuf,
    _peer_state: StateFile,
}

/// QEMU's DMA map of guest RAM.
fn ram_map(file: File) -> DmaMap {
    DmaMap {
        flags: DMA_MAP_READ | DMA_MAP_WRITE,
        offset: 0,
        iova: 0,
        size: RAM,
        fd: Some(file),
    }
}

fn state_path(memory: &Path) -> PathBuf {
    Args::state_path_of(memory)
}

fn memory_file(path: &Path, size: u64) -> FileId {
    let f = File::create(path).unwrap();
    f.set_len(size).unwrap();
    FileId::of(&f).unwrap()
}

impl Rig {
    fn new() -> Rig {
        let dir = TempDir::new();
        let peer = dir.0.join("peer");
        let peer_id = memory_file(&peer, DEVMEM);
        let (peer_state, _) = StateFile::open(&state_path(&peer), peer_id, DEVMEM, false).unwrap();
        peer_state.set_guest_address(Some(PEER_BAR4));

        let ours = dir.0.join("devmem");
        let devmem = DeviceMemory::open(&ours, DEVMEM).unwrap();
        let our_state = state_path(&ours);
        let (st, restored) = StateFile::open(&our_state, devmem.id(), DEVMEM, true).unwrap();
        let cfg = DeviceConfig {
            attach: Attach::Cxl,
            peers: vec![peer.clone()],
            ..Default::default()
        };
        let device = Arc::new(Device::with_state(cfg, devmem, Arc::new(st), restored));
        let dispatcher = Arc::new(Dispatcher::new(1).unwrap());
        let mut f = CxlFunction::new(device.clone(), dispatcher, 256).unwrap();
        f.set_peers(Peers::open(std::slice::from_ref(&peer), state_path));

        let file = memfd("guest-ram", RAM);
        let ram = GuestMemoryMmap::from_arc_regions(vec![Arc::new(
            GuestRegionMmap::new(
                MmapRegion::from_file(FileOffset::new(file.try_clone().unwrap(), 0), RAM as usize)
                    .unwrap(),
                GuestAddress(0),
            )
            .unwrap(),
        )])
        .unwrap();
        let ram_file = file.try_clone().unwrap();
        f.dma_map(ram_map(file)).unwrap();
        Rig {
            f,
            device,
            ram,
            q: DriverQueue::new(RING, 256),
            dir,
            ram_file,
            our_state,
            peer,
            _peer_state: peer_state,
        }
    }

    fn config_write32(&mut self, off: u64, v: u32) {
        self.f
            .region_write(REGION_CONFIG, off, &v.to_le_bytes())
            .unwrap();
    }

    fn config_read32(&mut self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.f.region_read(REGION_CONFIG, off, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    fn common_write(&mut self, off: u64, v: u64, width: usize) {
        self.f
            .region_write(REGION_BAR0, COMMON + off, &v.to_le_bytes()[..width])
            .unwrap();
    }

    /// The guest's PCI set-up: BAR4 placed, memory decoding and bus mastering on.
    fn enable_memory(&mut self) {
        self.config_write32(0x20, OUR_BAR4 as u32 | 0xC);
        self.config_write32(0x24, (OUR_BAR4 >> 32) as u32);
        self.config_write32(0x04, 0x6);
    }

    /// QEMU maps BARs (ours and the peer's) into our DMA space without their files.
    fn map_bars(&mut self) {
        for iova in [OUR_BAR4, PEER_BAR4] {
            self.f
                .dma_map(DmaMap {
                    flags: DMA_MAP_READ | DMA_MAP_WRITE,
                    offset: 0,
                    iova,
                    size: DEVMEM,
                    fd: None,
                })
                .unwrap();
        }
    }

    /// The driver's virtio set-up of the command queue, as virtio_pci_modern does it.
    fn start_driver(&mut self) {
        self.common_write(0x14, 1 | 2, 1);
        self.common_write(0x08, 1, 4);
        self.common_write(0x0C, 1, 4); // VIRTIO_F_VERSION_1
        self.common_write(0x14, 1 | 2 | 8, 1);
        self.common_write(0x16, QUEUE_CMD as u64, 2);
        self.common_write(0x18, 256, 2);
        let (d, a, u) = (self.q.desc_addr(), self.q.avail_addr(), self.q.used_addr());
        self.common_write(0x20, d, 8);
        self.common_write(0x28, a, 8);
        self.common_write(0x30, u, 8);
        self.common_write(0x1C, 1, 2);
        self.common_write(0x14, 1 | 2 | 8 | 4, 1);
    }

    fn common_read8(&mut self, off: u64) -> u8 {
        let mut b = [0u8; 1];
        self.f
            .region_read(REGION_BAR0, COMMON + off, &mut b)
            .unwrap();
        b[0]
    }

    /// The driver's set-up after a reset: a new ring in zeroed memory.
    fn restart_driver(&mut self) {
        self.ram
            .write_slice(&[0u8; 0x8000], GuestAddress(RING))
            .unwrap();
        self.q = DriverQueue::new(RING, 256);
        self.start_driver();
    }

    /// Queues a FILL of device memory [0, 4 KiB) with `byte`, without the doorbell.
    fn queue_fill(&mut self, tag: u64, byte: u8) {
        let pattern = u64::from_ne_bytes([byte; 8]);
        let req = encode::fill(tag, pattern, &[encode::sge(SPACE_DEVMEM, 0, 4096)]);
        self.ram.write_slice(&req, GuestAddress(REQ)).unwrap();
        self.q.push(
            &self.ram,
            &[(REQ, req.len() as u32, false), (RESP, 0x400, true)],
        );
    }

    /// FILL of device memory [off, +len) with `byte`, through the command queue.
    fn fill_devmem(&mut self, id: u64, byte: u8, off: u64, len: u32) {
        let pattern = u64::from_ne_bytes([byte; 8]);
        let req = encode::fill(id, pattern, &[encode::sge(SPACE_DEVMEM, off, len)]);
        assert_eq!(self.call(&req).status, Status::Ok as u32);
    }

    fn devmem_bytes(&self, off: u64, len: usize) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let mut b = vec![0u8; len];
        File::open(self.dir.0.join("devmem"))
            .unwrap()
            .read_exact_at(&mut b, off)
            .unwrap();
        b
    }

    /// A driver's function (memory enabled, queue set up) with what a reset may keep or
    /// drop: 8 KiB of device memory filled with 0xA5 and the CXL state below.
    fn with_state_to_reset() -> Rig {
        let mut r = Rig::new();
        r.enable_memory();
        r.start_driver();
        r.fill_devmem(1, 0xA5, 0, 8192);
        r.set_cxl_state();
        r
    }

    /// After a reset: the driver sets the function up again and is served.
    fn serves_again(&mut self) {
        self.enable_memory();
        self.restart_driver();
        self.fill_devmem(2, 0x5A, 4096, 4096);
        assert!(self.devmem_bytes(4096, 4096).iter().all(|&b| b == 0x5A));
    }

    /// DVSEC state a reset may keep or drop: the range base set, CONFIG_LOCK set, a
    /// correctable RAS error logged with the masks cleared.
    fn set_cxl_state(&mut self) {
        self.config_write32(DVSEC + 0x24, 0x1000_0000);
        self.config_write32(DVSEC + 0x14, 1);
        let cxl = self.device.cxl();
        cxl.component_write(RAS + 0x10, 0);
        self.device
            .raise_ras(RasError::Correctable { bit: 3 })
            .unwrap();
    }

    /// The daemon dies and a successor (a supervised worker, under its supervisor's locks)
    /// starts over the same files, `resume` as `--supervise` starts it, and gets QEMU's
    /// DMA map of guest RAM replayed.
    fn take_over(&mut self, resume: bool) {
        let ours = self.dir.0.join("devmem");
        let access = Access {
            lock: false,
            group: None,
        };
        let devmem = DeviceMemory::open_with(&ours, DEVMEM, access).unwrap();
        let (st, restored) = StateFile::open(&self.our_state, devmem.id(), DEVMEM, false).unwrap();
        let cfg = DeviceConfig {
            attach: Attach::Cxl,
            ..Default::default()
        };
        let device = Arc::new(Device::with_state(cfg, devmem, Arc::new(st), restored));
        let dispatcher = Arc::new(Dispatcher::new(1).unwrap());
        let mut f = CxlFunction::with_resume(device.clone(), dispatcher, 256, resume).unwrap();
        f.dma_map(ram_map(self.ram_file.try_clone().unwrap()))
            .unwrap();
        self.f = f;
        self.device = device;
    }

    fn call(&mut self, req: &[u8]) -> Resp {
        self.ram.write_slice(req, GuestAddress(REQ)).unwrap();
        self.q.push(
            &self.ram,
            &[(REQ, req.len() as u32, false), (RESP, 0x400, true)],
        );
        // The doorbell of the command queue.
        self.f
            .region_write(REGION_BAR0, NOTIFY, &(QUEUE_CMD as u16).to_le_bytes())
            .unwrap();
        self.q
            .wait_used(&self.ram, Duration::from_secs(20))
            .expect("the device did not complete the request");
        self.ram.read_obj(GuestAddress(RESP)).unwrap()
    }
}

#[test]
fn config_space_is_a_virtio_device_with_the_dvsecs_of_a_cxl_type2_endpoint() {
    let mut r = Rig::new();
    assert_eq!(r.config_read32(0x00), 0x1040_1AF4 + (VIRTIO_ID << 16));
    // CXL Device DVSEC (ID 0) at 0x100, then Flex Bus Port (7), then Register Locator (8).
    let mut at = 0x100u64;
    let mut ids = Vec::new();
    while at != 0 {
        let header = r.config_read32(at);
        assert_eq!(header & 0xFFFF, 0x23, "a DVSEC at {at:#x}");
        let h1 = r.config_read32(at + 4);
        assert_eq!(h1 & 0xFFFF, 0x1E98, "the CXL vendor ID");
        ids.push(r.config_read32(at + 8) & 0xFFFF);
        at = (header >> 20) as u64;
    }
    assert_eq!(ids, [0, 7, 8]);
    // The register locator names the component registers (block 1) in BAR2.
    assert_eq!(r.config_read32(0x160 + 0xC) & 0xFF07, 0x0102);
}

#[test]
fn our_bar_is_our_memory_and_a_peers_bar_reaches_the_peers_file() {
    let mut r = Rig::new();
    r.enable_memory();
    assert_eq!(r.device.layout().devmem_gpa, Some(OUR_BAR4));
    // Published for the peers' daemons.
    let our_id = FileId::of(&File::open(r.dir.0.join("devmem")).unwrap()).unwrap();
    let st = File::open(&r.our_state).unwrap();
    assert_eq!(state::guest_address_of(&st, our_id), Some(OUR_BAR4));

    r.map_bars();
    assert_eq!(r.device.layout().peers, [(PEER_BAR4, DEVMEM)]);
    // RAM below the BARs, mapped after them (QEMU maps in no particular order).
    let high = memfd("late-ram", 1 << 20);
    std::os::unix::fs::FileExt::write_all_at(&high, b"from late RAM", 0).unwrap();
    r.f.dma_map(DmaMap {
        flags: DMA_MAP_READ | DMA_MAP_WRITE,
        offset: 0,
        iova: LATE_RAM,
        size: 1 << 20,
        fd: Some(high),
    })
    .unwrap();
    r.start_driver();

    // Guest RAM to the peer's memory, by guest-physical address: peer-to-peer.
    let data = pattern(64 << 10, 7);
    r.ram.write_slice(&data, GuestAddress(DATA)).unwrap();
    let req = encode::copy(
        1,
        &[encode::sge(SPACE_GPA, DATA, data.len() as u32)],
        &[encode::sge(SPACE_GPA, PEER_BAR4 + 4096, data.len() as u32)],
    );
    let resp = r.call(&req);
    assert_eq!(resp.status, Status::Ok as u32);
    let mut back = vec![0u8; data.len()];
    use std::os::unix::fs::FileExt;
    File::open(&r.peer)
        .unwrap()
        .read_exact_at(&mut back, 4096)
        .unwrap();
    assert!(back == data, "the peer's memory holds what was copied");
    assert!(r.device.stat(STAT_BYTES_P2P) >= data.len() as u64);

    // Our own BAR by guest-physical address is our device memory.
    let req = encode::copy(
        2,
        &[encode::sge(SPACE_GPA, DATA, 4096)],
        &[encode::sge(SPACE_GPA, OUR_BAR4 + 8192, 4096)],
    );
    assert_eq!(r.call(&req).status, Status::Ok as u32);
    let mut ours = vec![0u8; 4096];
    File::open(r.dir.0.join("devmem"))
        .unwrap()
        .read_exact_at(&mut ours, 8192)
        .unwrap();
    assert!(ours == data[..4096], "our memory holds what was copied");

    // From RAM mapped late to the peer.
    let req = encode::copy(
        3,
        &[encode::sge(SPACE_GPA, LATE_RAM, 13)],
        &[encode::sge(SPACE_GPA, PEER_BAR4, 13)],
    );
    assert_eq!(r.call(&req).status, Status::Ok as u32);
    let mut back = [0u8; 13];
    File::open(&r.peer)
        .unwrap()
        .read_exact_at(&mut back, 0)
        .unwrap();
    assert_eq!(&back, b"from late RAM");

    // QEMU takes the peer's BAR away (the guest moved it): copies there fail cleanly.
    r.f.dma_unmap(PEER_BAR4, DEVMEM, 0).unwrap();
    assert!(r.device.layout().peers.is_empty());
    let resp = r.call(&encode::fill(
        4,
        0x55,
        &[encode::sge(SPACE_GPA, PEER_BAR4, 4096)],
    ));
    assert_ne!(resp.status, Status::Ok as u32);
}

#[test]
fn a_mapping_without_a_file_that_is_no_peers_stays_out_of_reach() {
    let mut r = Rig::new();
    r.enable_memory();
    // A device of the peer's size, where the peer's daemon says the peer is not.
    r.f.dma_map(DmaMap {
        flags: DMA_MAP_READ | DMA_MAP_WRITE,
        offset: 0,
        iova: 0x2_0000_0000,
        size: DEVMEM,
        fd: None,
    })
    .unwrap();
    assert!(r.device.layout().peers.is_empty());
    r.start_driver();
    let resp = r.call(&encode::fill(
        1,
        0x55,
        &[encode::sge(SPACE_GPA, 0x2_0000_0000, 4096)],
    ));
    assert_ne!(resp.status, Status::Ok as u32);
    // Nothing reached the peer's file.
    let mut back = [0u8; 4096];
    use std::os::unix::fs::FileExt;
    File::open(&r.peer)
        .unwrap()
        .read_exact_at(&mut back, 0)
        .unwrap();
    assert!(back.iter().all(|&b| b == 0));
}

/// Drains the device's events: (kind, value0, value1) each.
fn events(device: &Device) -> Vec<(u32, u64, u64)> {
    std::iter::from_fn(|| device.pop_event())
        .map(|e| (e.kind, e.value0, e.value1))
        .collect()
}

#[test]
fn ras_errors_set_their_status_and_are_signalled_unless_masked() {
    let rig = Rig::new();
    let dev = &rig.device;
    let cxl = dev.cxl();
    events(dev);

    // Masked at reset, as on hardware: the status is set, nothing is signalled.
    let r = dev.raise_ras(RasError::Correctable { bit: 2 }).unwrap();
    assert!(!r.unmasked);
    assert_eq!(cxl.component_read(RAS + 0x0C), 1 << 2);
    assert!(events(dev).iter().all(|e| e.0 != EVENT_CXL_RAS));

    // The driver unmasks; the next error is signalled with its class and bit.
    cxl.component_write(RAS + 0x10, 0);
    cxl.component_write(RAS + 0x04, 0);
    assert!(
        dev.raise_ras(RasError::Correctable { bit: 5 })
            .unwrap()
            .unmasked
    );
    let header = [0x1111, 0x2222, 0x3333, 0x4444];
    let r = dev.raise_ras(RasError::Uncorrectable { bit: 14, header });
    assert!(r.unwrap().unmasked);
    let ras: Vec<_> = events(dev)
        .into_iter()
        .filter(|e| e.0 == EVENT_CXL_RAS)
        .collect();
    assert_eq!(
        ras,
        vec![(EVENT_CXL_RAS, 0, 1 << 5), (EVENT_CXL_RAS, 1, 1 << 14)]
    );

    // The registers the driver reads: status, first error pointer, header log.
    assert_eq!(cxl.component_read(RAS + 0x0C), (1 << 2) | (1 << 5));
    assert_eq!(cxl.component_read(RAS), 1 << 14);
    assert_eq!(cxl.component_read(RAS + 0x14) & 0x1F, 14);
    let log: Vec<u32> = (0..4)
        .map(|i| cxl.component_read(RAS + 0x18 + 4 * i))
        .collect();
    assert_eq!(log, header);

    // Write 1 to clear.
    cxl.component_write(RAS + 0x0C, (1 << 2) | (1 << 5));
    cxl.component_write(RAS, 1 << 14);
    assert_eq!(
        (cxl.component_read(RAS), cxl.component_read(RAS + 0x0C)),
        (0, 0)
    );

    // Bits the registers do not have are refused.
    assert!(dev.raise_ras(RasError::Correctable { bit: 9 }).is_err());
    assert!(dev
        .raise_ras(RasError::Uncorrectable { bit: 12, header })
        .is_err());
}

#[test]
fn ras_errors_need_the_cxl_attach_mode() {
    let dir = TempDir::new();
    let devmem = DeviceMemory::open(&dir.0.join("devmem"), DEVMEM).unwrap();
    let device = Device::new(DeviceConfig::default(), devmem);
    assert_eq!(
        device
            .raise_ras(RasError::Correctable { bit: 0 })
            .unwrap_err(),
        CxlError::NotCxl
    );
}

#[test]
fn a_function_level_reset_stops_the_queues_and_keeps_cxl_mem_state_and_memory() {
    let mut r = Rig::with_state_to_reset();
    assert_ne!(r.config_read32(PCIE + 4) & (1 << 28), 0, "FLR capable");

    // Initiate FLR (Device Control bit 15): it reads back as 0.
    r.config_write32(PCIE + 8, 1 << 15);
    assert_eq!(r.config_read32(PCIE + 8) & 0xFFFF, 0);
    assert_eq!(r.common_read8(0x14), 0, "virtio status reset");
    assert_eq!(r.config_read32(0x04) & 0x7, 0, "memory decoding off");
    assert_eq!(r.device.layout().devmem_gpa, None);
    // CXL.mem state and device memory are not the function's.
    assert_eq!(r.config_read32(DVSEC + 0x24), 0x1000_0000);
    assert_eq!(r.config_read32(DVSEC + 0x14), 1);
    assert_eq!(r.device.cxl().component_read(RAS + 0x0C), 1 << 3);
    assert!(r.devmem_bytes(0, 8192).iter().all(|&b| b == 0xA5));

    r.serves_again();
}

#[test]
fn a_cxl_reset_with_mem_clr_zeroes_device_memory_and_keeps_the_locked_registers() {
    let mut r = Rig::with_state_to_reset();

    // Without Mem Clr: memory stays.
    r.config_write32(DVSEC + 0x10, 1 << 2);
    assert_eq!(
        r.config_read32(DVSEC + 0x10) >> 16 & 0x7,
        1 << 1,
        "Reset Complete"
    );
    assert!(r.devmem_bytes(0, 8192).iter().all(|&b| b == 0xA5));
    assert_eq!(r.common_read8(0x14), 0, "the function was reset too");

    // With Mem Clr.
    r.config_write32(DVSEC + 0x10, (1 << 2) | (1 << 3));
    assert_eq!(r.config_read32(DVSEC + 0x10) >> 16 & 0x7, 1 << 1);
    assert!(r.devmem_bytes(0, 8192).iter().all(|&b| b == 0));
    // Locked by CONFIG_LOCK: kept. RAS: sticky.
    assert_eq!(r.config_read32(DVSEC + 0x24), 0x1000_0000);
    assert_eq!(r.config_read32(DVSEC + 0x14), 1);
    assert_eq!(r.device.cxl().component_read(RAS + 0x0C), 1 << 3);

    r.serves_again();
}

#[test]
fn a_conventional_reset_drops_the_dvsec_state_and_keeps_ras_and_memory() {
    let mut r = Rig::with_state_to_reset();

    // What QEMU sends for a system reset or a secondary bus reset above us.
    r.f.reset().unwrap();
    assert_eq!(r.common_read8(0x14), 0);
    assert_eq!(r.config_read32(DVSEC + 0x24), 0);
    assert_eq!(r.config_read32(DVSEC + 0x14), 0);
    assert_eq!(r.device.cxl().component_read(RAS + 0x0C), 1 << 3);
    assert!(r.devmem_bytes(0, 8192).iter().all(|&b| b == 0xA5));

    // A new client (a new machine) powers the device on: RAS goes too.
    r.f.disconnected();
    assert_eq!(r.device.cxl().component_read(RAS + 0x0C), 0);
}

/// What a driver can read of the function: command, BAR4, virtio status, the DVSEC's lock
/// and range base, RAS status.
fn visible_state(r: &mut Rig) -> [u32; 7] {
    [
        r.config_read32(0x04) & 0xFFFF,
        r.config_read32(0x20),
        r.config_read32(0x24),
        r.common_read8(0x14) as u32,
        r.config_read32(DVSEC + 0x14),
        r.config_read32(DVSEC + 0x24),
        r.device.cxl().component_read(RAS + 0x0C),
    ]
}

#[test]
fn a_successor_takes_over_the_registers_and_the_ring_a_dead_daemon_left() {
    let mut r = Rig::with_state_to_reset();
    let before = visible_state(&mut r);
    // A request the guest queued and rang for as the daemon died: never seen by it.
    r.queue_fill(7, 0x3C);

    r.take_over(true);
    // Nothing runs until the replay is over, which the first region access says.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(r.q.wait_used(&r.ram, Duration::ZERO), None);
    assert_eq!(visible_state(&mut r), before);
    assert_eq!(r.device.layout().devmem_gpa, Some(OUR_BAR4));
    // The queued request is served without a new doorbell, then the ring goes on.
    r.q.wait_used(&r.ram, Duration::from_secs(20))
        .expect("the successor did not serve the queued request");
    let resp: Resp = r.ram.read_obj(GuestAddress(RESP)).unwrap();
    assert_eq!((resp.tag, resp.status), (7, Status::Ok as u32));
    assert!(r.devmem_bytes(0, 4096).iter().all(|&b| b == 0x3C));
    r.fill_devmem(8, 0x77, 4096, 4096);
    assert!(r.devmem_bytes(4096, 4096).iter().all(|&b| b == 0x77));
}

#[test]
fn a_daemon_that_starts_afresh_takes_nothing_over() {
    let mut r = Rig::with_state_to_reset();
    r.take_over(false);
    assert_eq!(visible_state(&mut r), [0, 0xC, 0, 0, 0, 0, 0]);
}

#[test]
fn a_ring_set_up_again_after_a_reset_is_new_to_a_successor() {
    let mut r = Rig::with_state_to_reset();
    // The driver resets the device and sets the same ring up again (a reload), queues a
    // request and the daemon dies before the doorbell: the journal's record of the ring
    // is the old one's, which must not be taken for it.
    r.common_write(0x14, 0, 1);
    r.restart_driver();
    r.queue_fill(9, 0x6B);
    r.take_over(true);
    assert_eq!(r.common_read8(0x14), 1 | 2 | 8 | 4);
    r.q.wait_used(&r.ram, Duration::from_secs(20))
        .expect("the successor did not serve the new ring");
    let resp: Resp = r.ram.read_obj(GuestAddress(RESP)).unwrap();
    assert_eq!((resp.tag, resp.status), (9, Status::Ok as u32));
    assert!(r.devmem_bytes(0, 4096).iter().all(|&b| b == 0x6B));
}
