// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! In-process vhost-user front-end for tests and benchmarks: guest memory in a memfd, a
//! minimal driver-side split virtqueue, and the daemon serving a real unix socket.
#![allow(dead_code)]

pub mod vfio_client;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::PathBuf;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cxl_accel::device::devmem::DeviceMemory;
use cxl_accel::device::dispatch::Dispatcher;
use cxl_accel::device::{Device, DeviceConfig};
use cxl_accel::protocol::*;
use cxl_accel::vhost::server;
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{
    ByteValued, Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap,
    GuestRegionMmap, MmapRegion,
};
use vmm_sys_util::eventfd::EventFd;

pub const GUEST_SIZE: u64 = 128 << 20;
pub const DEVMEM_SIZE: u64 = 128 << 20;
/// Where the guest maps the device's BAR (when the test asks for it).
pub const DEVMEM_GPA: u64 = 0x1_0000_0000;
pub const QUEUE_SIZE: u16 = 256;
const RING_BASE: [u64; 2] = [0x0, 0x10000];
const REQ_AREA: u64 = 0x20000;
const RESP_AREA: u64 = 0x80000;
/// Guest memory from here on is free for test data.
pub const DATA: u64 = 0x100000;

pub fn memfd(name: &str, size: u64) -> File {
    let cname = std::ffi::CString::new(name).unwrap();
    // SAFETY: memfd_create with a valid C string; the fd is owned by the returned File.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create failed");
    // SAFETY: fd was just created and is owned by nobody else.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size).unwrap();
    f
}

/// The repository's root (the crate's), where the tests find its files.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The daemon binary, ready for arguments.
pub fn daemon() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_cxl-accel"))
}

/// The single error line of a daemon run that failed (log lines and clap's hint aside).
pub fn one_line_error(out: std::process::Output) -> String {
    assert!(!out.status.success(), "the daemon should have failed");
    let err = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| !l.contains(" INFO ") && !l.trim().is_empty() && !l.starts_with("For more"))
        .collect();
    assert_eq!(lines.len(), 1, "expected one error line, got:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    lines[0].to_string()
}

/// Runs the daemon expecting a failure; returns its single stderr line.
pub fn fails_with_one_line(args: &[&str]) -> String {
    one_line_error(daemon().args(args).output().unwrap())
}

/// Whether the tests run as root (they do in CI): needed to act as another user.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The unprivileged user (and group) the local-attacker tests act as.
pub const NOBODY: u32 = 65534;

/// Runs `f` in a forked child as user `uid` and group `gid` (no supplementary groups) and
/// returns its result (0-255). The test process has other threads, so `f` may only make
/// plain system calls on data prepared before the call (no allocation).
pub fn as_user(uid: u32, gid: u32, f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only makes async-signal-safe calls (setgroups, setgid, setuid, what
    // `f` does by the rule above, _exit); the parent waits for it.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = if libc::setgroups(0, std::ptr::null()) == 0
                && libc::setgid(gid) == 0
                && libc::setuid(uid) == 0
            {
                f()
            } else {
                99
            };
            libc::_exit(code);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status), "child died: {status:#x}");
        libc::WEXITSTATUS(status)
    }
}

