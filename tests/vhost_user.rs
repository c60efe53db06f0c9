// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon driven over a real unix socket by an in-process vhost-user front-end:
//! every command, and every class of hostile input.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use crc32c::crc32c_append as crc32c;
use cxl_accel::device::command::encode::*;
use cxl_accel::protocol::*;
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryBackend};

fn ok(r: &common::Reply) {
    assert_eq!(r.status(), Status::Ok, "detail {}", r.resp.detail);
}

fn gpa(addr: u64, len: u32) -> Sge {
    sge(SPACE_GPA, addr, len)
}

fn dev(off: u64, len: u32) -> Sge {
    sge(SPACE_DEVMEM, off, len)
}

fn read_guest(h: &Harness, addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    h.guest.read_slice(&mut v, GuestAddress(addr)).unwrap();
    v
}

#[test]
fn config_space_describes_the_device() {
    let mut h = Harness::new();
    let c = h.config();
    assert_eq!(c.magic, MAGIC);
    assert_eq!(
        (c.version_major, c.version_minor),
        (VERSION_MAJOR, VERSION_MINOR)
    );
    assert_eq!(c.devmem_size, DEVMEM_SIZE);
    assert_eq!(c.num_dma_engines, 2);
    assert_eq!(c.max_segments, MAX_SEGMENTS);
    assert_eq!(c.page_size, 4096);
    assert_ne!(c.features & F_ALLOC, 0);
}

#[test]
fn nop_and_identify() {
    let mut h = Harness::new();
    let r = h.call(&hdr(OP_NOP, 0, 42));
    ok(&r);
    assert_eq!(r.resp.tag, 42);
    assert_eq!(r.used_len, 32);
    let r = h.call(&hdr(OP_IDENTIFY, 0, 7));
    ok(&r);
    assert_eq!(r.used_len as usize, 32 + std::mem::size_of::<Identify>());
    let id = Identify::from_slice(&r.payload).copied().unwrap();
    assert_eq!(id.magic, MAGIC);
    assert_eq!(id.devmem_size, DEVMEM_SIZE);
    assert_eq!(id.devmem_free, DEVMEM_SIZE);
    assert_eq!(id.devmem_gpa, DEVMEM_GPA);
}

#[test]
fn device_memory_is_recognised_by_file_identity_not_size() {
    // Another region of exactly the device memory's size comes first in the table.
    let decoy = memfd("decoy", DEVMEM_SIZE);
    let mut h = Harness::with(Options {
        extra_regions: vec![(0x2_0000_0000, decoy, DEVMEM_SIZE)],
        ..Default::default()
    });
    // One round trip: the memory table has been processed.
    ok(&h.call(&hdr(OP_NOP, 0, 0)));
    assert_eq!(h.device().layout().devmem_gpa, Some(DEVMEM_GPA));
    let set = |gpa| with(hdr(OP_SET_DEVMEM_BASE, 0, 1), &SetDevmemBase { gpa });
    ok(&h.call(&set(DEVMEM_GPA)));
    assert_eq!(h.call(&set(0x2_0000_0000)).status(), Status::Invalid);
}

#[test]
fn set_devmem_base_before_the_bar_is_mapped() {
    let mut h = Harness::with(Options {
        map_devmem: false,
        ..Default::default()
    });
    let r = h.call(&with(
        hdr(OP_SET_DEVMEM_BASE, 0, 1),
        &SetDevmemBase { gpa: DEVMEM_GPA },
    ));
    assert_eq!(r.status(), Status::NotReady);
    // Device-memory offsets work without the BAR; BAR addresses do not.
    ok(&h.call(&fill(1, 0x11, &[dev(0, 4096)])));
    assert_eq!(
        h.call(&fill(1, 0x11, &[gpa(DEVMEM_GPA, 4096)])).status(),
        Status::BadGpa
    );
}

#[test]
fn copy_in_every_direction_with_scatter_gather() {
    let mut h = Harness::new();
    let data = pattern(3 * 4096 + 100, 3);
    h.guest.write_slice(&data, GuestAddress(DATA)).unwrap();
    let n = data.len() as u32;
    // guest -> device, source split in three uneven pieces, destination in two.
    let r = h.call(&copy(
        1,
        &[
            gpa(DATA, 1000),
            gpa(DATA + 1000, 5000),
            gpa(DATA + 6000, n - 6000),
        ],
        &[dev(8192, 7000), dev(65536, n - 7000)],
    ));
    ok(&r);
    assert_eq!(r.resp.result0, n as u64);
    assert_eq!(h.devmem_read(8192, 7000), data[..7000]);
    assert_eq!(h.devmem_read(65536, n as usize - 7000), data[7000..]);
    // device -> device
    ok(&h.call(&copy(
        2,
        &[dev(8192, 7000), dev(65536, n - 7000)],
        &[dev(1 << 20, n)],
    )));
    assert_eq!(h.devmem_read(1 << 20, n as usize), data);
    // device -> guest
    ok(&h.call(&copy(3, &[dev(1 << 20, n)], &[gpa(DATA + (1 << 20), n)])));
    assert_eq!(read_guest(&h, DATA + (1 << 20), n as usize), data);
    // guest -> guest
    ok(&h.call(&copy(4, &[gpa(DATA, n)], &[gpa(DATA + (2 << 20), n)])));
    assert_eq!(read_guest(&h, DATA + (2 << 20), n as usize), data);
    // through the BAR's guest-physical address: the same bytes as device offsets
    ok(&h.call(&copy(5, &[gpa(DATA, n)], &[gpa(DEVMEM_GPA + (4 << 20), n)])));
    assert_eq!(h.devmem_read(4 << 20, n as usize), data);
    // overlapping device-to-device copy behaves like memmove on each piece
    ok(&h.call(&copy(
        6,
        &[dev(4 << 20, 4096)],
        &[dev((4 << 20) + 16, 4096)],
    )));
    assert_eq!(h.devmem_read((4 << 20) + 16, 4096), data[..4096]);
    assert!(h.device().stat(STAT_BYTES_COPIED) >= 5 * n as u64);
}

