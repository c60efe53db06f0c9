// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The vfio-user server over a real unix socket, driven by a client written here from the
//! protocol's byte layout (not from the crate's encoders) against a mock PCI function:
//! the path QEMU's `vfio-user-pci` takes, then one test per kind of hostile input. Each
//! hostile message must get the error it earns (or end the session when the framing is
//! lost), close the descriptors it brought, and leave the stream in sync.

mod common;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cxl_accel::vfio::protocol::{
    DEVICE_PCI, DEVICE_RESET, IRQ_INFO_EVENTFD, REGION_MMAP, REGION_READ, REGION_WRITE,
};
use cxl_accel::vfio::server::{self, Server, Stopper};
use cxl_accel::vfio::{DeviceInfo, DmaMap, Errno, Function, IrqInfo, RegionInfo, SetIrqs};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use common::memfd;
use common::vfio_client::*;

// What the mock function holds.
const PATTERN: &[u8] = b"device memory";
const RAM_PATTERN: &[u8] = b"guest RAM";

// ---------------------------------------------------------------------------------------
// The mock function: config space and a memfd BAR, and a log of what it was asked.

#[derive(Default)]
struct Log {
    /// (flags, iova, size, the first bytes at offset in the fd, when one came)
    maps: Vec<(u32, u64, u64, Option<Vec<u8>>)>,
    unmaps: Vec<(u64, u64, u32)>,
    /// (flags, index, start, count, descriptors)
    irqs: Vec<(u32, u32, u32, u32, usize)>,
    writes: Vec<(u32, u64, Vec<u8>)>,
    resets: u32,
    disconnects: u32,
}

struct Mock {
    log: Arc<Mutex<Log>>,
    config: Vec<u8>,
    bar: File,
    /// The interrupt descriptors last set, kept as a real function would.
    vectors: Vec<File>,
}

fn config_space() -> Vec<u8> {
    let mut c = vec![0u8; 4096];
    c[0..4].copy_from_slice(&[0xf4, 0x1a, 0x55, 0x10]);
    c[0x100] = 0x23;
    c
}

impl Mock {
    fn new(log: Arc<Mutex<Log>>) -> Mock {
        let bar = memfd("bar", 4096);
        bar.write_all_at(PATTERN, 0).unwrap();
        Mock {
            log,
            config: config_space(),
            bar,
            vectors: Vec::new(),
        }
    }

    fn region(&mut self, region: u32, offset: u64, len: usize) -> Result<usize, Errno> {
        let end = offset.checked_add(len as u64).ok_or(Errno::EINVAL)?;
        if (region == CONFIG || region == 0) && end <= 4096 {
            Ok(offset as usize)
        } else {
            Err(Errno::EINVAL)
        }
    }
}

