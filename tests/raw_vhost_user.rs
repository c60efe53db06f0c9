// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A hostile or buggy front-end speaking raw vhost-user: malformed messages, bad file
//! descriptors, requests out of order, rings outside memory, a memory table replaced under
//! running queues. The daemon must reject them, end that session cleanly at worst, touch
//! nothing it was not given, and serve the next front-end normally.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use cxl_accel::device::devmem::DeviceMemory;
use cxl_accel::device::dispatch::Dispatcher;
use cxl_accel::device::{Device, DeviceConfig};
use cxl_accel::vhost::server;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;

const VERSION: u32 = 0x1;
const GET_FEATURES: u32 = 1;
const SET_FEATURES: u32 = 2;
const SET_OWNER: u32 = 3;
const SET_MEM_TABLE: u32 = 5;
const SET_VRING_NUM: u32 = 8;
const SET_VRING_ADDR: u32 = 9;
const SET_VRING_BASE: u32 = 10;
const SET_VRING_KICK: u32 = 12;
const GET_CONFIG: u32 = 24;

fn msg(request: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&request.to_le_bytes());
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

fn u64s(vals: &[u64]) -> Vec<u8> {
    vals.iter().flat_map(|v| v.to_le_bytes()).collect()
}

struct Daemon {
    sock: std::path::PathBuf,
    device: Arc<Device>,
    dir: std::path::PathBuf,
}

fn start() -> Daemon {
    let dir = common::temp_dir();
    let sock = dir.join("raw.sock");
    let devmem = DeviceMemory::open(&dir.join("devmem"), 4 << 20).unwrap();
    let device = Arc::new(Device::new(DeviceConfig::default(), devmem));
    let dispatcher = Arc::new(Dispatcher::new(1).unwrap());
    let mut listener = server::bind(&sock, None).unwrap();
    let d2 = device.clone();
    std::thread::spawn(move || {
        let _ = server::serve(&mut listener, d2, dispatcher, 256, None);
    });
    Daemon { sock, device, dir }
}