#[test]
fn large_overlapping_copies_behave_like_memmove() {
    // Larger than one copy step (1 MiB), both directions, device to device and through
    // the BAR's address.
    let mut h = Harness::new();
    let n = 3u64 << 20;
    let data = pattern(n as usize, 7);
    for (tag, src, dst) in [(1u64, 0u64, 4096u64), (2, 8192, 0), (3, 0, (1 << 20) + 12)] {
        h.guest.write_slice(&data, GuestAddress(DATA)).unwrap();
        ok(&h.call(&copy(10, &[gpa(DATA, n as u32)], &[dev(src, n as u32)])));
        ok(&h.call(&copy(tag, &[dev(src, n as u32)], &[dev(dst, n as u32)])));
        assert_eq!(
            h.devmem_read(dst, n as usize),
            data,
            "copy {tag}: {src} -> {dst}"
        );
    }
    // The source named by the BAR's guest-physical address, the destination by offset.
    h.guest.write_slice(&data, GuestAddress(DATA)).unwrap();
    ok(&h.call(&copy(20, &[gpa(DATA, n as u32)], &[dev(0, n as u32)])));
    ok(&h.call(&copy(
        21,
        &[gpa(DEVMEM_GPA, n as u32)],
        &[dev(2 << 20, n as u32)],
    )));
    assert_eq!(h.devmem_read(2 << 20, n as usize), data);
}

#[test]
fn copy_to_a_peer_bar_is_peer_to_peer() {
    let dir = temp_dir();
    let peer_path = dir.join("peer-devmem");
    let peer = cxl_accel::device::devmem::DeviceMemory::open(&peer_path, 4 << 20).unwrap();
    let peer_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&peer_path)
        .unwrap();
    let peer_gpa = 0x3_0000_0000;
    let mut h = Harness::with(Options {
        peers: vec![peer_path.clone()],
        extra_regions: vec![(peer_gpa, peer_file, 4 << 20)],
        ..Default::default()
    });
    ok(&h.call(&hdr(OP_NOP, 0, 0)));
    assert_eq!(h.device().layout().peers, vec![(peer_gpa, 4 << 20)]);
    let data = pattern(65536, 9);
    h.devmem_write(0, &data);
    ok(&h.call(&copy(1, &[dev(0, 65536)], &[gpa(peer_gpa + 4096, 65536)])));
    let mut back = vec![0u8; 65536];
    peer.slice(4096, 65536).unwrap().copy_to(&mut back[..]);
    assert_eq!(back, data);
    assert_eq!(h.device().stat(STAT_BYTES_P2P), 65536);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn fill_keeps_the_pattern_phase_across_segments() {
    let mut h = Harness::new();
    let p: u64 = 0x0807_0605_0403_0201;
    let r = h.call(&fill(1, p, &[dev(0, 3), gpa(DATA, 13), dev(100, 200_000)]));
    ok(&r);
    assert_eq!(r.resp.result0, 3 + 13 + 200_000);
    let expect = |start: usize, len: usize| -> Vec<u8> {
        (start..start + len).map(|i| (i % 8 + 1) as u8).collect()
    };
    assert_eq!(h.devmem_read(0, 3), expect(0, 3));
    assert_eq!(read_guest(&h, DATA, 13), expect(3, 13));
    assert_eq!(h.devmem_read(100, 200_000), expect(16, 200_000));
}

#[test]
fn checksum_matches_crc32c_of_the_data() {
    let mut h = Harness::new();
    let data = pattern(300_000, 1);
    h.devmem_write(4096, &data[..100_000]);
    h.guest
        .write_slice(&data[100_000..], GuestAddress(DATA))
        .unwrap();
    let r = h.call(&checksum(1, 0, &[dev(4096, 100_000), gpa(DATA, 200_000)]));
    ok(&r);
    assert_eq!(r.resp.result0, crc32c(0, &data) as u64);
    assert_eq!(r.resp.result1, 300_000);
    let r = h.call(&checksum(2, 77, &[dev(4096, 10)]));
    assert_eq!(r.resp.result0, crc32c(77, &data[..10]) as u64);
}

fn atomic_cmd(
    op: u16,
    width: u16,
    space: u16,
    addr: u64,
    operand: u64,
    compare: u64,
    repeat: u64,
) -> Atomic {
    Atomic {
        op,
        width,
        space,
        reserved: 0,
        addr,
        operand,
        compare,
        repeat,
    }
}

/// The device and a CPU thread add to the same word at once; no update may be lost.
fn concurrent_fetch_add(h: &mut Harness, space: u16, addr: u64, word: &AtomicU64) {
    const N: u64 = 300_000;
    let start = word.load(Ordering::SeqCst);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..N {
                word.fetch_add(1, Ordering::SeqCst);
            }
        });
        let r = h.call(&atomic(
            1,
            atomic_cmd(ATOMIC_FETCH_ADD, 8, space, addr, 1, 0, N),
        ));
        ok(&r);
        assert_eq!(r.resp.result1, N);
    });
    assert_eq!(word.load(Ordering::SeqCst), start + 2 * N);
}

#[test]
fn concurrent_atomics_on_device_and_guest_memory() {
    let mut h = Harness::new();
    let dev_word = {
        let p = h.devmem.as_ptr() as usize + 4096;
        // SAFETY: the mapping outlives the test body and the offset is 8-byte aligned.
        unsafe { &*(p as *const AtomicU64) }
    };
    concurrent_fetch_add(&mut h, SPACE_DEVMEM, 4096, dev_word);
    let guest_word = {
        let p = h.guest.get_host_address(GuestAddress(DATA)).unwrap() as usize;
        // SAFETY: as above, for guest memory.
        unsafe { &*(p as *const AtomicU64) }
    };
    concurrent_fetch_add(&mut h, SPACE_GPA, DATA, guest_word);
}