/// A path as a C string, for [`as_user`] closures.
pub fn cpath(p: &std::path::Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// The first child of process `pid` (a supervisor's worker).
pub fn child_pid(pid: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

/// Waits (10 s at most) until process `parent` has a child other than `not`.
pub fn wait_for_child(parent: u32, not: Option<u32>) -> u32 {
    let t = Instant::now();
    loop {
        if let Some(p) = child_pid(parent).filter(|&p| Some(p) != not) {
            return p;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no worker process");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// xorshift64*: reproducible random numbers without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Driver side of one split virtqueue.
pub struct DriverQueue {
    /// The queue's call eventfd, to sleep on instead of polling.
    call_fd: Option<i32>,
    /// How long a wait polls the used ring before it sleeps on the call eventfd (a
    /// benchmark sleeps at once: a polling front-end takes CPU the daemon needs).
    pub spin: Duration,
    base: u64,
    size: u16,
    avail_idx: u16,
    used_seen: u16,
    next_desc: u16,
}

impl DriverQueue {
    pub fn new(base: u64, size: u16) -> Self {
        DriverQueue {
            call_fd: None,
            spin: Duration::from_micros(50),
            base,
            size,
            avail_idx: 0,
            used_seen: 0,
            next_desc: 0,
        }
    }
    pub fn desc_addr(&self) -> u64 {
        self.base
    }
    pub fn avail_addr(&self) -> u64 {
        self.base + 16 * self.size as u64
    }
    pub fn used_addr(&self) -> u64 {
        (self.avail_addr() + 6 + 2 * self.size as u64 + 4095) & !4095
    }

    /// Writes a chain of raw descriptors (addr, len, flags, next) and publishes its head.
    /// `None` for next means "the following descriptor" when NEXT is set.
    pub fn push_raw(
        &mut self,
        mem: &GuestMemoryMmap,
        descs: &[(u64, u32, u16, Option<u16>)],
    ) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, flags, next)) in descs.iter().enumerate() {
            let idx = (head + i as u16) % self.size;
            let next = next.unwrap_or((idx + 1) % self.size);
            let a = self.base + 16 * idx as u64;
            mem.write_obj(addr, GuestAddress(a)).unwrap();
            mem.write_obj(len, GuestAddress(a + 8)).unwrap();
            mem.write_obj(flags, GuestAddress(a + 12)).unwrap();
            mem.write_obj(next, GuestAddress(a + 14)).unwrap();
        }
        self.next_desc = (head + descs.len() as u16) % self.size;
        self.publish(mem, head);
        head
    }

    /// Readable buffers then writable ones, chained with NEXT.
    pub fn push(&mut self, mem: &GuestMemoryMmap, bufs: &[(u64, u32, bool)]) -> u16 {
        let n = bufs.len();
        let descs: Vec<_> = bufs
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, write))| {
                let mut flags = if write { 2 } else { 0 };
                if i + 1 < n {
                    flags |= 1;
                }
                (addr, len, flags, None)
            })
            .collect();
        self.push_raw(mem, &descs)
    }

    pub fn publish(&mut self, mem: &GuestMemoryMmap, head: u16) {
        let slot = self.avail_addr() + 4 + 2 * (self.avail_idx % self.size) as u64;
        mem.write_obj(head, GuestAddress(slot)).unwrap();
        fence(Ordering::Release);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.write_obj(self.avail_idx, GuestAddress(self.avail_addr() + 2))
            .unwrap();
    }

    /// Sets the avail index directly (hostile-driver tests).
    pub fn set_avail_idx(&mut self, mem: &GuestMemoryMmap, idx: u16) {
        self.avail_idx = idx;
        mem.write_obj(idx, GuestAddress(self.avail_addr() + 2))
            .unwrap();
    }

    /// Waits for the next used element: (id, len), or None on timeout.
    pub fn wait_used(&mut self, mem: &GuestMemoryMmap, timeout: Duration) -> Option<(u32, u32)> {
        let start = Instant::now();
        // EVENT_IDX: ask for a notification once the device passes what we have seen.
        let used_event = self.avail_addr() + 4 + 2 * self.size as u64;
        mem.write_obj(self.used_seen, GuestAddress(used_event))
            .unwrap();
        fence(Ordering::SeqCst);
        loop {
            let idx: u16 = mem.read_obj(GuestAddress(self.used_addr() + 2)).unwrap();
            if idx != self.used_seen {
                fence(Ordering::Acquire);
                let e = self.used_addr() + 4 + 8 * (self.used_seen % self.size) as u64;
                let id: u32 = mem.read_obj(GuestAddress(e)).unwrap();
                let len: u32 = mem.read_obj(GuestAddress(e + 4)).unwrap();
                self.used_seen = self.used_seen.wrapping_add(1);
                return Some((id, len));
            }
            let waited = start.elapsed();
            if waited > timeout {
                return None;
            }
            if waited < self.spin {
                std::thread::yield_now();
            } else if let Some(fd) = self.call_fd {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; the eventfd outlives the queue.
                unsafe { libc::poll(&mut pfd, 1, 1) };
                let mut buf = 0u64;
                // SAFETY: reads 8 bytes into a u64 from a non-blocking eventfd.
                unsafe { libc::read(fd, &mut buf as *mut u64 as *mut libc::c_void, 8) };
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    pub fn used_idx(&self, mem: &GuestMemoryMmap) -> u16 {
        mem.read_obj(GuestAddress(self.used_addr() + 2)).unwrap()
    }
}

pub struct Reply {
    pub resp: Resp,
    pub payload: Vec<u8>,
    pub used_len: u32,
}

impl Reply {
    pub fn status(&self) -> Status {
        Status::from_u32(self.resp.status).expect("known status")
    }
}

pub struct Options {
    /// The front-end never answers the daemon's backend requests.
    pub silent_frontend: bool,
    pub attach: cxl_accel::device::Attach,
    pub map_devmem: bool,
    pub dma_threads: usize,
    pub peers: Vec<PathBuf>,
    pub extra_regions: Vec<(u64, File, u64)>,
    /// Run the real binary with `--supervise` (and these extra arguments) instead of an
    /// in-process daemon.
    pub supervised: Option<Vec<String>>,
    /// With `supervised`: run the daemon as this unprivileged uid/gid (needs root).
    pub run_as: Option<u32>,
    /// Size of the rings the driver sets up (the daemon's --queue-size stays QUEUE_SIZE).
    pub ring_size: u16,
    /// With `supervised`: the daemon's log (at info) goes to this file.
    pub log: Option<PathBuf>,
    /// Command queues the in-process device offers (the driver side sets up only the
    /// first, and the event queue).
    pub cmd_queues: u32,
    /// The in-process daemon's busy-poll (`--poll-us`).
    pub poll_us: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            silent_frontend: false,
            // The harness plays QEMU 10.2 by default: device memory is a BAR it shares.
            attach: cxl_accel::device::Attach::Bar,
            map_devmem: true,
            dma_threads: 2,
            peers: Vec::new(),
            extra_regions: Vec::new(),
            supervised: None,
            run_as: None,
            ring_size: QUEUE_SIZE,
            log: None,
            cmd_queues: 1,
            poll_us: 0,
        }
    }
}

