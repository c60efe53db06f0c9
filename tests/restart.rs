// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Restart without loss: the real daemon under `--supervise`, its worker killed with
//! SIGKILL again and again while commands stream in. Every command must come back, either
//! done (with correct data) or INTERRUPTED; allocations, exports and counters survive.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use crc32c::crc32c_append as crc32c;
use cxl_accel::device::command::encode::*;
use cxl_accel::protocol::*;
use vm_memory::{ByteValued, Bytes, GuestAddress};

const KILLS: usize = 25;
const BATCH: u64 = 16;
const CHUNK: u64 = 64 << 10;
/// A device-memory word the atomics count in.
const COUNTER: u64 = 100 << 20;
const ADDS_PER_ATOMIC: u64 = 1 << 20;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Copy { seed: u8, dst: u64 },
    Fill { pattern: u64, dst: u64 },
    Checksum { expect: u32 },
    Atomic,
    Alloc,
}

fn supervised() -> Harness {
    Harness::with(Options {
        supervised: Some(Vec::new()),
        ..Default::default()
    })
}

fn wait_for_worker(h: &Harness, not: Option<u32>) -> u32 {
    wait_for_child(h.process.as_ref().expect("supervised").id(), not)
}

fn kill(pid: u32) {
    // SAFETY: sends a signal to a process id; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
}