#[test]
fn compare_exchange_swap_and_32_bit_width() {
    let mut h = Harness::new();
    h.devmem_write(64, &5u64.to_le_bytes());
    let r = h.call(&atomic(
        1,
        atomic_cmd(ATOMIC_CMPXCHG, 8, SPACE_DEVMEM, 64, 9, 5, 0),
    ));
    ok(&r);
    assert_eq!((r.resp.result0, r.resp.result1), (5, 1));
    let r = h.call(&atomic(
        1,
        atomic_cmd(ATOMIC_CMPXCHG, 8, SPACE_DEVMEM, 64, 1, 5, 1),
    ));
    assert_eq!((r.resp.result0, r.resp.result1), (9, 0));
    let r = h.call(&atomic(
        1,
        atomic_cmd(ATOMIC_SWAP, 8, SPACE_DEVMEM, 64, 3, 0, 0),
    ));
    assert_eq!(r.resp.result0, 9);
    assert_eq!(h.devmem_read(64, 8), 3u64.to_le_bytes());
    h.devmem_write(128, &[0xff, 0xff, 0xff, 0xff, 7, 7, 7, 7]);
    let r = h.call(&atomic(
        1,
        atomic_cmd(ATOMIC_FETCH_ADD, 4, SPACE_DEVMEM, 128, 1, 0, 1),
    ));
    assert_eq!(r.resp.result0, 0xffff_ffff);
    // 32-bit wrap-around leaves the neighbouring word alone.
    assert_eq!(h.devmem_read(128, 8), [0, 0, 0, 0, 7, 7, 7, 7]);
}

#[test]
fn batched_page_copies_between_guest_and_device() {
    let mut h = Harness::new();
    let pages = 64u64;
    let data = pattern((pages * 4096) as usize, 5);
    h.guest.write_slice(&data, GuestAddress(DATA)).unwrap();
    // Scatter guest pages onto device pages in reverse order.
    let src: Vec<u64> = (0..pages).map(|i| DATA + i * 4096).collect();
    let dst: Vec<u64> = (0..pages).map(|i| (pages - 1 - i) * 4096).collect();
    let r = h.call(&copy_pages(1, 4096, SPACE_GPA, SPACE_DEVMEM, &src, &dst));
    ok(&r);
    assert_eq!(r.resp.result0, pages);
    for i in 0..pages as usize {
        let off = (pages as usize - 1 - i) * 4096;
        assert_eq!(
            h.devmem_read(off as u64, 4096),
            data[i * 4096..(i + 1) * 4096]
        );
    }
    // And back to fresh guest pages.
    let back: Vec<u64> = (0..pages).map(|i| DATA + (8 << 20) + i * 4096).collect();
    ok(&h.call(&copy_pages(2, 4096, SPACE_DEVMEM, SPACE_GPA, &dst, &back)));
    assert_eq!(read_guest(&h, DATA + (8 << 20), data.len()), data);
    assert_eq!(h.device().stat(STAT_PAGES_COPIED), 2 * pages);
    // Misaligned page addresses are refused before anything moves.
    let r = h.call(&copy_pages(
        3,
        4096,
        SPACE_GPA,
        SPACE_DEVMEM,
        &[DATA + 1],
        &[0],
    ));
    assert_eq!((r.status(), r.resp.detail), (Status::Unaligned, 0));
    // A misaligned destination page is named after all the source pages (spec 3.1).
    let r = h.call(&copy_pages(
        4,
        4096,
        SPACE_GPA,
        SPACE_DEVMEM,
        &[DATA, DATA + 4096],
        &[0, 4096 + 8],
    ));
    assert_eq!((r.status(), r.resp.detail), (Status::Unaligned, 3));
}

#[test]
fn fence_orders_a_command_after_all_earlier_ones() {
    let mut h = Harness::with(Options {
        dma_threads: 4,
        ..Default::default()
    });
    for round in 0..20u8 {
        let data = pattern(4 << 20, round);
        h.guest.write_slice(&data, GuestAddress(DATA)).unwrap();
        h.post(&copy(1, &[gpa(DATA, 4 << 20)], &[dev(0, 4 << 20)]), 1, 64);
        let mut c = checksum(2, 0, &[dev(0, 4 << 20)]);
        c[2] = FLAG_FENCE as u8;
        h.post(&c, 2, 64);
        let mut done = Vec::new();
        for _ in 0..2 {
            let (id, len) = h.queues[0]
                .wait_used(&h.guest, Duration::from_secs(20))
                .unwrap();
            done.push((id, len));
        }
        let r = h.read_reply(2, 32);
        ok(&r);
        assert_eq!(r.resp.result0, crc32c(0, &data) as u64, "round {round}");
    }
}

#[test]
fn fence_waits_for_small_commands_answered_inline() {
    // Small COPYs are answered on the ring thread after the pass over the ring that took
    // them; a fenced command taken in the same pass goes to an engine at once, and must
    // still see every one of them done.
    let mut h = Harness::with(Options {
        dma_threads: 2,
        ..Default::default()
    });
    let (piece, n) = (64u64 << 10, 48u64);
    for round in 0..5u8 {
        let data = pattern((n * piece) as usize, round);
        h.guest.write_slice(&data, GuestAddress(DATA)).unwrap();
        for i in 0..n {
            let c = copy(
                1 + i,
                &[gpa(DATA + i * piece, piece as u32)],
                &[dev(i * piece, piece as u32)],
            );
            h.post_quietly(&c, 1 + i, 64);
        }
        let mut c = checksum(100, 0, &[dev(0, (n * piece) as u32)]);
        c[2] = FLAG_FENCE as u8;
        h.post_quietly(&c, n + 1, 64);
        h.kick(0);
        for _ in 0..=n {
            h.queues[0]
                .wait_used(&h.guest, Duration::from_secs(20))
                .expect("answer");
        }
        let r = h.read_reply(n + 1, 32);
        ok(&r);
        assert_eq!(r.resp.result0, crc32c(0, &data) as u64, "round {round}");
    }
    assert_eq!(h.device().stat(STAT_ERRORS), 0);
}

#[test]
fn queues_never_set_up_are_never_written() {
    // A driver that uses one command queue of four, with the daemon busy-polling: the
    // rings it never set up have no addresses of the driver's, so nothing may be written
    // where their defaults point (a used ring at 0: its avail event at 4 + 8 * 32768).
    let mut h = Harness::with(Options {
        cmd_queues: 4,
        poll_us: 200,
        ..Default::default()
    });
    let marker = [0xa5u8; 32];
    let at = GuestAddress(0x40000);
    h.guest.write_slice(&marker, at).unwrap();
    for i in 0..50 {
        ok(&h.call(&hdr(OP_NOP, 0, i)));
    }
    // Let a poll window run out.
    std::thread::sleep(Duration::from_millis(5));
    let mut now = [0u8; 32];
    h.guest.read_slice(&mut now, at).unwrap();
    assert_eq!(now, marker);
}