/// What the daemon told the front-end about shared objects: (added?, uuid).
#[derive(Default)]
pub struct SharedObjectLog {
    pub log: std::sync::Mutex<Vec<(bool, [u8; 16])>>,
    /// Shared memory map (true) and unmap (false) requests, in order.
    pub shmem: std::sync::Mutex<Vec<(bool, ShmemRequest)>>,
}

/// One SHMEM_MAP or SHMEM_UNMAP request as the front-end received it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmemRequest {
    pub shmid: u8,
    pub fd_offset: u64,
    pub shm_offset: u64,
    pub len: u64,
    pub flags: u64,
    /// Inode of the file passed with a map (0 for an unmap).
    pub inode: u64,
}

impl ShmemRequest {
    fn of(m: &vhost::vhost_user::message::VhostUserMMap, inode: u64) -> Self {
        // Copies: the message is packed.
        let (shmid, fd_offset, shm_offset, len, flags) =
            (m.shmid, m.fd_offset, m.shm_offset, m.len, m.flags);
        ShmemRequest {
            shmid,
            fd_offset,
            shm_offset,
            len,
            flags,
            inode,
        }
    }
}

impl vhost::vhost_user::VhostUserFrontendReqHandler for SharedObjectLog {
    fn shared_object_add(
        &self,
        m: &vhost::vhost_user::message::VhostUserSharedMsg,
    ) -> vhost::vhost_user::HandlerResult<u64> {
        let mut u = [0u8; 16];
        u.copy_from_slice(m.as_slice());
        self.log.lock().unwrap().push((true, u));
        Ok(0)
    }
    fn shared_object_remove(
        &self,
        m: &vhost::vhost_user::message::VhostUserSharedMsg,
    ) -> vhost::vhost_user::HandlerResult<u64> {
        let mut u = [0u8; 16];
        u.copy_from_slice(m.as_slice());
        self.log.lock().unwrap().push((false, u));
        Ok(0)
    }
    fn shmem_map(
        &self,
        m: &vhost::vhost_user::message::VhostUserMMap,
        fd: &dyn AsRawFd,
    ) -> vhost::vhost_user::HandlerResult<u64> {
        // SAFETY: the handler lends us the descriptor for the call; ManuallyDrop keeps
        // it open.
        let f = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd.as_raw_fd()) });
        let inode = std::os::unix::fs::MetadataExt::ino(&f.metadata().unwrap());
        self.shmem
            .lock()
            .unwrap()
            .push((true, ShmemRequest::of(m, inode)));
        Ok(0)
    }
    fn shmem_unmap(
        &self,
        m: &vhost::vhost_user::message::VhostUserMMap,
    ) -> vhost::vhost_user::HandlerResult<u64> {
        self.shmem
            .lock()
            .unwrap()
            .push((false, ShmemRequest::of(m, 0)));
        Ok(0)
    }
}

