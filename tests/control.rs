// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The control channel (`--control-socket`) and `cxl-accel ctl`, against the real binary
//! under --supervise and the default seccomp filter: device info, counters, trace, buffers,
//! and every fault class seen from the driver's side of the ring.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use cxl_accel::device::command::encode::*;
use cxl_accel::protocol::*;
use serde_json::Value;

/// A supervised daemon with a control socket, as a test front-end sees it.
fn with_control() -> (Harness, PathBuf, PathBuf) {
    let dir = temp_dir();
    let sock = dir.join("ctl.sock");
    let log = dir.join("daemon.log");
    let h = Harness::with(Options {
        supervised: Some(vec![
            "--control-socket".into(),
            sock.to_str().unwrap().into(),
        ]),
        log: Some(log.clone()),
        ..Default::default()
    });
    (h, sock, log)
}

/// `cxl-accel ctl --json ...`: the reply, which must not be an error.
fn ctl(sock: &Path, args: &[&str]) -> Value {
    let out = daemon()
        .arg("ctl")
        .arg("--control-socket")
        .arg(sock)
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        panic!(
            "ctl {args:?}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        out.status.success() && v.get("error").is_none(),
        "ctl {args:?}: {v}"
    );
    v
}

fn nop() -> Vec<u8> {
    hdr(OP_NOP, 0, 1)
}

/// Posts one request and waits for it at most `timeout`: Some((used length, reply)).
fn try_call(h: &mut Harness, req: &[u8], timeout: Duration) -> Option<(u32, Reply)> {
    h.post(req, 0, 0x400);
    let (_, len) = h.queues[0].wait_used(&h.guest, timeout)?;
    Some((len, h.read_reply(0, len)))
}

