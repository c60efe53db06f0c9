// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Prints NOP round trips per second through the in-process vhost-user front-end; COPY
//! bandwidth (guest memory -> device memory) with one and two DMA engines next to memcpy
//! of the same memory with one and two threads (warmed buffers, medians of several runs,
//! measured in the same run); and CHECKSUM (CRC-32C) bandwidth through the device next to
//! the bare CRC-32C function. Run with `cargo bench`; `CXL_ACCEL_BENCH_PIN=1` gives the
//! engines CPUs of their own while they copy (where there are more CPUs than engines).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use vm_memory::{GuestAddress, GuestMemoryBackend};

use common::*;
use cxl_accel::device::command::encode::*;
use cxl_accel::protocol::*;

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn label(size: u64) -> String {
    match size {
        s if s >= 1 << 20 => format!("{}M", s >> 20),
        s => format!("{}K", s >> 10),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    // `cargo test --benches` passes flags; a quick smoke run then is enough.
    let quick = std::env::args().any(|a| a == "--test" || a == "--quick");
    let runs = if quick { 1 } else { 5 };
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

    // COPY of one buffer (guest memory -> device memory) by E engines, next to memcpy of
    // the very same memory by E threads: each of the E takes its share of the buffer,
    // every figure the median of `runs` runs, on buffers written and copied before the
    // clock starts (no first-touch page faults in either).
    // "in engine" is the bandwidth inside the engines' execute stage (the daemon's stage
    // timestamps), apart from the hand-offs between the submitting thread, the ring
    // thread and the engines.
    let depth = in_flight_per_engine();
    println!("COPY with {depth} commands in flight per engine (CXL_ACCEL_BENCH_DEPTH)");
    let pin = std::env::var("CXL_ACCEL_BENCH_PIN").is_ok_and(|v| v == "1");
    let cpus = allowed_cpus();
    if pin {
        println!(
            "engines pinned to CPUs of their own while they copy, where there are more CPUs \
             than engines (CXL_ACCEL_BENCH_PIN)"
        );
    }
    println!(
        "{:>6} {:>8} {:>11} {:>16} {:>12} {:>15}",
        "size", "engines", "COPY GB/s", "in engine GB/s", "memcpy GB/s", "COPY/memcpy"
    );
    for engines in [1usize, 2] {
        for (size, iters) in [(4096u64, 20_000u32), (2 << 20, 400), (64 << 20, 16)] {
            // A fresh device per size, so that its stage figures are this size's alone.
            let mut h = Harness::with(Options {
                dma_threads: engines,
                ..Default::default()
            });
            // The submitting side polls for completions a while before it sleeps, as the
            // driver does (its default 50 us), rather than sleeping at once.
            warm(&mut h);
            let iters = if quick { iters.min(4) } else { iters };
            let (mut dev, mut mc) = (Vec::new(), Vec::new());
            let mut pinned = false;
            for _ in 0..runs {
                pinned = pin && pin_engines(&cpus, engines);
                dev.push(copy_by_device(&mut h, size, engines, depth, iters));
                if pinned {
                    set_affinities(|_| cpus.clone());
                }
                mc.push(copy_by_threads(&h, size, engines, iters));
            }
            let (a, m) = (median(dev), median(mc));
            let execute_ns = h
                .device()
                .stages()
                .summary()
                .iter()
                .find(|s| s.name == "execute")
                .map_or(0, |s| s.mean_ns);
            // Each of the `engines` commands that run at once moves size / engines bytes.
            let in_engine = size as f64 / execute_ns.max(1) as f64;
            println!(
                "{:>6} {engines:>8} {a:>11.2} {in_engine:>16.2} {m:>12.2} {:>14.0}%{}",
                label(size),
                100.0 * a / m,
                if pinned { "  engines pinned" } else { "" }
            );
            println!("         daemon stages: {}", h.device().stages().line());
            assert_eq!(h.device().stat(STAT_ERRORS), 0);
        }
    }
    checksum_bandwidth(&mut h, quick);
    assert_eq!(h.device().stat(STAT_ERRORS), 0);
}

/// Commands in flight per engine: 4 (as the driver keeps several chunks of a large copy
/// in flight), or CXL_ACCEL_BENCH_DEPTH.
fn in_flight_per_engine() -> usize {
    std::env::var("CXL_ACCEL_BENCH_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .filter(|&d| d > 0)
        .unwrap_or(4)
}

/// The CPUs this thread may use.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for this thread.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set);
        set
    };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET reads a bit of the set, within CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Sets the affinity of every thread of this process: `cpus_for(thread name)`.
fn set_affinities(cpus_for: impl Fn(&str) -> Vec<usize>) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        // SAFETY: cpu_set_t is plain data; CPU_SET writes bits below CPU_SETSIZE;
        // sched_setaffinity on a thread of our own process.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for c in cpus_for(name.trim()) {
                libc::CPU_SET(c, &mut set);
            }
            libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set);
        }
    }
}

