// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Shared-memory attach (`--attach shmem`): device memory is a VIRTIO shared memory region
//! of the virtio function, which the front-end maps when the daemon asks (SHMEM_MAP) and
//! drops at every device reset without telling it. The harness plays QEMU 11.1's part:
//! it records the requests and sends the memory table QEMU would send.

mod common;

use common::*;
use cxl_accel::device::command::encode::*;
use cxl_accel::device::Attach;
use cxl_accel::protocol::*;
use vhost::vhost_user::VhostUserFrontend;

fn set_base() -> Vec<u8> {
    with(
        hdr(OP_SET_DEVMEM_BASE, 0, 1),
        &SetDevmemBase { gpa: DEVMEM_GPA },
    )
}

fn shmem_harness(supervised: bool) -> Harness {
    Harness::with(Options {
        attach: Attach::Shmem,
        map_devmem: false,
        supervised: supervised.then(Vec::new),
        ..Default::default()
    })
}

/// The one map request a started device sends: all of its memory file, writable.
fn assert_maps_devmem(h: &Harness, req: &(bool, ShmemRequest)) {
    assert_eq!(
        *req,
        (
            true,
            ShmemRequest {
                shmid: SHM_ID_DEVMEM,
                fd_offset: 0,
                shm_offset: 0,
                len: DEVMEM_SIZE,
                flags: 1,
                inode: h.devmem_inode(),
            }
        )
    );
}

#[test]
fn device_memory_is_one_shared_memory_region() {
    let mut h = shmem_harness(false);
    let cfg = h.frontend.as_mut().unwrap().get_shmem_config().unwrap();
    let (n, sizes) = (cfg.nregions, cfg.memory_sizes);
    assert_eq!(n, 1);
    assert_eq!(sizes[SHM_ID_DEVMEM as usize], DEVMEM_SIZE);
    assert!(sizes[1..].iter().all(|&s| s == 0));
    assert_ne!(h.config().features & F_SHMEM, 0);
    // Asked for once the queues are enabled, i.e. the device is started (QEMU 11.1 crashes
    // on a map request for a device that is not): before any command.
    let reqs = h.shared.wait_shmem(1);
    assert_eq!(reqs.len(), 1);
    assert_maps_devmem(&h, &reqs[0]);
}

#[test]
fn bar_mode_offers_no_shared_memory() {
    let mut h = Harness::new();
    assert!(h.frontend.as_mut().unwrap().get_shmem_config().is_err());
    assert_eq!(h.config().features & F_SHMEM, 0);
}

#[test]
fn maps_when_started_and_again_after_a_reset() {
    let mut h = shmem_harness(false);
    // Until the front-end's memory table shows the region, the guest would read zeros.
    assert_eq!(h.call(&set_base()).status(), Status::NotReady);
    let reqs = h.shared.wait_shmem(1);
    assert_eq!(reqs.len(), 1, "one map request once the device started");
    assert_maps_devmem(&h, &reqs[0]);
    // The retries of a driver waiting for the mapping ask no more than once a second.
    for _ in 0..20 {
        assert_eq!(h.call(&set_base()).status(), Status::NotReady);
    }
    assert_eq!(h.shared.shmem.lock().unwrap().len(), 1);

    h.set_table(true);
    assert_eq!(h.call(&set_base()).status(), Status::Ok);
    // The guest's writes through the BAR and the device see the same memory.
    h.devmem_write(4096, b"one function");
    let c = copy(
        1,
        &[sge(SPACE_DEVMEM, 4096, 12)],
        &[sge(SPACE_GPA, DATA, 12)],
    );
    assert_eq!(h.call(&c).status(), Status::Ok);
    let mut back = [0u8; 12];
    vm_memory::Bytes::read_slice(&h.guest, &mut back, vm_memory::GuestAddress(DATA)).unwrap();
    assert_eq!(&back, b"one function");

    // A device reset: QEMU stops the queues and drops the mapping, silently; the next
    // start's table lacks it. The start asks again.
    h.restart_rings();
    h.set_table(false);
    assert_eq!(h.call(&set_base()).status(), Status::NotReady);
    let reqs = h.shared.wait_shmem(2);
    assert_eq!(reqs.len(), 2, "mapped again after the reset");
    assert_maps_devmem(&h, &reqs[1]);
    h.set_table(true);
    assert_eq!(h.call(&set_base()).status(), Status::Ok);
    // The contents are the file's: they survived the reset.
    assert_eq!(h.devmem_read(4096, 12), b"one function");

    // A pause (stop and start, mapping kept): the table still shows it, nothing is asked.
    h.restart_rings();
    h.set_table(true);
    assert_eq!(h.call(&set_base()).status(), Status::Ok);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(h.shared.shmem.lock().unwrap().len(), 2);
}

#[test]
fn a_restarted_worker_maps_what_is_not_mapped_and_the_exit_unmaps() {
    let mut h = shmem_harness(true);
    assert_eq!(h.call(&set_base()).status(), Status::NotReady);
    assert_eq!(h.shared.wait_shmem(1).len(), 1);
    // The worker dies before the front-end mapped anything: its successor gets the old
    // table replayed (no region) and asks again at the first kick.
    let pid = h.worker_pid().expect("a worker");
    // SAFETY: kills our own daemon's worker.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let next = wait_for_child(h.process.as_ref().unwrap().id(), Some(pid));
    assert_ne!(next, pid);
    assert_eq!(h.call(&set_base()).status(), Status::NotReady);
    let reqs = h.shared.wait_shmem(2);
    assert_eq!(reqs.len(), 2, "the new worker maps");
    assert_maps_devmem(&h, &reqs[1]);
    h.set_table(true);
    assert_eq!(h.call(&set_base()).status(), Status::Ok);

    // Mapped now: a worker restart keeps the mapping (the replayed table has it).
    let pid = h.worker_pid().unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_for_child(h.process.as_ref().unwrap().id(), Some(pid));
    assert_eq!(h.call(&set_base()).status(), Status::Ok);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(h.shared.shmem.lock().unwrap().len(), 2);

    // SIGTERM: the device goes, and with it the guest's view of its memory.
    // SAFETY: signals our own child.
    unsafe { libc::kill(h.process.as_ref().unwrap().id() as i32, libc::SIGTERM) };
    let reqs = h.shared.wait_shmem(3);
    assert_eq!(reqs.len(), 3, "unmapped at exit");
    let (map, u) = reqs[2];
    assert!(!map);
    assert_eq!(
        (u.shmid, u.shm_offset, u.len),
        (SHM_ID_DEVMEM, 0, DEVMEM_SIZE)
    );
}

#[test]
fn the_memory_size_must_be_a_power_of_two() {
    let e = fails_with_one_line(&[
        "--socket-path",
        "/nonexistent/s",
        "--memory-path",
        "/nonexistent/m",
        "--memory-size",
        "6M",
    ]);
    assert!(e.contains("power-of-two"), "{e}");
}