impl Function for Mock {
    fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            flags: DEVICE_PCI | DEVICE_RESET,
            num_regions: 9,
            num_irqs: 5,
        }
    }

    fn region_info(&self, index: u32) -> Result<(RegionInfo, Option<File>), Errno> {
        match index {
            0 => Ok((
                RegionInfo {
                    flags: REGION_READ | REGION_WRITE | REGION_MMAP,
                    size: 4096,
                    offset: 0,
                },
                Some(self.bar.try_clone().map_err(Errno::from)?),
            )),
            CONFIG => Ok((
                RegionInfo {
                    flags: REGION_READ | REGION_WRITE,
                    size: 4096,
                    offset: 0,
                },
                None,
            )),
            1..=8 => Ok((RegionInfo::default(), None)),
            _ => Err(Errno::EINVAL),
        }
    }

    fn irq_info(&self, index: u32) -> Result<IrqInfo, Errno> {
        match index {
            2 => Ok(IrqInfo {
                flags: IRQ_INFO_EVENTFD,
                count: 8,
            }),
            0 | 1 | 4 => Ok(IrqInfo::default()),
            _ => Err(Errno::EINVAL),
        }
    }

    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno> {
        let at = self.region(region, offset, data.len())?;
        if region == CONFIG {
            data.copy_from_slice(&self.config[at..at + data.len()]);
        } else {
            self.bar.read_exact_at(data, offset).map_err(Errno::from)?;
        }
        Ok(())
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let at = self.region(region, offset, data.len())?;
        if region == CONFIG {
            self.config[at..at + data.len()].copy_from_slice(data);
        } else {
            self.bar.write_all_at(data, offset).map_err(Errno::from)?;
        }
        let mut log = self.log.lock().unwrap();
        log.writes.push((region, offset, data.to_vec()));
        Ok(())
    }

    fn dma_map(&mut self, map: DmaMap) -> Result<(), Errno> {
        let seen = map.fd.as_ref().map(|f| {
            let mut b = vec![0u8; RAM_PATTERN.len()];
            f.read_exact_at(&mut b, map.offset).unwrap();
            b
        });
        let mut log = self.log.lock().unwrap();
        log.maps.push((map.flags, map.iova, map.size, seen));
        Ok(())
    }

    fn dma_unmap(&mut self, iova: u64, size: u64, flags: u32) -> Result<(), Errno> {
        let mut log = self.log.lock().unwrap();
        if !log.maps.iter().any(|m| m.1 == iova && m.2 == size) {
            return Err(Errno::ENOENT);
        }
        log.unmaps.push((iova, size, flags));
        Ok(())
    }

    fn set_irqs(&mut self, irqs: SetIrqs) -> Result<(), Errno> {
        // Fire each vector once so the test sees which descriptor came for which.
        for (k, f) in irqs.fds.iter().enumerate() {
            let mut f: &File = f;
            f.write_all(&(irqs.start as u64 + k as u64 + 1).to_ne_bytes())
                .map_err(Errno::from)?;
        }
        let mut log = self.log.lock().unwrap();
        log.irqs.push((
            irqs.flags,
            irqs.index,
            irqs.start,
            irqs.count,
            irqs.fds.len(),
        ));
        self.vectors = irqs.fds;
        Ok(())
    }

    fn reset(&mut self) -> Result<(), Errno> {
        self.config = config_space();
        self.log.lock().unwrap().resets += 1;
        Ok(())
    }

    fn disconnected(&mut self) {
        self.vectors.clear();
        self.log.lock().unwrap().disconnects += 1;
    }
}

// ---------------------------------------------------------------------------------------
// The server, on a socket of its own in a fresh directory.

static DIRS: AtomicU32 = AtomicU32::new(0);

struct Fixture {
    dir: PathBuf,
    path: PathBuf,
    log: Arc<Mutex<Log>>,
    stopper: Stopper,
    thread: Option<JoinHandle<()>>,
}

impl Fixture {
    fn new() -> Fixture {
        let n = DIRS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("cxl-vfio-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vfio.sock");
        let server = Server::new(server::bind(&path, None).unwrap()).unwrap();
        let log = Arc::new(Mutex::new(Log::default()));
        let mut mock = Mock::new(log.clone());
        let stopper = server.stopper();
        let thread = std::thread::spawn(move || server.serve(&mut mock, None).unwrap());
        Fixture {
            dir,
            path,
            log,
            stopper,
            thread: Some(thread),
        }
    }

