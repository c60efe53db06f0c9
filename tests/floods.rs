// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A front-end or guest that repeats itself: new backend channels that are never answered
//! cost no threads, and resets, refused shared-object requests and failed announcements
//! cost a bounded number of log lines.

mod common;

use std::time::{Duration, Instant};

use common::*;
use cxl_accel::device::command::encode::*;
use cxl_accel::protocol::*;
use vhost::vhost_user::message::VhostUserSharedMsg;
use vhost::vhost_user::VhostUserFrontend;
use vm_memory::ByteValued;

fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

/// Allocates a buffer and exports it under `uuid`.
fn export(h: &mut Harness, uuid: [u8; 16]) -> u64 {
    let (id, _) = h.alloc(1 << 20);
    let r = h.call(&with(hdr(OP_EXPORT, 0, 2), &Export { id, uuid }));
    assert_eq!(r.status(), Status::Ok);
    id
}

#[test]
fn backend_channels_nobody_answers_cost_no_threads() {
    let mut h = Harness::with(Options {
        supervised: Some(Vec::new()),
        ..Default::default()
    });
    export(&mut h, [0x11; 16]);
    let worker = h.worker_pid().unwrap();
    let before = threads(worker);
    // Each channel gets the export announced (acks were negotiated) and never answers.
    let held: Vec<_> = (0..100).map(|_| h.new_backend_channel()).collect();
    // Answered in order: all 100 channels were taken.
    vhost::VhostBackend::get_features(h.frontend.as_mut().unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let after = threads(worker);
    drop(held);
    assert!(
        after <= before + 1,
        "{before} threads before, {after} after"
    );
    assert_eq!(h.call(&hdr(OP_NOP, 0, 3)).status(), Status::Ok);
}

#[test]
fn repeated_resets_and_refusals_log_a_bounded_number_of_lines() {
    let dir = temp_dir();
    let log = dir.join("daemon.log");
    let mut h = Harness::with(Options {
        supervised: Some(Vec::new()),
        log: Some(log.clone()),
        ..Default::default()
    });
    let uuid = [0x22; 16];
    let id = export(&mut h, uuid);
    // 300 resets from the guest.
    for i in 0..300 {
        assert_eq!(h.call(&hdr(OP_RESET, 0, i)).status(), Status::Ok);
    }
    // 300 shared-object requests the daemon must refuse.
    let id2 = export(&mut h, uuid);
    let mut m = VhostUserSharedMsg::default();
    m.as_mut_slice().copy_from_slice(&uuid);
    for _ in 0..300 {
        assert!(h.frontend.as_mut().unwrap().get_shared_object(&m).is_err());
    }
    // A backend channel whose other end is gone: 300 announcements fail.
    drop(h.new_backend_channel());
    for i in 0..150 {
        let r = h.call(&with(hdr(OP_UNEXPORT, 0, i), &Unexport { uuid }));
        assert_eq!(r.status(), Status::Ok);
        let r = h.call(&with(hdr(OP_EXPORT, 0, i), &Export { id: id2, uuid }));
        assert_eq!(r.status(), Status::Ok);
    }
    let _ = id;
    let t = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if t.elapsed() > Duration::from_secs(1) {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let count = |what: &str| text.lines().filter(|l| l.contains(what)).count();
    let (resets, objects, updates) = (
        count("device reset by the driver"),
        count("GET_SHARED_OBJECT"),
        count("shared object"),
    );
    eprintln!(
        "log lines: {resets} resets, {objects} GET_SHARED_OBJECT, {updates} shared-object updates"
    );
    assert!(resets <= 40, "{resets} lines for 300 resets");
    assert!(objects <= 40, "{objects} lines for 300 refused requests");
    assert!(
        updates <= 40,
        "{updates} lines for 300 failed announcements"
    );
    let _ = std::fs::remove_dir_all(dir);
}