impl SharedObjectLog {
    /// Waits until `n` shared memory requests arrived (or 5 s passed); returns them all.
    pub fn wait_shmem(&self, n: usize) -> Vec<(bool, ShmemRequest)> {
        let t = Instant::now();
        loop {
            let v = self.shmem.lock().unwrap().clone();
            if v.len() >= n || t.elapsed() > Duration::from_secs(5) {
                return v;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

pub struct Harness {
    pub shared: Arc<SharedObjectLog>,
    pub guest: GuestMemoryMmap,
    pub devmem: MmapRegion,
    device: Option<Arc<Device>>,
    /// The supervising daemon process (Options::supervised).
    pub process: Option<std::process::Child>,
    pub frontend: Option<Frontend>,
    pub queues: [DriverQueue; 2],
    kicks: [EventFd; 2],
    calls: [EventFd; 2],
    daemon: Option<JoinHandle<()>>,
    pub dir: PathBuf,
    _files: Vec<File>,
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub fn temp_dir() -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("cxl-accel-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Harness {
    pub fn new() -> Harness {
        Self::with(Options::default())
    }

    pub fn with(opts: Options) -> Harness {
        let dir = temp_dir();
        let sock = dir.join("cxl.sock");
        let devmem_path = dir.join("devmem");
        let (mut device, mut daemon, mut process) = (None, None, None);
        if let Some(extra) = &opts.supervised {
            let mut cmd = match opts.run_as {
                Some(id) => {
                    // The daemon creates its files in the test directory.
                    std::os::unix::fs::chown(&dir, Some(id), Some(id)).unwrap();
                    let mut c = std::process::Command::new("setpriv");
                    c.arg(format!("--reuid={id}"))
                        .arg(format!("--regid={id}"))
                        .arg("--clear-groups")
                        .arg("--inh-caps=-all")
                        .arg(env!("CARGO_BIN_EXE_cxl-accel"));
                    c
                }
                None => std::process::Command::new(env!("CARGO_BIN_EXE_cxl-accel")),
            };
            // Quiet unless asked: every kill makes the daemon log a restart.
            let mut level = std::env::var("CXL_ACCEL_TEST_LOG").unwrap_or_else(|_| "error".into());
            if let Some(log) = &opts.log {
                cmd.stderr(File::create(log).unwrap());
                level = "info".into();
            }
            let child = cmd
                .env("RUST_LOG", level)
                .arg("--supervise")
                .arg("--socket-path")
                .arg(&sock)
                .arg("--memory-path")
                .arg(&devmem_path)
                .arg("--memory-size")
                .arg(DEVMEM_SIZE.to_string())
                .arg("--queue-size")
                .arg(QUEUE_SIZE.to_string())
                .arg("--dma-threads")
                .arg(opts.dma_threads.to_string())
                .arg("--attach")
                .arg(match opts.attach {
                    cxl_accel::device::Attach::Bar => "bar",
                    cxl_accel::device::Attach::Shmem => "shmem",
                    cxl_accel::device::Attach::Numa => "numa",
                    cxl_accel::device::Attach::Cxl => "cxl",
                })
                .args(extra)
                .spawn()
                .expect("start the daemon");
            process = Some(child);
            // The daemon creates the memory file; wait for it to be sized.
            let t = Instant::now();
            while std::fs::metadata(&devmem_path).map(|m| m.len()).ok() != Some(DEVMEM_SIZE) {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "daemon made no memory file"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        } else {
            let devmem = DeviceMemory::open(&devmem_path, DEVMEM_SIZE).unwrap();
            let cfg = DeviceConfig {
                attach: opts.attach,
                dma_engines: opts.dma_threads as u32,
                peers: opts.peers.clone(),
                cmd_queues: opts.cmd_queues,
                poll_us: opts.poll_us,
                ..Default::default()
            };
            let dev = Arc::new(Device::new(cfg, devmem));
            let dispatcher = Arc::new(Dispatcher::new(opts.dma_threads).unwrap());
            let mut listener = server::bind(&sock, None).unwrap();
            let d2 = dev.clone();
            daemon = Some(std::thread::spawn(move || {
                let _ = server::serve(&mut listener, d2, dispatcher, QUEUE_SIZE, Some(1));
            }));
            device = Some(dev);
        }

        // Guest RAM and, optionally, the device BAR and other regions, as QEMU would share them.
        let ram = memfd("guest-ram", GUEST_SIZE);
        let devmem_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&devmem_path)
            .unwrap();
        let mut regions = vec![(0u64, ram.try_clone().unwrap(), GUEST_SIZE)];
        if opts.map_devmem {
            regions.push((DEVMEM_GPA, devmem_file.try_clone().unwrap(), DEVMEM_SIZE));
        }
        for (gpa, f, size) in &opts.extra_regions {
            regions.push((*gpa, f.try_clone().unwrap(), *size));
        }
        let guest = GuestMemoryMmap::from_regions(
            regions
                .iter()
                .map(|(gpa, f, size)| {
                    let r = MmapRegion::from_file(
                        FileOffset::new(f.try_clone().unwrap(), 0),
                        *size as usize,
                    )
                    .unwrap();
                    GuestRegionMmap::new(r, GuestAddress(*gpa)).unwrap()
                })
                .collect(),
        )
        .unwrap();
        let devmem_map =
            MmapRegion::from_file(FileOffset::new(devmem_file, 0), DEVMEM_SIZE as usize).unwrap();

        let mut fe = None;
        for _ in 0..2500 {
            if let Ok(f) = Frontend::connect(&sock, 2) {
                fe = Some(f);
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut fe = fe.expect("daemon did not listen");
        fe.set_owner().unwrap();
        let features = fe.get_features().unwrap();
        fe.set_features(features).unwrap();
        let pf = fe.get_protocol_features().unwrap();
        assert!(pf.contains(VhostUserProtocolFeatures::CONFIG));
        fe.set_protocol_features(pf).unwrap();
        let infos: Vec<VhostUserMemoryRegionInfo> = regions
            .iter()
            .map(|(gpa, f, size)| VhostUserMemoryRegionInfo {
                guest_phys_addr: *gpa,
                memory_size: *size,
                userspace_addr: guest.get_host_address(GuestAddress(*gpa)).unwrap() as u64,
                mmap_offset: 0,
                mmap_handle: f.as_raw_fd(),
            })
            .collect();
        fe.set_mem_table(&infos).unwrap();
        let shared = Arc::new(SharedObjectLog::default());
        let mut req_handler = vhost::vhost_user::FrontendReqHandler::new(shared.clone()).unwrap();
        req_handler.set_reply_ack_flag(!opts.silent_frontend);
        fe.set_backend_request_fd(&req_handler.get_tx_raw_fd())
            .unwrap();
        // Answers the daemon's backend requests until the channel closes.
        std::thread::spawn(move || while req_handler.handle_request().is_ok() {});

        let mut queues = [
            DriverQueue::new(RING_BASE[0], opts.ring_size),
            DriverQueue::new(RING_BASE[1], opts.ring_size),
        ];
        let kicks = [EventFd::new(0).unwrap(), EventFd::new(0).unwrap()];
        let calls = [
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
        ];
        queues[0].call_fd = Some(calls[0].as_raw_fd());
        queues[1].call_fd = Some(calls[1].as_raw_fd());
        start_rings(&mut fe, &guest, &queues, &kicks, &calls);
        let files = regions.into_iter().map(|(_, f, _)| f).collect();
        Harness {
            shared,
            guest,
            devmem: devmem_map,
            device,
            process,
            frontend: Some(fe),
            queues,
            kicks,
            calls,
            daemon,
            dir,
            _files: files,
        }
    }

    /// What a driver reload does: the front-end stops both rings, the driver clears them,
    /// and the front-end starts them again from 0.
    pub fn restart_rings(&mut self) {
        let fe = self.frontend.as_mut().unwrap();
        // As QEMU does: every set-up message waits for the backend's ack.
        fe.set_hdr_flags(vhost::vhost_user::message::VhostUserHeaderFlag::NEED_REPLY);
        for i in 0..2 {
            vhost::VhostBackend::get_vring_base(fe, i).expect("GET_VRING_BASE answered");
        }
        let zeros = vec![0u8; 0x10000];
        for (i, q) in self.queues.iter_mut().enumerate() {
            self.guest
                .write_slice(&zeros, GuestAddress(RING_BASE[i]))
                .unwrap();
            let call = q.call_fd;
            *q = DriverQueue::new(RING_BASE[i], q.size);
            q.call_fd = call;
        }
        start_rings(fe, &self.guest, &self.queues, &self.kicks, &self.calls);
    }

    /// Whether the device signals queue `q`'s call eventfd within `timeout` (consumes it).
    pub fn wait_call(&self, q: usize, timeout: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.calls[q].as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on an eventfd we own.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
        n == 1 && self.calls[q].read().is_ok()
    }

    /// Forgets earlier signals on queue `q`.
    pub fn drain_call(&self, q: usize) {
        while self.wait_call(q, Duration::ZERO) {}
    }

    /// Whether the in-process daemon has ended (it serves one session).
    pub fn daemon_finished(&self) -> bool {
        self.daemon.as_ref().is_none_or(|d| d.is_finished())
    }

    /// The in-process device model.
    pub fn device(&self) -> &Arc<Device> {
        self.device
            .as_ref()
            .expect("the device runs in another process (Options::supervised)")
    }

    /// The daemon's current worker process (Options::supervised).
    pub fn worker_pid(&self) -> Option<u32> {
        child_pid(self.process.as_ref()?.id())
    }

    /// The memfd behind guest RAM (region 0).
    pub fn ram_file(&self) -> &File {
        &self._files[0]
    }

    /// Sends a memory table of guest RAM, with device memory at DEVMEM_GPA when `devmem`:
    /// what QEMU sends once it mapped the device's shared memory region, and without it
    /// after a device reset dropped the mapping.
    pub fn set_table(&mut self, devmem: bool) {
        let ram = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: GUEST_SIZE,
            userspace_addr: self.guest.get_host_address(GuestAddress(0)).unwrap() as u64,
            mmap_offset: 0,
            mmap_handle: self.ram_file().as_raw_fd(),
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.dir.join("devmem"))
            .unwrap();
        let mut infos = vec![ram];
        if devmem {
            infos.push(VhostUserMemoryRegionInfo {
                guest_phys_addr: DEVMEM_GPA,
                memory_size: DEVMEM_SIZE,
                userspace_addr: self.devmem.as_ptr() as u64,
                mmap_offset: 0,
                mmap_handle: file.as_raw_fd(),
            });
        }
        let fe = self.frontend.as_mut().unwrap();
        fe.set_hdr_flags(vhost::vhost_user::message::VhostUserHeaderFlag::NEED_REPLY);
        fe.set_mem_table(&infos).unwrap();
    }

    /// The inode of the device memory file.
    pub fn devmem_inode(&self) -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(self.dir.join("devmem")).unwrap())
    }

    pub fn kick(&self, q: usize) {
        self.kicks[q].write(1).unwrap();
    }

    /// Submits one request chain without waiting.
    pub fn post(&mut self, req: &[u8], slot: u64, resp_room: u32) -> u16 {
        let head = self.post_quietly(req, slot, resp_room);
        self.kick(0);
        head
    }

    /// Publishes one request chain without a kick: several then reach the device in one
    /// pass over the ring, at the next [`Harness::kick`].
    pub fn post_quietly(&mut self, req: &[u8], slot: u64, resp_room: u32) -> u16 {
        let ra = REQ_AREA + slot * 0x1000;
        let wa = RESP_AREA + slot * 0x400;
        assert!(req.len() <= 0x1000 || slot == 0);
        self.guest.write_slice(req, GuestAddress(ra)).unwrap();
        self.queues[0].push(
            &self.guest,
            &[(ra, req.len() as u32, false), (wa, resp_room, true)],
        )
    }

    pub fn read_reply(&self, slot: u64, used_len: u32) -> Reply {
        let wa = RESP_AREA + slot * 0x400;
        let resp: Resp = self.guest.read_obj(GuestAddress(wa)).unwrap();
        let plen = (used_len as usize).saturating_sub(std::mem::size_of::<Resp>());
        let mut payload = vec![0u8; plen];
        self.guest
            .read_slice(&mut payload, GuestAddress(wa + 32))
            .unwrap();
        Reply {
            resp,
            payload,
            used_len,
        }
    }

    /// Allocates `size` bytes of device memory: (buffer id, device-memory offset).
    pub fn alloc(&mut self, size: u64) -> (u64, u64) {
        let req = cxl_accel::device::command::encode::with(
            cxl_accel::device::command::encode::hdr(OP_ALLOC, 0, 1),
            &Alloc { size, align: 0 },
        );
        let r = self.call(&req);
        assert_eq!(r.status(), Status::Ok);
        (r.resp.result0, r.resp.result1)
    }

    /// Hands the daemon a new backend channel; returns our end of it.
    pub fn new_backend_channel(&mut self) -> std::os::unix::net::UnixStream {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        self.frontend
            .as_mut()
            .unwrap()
            .set_backend_request_fd(&theirs)
            .unwrap();
        ours
    }

    /// Sends one request and waits for its reply.
    pub fn call(&mut self, req: &[u8]) -> Reply {
        self.call_with_room(req, 0x400)
    }

    pub fn call_with_room(&mut self, req: &[u8], room: u32) -> Reply {
        // Large requests (page lists) go in their own area.
        let (ra, wa) = (REQ_AREA, RESP_AREA);
        assert!(req.len() as u64 <= RESP_AREA - REQ_AREA);
        self.guest
            .write_slice(&[0u8; 32], GuestAddress(wa))
            .unwrap();
        self.guest.write_slice(req, GuestAddress(ra)).unwrap();
        self.queues[0].push(
            &self.guest,
            &[(ra, req.len() as u32, false), (wa, room, true)],
        );
        self.kick(0);
        let (_, len) = self.queues[0]
            .wait_used(&self.guest, Duration::from_secs(20))
            .expect("device did not complete the request");
        self.read_reply(0, len)
    }

    pub fn config(&mut self) -> Config {
        let size = std::mem::size_of::<Config>() as u32;
        let (_, payload) = self
            .frontend
            .as_mut()
            .unwrap()
            .get_config(
                0,
                size,
                vhost::vhost_user::message::VhostUserConfigFlags::WRITABLE,
                &vec![0u8; size as usize],
            )
            .unwrap();
        let mut c = Config::default();
        c.as_mut_slice().copy_from_slice(&payload);
        c
    }

    pub fn devmem_write(&self, off: u64, data: &[u8]) {
        use vm_memory::VolatileMemory;
        self.devmem
            .get_slice(off as usize, data.len())
            .unwrap()
            .copy_from(data);
    }

    pub fn devmem_read(&self, off: u64, len: usize) -> Vec<u8> {
        use vm_memory::VolatileMemory;
        let mut v = vec![0u8; len];
        self.devmem
            .get_slice(off as usize, len)
            .unwrap()
            .copy_to(&mut v[..]);
        v
    }

    /// Posts `n` writable event buffers of `size` bytes at `area` on the event queue.
    pub fn post_event_buffers(&mut self, area: u64, n: u64, size: u32) {
        for i in 0..n {
            self.queues[1].push(&self.guest, &[(area + i * 64, size, true)]);
        }
        self.kick(1);
    }

    pub fn shutdown(&mut self) {
        self.frontend.take();
        if let Some(h) = self.daemon.take() {
            h.join().unwrap();
        }
        if let Some(mut p) = self.process.take() {
            // SAFETY: sends SIGTERM to our own child.
            unsafe { libc::kill(p.id() as i32, libc::SIGTERM) };
            let _ = p.wait();
        }
    }
}

/// Configures and starts both rings from position 0, as QEMU does at DRIVER_OK.
fn start_rings(
    fe: &mut Frontend,
    guest: &GuestMemoryMmap,
    queues: &[DriverQueue; 2],
    kicks: &[EventFd; 2],
    calls: &[EventFd; 2],
) {
    let va = |gpa: u64| guest.get_host_address(GuestAddress(gpa)).unwrap() as u64;
    for (i, q) in queues.iter().enumerate() {
        fe.set_vring_num(i, q.size).unwrap();
        fe.set_vring_addr(
            i,
            &VringConfigData {
                queue_max_size: q.size,
                queue_size: q.size,
                flags: 0,
                desc_table_addr: va(q.desc_addr()),
                used_ring_addr: va(q.used_addr()),
                avail_ring_addr: va(q.avail_addr()),
                log_addr: None,
            },
        )
        .unwrap();
        fe.set_vring_base(i, 0).unwrap();
        fe.set_vring_call(i, &calls[i]).unwrap();
        fe.set_vring_kick(i, &kicks[i]).unwrap();
        fe.set_vring_enable(i, true).unwrap();
    }
    // QEMU sets the call fds once more after enabling (when it unmasks the vectors).
    for (i, call) in calls.iter().enumerate() {
        fe.set_vring_call(i, call).unwrap();
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// A fresh directory under the system's temporary directory, removed with everything in
/// it when dropped (also when a test panics).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        TempDir(temp_dir())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