/// Gives each DMA engine thread (`dma<i>`) a CPU of its own, the last ones, and every
/// other thread the CPUs left: how hardware engines copy, beside the host's cores rather
/// than on them. False (nothing changed) when there are no more CPUs than engines.
fn pin_engines(cpus: &[usize], engines: usize) -> bool {
    if cpus.len() <= engines {
        return false;
    }
    let (host, own) = cpus.split_at(cpus.len() - engines);
    set_affinities(|name| {
        match name
            .strip_prefix("dma")
            .and_then(|i| i.parse::<usize>().ok())
        {
            Some(i) => vec![own[i % engines]],
            None => host.to_vec(),
        }
    });
    true
}

/// Writes every page of the source and destination areas, so neither side of the
/// comparison pays for first touches.
fn warm(h: &mut Harness) {
    let size = 64usize << 20;
    let src = h.guest.get_host_address(GuestAddress(DATA)).unwrap();
    // SAFETY: the guest memory holds DATA + 64 MiB (GUEST_SIZE is 128 MiB) and the device
    // memory 64 MiB; nothing else touches them while the bench runs.
    unsafe {
        std::ptr::write_bytes(src, 1, size);
        std::ptr::write_bytes(h.devmem.as_ptr(), 0, size);
    }
}

/// COPY of `size` bytes from guest memory to device memory, split in `engines` commands
/// that run at once, `iters` times with `depth` times that many commands in flight; GB/s.
fn copy_by_device(h: &mut Harness, size: u64, engines: usize, depth: usize, iters: u32) -> f64 {
    let share = size / engines as u64;
    let reqs: Vec<Vec<u8>> = (0..engines as u64)
        .map(|e| {
            copy(
                1,
                &[sge(SPACE_GPA, DATA + e * share, share as u32)],
                &[sge(SPACE_DEVMEM, e * share, share as u32)],
            )
        })
        .collect();
    for r in &reqs {
        h.call(r); // the first use of each mapping
    }
    let depth = depth * engines;
    let total = iters as usize * engines;
    let t = Instant::now();
    let mut in_flight = 0;
    for i in 0..total {
        h.post(&reqs[i % engines], 1 + (i % depth) as u64, 64);
        in_flight += 1;
        if in_flight == depth {
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
    gbps(size * iters as u64, t.elapsed())
}

/// memcpy of the same `size` bytes between the same memory, by `threads` threads that
/// each copy their share `iters` times; GB/s.
fn copy_by_threads(h: &Harness, size: u64, threads: usize, iters: u32) -> f64 {
    let share = (size / threads as u64) as usize;
    let src = h.guest.get_host_address(GuestAddress(DATA)).unwrap() as usize;
    let dst = h.devmem.as_ptr() as usize;
    let one = move |e: usize| {
        for _ in 0..iters {
            // SAFETY: each thread copies its own `share` of two areas of at least
            // `size` bytes (see warm), which nothing else touches meanwhile.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (src + e * share) as *const u8,
                    (dst + e * share) as *mut u8,
                    share,
                )
            };
            std::hint::black_box(dst);
        }
    };
    one(0); // warm-up: caches and TLB as the device finds them
    let t = Instant::now();
    std::thread::scope(|s| {
        for e in 1..threads {
            s.spawn(move || one(e));
        }
        one(0);
    });
    gbps(size * iters as u64, t.elapsed())
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