#[test]
fn info_counters_trace_and_buffers() {
    let (mut h, sock, log) = with_control();
    let info = ctl(&sock, &["info"]);
    assert_eq!(info["memory_size"], DEVMEM_SIZE);
    assert_eq!(info["stalled"], false);
    let (id, off) = h.alloc(8192);
    for _ in 0..3 {
        assert_eq!(h.call(&nop()).status(), Status::Ok);
    }
    let bufs = ctl(&sock, &["buffers"]);
    assert_eq!(bufs["buffers"][0]["id"], id);
    assert_eq!(bufs["buffers"][0]["offset"], off);
    assert_eq!(bufs["buffers"][0]["size"], 8192);
    let c = ctl(&sock, &["counters"]);
    let nops = c["opcodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["opcode"] == "NOP")
        .expect("NOP counted")
        .clone();
    assert_eq!(nops["count"], 3);
    assert_eq!(nops["errors"], 0);
    let hist: u64 = nops["histogram_us"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b[1].as_u64().unwrap())
        .sum();
    assert_eq!(hist, 3, "every NOP is in the latency histogram");
    assert!(c["device"]["commands"].as_u64().unwrap() >= 4);
    // Trace: one line per command in the daemon's log.
    ctl(&sock, &["trace", "on"]);
    assert_eq!(h.call(&nop()).status(), Status::Ok);
    ctl(&sock, &["trace", "off"]);
    assert_eq!(h.call(&nop()).status(), Status::Ok);
    let text = std::fs::read_to_string(&log).unwrap();
    let traced = text.lines().filter(|l| l.contains("trace: NOP")).count();
    assert_eq!(traced, 1, "one traced command:\n{text}");
}

#[test]
fn fault_classes_seen_from_the_ring() {
    let (mut h, sock, _) = with_control();
    // The 2nd NOP fails with INTERNAL, once.
    let r = ctl(
        &sock,
        &[
            "fault", "add", "--opcode", "NOP", "--nth", "2", "--fail", "INTERNAL",
        ],
    );
    let rule = r["id"].as_u64().unwrap();
    let got: Vec<Status> = (0..4).map(|_| h.call(&nop()).status()).collect();
    assert_eq!(
        got,
        vec![Status::Ok, Status::Internal, Status::Ok, Status::Ok]
    );
    let list = ctl(&sock, &["fault", "list"]);
    assert_eq!(list["rules"][0]["matched"], 4);
    assert_eq!(list["rules"][0]["fired"], 1);
    ctl(&sock, &["fault", "clear", &rule.to_string()]);

    // A status the specification does not have, and a length shorter than a response.
    ctl(&sock, &["fault", "add", "--nth", "1", "--corrupt-status"]);
    let (_, r) = try_call(&mut h, &nop(), Duration::from_secs(5)).unwrap();
    assert_eq!(r.resp.status, 0xdead);
    ctl(&sock, &["fault", "clear"]);
    ctl(&sock, &["fault", "add", "--nth", "1", "--corrupt-length"]);
    let (len, _) = try_call(&mut h, &nop(), Duration::from_secs(5)).unwrap();
    assert!(len < 32, "used length {len}");
    ctl(&sock, &["fault", "clear"]);

    // Skip: answered OK, nothing done (a device that claims work it did not do).
    let (_, off) = h.alloc(4096);
    ctl(
        &sock,
        &["fault", "add", "--opcode", "FILL", "--nth", "1", "--skip"],
    );
    let fill_skipped = fill(1, 0x2222_2222_2222_2222, &[sge(SPACE_DEVMEM, off, 4096)]);
    assert_eq!(h.call(&fill_skipped).status(), Status::Ok);
    assert_ne!(h.devmem_read(off, 8), vec![0x22; 8], "a skipped FILL wrote");
    assert_eq!(h.call(&fill_skipped).status(), Status::Ok);
    assert_eq!(
        h.devmem_read(off, 8),
        vec![0x22; 8],
        "the next FILL did not"
    );
    ctl(&sock, &["fault", "clear"]);

    // A delay: the answer comes, late.
    ctl(
        &sock,
        &["fault", "add", "--every", "1", "--delay-ms", "300"],
    );
    let t = Instant::now();
    assert_eq!(h.call(&nop()).status(), Status::Ok);
    assert!(t.elapsed() >= Duration::from_millis(300));
    ctl(&sock, &["fault", "clear"]);

    // Late: executed at once, answered after the driver would have given up.
    let (id, off) = h.alloc(4096);
    let _ = id;
    ctl(
        &sock,
        &[
            "fault",
            "add",
            "--opcode",
            "FILL",
            "--nth",
            "1",
            "--late-ms",
            "600",
        ],
    );
    let fill = fill(1, 0x1111_1111_1111_1111, &[sge(SPACE_DEVMEM, off, 4096)]);
    assert!(try_call(&mut h, &fill, Duration::from_millis(300)).is_none());
    assert_eq!(
        h.devmem_read(off, 8),
        vec![0x11; 8],
        "executed before the answer"
    );
    let (_, late) = h.queues[0]
        .wait_used(&h.guest, Duration::from_secs(5))
        .unwrap();
    assert!(late >= 32);
    ctl(&sock, &["fault", "clear"]);

    // Hang: never answered while the queue runs; a queue stop (a reset) ends it at once.
    ctl(
        &sock,
        &["fault", "add", "--opcode", "NOP", "--nth", "1", "--hang"],
    );
    assert!(try_call(&mut h, &nop(), Duration::from_millis(500)).is_none());
    let t = Instant::now();
    h.restart_rings();
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "the stop took {:?}",
        t.elapsed()
    );
    ctl(&sock, &["fault", "clear"]);
    assert_eq!(h.call(&nop()).status(), Status::Ok);

    // Stall: nothing runs until unstalled.
    ctl(&sock, &["stall"]);
    assert!(try_call(&mut h, &nop(), Duration::from_millis(400)).is_none());
    assert_eq!(ctl(&sock, &["info"])["stalled"], true);
    ctl(&sock, &["unstall"]);
    let (_, r) = h.queues[0]
        .wait_used(&h.guest, Duration::from_secs(5))
        .map(|(_, l)| (l, h.read_reply(0, l)))
        .unwrap();
    assert_eq!(r.status(), Status::Ok);
}

