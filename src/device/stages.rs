// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Where a request's time goes inside the daemon, stage by stage, for latency work: how
//! long from the kick to taking it, from taking it to running it (the hop to an engine),
//! running it, and returning it (used entry and interrupt). Lock-free log2 histograms in
//! nanoseconds; the summary is logged when a session ends and shown by `ctl counters`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One stage of a request's way through the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// From the kick (the vring thread wakes) to the request taken off the ring.
    Pickup,
    /// From taken to executing: zero inline, the hop to an engine otherwise.
    Queue,
    /// Executing the command and writing its response.
    Execute,
    /// Returning it: the used entry, the journal around it, the interrupt.
    Publish,
}

const STAGES: [(Stage, &str); 4] = [
    (Stage::Pickup, "pickup"),
    (Stage::Queue, "queue"),
    (Stage::Execute, "execute"),
    (Stage::Publish, "publish"),
];

/// Bucket i counts durations below 2^i nanoseconds (the last one, everything longer:
/// 2^31 ns is 2 s).
const BUCKETS: usize = 32;

#[derive(Default)]
struct Histogram {
    count: AtomicU64,
    total_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

/// One stage's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct StageStats {
    pub name: &'static str,
    pub count: u64,
    pub mean_ns: u64,
    /// The bucket bound below which half of the samples lie (a power of two).
    pub median_below_ns: u64,
}

#[derive(Default)]
pub struct Stages {
    hist: [Histogram; 4],
}

impl Stages {
    pub fn record(&self, stage: Stage, took: Duration) {
        let ns = took.as_nanos().min(u64::MAX as u128) as u64;
        let h = &self.hist[stage as usize];
        h.count.fetch_add(1, Ordering::Relaxed);
        h.total_ns.fetch_add(ns, Ordering::Relaxed);
        let b = ((64 - ns.leading_zeros()) as usize).min(BUCKETS - 1);
        h.buckets[b].fetch_add(1, Ordering::Relaxed);
    }

    /// Every stage with samples.
    pub fn summary(&self) -> Vec<StageStats> {
        STAGES
            .iter()
            .filter_map(|&(stage, name)| {
                let h = &self.hist[stage as usize];
                let count = h.count.load(Ordering::Relaxed);
                if count == 0 {
                    return None;
                }
                let mut seen = 0;
                let mut median_below_ns = 1u64 << (BUCKETS - 1);
                for (i, b) in h.buckets.iter().enumerate() {
                    seen += b.load(Ordering::Relaxed);
                    if seen * 2 >= count {
                        median_below_ns = 1 << i;
                        break;
                    }
                }
                Some(StageStats {
                    name,
                    count,
                    mean_ns: h.total_ns.load(Ordering::Relaxed) / count,
                    median_below_ns,
                })
            })
            .collect()
    }

    /// One line for the log: "pickup n=.. mean=..us median<..us, ...".
    pub fn line(&self) -> String {
        self.summary()
            .iter()
            .map(|s| {
                format!(
                    "{} n={} mean={:.1}us median<{:.1}us",
                    s.name,
                    s.count,
                    s.mean_ns as f64 / 1000.0,
                    s.median_below_ns as f64 / 1000.0
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarises_each_stage() {
        let s = Stages::default();
        assert!(s.summary().is_empty());
        for ns in [100, 200, 300, 5000] {
            s.record(Stage::Execute, Duration::from_nanos(ns));
        }
        let sum = s.summary();
        assert_eq!(sum.len(), 1);
        assert_eq!(sum[0].name, "execute");
        assert_eq!(sum[0].count, 4);
        assert_eq!(sum[0].mean_ns, 1400);
        // 100 and 200 lie below 256.
        assert_eq!(sum[0].median_below_ns, 256);
        assert!(s.line().starts_with("execute n=4 mean=1.4us"));
    }
}