    fn connect(&self) -> Client {
        let s = UnixStream::connect(&self.path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        Client { s, next_id: 100 }
    }

    /// A client past the VERSION handshake.
    fn client(&self) -> Client {
        let mut c = self.connect();
        c.version();
        c
    }

    fn log<T>(&self, f: impl FnOnce(&Log) -> T) -> T {
        f(&self.log.lock().unwrap())
    }

    /// Waits until the server has ended `n` sessions.
    fn wait_disconnects(&self, n: u32) {
        let t = Instant::now();
        while self.log(|l| l.disconnects) < n {
            assert!(t.elapsed() < Duration::from_secs(3), "session did not end");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.stopper.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// True when every copy of the pipe's write end is closed (read gives EOF): proves the
/// server did not keep a descriptor it was sent.
fn closed_by_server(reader: std::io::PipeReader) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = reader;
        let mut b = [0u8; 1];
        let _ = tx.send(reader.read(&mut b).ok() == Some(0));
    });
    rx.recv_timeout(Duration::from_secs(2)).unwrap_or(false)
}

// ---------------------------------------------------------------------------------------
// The path QEMU takes.

#[test]
fn a_qemu_like_session_from_version_to_unmap() {
    let fx = Fixture::new();
    let mut c = fx.client();

    // Guest RAM on a memfd, then a ROM without a descriptor.
    let ram = memfd("ram", 1 << 20);
    ram.write_all_at(RAM_PATTERN, 0x2000).unwrap();
    let map = dma_map(32, 3, 0x2000, 0x10_0000, 0x8_0000);
    c.call_fds(DMA_MAP, &map, &[ram.as_raw_fd()]).ok();
    c.call(DMA_MAP, &dma_map(32, 1, 0, 0xfffc_0000, 0x4_0000))
        .ok();
    let maps = fx.log(|l| l.maps.clone());
    assert_eq!(
        maps[0],
        (3, 0x10_0000, 0x8_0000, Some(RAM_PATTERN.to_vec()))
    );
    assert_eq!(maps[1], (1, 0xfffc_0000, 0x4_0000, None));

    let r = c.call(GET_INFO, &P::default().u32(16).u32(0).u32(0).u32(0).0);
    r.ok();
    assert_eq!(r.size, 32);
    assert_eq!((r.u32(0), r.u32(4), r.u32(8), r.u32(12)), (16, 3, 9, 5));

    // BAR0: mappable, its descriptor on the reply, which fits in argsz + 16.
    let r = c.call(GET_REGION_INFO, &region_info(32, 0));
    r.ok();
    assert_eq!(r.size, 48);
    assert_eq!((r.u32(0), r.u32(4), r.u32(8), r.u32(12)), (32, 7, 0, 0));
    assert_eq!((r.u64(16), r.u64(24)), (4096, 0));
    let fd = r.fd.expect("no descriptor with the mappable region");
    // SAFETY: a new shared mapping of 4096 bytes of a descriptor we own; unmapped below
    // and used only in between.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: `p` maps 4096 readable and writable bytes.
    let bar = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), 4096) };
    assert_eq!(&bar[..PATTERN.len()], PATTERN);
    bar[100..104].copy_from_slice(b"gues");
    // SAFETY: unmaps the mapping made above; `bar` is not used after.
    assert_eq!(unsafe { libc::munmap(p, 4096) }, 0);
    let r = c.call(REGION_READ_CMD, &access(100, 0, 4).0);
    assert_eq!(
        &r.ok().payload[16..],
        b"gues",
        "the mapping is the function's BAR"
    );

    // Config space: no descriptor, all 4 KiB in one read, then a write read back.
    let r = c.call(GET_REGION_INFO, &region_info(32, CONFIG));
    assert!(r.ok().fd.is_none());
    assert_eq!((r.u32(4), r.u64(16)), (3, 4096));
    let config = c.read_config(0, 4096);
    assert_eq!(config, config_space());
    let w = c.call(REGION_WRITE_CMD, &access(4, CONFIG, 2).bytes(&[6, 0]).0);
    w.ok();
    assert_eq!(w.size, 32, "a write's reply carries no data");
    assert_eq!((w.u64(0), w.u32(8), w.u32(12)), (4, CONFIG, 2));
    assert_eq!(c.read_config(4, 2), [6, 0]);

    // MSI-X: its info; ERR refused by the function and said so.
    let r = c.call(GET_IRQ_INFO, &P::default().u32(16).u32(0).u32(2).u32(0).0);
    assert_eq!(
        (r.ok().u32(4), r.u32(8), r.u32(12)),
        (IRQ_INFO_EVENTFD, 2, 8)
    );
    let r = c.call(GET_IRQ_INFO, &P::default().u32(16).u32(0).u32(3).u32(0).0);
    assert_eq!(r.errno(), libc::EINVAL);

    // Two vectors from 3: each eventfd reaches the function in order.
    let e1 = EventFd::new(EFD_NONBLOCK).unwrap();
    let e2 = EventFd::new(EFD_NONBLOCK).unwrap();
    let r = c.call_fds(
        SET_IRQS,
        &set_irqs(EVENTFD_TRIGGER, 2, 3, 2),
        &[e1.as_raw_fd(), e2.as_raw_fd()],
    );
    assert_eq!(r.ok().size, 16);
    assert_eq!((e1.read().unwrap(), e2.read().unwrap()), (4, 5));
    c.call(SET_IRQS, &set_irqs(NONE_TRIGGER, 2, 0, 0)).ok();
    let irqs = fx.log(|l| l.irqs.clone());
    assert_eq!(irqs, [(0x24, 2, 3, 2, 2), (0x21, 2, 0, 0, 0)]);

    c.call(RESET, &[]).ok();
    assert_eq!(c.read_config(4, 2), [0, 0], "reset reached the function");
    assert_eq!(fx.log(|l| l.resets), 1);

    // Unmap echoes the entry (40 bytes, QEMU's receive buffer).
    let unmap = P::default().u32(24).u32(0).u64(0x10_0000).u64(0x8_0000).0;
    let r = c.call(DMA_UNMAP, &unmap);
    r.ok();
    assert_eq!(r.size, 40);
    assert_eq!(r.payload, unmap);
    assert_eq!(fx.log(|l| l.unmaps.clone()), [(0x10_0000, 0x8_0000, 0)]);
    // An unmap of nothing is the function's error, answered.
    let r = c.call(
        DMA_UNMAP,
        &P::default().u32(24).u32(0).u64(0x5000).u64(0x1000).0,
    );
    assert_eq!(r.errno(), libc::ENOENT);

    drop(c);
    fx.wait_disconnects(1);
}

