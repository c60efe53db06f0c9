// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `--attach cxl --supervise`: the real daemon, driven over its vfio-user socket as QEMU
//! and a guest driver drive it, its worker killed under it. The session QEMU opened goes
//! on (no reconnect), with the registers the guest wrote and the ring it set up, and a
//! hostile client still ends at most its own session.

mod common;

use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::vfio_client::*;
use common::{memfd, wait_for_child, DriverQueue, TempDir};
use cxl_accel::device::command::encode;
use cxl_accel::protocol::{Resp, Status, QUEUE_CMD, SPACE_DEVMEM};
use cxl_accel::vfio::virtio::{COMMON, NOTIFY};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const RAM: u64 = 16 << 20;
const BAR0: u32 = 0;
const BAR4_GPA: u64 = 0x1_0000_0000;
const RING: u64 = 0x10000;
const REQ: u64 = 0x20000;
const RESP: u64 = 0x21000;
/// The CXL Device DVSEC in config space.
const DVSEC: u64 = 0x100;
/// MSI-X index and the vector the command queue uses.
const IRQ_MSIX: u32 = 2;
const VECTOR: u16 = 1;

/// The daemon under `--supervise --attach cxl`, in a directory of its own.
struct Daemon {
    child: Child,
    dir: TempDir,
    /// Reads the daemon's log as it comes (a full pipe would stop the daemon) and returns
    /// it at the end.
    log: Option<std::thread::JoinHandle<String>>,
}

impl Daemon {
    fn start() -> Daemon {
        Daemon::start_with(&mut Command::new(env!("CARGO_BIN_EXE_cxl-accel")))
    }

    fn start_with(cmd: &mut Command) -> Daemon {
        let dir = TempDir::new();
        let child = cmd
            .args(["--attach", "cxl", "--supervise", "--memory-size", "256M"])
            .arg("--memory-path")
            .arg(dir.0.join("mem"))
            .arg("--socket-path")
            .arg(dir.0.join("sock"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut child = child;
        let mut stderr = child.stderr.take().unwrap();
        let log = std::thread::spawn(move || {
            let mut log = String::new();
            let _ = stderr.read_to_string(&mut log);
            log
        });
        let d = Daemon {
            child,
            dir,
            log: Some(log),
        };
        let t = Instant::now();
        while UnixStream::connect(d.socket()).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "no socket");
            std::thread::sleep(Duration::from_millis(10));
        }
        d
    }

    fn socket(&self) -> std::path::PathBuf {
        self.dir.0.join("sock")
    }