#[test]
fn signal_events_reach_the_event_queue_even_when_posted_late() {
    let mut h = Harness::new();
    let area = 0xC0000;
    ok(&h.call(&with(hdr(OP_SIGNAL, 0, 5), &Signal { value: 0xabcd })));
    // No event buffers yet: the event waits in the device.
    assert!(h.device().has_events());
    h.post_event_buffers(area, 4, 32);
    // First the device announced where the guest mapped its memory, then the signal.
    for _ in 0..2 {
        let (_, len) = h.queues[1]
            .wait_used(&h.guest, Duration::from_secs(5))
            .expect("event delivered");
        assert_eq!(len, 32);
    }
    let ev: Event = h.guest.read_obj(GuestAddress(area)).unwrap();
    assert_eq!(
        (ev.kind, ev.value0, ev.value1),
        (EVENT_DEVMEM_MAPPED, DEVMEM_GPA, DEVMEM_SIZE)
    );
    let ev: Event = h.guest.read_obj(GuestAddress(area + 64)).unwrap();
    assert_eq!((ev.kind, ev.value0, ev.value1), (EVENT_SIGNAL, 0xabcd, 5));
    ok(&h.call(&with(hdr(OP_SIGNAL, 0, 6), &Signal { value: 2 })));
    h.queues[1]
        .wait_used(&h.guest, Duration::from_secs(5))
        .expect("third event delivered");
    let ev: Event = h.guest.read_obj(GuestAddress(area + 128)).unwrap();
    assert_eq!((ev.kind, ev.value0), (EVENT_SIGNAL, 2));
    assert!(ev.seq > 0);
    assert_eq!(h.device().stat(STAT_EVENTS_SENT), 3);
}

#[test]
fn allocate_free_exhaust_and_export_buffers() {
    let mut h = Harness::new();
    let alloc = |size, align| with(hdr(OP_ALLOC, 0, 1), &Alloc { size, align });
    let r = h.call(&alloc(1 << 20, 2 << 20));
    ok(&r);
    let (id, off) = (r.resp.result0, r.resp.result1);
    assert_eq!(off % (2 << 20), 0);
    assert_eq!(h.call(&alloc(DEVMEM_SIZE, 0)).status(), Status::NoSpace);
    assert_eq!(h.call(&alloc(0, 0)).status(), Status::Invalid);
    assert_eq!(h.call(&alloc(4096, 3)).status(), Status::Invalid);
    let uuid = [7u8; 16];
    ok(&h.call(&with(hdr(OP_EXPORT, 0, 1), &Export { id, uuid })));
    assert_eq!(
        h.call(&with(
            hdr(OP_EXPORT, 0, 1),
            &Export {
                id: 999,
                uuid: [1; 16]
            }
        ))
        .status(),
        Status::NotFound
    );
    let r = h.call(&with(hdr(OP_UNEXPORT, 0, 1), &Unexport { uuid }));
    assert_eq!(r.resp.result0, id);
    ok(&h.call(&with(hdr(OP_FREE, 0, 1), &Free { id })));
    assert_eq!(
        h.call(&with(hdr(OP_FREE, 0, 1), &Free { id })).status(),
        Status::NotFound
    );
    let r = h.call(&hdr(OP_IDENTIFY, 0, 1));
    let ident = Identify::from_slice(&r.payload).copied().unwrap();
    assert_eq!((ident.devmem_free, ident.buffers), (DEVMEM_SIZE, 0));
}

#[test]
fn reset_releases_everything_a_previous_driver_left() {
    let mut h = Harness::new();
    for _ in 0..3 {
        ok(&h.call(&with(
            hdr(OP_ALLOC, 0, 1),
            &Alloc {
                size: 1 << 20,
                align: 0,
            },
        )));
    }
    ok(&h.call(&with(hdr(OP_SIGNAL, 0, 1), &Signal { value: 1 })));
    let r = h.call(&hdr(OP_RESET, 0, 1));
    ok(&r);
    assert_eq!(r.resp.result0, 3);
    assert!(!h.device().has_events());
    let ident = Identify::from_slice(&h.call(&hdr(OP_IDENTIFY, 0, 1)).payload)
        .copied()
        .unwrap();
    assert_eq!((ident.devmem_free, ident.buffers), (DEVMEM_SIZE, 0));
    assert_eq!(ident.devmem_gpa, DEVMEM_GPA);
}

#[test]
fn numa_mode_refuses_buffers_and_device_offsets() {
    let mut h = Harness::with(Options {
        attach: cxl_accel::device::Attach::Numa,
        ..Default::default()
    });
    let c = h.config();
    assert_ne!(c.features & F_NUMA, 0);
    assert_eq!(c.features & F_ALLOC, 0);
    // The node's memory is found by file identity, as a BAR would be.
    ok(&h.call(&hdr(OP_NOP, 0, 0)));
    assert_eq!(h.device().layout().devmem_gpa, Some(DEVMEM_GPA));
    let alloc = with(
        hdr(OP_ALLOC, 0, 1),
        &Alloc {
            size: 4096,
            align: 0,
        },
    );
    assert_eq!(h.call(&alloc).status(), Status::Unsupported);
    assert_eq!(
        h.call(&fill(1, 0, &[dev(0, 64)])).status(),
        Status::Unsupported
    );
    // Guest-physical addresses, including the node's, work.
    ok(&h.call(&fill(1, 0x4242_4242_4242_4242, &[gpa(DEVMEM_GPA, 64)])));
    assert_eq!(h.devmem_read(0, 64), vec![0x42u8; 64]);
}

