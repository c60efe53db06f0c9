// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Randomised hostile requests straight into the device model: structure-aware garbage
//! (valid-looking headers, counts, addresses at and around every boundary) must always
//! get a status, never a panic, and must never change memory outside the ranges a
//! successful command named. Deterministic (fixed seeds), so a failure reproduces.

mod common;

use common::Rng;
use cxl_accel::device::devmem::DeviceMemory;
use cxl_accel::device::{Device, DeviceConfig};
use cxl_accel::protocol::*;
use vm_memory::{
    ByteValued, Bytes, FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion,
};

const RAM: u64 = 256 << 10;
const DEVMEM: u64 = 2 << 20;
/// A second RAM region after a hole, so ranges can straddle regions and holes.
const HIGH: u64 = 0x1_0000_0000;

/// Addresses and lengths near the interesting edges.
fn edgy(r: &mut Rng) -> u64 {
    let edges = [
        0,
        8,
        4096,
        RAM,
        DEVMEM,
        HIGH,
        HIGH + RAM,
        1 << 32,
        u64::MAX,
        u32::MAX as u64,
    ];
    let base = edges[r.below(edges.len() as u64) as usize];
    match r.below(4) {
        0 => base,
        1 => base.wrapping_sub(r.below(64)),
        2 => base.wrapping_add(r.below(64)),
        _ => r.next() >> r.below(64),
    }
}

fn guest() -> GuestMemoryMmap {
    let regions = [(0, RAM), (HIGH, RAM)]
        .into_iter()
        .map(|(gpa, size)| {
            let r = MmapRegion::from_file(
                FileOffset::new(common::memfd("cxl-accel-random", size), 0),
                size as usize,
            )
            .unwrap();
            GuestRegionMmap::new(r, GuestAddress(gpa)).unwrap()
        })
        .collect();
    GuestMemoryMmap::from_regions(regions).unwrap()
}

fn random_request(r: &mut Rng) -> Vec<u8> {
    let ops = [
        OP_NOP,
        OP_IDENTIFY,
        OP_SET_DEVMEM_BASE,
        OP_STATS,
        OP_RESET,
        OP_COPY,
        OP_FILL,
        OP_CHECKSUM,
        OP_ATOMIC,
        OP_COPY_PAGES,
        OP_FENCE,
        OP_SIGNAL,
        OP_ALLOC,
        OP_FREE,
        OP_EXPORT,
        OP_UNEXPORT,
        0x99,
        0xffff,
    ];
    let opcode = ops[r.below(ops.len() as u64) as usize];
    let mut v = CmdHdr {
        opcode,
        flags: r.next() as u16,
        reserved: 0,
        tag: r.next(),
    }
    .as_slice()
    .to_vec();
    let sge = |r: &mut Rng| Sge {
        addr: edgy(r),
        len: (edgy(r) as u32) & if r.below(2) == 0 { 0xffff } else { u32::MAX },
        space: if r.below(10) == 0 {
            r.next() as u16
        } else {
            r.below(2) as u16
        },
        reserved: 0,
    };
    match opcode {
        OP_COPY | OP_FILL | OP_CHECKSUM => {
            let (a, b) = (r.below(5) as u32, r.below(5) as u32);
            let declared = if r.below(8) == 0 { r.next() as u32 } else { a };
            v.extend_from_slice(&declared.to_le_bytes());
            v.extend_from_slice(&b.to_le_bytes());
            for _ in 0..a + b {
                v.extend_from_slice(sge(r).as_slice());
            }
        }
        OP_ATOMIC => {
            let a = Atomic {
                op: r.below(4) as u16,
                width: [4, 8, 2, 0][r.below(4) as usize],
                space: r.below(3) as u16,
                reserved: 0,
                addr: edgy(r) & !3,
                operand: r.next(),
                compare: r.next(),
                repeat: r.below(3),
            };
            v.extend_from_slice(a.as_slice());
        }
        OP_COPY_PAGES => {
            let n = r.below(6) as u32;
            let p = CopyPages {
                nr_pages: n,
                page_size: [4096, 8192, 4097, 2 << 20, 0][r.below(5) as usize],
                src_space: r.below(3) as u16,
                dst_space: r.below(3) as u16,
                reserved: 0,
            };
            v.extend_from_slice(p.as_slice());
            for _ in 0..2 * n {
                v.extend_from_slice(&(edgy(r) & !4095).to_le_bytes());
            }
        }
        _ => {
            for _ in 0..r.below(40) {
                v.push(r.next() as u8);
            }
        }
    }
    // Sometimes cut the request short anywhere.
    if r.below(6) == 0 {
        let keep = r.below(v.len() as u64 + 1) as usize;
        v.truncate(keep);
    }
    v
}

#[test]
fn hundred_thousand_random_requests_get_a_status_and_no_panic() {
    let dir = std::env::temp_dir().join(format!("cxl-accel-random-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let devmem = DeviceMemory::open(&dir.join("devmem"), DEVMEM).unwrap();
    let device = Device::new(DeviceConfig::default(), devmem);
    let mem = guest();
    // Everything the device could touch, to prove failed commands change nothing.
    let snapshot = |device: &Device| -> Vec<u8> {
        let mut v = vec![0u8; (2 * RAM + DEVMEM) as usize];
        mem.read_slice(&mut v[..RAM as usize], GuestAddress(0))
            .unwrap();
        mem.read_slice(&mut v[RAM as usize..2 * RAM as usize], GuestAddress(HIGH))
            .unwrap();
        device
            .devmem()
            .slice(0, DEVMEM)
            .unwrap()
            .copy_to(&mut v[2 * RAM as usize..]);
        v
    };
    let mut counts = [0u64; 16];
    for seed in 1..=100_000u64 {
        let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let req = random_request(&mut r);
        let check = seed % 64 == 0;
        let before = check.then(|| snapshot(&device));
        let reply = device.execute(&mem, &req);
        let status = Status::from_u32(reply.resp.status)
            .unwrap_or_else(|| panic!("seed {seed}: unknown status {}", reply.resp.status));
        counts[status as usize] += 1;
        if status != Status::Ok {
            assert!(reply.payload.is_empty(), "seed {seed}: error with payload");
            if let Some(before) = before {
                assert!(
                    before == snapshot(&device),
                    "seed {seed}: failed command wrote memory"
                );
            }
        }
    }
    // The generator must reach both success and the main error classes, or it tests little.
    for s in [
        Status::Ok,
        Status::Unsupported,
        Status::Invalid,
        Status::Truncated,
        Status::BadGpa,
        Status::BadDevmem,
        Status::Overflow,
    ] {
        assert!(
            counts[s as usize] > 0,
            "no request ended in {s:?}: {counts:?}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