    /// A client past VERSION (the probe connection above was served and ended first).
    fn client(&self) -> Client {
        let s = UnixStream::connect(self.socket()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut c = Client { s, next_id: 100 };
        c.version();
        c
    }

    fn worker(&self, not: Option<u32>) -> u32 {
        wait_for_child(self.child.id(), not)
    }

    /// SIGTERM; the supervisor's log.
    fn stop(mut self) -> String {
        // SAFETY: sends a signal to our child; no memory is involved.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap();
        self.log.take().unwrap().join().unwrap()
    }
}

fn kill(pid: u32) {
    // SAFETY: sends a signal to a process id; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
}

/// What the guest sees: RAM (a memfd QEMU maps to the device) and its command ring.
struct Guest {
    ram: GuestMemoryMmap,
    ram_file: std::fs::File,
    q: DriverQueue,
    irq: EventFd,
}

impl Guest {
    fn new() -> Guest {
        let ram_file = memfd("guest-ram", RAM);
        let region = MmapRegion::from_file(
            FileOffset::new(ram_file.try_clone().unwrap(), 0),
            RAM as usize,
        )
        .unwrap();
        let ram = GuestMemoryMmap::from_arc_regions(vec![Arc::new(
            GuestRegionMmap::new(region, GuestAddress(0)).unwrap(),
        )])
        .unwrap();
        Guest {
            ram,
            ram_file,
            q: DriverQueue::new(RING, 256),
            irq: EventFd::new(EFD_NONBLOCK).unwrap(),
        }
    }
}

fn write(c: &mut Client, region: u32, offset: u64, data: &[u8]) {
    let payload = access(offset, region, data.len() as u32).bytes(data).0;
    c.call(REGION_WRITE_CMD, &payload).ok();
}

fn read32(c: &mut Client, region: u32, offset: u64) -> u32 {
    let r = c.call(REGION_READ_CMD, &access(offset, region, 4).0);
    r.ok();
    r.u32(16)
}

/// QEMU's and the guest's set-up: RAM mapped, MSI-X vectors, BAR4 placed with memory
/// decoding on, the DVSEC range locked, the command queue enabled on vector `VECTOR`.
fn set_up(c: &mut Client, g: &Guest) {
    let map = dma_map(32, 3, 0, 0, RAM);
    c.call_fds(DMA_MAP, &map, &[g.ram_file.as_raw_fd()]).ok();
    let fds: Vec<RawFd> = (0..=VECTOR).map(|_| g.irq.as_raw_fd()).collect();
    let irqs = set_irqs(EVENTFD_TRIGGER, IRQ_MSIX, 0, fds.len() as u32);
    c.call_fds(SET_IRQS, &irqs, &fds).ok();
    write(c, CONFIG, 0x20, &(BAR4_GPA as u32 | 0xC).to_le_bytes());
    write(c, CONFIG, 0x24, &((BAR4_GPA >> 32) as u32).to_le_bytes());
    write(c, CONFIG, 0x04, &6u16.to_le_bytes());
    write(c, CONFIG, DVSEC + 0x24, &0x1000_0000u32.to_le_bytes());
    write(c, CONFIG, DVSEC + 0x14, &1u16.to_le_bytes());
    let common = |c: &mut Client, off: u64, v: u64, width: usize| {
        write(c, BAR0, COMMON + off, &v.to_le_bytes()[..width])
    };
    common(c, 0x14, 1 | 2, 1);
    common(c, 0x08, 1, 4);
    common(c, 0x0C, 1, 4); // VIRTIO_F_VERSION_1
    common(c, 0x14, 1 | 2 | 8, 1);
    common(c, 0x16, QUEUE_CMD as u64, 2);
    common(c, 0x18, 256, 2);
    common(c, 0x1A, VECTOR as u64, 2);
    common(c, 0x20, g.q.desc_addr(), 8);
    common(c, 0x28, g.q.avail_addr(), 8);
    common(c, 0x30, g.q.used_addr(), 8);
    common(c, 0x1C, 1, 2);
    common(c, 0x14, 1 | 2 | 8 | 4, 1);
}

/// What the guest reads of the function: command, BAR4, virtio status, DVSEC lock and
/// range base.
fn registers(c: &mut Client) -> [u32; 6] {
    [
        read32(c, CONFIG, 0x04) & 0xFFFF,
        read32(c, CONFIG, 0x20),
        read32(c, CONFIG, 0x24),
        read32(c, BAR0, COMMON + 0x14) & 0xFF,
        read32(c, CONFIG, DVSEC + 0x14) & 0xFFFF,
        read32(c, CONFIG, DVSEC + 0x24),
    ]
}

/// Queues a FILL of device memory [0, 4 KiB) with `byte`.
fn queue_fill(g: &mut Guest, tag: u64, byte: u8) {
    let req = encode::fill(
        tag,
        u64::from_ne_bytes([byte; 8]),
        &[encode::sge(SPACE_DEVMEM, 0, 4096)],
    );
    g.ram.write_slice(&req, GuestAddress(REQ)).unwrap();
    g.q.push(
        &g.ram,
        &[(REQ, req.len() as u32, false), (RESP, 0x400, true)],
    );
}

fn ring(c: &mut Client) {
    write(c, BAR0, NOTIFY, &(QUEUE_CMD as u16).to_le_bytes());
}

/// The answer to the request queued last, and its interrupt.
fn answer(g: &mut Guest) -> Resp {
    g.q.wait_used(&g.ram, Duration::from_secs(20))
        .expect("no answer");
    let t = Instant::now();
    while g.irq.read().is_err() {
        assert!(t.elapsed() < Duration::from_secs(5), "no interrupt");
        std::thread::sleep(Duration::from_millis(1));
    }
    g.ram.read_obj(GuestAddress(RESP)).unwrap()
}

fn devmem_byte(dir: &Path) -> u8 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 1];
    std::fs::File::open(dir.join("mem"))
        .unwrap()
        .read_exact_at(&mut b, 0)
        .unwrap();
    b[0]
}

#[test]
fn the_session_and_the_ring_go_on_across_worker_kills() {
    let d = Daemon::start();
    let mut c = d.client();
    let mut g = Guest::new();
    set_up(&mut c, &g);
    let before = registers(&mut c);
    assert_eq!(before[0], 6);
    queue_fill(&mut g, 1, 0x11);
    ring(&mut c);
    assert_eq!(answer(&mut g).status, Status::Ok as u32);

    let mut worker = d.worker(None);
    for round in 0..3u8 {
        // Queued before the kill (no doorbell, and the daemon does not poll by default),
        // rung after: the new worker serves it.
        queue_fill(&mut g, 10 + round as u64, 0x20 + round);
        kill(worker);
        worker = d.worker(Some(worker));
        assert_eq!(registers(&mut c), before, "registers after kill {round}");
        ring(&mut c);
        let r = answer(&mut g);
        assert_eq!((r.tag, r.status), (10 + round as u64, Status::Ok as u32));
        assert_eq!(devmem_byte(&d.dir.0), 0x20 + round);
    }
    drop(c);
    let log = d.stop();
    assert_eq!(log.matches("started (resuming)").count(), 3, "{log}");
    assert!(log.contains("taken over from the state file"), "{log}");
}