#[test]
fn exported_buffers_become_vhost_user_shared_objects() {
    let mut h = Harness::new();
    let alloc = |h: &mut Harness| {
        let r = h.call(&with(
            hdr(OP_ALLOC, 0, 1),
            &Alloc {
                size: 8192,
                align: 0,
            },
        ));
        ok(&r);
        r.resp.result0
    };
    let (a, b) = (alloc(&mut h), alloc(&mut h));
    let (ua, ub) = ([0xaa; 16], [0xbb; 16]);
    ok(&h.call(&with(hdr(OP_EXPORT, 0, 1), &Export { id: a, uuid: ua })));
    ok(&h.call(&with(hdr(OP_EXPORT, 0, 1), &Export { id: b, uuid: ub })));
    // Unexport removes a's object; freeing an exported buffer removes b's.
    ok(&h.call(&with(hdr(OP_UNEXPORT, 0, 1), &Unexport { uuid: ua })));
    ok(&h.call(&with(hdr(OP_FREE, 0, 1), &Free { id: b })));
    // Announcements travel on their own thread.
    for _ in 0..500 {
        if h.shared.log.lock().unwrap().len() == 4 {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        *h.shared.log.lock().unwrap(),
        vec![(true, ua), (true, ub), (false, ua), (false, ub)]
    );
    // GET_SHARED_OBJECT cannot hand out a slice of a named file: a clean error, for an
    // unknown UUID too, and the daemon carries on.
    ok(&h.call(&with(hdr(OP_EXPORT, 0, 1), &Export { id: a, uuid: ua })));
    let mut msg = vhost::vhost_user::message::VhostUserSharedMsg::default();
    msg.as_mut_slice().copy_from_slice(&ua);
    let fe = h.frontend.as_mut().unwrap();
    use vhost::vhost_user::VhostUserFrontend;
    assert!(fe.get_shared_object(&msg).is_err());
    ok(&h.call(&hdr(OP_NOP, 0, 1)));
}

#[test]
fn a_front_end_that_never_answers_does_not_stall_commands() {
    let mut h = Harness::with(Options {
        silent_frontend: true,
        ..Default::default()
    });
    for i in 0..3u8 {
        let r = h.call(&with(
            hdr(OP_ALLOC, 0, 1),
            &Alloc {
                size: 4096,
                align: 0,
            },
        ));
        let id = r.resp.result0;
        ok(&h.call(&with(hdr(OP_EXPORT, 0, 1), &Export { id, uuid: [i; 16] })));
        ok(&h.call(&with(hdr(OP_FREE, 0, 1), &Free { id })));
    }
}

#[test]
fn a_command_without_room_for_its_response_is_not_executed() {
    let mut h = Harness::new();
    h.post_event_buffers(0xC0000, 4, 32);
    h.queues[1]
        .wait_used(&h.guest, Duration::from_secs(5))
        .unwrap(); // DEVMEM_MAPPED
    let alloc = with(
        hdr(OP_ALLOC, 0, 1),
        &Alloc {
            size: 4096,
            align: 0,
        },
    );
    // 16 writable bytes cannot hold a response: no buffer may be allocated (and leaked).
    let r = h.call_with_room(&alloc, 16);
    assert_eq!(r.used_len, 0);
    // A response buffer outside guest memory: same, and the driver hears of both.
    h.guest.write_slice(&alloc, GuestAddress(DATA)).unwrap();
    h.queues[0].push(
        &h.guest,
        &[
            (DATA, alloc.len() as u32, false),
            (GUEST_SIZE + 4096, 64, true),
        ],
    );
    h.kick(0);
    let (_, len) = h.queues[0]
        .wait_used(&h.guest, Duration::from_secs(5))
        .unwrap();
    assert_eq!(len, 0);
    let ident = Identify::from_slice(&h.call(&hdr(OP_IDENTIFY, 0, 1)).payload)
        .copied()
        .unwrap();
    assert_eq!(ident.buffers, 0);
    for i in 1..3 {
        h.queues[1]
            .wait_used(&h.guest, Duration::from_secs(5))
            .unwrap();
        let ev: Event = h.guest.read_obj(GuestAddress(0xC0000 + 64 * i)).unwrap();
        assert_eq!((ev.kind, ev.value0), (EVENT_ERROR, OP_ALLOC as u64));
    }
}

#[test]
fn requests_in_flight_are_bounded_by_the_queue_size() {
    let mut h = Harness::with(Options {
        dma_threads: 1,
        ..Default::default()
    });
    // One slow command occupies the only engine...
    let slow = atomic(
        1,
        atomic_cmd(ATOMIC_FETCH_ADD, 8, SPACE_DEVMEM, 0, 1, 0, 20_000_000),
    );
    h.post(&slow, 1, 64);
    std::thread::sleep(Duration::from_millis(20));
    // ...while the guest keeps publishing NOPs as fast as the device takes them, which
    // without a limit would pile up requests inside the daemon. Fenced, so that they wait
    // for the engine (an unfenced NOP is answered on the spot).
    h.guest
        .write_slice(&hdr(OP_NOP, FLAG_FENCE, 2), GuestAddress(DATA))
        .unwrap();
    let head = h.queues[0].push(&h.guest, &[(DATA, 16, false), (DATA + 4096, 32, true)]);
    let rounds = 2;
    // The avail_event word after the used ring: where the device stood when it last asked
    // to be kicked (EVENT_IDX).
    let avail_event = GuestAddress(h.queues[0].used_addr() + 4 + 8 * QUEUE_SIZE as u64);
    for round in 0..rounds {
        for _ in 0..200 {
            h.queues[0].publish(&h.guest, head);
        }
        h.kick(0);
        if round == 0 {
            // A driver never has more than the ring's size outstanding: the second round
            // comes once the device has taken the first (else the ring index is invalid
            // and the device refuses the queue, as it must).
            let t = std::time::Instant::now();
            while h.guest.read_obj::<u16>(avail_event).unwrap() < 201 {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "first round not taken"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    // The daemon takes at most a queue's worth; the rest waits in the ring. Once the slow
    // command is done, the throttled requests must still all be served.
    assert_eq!(h.queues[0].used_idx(&h.guest), 0);
    for _ in 0..rounds * 200 + 2 {
        h.queues[0]
            .wait_used(&h.guest, Duration::from_secs(30))
            .expect("every published request completes");
    }
    assert_eq!(h.device().stat(STAT_COMMANDS), rounds as u64 * 200 + 2);
}

#[test]
fn the_fence_opcode_waits_for_earlier_commands() {
    let mut h = Harness::with(Options {
        dma_threads: 2,
        ..Default::default()
    });
    let slow = atomic(
        1,
        atomic_cmd(ATOMIC_FETCH_ADD, 8, SPACE_DEVMEM, 0, 1, 0, 5_000_000),
    );
    h.post(&slow, 1, 64);
    h.post(&hdr(OP_FENCE, 0, 2), 2, 64);
    let (first, _) = h.queues[0]
        .wait_used(&h.guest, Duration::from_secs(30))
        .unwrap();
    // The slow command's chain (descriptors 0-1) completes before the FENCE (2-3).
    assert_eq!(first, 0);
    h.queues[0]
        .wait_used(&h.guest, Duration::from_secs(30))
        .unwrap();
}

#[test]
fn bar_addresses_and_device_offsets_are_the_same_bytes_for_overlap() {
    let mut h = Harness::new();
    let data = pattern(3 * 4096, 4);
    h.devmem_write(0, &data);
    // Source through the BAR, destination by offset, overlapping: memmove semantics.
    ok(&h.call(&copy(1, &[gpa(DEVMEM_GPA, 8192)], &[dev(4096, 8192)])));
    let mut expect = data.clone();
    expect.copy_within(0..8192, 4096);
    assert_eq!(h.devmem_read(0, 3 * 4096), expect);
}

#[test]
fn stats_count_commands_and_errors() {
    let mut h = Harness::new();
    ok(&h.call(&hdr(OP_NOP, 0, 1)));
    let _ = h.call(&hdr(0x99, 0, 1));
    let r = h.call(&hdr(OP_STATS, 0, 1));
    ok(&r);
    let s = Stats::from_slice(&r.payload).copied().unwrap();
    assert_eq!(s.counter[STAT_COMMANDS], 3);
    assert_eq!(s.counter[STAT_ERRORS], 1);
}

// ---- hostile input: one test per class ----

#[test]
fn unknown_opcode_is_unsupported_and_keeps_the_tag() {
    let mut h = Harness::new();
    let r = h.call(&hdr(0x4242, 0, 0xfeed));
    assert_eq!(r.status(), Status::Unsupported);
    assert_eq!(r.resp.tag, 0xfeed);
}

#[test]
fn truncated_commands() {
    let mut h = Harness::new();
    assert_eq!(h.call(&[1, 0, 0]).status(), Status::Truncated);
    let full = copy(1, &[dev(0, 8)], &[dev(8, 8)]);
    assert_eq!(h.call(&full[..full.len() - 1]).status(), Status::Truncated);
    // A count that promises more segments than the request holds.
    let mut lying = with(
        hdr(OP_FILL, 0, 1),
        &Fill {
            pattern: 0,
            nr_dst: 100,
            reserved: 0,
        },
    );
    lying.extend_from_slice(dev(0, 8).as_slice());
    assert_eq!(h.call(&lying).status(), Status::Truncated);
}

#[test]
fn guest_addresses_outside_memory_are_rejected_before_any_write() {
    let mut h = Harness::new();
    h.guest
        .write_slice(&[0x55u8; 4096], GuestAddress(DATA))
        .unwrap();
    h.devmem_write(0, &[0u8; 4096]);
    // Segment 1 of the destination is outside guest memory: segment 0 must stay untouched.
    let r = h.call(&copy(
        1,
        &[gpa(DATA, 4096)],
        &[dev(0, 2048), gpa(GUEST_SIZE + 0x1000, 2048)],
    ));
    assert_eq!(r.status(), Status::BadGpa);
    assert_eq!(r.resp.detail, 2);
    assert_eq!(h.devmem_read(0, 2048), vec![0u8; 2048]);
    // A range that starts inside guest memory and runs past its end.
    let r = h.call(&fill(1, 0, &[gpa(GUEST_SIZE - 16, 32)]));
    assert_eq!(r.status(), Status::BadGpa);
    assert_eq!(read_guest(&h, GUEST_SIZE - 16, 16), vec![0u8; 16]);
    let r = h.call(&atomic(
        1,
        atomic_cmd(ATOMIC_FETCH_ADD, 8, SPACE_GPA, 1 << 50, 1, 0, 1),
    ));
    assert_eq!(r.status(), Status::BadGpa);
}

#[test]
fn device_offsets_outside_device_memory_and_overflows() {
    let mut h = Harness::new();
    let r = h.call(&fill(1, 0, &[dev(DEVMEM_SIZE - 8, 16)]));
    assert_eq!(r.status(), Status::BadDevmem);
    let r = h.call(&checksum(1, 0, &[dev(DEVMEM_SIZE, 1)]));
    assert_eq!(r.status(), Status::BadDevmem);
    let r = h.call(&fill(1, 0, &[dev(u64::MAX - 4, 16)]));
    assert_eq!(r.status(), Status::Overflow);
    let r = h.call(&fill(1, 0, &[gpa(u64::MAX - 4, 16)]));
    assert_eq!(r.status(), Status::Overflow);
    let r = h.call(&atomic(
        1,
        atomic_cmd(ATOMIC_SWAP, 8, SPACE_DEVMEM, DEVMEM_SIZE, 1, 0, 1),
    ));
    assert_eq!(r.status(), Status::BadDevmem);
}

#[test]
fn mismatched_lengths_and_too_many_segments() {
    let mut h = Harness::new();
    let r = h.call(&copy(1, &[dev(0, 8)], &[dev(64, 16)]));
    assert_eq!(r.status(), Status::LengthMismatch);
    let many: Vec<Sge> = (0..MAX_SEGMENTS as u64 + 1)
        .map(|i| dev(i * 8, 8))
        .collect();
    let r = h.call(&fill(1, 0, &many));
    assert_eq!(r.status(), Status::TooLarge);
}

#[test]
fn oversized_request_is_too_large() {
    let mut h = Harness::new();
    let mut big = hdr(OP_NOP, 0, 3);
    big.resize(MAX_REQUEST as usize + 1, 0);
    // Spread over two readable descriptors so the request area limit is not an issue.
    h.guest.write_slice(&big, GuestAddress(DATA)).unwrap();
    h.queues[0].push(
        &h.guest,
        &[
            (DATA, 1 << 17, false),
            (DATA + (1 << 17), big.len() as u32 - (1 << 17), false),
            (DATA + (1 << 20), 64, true),
        ],
    );
    h.kick(0);
    let (_, len) = h.queues[0]
        .wait_used(&h.guest, Duration::from_secs(5))
        .unwrap();
    let r = h.read_reply(0, len);
    let resp: Resp = h.guest.read_obj(GuestAddress(DATA + (1 << 20))).unwrap();
    assert_eq!(resp.status, Status::TooLarge as u32);
    assert_eq!(resp.tag, 3);
    drop(r);
}

#[test]
fn wrong_descriptor_directions() {
    let mut h = Harness::new();
    let req = hdr(OP_NOP, 0, 9);
    h.guest.write_slice(&req, GuestAddress(DATA)).unwrap();
    // Writable before readable.
    h.queues[0].push(&h.guest, &[(DATA + 4096, 64, true), (DATA, 16, false)]);
    h.kick(0);
    let (_, len) = h.queues[0]
        .wait_used(&h.guest, Duration::from_secs(5))
        .unwrap();
    assert_eq!(len, 32);
    let resp: Resp = h.guest.read_obj(GuestAddress(DATA + 4096)).unwrap();
    assert_eq!(resp.status, Status::BadChain as u32);
    // No writable descriptor at all: nothing can be written, the chain still comes back,
    // and the driver hears about it on the event queue.
    h.post_event_buffers(0xC0000, 2, 32);
    h.queues[1]
        .wait_used(&h.guest, Duration::from_secs(5))
        .unwrap(); // DEVMEM_MAPPED
    h.queues[0].push(&h.guest, &[(DATA, 16, false)]);
    h.kick(0);
    let (_, len) = h.queues[0]
        .wait_used(&h.guest, Duration::from_secs(5))
        .unwrap();
    assert_eq!(len, 0);
    h.queues[1]
        .wait_used(&h.guest, Duration::from_secs(5))
        .unwrap();
    let ev: Event = h.guest.read_obj(GuestAddress(0xC0000 + 64)).unwrap();
    assert_eq!((ev.kind, ev.value0), (EVENT_ERROR, OP_NOP as u64));
    // Too little room for the IDENTIFY payload.
    let r = h.call_with_room(&hdr(OP_IDENTIFY, 0, 1), 40);
    assert_eq!(r.status(), Status::BadChain);
    assert_eq!(r.used_len, 32);
    ok(&h.call(&hdr(OP_NOP, 0, 1)));
}

#[test]
fn descriptors_pointing_outside_guest_memory() {
    let mut h = Harness::new();
    // Readable descriptor outside memory.
    h.queues[0].push(
        &h.guest,
        &[(GUEST_SIZE + 4096, 16, false), (DATA, 64, true)],
    );
    h.kick(0);
    let (_, len) = h.queues[0]
        .wait_used(&h.guest, Duration::from_secs(5))
        .unwrap();
    assert_eq!(len, 32);
    let resp: Resp = h.guest.read_obj(GuestAddress(DATA)).unwrap();
    assert_eq!(resp.status, Status::BadChain as u32);
    // Response buffer outside memory: the chain is returned with nothing written.
    h.guest
        .write_slice(&hdr(OP_NOP, 0, 1), GuestAddress(DATA))
        .unwrap();
    h.queues[0].push(&h.guest, &[(DATA, 16, false), (1 << 45, 64, true)]);
    h.kick(0);
    let (_, len) = h.queues[0]
        .wait_used(&h.guest, Duration::from_secs(5))
        .unwrap();
    assert_eq!(len, 0);
    ok(&h.call(&hdr(OP_NOP, 0, 1)));
}

#[test]
fn descriptor_loops_do_not_hang_the_queue() {
    let mut h = Harness::new();
    h.guest
        .write_slice(&hdr(OP_NOP, 0, 1), GuestAddress(DATA))
        .unwrap();
    // A descriptor whose NEXT points to itself.
    let head = h.queues[0].push_raw(&h.guest, &[(DATA, 16, 1, Some(0))]);
    assert_eq!(head, 0);
    h.kick(0);
    let done = h.queues[0].wait_used(&h.guest, Duration::from_secs(5));
    assert!(done.is_some(), "looping chain was returned");
    ok(&h.call(&hdr(OP_NOP, 0, 2)));
}

#[test]
fn a_corrupt_avail_index_does_not_kill_the_daemon() {
    let mut h = Harness::new();
    ok(&h.call(&hdr(OP_NOP, 0, 1)));
    // Claim far more available entries than the queue holds.
    h.queues[0].set_avail_idx(&h.guest, 1 + 3 * QUEUE_SIZE);
    h.kick(0);
    std::thread::sleep(Duration::from_millis(100));
    // The control path still answers.
    assert_eq!(h.config().magic, MAGIC);
    assert!(h.device().stat(STAT_ERRORS) >= 1);
}

/// Posts `n` copies of one request (written once at DATA), response `i` at
/// `DATA + 0x1000 + 64 * i`, and kicks.
fn post_many(h: &mut Harness, req: &[u8], n: u64) {
    h.guest.write_slice(req, GuestAddress(DATA)).unwrap();
    for i in 0..n {
        let resp = DATA + 0x1000 + i * 64;
        h.queues[0].push(
            &h.guest,
            &[(DATA, req.len() as u32, false), (resp, 64, true)],
        );
    }
    h.kick(0);
}

#[test]
fn a_guest_may_choose_a_larger_ring_than_the_queue_size() {
    // QEMU lets the guest pick any ring size up to 1024 whatever the device's vq_size, and
    // a ring up to 32768 is legal virtio: a larger ring than --queue-size must work, with
    // no more requests held at once than --queue-size.
    let ring = 1024;
    let mut h = Harness::with(Options {
        ring_size: ring,
        ..Default::default()
    });
    let nop = hdr(OP_NOP, 0, 1);
    assert_eq!(h.call(&nop).status(), Status::Ok);
    // More requests than --queue-size at once (two descriptors each), from one request buffer, each with its own
    // response slot; heads run across the whole ring.
    let n = 2 * QUEUE_SIZE as u64 - 12;
    post_many(&mut h, &nop, n);
    for _ in 0..n {
        let (_, len) = h.queues[0]
            .wait_used(&h.guest, Duration::from_secs(20))
            .expect("a request on the large ring never came back");
        assert_eq!(len, 32);
    }
    assert_eq!(h.call(&nop).status(), Status::Ok);
}

#[test]
fn a_queue_stop_cuts_long_commands_short() {
    // QEMU waits for GET_VRING_BASE under its global lock: 256 queued 1 GiB copies must
    // not hold it for their whole run, and each must come back (done or INTERRUPTED).
    let mut h = Harness::with(Options {
        ring_size: 1024,
        ..Default::default()
    });
    let half = DEVMEM_SIZE / 2;
    let src: Vec<_> = (0..16).map(|_| sge(SPACE_DEVMEM, 0, half as u32)).collect();
    let dst: Vec<_> = (0..16)
        .map(|_| sge(SPACE_DEVMEM, half, half as u32))
        .collect();
    let req = copy(7, &src, &dst);
    let n = 256u64;
    post_many(&mut h, &req, n);
    std::thread::sleep(Duration::from_millis(300));
    let t = std::time::Instant::now();
    let fe = h.frontend.as_mut().unwrap();
    let base = vhost::VhostBackend::get_vring_base(fe, 0).expect("GET_VRING_BASE answered");
    let stop = t.elapsed();
    eprintln!("queue stop with {n} queued 1 GiB copies took {stop:?}");
    assert!(stop < Duration::from_secs(1), "the stop took {stop:?}");
    assert_eq!(base, n as u32);
    // Every request was returned before the stop was answered.
    assert_eq!(h.queues[0].used_idx(&h.guest), n as u16);
    let (mut done, mut cut) = (0, 0);
    for _ in 0..n {
        let (id, _) = h.queues[0]
            .wait_used(&h.guest, Duration::ZERO)
            .expect("returned");
        let resp: Resp = h
            .guest
            .read_obj(GuestAddress(DATA + 0x1000 + (id as u64 / 2) * 64))
            .unwrap();
        match Status::from_u32(resp.status) {
            Some(Status::Ok) => done += 1,
            Some(Status::Interrupted) => cut += 1,
            s => panic!("{s:?}"),
        }
    }
    eprintln!("{done} copies done, {cut} interrupted");
    assert!(cut > 0);
    // The device goes on normally once the rings start again.
    h.restart_rings();
    assert_eq!(h.call(&hdr(OP_NOP, 0, 1)).status(), Status::Ok);
    let s = [sge(SPACE_DEVMEM, 0, 4096)];
    assert_eq!(
        h.call(&copy(8, &s, &[sge(SPACE_DEVMEM, half, 4096)]))
            .status(),
        Status::Ok
    );
}

#[test]
fn memory_that_shrinks_under_the_device_does_not_kill_it() {
    // A front-end truncates the memfd behind guest RAM after giving it, and the device
    // memory file (QEMU holds it read-write): touching those pages raises SIGBUS.
    let mut h = Harness::new();
    assert_eq!(h.call(&hdr(OP_NOP, 0, 1)).status(), Status::Ok);
    h.ram_file().set_len(GUEST_SIZE / 2).unwrap();
    let far = GUEST_SIZE * 3 / 4;
    let gone = [sge(SPACE_GPA, far, 4096)];
    let r = h.call(&copy(2, &gone, &[sge(SPACE_DEVMEM, 0, 4096)]));
    assert_eq!(r.status(), Status::BadGpa);
    // Another page: the first one is now an anonymous page of the daemon's own.
    let gone2 = [sge(SPACE_GPA, far + 0x10000, 4096)];
    assert_eq!(h.call(&fill(3, 0x55, &gone2)).status(), Status::BadGpa);
    std::fs::OpenOptions::new()
        .write(true)
        .open(h.dir.join("devmem"))
        .unwrap()
        .set_len(DEVMEM_SIZE / 2)
        .unwrap();
    let r = h.call(&fill(
        4,
        0x55,
        &[sge(SPACE_DEVMEM, DEVMEM_SIZE * 3 / 4, 4096)],
    ));
    assert_eq!(r.status(), Status::BadGpa);
    // Memory that is still there works as before.
    let here = [sge(SPACE_GPA, DATA, 4096)];
    assert_eq!(
        h.call(&fill(5, 0x7777_7777_7777_7777, &here)).status(),
        Status::Ok
    );
    let r = h.call(&checksum(6, 0, &here));
    assert_eq!(r.resp.result0, crc32c(0, &[0x77; 4096]) as u64);
}

#[test]
fn a_refused_memory_table_is_not_used_by_commands_still_running() {
    let mut h = Harness::new();
    assert_eq!(h.call(&hdr(OP_NOP, 0, 1)).status(), Status::Ok);
    let long = atomic_cmd(ATOMIC_FETCH_ADD, 8, SPACE_DEVMEM, 0, 1, 0, 1 << 26);
    h.post(&atomic(2, long), 1, 64);
    let t = std::time::Instant::now();
    while h.device().stat(STAT_COMMANDS) < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the atomic never started"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let used = h.queues[0].used_idx(&h.guest);
    // A table whose RAM region runs past the end of its file (the rings lie there).
    let small = memfd("small", 4096);
    let region = vhost::VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: GUEST_SIZE,
        userspace_addr: h.guest.get_host_address(GuestAddress(0)).unwrap() as u64,
        mmap_offset: 0,
        mmap_handle: std::os::fd::AsRawFd::as_raw_fd(&small),
    };
    let fe = h.frontend.as_mut().unwrap();
    fe.set_hdr_flags(vhost::vhost_user::message::VhostUserHeaderFlag::NEED_REPLY);
    assert!(vhost::VhostBackend::set_mem_table(fe, &[region]).is_err());
    // The refusal ends the session; the atomic ends (cut short, or done) without touching
    // the ring through the refused table, and the daemon's session loop finishes.
    let t = std::time::Instant::now();
    while !h.daemon_finished() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the session never ended"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(h.queues[0].used_idx(&h.guest), used);
}
