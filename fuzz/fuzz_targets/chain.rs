// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Descriptor chains from a hostile driver, handled by the daemon's own ring layer
//! (src/ring/): a split virtqueue in a small guest memory, chains taken and journaled by
//! `ring::take`, executed and answered by `ring::answer`, returned by `ring::publish`, and
//! the queue looked at again as `ring::Rearm` says, as the daemon's `process_commands` does
//! (there on the DMA engines, here one chain at a time).
//!
//! Input: a 16-byte header, then an image copied into guest memory at GPA 0 and again at
//! `HIGH` (everything else is zero):
//!
//! | bytes  | meaning |
//! |--------|---------|
//! | 0..2   | queue size (u16; an invalid size leaves the maximum, as in vhost-user-backend) |
//! | 2..4   | descriptor table offset (u16) |
//! | 4..6   | available ring offset (u16) |
//! | 6..8   | used ring offset (u16) |
//! | 8..10  | next available index (u16) |
//! | 10..12 | next used index (u16) |
//! | 12     | flags: bit 0 EVENT_IDX; bits 1, 2, 3: descriptor table, available ring, used |
//! |        | ring at `HIGH` + offset; bit 4: maximum queue size 32768 instead of 256   |
//! | 13..16 | ignored |
//!
//! Descriptors (16 bytes: address, length, flags NEXT/WRITE/INDIRECT, next) may point
//! anywhere, loop, chain into indirect tables, or name heads outside the ring.
#![no_main]

#[path = "world.rs"]
mod world;

use std::sync::OnceLock;
use world::World;

use cxl_accel::protocol::{CmdHdr, Status, MAX_REQUEST, OP_RESET};
use cxl_accel::ring::{self, ChainRequest};
use libfuzzer_sys::fuzz_target;
use std::sync::atomic::AtomicBool;
use virtio_queue::{Queue, QueueT};
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// Guest RAM: two adjacent 64 KiB regions at 0 (rings and buffers may straddle them) and
/// one more at `HIGH`, above a hole.
const REGION: usize = 64 << 10;
const HIGH: u64 = 0x1_0000_0000;
const DEVMEM: u64 = 64 << 10;
/// The daemon's default and largest `--queue-size` (the ring's maximum size).
const DEFAULT_QUEUE_SIZE: u16 = 256;
const MAX_QUEUE_SIZE: u16 = 32768;
/// Chains taken per input (the daemon takes up to the queue size per kick); keeps each
/// run short.
const MAX_CHAINS: usize = 64;
const HEADER: usize = 16;

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), REGION),
            (GuestAddress(REGION as u64), REGION),
            (GuestAddress(HIGH), REGION),
        ]);
        World::new(DEVMEM, mem.unwrap())
    })
}

fn u16_at(h: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([h[i], h[i + 1]])
}

/// A fresh guest: zeroed RAM with the image at 0 and at `HIGH`, and a device without
/// buffers or pending events (RESET), so that each input runs the same way on its own.
fn reset(w: &World, image: &[u8]) {
    for base in [0, REGION as u64, HIGH] {
        let host = w.mem.get_host_address(GuestAddress(base)).unwrap();
        // SAFETY: each region is REGION bytes mapped at `host`, and nothing else uses
        // guest memory between runs.
        unsafe { std::ptr::write_bytes(host, 0, REGION) };
    }
    w.mem.write_slice(image, GuestAddress(0)).unwrap();
    w.mem.write_slice(image, GuestAddress(HIGH)).unwrap();
    let hdr = CmdHdr {
        opcode: OP_RESET,
        ..Default::default()
    };
    let reply = w.device.execute(&w.mem, hdr.as_slice());
    assert_eq!(reply.resp.status, Status::Ok as u32);
}

/// What the fuzzer checks of each answer, beyond "no panic".
fn check(req: &ChainRequest, answer: &ring::Answer) {
    assert!(req.bytes.len() <= MAX_REQUEST as usize);
    let Some(reply) = &answer.reply else {
        assert_eq!(answer.written, 0);
        return;
    };
    let status = Status::from_u32(reply.resp.status).expect("a known status");
    if req.error.is_some() {
        assert_ne!(status, Status::Ok, "a malformed chain was answered OK");
    }
    // Every writable range was checked and there is room: the whole reply arrives.
    assert_eq!(
        answer.written as usize,
        reply.bytes().len(),
        "reply cut short"
    );
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let mut header = [0u8; HEADER];
    let n = data.len().min(HEADER);
    header[..n].copy_from_slice(&data[..n]);
    let image = &data[n..data.len().min(HEADER + REGION)];
    reset(w, image);

    let flags = header[12];
    let ring_addr = |off: usize, bit: u8| {
        let base = if flags & bit != 0 { HIGH } else { 0 };
        GuestAddress(base + u16_at(&header, off) as u64)
    };
    // The set-up the front-end drives through vhost-user-backend's VringState.
    let max_size = if flags & 16 != 0 {
        MAX_QUEUE_SIZE
    } else {
        DEFAULT_QUEUE_SIZE
    };
    let mut queue = Queue::new(max_size).unwrap();
    queue.set_size(u16_at(&header, 0));
    if queue.try_set_desc_table_address(ring_addr(2, 2)).is_err()
        || queue.try_set_avail_ring_address(ring_addr(4, 4)).is_err()
        || queue.try_set_used_ring_address(ring_addr(6, 8)).is_err()
    {
        return;
    }
    queue.set_next_avail(u16_at(&header, 8));
    queue.set_next_used(u16_at(&header, 10));
    queue.set_event_idx(flags & 1 != 0);
    queue.set_ready(true);

    let (mem, journal) = (&w.mem, ring::Journal::of(w.device.state()));
    let never = AtomicBool::new(false);
    let (mut taken, mut rearm) = (0, ring::Rearm::default());
    'kicks: loop {
        let _ = queue.disable_notification(mem);
        let taken_before = taken;
        loop {
            if taken == MAX_CHAINS {
                break 'kicks;
            }
            // One chain at a time: a reply written over the ring (legal for a hostile
            // driver's buffers) is seen by the next chain, as with the daemon's engines.
            let cq = ring::CmdQueue::of(0, 1).expect("virtqueue 0 is a command queue");
            let Ok(mut got) = ring::take(&mut queue, mem, &w.device, journal, cq, 1) else {
                break 'kicks;
            };
            let Some(ring::Taken { req, origin }) = got.pop() else {
                break;
            };
            taken += 1;
            let answer = ring::answer(&w.device, mem, &req, origin, &never);
            check(&req, &answer);
            if ring::publish(&mut queue, mem, journal, 0, req.head, answer.written) {
                let event_idx = queue.event_idx_enabled();
                ring::needs_signal(&mut queue, mem, event_idx);
            }
        }
        match rearm.after_pass(&mut queue, mem, taken - taken_before) {
            Ok(true) => continue,
            _ => break,
        }
    }
    // Events the requests raised are dropped with the next input's RESET.
    while w.device.pop_event().is_some() {}
});