#[test]
fn commands_survive_worker_kills() {
    let mut h = supervised();
    let alloc = |size| with(hdr(OP_ALLOC, 0, 1), &Alloc { size, align: 0 });
    // Buffers the device said it allocated: each must exist at the end, and no others.
    let mut ids = Vec::new();
    for _ in 0..3 {
        let r = h.call(&alloc(1 << 20));
        assert_eq!(r.status(), Status::Ok);
        ids.push(r.resp.result0);
    }
    let uuid = [0x5a; 16];
    let r = h.call(&with(hdr(OP_EXPORT, 0, 1), &Export { id: ids[0], uuid }));
    assert_eq!(r.status(), Status::Ok);

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut next = || rng.next();
    let (mut done, mut interrupted, mut atomics_done, mut atomics_cut) = (0, 0, 0u64, 0u64);
    let mut worker = wait_for_worker(&h, None);
    for round in 0..KILLS {
        let mut posted: HashMap<u16, (u64, Kind)> = HashMap::new();
        for i in 0..BATCH {
            let slot = i + 1;
            let src = DATA + i * CHUNK;
            let dst = (round as u64 % 4) * BATCH * CHUNK + i * CHUNK;
            let tag = round as u64 * 100 + i;
            let (req, kind) = match i % 5 {
                0 => {
                    let seed = next() as u8;
                    h.guest
                        .write_slice(&pattern(CHUNK as usize, seed), GuestAddress(src))
                        .unwrap();
                    let req = copy(
                        tag,
                        &[sge(SPACE_GPA, src, CHUNK as u32)],
                        &[sge(SPACE_DEVMEM, dst, CHUNK as u32)],
                    );
                    (req, Kind::Copy { seed, dst })
                }
                1 => {
                    let pattern = next();
                    let req = fill(tag, pattern, &[sge(SPACE_DEVMEM, dst, CHUNK as u32)]);
                    (req, Kind::Fill { pattern, dst })
                }
                2 => {
                    let data = pattern(CHUNK as usize, next() as u8);
                    h.guest.write_slice(&data, GuestAddress(src)).unwrap();
                    let req = checksum(tag, 0, &[sge(SPACE_GPA, src, CHUNK as u32)]);
                    (
                        req,
                        Kind::Checksum {
                            expect: crc32c(0, &data),
                        },
                    )
                }
                4 => (alloc(CHUNK), Kind::Alloc),
                _ => {
                    let a = Atomic {
                        op: ATOMIC_FETCH_ADD,
                        width: 8,
                        space: SPACE_DEVMEM,
                        reserved: 0,
                        addr: COUNTER,
                        operand: 1,
                        compare: 0,
                        repeat: ADDS_PER_ATOMIC,
                    };
                    (atomic(tag, a), Kind::Atomic)
                }
            };
            let head = h.post(&req, slot, 64);
            posted.insert(head, (slot, kind));
        }
        // Kill while the batch is (probably) running.
        std::thread::sleep(Duration::from_micros(next() % 3000));
        kill(worker);
        for _ in 0..BATCH {
            let (head, len) = h.queues[0]
                .wait_used(&h.guest, Duration::from_secs(20))
                .unwrap_or_else(|| panic!("round {round}: a command never came back"));
            let (slot, kind) = posted
                .remove(&(head as u16))
                .unwrap_or_else(|| panic!("round {round}: unknown or repeated head {head}"));
            let r = h.read_reply(slot, len);
            match r.status() {
                Status::Interrupted => {
                    interrupted += 1;
                    if matches!(kind, Kind::Atomic) {
                        atomics_cut += 1;
                    }
                    continue;
                }
                Status::Ok => done += 1,
                s => panic!("round {round}: {kind:?} failed with {s:?}"),
            }
            match kind {
                Kind::Copy { seed, dst } => assert!(
                    h.devmem_read(dst, CHUNK as usize) == pattern(CHUNK as usize, seed),
                    "round {round}: completed copy to {dst:#x} left other data"
                ),
                Kind::Fill { pattern, dst } => {
                    let got = h.devmem_read(dst, CHUNK as usize);
                    assert!(
                        got.chunks(8).all(|c| c == pattern.to_le_bytes()),
                        "round {round}: completed fill at {dst:#x} left other data"
                    );
                }
                Kind::Checksum { expect } => assert_eq!(r.resp.result0, expect as u64),
                Kind::Atomic => atomics_done += 1,
                Kind::Alloc => ids.push(r.resp.result0),
            }
        }
        assert!(posted.is_empty());
        worker = wait_for_worker(&h, Some(worker));
    }
    eprintln!(
        "{KILLS} kills: {done} commands completed, {interrupted} interrupted \
         ({atomics_done} atomics done, {atomics_cut} cut)"
    );
    assert!(interrupted > 0, "no kill hit a command in flight");

    // Atomics: every completed one counted in full, interrupted ones partly at most.
    let counter = u64::from_le_bytes(h.devmem_read(COUNTER, 8).try_into().unwrap());
    assert!(
        counter >= atomics_done * ADDS_PER_ATOMIC,
        "lost atomic updates: {counter}"
    );
    assert!(counter <= (atomics_done + atomics_cut) * ADDS_PER_ATOMIC);

    // The daemon's own state survived every restart.
    let r = h.call(&hdr(OP_IDENTIFY, 0, 2));
    let ident = Identify::from_slice(&r.payload).copied().unwrap();
    let allocated = ids.len() as u64;
    assert_eq!(
        ident.buffers as u64, allocated,
        "interrupted allocations leaked"
    );
    assert_eq!(
        ident.devmem_free,
        DEVMEM_SIZE - 3 * (1 << 20) - (allocated - 3) * CHUNK
    );
    let r = h.call(&hdr(OP_STATS, 0, 3));
    let stats = Stats::from_slice(&r.payload).copied().unwrap();
    assert!(stats.counter[STAT_COMMANDS] >= done as u64 + 5);
    eprintln!(
        "{} buffers allocated during the kills all survived",
        allocated - 3
    );
    for id in &ids {
        let r = h.call(&with(hdr(OP_FREE, 0, 4), &Free { id: *id }));
        assert_eq!(r.status(), Status::Ok, "buffer {id} lost in a restart");
    }
    // The front-end can still stop the rings (as a driver unload does), and gets the
    // position of the last request taken.
    let posted = h.queues[0].used_idx(&h.guest);
    let fe = h.frontend.as_mut().unwrap();
    let base = vhost::VhostBackend::get_vring_base(fe, 0).expect("GET_VRING_BASE answered");
    assert_eq!(base as u16, posted);
    vhost::VhostBackend::get_vring_base(fe, 1).expect("GET_VRING_BASE answered");
    // The export was announced once, not again by each new worker, and its removal
    // reached the front-end over the replayed backend channel.
    let t = Instant::now();
    loop {
        let log = h.shared.log.lock().unwrap().clone();
        if log.len() >= 2 {
            assert_eq!(log, vec![(true, uuid), (false, uuid)]);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "shared objects: {log:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn workers_killed_before_they_took_their_connection_are_replaced() {
    let mut h = supervised();
    assert_eq!(h.call(&hdr(OP_NOP, 0, 1)).status(), Status::Ok);
    let mut worker = wait_for_worker(&h, None);
    // Each replacement killed as soon as it exists: mostly before it accepted the
    // connection the supervisor made for it, which then never closes.
    for _ in 0..5 {
        kill(worker);
        worker = wait_for_worker(&h, Some(worker));
    }
    assert_eq!(h.call(&hdr(OP_NOP, 0, 2)).status(), Status::Ok);
}

#[test]
fn a_second_daemon_on_the_same_memory_file_is_refused() {
    let h = supervised();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cxl-accel"))
        .arg("--socket-path")
        .arg(h.dir.join("other.sock"))
        .arg("--memory-path")
        .arg(h.dir.join("devmem"))
        .arg("--memory-size")
        .arg(DEVMEM_SIZE.to_string())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("locked by another running cxl-accel"), "{err}");
}

#[test]
fn a_memory_table_sent_after_the_rings_survives_a_restart() {
    // QEMU sends the table again when the guest's address space changes (a BAR, a shared
    // memory mapping): the recording then holds it after the rings, whose addresses the
    // new worker can only translate once it has the table.
    let mut h = Harness::with(Options {
        map_devmem: false,
        supervised: Some(Vec::new()),
        ..Default::default()
    });
    h.set_table(true);
    let set_base = with(
        hdr(OP_SET_DEVMEM_BASE, 0, 1),
        &SetDevmemBase { gpa: DEVMEM_GPA },
    );
    assert_eq!(h.call(&set_base).status(), Status::Ok);
    let pid = wait_for_worker(&h, None);
    kill(pid);
    wait_for_worker(&h, Some(pid));
    assert_eq!(h.call(&set_base).status(), Status::Ok);
}

#[test]
fn rings_started_again_after_a_restart_work() {
    // A front-end waiting for an ack that never comes would hang the test.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        eprintln!("rings_started_again_after_a_restart_work: hung");
        std::process::exit(1);
    });
    let mut h = supervised();
    let nop = hdr(OP_NOP, 0, 1);
    assert_eq!(h.call(&nop).status(), Status::Ok);
    // Killed while idle, then the driver is reloaded: the front-end stops and restarts
    // the rings on the new worker.
    let w = wait_for_worker(&h, None);
    kill(w);
    wait_for_worker(&h, Some(w));
    assert_eq!(h.call(&nop).status(), Status::Ok);
    h.restart_rings();
    for _ in 0..3 {
        assert_eq!(h.call(&nop).status(), Status::Ok);
    }
    // And a kill after the restart still resumes.
    let w = wait_for_worker(&h, None);
    kill(w);
    wait_for_worker(&h, Some(w));
    assert_eq!(h.call(&nop).status(), Status::Ok);
}