// ---------------------------------------------------------------------------------------
// Hostile input.

#[test]
fn a_size_below_the_header_ends_the_session() {
    let fx = Fixture::new();
    let mut c = fx.client();
    c.raw(&header(1, GET_INFO, 8, 0), &[]);
    c.expect_closed();
    fx.wait_disconnects(1);
    fx.client().read_config(0, 4);
}

#[test]
fn an_absurd_size_ends_the_session() {
    let fx = Fixture::new();
    let mut c = fx.client();
    c.raw(&header(1, REGION_WRITE_CMD, 0xffff_fff0, 0), &[]);
    c.expect_closed();
    fx.wait_disconnects(1);
}

#[test]
fn a_large_payload_is_read_through_and_refused() {
    let fx = Fixture::new();
    let mut c = fx.client();
    let big = vec![0x5au8; 2 << 20];
    let id = c.send(REGION_WRITE_CMD, 0, &big, &[]);
    let r = c.try_reply().unwrap();
    assert_eq!(r.id, id);
    assert_eq!(r.errno(), libc::E2BIG);
    assert_eq!(c.read_config(0, 4), [0xf4, 0x1a, 0x55, 0x10]);
    assert!(fx.log(|l| l.writes.is_empty()));
}

#[test]
fn version_must_be_well_formed_and_first() {
    let fx = Fixture::new();
    let mut c = fx.connect();
    // Anything before VERSION.
    let r = c.call(REGION_READ_CMD, &access(0, CONFIG, 4).0);
    assert_eq!(r.errno(), libc::EINVAL);
    // JSON without its NUL.
    let r = c.call(VERSION, &version_payload(0, QEMU_CAPS));
    assert_eq!(r.errno(), libc::EINVAL);
    // Too short for major and minor.
    let r = c.call(VERSION, &[0, 0]);
    assert_eq!(r.errno(), libc::EINVAL);
    // Not JSON, and JSON that is not an object.
    assert_eq!(
        c.call(VERSION, &version_payload(0, "{caps\0")).errno(),
        libc::EINVAL
    );
    assert_eq!(
        c.call(VERSION, &version_payload(0, "[1]\0")).errno(),
        libc::EINVAL
    );
    // A NUL inside.
    assert_eq!(
        c.call(VERSION, &version_payload(0, "{}\0{}\0")).errno(),
        libc::EINVAL
    );
    // Major 1.
    let r = c.call(VERSION, &version_payload(1, &format!("{QEMU_CAPS}\0")));
    assert_eq!(r.errno(), libc::ENOTSUP);
    // Still not negotiated; now a good one, and only one.
    assert_eq!(
        c.call(GET_INFO, &P::default().u32(16).u32(0).u32(0).u32(0).0)
            .errno(),
        libc::EINVAL
    );
    c.version();
    let r = c.call(VERSION, &version_payload(0, &format!("{QEMU_CAPS}\0")));
    assert_eq!(r.errno(), libc::EINVAL);
    c.read_config(0, 4);
}

