// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Prints NOP round trips per second through the in-process vhost-user front-end, and COPY
//! bandwidth (guest memory -> device memory) next to plain memcpy of the same sizes,
//! measured in the same run, and CHECKSUM (CRC-32C) bandwidth through the device next to
//! the bare CRC-32C function. Run with `cargo bench`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use cxl_accel::command::encode::*;
use cxl_accel::protocol::*;

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn main() {
    // `cargo test --benches` passes flags; a quick smoke run then is enough.
    let quick = std::env::args().any(|a| a == "--test" || a == "--quick");
    let mut h = Harness::with(Options {
        dma_threads: 1,
        ..Default::default()
    });

    let n = if quick { 200 } else { 20_000 };
    for _ in 0..100 {
        h.call(&hdr(OP_NOP, 0, 0));
    }
    let t = Instant::now();
    for i in 0..n {
        let r = h.call(&hdr(OP_NOP, 0, i));
        assert_eq!(r.resp.status, 0);
    }
    let d = t.elapsed();
    println!(
        "NOP round trip: {:.0} requests/s ({:.1} us each, {n} requests)",
        n as f64 / d.as_secs_f64(),
        d.as_secs_f64() * 1e6 / n as f64
    );

    println!(
        "{:>6} {:>14} {:>14} {:>12} {:>11}",
        "size", "COPY qd1 GB/s", "COPY qd4 GB/s", "memcpy GB/s", "qd4/memcpy"
    );
    // The memcpy baseline copies between its own buffers of the same sizes, on one thread,
    // as the device does with its single DMA engine here.
    let mut src_buf = vec![1u8; 64 << 20];
    let mut dst_buf = vec![0u8; 64 << 20];
    let (src_ptr, dst_ptr) = (src_buf.as_mut_ptr(), dst_buf.as_mut_ptr());
    for (size, iters) in [(4096u64, 20_000u32), (2 << 20, 400), (64 << 20, 16)] {
        let iters = if quick { iters.min(4) } else { iters };
        let req = copy(
            1,
            &[sge(SPACE_GPA, DATA, size as u32)],
            &[sge(SPACE_DEVMEM, 0, size as u32)],
        );
        for _ in 0..2 {
            h.call(&req); // fault in both mappings
        }
        // Queue depth 1: each command waits for the previous completion (and its wake-up).
        let t = Instant::now();
        for _ in 0..iters {
            assert_eq!(h.call(&req).resp.status, 0);
        }
        let qd1 = t.elapsed();
        // Queue depth 4: the driver keeps the engine busy, as real DMA users do.
        let t = Instant::now();
        let mut in_flight = 0;
        for i in 0..iters {
            h.post(&req, 1 + (i % 4) as u64, 64);
            in_flight += 1;
            if in_flight == 4 {
                h.queues[0]
                    .wait_used(&h.guest, Duration::from_secs(20))
                    .expect("completion");
                in_flight -= 1;
            }
        }
        for _ in 0..in_flight {
            h.queues[0]
                .wait_used(&h.guest, Duration::from_secs(20))
                .expect("completion");
        }
        let qd4 = t.elapsed();
        let t = Instant::now();
        for _ in 0..iters {
            // SAFETY: both buffers are 64 MiB >= size and distinct allocations.
            unsafe { std::ptr::copy_nonoverlapping(src_ptr, dst_ptr, size as usize) };
            std::hint::black_box(dst_ptr);
        }
        let mc = t.elapsed();
        let total = size * iters as u64;
        let (a, b, m) = (gbps(total, qd1), gbps(total, qd4), gbps(total, mc));
        let label = match size {
            s if s >= 1 << 20 => format!("{}M", s >> 20),
            s => format!("{}K", s >> 10),
        };
        println!(
            "{label:>6} {a:>14.2} {b:>14.2} {m:>12.2} {:>10.0}%",
            100.0 * b / m
        );
    }
    checksum_bandwidth(&mut h, quick);
    assert_eq!(h.device().stat(STAT_ERRORS), 0);
}

/// CHECKSUM over device memory at queue depth 1, and the CRC-32C function alone over a
/// buffer of the same size.
fn checksum_bandwidth(h: &mut Harness, quick: bool) {
    println!(
        "{:>6} {:>18} {:>16}",
        "size", "CHECKSUM qd1 GB/s", "crc32c() GB/s"
    );
    let data = vec![0x5au8; 64 << 20];
    for (size, iters) in [(4096u64, 20_000u32), (2 << 20, 400), (64 << 20, 16)] {
        let iters = if quick { iters.min(4) } else { iters };
        let req = checksum(1, 0, &[sge(SPACE_DEVMEM, 0, size as u32)]);
        h.call(&req); // fault in device memory
        let t = Instant::now();
        for _ in 0..iters {
            assert_eq!(h.call(&req).resp.status, 0);
        }
        let dev = t.elapsed();
        let t = Instant::now();
        for _ in 0..iters {
            std::hint::black_box(crc32c_of(std::hint::black_box(&data[..size as usize])));
        }
        let bare = t.elapsed();
        let total = size * iters as u64;
        let label = match size {
            s if s >= 1 << 20 => format!("{}M", s >> 20),
            s => format!("{}K", s >> 10),
        };
        println!(
            "{label:>6} {:>18.2} {:>16.2}",
            gbps(total, dev),
            gbps(total, bare)
        );
    }
}

fn crc32c_of(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}