#[test]
fn poison_fails_commands_posts_events_and_steers_allocation() {
    let (mut h, sock, _) = with_control();
    h.post_event_buffers(0x60000, 8, 32);
    let page = 4096u64;
    ctl(&sock, &["poison", "0x10000", "4096"]);
    let copy = |off: u64| {
        copy(
            1,
            &[sge(SPACE_DEVMEM, off, 64)],
            &[sge(SPACE_GPA, DATA, 64)],
        )
    };
    let r = h.call(&copy(0x10000 + 100));
    assert_eq!(r.status(), Status::MediaError);
    assert_eq!(r.resp.detail as u64, 0x10000 / page);
    assert_eq!(h.call(&copy(0x20000)).status(), Status::Ok);
    // By guest-physical address inside the BAR too.
    let r = h.call(&cxl_accel::device::command::encode::copy(
        1,
        &[sge(SPACE_GPA, DEVMEM_GPA + 0x10000, 64)],
        &[sge(SPACE_GPA, DATA, 64)],
    ));
    assert_eq!(r.status(), Status::MediaError);
    // Allocations go around it.
    for _ in 0..40 {
        let (_, off) = h.alloc(4096);
        assert!(
            off + 4096 <= 0x10000 || off >= 0x11000,
            "handed out {off:#x}"
        );
    }
    let c = ctl(&sock, &["counters"]);
    assert_eq!(c["device"]["media_errors"], 2);
    assert_eq!(c["status"]["MEDIA_ERROR"], 2);
    ctl(&sock, &["unpoison", "0", "0x100000"]);
    assert_eq!(h.call(&copy(0x10000)).status(), Status::Ok);
    // Both events reached the driver (kind, value0, value1 in the posted buffers).
    while h.queues[1]
        .wait_used(&h.guest, Duration::from_millis(300))
        .is_some()
    {}
    let events: Vec<(u32, u64, u64)> = (0..8u64)
        .map(|i| {
            let ev: Event =
                vm_memory::Bytes::read_obj(&h.guest, vm_memory::GuestAddress(0x60000 + i * 64))
                    .unwrap();
            (ev.kind, ev.value0, ev.value1)
        })
        .collect();
    assert!(
        events.contains(&(EVENT_POISON, 0x10000, 4096)),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|&(k, o, _)| k == EVENT_POISON_CLEARED && o == 0),
        "{events:?}"
    );
    // A bad range is refused with an error, not a panic.
    let out = daemon()
        .args(["ctl", "--control-socket"])
        .arg(&sock)
        .args(["poison", "0", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn allocation_goes_past_a_large_poisoned_range() {
    let (mut h, sock, _) = with_control();
    // 1024 pages poisoned at the start of device memory, where first fit looks first.
    ctl(&sock, &["poison", "0", "0x400000"]);
    for _ in 0..3 {
        let (_, off) = h.alloc(4096);
        assert!(off >= 0x400000, "handed out {off:#x}");
    }
    let (_, off) = h.alloc(2 << 20);
    assert!(off >= 0x400000, "handed out {off:#x}");
}

#[test]
fn poison_events_arrive_while_no_command_runs() {
    // A driver waits for the event with nothing in flight: the device must not hold it back
    // until the next command.
    let (mut h, sock, _) = with_control();
    h.post_event_buffers(0x60000, 8, 32);
    let mut wait_for = |kind: u32| {
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            let _ = h.queues[1].wait_used(&h.guest, Duration::from_millis(100));
            for i in 0..8u64 {
                let ev: Event =
                    vm_memory::Bytes::read_obj(&h.guest, vm_memory::GuestAddress(0x60000 + i * 64))
                        .unwrap();
                if ev.kind == kind {
                    return Some((ev.value0, ev.value1));
                }
            }
        }
        None
    };
    ctl(&sock, &["poison", "0x20000", "8192"]);
    assert_eq!(wait_for(EVENT_POISON), Some((0x20000, 8192)));
    ctl(&sock, &["unpoison", "0x20000", "8192"]);
    assert_eq!(wait_for(EVENT_POISON_CLEARED), Some((0x20000, 8192)));
}

#[test]
fn a_worker_restart_keeps_buffers_and_counters_but_no_fault_state() {
    // What the README promises: the state file carries buffers and the device's counters;
    // fault rules, the stall, the model, tracing, poison and the per-opcode metrics belong
    // to the worker and are gone with it.
    let (mut h, sock, _) = with_control();
    let (id, _) = h.alloc(8192);
    for _ in 0..3 {
        assert_eq!(h.call(&nop()).status(), Status::Ok);
    }
    ctl(
        &sock,
        &["fault", "add", "--opcode", "FILL", "--nth", "9", "--hang"],
    );
    ctl(
        &sock,
        &["model", "--enforce", "true", "--read-latency-ns", "5"],
    );
    ctl(&sock, &["trace", "on"]);
    ctl(&sock, &["poison", "0x40000", "4096"]);
    ctl(&sock, &["stall"]);
    let before = ctl(&sock, &["counters"]);
    let pid1 = ctl(&sock, &["info"])["pid"].as_u64().unwrap();
    // SAFETY: kills our own daemon's worker.
    unsafe { libc::kill(pid1 as i32, libc::SIGKILL) };
    wait_for_child(h.process.as_ref().unwrap().id(), Some(pid1 as u32));
    let info = ctl(&sock, &["info"]);
    assert_ne!(info["pid"].as_u64().unwrap(), pid1);
    assert_eq!(info["stalled"], false);
    assert_eq!(info["trace"], false);
    let f = ctl(&sock, &["fault", "list"]);
    assert_eq!(f["rules"], serde_json::json!([]));
    assert_eq!(f["poison"], serde_json::json!([]));
    assert_eq!(f["model"]["enforce"], false);
    // The device answers (not stalled), its buffer is still there, its counters went on.
    assert_eq!(h.call(&nop()).status(), Status::Ok);
    let bufs = ctl(&sock, &["buffers"]);
    assert_eq!(bufs["buffers"][0]["id"], id);
    let after = ctl(&sock, &["counters"]);
    assert!(
        after["device"]["commands"].as_u64() > before["device"]["commands"].as_u64(),
        "{before} -> {after}"
    );
    let nops = |c: &Value| {
        c["opcodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["opcode"] == "NOP")
            .map_or(0, |o| o["count"].as_u64().unwrap())
    };
    assert_eq!(nops(&before), 3);
    assert_eq!(nops(&after), 1, "per-opcode metrics start again");
}

#[test]
fn the_control_socket_outlives_worker_restarts() {
    let (mut h, sock, _) = with_control();
    let pid1 = ctl(&sock, &["info"])["pid"].as_u64().unwrap();
    assert_eq!(Some(pid1 as u32), h.worker_pid());
    // SAFETY: kills our own daemon's worker.
    unsafe { libc::kill(pid1 as i32, libc::SIGKILL) };
    wait_for_child(h.process.as_ref().unwrap().id(), Some(pid1 as u32));
    assert_eq!(h.call(&nop()).status(), Status::Ok);
    let pid2 = ctl(&sock, &["info"])["pid"].as_u64().unwrap();
    assert_ne!(pid1, pid2);
    // Garbage gets an error line, and the next request is served.
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    writeln!(s, "not json").unwrap();
    writeln!(s, "{{\"cmd\": \"nonsense\"}}").unwrap();
    writeln!(s, "{{\"cmd\": \"info\"}}").unwrap();
    let mut r = BufReader::new(s);
    for want_error in [true, true, false] {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v.get("error").is_some(), want_error, "{line}");
    }
    // The socket is the daemon user's alone.
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&sock).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
}