fn connect(d: &Daemon) -> UnixStream {
    let s = UnixStream::connect(&d.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// A well-behaved front-end still gets served.
fn healthy(sock: &std::path::Path) {
    let mut fe = None;
    for _ in 0..500 {
        if let Ok(f) = Frontend::connect(sock, 2) {
            fe = Some(f);
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut fe = fe.expect("daemon accepts a new front-end");
    fe.set_owner().unwrap();
    let features = fe.get_features().unwrap();
    assert_ne!(features & (1 << 32), 0, "VERSION_1 offered");
    fe.set_features(features).unwrap();
    let pf = fe.get_protocol_features().unwrap();
    fe.set_protocol_features(pf).unwrap();
    drop(fe);
}

/// Sends raw bytes; returns whether the daemon closed the connection.
fn send_and_see_closed(s: &mut UnixStream, bytes: &[u8]) -> bool {
    if s.write_all(bytes).is_err() {
        return true;
    }
    let mut buf = [0u8; 256];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

#[test]
fn malformed_messages_end_the_session_not_the_daemon() {
    let d = start();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unknown request", msg(999, &[])),
        ("size larger than any message", {
            let mut m = msg(GET_FEATURES, &[]);
            m[8..12].copy_from_slice(&0x1000_0000u32.to_le_bytes());
            m
        }),
        ("wrong version flags", {
            let mut m = msg(GET_FEATURES, &[]);
            m[4..8].copy_from_slice(&0x7u32.to_le_bytes());
            m
        }),
        ("features before owner, then garbage size", {
            let mut m = msg(SET_FEATURES, &u64s(&[u64::MAX]));
            m.extend(msg(SET_FEATURES, &[1, 2, 3]));
            m
        }),
        ("memory table with regions but no fds", {
            let mut m = msg(SET_OWNER, &[]);
            let table = [u64s(&[1, 0]), u64s(&[0, 1 << 20, 0x7f00_0000_0000, 0])].concat();
            m.extend(msg(SET_MEM_TABLE, &table));
            m
        }),
        ("memory table claiming 1000 regions", {
            let mut m = msg(SET_OWNER, &[]);
            m.extend(msg(SET_MEM_TABLE, &u64s(&[1000, 0])));
            m
        }),
        ("vring index beyond the queues", {
            let mut m = msg(SET_OWNER, &[]);
            m.extend(msg(
                SET_VRING_NUM,
                &[u32::to_le_bytes(77), u32::to_le_bytes(256)].concat(),
            ));
            m
        }),
        ("vring size zero and huge", {
            let mut m = msg(SET_OWNER, &[]);
            m.extend(msg(
                SET_VRING_NUM,
                &[0u32.to_le_bytes(), 0u32.to_le_bytes()].concat(),
            ));
            m.extend(msg(
                SET_VRING_NUM,
                &[0u32.to_le_bytes(), 65535u32.to_le_bytes()].concat(),
            ));
            m
        }),
        ("vring addresses with no memory table", {
            let mut m = msg(SET_OWNER, &[]);
            let addr = [0u32.to_le_bytes(), 0u32.to_le_bytes()].concat();
            let payload = [addr, u64s(&[0x1000, 0x2000, 0x3000, 0])].concat();
            m.extend(msg(SET_VRING_ADDR, &payload));
            m
        }),
        ("kick without a file descriptor", {
            let mut m = msg(SET_OWNER, &[]);
            m.extend(msg(
                SET_VRING_BASE,
                &[0u32.to_le_bytes(), 0u32.to_le_bytes()].concat(),
            ));
            m.extend(msg(SET_VRING_KICK, &u64s(&[0])));
            m
        }),
        ("config read past any size", {
            let mut m = msg(SET_OWNER, &[]);
            let hdr = [
                0u32.to_le_bytes(),
                0xffffu32.to_le_bytes(),
                0u32.to_le_bytes(),
            ]
            .concat();
            m.extend(msg(GET_CONFIG, &hdr));
            m
        }),
        ("truncated header", msg(GET_FEATURES, &[])[..7].to_vec()),
    ];
    for (name, bytes) in &cases {
        let mut s = connect(&d);
        let _closed = send_and_see_closed(&mut s, bytes);
        drop(s);
        healthy(&d.sock);
        eprintln!("survived: {name}");
    }
    assert_eq!(d.device.stat(cxl_accel::protocol::STAT_COMMANDS), 0);
    let _ = std::fs::remove_dir_all(&d.dir);
}

#[test]
fn memory_table_replaced_under_running_queues() {
    // A full session whose memory table is swapped (and shrunk) while requests run: the
    // device keeps serving from the table it has and never faults.
    let mut h = common::Harness::new();
    let req = cxl_accel::device::command::encode::hdr(cxl_accel::protocol::OP_NOP, 0, 1);
    assert_eq!(h.call(&req).resp.status, 0);
    // Same RAM, device memory region dropped: BAR addresses become unknown.
    let region = vhost::VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: common::GUEST_SIZE,
        userspace_addr: vm_memory::GuestMemoryBackend::get_host_address(
            &h.guest,
            vm_memory::GuestAddress(0),
        )
        .unwrap() as u64,
        mmap_offset: 0,
        mmap_handle: std::os::fd::AsRawFd::as_raw_fd(h.ram_file()),
    };
    // Wait for the daemon's ack, so the new table is in place before the next request.
    let fe = h.frontend.as_mut().unwrap();
    fe.set_hdr_flags(vhost::vhost_user::message::VhostUserHeaderFlag::NEED_REPLY);
    fe.set_mem_table(&[region]).unwrap();
    fe.set_hdr_flags(vhost::vhost_user::message::VhostUserHeaderFlag::empty());
    assert_eq!(h.call(&req).resp.status, 0);
    let fill = cxl_accel::device::command::encode::fill(
        1,
        0,
        &[cxl_accel::device::command::encode::sge(
            cxl_accel::protocol::SPACE_GPA,
            common::DEVMEM_GPA,
            64,
        )],
    );
    assert_eq!(
        h.call(&fill).resp.status,
        cxl_accel::protocol::Status::BadGpa as u32
    );
    assert_eq!(h.device().layout().devmem_gpa, None);
    let fe = h.frontend.as_mut().unwrap();
    assert!(fe.get_features().is_ok());
}

#[test]
fn a_memory_region_larger_than_its_file_is_refused() {
    // Mapped past the end of the file, the region would raise SIGBUS on access.
    let d = start();
    let small = common::memfd("short", 4096);
    let mut fe = Frontend::connect(&d.sock, 2).unwrap();
    fe.set_owner().unwrap();
    let features = fe.get_features().unwrap();
    fe.set_features(features).unwrap();
    let pf = fe.get_protocol_features().unwrap();
    fe.set_protocol_features(pf).unwrap();
    let map = vm_memory::MmapRegion::<()>::from_file(
        vm_memory::FileOffset::new(small.try_clone().unwrap(), 0),
        4096,
    )
    .unwrap();
    let region = vhost::VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: 1 << 20,
        userspace_addr: map.as_ptr() as u64,
        mmap_offset: 0,
        mmap_handle: std::os::fd::AsRawFd::as_raw_fd(&small),
    };
    // Without a requested ack the refusal shows in the daemon's state: the table counted
    // as an error, and the daemon alive for the next front-end.
    let _ = fe.set_mem_table(&[region]);
    let _ = fe.get_features();
    drop(fe);
    healthy(&d.sock);
    assert_eq!(d.device.stat(cxl_accel::protocol::STAT_ERRORS), 1);
    assert_eq!(d.device.layout().devmem_gpa, None);
    let _ = std::fs::remove_dir_all(&d.dir);
}

#[test]
fn client_mode_connects_to_a_listening_front_end_and_reconnects() {
    let dir = common::temp_dir();
    let sock = dir.join("qemu.sock");
    let devmem = DeviceMemory::open(&dir.join("devmem"), 4 << 20).unwrap();
    let device = Arc::new(Device::new(DeviceConfig::default(), devmem));
    let dispatcher = Arc::new(Dispatcher::new(1).unwrap());
    let path = sock.clone();
    // The daemon starts first and waits for the front-end's socket to appear.
    let daemon = std::thread::spawn(move || {
        server::serve_endpoint(
            server::Endpoint::Connect(path),
            device,
            dispatcher,
            256,
            Some(2),
            false,
        )
    });
    std::thread::sleep(Duration::from_millis(200));
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    for _ in 0..2 {
        let (stream, _) = listener.accept().unwrap();
        let fe = Frontend::from_stream(stream, 2);
        fe.set_owner().unwrap();
        assert_ne!(fe.get_features().unwrap() & (1 << 32), 0);
        drop(fe); // the daemon connects again for its second session
    }
    daemon.join().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// One random message: mostly real requests with plausible payloads (ring indices 0-2,
/// small sizes, addresses inside a small shared region), sometimes lies about sizes,
/// versions and fds.
fn random_message(rng: &mut common::Rng, region: &std::fs::File) -> cxl_accel::supervisor::Message {
    use std::os::fd::OwnedFd;
    let request = match rng.below(10) {
        0 => rng.below(64) as u32,
        _ => [
            1, 2, 3, 5, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 21, 24, 25, 36, 37, 38,
        ][rng.below(21) as usize],
    };
    let ring = rng.below(3) as u32;
    let mut payload: Vec<u8> = match request {
        // vring state: index, value
        8 | 10 | 11 | 18 => [ring.to_le_bytes(), (rng.below(512) as u32).to_le_bytes()].concat(),
        // vring addresses inside the region (guest address = region offset)
        9 => [
            [ring.to_le_bytes(), 0u32.to_le_bytes()].concat(),
            u64s(&[
                0x7f00_0000_0000 + rng.below(1 << 20),
                0x7f00_0000_0000 + rng.below(1 << 20),
                0x7f00_0000_0000 + rng.below(1 << 20),
                0,
            ]),
        ]
        .concat(),
        // kick/call/err: index, maybe the "no fd" bit
        12..=14 => u64s(&[ring as u64 | (rng.below(2) << 8)]),
        // memory table: one region over (part of) the memfd, sometimes beyond it
        5 => u64s(&[
            1,
            0,
            0,
            [1 << 20, 4096, 2 << 20][rng.below(3) as usize],
            0x7f00_0000_0000,
            [0, 4096, 1 << 20][rng.below(3) as usize],
        ]),
        2 | 16 => u64s(&[rng.next() & 0x1_7000_0000 | 1 << 30]),
        24 | 25 => [
            0u32.to_le_bytes(),
            (rng.below(80) as u32).to_le_bytes(),
            0u32.to_le_bytes(),
        ]
        .concat(),
        _ => Vec::new(),
    };
    if rng.below(8) == 0 {
        let n = rng.below(64) as usize;
        payload = (0..n).map(|_| rng.next() as u8).collect();
    }
    let flags = if rng.below(16) == 0 {
        rng.next() as u32
    } else {
        0x1 | (rng.below(2) as u32) << 3
    };
    let size = if rng.below(32) == 0 {
        rng.below(5000) as u32
    } else {
        payload.len() as u32
    };
    let mut fds: Vec<OwnedFd> = Vec::new();
    let want_fd = matches!(request, 5 | 12..=14 | 21) || rng.below(16) == 0;
    if want_fd && rng.below(6) != 0 {
        let fd: OwnedFd = if request == 5 {
            region.try_clone().unwrap().into()
        } else {
            vmm_sys_util::eventfd::EventFd::new(0)
                .map(|e| e.try_clone().unwrap())
                .map(|e| {
                    use std::os::fd::{FromRawFd, IntoRawFd};
                    // SAFETY: the raw fd comes from an EventFd we own and give up here.
                    unsafe { OwnedFd::from_raw_fd(e.into_raw_fd()) }
                })
                .unwrap()
        };
        fds.push(fd);
        if rng.below(8) == 0 {
            fds.push(region.try_clone().unwrap().into());
        }
    }
    cxl_accel::supervisor::Message::new(request, flags, size, payload, fds)
}

/// Sends random message sequences, then kicks every ring, from many short sessions, and
/// runs `after` after each. Returns the number of messages sent.
fn random_sessions(
    sock: &std::path::Path,
    sessions: usize,
    seed: u64,
    after: &mut dyn FnMut(),
) -> usize {
    use std::os::fd::AsFd;
    let mut rng = common::Rng(seed);
    let region = common::memfd("random-region", 2 << 20);
    let mut sent = 0;
    for _ in 0..sessions {
        // Ring memory full of garbage, so any ring the daemon accepts gives it bad chains.
        let junk: Vec<u8> = (0..1 << 16).map(|_| rng.next() as u8).collect();
        std::os::unix::fs::FileExt::write_all_at(&region, &junk, rng.below(1 << 20)).unwrap();
        let mut s = None;
        for _ in 0..500 {
            if let Ok(c) = UnixStream::connect(sock) {
                s = Some(c);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let s = s.expect("daemon accepts connections");
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        s.set_nonblocking(false).unwrap();
        let mut kicks = Vec::new();
        for _ in 0..(1 + rng.below(30)) {
            let m = random_message(&mut rng, &region);
            if m.request() == SET_VRING_KICK {
                kicks.push(());
            }
            if cxl_accel::supervisor::send_message(s.as_fd(), &m).is_err() {
                break;
            }
            sent += 1;
            // Replies, if any, are drained so the daemon never blocks on us.
            let mut buf = [0u8; 4096];
            let _ = s.set_nonblocking(true);
            while matches!((&s).read(&mut buf), Ok(n) if n > 0) {}
            let _ = s.set_nonblocking(false);
        }
        std::thread::sleep(Duration::from_millis(rng.below(3)));
        drop(s);
        after();
    }
    sent
}

#[test]
fn random_message_sequences_never_take_the_daemon_down() {
    let d = start();
    let sock = d.sock.clone();
    let sent = random_sessions(&d.sock, 300, 0x5eed_1234_abcd_0001, &mut || healthy(&sock));
    eprintln!("in-process daemon: {sent} random messages in 300 sessions, still serving");
    // How many get in before the daemon drops a session depends on timing; each session
    // delivers at least its first message.
    assert!(sent >= 300, "{sent}");
    let _ = std::fs::remove_dir_all(&d.dir);
}

/// The real daemon under `--supervise` (with the seccomp filter), its log in a file.
struct Supervised {
    child: std::process::Child,
    sock: std::path::PathBuf,
    log: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl Supervised {
    fn start() -> Supervised {
        let dir = common::temp_dir();
        let sock = dir.join("sup.sock");
        let log = dir.join("log");
        let child = common::daemon()
            .arg("--supervise")
            .arg("--socket-path")
            .arg(&sock)
            .arg("--memory-path")
            .arg(dir.join("devmem"))
            .arg("--memory-size")
            .arg("4M")
            .arg("--seccomp")
            .arg("enforce")
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while !sock.exists() {
            assert!(t.elapsed() < Duration::from_secs(10), "no socket");
            std::thread::sleep(Duration::from_millis(5));
        }
        Supervised {
            child,
            sock,
            log,
            dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The supervisor is still running and serves a well-behaved front-end.
    fn serves(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the supervisor exited: {}",
            self.log()
        );
        healthy(&self.sock);
    }

    /// Stops the daemon; returns its log.
    fn stop(mut self) -> String {
        // SAFETY: sends SIGTERM to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        let log = self.log();
        assert!(status.success(), "{log}");
        let _ = std::fs::remove_dir_all(&self.dir);
        log
    }
}

/// Fails the test binary instead of hanging it when a front-end waits for ever.
fn watchdog(name: &'static str, secs: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(secs));
        eprintln!("{name}: hung for {secs} s");
        std::process::exit(1);
    });
}

/// Messages a daemon refuses, each ending its session: (name, message).
fn refused_messages() -> Vec<(&'static str, Vec<cxl_accel::supervisor::Message>)> {
    use cxl_accel::supervisor::Message;
    use std::os::fd::OwnedFd;
    let eventfd = || -> OwnedFd {
        use std::os::fd::{FromRawFd, IntoRawFd};
        let e = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        // SAFETY: the raw fd comes from an EventFd we own and give up here.
        unsafe { OwnedFd::from_raw_fd(e.into_raw_fd()) }
    };
    let owner = || Message::new(SET_OWNER, VERSION, 0, Vec::new(), Vec::new());
    let short = common::memfd("short", 4096);
    let table = u64s(&[1, 0, 1 << 20, 0x7f00_0000_0000, 0]);
    let state = |i: u32, n: u32| [i.to_le_bytes(), n.to_le_bytes()].concat();
    vec![
        (
            "GET_FEATURES carrying file descriptors",
            vec![Message::new(
                GET_FEATURES,
                VERSION,
                0,
                Vec::new(),
                vec![eventfd()],
            )],
        ),
        (
            "a ring index out of range",
            vec![
                owner(),
                Message::new(SET_VRING_NUM, VERSION, 8, state(77, 256), Vec::new()),
            ],
        ),
        (
            "a memory region larger than its file",
            vec![
                owner(),
                Message::new(
                    SET_MEM_TABLE,
                    VERSION,
                    table.len() as u32,
                    table,
                    vec![short.into()],
                ),
            ],
        ),
        (
            "a kick that names a descriptor it does not carry",
            vec![
                owner(),
                Message::new(SET_VRING_KICK, VERSION, 8, u64s(&[0]), Vec::new()),
            ],
        ),
        (
            "40 file descriptors in one message",
            vec![Message::new(
                GET_FEATURES,
                VERSION,
                0,
                Vec::new(),
                (0..40).map(|_| eventfd()).collect(),
            )],
        ),
    ]
}

/// Sends one case's messages on a new connection and waits (`wait` at most) for the daemon
/// to close it; returns whether it did.
fn send_case(
    sock: &std::path::Path,
    msgs: &[cxl_accel::supervisor::Message],
    wait: Duration,
) -> bool {
    use std::os::fd::AsFd;
    let t = std::time::Instant::now();
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    for m in msgs {
        if cxl_accel::supervisor::send_message(s.as_fd(), m).is_err() {
            break;
        }
    }
    let mut buf = [0u8; 4096];
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    t.elapsed() < wait
}

#[test]
fn refused_messages_end_only_their_session() {
    watchdog("refused_messages_end_only_their_session", 120);
    let d = start();
    let mut sup = Supervised::start();
    for (name, msgs) in refused_messages() {
        // Unsupervised, the vhost crate may also take 32 of 40 descriptors and answer.
        send_case(&d.sock, &msgs, Duration::from_secs(2));
        healthy(&d.sock);
        assert!(
            // A loaded machine may take a while to restart nothing: what matters is
            // that the session ends, not how fast.
            send_case(&sup.sock, &msgs, Duration::from_secs(15)),
            "{name}: the session went on: {}",
            sup.log()
        );
        sup.serves();
        eprintln!("ended its session only, with and without a supervisor: {name}");
    }
    let log = sup.stop();
    // Refused, not replayed to new workers until the supervisor gave up.
    assert!(!log.contains("restart"), "{log}");
    assert_eq!(
        log.matches("session ended (not replayed)").count(),
        4,
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&d.dir);
}

#[test]
fn random_message_sequences_through_the_supervisor() {
    watchdog("random_message_sequences_through_the_supervisor", 240);
    let mut sup = Supervised::start();
    let sock = sup.sock.clone();
    let sent = random_sessions(&sock, 150, 0x5eed_1234_abcd_0002, &mut || sup.serves());
    eprintln!("supervised daemon: {sent} random messages in 150 sessions, still serving");
    let log = sup.stop();
    // No input may kill a worker (a panic, a refused system call): the supervisor would
    // hide it by restarting.
    assert!(!log.contains("restart"), "{log}");
    assert!(!log.contains("refused system call"), "{log}");
}