#[test]
fn a_short_version_request_gets_a_reply_that_fits() {
    let fx = Fixture::new();
    let mut c = fx.connect();
    let payload = version_payload(0, "{}\0");
    let r = c.call(VERSION, &payload);
    r.ok();
    assert!(r.size as usize <= 16 + payload.len());
    assert_eq!(&r.payload[4..], b"{}\0");
    c.read_config(0, 4);
}

#[test]
fn payloads_shorter_or_longer_than_the_command_takes() {
    let fx = Fixture::new();
    let mut c = fx.client();
    let cases: &[(u16, Vec<u8>)] = &[
        (DMA_MAP, dma_map(32, 1, 0, 0, 0x1000)[..24].to_vec()),
        (DMA_UNMAP, P::default().u32(24).u32(0).u64(0).0),
        (GET_INFO, P::default().u32(16).0),
        (GET_REGION_INFO, region_info(32, 0)[..16].to_vec()),
        (GET_REGION_INFO, [region_info(32, 0), vec![0; 8]].concat()),
        (GET_IRQ_INFO, P::default().u32(16).u32(0).u32(2).0),
        (SET_IRQS, set_irqs(NONE_TRIGGER, 2, 0, 0)[..16].to_vec()),
        (REGION_READ_CMD, P::default().u64(0).u32(CONFIG).0),
        (REGION_READ_CMD, access(0, CONFIG, 4).bytes(&[0; 4]).0),
        (REGION_WRITE_CMD, P::default().u64(0).u32(CONFIG).0),
        (RESET, vec![0; 4]),
    ];
    for (command, payload) in cases {
        let r = c.call(*command, payload);
        assert_eq!(
            r.errno(),
            libc::EINVAL,
            "command {command}, {} bytes",
            payload.len()
        );
    }
    assert!(fx.log(|l| l.maps.is_empty() && l.irqs.is_empty() && l.resets == 0));
    c.read_config(0, 4);
}

#[test]
fn argsz_that_lies() {
    let fx = Fixture::new();
    let mut c = fx.client();
    // Smaller than the struct: the reply would not fit.
    assert_eq!(
        c.call(GET_REGION_INFO, &region_info(8, 0)).errno(),
        libc::EINVAL
    );
    let info = P::default().u32(4).u32(0).u32(0).u32(0).0;
    assert_eq!(c.call(GET_INFO, &info).errno(), libc::EINVAL);
    let irq = P::default().u32(15).u32(0).u32(2).u32(0).0;
    assert_eq!(c.call(GET_IRQ_INFO, &irq).errno(), libc::EINVAL);
    // Larger than the payload that came.
    assert_eq!(
        c.call(DMA_MAP, &dma_map(64, 1, 0, 0, 0x1000)).errno(),
        libc::EINVAL
    );
    let unmap = P::default().u32(32).u32(0).u64(0).u64(0x1000).0;
    assert_eq!(c.call(DMA_UNMAP, &unmap).errno(), libc::EINVAL);
    let mut irqs = set_irqs(NONE_TRIGGER, 2, 0, 0);
    irqs[0..4].copy_from_slice(&100u32.to_le_bytes());
    assert_eq!(c.call(SET_IRQS, &irqs).errno(), libc::EINVAL);
    // A generous argsz is fine, and the reply stays 32 bytes of payload.
    let r = c.call(GET_REGION_INFO, &region_info(4096, CONFIG));
    assert_eq!((r.ok().size, r.u32(0)), (48, 32));
    assert!(fx.log(|l| l.maps.is_empty() && l.irqs.is_empty()));
}

