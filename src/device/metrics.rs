// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Per-command metrics for the host side: how many commands of each opcode, how many failed
//! and with which status, and how long they took from the ring to the answer (a log2
//! histogram). Lock-free counters: the engines update them on every completion.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::protocol::Status;

/// Histogram buckets: bucket i counts latencies below 2^i microseconds (the last one,
/// everything longer).
pub const BUCKETS: usize = 24;

/// Opcodes are one byte wide in practice (the highest is 0x23); more are counted as "other".
const OPCODES: usize = 0x40;

#[derive(Default)]
struct PerOpcode {
    count: AtomicU64,
    errors: AtomicU64,
    total_us: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

pub struct Metrics {
    ops: Vec<PerOpcode>,
    other: PerOpcode,
    by_status: Vec<AtomicU64>,
    executing: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            ops: (0..OPCODES).map(|_| PerOpcode::default()).collect(),
            other: PerOpcode::default(),
            by_status: (0..Status::ALL.len() + 1)
                .map(|_| AtomicU64::new(0))
                .collect(),
            executing: AtomicU64::new(0),
        }
    }
}

/// One opcode's figures, as the control channel reports them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpcodeStats {
    pub opcode: u16,
    pub count: u64,
    pub errors: u64,
    pub mean_us: u64,
    /// (upper bound in microseconds, count); empty buckets are left out.
    pub histogram: Vec<(u64, u64)>,
}

fn bucket(us: u64) -> usize {
    // us < 2^i: the number of significant bits.
    ((64 - us.leading_zeros()) as usize).min(BUCKETS - 1)
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::default()
    }

    fn slot(&self, opcode: u16) -> &PerOpcode {
        self.ops.get(opcode as usize).unwrap_or(&self.other)
    }

    /// A command starts on an engine.
    pub fn started(&self) {
        self.executing.fetch_add(1, Ordering::Relaxed);
    }

    /// Commands on the engines now (started and not yet answered).
    pub fn executing(&self) -> u64 {
        self.executing.load(Ordering::Relaxed)
    }

    /// A command answered with `status` (a raw value: corrupted answers count as their
    /// own kind) after `took`.
    pub fn record(&self, opcode: u16, status: u32, took: Duration) {
        self.executing.fetch_sub(1, Ordering::Relaxed);
        let s = self.slot(opcode);
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        s.count.fetch_add(1, Ordering::Relaxed);
        s.total_us.fetch_add(us, Ordering::Relaxed);
        s.buckets[bucket(us)].fetch_add(1, Ordering::Relaxed);
        if status != Status::Ok as u32 {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        let i = (status as usize).min(self.by_status.len() - 1);
        self.by_status[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Every opcode seen so far (the unknown ones as 0xffff).
    pub fn opcodes(&self) -> Vec<OpcodeStats> {
        let one = |opcode: u16, s: &PerOpcode| {
            let count = s.count.load(Ordering::Relaxed);
            (count > 0).then(|| OpcodeStats {
                opcode,
                count,
                errors: s.errors.load(Ordering::Relaxed),
                mean_us: s.total_us.load(Ordering::Relaxed) / count,
                histogram: s
                    .buckets
                    .iter()
                    .enumerate()
                    .map(|(i, b)| (1u64 << i, b.load(Ordering::Relaxed)))
                    .filter(|&(_, n)| n > 0)
                    .collect(),
            })
        };
        self.ops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| one(i as u16, s))
            .chain(one(0xffff, &self.other))
            .collect()
    }

    /// Answers by status: (status name, count), non-zero only; "UNDEFINED" for values the
    /// specification does not have (injected corruption).
    pub fn by_status(&self) -> Vec<(&'static str, u64)> {
        self.by_status
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let name = Status::ALL.get(i).map_or("UNDEFINED", |s| s.name());
                (name, n.load(Ordering::Relaxed))
            })
            .filter(|&(_, n)| n > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_errors_statuses_and_buckets() {
        let m = Metrics::new();
        for _ in 0..5 {
            m.started();
        }
        m.record(0x10, 0, Duration::from_micros(0));
        m.record(0x10, 0, Duration::from_micros(3));
        m.record(0x10, Status::BadGpa as u32, Duration::from_micros(1000));
        m.record(0x99, 0xdead, Duration::from_secs(100_000));
        let ops = m.opcodes();
        assert_eq!(ops.len(), 2);
        let copy = &ops[0];
        assert_eq!((copy.opcode, copy.count, copy.errors), (0x10, 3, 1));
        assert_eq!(copy.mean_us, 1003 / 3);
        // 0 us < 1, 3 us < 4, 1000 us < 1024
        assert_eq!(copy.histogram, vec![(1, 1), (4, 1), (1024, 1)]);
        let other = &ops[1];
        assert_eq!((other.opcode, other.count, other.errors), (0xffff, 1, 1));
        assert_eq!(other.histogram, vec![(1 << (BUCKETS - 1), 1)]);
        assert_eq!(m.executing(), 1);
        assert_eq!(
            m.by_status(),
            vec![("OK", 2), ("BAD_GPA", 1), ("UNDEFINED", 1)]
        );
    }
}