#[test]
fn hostile_messages_end_at_most_their_own_session() {
    let d = Daemon::start();
    let mut c = d.client();
    // More descriptors than a message may carry: refused, the session goes on.
    let files: Vec<EventFd> = (0..17).map(|_| EventFd::new(0).unwrap()).collect();
    let fds: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
    let irqs = set_irqs(EVENTFD_TRIGGER, IRQ_MSIX, 0, 17);
    assert_eq!(c.call_fds(SET_IRQS, &irqs, &fds).errno(), libc::EINVAL);
    // A payload beyond what any request needs: refused, read through.
    let big = vec![0u8; 2 << 20];
    let payload = access(0, CONFIG, big.len() as u32).bytes(&big).0;
    assert_eq!(c.call(REGION_WRITE_CMD, &payload).errno(), libc::E2BIG);
    assert_eq!(read32(&mut c, CONFIG, 0) & 0xFFFF, 0x1af4);
    // A header whose size cannot be trusted: the session ends, the daemon serves on.
    c.raw(&header(1, REGION_READ_CMD, 8, 0), &[]);
    c.expect_closed();
    let mut next = d.client();
    assert_eq!(read32(&mut next, CONFIG, 0) & 0xFFFF, 0x1af4);
    drop(next);
    let log = d.stop();
    assert!(log.contains("too many file descriptors"), "{log}");
}

#[test]
fn a_client_that_maps_without_end_runs_out_alone() {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cxl-accel"));
    // SAFETY: setrlimit between fork and exec touches no memory of the parent's.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 96,
                rlim_max: 96,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let d = Daemon::start_with(&mut cmd);
    let mut c = d.client();
    let ram = memfd("guest-ram", 1 << 20);
    let (mut mapped, mut refused) = (0, 0);
    for i in 0..200u64 {
        let map = dma_map(32, 3, 0, i << 20, 1 << 20);
        let id = c.send(DMA_MAP, 0, &map, &[ram.as_raw_fd()]);
        match c.try_reply() {
            Some(r) if r.id == id && r.flags == REPLY => mapped += 1,
            Some(r) if r.id == id => refused += 1,
            Some(r) => panic!("a reply to another request: {r:?}"),
            // The supervisor could not keep one more: this session ended.
            None => break,
        }
    }
    assert!(mapped > 0, "{mapped} mapped, {refused} refused");
    drop(c);
    // The next client is served as ever.
    let mut next = d.client();
    assert_eq!(read32(&mut next, CONFIG, 0) & 0xFFFF, 0x1af4);
    drop(next);
    let log = d.stop();
    // Out of descriptors, the supervisor ended that session (or the worker refused maps).
    assert!(
        log.contains("cannot keep the session's set-up") || refused > 0,
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}

/// One random message: a command number around the real ones, any flags, a payload of
/// plausible or lying length (the header may claim more or less than comes), and up to
/// three descriptors (eventfds or a memfd of guest RAM).
fn random_message(c: &mut Client, rng: &mut common::Rng, ram: &std::fs::File, irq: &EventFd) {
    let command = rng.below(20) as u16;
    let flags = match rng.below(4) {
        0 => rng.next() as u32,
        1 => NO_REPLY,
        _ => 0,
    };
    let mut payload: Vec<u8> = (0..rng.below(48)).map(|_| rng.next() as u8).collect();
    if rng.below(3) == 0 {
        // Fields that look real: small offsets, config space or BAR0, a few bytes.
        payload = access(
            rng.below(0x200),
            [CONFIG, 0, 2, 4][rng.below(4) as usize],
            4,
        )
        .bytes(&(rng.next() as u32).to_le_bytes())
        .0;
    }
    let size = match rng.below(8) {
        0 => 16 + rng.below(64) as u32,
        _ => 16 + payload.len() as u32,
    };
    let fds: Vec<RawFd> = match rng.below(4) {
        0 => vec![ram.as_raw_fd()],
        1 => (0..rng.below(4)).map(|_| irq.as_raw_fd()).collect(),
        _ => Vec::new(),
    };
    c.send_sized(command, flags, size, &payload, &fds);
}

#[test]
fn random_messages_through_the_supervisor_end_at_most_their_sessions() {
    let d = Daemon::start();
    let mut rng = common::Rng(0x5eed_cafe_f00d_0001);
    let ram = memfd("guest-ram", RAM);
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut sent = 0;
    for _ in 0..60 {
        let mut c = d.client();
        c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        for _ in 0..rng.below(40) + 1 {
            random_message(&mut c, &mut rng, &ram, &irq);
            sent += 1;
        }
        // Whatever the replies, the session ends when the client goes, and the next one
        // is served.
        c.s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        let _ = c.s.read_to_end(&mut rest);
        drop(c);
        let mut next = d.client();
        assert_eq!(
            read32(&mut next, CONFIG, 0) & 0xFFFF,
            0x1af4,
            "after {sent}"
        );
    }
    let log = d.stop();
    // No worker died: none was restarted, and nothing panicked.
    assert!(!log.contains("restart"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}