#[test]
fn counts_beyond_the_transfer_limit() {
    let fx = Fixture::new();
    let mut c = fx.client();
    let r = c.call(REGION_READ_CMD, &access(0, CONFIG, (1 << 20) + 1).0);
    assert_eq!(r.errno(), libc::E2BIG);
    assert_eq!(
        c.call(REGION_READ_CMD, &access(0, CONFIG, 0).0).errno(),
        libc::EINVAL
    );
    let r = c.call(REGION_READ_CMD, &access(u64::MAX - 1, CONFIG, 4).0);
    assert_eq!(r.errno(), libc::EINVAL);
    // The whole config space in one read is within the limit.
    assert_eq!(c.read_config(0, 4096).len(), 4096);
}

#[test]
fn a_write_whose_count_is_not_its_data() {
    let fx = Fixture::new();
    let mut c = fx.client();
    let r = c.call(
        REGION_WRITE_CMD,
        &access(4, CONFIG, 8).bytes(&[1, 2, 3, 4]).0,
    );
    assert_eq!(r.errno(), libc::EINVAL);
    let r = c.call(
        REGION_WRITE_CMD,
        &access(4, CONFIG, 2).bytes(&[1, 2, 3, 4]).0,
    );
    assert_eq!(r.errno(), libc::EINVAL);
    assert!(fx.log(|l| l.writes.is_empty()));
    assert_eq!(c.read_config(4, 4), [0, 0, 0, 0]);
}

#[test]
fn too_many_descriptors_are_closed_and_refused() {
    let fx = Fixture::new();
    let mut c = fx.client();
    // 17 pipes' write ends on one SET_IRQS for 17 vectors.
    let pipes: Vec<_> = (0..17).map(|_| std::io::pipe().unwrap()).collect();
    let fds: Vec<RawFd> = pipes.iter().map(|(_, w)| w.as_raw_fd()).collect();
    let r = c.call_fds(SET_IRQS, &set_irqs(EVENTFD_TRIGGER, 2, 0, 17), &fds);
    assert_eq!(r.errno(), libc::EINVAL);
    // A DMA_MAP takes at most one.
    let two = std::io::pipe().unwrap();
    let three = std::io::pipe().unwrap();
    let r = c.call_fds(
        DMA_MAP,
        &dma_map(32, 3, 0, 0, 0x1000),
        &[two.1.as_raw_fd(), three.1.as_raw_fd()],
    );
    assert_eq!(r.errno(), libc::EINVAL);
    // A read takes none.
    let four = std::io::pipe().unwrap();
    let r = c.call_fds(
        REGION_READ_CMD,
        &access(0, CONFIG, 4).0,
        &[four.1.as_raw_fd()],
    );
    assert_eq!(r.errno(), libc::EINVAL);
    assert!(fx.log(|l| l.irqs.is_empty() && l.maps.is_empty()));
    c.read_config(0, 4);
    let readers = pipes.into_iter().chain([two, three, four]).map(|(r, w)| {
        drop(w);
        r
    });
    for (i, r) in readers.enumerate() {
        assert!(closed_by_server(r), "descriptor {i} kept by the server");
    }
}

