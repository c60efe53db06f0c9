//! Prints NOP round trips per second through the in-process vhost-user front-end, and COPY
//! bandwidth (guest memory -> device memory) next to plain memcpy of the same sizes between
//! the same mappings, measured in the same run. Run with `cargo bench`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use cxl_accel::command::encode::*;
use cxl_accel::protocol::*;
use vm_memory::{GuestAddress, GuestMemoryBackend};

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn main() {
    // `cargo test --benches` passes flags; a quick smoke run then is enough.
    let quick = std::env::args().any(|a| a == "--test" || a == "--quick");
    let mut h = Harness::new();

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
        "{:>8} {:>12} {:>12} {:>8}",
        "size", "COPY GB/s", "memcpy GB/s", "ratio"
    );
    let src_ptr = h.guest.get_host_address(GuestAddress(DATA)).unwrap();
    let dst_ptr = h.devmem.as_ptr();
    for (size, iters) in [(4096u64, 20_000u32), (2 << 20, 300), (64 << 20, 12)] {
        let iters = if quick { iters.min(3) } else { iters };
        let src = [sge(SPACE_GPA, DATA, size as u32)];
        let dst = [sge(SPACE_DEVMEM, 0, size as u32)];
        let req = copy(1, &src, &dst);
        // Warm up: fault in both mappings.
        for _ in 0..2 {
            h.call(&req);
        }
        // Interleave the two so both see the same machine load.
        let (mut copy_d, mut memcpy_d) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..iters {
            let t = Instant::now();
            let r = h.call(&req);
            copy_d += t.elapsed();
            assert_eq!(r.resp.status, 0);
            let t = Instant::now();
            // SAFETY: both mappings are at least `size` bytes long from these addresses
            // (guest memory holds DATA + 64 MiB, device memory 128 MiB) and do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src_ptr, dst_ptr, size as usize) };
            std::hint::black_box(dst_ptr);
            memcpy_d += t.elapsed();
        }
        let (c, m) = (
            gbps(size * iters as u64, copy_d),
            gbps(size * iters as u64, memcpy_d),
        );
        let label = match size {
            s if s >= 1 << 20 => format!("{}M", s >> 20),
            s => format!("{}K", s >> 10),
        };
        println!("{label:>8} {c:>12.2} {m:>12.2} {:>7.0}%", 100.0 * c / m);
    }
}