#[test]
fn runs_as_an_unprivileged_user() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        // Not root: this whole test suite already ran unprivileged.
        return;
    }
    let nobody = 65534;
    let mut h = Harness::with(Options {
        supervised: Some(vec!["--seccomp".into(), "enforce".into()]),
        run_as: Some(nobody),
        ..Default::default()
    });
    let (_, offset) = h.alloc(1 << 20);
    let dst = [sge(SPACE_DEVMEM, offset, 4096)];
    assert_eq!(
        h.call(&fill(2, 0x7777_7777_7777_7777, &dst)).status(),
        Status::Ok
    );
    let w = wait_for_worker(&h, None);
    let status = std::fs::read_to_string(format!("/proc/{w}/status")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid_line.split_whitespace().skip(1).all(|u| u == "65534"),
        "{uid_line}"
    );
    let cap_line = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
    assert!(cap_line.ends_with("0000000000000000"), "{cap_line}");
    use std::os::unix::fs::MetadataExt;
    let sock = std::fs::metadata(h.dir.join("cxl.sock")).unwrap();
    assert_eq!((sock.uid(), sock.mode() & 0o777), (nobody, 0o600));
    // A restart works without privileges too.
    kill(w);
    wait_for_worker(&h, Some(w));
    let r = h.call(&checksum(3, 0, &dst));
    assert_eq!(r.status(), Status::Ok);
    assert_eq!(r.resp.result0, crc32c(0, &[0x77; 4096]) as u64);
}

#[test]
fn a_restarted_worker_signals_what_it_answers() {
    let mut h = supervised();
    assert_eq!(h.call(&hdr(OP_NOP, 0, 1)).status(), Status::Ok);
    let long = Atomic {
        op: ATOMIC_FETCH_ADD,
        width: 8,
        space: SPACE_DEVMEM,
        reserved: 0,
        addr: COUNTER,
        operand: 1,
        compare: 0,
        repeat: 1 << 27,
    };
    h.post(&atomic(2, long), 1, 64);
    std::thread::sleep(Duration::from_millis(20));
    h.drain_call(0);
    let w = wait_for_worker(&h, None);
    kill(w);
    // Only the new worker can complete the atomic (as INTERRUPTED), and the driver learns
    // of it only through the call eventfd: polling the used ring would hide a lost signal.
    assert!(
        h.wait_call(0, Duration::from_secs(10)),
        "the interrupted request was answered without an interrupt"
    );
    let (_, len) = h.queues[0]
        .wait_used(&h.guest, Duration::from_secs(1))
        .unwrap();
    assert_eq!(h.read_reply(1, len).status(), Status::Interrupted);
}

#[test]
fn the_relay_and_the_worker_are_sandboxed_by_default() {
    let h = supervised();
    let sup = h.process.as_ref().unwrap().id();
    let worker = wait_for_worker(&h, None);
    let seccomp = |task: &str| -> String {
        let status = std::fs::read_to_string(format!("{task}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("Seccomp:")).unwrap();
        line.split_whitespace().nth(1).unwrap().to_string()
    };
    let tasks: Vec<(String, String)> = std::fs::read_dir(format!("/proc/{sup}/task"))
        .unwrap()
        .map(|t| {
            let path = t.unwrap().path().display().to_string();
            let comm = std::fs::read_to_string(format!("{path}/comm")).unwrap();
            (comm.trim().to_string(), path)
        })
        .collect();
    // The thread that parses the front-end's messages is filtered (mode 2)...
    let relay = tasks
        .iter()
        .find(|(c, _)| c == "relay")
        .expect("a relay thread");
    assert_eq!(seccomp(&relay.1), "2");
    // ...the one that starts workers (the main thread) cannot be, or workers would
    // inherit its filter...
    assert_eq!(seccomp(&format!("/proc/{sup}/task/{sup}")), "0");
    // ...and the worker filters itself once it serves.
    assert_eq!(seccomp(&format!("/proc/{worker}")), "2");
}