#[test]
fn unknown_commands_are_read_through_and_refused() {
    let fx = Fixture::new();
    let mut c = fx.client();
    let (reader, writer) = std::io::pipe().unwrap();
    let feature = P::default().u32(40).u32(1 << 16).bytes(&[0xee; 32]).0;
    let r = c.call_fds(DEVICE_FEATURE, &feature, &[writer.as_raw_fd()]);
    assert_eq!(r.errno(), libc::ENOTTY);
    drop(writer);
    assert!(closed_by_server(reader), "descriptor kept");
    // The payload looks like a header: a server that did not consume it would answer it.
    let fake = header(7, GET_INFO, 16, 0);
    assert_eq!(c.call(GET_REGION_IO_FDS, &fake).errno(), libc::ENOSYS);
    assert_eq!(c.call(200, &[0; 100]).errno(), libc::ENOSYS);
    // An unknown message type, and a reply from the client (dropped without an answer).
    let id = c.send(
        GET_INFO,
        0x3,
        &P::default().u32(16).u32(0).u32(0).u32(0).0,
        &[],
    );
    let r = c.try_reply().unwrap();
    assert_eq!((r.id, r.errno()), (id, libc::EINVAL));
    c.send(GET_INFO, REPLY, &[0; 16], &[]);
    assert_eq!(c.read_config(0, 4), [0xf4, 0x1a, 0x55, 0x10]);
}

#[test]
fn no_reply_writes_get_no_reply() {
    let fx = Fixture::new();
    let mut c = fx.client();
    c.send(
        REGION_WRITE_CMD,
        NO_REPLY,
        &access(8, CONFIG, 4).bytes(b"abcd").0,
        &[],
    );
    // Even a refused one stays silent.
    c.send(
        REGION_WRITE_CMD,
        NO_REPLY,
        &access(8, CONFIG, 9).bytes(b"abcd").0,
        &[],
    );
    c.send(
        REGION_WRITE_CMD,
        NO_REPLY,
        &access(4096, CONFIG, 4).bytes(b"wxyz").0,
        &[],
    );
    // The first reply that comes is this read's, and it sees the posted write.
    assert_eq!(c.read_config(8, 4), b"abcd");
    assert_eq!(fx.log(|l| l.writes.len()), 1);
}

#[test]
fn eof_in_the_middle_of_a_message_ends_the_session() {
    let fx = Fixture::new();
    let mut c = fx.client();
    c.raw(&header(1, GET_REGION_INFO, 48, 0), &[]);
    c.raw(&[0; 10], &[]);
    drop(c);
    fx.wait_disconnects(1);
    // And in the middle of a header.
    let mut c = fx.client();
    c.raw(&[1, 0, 4], &[]);
    drop(c);
    fx.wait_disconnects(2);
    fx.client().read_config(0, 4);
}

#[test]
fn sessions_follow_each_other() {
    let fx = Fixture::new();
    let mut a = fx.client();
    let ram = memfd("ram", 4096);
    a.call_fds(DMA_MAP, &dma_map(32, 3, 0, 0, 4096), &[ram.as_raw_fd()])
        .ok();
    // A second client waits in the backlog while the first is served.
    let mut b = fx.connect();
    b.s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let payload = version_payload(0, &format!("{QEMU_CAPS}\0"));
    let id = b.send(VERSION, 0, &payload, &[]);
    let mut h = [0u8; 16];
    let e = b.s.read(&mut h).unwrap_err();
    assert_eq!(
        e.kind(),
        std::io::ErrorKind::WouldBlock,
        "served while another session runs"
    );
    a.read_config(0, 4);
    drop(a);
    fx.wait_disconnects(1);
    // Its VERSION is answered now; the new session starts from scratch.
    b.s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let r = b.try_reply().unwrap();
    assert_eq!((r.id, r.ok().command), (id, VERSION));
    b.read_config(0, 4);
    drop(b);
    fx.wait_disconnects(2);
    // A third, after both: VERSION is needed again.
    let mut c = fx.connect();
    assert_eq!(
        c.call(REGION_READ_CMD, &access(0, CONFIG, 4).0).errno(),
        libc::EINVAL
    );
    c.version();
    c.read_config(0, 4);
}

#[test]
fn stop_ends_a_running_session_and_the_server() {
    let mut fx = Fixture::new();
    let mut c = fx.client();
    c.read_config(0, 4);
    fx.stopper.stop();
    let t = fx.thread.take().unwrap();
    let start = Instant::now();
    while !t.is_finished() {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "server did not stop"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    t.join().unwrap();
    c.expect_closed();
    assert_eq!(fx.log(|l| l.disconnects), 1);
}
